"""``kp.load``: artifact bytes → a verified, lazily decoded :class:`Pack`. No GPU needed.

Order of checks (docs/FORMAT.md, "What a reader MUST check"): size limit, identifier and the
format version (a newer major is refused before anything else is interpreted), the structure
of the whole file, the body digest, the signature when ``trusted_keys`` is given, the structure
of the body, then the module/image index. Summaries are decoded on first use; image bytes are
checked against their digests, decompressed within their recorded size and checked again only
when read. A failed load raises and leaves nothing behind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ._fbread import ByteViews, Table, Tables, module_index, tree_spec
from ._images import (_CODECS, _IMAGE_FIELDS, _SUFFIXES, FileBlobs, ImageInfo,  # noqa: F401
                      PackFile, _decompress)  # _decompress: kept importable here
from ._interrupts import deferred_interrupts
from .errors import FormatError, IntegrityError, KernelPackError, SignatureError
from .limits import DIGEST_SIZE, FILE_IDENTIFIER, MAX_FILE_SIZE, MAX_IMAGE_SIZE
from ._records import FrozenRecord
from .compiled import IMAGE_KINDS, Compiled, Module
from . import program as _program_module
from .program import Program
from .verify import read_format_version, verify_buffer

__all__ = ["load", "Pack", "Program", "ModuleInfo", "ImageInfo", "SignatureInfo"]


class SignatureInfo(FrozenRecord):
    """The signature block: ``verified`` is True only when checked against trusted keys.
    Immutable (a :class:`~kernelpack._records.FrozenRecord`)."""

    __slots__ = ("key_id", "public_key", "verified")
    key_id: str
    public_key: str
    verified: bool

    def __init__(self, key_id: str, public_key: str, verified: bool) -> None:
        self._set(key_id=key_id, public_key=public_key, verified=verified)


# what kp.load reads of each module in one call (Table.tree), images included: module by
# module, each checked before the next is read (a whole index read first let a file whose
# first module is bad cost reading every image of 100,000 modules; review 23)
_MODULE = tree_spec("Module", ("name", "kernels", ("images", _IMAGE_FIELDS)))
# every program's name, in one call (kp.load checks them; a Program is decoded on first use)
_PROGRAM_NAMES = tree_spec("Body", (("programs", ("name",)),))


class ModuleInfo:
    """A module: kernel entry names and images per target.

    Every image's metadata is checked at load (docs/FORMAT.md §3, 8). In a pack of many
    modules read into memory, the :class:`ImageInfo` objects are made when ``images`` is first
    read: such a pack uses a few of its modules per process, and making two or three ImageInfo
    per module was about half of what ``kp.load`` spent on a 100-module pack. Where the C
    extension checked the whole index at load (``_fbread.module_index``), even the kernel names
    and image metadata are read on first use. A memory-mapped file's are made at load
    (locating a blob reads the map; see :class:`PackFile`)."""

    __slots__ = ("name", "_kernels", "_images", "_metas", "_blobs", "_module", "_source")

    def __init__(self, fm: Sequence[Any],
                 blobs: ByteViews | FileBlobs | Sequence[memoryview], *,
                 defer: bool = False) -> None:
        """``fm``: a Module table read by Table.tree with :data:`_MODULE`; ``defer``: make the
        ImageInfo objects on first use where the metadata allows (see the class)."""
        self.name, kernels, fimages = fm
        if not self.name.isidentifier():
            raise FormatError(f"module name {self.name!r} is not an identifier")
        if kernels != sorted(set(kernels)) or not all(kernels):
            raise FormatError(f"module {self.name!r}: kernel names must be non-empty, sorted "
                              f"and unique (got {kernels[:8]})")
        self._kernels: tuple[str, ...] | None = tuple(kernels)
        self._module: Module | None = None
        self._images: tuple[ImageInfo, ...] | None = None
        self._metas, self._blobs = fimages, blobs
        self._source: tuple[Tables, int] | None = None
        # A memory-mapped file's blobs are located through the map (FileBlobs): that must
        # happen within load, since touching the map later faults if the file was truncated.
        if not defer or isinstance(blobs, FileBlobs) or not _plain_images(fimages,
                                                                          len(blobs)):
            self._images = self._make_images()  # raises the error that names what is wrong

    @classmethod
    def _indexed(cls, name: str, fmodules: Tables, index: int,
                 blobs: ByteViews | Sequence[memoryview]) -> "ModuleInfo":
        """Module ``index`` of ``fmodules``, which ``_fbread.module_index`` accepted (so
        nothing read later can fail): its kernel names and image metadata are read from the
        (immutable) buffer on first use."""
        info = object.__new__(cls)
        info.name, info._blobs, info._source = name, blobs, (fmodules, index)
        info._kernels = info._images = info._metas = info._module = None
        return info

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kernel entry names, sorted."""
        kernels = self._kernels
        if kernels is None:
            kernels = self._read()
        return kernels

    def _read(self) -> tuple[str, ...]:
        """Read an indexed module's kernels and image metadata (threads racing here read the
        same values from the same bytes)."""
        fmodules, index = self._source  # type: ignore[misc]
        _, kernels, self._metas = fmodules.tree(index, _MODULE)
        self._kernels = kernels = tuple(kernels)
        return kernels

    @property
    def images(self) -> tuple[ImageInfo, ...]:
        """The module's images, sorted by target (made on first use: see the class)."""
        images = self._images
        if images is None:
            with _MAKING_IMAGES:  # threads racing here must share one set (each ImageInfo
                images = self._images  # caches its checked and decompressed bytes)
                if images is None:
                    if self._metas is None:
                        self._read()
                    images = self._images = self._make_images()
        return images

    def _make_images(self) -> tuple[ImageInfo, ...]:
        images = tuple(ImageInfo(self.name, meta, self._blobs) for meta in self._metas)
        keys = [i.sort_key() for i in images]
        if not images or keys != sorted(set(keys)):
            raise FormatError(f"module {self.name!r}: images must be non-empty, sorted by "
                              f"target and one per target (got {[i.target for i in images]})")
        return images

    def module(self) -> Module:
        """The :class:`~kernelpack.summary.Module`: every image's stored digest checked now,
        each image decompressed and checked on the first read of its ``data``."""
        if self._module is None:
            self._module = Module(self.name, self.kernels,
                                  tuple(i.lazy_image() for i in self.images))
        return self._module

    def __repr__(self) -> str:
        return (f"ModuleInfo({self.name}, kernels={list(self.kernels)}, "
                f"images={[i.target for i in self.images]})")

    def __reduce__(self) -> Any:
        # (was "cannot pickle memoryview objects": its images read from the pack's buffer)
        raise TypeError(f"a loaded ModuleInfo ({self.name!r}) cannot be pickled or copied: it "
                        f"reads from its pack's buffer; send .module() (a kp.Module) or "
                        f"pack.compiled(name) instead")


# A pack of more modules than this makes their ImageInfo objects on first use, and one of
# more programs their tables: a small pack's are all used (deferring would only add work to
# its first call), a large pack's mostly not.
_DEFER_TABLES_FROM = 8
_MAKING_IMAGES = threading.Lock()  # a deferred module's first ``images`` (rare, brief)
_KIND_COUNT, _SUFFIX_COUNT, _ZSTD = len(IMAGE_KINDS), len(_SUFFIXES), _CODECS.index("zstd")
# what module_index (_fbread.c) checks image metadata against, as _plain_images does (the
# blob count is the pack's)
_INDEX_LIMITS = (_KIND_COUNT, _SUFFIX_COUNT, _ZSTD, DIGEST_SIZE, MAX_IMAGE_SIZE)


def _plain_images(metas: Sequence[Sequence[Any]], blob_count: int) -> bool:
    """Whether ImageInfo would accept every one of a module's image metadata (read with
    ``_IMAGE_FIELDS``) and they are sorted by target, one per target, without making them:
    zstd-coded images only (an uncompressed one's stored size is checked against its
    ``raw_size``, which needs its blob). False sends the module to ImageInfo at once, which
    then names what is wrong; True only where ImageInfo cannot fail later."""
    if not metas:
        return False
    last: tuple = ()
    for (kind, major, minor, suffix, _, _, _, codec, raw_size, digest, raw_digest,
         blob) in metas:
        if not (0 <= kind < _KIND_COUNT and 0 < major < 100 and 0 <= minor < 10
                and 0 <= suffix < _SUFFIX_COUNT and codec == _ZSTD
                and len(digest) == DIGEST_SIZE and len(raw_digest) == DIGEST_SIZE
                and 0 <= raw_size <= MAX_IMAGE_SIZE and 0 <= blob < blob_count):
            return False
        key = (kind, major, minor, suffix)  # ImageInfo.sort_key's order, as numbers
        if key <= last:
            return False
        last = key
    return True


class Pack:
    """A verified artifact. Made by :func:`load`; do not construct directly."""

    def __init__(self, buf: memoryview, *, trusted_keys: Iterable[object] | None,
                 file: PackFile | None = None) -> None:
        self.format_version = read_format_version(buf)
        root = verify_buffer(buf, "Pack", identifier=FILE_IDENTIFIER)
        fpack = Table(buf, root, "Pack")
        if not fpack.has("body"):
            raise FormatError("file: Pack.body is missing")
        body = fpack.view("body")
        if not isinstance(buf.obj, bytes):
            # A memory-mapped file can be rewritten in place (`cp new.kpack model.kpack`) after
            # this check: summaries are decoded later, so they must read the bytes verified
            # here, a private copy of the small body. Images are read from the file (pread, see
            # _images.PackFile) and checked against their digests at every read.
            body = memoryview(bytes(body))
        digest = fpack.get("body_digest")
        if len(digest) != DIGEST_SIZE:
            raise FormatError(f"file: Pack.body_digest is {len(digest)} bytes, expected "
                              f"{DIGEST_SIZE}")
        actual = hashlib.sha256(body).digest()
        if actual != digest:
            raise IntegrityError(f"file: body does not match body_digest (expected sha256 "
                                 f"{digest.hex()}, got {actual.hex()}): the metadata is corrupt")
        self.body_digest = digest.hex()
        self.signature = self._check_signature(fpack, digest, trusted_keys)
        verify_buffer(body, "Body", identifier=None, what="body")
        self._buf = buf
        fbody = Table.root(body, "Body")
        self.generator: str = fbody.get("generator")
        blobs: ByteViews | FileBlobs
        blobs = fpack.byte_views("blobs")  # made when an image names one
        if file is not None:  # images of a mapped file are read with pread, never via the map
            blobs = FileBlobs(blobs, file)
        self._file = file
        fmodules = fbody.tables("modules")
        # Deferred images locate their blobs in ``buf`` later: only where it cannot change
        # (bytes; the caller's read-only view of a bytearray or of its own memory map can)
        defer = len(fmodules) > _DEFER_TABLES_FROM and isinstance(buf.obj, bytes)
        # a large pack's index is checked in one C call where the extension is built, which
        # makes only the names; anything it does not pass takes the path that names the error
        names = module_index(fmodules, _MODULE, _INDEX_LIMITS + (len(blobs),)) if defer \
            else None
        if names is not None:
            _sorted_unique(names, "module")
            modules = [ModuleInfo._indexed(name, fmodules, i, blobs)  # type: ignore[arg-type]
                       for i, name in enumerate(names)]
        else:
            modules = [ModuleInfo(fmodules.tree(i, _MODULE), blobs, defer=defer)
                       for i in range(len(fmodules))]
            _sorted_unique([m.name for m in modules], "module")
        self._modules: dict[str, ModuleInfo] = {m.name: m for m in modules}
        programs = fbody.tables("programs")
        # a large pack's Program tables are made when each is decoded
        self._programs: Tables | list[Table] = (programs if len(programs) > _DEFER_TABLES_FROM
                                                else list(programs))
        names = [name for name, in fbody.tree(_PROGRAM_NAMES)[0]]
        _sorted_unique(names, "program")
        for name in names:
            if not name.isidentifier():
                raise FormatError(f"program name {name!r} is not an identifier")
        self._names: list[str] = names
        self._index = {name: i for i, name in enumerate(names)}
        self._handles: dict[str, Program] = {}

    def _check_signature(self, fpack: Table, digest: bytes,
                         trusted_keys: Iterable[object] | None) -> SignatureInfo | None:
        sig = fpack.get("signature")
        self._signed: tuple[bytes, bytes, bytes] | None = None
        if sig is None:
            if trusted_keys is not None:
                raise SignatureError("artifact is unsigned, but trusted_keys were given")
            return None
        key, value = sig.get("public_key"), sig.get("signature")
        if len(key) != 32 or len(value) != 64:
            raise FormatError(f"file: signature block has a {len(key)}-byte key and a "
                              f"{len(value)}-byte signature, expected 32 and 64")
        from .signing import key_id, verify_digest

        if trusted_keys is not None:
            verify_digest(key, value, digest, trusted_keys)
        self._signed = (bytes(key), bytes(value), bytes(digest))
        return SignatureInfo(key_id(key), key.hex(), trusted_keys is not None)

    def check_signature_intact(self) -> None:
        """Check the signature this pack carries under the key it names (load checks it only
        against ``trusted_keys``): SignatureError if the file was changed after signing. Proves
        nothing about who signed it; does nothing for an unsigned pack."""
        check_intact(self._signed)

    # ---- mapping of programs -----------------------------------------------------------------
    def __getitem__(self, name: str) -> Program:
        handle = self._handles.get(name)
        if handle is None:
            # setdefault: threads asking at once all get one Program (one binding, one
            # planner), not each its own
            handle = self._handles.setdefault(name, Program(self, name, self._index_of(name)))
        return handle

    def _index_of(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            shown = ", ".join(self._names[:20]) + (" ..." if len(self._names) > 20 else "")
            raise KeyError(f"no program {name!r} in this pack (has: {shown or 'none'})")
        return index

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    # Views, not the pack's own containers: ``pack.modules.pop(...)`` must not break the pack.
    @property
    def programs(self) -> list[str]:
        """Program names, sorted (a new list: changing it does not change the pack)."""
        return list(self._names)

    @property
    def modules(self) -> Mapping[str, ModuleInfo]:
        """Module name → :class:`ModuleInfo`, sorted by name (a read-only mapping)."""
        return MappingProxyType(self._modules)

    @property
    def nbytes(self) -> int:
        return len(self._buf)

    def compiled(self, name: str, *, origin: str = "disk") -> Compiled:
        """Program ``name`` as a :class:`~kernelpack.summary.Compiled`, e.g. to save it again
        or into another pack. Every image's stored bytes are checked against their digest
        now; an image is decompressed (and checked again) when its ``data`` is first read.
        Raises IntegrityError / FormatError."""
        program = self._handles.get(name)
        if program is None:
            # A handle made here is not kept: a cache hit loads a pack, takes its one program
            # as a Compiled and drops the pack; a kept handle would only cost memory.
            program = Program(self, name, self._index_of(name))
        return program.compiled(origin=origin)

    def warmup(self, devices: Iterable[int] | None = None) -> None:
        """Load every program's chosen images on ``devices`` (default: the current device) now,
        so that servers pay the loading cost at start-up instead of on the first request."""
        from .runtime import warmup

        warmup(self, devices)

    def verify(self) -> None:
        """Check everything load() leaves for later: every summary decodes, every launch's
        module and kernel exist, every image matches its digests (images naming one blob
        with the same claims are decompressed once: see ``ImageInfo.check_key``), and a
        signature the pack carries holds under the key it names (load checks it only against
        ``trusted_keys``; a signed file changed after signing fails here, as ``kernelpack
        verify`` does). Raises KernelPackError."""
        if self.signature is not None and not self.signature.verified:
            self.check_signature_intact()
        for name in self._names:
            self[name].modules  # decodes the summary and checks the references
        kept = 0
        checked: set[tuple] = set()
        for module in self._modules.values():
            for image in module.images:
                if image.check_key in checked:
                    continue  # the same blob under the same claims: checked already
                # Checked images stay cached for the launches that follow, up to a budget: a
                # small file can declare thousands of images of MAX_IMAGE_SIZE raw bytes each.
                keep = kept + image.raw_size <= _VERIFY_KEEP_BYTES
                image.read(keep=keep)
                kept += image.raw_size if keep else 0
                checked.add(image.check_key)

    def __reduce__(self) -> Any:
        raise TypeError("a loaded Pack cannot be pickled or copied (it reads from the artifact's "
                        "buffer): send the artifact's path or bytes and kp.load it there, or "
                        "pack.compiled(name) for one program")

    def __repr__(self) -> str:
        major, minor = self.format_version
        def count(n: int, noun: str) -> str:
            return f"{n} {noun}" + ("" if n == 1 else "s")

        return (f"<kernelpack Pack {count(len(self.programs), 'program')}, "
                f"{count(len(self.modules), 'module')}, format {major}.{minor}, "
                f"{self.nbytes} bytes>")


def _sorted_unique(names: list[str], what: str) -> None:
    for a, b in zip(names, names[1:]):
        if not a < b:
            raise FormatError(f"body: {what} names must be sorted and unique ({a!r} then {b!r})")


# Pack.verify() keeps the raw bytes of the images it checked up to this total (decompressing
# every image of a hostile file and keeping them all would be an unbounded allocation).
_VERIFY_KEEP_BYTES = 256 << 20

# Files up to this size are read into memory; larger ones are memory-mapped, so a pack of many
# programs costs only the pages its used programs and images touch.
_READ_LIMIT = 1 << 20


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def _mmap_module(source: str | os.PathLike[str]) -> Any:
    """``mmap``, imported only for a file that needs it: importing it costs a small file's
    load a quarter millisecond. Its import opens the extension module's file: with no
    descriptor left (the artifact took the last one) it failed as an ImportError naming
    ``mmap.cpython-*.so`` (review 39); that is the OSError of load's other steps, naming the
    artifact."""
    try:
        import mmap
    except ImportError as exc:
        for code in (errno.EMFILE, errno.ENFILE):  # the dynamic loader's words for them
            if os.strerror(code) in str(exc):
                raise OSError(code, f"{os.strerror(code)} (importing mmap to map the "
                                    f"artifact)", os.fspath(source)) from None
        raise
    return mmap


def _open(source: object) -> tuple[memoryview, PackFile | None]:
    """The bytes to verify, and for a memory-mapped file the file to read images from."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        if view.nbytes > MAX_FILE_SIZE:
            raise FormatError(f"file: {view.nbytes} bytes exceed MAX_FILE_SIZE {MAX_FILE_SIZE}")
        if view.readonly and view.c_contiguous:
            return (view.cast("B") if view.format != "B" or view.ndim != 1 else view), None
        # A writable buffer could change between verification and a later (lazy) decode, and
        # a strided view is not a byte string: the pack reads a private copy.
        return memoryview(view.tobytes()), None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"kp.load takes a path or bytes (got {type(source).__name__})")
    # O_NONBLOCK: opening a FIFO must not wait forever for a writer (no effect on files)
    with deferred_interrupts():  # a Ctrl-C as the opener's open returns lost the descriptor
        f = open(source, "rb", opener=_open_nonblocking)
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{os.fspath(source)}: not a regular file (a FIFO, socket or "
                              f"device cannot hold an artifact)")
        size = st.st_size
        if size > MAX_FILE_SIZE:
            raise FormatError(f"{os.fspath(source)}: {size} bytes exceed MAX_FILE_SIZE "
                              f"{MAX_FILE_SIZE}")
        if size == 0:
            return memoryview(b""), None
        if size <= _READ_LIMIT or not hasattr(os, "pread"):
            # small files: one read costs less than mapping (and unmapping)
            return memoryview(f.read()), None
        mmap = _mmap_module(source)

        # The map serves load's checks (the structure, the body copied out); images are read
        # later through PackFile, since touching a map of a file truncated meanwhile is SIGBUS.
        # A truncation *during* load can still fault: the window is one load's checks.
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        if len(view) != size:  # changed between fstat and mmap
            raise FormatError(f"{os.fspath(source)}: file changed while being opened")
        return view, PackFile(f.fileno(), os.fspath(source), size)


def load(path_or_bytes: object, *, trusted_keys: Iterable[object] | None = None) -> Pack:
    """Open and verify an artifact.

    Parameters
    ----------
    path_or_bytes: a path (read, or memory-mapped when over 1 MiB) or bytes / bytearray /
        memoryview.
    trusted_keys: public keys (see :func:`kernelpack.signing.load_public_key`); when given, an
        unsigned artifact or one not signed by one of them raises SignatureError.

    Raises
    ------
    FormatError, IntegrityError, SignatureError, CompatibilityError (newer format major).
    """
    # None skips the ABC check: a cold isinstance(None, Iterable) walks all its classes (~50 µs)
    if trusted_keys is not None:  # a mistyped key path is named now, not as "unsigned" later
        if (isinstance(trusted_keys, (bytes, bytearray, memoryview, str, os.PathLike))
                or not isinstance(trusted_keys, Iterable)):
            # one key given bare (bytes, a path, an Ed25519PublicKey): not a list of byte
            # values, and not Python's "object is not iterable", which does not say what a
            # key may be
            trusted_keys = [trusted_keys]
        from .signing import load_for, load_public_key

        # errors name the parameter, as kp.Cache's and kp.save's do ("trusted_keys: ...")
        trusted_keys = [load_for("trusted_keys", load_public_key, k) for k in trusted_keys]
    try:
        try:
            return _opened(path_or_bytes, trusted_keys)
        except KernelPackError as exc:
            if isinstance(path_or_bytes, (str, os.PathLike)):
                name_file(exc, os.fspath(path_or_bytes))
            raise
        except OSError as exc:
            # the map's and the image reader's own descriptors (os.dup: EMFILE) named no file
            if exc.filename is None and exc.errno is not None and isinstance(
                    path_or_bytes, (str, os.PathLike)):
                raise type(exc)(exc.errno, exc.strerror, os.fspath(path_or_bytes)) from None
            raise
    except BaseException as exc:
        if isinstance(path_or_bytes, (str, os.PathLike)):
            _let_go_of_the_file(exc)
        raise


def _opened(source: object, trusted_keys: Iterable[object] | None) -> Pack:
    # a frame of its own, which _let_go_of_the_file can clear after a failure (load's own
    # frame, still running then, cannot be)
    buf, file = _open(source)
    return Pack(buf, trusted_keys=trusted_keys, file=file)


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _let_go_of_the_file(exc: BaseException) -> None:
    """Clear the locals of kernelpack's finished frames in a failed load's traceback (and in
    the exceptions it chains): they held a large file's memory map and image reader, so an
    error kept by its caller (``sys.last_value`` in a notebook, a retry loop's last error) kept
    two descriptors of the file open and it mapped (review 39). The stack's lines stay, and
    no frame of the caller's (a load called while handling another exception chains that
    one) is touched. (What ``traceback.clear_frames`` does, without importing it: out of
    descriptors, that import failed and replaced the error.)"""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 8:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # a frame still running (load's own)
                    pass
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def check_intact(signed: tuple[bytes, bytes, bytes] | None) -> None:
    """SignatureError unless ``signed`` (a pack's ``(public key, signature, body digest)``,
    or None for an unsigned one) verifies under the key it names."""
    if signed is not None:
        from .signing import verify_digest

        key, value, digest = signed
        verify_digest(key, value, digest, [key])


def name_file(exc: BaseException, path: str) -> BaseException:
    """Put ``path`` at the front of ``exc``'s message (in place; type and traceback kept), so
    that an error about a file says which file: ``model.kpack: header: 0 bytes ...``. The
    generic ``file:`` prefix of the verifier's messages is replaced by the path."""
    message = str(exc.args[0]) if exc.args else str(exc)
    if message == path or message.startswith(f"{path}: "):
        return exc
    if message.startswith("file: "):
        message = message[len("file: "):]
    exc.args = (f"{path}: {message}", *exc.args[1:])
    return exc


# program.py's annotations name these (typing.get_type_hints resolves them in its globals); it
# cannot import them itself, since this module imports it (it does for mypy: TYPE_CHECKING)
_program_module.Pack, _program_module.ModuleInfo = Pack, ModuleInfo  # type: ignore[misc]
