"""Redis for the tests, in one place: a free port, a URL where nothing listens, a server that
accepts and never answers, and the one starter of a real redis-server (:class:`RedisServer`).

Every test that needs a real server starts it through :class:`RedisServer` (directly, as a
context manager, or through :func:`redis_server`), so the port picking, the readiness wait, the
configuration and the shutdown are the same everywhere:

* a free loopback port from :func:`free_port`, retried when another process takes it between
  the pick and redis-server's bind (then ours exits with "Address already in use", or a
  stranger's server answers the ping: only an answer from *our* process counts);
* no persistence (``--save "" --appendonly no``), ``--dir`` a directory of the test's;
* ready once it answers PING (after AUTH when it has a password) and INFO names our process,
  within :attr:`RedisServer.START_TIMEOUT_S`; otherwise a :class:`RedisStartError` that ends
  with the server's own log;
* :meth:`RedisServer.stop` (terminate, wait, kill) leaves no process behind, and neither does a
  server a test forgot: the ones still running are reaped when the test process exits.

No redis-py is needed to start or probe a server (the probe speaks RESP itself); the object API
(:meth:`RedisServer.client`) uses redis-py, so by default a missing ``redis`` package skips.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

__all__ = ["HungServer", "RedisServer", "RedisStartError", "down_url", "free_port",
           "hung_server", "redis_binary", "redis_server"]

_FALLBACK_BINARY = "/usr/bin/redis-server"
_SKIP_NO_BINARY = ("redis-server is not installed (apt-get install redis-server; .ci/run "
                   "installs it)")


def free_port() -> int:
    """A loopback port the kernel just handed out. It is free again when this returns, so the
    next process to bind it may not be ours: :meth:`RedisServer.start` checks who answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def down_url(password: str | None = None) -> str:
    """A Redis URL where nothing listens (connection refused at once)."""
    auth = f":{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{free_port()}/0"


class HungServer:
    """Accepts connections and never answers: a Redis that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@contextlib.contextmanager
def hung_server() -> Iterator[HungServer]:
    server = HungServer()
    try:
        yield server
    finally:
        server.close()


# ---- a real redis-server ----------------------------------------------------------------------
class RedisStartError(RuntimeError):
    """redis-server did not come up; the message ends with its log."""


def redis_binary() -> str:
    """The redis-server executable; skips the calling test (with how to get one) when none."""
    binary = shutil.which("redis-server") or (
        _FALLBACK_BINARY if os.access(_FALLBACK_BINARY, os.X_OK) else None)
    if binary is None:
        pytest.skip(_SKIP_NO_BINARY)
    return binary


def _command(stream: IO[bytes], *args: str) -> object:
    """Send one command and read its reply: bytes/str/int, or an ``_Error`` for ``-ERR ...``."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    stream.write(b"".join(parts))
    stream.flush()
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return _Error(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = stream.read(size + 2)
        if len(data) != size + 2:
            raise ConnectionError("connection closed mid-reply")
        return data[:-2]
    raise ConnectionError(f"unexpected reply {line[:40]!r}")


class _Error(str):
    """An error reply (``-NOAUTH ...``, ``-LOADING ...``)."""


def _probe(port: int, password: str | None, timeout_s: float = 1.0) -> int | None:
    """Who answers on ``port``: the answering server's process id once PING (after AUTH) and
    INFO are answered; 0 when a server answers but refuses us (a stranger with another
    password); None while nothing answers yet (refused, reset, silent, still loading)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock, \
                sock.makefile("rwb") as stream:
            if password is not None:
                reply = _command(stream, "AUTH", password)
                if isinstance(reply, _Error):
                    return None if reply.startswith("LOADING") else 0
            reply = _command(stream, "PING")
            if isinstance(reply, _Error):
                return None if reply.startswith("LOADING") else 0
            info = _command(stream, "INFO", "server")
    except (OSError, ValueError):
        return None
    if not isinstance(info, bytes):
        return 0
    for line in info.decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return 0


# Servers started and not yet reaped, with the pid of the process that started them: a test
# that forgets to stop one (or dies in between) must not leave it running past the test run.
# A forked child exiting must not stop its parent's servers, hence the owner pid.
_LIVE: dict[subprocess.Popen, int] = {}


@atexit.register
def _reap_forgotten() -> None:
    for proc, owner in list(_LIVE.items()):
        if owner == os.getpid():
            _stop_process(proc, RedisServer.STOP_TIMEOUT_S)


def _stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """terminate, wait, kill: SIGTERM lets redis-server close its clients; a stopped one
    (SIGSTOP by a test) is continued so that it sees the SIGTERM; one that outlives
    ``timeout_s`` is killed. Always reaped."""
    try:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        if proc.poll() is None:  # interrupted above (Ctrl-C): never leave it running
            proc.kill()
            proc.wait()
        _LIVE.pop(proc, None)


class RedisServer:
    """A redis-server child on 127.0.0.1:<free port>, no persistence, data in ``workdir``
    (created), optionally with a password (``requirepass``) and more options (``extra_args``,
    e.g. ``("--rename-command", "GETEX", "")`` or a ``--unixsocket``). Started by the
    constructor; skips the test when there is no redis-server (or, with ``needs_redis_py``, no
    ``redis`` package for :meth:`client`). Usable as a context manager (:meth:`stop` on exit).
    """

    START_ATTEMPTS = 5
    START_TIMEOUT_S = 30.0  # a loaded 2-core CI box; normally it answers in milliseconds
    STOP_TIMEOUT_S = 10.0
    LOG_TAIL_LINES = 20

    def __init__(self, workdir: Path, password: str | None = None,
                 extra_args: Sequence[str] = (), *, needs_redis_py: bool = True) -> None:
        binary = redis_binary()
        if needs_redis_py:
            pytest.importorskip("redis", reason="the redis package is not installed")
        self.binary, self.workdir, self.password = binary, Path(workdir), password
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._log: IO[bytes] | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, without the password."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start on a fresh port, retried: between :func:`free_port` and redis-server's bind
        another process (an outgoing connection, a parallel test run's server) may take the
        port; then ours exits, and a ping alone could even be answered by the other server."""
        for _ in range(self.START_ATTEMPTS):
            self.port = free_port()
            if self.relaunch():
                return
        raise RedisStartError(f"redis-server did not start on a free port in "
                              f"{self.START_ATTEMPTS} attempts (last port {self.port}); its "
                              f"log:\n{self.log_tail()}")

    def relaunch(self) -> bool:
        """Start redis-server on ``self.port`` (a restart at the same address after
        :meth:`kill`): True once *this* process answers there, False when the port was taken
        (another process bound it, or another server answers). Raises
        :class:`RedisStartError` (with the log) when it fails for another reason or does not
        answer within :attr:`START_TIMEOUT_S`."""
        self.stop()
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        args += list(self.extra_args)
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile(prefix="kp-redis-log-")  # not in workdir: tests list it
        self.proc = proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                            stderr=subprocess.STDOUT, cwd=self.workdir)
        _LIVE[proc] = os.getpid()
        try:
            return self._wait_ready(proc)
        except BaseException:
            self.stop()
            raise

    _launch = relaunch  # the name the restart tests call

    def _wait_ready(self, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while True:
            answer = _probe(self.port, self.password)
            if answer is not None:
                if answer == proc.pid:
                    return True
                self.stop()  # a stranger holds the port: ours cannot bind it
                return False
            code = proc.poll()
            if code is not None:
                log = self.log_tail()
                if "in use" in log:  # "bind: Address already in use": lost the port race
                    self.stop()  # reaped already; forget it
                    return False
                raise RedisStartError(f"redis-server exited with status {code} before it "
                                      f"answered on port {self.port}; its log:\n{log}")
            if time.monotonic() > deadline:
                raise RedisStartError(f"redis-server did not answer PING on port {self.port} "
                                      f"within {self.START_TIMEOUT_S:g} s; its log:\n"
                                      f"{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int | None = None) -> str:
        """The last lines redis-server wrote (stdout and stderr) since its last launch."""
        if self._log is None or self._log.closed:
            return "(no log)"
        fd = self._log.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - 8192)
        text = os.pread(fd, size - start, start).decode(errors="replace")  # keeps the offset
        tail = text.splitlines()[-(lines or self.LOG_TAIL_LINES):]
        return "\n".join(tail) if tail else "(empty log)"

    def client(self) -> Any:
        """A redis-py client of this server (authenticated), 5 s socket timeout."""
        import redis

        return redis.Redis.from_url(self.url, password=self.password, socket_timeout=5)

    def kill(self) -> None:
        """SIGKILL and reap, as a crash would end it ("Redis killed mid-run"); :meth:`start`
        or :meth:`relaunch` bring it back."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
                proc.wait(self.STOP_TIMEOUT_S)
            _LIVE.pop(proc, None)

    def stop(self) -> None:
        """The teardown: terminate, wait, kill; nothing is left running."""
        if self.proc is not None:
            _stop_process(self.proc, self.STOP_TIMEOUT_S)


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    """A real redis-server on a free loopback port (its port), skipping the test when there
    is no redis-server or no ``redis`` package."""
    with RedisServer(directory) as server:
        yield server.port
