"""A minimal Redis client (RESP2 over one TCP socket) for the cache's handful of commands.

Why not only the ``redis`` package: ``import redis`` also imports ``redis.asyncio`` and
``asyncio``, ~130 ms on a CI-class machine — longer than a whole warm start from disk
(benchmarks/warmstart.py). The cache needs seven commands (GET, GETEX, SET with EX/PX/NX,
EXISTS, DEL, EVAL, PING) with hard timeouts, so this module speaks them directly.
``rediss://`` (TLS) and ``unix://`` URLs go through the ``redis`` package instead (see
:class:`RedisStore`).

Every failure is an ``OSError`` (connection refused, timeout, reset) or :class:`RespError`
(a protocol violation or an error reply); the cache above turns either into a warning. After
any failure the connection is dropped and the next call reconnects. One connection per
process (re-opened after ``fork``), used under a lock by all threads.

``timeout_s`` bounds the whole connect, name lookup included (:func:`connect_tcp`): a socket
timeout does not bound ``getaddrinfo``, which blocks for resolver timeouts x retries (often
tens of seconds) when DNS is slow or unreachable, and would stall every compile of a process
whose remote is ``redis://cache.internal``. A host name is resolved in a daemon thread that the
caller waits for only ``timeout_s`` (one thread per host at a time, shared by every caller);
an IP literal or ``localhost`` never reaches the resolver, and costs no thread.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
import time
import weakref
from urllib.parse import unquote, urlparse

from ._args import redact_url

__all__ = ["url_options", "RespClient", "RespError", "ReplyTooLarge", "HostLookupError",
           "HostLookupTimeout", "connect_tcp", "resolve_host", "MAX_REPLY_BYTES",
           "MIN_TRANSFER_RATE"]

MAX_REPLY_BYTES = 1 << 30  # default bound on one bulk reply (the cache passes a tighter one)
_MAX_LINE = 64 * 1024
_MAX_ARRAY = 1 << 16
# A bulk reply may take longer than ``timeout_s`` only by the time it needs at this rate, so a
# 64 MiB entry on a slow link still arrives, while a server that trickles bytes cannot stretch
# one command without bound (a per-recv timeout alone never fires against one byte a second).
MIN_TRANSFER_RATE = 8 << 20  # bytes per second


class RespError(OSError):
    """The server sent an error reply, or something that is not RESP."""


class ReplyTooLarge(RespError):
    """A bulk reply announced as larger than ``max_reply_bytes``, refused before reading it.
    The server answered: what it holds under that name is too large, which is a property of
    the value, not of the connection (the cache refuses that one entry and keeps the remote)."""


class HostLookupError(OSError):
    """The host of the remote URL did not resolve (the resolver failed or found no address).
    An OSError like a refused connection, so the cache treats it as an outage: a warning, a
    local compile, and the remote skipped for its back-off."""


class HostLookupTimeout(HostLookupError, TimeoutError):
    """The resolver did not answer within ``timeout_s``. Its lookup cannot be cancelled: the
    thread finishes on its own, and later lookups of the host wait on it instead of starting
    another."""


_Address = tuple  # one getaddrinfo row: (family, type, proto, canonname, sockaddr)


class _Lookup:
    """One ``getaddrinfo`` in a daemon thread, shared by every caller asking for the same host
    while it runs: a resolver that hangs for a minute costs one thread, not one per call."""

    def __init__(self, key: tuple[str, int, int]) -> None:
        self.key = key
        self.done = threading.Event()
        self.result: list[_Address] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        host, port, family = self.key
        try:
            self.result = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
        except Exception as exc:  # gaierror, UnicodeError (a label too long for IDNA), ...
            self.error = exc
        finally:
            with _LOOKUPS_LOCK:
                if _LOOKUPS.get(self.key) is self:
                    del _LOOKUPS[self.key]
            self.done.set()


_LOOKUPS: dict[tuple[str, int, int], _Lookup] = {}
_LOOKUPS_LOCK = threading.Lock()


_CLIENTS: weakref.WeakSet[RespClient] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's lookup threads: waiting on their entries would
    time out every lookup of those hosts; and the lock may have been held mid-fork. So may
    each client's: a parent thread waiting for a reply as another forked left the child's
    first command blocked for ever (review 35); the child opens its own connection anyway."""
    global _LOOKUPS_LOCK
    _LOOKUPS_LOCK = threading.Lock()
    _LOOKUPS.clear()
    for client in list(_CLIENTS):
        client._lock = threading.Lock()
        client._failed_at, client._failure = 0.0, ""


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _literal(host: str, port: int) -> list[_Address] | None:
    """The addresses of an IP literal or of ``localhost`` (RFC 6761: always loopback), built
    without the resolver; None for any other name."""
    if host.lower().rstrip(".") == "localhost":
        rows: list[_Address] = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                                 ("127.0.0.1", port))]
        if socket.has_ipv6:
            rows.append((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                         ("::1", port, 0, 0)))
        return rows
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 4:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]
    # connect() parses a numeric address (with a %scope) itself, never asking the resolver
    return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))]


def resolve_host(host: str, port: int, timeout_s: float, family: int = 0) -> list[_Address]:
    """``getaddrinfo(host, port, family, SOCK_STREAM)`` answered within ``timeout_s``.

    Raises
    ------
    HostLookupTimeout
        The resolver did not answer in time (the message names the host and ``timeout_s``).
    HostLookupError
        The name does not resolve, or resolves to no address.
    """
    literal = _literal(host, port)
    if literal is not None:
        return [row for row in literal if family in (0, row[0])]
    key = (host, port, family)
    with _LOOKUPS_LOCK:
        lookup = _LOOKUPS.get(key)
        start = lookup is None
        if lookup is None:
            lookup = _LOOKUPS[key] = _Lookup(key)  # registered before it runs: see _Lookup.run
    if start:
        try:
            threading.Thread(target=lookup.run, name=f"kernelpack-resolve-{host}",
                             daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: fail this call, not the next ones
            with _LOOKUPS_LOCK:
                _LOOKUPS.pop(key, None)
            raise HostLookupError(f"cannot resolve redis host {host!r}: {exc}") from exc
    if not lookup.done.wait(timeout_s):
        raise HostLookupTimeout(f"redis host {host!r} did not resolve within {timeout_s:g} s "
                                f"(timeout_s): DNS slow or unreachable?")
    if lookup.error is not None:
        raise HostLookupError(f"redis host {host!r} does not resolve "
                              f"({type(lookup.error).__name__}: {lookup.error})") from lookup.error
    if not lookup.result:
        raise HostLookupError(f"redis host {host!r} resolved to no address")
    return list(lookup.result)


def connect_tcp(host: str, port: int, timeout_s: float, family: int = 0) -> socket.socket:
    """A TCP socket connected to ``host:port`` within ``timeout_s`` in all: the name lookup
    (:func:`resolve_host`), then each address in turn with the time left (as
    ``socket.create_connection`` does, which bounds only each connect). The socket is returned
    with the timeout of its last connect; nothing is left open on failure.

    Raises an OSError: :class:`HostLookupError`, ``TimeoutError`` naming the host when time runs
    out, or the last address's error (e.g. ``ConnectionRefusedError``).
    """
    deadline = time.monotonic() + timeout_s
    error: OSError | None = None
    for af, socktype, proto, _, sockaddr in resolve_host(host, port, timeout_s, family):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = None
        try:
            sock = socket.socket(af, socktype, proto)
            sock.settimeout(left)
            sock.connect(sockaddr)
            return sock
        except BaseException as exc:
            if sock is not None:
                sock.close()
            if not isinstance(exc, OSError):
                raise
            error = exc
    if error is None or isinstance(error, TimeoutError):
        raise TimeoutError(f"redis at {host}:{port} did not accept a connection within "
                           f"{timeout_s:g} s (timeout_s)") from error
    raise error


_URL_OPTIONS = ("db", "password", "username")


def url_options(query: str, where: str) -> dict[str, str]:
    """The options of a ``redis://`` URL's query that the cache honours (``db``,
    ``password``, ``username``, as redis-py reads them). Any other is a ValueError naming
    ``where``: ``?db=3`` read by nobody wrote to database 0, and ``?password=`` was never
    sent, without a word."""
    from urllib.parse import parse_qsl

    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"{where}: cannot read the URL's options (expected ?name=value&...)"
                         ) from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name not in _URL_OPTIONS:
            raise ValueError(f"{where}: URL option {name!r} is not supported (supported: "
                             f"{', '.join(_URL_OPTIONS)})")
        if name in options:  # redis-py reads the first, a dict the last: neither, say so
            raise ValueError(f"{where}: URL option {name!r} is given more than once")
        options[name] = value
    if "db" in options and not options["db"].isdigit():
        raise ValueError(f"{where}: the database must be a number (got db={options['db']!r})")
    return options


class RespClient:
    """``redis://[user:password@]host[:port][/db]``: get/set/exists/delete/eval/ping with the
    same call signatures as ``redis.Redis`` for the subset used by the cache."""

    def __init__(self, url: str, timeout_s: float = 1.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "redis" or not parsed.hostname:
            raise ValueError(f"expected redis://host:port/db (got {redact_url(url)!r})")
        self.host = parsed.hostname
        self.port = parsed.port or 6379
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"redis database must be a number (got {path!r} in "
                             f"{redact_url(url)!r})")
        options = url_options(parsed.query, f"remote {redact_url(url)!r}")
        self.db = int(options.get("db", path or 0))
        self.username = unquote(parsed.username) if parsed.username else options.get("username")
        self.password = unquote(parsed.password) if parsed.password else options.get("password")
        self.timeout_s = float(timeout_s)
        self.max_reply_bytes = int(max_reply_bytes)
        self._sock: socket.socket | None = None
        self._buf = b""
        self._pid = 0
        self._deadline = 0.0  # monotonic time by which the current command must be answered
        self._lock = threading.Lock()
        self._failed_at = 0.0  # when a command last failed on the connection, and why
        self._failure = ""  # its text only: the exception's traceback held the command's
        # arguments (an 8 MB entry, three times) until the next failure (review 36)
        _CLIENTS.add(self)

    # ---- connection ----------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        sock = connect_tcp(self.host, self.port, self.timeout_s)  # name lookup included
        try:
            sock.settimeout(self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        self._sock, self._buf, self._pid = sock, b"", os.getpid()
        try:
            if self.password is not None:
                auth = [self.username, self.password] if self.username else [self.password]
                self._roundtrip(["AUTH", *auth])
            if self.db:
                self._roundtrip(["SELECT", str(self.db)])
        except BaseException:
            self._drop()
            raise
        return sock

    def __del__(self) -> None:  # a dropped client closes its socket (no ResourceWarning)
        if getattr(self, "_sock", None) is not None and self._pid == os.getpid():
            self._drop()

    def close(self) -> None:
        """Close the connection once the command in flight, if any, is answered (the next
        command opens a new one): closed under another thread's command, the socket failed
        it with EBADF, the cache took that for an outage (30 s without the remote), and the
        descriptor number could be reused meanwhile by another file."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        """Close the socket (the caller holds the lock, or no thread can use the client)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf = None, b""

    def execute(self, *args: object) -> object:
        """Send one command, return its reply (bytes, int, str, list or None).

        A connection that was open before this command and turns out closed (Redis's idle
        ``timeout``, a proxy's, a Redis restart) is opened again and the command sent once
        more: that is no outage, and treating it as one cost a local compile and 30 s without
        the remote. A failure on a fresh connection, or a timeout, is raised.

        A command that waited for the connection while another thread's command failed on it
        fails at once with that failure, instead of connecting and waiting out its own
        timeout: eight threads behind a hung Redis took eight timeouts in turn (review 35)."""
        arrived = time.monotonic()
        with self._lock:
            if self._failed_at > arrived:
                raise ConnectionError(f"{self._failure} (it failed while this command waited "
                                      f"for the connection)")
            try:
                return self._execute(args)
            except RespError:  # the server answered: no failure of the connection
                raise
            except OSError as exc:
                self._failed_at, self._failure = time.monotonic(), f"{type(exc).__name__}: {exc}"
                raise

    def _execute(self, args: tuple[object, ...]) -> object:
        """:meth:`execute`'s work, under the lock."""
        reused = self._sock is not None and self._pid == os.getpid()
        if not reused:
            if self._sock is not None:  # a forked child must not share its parent's
                inherited, self._sock = self._sock, None  # socket: close its copy (a
                with contextlib.suppress(OSError):  # plain close, no shutdown: the
                    inherited.close()  # parent's connection stays up)
            self._connect()
        try:
            return self._roundtrip(list(args))
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            self._drop()  # the stream position is unknown now: start over
            if not reused:
                raise
        except BaseException:
            self._drop()  # the stream position is unknown now: start over next time
            raise
        self._connect()
        try:
            return self._roundtrip(list(args))
        except BaseException:
            self._drop()
            raise

    def _roundtrip(self, args: list) -> object:
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            data = a if isinstance(a, (bytes, bytearray, memoryview)) else str(a).encode()
            parts += [b"$%d\r\n" % len(data), bytes(data), b"\r\n"]
        assert self._sock is not None
        payload = b"".join(parts)
        # sendall's timeout bounds the whole send; the reply then gets its own deadline
        self._sock.settimeout(self.timeout_s + len(payload) / MIN_TRANSFER_RATE)
        self._sock.sendall(payload)
        self._deadline = time.monotonic() + self.timeout_s
        reply = self._read()
        if isinstance(reply, RespError):
            raise reply
        return reply

    # ---- parsing -------------------------------------------------------------------------------
    def _fill(self, need: int) -> None:
        assert self._sock is not None
        chunks, have = [self._buf], len(self._buf)
        while have < need:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"redis did not answer within {self.timeout_s:g} s "
                                   f"(timeout_s)")
            self._sock.settimeout(left)  # the whole reply, not each recv, is bounded
            chunk = self._sock.recv(max(65536, need - have))
            if not chunk:
                raise ConnectionResetError("redis closed the connection")
            chunks.append(chunk)
            have += len(chunk)
        self._buf = b"".join(chunks)

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line, self._buf = self._buf[:end], self._buf[end + 2:]
                return line
            if len(self._buf) > _MAX_LINE:
                raise RespError("redis reply line too long: not a RESP server?")
            self._fill(len(self._buf) + 1)

    def _read(self) -> object:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8", "replace")
        if kind == b"-":
            return RespError(f"redis error: {rest.decode('utf-8', 'replace')}")
        if kind in (b":", b"$", b"*"):
            try:
                n = int(rest)
            except ValueError:
                raise RespError(f"malformed redis reply {line[:40]!r}") from None
            if kind == b":":
                return n
            if kind == b"$":
                if n < 0:
                    return None
                if n > self.max_reply_bytes:  # refuse before reading: a hostile entry
                    raise ReplyTooLarge(f"redis bulk reply of {n} bytes exceeds the limit "
                                    f"{self.max_reply_bytes}")
                self._deadline += n / MIN_TRANSFER_RATE  # time to transfer what was announced
                self._fill(n + 2)
                data, self._buf = self._buf[:n], self._buf[n + 2:]
                return data
            if n < 0:
                return None
            if n > _MAX_ARRAY:
                raise RespError(f"redis array reply of {n} items is too long")
            items = [self._read() for _ in range(n)]
            for item in items:
                if isinstance(item, RespError):
                    raise item
            return items
        raise RespError(f"malformed redis reply {line[:40]!r}: not a RESP server?")

    # ---- the commands the cache uses -------------------------------------------------------------
    def ping(self) -> bool:
        return self.execute("PING") == "PONG"

    def get(self, name: str) -> bytes | None:
        value = self.execute("GET", name)
        if value is not None and not isinstance(value, bytes):
            raise RespError(f"GET returned {type(value).__name__}, expected a bulk string")
        return value

    def getex(self, name: str, ex: int) -> bytes | None:
        """GET that also sets the key's expiry to ``ex`` seconds (Redis 6.2+)."""
        value = self.execute("GETEX", name, "EX", int(ex))
        if value is not None and not isinstance(value, bytes):
            raise RespError(f"GETEX returned {type(value).__name__}, expected a bulk string")
        return value

    def set(self, name: str, value: bytes, ex: int | None = None, px: int | None = None,
            nx: bool = False) -> bool:
        args: list[object] = ["SET", name, value]
        if ex is not None:
            args += ["EX", int(ex)]
        if px is not None:
            args += ["PX", int(px)]
        if nx:
            args.append("NX")
        return self.execute(*args) == "OK"

    def exists(self, *names: str) -> int:
        return int(self.execute("EXISTS", *names))  # type: ignore[call-overload]

    def delete(self, *names: str) -> int:
        return int(self.execute("DEL", *names))  # type: ignore[call-overload]

    def eval(self, script: str, numkeys: int, *keys_and_args: object) -> object:
        return self.execute("EVAL", script, numkeys, *keys_and_args)
