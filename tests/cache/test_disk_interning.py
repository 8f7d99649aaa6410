"""The disk tier keeps a key's file names out of ``sys.intern``.

pathlib interns every component of a path it parses (up to Python 3.13; gh-119518), and on
Python 3.12 interned strings are immortal (gh-113993): each entry, key record, lock and
temporary name that went through a Path stayed in memory for the process's life, ~6 blocks
per cache miss + remote hit in a long-running server (tests/test_review30_longrun.py fails
that way under 3.12 when the store builds them as Paths). This test holds on any version:
``sys.intern`` is recorded while a cache goes through its per-key operations.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache

from .conftest import AXPY_PTX, axpy_external

# a digest, or a name with one: an entry, record, lock, quarantined file or temporary
PER_KEY = re.compile(r"[0-9a-f]{64}|\.tmp$")


def test_per_key_operations_intern_no_name_of_a_key(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path / "cache", remote=False, max_bytes=1 << 20)
    keys = [kp.make_key("external", AXPY_PTX, {"entry": "axpy", "i": i}, ["sm_80"])
            for i in range(4)]
    cache.fetch_or_compile(keys[0], axpy_external)  # the top directories made, once
    interned: list[str] = []
    real = sys.intern

    def recording(text: str) -> str:
        interned.append(text)
        return real(text)

    monkeypatch.setattr(sys, "intern", recording)
    for key in keys[1:]:
        assert cache.fetch_or_compile(key, axpy_external).origin == "compiled"  # miss, lock,
        assert cache.fetch_or_compile(key, axpy_external).origin == "disk"  # put, record, hit
    store = cache.disk
    store.evict(1, keep=keys[-1].digest)  # over the cap: entries and records removed
    store.prune_temps(older_than_s=0)
    cache.clear()
    monkeypatch.setattr(sys, "intern", real)
    assert not [t for t in interned if PER_KEY.search(t)], interned


def test_the_public_paths_are_still_paths(tmp_path: Path) -> None:
    """``DiskStore.path`` and the listings keep their Path types (tools and tests use them)."""
    cache = Cache(tmp_path / "cache", remote=False)
    key = kp.make_key("external", AXPY_PTX, {"entry": "axpy"}, ["sm_80"])
    cache.fetch_or_compile(key, axpy_external)
    path = cache.disk.path(key)
    assert isinstance(path, Path) and path.is_file() and path.name == key.digest + ".kpack"
    (entry,) = cache.disk.entries()
    assert isinstance(entry.path, Path) and entry.path == path
    assert cache.disk._parts_path(key.digest).is_file()
