"""Ctrl-C inside the disk tier (review 30): a KeyboardInterrupt must come out of the call, and
leave no lock held, no descriptor open and no temporary behind.

The interrupts are injected by replacing one function the code calls at the critical point,
so each test is deterministic. (Review 30's sweep raised at every point where CPython checks
for signals; a few of those lie between a call's return and the store of its result, such as
the descriptor ``os.open`` returns: no Python code can close a descriptor it never received,
so those windows remain.)"""

from __future__ import annotations

import os
import threading
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import _files, disk

KEY = "ab" * 32


def _open_fds() -> set[str]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_ctrl_c_while_taking_the_key_lock_leaves_it_free(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt after the flock but before the lock was recorded (hold) left the
    descriptor open and locked: the key stayed locked for as long as the process lived, and
    the next compile of it (here, or in any process) waited for ever."""
    store = disk.DiskStore(tmp_path / "c")
    real_hold = disk.hold

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(disk, "hold", interrupted)
    before = _open_fds()
    with pytest.raises(KeyboardInterrupt):
        with store.lock(KEY):
            pass
    assert not {p for p in _open_fds() - before if "locks" in p}
    monkeypatch.setattr(disk, "hold", real_hold)
    got = threading.Event()

    def again() -> None:
        with store.lock(KEY):
            got.set()

    t = threading.Thread(target=again, daemon=True)
    t.start()
    assert got.wait(5), "the key stayed locked after the interrupt"
    t.join(5)


def test_ctrl_c_after_the_temporary_is_closed_comes_out_of_put(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt right after the temporary's close used to close it a second time
    in the cleanup, whose EBADF replaced the KeyboardInterrupt: Cache.put turned that into a
    "disk cache write failed" warning, so Ctrl-C was ignored. It comes out now, and no
    temporary is left."""
    calls = []

    def close(fd: int) -> None:
        os.close(fd)
        calls.append(fd)
        if len(calls) == 1:
            raise KeyboardInterrupt

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os)
                                       if not k.startswith("__")})
    fake_os.close = close
    monkeypatch.setattr(_files, "os", fake_os)
    cache = kp.Cache(tmp_path / "c", remote=False)
    data = kp.save(__import__("kp_samples").axpy())
    with pytest.raises(KeyboardInterrupt):
        cache.put(KEY, data)
    assert len(calls) == 1  # closed once
    assert not list((tmp_path / "c").rglob("*.tmp"))
    monkeypatch.setattr(_files, "os", os)
    cache.put(KEY, data)
    assert cache.get(KEY) == data
