"""The disk tier of a :class:`~kernelpack.cache.Cache`: verified reads that quarantine a bad
entry, and writes whose failure costs a warning, never the caller's work.

A disk entry is untrusted input, as every cache entry is: every read goes back through
``kp.load`` and must hold the program the key names (:func:`~.binding.check_binding`), since a
disk entry carries no key of its own. An entry the loader refuses is moved aside
(:meth:`~.disk.DiskStore.quarantine`) and recompiled; a loader that fails for another reason (a
bug, a missing module) leaves the entry where it is. The files themselves (layout, locks,
eviction) are :class:`~kernelpack.cache.disk.DiskStore`; this module is what the Cache does
with them.

As :class:`~kernelpack.cache.remote_tier.RemoteTier`, the tier keeps no state of its own: the
store, counters, warnings and decoding are the Cache's, so ``Cache.stats()``, the warnings and
a patched ``Cache._decode`` are the same whichever tier did the work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..compiled import Compiled
from ..errors import KernelPackError
from ._once import WarnedOnce
from .binding import check_binding
from .disk import check_digest
from .keys import CacheKey

if TYPE_CHECKING:
    from . import Cache

__all__ = ["DiskTier", "DISK_WRITE_BACKOFF_S"]

# After a failed write (a full disk, a read-only or foreign-owned directory), how long writes
# and locks are skipped: one warning for the condition, not one per compiled kernel.
DISK_WRITE_BACKOFF_S = 30.0
# ENOTDIR: the cache root lies below a regular file, so nothing under it exists or can
_TIER_WIDE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.ENOTDIR})


class DiskTier:
    """The disk half of one Cache (``cache.disk``, a :class:`~.disk.DiskStore`).

    Warnings are given with the Cache's ``_warn``, which names the caller's line outside
    kernelpack. A bad entry is "treated as a miss": what follows (a compile, or None from
    ``Cache.get``) is the caller's, and a warning promising a recompile misled (review 35).
    """

    def __init__(self, cache: Cache) -> None:
        # A weak proxy, as RemoteTier's: the Cache owns its tier, and a reference cycle would
        # keep a dropped Cache alive until the next garbage collection.
        self._cache = weakref.proxy(cache)
        self._writes_down_until = 0.0
        self._warned = WarnedOnce()  # (what, digest) warned about once

    def entry(self, key: CacheKey | str, count_miss: bool = True,
              name: str | None = None, report: bool = True) -> tuple[bytes, Compiled] | None:
        """The disk entry's bytes and what they decode to, read once and verified; None on a
        miss or a bad entry (quarantined). A bad entry includes one that cannot be ``key``'s
        (another program, another image set: :func:`~.binding.check_binding`), since a disk
        entry carries no key of its own. ``count_miss``: count a missing entry; ``report``:
        warn about (and count) an entry refused for its signer."""
        cache = self._cache
        digest = check_digest(key)
        exposed = cache.disk.exposed(digest)
        if exposed is not None:  # anyone's entry could be there: not read, said once
            if self._warned.first(("exposed", "")):
                cache._warn(f"disk cache {cache.disk.root}: {exposed}, so its entries could "
                            f"be anyone's and are not read (make the directory private to "
                            f"this user or a group, or choose another cache directory)")
            if count_miss:
                cache._count("disk_misses")
            return None
        try:
            found = cache.disk.read(digest)
        except OSError as exc:
            cache._count("errors")
            self.failed(f"disk cache read of {digest[:16]}", exc)
            return None
        if found is None:
            if count_miss:
                cache._count("disk_misses")
            return None
        data, seen = found
        signer: list = []
        try:
            compiled = cache._decode(data, None, "disk", signer)
            check_binding(compiled, key, name)
        except KernelPackError as exc:  # the bytes are bad (the loader's promise)
            try:
                moved = cache.disk.quarantine(digest, seen)
            except OSError as move_exc:  # a broken cache dir costs a warning, never a crash
                cache._count("errors")
                cache._warn(f"disk cache entry {digest[:16]} is invalid ({type(exc).__name__}: "
                            f"{exc}); it could not be moved aside ({move_exc}); treated as a miss")
                return None
            if moved:  # else another thread or process moved or replaced it first: its
                cache._count("quarantined")  # warning is the one, and the caller looks again
                cache._warn(f"disk cache entry {digest[:16]} is invalid ({type(exc).__name__}:"
                            f" {exc}); moved to {moved}; treated as a miss")
            return None
        except Exception as exc:  # the loader itself failed (a bug, a missing module): the
            cache._count("errors")  # entry may be fine, so keep it; never crash on a hit
            cache._warn(f"loading disk cache entry {digest[:16]} failed "
                        f"({type(exc).__name__}: {exc}); treated as a miss")
            return None
        if signer[0] is not None and not self._still_trusted(signer[0]):
            if report:  # the look after taking the lock (report=False) says nothing
                from ..signing import key_id

                cache._count("refused")
                # warned once per key, recorded first: under simplefilter("error") the
                # warning raised before the compile that replaces the entry, at every call
                if self._warned.first(("revoked", digest)):
                    cache._warn(f"disk cache entry {digest[:16]} is signed by a key this "
                                f"cache no longer trusts (key id "
                                f"{key_id(bytes.fromhex(signer[0]))}); treated as a miss")
            if count_miss:  # not a hit: one miss per lookup, as for a quarantined entry
                cache._count("disk_misses")
            return None
        cache._count("disk_hits")
        return data, compiled

    def _still_trusted(self, public_key_hex: str) -> bool:
        """A signed disk entry came from the remote (or a signing node): with trusted keys
        configured, its signer must still be one of them. A revoked key's entries were served
        from every disk that had pulled them, and since those machines never missed, the
        fleet's remote entry was never re-signed. Unsigned entries (compiled here by a cache
        without ``sign_with``) and caches that trust no key are not affected."""
        cache = self._cache
        if not cache.require_signed_remote:
            return True
        trusted = cache.trusted_keys
        if not trusted:
            return True
        return bytes.fromhex(public_key_hex) in trusted

    def put(self, key: CacheKey | str, data: bytes, sync: bool = True,
            record: bool = True, program: str | None = None) -> None:
        """Write ``data`` under ``key`` (and the key's parts, for ``explain``, when ``record``,
        with the name of the ``program`` it holds); a failure is counted and warned about.
        ``sync=False`` for entries that can be fetched again (a remote hit put through): no
        fsync."""
        cache = self._cache
        if not self.writable():
            cache._count("errors")  # skipped: the failure was warned about already
            return
        try:
            cache.disk.put(key, data, sync=sync)
            if record and isinstance(key, CacheKey):
                cache.disk.record_parts(key, program)
            cache._count("puts")
        except (OSError, KernelPackError) as exc:
            # an entry over the cap is skipped by design, as the remote's over-size one is
            too_large = isinstance(exc, OSError) and exc.errno == errno.E2BIG
            cache._count("disk_too_large" if too_large else "errors")
            digest = check_digest(key)
            what = f"disk cache write of {digest[:16]}"
            if not too_large:
                self.failed(what, exc)
            elif self._warned.first(("too large", digest)):  # (a warning raised as an
                # error, after the compile, lost its result at every call: review 36)
                # E2BIG's "[Errno 7]" would name an "argument list too long" nobody passed
                cache._warn(f"{what} skipped: {cast(OSError, exc).strerror}")

    def failed(self, what: str, exc: BaseException, message: str | None = None) -> None:
        """Report a failed read, write or lock: a failure of one key's path (a foreign shard,
        a stale file) is warned about as it is (``message``, else ``"<what> failed: <exc>"``)
        and costs that key alone; one of the whole directory (:meth:`tier_wide`) warns once
        and pauses writes (:meth:`_write_failed`), and is quiet while they are paused."""
        if not self.tier_wide(exc):
            self._cache._warn(message or f"{what} failed: {exc}")
        elif self.writable():
            self._write_failed(what, exc)

    def writable(self) -> bool:
        """Not backing off after a failed write (see :meth:`_write_failed`)."""
        return time.monotonic() >= self._writes_down_until

    def tier_wide(self, exc: BaseException) -> bool:
        """Whether a failed write means the whole directory cannot be written: a full disk or
        quota, a read-only filesystem, a file size limit; a permission error only when the
        entries directory itself (or the root, before it exists) is not writable. A
        permission error on one key's shard or lock file costs that key alone (review 28:
        pausing the tier for it lost every other entry compiled in the next 30 s)."""
        code = getattr(exc, "errno", None)
        if code in _TIER_WIDE:
            return True
        if code in (errno.EACCES, errno.EPERM):
            root = self._cache.disk.root
            # os.path.isdir: False, not PermissionError, inside another user's 0700 root
            target = root / "entries" if os.path.isdir(root / "entries") else root
            return not os.access(target, os.W_OK | os.X_OK)
        return False

    def _write_failed(self, what: str, exc: BaseException) -> None:
        """Warn once, naming the directory, and skip writes and locks for
        :data:`DISK_WRITE_BACKOFF_S`: a full disk or a directory this user cannot write gave
        one warning per compiled kernel, none of which said where."""
        cache = self._cache
        self._writes_down_until = time.monotonic() + DISK_WRITE_BACKOFF_S
        why = ""
        if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM):
            why = _denied_by(cache.disk.root, getattr(exc, "filename", None))
        cache._warn(f"{what} failed: {exc} (cache directory {cache.disk.root}{why}); not "
                    f"writing to it for {DISK_WRITE_BACKOFF_S:.0f} s")


def _denied_by(root: Path, filename: object) -> str:
    """``"; <dir> (owner uid U, mode 0700) does not let uid V ..."``: the first directory from
    the cache root down to ``filename`` that this user cannot enter or write, so a warning
    names what to fix. "Permission denied" on an entry of mode 0644 named the file, not the
    0700 ``entries/`` of another user that denied it (review 36); "" when none is found."""
    path = root
    parts = []
    if isinstance(filename, str):
        with contextlib.suppress(ValueError):
            parts = list(Path(filename).parent.relative_to(root).parts)
    for step in [None, *parts]:
        if step is not None:
            path = path / step
        try:
            st = os.stat(path)
        except OSError:
            break
        if not os.access(path, os.W_OK | os.X_OK):
            return (f"; {path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) "
                    f"does not let uid {os.getuid()} write in it: a cache directory is private "
                    f"to the user who made it unless its owner opens it to a group")
    return ""
