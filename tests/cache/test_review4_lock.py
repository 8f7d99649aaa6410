"""Review 4: a stale value at the fleet lock key (no expiry, or not a string: planted by a
crashed old version or by hand) must not make every miss of that key wait ``wait_s``; a live
lock of another process keeps the single flight and is never overwritten or deleted."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from kernelpack.cache import Cache
from kernelpack.cache.remote import RedisStore

from .conftest import RedisServer, from_cubin
from .worker import key_for

pytestmark = pytest.mark.redis

CLIENTS = ("resp", "redis-py")


def _plant(server: RedisServer, name: str, kind: str) -> None:
    r = server.client()
    if kind == "string":
        r.set(name, b"held-by-a-crashed-old-version")  # no expiry
    elif kind == "hash":
        r.hset(name, "owner", "someone")
    elif kind == "list":
        r.rpush(name, "x")
    elif kind == "hash-with-ttl":
        r.hset(name, "owner", "someone")
        r.pexpire(name, 60_000)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["string", "hash", "list", "hash-with-ttl"])
def test_stale_lock_does_not_make_a_miss_wait(tmp_path: Path, redis_server: RedisServer,
                                              axpy_cubin: bytes,
                                              signing_keys: tuple[Path, Path],
                                              kind: str) -> None:
    key = key_for(41)
    name = f"kernelpack:1:lock:{key.digest}"
    _plant(redis_server, name, kind)
    private, public = signing_keys
    cache = Cache(tmp_path, remote=redis_server.url, sign_with=str(private),
                  trusted_keys=[str(public)], wait_s=3.0)
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "waited ... s" warning, no remote failure
        c = cache.fetch_or_compile(key, lambda: from_cubin("k41", axpy_cubin))
    assert time.monotonic() - start < 2.0
    assert c.origin == "compiled"
    stats = cache.stats()
    assert stats["remote_waits"] == 0 and stats["remote_errors"] == 0
    assert stats["remote_puts"] == 1
    # We took the stale key over as a real lock and released it after the compile.
    assert redis_server.client().exists(name) == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_store_takes_over_only_a_stale_lock(redis_server: RedisServer, client: str) -> None:
    store = RedisStore(redis_server.url, client=client)
    r = redis_server.client()
    key = key_for(42)
    name = f"kernelpack:1:lock:{key.digest}"
    r.set(name, b"junk")
    assert not store.is_locked(key)
    token = store.try_lock(key, 5_000)
    assert token is not None and store.is_locked(key)
    assert r.get(name) == token.encode() and 0 < r.pttl(name) <= 5_000
    # Now a live lock: nobody else takes it, and a wrong token does not release it.
    other = RedisStore(redis_server.url, client=client)
    assert other.try_lock(key, 5_000) is None
    other.unlock(key, "not-the-token")
    assert r.get(name) == token.encode()
    store.unlock(key, token)
    assert r.exists(name) == 0


@pytest.mark.parametrize("client", CLIENTS)
def test_unlock_after_the_key_turned_into_another_type(redis_server: RedisServer,
                                                       client: str) -> None:
    """Our lock replaced by a hash meanwhile: unlock leaves it alone instead of failing
    with WRONGTYPE (which would switch the remote off for the back-off)."""
    store = RedisStore(redis_server.url, client=client)
    key = key_for(43)
    name = f"kernelpack:1:lock:{key.digest}"
    token = store.try_lock(key, 5_000)
    assert token is not None
    r = redis_server.client()
    r.delete(name)
    r.hset(name, "owner", "someone")
    store.unlock(key, token)
    assert r.type(name) == b"hash"


def test_live_lock_still_single_flight(tmp_path: Path, redis_server: RedisServer,
                                       axpy_cubin: bytes,
                                       signing_keys: tuple[Path, Path]) -> None:
    """A live lock with an expiry is waited for (up to wait_s), not taken over."""
    key = key_for(44)
    held = RedisStore(redis_server.url).try_lock(key, 20_000)
    assert held is not None
    private, public = signing_keys
    cache = Cache(tmp_path, remote=redis_server.url, sign_with=str(private),
                  trusted_keys=[str(public)], wait_s=0.5)
    start = time.monotonic()
    with pytest.warns(Warning, match="waited"):
        c = cache.fetch_or_compile(key, lambda: from_cubin("k44", axpy_cubin))
    assert time.monotonic() - start >= 0.5 and c.origin == "compiled"
    assert cache.stats()["remote_waits"] == 1
    assert redis_server.client().get(f"kernelpack:1:lock:{key.digest}") == held.encode()
