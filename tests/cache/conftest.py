"""Fixtures for the cache tests: a small PTX kernel, a cheap Compiled builder, a real
redis-server on a free loopback port (skipped with a reason when the binary is missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from kp_redis_helpers import RedisServer, free_port  # noqa: F401  (re-exported)

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
# One starter for the whole suite (tests/kp_redis_helpers.py); re-exported here for the cache
# tests that import RedisServer / free_port from this conftest.
@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test, data in ``tmp_path``; stopped (terminate, wait,
    kill) after it, also when the test killed or restarted it."""
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A key pair on disk (private hex, public hex), usable by worker processes."""
    from kernelpack.signing import write_keypair

    path = tmp_path_factory.mktemp("keys") / "fleet.key"
    private, public = write_keypair(path)
    return Path(private), Path(public)
