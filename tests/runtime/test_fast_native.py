"""The C fast path (``_launch.FastCall``, built by ``runtime/fast_native.py``) on CPU: every
scalar kind lands in the parameter block as the closure writes it, values the C path cannot
take go to the general path (and its errors) before anything is launched, the plan-cache key
carries symbol scalars, several launches and outputs, reference cycles are collected, and the
type refuses layouts it cannot take. Tests that compare with the closure run on both paths
(``launch_path``)."""

from __future__ import annotations

import ctypes
import gc
import struct
import sys
import weakref
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, KernelPackError
from kernelpack.runtime import call_program
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor as FakeTensor, select_path, torch  # noqa: E402,F401

_launch = pytest.importorskip("kernelpack.runtime._launch",
                              reason="the C extension kernelpack.runtime._launch is not built")


@pytest.fixture(params=["C", "closure"])
def launch_path(request, monkeypatch) -> str:
    """Both torch fast paths, for the tests that compare them (the others use the C one)."""
    return select_path(request.param, monkeypatch)

# name, kp dtype, struct code, a value inside its range
SCALARS = [("a", kp.f64, "d", -2.5), ("b", kp.f32, "f", 0.75), ("c", kp.i8, "b", -7),
           ("d", kp.u8, "B", 250), ("e", kp.i16, "h", -30000), ("f", kp.u16, "H", 65000),
           ("g", kp.i32, "i", -(1 << 31)), ("h", kp.u32, "I", (1 << 32) - 1),
           ("i", kp.i64, "q", -(1 << 62)), ("j", kp.u64, "Q", (1 << 63) - 1)]
FMT = "QQ" + "".join(code for _, _, code, _ in SCALARS) + "I"


def _copy_impl(grid, block, shmem, v) -> None:
    x, z, n = v[0], v[1], v[-1]
    ctypes.memmove(z, x, 4 * n)


def _scalars_program() -> Compiled:
    """z = x, with one scalar of every kind the fast paths take passed to the kernel."""
    params = [Scalar(name, dt) for name, dt, _, _ in SCALARS]
    s = KernelSummary("every", (Tensor("x", kp.f32, ("n",)), Tensor("z", kp.f32, ("n",),
                                                                    role="out"),
                                *params, Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("copy", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        *[Arg.scalar(p.name) for p in params],
                                        Arg.scalar("n32"))),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-copy", "fake", 13000)
    return Compiled(s, (Module("m", ("copy",), (img,)),))


def _driver(monkeypatch) -> FakeDriver:
    return install(monkeypatch, FakeDriver(kernels={"copy": (FMT, _copy_impl)}))


def _launches(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _fast(prog) -> object:
    from kernelpack.runtime.launcher import bind

    return getattr(bind(prog).call, "__self__", None)


def test_every_scalar_kind_is_packed_like_struct(monkeypatch, torch, launch_path) -> None:
    fake = _driver(monkeypatch)
    prog = _scalars_program()
    x = FakeTensor([1.0, 2.0, 3.0], torch.float32)
    values = [v for _, _, _, v in SCALARS]
    call_program(prog, x, *values)  # general path: binds
    for k in range(3):
        shifted = [v if isinstance(v, float) else v - k * (v > 0) + k * (v < 0)
                   for v in values]
        z = call_program(prog, x, *shifted)
        assert z.values() == [1.0, 2.0, 3.0]
        got = _launches(fake)[-1][6]
        assert list(got[2:-1]) == shifted and got[-1] == 3
    if launch_path == "C":
        assert _fast(prog).fast_calls == 3


@pytest.mark.parametrize("index, value", [
    (2, 128),             # int8 out of range
    (3, -1),              # uint8 below 0
    (6, 1 << 31),         # int32 out of range
    (7, 1 << 32),         # uint32 out of range
    (1, 1e39),            # too large for float32
    (0, 3),               # an int for a float scalar: the general path converts it
    (9, (1 << 64) - 1),   # a uint64 beyond int64: the general path takes it
])
def test_values_the_fast_path_cannot_take_go_to_the_general_path(monkeypatch, torch, index,
                                                                  value) -> None:
    """Each answer (result or error) is the general path's: compared with a program whose
    fast path is never built."""
    fast, general = both_paths(monkeypatch, torch, index, value)
    assert fast == general


def both_paths(monkeypatch, torch, index: int, value: object) -> list[tuple]:
    """The answer to a call (``torch``: the fake torch fixture) with scalar ``index`` set to
    ``value``, on a program whose fast path is built and on one whose fast path never is:
    ``("ok", scalar slots)`` or
    ``(error type name, message, launches made)``."""
    results = []
    for fast in (True, False):
        fake = _driver(monkeypatch)
        prog = _scalars_program()
        x = FakeTensor([1.0, 2.0], torch.float32)
        values = [v for _, _, _, v in SCALARS]
        call_program(prog, x, *values)
        if fast:
            call_program(prog, x, *values)  # the fast path is built now
        else:
            from kernelpack.runtime.launcher import bind
            bound = bind(prog)
            bound.call = bound.__call__  # general path only
        values[index] = value
        n0 = len(_launches(fake))
        try:
            call_program(prog, x, *values)
            results.append(("ok", _launches(fake)[-1][6][2:-1]))
        except KernelPackError as exc:
            results.append((type(exc).__name__, str(exc), len(_launches(fake)) - n0))
    return results


def _symbol_program() -> Compiled:
    """A grid read from a scalar: calls with different k differ only in that scalar."""
    s = KernelSummary("sym", (Tensor("x", kp.f32, ("n",)), Tensor("z", kp.f32, ("n",),
                                                                  role="out"),
                              Scalar("k", kp.i32)),
                      (Variant((Launch("copy2", "m", ("k",), (32,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("k"))),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-sym", "fake", 13000)
    return Compiled(s, (Module("m", ("copy2",), (img,)),))


def test_symbol_scalars_are_part_of_the_key(monkeypatch, torch, launch_path) -> None:
    fake = install(monkeypatch, FakeDriver(kernels={"copy2": ("QQi", lambda *a: None)}))
    prog = _symbol_program()
    x = FakeTensor([1.0, 2.0], torch.float32)
    call_program(prog, x, 1)
    for k in (2, 3, 2, 5):
        call_program(prog, x, k)
        assert _launches(fake)[-1][2] == (k, 1, 1)
    with pytest.raises(ConstraintError):
        call_program(prog, x, -1)  # a negative grid: the planner refuses, the general path says
    if launch_path == "C":
        fast = _fast(prog)
        # keys 2, 3, 5 and the refused -1 (remembered: its next call asks no hook)
        assert fast.fast_calls == 4 and fast.entries == 4
    with pytest.raises(ConstraintError):
        call_program(prog, x, -1)


def _two_launch_program() -> Compiled:
    n = kp.sym("n")
    s = KernelSummary("two", (Tensor("x", kp.f32, ("n",)), Tensor("s", kp.f32, ("n",),
                                                                  role="out"),
                              Tensor("t", kp.f32, (2,), role="out")),
                      (Variant((Launch("a", "m", (1,), (1,), (Arg.buffer("x"), Arg.buffer("s"))),
                                Launch("b", "m", (1,), (1,), (Arg.buffer("t"),
                                                             Arg.of(n * 1_000_000, kp.i32))))),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-two", "fake", 13000)
    return Compiled(s, (Module("m", ("a", "b"), (img,)),))


def test_two_launches_two_outputs(monkeypatch, torch, launch_path) -> None:
    noop = lambda *a: None  # noqa: E731
    fake = install(monkeypatch, FakeDriver(kernels={"a": ("QQ", noop), "b": ("Qi", noop)}))
    prog = _two_launch_program()
    x = FakeTensor([1.0, 2.0], torch.float32)
    call_program(prog, x)
    fake.calls.clear()
    s, t = call_program(prog, x)
    assert s.shape == (2,) and t.shape == (2,)
    launches = _launches(fake)
    assert [c[1] for c in launches] == ["a", "b"]
    assert launches[0][6] == (x.data_ptr(), s.data_ptr())
    assert launches[1][6] == (t.data_ptr(), 2_000_000)
    fake.calls.clear()
    with pytest.raises(ConstraintError, match="does not fit int32"):
        call_program(prog, FakeTensor([1.0] * 3000, torch.float32))
    assert not _launches(fake)  # the first launch did not run either


def test_bound_programs_are_collected(monkeypatch, torch) -> None:
    """bound program -> FastCall.call -> hooks -> core -> bound program is a cycle: the
    collector must see through the C object. A dropped kp.Compiled (bound by identity, since
    it cannot hold attributes) takes its entry and bound program with it."""
    from kernelpack.runtime import launcher

    _driver(monkeypatch)
    monkeypatch.setattr(launcher, "_bound", {})  # kp.Compiled's bound programs, by identity
    prog = _scalars_program()
    x = FakeTensor([1.0], torch.float32)
    values = [v for _, _, _, v in SCALARS]
    call_program(prog, x, *values)
    call_program(prog, x, *values)
    fast = _fast(prog)
    assert type(fast).__name__ == "FastCall"
    ref = weakref.ref(launcher.bind(prog))
    assert len(launcher._bound) == 1
    del prog, fast
    gc.collect()
    assert ref() is None and not launcher._bound


# ---- the type itself ---------------------------------------------------------------------
class _Hooks:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.slow_calls = 0

    def entry(self, key):
        return self.answer

    def slow(self, args, out, stream):
        self.slow_calls += 1
        return "slow"


def _make(layouts=((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "f", 2))),),
          floats=((1, 2),), hooks=None, nvals=3, dtype="f32"):
    return _launch.FastCall(FakeTensor, lambda t: None, lambda d: 0, hooks or _Hooks(None),
                            {}, 2, ((0, 0, dtype),), floats, (), ((1, dtype),), nvals, layouts,
                            True)


@pytest.mark.parametrize("layouts, message", [
    (((8000, (0,), ()),), "larger than 4096 bytes"),
    (((24, (0, 30), ()),), "offset is outside its block"),
    (((24, (0,), ((20, "Q", 0),)),), "lies outside its block"),
    (((24, (0,), ((0, "x", 0),)),), "code is not one of"),
    (((24, (0,), ((0, "f", 0),)),), "float scalar's parameter|tensor parameter"),
    (((24, (0,), ((0, "d", 1),)),), "not a 64-bit pointer"),
    (((24, (0,), ((0, "Q", 7),)),), "value slot is out of range"),
])
def test_layouts_it_cannot_take_are_refused(layouts, message) -> None:
    with pytest.raises(ValueError, match=message):
        _make(layouts=layouts)


def test_int_range_must_fit_its_parameter() -> None:
    layouts = ((8, (0,), ((0, "i", 1),)),)
    with pytest.raises(ValueError, match="range does not fit"):
        _launch.FastCall(FakeTensor, lambda t: None, lambda d: 0, _Hooks(None), {}, 2,
                         ((0, 0, "f32"),), (), ((1, 1, 0, 1 << 40, False),), (), 2, layouts,
                         True)


def test_a_malformed_entry_is_an_error_not_a_crash(monkeypatch, torch) -> None:
    _driver(monkeypatch)
    from kernelpack.runtime.native import launcher

    assert launcher().native
    hooks = _Hooks(("not", "an entry"))
    fast = _make(hooks=hooks, dtype=torch.float32)
    x = FakeTensor([1.0], torch.float32)
    # no device state for the tensors' device: handed to hooks.slow before the entry
    assert fast.call((x, 1.0), None, None) == "slow"
    assert fast.call((x,), None, None) == "slow"          # wrong number of arguments
    assert fast.call([x, 1.0], None, None) == "slow"      # not a tuple
    assert fast.call((x, 1), None, None) == "slow"        # an int for a float
    assert hooks.slow_calls == 4
    fast = _launch.FastCall(FakeTensor, lambda t: None, lambda d: 0, hooks, {0: object()}, 2,
                            ((0, 0, torch.float32),), ((1, 2),), (), ((1, torch.float32),), 3,
                            ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "f", 2))),), True)
    with pytest.raises(TypeError, match="hooks.entry"):
        fast.call((x, 1.0), None, None)


def test_call_base_forwards_to_the_bound_call() -> None:
    class Bound:
        def __init__(self) -> None:
            self.call = lambda args, out, stream: ("fast", args, out, stream)

    class Prog(_launch.CallBase):
        _kp_bound = None

        def _kp_general_call(self, *args, **kwargs):
            return ("general", args, kwargs)

    p = Prog()
    assert p(1, 2, out=3) == ("general", (1, 2), {"out": 3})  # not bound yet
    p._kp_bound = Bound()
    assert p(1, 2) == ("fast", (1, 2), None, None)
    assert p(1, out=3, stream=4) == ("fast", (1,), 3, 4)
    assert p(1, x=2) == ("general", (1,), {"x": 2})           # named inputs
    assert p(1, out=3, x=2) == ("general", (1,), {"out": 3, "x": 2})


def _assert_calls_leave_no_references(prog, x, z, watched: tuple) -> None:
    """Flat reference counts of ``watched`` over 200 rounds of calls on the allocating,
    out=, explicit-stream and fallback branches (a leak in C would grow them per call)."""
    values = [v for _, _, _, v in SCALARS]
    watched = (*watched, values[1], values[-1])

    def counts() -> list:
        return [sys.getrefcount(o) for o in watched]

    def calls() -> None:
        call_program(prog, x, *values)
        call_program(prog, x, *values, out=z)
        call_program(prog, x, *values, out=z, stream=3)
        call_program(prog, x, *values[:-1], (1 << 64) - 1)  # general path

    calls()
    calls()  # caches filled (the planners keep shapes of the keys they saw)
    assert type(_fast(prog)).__name__ == "FastCall"
    gc.collect()  # earlier tests' programs still referencing the shared SCALARS values
    before = counts()
    for _ in range(200):
        calls()
    assert counts() == before
    assert _fast(prog).fast_calls == 2 + 3 + 600  # the very first call binds (general path)


def test_calls_leave_no_references_behind(monkeypatch, torch) -> None:
    _driver(monkeypatch)
    x = FakeTensor([1.0, 2.0], torch.float32)
    z = FakeTensor([0.0, 0.0], torch.float32)
    _assert_calls_leave_no_references(_scalars_program(), x, z,
                                      (x, z, torch.float32, x.shape))


# ---- cupy arrays -------------------------------------------------------------------------
def test_flavor_and_current_device_are_checked() -> None:
    from test_fastpath_fake import NDArray

    args = (NDArray, lambda a: None, lambda: None, _Hooks(None), {}, 2, ((0, 0, "f32"),),
            ((1, 2),), (), ((1, "f32"),), 3,
            ((24, (0, 8, 16), ((0, "Q", 0), (8, "Q", 1), (16, "f", 2))),), True)
    assert type(_launch.FastCall(*args, "cupy", lambda: 0)).__name__ == "FastCall"
    with pytest.raises(ValueError, match="flavor must be 'torch' or 'cupy'"):
        _launch.FastCall(*args, "numpy", lambda: 0)
    with pytest.raises(TypeError, match="current_device is a callable for cupy"):
        _launch.FastCall(*args, "cupy")                    # cupy needs the getter
    with pytest.raises(TypeError, match="current_device is a callable for cupy"):
        _launch.FastCall(*args, "torch", lambda: 0)        # torch takes none
    with pytest.raises(TypeError, match="current_device is a callable for cupy"):
        _launch.FastCall(*args, "cupy", 0)


def test_cupy_calls_leave_no_references_behind(monkeypatch) -> None:
    from test_fastpath_fake import NDArray, _install_cupy

    cupy = _install_cupy(monkeypatch)
    _driver(monkeypatch)
    x, z = NDArray([1.0, 2.0]), NDArray([0.0, 0.0])
    _assert_calls_leave_no_references(_scalars_program(), x, z,
                                      (x, z, x.dtype, x.data, cupy.current.stream))
    assert z.values() == [1.0, 2.0]


def test_flavor_and_hooks_are_readable() -> None:
    hooks = _Hooks(None)
    fast = _make(hooks=hooks)
    assert fast.flavor == "torch" and fast.hooks is hooks
