"""Review 42: the lowering read for logic bugs in rarely taken branches.

Suspicions were proved or disproved on the CPU: the summary's plan for concrete shapes
(``Planner.plan``), and the SIMT emulator (:mod:`.simt`) against NumPy. Each bug below failed
on the code as reviewed; all three are fixed (lowering/size_checks.py; the row sums become a
workspace, pipeline._row_read_elsewhere, a session later; the general schedule's complex64
sums accumulate in complex128, compensated); the rest pin behaviour that was checked and holds:

- expressions a kernel computes that no plan evaluates: a dim used as a value
  (``x.shape[0] // y.shape[0]``, ``1 << x.shape[0]``) and a size that only a general-schedule
  reduction's loop reads (``kp.arange(1 << k)`` reduced over axes ``(0, 2)``): the plan
  accepts a zero divisor or a shift past int64, and the kernel divides by zero, flips the sign
  of ``2**63`` or loops over a poison bound. The row and column schedules, whose predicates
  read those sizes, refuse the same shapes;
- a row reduction read at another row (``d[None, :]`` of ``d = a.sum(-1)``: the symmetric
  normalization of a graph) sends its stage to the general schedule when the code generator
  finds it, after the materialization step ran: ``a.sum(-1)`` is recomputed by every element
  (O(n^3) loads), although the README promises that a reduction other work reads is computed
  once, into a workspace (the column form ``a.sum(0)`` is);
- complex64 sums on the general schedule (one thread per whole axis) accumulate in complex64
  without the compensation float sums get there: 10^6 terms of 0.1+0.1j come out 1% off
  (NumPy 6e-8), far past the issue's 1e-5 for float32-based results.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import longrows, pipeline
from kernelpack.planner import Planner

from .simt import Kernels, assert_close

T = kp.Tensor


def _rng(seed: int = 42) -> np.random.Generator:
    return np.random.default_rng(seed)


def _summary(f, static=None):
    """The summary the lowering derives (through the LLVM IR stage, whose code generator may
    still send a stage to the general schedule), without PTX or cubins."""
    build = pipeline.run(pipeline.new_build(f, ["sm_80"], static, {}), stop="llvm_ir")
    return pipeline.summarize(build).summary


def _ran(k: Kernels, *inputs) -> list[str]:
    plan = k.planner.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
    return [launch.kernel for launch in plan.launches if all(launch.grid)]


# ---- expressions the kernels compute but no plan evaluates ---------------------------------

@kp.fusion
def dim_quotient(x: T[kp.i64, "n"], y: T[kp.f32, "m"]):
    return x + x.shape[0] // y.shape[0]


@kp.fusion
def dim_power(x: T[kp.f32, "n"]):
    return x * (1 << x.shape[0])


@kp.fusion
def reduced_only_size(x: T[kp.f32, "a"], y: T[kp.f32, "m"], k: kp.i64):
    # axes (0, 2): the general schedule (one thread per output, looping over a * 2^k terms)
    t = x[:, None, None] * kp.arange(1 << k).astype(kp.f32)[None, None, :] + y[None, :, None]
    return t.sum(axis=(0, 2))


@kp.fusion
def reduced_size_rows(x: T[kp.f32, "a"], k: kp.i64):
    return (x[:, None] * kp.arange(1 << k).astype(kp.f32)[None, :]).sum(-1)


@kp.fusion
def reduced_size_columns(x: T[kp.f32, "a"], y: T[kp.f32, "m"], k: kp.i64):
    t = x[:, None, None] * kp.arange(1 << k).astype(kp.f32)[None, :, None] + y[None, None, :]
    return t.sum(axis=1)


def test_dim_value_divided_by_a_zero_dim_is_refused_by_the_plan():
    planner = Planner(_summary(dim_quotient))
    assert planner.plan(x=(4,), y=(2,)).variant == 0  # an ordinary call plans
    with pytest.raises(kp.ConstraintError):
        planner.plan(x=(4,), y=(0,))


def test_dim_value_shift_past_int64_is_refused_or_exact():
    x = np.ones(63, np.float32)
    k = Kernels(dim_power)
    try:
        k.planner.plan(x.shape)
    except kp.ConstraintError:
        return  # refused: as the row schedule refuses 1 << 63 (below)
    (got,) = k(x)
    np.testing.assert_array_equal(got, x * np.float32(2.0 ** 63))


def test_dim_value_shift_within_int64_is_exact():
    rng = _rng()
    x = rng.standard_normal(40).astype(np.float32)
    (got,) = Kernels(dim_power)(x)
    np.testing.assert_array_equal(got, x * np.float32(2.0 ** 40))


def test_size_read_only_by_the_general_schedule_is_checked_by_the_plan():
    planner = Planner(_summary(reduced_only_size))
    assert planner.plan(x=(2,), y=(3,), k=3).launches
    with pytest.raises(kp.ConstraintError):
        planner.plan(x=(2,), y=(3,), k=64)


@pytest.mark.parametrize("fusion", [reduced_size_rows, reduced_size_columns])
def test_row_and_column_schedules_refuse_a_shift_past_int64(fusion):
    """The contrast: where a variant predicate reads the reduced length, 1 << 63 and 1 << 64
    are ConstraintErrors (ExpressionError) naming the predicate."""
    planner = Planner(_summary(fusion))
    kw = {"x": (2,), "y": (3,)} if fusion is reduced_size_columns else {"x": (2,)}
    assert planner.plan(**kw, k=3).launches
    for k in (63, 64):
        with pytest.raises(kp.ConstraintError):
            planner.plan(**kw, k=k)


def test_general_schedule_sum_with_a_shift_size_matches_numpy():
    rng = _rng()
    x = rng.standard_normal(3).astype(np.float32)
    y = rng.standard_normal(4).astype(np.float32)
    k = Kernels(reduced_only_size)
    (got,) = k(x, y, 5)
    assert _ran(k, x, y, 5) == ["reduced_only_size_0_pointwise"]
    t = x[:, None, None].astype(np.float64) * np.arange(32)[None, None, :] + y[None, :, None]
    assert_close(got, t.sum(axis=(0, 2)), 1e-6, "sum over (0, 2)")


# ---- a row reduction read at another row --------------------------------------------------

@kp.fusion
def sym_norm(a: T[kp.f32, "n", "n"]):
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


@kp.fusion
def sym_norm_columns(a: T[kp.f32, "n", "n"]):
    d = kp.rsqrt(a.sum(0))
    return a * d[:, None] * d[None, :]


def test_row_sums_read_across_rows_are_computed_once():
    """Was a bug: NotRowSchedulable rescheduled the stage general without materializing, so
    every element recomputed both row sums (O(n^3) loads). Now the sums are a workspace
    (pipeline._row_read_elsewhere); test_materialize covers it further."""
    plan = Planner(_summary(sym_norm)).plan(a=(4096, 4096))
    assert "sym_norm_m0" in plan.allocations
    assert [launch.kernel for launch in plan.launches][-1] == "sym_norm_1_pointwise"


def test_column_sums_read_across_columns_are_materialized():
    """The contrast: the same normalization by column sums gets a workspace stage."""
    plan = Planner(_summary(sym_norm_columns)).plan(a=(4096, 4096))
    assert "sym_norm_columns_m0" in plan.allocations
    assert len(plan.launches) >= 3


@pytest.mark.parametrize("n", [1, 5, 33])
def test_row_sums_read_across_rows_match_numpy(n):
    rng = _rng()
    a = (rng.random((n, n)) + 0.5).astype(np.float32)
    (got,) = Kernels(sym_norm)(a)
    ad = a.astype(np.float64)
    d = 1 / np.sqrt(ad.sum(-1))
    assert_close(got, ad * d[:, None] * d[None, :], 1e-6, f"n={n}")


# ---- complex64 sums on the general schedule -----------------------------------------------

@kp.fusion
def sums_over_0_2(z: T[kp.c64, "a", "b", "c"], x: T[kp.f32, "a", "b", "c"]):
    return z.sum(axis=(0, 2)), x.sum(axis=(0, 2))


def _fallback_sums():
    # 10^6 equal terms (0.1 is not exact in binary): a running float32 sum drifts
    # systematically, a pairwise or compensated one does not
    x = np.full((1000, 1, 1000), 0.1, np.float32)
    z = (x + 1j * x).astype(np.complex64)
    k = Kernels(sums_over_0_2)
    got = k(z, x)
    assert _ran(k, z, x) == ["sums_over_0_2_0_pointwise"]  # one thread per output
    return got, z, x


def test_complex64_sum_on_the_general_schedule_is_accurate():
    (got, _), z, _ = _fallback_sums()
    ref = z.astype(np.complex128).sum(axis=(0, 2))
    assert_close(got, ref, 1e-5, "complex64 sum over (0, 2)")


def test_float32_sum_on_the_general_schedule_is_accurate():
    (_, got), _, x = _fallback_sums()
    assert_close(got, x.astype(np.float64).sum(axis=(0, 2)), 1e-7, "float32 sum over (0, 2)")


# ---- behaviour checked and found right ----------------------------------------------------

@kp.fusion
def int_stats(c: T[kp.u64, "b", "n"], a: T[kp.u8, "b", "n"], e: T[kp.i16, "b", "n"],
              d: T[kp.u32, "b", "n"]):
    return (c.max(-1), c.min(-1), c.sum(-1), a.sum(-1), a.prod(-1), e.max(-1), e.min(-1),
            d.max(-1), c.max(0), c.min(0), a.sum(0), e.min(0), d.max(0), d.min(0),
            c.max(), a.sum(), e.min())


@pytest.mark.parametrize("shape", [(3, 5), (3, 40), (2, 3000), (100, 4)])
def test_unsigned_and_narrow_integer_reductions_on_every_schedule(shape):
    """Unsigned and 8/16-bit integers (which the random fusions do not draw): row (thread,
    warp tiles, block tiles), column (split and general) and full reductions, exactly NumPy's
    (uint64 maxima above 2^63, the unsigned identities, shuffles of int16)."""
    rng = _rng()
    c = rng.integers(0, 2**64, shape, dtype=np.uint64)
    a = rng.integers(0, 256, shape).astype(np.uint8)
    e = rng.integers(-2**15, 2**15, shape).astype(np.int16)
    d = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    got = Kernels(int_stats)(c, a, e, d)
    ref = (c.max(-1), c.min(-1), c.sum(-1), a.sum(-1, dtype=np.uint64),
           a.prod(-1, dtype=np.uint64), e.max(-1), e.min(-1), d.max(-1), c.max(0), c.min(0),
           a.sum(0, dtype=np.uint64), e.min(0), d.max(0), d.min(0), c.max(),
           a.sum(dtype=np.uint64), e.min())
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == r.dtype and np.array_equal(g, r), (i, g, r)


@kp.fusion
def no_axes(x: T[kp.i32, "a", "b"], y: T[kp.f32, "a", "b"]):
    return x.sum(axis=()), x.prod(axis=()), x.mean(axis=()), y.max(axis=()), y.mean(axis=())


def test_reductions_over_no_axes_are_casts():
    rng = _rng()
    x = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    got = Kernels(no_axes)(x, y)
    ref = (x.sum(axis=()), x.prod(axis=()), x.mean(axis=()), y.max(axis=()), y.mean(axis=()))
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)


@kp.fusion
def other_rows(x: T[kp.f32, "b", "n"], y: T[kp.f32, "b", "m"]):
    return x - y.max(-1, keepdims=True) + y.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape,kernels", [
    ((3, 5, 6), ["other_rows_0_rowwarp"]),
    ((4, 100, 1000), ["other_rows_0_rowblock"]),
    ((1, 3000, 40), ["other_rows_0_one_partial0", "other_rows_0_one_partial1",
                     "other_rows_0_one_combine0", "other_rows_0_one_pointwise"]),
    ((3, 2000, 7), ["other_rows_0_s_rowthread", "other_rows_0_pointwise"]),
    ((4, 3000, 40), ["other_rows_0_s_rowwarpt16", "other_rows_0_pointwise"]),
])
def test_rows_written_longer_than_reduced_take_every_long_row_path(shape, kernels,
                                                                   monkeypatch):
    """``x - y.max(-1, keepdims=True)`` with y's rows of another length goes through
    :mod:`.longrows` (no pad involved): fused warp / block, the one-row full reduction, and the
    row values into a workspace then a pointwise grid (constants patched small)."""
    monkeypatch.setattr(longrows, "OUT_PER_THREAD", 2)
    monkeypatch.setattr(longrows, "WARP_KEEP_MAX", 8)
    b, n, m = shape
    rng = _rng()
    x = rng.standard_normal((b, n)).astype(np.float32)
    y = rng.standard_normal((b, m)).astype(np.float32)
    k = Kernels(other_rows)
    (got,) = k(x, y)
    assert _ran(k, x, y) == kernels
    yd = y.astype(np.float64)
    assert_close(got, x - yd.max(-1, keepdims=True) + yd.sum(-1, keepdims=True), 1e-6,
                 str(shape))


@kp.fusion
def norm_stats(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) * w, x.mean(0), (x * w).sum()


@pytest.mark.parametrize("static,shape", [({"n": 1}, (5, 1)), ({"n": 0}, (3, 0)),
                                          ({"b": 1}, (1, 300)), ({"b": 0}, (0, 7)),
                                          ({"b": 3, "n": 5}, (3, 5))])
def test_static_sizes_beside_symbolic_ones(static, shape):
    """static= fixing one dim (to 0, 1 or more) beside a symbolic one: row, column and full
    stages whose predicates become constants."""
    rng = _rng()
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1:]).astype(np.float32)
    got = Kernels(norm_stats, static)(x, w)
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(xd - xd.max(-1, keepdims=True)) if shape[1] else xd
        ref = (e / e.sum(-1, keepdims=True) * w, xd.mean(0), (xd * w).sum())
    for i, (g, r) in enumerate(zip(got, ref)):
        assert_close(g, r.astype(np.float32), 1e-5, f"{static} output {i}")


@kp.fusion
def heavy_after_full(x: T[kp.f32, "n"], y: T[kp.f16, "n"]):
    return kp.exp(x - x.max()), kp.sin(x / x.sum()) + y.astype(kp.f32)


@pytest.mark.parametrize("n", [7, 1023, 2053])
@pytest.mark.parametrize("offset", [0, 1])
def test_grouped_pointwise_after_a_full_reduction_misaligned(n, offset):
    """The pointwise grid after a full reduction's combine kernel, in 16-byte groups
    (HEAVY_POINTWISE's two groups per thread, LONG_MATH_POINTWISE's one) or, for inputs 4 or
    2 bytes off a 16-byte boundary, the scalar loop."""
    rng = _rng()
    xb = rng.standard_normal(n + 1).astype(np.float32)
    yb = rng.standard_normal(n + 1).astype(np.float16)
    x, y = xb[offset:offset + n], yb[offset:offset + n]
    got = Kernels(heavy_after_full)(x, y)
    xd = x.astype(np.float64)
    assert_close(got[0], np.exp(xd - xd.max()), 1e-6, "exp")
    assert_close(got[1], np.sin(xd / xd.sum()) + y.astype(np.float64), 1e-5, "sin")
