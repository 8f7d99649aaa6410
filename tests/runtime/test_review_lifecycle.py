"""Review of the runtime's concurrency and lifecycle, on CPU against the fake driver: first
calls from many threads bind and load once; a failed load or launch leaves nothing cached or
pinned; warmup leaves the caller's current device alone; a dropped pack is freed; two devices
never mix; a missing driver keeps failing the same way without growing."""

from __future__ import annotations

import array
import gc
import struct
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import DeviceError, LaunchError
from kernelpack.runtime import library
from kernelpack.summary import Compiled, Image, KernelSummary, Module

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import CUresult, FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402

CTX0 = 0x100  # the fake's primary context of device 0


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(devices=2, kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _renamed(name: str, data: bytes = b"\x7fELF-fake-axpby") -> Compiled:
    """axpby under another program name (all share module "m")."""
    s = axpby().summary
    summary = KernelSummary(name, s.params, s.variants)
    return Compiled(summary, (Module("m", ("axpby",), (Image("cubin", "sm_90", data, "fake",
                                                             13000),)),))


def _loads(fake: FakeDriver) -> int:
    return sum(1 for c in fake.calls if c[0] == "cuLibraryLoadData")


def _slow_loads(fake: FakeDriver) -> None:
    """Widen the race window: the load takes a while, as a real one does."""
    real = fake.cuLibraryLoadData

    def slow(*args):
        time.sleep(0.02)
        return real(*args)

    fake.cuLibraryLoadData = slow


def _values(z) -> list:
    return list(struct.unpack(f"<{z.shape[0]}f", z.copy_to_host()))


def test_concurrent_first_calls_bind_and_load_once(fake) -> None:
    _slow_loads(fake)
    pack = kp.load(kp.save([_renamed(f"p{i}") for i in range(4)], None))
    from kernelpack.runtime import launcher

    made: list = []
    real_init = launcher.BoundProgram.__init__

    def counting(self, program):
        real_init(self, program)
        made.append(program.name)
        time.sleep(0.01)

    n = 16
    results: list = [None] * n
    errors: list = []
    barrier = threading.Barrier(n + 1)

    def call(i: int) -> None:
        try:
            barrier.wait()
            z = pack[f"p{i % 4}"](HostArray([float(i)] * 3), HostArray([1.0] * 3), 2.0)
            results[i] = _values(z)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def warm() -> None:
        try:
            barrier.wait()
            pack.warmup(devices=[0])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    launcher.BoundProgram.__init__ = counting
    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        threads.append(threading.Thread(target=warm))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        launcher.BoundProgram.__init__ = real_init
    assert not errors
    assert results == [[2.0 * i + 1.0] * 3 for i in range(n)]
    assert _loads(fake) == 1 and len(library.loaded_libraries()) == 1
    assert sorted(made) == ["p0", "p1", "p2", "p3"]  # each program bound exactly once


def test_failed_load_caches_nothing_and_a_later_call_loads_once(fake) -> None:
    prog = kp.load(kp.save([axpby()], None))["axpby"]
    fake.load_error = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(LaunchError, match="cuLibraryLoadData"):
        prog(HostArray([1.0]), HostArray([1.0]), 1.0)
    assert library.loaded_libraries() == [] and prog._kp_bound._states == {}
    fake.load_error = 0
    real = fake.cuLibraryGetKernel
    fake.cuLibraryGetKernel = lambda lib, name: (CUresult.CUDA_ERROR_NOT_FOUND, None)
    with pytest.raises(LaunchError, match="cuLibraryGetKernel"):
        prog(HostArray([1.0]), HostArray([1.0]), 1.0)
    assert library.loaded_libraries() == [] and not fake.libraries  # unloaded again
    fake.cuLibraryGetKernel = real
    fake.calls.clear()
    assert _values(prog(HostArray([1.0]), HostArray([2.0]), 3.0)) == [5.0]
    assert _values(prog(HostArray([2.0]), HostArray([2.0]), 3.0)) == [8.0]
    assert _loads(fake) == 1


def test_failed_launch_frees_its_outputs_without_the_collector(fake) -> None:
    prog = axpby()
    fake.launch_error = 719
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            with pytest.raises(LaunchError, match=r"launching axpby with grid \(1, 1, 1\) "
                                                  r"block \(128, 1, 1\)"):
                kp.runtime.call_program(prog, HostArray([1.0]), HostArray([1.0]), 1.0)
        assert not fake.memory  # no exception -> frame cycle keeps the outputs
    finally:
        gc.enable()
    fake.launch_error = 0
    z = kp.runtime.call_program(prog, HostArray([1.0]), HostArray([1.0]), 1.0)
    assert _values(z) == [2.0]  # still usable


def test_warmup_leaves_the_current_device_alone(fake) -> None:
    pack = kp.load(kp.save([axpby()], None))
    fake.current = CTX0
    pack.warmup(devices=[1, 0])
    assert fake.current == CTX0
    assert [c[0] for c in fake.calls].count("cuFuncLoad") == 2  # one per device
    assert not [c for c in fake.calls if c[0] == "cuCtxSetCurrent"]


def test_inputs_on_device_1_bind_device_1_only(fake) -> None:
    on: dict[int, int] = {}
    fake.cuPointerGetAttribute = lambda attr, ptr: (CUresult(0), on.get(int(ptr), 0))
    real_launch = fake.cuLaunchKernel
    contexts: list[int] = []

    def launch(*args):
        contexts.append(fake.current)
        return real_launch(*args)

    fake.cuLaunchKernel = launch

    keep: list = []  # alive, so that no later array reuses an address marked device 1

    def dev1(values: list) -> HostArray:
        a = HostArray(values)
        on[a.__cuda_array_interface__["data"][0]] = 1
        keep.append(a)
        return a

    prog = kp.load(kp.save([axpby()], None))["axpby"]
    z = prog(dev1([1.0]), dev1([2.0]), 3.0)
    assert z.device == 1 and contexts == [CTX0 + 1] and list(prog._kp_bound._states) == [1]
    with pytest.raises(LaunchError, match="'y' is on device 0, earlier arguments on device 1"):
        prog(dev1([1.0]), HostArray([1.0]), 1.0)
    prog(HostArray([1.0]), HostArray([1.0]), 1.0)
    assert contexts[-1] == CTX0 and sorted(prog._kp_bound._states) == [0, 1]
    assert _loads(fake) == 1  # same arch: one context-independent library serves both


def test_dropped_pack_is_freed_and_its_twin_keeps_working(fake) -> None:
    data = kp.save([axpby()], None)
    backing = array.array("B", data)  # a buffer that can be watched with a weak reference
    watch = weakref.ref(backing)
    first = kp.load(memoryview(backing).toreadonly())
    del backing
    second = kp.load(data)
    assert _values(first["axpby"](HostArray([1.0]), HostArray([1.0]), 1.0)) == [2.0]
    del first
    gc.collect()
    assert watch() is None  # nothing in the runtime keeps a dropped pack's bytes
    assert _values(second["axpby"](HostArray([1.0]), HostArray([1.0]), 2.0)) == [3.0]
    assert _loads(fake) == 1  # the same image: one library for both packs


def test_packs_with_other_bytes_under_the_same_names_load_their_own_code(fake) -> None:
    a = kp.load(kp.save([_renamed("axpby", b"\x7fELF-code-A")], None))
    b = kp.load(kp.save([_renamed("axpby", b"\x7fELF-code-B")], None))
    a["axpby"](HostArray([1.0]), HostArray([1.0]), 1.0)
    b["axpby"](HostArray([1.0]), HostArray([1.0]), 1.0)
    loaded = [c[1] for c in fake.calls if c[0] == "cuLibraryLoadData"]
    assert loaded == [b"\x7fELF-code-A", b"\x7fELF-code-B"]


def test_missing_driver_error_does_not_grow(monkeypatch) -> None:
    class NoLibcuda(FakeDriver):
        def cuInit(self, flags: int) -> tuple:
            raise RuntimeError("libcuda.so: cannot open shared object file")

    install(monkeypatch, NoLibcuda())
    prog = axpby()
    depths = []
    for _ in range(5):
        with pytest.raises(DeviceError, match="no CUDA driver found") as info:
            kp.runtime.call_program(prog, HostArray([1.0]), HostArray([1.0]), 1.0)
        tb, depth = info.value.__traceback__, 0
        while tb is not None:
            depth, tb = depth + 1, tb.tb_next
        depths.append(depth)
        assert isinstance(info.value.__cause__, RuntimeError)
    assert depths[1:] == depths[1:2] * 4  # each failure carries its own frames only
