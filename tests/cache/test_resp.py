"""The minimal RESP client against a real redis-server, and parity with the redis package."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache
from kernelpack.cache.remote import RedisStore
from kernelpack.cache.resp import RespClient, RespError

from .conftest import RedisServer, from_cubin
from .worker import key_for

pytestmark = pytest.mark.redis


def test_commands(redis_server: RedisServer) -> None:
    c = RespClient(redis_server.url, timeout_s=1)
    assert c.ping()
    assert c.get("missing") is None
    big = bytes(range(256)) * 20_000  # 5 MB, binary, with \r\n inside
    assert c.set("k", big, ex=100) and c.get("k") == big
    assert redis_server.client().ttl("k") > 90
    assert c.set("lock", b"a", px=5000, nx=True)
    assert not c.set("lock", b"b", px=5000, nx=True)
    assert c.exists("lock") == 1 and c.exists("nope") == 0
    script = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) " \
             "else return 0 end"
    assert c.eval(script, 1, "lock", "b") == 0 and c.eval(script, 1, "lock", "a") == 1
    assert c.delete("k", "lock") == 1
    with pytest.raises(RespError, match="redis error"):
        c.execute("NOSUCHCOMMAND")
    assert c.ping()  # reconnected after the error


def test_database_and_password(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, password="s3cret")  # skips when redis-server is missing
    try:
        port = server.port
        c = RespClient(f"redis://:s3cret@127.0.0.1:{port}/3", timeout_s=1)
        c.set("x", b"in db 3")
        other = RespClient(f"redis://:s3cret@127.0.0.1:{port}/0", timeout_s=1)
        assert other.get("x") is None and c.get("x") == b"in db 3"
        with pytest.raises(RespError):
            RespClient(f"redis://:wrong@127.0.0.1:{port}/0", timeout_s=1).ping()
    finally:
        server.kill()


def test_bad_urls() -> None:
    with pytest.raises(ValueError, match="redis://"):
        RespClient("http://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="database"):
        RespClient("redis://127.0.0.1:1/x")


def test_reconnects_after_a_restart(tmp_path: Path, redis_server: RedisServer) -> None:
    c = RespClient(redis_server.url, timeout_s=1)
    assert c.ping()
    redis_server.kill()
    with pytest.raises(OSError):
        c.ping()
    redis_server.start()
    c.port = redis_server.port  # a restarted server may get another port here
    assert c.ping()


def test_threads_share_one_client(redis_server: RedisServer) -> None:
    c = RespClient(redis_server.url, timeout_s=2)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(50):
                c.set(f"t{n}:{i}", str(i).encode())
                assert c.get(f"t{n}:{i}") == str(i).encode()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_garbage_replies_are_errors() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(RespError, match="not a RESP server"):
            RespClient(f"redis://127.0.0.1:{server.getsockname()[1]}/0").get("k")
    finally:
        server.close()


@pytest.mark.parametrize("client", ["resp", "redis-py"])
def test_cache_works_with_either_client(tmp_path: Path, redis_server: RedisServer,
                                        axpy_cubin: bytes, signing_keys: tuple[Path, Path],
                                        client: str) -> None:
    private, public = signing_keys

    def cache(disk: str) -> Cache:
        return Cache(tmp_path / disk, remote=RedisStore(redis_server.url, client=client),
                     sign_with=str(private), trusted_keys=[str(public)])

    key = key_for(40)
    assert cache("a").fetch_or_compile(key, lambda: from_cubin("k40", axpy_cubin)).origin \
        == "compiled"
    hit = cache("b").fetch_or_compile(key, lambda: pytest.fail("compiled"))
    assert hit.origin == "remote" and hit.name == "k40"
    assert isinstance(hit, kp.Compiled)
