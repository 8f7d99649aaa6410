"""Stored images of a loaded pack: metadata checked at load, bytes checked when read.

:class:`ImageInfo` is what :mod:`kernelpack.loader` makes for every ``ImageMeta`` table; its
:meth:`~ImageInfo.read` checks the stored digest *before* the decompressor sees a byte, bounds
decompression by the recorded ``raw_size`` and checks the raw digest after (docs/FORMAT.md).
:meth:`~ImageInfo.lazy_image` is the cache's warm path: a :class:`~kernelpack.summary.Image`
whose stored digest is checked now and whose bytes are decompressed on first use, so a hit does
not decompress the images that the device never runs.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

from ._fbread import ByteViews
from ._interrupts import deferred_interrupts
from .errors import FormatError, IntegrityError
from .limits import DIGEST_SIZE, MAX_IMAGE_SIZE
from .compiled import IMAGE_KINDS, Image
from .targets import Arch

__all__ = ["ImageInfo", "PackFile", "FileBlobs"]

_SUFFIXES = ("", "a", "f")
_CODECS = ("none", "zstd")
_IMAGE_FIELDS = ("kind", "arch_major", "arch_minor", "arch_suffix", "ptx_isa", "cuda_version",
                 "toolchain", "codec", "raw_size", "digest", "raw_digest", "blob")


@lru_cache(maxsize=256)
def _arch(major: int, minor: int, suffix: int) -> Arch:
    """Arch objects are immutable and few: made (and validated) once per process."""
    return Arch(major, minor, _SUFFIXES[suffix])


_OWNED_DUP: Any = None  # the extension's owned_dup once looked up; False: not built


def _own(fd: int) -> Any:
    """A duplicate of ``fd`` owned (and closed) by a C object, or None without the extension."""
    global _OWNED_DUP
    if _OWNED_DUP is None:
        try:
            from .runtime._launch import owned_dup
        except ImportError:
            owned_dup = False
        _OWNED_DUP = owned_dup
    return _OWNED_DUP(fd) if _OWNED_DUP else None


class PackFile:
    """An open artifact file that images are read from with ``os.pread`` after load.

    A large file is memory-mapped for load's checks, but reading an image through the map
    later would kill the process with SIGBUS if the file was truncated in the meantime (a
    rewrite in place, a full disk): a read past the end of a file must be an IntegrityError.
    The descriptor is a private duplicate, closed when the last reader goes away, by no Python
    code: a Ctrl-C landing in a Python closer (a ``weakref.finalize`` callback, a ``__del__``)
    is printed as "Exception ignored" and lost, and the close skipped (review 34). So the
    extension's ``owned_dup`` makes the duplicate and owns it in one C call, and closes it when
    deallocated (``_fdowner.c``). Without the extension a finalizer closes it, registered with
    interrupts held back (:mod:`kernelpack._interrupts`): a Ctrl-C between the ``dup`` and the
    registration left it open for good (review 32c)."""

    __slots__ = ("path", "size", "fd", "_owner", "__weakref__")

    def __init__(self, fd: int, path: str, size: int) -> None:
        self.path, self.size = path, size
        self._owner = _own(fd)
        if self._owner is not None:
            self.fd: int = self._owner.fileno()
            return
        with deferred_interrupts():  # no Ctrl-C between the dup and its finalizer
            closer = weakref.finalize(self, os.close, os.dup(fd))
        self.fd = closer.peek()[2][0]  # type: ignore[index]  # None once finalized only

    def read(self, start: int, size: int, where: str) -> bytes:
        """Bytes [start, start + size): IntegrityError if the file is shorter now."""
        chunks, have = [], 0
        while have < size:  # one pread returns at most about 2 GiB
            chunk = os.pread(self.fd, size - have, start + have)
            if not chunk:
                now = os.fstat(self.fd).st_size
                raise IntegrityError(f"{self.path}: {where}: the file is {now} bytes now, "
                                     f"{self.size} when it was loaded (truncated after "
                                     f"load; bytes {start}..{start + size} are gone)")
            chunks.append(chunk)
            have += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class FileBlob:
    """One stored blob of a :class:`PackFile`: ``len()`` without I/O, bytes read on request."""

    __slots__ = ("file", "start", "size")

    def __init__(self, file: PackFile, start: int, size: int) -> None:
        self.file, self.start, self.size = file, start, size

    def __len__(self) -> int:
        return self.size

    def read(self, where: str) -> bytes:
        return self.file.read(self.start, self.size, where)

    def __bytes__(self) -> bytes:  # as bytes(view) of an in-memory blob
        return self.read("stored blob")


class FileBlobs:
    """:class:`~kernelpack._fbread.ByteViews` of a memory-mapped file, handing out
    :class:`FileBlob` readers instead of views into the map (see :class:`PackFile`)."""

    __slots__ = ("views", "file")

    def __init__(self, views: ByteViews, file: PackFile) -> None:
        self.views, self.file = views, file

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, index: int) -> FileBlob:
        return FileBlob(self.file, *self.views.span(index))


if TYPE_CHECKING:  # a runtime typing.Union costs ~40 µs at import, inside a first load
    Stored = memoryview | FileBlob


class ImageInfo:
    """Metadata of one stored image; :meth:`read` returns its checked raw bytes."""

    def __reduce__(self) -> Any:
        # (was "cannot pickle memoryview objects": it reads from its pack's buffer)
        raise TypeError(f"a loaded image ({self.module!r} {self.kind} {self.arch}) cannot be "
                        f"pickled or copied: it reads from its pack's buffer; send "
                        f"pack.compiled(name) (or the artifact's bytes) instead")

    __slots__ = ("module", "kind", "arch", "codec", "stored_size", "raw_size", "digest",
                 "raw_digest", "toolchain", "cuda_version", "ptx_isa", "blob", "_stored",
                 "_data", "_stored_ok")

    def __init__(self, module: str, meta: Sequence[Any],
                 blobs: ByteViews | FileBlobs | Sequence[memoryview]) -> None:
        """``meta``: an ImageMeta table's _IMAGE_FIELDS, as Table.values or .tree read them."""
        self.module = module
        (kind, major, minor, suffix, self.ptx_isa, self.cuda_version, self.toolchain, codec,
         self.raw_size, digest, raw_digest, blob) = meta
        self.kind = IMAGE_KINDS[kind]
        if self.kind != "ptx":  # FORMAT.md §7: a reader ignores ptx_isa on other kinds
            self.ptx_isa = None
        try:
            self.arch = _arch(major, minor, suffix)
        except ValueError:
            raise FormatError(f"module {module!r}: image has arch_major {major}, arch_minor "
                              f"{minor} (expected 1..99 and 0..9)") from None
        self.codec = _CODECS[codec]
        if len(digest) != DIGEST_SIZE or len(raw_digest) != DIGEST_SIZE:
            raise FormatError(f"module {module!r} image {self.target}: digests must be "
                              f"{DIGEST_SIZE} bytes (got {len(digest)} and {len(raw_digest)})")
        self.digest, self.raw_digest = digest.hex(), raw_digest.hex()
        if self.raw_size > MAX_IMAGE_SIZE:
            raise FormatError(f"module {module!r} image {self.target}: raw_size "
                              f"{self.raw_size} exceeds MAX_IMAGE_SIZE {MAX_IMAGE_SIZE}")
        if blob >= len(blobs):
            raise FormatError(f"module {module!r} image {self.target}: blob index {blob} "
                              f"outside 0..{len(blobs) - 1}")
        self.blob = blob
        self._stored: Stored = blobs[blob]
        self.stored_size = len(self._stored)
        if self.codec == "none" and self.stored_size != self.raw_size:
            raise IntegrityError(f"module {module!r} image {self.target}: stored uncompressed "
                                 f"as {self.stored_size} bytes but raw_size is {self.raw_size}")
        self._data: bytes | None = None
        self._stored_ok = False

    @property
    def target(self) -> str:
        if self.kind == "ptx":
            return self.arch.compute
        return ("host-" if self.kind == "host" else "") + self.arch.sm

    def sort_key(self) -> tuple:
        return (IMAGE_KINDS.index(self.kind), self.arch.major, self.arch.minor, self.arch.suffix)

    @property
    def check_key(self) -> tuple:
        """What decides the outcome of :meth:`read`'s checks: images with equal keys (one
        blob, the same claims about it) pass or fail together, so a check of every image
        checks each key once. Images may share a blob, and a few dozen bytes of metadata
        per image could otherwise make ``Pack.verify`` decompress one 32 KiB zstd frame of
        1 GiB thousands of times."""
        return (self.blob, self.codec, self.raw_size, self.digest, self.raw_digest)

    def check_stored(self) -> None:
        """Check the stored bytes against ``digest`` (and a zstd frame's declared size against
        ``raw_size``) without decompressing: what a cache hit checks for every image, leaving
        decompression and the raw digest to :meth:`read`. Raises IntegrityError."""
        if self._stored_ok:
            return
        where = f"module {self.module!r} image {self.target}"
        self._check(self._fetch(where), where)

    def _fetch(self, where: str) -> memoryview | bytes:
        """The stored bytes: a view of an in-memory buffer, or read from the file now."""
        stored = self._stored
        return stored if isinstance(stored, memoryview) else stored.read(where)

    def _check(self, stored: memoryview | bytes, where: str) -> None:
        actual = hashlib.sha256(stored).hexdigest()
        if actual != self.digest:
            raise IntegrityError(f"{where}: stored bytes do not match their digest "
                                 f"(expected sha256 {self.digest}, got {actual})")
        if self.codec == "zstd":
            _frame_size(stored, self.raw_size, where)
        self._stored_ok = True

    def read(self, keep: bool = True) -> bytes:
        """The raw image bytes: stored digest checked *before* decompression, size bounded by
        ``raw_size``, raw digest checked after. Cached unless ``keep`` is False: a check of
        every image (``Pack.verify``, ``kernelpack extract``) must not hold them all, since a
        small file can declare many images of up to MAX_IMAGE_SIZE each. Raises
        IntegrityError."""
        if self._data is not None:
            return self._data
        if not keep:
            data = self.read()
            self._data = None
            return data
        where = f"module {self.module!r} image {self.target}"
        if self.codec == "none" and self.raw_digest == self.digest:
            # Stored bytes = raw bytes, one digest for both: hash the copy handed out once
            # (what check_stored would hash, then the raw check again), with the message of
            # the check that would have failed first.
            data = bytes(self._fetch(where))
            actual = hashlib.sha256(data).hexdigest()
            if actual != self.digest:
                what = "decompressed bytes do not match raw_digest" if self._stored_ok else \
                    "stored bytes do not match their digest"
                raise IntegrityError(f"{where}: {what} (expected sha256 {self.digest}, got "
                                     f"{actual})")
            self._stored_ok = True
            self._data = data
            return data
        stored = self._fetch(where)
        if not (self._stored_ok and isinstance(getattr(self._stored, "obj", None), bytes)):
            # bytes read from the file now are checked now: the file may have changed; so is
            # a view of a caller's bytearray, which the caller may have reused since (review
            # 51); only immutable bytes checked once are not hashed again
            self._check(stored, where)
        data = bytes(stored) if self.codec == "none" else _inflate(stored, self.raw_size, where)
        actual = hashlib.sha256(data).hexdigest()
        if actual != self.raw_digest:
            raise IntegrityError(f"{where}: decompressed bytes do not match raw_digest "
                                 f"(expected sha256 {self.raw_digest}, got {actual})")
        self._data = data
        return data

    def image(self) -> Image:
        """A :class:`~kernelpack.summary.Image` with the checked raw bytes (for re-saving)."""
        return Image(self.kind, self.arch, self.read(), self.toolchain, self.cuda_version,
                     self.ptx_isa)

    def lazy_image(self) -> Image:
        """Like :meth:`image`, but the stored digest is checked now and the bytes are
        decompressed (and checked against ``raw_digest``) on the first read of ``.data``."""
        if self._data is not None:
            return self.image()
        self.check_stored()
        return Image._lazy(self.kind, self.arch, self.read, self.toolchain, self.cuda_version,
                           self.ptx_isa, self.digest)

    def __repr__(self) -> str:
        return (f"ImageInfo({self.module}:{self.target}, {self.codec}, {self.stored_size}/"
                f"{self.raw_size} bytes)")


def _frame_size(stored: memoryview | bytes, raw_size: int, where: str) -> None:
    """The zstd frame must declare its content size, and it must equal ``raw_size``."""
    from . import _zstd  # libzstd through ctypes where present (see _zstd: no zstandard import)

    try:
        declared = _zstd.frame_content_size(stored)
    except _zstd.ZstdFormatError as exc:
        raise IntegrityError(f"{where}: not a zstd frame ({exc})") from None
    if declared != raw_size:
        raise IntegrityError(f"{where}: zstd frame declares {declared} bytes, raw_size is "
                             f"{raw_size}")


def _decompress(stored: memoryview | bytes, raw_size: int, where: str) -> bytes:
    """Decompress one zstd frame into exactly ``raw_size`` bytes.

    The frame must declare its content size, and it must equal ``raw_size`` (bounded by
    MAX_IMAGE_SIZE at load): one-shot decompression then allocates that much and no more, and
    zstd fails if the data would produce more or fewer bytes than declared.
    """
    _frame_size(stored, raw_size, where)
    return _inflate(stored, raw_size, where)


def _inflate(stored: memoryview | bytes, raw_size: int, where: str) -> bytes:
    """:func:`_decompress` after the frame's declared size was checked (by
    :meth:`ImageInfo.check_stored`, which :meth:`ImageInfo.read` has just run)."""
    from . import _zstd

    try:
        out = _zstd.decompress(stored, raw_size)
    except _zstd.ZstdFormatError as exc:
        raise IntegrityError(f"{where}: zstd decompression failed ({exc})") from None
    if len(out) != raw_size:
        raise IntegrityError(f"{where}: decompressed to {len(out)}{'+' if len(out) > raw_size else ''}"
                             f" bytes, raw_size is {raw_size}")
    return out
