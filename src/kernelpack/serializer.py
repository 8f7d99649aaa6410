"""``kp.save``: programs and their modules → artifact bytes (deterministic, crash-safe).

The same input always gives the same bytes: programs, modules and images are sorted, images
are compressed with zstd at a fixed level (content size in the frame, no checksum: the
digests cover it), the generator string holds no timestamp, and ed25519 signatures are
deterministic. Saving a loaded :class:`~kernelpack.loader.Pack` reproduces its bytes.

Layout (docs/FORMAT.md): a ``Pack`` root holding the version, the metadata ``body`` (a nested
FlatBuffer whose SHA-256 is ``body_digest``), the image ``blobs``, and an optional signature.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import BinaryIO, Iterable, Union

import flatbuffers

from . import _generated as _fbpkg  # noqa: F401  (the generated package must be importable)
from ._generated import (Arg as FArg, Blob as FBlob, Body as FBody, Constraint as FConstraint,
                         Dim3 as FDim3, ImageMeta as FImage, Launch as FLaunch,
                         Module as FModule, Pack as FPack, Param as FParam,
                         Program as FProgram, Scratch as FScratch, Signature as FSignature,
                         Variant as FVariant, Version as FVersion)
from .expr_program import ExprEncoder
from .limits import (FILE_IDENTIFIER, FORMAT_MAJOR, FORMAT_MINOR, MAX_FILE_SIZE,
                     MAX_IMAGE_SIZE, MAX_PROGRAMS)
from .summary import IMAGE_KINDS, ROLES, Compiled, Image, KernelSummary, Module, Tensor
from .signing import SIGNATURE_DOMAIN  # noqa: F401  (re-exported; cryptography stays lazy)
from .verify import BODY_ALIGNMENT

__all__ = ["save", "encode", "ZSTD_LEVEL", "ARG_KINDS", "ARCH_SUFFIXES", "CODECS",
           "SIGNATURE_DOMAIN"]

ZSTD_LEVEL = 9
ARG_KINDS = ("buffer", "scalar", "value")
ARCH_SUFFIXES = ("", "a", "f")
CODECS = ("none", "zstd")

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO, None]


def _generator() -> str:
    from . import __version__
    return f"kernelpack {__version__}"


def _collect(items: object) -> list[Compiled]:
    """Flatten a Compiled, a Pack, or an iterable of them into Compiled objects."""
    if isinstance(items, Compiled):
        return [items]
    if hasattr(items, "compiled") and hasattr(items, "programs"):  # a loaded Pack
        return [items.compiled(name) for name in items.programs]  # type: ignore[attr-defined]
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"kp.save takes a Compiled, a Pack or an iterable of them "
                        f"(got {type(items).__name__})")
    out: list[Compiled] = []
    for item in items:
        if isinstance(item, Compiled) or hasattr(item, "compiled"):
            out.extend(_collect(item))
        else:
            raise TypeError(f"kp.save takes Compiled or Pack items (got {type(item).__name__})")
    return out


def _byte_vector(b: flatbuffers.Builder, data: bytes, align: int = 1) -> int:
    b.StartVector(1, len(data), align)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def _u32_vector(b: flatbuffers.Builder, values: list[int]) -> int:
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependUint32(v)
    return b.EndVector()


def _i64_vector(b: flatbuffers.Builder, values: tuple[int, ...]) -> int:
    b.StartVector(8, len(values), 8)
    for v in reversed(values):
        b.PrependInt64(v)
    return b.EndVector()


def _offsets(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _strings(b: flatbuffers.Builder, names: Iterable[str]) -> int:
    return _offsets(b, [b.CreateString(n) for n in names])


class _Roots:
    """Registers a program's expressions with one ExprEncoder, in a fixed order."""

    def __init__(self, summary: KernelSummary) -> None:
        loops = [s for s in summary.loop_symbols() if s not in summary.bound_symbols()]
        self.enc = ExprEncoder([*summary.bound_symbols(), *loops])
        self.positions: list[int] = []

    def add(self, expr: object) -> int:
        return self.enc.add(expr)  # type: ignore[arg-type]

    def finish(self) -> None:
        self.encoded, self.positions = self.enc.finish()

    def __getitem__(self, handle: int) -> int:
        return self.positions[handle]


def _program(b: flatbuffers.Builder, s: KernelSummary) -> int:
    r = _Roots(s)
    param_roots = [([r.add(d) for d in p.shape], -1) if isinstance(p, Tensor)
                   else ([], r.add(p.value) if p.value is not None else -1) for p in s.params]
    constraint_roots = [r.add(c.predicate) for c in s.constraints]
    variant_roots = []
    for v in s.variants:
        pred = r.add(v.predicate) if v.predicate is not None else -1
        scratch = [[r.add(d) for d in sc.shape] for sc in v.scratch]
        launches = []
        for ln in v.launches:
            launches.append(([r.add(e) for e in ln.grid], [r.add(e) for e in ln.block],
                             r.add(ln.shared_mem), r.add(ln.count) if ln.count is not None else -1,
                             [r.add(a.value) if a.value is not None else 0 for a in ln.args]))
        variant_roots.append((pred, scratch, launches))
    r.finish()

    params = []
    for p, (dims, value) in zip(s.params, param_roots):
        name = b.CreateString(p.name)
        shape = _u32_vector(b, [r[d] for d in dims]) if isinstance(p, Tensor) else None
        FParam.Start(b)
        FParam.AddKind(b, 0 if isinstance(p, Tensor) else 1)
        FParam.AddName(b, name)
        FParam.AddDtype(b, p.dtype.code)
        if isinstance(p, Tensor):
            FParam.AddRole(b, ROLES.index(p.role))
            FParam.AddZeroInit(b, p.zero_init)
            FParam.AddShape(b, shape)
        elif value >= 0:
            FParam.AddValue(b, r[value])
        params.append(FParam.End(b))
    constraints = []
    for c, root in zip(s.constraints, constraint_roots):
        message = b.CreateString(c.message)
        FConstraint.Start(b)
        FConstraint.AddPredicate(b, r[root])
        FConstraint.AddMessage(b, message)
        constraints.append(FConstraint.End(b))
    variants = []
    for v, (pred, scratch_roots, launch_roots) in zip(s.variants, variant_roots):
        scratch = []
        for sc, dims in zip(v.scratch, scratch_roots):
            name, shape = b.CreateString(sc.name), _u32_vector(b, [r[d] for d in dims])
            FScratch.Start(b)
            FScratch.AddName(b, name)
            FScratch.AddDtype(b, sc.dtype.code)
            FScratch.AddShape(b, shape)
            FScratch.AddZeroInit(b, sc.zero_init)
            scratch.append(FScratch.End(b))
        launches = []
        for ln, (grid, block, smem, count, arg_roots) in zip(v.launches, launch_roots):
            args = []
            for a, root in zip(ln.args, arg_roots):
                name = b.CreateString(a.name)
                FArg.Start(b)
                FArg.AddKind(b, ARG_KINDS.index(a.kind))
                FArg.AddName(b, name)
                if a.kind == "value":
                    FArg.AddValue(b, r[root])
                    FArg.AddDtype(b, a.dtype.code)  # type: ignore[union-attr]
                args.append(FArg.End(b))
            kernel, module = b.CreateString(ln.kernel), b.CreateString(ln.module)
            loop, args_vec = b.CreateString(ln.loop), _offsets(b, args)
            FLaunch.Start(b)
            FLaunch.AddKernel(b, kernel)
            FLaunch.AddModule(b, module)
            FLaunch.AddGrid(b, FDim3.CreateDim3(b, *(r[x] for x in grid)))
            FLaunch.AddBlock(b, FDim3.CreateDim3(b, *(r[x] for x in block)))
            FLaunch.AddSharedMem(b, r[smem])
            if count >= 0:
                FLaunch.AddCount(b, r[count])
            FLaunch.AddLoop(b, loop)
            FLaunch.AddArgs(b, args_vec)
            launches.append(FLaunch.End(b))
        scratch_vec, launch_vec = _offsets(b, scratch), _offsets(b, launches)
        FVariant.Start(b)
        if pred >= 0:
            FVariant.AddPredicate(b, r[pred])
        FVariant.AddScratch(b, scratch_vec)
        FVariant.AddLaunches(b, launch_vec)
        variants.append(FVariant.End(b))

    enc = r.encoded
    name, symbols = b.CreateString(s.name), _strings(b, enc.symbols)
    ops, imms = _byte_vector(b, enc.ops), _i64_vector(b, enc.imms)
    vecs = [_offsets(b, params), _offsets(b, constraints), _offsets(b, variants)]
    FProgram.Start(b)
    FProgram.AddName(b, name)
    FProgram.AddSymbols(b, symbols)
    FProgram.AddOps(b, ops)
    FProgram.AddImms(b, imms)
    FProgram.AddParams(b, vecs[0])
    FProgram.AddConstraints(b, vecs[1])
    FProgram.AddVariants(b, vecs[2])
    return FProgram.End(b)


def _store(data: bytes) -> tuple[int, bytes]:
    """(codec index, stored bytes): zstd when it makes the image smaller."""
    if not data:
        return 0, data
    import zstandard

    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                      write_checksum=False, write_dict_id=False).compress(data)
    return (1, packed) if len(packed) < len(data) else (0, data)


def _image(b: flatbuffers.Builder, image: Image, blob: int, codec: int, stored: bytes) -> int:
    toolchain = b.CreateString(image.toolchain)
    digest = _byte_vector(b, hashlib.sha256(stored).digest())
    raw_digest = _byte_vector(b, hashlib.sha256(image.data).digest())
    FImage.Start(b)
    FImage.AddKind(b, IMAGE_KINDS.index(image.kind))
    FImage.AddArchMajor(b, image.arch.major)
    FImage.AddArchMinor(b, image.arch.minor)
    FImage.AddArchSuffix(b, ARCH_SUFFIXES.index(image.arch.suffix))
    if image.ptx_isa is not None:
        FImage.AddPtxIsa(b, FVersion.CreateVersion(b, *image.ptx_isa))
    FImage.AddCudaVersion(b, image.cuda_version)
    FImage.AddToolchain(b, toolchain)
    FImage.AddCodec(b, codec)
    FImage.AddRawSize(b, len(image.data))
    FImage.AddDigest(b, digest)
    FImage.AddRawDigest(b, raw_digest)
    FImage.AddBlob(b, blob)
    return FImage.End(b)


def _check_image(module: str, image: Image) -> None:
    if len(image.data) > MAX_IMAGE_SIZE:
        raise ValueError(f"module {module!r} image {image.target}: {len(image.data)} bytes "
                         f"exceed MAX_IMAGE_SIZE {MAX_IMAGE_SIZE}")
    if not 0 <= image.cuda_version < (1 << 32):
        raise ValueError(f"module {module!r} image {image.target}: cuda_version must fit in "
                         f"32 bits (got {image.cuda_version})")
    if image.ptx_isa is not None and not all(0 <= v < 256 for v in image.ptx_isa):
        raise ValueError(f"module {module!r} image {image.target}: ptx_isa parts must be "
                         f"0..255 (got {image.ptx_isa})")


def encode(compiled: list[Compiled]) -> tuple[bytes, list[bytes]]:
    """The body bytes and the stored blobs for ``compiled`` (already collected)."""
    programs: dict[str, KernelSummary] = {}
    modules: dict[str, Module] = {}
    for c in compiled:
        if c.name in programs:
            raise ValueError(f"two programs are named {c.name!r}; program names must be unique")
        programs[c.name] = c.summary
        used = {ln.module for v in c.summary.variants for ln in v.launches}
        for m in c.modules:
            if m.name not in used:
                continue  # only modules some launch uses are stored
            if m.name in modules and modules[m.name] != m:
                raise ValueError(f"two different modules are named {m.name!r} (programs must "
                                 f"agree on a module's kernels and images)")
            modules[m.name] = m
    if len(programs) > MAX_PROGRAMS:
        raise ValueError(f"{len(programs)} programs exceed MAX_PROGRAMS {MAX_PROGRAMS}")
    b = flatbuffers.Builder(4096)
    blobs: list[bytes] = []
    blob_index: dict[bytes, int] = {}
    module_offsets = []
    for mname in sorted(modules):
        module = modules[mname]
        images = []
        for image in sorted(module.images, key=Image.sort_key):
            _check_image(mname, image)
            codec, stored = _store(image.data)
            key = hashlib.sha256(stored).digest()
            if key not in blob_index:
                blob_index[key] = len(blobs)
                blobs.append(stored)
            images.append(_image(b, image, blob_index[key], codec, stored))
        name, kernels, images_vec = (b.CreateString(mname), _strings(b, module.kernels),
                                     _offsets(b, images))
        FModule.Start(b)
        FModule.AddName(b, name)
        FModule.AddKernels(b, kernels)
        FModule.AddImages(b, images_vec)
        module_offsets.append(FModule.End(b))
    program_offsets = [_program(b, programs[name]) for name in sorted(programs)]
    generator = b.CreateString(_generator())
    progs_vec, mods_vec = _offsets(b, program_offsets), _offsets(b, module_offsets)
    FBody.Start(b)
    FBody.AddGenerator(b, generator)
    FBody.AddPrograms(b, progs_vec)
    FBody.AddModules(b, mods_vec)
    b.Finish(FBody.End(b))
    return bytes(b.Output()), blobs


def assemble(body: bytes, blobs: list[bytes], signature: tuple[bytes, bytes] | None) -> bytes:
    """The outer ``Pack`` around an encoded body; ``signature`` is (public key, signature)."""
    b = flatbuffers.Builder(len(body) + sum(len(x) + 16 for x in blobs) + 1024)
    blob_offsets = []
    for data in blobs:
        vec = _byte_vector(b, data)
        FBlob.Start(b)
        FBlob.AddData(b, vec)
        blob_offsets.append(FBlob.End(b))
    blobs_vec = _offsets(b, blob_offsets)
    sig = None
    if signature is not None:
        key, sig_bytes = _byte_vector(b, signature[0]), _byte_vector(b, signature[1])
        FSignature.Start(b)
        FSignature.AddPublicKey(b, key)
        FSignature.AddSignature(b, sig_bytes)
        sig = FSignature.End(b)
    digest = _byte_vector(b, hashlib.sha256(body).digest())
    body_vec = _byte_vector(b, body, BODY_ALIGNMENT)
    FPack.Start(b)
    FPack.AddFormatMajor(b, FORMAT_MAJOR)
    FPack.AddFormatMinor(b, FORMAT_MINOR)
    FPack.AddBody(b, body_vec)
    FPack.AddBodyDigest(b, digest)
    FPack.AddBlobs(b, blobs_vec)
    if sig is not None:
        FPack.AddSignature(b, sig)
    b.Finish(FPack.End(b), file_identifier=FILE_IDENTIFIER)
    data = bytes(b.Output())
    if len(data) > MAX_FILE_SIZE:
        raise ValueError(f"artifact of {len(data)} bytes exceeds MAX_FILE_SIZE {MAX_FILE_SIZE}")
    return data


def _write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same directory, fsync, os.replace: all or nothing under ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not every platform can open a directory
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def save(items: object, path_or_file: PathOrFile = None, *, sign_with: object = None) -> bytes:
    """Serialize programs into one artifact and return its bytes.

    Parameters
    ----------
    items: a :class:`~kernelpack.summary.Compiled`, a loaded ``Pack``, or an iterable of them.
        Modules shared by several programs are stored once (same name and content).
    path_or_file: a path (written crash-safely: temp file + fsync + rename), a binary file
        object (written as is), or None (just return the bytes).
    sign_with: an ed25519 private key (anything :func:`kernelpack.signing.load_private_key`
        accepts) to sign the artifact with. Without it the result is unsigned, also when
        re-saving a signed Pack (signing the same content with the same key gives the same
        bytes again).

    Raises
    ------
    ValueError: duplicate program names, two different modules with one name, a limit exceeded.
    TypeError: items of the wrong type.
    """
    body, blobs = encode(_collect(items))
    signature = None
    if sign_with is not None:
        from .signing import sign_digest

        signature = sign_digest(sign_with, hashlib.sha256(body).digest())
    data = assemble(body, blobs, signature)
    if path_or_file is None:
        return data
    if hasattr(path_or_file, "write"):
        path_or_file.write(data)  # type: ignore[union-attr]
    else:
        _write_atomic(path_or_file, data)  # type: ignore[arg-type]
    return data
