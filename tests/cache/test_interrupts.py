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

    def interrupted(fd: int, **how: object) -> None:
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


def _in_thread(work, timeout: float = 10.0) -> bool:
    """Run ``work`` in a daemon thread; False when it has not finished within ``timeout``
    (a hang must fail the test, not freeze the suite)."""
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def _leak_the_key_lock(store: disk.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C at the start of the lock's release (after the body ran): the descriptor stays
    open and locked, as no Python code can prevent."""
    real_release = disk.release

    def interrupted(fd: int, unlink=None, file=None) -> None:
        monkeypatch.setattr(disk, "release", real_release)
        raise KeyboardInterrupt

    monkeypatch.setattr(disk, "release", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with store.lock(KEY):
            pass


def test_ctrl_c_in_the_release_does_not_hang_the_next_lock_of_that_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A notebook cell interrupted as its compile released the key's lock, then run again:
    the leaked descriptor kept the key locked, and the re-run waited for the lock its own
    thread held, for ever (review 32c). A thread cannot be waiting for itself: the stale hold
    is released and the lock taken; the lock file is gone afterwards."""
    store = disk.DiskStore(tmp_path / "c")
    done = []

    def cell_then_rerun() -> None:
        _leak_the_key_lock(store, monkeypatch)
        assert list((tmp_path / "c" / "locks").iterdir())  # the leaked lock's file
        with store.lock(KEY):
            done.append(True)

    assert _in_thread(cell_then_rerun), "the re-run waited for its own thread's lock"
    assert done == [True]
    assert not list((tmp_path / "c" / "locks").iterdir())


def test_a_lock_leaked_by_an_ended_thread_does_not_block_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = disk.DiskStore(tmp_path / "c")
    assert _in_thread(lambda: _leak_the_key_lock(store, monkeypatch))
    got = []

    def other() -> None:
        with store.lock(KEY):
            got.append(True)

    assert _in_thread(other), "a thread that has ended still held the key"
    assert got == [True]


def test_a_live_thread_holding_the_key_is_waited_for(tmp_path: Path) -> None:
    """The recovery is not a way around the lock: another thread's compile in progress is
    waited for, and only then is the key taken."""
    store = disk.DiskStore(tmp_path / "c")
    holding, release_it, order = threading.Event(), threading.Event(), []

    def holder() -> None:
        with store.lock(KEY):
            holding.set()
            release_it.wait(10)
            order.append("holder done")

    def waiter() -> None:
        with store.lock(KEY):
            order.append("waiter in")

    h = threading.Thread(target=holder, daemon=True)
    h.start()
    assert holding.wait(5)
    w = threading.Thread(target=waiter, daemon=True)
    w.start()
    w.join(0.5)
    assert w.is_alive() and order == []  # still waiting
    release_it.set()
    h.join(5)
    w.join(5)
    assert order == ["holder done", "waiter in"]
