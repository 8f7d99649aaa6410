"""``out=`` with several arrays on the fast paths (the C ``FastCall`` with attribute reads or
DLPack's exchange API, and the Python closures), on CPU with the stand-in torch and CuPy of
test_fastpath_fake.py and the fake driver.

A call ``prog(x, y, out=(s, d))`` used to go to the general path every time (both fast paths
checked a single ``out=`` only). Now the fast paths take it when every array fits and the
memory is shared only as the general path allows without a copy: no two ``out=`` arrays share a
byte, none partially overlaps an input, and an output is the very same memory as an input only
where the program allows in-place use without a copy (:mod:`kernelpack.runtime.in_place`).
Anything else still goes to the general path, which gives its answer or its error."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import (NDArray, Tensor, cupy, exchange, launch_path,  # noqa: E402,F401
                                torch)


def _f32(addr: int, n: int) -> list:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(addr, 4 * n)))


def _sumdiff_impl(grid, block, shmem, v) -> None:
    """s = x + y, d = x - y: every load before any store, as the lowering's pointwise kernels
    do (``stores_after_loads``)."""
    x, y, s, d, n = v
    xs, ys = _f32(x, n), _f32(y, n)
    ctypes.memmove(s, struct.pack(f"<{n}f", *[p + q for p, q in zip(xs, ys)]), 4 * n)
    ctypes.memmove(d, struct.pack(f"<{n}f", *[p - q for p, q in zip(xs, ys)]), 4 * n)


def sumdiff(stores_after_loads: bool = True) -> Compiled:
    """(s, d) = (x + y, x - y) in one launch; without ``stores_after_loads`` the runtime may
    not run it in place over an input without a copy (a launch that stores two arrays)."""
    s = KernelSummary("sumdiff", (TensorSpec("x", kp.f32, ("n",)),
                                  TensorSpec("y", kp.f32, ("n",)),
                                  TensorSpec("s", kp.f32, ("n",), role="out"),
                                  TensorSpec("d", kp.f32, ("n",), role="out"),
                                  Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("sumdiff", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("s"),
                                        Arg.buffer("d"), Arg.scalar("n32")),
                                       stores_after_loads=stores_after_loads),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-sumdiff", "fake", 13000)
    return Compiled(s, (Module("m", ("sumdiff",), (img,)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"sumdiff": ("QQQQI", _sumdiff_impl)}))


def _launches(fake: FakeDriver) -> int:
    return sum(1 for c in fake.calls if c[0] == "cuLaunchKernel")


def _fast_count(prog) -> int | None:
    """The C FastCall's count of calls it launched itself (None on the closure path)."""
    fast = getattr(bind(prog).call, "__self__", None)
    return fast.fast_calls if type(fast).__name__ == "FastCall" else None


def _warm(prog, make) -> None:
    """Bind the program and build its fast path (the first call is the general path's)."""
    for _ in range(2):
        call_program(prog, make([1.0, 2.0]), make([3.0, 5.0]))


def _torch_array(torch):
    return lambda values: Tensor(values, torch.float32)


def test_two_out_arrays_take_the_fast_path(fake, torch, launch_path) -> None:
    prog = sumdiff()
    make = _torch_array(torch)
    _warm(prog, make)
    before = _fast_count(prog)
    x, y, s, d = make([1.0, 2.0]), make([3.0, 5.0]), make([0.0, 0.0]), make([0.0, 0.0])
    out = (s, d)
    got = call_program(prog, x, y, out=out)
    assert got[0] is s and got[1] is d
    assert s.values() == [4.0, 7.0] and d.values() == [-2.0, -3.0]
    if before is not None:
        assert _fast_count(prog) == before + 1
    # the launch got both arrays' pointers
    last = [c for c in fake.calls if c[0] == "cuLaunchKernel"][-1]
    assert last[6][:4] == (x.data_ptr(), y.data_ptr(), s.data_ptr(), d.data_ptr())


def test_in_place_over_both_inputs_is_fast_when_loads_come_first(fake, torch,
                                                                 launch_path) -> None:
    """``out=(x, y)`` and the swapped ``out=(y, x)``: each output is the very same memory
    as an input, which a launch that loads everything before it stores allows."""
    prog = sumdiff()
    make = _torch_array(torch)
    _warm(prog, make)
    before = _fast_count(prog)
    x, y = make([1.0, 2.0]), make([3.0, 5.0])
    call_program(prog, x, y, out=(x, y))
    assert x.values() == [4.0, 7.0] and y.values() == [-2.0, -3.0]
    call_program(prog, x, y, out=(y, x))
    assert y.values() == [2.0, 4.0] and x.values() == [6.0, 10.0]
    if before is not None:
        assert _fast_count(prog) == before + 2


def test_in_place_that_needs_a_copy_goes_to_the_general_path(fake, torch, launch_path) -> None:
    """Without ``stores_after_loads`` a launch storing two arrays may not run over an input
    it reads: the fast path hands the call over, and the general path reads the input from a
    copy (the answer separate arrays give)."""
    prog = sumdiff(stores_after_loads=False)
    make = _torch_array(torch)
    _warm(prog, make)
    before = _fast_count(prog)
    x, y, d = make([1.0, 2.0]), make([3.0, 5.0]), make([0.0, 0.0])
    call_program(prog, x, y, out=(x, d))
    assert x.values() == [4.0, 7.0] and d.values() == [-2.0, -3.0]
    if before is not None:
        assert _fast_count(prog) == before  # not launched by FastCall
    # separate arrays still take it
    s = make([0.0, 0.0])
    call_program(prog, x, y, out=(s, d))
    assert s.values() == [7.0, 12.0] and d.values() == [1.0, 2.0]
    if before is not None:
        assert _fast_count(prog) == before + 1


def test_out_arrays_sharing_memory_get_the_general_paths_error(fake, torch,
                                                              launch_path) -> None:
    prog = sumdiff()
    make = _torch_array(torch)
    _warm(prog, make)
    x, y, s = make([1.0, 2.0]), make([3.0, 5.0]), make([0.0, 0.0])
    launched = _launches(fake)
    with pytest.raises(LaunchError, match="overlap in memory"):
        call_program(prog, x, y, out=(s, s))
    with pytest.raises(LaunchError, match="overlap in memory"):
        call_program(prog, x, y, out=(s, _view(torch, s, 4)))
    with pytest.raises(LaunchError, match="partially overlaps argument 'x'"):
        call_program(prog, x, y, out=(make([0.0, 0.0]), _view(torch, x, 4)))
    assert _launches(fake) == launched


def _view(torch, t: Tensor, offset: int) -> Tensor:
    """A stand-in float32 tensor of ``t``'s shape whose memory starts ``offset`` bytes into
    ``t``'s (a partial overlap); a plain ``Tensor``, as the fast paths want."""
    view = Tensor([0.0] * len(t.shape), torch.float32, shape=t.shape)
    view._buf = (ctypes.c_char * (4 * t.shape[0])).from_address(t.data_ptr() + offset)
    view.base = t  # keeps t's memory alive
    return view


@pytest.mark.parametrize("bad", ["short tuple", "list", "dtype", "shape", "contiguity",
                                 "device", "conj"])
def test_an_out_tuple_that_does_not_fit_goes_to_the_general_path(fake, torch, launch_path,
                                                                bad) -> None:
    """Each mismatch is handed over before anything is launched; the general path then
    answers (a list is a valid ``out=``) or names the output in its error."""
    prog = sumdiff()
    make = _torch_array(torch)
    _warm(prog, make)
    before = _fast_count(prog)
    x, y, s, d = make([1.0, 2.0]), make([3.0, 5.0]), make([0.0, 0.0]), make([0.0, 0.0])
    if bad == "conj":  # asked only where torch can make one: complex, or a single element
        x, y, s = make([1.0]), make([3.0]), make([0.0])
        call_program(prog, x, y, out=(s, make([0.0])))  # the entry for this shape
        before = _fast_count(prog)
    if bad == "list":
        got = call_program(prog, x, y, out=[s, d])
        assert got == (s, d) and s.values() == [4.0, 7.0] and d.values() == [-2.0, -3.0]
    elif bad == "short tuple":
        with pytest.raises(TypeError, match="out= has 1 arrays, the program has 2 outputs"):
            call_program(prog, x, y, out=(s,))
    else:
        wrong = {"dtype": lambda: Tensor([0, 0], torch.int32),
                 "shape": lambda: make([0.0, 0.0, 0.0]),
                 "contiguity": lambda: Tensor([0.0, 0.0], torch.float32, contiguous=False),
                 "device": lambda: Tensor([0.0, 0.0], torch.float32, device=1),
                 "conj": lambda: Tensor([0.0], torch.float32, conj=True)}[bad]()
        with pytest.raises(LaunchError, match="'d'"):
            call_program(prog, x, y, out=(s, wrong))
    if before is not None:
        assert _fast_count(prog) == before


def test_cupy_out_tuple_takes_the_fast_path(fake, cupy, launch_path) -> None:
    prog = sumdiff()
    _warm(prog, NDArray)
    before = _fast_count(prog)
    x, y, s, d = NDArray([1.0, 2.0]), NDArray([3.0, 5.0]), NDArray([0.0, 0.0]), \
        NDArray([0.0, 0.0])
    got = call_program(prog, x, y, out=(s, d))
    assert got[0] is s and got[1] is d
    assert s.values() == [4.0, 7.0] and d.values() == [-2.0, -3.0]
    call_program(prog, x, y, out=(y, x))  # in place, swapped
    assert y.values() == [4.0, 7.0] and x.values() == [-2.0, -3.0]
    if before is not None:
        assert _fast_count(prog) == before + 2
    with pytest.raises(LaunchError, match="overlap in memory"):
        call_program(prog, x, y, out=(s, s))
    with pytest.raises(LaunchError, match="out 'd' has dtype int32"):
        call_program(prog, x, y, out=(s, NDArray([0, 0], "int32")))
    if before is not None:
        assert _fast_count(prog) == before + 2


def test_empty_outputs_share_nothing(fake, torch, launch_path) -> None:
    """Size-0 arrays hold no bytes: two of them at one address are no overlap (the general
    path agrees: check_disjoint_outputs skips them), and nothing is launched."""
    prog = sumdiff()
    make = _torch_array(torch)
    _warm(prog, make)
    e = Tensor([], torch.float32, shape=(0,))
    launched = _launches(fake)
    got = call_program(prog, e, e, out=(e, e))
    assert got[0] is e and got[1] is e
    assert _launches(fake) == launched
