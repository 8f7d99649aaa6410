"""The remote tier's TTL counts from an entry's last read (``GETEX``), with plain GET on a
server that has no GETEX (before Redis 6.2: simulated here by renaming the command away)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelpack.cache.remote import RedisStore

from .conftest import RedisServer
from .worker import key_for

pytestmark = pytest.mark.redis
redis = pytest.importorskip("redis", reason="the redis package is not installed")

TTL_S = 1000


def _entry_name(store: RedisStore, digest: str) -> str:
    return f"{store.namespace}:entry:{digest}"


@pytest.mark.parametrize("client", ["resp", "redis-py"])
def test_a_read_restarts_the_ttl(redis_server: RedisServer, client: str) -> None:
    store = RedisStore(redis_server.url, ttl_s=TTL_S, client=client)
    digest = key_for(7).digest
    assert store.put(digest, b"envelope bytes")
    raw = redis.Redis.from_url(redis_server.url)
    name = _entry_name(store, digest)
    raw.expire(name, 5)  # as if written ttl_s - 5 seconds ago
    assert store.get(digest) == b"envelope bytes"
    assert TTL_S - 5 <= raw.ttl(name) <= TTL_S
    # a missing entry stays missing (GETEX creates nothing)
    other = key_for(8).digest
    assert store.get(other) is None
    assert not raw.exists(_entry_name(store, other))


@pytest.mark.parametrize("client", ["resp", "redis-py"])
def test_a_server_without_getex_is_read_with_get(tmp_path: Path, client: str) -> None:
    server = RedisServer(tmp_path, extra_args=("--rename-command", "GETEX", ""))
    try:
        store = RedisStore(server.url, ttl_s=TTL_S, client=client)
        digest = key_for(9).digest
        assert store.put(digest, b"old server")
        raw = redis.Redis.from_url(server.url)
        with pytest.raises(redis.ResponseError, match="unknown command"):
            raw.getex(_entry_name(store, digest), ex=TTL_S)  # the server really lacks it
        raw.expire(_entry_name(store, digest), 50)
        for _ in range(2):  # the first read learns it, the second goes straight to GET
            assert store.get(digest) == b"old server"
        assert store._getex is False
        assert raw.ttl(_entry_name(store, digest)) <= 50  # not refreshed: no GETEX there
        assert store.get(key_for(10).digest) is None
    finally:
        server.kill()


def test_other_errors_of_getex_are_not_taken_for_an_old_server(
        redis_server: RedisServer) -> None:
    """A value of another type under the entry key is still a bad entry (WRONGTYPE), and the
    store keeps using GETEX."""
    from kernelpack.cache.remote import BadEntryValue

    store = RedisStore(redis_server.url, ttl_s=TTL_S)
    digest = key_for(11).digest
    redis.Redis.from_url(redis_server.url).lpush(_entry_name(store, digest), b"x")
    with pytest.raises(BadEntryValue, match="not a string"):
        store.get(digest)
    assert store._getex is True
