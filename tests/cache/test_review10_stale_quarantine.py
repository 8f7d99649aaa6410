"""Review 10: a bad disk entry that has not been used for a while is quarantined on its first
read, not reported as "already replaced by another process" and left in place.

:meth:`DiskStore.read` refreshes an entry's LRU time when it is older than
``TOUCH_INTERVAL_S``; it used to return the identity (inode, mtime) seen *before* that touch,
so the quarantine that follows a failed verification saw another mtime, took the entry for a
fresh one another process had written, and left the bad file where it was (no evidence kept,
and a read-only-for-writes reader would meet it again).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.disk import TOUCH_INTERVAL_S, DiskStore

DIGEST = "ab" * 32


def _plant_old(store: DiskStore, data: bytes) -> Path:
    path = store.path(DIGEST)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    old = path.stat().st_mtime - 10 * TOUCH_INTERVAL_S
    os.utime(path, (old, old))
    return path


def test_an_old_corrupt_entry_is_quarantined_on_first_read(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=False)
    path = _plant_old(cache.disk, b"not an artifact" * 10)
    with pytest.warns(CacheWarning, match="moved to") as record:
        assert cache.load(DIGEST) is None
    assert not any("already replaced" in str(w.message) for w in record)
    assert not path.exists()
    assert len(cache.disk.quarantined()) == 1
    assert cache.stats()["quarantined"] == 1


def test_the_identity_read_returns_is_the_file_after_its_touch(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    path = _plant_old(store, b"x" * 64)
    found = store.read(DIGEST)
    assert found is not None
    st = path.stat()
    assert found[1] == (st.st_ino, st.st_mtime_ns)
    assert time.time() - st.st_mtime < TOUCH_INTERVAL_S  # the touch happened (LRU refreshed)
    assert store.quarantine(DIGEST, found[1]) is not None


def test_a_replaced_entry_is_still_left_alone(tmp_path: Path) -> None:
    """The identity check keeps its point: a file written after the read is not moved."""
    store = DiskStore(tmp_path)
    _plant_old(store, b"x" * 64)
    found = store.read(DIGEST)
    assert found is not None
    store.put(DIGEST, b"y" * 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.quarantine(DIGEST, found[1]) is None
    assert store.path(DIGEST).read_bytes() == b"y" * 64
