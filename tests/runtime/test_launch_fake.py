"""The launch path on CPU, against a fake driver: slot layout, pointers, scalars, dimensions,
allocation, out=, errors and the all-or-nothing loading guarantee."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import (CompatibilityError, ConstraintError, DeviceError, LaunchError)
from kernelpack.runtime import call_program, warmup
from kernelpack.runtime.driver import CudaResultError
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent.parent))
from kp_samples import axpy, rich  # noqa: E402

from fake_driver import FakeDriver, HostArray, install  # noqa: E402


def _f32(addr: int, n: int) -> list:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(addr, 4 * n)))


def _axpy_impl(grid, block, shmem, v) -> None:
    x, y, a, n = v
    xs, ys = _f32(x, n), _f32(y, n)
    ctypes.memmove(y, struct.pack(f"<{n}f", *[a * p + q for p, q in zip(xs, ys)]), 4 * n)


def _axpby_impl(grid, block, shmem, v) -> None:
    x, y, z, a, n = v
    xs, ys = _f32(x, n), _f32(y, n)
    ctypes.memmove(z, struct.pack(f"<{n}f", *[a * p + q for p, q in zip(xs, ys)]), 4 * n)


def axpby() -> Compiled:
    """z = a*x + y with z an output (the shape the benchmarks use)."""
    s = KernelSummary("axpby", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",)),
                                Tensor("z", kp.f32, ("n",), role="out"), Scalar("a", kp.f32),
                                Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("axpby", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("z"),
                                        Arg.scalar("a"), Arg.scalar("n32"))),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-axpby", "fake", 13000)
    return Compiled(s, (Module("m", ("axpby",), (img,)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl),
                                                    "axpby": ("QQQfI", _axpby_impl)}))


def test_axpy_inout_writes_slots_and_runs(fake) -> None:
    x, y = HostArray([1.0, 2.0, 3.0]), HostArray([10.0, 20.0, 30.0])
    assert call_program(axpy(), x, y, 2.0) is None
    assert y.values() == [12.0, 24.0, 36.0]
    launch = [c for c in fake.calls if c[0] == "cuLaunchKernel"][0]
    assert launch[2:5] == ((1, 1, 1), (256, 1, 1), 0)
    assert launch[6][2:] == (2.0, 3)
    loads = [c for c in fake.calls if c[0] == "cuLibraryLoadData"]
    assert len(loads) == 1 and loads[0][1] == axpy().modules[0].images[1].data  # sm_90 cubin


def test_output_allocated_as_device_buffer(fake) -> None:
    from kernelpack.runtime.buffer import DeviceBuffer

    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 0.5)
    assert isinstance(z, DeviceBuffer) and z.shape == (2,) and z.dtype is kp.f32
    assert list(struct.unpack("<2f", z.copy_to_host())) == [3.5, 5.0]
    cai = z.__cuda_array_interface__
    assert cai["shape"] == (2,) and cai["typestr"] == "<f4" and cai["data"] == (z.ptr, False)
    ptr, fake.current = z.ptr, 0x999
    del z, cai
    assert ptr not in fake.memory and fake.current == 0x999  # freed, context left as it was


def test_device_buffer_dlpack_capsule(fake) -> None:
    from kernelpack.runtime.dlpack import read_capsule

    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 1.0)
    capsule = z.__dlpack__()
    view = read_capsule(capsule, "z")
    assert (view.ptr, view.shape, view.dtype, view.device_id) == (z.ptr, (2,), kp.f32, 0)
    assert view.strides == (1,) and z.__dlpack_device__() == (2, 0)
    ptr = z.ptr
    del z
    assert ptr in fake.memory      # the capsule keeps the buffer alive
    del capsule, view
    import gc
    gc.collect()
    assert ptr not in fake.memory  # dropped unconsumed: the capsule destructor released it


def test_out_given_allocates_nothing(fake) -> None:
    z = HostArray([0.0, 0.0])
    result = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 2.0, out=z)
    assert result is z and z.values() == [5.0, 8.0]
    call_program(axpby(), HostArray([1.0, 1.0]), HostArray([1.0, 1.0]), 1.0, out={"z": z})
    assert z.values() == [2.0, 2.0]
    assert not fake.memory  # no cuMemAlloc


def test_kwargs_and_stream_handle(fake) -> None:
    class TorchLikeStream:
        cuda_stream = 0x1234

    y = HostArray([1.0])
    call_program(axpy(), x=HostArray([1.0]), y=y, a=1.0, stream=TorchLikeStream())
    call_program(axpy(), HostArray([1.0]), y, 1.0, stream=77)
    streams = [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert streams == [0x1234, 77]
    assert y.values() == [3.0]


def test_context_made_current_only_when_needed(fake) -> None:
    fake.current = 0
    y = HostArray([1.0])
    for _ in range(3):
        call_program(axpy(), HostArray([1.0]), y, 1.0)
    assert [c for c in fake.calls if c[0] == "cuCtxSetCurrent"] == [("cuCtxSetCurrent", 0x100)]


def test_dtype_rank_shape_errors_name_the_parameter(fake) -> None:
    prog = axpy()
    with pytest.raises(LaunchError, match="'x' has dtype int32, expected float32"):
        call_program(prog, HostArray([1], "i", typestr="<i4"), HostArray([1.0]), 1.0)
    with pytest.raises(ConstraintError, match="x"):
        call_program(prog, HostArray([1.0, 2.0], shape=(1, 2)), HostArray([1.0]), 1.0)
    with pytest.raises(ConstraintError, match=r"y\.shape\[0\] is 2"):
        call_program(prog, HostArray([1.0]), HostArray([1.0, 2.0]), 1.0)
    bad = HostArray([1.0, 2.0, 3.0, 4.0], shape=(2,))
    bad.strides = (8,)
    with pytest.raises(LaunchError, match="'y' is not C-contiguous"):
        call_program(prog, HostArray([1.0, 2.0]), bad, 1.0)
    with pytest.raises(LaunchError, match="expected a CUDA array"):
        call_program(prog, [1.0], HostArray([1.0]), 1.0)
    with pytest.raises(TypeError, match="takes 3 inputs"):
        call_program(prog, HostArray([1.0]))
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_scalar_conversion_errors(fake) -> None:
    s = KernelSummary("k", (Tensor("x", kp.f32, ("n",)), Scalar("k", kp.i8)),
                      (Variant((Launch("axpy", "m", (1,), (1,), (Arg.buffer("x"),
                                                                Arg.scalar("k"))),)),))
    prog = Compiled(s, (Module("m", ("axpy",), (Image("cubin", "sm_90", b"\x7fELF"),)),))
    with pytest.raises(TypeError, match="'k' is int8; pass an integer"):
        call_program(prog, HostArray([1.0]), 2.5)
    with pytest.raises(ConstraintError, match="'k' = 300 does not fit int8"):
        call_program(prog, HostArray([1.0]), 300)


def test_out_errors(fake) -> None:
    prog = axpby()
    x, y = HostArray([1.0, 2.0]), HostArray([3.0, 4.0])
    with pytest.raises(LaunchError, match="out 'z' has shape \\(3,\\), expected \\(2,\\)"):
        call_program(prog, x, y, 1.0, out=HostArray([0.0] * 3))
    with pytest.raises(TypeError, match="unknown outputs"):
        call_program(prog, x, y, 1.0, out={"w": HostArray([0.0, 0.0])})
    with pytest.raises(LaunchError, match="out 'z' has dtype int32"):
        call_program(prog, x, y, 1.0, out=HostArray([0, 0], "i", typestr="<i4"))


def test_size_zero_launches_nothing(fake) -> None:
    z = call_program(axpby(), HostArray([]), HostArray([]), 1.0)
    assert z.shape == (0,) and z.nbytes == 0
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_no_device_is_a_plain_device_error(monkeypatch) -> None:
    install(monkeypatch, FakeDriver(devices=0))
    with pytest.raises(DeviceError, match="CUDA_ERROR_NO_DEVICE") as info:
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)
    assert isinstance(info.value.__cause__, CudaResultError)


def test_no_compatible_image_lists_every_image(monkeypatch) -> None:
    install(monkeypatch, FakeDriver(arch=(7, 5), kernels={"axpy": ("QQfI", _axpy_impl)}))
    with pytest.raises(CompatibilityError) as info:
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)
    text = str(info.value)
    assert "sm_75" in text and "cubin sm_80" in text and "cubin sm_90" in text
    assert "ptx compute_80" in text and "newer than the device" in text


def test_failed_load_leaves_nothing_loaded(fake) -> None:
    from kernelpack.runtime import library

    fake.load_error = 200  # CUDA_ERROR_INVALID_IMAGE
    with pytest.raises(CompatibilityError, match="CUDA_ERROR_INVALID_IMAGE"):
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)
    assert library.loaded_libraries() == []
    fake.load_error = 0
    prog = Compiled(axpy().summary,
                    (Module("axpy", ("axpy", "missing"), (Image("cubin", "sm_90", b"\x7fELF"),)),))
    with pytest.raises(LaunchError, match="cuLibraryGetKernel\\('missing'\\)"):
        call_program(prog, HostArray([1.0]), HostArray([1.0]), 1.0)
    assert library.loaded_libraries() == []
    assert fake.calls[-1][0] == "cuLibraryUnload"


def test_launch_error_is_chained(fake) -> None:
    fake.launch_error = 719  # CUDA_ERROR_LAUNCH_FAILED (unknown to the fake enum: still named)
    with pytest.raises(LaunchError, match="launching axpy") as info:
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)
    assert isinstance(info.value.__cause__, CudaResultError) and info.value.__cause__.code == 719


def test_warmup_loads_functions(fake) -> None:
    warmup([axpy()], devices=[0])
    assert [c[0] for c in fake.calls].count("cuFuncLoad") == 1


def test_rich_program_matches_the_planner(monkeypatch) -> None:
    """Every summary feature (variants, scratch, zero_init, repeats, value args) launches
    exactly what ``Planner.plan`` says."""
    from kernelpack.planner import Planner

    noop = lambda *a: None  # noqa: E731
    fake = install(monkeypatch, FakeDriver(arch=(8, 6), kernels={
        "rowsum": ("QQiq", noop), "partial": ("QQi", noop), "stage": ("Qi", noop),
        "finish": ("QQ", noop)}))
    prog = rich()
    for n, m in ((3, 100), (5, 3000)):
        fake.calls.clear()
        x = HostArray([0.0] * (n * m), shape=(n, m))
        out = call_program(prog, x, m, 0.5)
        plan = Planner(prog.summary).plan((n, m), m, 0.5)
        launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
        assert [(c[1], c[2], c[3], c[4]) for c in launches] == \
            [(p.kernel, p.grid, p.block, p.shared_mem) for p in plan.launches]
        for call, planned in zip(launches, plan.launches):
            values = [a[1] for a in planned.args if a[0] == "value"]
            assert [v for v in call[6] if v in values] == values or not values
        memsets = [c for c in fake.calls if c[0] == "cuMemsetD8Async"]
        zeroed = [a.nbytes for a in plan.allocations.values() if a.zero_init]
        assert sorted(c[2] for c in memsets) == sorted(zeroed)
        assert out.shape == (n,)
        allocs = [c for c in fake.calls if c[0] == "cuMemAllocAsync"]
        frees = [c for c in fake.calls if c[0] == "cuMemFreeAsync"]
        assert len(allocs) == len(frees) == (1 if m > 1024 else 0)  # scratch, stream-ordered
    with pytest.raises(ConstraintError, match="need at least one row"):
        call_program(prog, HostArray([], shape=(0, 4)), 4, 0.5)
    with pytest.raises(ConstraintError):
        call_program(prog, HostArray([0.0] * 4, shape=(1, 4)), 5, 0.5)  # m disagrees


def test_a_failed_check_queues_nothing(monkeypatch) -> None:
    """The second launch's value argument overflows int32: the first launch must not run."""
    noop = lambda *a: None  # noqa: E731
    fake = install(monkeypatch, FakeDriver(kernels={"a": ("Q", noop), "b": ("Qi", noop)}))
    n = kp.sym("n")
    s = KernelSummary("two", (Tensor("x", kp.f32, ("n",)),),
                      (Variant((Launch("a", "m", (1,), (1,), (Arg.buffer("x"),)),
                                Launch("b", "m", (1,), (1,), (Arg.buffer("x"),
                                                             Arg.of(n * 1_000_000, kp.i32))))),))
    prog = Compiled(s, (Module("m", ("a", "b"), (Image("cubin", "sm_90", b"\x7fELF"),)),))
    call_program(prog, HostArray([1.0]))
    assert len([c for c in fake.calls if c[0] == "cuLaunchKernel"]) == 2
    fake.calls.clear()
    with pytest.raises(ConstraintError, match="does not fit int32"):
        call_program(prog, HostArray([1.0] * 3000))
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_missing_driver_library_is_a_plain_device_error(monkeypatch) -> None:
    class NoLibcuda(FakeDriver):
        def cuInit(self, flags: int) -> tuple:
            raise RuntimeError("libcuda.so: cannot open shared object file")

    install(monkeypatch, NoLibcuda())
    with pytest.raises(DeviceError, match="no CUDA driver found") as info:
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(DeviceError, match="no CUDA driver found"):  # remembered, not retried
        call_program(axpy(), HostArray([1.0]), HostArray([1.0]), 1.0)


def test_dlpack_only_arguments(fake) -> None:
    """An object with only __dlpack__ (here: wrapping our own DeviceBuffer) is read through
    the capsule: pointer, dtype, shape and device."""
    x = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([0.0, 0.0]), 1.0)  # x = [1, 2]

    class OnlyDLPack:
        def __init__(self, buf) -> None:
            self.buf = buf

        def __dlpack__(self, stream=None):
            return self.buf.__dlpack__(stream=stream)

    z = call_program(axpby(), OnlyDLPack(x), OnlyDLPack(x), 3.0)
    assert list(struct.unpack("<2f", z.copy_to_host())) == [4.0, 8.0]
