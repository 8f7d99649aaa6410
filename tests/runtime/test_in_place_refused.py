"""In-place use (``out=`` or an ``inout`` argument that is the very same memory as an input) needs
a copy where the summary shows the result would depend on the device's order of stores and
loads (runtime/in_place.py): a later launch reads that input after an earlier one stored to
the written array (``x * 2, x.sum(0)`` compiles to two kernels, and with ``out=(x, s)`` the
second summed the doubled ``x``), the storing launch stores to another array too, or the element
sizes differ. ``BoundSummary.in_place_refused`` gives the pairs; a call passing one as the very
same memory reads the input from a copy (runtime/aliasing.py; until session 39 every path
refused it with ``LaunchError``), and gets what separate arrays give. A program whose kernels
read the input before they store over it runs in place without a copy. Stand-in frameworks
over host memory, the fake driver. The emulator side (review 48) is
tests/lowering/test_review48_in_place.py."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.binding import BoundSummary
from kernelpack.runtime.fastpath import written_pairs
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar, Scratch,
                                Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from kp_samples import fake_image  # noqa: E402
from test_fastpath_fake import NDArray, Tensor, cupy, exchange, launch_path, \
    torch  # noqa: E402,F401 - the fixtures
from test_inout_overlap import _fast_calls, _floats, _host_view, _launches  # noqa: E402
from test_launch_fake import _f32  # noqa: E402
from test_review9_outputs_fast import _array_view, _tensor_view  # noqa: E402


def _put(addr: int, values: list) -> None:
    ctypes.memmove(addr, struct.pack(f"<{len(values)}f", *values), 4 * len(values))


def _double_impl(grid, block, shmem, v) -> None:
    """``dst = 2 * src``."""
    src, dst, n = v
    _put(dst, [2 * p for p in _f32(src, n)])


def _add_impl(grid, block, shmem, v) -> None:
    """``dst += src``."""
    src, dst, n = v
    _put(dst, [p + q for p, q in zip(_f32(dst, n), _f32(src, n))])


def _kernels() -> dict:
    return {"twice": ("QQI", _double_impl), "plus": ("QQI", _add_impl)}


def _module(name: str) -> tuple[Module, ...]:
    return (Module(name, ("twice", "plus"), (fake_image("cubin", "sm_80"),
                                             fake_image("cubin", "sm_90", seed=3))),)


def _launch(kernel: str, module: str, src: str, dst: str, count: object = None) -> Launch:
    return Launch(kernel, module, (kp.cdiv("n", 256),), (256,),
                  (Arg.buffer(src), Arg.buffer(dst), Arg.scalar("n32")), count=count)


def three_x(order: str = "late") -> Compiled:
    """"late": ``o = 3x`` in two launches, ``o = 2x`` then ``o += x`` (the second reads ``x``
    after the first stored to ``o``). "early": ``t += x`` into a zero-filled workspace, then
    ``o = 2x``: every launch that reads ``x`` stores to ``o`` in that launch or not at all."""
    name = f"three_x_{order}"
    launches = [_launch("twice", name, "x", "o"), _launch("plus", name, "x", "o")]
    scratch: tuple = ()
    if order == "early":
        launches = [_launch("plus", name, "x", "t"), _launch("twice", name, "x", "o")]
        scratch = (Scratch("t", kp.f32, ("n",), zero_init=True),)
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("o", kp.f32, ("n",), role="out"),
               Scalar("n32", kp.u32, value="n")),
        (Variant(tuple(launches), scratch),))
    return Compiled(summary, _module(name))


def bump_then_add() -> Compiled:
    """``y = 2y + x`` in two launches on an ``inout`` ``y``: ``y = 2y`` then ``y += x``."""
    summary = KernelSummary(
        "bump_then_add",
        (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",), role="inout"),
         Scalar("n32", kp.u32, value="n")),
        (Variant((_launch("twice", "bump_then_add", "y", "y"),
                  _launch("plus", "bump_then_add", "x", "y"))),))
    return Compiled(summary, _module("bump_then_add"))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels=_kernels()))


# ---- the pairs -------------------------------------------------------------------------------

def _late(launches, params=None) -> set:
    params = params or (TensorSpec("x", kp.f32, ("n",)), TensorSpec("w", kp.f32, ("n",)),
                        TensorSpec("o", kp.f32, ("n",), role="out"),
                        TensorSpec("p", kp.f32, ("n",), role="out"),
                        Scalar("n32", kp.u32, value="n"))
    return BoundSummary(KernelSummary("late", params, (Variant(tuple(launches)),))
                        ).in_place_refused(0).keys()


def test_late_reads_follow_the_launch_order() -> None:
    assert _late([_launch("twice", "m", "x", "o"), _launch("plus", "m", "w", "p")]) == {
        ("o", "w")}
    assert _late([_launch("twice", "m", "x", "o"), _launch("plus", "m", "x", "p"),
                  _launch("plus", "m", "w", "p")]) == {("o", "x"), ("o", "w"), ("p", "w")}
    # each launch reads before it stores, and nothing reads after: in-place use stays
    assert _late([_launch("twice", "m", "x", "o")]) == frozenset()
    assert _late([_launch("twice", "m", "x", "o"), _launch("plus", "m", "o", "p")]) == \
        frozenset()  # o is not an input
    # a repeated launch reads again after its own first copy stored
    assert _late([_launch("plus", "m", "x", "o", count="n")]) == {("o", "x")}
    assert _late([_launch("plus", "m", "x", "o", count=1)]) == frozenset()


def test_a_launch_storing_two_outputs_refuses_in_place_over_what_it_reads() -> None:
    two = Launch("two", "m", (1,), (32,), (Arg.buffer("x"), Arg.buffer("o"), Arg.buffer("p"),
                                           Arg.scalar("n32")))
    assert _late([two]) == {("o", "x"), ("p", "x")}
    assert _late([_launch("plus", "m", "w", "w"), two]) == {("o", "x"), ("p", "x")}


def test_element_sizes_must_match_for_in_place_use() -> None:
    params = (TensorSpec("x", kp.f64, ("n",)), TensorSpec("w", kp.f32, ("n",)),
              TensorSpec("o", kp.f32, ("n",), role="out"),
              TensorSpec("p", kp.i32, ("n",), role="out"), Scalar("n32", kp.u32, value="n"))
    refused = BoundSummary(KernelSummary("sizes", params, (Variant((_launch(
        "twice", "m", "x", "o"),)),))).in_place_refused(0)
    assert refused.keys() == {("o", "x"), ("p", "x")}  # float32 and int32 over float64
    assert refused["o", "x"] == ("'o' has 4-byte elements and 'x' 8-byte ones, so a store "
                                 "to one lands on elements of the other that other threads "
                                 "still read")


def test_late_reads_of_an_inout_argument() -> None:
    assert BoundSummary(bump_then_add().summary).in_place_refused(0).keys() == {("y", "x")}


def test_written_pairs_mark_late_pairs() -> None:
    spans, key = [(0, 4), (1, 4)], ((3,), (3,))
    assert written_pairs(spans, [False, True], key, ("x", "y"), {("y", "x")}) == (
        (1, 12, 0, 12, True),)
    assert written_pairs(spans, [False, True], key, ("x", "y"), {("x", "y")}) == (
        (1, 12, 0, 12, False),)  # x is not written: that pair means nothing here


def test_a_compiled_fusion_knows_its_late_reads() -> None:
    @kp.fusion
    def double_and_colsum(x: kp.Tensor[kp.f32, "n", "m"]):
        return x * 2, x.sum(0)

    compiled = kp.compile(double_and_colsum, targets=["sm_90"])
    bs = BoundSummary(compiled.summary)
    for i, variant in enumerate(compiled.summary.variants):
        assert len(variant.launches) >= 2
        # the stage the scheduler puts first stores its output before the other reads x
        first = {a.name for a in variant.launches[0].args if a.kind == "buffer"}
        written = next(t.name for t in compiled.summary.outputs if t.name in first)
        refused = bs.in_place_refused(i)
        assert "a later kernel" in refused[(written, "x")], variant
        # and the column sum's kernel reads x down whole columns (format 1.1's
        # reads_elsewhere): its output over x would need a copy too (were its size x's)
        assert set(refused) - {(written, "x")} <= {("out1", "x")}, refused
        assert all("at other elements" in why for pair, why in refused.items()
                   if pair != (written, "x")), refused


# ---- the general path --------------------------------------------------------------------------

def _addr(a: HostArray) -> int:
    return ctypes.addressof(a.buf)


def _copies(fake) -> list:
    """The call's ``cuMemcpyDtoDAsync`` calls: ``(dst, src, nbytes, stream)``."""
    return [c[1:] for c in fake.calls if c[0] == "cuMemcpyDtoDAsync"]


def test_in_place_out_read_by_a_later_launch_reads_a_copy(fake) -> None:
    """``out=x`` for ``o = 2x; o += x``: in place, the second launch would add the doubled
    ``x`` (4x); the call reads ``x`` from a copy made first and gets what separate arrays give
    (3x)."""
    x = HostArray([1.0, 2.0, 3.0])
    call_program(three_x(), x, out=x)
    assert _floats(x, 3) == [3.0, 6.0, 9.0]
    (dst, src, nbytes, _), = _copies(fake)
    assert (src, nbytes) == (_addr(x), 12) and dst != _addr(x)
    launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 2
    # the copy is queued before the launches and freed (stream-ordered) after them
    names = [c[0] for c in fake.calls if c[0] in ("cuMemcpyDtoDAsync", "cuLaunchKernel",
                                                   "cuMemAllocAsync", "cuMemFreeAsync")]
    assert names == ["cuMemAllocAsync", "cuMemcpyDtoDAsync", "cuLaunchKernel",
                     "cuLaunchKernel", "cuMemFreeAsync"]
    base = HostArray([1.0, 2.0, 3.0, 4.0])  # a partial overlap is still refused
    with pytest.raises(LaunchError, match=r"out 'o' partially overlaps argument 'x' .*; "
                       r"pass a separate array, or the very same array as 'x' for in-place "
                       r"use$"):
        call_program(three_x(), _host_view(base, 0, 3), out=_host_view(base, 4, 3))
    o = HostArray([0.0] * 3)
    copies = len(_copies(fake))
    call_program(three_x(), x, out=o)  # separate arrays: nothing is copied
    assert _floats(o, 3) == [9.0, 18.0, 27.0] and len(_copies(fake)) == copies


def test_in_place_out_of_another_element_size_reads_a_copy(fake) -> None:
    summary = KernelSummary(
        "narrow", (TensorSpec("x", kp.f64, ("n",)),
                   TensorSpec("o", kp.f32, (kp.sym("n") * 2,), role="out"),
                   Scalar("n32", kp.u32, value="n")),
        (Variant((_launch("twice", "narrow", "x", "o"),)),))
    prog = Compiled(summary, _module("narrow"))
    separate = HostArray([1.0, 2.0, 3.0, 4.0])  # (the fake kernel stores n floats of 2n)
    source = HostArray([1.0, 2.0, 3.0, 4.0])
    whole = _host_view(source, 0, 4)
    whole.typestr, whole.shape = "<f8", (2,)
    call_program(prog, whole, out=separate)  # what separate arrays give
    base = HostArray([1.0, 2.0, 3.0, 4.0])  # 16 bytes
    x, o = _host_view(base, 0, 4), _host_view(base, 0, 4)
    x.typestr, x.shape = "<f8", (2,)  # as float64, n = 2; o: the four float32 over it
    call_program(prog, x, out=o)
    assert _floats(base, 4) == _floats(separate, 4)
    assert [(src, n) for _, src, n, _ in _copies(fake)] == [(_addr(base), 16)]


def test_in_place_out_stored_last_runs_without_a_copy(fake) -> None:
    x = HostArray([1.0, 2.0, 3.0])
    call_program(three_x("early"), x, out=x)  # t += x, then o = 2x in the launch reading x
    assert _floats(x, 3) == [2.0, 4.0, 6.0]
    assert _launches(fake) == 2 and _copies(fake) == []
    assert bind(three_x("early")).bound.in_place_refused(0) == {}


def test_in_place_inout_read_by_a_later_launch_reads_a_copy(fake) -> None:
    """``y = 2y; y += x`` with ``y`` the very same memory as ``x``: ``x`` is read from a copy,
    so ``y`` becomes ``3x`` (in place, the second launch would add the doubled values)."""
    base = HostArray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    x = _host_view(base, 0, 3)
    call_program(bump_then_add(), x, x)
    assert _floats(base, 6) == [3.0, 6.0, 9.0, 4.0, 5.0, 6.0]
    assert [(src, n) for _, src, n, _ in _copies(fake)] == [(_addr(base), 12)]
    with pytest.raises(LaunchError, match=r"argument 'y', which the program writes .* "
                       r"partially overlaps argument 'x' .*; pass a separate array, or the "
                       r"very same array as 'x' for in-place use$"):
        call_program(bump_then_add(), x, _host_view(base, 4, 3))
    call_program(bump_then_add(), x, _host_view(base, 12, 3))
    assert _floats(base, 6) == [3.0, 6.0, 9.0, 11.0, 16.0, 21.0]
    assert len(_copies(fake)) == 1


# ---- the fast paths ----------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_fast_paths_send_late_in_place_use_to_the_general_path(fake, launch_path, framework,
                                                               request) -> None:
    mod = request.getfixturevalue(framework)  # that framework alone: its own fast path
    make, view = ((lambda v: Tensor(v, mod.float32), _tensor_view) if framework == "torch"
                  else (NDArray, _array_view))
    mem = make([float(i) for i in range(8)])
    x, o = view(mem, 0, 4), view(mem, 16, 4)
    prog = three_x()
    call_program(prog, x, out=o)
    call_program(prog, x, out=o)  # the fast path is built and taken from here on
    assert o.values() == [0.0, 3.0, 6.0, 9.0]
    fast = _fast_calls(prog, launch_path)
    launches = _launches(fake)
    call_program(prog, x, out=x)  # the general path, reading x from a copy
    assert x.values() == [0.0, 3.0, 6.0, 9.0]
    assert _launches(fake) == launches + 2 and len(_copies(fake)) == 1
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast
    call_program(prog, x, out=o)
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 1
    assert o.values() == [0.0, 9.0, 18.0, 27.0] and len(_copies(fake)) == 1

    prog = bump_then_add()
    x = view(make([1.0, 2.0, 3.0, 4.0]), 0, 4)
    y = view(mem, 16, 4)
    call_program(prog, x, y)
    call_program(prog, x, y)
    fast = _fast_calls(prog, launch_path)
    call_program(prog, x, x)
    assert x.values() == [3.0, 6.0, 9.0, 12.0] and len(_copies(fake)) == 2
    call_program(prog, x, y)
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 1


def test_bound_programs_ask_only_when_aliasing_is_possible(fake) -> None:
    x, o = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    prog = three_x()
    call_program(prog, x)  # allocating: nothing can alias
    assert bind(prog).bound._refused == {}
    call_program(prog, x, out=o)
    assert set(bind(prog).bound._refused[0]) == {("o", "x")}
