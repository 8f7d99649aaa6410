"""Regressions from a second adversarial review of the cache: hostile or broken files in the
cache directory (a FIFO or device as an entry, an unusable quarantine, a stray quarantined
file, a dangling lock symlink), constructor numbers and Redis URLs checked up front, ``~`` and
relative roots, LRU order within a process, an empty trusted key list, and keys of externals
(large expressions, CUDA headers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning, DiskStore
from kernelpack.cache.external_key import external_key
from kernelpack.cli import main

from .conftest import AXPY_PTX, axpy_params, from_cubin, worker_env
from .test_remote_tier import MemoryStore
from .worker import key_for


class Blocked(BaseException):
    """Raised by the alarm: not an OSError (TimeoutError is one), which the cache would
    catch as a failed read and then block on again."""


@pytest.fixture()
def deadline() -> Iterator[None]:
    """Fail (instead of hanging the suite) when the test blocks for more than 10 s."""
    def expire(*_: object) -> None:
        raise Blocked("blocked: the cache waited on a file")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---- hostile or broken files in the cache directory -------------------------------------------
def test_a_fifo_as_an_entry_is_quarantined_not_waited_on(tmp_path: Path, axpy_cubin: bytes,
                                                        deadline: None) -> None:
    cache = Cache(tmp_path, remote=False)
    path = cache.disk.path(key_for(1))
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    with pytest.warns(CacheWarning, match="invalid"):
        c = cache.fetch_or_compile(key_for(1), lambda: from_cubin("k1", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["quarantined"] == 1
    assert path.is_file()  # the compiled entry replaced it
    assert cache.fetch_or_compile(key_for(1), lambda: pytest.fail("compiled")).origin == "disk"


_DEV_ZERO_CHILD = """
import resource, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
warnings.simplefilter("ignore")
from kernelpack.cache import Cache
cache = Cache(sys.argv[1], remote=False)
print(cache.get(sys.argv[2]), cache.stats()["quarantined"])
"""


def test_a_device_as_an_entry_is_not_read(tmp_path: Path) -> None:
    """A symlink to /dev/zero (size 0, endless) was read until memory ran out."""
    store = DiskStore(tmp_path)
    path = store.path(key_for(2))
    path.parent.mkdir(parents=True)
    os.symlink("/dev/zero", path)
    out = subprocess.run([sys.executable, "-c", _DEV_ZERO_CHILD, str(tmp_path),
                          key_for(2).digest], env=worker_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "1"]
    assert not path.is_symlink()  # moved aside


def test_cache_ls_does_not_wait_on_a_fifo(tmp_path: Path, axpy_cubin: bytes, deadline: None,
                                         capsys: pytest.CaptureFixture) -> None:
    cache = Cache(tmp_path, remote=False)
    cache.put(key_for(11), kp.save(from_cubin("k11", axpy_cubin)))
    fifo = cache.disk.path(key_for(12))
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "k11" in out and "<invalid: FormatError>" in out and "2 entries" in out


def test_an_unusable_quarantine_is_a_warning(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    cache.fetch_or_compile(key_for(3), lambda: from_cubin("k3", axpy_cubin))
    cache.disk.path(key_for(3)).write_bytes(b"garbage")
    (tmp_path / "quarantine").write_text("a file where the folder should be")
    with pytest.warns(CacheWarning, match="could not be moved aside"):
        c = cache.fetch_or_compile(key_for(3), lambda: from_cubin("k3", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["errors"] >= 1
    assert cache.fetch_or_compile(key_for(3), lambda: pytest.fail("compiled")).origin == "disk"


def test_a_stray_file_in_quarantine_breaks_nothing(tmp_path: Path, axpy_cubin: bytes,
                                                   capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "quarantine" / "notes.kpack").write_text("someone's file")
    cache = Cache(tmp_path, remote=False)
    cache.put(key_for(4), kp.save(from_cubin("k4", axpy_cubin)))
    cache.disk.path(key_for(4)).write_bytes(b"garbage")
    with pytest.warns(CacheWarning, match="moved to"):
        assert cache.get(key_for(4)) is None
    assert len(cache.disk.quarantined()) == 2
    assert main(["cache", "stats", "--dir", str(tmp_path), "--json"]) == 0
    assert '"quarantined": 2' in capsys.readouterr().out


def test_a_dangling_lock_symlink_does_not_spin(tmp_path: Path, axpy_cubin: bytes,
                                               deadline: None) -> None:
    cache = Cache(tmp_path, remote=False)
    (tmp_path / "locks").mkdir()
    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "locks" / f"{key_for(5).digest}.lock")
    with pytest.warns(CacheWarning, match="cannot take the disk lock"):
        c = cache.fetch_or_compile(key_for(5), lambda: from_cubin("k5", axpy_cubin))
    assert c.origin == "compiled"


# ---- constructor arguments ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    ({"timeout_s": 0}, ValueError, "^timeout_s must be"),
    ({"timeout_s": -1.0}, ValueError, "^timeout_s must be"),
    ({"timeout_s": "1"}, TypeError, "^timeout_s must be a number"),
    ({"lock_ttl_s": 0}, ValueError, "^lock_ttl_s must be"),
    ({"lock_ttl_s": float("inf")}, ValueError, "^lock_ttl_s must be"),
    ({"wait_s": -1}, ValueError, "^wait_s must be"),
    ({"wait_s": float("nan")}, ValueError, "^wait_s must be"),
    ({"wait_s": None}, TypeError, "^wait_s must be a number"),
    ({"ttl_s": 0}, ValueError, "^ttl_s must be a positive"),
    ({"ttl_s": 3600.0}, TypeError, r"^ttl_s must be an int"),
    ({"ttl_s": True}, TypeError, r"^ttl_s must be an int"),
    ({"max_entry_bytes": -5}, ValueError, "^max_entry_bytes must be a positive"),
    # bool("false") is True: a flag read from a config file as text would mean its opposite
    ({"require_signed_remote": "false"}, TypeError, "^require_signed_remote must be True or"),
    ({"require_signed_remote": 0}, TypeError, "^require_signed_remote must be True or"),
    ({"explain_misses": "no"}, TypeError, "^explain_misses must be True or False"),
])
@pytest.mark.parametrize("remote", [False, "redis://127.0.0.1:1/0"])
def test_every_number_is_checked_with_or_without_a_remote(tmp_path: Path, kwargs: dict,
                                                          error: type, match: str,
                                                          remote: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        with pytest.raises(error, match=match):
            Cache(tmp_path, remote=remote, **kwargs)


@pytest.mark.parametrize("url, match", [
    ("redis://127.0.0.1:abc/0", "Port"),
    ("redis://127.0.0.1:6379/zero", "database must be a number"),
    ("redis:///0", "no host"),
    ("unix://", "socket path"),
])
def test_a_redis_url_that_cannot_work_fails_at_construction(tmp_path: Path, url: str,
                                                            match: str) -> None:
    with pytest.raises(ValueError, match=f"^remote '{url}'.*{match}"):
        Cache(tmp_path, remote=url, require_signed_remote=False)


def test_tilde_and_relative_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Cache("~/kp", remote=False).disk.root == tmp_path / "home" / "kp"
    monkeypatch.chdir(tmp_path)
    cache = Cache("rel", remote=False)
    monkeypatch.chdir(tmp_path / "home" if (tmp_path / "home").is_dir() else "/")
    cache.disk.put(key_for(6), b"x")  # after a chdir: still the folder named at construction
    assert (tmp_path / "rel" / "entries").is_dir() and not Path("~").exists()


def test_lru_order_follows_hits_within_a_process(tmp_path: Path) -> None:
    """put A, put B, hit A, put C over the cap: B (least recently used) goes, not A."""
    store = DiskStore(tmp_path, max_bytes=2500)
    a, b, c = key_for(7), key_for(8), key_for(9)
    store.put(a, bytes(1000))
    store.put(b, bytes(1000))
    assert store.get(a) == bytes(1000)
    store.put(c, bytes(1000))
    left = {e.digest for e in store.entries()}
    assert left == {a.digest, c.digest}


def test_an_empty_trusted_key_list_reads_nothing(tmp_path: Path, axpy_cubin: bytes) -> None:
    store = MemoryStore()
    with pytest.warns(CacheWarning, match="empty trusted_keys"):
        cache = Cache(tmp_path, remote=store, trusted_keys=[])  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "refused" warning per key either
        c = cache.fetch_or_compile(key_for(10), lambda: from_cubin("k10", axpy_cubin))
    # one get: the unsigned put looks first, so as never to replace a signed entry (none here);
    # no entry is taken from the remote
    assert c.origin == "compiled" and store.calls["get"] == 1 and store.calls["put"] == 1
    assert cache.stats()["refused"] == 0 and cache.stats()["remote_hits"] == 0


# ---- keys of kp.external calls -----------------------------------------------------------------
def _long_max(last: int) -> kp.Expr:
    e = kp.sym("n")
    for i in range(300):
        e = kp.emax(e, kp.sym("n") - i)
    return kp.emax(e, kp.sym("n") - last)  # differs past what printing shows


def test_external_keys_see_all_of_a_large_expression() -> None:
    keys = {external_key(("axpy", "axpy", axpy_params()),
                         {"grid": _long_max(last), "block": 256, "ptx": AXPY_PTX,
                          "targets": ["sm_80"]})[0].digest for last in (1000, 2000)}
    assert len(keys) == 2


def _cuda_key(options: list[str]) -> kp.CacheKey:
    src = '#include "f.h"\nextern "C" __global__ void k(float* x) { x[0] *= F; }\n'
    params = [kp.Tensor("x", kp.f32, ["n"], role="inout")]
    return external_key(("k", "k", params), {"grid": 1, "block": 1, "cuda": src,
                                              "nvrtc_options": options,
                                              "targets": ["sm_80"]})[0]


def test_cuda_keys_cover_header_contents_not_their_paths(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "f.h").write_text("#define F 2.0f\n")
    before = _cuda_key([f"-I{inc}"])
    (inc / "f.h").write_text("#define F 3.0f\n")  # same size: only the content changed
    after = _cuda_key([f"-I{inc}"])
    assert before.digest != after.digest
    assert str(tmp_path) not in after.part("options")
    elsewhere = tmp_path / "copy" / "include"
    elsewhere.mkdir(parents=True)
    (elsewhere / "f.h").write_text("#define F 3.0f\n")
    monkeypatch.chdir(tmp_path / "copy")
    for spelling in (["-Iinclude"], ["-I", "include"], ["--include-path=include"],
                     [f"-I{elsewhere}"]):
        assert _cuda_key(spelling).digest == after.digest, spelling
    (tmp_path / "pre.h").write_text("#define G 1\n")
    pre = _cuda_key(["-Iinclude", f"--pre-include={tmp_path / 'pre.h'}"])
    (tmp_path / "pre.h").write_text("#define G 2\n")
    assert _cuda_key(["-Iinclude", f"--pre-include={tmp_path / 'pre.h'}"]).digest != pre.digest


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                        ("10", TypeError)])
def test_prune_refuses_sizes_that_would_silently_empty_the_cache(tmp_path: Path,
                                                                 axpy_cubin: bytes, bad: Any,
                                                                 error: type) -> None:
    cache = Cache(tmp_path, remote=False)
    cache.put(key_for(13), kp.save(from_cubin("k13", axpy_cubin)))
    with pytest.raises(error, match="max_bytes must be a byte count"):
        cache.prune(bad)
    assert len(cache.disk.entries()) == 1
    assert cache.prune(0)[0] == 1 and not cache.disk.entries()


def test_cuda_keys_follow_symlinked_header_folders(tmp_path: Path) -> None:
    pytest.importorskip("cuda.bindings")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f.h").write_text("#define F 2.0f\n")
    (tmp_path / "inc").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "inc" / "sub")
    os.symlink(tmp_path / "inc", tmp_path / "inc" / "loop")  # a cycle must not hang the walk
    before = _cuda_key([f"-I{tmp_path / 'inc'}"])
    (tmp_path / "real" / "f.h").write_text("#define F 3.0f\n")
    assert _cuda_key([f"-I{tmp_path / 'inc'}"]).digest != before.digest
