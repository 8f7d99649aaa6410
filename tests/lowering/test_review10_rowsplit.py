"""Review of the row-split schedule (lowering/rowsplit.py): the regression it fixed.

``pipeline.fit_variants`` drops split alternatives first when a program has more than
``MAX_VARIANTS`` combinations; it picked any stage holding a split, including one whose static
dims made the split its only alternative (predicate None), found nothing to drop there and
stopped trimming: a static softmax beside three symbolic ones was a TraceError (512 variants)
where the previous schedules fit in 64. The fusions the review tried without finding a bug are
in test_review10_rowsplit_fusions.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline, schedule

from .split_consts import kernel_names, softmax_ref, use_small_split
from .simt import Kernels, assert_close

T = kp.Tensor


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    use_small_split(monkeypatch)


_names = kernel_names


_sm = softmax_ref


@kp.fusion
def static_and_three(x: T[kp.f32, 2, 300], y: T[kp.f32, "a", "n"], z: T[kp.f32, "c", "m"],
                     w: T[kp.f32, "d", "k"]):
    outs = []
    for t in (x, y, z, w):
        e = kp.exp(t - t.max(axis=1, keepdims=True))
        outs.append(e / e.sum(axis=1, keepdims=True))
    return tuple(outs)


def test_an_unconditional_split_does_not_stop_the_variant_trimming():
    """x's static (2, 300) always splits (its one alternative, predicate None); the three
    symbolic softmaxes have 9 alternatives each (729 combinations). Before the fix the loop
    dropped their splits (512), then picked x's stage (it still had a split), found no
    conditional split to drop and stopped: 'needs 1 to 64 variants (got 512)'."""
    build = pipeline.run(pipeline.new_build(static_and_three, ["sm_90"], None, {}),
                         stop="schedule")
    counts = [len(st.alternatives) for st in build.stages]
    assert counts[0] == 1 and build.stages[0].alternatives[0].predicate is None
    found = schedule.variants(list(build.stages))
    assert len(found) <= 64
    # the static stage keeps its split; the symbolic ones lost theirs first (then widths)
    assert found[0][1][0].kernels[0].name == "static_and_three_0_split_partial0"
    assert not any(k.name.endswith("split_partial0") for _, chosen in found
                   for alt in chosen[1:] for k in alt.kernels)
    assert len(kp.compile(static_and_three, targets=["sm_90"]).summary.variants) == len(found)


def test_static_split_stage_runs_beside_the_trimmed_ones():
    k = Kernels(static_and_three)
    rng = np.random.default_rng(20)
    xs = [rng.standard_normal(s).astype(np.float32) for s in ((2, 300), (3, 250), (1, 40),
                                                               (4, 520))]
    assert _names(k, *(x.shape for x in xs))[0] == "static_and_three_0_split_partial0"
    for got, x in zip(k(*xs), xs):
        assert_close(got, _sm(x.astype(np.float64)), 1e-6, f"softmax {x.shape}")
