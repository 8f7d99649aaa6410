"""Review 8 (flakiness): the redis-server fixture picked a free port, closed it and started
redis-server there. When something else took the port in between (an outgoing connection of
a worker, a parallel test run), our server exited and the fixture failed the test ("did not
start"); when the taker was another redis-server, its answer to the ping was taken for ours
and the test ran against a stranger's server. Now the fixture retries on a fresh port and
accepts only an answer from its own process.

The worker races asserted on each worker in turn: a failed or hung one left the others
running past the test (writing into tmp_path, holding Redis). ``finish_workers`` collects
them all and kills what is left."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import kp_redis_helpers

from .conftest import RedisServer, finish_workers

pytestmark = pytest.mark.redis


def _first_then_free(port: int) -> Callable[[], int]:
    """A free_port that hands out ``port`` (taken) once, then really free ports."""
    ports: Iterator[int] = iter([port])
    real = kp_redis_helpers.free_port
    return lambda: next(ports, None) or real()


def _owns(server: RedisServer) -> bool:
    assert server.proc is not None
    return server.proc.poll() is None and \
        server.client().info("server")["process_id"] == server.proc.pid


def test_a_port_taken_before_redis_binds_it_is_retried(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:  # listens, never answers
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(kp_redis_helpers, "free_port", _first_then_free(taken))
        server = RedisServer(tmp_path)
        try:
            assert server.port != taken and _owns(server)
        finally:
            server.kill()


def test_another_redis_on_the_port_is_not_taken_for_ours(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    stranger = RedisServer(tmp_path / "a")
    try:
        monkeypatch.setattr(kp_redis_helpers, "free_port", _first_then_free(stranger.port))
        mine = RedisServer(tmp_path / "b")
        try:
            assert mine.port != stranger.port and _owns(mine) and _owns(stranger)
        finally:
            mine.kill()
    finally:
        stranger.kill()


def test_a_password_server_starts_and_refuses_the_wrong_password(tmp_path: Path) -> None:
    import redis

    server = RedisServer(tmp_path, password="s3cret")
    try:
        assert _owns(server)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url, password="wrong", socket_timeout=5).ping()
    finally:
        server.kill()


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_finish_workers_collects_every_worker() -> None:
    procs = [_python("print('a')"), _python("import sys; sys.exit('b failed')")]
    assert finish_workers(procs) == [(0, "a\n", ""), (1, "", "b failed\n")]


def test_finish_workers_leaves_no_worker_running_after_a_timeout() -> None:
    procs = [_python("print('quick')"), _python("import time; time.sleep(60)"),
             _python("import time; time.sleep(60)")]
    with pytest.raises(subprocess.TimeoutExpired):
        finish_workers(procs, timeout_s=1.0)
    assert [p.poll() is not None for p in procs] == [True, True, True]
    assert all(p.stdout is not None and p.stdout.closed for p in procs[1:])
