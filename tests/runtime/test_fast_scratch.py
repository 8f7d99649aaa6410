"""Scratch buffers on the torch fast paths (C, C through DLPack's exchange API, the closure),
on CPU with the stand-in torch and the fake driver.

A program whose variant for a shape has scratch used to go to the general path for every
call, and so did every shape of a program with such a variant anywhere (a row softmax, whose
split variant for long rows has scratch, on any shape). Now such a call allocates its scratch
as one buffer of the caller's framework and launches from the fast path; a variant with
zeroed scratch or repeated launches still goes to the general path, per key; with
``stream=`` the scratch comes from that stream's pool. The C type's side: malformed scratch
answers and slots are errors, and calls leave no references behind."""

from __future__ import annotations

import ctypes
import gc
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.expr import eq, ge
from kernelpack.runtime import call_program
from kernelpack.runtime.fastpath import SCRATCH_ALIGN, fits
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scratch,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import FakeDtype, NDArray, Tensor as FakeTensor, _prod  # noqa: E402
from test_fastpath_fake import cupy, exchange, select_path, torch  # noqa: E402,F401


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


@pytest.fixture
def allocations(torch, monkeypatch) -> list:
    """The stand-in torch with uint8 tensors (scratch), recording every allocation as
    ``(shape, dtype name)``."""
    made: list = []
    torch.uint8 = FakeDtype("uint8", "B", 1)

    def empty(shape, dtype, device):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        made.append((shape, dtype.name) if torch.current_stream is None
                    else (shape, dtype.name, torch.current_stream))
        n = _prod(shape)
        # the stand-in's buffer holds 4 bytes per value: itemsize // 4 values per element of
        # 4 bytes or more (as the stand-in's own empty), one per element below that
        return FakeTensor([0] * (n * dtype.itemsize // 4 if dtype.itemsize >= 4 else n), dtype,
                          shape)

    monkeypatch.setattr(torch, "empty", empty)
    return made


def _floats(addr: int, n: int) -> list[float]:
    return list((ctypes.c_float * n).from_address(addr))


def _put(addr: int, values: list[float]) -> None:
    (ctypes.c_float * len(values)).from_address(addr)[:] = values


def _double(grid, block, shmem, v) -> None:
    x, s1, n = v
    _put(s1, [2 * a for a in _floats(x, n)])


def _total(grid, block, shmem, v) -> None:
    s1, s2, n = v
    _put(s2, [sum(_floats(s1, n))])


def _add(grid, block, shmem, v) -> None:
    s1, s2, z, n = v
    t = _floats(s2, 1)[0]
    _put(z, [a + t for a in _floats(s1, n)])


def _direct(grid, block, shmem, v) -> None:
    x, z, n = v
    xs = _floats(x, n)
    _put(z, [2 * a + 2 * sum(xs) for a in xs])


def _accumulate(grid, block, shmem, v) -> None:  # needs acc zeroed first
    x, acc, n = v
    _put(acc, [_floats(acc, 1)[0] + 2 * sum(_floats(x, n))])


def _add_acc(grid, block, shmem, v) -> None:
    x, acc, z, n = v
    t = _floats(acc, 1)[0]
    _put(z, [2 * a + t for a in _floats(x, n)])


KERNELS = {"double": ("QQi", _double), "total": ("QQi", _total), "add": ("QQQi", _add),
           "direct": ("QQi", _direct), "accumulate": ("QQi", _accumulate),
           "add_acc": ("QQQi", _add_acc)}


def _program(zeroed_only: bool = False) -> Compiled:
    """z = 2x + 2 sum(x), three ways: n == 3 with a zeroed accumulator (general path), n >= 4
    in three launches through two scratch buffers (fast path), else one launch."""
    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)

    def one(kernel: str, *names: str) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], n32))

    zeroed = Variant((one("accumulate", "x", "acc"), one("add_acc", "x", "acc", "z")),
                     (Scratch("acc", kp.f32, (1,), zero_init=True),),
                     None if zeroed_only else eq(n, 3))
    split = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                     one("add", "s1", "s2", "z")),
                    (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))), ge(n, 4))
    direct = Variant((one("direct", "x", "z"),))
    variants = (zeroed,) if zeroed_only else (zeroed, split, direct)
    s = KernelSummary("scr", (Tensor("x", kp.f32, ("n",)), Tensor("z", kp.f32, ("n",),
                                                                  role="out")), variants)
    img = Image("cubin", "sm_90", b"\x7fELF-fake-scratch", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS), (img,)),))


def _launches(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _expected(xs: list[float]) -> list[float]:
    return [2 * a + 2 * sum(xs) for a in xs]


def four_after_a_first_call(monkeypatch, torch, allocations) -> tuple:
    """The fake driver installed, :func:`_program` bound by a first call on four values (the
    split variant, with scratch) and the records cleared: ``(fake, prog, xs, x, out)``."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    call_program(prog, x)
    allocations.clear()
    fake.calls.clear()
    return fake, prog, xs, x, out


def test_a_variant_with_scratch_takes_the_fast_path(monkeypatch, torch, allocations,
                                                    launch_path) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    x = FakeTensor(xs, torch.float32)
    assert call_program(prog, x).values() == _expected(xs)  # general path: binds the device
    assert [a for a in allocations if a[1] == "uint8"] == [((20,), "uint8"), ((4,), "uint8")]
    allocations.clear()
    fake.calls.clear()
    z = call_program(prog, x)
    assert z.values() == _expected(xs)
    # one scratch allocation of both buffers, each at a multiple of SCRATCH_ALIGN (the output
    # is made with empty_like, which is not recorded)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")]
    double, total, add = _launches(fake)
    base = double[6][1]
    assert total[6][:2] == (base, base + SCRATCH_ALIGN)
    assert add[6] == (base, base + SCRATCH_ALIGN, z.data_ptr(), 5)
    if launch_path.startswith("C"):
        fast = getattr(bind(prog).call, "__self__", None)
        assert fast.fast_calls == 1
    # out= on the current stream: the fast path too; the small shape's variant has none
    out = FakeTensor([0.0] * 5, torch.float32)
    allocations.clear()
    assert call_program(prog, x, out=out) is out and out.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")]
    small = FakeTensor([1.0, 2.0], torch.float32)
    call_program(prog, small)
    allocations.clear()
    assert call_program(prog, small).values() == _expected([1.0, 2.0])
    assert allocations == []


def test_scratch_with_an_explicit_stream_comes_from_that_streams_pool(monkeypatch, torch,
                                                                     allocations,
                                                                     launch_path) -> None:
    """With ``stream=`` the fast paths allocate the call's scratch (one buffer) from that
    stream's pool, as the general path allocates its buffers for it, and launch there; until
    session 42 such a call went to the general path (each buffer apart)."""
    fake, prog, xs, x, out = four_after_a_first_call(monkeypatch, torch, allocations)
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    # one buffer for both (the general path allocates each apart: (16,) and (4,))
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 9))]
    double, total, add = _launches(fake)
    assert {c[5] for c in (double, total, add)} == {9}
    base = double[6][1]
    assert total[6][:2] == (base, base + SCRATCH_ALIGN) and add[6][:2] == total[6][:2]
    # the current stream's own handle as stream=: a plain allocation, as without stream=
    allocations.clear()
    current = torch._C._cuda_getCurrentRawStream(0)
    assert call_program(prog, x, out=out, stream=current) is out
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")]


def test_zeroed_scratch_stays_on_the_general_path_per_shape(monkeypatch, torch,
                                                            allocations, launch_path) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0]
    x = FakeTensor(xs, torch.float32)
    for _ in range(3):
        allocations.clear()
        fake.calls.clear()
        assert call_program(prog, x).values() == _expected(xs)
        assert ((4,), "uint8") in allocations  # the general path's accumulator
        assert any(c[0] == "cuMemsetD8Async" for c in fake.calls)
    if launch_path.startswith("C"):
        fast = getattr(bind(prog).call, "__self__", None)
        assert fast.fast_calls == 0 and fast.entries == 1  # remembered as the general path's
    # the other shapes of the same program still take the fast path
    y = FakeTensor([1.0, 2.0, 3.0, 4.0], torch.float32)
    call_program(prog, y)
    allocations.clear()
    assert call_program(prog, y).values() == _expected([1.0, 2.0, 3.0, 4.0])
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")]


def test_fits_asks_for_one_variant_the_fast_paths_take(monkeypatch, torch) -> None:
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    assert fits(bind(_program()).bound)
    assert not fits(bind(_program(zeroed_only=True)).bound)


def test_cupy_calls_allocate_scratch_with_cupy(monkeypatch, cupy, launch_path) -> None:
    """CuPy's fast paths (C and closure) make the scratch with ``cupy.empty`` on CuPy's
    current device and stream, which are the arrays' and the launch's."""
    import numpy

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    made: list = []

    def empty(shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        name = numpy.dtype(dtype).name  # a dtype, or a scalar type (numpy.uint8)
        made.append((shape, name))
        return NDArray([0] * _prod(shape), name, shape)

    monkeypatch.setattr(cupy, "empty", empty)
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    x = NDArray(xs)
    call_program(prog, x)
    made.clear()
    fake.calls.clear()
    z = call_program(prog, x)
    assert z.values() == _expected(xs)
    assert made == [((2 * SCRATCH_ALIGN,), "uint8")]
    double, total, _ = _launches(fake)
    assert total[6][:2] == (double[6][1], double[6][1] + SCRATCH_ALIGN)
    if launch_path.startswith("C"):
        assert getattr(bind(prog).call, "__self__", None).fast_calls == 1


def test_an_empty_scratch_buffer_at_the_end(monkeypatch, torch, allocations,
                                            launch_path) -> None:
    """A buffer of zero bytes lies at the end of the allocation (its offset is the total):
    the random fusions of tests/gpu found the C path refusing that entry."""
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)
    launches = tuple(Launch(k, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], n32))
                     for k, names in (("double", ("x", "s1")), ("total", ("s1", "s2")),
                                      ("add", ("s1", "s2", "z"))))
    s = KernelSummary("tail", (Tensor("x", kp.f32, ("n",)), Tensor("z", kp.f32, ("n",),
                                                                   role="out")),
                      (Variant(launches, (Scratch("s1", kp.f32, ("n",)),
                                          Scratch("s2", kp.f32, (1,)),
                                          Scratch("empty", kp.f32, (n - n,)))),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-tail", "fake", 13000)
    prog = Compiled(s, (Module("m", tuple(KERNELS), (img,)),))
    xs = [1.0, 2.0, 3.0]
    x = FakeTensor(xs, torch.float32)
    call_program(prog, x)
    allocations.clear()
    assert call_program(prog, x).values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")]
    if launch_path.startswith("C"):
        assert getattr(bind(prog).call, "__self__", None).fast_calls == 1


# ---- the C type's side: what it takes from fast_native.py ---------------------------------
def _fast_call(torch, answer, scratch_slots=None):
    """A FastCall for f(x: f32[n]) -> z (slots 0 and 1) with one scratch slot (2) and device
    state for device 0, whose hooks answer every key with ``answer``."""
    from kernelpack.runtime import _launch

    class Hooks:
        def entry(self, key):
            return answer

        def slow(self, args, out, stream):
            return "slow"

        def scratch(self, nbytes, device):
            return FakeTensor([0] * nbytes, torch.uint8, (nbytes,))

    layouts = ((16, (0, 8), ((0, "Q", 0), (8, "Q", 2))),)
    return _launch.FastCall(FakeTensor, lambda t: None, lambda d: 0, Hooks(), {0: object()}, 1,
                            ((0, 0, torch.float32),), (), (), ((1, torch.float32),), 3, layouts,
                            True, "torch", None, None,
                            (2,) if scratch_slots is None else scratch_slots)


@pytest.mark.parametrize("scratch, error, message", [
    ("bad", TypeError, "scratch is \\(total"),
    ((256,), TypeError, "scratch is \\(total"),
    ((256, ((2,),)), TypeError, "an item of hooks.entry's scratch"),
    ((256, ((9, 0),)), ValueError, "value slot of hooks.entry's scratch is out of range"),
    ((256, ((2, 512),)), ValueError, "offset is past the scratch's size"),
    ((-1, ((2, 0),)), OverflowError, "negative"),
])
def test_a_malformed_scratch_answer_is_an_error(monkeypatch, torch, allocations, launch_path,
                                                scratch, error, message) -> None:
    if not launch_path.startswith("C"):
        pytest.skip("the C type's parsing")
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    answer = (((1,),), (0,), (), (), False, (0, ()), scratch)
    fast = _fast_call(torch, answer)
    with pytest.raises(error, match=message):
        fast.call((FakeTensor([1.0], torch.float32),), None, None)


@pytest.mark.parametrize("slots, message", [
    ((0,), "written twice"),            # the input's slot
    ((7,), "value slot is out of range"),
    ("2", "scratch slots must be a tuple"),
])
def test_scratch_slots_it_cannot_take_are_refused(torch, launch_path, slots, message) -> None:
    if not launch_path.startswith("C"):
        pytest.skip("the C type's construction")
    with pytest.raises(ValueError, match=message):
        _fast_call(torch, None, slots)


def test_scratch_calls_leave_no_references(monkeypatch, torch, allocations, launch_path,
                                           exchange) -> None:
    """Each call's scratch is dropped once its launches are queued (a leak in C would keep
    every scratch tensor, and with it a reference to its dtype). The stand-in exchange API
    keeps every tensor it described: forgotten before counting."""
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x = FakeTensor([1.0, 2.0, 3.0, 4.0], torch.float32)
    out = FakeTensor([0.0] * 4, torch.float32)
    for _ in range(3):
        call_program(prog, x)
        call_program(prog, x, out=out)
    described = exchange.described if exchange is not None else []
    described.clear()
    gc.collect()
    before = sys.getrefcount(torch.uint8), sys.getrefcount(out)
    for _ in range(200):
        call_program(prog, x)
        call_program(prog, x, out=out)
    # three per call: x, the output (allocated or out=) and the scratch
    assert exchange is None or len(described) == 1200
    described.clear()
    gc.collect()
    assert (sys.getrefcount(torch.uint8), sys.getrefcount(out)) == before
    assert out.values() == _expected([1.0, 2.0, 3.0, 4.0])
