"""Eleventh review: several GPUs, on the fake driver (2-3 fake devices, per-thread current
contexts, both driver doors: the cuda.bindings-like fake and the ctypes one over the C-level
fake). What issue 4 asks of a multi-GPU process: the device of the input tensors decides, one
loaded library per device (per chosen image: ``cuLibraryLoadData`` is context-independent),
launches in that device's context, outputs on that device, and the caller's current device
left as it was; mixed devices, unknown ordinals and ``out=`` elsewhere refused by name;
``warmup`` loads exactly the devices asked for, with the image chosen per device."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompatibilityError, DeviceError, LaunchError
from kernelpack.summary import Compiled, Image, Module

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install, install_framework  # noqa: E402
from test_fastpath_fake import FakeDtype, Tensor, _has_c_fast_path, _prod  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_libcuda import _make  # noqa: E402

CTX = {0: 0x100, 1: 0x101, 2: 0x102}  # the fake's primary contexts


def make_fake(monkeypatch, door: str, devices: int = 2, **kw) -> FakeDriver:
    """A fake of ``devices`` GPUs behind ``door`` ("bindings": the cuda.bindings-like fake;
    "bindings-py": the same without a C entry point for cuLaunchKernel; "ctypes": LibCuda
    over the C-level fake), with per-thread contexts, allocations that
    remember their device and per-library kernel handles."""
    kw = dict(devices=devices, thread_contexts=True, track_pointers=True,
              distinct_kernels=True, **kw)
    if door == "bindings-py":  # no C entry point: launches through the fake's Python one
        kw["native"] = False
    if door == "ctypes":
        if not _has_c_fast_path():
            pytest.skip("the C extension kernelpack.runtime._launch is not built")
        drv, c = _make(**kw)
        c.fake.kernels["axpby"] = ("QQQfI", _axpby_impl)
        install(monkeypatch, drv)
        return c.fake
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}, **kw))


@pytest.fixture(params=["bindings", "bindings-py", "ctypes"])
def door(request) -> str:
    return request.param


def two_arch_axpby() -> Compiled:
    """axpby with an sm_90 and an sm_80 cubin: a mixed box picks one per device."""
    prog = axpby()
    images = (Image("cubin", "sm_90", b"\x7fELF-fake-axpby-sm90", "fake", 13000),
              Image("cubin", "sm_80", b"\x7fELF-fake-axpby-sm80", "fake", 13000))
    return Compiled(prog.summary, (Module("m", ("axpby",), images),))


def on(fake: FakeDriver, device: int, values: list) -> HostArray:
    """A HostArray the fake says lives on ``device`` (kept alive by the test: its address
    must not be reused by an array of another device)."""
    a = HostArray(values)
    fake.pointer_devices[a.__cuda_array_interface__["data"][0]] = device
    return a


class DevTensor(Tensor):
    """The stand-in torch tensor, whose ``empty_like`` keeps its device."""


@pytest.fixture
def torch(monkeypatch):
    """A stand-in ``torch`` whose ``empty`` allocates on the device it is asked for."""
    mod = types.ModuleType("torch")
    mod.float32, mod.int32 = FakeDtype("float32", "f"), FakeDtype("int32", "i")
    mod.Tensor = Tensor
    mod.device = lambda kind, index: (kind, index)

    def empty(*shape, dtype, device):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return Tensor([0] * _prod(shape), dtype, tuple(shape), device=device[1])

    mod.empty = empty
    mod.empty_like = lambda t: Tensor([0] * _prod(t.shape), t.dtype, t.shape, device=t._device)
    mod._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)
    mod.cuda = types.SimpleNamespace(ExternalStream=lambda handle, device=None: ("ext", handle))
    return install_framework(monkeypatch, "torch", mod)


def _device_of(fake: FakeDriver, result) -> int:
    if isinstance(result, Tensor):
        return result.get_device()
    return result.device


def _values(result) -> list:
    if isinstance(result, Tensor):
        return result.values()
    import struct
    return list(struct.unpack(f"<{result.shape[0]}f", result.copy_to_host()))


# ---- 0, then 1, then 0 again --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["host", "torch"])
@pytest.mark.parametrize("arches", ["same", "mixed"])
def test_devices_0_1_0_load_once_launch_in_their_context_and_leave_the_caller_alone(
        monkeypatch, door, kind, arches, request) -> None:
    archs = {1: (8, 0)} if arches == "mixed" else None
    fake = make_fake(monkeypatch, door, archs=archs)
    if kind == "torch":
        request.getfixturevalue("torch")
    prog = kp.load(kp.save([two_arch_axpby()]))["axpby"]
    keep = []

    def args(device: int, k: float) -> tuple:
        if kind == "torch":
            return (Tensor([1.0, 2.0, k], kp_f32(), device=device),
                    Tensor([1.0, 1.0, 1.0], kp_f32(), device=device))
        pair = (on(fake, device, [1.0, 2.0, k]), on(fake, device, [1.0, 1.0, 1.0]))
        keep.append(pair)
        return pair

    handles: dict[int, set] = {0: set(), 1: set()}
    # (tensors' device, the caller's current device before the call: None = no context)
    steps = [(0, None), (1, 0), (0, 1), (0, 1), (1, 0), (1, 1), (0, 0), (0, 1), (1, 0)]
    for i, (device, caller) in enumerate(steps):
        fake.current = 0 if caller is None else CTX[caller]
        before = fake.current
        result = prog(*args(device, float(i)), 2.0)
        assert _values(result) == [3.0, 5.0, 2.0 * i + 1.0], (i, device)
        assert _device_of(fake, result) == device, (i, device)  # allocated on the inputs' device
        entry, ctx, stream, handle = fake.launch_contexts[-1]
        assert (entry, ctx, stream) == ("axpby", CTX[device], 0), (i, device, caller)
        handles[device].add(handle)
        if caller is not None:  # the general path and the fast paths alike (review 11)
            assert fake.current == before, (f"call {i}: tensors on device {device} left device "
                                             f"{fake.current - 0x100} current, the caller had "
                                             f"device {caller}")
    assert len(fake.launch_contexts) == len(steps)
    # one context-independent library per chosen image, loaded once, never again
    loads = fake.load_contexts
    libs = {lib for h in handles[0] | handles[1] for lib, _ in [fake.kernel_handles[h]]}
    if arches == "mixed":
        assert len(loads) == 2 and len(libs) == 2
        lib0, = {fake.kernel_handles[h][0] for h in handles[0]}
        lib1, = {fake.kernel_handles[h][0] for h in handles[1]}
        assert fake.libraries[lib0].endswith(b"sm90") and fake.libraries[lib1].endswith(b"sm80")
    else:
        assert len(loads) == 1 and len(libs) == 1
    assert all(len(h) == 1 for h in handles.values())  # one function per device, reused
    assert not fake.callback_errors, fake.callback_errors


def kp_f32() -> FakeDtype:
    return sys.modules["torch"].float32


#: The torch/cupy fast paths (fastpath.py FastCore.context_was_lost, and the C FastCall that
#: calls it) made the tensors' device current with cuCtxSetCurrent and left it so: a thread on
#: device 1 calling with tensors on device 0 was on device 0 afterwards. They push and pop
#: now, as the general path does.
@pytest.mark.parametrize("path", ["C", "closure"])
def test_fast_path_leaves_the_callers_device_alone(monkeypatch, door, torch, path) -> None:
    if path == "closure":
        if door == "ctypes":
            pytest.skip("KERNELPACK_NATIVE_LAUNCH=0 launches through cuda.bindings: no ctypes door")
        monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "0")
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    x, y = Tensor([1.0], torch.float32, device=0), Tensor([1.0], torch.float32, device=0)
    prog(x, y, 1.0)
    fake.current = CTX[1]  # torch.cuda.set_device(1)
    assert prog(x, y, 1.0).values() == [2.0]
    assert fake.launch_contexts[-1][1] == CTX[0]
    assert fake.current == CTX[1]


# ---- errors -----------------------------------------------------------------------------------
def _placed(request, fake, kind: str, *placed: tuple[int, list]) -> list:
    """Arrays of ``(device, values)``: stand-in torch tensors, or the fake's host-kind ones."""
    if kind == "torch":
        t = request.getfixturevalue("torch")
        return [Tensor(values, t.float32, device=d) for d, values in placed]
    return [on(fake, d, values) for d, values in placed]


@pytest.mark.parametrize("kind", ["host", "torch"])
def test_mixed_devices_name_both_arguments_and_devices(monkeypatch, door, kind, request) -> None:
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    x0, y0, x1 = _placed(request, fake, kind, (0, [1.0]), (0, [1.0]), (1, [1.0]))
    prog(x0, y0, 1.0)
    prog(x0, y0, 1.0)  # the fast path is built (torch)
    n = len(fake.launch_contexts)
    with pytest.raises(LaunchError) as err:
        prog(x1, y0, 1.0)
    msg = str(err.value)
    assert "'y' is on device 0" in msg and "'x'" in msg and "device 1" in msg, msg
    assert len(fake.launch_contexts) == n  # nothing launched


@pytest.mark.parametrize("kind", ["host", "torch"])
def test_a_device_that_does_not_exist_is_a_device_error(monkeypatch, door, kind,
                                                        request) -> None:
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    if kind == "torch":
        t = request.getfixturevalue("torch")
        x, y = Tensor([1.0], t.float32, device=3), Tensor([1.0], t.float32, device=3)
        prog(Tensor([1.0], t.float32), Tensor([1.0], t.float32), 1.0)
        prog(Tensor([1.0], t.float32), Tensor([1.0], t.float32), 1.0)  # fast path built
    else:
        x, y = on(fake, 3, [1.0]), on(fake, 3, [1.0])
    with pytest.raises(DeviceError, match="axpby: argument 'x': CUDA device 3 does not exist "
                                          r"\(this machine has 2 devices\)"):
        prog(x, y, 1.0)
    assert 3 not in prog._kp_bound._states


@pytest.mark.parametrize("kind", ["host", "torch"])
def test_out_on_another_device_is_refused_naming_out(monkeypatch, door, kind, request) -> None:
    fake = make_fake(monkeypatch, door)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    x, y, z1 = _placed(request, fake, kind, (0, [1.0]), (0, [1.0]), (1, [0.0]))
    prog(x, y, 1.0)
    prog(x, y, 1.0)
    n = len(fake.launch_contexts)
    with pytest.raises(LaunchError, match="out 'z' is on device 1, the inputs on device 0"):
        prog(x, y, 1.0, out=z1)
    assert len(fake.launch_contexts) == n


# ---- warmup -----------------------------------------------------------------------------------
def _func_loads(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuFuncLoad"]


def test_warmup_loads_exactly_the_devices_asked_once(monkeypatch, door) -> None:
    fake = make_fake(monkeypatch, door, devices=3, archs={2: (8, 0)})
    pack = kp.load(kp.save([two_arch_axpby()]))
    prog = pack["axpby"]
    fake.current = CTX[1]
    pack.warmup(devices=[0, 2])
    assert fake.current == CTX[1]
    assert sorted(prog._kp_bound._states) == [0, 2]
    assert len(fake.load_contexts) == 2  # sm_90 for device 0, sm_80 for device 2
    assert sorted(fake.load_contexts) == [CTX[0], CTX[2]]
    assert len(_func_loads(fake)) == 2
    pack.warmup(devices=[2, 0])  # again: nothing more
    prog.warmup(devices=[0])
    assert len(fake.load_contexts) == 2 and len(_func_loads(fake)) == 2
    keep = [on(fake, d, [1.0]) for d in (0, 0, 2, 2)]
    calls = len(fake.calls)
    prog(keep[0], keep[1], 1.0)
    prog(keep[2], keep[3], 1.0)
    later = [c[0] for c in fake.calls[calls:]]
    assert "cuLibraryLoadData" not in later and "cuFuncLoad" not in later
    assert [c[1] for c in fake.launch_contexts] == [CTX[0], CTX[2]]
    assert fake.current == CTX[1]
    pack.warmup()  # the current device: 1, an sm_90 device, the library of device 0
    assert sorted(prog._kp_bound._states) == [0, 1, 2]
    assert len(fake.load_contexts) == 2 and len(_func_loads(fake)) == 3


def test_program_warmup_of_one_device(monkeypatch, door) -> None:
    fake = make_fake(monkeypatch, door, devices=3)
    pack = kp.load(kp.save([axpby()]))
    pack["axpby"].warmup(devices=[1])
    assert sorted(pack["axpby"]._kp_bound._states) == [1]
    assert fake.load_contexts == [CTX[1]] and len(_func_loads(fake)) == 1
    assert fake.current == 0  # the thread had no context, and has none


def test_warmup_of_a_device_without_a_compatible_image(monkeypatch, door) -> None:
    fake = make_fake(monkeypatch, door, devices=3, archs={1: (7, 5)})
    pack = kp.load(kp.save([two_arch_axpby()]))
    with pytest.raises(CompatibilityError) as err:
        pack.warmup(devices=[0, 1])
    msg = str(err.value)
    assert "sm_75" in msg and "sm_90" in msg and "sm_80" in msg, msg
    assert "device 1" in msg, msg
    # device 0 is usable all the same, and device 1 stays refused on a call
    keep = [on(fake, 0, [1.0]), on(fake, 0, [1.0]), on(fake, 1, [1.0]), on(fake, 1, [1.0])]
    assert _values(pack["axpby"](keep[0], keep[1], 1.0)) == [2.0]
    with pytest.raises(CompatibilityError, match="sm_75"):
        pack["axpby"](keep[2], keep[3], 1.0)


def test_warmup_of_a_device_that_does_not_exist(monkeypatch, door) -> None:
    fake = make_fake(monkeypatch, door)
    with pytest.raises(DeviceError, match="device 5 does not exist"):
        kp.load(kp.save([axpby()])).warmup(devices=[0, 5])
    assert fake.load_contexts == []  # checked before anything loads
