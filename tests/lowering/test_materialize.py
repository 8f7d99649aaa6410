"""Broadcast reductions over leading or middle axes are computed once, into a workspace
(:mod:`kernelpack.lowering.materialize`), instead of once per element that reads them.

Before, ``x - x.mean(axis=0, keepdims=True)`` ran on the general schedule, one thread per
element, each recomputing its column's mean: quadratic work (minutes on an H200 for a 100000 x
64 tensor; the GPU fuzz's seeds 2078 and 2163 never finished). Numerics run on the SIMT
emulator against NumPy in float64; the plans are checked for the extra stage and its scratch.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline

from .simt import Kernels, assert_close

T = kp.Tensor


def _summary(f) -> kp.KernelSummary:
    b = pipeline.run(pipeline.new_build(f, ["sm_80"], None, {}), stop="llvm_ir")
    return pipeline.summarize(b).summary


@kp.fusion
def center(x: T[kp.f64, "a", "b"]):
    return x - x.mean(axis=0, keepdims=True)


@pytest.mark.parametrize("shape", [(37, 5), (1, 1), (300, 2), (0, 3), (3, 0)])
def test_column_centring_matches_numpy(shape):
    x = np.random.default_rng(1).standard_normal(shape)
    (got,) = Kernels(center)(x)
    ref = x - x.mean(axis=0, keepdims=True) if x.size else np.empty(shape)
    assert_close(got, ref, 1e-13, f"center {shape}")


def test_the_mean_is_a_stage_and_scratch_of_its_own():
    s = _summary(center)
    assert [p.name for p in s.outputs] == ["out"]
    (variant,) = s.variants
    assert [w.name for w in variant.scratch] == ["center_m0"]
    assert [str(d) for d in variant.scratch[0].shape] == ["1", "b"]
    first, second = variant.launches
    assert first.args[0].name == "center_m0"       # the mean's stage writes the workspace
    assert any(a.name == "center_m0" for a in second.args)  # the pointwise stage reads it
    plan = kp.load(kp.save([kp.compile(center, targets=["sm_80"])]))["center"].plan(
        x=(100000, 64))
    assert plan.allocations["center_m0"].kind == "scratch"
    # the elements now only subtract: a pointwise grid, 2 doubles per 16-byte group
    assert plan.launches[1].grid[0] == 6400000 // (256 * 2)


def test_nested_column_reductions_and_a_returned_one():
    """A column log-softmax (a max read inside the sum's terms, a log-sum-exp read by every
    element) returned beside its log-sum-exp, and a middle-axis mean of a 3-D tensor."""

    @kp.fusion
    def colstats(x: T[kp.f32, "a", "b"], y: T[kp.f64, "p", "q", "r"]):
        m = x.max(axis=0, keepdims=True)
        lse = kp.log(kp.exp(x - m).sum(axis=0, keepdims=True)) + m
        my = y.mean(axis=1, keepdims=True)
        return x - lse, lse, (y - my) * y.shape[1]

    rng = np.random.default_rng(2)
    x = rng.standard_normal((41, 7)).astype(np.float32)
    y = rng.standard_normal((3, 9, 4))
    k = Kernels(colstats)
    assert len(k.summary.variants[0].scratch) == 3  # max, sum, the middle-axis mean
    a, lse, c = k(x, y)
    xd = x.astype(np.float64)
    ref_lse = np.log(np.exp(xd - xd.max(0, keepdims=True)).sum(0, keepdims=True)) \
        + xd.max(0, keepdims=True)
    assert_close(lse, ref_lse, 1e-5, "log-sum-exp")
    assert_close(a, xd - ref_lse, 1e-5, "log-softmax")
    assert_close(c, (y - y.mean(1, keepdims=True)) * 9, 1e-13, "middle-axis centring")


def test_a_column_softmax_read_by_a_row_variance_and_a_full_sum():
    """GPU fuzz seed 2078's shape: column softmax, row-normalized, then summed to a scalar."""

    @kp.fusion
    def mixed(x: T[kp.f64, "a", "b"]):
        e = kp.exp(x - x.max(axis=0, keepdims=True))
        p = e / e.sum(axis=0, keepdims=True)
        d = p - p.mean(axis=-1, keepdims=True)
        return (d * kp.rsqrt((d * d).mean(axis=-1, keepdims=True) + 1e-9)).sum()

    x = np.random.default_rng(3).standard_normal((23, 3))
    (got,) = Kernels(mixed)(x)
    e = np.exp(x - x.max(0, keepdims=True))
    p = e / e.sum(0, keepdims=True)
    d = p - p.mean(-1, keepdims=True)
    ref = (d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-9)).sum()
    assert abs(float(got) - ref) <= 1e-12 * max(1.0, abs(ref)) * 100


def test_row_full_and_unbroadcast_reductions_are_unchanged():
    """Trailing-axis and full reductions keep their own schedules, and a column reduction
    returned at its own shape is computed once per output anyway: no workspace."""

    @kp.fusion
    def plain(x: T[kp.f32, "a", "b"]):
        return (x - x.mean(axis=-1, keepdims=True), x / x.sum(), x.sum(axis=0),
                x.max(axis=0, keepdims=True))

    (variant, *_) = _summary(plain).variants
    assert not [w for w in variant.scratch if "_m" in w.name]
