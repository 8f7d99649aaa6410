"""Compile-or-load: a disk tier, an optional Redis tier, and the compiler as the last resort.

``cache.fetch_or_compile(key, build)`` looks on disk, then in Redis, then calls ``build()``
and writes the result through to both. Every hit is an artifact that goes back through
``kp.load`` — digests, bounds, and for remote entries a trusted ed25519 signature — because a
cache is untrusted input. A broken entry is quarantined and recompiled; a Redis that is down,
slow or returns garbage is a :class:`CacheWarning` and a local compile. The only exceptions
that escape are the ones ``build()`` raises and misuse of the API.

Concurrency: N processes (or threads) missing one key on one machine compile it once (a
per-key ``flock``); N machines missing it compile it once when Redis is reachable (``SET NX
PX`` lock; the others poll, then load).

The disk tier's files are :class:`~kernelpack.cache.disk.DiskStore`, and its verified reads
and counted writes :class:`~kernelpack.cache.disk_tier.DiskTier`; the remote tier's reads,
writes, back-off and fleet lock are :class:`~kernelpack.cache.remote_tier.RemoteTier`. Both
tiers count and warn through the Cache that holds them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import warnings
from typing import Any, Callable, Iterable

from .. import config
from .._warn import warn_caller
from ..limits import shown_int
from ..errors import KernelPackError
from ..compiled import Compiled
from ._args import flag, from_env, key_list, maintenance, positive_int, seconds
from .disk import DiskStore, check_digest
from .disk_tier import DiskTier
from .keys import CacheKey, make_key, remember_digests_in
from .remote_tier import RemoteTier

__all__ = ["Cache", "CacheKey", "CacheWarning", "make_key", "DiskStore", "STAT_NAMES"]


def _log() -> Any:
    """The ``kernelpack.cache`` logger; ``logging`` (~5 ms) is imported only when something is
    logged, never on a warm start's hit path. The ``kernelpack`` logger gets a NullHandler (as
    a library's should): without one, Python's last-resort handler printed every warning a
    second time beside the CacheWarning; an application that configures logging still gets
    the records."""
    import logging

    root = logging.getLogger("kernelpack")
    if not any(isinstance(h, logging.NullHandler) for h in root.handlers):
        root.addHandler(logging.NullHandler())
    return logging.getLogger("kernelpack.cache")

STAT_NAMES = ("disk_hits", "disk_misses", "remote_hits", "remote_misses", "compiles", "refused",
              "quarantined", "errors", "remote_errors", "remote_waits", "remote_too_large",
              "puts", "remote_puts", "evictions", "disk_too_large")


class CacheWarning(UserWarning):
    """A cache tier failed (disk unwritable, Redis down, an entry refused); work goes on."""


class Cache:
    """A compile-or-load cache.

    Parameters
    ----------
    path:
        Disk cache root (default :func:`kernelpack.config.cache_dir`).
    remote:
        ``"redis://host:port/db"``, a store object with ``get``/``put``, or None (then
        ``$KERNELPACK_REMOTE_CACHE`` if set; pass ``remote=False`` for none at all).
    trusted_keys:
        Public keys (anything :func:`kernelpack.signing.load_public_key` takes) whose signed
        remote entries are accepted, besides the key of ``sign_with``: a process always
        trusts what it signs (with ``sign_with`` not among them it refused its own entries,
        recompiled and overwrote them at every lookup).
    sign_with:
        Private key signing what this process puts (artifact and remote envelope).
    max_bytes:
        Disk size cap (LRU); default ``$KERNELPACK_CACHE_MAX_BYTES`` (10 GiB).
    require_signed_remote:
        When True (the default) a remote entry without a trusted signature is refused and
        counted; with no trusted key at all the remote is only written, never read.
    ttl_s, max_entry_bytes, timeout_s:
        Redis entry lifetime (whole seconds, counted from the entry's last read), the
        largest entry put there (bytes), and the socket timeout (seconds, > 0).
    lock_ttl_s, wait_s:
        Fleet-wide compile lock lifetime (at least 1 ms), and how long a process waits for
        another machine's compile before compiling itself (>= 0). A process waits for
        another process *of this machine* compiling the same key for at most ``lock_ttl_s``
        (then it warns and compiles itself: a hung compile must not stall every process
        that asks for its key). Every number is checked here, remote or not:
        TypeError/ValueError naming the parameter.
    explain_misses:
        Log (INFO, logger ``kernelpack.cache``) which key parts differ from the nearest
        recorded key on every compile; default ``$KERNELPACK_CACHE_EXPLAIN``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, remote: Any = None,
                 trusted_keys: Iterable[object] | None = None, sign_with: object = None,
                 max_bytes: int | None = None, *, require_signed_remote: bool = True,
                 ttl_s: int = 7 * 86400, max_entry_bytes: int = 64 << 20,
                 timeout_s: float = 1.0, lock_ttl_s: float = 120.0, wait_s: float = 30.0,
                 explain_misses: bool | None = None) -> None:
        cap = config.cache_max_bytes() if max_bytes is None else max_bytes
        self.disk = (DiskStore(path, cap) if path is not None else
                     from_env("KERNELPACK_CACHE_DIR",
                              lambda: DiskStore(config.default_cache_dir(), cap)))
        # Redis refuses an expiry whose milliseconds pass int64 ("invalid expire time"): every
        # read and write then failed; 2^31 - 1 s is 68 years
        ttl_s = positive_int("ttl_s", ttl_s, "seconds", maximum=(1 << 31) - 1)
        max_entry_bytes = positive_int("max_entry_bytes", max_entry_bytes, "bytes")
        timeout_s = seconds("timeout_s", timeout_s, 0.0, inclusive=False)
        lock_ttl_s = seconds("lock_ttl_s", lock_ttl_s, 0.001)  # Redis' PX takes whole ms
        wait_s = seconds("wait_s", wait_s, 0.0)
        require_signed_remote = flag("require_signed_remote", require_signed_remote)
        if explain_misses is not None:
            explain_misses = flag("explain_misses", explain_misses)
        env = remote is None
        if env:
            remote = config.remote_cache_url()
        if isinstance(remote, str):
            from .remote import RedisStore

            url = remote
            remote = from_env("KERNELPACK_REMOTE_CACHE" if env else None, lambda: RedisStore(
                url, ttl_s=ttl_s, max_entry_bytes=max_entry_bytes, timeout_s=timeout_s))
        elif remote is False:
            remote = None
        elif remote is not None and not (hasattr(remote, "get") and hasattr(remote, "put")):
            raise TypeError(f"remote must be a redis:// URL or a store with get/put "
                            f"(got {type(remote).__name__})")
        self.remote = remote
        self._trusted_arg = key_list(trusted_keys)
        self.sign_with = sign_with
        self.require_signed_remote = require_signed_remote
        self.lock_ttl_s = lock_ttl_s
        self.wait_s = wait_s
        self.explain_misses = (config.explain_cache_misses() if explain_misses is None
                               else explain_misses)
        self._trusted: list[bytes] | None = None
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._stats_lock = threading.Lock()
        self._disk_tier = DiskTier(self)
        self._remote_tier = RemoteTier(self)
        if sign_with is not None or self._trusted_arg:
            # Misconfigured keys are API misuse: fail here, not at the first miss, and with
            # or without a remote (a program must not start failing when the fleet sets
            # $KERNELPACK_REMOTE_CACHE). This imports cryptography, which only keys need.
            from ..signing import load_for, load_private_key

            if sign_with is not None:
                load_for("sign_with", load_private_key, sign_with)
            load_for("trusted_keys", lambda _: self.trusted_keys, trusted_keys)
        if self.remote is not None and self.require_signed_remote:
            if self._trusted_arg is None and sign_with is None:
                warnings.warn("remote cache has no trusted_keys and no sign_with: remote "
                              "entries will be written but never read", CacheWarning,
                              stacklevel=2)
            elif self._trusted_arg == [] and sign_with is None:  # every entry would be refused
                warnings.warn("remote cache has an empty trusted_keys list: remote entries "
                              "will be written but never read", CacheWarning, stacklevel=2)
        # last: a cache whose arguments were refused lends nothing (review 68)
        remember_digests_in(self.disk.digest_memo())

    def __repr__(self) -> str:
        return f"Cache(path={str(self.disk.root)!r}, remote={self.remote!r})"

    def __reduce__(self) -> Any:
        """Refused by name: a Cache holds a connection, locks and this process's counters
        (pickle said only "cannot pickle '_thread.lock' object", to a user passing one to a
        pool's initializer)."""
        raise TypeError("a kp.Cache cannot be pickled or copied (it holds a connection, locks "
                        "and this process's counters): make one in each worker, with the same "
                        "path, remote and keys, e.g. in a pool's initializer")

    def close(self) -> None:
        """Close the remote connection, if any (the disk tier holds nothing open). The cache
        stays usable: a later remote command reconnects."""
        close = getattr(self.remote, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- counters ----------------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += n

    def stats(self) -> dict[str, int]:
        """This process's counters: hits and misses per tier, compiles, refused (untrusted or
        unsigned remote entries), quarantined (bad disk entries), errors, waits, evictions
        (disk entries this Cache removed for the size cap, by puts or :meth:`prune`), and
        entries not stored for their size (``disk_too_large``: larger than ``max_bytes``;
        ``remote_too_large``: larger than ``max_entry_bytes``), which are no failure."""
        with self._stats_lock:
            out = dict(self._stats)
        out["evictions"] = self.disk.evicted
        return out

    # ---- trust and codecs --------------------------------------------------------------------
    @property
    def trusted_keys(self) -> list[bytes] | None:
        """Raw public keys accepted for remote entries (None or empty: none, so the remote
        is never read)."""
        if self._trusted is None:
            from ..signing import load_public_key, public_key_bytes

            trusted = ([] if self._trusted_arg is None else
                       [load_public_key(k) for k in self._trusted_arg])
            if self.sign_with is not None:
                own = public_key_bytes(self.sign_with)
                if own not in trusted:
                    trusted.append(own)
            self._trusted = trusted if trusted or self._trusted_arg is not None else None
        return self._trusted

    @staticmethod
    def _open(data: bytes, trusted_keys: list[bytes] | None) -> tuple[Any, str]:
        """The entry loaded (verified) and the name of its one program."""
        from ..loader import load

        pack = load(bytes(data), trusted_keys=trusted_keys)
        names = list(pack.programs)
        if len(names) != 1:
            raise KernelPackError(f"a cache entry must hold exactly 1 program (holds "
                                  f"{len(names)}: {names[:5]})")
        return pack, names[0]

    @staticmethod
    def _decode(data: bytes, trusted_keys: list[bytes] | None, origin: str,
                signer: list | None = None) -> Compiled:
        """The entry's one program; ``signer`` (a list) gets the public key (hex) that signed
        the entry, or None for an unsigned one."""
        pack, name = Cache._open(data, trusted_keys)
        if signer is not None:
            signer.append(pack.signature.public_key if pack.signature is not None else None)
        return pack.compiled(name, origin=origin)

    def _encode(self, compiled: Compiled) -> bytes:
        from ..serializer import save

        return save(compiled, sign_with=self.sign_with)

    # ---- the tiers: disk (self._disk_tier) and remote (self._remote_tier) ----------------------
    def _warn(self, message: str) -> None:
        """A CacheWarning attributed to the caller's line. Not also logged: a server that
        routes warnings to its logs (``logging.captureWarnings``) got every event twice, and
        one that ignores CacheWarning still got the log record (review 35)."""
        warn_caller(message, CacheWarning)

    def _from_disk(self, key: CacheKey | str, count_miss: bool = True,
                   name: str | None = None, report: bool = True) -> Compiled | None:
        hit = self._disk_tier.entry(key, count_miss, name, report)
        return None if hit is None else hit[1]

    @property
    def _put_disk(self) -> Callable[..., None]:
        """The disk tier's write, :meth:`DiskTier.put <.disk_tier.DiskTier.put>` (the remote
        tier puts its hits through with it): the bound method itself, not a wrapper, so that
        the warning of a failed write names the caller of the write."""
        return self._disk_tier.put

    # ---- the API -------------------------------------------------------------------------------
    def load(self, key: CacheKey | str, *, name: str | None = None) -> Compiled | None:
        """A verified hit from disk or the remote (put through to disk), or None; ``name``:
        the program the entry must hold (None: any)."""
        hit = self._from_disk(key, name=name)
        if hit is None and self._remote_tier.readable():
            hit = self._remote_tier.get(key, name=name)
        return hit

    def get(self, key: CacheKey | str) -> bytes | None:
        """The verified artifact bytes of ``key`` from disk, else the remote (put through to
        disk), or None: the issue's storage interface, over both tiers. Verified as
        :meth:`load` verifies (a bad disk entry is quarantined, an untrusted remote one
        refused), since the bytes are executable code whoever asks for them."""
        hit = self._disk_tier.entry(key)
        if hit is not None:
            return hit[0]  # the bytes that were verified, not a second read of the file
        if self._remote_tier.readable():
            return self._remote_tier.fetch(key)[0]
        return None

    def put(self, key: CacheKey | str, data: bytes) -> None:
        """Store artifact bytes (from ``kp.save`` of one program) under ``key`` on disk and on
        the remote, signed with ``sign_with`` when it is given (the artifact itself is
        re-signed unless that key signed it already; its body and images are unchanged).
        TypeError/ValueError for data that is not such an artifact: signing and sharing
        garbage would only make every reader refuse it."""
        check_digest(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be artifact bytes (got {type(data).__name__})")
        data = bytes(data)
        try:
            pack, program = self._open(data, None)
            pack.compiled(program, origin="disk")  # its summary decodes: garbage stops here
        except KernelPackError as exc:
            raise ValueError(f"data is not a single-program kernelpack artifact "
                             f"({type(exc).__name__}: {exc})") from None
        if self.sign_with is not None:
            from ..signing import public_key_bytes

            signer = pack.signature.public_key if pack.signature is not None else None
            if signer != public_key_bytes(self.sign_with).hex():
                # signed as the cache signs what it compiles: readers of the remote take an
                # artifact only with a trusted signature of its own (not only the envelope's);
                # the pack verified above is re-signed, not loaded again
                from ..serializer import resign

                data = resign(pack, self.sign_with)
        self._put_disk(key, data, program=program)
        if self.remote is not None:
            self._remote_tier.put(key, data)

    def store(self, key: CacheKey | str, compiled: Compiled) -> bytes | None:
        """Serialize ``compiled`` and write it to disk and the remote; the artifact bytes, or
        None when it cannot be serialized (a warning, counted as an error)."""
        try:
            data = self._encode(compiled)
        except Exception as exc:
            self._count("errors")
            self._warn(f"cannot serialize {compiled.name!r} for the cache: {exc}")
            return None
        try:
            self._put_disk(key, data, program=compiled.name)
        finally:  # a disk warning raised as an error (simplefilter("error")) must not cost
            if self.remote is not None:  # the fleet its copy of this compile (review 35)
                self._remote_tier.put(key, data)
        return data

    def fetch_or_compile(self, key: CacheKey | str, build: Callable[[], Compiled], *,
                         name: str | None = None) -> Compiled:
        """The compiled program for ``key``: from disk, else the remote, else ``build()``.

        ``name``, when given, is the program ``build()`` makes: a hit holding another program
        is not this key's entry (quarantined on disk, refused from the remote).
        Returns a :class:`~kernelpack.Compiled` whose ``origin`` is ``"disk"``, ``"remote"``
        or ``"compiled"``. Raises only what ``build()`` raises (and TypeError if it returns
        something that is not a Compiled).
        """
        digest = check_digest(key)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a program name (str) or None (got "
                            f"{type(name).__name__})")
        # One disk outcome per call: a miss is counted once it is known to be one, so that a
        # thread that waits for another's compile and then hits counts a hit, not both.
        hit = self._from_disk(key, count_miss=False, name=name)
        if hit is not None:
            return hit
        # The remote before the local lock: a hit needs no lock (concurrent put-throughs of
        # one entry are atomic and identical), and a warm start from Redis skips 50 flocks.
        status = "off"
        counted = False
        if self._remote_tier.readable():
            self._count("disk_misses")
            counted = True
            hit, status = self._remote_tier.lookup(key, name=name)
            if hit is not None:
                return hit
        with contextlib.ExitStack() as stack:
            try:
                if self._disk_tier.writable():  # else warned already: compile without it
                    stack.enter_context(self.disk.lock(digest, wait_s=self.lock_ttl_s))
            except (OSError, KernelPackError) as exc:
                self._count("errors")
                self._disk_tier.failed(
                    f"taking the disk lock for {digest[:16]} (compiling without single-flight)",
                    exc, f"cannot take the disk lock for {digest[:16]} ({exc}); compiling "
                         f"without single-flight")
            # filled while we waited?
            hit = self._from_disk(key, count_miss=not counted, name=name, report=False)
            if hit is not None:
                return hit
            token = None
            # Only a plain miss waits for the fleet: after a refused entry (which our
            # put-through will overwrite) or an outage, compile here at once. The tier's lock
            # looks at the remote again once it holds the fleet lock.
            if status == "miss" and self._remote_tier.ok():
                hit, token = self._remote_tier.lock(key, name)
                if hit is not None:
                    return hit
            if token is not None:
                stack.callback(self._remote_tier.unlock, digest, token)
            if self.explain_misses and isinstance(key, CacheKey):
                _log().info("cache miss: %s", self.explain_miss(key, name))
            compiled = build()
            if not isinstance(compiled, Compiled):
                raise TypeError(f"build() must return a kp.Compiled (got "
                                f"{type(compiled).__name__})")
            self._count("compiles")
            self.store(key, compiled)
            return dataclasses.replace(compiled, origin="compiled")

    def external(self, *args: Any, **kwargs: Any) -> Compiled:
        """``kp.external(...)`` through the cache: same arguments, keyed by the source bytes
        (PTX, LLVM IR or cubins) and every other argument (see
        :func:`kernelpack.cache.external_key.external_key`)."""
        from .external_key import external_key

        key, build = external_key(args, kwargs)
        name = args[0] if args else kwargs.get("name")
        return self.fetch_or_compile(key, build, name=name if isinstance(name, str) else None)

    # ---- inspection ----------------------------------------------------------------------------
    def key_record(self, digest: str) -> CacheKey | None:
        """The recorded parts of ``digest`` (disk record, else remote), or None. A remote
        that cannot be asked is a warning and the remote tier's back-off, as for a lookup."""
        from .explain import key_record

        remote = self.remote if self._remote_tier.ok() else None
        digest = check_digest(digest)
        return key_record(self.disk, remote, digest, lambda exc: self._remote_tier.failed(
            f"read of the record of {digest[:16]}", exc, "not asking it"))

    def explain(self, key: CacheKey | str) -> str:
        """The parts of a key, and whether the disk holds it."""
        from .explain import explain

        record = key if isinstance(key, CacheKey) else self.key_record(check_digest(key))
        return explain(self.disk, check_digest(key), record)

    def explain_miss(self, key: CacheKey, name: str | None = None) -> str:
        """Why ``key`` missed: the parts that differ from the nearest recorded key (of
        program ``name``, when given and recorded)."""
        from .explain import explain_miss

        return explain_miss(self.disk, key, name)

    def prune(self, max_bytes: int | None = None) -> tuple[int, int]:
        """Evict down to ``max_bytes`` (default: the cap) and remove stale temporary files;
        returns ``(entries removed, bytes freed)``. ``max_bytes=0`` empties the cache; a
        negative or non-integer size is refused (it would silently mean 0). A cache under the
        cap needs no write (read-only is fine); one that cannot be evicted is a CacheError."""
        if max_bytes is not None:
            shown = shown_int(max_bytes) if isinstance(max_bytes, int) else f"{max_bytes!r:.60}"
            message = f"max_bytes must be a byte count >= 0 or None (got {shown})"
            if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
                raise TypeError(message)
            if max_bytes < 0:
                raise ValueError(message)
        self.disk.prune_temps()
        cap = self.disk.max_bytes if max_bytes is None else max_bytes
        with maintenance("prune", self.disk.root):  # read-only, or another user's
            return self.disk.evict(cap) if cap is not None else (0, 0)

    def clear(self) -> int:
        """Remove every disk entry (not the remote's); returns how many. CacheError naming
        the directory when it cannot be emptied (read-only, another user's)."""
        with maintenance("clear", self.disk.root):
            return self.disk.clear()
