"""Regressions from an adversarial review of the DSL and its lowering: complex Python literals,
NumPy scalars and axes, integer powers, out-of-range integer literals, and ops that used to
reach the code generator (or a raw Python exception) instead of a TraceError at trace time.

Numerics run through the SIMT emulator (:mod:`.simt`) against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close

T = kp.Tensor


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_complex_python_literals_take_numpys_weak_dtype(dt):
    """``x + 1j`` was a TraceError ("cannot use 1j"); NumPy gives complex64 beside float32,
    complex128 beside float64 and integers. Negative small powers of complex values are their
    reciprocals (complex pow is otherwise not lowered)."""
    cdt = kp.complex64 if dt == kp.float32 else kp.complex128

    @kp.fusion
    def lit(x: T[dt, "n"], z: T[cdt, "n"], i: T[kp.i32, "n"]):
        return (x + 1j, 1j * x, z * (2 - 3j), kp.where(x > 0, z, 1j), (x + 2j).sum(), i * 1j,
                z ** -2, 0.5j - z, x * np.float32(2))

    g = lit.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [cdt, cdt, cdt, cdt, cdt,
                                                           kp.complex128, cdt, cdt, dt]
    rng = np.random.default_rng(1)
    npdt = np.float32 if dt == kp.float32 else np.float64
    x = rng.standard_normal(11).astype(npdt)
    z = (rng.standard_normal(11) + 1j * rng.standard_normal(11)).astype(np.dtype(cdt.name))
    i = np.arange(11, dtype=np.int32)
    xd, zd = x.astype(np.float64), z.astype(np.complex128)
    refs = (xd + 1j, 1j * xd, zd * (2 - 3j), np.where(xd > 0, zd, 1j), (xd + 2j).sum(), i * 1j,
            zd ** -2, 0.5j - zd, xd * 2)
    tol = 1e-5 if dt == kp.float32 else 1e-12
    for k, (got, ref) in enumerate(zip(Kernels(lit)(x, z, i), refs)):
        assert_close(got, ref, tol, f"output {k}")
    # canonical bytes encode the literal (json has no complex numbers) and stay stable
    assert lit.canonical_bytes() == lit.canonical_bytes()
    assert b"complex:" in lit.canonical_bytes()


@pytest.mark.parametrize("dt", [kp.int32, kp.int64, kp.uint32], ids=["i32", "i64", "u32"])
def test_integer_powers_follow_numpy(dt):
    """``i ** 9``, ``2 ** k`` and ``i ** k`` (exponents past the unrolled 0..8) failed at
    codegen with "integer ** with a tensor exponent is not supported"; they are NumPy's
    wrapping integer powers now."""
    @kp.fusion
    def ipow(i: T[dt, "n"], k: T[dt, "n"]):
        return i ** 9, 2 ** k, i ** k, 3 ** k

    npdt = np.dtype(dt.name)
    rng = np.random.default_rng(2)
    lo = 0 if dt.kind == "u" else -6
    i = rng.integers(lo, 6, 40).astype(npdt)
    k = rng.integers(0, 40, 40).astype(npdt)
    for got, ref in zip(Kernels(ipow)(i, k), (i ** 9, 2 ** k, i ** k, 3 ** k)):
        assert got.dtype == npdt and np.array_equal(got, ref)


def test_negative_integer_tensor_exponents_truncate():
    """NumPy raises for negative integer exponents; a kernel cannot, so a negative tensor
    exponent gives the truncated real power (1, +-1 or 0). A negative literal is a trace
    error, as in NumPy."""
    @kp.fusion
    def ineg(i: T[kp.i64, "n"], k: T[kp.i64, "n"]):
        return i ** k

    i = np.array([1, -1, -1, 2, 0, -3, 5, -2])
    k = np.array([-3, -3, -2, -1, 2, 3, 0, -7])
    assert Kernels(ineg)(i, k)[0].tolist() == [1, -1, 1, 0, 0, -27, 1, 0]

    @kp.fusion
    def lit(i: T[kp.i32, "n"]):
        return i ** -1

    with pytest.raises(kp.TraceError, match=r"pow: integers to negative integer powers .*"
                                            r"int32\[n\] \*\* -1"):
        lit.trace()


def test_out_of_range_integer_literals_are_trace_errors():
    """``int64 + 2**70`` compiled to ``+ 0`` and ``uint32 + -1`` wrapped silently; NumPy 2
    raises OverflowError for both."""
    @kp.fusion
    def wide(z: T[kp.i64, "n"]):
        return z + (1 << 70)

    @kp.fusion
    def neg(u: T[kp.u32, "n"]):
        return u + -1

    @kp.fusion
    def fits(u: T[kp.u32, "n"], i: T[kp.i32, "n"]):
        return u - 1, i + ((1 << 31) - 1) + -(1 << 31) + 1, i.astype(kp.f32) + (1 << 70)

    with pytest.raises(kp.TraceError, match=r"Python integer 1180591620717411303424 is out "
                                            r"of bounds for int64"):
        wide.trace()
    with pytest.raises(kp.TraceError, match=r"Python integer -1 is out of bounds for uint32"):
        neg.trace()
    u, i = np.array([1, 7], np.uint32), np.array([3, -4], np.int32)
    a, b, c = Kernels(fits)(u, i)
    assert a.tolist() == [0, 6] and b.tolist() == [3, -4]
    assert np.array_equal(c, i.astype(np.float32) + np.float32(2.0 ** 70))


@pytest.mark.parametrize("body,match", [
    (lambda x, z: kp.log(z), r"log: complex arguments are not supported \(got complex64\[n\]\)"),
    (lambda x, z: z ** 2.5, r"pow: complex powers support only integer exponents -8\.\.8 "
                            r"\(got complex64\[n\] \*\* complex64\[\]\)"),
    (lambda x, z: z ** z, r"pow: complex powers"),
    (lambda x, z: x.astype("float128"), r"astype of float32\[n\]: not a kernelpack dtype"),
    (lambda x, z: x + np.ones(3), r"cannot use array"),
    (lambda x, z: x.sum(axis="0"), r"sum: axis '0' must be an int"),
    (lambda x, z: x.sum().sum(axis=0), r"sum: axis 0 out of range for float32\[\]"),
])
def test_review_trace_errors(body, match):
    """Each used to pass the trace and fail later (a CompileError from codegen) or raise a raw
    TypeError/ZeroDivisionError."""
    @kp.fusion
    def f(x: T[kp.f32, "n"], z: T[kp.c64, "n"]):
        return body(x, z)

    with pytest.raises(kp.TraceError, match=match):
        f.trace()


def test_numpy_integer_axes_reduce():
    """``axis=np.int64(1)`` was rejected as "out of range"."""
    @kp.fusion
    def red(x: T[kp.f64, "a", "b", "c"]):
        return x.sum(axis=np.int64(1)), x.max(axis=(np.int32(0), -1), keepdims=True)

    x = np.random.default_rng(3).standard_normal((2, 3, 5))
    a, b = Kernels(red)(x)
    assert_close(a, x.sum(1), 1e-13, "sum")
    assert np.array_equal(b, x.max(axis=(0, 2), keepdims=True))


def test_complex_literal_fusion_compiles_deterministically():
    @kp.fusion
    def phase(x: T[kp.f32, "b", "q"]):
        k = kp.arange(1 << x.shape[1]).astype(kp.f32)
        return kp.exp(1j * k[None, :] * x.sum(axis=1, keepdims=True))

    first, again = (kp.save([kp.compile(phase, targets=["sm_80", "sm_90", "ptx"])])
                    for _ in range(2))
    assert first == again
    plan = kp.load(first)["phase"].plan((3, 4))
    assert [(a.shape, a.dtype) for a in plan.allocations.values()] == [((3, 16), kp.complex64)]


def test_casts_to_half_precision_round_once_like_numpy():
    """float16/bfloat16 compute in float32, and casts to them were no-ops until the store: a
    float64 source then rounded twice (float16(1 + 2**-11 + 2**-40) came out 1.0, not 1.001;
    65520 - 2**-30 became inf, not 65504), and ``y.astype(f16) * 2`` used the unrounded
    float32 value. A float literal beside a float16 tensor is NumPy's float16(literal)."""
    @kp.fusion
    def narrow(x: T[kp.f64, "n"], y: T[kp.f32, "n"], h: T[kp.f16, "n"]):
        return (x.astype(kp.f16), (y.astype(kp.f16) * 2).astype(kp.f32), h + 0.1,
                x.astype(kp.bf16))

    x = np.array([1 + 2**-11 + 2**-40, 1 + 2**-11 - 2**-40, 65520.0 - 2**-30, 2049.0 + 1e-9,
                  -(1 + 2**-11 + 2**-40), np.nan, 6e-8, 1e6])
    with np.errstate(all="ignore"):
        y = (x * 1.0001).astype(np.float32)
        h = x.astype(np.float16)
    a, b, c, d = Kernels(narrow)(x, y, h)
    with np.errstate(all="ignore"):
        assert np.array_equal(a, x.astype(np.float16), equal_nan=True)
        assert np.array_equal(b, (y.astype(np.float16) * np.float16(2)).astype(np.float32),
                              equal_nan=True)
        assert np.array_equal(c, h + np.float16(0.1), equal_nan=True)
    # bfloat16 keeps 8 significant bits: 1 + 2**-8 is the tie between 0x3f80 and 0x3f81
    v = np.array([1 + 2**-8 + 2**-40, 1 + 2**-8 - 2**-40, -(1 + 2**-8 + 2**-40), 1 + 2**-8])
    (bits,) = Kernels(_to_bf16)(v)
    assert bits.tolist() == [0x3F81, 0x3F80, 0xBF81, 0x3F80]
    assert d[0] == 0x3F80 and d[5] == 0x7FC0  # 1 + 2**-11 + 2**-40 is close to 1; NaN


@kp.fusion
def _to_bf16(x: T[kp.f64, "n"]):
    return x.astype(kp.bf16)


@pytest.mark.parametrize("cdt", [kp.complex64, kp.complex128], ids=["c64", "c128"])
def test_complex_division_keeps_range_like_numpy(cdt):
    """The textbook ``d*d + e*e`` denominator overflowed for complex64 divisors past ~1e19
    (quotients of 0 or NaN) and underflowed below ~1e-19; NumPy scales (Smith's algorithm)."""
    @kp.fusion
    def div(z: T[cdt, "n"], w: T[cdt, "n"]):
        return z / w

    npdt = np.dtype(cdt.name)
    z = np.array([1 + 1j, 1e20 + 1e20j, 3 - 4j, 1e-20 + 1e-20j, 2j, 1e30, 5 - 1j, 1 + 0j], npdt)
    w = np.array([1e20 + 1e20j, 1e20 - 1e19j, 1e-20 + 1e-21j, 1e-20 + 3e-20j, 1e-25j,
                  1e30 + 1e30j, 2 + 3j, 0j], npdt)
    with np.errstate(all="ignore"):
        ref = z.astype(np.complex128) / w.astype(np.complex128)
    (got,) = Kernels(div)(z, w)
    tol = 1e-6 if cdt == kp.complex64 else 1e-15
    finite = np.isfinite(ref)
    rel = np.abs(got[finite] - ref[finite]) / np.abs(ref[finite])
    assert np.all(rel <= tol), rel
    assert np.isinf(got[-1].real) and np.isnan(got[-1].imag)  # 1 / 0: (inf, nan), as NumPy


def test_numpy_scalars_are_weak_numbers_and_keyword_only_parameters_trace():
    """``np.float32(2) * x`` was a TraceError ("cannot use np.float32(2.0)"); a keyword-only
    parameter (after a bare ``*``) made the trace call fail with a raw TypeError."""
    @kp.fusion
    def f(x: T[kp.f32, "n"], *, i: T[kp.i32, "n"]):
        return np.float32(2) * x, np.int32(3) + i, np.complex64(1j) * x, x * np.float64(0.5)

    g = f.trace()
    assert [g.nodes[n].dtype for _, n in g.outputs] == [kp.f32, kp.i32, kp.c64, kp.f32]
    x, i = np.arange(5, dtype=np.float32), np.arange(5, dtype=np.int32)
    a, b, c, d = Kernels(f)(x, i)
    assert np.array_equal(a, 2 * x) and np.array_equal(b, i + 3)
    assert np.array_equal(c, 1j * x) and np.array_equal(d, x / 2)


@pytest.mark.parametrize("body,exc,match", [
    (lambda x: x.reshape(2, -1), AttributeError, r"traced tensors have no attribute 'reshape'"),
    (lambda x: x.T, AttributeError, r"no attribute 'T'"),
    (lambda x: x.shape[3], IndexError, r"shape index 3 out of range for a tensor of shape "
                                       r"\(n,\) \(rank 1\)"),
    (lambda x: len(x), TypeError, r"len\(\) of a traced tensor"),
    (lambda x: float(x), TypeError, r"float\(\) of a traced tensor"),
])
def test_python_protocol_misuse_is_a_trace_error(body, exc, match):
    """Raw AttributeError/IndexError/TypeError became TraceErrors that say what to use; the
    attribute and index ones stay AttributeError/IndexError too (``hasattr`` keeps working)."""
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return body(x)

    with pytest.raises(kp.TraceError, match=match) as info:
        f.trace()
    assert isinstance(info.value, exc) or exc is TypeError


def test_variadic_parameters_are_rejected():
    with pytest.raises(kp.TraceError, match=r"parameter 'xs' is variadic"):
        @kp.fusion
        def f(*xs: T[kp.f32, "n"]):
            return xs[0]


def test_pad_below_the_current_length_is_refused():
    """``kp.pad(x, size)`` with a size below the axis's length silently dropped elements; the
    plan checks it now (a constraint), and the trace where both lengths are fixed."""
    @kp.fusion
    def padded(x: T[kp.f32, "a", "m"], n: kp.i64):
        return kp.pad(x, 4), kp.pad(x, 1 << n, axis=0)

    prog = kp.load(kp.save([kp.compile(padded, targets=["sm_80"])]))["padded"]
    assert [a.shape for a in prog.plan((2, 3), 1).allocations.values()] == [(2, 4), (2, 3)]
    with pytest.raises(kp.ConstraintError, match=r"kp.pad: axis 1 padded to 4 must be at least "
                                                 r"its length m .*m=5"):
        prog.plan((2, 5), 1)
    with pytest.raises(kp.ConstraintError, match=r"axis 0 padded to 1 << n"):
        prog.plan((3, 3), 1)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    a, b = Kernels(padded)(x, 1)
    assert np.array_equal(a, np.pad(x, ((0, 0), (0, 1)))) and np.array_equal(b, x)

    @kp.fusion
    def short(x: T[kp.f32, 5]):
        return kp.pad(x, 3)

    with pytest.raises(kp.TraceError, match=r"pad: size 3 is below the length 5 of axis 0"):
        short.trace()


def test_comparisons_with_out_of_range_literals_are_exact():
    """``int32 == 3_000_000_000`` compared a wrapped constant (true for -1294967296); NumPy 2
    compares exactly, so the narrow tensor widens to int64 for such a literal."""
    @kp.fusion
    def cmp(i: T[kp.i32, "n"], u: T[kp.u32, "n"], b: T[kp.u8, "n"]):
        return i == 3000000000, 3000000000 > i, u > -1, u == -1, b < 256, i != -(1 << 40)

    i = np.array([0, -1294967296, 2**31 - 1, -(2**31)], np.int32)
    u = np.array([0, 1, 2**32 - 1, 7], np.uint32)
    b = np.array([0, 255, 3, 1], np.uint8)
    refs = (i == 3000000000, 3000000000 > i, u > -1, u == -1, b < 256, i != -(1 << 40))
    for got, ref in zip(Kernels(cmp)(i, u, b), refs):
        assert np.array_equal(got, ref)


def test_dims_with_floats_and_int_only_operators_become_traced_values():
    """``1.0 / x.shape[1]``, ``x.shape[1] * 0.5``, ``x.shape[1] ** 2`` and ``x.shape[0] & 1``
    were raw TypeErrors (an int64 expression has no float or ``/ ** &``); inside a fusion the
    dim is now a traced int64 value, as in ``x / x.shape[1]``; the float64 result is as weak
    as the Python float NumPy computes (float32 beside a float32 tensor). Outside a trace they
    stay TypeErrors."""

    @kp.fusion
    def dims(x: T[kp.f64, "n", "m"]):
        m, n = x.shape[1], x.shape[0]
        return x * (1.0 / m), x.sum(axis=1) / m, x * (m ** 2), x * (n & 1), x * (m * 0.5), \
            x * (2 / m)

    g = dims.trace()
    assert {g.nodes[nid].dtype for _, nid in g.outputs} == {kp.float64}
    x = np.random.default_rng(3).standard_normal((3, 5))
    refs = (x / 5, x.sum(axis=1) / 5, x * 25, x * 1, x * 2.5, x * 0.4)
    for k, (got, ref) in enumerate(zip(Kernels(dims)(x), refs)):
        assert_close(got, ref, 1e-12, f"output {k}")

    @kp.fusion
    def mixed(x: T[kp.f32, "n"]):
        return x * (1.0 / x.shape[0])  # a Python float in NumPy: weak beside float32

    g = mixed.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [kp.float32]
    n = kp.sym("n")
    for bad in (lambda: n / 2, lambda: n * 0.5, lambda: n ** 2, lambda: 1 & n):
        with pytest.raises(TypeError):
            bad()


def test_floor_and_ceil_of_integers_keep_their_dtype():
    """NumPy 2 keeps integer and bool dtypes through floor/ceil (they were float64 here)."""

    @kp.fusion
    def fc(i: T[kp.i32, "n"], b: T[kp.bool_, "n"], x: T[kp.f32, "n"]):
        return kp.floor(i), kp.ceil(i), kp.floor(b), kp.floor(x)

    g = fc.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [kp.int32, kp.int32, kp.bool_,
                                                           kp.float32]
    i = np.array([-3, 0, 7], dtype=np.int32)
    b = np.array([True, False, True])
    x = np.array([-1.5, 0.25, 2.0], dtype=np.float32)
    for got, ref in zip(Kernels(fc)(i, b, x), (np.floor(i), np.ceil(i), np.floor(b),
                                               np.floor(x))):
        assert np.array_equal(np.asarray(got), ref)
