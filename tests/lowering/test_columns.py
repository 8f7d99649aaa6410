"""Column reductions split across threads (:mod:`kernelpack.lowering.columns`).

``x.sum(axis=0)`` and other reductions over a block of leading or middle axes used to run on
the general schedule, one thread per output element looping over its whole column (a column
sum of a 100000 x 64 tensor on 64 threads). They now take a split kernel and a final kernel
where the shapes give enough splits, the general schedule where they do not. Numerics run on
the SIMT emulator against NumPy in float64, for shapes on both sides of each predicate
(warp final, block final, general); the plans are checked through ``Program.plan``.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import columns, pipeline
from kernelpack.lowering.schedule import plan, variants

from .simt import Kernels, assert_close

T = kp.Tensor


def _program(f):
    return kp.load(kp.save([kp.compile(f, targets=["sm_80"])]))[f.name]


def _kernels(program, **shapes) -> list[str]:
    """The kernels that run for these shapes (a launch with an empty grid does not)."""
    return [launch.kernel for launch in program.plan(**shapes).launches if all(launch.grid)]


@kp.fusion
def colstats(x: T[kp.f32, "a", "b"]):
    return x.sum(axis=0), x.max(axis=0, keepdims=True), x.mean(axis=0), x.min(axis=0)


# (200, 5), (512, 3), (129, 1): 13, 32 and 9 splits, a thread combines them; (513, 3): 33, a warp;
# (300, 8), (67, 12), (0, 4): widths of groups of 4, the quad split kernel (the others colsplit1)
@pytest.mark.parametrize("shape", [(200, 5), (512, 3), (513, 3), (1000, 3), (9000, 2), (7, 3),
                                   (0, 4), (300, 0), (129, 1), (1, 6), (300, 8), (67, 12)])
def test_column_statistics_match_numpy(shape):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    got = Kernels(colstats)(x)
    xd = x.astype(np.float64)
    assert_close(got[0], xd.sum(0), 1e-6, f"sum {shape}")
    assert_close(got[2], xd.mean(0) if shape[0] else np.full(shape[1], np.nan), 1e-6,
                 f"mean {shape}")
    if shape[0]:  # max/min of nothing: the identity (README), not NumPy's error
        assert_close(got[1], xd.max(0, keepdims=True), 0, f"max {shape}")
        assert_close(got[3], xd.min(0), 0, f"min {shape}")


def test_each_predicate_picks_its_kernels():
    p = _program(colstats)
    # splits S = min(cdiv(2^19, b), cdiv(a, 16), 16384): 4..32 a thread combines them,
    # 33..512 a warp, more a block; fewer than 4 (short columns, or so many that a thread
    # each fills the GPU) the general schedule. One split kernel reads x once for all four
    # statistics' stages with the same axes and shape (the max, kept 2-D, is a stage of its
    # own). Float32 widths that are a multiple of 4 take the quad kernel (colsplit, S from
    # 2^18 instead of 2^19, at least 4 where 2^19 gives 4), others the one-output kernel
    # (colsplit1); the other's launch has an empty grid.
    assert _kernels(p, x=(200, 5)) == ["colstats_0_colsplit1", "colstats_0_colfinalthread",
                                       "colstats_1_colsplit1", "colstats_1_colfinalthread"]
    assert _kernels(p, x=(1000, 3)) == ["colstats_0_colsplit1", "colstats_0_colfinalwarp",
                                        "colstats_1_colsplit1", "colstats_1_colfinalwarp"]
    assert _kernels(p, x=(100000, 64))[:2] == ["colstats_0_colsplit", "colstats_0_colfinalblock"]
    assert [ln.grid[0] for ln in p.plan(x=(100000, 64)).launches[:2]] == [1024, 0]
    assert _kernels(p, x=(100, 64)) == ["colstats_0_colsplit", "colstats_0_colfinalthread",
                                        "colstats_1_colsplit", "colstats_1_colfinalthread"]
    assert _kernels(p, x=(48, 64)) == ["colstats_0_pointwise", "colstats_1_pointwise"]  # S = 3
    assert _kernels(p, x=(10**6, 2**17))[0] == "colstats_0_colsplit"  # S = 4
    assert _kernels(p, x=(10**6, 2**18)) == ["colstats_0_pointwise", "colstats_1_pointwise"]
    assert _kernels(p, x=(200, 2**17 + 1))[0] == "colstats_0_colsplit1"  # S = 4 (2^19)
    big = p.plan(x=(100000, 64))
    split = big.launches[0]
    assert split.grid[0] == 4096 * 64 // 256  # S = cdiv(2^18, 64) splits of 64 columns
    ws = big.allocations["colstats_0_col0"]
    assert ws.kind == "scratch" and ws.nbytes == 64 * 4096 * 8  # float64 partials
    odd = p.plan(x=(100000, 63)).launches[1]
    assert odd.kernel == "colstats_0_colsplit1" and odd.grid[0] == -(-6250 * 63 // 256)
    # three statistics of one shape share the predicates: 4 variants, not 4 * 4
    assert len(p.summary.variants) == 4


@kp.fusion
def middle(y: T[kp.f64, "p", "q", "r"], z: T[kp.i32, "u", "v", "w"]):
    return y.sum(axis=1), y.prod(axis=(0, 1), keepdims=True), z.sum(axis=0)


def test_middle_and_several_axes_and_integers():
    rng = np.random.default_rng(4)
    y = rng.uniform(0.9, 1.1, (3, 400, 5))
    z = rng.integers(-1000, 1000, (300, 2, 3), dtype=np.int32)
    k = Kernels(middle)
    kernels = [l.kernel for l in k.summary.variants[0].launches]
    assert sum(name.endswith("colsplit") for name in kernels) == 3
    a, b, c = k(y, z)
    assert_close(a, y.sum(1), 1e-13, "middle-axis sum")
    assert_close(b, y.prod(axis=(0, 1), keepdims=True), 1e-12, "two-axis product")
    np.testing.assert_array_equal(c, z.sum(0, dtype=np.int64).astype(np.int32))


@kp.fusion
def derived(x: T[kp.f64, "a", "b"]):
    s = x.sum(axis=0)
    var = ((x - x.mean(axis=0, keepdims=True)) ** 2).mean(axis=0)
    return s, s * 2.0, kp.sqrt(var)


def test_column_reductions_read_by_other_work_get_their_own_split_stage():
    """``s`` is returned and doubled, the variance reads a broadcast mean: each reduction
    is materialized into a workspace whose stage splits (the general schedule would loop
    over whole columns), the outputs then read the workspaces. The sum and the mean read x
    alike and neither reads the other: one split kernel computes both; the variance, which
    reads the mean, is the next stage."""
    x = np.random.default_rng(5).standard_normal((3000, 7)) + 10.0
    k = Kernels(derived)
    s, s2, sd = k(x)
    assert_close(s, x.sum(0), 1e-13, "sum")
    assert_close(s2, 2 * x.sum(0), 1e-13, "doubled sum")
    assert_close(sd, x.std(0), 1e-12, "standard deviation")
    p = _program(derived)
    names = _kernels(p, x=(3000, 7))
    assert names == ["derived_0_colsplit", "derived_0_colfinalwarp", "derived_1_colsplit",
                     "derived_1_colfinalwarp", "derived_2_pointwise"], names
    first = p.plan(x=(3000, 7)).launches[0]
    assert [a[1] for a in first.args[:2]] == ["derived_0_col0", "derived_0_col1"]


def test_forms_that_are_not_column_reductions_keep_their_schedules():
    b = pipeline.run(pipeline.new_build(derived, ["sm_80"], None, {}), stop="trace")
    g = b.graph
    reduce_ids = [n.id for n in g.nodes if n.op == "reduce"]
    assert all(columns.column_axes(g, r) == (0, 1) for r in reduce_ids)

    @kp.fusion
    def rows_and_full(x: T[kp.f32, "a", "b"]):
        return x.sum(axis=1), x.sum(), x.sum(axis=(0, 1))

    stages = plan(pipeline.run(pipeline.new_build(rows_and_full, ["sm_80"], None, {}),
                               stop="trace").graph)
    kinds = {k.kind for st in stages for alt in st.alternatives for k in alt.kernels}
    assert "colsplit" not in kinds


@pytest.mark.parametrize("dtype, tol", [(np.float16, 2e-3), (np.complex128, 1e-13)])
def test_narrow_and_complex_columns(dtype, tol):
    kdt = {np.float16: kp.f16, np.complex128: kp.c128}[dtype]

    @kp.fusion
    def colsum_of(x: T[kdt, "a", "b"]):
        return x.sum(axis=0), x.mean(axis=0)

    rng = np.random.default_rng(6)
    x = rng.standard_normal((500, 3))
    if dtype is np.complex128:
        x = x + 1j * rng.standard_normal((500, 3))
    x = x.astype(dtype)
    s, m = Kernels(colsum_of)(x)
    ref = x.astype(np.complex128 if dtype is np.complex128 else np.float64)
    assert_close(s, ref.sum(0), tol, "sum")
    assert_close(m, ref.mean(0), tol, "mean")


def test_trimming_to_the_variant_limit_keeps_lockstep_stages_together():
    """Four tensors' column sums, each also returned with keepdims (two stages in lockstep
    per tensor): 3^4 = 81 combinations exceed MAX_VARIANTS (64). The widest stage loses its
    block final; its lockstep partner must lose the same one, or the pair would count as
    3 x 2 independent combinations and the trimming would go on removing alternatives."""

    @kp.fusion
    def four(a: T[kp.f32, "p", "q"], b: T[kp.f32, "r", "s"], c: T[kp.f32, "t", "u"],
             d: T[kp.f32, "v", "w"]):
        return (a.sum(0), b.sum(0), c.sum(0), d.sum(0),
                a.max(0, keepdims=True), b.max(0, keepdims=True), c.max(0, keepdims=True),
                d.max(0, keepdims=True))

    b = pipeline.run(pipeline.new_build(four, ["sm_80"], None, {}), stop="schedule")
    widths = [len(st.alternatives) for st in b.stages]
    assert widths == [2, 3, 3, 3, 2, 3, 3, 3], widths  # one pair trimmed, together
    assert len(variants(list(b.stages))) == 2 * 3 * 3 * 3


@kp.fusion
def weighted(x: T[kp.f32, "a", "b"], y: T[kp.f32, "a", "b"], h: T[kp.f16, "a", "b"]):
    return (x * y).sum(axis=0), x.max(axis=0), (h * h).astype(kp.f32).mean(axis=0)


@pytest.mark.parametrize("shape", [(300, 8), (300, 16), (129, 24), (300, 7), (300, 12)])
def test_sixteen_byte_groups_and_the_scalar_body(shape):
    """Columns a whole number of 16-byte groups of the widest input (4 float32: b % 4 == 0)
    take the body with vector loads, each thread 4 neighbouring outputs; other widths, and
    views 4 bytes past a 16-byte boundary, the scalar body. Same results either way."""
    rng = np.random.default_rng(sum(shape))
    a, b = shape
    base = rng.standard_normal(a * b + 1).astype(np.float32)
    k = Kernels(weighted)
    for x in (base[:a * b].reshape(shape), base[1:].reshape(shape)):  # aligned, then not
        y = rng.standard_normal(shape).astype(np.float32)
        h = rng.standard_normal(shape).astype(np.float16)
        s, mx, hm = k(x, y, h)
        xd, yd = x.astype(np.float64), y.astype(np.float64)
        assert_close(s, (xd * yd).sum(0), 1e-6, f"sum {shape}")
        assert_close(mx, xd.max(0), 0, f"max {shape}")
        hh = (h * h).astype(np.float64)  # float16 products, rounded as the kernel does
        assert_close(hm, hh.mean(0), 1e-6, f"float16 mean {shape}")


def test_the_split_kernel_has_a_vector_body():
    b = pipeline.run(pipeline.new_build(weighted, ["sm_90"], None, {}), stop="ptx")
    ptx = b.ptx.decode()
    body = ptx[ptx.index(".entry weighted_0_colsplit"):]
    body = body[:body.index("\n}\n")]
    assert "ld.global.v4.b32" in body  # float32 groups of four


def test_quad_stages_are_plain_float32_reductions_over_leading_axes():
    """Only a reduction of an input itself over leading axes takes the quad kernel: the
    variance pass of a standard deviation (a computed term) and middle-axis sums were slower
    with it on an H200 (notes/column-perf.md), and float64 pairs have a target of their own."""
    @kp.fusion
    def forms(x: T[kp.f32, "a", "b"], y: T[kp.f32, "p", "q", "r"], z: T[kp.f64, "a", "b"]):
        m = x.mean(axis=0, keepdims=True)
        return (x.sum(axis=0), ((x - m) * (x - m)).sum(axis=0), y.sum(axis=1), z.sum(axis=0))

    g = pipeline.run(pipeline.new_build(forms, ["sm_80"], None, {}), stop="trace").graph
    reduces = {n.id: n for n in g.nodes if n.op == "reduce"}
    quads = {nid for nid in reduces if columns.quad(g, [nid])}
    srcs = {nid: g.nodes[n.inputs[0]] for nid, n in reduces.items()}
    assert all(srcs[nid].op == "input" for nid in quads)
    assert any(srcs[nid].op != "input" for nid in set(reduces) - quads)  # the variance pass
    assert any(columns.column_axes(g, nid) == (1, 2) for nid in set(reduces) - quads)  # y
    kernels = {ln.kernel for v in _program(forms).summary.variants for ln in v.launches}
    # x's sum and mean share one stage, the only quad stage: one one-output kernel beside it
    assert sum(k.endswith("colsplit1") for k in kernels) == 1


def test_a_quad_stage_keeps_the_variants_of_its_neighbours():
    """The quad mean and the variance pass of one tensor share predicates (the one-output
    schedule's splits), so a float32 standard deviation has 4 variants, as before quads; two
    of them over different tensors 16, not 256 (which fit_variants would have trimmed,
    sending wide shapes to the general schedule)."""
    @kp.fusion
    def stds(x: T[kp.f32, "a", "b"], y: T[kp.f32, "c", "d"]):
        mx, my = x.mean(axis=0, keepdims=True), y.mean(axis=0, keepdims=True)
        return kp.sqrt(((x - mx) * (x - mx)).mean(axis=0)), kp.sqrt(((y - my) ** 2).mean(axis=0))

    assert len(_program(stds).summary.variants) == 16
    kernels = _kernels(_program(stds), x=(100000, 64), y=(3000, 7))
    assert [k for k in kernels if "final" in k] == [
        "stds_0_colfinalblock", "stds_1_colfinalwarp", "stds_2_colfinalblock",
        "stds_3_colfinalwarp"], kernels
