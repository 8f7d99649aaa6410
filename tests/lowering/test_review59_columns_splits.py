"""Review 59 (part 2 of 3): columns, full reductions, rows split across blocks, long output
rows and 32-warp block reductions, on the emulator between guard bytes (the harness is in
:mod:`.test_review59_codegen_mutants`, whose docstring lists the mutants and equivalents).

Kills R13, R17 (the combine of a row's partials), C15 (lanes of a 16-byte column group),
F04 (a one-entry row-value workspace: stored outside it), G15 (complex parts of a 32-warp
block reduction overlapping in shared memory), S03 (a split chunk of whole blocks but not
whole unrolled strides).
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.lowering import longrows, pipeline, tuning

from .simt import Kernels, assert_close
from .split_consts import use_small_split
from .test_review59_codegen_mutants import compiled, launched, rng_for

T = kp.Tensor


# ---- columns, full reductions, rows split across blocks, long output rows -----------------

@kp.fusion
def col_stats(x: T[kp.f32, "m", "n"]):
    return x.sum(0), x.max(0)


@kp.fusion
def col_middle(x: T[kp.f64, "a", "m", "n"]):
    return x.sum(1), x.min(1)


# (reduced, kept): 15 splits of 64 outputs (a thread's 8-partial rounds and a rest of 7),
# 7 outputs (no 16-byte groups), 130 (groups of 4 do not fit), 9 outputs with a warp final
# (63 partials each: no whole round of 8 per lane; 257: lane 0 takes one round of 8·32)


@pytest.mark.parametrize("shape", [(240, 64), (100, 7), (64, 130), (1000, 9), (497, 12),
                                   (4100, 9)])
def test_column_splits_between_guards(shape):
    """Column sums and maxima (negative values: a 0 in place of the max identity shows) over
    leading axes at split counts whose rounds of unrolled terms end early, in the middle, or
    exactly; every partial written inside its workspace, every final inside the output."""
    x = -(np.abs(rng_for(shape[0]).standard_normal(shape)) + 0.25).astype(np.float32)
    sm, mx = compiled(col_stats)(x)
    assert_close(sm, x.astype(np.float64).sum(0), 1e-6, f"column sum {shape}")
    np.testing.assert_array_equal(mx, x.max(0))


@pytest.mark.parametrize("shape", [(3, 100, 5), (2, 301, 2), (2, 64, 33)])
def test_middle_axis_columns_between_guards(shape):
    """Sums and minima over a middle axis (the source index ``(o·K + t)·I + i``: the outer
    index, the reduced one, the inner one all matter)."""
    x = np.abs(rng_for(shape[1]).standard_normal(shape)) + 0.5
    sm, mn = compiled(col_middle)(x)
    assert_close(sm, x.sum(1), 1e-12, f"middle sum {shape}")
    np.testing.assert_array_equal(mn, x.min(1))


@kp.fusion
def full_stats(x: T[kp.f32, "n"]):
    return x.sum(), x.max()


@kp.fusion
def centred(x: T[kp.f64, "n"]):
    return x - x.mean(), ((x - x.mean()) ** 2).mean()


@pytest.mark.parametrize("n", [1, 8193])
def test_full_reductions_between_guards(n):
    """Full reductions: partial chunks of 8192 (the last one short, empty of unrolled rounds,
    or exactly whole), the combine and last kernels; negative values for the maximum."""
    x = -(np.abs(rng_for(n).standard_normal(n)) + 0.5).astype(np.float32)
    sm, mx = compiled(full_stats)(x)
    assert_close(sm, x.astype(np.float64).sum(), 1e-6, f"sum {n}")
    assert mx == x.max()
    xd = rng_for(n + 1).standard_normal(n) + 3.0
    c, var = compiled(centred)(xd)
    assert_close(c, xd - xd.mean(), 1e-12, f"centred {n}")
    assert_close(var, ((xd - xd.mean()) ** 2).mean(), 1e-12, f"variance {n}")


@kp.fusion
def split_rows(x: T[kp.f32, "b", "n"]):
    return x - x.max(-1, keepdims=True), x.sum(-1, keepdims=True)


@kp.fusion
def split_stats(x: T[kp.f64, "b", "n"]):
    return x.max(-1), ((x - x.mean(-1, keepdims=True)) ** 2).sum(-1)


@pytest.mark.parametrize("shape", [(3, 200), (2, 385)])
def test_split_rows_between_guards(shape, monkeypatch):
    """Rows split across blocks (the split constants patched small: chunks of 128 for blocks
    of 32 threads, at most 3 rows of >= 200): each block's chunk of its row (the last one
    short, or whole), the combine kernel's row of partials, the stored per-row values that
    the next level and the outputs load by row; rows of distinct offsets so that a row index
    off by one shows."""
    use_small_split(monkeypatch)
    rng = rng_for(shape[1])
    x = (rng.standard_normal(shape) - np.arange(shape[0])[:, None] * 10).astype(np.float32)
    k = Kernels(split_rows)
    assert any("split" in name for name in launched(k, shape))
    d, s = k(x)
    np.testing.assert_array_equal(d, x - x.max(-1, keepdims=True))
    assert_close(s, x.astype(np.float64).sum(-1, keepdims=True), 1e-6, f"split sum {shape}")
    xd = -np.abs(rng.standard_normal(shape)) - np.arange(shape[0])[:, None] * 10
    k = Kernels(split_stats)
    assert any("split" in name for name in launched(k, shape))
    mx, ss = k(xd)
    np.testing.assert_array_equal(mx, xd.max(-1))
    assert_close(ss, ((xd - xd.mean(-1, keepdims=True)) ** 2).sum(-1), 1e-12, f"split ss {shape}")


@kp.fusion
def amplitude(v: T[kp.f32, "b", "l"], n: kp.i64):
    return kp.pad(v * kp.rsqrt((v * v).sum(-1, keepdims=True)), 1 << n)


@pytest.mark.parametrize("b, l, n, per_thread, kernel", [
    (3, 7, 10, 0, "rowwarp"), (3, 100, 14, 0, "rowblock"), (1, 5, 10, 1, "_one_"),
    (3, 7, 10, 1, "_pointwise"), (2, 100, 10, 1, "_pointwise")])
def test_long_output_rows_between_guards(b, l, n, per_thread, kernel, monkeypatch):
    """Output rows longer than the reduced ones (the amplitude encoding's pad to 2^n): fused
    warp and block rows, a single row (the full-reduction kernels), and, with
    ``OUT_PER_THREAD`` patched to 1 so that emulator-sized rows take it, the reduce-only
    kernel into a workspace of one value per row and a pointwise grid over the long rows."""
    if per_thread:
        monkeypatch.setattr(longrows, "OUT_PER_THREAD", per_thread)
    k = Kernels(amplitude)
    names = launched(k, (b, l), n)
    assert any(kernel in name for name in names), names
    v = (rng_for(l).standard_normal((b, l)) + 0.1).astype(np.float32)
    (got,) = k(v, n)
    vd = v.astype(np.float64)
    ref = np.zeros((b, 1 << n))
    ref[:, :l] = vd / np.sqrt((vd * vd).sum(-1, keepdims=True))
    assert_close(got, ref, 1e-6, f"amplitude {b} {l} {n}")


@kp.fusion
def complex_rows(z: T[kp.c128, "b", "n"]):
    return z.sum(-1), z.mean(-1)


def test_complex_block_reduction_of_32_warps(monkeypatch):
    """A block reduction of 1024 threads (32 warps) over complex values: shared memory holds
    each part's 32 warp values side by side (33 slots a part), so the parts must not
    overlap. Reached with the row split's combine block patched to 1024 threads (the shipped
    blocks have at most 16 warps)."""
    use_small_split(monkeypatch)
    monkeypatch.setattr(tuning, "SPLIT_COMBINE_BLOCK", 1024)
    k = Kernels(complex_rows)
    plan = k.planner.plan((2, 300))
    assert max(launch.block[0] for launch in plan.launches) == 1024
    rng = rng_for(300)
    z = rng.standard_normal((2, 300)) + 1j * (rng.standard_normal((2, 300)) + 2.0)
    s, m = k(z)
    assert_close(s, z.sum(-1), 1e-12, "complex split sum")
    assert_close(m, z.mean(-1), 1e-12, "complex split mean")


@kp.fusion
def weighted_columns(x: T[kp.f32, "m", "n"], w: T[kp.f32, "n"]):
    return (x * w[None, :] + kp.arange(x.shape[1]).astype(kp.f32)[None, :]).sum(0)


@pytest.mark.parametrize("shape", [(240, 64), (100, 12)])
def test_column_groups_index_each_lane_s_broadcast_inputs(shape):
    """A column reduction whose terms read a broadcast weight and an iota along the kept
    axis: with 16-byte groups each lane of a group is its own output, so its broadcast loads
    and iota values are its own, not the group's first's."""
    rng = rng_for(shape[0])
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    k = compiled(weighted_columns)
    assert "colsplit" in launched(k, shape, (shape[1],))[0]
    (got,) = k(x, w)
    ref = (x.astype(np.float64) * w + np.arange(shape[1])).sum(0)
    assert_close(got, ref, 1e-6, f"weighted columns {shape}")


def test_a_chunk_of_whole_blocks_but_not_whole_unrolled_strides_is_refused(monkeypatch):
    """A split chunk's full loop steps ``SPLIT_BLOCK · UNROLL`` elements with no bounds
    check, so a chunk of 96 with blocks of 32 (whole blocks, not whole strides of 128) would
    read 32 elements of the next chunk: the check must be against the unrolled stride."""
    use_small_split(monkeypatch)
    monkeypatch.setattr(tuning, "SPLIT_CHUNK", 96)
    with pytest.raises(CompileError, match="SPLIT_CHUNK must be a positive multiple"):
        pipeline.run(pipeline.new_build(split_rows, ["sm_90"], None, {}), stop="schedule")
