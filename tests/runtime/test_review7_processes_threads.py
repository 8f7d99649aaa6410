"""Programs crossing threads and ``fork`` with the fake driver: a program called from many
threads at its first call loads each module once, and a forked child neither reuses the
parent's loaded libraries, devices and bound launch state nor hangs on a lock."""

from __future__ import annotations

import os
import struct
import sys
import threading
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import DeviceError

sys.path.insert(0, str(Path(__file__).parent.parent))
from kp_samples import axpy  # noqa: E402
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpy_impl  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl)}))


def _loads(fake: FakeDriver) -> int:
    return sum(1 for c in fake.calls if c[0] == "cuLibraryLoadData")


def test_sixteen_threads_at_first_call_load_once(fake) -> None:
    program = kp.load(kp.save([axpy()]))["axpy"]
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []
    results: list[list[float]] = [[] for _ in range(16)]

    def work(i: int) -> None:
        try:
            x, y = HostArray([1.0, 2.0, float(i)]), HostArray([1.0, 1.0, 1.0])
            barrier.wait()
            for _ in range(3):
                program(x, y, 1.0)
            results[i] = y.values()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert _loads(fake) == 1
    assert results == [[4.0, 7.0, 3.0 * i + 1.0] for i in range(16)]


def test_many_threads_load_one_file(tmp_path) -> None:
    path = tmp_path / "m.kpack"
    kp.save([axpy()], path)
    packs: list[object] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            pack = kp.load(path)
            pack.verify()
            packs.append(pack["axpy"].plan(x=(5,), y=(5,), a=1.0))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(packs) == 16 and all(p == packs[0] for p in packs)


def _in_child(body) -> str:
    """Run ``body()`` in a forked child; its return value (a str) or its error, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read)
        try:
            import signal

            signal.alarm(20)  # a child that hangs on a lock must not hang the suite
            text = body()
        except BaseException as exc:  # noqa: BLE001 - sent to the parent
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"child ended with status {status}"
    return b"".join(chunks).decode()


def test_forked_child_does_not_reuse_parent_gpu_state(fake) -> None:
    from kernelpack.runtime import library

    pack = kp.load(kp.save([axpy()]))
    program = pack["axpy"]
    x, y = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    program(x, y, 2.0)
    program(x, y, 2.0)  # the fast path is built by now
    assert library.loaded_libraries()

    def child() -> str:
        from kernelpack.runtime import device

        assert pack["axpy"].plan(x=(3,), y=(3,), a=1.0).launches  # CPU side works
        assert pack.compiled("axpy") == kp.load(kp.save([axpy()])).compiled("axpy")
        assert library.loaded_libraries() == [] and device._devices == {}
        assert program._kp_bound._states == {}
        loads = _loads(fake)
        try:
            program(x, y, 2.0)
        except DeviceError as exc:
            assert _loads(fake) == loads  # nothing loaded with the parent's handles
            return f"DeviceError: {exc}"
        return "launched with the parent's state"

    text = _in_child(child)
    assert text.startswith("DeviceError: CUDA was initialized in the parent"), text
    assert "spawn" in text
    program(x, y, 2.0)  # the parent is untouched
    assert y.values() == [6.0, 12.0]


def test_forked_child_before_cuda_is_used_can_launch(fake) -> None:
    """Forking before the first launch is fine: the child initializes CUDA itself."""
    program = kp.load(kp.save([axpy()]))["axpy"]
    program.plan(x=(2,), y=(2,), a=1.0)

    def child() -> str:
        x, y = HostArray([1.0, 2.0]), HostArray([1.0, 1.0])
        program(x, y, 3.0)
        return repr(y.values())

    assert _in_child(child) == "[4.0, 7.0]"


def test_forked_child_does_not_hang_on_a_lock_held_by_a_parent_thread(fake) -> None:
    from kernelpack.runtime import library

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with library._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        text = _in_child(lambda: repr(library.loaded_libraries()))
    finally:
        release.set()
        t.join()
    assert text == "[]", text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_driver_lock_is_fresh_in_a_forked_child() -> None:
    """A thread inside driver.init() holds its lock at the fork: the child must not inherit
    a lock nobody will release."""
    from kernelpack.runtime import driver

    driver._lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the lock must be free
            ok = driver._lock.acquire(timeout=2)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        driver._lock.release()
    assert os.WEXITSTATUS(status) == 0
