"""The remote tier against an in-memory store (no Redis needed): put-through and hits, the
back-off after a failure, the fleet lock's wait, and no reference cycle with its Cache."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from kernelpack.cache import Cache, CacheWarning

from .conftest import from_cubin
from .worker import key_for


class MemoryStore:
    """What the tier needs of a remote, in a dict; counts calls so tests can see skips."""

    def __init__(self, fail: bool = False, held: bool = False) -> None:
        self.entries: dict[str, bytes] = {}
        self.parts: dict[str, bytes] = {}
        self.fail, self.held = fail, held
        self.calls = {"get": 0, "put": 0, "try_lock": 0}

    def get(self, digest: str) -> bytes | None:
        self.calls["get"] += 1
        if self.fail:
            raise ConnectionError("store is down")
        return self.entries.get(digest)

    def put(self, digest: str, data: bytes) -> bool:
        self.calls["put"] += 1
        self.entries[digest] = data
        return True

    def put_parts(self, key: object, data: bytes) -> None:
        self.parts[key.digest] = data  # type: ignore[attr-defined]

    def try_lock(self, digest: str, ttl_ms: int) -> str | None:
        self.calls["try_lock"] += 1
        return None if self.held else "token"

    def is_locked(self, digest: str) -> bool:
        return self.held

    def unlock(self, digest: str, token: str) -> None:
        pass


def _lax(path: Path, store: MemoryStore, **kw: object) -> Cache:
    return Cache(path, remote=store, require_signed_remote=False, **kw)  # type: ignore[arg-type]


def test_put_through_then_remote_hit_then_disk_hit(tmp_path: Path, axpy_cubin: bytes) -> None:
    store = MemoryStore()
    key = key_for(60)
    a = _lax(tmp_path / "a", store)
    assert a.fetch_or_compile(key, lambda: from_cubin("k60", axpy_cubin)).origin == "compiled"
    assert a.stats()["remote_puts"] == 1 and key.digest in store.parts
    b = _lax(tmp_path / "b", store)
    assert b.fetch_or_compile(key, lambda: pytest.fail("compiled")).origin == "remote"
    assert b.fetch_or_compile(key, lambda: pytest.fail("compiled")).origin == "disk"
    assert (b.stats()["remote_hits"], b.stats()["disk_hits"]) == (1, 1)


def test_a_failure_backs_off_instead_of_paying_per_key(tmp_path: Path, axpy_cubin: bytes) -> None:
    store = MemoryStore(fail=True)
    cache = _lax(tmp_path, store)
    with pytest.warns(CacheWarning, match=r"remote cache read failed \(ConnectionError"):
        cache.fetch_or_compile(key_for(61), lambda: from_cubin("k61", axpy_cubin))
    for i in (62, 63):
        cache.fetch_or_compile(key_for(i), lambda i=i: from_cubin(f"k{i}", axpy_cubin))
    assert store.calls == {"get": 1, "put": 0, "try_lock": 0}  # skipped while backing off
    stats = cache.stats()
    assert (stats["remote_errors"], stats["compiles"], stats["remote_puts"]) == (1, 3, 0)


def test_waits_for_a_held_lock_then_compiles(tmp_path: Path, axpy_cubin: bytes) -> None:
    store = MemoryStore(held=True)
    cache = _lax(tmp_path, store, wait_s=0.2)
    with pytest.warns(CacheWarning, match="waited 0 s for another process to compile"):
        c = cache.fetch_or_compile(key_for(64), lambda: from_cubin("k64", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["remote_waits"] == 1
    assert store.calls["get"] >= 2  # the first miss, then polls while the lock was held


def test_a_dropped_cache_is_freed_without_the_garbage_collector(tmp_path: Path) -> None:
    """The tier refers to its Cache weakly, so the Cache (and its Redis socket) goes at once."""
    cache = _lax(tmp_path, MemoryStore())
    ref = weakref.ref(cache)
    gc.disable()
    try:
        del cache
        assert ref() is None
    finally:
        gc.enable()
