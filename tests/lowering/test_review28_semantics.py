"""Review 28 (black box): the DSL's results and errors against NumPy 2, the README and
docs/FORMAT.md, through the SIMT emulator (:mod:`.simt`) and the planner of a loaded artifact.

Bugs (each test below fails on the code reviewed and passes once fixed):

- NumPy scalars (``np.float32(0.5)``, ``np.float16``, ``np.float64``, 0-d arrays) are treated
  as weak Python numbers. The README (and the ``kp.f32(1e-5)`` TypeError) tell users to write
  ``np.float32(1e-5)`` "for a typed constant", and NumPy 2 treats NumPy scalars as typed, but
  ``x_i8 * np.float32(0.5)`` is float64. (Decided: NumPy scalars stay weak, as in torch, and
  the README no longer calls them typed; a documented difference from NumPy 2.)
- A default value on a fusion parameter (``s: kp.f32 = 2.0``) is silently dropped: the
  compiled program demands ``s`` ("missing input(s) ['s']"), while ``*args``/``**kw`` are
  refused when the fusion is defined.
- A ``kp.u64`` scalar parameter cannot take values of 2**63 or more in any fusion
  (ExpressionError: "expressions are evaluated over int64"), even ``x + s`` on a uint64 tensor,
  because the lowering passes every integer scalar as an int64 expression argument.
- ``kp.where`` refuses a non-bool condition ("condition must be bool"); NumPy takes any
  dtype's truth value, and the README's list of deliberate differences does not include it.
- A bool scalar parameter named like a dim is bound as an integer symbol and must equal the
  dim (FORMAT.md binds *integer* caller scalars only). (Decided: documented, FORMAT.md §2.)

The remaining tests pin behaviour checked and found right.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, run_fusion

T = kp.Tensor


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    if ref.dtype.kind in "fc":
        assert np.allclose(got, ref, rtol=1e-6, atol=0, equal_nan=True), f"{what}: {got} != {ref}"
    else:
        assert np.array_equal(got, ref), f"{what}: {got} != {ref}"


# ---------------------------------------------------------------------------------------------
# bugs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("const", [np.float32(0.5), np.float16(0.5)], ids=["np.float32", "np.float16"])
def test_numpy_float_scalar_with_int8_tensor_is_weak_like_a_python_float(const) -> None:
    """Decided in review 28 (README): NumPy scalars are weak like the Python number they
    hold, as in torch. NumPy 2 types them (int8 * np.float32 is float32 there); typing them
    was tried and disagreed with every rule built on weak numbers (sizes, pow, where)."""
    @kp.fusion
    def f(x: T[kp.i8, "n"]):
        return x * const

    x = np.array([1, -2, 3, 100], np.int8)
    (got,) = run_fusion(f, x)
    _same(got, x * float(const), f"int8 * {type(const).__name__}")


def test_numpy_float32_scalars_in_where_are_weak() -> None:
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return kp.where(x > 0, np.float32(1.5), 0), kp.where(x > 0, 0.1, np.float32(1.5))

    x = np.array([1.0, -2.0, 3.0], np.float32)
    got = run_fusion(f, x)
    _same(got[0], np.where(x > 0, 1.5, 0), "where(c, np.float32, 0)")
    _same(got[1], np.where(x > 0, 0.1, 1.5), "where(c, 0.1, np.float32)")


@pytest.mark.parametrize("tdt,ndt,const", [
    (kp.f16, np.float16, np.float32(0.1)),
    (kp.f32, np.float32, np.float64(0.1)),
    (kp.f32, np.float32, np.array(0.1)),
    (kp.f32, np.float32, np.sqrt(2.0)),
], ids=["f16*np.float32", "f32*np.float64", "f32*0d-f64-array", "f32*np.sqrt(2.0)"])
def test_numpy_float_scalar_beside_a_float_tensor_takes_the_tensor_s_width(tdt, ndt,
                                                                          const) -> None:
    """Decided in review 28 (README, "Where the DSL differs from NumPy"): beside a float
    tensor a NumPy float scalar takes the tensor's width, as a Python float does (and as
    torch does): ``x_f32 * np.sqrt(2.0)`` (an np.float64) stays a float32 kernel. NumPy 2
    widens to the scalar's dtype; a float64 kernel is many times slower on a GPU, and a
    TraceError would refuse the commonest spelling of a constant."""
    @kp.fusion
    def f(x: T[tdt, "n"]):
        return x * const

    x = np.array([0.1, 1000.0, -3.0], ndt)
    (got,) = run_fusion(f, x)
    _same(got, x * ndt(const), f"{x.dtype} * {type(const).__name__}")


def test_default_on_fusion_parameter_is_refused_where_declared() -> None:
    with pytest.raises(kp.TraceError, match="parameter 's' has a default value"):
        @kp.fusion
        def f(x: T[kp.f32, "n"], s: kp.f32 = 2.0):
            return x * s


@pytest.mark.parametrize("s", [2**64 - 1, 2**63])
def test_u64_scalar_takes_its_full_range(s) -> None:
    @kp.fusion
    def f(x: T[kp.u64, "n"], s: kp.u64):
        return x + s, x > s

    x = np.array([0, 1, 5, 2**63], np.uint64)
    got = run_fusion(f, x, s)
    _same(got[0], x + np.uint64(s), "u64 + s")
    _same(got[1], x > np.uint64(s), "u64 > s")


def test_where_takes_non_bool_condition_like_numpy() -> None:
    @kp.fusion
    def f(i: T[kp.i32, "n"], x: T[kp.f32, "n"]):
        return kp.where(i, x, 0.0), kp.where(x, 1, 0)

    i = np.array([-3, 0, 5, 0], np.int32)
    x = np.array([0.5, np.nan, -0.0, 2.0], np.float32)
    got = run_fusion(f, i, x)
    _same(got[0], np.where(i, x, np.float32(0)), "where(int cond)")
    _same(got[1], np.where(x, 1, 0), "where(float cond)")


def test_bool_scalar_named_like_a_dim_binds_it_as_0_or_1() -> None:
    """Decided in review 28: a bool caller scalar is a symbol like an integer one (as 0 or 1;
    FORMAT.md §2 now says so), so one named like a dim must equal that dim."""
    @kp.fusion
    def f(x: T[kp.f32, "s"], s: kp.bool_):
        return kp.where(s, x, -x)

    x = np.arange(5, dtype=np.float32)
    with pytest.raises(kp.ConstraintError, match="scalar s is 1 but s = 5 from x.shape"):
        run_fusion(f, x, True)
    (got,) = run_fusion(f, np.arange(1, dtype=np.float32), True)
    _same(got, np.arange(1, dtype=np.float32), "where(bool scalar s == len(x))")


# ---------------------------------------------------------------------------------------------
# checked and found right
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("npdt,kdt", [(np.bool_, kp.bool_), (np.int8, kp.i8), (np.uint8, kp.u8),
                                      (np.uint32, kp.u32)])
def test_reduction_accumulator_dtypes(npdt, kdt) -> None:
    @kp.fusion
    def f(x: T[kdt, "a", "b"]):
        return x.sum(axis=1), x.prod(axis=0), x.max(axis=-1), x.mean(axis=(0, 1)), x.sum(keepdims=True)

    rng = np.random.default_rng(0)
    hi = 2 if npdt is np.bool_ else int(np.iinfo(npdt).max) + 1
    lo = int(np.iinfo(npdt).min) if npdt is not np.bool_ else 0
    x = rng.integers(lo, hi, (3, 17)).astype(npdt)
    for got, ref, what in zip(run_fusion(f, x), [x.sum(axis=1), x.prod(axis=0), x.max(axis=-1),
                                                 x.mean(axis=(0, 1)), x.sum(keepdims=True)],
                              ["sum", "prod", "max", "mean", "sum keepdims"]):
        _same(got, ref, f"{npdt.__name__} {what}")


def test_empty_reductions_follow_the_readme() -> None:
    # sum 0 and prod 1 as NumPy, mean NaN as NumPy; max/min the identity (README) where NumPy raises
    @kp.fusion
    def f(x: T[kp.f32, "a", "b"], i: T[kp.i32, "a", "b"]):
        return x.sum(axis=1), x.prod(axis=1), x.mean(axis=1), x.max(axis=1), i.min(axis=1), i.mean()

    x = np.zeros((3, 0), np.float32)
    i = np.zeros((3, 0), np.int32)
    got = run_fusion(f, x, i)
    _same(got[0], np.zeros(3, np.float32), "sum")
    _same(got[1], np.ones(3, np.float32), "prod")
    _same(got[2], np.full(3, np.nan, np.float32), "mean")
    _same(got[3], np.full(3, -np.inf, np.float32), "max")
    _same(got[4], np.full(3, np.iinfo(np.int32).max, np.int32), "int min")
    _same(got[5], np.float64(np.nan), "int mean")


def test_unsigned_high_bit_values() -> None:
    @kp.fusion
    def f(x: T[kp.u32, "a", "b"], d: T[kp.u32, "a", "b"]):
        return x.sum(axis=1), x.max(axis=0), x // d, x % 7, x.mean(), x.astype(kp.f64)

    rng = np.random.default_rng(1)
    x = rng.integers(2**31, 2**32, (3, 11), dtype=np.uint32)
    d = rng.integers(1, 2**32, (3, 11), dtype=np.uint32)
    for got, ref, what in zip(run_fusion(f, x, d), [x.sum(axis=1), x.max(axis=0), x // d, x % 7,
                                                    x.mean(), x.astype(np.float64)],
                              ["sum", "max", "//", "%", "mean", "astype"]):
        _same(got, ref, f"u32 {what}")


def test_integer_floor_division_modulo_and_shifts_like_numpy() -> None:
    @kp.fusion
    def f(a: T[kp.i32, "n"], d: T[kp.i32, "n"], s: T[kp.i32, "n"]):
        return a // d, a % d, a << s, a >> s, a // 0, a % -1

    a = np.array([7, -7, 7, -7, 0, -2147483648, 5, -5], np.int32)
    d = np.array([2, 2, -2, -2, 3, -1, 0, 0], np.int32)
    s = np.array([0, 1, 31, 32, 33, 40, -1, 5], np.int32)
    with np.errstate(all="ignore"):
        refs = [a // d, a % d, np.left_shift(a, s), np.right_shift(a, s), a // 0, a % -1]
    for got, ref, what in zip(run_fusion(f, a, d, s), refs, ["//", "%", "<<", ">>", "//0", "%-1"]):
        _same(got, ref, what)


def test_python_int_comparisons_past_the_dtype_range() -> None:
    @kp.fusion
    def f(u: T[kp.u8, "n"], i: T[kp.i32, "n"]):
        return u > -1, u == 256, i == 2.5, i < float("inf"), i != float("nan")

    u = np.array([0, 1, 128, 255], np.uint8)
    i = np.array([2, 3, -5, 2**31 - 1], np.int32)
    refs = [u > -1, u == 256, i == 2.5, i < float("inf"), i != float("nan")]
    for j, (got, ref) in enumerate(zip(run_fusion(f, u, i), refs)):
        _same(got, ref, f"comparison {j}")


def test_outputs_of_several_shapes_literal_one_broadcast_and_rank0() -> None:
    @kp.fusion
    def f(x: T[kp.f32, "a", 1], y: T[kp.f32, 1, "b"], c: T[kp.f32]):
        z = x * y + c
        return x, z, z.sum(axis=0), z.max(axis=-1, keepdims=True), z.mean(), c * 2

    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    y = np.arange(5, dtype=np.float32).reshape(1, 5) - 2
    c = np.array(0.5, np.float32)
    z = x * y + c
    refs = [x, z, z.sum(axis=0), z.max(axis=-1, keepdims=True), z.mean(), c * 2]
    for j, (got, ref) in enumerate(zip(run_fusion(f, x, y, c), refs)):
        _same(got, ref, f"output {j}")


def test_shape_errors_name_the_op_parameter_and_dims() -> None:
    @kp.fusion
    def bad(x: T[kp.f32, "n"], y: T[kp.f32, "m"]):
        return x + y

    with pytest.raises(kp.TraceError, match=r"add: shapes \(n,\) and \(m,\) do not broadcast"):
        run_fusion(bad, np.ones(3, np.float32), np.ones(3, np.float32))

    @kp.fusion
    def f(x: T[kp.f32, "a", "b"], y: T[kp.f32, "b"]):
        return x + y

    with pytest.raises(kp.ConstraintError, match=r"y\.shape\[0\] is 4 but b = 3 from x\.shape\[1\]"):
        run_fusion(f, np.ones((2, 3), np.float32), np.ones(4, np.float32))
    with pytest.raises(kp.RankError, match="y has rank 2"):
        run_fusion(f, np.ones((2, 3), np.float32), np.ones((1, 3), np.float32))


def test_static_dim_and_plan_sizes(tmp_path) -> None:
    @kp.fusion
    def f(x: T[kp.f32, "a", "n"], m: T[kp.bool_, "n"]):
        return x / x.shape[1], x.mean(axis=1), m & m

    k = Kernels(f, static={"n": 3})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = np.array([True, False, True])
    got = k(x, m)
    _same(got[0], x / np.float32(3), "x / n")
    _same(got[1], x.mean(axis=1), "mean")
    _same(got[2], m, "m & m")
    with pytest.raises(kp.ConstraintError, match=r"x\.shape\[1\] is 4, expected 3"):
        k(np.ones((2, 4), np.float32), np.ones(4, bool))

    c = kp.compile(f, targets=["sm_80"])
    path = tmp_path / "f.kpack"
    kp.save([c], str(path))
    program = kp.load(str(path))["f"]
    for shape in [(2, 3), (0, 5), (7, 0)]:
        plan = program.plan(x=shape, m=(shape[1],))
        outs = {name: a for name, a in plan.allocations.items() if a.kind == "output"}
        assert [a.shape for a in outs.values()] == [shape, (shape[0],), (shape[1],)]
        assert [a.nbytes for a in outs.values()] == [4 * shape[0] * shape[1], 4 * shape[0], shape[1]]
        assert all(len(launch.grid) == 3 for launch in plan.launches)
