"""Review 10: a key record (``keys/ab/<key>.json``) is read as an entry is, since the cache
directory is untrusted: a FIFO planted under a record's name used to block ``kernelpack cache
ls``, ``kernelpack cache explain``, ``Cache.explain``/``key_record`` and, with
``explain_misses``, every compile miss, forever (``Path.read_bytes`` waits for a writer).
Anything but a small regular file is now no record at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache
from kernelpack.cache.disk import DiskStore

SRC = Path(__file__).resolve().parents[2] / "src"
DIGEST = "ab" * 32


def _plant_fifo_record(store: DiskStore) -> Path:
    path = store._parts_path(DIGEST)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _in_child(code: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``code`` in a child with a deadline: the old code blocked, and a test must fail,
    not hang the suite."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked on a FIFO key record for {timeout_s:g} s: {code}")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_record_neither_blocks_nor_explains(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.put(DIGEST, b"x" * 100)
    _plant_fifo_record(store)
    done = _in_child(f"from kernelpack.cache import Cache\n"
                     f"c = Cache({str(tmp_path)!r}, remote=False)\n"
                     f"print(c.key_record({DIGEST!r}))\n"
                     f"print(c.explain({DIGEST!r}))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None\n") and "no record of its parts" in done.stdout
    ls = _in_child(f"from kernelpack.cli import main\n"
                   f"raise SystemExit(main(['cache', 'ls', '--dir', {str(tmp_path)!r}]))")
    assert ls.returncode == 0, ls.stderr
    assert DIGEST[:16] in ls.stdout and "1 entries" in ls.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_an_explained_miss_skips_a_fifo_record(tmp_path: Path) -> None:
    """``explain_misses`` reads every recorded key on a miss: a FIFO among them must not
    stop the compile."""
    _plant_fifo_record(DiskStore(tmp_path))
    done = _in_child(
        "import kernelpack as kp\n"
        "from kernelpack.cache import Cache\n"
        "@kp.fusion\n"
        "def neg(x: kp.Tensor[kp.f32, 'n']):\n"
        "    return -x\n"
        f"c = Cache({str(tmp_path)!r}, remote=False, explain_misses=True)\n"
        "print(kp.compile(neg, targets=['sm_80'], cache=c).origin)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "compiled"


def test_an_oversized_or_foreign_record_is_no_record(tmp_path: Path) -> None:
    from kernelpack.cache import _files

    store = DiskStore(tmp_path)
    path = store._parts_path(DIGEST)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()  # a directory under the record's name
    assert store.read_parts(DIGEST) is None
    path.rmdir()
    with open(path, "wb") as f:
        f.truncate(_files.MAX_RECORD + 1)  # sparse: larger than any record
    assert store.read_parts(DIGEST) is None
    assert list(store.recorded_keys()) == []


def test_a_real_record_still_explains(tmp_path: Path) -> None:
    @kp.fusion
    def halve(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
        return x * 0.5

    cache = Cache(tmp_path, remote=False)
    kp.compile(halve, targets=["sm_80"], cache=cache)
    (key,) = list(cache.disk.recorded_keys())
    assert cache.key_record(key.digest) == key
    assert "kind" in cache.explain(key.digest)
