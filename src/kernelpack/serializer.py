"""``kp.save``: programs and their modules → artifact bytes (deterministic, crash-safe).

The same input always gives the same bytes: programs, modules and images are sorted, images
are compressed with zstd at a fixed level (content size in the frame, no checksum: the
digests cover it), the generator string holds no timestamp, and ed25519 signatures are
deterministic. Saving a loaded :class:`~kernelpack.loader.Pack` reproduces its bytes.

Layout (docs/FORMAT.md): a ``Pack`` root holding the version, the metadata ``body`` (a nested
FlatBuffer whose SHA-256 is ``body_digest``), the image ``blobs``, and an optional signature.
This module decides what goes in (unique programs, the modules their launches use, one blob
per distinct compressed image) and assembles, signs and writes the file; the ``Program`` and
``ImageMeta`` tables themselves are built by :mod:`kernelpack._encode`.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import BinaryIO, Iterable, Union

import flatbuffers

from . import _generated as _fbpkg  # noqa: F401  (the generated package must be importable)
from ._encode import (ARCH_SUFFIXES, ARG_KINDS, byte_vector, image_table, offset_vector,
                      program_table, string_vector, text)
from ._generated import (Blob as FBlob, Body as FBody, Module as FModule, Pack as FPack,
                         Signature as FSignature)
from ._schema import BODY_ALIGNMENT
from .limits import (FILE_IDENTIFIER, FORMAT_MAJOR, FORMAT_MINOR, MAX_FILE_SIZE,
                     MAX_IMAGE_SIZE, MAX_PROGRAMS)
from .compiled import Compiled, Image, Module
from .filewrite import write_atomic, write_file_object
from .summary import KernelSummary
from .signing import SIGNATURE_DOMAIN  # noqa: F401  (re-exported; cryptography stays lazy)

__all__ = ["save", "resign", "encode", "check_readable", "ZSTD_LEVEL", "ARG_KINDS",
           "ARCH_SUFFIXES", "CODECS", "SIGNATURE_DOMAIN"]

ZSTD_LEVEL = 9
CODECS = ("none", "zstd")  # ARG_KINDS and ARCH_SUFFIXES: re-exported from ._encode

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO, None]


def _generator() -> str:
    from . import __version__
    return f"kernelpack {__version__}"


def _collect(items: object, packs: list | None = None) -> list[Compiled]:
    """Flatten a Compiled, a Pack, a loaded program (``pack["name"]``), or an iterable of
    them into Compiled objects. A loaded program is accepted because ``kp.save([pack["a"]],
    ...)`` is how a user copies one program out of a pack (it is ``pack.compiled("a")``).
    ``packs``, when given, gets every loaded pack, and every loaded program (which checks
    its pack's signature as the pack does)."""
    if isinstance(items, Compiled):
        return [items]
    if hasattr(items, "compiled") and hasattr(items, "programs"):  # a loaded Pack
        if packs is not None:
            packs.append(items)
        return [items.compiled(name) for name in items.programs]  # type: ignore[attr-defined]
    from .program import Program
    if isinstance(items, Program):
        if packs is not None:
            packs.append(items)  # checks its pack's signature as a pack does
        return [items.compiled()]
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"kp.save takes a Compiled, a Pack, a loaded program or an iterable "
                        f"of them (got {type(items).__name__})")
    out: list[Compiled] = []
    for item in items:
        if isinstance(item, (Compiled, Program)) or hasattr(item, "compiled"):
            out.extend(_collect(item, packs))
        else:
            raise TypeError(f"kp.save takes Compiled, Pack or loaded program items "
                            f"(got {type(item).__name__})")
    return out


def _check_signatures_intact(packs: list) -> None:
    """Before signing what loaded packs hold (``packs``, from :func:`_collect`): a pack whose
    own signature does not verify was changed after signing, or carries a forged one;
    signing its content would launder it (``kernelpack sign`` refuses such a file too).
    SignatureError naming it."""
    from .errors import SignatureError

    for pack in packs:
        check = getattr(pack, "check_signature_intact", None)
        if check is None:
            continue
        try:
            check()
        except SignatureError as exc:
            raise SignatureError(f"kp.save(sign_with=...): a pack to save carries a signature "
                                 f"that does not verify ({exc}); not signing its content") \
                from None


def _store(data: bytes) -> tuple[int, bytes]:
    """(codec index, stored bytes): zstd when it makes the image smaller."""
    if not data:
        return 0, data
    import zstandard

    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                      write_checksum=False, write_dict_id=False).compress(data)
    return (1, packed) if len(packed) < len(data) else (0, data)


def _check_image(module: str, image: Image) -> None:
    """What the ImageMeta fields can hold, checked with a message naming the image (the
    builder's own errors say "required argument is not an integer")."""
    where = f"module {module!r} image {image.target}"
    isa = image.ptx_isa
    if not isinstance(image.toolchain, str):
        raise TypeError(f"{where}: toolchain must be a str (got {image.toolchain!r:.80})")
    if isinstance(image.cuda_version, bool) or not isinstance(image.cuda_version, int):
        raise TypeError(f"{where}: cuda_version must be an int such as 12080 "
                        f"(got {image.cuda_version!r:.80})")
    if isa is not None and (not isinstance(isa, (tuple, list)) or len(isa) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in isa)):
        raise TypeError(f"{where}: ptx_isa must be None or (major, minor) ints "
                        f"(got {isa!r:.80})")
    if isa is not None and image.kind != "ptx":
        # The schema stores ptx_isa for PTX images only and readers ignore it elsewhere: written
        # on a cubin it would be lost on load, so the loaded image would not equal this one.
        raise ValueError(f"{where}: ptx_isa applies to PTX images only (got {tuple(isa)} on "
                         f"a {image.kind} image; expected None)")
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
    """The body bytes and the stored blobs for ``compiled`` (already collected). The result
    is not checked against the reader's limits: :func:`save` does that (:func:`check_readable`);
    tests build hostile files from it."""
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
            have = modules.get(m.name)
            if have is not None and have != m:
                if have.images != m.images:
                    raise ValueError(f"two different modules are named {m.name!r} (programs "
                                     f"must agree on a module's images)")
                # the same code listed with other entries (two kp.external of one .cu, each
                # naming its own kernel): one module holding every entry, sorted so that the
                # order of the programs does not change the bytes
                m = Module(m.name, tuple(sorted(set(have.kernels) | set(m.kernels))), m.images)
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
            images.append(image_table(b, image, blob_index[key], codec, stored))
        name = text(b, mname, "module name")
        kernels = string_vector(b, module.kernels, f"module {mname!r}: kernel name")
        images_vec = offset_vector(b, images)
        FModule.Start(b)
        FModule.AddName(b, name)
        FModule.AddKernels(b, kernels)
        FModule.AddImages(b, images_vec)
        module_offsets.append(FModule.End(b))
    program_offsets = [program_table(b, programs[name]) for name in sorted(programs)]
    generator = b.CreateString(_generator())
    progs_vec, mods_vec = offset_vector(b, program_offsets), offset_vector(b, module_offsets)
    FBody.Start(b)
    FBody.AddGenerator(b, generator)
    FBody.AddPrograms(b, progs_vec)
    FBody.AddModules(b, mods_vec)
    b.Finish(FBody.End(b))
    return bytes(b.Output()), blobs


def check_readable(data: bytes, programs: list[str], modules: list[str]) -> None:
    """Writers refuse what readers refuse (docs/FORMAT.md §3): open ``data`` as ``kp.load``
    would (structure, limits, module and image index) and raise ValueError naming the
    program or module when a reader would refuse it. The summary dataclasses check names in
    characters, the format limits them in UTF-8 bytes (a 1000-character name of accented
    letters is 2000 bytes); module kernels, images per module and free text had no check
    at all: such files were written and then refused by every reader. ``programs`` and
    ``modules`` are the sorted names, for the message."""
    from .errors import KernelPackError
    from .loader import Pack

    try:
        Pack(memoryview(data), trusted_keys=None)
    except KernelPackError as exc:
        def named(match: re.Match[str]) -> str:
            names = programs if match.group(1) == "programs" else modules
            index = int(match.group(2))
            label = f" ({match.group(1)[:-1]} {names[index]!r:.80})" if index < len(names) else ""
            return match.group(0) + label
        message = re.sub(r"Body\.(programs|modules)\[(\d+)\]", named, str(exc), count=1)
        raise ValueError(f"the artifact would not load, so it is not written: "
                         f"{message}") from None


def assemble(body: bytes, blobs: list[bytes], signature: tuple[bytes, bytes] | None,
             minor: int = FORMAT_MINOR) -> bytes:
    """The outer ``Pack`` around an encoded body; ``signature`` is (public key, signature)."""
    b = flatbuffers.Builder(len(body) + sum(len(x) + 16 for x in blobs) + 1024)
    blob_offsets = []
    for data in blobs:
        vec = byte_vector(b, data)
        FBlob.Start(b)
        FBlob.AddData(b, vec)
        blob_offsets.append(FBlob.End(b))
    blobs_vec = offset_vector(b, blob_offsets)
    sig = None
    if signature is not None:
        key, sig_bytes = byte_vector(b, signature[0]), byte_vector(b, signature[1])
        FSignature.Start(b)
        FSignature.AddPublicKey(b, key)
        FSignature.AddSignature(b, sig_bytes)
        sig = FSignature.End(b)
    digest = byte_vector(b, hashlib.sha256(body).digest())
    body_vec = byte_vector(b, body, BODY_ALIGNMENT)
    FPack.Start(b)
    FPack.AddFormatMajor(b, FORMAT_MAJOR)
    FPack.AddFormatMinor(b, minor)
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


def resign(pack: object, sign_with: object) -> bytes:
    """A loaded ``Pack`` wrapped again around its own body and stored blobs, signed with
    ``sign_with`` (what ``kernelpack sign`` writes).

    Nothing is decompressed or recompressed: re-saving holds every image's raw bytes at once,
    and a small file can declare gigabytes of them; and the signature then covers exactly the
    body that was verified. For a file this writer made, the bytes equal
    ``save(pack, sign_with=...)``. The caller verifies the pack first.
    """
    from ._fbread import Table
    from .signing import sign_digest
    from .errors import IntegrityError
    from .verify import verify_buffer

    file = getattr(pack, "_file", None)
    # a memory-mapped file is read again with pread: it may have been truncated since load,
    # and reading a map past the file's end kills the process (kernelpack._images.PackFile)
    buf = pack._buf if file is None else file.read(0, file.size, "re-reading the file")  # type: ignore[attr-defined]
    fpack = Table(buf, verify_buffer(buf, "Pack", identifier=FILE_IDENTIFIER), "Pack")
    from .errors import CompatibilityError
    from .verify import read_format_version

    major, minor = read_format_version(buf)
    if (major, minor) > (FORMAT_MAJOR, FORMAT_MINOR):  # its outer fields would be dropped and
        # the file relabelled as this writer's version
        raise CompatibilityError(f"{getattr(file, 'path', 'the artifact')}: format "
                                 f"{major}.{minor} is newer than this kernelpack writes "
                                 f"({FORMAT_MAJOR}.{FORMAT_MINOR}); re-signing it would drop "
                                 f"what it adds: sign it with a newer kernelpack")
    body = bytes(fpack.view("body"))
    if hashlib.sha256(body).hexdigest() != pack.body_digest:  # type: ignore[attr-defined]
        raise IntegrityError(f"{getattr(file, 'path', 'file')}: the body changed after the "
                             f"file was loaded and verified; not signing it")
    blobs = [bytes(blob.view("data")) for blob in fpack.get("blobs")]
    # the file's own version: a 1.0 body stays a 1.0 file, byte for byte as its writer signed
    return assemble(body, blobs, sign_digest(sign_with, hashlib.sha256(body).digest()), minor)


def format_minor(compiled: Iterable[Compiled]) -> int:
    """The oldest minor version of the format that holds everything ``compiled`` says: 1 when
    a launch uses a field added in 1.1 (``Launch.reads_elsewhere``, ``stores_after_loads``),
    else 0, so that a file without them is the 1.0 file its older writer wrote, byte for byte
    (its signatures and the golden files stay as they were)."""
    for c in compiled:
        for v in c.summary.variants:
            if any(ln.reads_elsewhere or ln.stores_after_loads for ln in v.launches):
                return 1
    return 0


def save(items: object, path_or_file: PathOrFile = None, *, sign_with: object = None) -> bytes:
    """Serialize programs into one artifact and return its bytes.

    Parameters
    ----------
    items: a :class:`~kernelpack.compiled.Compiled`, a loaded ``Pack``, a loaded program
        (``pack["name"]``), or an iterable of them.
        Modules shared by several programs are stored once (same name and images; their
        kernel entries are merged: two kp.external of one source, each naming its kernel).
    path_or_file: a path (written crash-safely: temp file + fsync + rename; a symbolic link
        is followed, a FIFO or device written directly), a binary file object (written as
        is), or None (just return the bytes).
    sign_with: an ed25519 private key (anything :func:`kernelpack.signing.load_private_key`
        accepts) to sign the artifact with. Without it the result is unsigned, also when
        re-saving a signed Pack (signing the same content with the same key gives the same
        bytes again).

    Raises
    ------
    ValueError: duplicate program names, two different modules with one name, a limit exceeded
        (also one that only the stored form shows, such as a name over 1024 UTF-8 bytes:
        nothing a reader would refuse is written).
    TypeError: items of the wrong type, or a ``path_or_file`` that is none of the above.
    """
    packs: list = []
    compiled = _collect(items, packs)
    body, blobs = encode(compiled)
    signature = None
    if sign_with is not None:
        from .signing import load_for, load_private_key, sign_digest

        key = load_for("sign_with", load_private_key, sign_with)
        _check_signatures_intact(packs)
        signature = sign_digest(key, hashlib.sha256(body).digest())
    data = assemble(body, blobs, signature, format_minor(compiled))
    check_readable(data, sorted({c.name for c in compiled}),
                   sorted({ln.module for c in compiled for v in c.summary.variants
                           for ln in v.launches}))
    if path_or_file is None:
        return data
    if hasattr(path_or_file, "write"):
        write_file_object(path_or_file, data)
    elif isinstance(path_or_file, (str, os.PathLike)):
        write_atomic(path_or_file, data)
    else:  # bytes would be artifact data to kp.load, never a path: say so before any I/O
        raise TypeError(f"kp.save writes to a path (str or os.PathLike), a binary file object "
                        f"or nowhere (None) (got {type(path_or_file).__name__})")
    return data
