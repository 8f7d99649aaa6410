"""Review of the column-reduction schedule (:mod:`kernelpack.lowering.columns`).

Two regressions: a column group whose reductions read one another (a mean returned beside
the variance that reads it) was split as one stage, so the split kernel recomputed the mean
inline for every term it read (a loop over the whole column per term); and a stage whose
static dims always give enough splits kept its general kernel as a dead second variant.
"""

from __future__ import annotations

import numpy as np

import kernelpack as kp
from kernelpack.lowering import columns, pipeline

from .simt import Kernels, assert_close

T = kp.Tensor


def _program(f, **kw):
    return kp.load(kp.save([kp.compile(f, targets=["sm_80"], **kw)]))[f.name]


@kp.fusion
def meanvar(x: T[kp.f64, "a", "b"]):
    m = x.mean(axis=0)
    return m, ((x - m) ** 2).sum(axis=0)


@kp.fusion
def standardized(x: T[kp.f64, "a", "b"]):
    m = x.mean(axis=0, keepdims=True)
    v = ((x - m) ** 2).mean(axis=0, keepdims=True)
    return m, v, ((x - m) / kp.sqrt(v)).max(axis=0, keepdims=True)


def test_group_reading_its_own_reduction_is_not_one_split_stage():
    g = pipeline.run(pipeline.new_build(meanvar, ["sm_80"], None, {}), stop="trace").graph
    assert columns.column_group(g, [nid for _, nid in g.outputs]) is None
    names = [launch.kernel for launch in _program(meanvar).plan(x=(3000, 7)).launches]
    # the mean first, then the sum that reads its workspace, each split; then the outputs
    assert names == ["meanvar_0_colsplit", "meanvar_0_colfinalwarp", "meanvar_1_colsplit",
                     "meanvar_1_colfinalwarp", "meanvar_2_pointwise"], names


def test_split_kernels_hold_no_inline_reduction_loop():
    build = pipeline.run(pipeline.new_build(standardized, ["sm_80"], None, {}),
                         stop="llvm_ir")
    splits = [spec for st in build.stages for alt in st.alternatives for spec in alt.kernels
              if spec.kind == "colsplit"]
    assert len({s.name for s in splits}) == 3  # mean, variance, max: one depth each
    for spec in splits:  # each split stage reads x and workspaces, never a reduction
        assert len(spec.reduces) == 1, spec


def test_dependent_column_statistics_match_numpy():
    x = np.random.default_rng(7).standard_normal((300, 5)) * 3.0 + 1.0
    m, v, z = Kernels(standardized)(x)
    mr = x.mean(0, keepdims=True)
    vr = ((x - mr) ** 2).mean(0, keepdims=True)
    assert_close(m, mr, 1e-13, "mean")
    assert_close(v, vr, 1e-12, "variance")
    assert_close(z, ((x - mr) / np.sqrt(vr)).max(0, keepdims=True), 1e-12, "max z")
    got = Kernels(meanvar)(x)
    assert_close(got[1], ((x - x.mean(0)) ** 2).sum(0), 1e-12, "sum of squares")


@kp.fusion
def colsums(x: T[kp.f32, "a", "b"]):
    return x.sum(axis=0), x.mean(axis=0)


def test_static_dims_that_always_split_have_no_dead_general_variant():
    p = _program(colsums, static={"a": 1000, "b": 3})
    kernels = [[launch.kernel for launch in v.launches] for v in p.summary.variants]
    # (3 columns: not groups of 4, so the one-output split kernel alone is compiled)
    assert kernels == [["colsums_0_colsplit1", "colsums_0_colfinalwarp"]], kernels
    never = _program(colsums, static={"a": 48, "b": 3})  # 3 splits: the general schedule
    assert [[launch.kernel for launch in v.launches] for v in never.summary.variants] == [
        ["colsums_0_pointwise"]]
    x = np.random.default_rng(8).standard_normal((1000, 3)).astype(np.float32)
    s, m = Kernels(colsums, static={"a": 1000, "b": 3})(x)
    assert_close(s, x.astype(np.float64).sum(0), 1e-6, "static sum")
    assert_close(m, x.astype(np.float64).mean(0), 1e-6, "static mean")
