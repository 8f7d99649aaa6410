"""Chained full reductions (a reduction of every axis that reads another one: a variance) run
on a grid: a partial pass per reduction, a combine kernel storing each value a later pass
reads, a last kernel combining the rest (:mod:`kernelpack.lowering.fullred`). Before, the
second reduction ran inside the last kernel's single block: a float32 variance of 1e8
elements streamed the input twice through one SM.

Plans are checked at large sizes, numerics through the SIMT emulator (:mod:`.simt`) against
NumPy in float64 (float32 results within 1e-5 relative, float64 within 1e-12)."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.expr import cdiv, const, sym
from kernelpack.lowering import pipeline
from kernelpack.lowering.tuning import CHUNK

from .full_reduction_fusions import moments, two, unit, unit64, var2d, var_std
from .simt import Kernels, assert_close

T = kp.Tensor


@kp.fusion
def var(x: T[kp.f32, "n"]):
    m = x.mean()
    return ((x - m) ** 2).mean()


@kp.fusion
def cov(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return ((x - x.mean()) * (y - y.mean())).mean()


@kp.fusion
def mixed(i: T[kp.i32, "n"], z: T[kp.c64, "n"]):
    return (i == i.max()).sum(), (abs(z - z.mean()) ** 2).mean()


@lru_cache(maxsize=None)
def _kernels(f: kp.fusion) -> Kernels:
    return Kernels(f)


def _launches(f, *shapes):  # type: ignore[no-untyped-def]
    plan = kp.load(kp.save([kp.compile(f, targets=["sm_90"])]))[f.name].plan(*shapes)
    return [(ln.kernel.removeprefix(f.name + "_"), ln.grid[0]) for ln in plan.launches]


def _ref_var(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(((x - x.mean()) ** 2).mean()) if x.size else np.asarray(np.nan)


def test_variance_takes_a_partial_pass_per_reduction_on_a_grid():
    """The brief's reproduction: at n = 1e8 the second reduction gets its own grid of
    cdiv(n, CHUNK) blocks after a one-block combine of the mean, and the workspaces are
    expressions."""
    blocks = -(-100_000_000 // CHUNK)
    assert _launches(var, (100_000_000,)) == [
        ("0_partial0", blocks), ("0_combine0", 1), ("0_partial1", blocks), ("0_rowblock", 1)]
    (variant,) = kp.compile(var, targets=["sm_90"]).summary.variants
    n = sym("n")
    assert [ln.grid[0] for ln in variant.launches] == [cdiv(n, CHUNK), const(1),
                                                       cdiv(n, CHUNK), const(1)]
    assert [(s.name, s.dtype, s.shape) for s in variant.scratch] == [
        ("var_0_ws0", kp.f64, (cdiv(n, CHUNK),)), ("var_0_val0", kp.f32, (const(1),)),
        ("var_0_ws1", kp.f64, (cdiv(n, CHUNK),))]


def test_outputs_as_long_as_the_input_take_a_pointwise_grid_after_the_chain():
    """``y / |y|`` with ``y = x - mean``: the norm gets a grid pass and a combine of its own,
    and a pointwise grid loads the mean and the norm and writes the outputs (a grid of blocks
    each combining the partials and writing its slice one scalar at a time ran at ~1.35 TB/s
    on an H200)."""
    blocks = -(-100_000_000 // CHUNK)
    launches = _launches(unit, (100_000_000,))
    assert launches[:-1] == [("0_partial0", blocks), ("0_combine0", 1), ("0_partial1", blocks),
                             ("0_combine1", 1)]
    kernel, grid = launches[-1]
    assert kernel == "0_pointwise" and grid >= 100_000_000 // (256 * 4), launches


def test_three_levels_and_independent_chains():
    p = (1 << 20) // CHUNK
    assert _launches(moments, (1 << 20,)) == [
        ("0_partial0", p), ("0_combine0", 1), ("0_partial1", p), ("0_combine1", 1),
        ("0_partial2", p), ("0_rowblock", 1)]
    # reductions 0..5 of `two` in trace order: x.mean, x's variance, y.mean, y's sum of
    # squares, x.sum, y.max. Both means in one combine; the sum and the max, which nothing
    # else reads, are combined by the last kernel with the two second-level reductions
    launches = _launches(two, (40_000,), (3,))
    p = -(-40_000 // CHUNK)
    assert launches == [("0_partial0", p), ("0_partial2", 1), ("0_partial4", p),
                        ("0_partial5", 1), ("0_combine0", 1), ("0_partial1", p),
                        ("0_partial3", 1), ("0_rowblock", 1)]


@pytest.mark.parametrize("n", [0, 1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3])
def test_variance_and_std_float32(n):
    x = (np.random.default_rng(n).standard_normal(n) * 2 + 100).astype(np.float32)
    v, s = _kernels(var_std)(x)
    ref = _ref_var(x.astype(np.float64))
    assert_close(v, ref, 1e-5, f"var n={n}")
    assert_close(s, np.sqrt(ref), 1e-5, f"std n={n}")


@pytest.mark.parametrize("n", [2, 16411])
def test_three_levels_float64(n):
    x = np.random.default_rng(n).standard_normal(n) * 3 + 1
    v, s, k = _kernels(moments)(x)
    ref = _ref_var(x)
    assert_close(v, ref, 1e-12, "var")
    assert_close(s, np.sqrt(ref), 1e-12, "std")
    with np.errstate(all="ignore"):
        z = (x - x.mean()) / np.sqrt(ref)
        assert_close(k, np.asarray((z ** 4).mean()), 1e-12, "kurtosis")


@pytest.mark.parametrize("f, dt, tol, n", [(unit, np.float32, 1e-5, 0), (unit, np.float32, 1e-5, 9001),
                                           (unit64, np.float64, 1e-12, 1),
                                           (unit64, np.float64, 1e-12, 16385)])
def test_centred_and_normalised(f, dt, tol, n):
    x = (np.random.default_rng(n).standard_normal(n) + 5).astype(dt)
    (got,) = _kernels(f)(x)
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):  # n = 1: 0 / 0
        y = xd - (xd.mean() if n else 0.0)
        ref = y / np.sqrt((y * y).sum())
    assert got.dtype == dt
    assert_close(got, ref, tol, f"{f.name} n={n}")


@pytest.mark.parametrize("n, m", [(16385, 3), (0, 5)])
def test_independent_reductions_in_one_fusion(n, m):
    rng = np.random.default_rng(n + m)
    x = rng.standard_normal(n).astype(np.float32) + 3
    y = rng.standard_normal(m).astype(np.float32) - 1
    a, b = _kernels(two)(x, y)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    assert_close(a, _ref_var(xd), 1e-5, "var x")
    assert_close(b, ((yd - yd.mean()) ** 2).sum() + xd.sum() * yd.max(), 1e-5, "y")
    if n:  # two means in one combine kernel
        x2, y2 = rng.standard_normal(n) + 1, rng.standard_normal(n) * 2 + 0.5 * rng.random(n)
        (c,) = _kernels(cov)(x2, y2)
        assert_close(c, np.asarray(((x2 - x2.mean()) * (y2 - y2.mean())).mean()), 1e-12, "cov")


def test_two_dimensional_tensor_reduced_over_every_axis():
    x = (np.random.default_rng(5).standard_normal((3, 5479)) + 2).astype(np.float32)
    k = Kernels(var2d)
    v, u = k(x)
    xd = x.astype(np.float64)
    d = xd - xd.mean()
    assert_close(v, _ref_var(xd), 1e-5, "var 2d")
    assert_close(u, d / np.sqrt((d * d).sum()), 1e-5, "unit 2d")
    grids = {ln.kernel: ln.grid[0] for ln in k.planner.plan((1000, 100_000)).launches}
    assert grids["var2d_1_partial1"] == -(-100_000_000 // CHUNK)
    assert grids["var2d_1_pointwise"] >= 100_000_000 // (256 * 4)


def test_integer_and_complex_values_pass_between_kernels():
    rng = np.random.default_rng(4)
    i = rng.integers(-5, 6, 20_000).astype(np.int32)
    z = (rng.standard_normal(20_000) + 1j * rng.standard_normal(20_000) + (2 - 1j)).astype(
        np.complex64)
    ties, spread = Kernels(mixed)(i, z)
    assert ties.dtype == np.int64 and int(ties) == int((i == i.max()).sum())
    zd = z.astype(np.complex128)
    assert_close(spread, np.asarray((np.abs(zd - zd.mean()) ** 2).mean()), 1e-5, "complex")


def test_workspace_names_step_aside_from_parameters():
    @kp.fusion(name="clash")
    def clash(x: T[kp.f32, "n"], clash_0_val0: T[kp.f32, "n"]):
        return ((x - x.mean()) * clash_0_val0).sum()

    (variant,) = kp.compile(clash, targets=["sm_90"]).summary.variants
    assert [s.name for s in variant.scratch] == ["clash_0_ws0", "clash_0_val0_", "clash_0_ws1"]
    x = np.arange(5, dtype=np.float32)
    w = np.array([1, -2, 0.5, 3, 1], np.float32)
    (got,) = Kernels(clash)(x, w)
    assert_close(got, np.asarray(((x - x.mean()) * w).sum(dtype=np.float64)), 1e-6, "clash")


def test_deterministic_artifact_without_atomics():
    first = kp.save([kp.compile(moments, targets=["sm_90"])])
    assert kp.save([kp.compile(moments, targets=["sm_90"])]) == first
    ptx = pipeline.run(pipeline.new_build(unit, ["sm_90"], None, {}), stop="ptx").ptx
    assert not re.search(rb"\b(atom|red)\.", ptx)  # no atomics (float ones least of all)
