"""Review 54: mutation testing of the in-place rule (runtime/in_place.py) and of the kernels'
buffer lists (lowering: ``irutil.drop_unused_arguments``, ``Emitter.finish``,
``kernels.signature``, ``pipeline._emit_stage``/``llvm_ir``/``summarize``) and
``BoundSummary.in_place_refused``.

A throw-away mutator (outside the repo, on a copy of ``src/`` and ``tests/`` run with
PYTHONPATH set to it; a mutant refusing nothing was checked to fail there) changed one site
at a time: flipped comparisons and boolean operators, dropped conditions and statements,
swapped arguments and tuples, set operators, slice bounds off by one, plus hand-written
mutants against the rule's intent. 113 mutants ran (the budget ran out before the rest):

- ``in_place.py``: 17 hand-written (H0-H16: refuse nothing, only the size rule, variant 0
  always, inout left out of the written or the read set, scalars taken as buffers, only the
  first written array recorded, the last stored one skipped, ``covered`` over-advanced, the
  ``done`` key without its loads or its repeat flag, rule 2 or rule 1 skipping what the
  launch writes, a symbolic count only, two outputs needing two loads) and the first 44 of
  122 generated ones (P0-P43). 51 killed by the suite (mostly by test_in_place.py's
  launch-by-launch reference); killed here: H4, P21, P30.
- lowering: 8 hand-written (LH0-LH7: ``drop_unused_arguments`` returning fewer than it
  removed, dropping a used output, not counting stores' or later operands, ``finish``
  keeping dropped outputs, ``summarize`` keeping every scratch buffer or dropping its last
  one, the emitted lists replaced by the full signature) and 44 generated ones in
  ``drop_unused_arguments`` (L0-L23), ``Emitter.finish`` (L30-L35, L39-L41, L52-L54) and
  ``summarize``'s filtering (L179-L183, L193-L195). 47 killed by the suite (by
  tests/lowering/test_kernel_buffers.py); killed here: L180.

Equivalent survivors: H6 (scalar arguments counted as buffers: names are only kept where
they are tensor names, and a summary's parameter names are unique); H10, H11, H12, P27 and
P28 (the ``done`` key without loads or without the repeat flag, ``seen`` growing by the
launch's written names, the ``done`` check or ``done.add`` dropped: rule 2 then only sees a
written array again that an earlier launch stored, so rule 1 has already paired it with
every input the later launch reads, with its own reason first; only work changes); P35 (the
size rule without ``r != w``: an array paired with itself is an inout one, of one element
size); LH4 (every kernel stores its outputs, so none is ever dropped); L2 and L33 (``if
dropped:`` made true: with nothing dropped the rebuilt arguments and buffers are the same);
L12 (switch cases are constants, never a kernel's argument).

Not run (budget): ``in_place.py`` P44-P121, ``kernels.signature``, ``_emit_stage``'s and
``llvm_ir``'s buffer lists, the rest of ``summarize``, ``BoundSummary.in_place_refused``,
and the refusals' use in execute.py/fastpath.py (being reworked into aliasing.py as this
ran).

A real gap, not a mutant: the rule trusts that a one-output kernel reads each input element
only to compute the output element over it. A contraction breaks that: ``(x[:, None, :] *
x[None, :, :]).sum(-1)`` (one ``rowthread`` launch) or ``(a[:, :, None] * b[:, None,
:]).sum(0)`` (one pointwise launch summing columns inline) is allowed in place over ``x``,
``a`` or ``b`` and gave wrong results. Closed in session 40: since format 1.1 each launch
names the inputs it reads at other elements than the ones it stores
(``Launch.reads_elsewhere``, filled by lowering/elsewhere.py) and the runtime reads those from
a copy. The test below now checks that each such pair is refused and that, forced through in
place, it is still wrong (so the refusal is needed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline
from kernelpack.runtime.binding import BoundSummary
from kernelpack.runtime.in_place import refused_in_variant, refused_pairs
from kernelpack.summary import Arg, KernelSummary, Launch, Scalar, Tensor as TensorSpec, Variant

sys.path.insert(0, str(Path(__file__).parent.parent))
from lowering.simt import Kernels  # noqa: E402
from lowering.test_review48_in_place import run_plan  # noqa: E402

T = kp.Tensor


def _rng_f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(54).standard_normal(shape).astype(np.float32)


def _in_place_differs(k: Kernels, inputs: list, pair: tuple[str, str]) -> bool:
    """Whether running ``k`` with output ``pair[0]`` in the memory of input ``pair[1]`` gives
    other bits than separate buffers, in either serial order (review 48's runner)."""
    for reverse in (False, True):
        ref = run_plan(k, inputs, reverse=reverse)
        got = run_plan(k, inputs, alias=pair, reverse=reverse)
        if any(g.tobytes() != r.tobytes() for g, r in zip(got, ref)):
            return True
    return False


# ---- a real gap: an output element computed from input elements at other positions ------------

@kp.fusion
def r54_gram(x: T[kp.f32, "n", "n"]):  # noqa: F821 - dim names
    """``x @ x.T`` by broadcasting: one row-reduction kernel (``rowthread``)."""
    return (x[:, None, :] * x[None, :, :]).sum(-1)


@kp.fusion
def r54_at_b(a: T[kp.f32, "n", "n"], b: T[kp.f32, "n", "n"]):  # noqa: F821 - dim names
    """``a.T @ b`` by broadcasting: one pointwise kernel summing each column inline."""
    return (a[:, :, None] * b[:, None, :]).sum(0)


@pytest.mark.parametrize("f, pair, n", [(r54_gram, ("out", "x"), 6), (r54_at_b, ("out", "b"), 5),
                                        (r54_at_b, ("out", "a"), 5)])
def test_a_contraction_in_place_is_refused_and_needs_to_be(f, pair, n):
    k = Kernels(f)
    inputs = [_rng_f32(n, n) for _ in k.summary.inputs]
    plan = k.planner.plan(*[v.shape for v in inputs])
    (launch,) = k.summary.variants[plan.variant].launches
    assert pair[1] in launch.reads_elsewhere, launch
    refused = BoundSummary(k.summary).in_place_refused(plan.variant)
    assert "at other elements" in refused[pair], refused
    assert _in_place_differs(k, inputs, pair)  # forced through: wrong, so the copy is needed


# ---- runtime/in_place.py -------------------------------------------------------------------------

def _summary(params: tuple, launches: list[Launch]) -> KernelSummary:
    return KernelSummary("r54", params, (Variant(tuple(launches)),))


def _launch(*buffers: str, count: object = None) -> Launch:
    return Launch("k", "m", (1,), (32,), tuple(Arg.buffer(n) for n in buffers)
                  + (Arg.scalar("n32"),), count=count)


def test_an_inout_tensor_counts_as_a_read_input():
    """H4 (``refused_in_variant``'s read set without ``inout`` tensors): a later launch reads
    the ``inout`` ``u`` after an earlier one stored to the output ``o``; ``kernelpack
    inspect`` lists that pair (the runtime refuses it for the inout rule too)."""
    params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("u", kp.f32, ("n",), role="inout"),
              TensorSpec("o", kp.f32, ("n",), role="out"), Scalar("n32", kp.u32, value="n"))
    summary = _summary(params, [_launch("x", "o"), _launch("u")])
    assert refused_in_variant(summary, 0) == {
        ("o", "u"): "a later kernel of the program reads 'u' after an earlier one stored to 'o'"}


class _Name(str):
    """A buffer name that counts the ``!=`` comparisons ``refused_pairs`` makes with it."""

    compared = 0

    def __ne__(self, other: object) -> bool:
        _Name.compared += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def test_each_pair_is_compared_once_however_many_launches_repeat_it():
    """P21 (``covered[r] = len(stored)`` deleted): the later-read rule looks at each
    (stored, read) pair once, not once per launch (the module's comment: 4096 launches of 128
    outputs and inputs took ~24 s when every launch's pairs were looked at). The pairs are
    the same either way; the work is what is pinned, by counting comparisons."""
    x, o = _Name("x"), _Name("o")
    launches = [Launch(f"k{j}", "m", (1,), (32,), (Arg.buffer(x), Arg.buffer(o)))
                for j in range(100)]
    _Name.compared = 0
    assert refused_pairs(launches, {"o": 4}, {"x": 4}).keys() == {("o", "x")}
    assert _Name.compared <= 2


# ---- the lowering's buffer lists -----------------------------------------------------------------

@kp.fusion
def r54_unread(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):  # noqa: F821 - dim names
    return x + 1


def test_a_build_stopped_before_the_ir_passes_every_buffer():
    """L180 (``summarize``'s ``if emitted:`` made always true): a build stopped before
    ``llvm_ir`` has no emitted buffer lists, and its summary passes every buffer of the
    kernels' signatures (the unread ``y`` too); the emitted build passes only ``out, x``."""
    early = pipeline.run(pipeline.new_build(r54_unread, ["sm_80"], None, {}), stop="schedule")
    assert not early.kernel_buffers
    (launch,) = pipeline.summarize(early).summary.variants[0].launches
    assert [a.name for a in launch.args if a.kind == "buffer"] == ["out", "x", "y"]
    emitted = pipeline.run(early, start="llvm_ir", stop="llvm_ir")
    (launch,) = pipeline.summarize(emitted).summary.variants[0].launches
    assert [a.name for a in launch.args if a.kind == "buffer"] == ["out", "x"]
