"""A minimal Redis client (RESP2 over one TCP socket) for the cache's handful of commands.

Why not only the ``redis`` package: ``import redis`` also imports ``redis.asyncio`` and
``asyncio``, ~130 ms on a CI-class machine — longer than a whole warm start from disk
(benchmarks/warmstart.py). The cache needs six commands (GET, SET with EX/PX/NX, EXISTS, DEL,
EVAL, PING) with hard timeouts, so this module speaks them directly. ``rediss://`` (TLS) and
``unix://`` URLs go through the ``redis`` package instead (see :class:`RedisStore`).

Every failure is an ``OSError`` (connection refused, timeout, reset) or :class:`RespError`
(a protocol violation or an error reply); the cache above turns either into a warning. After
any failure the connection is dropped and the next call reconnects. One connection per
process (re-opened after ``fork``), used under a lock by all threads.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from urllib.parse import unquote, urlparse

from ._args import redact_url

__all__ = ["RespClient", "RespError", "ReplyTooLarge", "MAX_REPLY_BYTES", "MIN_TRANSFER_RATE"]

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
        self.db = int(path or 0)
        self.username = unquote(parsed.username) if parsed.username else None
        self.password = unquote(parsed.password) if parsed.password else None
        self.timeout_s = float(timeout_s)
        self.max_reply_bytes = int(max_reply_bytes)
        self._sock: socket.socket | None = None
        self._buf = b""
        self._pid = 0
        self._deadline = 0.0  # monotonic time by which the current command must be answered
        self._lock = threading.Lock()

    # ---- connection ----------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.settimeout(self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._buf, self._pid = sock, b"", os.getpid()
        try:
            if self.password is not None:
                auth = [self.username, self.password] if self.username else [self.password]
                self._roundtrip(["AUTH", *auth])
            if self.db:
                self._roundtrip(["SELECT", str(self.db)])
        except BaseException:
            self.close()
            raise
        return sock

    def __del__(self) -> None:  # a dropped client closes its socket (no ResourceWarning)
        if getattr(self, "_sock", None) is not None and self._pid == os.getpid():
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf = None, b""

    def execute(self, *args: object) -> object:
        """Send one command, return its reply (bytes, int, str, list or None)."""
        with self._lock:
            if self._sock is None or self._pid != os.getpid():
                self._sock = None  # a forked child must not share its parent's socket
                self._connect()
            try:
                return self._roundtrip(list(args))
            except BaseException:
                self.close()  # the stream position is unknown now: start over next time
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
