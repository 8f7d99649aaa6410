"""Redis stand-ins for the tests: a free port, a URL where nothing listens, a server that
accepts and never answers, and a real redis-server on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest


def free_port() -> int:
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


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    """A real redis-server on a free loopback port (its port), skipping the test when there
    is no redis-server or no ``redis`` package."""
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if binary is None:
        pytest.skip("redis-server is not installed")
    redis = pytest.importorskip("redis")
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                 "", "--appendonly", "no", "--dir", str(directory)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    info = redis.Redis(port=port, socket_timeout=1).info("server")
                except redis.RedisError:
                    time.sleep(0.03)
                    continue
                if info.get("process_id") == proc.pid:
                    yield port
                    return
                break
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    pytest.fail("redis-server did not start")
