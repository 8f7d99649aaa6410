"""An artifact writer built from docs/FORMAT.md and schema/kernelpack.fbs alone.

It uses the ``flatbuffers`` package's Builder and nothing of kernelpack (no generated
accessors, no ``_encode``), so a file it writes checks the prose specification against the
reader, not the reader against its own writer. Slot numbers are the field order of the
schema's tables; every knob below produces one specific deviation from a valid file.

The program it writes is ``t(x: f32[n])``: one launch of kernel ``k`` in module ``m`` with
grid ``(cdiv(n, 128), 1, 1)``, block ``(128, 1, 1)``, no shared memory, argument ``x``.
Fields with non-zero defaults (``Param.value``, ``Variant.predicate``, ``Launch.count``) are
left absent, as an older writer would leave them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import flatbuffers

IMAGE = b"\x7fELF hand-written, not a real cubin"
# roots: 0 = n, 1 = cdiv(n, 128), 2 = 128, 3 = 1, 4 = 0 (opcodes: SYM 2, CONST 1, CEILDIV 14)
OPS = bytes([2, 0, 2, 1, 14, 0, 1, 0, 1, 0, 1, 0])
IMMS = (0, 0, 128, 128, 1, 0)


def _bytes(b: flatbuffers.Builder, data: bytes, align: int = 1) -> int:
    b.StartVector(1, len(data), align)
    b.head -= len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _u32s(b: flatbuffers.Builder, values: list[int]) -> int:
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependUint32(v)
    return b.EndVector()


def _i64s(b: flatbuffers.Builder, values: tuple[int, ...]) -> int:
    b.StartVector(8, len(values), 8)
    for v in reversed(values):
        b.PrependInt64(v)
    return b.EndVector()


def _dim3(b: flatbuffers.Builder, x: int, y: int, z: int) -> int:
    b.Prep(4, 12)
    b.PrependUint32(z)
    b.PrependUint32(y)
    b.PrependUint32(x)
    return b.Offset()


@dataclass
class Spec:
    """What to write; the defaults give a valid artifact."""

    programs: tuple[str, ...] = ("t",)      # written in this order (FORMAT: sorted, unique)
    module: str = "m"
    kernels: tuple[str, ...] = ("k",)       # the module's entry names
    launch_module: str = "m"                # what the launch names
    launch_kernel: str = "k"
    image: bytes = IMAGE                    # the stored bytes
    kind: int = 0                           # ImageKind: Cubin
    arch: tuple[int, int] = (8, 0)
    suffix: int = 0
    codec: int = 0
    raw_size: int | None = None             # None: len(image)
    raw_digest: bytes | None = None         # None: SHA-256(image)
    dtype: int = 12                         # Float32
    tensor_value: int | None = None         # Param.value on the tensor x (does not apply)
    symbols: tuple[str, ...] = ("n",)
    ops: bytes = OPS
    imms: tuple[int, ...] = IMMS
    blobs: list[bytes] | None = None        # None: [image]
    major: int = 1
    minor: int = 0
    body_digest: bytes | None = None        # None: SHA-256(body)
    signature: tuple[bytes, bytes] | None = None
    appended_pack_field: int | None = None  # a field of a newer minor, after the known slots


def body(spec: Spec) -> bytes:
    """The nested ``Body`` FlatBuffer (root offset at byte 0, no identifier)."""
    b = flatbuffers.Builder(1024)
    toolchain = b.CreateString("hand")
    digest = _bytes(b, hashlib.sha256(spec.image).digest())
    raw_digest = _bytes(b, spec.raw_digest if spec.raw_digest is not None
                        else hashlib.sha256(spec.image).digest())
    b.StartObject(12)                       # ImageMeta
    b.PrependUint8Slot(0, spec.kind, 0)
    b.PrependUint8Slot(1, spec.arch[0], 0)
    b.PrependUint8Slot(2, spec.arch[1], 0)
    b.PrependUint8Slot(3, spec.suffix, 0)
    b.PrependUint32Slot(5, 12080, 0)
    b.PrependUOffsetTRelativeSlot(6, toolchain, 0)
    b.PrependUint8Slot(7, spec.codec, 0)
    b.PrependUint64Slot(8, len(spec.image) if spec.raw_size is None else spec.raw_size, 0)
    b.PrependUOffsetTRelativeSlot(9, digest, 0)
    b.PrependUOffsetTRelativeSlot(10, raw_digest, 0)
    b.PrependUint32Slot(11, 0, 0)
    image = b.EndObject()
    name = b.CreateString(spec.module)
    kernels = _offsets(b, [b.CreateString(k) for k in spec.kernels])
    images = _offsets(b, [image])
    b.StartObject(3)                        # Module
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, kernels, 0)
    b.PrependUOffsetTRelativeSlot(2, images, 0)
    module = b.EndObject()
    programs = [_program(b, name, spec) for name in spec.programs]
    generator = b.CreateString("hand-written 1")
    programs_vec, modules_vec = _offsets(b, programs), _offsets(b, [module])
    b.StartObject(3)                        # Body
    b.PrependUOffsetTRelativeSlot(0, generator, 0)
    b.PrependUOffsetTRelativeSlot(1, programs_vec, 0)
    b.PrependUOffsetTRelativeSlot(2, modules_vec, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def _program(b: flatbuffers.Builder, pname: str, spec: Spec) -> int:
    name = b.CreateString(pname)
    symbols = _offsets(b, [b.CreateString(s) for s in spec.symbols])
    ops, imms = _bytes(b, spec.ops), _i64s(b, spec.imms)
    param_name, shape = b.CreateString("x"), _u32s(b, [0])
    b.StartObject(7)                        # Param x: Tensor, In, shape (root 0,)
    b.PrependUint8Slot(0, 0, 0)
    b.PrependUOffsetTRelativeSlot(1, param_name, 0)
    b.PrependUint8Slot(2, spec.dtype, 0)
    b.PrependUOffsetTRelativeSlot(5, shape, 0)
    if spec.tensor_value is not None:
        b.PrependInt32Slot(6, spec.tensor_value, -1)
    params = _offsets(b, [b.EndObject()])
    arg_name = b.CreateString("x")
    b.StartObject(4)                        # Arg: Buffer x
    b.PrependUOffsetTRelativeSlot(1, arg_name, 0)
    args = _offsets(b, [b.EndObject()])
    kernel, module = b.CreateString(spec.launch_kernel), b.CreateString(spec.launch_module)
    b.StartObject(8)                        # Launch
    b.PrependUOffsetTRelativeSlot(0, kernel, 0)
    b.PrependUOffsetTRelativeSlot(1, module, 0)
    b.PrependStructSlot(2, _dim3(b, 1, 3, 3), 0)
    b.PrependStructSlot(3, _dim3(b, 2, 3, 3), 0)
    b.PrependUint32Slot(4, 4, 0)
    b.PrependUOffsetTRelativeSlot(7, args, 0)
    launches = _offsets(b, [b.EndObject()])
    b.StartObject(3)                        # Variant (predicate absent: always)
    b.PrependUOffsetTRelativeSlot(2, launches, 0)
    variants = _offsets(b, [b.EndObject()])
    b.StartObject(7)                        # Program
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, symbols, 0)
    b.PrependUOffsetTRelativeSlot(2, ops, 0)
    b.PrependUOffsetTRelativeSlot(3, imms, 0)
    b.PrependUOffsetTRelativeSlot(4, params, 0)
    b.PrependUOffsetTRelativeSlot(6, variants, 0)
    return b.EndObject()


def artifact(spec: Spec | None = None, **changes: object) -> bytes:
    """The whole file: the outer ``Pack`` (identifier ``KPAK``) around :func:`body`."""
    spec = spec or Spec(**changes)  # type: ignore[arg-type]
    body_bytes = body(spec)
    b = flatbuffers.Builder(1024)
    blob_tables = []
    for data in (spec.blobs if spec.blobs is not None else [spec.image]):
        vec = _bytes(b, data)
        b.StartObject(1)                    # Blob
        b.PrependUOffsetTRelativeSlot(0, vec, 0)
        blob_tables.append(b.EndObject())
    blobs = _offsets(b, blob_tables)
    signature = None
    if spec.signature is not None:
        key, sig = _bytes(b, spec.signature[0]), _bytes(b, spec.signature[1])
        b.StartObject(2)                    # Signature
        b.PrependUOffsetTRelativeSlot(0, key, 0)
        b.PrependUOffsetTRelativeSlot(1, sig, 0)
        signature = b.EndObject()
    digest = _bytes(b, hashlib.sha256(body_bytes).digest() if spec.body_digest is None
                    else spec.body_digest)
    body_vec = _bytes(b, body_bytes, 8)      # the nested body starts 8-aligned
    b.StartObject(6 if spec.appended_pack_field is None else 7)  # Pack
    b.PrependUint16Slot(0, spec.major, 0)
    b.PrependUint16Slot(1, spec.minor, 0)
    b.PrependUOffsetTRelativeSlot(2, body_vec, 0)
    b.PrependUOffsetTRelativeSlot(3, digest, 0)
    b.PrependUOffsetTRelativeSlot(4, blobs, 0)
    if signature is not None:
        b.PrependUOffsetTRelativeSlot(5, signature, 0)
    if spec.appended_pack_field is not None:
        b.PrependUint32Slot(6, spec.appended_pack_field, 0)
    b.Finish(b.EndObject(), file_identifier=b"KPAK")
    return bytes(b.Output())
