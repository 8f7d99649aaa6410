"""Review 27: the DSL's semantics against NumPy, checked on the CPU (no GPU).

Fusions a user would plausibly write, compiled to LLVM IR and run through the host SIMT
emulator (:mod:`tests.lowering.simt`), compared with NumPy exactly (integers, bools, casts,
selections) or in float64 (float math, reductions). Shapes come from the planner
(``Program.plan``) as they would on a machine without a GPU.

Two findings fail here until fixed:

- ``b << b`` / ``b >> b`` of two bool tensors is a TraceError ("shl: needs integer
  operands"), although ``b << 1``, ``1 << b``, ``b // b`` and ``b ** b`` all follow NumPy
  (bool promotes to int8 for the integer ops: ``np.array([True]) << np.array([True])`` is
  ``array([2], dtype=int8)``). Nothing in the README lists it among the deliberate differences.
- A dim known at trace time (a literal dim ``T[kp.f32, "n", 3]`` or one fixed by
  ``static={"m": 3}``) is ``Expr(3)``: ``range(d)``, ``int(d)``, ``d > 2`` and ``d >= 3`` treat
  it as 3, but ``d == 3`` is False and ``d != 3`` True (``Expr.__eq__`` returns NotImplemented
  for an int, so Python falls back to identity). ``if x.shape[1] == 3:`` silently takes the
  wrong branch in a fusion specialized for 3.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from lowering.simt import Kernels

import kernelpack as kp
from kernelpack.lowering import pipeline
from kernelpack.planner import Planner

T = kp.Tensor


def _same(got: object, ref: object, what: str) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    assert np.array_equal(got, ref, equal_nan=ref.dtype.kind in "fc"), \
        f"{what}: {got.tolist()} != NumPy {ref.tolist()}"


def _close(got: object, ref: object, what: str, tol: float) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    assert np.allclose(got.astype(wide), ref.astype(wide), rtol=tol, atol=tol, equal_nan=True), \
        f"{what}: {got.tolist()} != NumPy {ref.tolist()}"


def _planner(fusion: kp.fusion, static: dict | None = None) -> Planner:
    build = pipeline.run(pipeline.new_build(fusion, ["sm_80"], static or {}, {}), stop="llvm_ir")
    return Planner(pipeline.summarize(build).summary)


# ---- integer arithmetic: floor division, modulo, shifts ------------------------------------

_INT_TYPES = [(kp.i8, np.int8), (kp.i16, np.int16), (kp.i32, np.int32), (kp.i64, np.int64),
              (kp.u8, np.uint8), (kp.u32, np.uint32), (kp.u64, np.uint64)]


def _int_ops(a, b, signed: bool):
    lit = -3 if signed else 3
    return (a // b, a % b, a << b, a >> b, a // lit, a % lit, a // 1, a % 1)


@pytest.mark.parametrize("kdt,ndt", _INT_TYPES, ids=lambda t: getattr(t, "__name__", str(t)))
def test_integer_floordiv_mod_shift_match_numpy_for_every_sign_and_width(kdt, ndt):
    """NumPy's floor semantics for mixed signs, 0 for a zero divisor, MIN // -1 wrapping, and
    shifts by amounts at or past the bit width (0, or -1 for a negative signed value)."""
    info = np.iinfo(ndt)
    signed = info.min < 0

    @kp.fusion
    def f(a: T[kdt, "n"], b: T[kdt, "n"]):
        return _int_ops(a, b, signed)

    if signed:
        av = [7, -7, 7, -7, 0, -1, info.max, info.min, 5, -100, 3, -3]
        bv = [2, 2, -2, -2, 3, 3, -1, -1, 0, 1, 100, info.bits - 1]
    else:
        av = [7, 0, 1, info.max, info.max - 1, 5, 200, 3, 1, 9, 128, 2]
        bv = [2, 3, 0, 1, 7, 0, 3, info.bits, info.bits + 1, 255, info.bits - 1, 1]
    a, b = np.array(av, ndt), np.array(bv, ndt)
    got = Kernels(f)(a, b)
    with np.errstate(all="ignore"):
        refs = _int_ops(a, b, signed)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"{ndt.__name__} op {k}")


def test_int32_shifts_by_negative_and_oversized_tensor_amounts():
    @kp.fusion
    def f(a: T[kp.i32, "n"], s: T[kp.i32, "n"]):
        return a << s, a >> s, a << 40, a >> 40, 1 << s, -1 >> s

    a = np.array([1, -1, 5, -8, 2**31 - 1, -2**31, 7, 3], np.int32)
    s = np.array([0, 1, 31, 32, 33, -1, -32, 100], np.int32)
    got = Kernels(f)(a, s)
    refs = (a << s, a >> s, a << 40, a >> 40, 1 << s, -1 >> s)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"shift {k}")


# ---- bools, promotion, Python literals -----------------------------------------------------

_BOOL_OPS = {
    "b+1": lambda b: b + 1, "b*2.5": lambda b: b * 2.5, "b<<1": lambda b: b << 1,
    "1<<b": lambda b: 1 << b, "b-1": lambda b: b - 1, "b/2": lambda b: b / 2,
    "b//2": lambda b: b // 2, "b%2": lambda b: b % 2, "b**2": lambda b: b ** 2,
    "b+True": lambda b: b + True, "b&1": lambda b: b & 1, "b^True": lambda b: b ^ True,
    "b==1": lambda b: b == 1, "b>0.5": lambda b: b > 0.5, "b+1j": lambda b: b + 1j,
    "b*b.sum()": lambda b: b * b.sum(), "b.mean()": lambda b: b.mean(),
    "b.prod()": lambda b: b.prod(), "b+b": lambda b: b + b, "b*b": lambda b: b * b,
    "b//b": lambda b: b // b, "b**b": lambda b: b ** b,
}


@pytest.mark.parametrize("name", sorted(_BOOL_OPS))
def test_bool_tensor_arithmetic_takes_numpys_types(name):
    op = _BOOL_OPS[name]

    @kp.fusion
    def f(b: T[kp.bool_, "n"]):
        return op(b)

    b = np.array([True, False, True, True])
    with np.errstate(all="ignore"):
        ref = op(b)
    _same(Kernels(f)(b)[0], ref, name)


@pytest.mark.parametrize("name", ["b<<b", "b>>b", "np.left_shift(b,b)"])
def test_shifts_of_two_bool_tensors_promote_to_int8_like_numpy(name):
    """Was a bug (review 27, fixed): ``b << b`` is a TraceError ("shl: needs integer operands")
    while NumPy gives
    int8 (``[True] << [True]`` is 2), and while ``b << 1``, ``1 << b`` and ``b // b`` here all
    follow NumPy's integer promotion of bools."""
    op = {"b<<b": lambda b, c: b << c, "b>>b": lambda b, c: b >> c,
          "np.left_shift(b,b)": lambda b, c: np.left_shift(b, c)}[name]

    @kp.fusion
    def f(b: T[kp.bool_, "n"], c: T[kp.bool_, "n"]):
        return op(b, c)

    b = np.array([True, False, True, False])
    c = np.array([True, True, False, False])
    _same(Kernels(f)(b, c)[0], op(b, c), name)


def test_mixed_tensors_and_literals_follow_numpy_or_the_documented_rules():
    """``i32 + f16`` takes float16 (README: an integer tensor with a float one takes the
    float's dtype); Python numbers are weak; ``i32 / i32`` and ``i32 + 1.5`` are float64."""

    @kp.fusion
    def f(a: T[kp.i32, "n"], h: T[kp.f16, "n"], b: T[kp.bool_, "n"], u: T[kp.u32, "n"],
          x: T[kp.f32, "n"]):
        return (a + h, b + a, b * x, a + 1.5, h + 1, (a > 2) * x, a * True, x > a, u + 1,
                u - 5, a / 2, a / a, h / 3, a ** 2, x // 2.5, x % -2.5, -x % 3, a % 2.5)

    a = np.array([0, 1, 3, -4, 7], np.int32)
    h = np.array([0.5, -1.25, 3, 1000, -0.0], np.float16)
    b = np.array([True, False, True, True, False])
    u = np.array([0, 1, 2, 3, 4**10], np.uint32)
    x = np.array([0.5, -1.5, 2.25, -7, 9], np.float32)
    got = Kernels(f)(a, h, b, u, x)
    with np.errstate(all="ignore"):
        refs = ((a + h).astype(np.float16), b + a, b * x, a + 1.5, h + 1, (a > 2) * x, a * True,
                x > a, u + 1, u - 5, a / 2, a / a, h / np.float16(3), a ** 2,
                x // np.float32(2.5), x % np.float32(-2.5), -x % np.float32(3), a % 2.5)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"op {k}")


def test_documented_refusals_of_mixed_widths_and_signedness_name_the_op():
    cases = {
        "add: dtype mismatch float32\\[a, b\\] and float64\\[c\\]":
            lambda x, y, i, u: x + y.astype(kp.f64),
        "add: dtype mismatch int32\\[a, b\\] and int64\\[a, b\\]":
            lambda x, y, i, u: i + i.astype(kp.i64),
        "where: dtype mismatch uint8\\[a, b\\] and int32\\[a, b\\]":
            lambda x, y, i, u: kp.where(x > 0, u, i),
        "add: shapes \\(a, b\\) and \\(c,\\) do not broadcast \\(axis 1: b vs c\\)":
            lambda x, y, i, u: x + y,
        "where: shapes \\(a, b\\) and \\(a, b\\) and \\(c,\\) do not broadcast":
            lambda x, y, i, u: kp.where(x > 0, x, y),
        "sum: axis 2 out of range": lambda x, y, i, u: x.sum(axis=2),
        "sum: repeated axis in \\(1, -1\\)": lambda x, y, i, u: x.sum(axis=(1, -1)),
        "shl: needs integer or bool operands": lambda x, y, i, u: x << 1,
        "max: complex numbers are not ordered": lambda x, y, i, u: x.astype(kp.c64).max(),
        "pow: integers to negative integer powers": lambda x, y, i, u: i ** -1,
        "Python integer 300 is out of bounds for uint8": lambda x, y, i, u: u + 300,
    }
    def fusion_of(body):
        def fn(x: T[kp.f32, "a", "b"], y: T[kp.f32, "c"], i: T[kp.i32, "a", "b"],
               u: T[kp.u8, "a", "b"]):
            return body(x, y, i, u)

        return kp.fusion(fn)

    for match, body in cases.items():
        with pytest.raises(kp.TraceError, match=match):
            fusion_of(body).trace()


# ---- casts -----------------------------------------------------------------------------------

def test_float_to_int_casts_of_negative_fractional_and_special_values():
    """README: casts truncate toward zero and wrap as NumPy's scalar loop does; compared one
    element at a time (NumPy's vectorized loop differs for NaN/inf/out of range)."""
    targets = [(kp.i8, np.int8), (kp.u8, np.uint8), (kp.i16, np.int16), (kp.i32, np.int32),
               (kp.u32, np.uint32), (kp.i64, np.int64), (kp.u64, np.uint64), (kp.bool_, np.bool_)]

    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return tuple(x.astype(k) for k, _ in targets)

    x = np.array([-2.7, 2.7, np.nan, np.inf, -np.inf, 3e9, -3e9, 1e20, 255.9, 256, -0.0,
                  65535.5, -128.5, 0.999], np.float32)
    for got, (_, to) in zip(Kernels(f)(x), targets):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = np.array([x[i:i + 1].astype(to)[0] for i in range(x.size)], to)
        _same(got, ref, f"float32 -> {to.__name__}")


def test_uint64_values_past_int64_divide_compare_reduce_and_convert_as_unsigned():
    @kp.fusion
    def f(u: T[kp.u64, "n"], v: T[kp.u64, "n"]):
        return (u // v, u % v, u > v, u.max(), u.min(), kp.maximum(u, v), u.astype(kp.f64),
                u.astype(kp.f32), u >> 63, u - v, u.sum(), u == u.max(), u > 2**63)

    u = np.array([2**64 - 1, 2**63, 2**63 + 12345, 5, 0, 2**64 - 2, 3, 2**62], np.uint64)
    v = np.array([3, 2**63 + 1, 7, 2**64 - 1, 1, 2, 2**63, 5], np.uint64)
    got = Kernels(f)(u, v)
    with np.errstate(all="ignore"):
        refs = (u // v, u % v, u > v, u.max(), u.min(), np.maximum(u, v), u.astype(np.float64),
                u.astype(np.float32), u >> np.uint64(63), u - v, u.sum(), u == u.max(),
                u > 2**63)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"u64 op {k}")


# ---- where with broadcasting ------------------------------------------------------------------

def test_where_broadcasts_all_three_operands_and_literals():
    @kp.fusion
    def f(c: T[kp.bool_, "a", 1], x: T[kp.f32, 1, "b"], y: T[kp.f32, "a", "b"],
          z: T[kp.f32, "b"]):
        return (kp.where(c, x, 0.0), kp.where(c, x, z), kp.where(x > 0, c, False),
                kp.where(c, 1, 2), kp.where(c, y, z[None, :]), kp.where(c, 1.5, x),
                kp.where(c, 1, 2.5), kp.where(c, 1j, x), kp.where(c, True, False))

    rng = np.random.default_rng(0)
    c = np.array([[True], [False], [True]])
    x = rng.standard_normal((1, 4)).astype(np.float32)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    z = rng.standard_normal(4).astype(np.float32)
    got = Kernels(f)(c, x, y, z)
    refs = (np.where(c, x, np.float32(0)), np.where(c, x, z), np.where(x > 0, c, False),
            np.where(c, 1, 2), np.where(c, y, z[None, :]), np.where(c, np.float32(1.5), x),
            np.where(c, 1, 2.5), np.where(c, 1j, x).astype(np.complex64),
            np.where(c, True, False))
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"where {k}")


# ---- floats: NaN, signed zeros, infinities ---------------------------------------------------

def test_float_elementwise_corners_match_numpy():
    @kp.fusion
    def f(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
        return (kp.maximum(x, y), kp.minimum(x, y), x % y, x // y, abs(x), kp.floor(x),
                kp.ceil(x), kp.where(x > y, x, y), x.max(), x.min())

    vals = [np.nan, 1.0, -1.0, 0.0, -0.0, np.inf, -np.inf, 2.5, -7.5, 3.0]
    pairs = [(p, q) for p in vals for q in vals]
    x = np.array([p for p, _ in pairs])
    y = np.array([q for _, q in pairs])
    got = Kernels(f)(x, y)
    with np.errstate(all="ignore"):
        refs = (np.maximum(x, y), np.minimum(x, y), x % y, x // y, abs(x), np.floor(x),
                np.ceil(x), np.where(x > y, x, y), x.max(), x.min())
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"float op {k}")


# ---- reductions ---------------------------------------------------------------------------

_AXES = [None, 0, -1, (0, 1), (-1, 0), (0, 2), (1, 2)]


def _reductions(x):
    out = []
    for ax in _AXES:
        for red in ("sum", "prod", "max", "min", "mean"):
            out.append(getattr(x, red)(axis=ax, keepdims=ax in (None, (0, 2))))
    return tuple(out)


def test_reductions_over_several_and_negative_axes_with_keepdims():
    @kp.fusion
    def f(x: T[kp.i32, "a", "b", "c"]):
        return _reductions(x)

    x = np.random.default_rng(1).integers(-3, 4, (2, 3, 4)).astype(np.int32)
    for k, (g, r) in enumerate(zip(Kernels(f)(x), _reductions(x))):
        if r.dtype.kind == "f":
            _close(g, r, f"reduction {k}", 1e-12)
        else:
            _same(g, r, f"reduction {k}")


def test_reductions_of_small_and_mixed_integer_types_take_numpys_result_types():
    @kp.fusion
    def f(a: T[kp.i8, "n", "m"], b: T[kp.bool_, "n", "m"], u: T[kp.u16, "n", "m"]):
        return (a.sum(), a.sum(axis=1), a.prod(axis=0), a.max(axis=1), b.sum(axis=0),
                b.max(axis=1), b.min(), b.prod(axis=1), u.sum(axis=1), u.min(axis=0),
                a.sum(axis=1, dtype=kp.i8), a.sum(axis=()), b.sum(axis=(0, 1), keepdims=True))

    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (3, 20)).astype(np.int8)
    b = rng.random((3, 20)) < 0.5
    u = rng.integers(0, 65536, (3, 20)).astype(np.uint16)
    refs = (a.sum(), a.sum(axis=1), a.prod(axis=0), a.max(axis=1), b.sum(axis=0),
            b.max(axis=1), b.min(), b.prod(axis=1), u.sum(axis=1), u.min(axis=0),
            a.sum(axis=1, dtype=np.int8), a.sum(axis=()), b.sum(axis=(0, 1), keepdims=True))
    for k, (g, r) in enumerate(zip(Kernels(f)(a, b, u), refs)):
        _same(g, r, f"int reduction {k}")


def test_reductions_over_empty_axes_give_the_documented_identities():
    """README: max/min over an empty axis give the identity (-inf/+inf for floats, the
    integer type's minimum/maximum) where NumPy raises; sum 0, prod 1, mean NaN (NumPy)."""

    @kp.fusion
    def f(x: T[kp.f64, "a", "b"], i: T[kp.i16, "a", "b"]):
        return (x.max(axis=1), x.min(axis=1), x.sum(axis=1), x.prod(axis=1), x.mean(axis=1),
                i.max(axis=1), i.min(), x.max(axis=0), x.sum(), x.max(keepdims=True))

    x = np.zeros((3, 0))
    i = np.zeros((3, 0), np.int16)
    got = Kernels(f)(x, i)
    refs = (np.full(3, -np.inf), np.full(3, np.inf), np.zeros(3), np.ones(3),
            np.full(3, np.nan), np.full(3, -32768, np.int16), np.int16(32767), np.zeros(0),
            np.float64(0), np.full((1, 1), -np.inf))
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"empty reduction {k}")


def test_reductions_of_broadcast_views_and_of_other_reductions():
    @kp.fusion
    def f(x: T[kp.f64, "n"], y: T[kp.f64, "m"], z: T[kp.f64, "a", "b"]):
        p = x[:, None] * y[None, :]
        return (p.sum(0), p.sum(1), p.max(), (y + x[:, None]).mean(axis=0, keepdims=True),
                z.sum(1).max(0), z - z.max(axis=0, keepdims=True), z[:, None].sum(axis=1),
                z.sum(keepdims=True) + z, z[..., None].prod(axis=-1))

    rng = np.random.default_rng(5)
    x, y, z = rng.standard_normal(3), rng.standard_normal(5), rng.standard_normal((3, 4))
    p = x[:, None] * y[None, :]
    refs = (p.sum(0), p.sum(1), p.max(), (y + x[:, None]).mean(axis=0, keepdims=True),
            z.sum(1).max(0), z - z.max(axis=0, keepdims=True), z[:, None].sum(axis=1),
            z.sum(keepdims=True) + z, z[..., None].prod(axis=-1))
    for k, (g, r) in enumerate(zip(Kernels(f)(x, y, z), refs)):
        _close(g, r, f"reduction {k}", 1e-12)


# ---- sizes, arange/iota, indexing with None --------------------------------------------------

def test_arange_and_iota_from_size_arithmetic_including_empty_ranges():
    @kp.fusion
    def f(x: T[kp.f32, "n", "m"], i: T[kp.i64, "n", "m"]):
        n, m = x.shape
        d = n - m
        return (kp.arange(n), kp.arange(2, m, 3), kp.arange(m, 0, -2), kp.arange(m - 1, n, -1),
                kp.arange(n - m), kp.arange(n)[:, None] * m + kp.arange(m),
                kp.iota((n, m), -2, kp.i32), i + d // 3, i + d % 3, i + (-d) // 4,
                i * (d // -2), i + (d % -3), i + kp.cdiv(d, 2), i < d, i + 2 ** n)

    k = Kernels(f)
    for shape in [(2, 7), (5, 3), (3, 0)]:
        n, m = shape
        d = n - m
        x = np.zeros(shape, np.float32)
        i = np.arange(n * m, dtype=np.int64).reshape(shape) - 4
        refs = (np.arange(n), np.arange(2, m, 3), np.arange(m, 0, -2), np.arange(m - 1, n, -1),
                np.arange(n - m), np.arange(n)[:, None] * m + np.arange(m),
                np.broadcast_to(np.arange(n, dtype=np.int32)[:, None], shape), i + d // 3,
                i + d % 3, i + (-d) // 4, i * (d // -2), i + (d % -3), i + -(-d // 2), i < d,
                i + 2 ** n)
        for j, (g, r) in enumerate(zip(k(x, i), refs)):
            _same(g, r, f"{shape} op {j}")


def test_none_and_ellipsis_indexing_adds_axes_like_numpy():
    ops = (lambda x: x[...], lambda x: x[None, ..., None], lambda x: x[:, None, :],
           lambda x: x[..., None, :], lambda x: x[()], lambda x: x[None, None],
           lambda x: x[np.newaxis, :], lambda x: x.sum()[None],
           lambda x: x[:, None] - x[None, :, :])

    @kp.fusion
    def f(x: T[kp.f32, "n", "m"]):
        return tuple(op(x) for op in ops)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for k, (g, op) in enumerate(zip(Kernels(f)(x), ops)):
        _same(g, op(x), f"index {k}")


# ---- outputs, static shapes, scalars, plans ---------------------------------------------------

def test_outputs_passing_inputs_through_repeating_values_and_scalars():
    @kp.fusion
    def f(x: T[kp.f32, "a", "b"], s: kp.f32, n: kp.i32):
        y = x * 2
        return x, y, y, s, x.shape[0], kp.arange(n), x[:, None, :]

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = Kernels(f)(x, 2.5, 4)
    refs = (x, x * 2, x * 2, np.float32(2.5), np.int64(2), np.arange(4), x[:, None, :])
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"output {k}")


def test_static_and_literal_dims_are_checked_by_the_plan():
    @kp.fusion
    def f(x: T[kp.f32, "a", 3], y: T[kp.f32, "a", "b"]):
        return x.sum(1), y * y.shape[1]

    p = _planner(f, {"b": 4})
    plan = p.plan(x=(5, 3), y=(5, 4))
    assert [a.shape for a in plan.allocations.values() if a.kind == "output"] == [(5,), (5, 4)]
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[1\] is 4, expected 3"):
        p.plan(x=(5, 4), y=(5, 4))
    with pytest.raises(kp.ConstraintError, match=r"y.shape\[1\] is 5, expected 4"):
        p.plan(x=(5, 3), y=(5, 5))
    with pytest.raises(kp.ConstraintError, match="rank"):
        p.plan(x=(5,), y=(5, 4))


def test_integer_scalar_parameters_are_range_checked_by_the_plan():
    @kp.fusion
    def f(n: kp.i32, u: kp.u8, b: kp.bool_):
        return kp.arange(n), kp.arange(u), kp.where(b, kp.arange(3), 0)

    p = _planner(f)
    shapes = [a.shape for a in p.plan(-5, 3, True).allocations.values()]
    assert shapes == [(0,), (3,), (3,)]
    for args, match in [((2**40, 1, True), "scalar n = 1099511627776 is outside"),
                        ((4, 300, True), "scalar u = 300 is outside"),
                        ((4, -1, True), "scalar u = -1 is outside"),
                        ((4, 1, 2), "scalar b = 2 is outside")]:
        with pytest.raises(kp.ConstraintError, match=match):
            p.plan(*args)
    with pytest.raises(TypeError, match="scalar n must be an integer"):
        p.plan(1.5, 1, True)
    assert [g.tolist() for g in Kernels(f)(4, 3, False)] == [[0, 1, 2, 3], [0, 1, 2], [0, 0, 0]]


def test_power_of_two_sizes_overflow_as_constraint_errors():
    @kp.fusion
    def f(x: T[kp.f32, "q"], n: kp.i64):
        return kp.arange(1 << n), kp.pad(x, 1 << x.shape[0])

    p = _planner(f)
    assert [a.shape for a in p.plan((3,), 2).allocations.values()] == [(4,), (8,)]
    for args in [((3,), 63), ((3,), 64), ((3,), -1), ((70,), 2)]:
        with pytest.raises(kp.ConstraintError):
            p.plan(*args)


# ---- complex and half precision ----------------------------------------------------------------

def test_complex_arithmetic_parts_and_reductions():
    @kp.fusion
    def f(z: T[kp.c64, "n"], w: T[kp.c128, "n"], x: T[kp.f32, "n"]):
        return (z * z, z / (z + 1), abs(z), z.real, z.imag, kp.complex(x, x * 2), z + x,
                w * 2j, -z, z.conj(), kp.exp(z), z ** 2, z ** -1, z == z, z != 0,
                (z * w.astype(kp.c64)).sum(), abs(w).max(), z.astype(kp.c128) + w, x + 1j,
                z.mean(), x.real, x.imag)

    rng = np.random.default_rng(2)
    x = rng.standard_normal(6).astype(np.float32)
    z = (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64)
    w = rng.standard_normal(6) + 1j * rng.standard_normal(6)
    refs = (z * z, z / (z + 1), abs(z), z.real, z.imag, (x + 1j * (x * 2)).astype(np.complex64),
            z + x, w * 2j, -z, z.conj(), np.exp(z), z ** 2, z ** -1, z == z, z != 0,
            (z * w.astype(np.complex64)).sum(), abs(w).max(), z.astype(np.complex128) + w,
            (x + 1j).astype(np.complex64), z.mean(), x.real, np.zeros_like(x))
    for k, (g, r) in enumerate(zip(Kernels(f)(z, w, x), refs)):
        _close(g, r, f"complex op {k}", 1e-5)


def test_complex_math_beyond_exp_is_a_trace_error_naming_the_op():
    """Only exp (with neg/abs/real/imag/conj) is lowered for complex; the README names sqrt
    and sigmoid as missing, and log is refused the same way, naming the op."""

    @kp.fusion
    def f(z: T[kp.c128, "n"]):
        return kp.log(z)

    with pytest.raises(kp.TraceError, match=r"log: complex arguments are not supported"):
        f.trace()


def test_float16_math_rounds_like_numpy():
    @kp.fusion
    def f(h: T[kp.f16, "n"]):
        return (kp.exp(h), kp.tanh(h), h * h + h, h / 3, kp.sqrt(h), h // 0.3, h % 0.3, h.max(),
                h.astype(kp.i32), (h * h).astype(kp.f32))

    h = (np.random.default_rng(4).standard_normal(64) * 4).astype(np.float16)
    with np.errstate(all="ignore"):
        refs = (np.exp(h), np.tanh(h), h * h + h, h / np.float16(3), np.sqrt(h),
                h // np.float16(0.3), h % np.float16(0.3), h.max(), h.astype(np.int32),
                (h * h).astype(np.float32))
    for k, (g, r) in enumerate(zip(Kernels(f)(h), refs)):
        _same(g, r, f"float16 op {k}")


# ---- dims known at trace time ----------------------------------------------------------------

def test_known_dims_behave_as_ints_for_ordering_range_and_int():
    seen: dict = {}

    @kp.fusion
    def f(x: T[kp.f32, "n", 3]):
        d = x.shape[1]
        seen.update(gt=bool(d > 2), ge=bool(d >= 3), eq=bool(kp.eq(d, 3)), rng=list(range(d)),
                    num=int(d))
        return x * 1

    f.trace()
    assert seen == {"gt": True, "ge": True, "eq": True, "rng": [0, 1, 2], "num": 3}


def test_a_literal_dim_equals_its_int():
    """Was a bug (review 27, fixed): ``x.shape[1] == 3`` is False (and ``!= 3`` True) for a literal
    dim of 3,
    while ``x.shape[1] >= 3``, ``> 2``, ``int()`` and ``range()`` all see 3."""
    seen: dict = {}

    @kp.fusion
    def f(x: T[kp.f32, "n", 3]):
        seen.update(eq=x.shape[1] == 3, ne=x.shape[1] != 3)
        return x * 1

    f.trace()
    assert seen == {"eq": True, "ne": False}


def test_a_static_dim_takes_the_branch_its_size_selects():
    """Was a bug (review 27, fixed): with ``static={"m": 3}`` the fusion's ``if x.shape[1] == 3``
    branch is never
    taken, so the specialized kernel silently computes ``x`` instead of ``x * 3``."""

    @kp.fusion
    def f(x: T[kp.f32, "n", "m"]):
        if x.shape[1] == 3:
            return x * 3
        return x

    x = np.ones((2, 3), np.float32)
    _same(Kernels(f, {"m": 3})(x)[0], x * 3, "static m=3")
