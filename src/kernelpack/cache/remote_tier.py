"""The remote tier of a :class:`~kernelpack.cache.Cache`: trusted reads, put-through writes,
a back-off after a failure, and the fleet-wide single-flight lock.

What it guarantees (issue 5): a remote that is down, slow or returns garbage costs a
:class:`~kernelpack.cache.CacheWarning` and a local compile, never a failure, and is then
skipped for :data:`REMOTE_BACKOFF_S`, so no timeout is paid per key. A value that cannot be
an entry (too large, not a string: :class:`~.remote.BadEntryValue`) is one bad entry, refused
without the back-off, so that one planted value cannot switch the remote off. A remote entry is
executable code: unless the cache opted out, it is read only when its envelope carries a
trusted signature, and anything else is refused and counted. N machines missing one key
compile it once while the remote is reachable (a ``SET NX PX`` lock; the others poll, then
load), and nobody waits for an entry it would refuse, nor for a stale value at the lock key
(no expiry or not a string: the store takes it over, see ``RedisStore.try_lock``).

The tier keeps only its back-off state. The store, the trust settings, the lock lifetime and
the wait stay the Cache's public attributes, read at each use; counters, warnings, decoding
and the put-through to disk go through the Cache, so ``Cache.stats()`` and the warnings are
the same whichever tier did the work.
"""

from __future__ import annotations

import json
import time
import weakref
from typing import TYPE_CHECKING

from ..compiled import Compiled
from ._once import WarnedOnce
from .binding import check_binding
from .disk import check_digest
from .keys import CacheKey

if TYPE_CHECKING:
    from . import Cache

__all__ = ["RemoteTier", "REMOTE_BACKOFF_S"]

REMOTE_BACKOFF_S = 30.0


class RemoteTier:
    """The remote half of one Cache (``cache.remote``: a store with ``get``/``put``, and for
    the fleet lock ``try_lock``/``is_locked``/``unlock``)."""

    def __init__(self, cache: Cache) -> None:
        # A weak proxy: the Cache owns its tier, and a reference cycle would keep a dropped
        # Cache (and its Redis socket) alive until the next garbage collection.
        self._cache = weakref.proxy(cache)
        self._down_until = 0.0
        self._writes_down_until = 0.0
        self._refused = WarnedOnce()  # digests whose refusal was warned about

    def ok(self) -> bool:
        """A remote is configured and not backing off after a failure."""
        return self._cache.remote is not None and time.monotonic() >= self._down_until

    def failed(self, what: str, exc: BaseException,
               meanwhile: str = "using the local cache and compiler") -> None:
        """Count and warn about a failed remote call, and skip the remote for a while. A call
        that fails while the remote is already skipped was in flight when another thread's
        call failed: the same outage, already reported (review 35: eight threads behind a
        hung Redis gave eight warnings and eight errors)."""
        cache = self._cache
        if time.monotonic() < self._down_until:
            return
        cache._count("remote_errors")
        self._down_until = time.monotonic() + REMOTE_BACKOFF_S
        cache._warn(f"remote cache {what} failed ({type(exc).__name__}: {exc}) at "
                    f"{self.where()}; {meanwhile} for {REMOTE_BACKOFF_S:.0f} s")

    def where(self) -> str:
        """The remote as a warning names it (:func:`._args.remote_name`)."""
        from ._args import remote_name

        return remote_name(self._cache.remote)

    def writable(self) -> bool:
        """Reachable and not backing off after Redis refused a write (below)."""
        return self.ok() and time.monotonic() >= self._writes_down_until

    def refused(self, what: str, exc: BaseException) -> bool:
        """Redis *answered* a write or lock with an error (``OOM`` at ``maxmemory`` with
        ``noeviction``, ``READONLY`` on a replica): the remote still serves reads, so only
        writes are skipped for a while, with one warning. Before, this backed the whole remote
        off, and a full Redis made every machine compile entries it held. False when ``exc``
        is not such a reply (the caller treats it as an outage)."""
        if not _is_error_reply(exc):
            return False
        cache = self._cache
        cache._count("remote_errors")
        self._writes_down_until = time.monotonic() + REMOTE_BACKOFF_S
        cache._warn(f"remote cache refused a {what} ({type(exc).__name__}: {exc}) at "
                    f"{self.where()}; reading it still, writing nothing to it for "
                    f"{REMOTE_BACKOFF_S:.0f} s")
        return True

    def readable(self) -> bool:
        """Reachable, and with a trusted key to check entries against (unless unsigned
        entries were allowed): otherwise the remote is only written."""
        return self.ok() and (not self._cache.require_signed_remote or
                              bool(self._cache.trusted_keys))

    def get(self, key: CacheKey | str, count_miss: bool = True,
            name: str | None = None) -> Compiled | None:
        """A verified hit (put through to disk), or None."""
        return self.lookup(key, count_miss, name)[0]

    def lookup(self, key: CacheKey | str, count_miss: bool = True,
               name: str | None = None) -> tuple[Compiled | None, str]:
        """(a verified hit or None, ``"hit" | "miss" | "refused" | "error"``)."""
        _, compiled, status = self.fetch(key, count_miss, name)
        return compiled, status

    def fetch(self, key: CacheKey | str, count_miss: bool = True,
              name: str | None = None) -> tuple[bytes | None, Compiled | None, str]:
        """:meth:`lookup` plus the verified artifact bytes (for ``Cache.get``); ``name``:
        the program the entry must hold (None: any), as for the disk tier."""
        cache = self._cache
        digest = check_digest(key)
        try:
            data = cache.remote.get(digest)
        except Exception as exc:
            from .remote import BadEntryValue

            if isinstance(exc, BadEntryValue):  # one bad value, not an outage: no back-off
                return self._refuse(digest, exc)
            self.failed("read", exc)
            return None, None, "error"
        if data is None:
            if count_miss:
                cache._count("remote_misses")
            return None, None, "miss"
        trusted = cache.trusted_keys if cache.require_signed_remote else None
        try:
            from .remote import unwrap_entry

            artifact = unwrap_entry(digest, data, trusted)
            # The artifact must carry a trusted signature of its own too, not only the
            # envelope: its copy on disk is all that later processes see, and an unsigned one
            # would pass there for this machine's own compile, out of reach of revoking the
            # envelope's key (review 29). Kernelpack's writers sign both with sign_with.
            compiled = cache._decode(artifact, trusted, "remote")
            check_binding(compiled, key, name)
        except Exception as exc:
            return self._refuse(digest, exc)
        cache._count("remote_hits")
        # Refetchable and verified on every read: no fsync; the remote keeps the key record.
        cache._put_disk(key, artifact, sync=False, record=False)
        return artifact, compiled, "hit"

    def _refuse(self, digest: str, exc: Exception) -> tuple[None, None, str]:
        """Count a refused entry, and warn the first time this process refuses ``digest``.
        The key is recorded before the warning: under ``simplefilter("error")`` the warning
        raised at every lookup, before the compile whose put would replace the entry, so that
        anyone able to write to Redis could make a key impossible to build (review 35)."""
        self._cache._count("refused")
        if self._refused.first(digest):
            self._cache._warn(f"remote cache entry {digest[:16]} refused "
                              f"({type(exc).__name__}: {exc}); treated as a miss")
        return None, None, "refused"

    def put(self, key: CacheKey | str, data: bytes) -> None:
        """Put ``data`` in a signed envelope (and the key's parts, for ``explain``); a failure
        is a warning and a back-off."""
        if not self.writable():
            return
        from .remote import BadEntryValue, signed_entry, wrap_entry

        cache = self._cache
        digest = check_digest(key)
        try:
            if cache.sign_with is None:
                # never replace a signed entry with an unsigned one: the fleet's trusted entry
                # would be refused by every reader after this one (a node without sign_with)
                try:
                    existing = cache.remote.get(digest)
                except BadEntryValue:  # not an entry at all, so not a signed one: replace it
                    existing = None
                if existing is not None and signed_entry(digest, existing):
                    return
            if cache.remote.put(digest, wrap_entry(digest, data, cache.sign_with)) is False:
                cache._count("remote_too_large")
                return
            if isinstance(key, CacheKey) and hasattr(cache.remote, "put_parts"):
                cache.remote.put_parts(key, json.dumps({"parts": key.parts}).encode())
            cache._count("remote_puts")
        except Exception as exc:
            if not self.refused("write", exc):
                self.failed("write", exc)

    # ---- fleet-wide single flight --------------------------------------------------------------
    def lock(self, key: CacheKey | str,
             name: str | None = None) -> tuple[Compiled | None, str | None]:
        """Take the fleet lock, or wait for whoever holds it. Returns (a hit, None) when the
        holder's entry arrived, (None, token) when we hold the lock, (None, None) otherwise."""
        cache = self._cache
        digest = check_digest(key)
        remote = cache.remote
        if not hasattr(remote, "try_lock") or not self.writable():
            return None, None
        ttl_ms = int(cache.lock_ttl_s * 1000)
        deadline = time.monotonic() + cache.wait_s
        delay = 0.01
        waited = False
        try:
            while True:
                token = remote.try_lock(digest, ttl_ms)
                if token is not None:
                    # Another process may have put the entry and released the lock between
                    # our miss and our lock: look once more before compiling.
                    hit = self.get(key, count_miss=False, name=name)
                    if hit is not None:
                        remote.unlock(digest, token)
                        return hit, None
                    return None, token
                if not waited:
                    waited = True
                    cache._count("remote_waits")
                while time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 1.5, 0.2)
                    hit, status = self.lookup(key, count_miss=False, name=name)
                    if status != "miss":  # a hit; or an entry we refuse, or an outage:
                        return hit, None  # waiting longer would not change that
                    if not remote.is_locked(digest):
                        break  # the holder gave up or died: try to take the lock
                else:
                    cache._warn(f"waited {cache.wait_s:.0f} s for another process to compile "
                                f"{digest[:16]}; compiling here")
                    return None, None
        except Exception as exc:
            if not self.refused("lock", exc):
                self.failed("lock", exc)
            return None, None

    def unlock(self, digest: str, token: str) -> None:
        """Release the fleet lock we hold; a failure is a warning (the lock expires anyway)."""
        try:
            self._cache.remote.unlock(digest, token)
        except Exception as exc:
            if not self.refused("unlock", exc):
                self.failed("unlock", exc)


def _is_error_reply(exc: BaseException) -> bool:
    """An error *reply* of Redis (the server answered): kernelpack's RESP client's
    ``RespError`` (a reply over the size limit aside: that is one bad entry), or the ``redis``
    package's ``ResponseError`` family (OutOfMemoryError, ReadOnlyError)."""
    from .resp import ReplyTooLarge, RespError

    if isinstance(exc, RespError):
        return not isinstance(exc, ReplyTooLarge)
    return any(c.__name__ == "ResponseError" for c in type(exc).__mro__)
