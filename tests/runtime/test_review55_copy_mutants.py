"""Review 55: mutation testing of the in-place copy path (an input the very same memory as an
``out=`` array or ``inout`` argument read from a copy: runtime/aliasing.py, execute.py's
``_run``/``_temporary``/``_queue``, launcher.py's written copies, ``BoundSummary.input_slot``,
fastpath.py's ``out_overlap``/``out_overlaps_input``/``written_pairs``/``written_conflict``,
the C fast path's ``conflicts``/``written_conflict``) and of the in_place.py sites review 54
did not reach.

A throw-away mutator (outside the repo, on copies of the tree run with PYTHONPATH set to
them; a mutant copying nothing, a C ``conflicts`` that never conflicts and an in_place.py
refusing nothing were each checked to fail there) changed one site at a time, restored after
each, running the copy path's tests (test_aliasing, test_in_place_refused, test_inout_overlap,
test_review9_outputs(_fast), test_review43_runtime_read, test_libcuda, test_review4_inout;
for in_place.py test_in_place, test_in_place_refused, test_review54_in_place_mutants,
test_cli_in_place); survivors were run again with the scratch tests (test_review22_scratch,
test_fast_scratch, test_launch_fake, test_fastpath_fake). 507 mutants:

- 381 generated (review 54's generator: flipped comparisons and boolean operators, dropped
  conditions and statements, swapped call arguments and tuples, constants off by one) over
  every site of aliasing.py, execute.py lines 123-129, 143-180 and 208-213, launcher.py
  250-253, binding.py's ``input_slot`` and fastpath.py's four functions plus the flags of
  ``out_overlap`` (lines 255-263): G0-G380. 337 killed by the tests above, 6 more by the
  scratch tests (G146, G183, G184, G206, G207, G211); killed here: G15, G16, G36, G60, G87,
  G106, G155, G156, G168, G170, G174, G176, G177, G182, G197, G231, G232, G242, G244, G245,
  G261, G262, G278, G296, G319, G341.
- 35 hand-written (H0-H34: no copies at all, the copy after the fills, its dst/src swapped,
  the launch reading the original or the wrong slot, the written copies or the ``out=`` ones
  lost (``set(copies) |``), half the bytes copied, refusals of variant 0, no written names,
  the default stream, the copy's error unchecked, the temporary freed at once, not kept, or
  freed before the launches, only the first copy, launcher without refusals or copies,
  ``input_slot`` reversed or off by one, aliasing's copy of the wrong name, pairs reversed,
  outputs unsorted, the fast paths' flags without refusals or reversed). 26 killed by the
  suite; killed here: H5, H6, H9, H11, H12, H13, H19, H22.
- 13 C (C0-C12 in _fastcall.c, rebuilt with gcc each: ``<`` made ``<=`` on either side,
  ``both_written``, ``na != nb`` or ``a != b`` dropped, ``&&`` made ``||``, the first written
  pair or span skipped, the written flag ignored or left in the size, written pairs not
  checked, ``b >= a`` made ``b > a``). 11 killed by the suite; killed here: C4.
- 78 generated in in_place.py, P44-P121 (review 54's numbering; P0-P43 ran there). 69
  killed by the suite (P58 by test_review54's once-per-pair timing test, after 261 s; P60,
  ``stored_set.add`` dropped, by the 300 s timeout: ``stored`` then grows with every launch);
  killed here: P118.

Equivalent survivors: H18 (the copy loop iterating with ``copies`` empty: it copies only
names in ``copies``); G154, G173, G175, G198 (``check_disjoint_outputs`` also run for one
output: one span overlaps nothing); G157 (``if inputs:`` made True: no inputs, no copies);
G241 (``max(1, nbytes)``); G257 (spans made for calls without ``out=`` or ``inout``: unused
there); G297 (``written or [False]``: the one caller always passes a flag per input, and an
empty list only with no inputs); G308 (the initial ``overlap``'s size is read only against its
spans, none); G351 (``self.outputs[-1]`` in the one-output branch); G365 (``j <= i``: ``j ==
i`` is skipped before); C10 (``a == b`` takes either branch to ``0 < n``); P50, P54, P55, P56,
P94, P95 (rule 2's ``done`` and ``seen`` bookkeeping: a pair it would look at again has its
reason already, ``setdefault`` keeps it; only work changes, as review 54's P27/P28/H11); P69
(``r != w`` in the size rule: an array paired with itself has one element size); P75
(scalars counted as buffers: only tensor names are kept, as review 54's H6).

Not killed, not equivalent: G345 (``value & ~WRITTEN_SPAN`` made ``value`` in
``out_overlaps_input``: a flagged input's size becomes about 2**63, so an ``out=`` anywhere
above it leaves the Python fast paths for the general path; the results are the same and
the closure path counts no fast calls to test).

Not done (time box): the callers of the four functions in fast_torch.py/fast_cupy.py, the C
fast path's other lines (only ``conflicts``, ``written_conflict`` and the ``out=`` span loop
were mutated), libcuda.py's ``cuMemcpyDtoDAsync`` and cuda_abi.py. No real bug was found.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.aliasing import (conflicts, inputs_to_copy_for_outputs,
                                         inputs_to_copy_for_written)
from kernelpack.runtime.binding import BoundSummary
from kernelpack.runtime.fastpath import out_overlap
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Scalar, Scratch,
                                Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from fake_driver import CUresult, HostArray  # noqa: E402
import test_fastpath_fake as _fast  # noqa: E402
import test_in_place_refused as _refused  # noqa: E402
from test_fastpath_fake import NDArray, Tensor  # noqa: E402
from test_in_place_refused import _addr, _copies, _launch, _module, three_x  # noqa: E402
from test_inout_overlap import _fast_calls, _floats, _host_view, _launches  # noqa: E402
from test_review9_outputs_fast import _array_view, _tensor_view  # noqa: E402

# the fixtures: the fake driver, every torch fast path (autouse), the stand-in frameworks
fake, launch_path, exchange = _refused.fake, _fast.launch_path, _fast.exchange
torch, cupy = _fast.torch, _fast.cupy

N32 = Scalar("n32", kp.u32, value="n")


def both_ways() -> Compiled:
    """``y = 2y + x`` (``y`` inout) and ``o = 3w`` (``o`` out), each in two launches, so
    that ``y`` may not be in place over ``x`` nor ``o`` over ``w``: a call with ``y`` the
    very same memory as ``x`` and ``out=`` that of ``w`` reads both inputs from copies, one
    found by the written arguments' check (launcher), the other by ``out=``'s (execute)."""
    name = "both_ways"
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("w", kp.f32, ("n",)),
               TensorSpec("y", kp.f32, ("n",), role="inout"),
               TensorSpec("o", kp.f32, ("n",), role="out"), N32),
        (Variant((_launch("twice", name, "y", "y"), _launch("plus", name, "x", "y"),
                  _launch("twice", name, "w", "o"), _launch("plus", name, "w", "o"))),))
    return Compiled(summary, _module(name))


def test_written_and_out_copies_are_both_made(fake) -> None:
    """Kills H5 (``set(copies) |`` dropped: the written copy lost when ``out=`` is given),
    H6 (``|`` made ``or``: the ``out=`` copies lost when a written one exists) and H19 (only
    the first input of ``copies`` read from its copy)."""
    prog = both_ways()
    assert {("y", "x"), ("o", "w")} <= set(bind(prog).bound.in_place_refused(0))
    x, w = HostArray([1.0, 2.0, 3.0]), HostArray([10.0, 20.0, 30.0])
    call_program(prog, x, w, x, out=w)
    assert _floats(x, 3) == [3.0, 6.0, 9.0]  # y = 2x + x, read from a copy of x
    assert _floats(w, 3) == [30.0, 60.0, 90.0]  # o = 2w + w, read from a copy of w
    assert sorted((src, n) for _, src, n, _ in _copies(fake)) == sorted(
        [(_addr(x), 12), (_addr(w), 12)])
    assert _launches(fake) == 4


def test_an_out_array_over_an_inout_argument_is_refused(fake) -> None:
    """Kills H11 (execute passing no written names to ``inputs_to_copy_for_outputs``: ``out=``
    over an ``inout`` argument taken for in-place use)."""
    prog = both_ways()
    x, w, y = HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), HostArray([5.0, 6.0])
    with pytest.raises(LaunchError, match=r"out 'o' shares memory with argument 'y' .* the "
                       r"program writes both \('y' has role 'inout'\)"):
        call_program(prog, x, w, y, out=y)
    assert _launches(fake) == 0 and _copies(fake) == []


def two_variants(written: bool) -> Compiled:
    """Variant 0 (``n > 100``) runs in place as it is; variant 1 (the others) reads its input
    after a first launch stored: ``o = 3x`` into ``out`` (``written`` False) or ``y = 2y + x``
    on an inout ``y`` (True), as in tests/runtime/test_in_place_refused.py."""
    name = f"two_variants_{int(written)}"
    if written:
        params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",), role="inout"),
                  N32)
        fast = (_launch("plus", name, "x", "y"),)
        late = (_launch("twice", name, "y", "y"), _launch("plus", name, "x", "y"))
    else:
        params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("o", kp.f32, ("n",), role="out"),
                  N32)
        fast = (_launch("twice", name, "x", "o"),)
        late = (_launch("twice", name, "x", "o"), _launch("plus", name, "x", "o"))
    summary = KernelSummary(name, params, (Variant(fast, predicate=kp.sym("n") > 100),
                                           Variant(late)))
    return Compiled(summary, _module(name))


@pytest.mark.parametrize("written", [False, True])
def test_the_copy_follows_the_refusals_of_the_variant_that_runs(fake, written) -> None:
    """Kills H9 (execute asking ``in_place_refused(0)`` for ``out=``) and H22 (the launcher
    asking it for the ``inout`` arguments): variant 0 refuses nothing, the call runs variant
    1, which needs the copy."""
    prog = two_variants(written)
    bs = bind(prog).bound
    assert bs.in_place_refused(0) == {} and set(bs.in_place_refused(1)) == {
        ("y" if written else "o", "x")}
    x = HostArray([1.0, 2.0, 3.0])
    if written:
        call_program(prog, x, x)
    else:
        call_program(prog, x, out=x)
    assert _floats(x, 3) == [3.0, 6.0, 9.0]  # in place without the copy: 4x
    assert [(src, n) for _, src, n, _ in _copies(fake)] == [(_addr(x), 12)]


def test_the_copy_is_queued_on_the_calls_stream(fake) -> None:
    """Kills H12 (the copy queued on the legacy default stream, not the call's: the launches
    would not wait for it) and G231 on the driver's allocation."""
    x = HostArray([1.0, 2.0, 3.0])
    call_program(three_x(), x, out=x, stream=5)
    assert _floats(x, 3) == [3.0, 6.0, 9.0]
    (_, src, nbytes, stream), = _copies(fake)
    assert (src, nbytes, stream) == (_addr(x), 12, 5)
    assert {c[5] for c in fake.calls if c[0] == "cuLaunchKernel"} == {5}
    # G231 (``nbytes`` and ``device`` swapped): a 1-byte copy the 12-byte one overran
    assert [c for c in fake.calls if c[0] == "cuMemAllocAsync"] == [("cuMemAllocAsync", 12, 5)]


def test_a_framework_copy_comes_from_its_allocator_for_the_calls_stream(fake, torch,
                                                                        monkeypatch) -> None:
    """Kills G231 and G232 (``_temporary``'s ``nbytes``/``device`` or ``device``/``sh``
    swapped for the copy) and G168 (``adapter.empty``'s ``device``/``sh`` swapped in
    ``_temporary``): torch's copy is 12 bytes on device 0, from the pool of the
    call's stream."""
    made = []
    empty = torch.empty

    def recording(*shape, dtype, device):
        made.append((shape, dtype, device, torch.current_stream))
        return empty(*shape, dtype=dtype, device=device)

    monkeypatch.setattr(torch, "empty", recording)

    class Stream:
        cuda_stream = 0x77

    x = Tensor([1.0, 2.0, 3.0], torch.float32)
    call_program(three_x(), x, out=x, stream=Stream())
    assert x.values() == [3.0, 6.0, 9.0]
    assert made == [(((12,),), torch.uint8, ("cuda", 0), ("ext", 0x77))]
    assert [c[0] for c in fake.calls if c[0].startswith("cuMem")] == ["cuMemcpyDtoDAsync"]


def test_a_failed_copy_raises_and_launches_nothing(fake, monkeypatch) -> None:
    """Kills H13 (the copy's result unchecked: the launches would read a copy never made)."""
    def refuse(dst, src, n, stream):
        fake.calls.append(("cuMemcpyDtoDAsync", int(dst), int(src), n, int(stream)))
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)

    monkeypatch.setattr(fake, "cuMemcpyDtoDAsync", refuse)
    x = HostArray([1.0, 2.0, 3.0])
    with pytest.raises(LaunchError, match="three_x_late: copying an input for in-place use"):
        call_program(three_x(), x, out=x)
    assert _launches(fake) == 0 and len(_copies(fake)) == 1
    assert _floats(x, 3) == [1.0, 2.0, 3.0]


def doubled_z(name: str) -> Compiled:
    """``o = 2z`` (one launch), beside an input ``x`` that no kernel reads: ``x`` only gives
    ``out=`` memory to lie in."""
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("z", kp.f32, ("m",)),
               TensorSpec("o", kp.f32, ("m",), role="out"), Scalar("n32", kp.u32, value="m")),
        (Variant((Launch("twice", name, (kp.cdiv("m", 256),), (256,),
                         (Arg.buffer("z"), Arg.buffer("o"), Arg.scalar("n32"))),)),))
    return Compiled(summary, _module(name))


def test_an_empty_out_inside_an_input_shares_nothing(fake) -> None:
    """Kills G15/G16 (``if not n0: continue`` dropped in ``inputs_to_copy_for_outputs``: an
    empty ``out=`` whose pointer lies inside an input was refused as a partial overlap)."""
    assert inputs_to_copy_for_outputs("f", [(104, 0, "o")], [(100, 8, "x")], ("o",), (),
                                      {("o", "x"): "why"}) == set()
    base = HostArray([1.0, 2.0, 3.0, 4.0])
    o = _host_view(base, 4, 0)  # no element, its pointer inside x
    assert call_program(doubled_z("empty_out"), base, HostArray([]), out=o) is o
    assert _launches(fake) == 0 and _copies(fake) == []
    assert _floats(base, 4) == [1.0, 2.0, 3.0, 4.0]


def test_a_range_wholly_below_the_other_does_not_conflict() -> None:
    """Kills G36 (``overlaps(n0, p0, p1, n1)`` in ``conflicts``: with a real pointer the
    second test always holds, so a written argument above another one conflicted and every
    such call left the fast paths)."""
    assert not conflicts(200, 8, 100, 8, True) and not conflicts(200, 8, 100, 8, False)
    assert not conflicts(1 << 40, 8, (1 << 40) - 8, 8, True)
    assert conflicts(200, 8, 196, 8, True) and conflicts(200, 8, 196, 8, False)


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_fast_paths_refuse_an_out_at_an_inputs_start_of_another_size(fake, launch_path,
                                                                     framework, request) -> None:
    """Kills C4 (the C fast path's ``conflicts`` without ``na != nb``: an ``out=`` starting
    where an input starts, but shorter, was launched in place on the fast path; the general
    path refuses it as a partial overlap)."""
    mod = request.getfixturevalue(framework)
    make, view = ((lambda v: Tensor(v, mod.float32), _tensor_view) if framework == "torch"
                  else (NDArray, _array_view))
    prog = doubled_z("shorter_out")
    x, z, o = make([1.0, 2.0, 3.0, 4.0]), make([5.0, 6.0]), make([0.0, 0.0])
    call_program(prog, x, z, out=o)
    call_program(prog, x, z, out=o)  # the fast path is built and taken from here on
    assert o.values() == [10.0, 12.0]
    fast, launches = _fast_calls(prog, launch_path), _launches(fake)
    with pytest.raises(LaunchError, match=r"out 'o' partially overlaps argument 'x'"):
        call_program(prog, x, z, out=view(x, 0, 2))
    assert _launches(fake) == launches and x.values() == [1.0, 2.0, 3.0, 4.0]
    assert _fast_calls(prog, launch_path) == fast


def test_empty_arrays_inside_others_share_nothing() -> None:
    """Kills G60 (``not n0 or`` dropped in ``inputs_to_copy_for_written``: an empty ``inout``
    argument whose pointer lies inside another argument was refused as a partial overlap),
    and the empty read side of both functions (``not n1``) with pointers inside the other
    range, not at its start."""
    refused = {("y", "x"): "why", ("o", "x"): "why"}
    assert inputs_to_copy_for_written("f", [(100, 8, "x"), (104, 0, "y")], {"y"},
                                      refused) == set()
    assert inputs_to_copy_for_written("f", [(100, 0, "x"), (96, 8, "y")], {"y"},
                                      refused) == set()
    assert inputs_to_copy_for_outputs("f", [(96, 8, "o")], [(100, 0, "x")], ("o",), (),
                                      refused) == set()
    with pytest.raises(LaunchError, match="partially overlaps"):  # non-empty: refused
        inputs_to_copy_for_written("f", [(100, 8, "x"), (104, 4, "y")], {"y"}, refused)


def test_two_outputs_in_the_same_memory_are_refused(fake) -> None:
    """Kills G155/G156 (``if len(results) > 1: check_disjoint_outputs(...)`` made False or
    deleted: ``out=(z, z)`` ran, both kernels storing into ``z``)."""
    name = "two_outs"
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("o", kp.f32, ("n",), role="out"),
               TensorSpec("p", kp.f32, ("n",), role="out"), N32),
        (Variant((_launch("twice", name, "x", "o"), _launch("plus", name, "x", "p"))),))
    prog = Compiled(summary, _module(name))
    x, z = HostArray([1.0, 2.0]), HostArray([5.0, 5.0])
    with pytest.raises(LaunchError, match=r"out 'o' and out 'p' overlap in memory"):
        call_program(prog, x, out=(z, z))
    base = HostArray([5.0, 5.0, 5.0])
    with pytest.raises(LaunchError, match=r"out 'p' and out 'o' overlap in memory"):
        call_program(prog, x, out=(_host_view(base, 4, 2), _host_view(base, 0, 2)))
    assert _launches(fake) == 0 and _floats(z, 2) == [5.0, 5.0]
    p = HostArray([1.0, 1.0])
    call_program(prog, x, out=(z, p))
    assert _floats(z, 2) == [2.0, 4.0] and _floats(p, 2) == [2.0, 3.0]


def test_a_zero_init_output_in_place_is_copied_then_zero_filled(fake) -> None:
    """Kills G242 (the zero fill writing bytes of 1: 0x01010101 is a float32 of 2.4e-38,
    which accumulating 1.0 or 2.0 into hides) and G170, and checks the order: copy, fill,
    launch."""
    name = "accumulate"
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)),
               TensorSpec("o", kp.f32, ("n",), role="out", zero_init=True), N32),
        (Variant((_launch("plus", name, "x", "o"),)),))
    x = HostArray([0.0, 1.0, -2.0])
    call_program(Compiled(summary, _module(name)), x, out=x)
    assert _floats(x, 3) == [0.0, 1.0, -2.0]  # o = 0 + x, x read from its copy
    order = [c[0] for c in fake.calls if c[0] in ("cuMemcpyDtoDAsync", "cuMemsetD8Async",
                                                   "cuLaunchKernel")]
    assert order == ["cuMemcpyDtoDAsync", "cuMemsetD8Async", "cuLaunchKernel"]
    # G170 (``if nbytes:`` made True): an empty output queued a zero-byte fill
    before = len(fake.calls)
    call_program(Compiled(summary, _module(name)), HostArray([]))
    assert [c for c in fake.calls[before:] if c[0] == "cuMemsetD8Async"] == []


def test_a_launch_repeated_a_constant_twice_is_repeated() -> None:
    """Kills P118 (``launch.count.value <= 1`` made ``<= 2``: a launch with ``count=2``
    taken for one that runs once, its second run reading what its first stored)."""
    params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("o", kp.f32, ("n",), role="out"),
              N32)
    def refused(count: object) -> set:
        return set(BoundSummary(KernelSummary("rep", params, (Variant((_launch(
            "plus", "rep", "x", "o", count=count),)),))).in_place_refused(0))

    assert refused(2) == refused(3) == {("o", "x")} and refused(1) == set()


def test_out_overlap_of_a_program_without_tensor_inputs() -> None:
    """Kills G261, G262 and G296 (``[False] * len(in_spans)`` made ``+``: a program whose
    only tensor is its output, its shape from a scalar, passes no flags, ``[]``, and the fast
    path's entry failed with a TypeError)."""
    assert out_overlap([], (), 12, []) == (12, ())
    assert out_overlap([(0, 4)], ((3,),), 12, None) == (12, ((0, 12),))
    # G261/G262 (``if not out_nbytes: return 0, ()`` dropped): an empty out= checked against
    # every input, one it lies inside sending the call off the fast path
    assert out_overlap([(0, 4)], ((3,),), 0, [False]) == (0, ())


def test_an_empty_scratch_buffer_still_allocates_a_byte(fake) -> None:
    """Kills G245 (``max(nbytes, 1)`` made ``max(nbytes, 0)``: the driver refuses
    ``cuMemAllocAsync`` of 0 bytes with CUDA_ERROR_INVALID_VALUE; the fake does not, so the
    size asked is checked)."""
    prog = three_x("early")  # a zero_init scratch t of n floats
    call_program(prog, HostArray([]), out=HostArray([]))
    assert [c[1] for c in fake.calls if c[0] == "cuMemAllocAsync"] == [1]


def test_only_zero_init_scratch_is_zero_filled(fake) -> None:
    """Kills G182 (``if alloc.zero_init:`` made True for scratch: every workspace zero-filled,
    a memset per call the program did not ask for)."""
    name = "via_t"
    summary = KernelSummary(
        name, (TensorSpec("x", kp.f32, ("n",)), TensorSpec("o", kp.f32, ("n",), role="out"),
               N32),
        (Variant((_launch("twice", name, "x", "t"), _launch("twice", name, "t", "o")),
                 (Scratch("t", kp.f32, ("n",)),)),))
    o = HostArray([0.0, 0.0])
    call_program(Compiled(summary, _module(name)), HostArray([1.0, 2.0]), out=o)
    assert _floats(o, 2) == [4.0, 8.0]
    assert [c for c in fake.calls if c[0] == "cuMemsetD8Async"] == []


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_fast_paths_refuse_an_out_over_an_inout_argument(fake, launch_path, framework,
                                                         request) -> None:
    """Kills G341 (the fast paths' ``out=`` flags without ``w or``: an inout argument not
    flagged, so ``out=`` the very same memory as it was launched on the fast path, both
    launches storing into it)."""
    mod = request.getfixturevalue(framework)
    make = (lambda v: Tensor(v, mod.float32)) if framework == "torch" else NDArray
    prog = both_ways()
    x, w, y, o = make([1.0, 2.0]), make([3.0, 4.0]), make([5.0, 6.0]), make([0.0, 0.0])
    call_program(prog, x, w, y, out=o)
    call_program(prog, x, w, y, out=o)  # the fast path is built and taken from here on
    fast, launches = _fast_calls(prog, launch_path), _launches(fake)
    with pytest.raises(LaunchError, match=r"out 'o' shares memory with argument 'y'"):
        call_program(prog, x, w, y, out=y)
    assert _launches(fake) == launches and _fast_calls(prog, launch_path) == fast
