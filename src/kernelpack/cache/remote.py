"""The remote tier: Redis, shared by a fleet, and treated as hostile.

A remote entry is executable code that any process with write access to Redis could have
planted, so what is stored is an *envelope* binding the artifact to its key::

    b"KPCE" | version (1 byte) | key digest (32) | public key (32) | signature (64) | artifact

The ed25519 signature covers ``"kernelpack-cache-entry-v1\\0" + key digest + sha256(artifact)``,
so a trusted signed artifact cannot be replayed under another key, and the artifact inside
carries its own kernelpack signature, checked again by ``kp.load(trusted_keys=...)``.

``redis://`` URLs are served by :mod:`kernelpack.cache.resp` (seven commands, no heavy
import);
``rediss://`` and ``unix://`` by the ``redis`` package, imported on first use. Every call has a
socket timeout; the cache above turns any failure into a warning and a local compile (see
:class:`kernelpack.cache.remote_tier.RemoteTier`). The name lookup is bounded by
``timeout_s`` too, for both clients: the ``redis`` package resolves with a plain, unbounded
``getaddrinfo``, so its TCP connect is replaced by :func:`~kernelpack.cache.resp.connect_tcp`
(see :func:`_bounded_connection_class`; TLS still verifies the URL's host name).
Keys: ``kernelpack:1:entry:<digest>``, ``...:lock:<digest>``, ``...:parts:<digest>``.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import struct
from typing import Any, Iterable

from ..errors import CacheError, SignatureError
from ._args import redact_url
from .disk import check_digest
from .keys import CacheKey
from .resp import ReplyTooLarge, RespError

__all__ = ["RedisStore", "BadEntryValue", "redact_url", "wrap_entry", "unwrap_entry",
           "ENTRY_MAGIC", "ENTRY_DOMAIN"]

ENTRY_MAGIC = b"KPCE"
ENTRY_VERSION = 1
ENTRY_DOMAIN = b"kernelpack-cache-entry-v1\0"
_HEADER = struct.Struct(">4sB32s32s64s")
# A live lock is a string with an expiry (``SET NX PX`` always sets one). Anything else at the
# lock key (a value without expiry or of another type, planted by a crashed old version or by
# hand) is stale: nobody is compiling behind it, and waiting for it would cost every miss of
# that key the whole ``wait_s``. Each script tests and acts in one step, so a live lock of
# another process is never overwritten or deleted.
_LIVE = "redis.call('type', KEYS[1])['ok'] == 'string' and redis.call('pttl', KEYS[1]) ~= -1"
_UNLOCK = ("if redis.call('type', KEYS[1])['ok'] == 'string' and "
           "redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
           "else return 0 end")
_TAKE_STALE = (f"if {_LIVE} then return 0 end "
               "redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2]) return 1")
_IS_LIVE = f"if {_LIVE} then return 1 else return 0 end"


class BadEntryValue(CacheError):
    """The value under an entry key cannot be an entry: larger than any entry may be
    (``max_entry_bytes`` plus the envelope header), or not a string (``WRONGTYPE``). A bad
    entry, refused like any other, not a remote outage: the server answered."""


def _message(digest: str, artifact: bytes) -> bytes:
    return ENTRY_DOMAIN + bytes.fromhex(digest) + hashlib.sha256(artifact).digest()


def wrap_entry(digest: str, artifact: bytes, sign_with: object | None) -> bytes:
    """The envelope for ``artifact`` under key ``digest``; unsigned (zero key and signature)
    when ``sign_with`` is None."""
    check_digest(digest)
    if sign_with is None:
        public, signature = bytes(32), bytes(64)
    else:
        from ..signing import load_private_key, public_key_bytes

        private = load_private_key(sign_with)
        public, signature = public_key_bytes(private), private.sign(_message(digest, artifact))
    return _HEADER.pack(ENTRY_MAGIC, ENTRY_VERSION, bytes.fromhex(digest), public,
                        signature) + artifact


def signed_entry(digest: str, data: bytes) -> bool:
    """Whether ``data`` is an envelope for ``digest`` whose signature verifies under the key
    it names (trusted or not): what an unsigned writer must not replace."""
    try:
        public = _HEADER.unpack_from(data)[3]
        if public == bytes(32):
            return False
        unwrap_entry(digest, data, [public])
    except (CacheError, SignatureError, ValueError, struct.error, TypeError):
        return False
    return True


def unwrap_entry(digest: str, data: bytes, trusted_keys: Iterable[object] | None) -> bytes:
    """The artifact inside an envelope, after checking it is for ``digest`` and, unless
    ``trusted_keys`` is None, signed by one of them.

    Raises
    ------
    CacheError
        Not an envelope (garbage, truncated, other version) or made for another key.
    SignatureError
        Unsigned, signed by an untrusted key, or a signature that does not verify.
    """
    check_digest(digest)
    if not isinstance(data, (bytes, bytearray)) or len(data) < _HEADER.size:
        raise CacheError(f"remote entry {digest[:16]}: {len(data) if data else 0} bytes is "
                         f"shorter than the {_HEADER.size}-byte envelope header")
    magic, version, key, public, signature = _HEADER.unpack_from(data)
    if magic != ENTRY_MAGIC or version != ENTRY_VERSION:
        raise CacheError(f"remote entry {digest[:16]}: not a kernelpack cache envelope "
                         f"(magic {magic!r} version {version}, expected {ENTRY_MAGIC!r} "
                         f"version {ENTRY_VERSION})")
    if key.hex() != digest:
        raise CacheError(f"remote entry {digest[:16]}: envelope is for key {key.hex()[:16]}")
    artifact = bytes(data[_HEADER.size:])
    if trusted_keys is None:
        return artifact
    if public == bytes(32):
        raise SignatureError(f"remote entry {digest[:16]} is unsigned; trusted keys are required")
    # Not signing.verify_digest: an entry signature has its own domain (ENTRY_DOMAIN), so an
    # artifact signature can never be passed off as an entry signature or the reverse.
    from ..signing import key_id, load_public_key

    trusted = [load_public_key(k) for k in trusted_keys]
    if public not in trusted:
        raise SignatureError(f"remote entry {digest[:16]} is signed by key {key_id(public)}, "
                             f"which is not trusted")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ed25519

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public).verify(signature,
                                                                   _message(digest, artifact))
    except InvalidSignature:
        raise SignatureError(f"remote entry {digest[:16]}: signature by key {key_id(public)} "
                             f"does not verify (entry modified or replayed)") from None
    return artifact


def _check_url(url: str) -> None:
    """ValueError naming ``remote`` for a URL no client could connect with (a port or
    database that is not a number, no host): found here, not as a warning at the first miss
    that then switches the remote off for a while."""
    from urllib.parse import urlparse

    shown = redact_url(url)  # what the messages below show
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [ in the host
        raise ValueError(f"remote {shown!r}: {exc}") from None
    url = shown
    if parsed.scheme == "unix":
        if not parsed.path:
            raise ValueError(f"remote {url!r}: a unix:// URL needs a socket path")
        return
    if not parsed.hostname:
        raise ValueError(f"remote {url!r}: no host (expected redis://host:port/db)")
    db = parsed.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"remote {url!r}: the database must be a number (got {db!r})")
    from .resp import url_options

    url_options(parsed.query, f"remote {url!r}")  # no option the clients would ignore


@functools.lru_cache(maxsize=None)
def _bounded_connection_class(tls: bool) -> type:
    """The ``redis`` package's connection class (TCP, or TLS for ``rediss://``) with its TCP
    connect replaced by :func:`~kernelpack.cache.resp.connect_tcp`, so a hung DNS resolver
    costs ``timeout_s``, not resolver timeouts x retries.

    Why it holds across versions: ``Connection._connect`` has made the plain TCP socket in
    every redis-py since 3.0, and ``SSLConnection._connect`` wraps ``super()._connect()``;
    the TLS class puts the bounded one after ``SSLConnection`` in its MRO, so the handshake
    (SNI and certificate checks against the URL's host) is the package's own. Were a version
    to stop calling ``_connect``, the override would merely be unused (an unbounded lookup
    again), never a broken connection.
    """
    import socket

    from redis.connection import Connection, SSLConnection

    from .resp import connect_tcp

    class BoundedConnection(Connection):  # type: ignore[misc]
        def _connect(self) -> socket.socket:
            timeout = getattr(self, "socket_connect_timeout", None)
            if timeout is None:  # not how RedisStore builds it: keep the package's behaviour
                return super()._connect()
            sock = connect_tcp(self.host, self.port, timeout, getattr(self, "socket_type", 0))
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if getattr(self, "socket_keepalive", False):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                    for opt, value in (getattr(self, "socket_keepalive_options", None)
                                       or {}).items():
                        sock.setsockopt(socket.IPPROTO_TCP, opt, value)
                sock.settimeout(self.socket_timeout)
            except BaseException:
                sock.close()
                raise
            return sock

    if not tls:
        return BoundedConnection

    class BoundedSSLConnection(SSLConnection, BoundedConnection):  # type: ignore[misc]
        pass

    return BoundedSSLConnection


class RedisStore:
    """``get(key) -> bytes | None`` / ``put(key, data)`` over Redis, plus a fleet-wide lock.

    Every method may raise the ``redis`` package's exceptions (connection refused, timeout);
    the caller decides what a failure means.
    """

    def __init__(self, url: str, *, ttl_s: int = 7 * 86400, max_entry_bytes: int = 64 << 20,
                 timeout_s: float = 1.0, namespace: str = "kernelpack:1",
                 client: str = "resp") -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"remote must be a redis://host:port/db URL (got "
                             f"{redact_url(url) if isinstance(url, str) else url!r:.80})")
        _check_url(url)
        if not isinstance(ttl_s, int) or ttl_s <= 0:
            raise ValueError(f"ttl_s must be a positive int (got {ttl_s!r})")
        if not isinstance(max_entry_bytes, int) or max_entry_bytes <= 0:
            raise ValueError(f"max_entry_bytes must be a positive int (got {max_entry_bytes!r})")
        self.url = url
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes
        self.timeout_s = float(timeout_s)
        self.namespace = namespace
        if client not in ("resp", "redis-py"):
            raise ValueError(f"client must be 'resp' or 'redis-py' (got {client!r})")
        self.client_kind = client
        self._client: Any = None
        self._getex = True  # False once the server said it has no GETEX (before Redis 6.2)

    def __repr__(self) -> str:
        return f"RedisStore({redact_url(self.url)!r})"

    def close(self) -> None:
        """Close the connection (the next command opens a new one), without failing another
        thread's command in flight: kernelpack's own client closes once that command is
        answered; the ``redis`` package's pool closes its idle connections only (the one in
        use is closed when the pool is dropped)."""
        client, self._client = self._client, None
        if client is None:
            return
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            try:
                pool.disconnect(inuse_connections=False)
                return
            except TypeError:  # a redis package without that keyword: close them all
                pass
        client.close()

    @property
    def client(self) -> Any:
        """The connection: kernelpack's own RESP client for ``redis://`` (no 130 ms ``import
        redis``), the ``redis`` package for ``rediss://`` (TLS), ``unix://``, or when asked
        with ``client="redis-py"``."""
        if self._client is None:
            if self.url.startswith("redis://") and self.client_kind == "resp":
                from .resp import RespClient

                # Never download more than an entry may be (plus the envelope header).
                self._client = RespClient(self.url, self.timeout_s,
                                          max_reply_bytes=self.max_entry_bytes + _HEADER.size)
                return self._client
            try:
                import redis
            except ImportError as exc:
                raise CacheError(f"remote {redact_url(self.url)!r} needs the 'redis' package: "
                                 f"install "
                                 f"kernelpack[redis]") from exc
            kwargs: dict[str, Any] = {}
            if not self.url.startswith("unix://"):  # a socket path has no name to look up
                kwargs["connection_class"] = _bounded_connection_class(
                    self.url.startswith("rediss://"))
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
                retry_on_timeout=False, health_check_interval=0, **kwargs)
        return self._client

    def _name(self, what: str, key: str | CacheKey) -> str:
        return f"{self.namespace}:{what}:{check_digest(key)}"

    def get(self, key: str | CacheKey) -> bytes | None:
        """The envelope under ``key``, or None; :class:`BadEntryValue` for a value of another
        type, or larger than an entry may be (never downloaded by the RESP client; refused
        after the fact by redis-py, which has no reply limit)."""
        limit = self.max_entry_bytes + _HEADER.size
        try:
            value = self._get_refreshing(self._name("entry", key))
        except Exception as exc:  # RespError, or the redis package's ResponseError
            if isinstance(exc, ReplyTooLarge):
                raise BadEntryValue(f"remote entry {check_digest(key)[:16]}: {exc} "
                                    f"(max_entry_bytes {self.max_entry_bytes} + envelope "
                                    f"header)") from None
            if "WRONGTYPE" in str(exc) and (isinstance(exc, RespError) or
                                            type(exc).__name__ == "ResponseError"):
                raise BadEntryValue(f"remote entry {check_digest(key)[:16]} is not a string "
                                    f"value ({exc})") from None
            raise
        if value is not None and len(value) > limit:
            raise BadEntryValue(f"remote entry {check_digest(key)[:16]}: {len(value)} bytes "
                                f"exceed the limit {limit} (max_entry_bytes "
                                f"{self.max_entry_bytes} + envelope header)")
        return None if value is None else bytes(value)

    def _get_refreshing(self, name: str) -> Any:
        """GET ``name`` and restart its TTL (``GETEX ... EX ttl_s``): ``ttl_s`` counts from an
        entry's last use, so the entries a fleet keeps reading never expire under it (which
        made every machine miss, and one recompile, each ``ttl_s``), while unused ones still
        go. A server older than Redis 6.2 has no GETEX: plain GET from then on (the TTL then
        counts from the entry's write)."""
        client = self.client
        if self._getex:
            try:
                return client.getex(name, ex=self.ttl_s)
            except Exception as exc:  # RespError, or the redis package's ResponseError
                if "unknown command" not in str(exc).lower():
                    raise
                self._getex = False
        return client.get(name)

    def put(self, key: str | CacheKey, data: bytes) -> bool:
        """Store with the TTL; False (nothing stored) when over ``max_entry_bytes``."""
        if len(data) > self.max_entry_bytes:
            return False
        self.client.set(self._name("entry", key), bytes(data), ex=self.ttl_s)
        return True

    def put_parts(self, key: CacheKey, record: bytes) -> None:
        self.client.set(self._name("parts", key), record, ex=self.ttl_s)

    def get_parts(self, key: str) -> bytes | None:
        value = self.client.get(self._name("parts", key))
        return None if value is None else bytes(value)

    def try_lock(self, key: str | CacheKey, ttl_ms: int) -> str | None:
        """Take the fleet-wide compile lock (``SET NX PX``); a token to unlock with, or None
        when another process holds it. A stale value at the lock key (no expiry, or not a
        string) is replaced by our lock in one script: nobody holds it."""
        token = secrets.token_hex(16)
        name = self._name("lock", key)
        if self.client.set(name, token, nx=True, px=int(ttl_ms)):
            return token
        # The RESP client sends a command again after a connection reset: when the first SET
        # took the lock and only its reply was lost, the second finds our own token there
        # (review 28: the process then waited wait_s for itself).
        try:
            if self.client.get(name) == token.encode():
                return token
        except Exception as exc:  # WRONGTYPE: a stale value of another type, taken over below
            if "WRONGTYPE" not in str(exc):
                raise
        taken = self.client.eval(_TAKE_STALE, 1, name, token, int(ttl_ms))
        return token if int(taken) == 1 else None  # type: ignore[call-overload]

    def is_locked(self, key: str | CacheKey) -> bool:
        """A live lock is held (a stale value at the lock key does not count: see
        :meth:`try_lock`)."""
        live = self.client.eval(_IS_LIVE, 1, self._name("lock", key))
        return int(live) == 1  # type: ignore[call-overload]

    def unlock(self, key: str | CacheKey, token: str) -> None:
        """Release the lock only if it is still ours (compare-and-delete in one script)."""
        self.client.eval(_UNLOCK, 1, self._name("lock", key), token)

    def delete(self, key: str | CacheKey) -> None:
        self.client.delete(self._name("entry", key), self._name("parts", key))
