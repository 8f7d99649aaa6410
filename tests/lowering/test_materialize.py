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
    # the mean's stage splits its columns where the shapes allow (lowering/columns.py):
    # a thread, a warp or a block combines the partials, or the general schedule: four
    # variants
    assert len(s.variants) == 4
    variant = s.variants[-1]
    assert [w.name for w in variant.scratch] == ["center_m0"]
    assert [str(d) for d in variant.scratch[0].shape] == ["1", "b"]
    first, second = variant.launches
    assert first.args[0].name == "center_m0"       # the mean's stage writes the workspace
    assert any(a.name == "center_m0" for a in second.args)  # the pointwise stage reads it
    plan = kp.load(kp.save([kp.compile(center, targets=["sm_80"])]))["center"].plan(
        x=(100000, 64))
    assert plan.allocations["center_m0"].kind == "scratch"
    assert [l.kernel for l in plan.launches] == ["center_0_colsplit", "center_0_colfinalblock",
                                                  "center_1_pointwise"]
    # the elements now only subtract: a pointwise grid, 2 doubles per 16-byte group
    assert plan.launches[-1].grid[0] == 6400000 // (256 * 2)


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
    # max, sum, the middle-axis mean (+ their split partials where a variant splits them)
    assert len(k.summary.variants[-1].scratch) == 3
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
    """Trailing-axis and full reductions keep their own schedules (row kernels, fullred),
    and a column reduction returned at its own shape is computed once per output anyway: no
    workspace. (Mixed in one output group they do go to the general schedule, and are then
    materialized: see the last test.)"""

    @kp.fusion
    def row(x: T[kp.f32, "a", "b"]):
        return x - x.mean(axis=-1, keepdims=True)

    @kp.fusion
    def full(x: T[kp.f32, "a", "b"]):
        return x / x.sum()

    @kp.fusion
    def cols(x: T[kp.f32, "a", "b"]):
        return x.sum(axis=0), x.max(axis=0, keepdims=True)

    for f in (row, full, cols):
        for variant in _summary(f).variants:
            assert not [w for w in variant.scratch if "_m" in w.name], f.name


def test_a_row_and_a_full_reduction_in_one_general_stage():
    """``x - x.mean(-1)`` and ``x / x.sum()`` share an output shape, so one general stage:
    each element recomputed its row mean and the whole sum. Now both are workspaces."""

    @kp.fusion
    def both(x: T[kp.f64, "a", "b"]):
        return x - x.mean(axis=-1, keepdims=True), x / x.sum()

    k = Kernels(both)
    assert len(k.summary.variants[0].scratch) >= 2
    x = np.random.default_rng(5).random((19, 6)) + 0.5
    a, b = k(x)
    assert_close(a, x - x.mean(-1, keepdims=True), 1e-13, "row centring")
    assert_close(b, x / x.sum(), 1e-13, "x / x.sum()")


def test_full_reductions_broadcast_inside_a_general_stage():
    """GPU fuzz seed 2444's shape: a reduction over a size-1 leading axis puts the program
    on the general schedule, where two full sums read back at every element were recomputed
    per element (1e10 steps at b = 100003). Both are materialized; the result is unchanged."""

    @kp.fusion
    def lse(x1: T[kp.f64, "b"], x2: T[kp.f32, 1, "b"], s: kp.f64):
        v1 = kp.max(x2, axis=0)
        v5 = kp.where(x1.astype(kp.i64).sum(axis=0, keepdims=True) != 1, v1, 0.0)
        v6 = kp.max(v5, axis=0, keepdims=True)
        return (kp.log(kp.exp(v5 - v6).sum(axis=0, keepdims=True)) + v6).astype(kp.f64) / s

    k = Kernels(lse)
    assert len(k.summary.variants[0].scratch) >= 2
    rng = np.random.default_rng(4)
    x1 = rng.standard_normal(301) * 3
    x2 = rng.standard_normal((1, 301)).astype(np.float32)
    (got,) = k(x1, x2, 2.0)
    v5 = np.where(x1.astype(np.int64).sum() != 1, x2[0].astype(np.float64), 0.0)
    ref = (np.log(np.exp(v5 - v5.max()).sum()) + v5.max()) / 2.0
    assert_close(got, np.array([ref]), 1e-6, "log-sum-exp")


@kp.fusion
def cross_entropy(x: T[kp.f64, "b", "v"], t: T[kp.i64, "b"]):
    m = x.max(axis=1, keepdims=True)
    lse = kp.log(kp.exp(x - m).sum(axis=1, keepdims=True)) + m
    picked = kp.where(kp.arange(x.shape[1])[None, :] == t[:, None], x, 0.0).sum(
        axis=1, keepdims=True)
    return (lse - picked).mean()


def test_a_mean_of_row_reductions_runs_on_grids_not_one_thread():
    """A loss averaged over the batch reduces per-row reductions again. On the general
    schedule its one output had one thread, which ran every row's sums too: the whole (b, v)
    work of a cross-entropy on a single GPU thread. The inner reductions are now workspaces
    (row kernels) and the mean a full reduction over them (a partial grid, then one block)."""
    for variant in _summary(cross_entropy).variants:
        names = [launch.kernel for launch in variant.launches]
        assert not [n for n in names if n.endswith("_pointwise")], names
        assert names[-2].endswith("_partial0") and names[-1].endswith("_rowblock"), names
        assert len([w for w in variant.scratch if "_m" in w.name]) == 3
        # the row max and the picked logit read the logits in one stage (one row kernel, or
        # one split), the log-sum-exp (which reads the max) in a second, then the mean
        stages = {n[len("cross_entropy_"):].split("_")[0] for n in names}
        assert len(stages) == 3, names


@pytest.mark.parametrize("shape", [(37, 53), (1, 1), (5, 300), (300, 3), (0, 4)])
def test_a_mean_of_row_reductions_matches_numpy(shape):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape) * 4
    t = rng.integers(0, shape[1], shape[0])
    (got,) = Kernels(cross_entropy)(x, t)
    if not shape[0]:
        assert np.isnan(got).all()  # NumPy's mean of nothing
        return
    m = x.max(1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(1)) + m[:, 0]
    ref = (lse - x[np.arange(shape[0]), t]).mean()
    assert_close(got, np.array(ref), 1e-12, f"cross-entropy {shape}")


# ---- row reductions read at another row (found by the codegen, pipeline._row_read_elsewhere)

@kp.fusion
def sym_norm(a: T[kp.f64, "n", "n"]):
    """D^-1/2 A D^-1/2, a graph Laplacian's normalization: row sums read per row and per
    column."""
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


@kp.fusion
def centred_sym_norm(a: T[kp.f64, "n", "n"]):
    """The row sums read across rows read a column mean that is a workspace already
    (materialize() chose it before scheduling): the second workspace comes after it."""
    c = a - a.mean(axis=0, keepdims=True)
    d = (c * c).sum(-1)
    return d, c / kp.sqrt(d[:, None] * d[None, :])


def _ran(k: Kernels, *inputs) -> list[str]:
    plan = k.planner.plan(*[v.shape for v in inputs])
    return [launch.kernel for launch in plan.launches if all(launch.grid)]


def test_row_sums_read_at_another_row_are_a_workspace():
    """Before, the stage fell back to the general schedule, where every element summed two
    whole rows (O(n^3) loads); now a row kernel writes the sums once and a pointwise kernel
    reads them."""
    for variant in _summary(sym_norm).variants:
        (space,) = [w for w in variant.scratch if w.name == "sym_norm_m0"]
        assert [str(d) for d in space.shape] == ["n", "1"]  # the sums, kept as a column
        *sums, last = (launch.kernel for launch in variant.launches)
        assert last == "sym_norm_1_pointwise", variant.launches
        assert sums and all(k.startswith("sym_norm_0_") for k in sums), sums
        assert not [k for k in sums if k.endswith("_pointwise")], sums  # a row schedule
    a = np.random.default_rng(3).random((33, 33)) + 0.5
    assert _ran(Kernels(sym_norm), a)[-1] == "sym_norm_1_pointwise"


@pytest.mark.parametrize("n", [0, 1, 2, 33, 130])
def test_row_sums_read_at_another_row_match_numpy(n):
    a = np.random.default_rng(n).random((n, n)) + 0.5
    (got,) = Kernels(sym_norm)(a)
    d = 1 / np.sqrt(a.sum(-1))
    assert_close(got, a * d[:, None] * d[None, :], 1e-13, f"n={n}")


def test_a_row_read_elsewhere_that_reads_a_workspace_comes_after_it():
    s = _summary(centred_sym_norm)
    for variant in s.variants:
        names = [w.name for w in variant.scratch if "_m" in w.name]
        assert names == ["centred_sym_norm_m0", "centred_sym_norm_m1"], names
        written = [launch.args[0].name for launch in variant.launches]
        assert written.index("centred_sym_norm_m0") < written.index("centred_sym_norm_m1")
    for n in (1, 7, 40):
        a = np.random.default_rng(n).random((n, n)) * 3
        got_d, got = Kernels(centred_sym_norm)(a)
        c = a - a.mean(0, keepdims=True)
        d = (c * c).sum(-1)
        assert_close(got_d, d, 1e-12, f"d n={n}")
        with np.errstate(all="ignore"):
            ref = c / np.sqrt(d[:, None] * d[None, :])
        assert_close(got, ref, 1e-12, f"n={n}")


@kp.fusion
def row_beside_strided(a: T[kp.f32, "n", "m"], c: T[kp.f32, "p", "n", "q"]):
    return a.sum(-1), c.sum(axis=(0, 2))


@kp.fusion
def short_row_beside_strided(a: T[kp.f32, "n", 3], c: T[kp.f32, "p", "n", "q"]):
    return a.sum(-1), c.sum(axis=(0, 2))


def test_a_row_sum_in_a_general_stage_is_a_workspace_unless_short_and_constant():
    """Both outputs have shape (n,): one stage, general for the (0, 2) sum. Its row sum was
    one thread per row over the whole row; now a row kernel writes it to a workspace. A
    row of 3 elements known at compile time stays inline (materialize.SHORT_ROW)."""
    for variant in _summary(row_beside_strided).variants:
        assert "row_beside_strided_m0" in [w.name for w in variant.scratch]
    for variant in _summary(short_row_beside_strided).variants:
        assert not [w.name for w in variant.scratch if "_m" in w.name]
    rng = np.random.default_rng(5)
    for n, m, p, q in ((4, 300, 2, 3), (0, 5, 1, 1), (7, 1, 3, 0)):
        a, c = rng.random((n, m)), rng.random((p, n, q))
        got_a, got_c = Kernels(row_beside_strided)(a.astype(np.float32), c.astype(np.float32))
        assert_close(got_a, a.sum(-1), 1e-6, f"rows {n}x{m}")
        assert_close(got_c, c.sum(axis=(0, 2)), 1e-6, f"strided {p}x{n}x{q}")
