"""Eleventh review, several GPUs continued: threads calling one program on two devices at
once, ``stream=`` of another device than the arguments, and ``fork`` after using several
devices (fake driver with per-thread current contexts; see test_review11_multidevice)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import DeviceError, LaunchError

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver  # noqa: E402
from test_fastpath_fake import Tensor  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_review11_multidevice import (CTX, _values, door, make_fake, on, torch,  # noqa: E402,F401
                                       two_arch_axpby)
from test_review7_processes_threads import _in_child  # noqa: E402


def _checked_kernel(fake: FakeDriver, wrong: list) -> None:
    """axpby that records a launch whose pointers are not on the current context's device."""
    def impl(grid, block, shmem, v) -> None:
        here = fake.current - 0x100
        for name, ptr in zip("xyz", v[:3]):
            on_dev = fake.pointer_devices.get(ptr)
            if on_dev is not None and on_dev != here:
                wrong.append((name, on_dev, here))
        _axpby_impl(grid, block, shmem, v)

    fake.kernels["axpby"] = ("QQQfI", impl)


@pytest.mark.parametrize("kind", ["host", "torch"])
@pytest.mark.parametrize("arches", ["same", "mixed"])
def test_eight_threads_on_two_devices(monkeypatch, door, kind, arches, request) -> None:
    fake = make_fake(monkeypatch, door, archs={1: (8, 0)} if arches == "mixed" else None)
    wrong: list = []
    _checked_kernel(fake, wrong)
    t = request.getfixturevalue("torch") if kind == "torch" else None
    prog = kp.load(kp.save([two_arch_axpby()]))["axpby"]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    left: list = []
    keep: list = []
    lock = threading.Lock()

    def arrays(device: int, k: float) -> tuple:
        if t is not None:
            return (Tensor([1.0, k], t.float32, device=device),
                    Tensor([1.0, 1.0], t.float32, device=device))
        with lock:  # pointer_devices is shared: one writer at a time
            pair = (on(fake, device, [1.0, k]), on(fake, device, [1.0, 1.0]))
            keep.append(pair)
        return pair

    def work(i: int) -> None:
        device = i % 2
        try:
            mine = CTX[1 - device] if i >= 4 else 0  # half the threads work on the other one
            fake.current = mine
            barrier.wait()
            for k in range(10):
                z = prog(*arrays(device, float(k + i)), 2.0)
                assert _values(z) == [3.0, 2.0 * (k + i) + 1.0]
                if kind == "host" and mine and fake.current != mine:
                    left.append((i, fake.current))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert not wrong, wrong[:5]  # every launch ran in its arrays' device's context
    assert not left, left[:5]    # general path: the thread's own device given back
    assert len(fake.launch_contexts) == 80
    assert len(fake.load_contexts) == (2 if arches == "mixed" else 1)
    per_device: dict[int, set] = {}
    for _, ctx, _, handle in fake.launch_contexts:
        per_device.setdefault(ctx, set()).add(fake.kernel_handles[handle][0])
    assert sorted(per_device) == [CTX[0], CTX[1]]
    assert all(len(libs) == 1 for libs in per_device.values())  # one library per device
    if arches == "mixed":
        (lib0,), (lib1,) = per_device[CTX[0]], per_device[CTX[1]]
        assert fake.libraries[lib0].endswith(b"sm90") and fake.libraries[lib1].endswith(b"sm80")
    assert not fake.callback_errors, fake.callback_errors


# ---- stream= of another device ------------------------------------------------------------------
class TorchStream:
    """torch.cuda.Stream's attributes: its handle and the device it belongs to."""

    def __init__(self, handle: int, device: int) -> None:
        self.cuda_stream, self.device_index = handle, device


class CupyStream:
    def __init__(self, handle: int, device: int) -> None:
        self.ptr, self.device_id = handle, device


@pytest.mark.parametrize("stream_type", [TorchStream, CupyStream])
def test_a_stream_of_another_device_is_refused(monkeypatch, door, stream_type) -> None:
    """A launch runs on its stream's device: a stream of device 1 with arguments on device 0
    would run the kernel on device 1 over device 0's memory. A stream object that says its
    device is checked; a raw handle says nothing and is the caller's to get right."""
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    x, y, z = on(fake, 0, [1.0]), on(fake, 0, [1.0]), on(fake, 0, [0.0])
    with pytest.raises(LaunchError, match=r"stream= is a stream of device 1, the arguments are "
                                          r"on device 0; pass a stream of device 0"):
        prog(x, y, 1.0, stream=stream_type(0x77, 1))
    with pytest.raises(LaunchError, match="stream of device 1"):
        prog(x, y, 1.0, out=z, stream=stream_type(0x77, 1))
    assert fake.launch_contexts == [] and fake.load_contexts == []
    assert prog(x, y, 1.0, out=z, stream=stream_type(0x78, 0)) is z and z.values() == [2.0]
    fake.current = CTX[1]
    assert prog(x, y, 2.0, out=z, stream=0x79) is z and z.values() == [3.0]  # a raw handle
    assert [c[2] for c in fake.launch_contexts] == [0x78, 0x79]
    assert fake.current == CTX[1]


def test_torch_stream_of_another_device_on_the_fast_path(monkeypatch, door, torch) -> None:
    """The general path refuses it, and so does the torch fast path, which takes ``stream=``
    with ``out=`` itself (it launched there before review 11)."""
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    x, y = Tensor([1.0], torch.float32), Tensor([1.0], torch.float32)
    z = Tensor([0.0], torch.float32)
    prog(x, y, 1.0)
    prog(x, y, 1.0)  # the fast path is built
    n = len(fake.launch_contexts)
    with pytest.raises(LaunchError, match="stream= is a stream of device 1, the arguments are "
                                          "on device 0"):
        prog(x, y, 1.0, out=z, stream=TorchStream(0x77, 1))
    assert len(fake.launch_contexts) == n


# ---- fork ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_after_using_two_devices(monkeypatch) -> None:
    from kernelpack.runtime import device as device_mod, library

    fake = make_fake(monkeypatch, "bindings", devices=3, archs={1: (8, 0)})
    pack = kp.load(kp.save([two_arch_axpby()]))
    prog = pack["axpby"]
    keep = [on(fake, d, [1.0]) for d in (0, 0, 1, 1, 2, 2)]
    for d in (0, 1):
        prog(keep[2 * d], keep[2 * d + 1], 1.0)
        prog(keep[2 * d], keep[2 * d + 1], 1.0)
    assert sorted(prog._kp_bound._states) == [0, 1] and len(fake.load_contexts) == 2

    def child() -> str:
        assert library.loaded_libraries() == [] and device_mod._devices == {}
        assert prog._kp_bound._states == {}
        outcomes = []
        for d in (0, 1, 2):
            try:
                prog(keep[2 * d], keep[2 * d + 1], 1.0)
                outcomes.append(f"device {d} launched")
            except DeviceError as exc:
                outcomes.append("fork" if "'spawn'" in str(exc) else str(exc))
        try:
            pack.warmup(devices=[1])
            outcomes.append("warmup ran")
        except DeviceError as exc:
            outcomes.append("fork" if "'spawn'" in str(exc) else str(exc))
        assert len(fake.load_contexts) == 2  # nothing loaded with the parent's handles
        return ",".join(outcomes)

    assert _in_child(child) == "fork,fork,fork,fork"
    # the parent is untouched: both devices still bound, nothing loaded again
    for d in (0, 1):
        assert _values(prog(keep[2 * d], keep[2 * d + 1], 2.0)) == [3.0]
    assert len(fake.load_contexts) == 2
    assert [c[1] for c in fake.launch_contexts[-2:]] == [CTX[0], CTX[1]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_before_any_use_then_two_devices_in_the_child(monkeypatch) -> None:
    fake = make_fake(monkeypatch, "bindings", devices=2)
    pack = kp.load(kp.save([axpby()]))
    keep = [on(fake, d, [1.0]) for d in (0, 0, 1, 1)]

    def child() -> str:
        out = [_values(pack["axpby"](keep[2 * d], keep[2 * d + 1], 1.0)) for d in (1, 0)]
        return f"{out} {[c[1] for c in fake.launch_contexts]} {len(fake.load_contexts)}"

    assert _in_child(child) == f"[[2.0], [2.0]] {[CTX[1], CTX[0]]} 1"
