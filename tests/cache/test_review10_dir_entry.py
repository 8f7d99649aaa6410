"""Review 10: a directory planted under an entry's name (or a key record's, or in the
quarantine) stopped every eviction and every ``clear``: ``unlink`` refuses a directory with
EISDIR, which the disk tier let escape. Evictions past it never happened, so the size cap no
longer held and every put warned that its write had failed (it had not); ``kernelpack cache
clear`` and ``prune`` failed for good. Such a directory can never be an entry: it is removed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.disk import DiskStore
from kernelpack.cli import main


def _digest(i: int) -> str:
    return f"{i:02x}" * 32


def _plant_dir(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "inner").write_bytes(b"x" * 10)
    os.utime(path, (1, 1))  # the least recently used: the first to evict


def test_eviction_goes_past_a_directory(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10_000)
    for i in range(3):
        store.put(_digest(i), b"x" * 3000)
    _plant_dir(store.path(_digest(0xff)))
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    os.symlink(outside, store.path(_digest(0xff)) / "link")
    os.utime(store.path(_digest(0xff)), (1, 1))
    removed, _ = store.evict(6000)  # to 5400: the directory and the two oldest entries
    assert removed == 3 and not store.path(_digest(0xff)).exists()
    assert (outside / "keep").exists()  # a symlink inside is removed, never followed
    assert [e.size for e in store.entries()] == [3000]


def test_puts_keep_the_cap_and_do_not_warn(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=False, max_bytes=10_000)
    _plant_dir(cache.disk.path(_digest(0xff)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        for i in range(8):
            cache.disk.put(_digest(i), b"x" * 3000)  # what Cache.put does after its checks
    assert sum(e.size for e in cache.disk.entries()) <= 10_000


def test_clear_and_prune_remove_planted_directories(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    store = DiskStore(tmp_path)
    store.put(_digest(1), b"x" * 100)
    _plant_dir(store.path(_digest(2)))
    _plant_dir(store._parts_path(_digest(1)))
    _plant_dir(tmp_path / "quarantine" / f"{_digest(3)}.1.kpack")
    assert main(["cache", "prune", "--dir", str(tmp_path), "--max-bytes", "0"]) == 0
    assert store.entries() == []
    store.put(_digest(1), b"x" * 100)
    _plant_dir(store.path(_digest(2)))
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert store.entries() == [] and store.quarantined() == []
    assert not store._parts_path(_digest(1)).exists()
