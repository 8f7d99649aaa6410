"""Fixtures for the cache tests: a small PTX kernel, a cheap Compiled builder, a real
redis-server on a free loopback port (skipped with a reason when the binary is missing)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import kernelpack as kp

SRC = Path(__file__).resolve().parents[2] / "src"
WORKER = Path(__file__).resolve().parent / "worker.py"

from ._cache_kernels import AXPY_PTX, axpy_external, axpy_params, from_cubin  # noqa: F401


@pytest.fixture(scope="session")
def axpy_cubin(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    try:
        from kernelpack.toolchain.nvjitlink import ptx_to_cubin
        from kernelpack.targets import parse_arch

        return ptx_to_cubin(AXPY_PTX, parse_arch("sm_80"))
    except kp.CompileError as exc:
        pytest.skip(f"nvJitLink is not available: {exc}")


@pytest.fixture(scope="session")
def cubin_file(axpy_cubin: bytes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cubin") / "axpy.sm_80.cubin"
    path.write_bytes(axpy_cubin)
    return path


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("KERNELPACK_REMOTE_CACHE", None)
    return env


def spawn_worker(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=worker_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ---- redis -------------------------------------------------------------------------------------
class RedisServer:
    """A redis-server child on 127.0.0.1:<free port>, no persistence."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run "
                        "installs it)")
        pytest.importorskip("redis", reason="the redis package is not installed")
        self.binary, self.workdir = binary, workdir
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url, socket_timeout=0.5).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.05)

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A key pair on disk (private hex, public hex), usable by worker processes."""
    from kernelpack.signing import write_keypair

    path = tmp_path_factory.mktemp("keys") / "fleet.key"
    private, public = write_keypair(path)
    return Path(private), Path(public)
