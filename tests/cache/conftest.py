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


def finish_workers(procs: list[subprocess.Popen], timeout_s: float = 300.0
                   ) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of every worker, within one shared deadline. Whatever
    happens (a timeout, an interrupt), no worker outlives the call: the ones still running are
    killed and reaped, so a failed race leaves no process writing into tmp_path or holding
    Redis, and the caller asserts only once all have been collected."""
    results: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((p.returncode, out, err))
    finally:
        for p in procs[len(results):]:
            if p.poll() is None:
                p.kill()
            p.communicate()  # reap it and close its pipes
    return results


# ---- redis -------------------------------------------------------------------------------------
def free_port() -> int:
    """A loopback port the kernel just handed out. It is free again when this returns, so the
    next process to bind it may not be ours: :meth:`RedisServer.start` checks who answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server child on 127.0.0.1:<free port>, no persistence (optionally with a
    password: ``requirepass``, and more options: ``extra_args``)."""

    START_ATTEMPTS = 5
    START_TIMEOUT_S = 30.0  # a loaded 2-core CI box; normally it answers in milliseconds

    def __init__(self, workdir: Path, password: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run "
                        "installs it)")
        pytest.importorskip("redis", reason="the redis package is not installed")
        self.binary, self.workdir, self.password = binary, workdir, password
        self.extra_args = extra_args  # more redis-server options, e.g. a rename-command
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start on a fresh port, retried: between :func:`free_port` and redis-server's bind
        another process (an outgoing connection, a parallel test run's server) may take the
        port; then ours exits, and a ping alone could even be answered by the other server."""
        for _ in range(self.START_ATTEMPTS):
            self.port = free_port()
            if self._launch():
                return
        raise RuntimeError(f"redis-server did not start on a free port in "
                           f"{self.START_ATTEMPTS} attempts (last port {self.port})")

    def _launch(self) -> bool:
        """Run redis-server on ``self.port``; True once *this* process answers there."""
        import redis

        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        args += list(self.extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while self.proc.poll() is None:
            try:
                info = redis.Redis.from_url(self.url, password=self.password,
                                            socket_timeout=1).info("server")
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"redis-server did not answer on port {self.port} "
                                       f"within {self.START_TIMEOUT_S:g} s") from None
                time.sleep(0.05)
                continue
            if info.get("process_id") == self.proc.pid:
                return True
            break  # another server holds the port: ours cannot bind it
        self.kill()
        return False

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis.from_url(self.url, password=self.password, socket_timeout=5)

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
