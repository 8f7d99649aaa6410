"""The disk tier and Cache without a remote: hits, atomicity, single-flight, eviction,
corrupt entries, unwritable directories, killed writers, racing processes."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning, DiskStore

from .conftest import (AXPY_PTX, axpy_external, axpy_params, finish_workers, from_cubin,
                       spawn_worker)
from .worker import key_for


def test_cold_then_warm(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=False)
    key = kp.make_key("external", AXPY_PTX, {"entry": "axpy"}, ["sm_80"])
    first = cache.fetch_or_compile(key, axpy_external)
    second = cache.fetch_or_compile(key, lambda: pytest.fail("warm lookup compiled"))
    assert (first.origin, second.origin) == ("compiled", "disk")
    assert second.summary == first.summary
    assert [i.data for i in second.modules[0].images] == [i.data for i in first.modules[0].images]
    stats = cache.stats()
    assert (stats["compiles"], stats["disk_hits"], stats["disk_misses"]) == (1, 1, 1)
    # The entry is the artifact itself: kp.load reads it directly.
    assert kp.load(cache.disk.path(key).read_bytes()).programs == ["axpy"]


def test_external_helper_keys_on_every_argument(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=False)
    args = ("axpy", "axpy", axpy_params())
    a = cache.external(*args, grid=kp.cdiv("n", 256), block=256, ptx=AXPY_PTX, targets=["sm_80"])
    b = cache.external(*args, grid=kp.cdiv("n", 256), block=256, ptx=AXPY_PTX, targets=["sm_80"])
    c = cache.external(*args, grid=kp.cdiv("n", 128), block=128, ptx=AXPY_PTX, targets=["sm_80"])
    assert (a.origin, b.origin, c.origin) == ("compiled", "disk", "compiled")
    assert str(c.summary.variants[0].launches[0].block[0]) == "128"


def test_sidecar_explains_key(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    key = key_for(1)
    cache.fetch_or_compile(key, lambda: from_cubin("k1", axpy_cubin))
    assert cache.disk.read_parts(key.digest) == key
    text = Cache(tmp_path, remote=False).explain(key.digest)
    assert key.part("source") in text and "on disk: yes" in text
    # A tampered record does not reproduce the digest and is not believed.
    record = tmp_path / "keys" / key.digest[:2] / f"{key.digest}.json"
    data = json.loads(record.read_text())
    data["parts"][5][1] = "sm_90"
    record.write_text(json.dumps(data))
    assert cache.disk.read_parts(key.digest) is None


def test_explain_miss_names_the_changed_part(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    a = kp.make_key("external", b"same", {"block": 256}, ["sm_80"])
    b = kp.make_key("external", b"same", {"block": 128}, ["sm_80"])
    cache.fetch_or_compile(a, lambda: from_cubin("a", axpy_cubin))
    text = cache.explain_miss(b)
    assert "options" in text and "i256" in text and "i128" in text and "targets" not in text


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_quarantined_and_recompiled(tmp_path: Path, axpy_cubin: bytes,
                                                     damage: str) -> None:
    cache = Cache(tmp_path, remote=False)
    key = key_for(2)
    cache.fetch_or_compile(key, lambda: from_cubin("k2", axpy_cubin))
    path = cache.disk.path(key)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) - 40] ^= 0xFF  # inside an image blob: its digest no longer matches
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    fresh = Cache(tmp_path, remote=False)
    with pytest.warns(CacheWarning, match="invalid"):
        again = fresh.fetch_or_compile(key, lambda: from_cubin("k2", axpy_cubin))
    assert again.origin == "compiled"
    assert fresh.stats()["quarantined"] == 1
    assert len(fresh.disk.quarantined()) == 1
    assert fresh.fetch_or_compile(key, lambda: pytest.fail("recompiled twice")).origin == "disk"


def test_unwritable_directory_warns_and_compiles(tmp_path: Path, axpy_cubin: bytes) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = Cache(blocker / "cache", remote=False)
    with pytest.warns(CacheWarning):
        c = cache.fetch_or_compile(key_for(3), lambda: from_cubin("k3", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["errors"] >= 1


def test_unserializable_build_is_returned_and_counted(tmp_path: Path, axpy_cubin: bytes,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path, remote=False)
    monkeypatch.setattr(Cache, "_encode", lambda self, c: (_ for _ in ()).throw(ValueError("x")))
    with pytest.warns(CacheWarning, match="cannot serialize"):
        c = cache.fetch_or_compile(key_for(4), lambda: from_cubin("k4", axpy_cubin))
    assert c.origin == "compiled" and not cache.disk.path(key_for(4)).exists()


def test_build_errors_propagate_and_release_the_lock(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    with pytest.raises(kp.CompileError):
        bad_ptx = AXPY_PTX.replace("fma.rn", "fma.bogus")
        cache.fetch_or_compile(key_for(5), lambda: axpy_external(ptx=bad_ptx))
    assert cache.fetch_or_compile(key_for(5), lambda: from_cubin("k5", axpy_cubin)).origin \
        == "compiled"
    with pytest.raises(TypeError, match="build"):
        cache.fetch_or_compile(key_for(6), lambda: b"bytes")  # type: ignore[arg-type,return-value]


def test_lru_eviction_keeps_recent_entries(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=None)
    for i in range(10):
        store.put(key_for(i), bytes(1000))
        os.utime(store.path(key_for(i)), (1000 + i, 1000 + i))
    os.utime(store.path(key_for(0)), (5000, 5000))  # entry 0 was used recently
    removed, freed = store.evict(5000)
    assert freed == removed * 1000 and sum(e.size for e in store.entries()) <= 4500
    left = {e.digest for e in store.entries()}
    assert key_for(0).digest in left and key_for(1).digest not in left
    assert key_for(9).digest in left


def test_put_enforces_the_cap(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10_000)
    for i in range(40):
        store.put(key_for(i), bytes(1000))
    assert sum(e.size for e in store.entries()) <= 10_000 + 10_000 // 16 + 1000


def test_an_entry_larger_than_the_cap_is_not_kept_and_says_so(tmp_path: Path,
                                                                axpy_cubin: bytes) -> None:
    """It used to be written and then evicted at once by the same put: never a hit, and no
    word of why."""
    store = DiskStore(tmp_path, max_bytes=500)
    with pytest.raises(OSError, match="1000 bytes exceed the cache's cap of 500 bytes"):
        store.put(key_for(0), bytes(1000))
    assert store.entries() == [] and not store.path(key_for(0)).exists()
    size = len(kp.save(from_cubin("k0", axpy_cubin)))
    cache = Cache(tmp_path / "c", remote=False, max_bytes=size - 1)
    with pytest.warns(CacheWarning, match=r"exceed the cache's cap of \d+ bytes .* not kept"):
        c = cache.fetch_or_compile(key_for(1), lambda: from_cubin("k0", axpy_cubin))
    assert c.origin == "compiled"
    # skipped by design, as the remote's over-size entry is (was: counted under errors)
    assert cache.stats()["disk_too_large"] == 1 and cache.stats()["errors"] == 0


def test_hit_refreshes_lru_time(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    store.put(key_for(0), b"x")
    os.utime(store.path(key_for(0)), (1000, 1000))
    assert store.get(key_for(0)) == b"x"
    assert store.path(key_for(0)).stat().st_mtime > time.time() - 60


def test_threads_compile_once(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    builds: Counter[str] = Counter()
    errors: list[BaseException] = []

    def build(i: int) -> kp.Compiled:
        builds[key_for(i).digest] += 1
        time.sleep(0.01)
        return from_cubin(f"k{i}", axpy_cubin)

    def work(seed: int) -> None:
        try:
            for i in sorted(range(5), key=lambda j: (j * seed) % 5):
                assert cache.fetch_or_compile(key_for(i), lambda i=i: build(i)).name == f"k{i}"
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and set(builds.values()) == {1} and len(builds) == 5


def test_sigkill_while_writing_leaves_no_entry(tmp_path: Path, cubin_file: Path,
                                               axpy_cubin: bytes) -> None:
    proc = spawn_worker("slowwrite", str(tmp_path), str(cubin_file))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "writing", proc.stderr.read() if proc.stderr else line
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    store = DiskStore(tmp_path)
    final = store.path(key_for(0))
    temps = list(final.parent.glob(".*.tmp"))
    assert not final.exists() and len(temps) == 1 and temps[0].stat().st_size == 64
    assert store.entries() == []
    # The lock died with the process; the next caller compiles and the temp file is pruned.
    cache = Cache(tmp_path, remote=False)
    assert cache.fetch_or_compile(key_for(0), lambda: from_cubin("k0", axpy_cubin)).origin \
        == "compiled"
    assert store.prune_temps(older_than_s=0) == 1


def test_eight_processes_twenty_keys_compile_each_once(tmp_path: Path, cubin_file: Path) -> None:
    marker = tmp_path / "compiles.log"
    procs = [spawn_worker("race", str(tmp_path / "cache"), "-", str(marker), str(cubin_file),
                          "20", str(seed), "-") for seed in range(8)]
    results = []
    for code, out, err in finish_workers(procs):
        assert code == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    compiles = Counter(marker.read_text().split())
    assert len(compiles) == 20 and set(compiles.values()) == {1}, compiles
    assert sum(r["stats"]["compiles"] for r in results) == 20
    assert all(r["stats"]["errors"] == 0 and r["stats"]["quarantined"] == 0 for r in results)
    assert all(not r["warnings"] for r in results)
    store = DiskStore(tmp_path / "cache")
    assert len(store.entries()) == 20
    for e in store.entries():  # no torn entries: each one verifies
        assert len(kp.load(e.path.read_bytes()).programs) == 1
    assert not list((tmp_path / "cache" / "entries").glob("*/.*.tmp"))


def test_external_key_uses_bytes_not_paths(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", remote=False)
    a, b = tmp_path / "a.ptx", tmp_path / "sub" / "b.ptx"
    b.parent.mkdir()
    a.write_text(AXPY_PTX)
    b.write_text(AXPY_PTX)
    call = dict(grid=kp.cdiv("n", 256), block=256, targets=["sm_80"])
    first = cache.external("axpy", "axpy", axpy_params(), ptx=str(a), **call)
    second = cache.external("axpy", "axpy", axpy_params(), ptx=b, **call)
    third = cache.external("axpy", "axpy", axpy_params(), ptx=AXPY_PTX.encode(), **call)
    assert (first.origin, second.origin, third.origin) == ("compiled", "disk", "disk")
    with pytest.raises(TypeError, match="exactly one"):
        cache.external("axpy", "axpy", axpy_params(), **call)


def test_kp_compile_goes_through_the_cache(tmp_path: Path) -> None:
    if not hasattr(kp, "compile") or not hasattr(kp, "fusion"):
        pytest.skip("kp.compile is not available yet")

    @kp.fusion
    def scale(x: kp.Tensor[kp.f32, "n"], s: kp.f32):  # type: ignore[no-untyped-def]
        return x * s

    cache = Cache(tmp_path, remote=False, explain_misses=True)
    first = kp.compile(scale, targets=["sm_80"], cache=cache)
    again = kp.compile(scale, targets=["sm_80"], cache=cache)
    other = kp.compile(scale, targets=["sm_80"], static={"n": 1024}, cache=cache)
    assert (first.origin, again.origin, other.origin) == ("compiled", "disk", "compiled")
    assert again.summary == first.summary
    # the lowering's own entry with a cache is the same lookup (same key: a hit)
    from kernelpack.lowering import compile_fusion

    assert compile_fusion(scale, ["sm_80"], cache=cache).origin == "disk"


def test_explain_misses_logs_the_difference(tmp_path: Path, axpy_cubin: bytes,
                                            caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(tmp_path, remote=False, explain_misses=True)
    cache.fetch_or_compile(kp.make_key("external", b"s", {"opt": 3}, ["sm_80"]),
                           lambda: from_cubin("a", axpy_cubin))
    with caplog.at_level("INFO", logger="kernelpack.cache"):
        cache.fetch_or_compile(kp.make_key("external", b"s", {"opt": 2}, ["sm_80"]),
                               lambda: from_cubin("a", axpy_cubin))
    assert any("options" in r.getMessage() and "i3" in r.getMessage() for r in caplog.records)


def test_entry_with_two_programs_is_quarantined(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    key = key_for(7)
    cache.disk.put(key, kp.save([from_cubin("a", axpy_cubin), from_cubin("b", axpy_cubin)]))
    with pytest.warns(CacheWarning, match="exactly 1 program"):
        assert cache.fetch_or_compile(key, lambda: from_cubin("k7", axpy_cubin)).origin \
            == "compiled"
    assert cache.stats()["quarantined"] == 1


def test_bad_keys_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises((ValueError, TypeError)):
        Cache(tmp_path, remote=False, sign_with=b"short")
    with pytest.raises(ValueError, match="public key"):
        Cache(tmp_path, remote="redis://127.0.0.1:1/0", trusted_keys=["not a key"])
    with pytest.raises(TypeError, match="remote"):
        Cache(tmp_path, remote=42)
    with pytest.raises(ValueError, match="redis://"):
        Cache(tmp_path, remote="http://example.com")


def test_quarantine_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelpack.cache import disk

    monkeypatch.setattr(disk, "MAX_QUARANTINED", 3)
    store = DiskStore(tmp_path)
    for i in range(6):
        store.put(key_for(i), b"bad")
        assert store.quarantine(key_for(i)) is not None
    left = store.quarantined()
    assert len(left) == 3
    assert {p.name.split(".")[0] for p in left} == {key_for(i).digest for i in (3, 4, 5)}
    assert store.quarantine(key_for(0)) is None  # already gone: nothing to move


def test_quarantine_leaves_a_fresh_entry_alone(tmp_path: Path) -> None:
    """Two readers see one bad entry; the first replaces it; the second must not move the
    good replacement aside."""
    store = DiskStore(tmp_path)
    store.put(key_for(0), b"bad")
    found = store.read(key_for(0))
    assert found is not None
    time.sleep(0.01)
    store.put(key_for(0), b"good")  # another process fixed it meanwhile
    assert store.quarantine(key_for(0), found[1]) is None
    assert store.get(key_for(0)) == b"good"


def test_disk_hits_stay_light(tmp_path: Path, axpy_cubin: bytes) -> None:
    """A warm start from disk imports neither redis, cryptography nor llvmlite."""
    import subprocess
    import sys

    from .conftest import worker_env

    Cache(tmp_path, remote=False).fetch_or_compile(key_for(8), lambda: from_cubin("k8", axpy_cubin))
    code = ("import sys, kernelpack as kp\n"
            "sys.path.insert(0, %r)\n"
            "from worker import key_for\n"
            "c = kp.Cache(%r, remote=False).fetch_or_compile(key_for(8), lambda: 1/0)\n"
            "assert c.origin == 'disk'\n"
            "print(sorted(m for m in ('redis', 'cryptography', 'llvmlite', 'filelock') "
            "if m in sys.modules))\n") % (str(Path(__file__).parent), str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=worker_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_loader_failure_is_not_blamed_on_the_entry(tmp_path: Path, axpy_cubin: bytes,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path, remote=False)
    cache.fetch_or_compile(key_for(9), lambda: from_cubin("k9", axpy_cubin))

    def broken(*args: object) -> kp.Compiled:
        raise ImportError("zstandard is missing")

    monkeypatch.setattr(Cache, "_decode", staticmethod(broken))
    with pytest.warns(CacheWarning, match="ImportError"):
        c = cache.fetch_or_compile(key_for(9), lambda: from_cubin("k9", axpy_cubin))
    assert c.origin == "compiled"
    assert cache.stats()["quarantined"] == 0 and cache.stats()["errors"] >= 1


def test_a_compile_lock_held_too_long_is_waited_for_lock_ttl_s_only(tmp_path: Path,
                                                                     axpy_cubin: bytes) -> None:
    """Review 35: a process holding a key's compile lock for ever (a hung compiler, a stopped
    process) kept every other process asking for that key waiting for ever. Now a waiter
    gives up after ``lock_ttl_s``, warns naming the key, and compiles itself."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the stuck holder
        try:
            os.close(r)
            with DiskStore(tmp_path).lock(key_for(3)):
                os.write(w, b"held")
                time.sleep(60)
        finally:
            os._exit(0)
    try:
        os.close(w)
        assert os.read(r, 4) == b"held"
        cache = Cache(tmp_path, remote=False, lock_ttl_s=0.5)
        t0 = time.monotonic()
        with pytest.warns(CacheWarning, match=rf"compile lock of key {key_for(3).digest[:16]} for "
                                              rf"more than 0.5 s.*without single-flight"):
            c = cache.fetch_or_compile(key_for(3), lambda: from_cubin("k0", axpy_cubin))
        assert c.origin == "compiled" and 0.5 <= time.monotonic() - t0 < 10
        assert cache.fetch_or_compile(key_for(3), lambda: from_cubin("k0", axpy_cubin)
                                      ).origin == "disk"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
