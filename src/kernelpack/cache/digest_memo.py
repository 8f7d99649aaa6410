"""Once-per-process digests of a cache key, remembered across processes by the files' stat.

Every process that makes a cache key hashes two inputs once: kernelpack's codegen sources
(:func:`~kernelpack.cache.keys.codegen_digest`: ~110 ``.py`` files) and libdevice (one ~0.5 MB
bitcode file). A cache root keeps them in ``meta/digests.json``: for each digest, the stat of
every file it was computed from, and the digest. A later process whose files all stat the same
takes the digest from there: the key's once-per-process probes 3.3 -> 1.6 ms on the 2-CPU box
(median of 11 processes; the rest is the listing, the stats, one small read, and the sys.path
scan for the toolchain's versions), of a warm start's ~28 ms of 50 cache hits (session 50).

Why a stat may stand for the bytes (git's index and Python's bytecode cache rely on the same,
with less): a file's stamp is its name, size, mtime, ctime (nanoseconds), inode and device.
Writing to a file or replacing it (an install, a checkout, ``cp -p``) sets its ctime, which no
call lets a user set back, and a file moved in from elsewhere has another inode. Two guards
close what a timestamp's granularity leaves open (git's "racy clean" problem): a digest is
remembered only when every file's mtime and ctime lie more than :data:`RACY_S` before the
hashing began (a later change then carries a later timestamp on any filesystem whose clock
ticks at least that often), and only when the files stat the same after hashing as before.

Files on a read-only filesystem are never remembered: such an image changes by another being
mounted in its place, with stamps that can all match (see :func:`file_stamps`). What the guard
assumes, as git does: the clock of whoever writes the files agrees with this one's within
:data:`RACY_S` (a network filesystem whose server runs seconds behind could let an edit made
twice within one of its timestamp ticks pass).

Trust: the memo is read and written only where the cache's entries are (``DiskStore.
untrusted``: no link, nothing writable by every user): whoever can write it can plant an
entry anyway. Whatever is wrong with it (missing, unreadable, not JSON, another shape, a
write that fails) is ignored, and the digest is computed as it would be without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .._smallfile import read_regular
from ..errors import CacheError
from ._files import write_atomic

__all__ = ["DigestMemo", "file_stamps", "RACY_S", "MAX_LABELS"]

RACY_S = 2.0  # a file changed this shortly before it was hashed is not remembered
MAX_LABELS = 16  # digests kept per memo (one kernelpack install: 2); the oldest go first
_MAX_BYTES = 1 << 20
_VERSION = 1
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}( \([0-9]+ files\))?")


def file_stamps(files: Sequence[tuple[str, str | Path]]) -> list[list[Any]] | None:
    """``[name, size, mtime_ns, ctime_ns, inode, device]`` of each ``(name, path)``; None when
    one cannot be looked at, is not a regular file, or lies on a read-only filesystem (then
    nothing is remembered). Why the last: a read-only image (squashfs, erofs: an Apptainer
    container) is changed by mounting another one in its place, and two images built with
    fixed timestamps give a same-size edit the same stamp: no ctime of its own, inodes
    numbered in tree order, the loop device reused (review 68)."""
    out: list[list[Any]] = []
    devices: dict[int, str | Path] = {}
    for name, path in files:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        devices.setdefault(st.st_dev, path)
        out.append([name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
    for path in devices.values():
        try:
            if os.statvfs(path).f_flag & os.ST_RDONLY:
                return None
        except OSError:
            return None
    return out


class DigestMemo:
    """``meta/digests.json`` of one cache root; ``untrusted()`` says why it must not be used
    (:meth:`DiskStore.untrusted` of ``meta/``), or None."""

    def __init__(self, path: Path, untrusted: Callable[[], str | None]) -> None:
        self.path = path
        self._untrusted = untrusted
        self._digests: dict[str, Any] | None = None  # the file as first read (or written)

    def digest(self, label: str, files: Sequence[tuple[str, str | Path]],
               compute: Callable[[], str]) -> str:
        """``compute()``, or what it answered for ``label`` before when ``files`` stat the
        same as they did then."""
        before = file_stamps(files)
        if before is None or self._untrusted() is not None:
            return compute()
        recorded = self._read().get(label)
        if (isinstance(recorded, dict) and recorded.get("stamps") == before
                and isinstance(recorded.get("digest"), str)
                and _DIGEST.fullmatch(recorded["digest"])):
            return str(recorded["digest"])
        started_ns = time.time_ns()
        result = compute()
        settled = started_ns - int(RACY_S * 1e9)
        if (_DIGEST.fullmatch(result) and all(max(s[2], s[3]) < settled for s in before)
                and file_stamps(files) == before):
            self._remember(label, before, result)
        return result

    def _read(self) -> dict[str, Any]:
        if self._digests is None:
            self._digests = self._load()
        return self._digests

    def _load(self) -> dict[str, Any]:
        try:
            data = read_regular(self.path, _MAX_BYTES)
        except OSError:
            return {}
        if data is None or len(data) > _MAX_BYTES:
            return {}
        try:
            memo = json.loads(data)
        except (ValueError, RecursionError):  # (UnicodeDecodeError, JSONDecodeError are
            # ValueErrors; a file nested past the parser's depth is a RecursionError)
            return {}
        if not isinstance(memo, dict) or memo.get("version") != _VERSION \
                or not isinstance(memo.get("digests"), dict):
            return {}
        return memo["digests"]

    def _remember(self, label: str, stamps: list[list[Any]], digest: str) -> None:
        digests = {k: v for k, v in self._load().items() if k != label}  # (others' writes)
        while len(digests) >= MAX_LABELS:
            del digests[next(iter(digests))]
        digests[label] = {"stamps": stamps, "digest": digest}
        self._digests = digests
        if not self.path.parent.parent.is_dir():  # no cache root (yet, or any more): making
            return  # one is a put's business, not a key's
        data = json.dumps({"version": _VERSION, "digests": digests}).encode()
        # advisory: a torn file (no fsync) fails to parse and is ignored
        with contextlib.suppress(OSError, CacheError):
            write_atomic(self.path, data, sync=False)
