"""Review 65b: mutation testing of the lowering's math and code generation entry points.

Commit mutated: a32d37265bbc7ae93403159da4aa6ddc76d3a960 (a copy of the tree, run with
PYTHONPATH on the copy's src, one mutant at a time, restored after each).
Mutated: src/kernelpack/lowering/mathops.py (M: every math op's lowering; review 59 mutated
only ``identity``), codegen.py (C), memory.py (D), and the casts the code generator calls in
irutil.py (X: ``convert``, ``_round_narrow``, ``_float_to_int``, ``to_storage``...; review 59's
I mutants were its dim arithmetic). Tests chosen by module, the nearest first, ``-x``, 300 s:
M001-M022 ran the emulator's math, semantics and codegen files (review 27's math, review 12's
scalar math, test_mathops, review 6/9/10/28's NumPy corners, casts and semantics, test_simt,
test_compile, the DSL reviews, pointwise groups, review 59's bounds, review 9's amplitudes,
review 4's dim scalars); M023-M149 a leaner set of the same (without test_compile,
pointwise groups, review 3's DSL, amplitudes, dim scalars), and every survivor of it then ran
those five files too (three died there, M053, M131, M140: test_compile's 16-byte accesses,
shift counts and fma). The D and four C mutants listed below were checked against this file on
a second copy; the suite's own run of D and C had reached only C01 when the review's time ran
out, and the X mutants were not run (the mutant table is in /tmp/r65b_tools, lost with the
machine: its rows are the docstrings here and the report).

Totals (written as the batches ran; final at the review's stop):
Totals so far: 146 of 243 mutants run (M 145, C 1, D 0, X 0); 109 killed by the suite, 25 killed
here, 12 equivalent, 0 survivors not yet judged; 97 not run by the suite (C 51, D 15, X 31).
Bugs: one latent (memory._align over-claimed alignment in mixed-width groups: fixed in
session 47) and one minor (float32 maximum/minimum of zeros of both signs: a choice kept for
speed, now documented in the README and pinned below).

Killed here: M006, M010, M012, M017, M018, M023, M024, M026, M034, M047, M060, M065, M083, M084,
M093, M116, M117, M130, M132, M133, M136, M139, M145, M146, M148 (each test's docstring names
its mutants).
Also killed here, each checked failing on its mutant (the suite did not run these): D01, D02, D03,
D04, D05, D09, D10, D11, D14, D16, C35, C39, C58, C59.

Equivalent (no test can fail on them):
- M009: the ``keep`` entry guards id(x) against reuse, but x is an operand of the sincos call in
  the function's IR, which keeps it alive as long as the entry.
- M019: without the shortcut a literal 0 real part takes exp(0 - 0) = 1 and scale 1: (1·c·1,
  1·s·1) is (c, s) exactly, and the special-value selects keep it (speed only).
- M022: ``x <= 0`` instead of ``x < 0`` negates 0 too: -0 is 0 for integers.
- M025: ``~`` of a bool xors with the i1 constant -1, which is 1: the same bit.
- M050: ``rsqrt`` as ``1 / sqrt``: the emulator's ``__nv_rsqrtf`` is that very formula, and on
  the GPU both forms are within 2 ulp (far inside 1e-5); speed only.
- M051: ``tan`` as ``sin / cos`` of one sincos: each part within an ulp, the quotient within ~3
  ulp (5e-16 relative in float64, 2e-7 in float32), inside the 1e-12 / 1e-5 the issue allows,
  with the same specials (±0, inf, NaN).
- M069: an unordered ``re > THRESHOLD`` differs only for a NaN real part, whose exp is NaN with
  or without the scaling.
- M081: with a NaN among |re|, |im| either order of the two gives NaN (or inf through the
  infinity select): the comment's "either way".
- M087: ``t·t + s·s`` with two roundings instead of one fma: at most an ulp more before the
  square root (1e-16 relative), and a part beside a negligible one still comes back exactly
  (fl(t²) + a negligible s² is fl(t²)).
- M100: under ``both`` the two parts of the divisor are zero: ``|d|`` and ``|e|`` are the same
  +0.
- M107: ``div`` is ``(x - fmod(x, y)) / y``, within an ulp or two of an integer: its fraction is
  never 0.5, so ``> 0.5`` and ``>= 0.5`` snap alike.
- M144: the element count is never negative: ``uitofp`` and ``sitofp`` give the same float.

Bug (latent, fixed in session 47): ``Memory._align`` claimed 16-byte alignment for lane 0 of
a narrower buffer in a pointwise kernel whose 16-byte groups are sized by a wider dtype.

The emulator links libdevice calls to the host's libm, so these tests check what the lowering
does around them (special values, signed zeros, NaN, scaling, rounding), not libdevice's ulps.
"""

from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline

from . import simt
from .simt import Kernels
from .test_review59_codegen_mutants import compiled

T = kp.Tensor
# parameter types (module-level names: ruff reads a string dim in an annotation as a name)
BOOL_N = T[kp.bool_, "n"]
C128_ABC = T[kp.c128, "a", "b", "c"]
C128_M = T[kp.c128, "m"]
C128_N = T[kp.c128, "n"]
C64_ABC = T[kp.c64, "a", "b", "c"]
C64_BN = T[kp.c64, "b", "n"]
C64_N = T[kp.c64, "n"]
F32_BN = T[kp.f32, "b", "n"]
F32_M = T[kp.f32, "m"]
F32_N = T[kp.f32, "n"]
F64_ABC = T[kp.f64, "a", "b", "c"]
F64_N = T[kp.f64, "n"]
I32_B8 = T[kp.i32, "b", 8]
I32_N = T[kp.i32, "n"]
I64_N = T[kp.i64, "n"]
I8_N = T[kp.i8, "n"]
U16_B8 = T[kp.u16, "b", 8]
U32_N = T[kp.u32, "n"]
U8_N = T[kp.u8, "n"]


def _ir(f: kp.fusion) -> str:
    """The fusion's LLVM IR for sm_80 (what the emulator and the PTX step start from)."""
    return str(pipeline.run(pipeline.new_build(f, ["sm_80"], None, {}), stop="llvm_ir").ir)


def _same_bits(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal values, NaN in the same places and zeros of the same sign (exact ops only)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert np.array_equal(got, ref, equal_nan=True), f"{what}: got {got}, NumPy {ref}"
    zero = (got == 0) & (ref == 0)
    assert (np.signbit(got[zero]) == np.signbit(ref[zero])).all(), \
        f"{what}: signs of zeros differ: got {got}, NumPy {ref}"


# ---- sin/cos share one sincos ------------------------------------------------------------------

@kp.fusion
def _sin_only(x: F32_N):
    return kp.sin(x)


@kp.fusion
def _sin_and_cos(x: F32_N):
    return kp.sin(x) * kp.cos(x)


def test_sin_and_cos_of_one_value_share_one_sincos_call():
    """Kills M006 (each ``sin``/``cos`` with its own ``sincos`` call): ``sin(x) * cos(x)``
    must make as many argument reductions as ``sin(x)`` alone; the mutant doubles them, and
    a user sees the rotary embeddings and quantum encodings (sin and cos of one angle per
    element) run slower."""
    one, both = (len(re.findall(r'call void @"__nv_sincosf"', _ir(f)))
                 for f in (_sin_only, _sin_and_cos))
    assert one > 0 and both == one, (one, both)


# ---- exp2/log2 of powers of two are exact ------------------------------------------------------

@kp.fusion
def _powers_of_two(x: F64_N, k: F64_N, a: F32_M, j: F32_M):
    return kp.log2(x), kp.exp2(k), kp.floor(kp.log2(x)), kp.log2(a), kp.exp2(j)


def test_log2_and_exp2_of_powers_of_two_are_exact():
    """Kills M047 (``log2(x)`` as ``log(x) / ln 2``: ``log2(2**29)`` came out
    28.999999999999996, so ``floor(log2(x))``, a bit width, was 28) and M048 (``exp2(k)`` as
    ``exp(k · ln 2)``: ``exp2(100)`` off in the last bits). NumPy (and libdevice) give these
    exactly, float32 and float64."""
    ks = np.arange(-60, 61, dtype=np.float64)
    x = np.exp2(ks)
    ks32 = np.arange(-30, 31, dtype=np.float32)
    got = compiled(_powers_of_two)(x, ks, np.exp2(ks32), ks32)
    refs = (ks, x, ks, ks32, np.exp2(ks32))
    for g, r, what in zip(got, refs, ["log2", "exp2", "floor(log2)", "log2 f32", "exp2 f32"]):
        _same_bits(g, r, what)


@kp.fusion
def _sqrt_both(x: F64_N, a: F32_N):
    return kp.sqrt(a), kp.sqrt(x), kp.sqrt(a).astype(kp.f64) + kp.sqrt(x)


def test_float32_and_float64_square_roots_in_one_module():
    """Kills M034 (float64 ``sqrt`` sent through the float32 intrinsic): alone LLVM renames
    the intrinsic after its argument type, but beside a float32 ``sqrt`` in the same module
    the declaration is float32's and the float64 call cannot be built (the user's compile
    fails). Both correctly rounded (IEEE ``sqrt.rn``)."""
    x = np.array([2.0, 5.0, 0.0, -0.0, np.inf, 1e-310, 1e300, -1.0])
    with np.errstate(over="ignore"):
        a = x.astype(np.float32)  # 1e300 is inf in float32
    r32, r64, mixed = compiled(_sqrt_both)(x, a)
    with np.errstate(invalid="ignore", over="ignore"):
        _same_bits(r32, np.sqrt(a), "sqrt float32")
        _same_bits(r64, np.sqrt(x), "sqrt float64")
        _same_bits(mixed, np.sqrt(a).astype(np.float64) + np.sqrt(x), "sum")


# ---- signed zeros, NaN and division by zero of float ops ---------------------------------------

@kp.fusion
def _float_corners(x: F64_N, y: F64_N, a: F32_N, b: F32_N):
    return (-x, kp.maximum(x, y), kp.minimum(x, y), x // y, x % y, x / y,
            -a, a // b, a % b, a / b)


def test_float_ops_keep_numpys_signed_zeros_nans_and_division_by_zero():
    """Kills M028 (``-x`` as ``0 - x``: ``-(0.0)`` gave +0.0), M060 (float64 max/min with
    ``>=``: ``maximum(-0.0, 0.0)`` gave -0.0 where NumPy takes the second operand, 0.0),
    M102 (an ordered ``mod != 0``: ``inf % 3`` and ``x % 0`` gave 0 instead of NaN), M105
    (a zero remainder without the divisor's sign: ``3.0 % -3.0`` gave 0.0, NumPy -0.0), M109
    (a zero quotient as ``floor`` of it: ``-1.0 // -3.0`` gave -0.0, NumPy 0.0), M110
    (``x // 0`` through fmod: NaN where NumPy gives ±inf), M053 (``x / y`` as ``x * (1/y)``:
    the last bit off, and inf for a subnormal divisor), M101 (the quotient as ``x / y``:
    ``10.0 // 0.1`` gave 100, NumPy 99), M108 (the quotient not snapped to the nearest
    integer: ``-1.2654214710460525 // -0.03116344838893499`` gave 39, NumPy 40). Exact ops:
    compared bit for bit."""
    # the last four: (x - fmod(x, y)) / y just below an integer (39.99999999999999 in float64,
    # 5.9999995 in float32), which the quotient snaps up to as NumPy's npy_divmod does
    f32 = [float(np.float32(v)) for v in (-4.261922, -0.7073163, 8.237985, 0.017037448)]
    xs = [0.0, -0.0, 3.0, -1.0, 1.0, np.inf, 1.0, -1.0, 0.0, 7.0, 1e-300, 10.0, 1.0, 2.5,
          np.nan, -0.0, -1.2654214710460525, 1.5139237747390626, f32[0], f32[2]]
    ys = [-0.0, 0.0, -3.0, -3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 49.0, 5e-324, 0.1, 49.0, np.nan,
          1.0, -0.0, -0.03116344838893499, -0.012646019073257513, f32[1], f32[3]]
    x, y = np.array(xs), np.array(ys)
    a, b = x.astype(np.float32), np.where(y == 5e-324, 1e-45, y).astype(np.float32)
    got = compiled(_float_corners)(x, y, a, b)
    with np.errstate(all="ignore"):
        refs = (-x, np.maximum(x, y), np.minimum(x, y), x // y, x % y, x / y,
                -a, a // b, a % b, a / b)
    names = ["-x", "maximum", "minimum", "//", "%", "/", "-a", "// f32", "% f32", "/ f32"]
    for g, r, what in zip(got, refs, names):
        _same_bits(g, r, what)


# ---- a value's sincos stays in the scope that computed it ---------------------------------------

@kp.fusion
def _scalar_angle_rows(x: F32_BN, s: kp.f32):
    y = x * kp.sin(s) + kp.cos(s)
    return y - y.max(axis=1, keepdims=True), (x * kp.cos(s)).sum(axis=1)


def test_sin_of_a_scalar_in_two_loops_of_one_kernel():
    """Kills M010 (a ``sincos`` remembered in the kernel's outermost scope instead of the
    current one): ``sin(s)`` of a scalar parameter is computed inside one loop of a row
    kernel and again inside the next; reused, the second loop names values of the first
    loop's blocks, and LLVM refuses the IR (the user's compile fails)."""
    x = np.linspace(-3, 3, 2 * 37, dtype=np.float32).reshape(2, 37)
    s = np.float32(0.7)
    y = x.astype(np.float64) * np.sin(0.7) + np.cos(0.7)
    got = compiled(_scalar_angle_rows)(x, s)
    np.testing.assert_allclose(got[0], y - y.max(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], (x.astype(np.float64) * np.cos(0.7)).sum(axis=1),
                               rtol=1e-5, atol=1e-5)


# ---- integer // and % by zero and by -1 --------------------------------------------------------

@kp.fusion
def _int_division(u: U32_N, d: U32_N, a: I64_N, e: I64_N,
                  b: U8_N):
    return (u // d, u % d, a // e, a % e, u // 0, u % 0, a // -1, a % -1, a // 0, a % 0,
            b // 0, b % 3)


def test_integer_division_by_zero_and_minus_one_is_numpys():
    """Kills M115-M118 and M123-M125 (the guards of integer ``//`` and ``%``: NumPy gives 0
    for ``x // 0`` and ``x % 0`` of every integer type, ``-x`` (wrapping) for ``x // -1`` and
    0 for ``x % -1``; unguarded, the x86 host traps on a division by zero or on
    ``INT64_MIN // -1``, and the GPU gives what its division gives); tensor divisors and
    literal ones, unsigned and signed."""
    u = np.array([7, 2**32 - 1, 0, 5, 2**31, 9], np.uint32)
    d = np.array([0, 0, 0, 2, 3, 2**32 - 1], np.uint32)
    a = np.array([7, -7, -2**63, -2**63, 0, 2**63 - 1], np.int64)
    e = np.array([0, -1, -1, 0, -1, 2], np.int64)
    b = np.array([200, 0, 255, 1, 3, 17], np.uint8)
    got = compiled(_int_division)(u, d, a, e, b)
    with np.errstate(all="ignore"):
        refs = (u // d, u % d, a // e, a % e, u // np.uint32(0), u % np.uint32(0), a // -1,
                a % -1, a // 0, a % 0, b // np.uint8(0), b % np.uint8(3))
    for k, (g, r) in enumerate(zip(got, refs)):
        _same_bits(g, r, f"division output {k}")


# ---- in-range shifts, complex means, compensated sums -----------------------------------------

@kp.fusion
def _in_range_shifts(x: I32_B8, u: U16_B8):
    k = kp.arange(8).astype(kp.i32)
    return x >> k[None, :], x << k[None, :], u >> k.astype(kp.u16)[None, :]


def test_shifts_by_counts_known_in_range_keep_the_sign():
    """Kills M132 (the unguarded shift for counts known to be below the width, ``x >>
    arange(8)``, made logical for signed values: ``-8 >> 1`` gave 2147483644, NumPy -4)."""
    x = np.array([[-8] * 8, [-2**31] * 8, [12345] * 8], np.int32)
    u = np.array([[65535] * 8, [32768] * 8, [7] * 8], np.uint16)
    k = np.arange(8, dtype=np.int32)[None, :]
    got = compiled(_in_range_shifts)(x, u)
    refs = (x >> k, x << k, u >> k.astype(np.uint16))
    for g, r, what in zip(got, refs, [">>", "<<", "u16 >>"]):
        _same_bits(g, r, what)


@kp.fusion
def _unsigned_shifts(u: U32_N, s: U32_N):
    return u >> s, u << s


def test_unsigned_shifts_by_the_width_or_more_give_zero():
    """Kills M130 (an unsigned ``>>`` by the width or more left unguarded: LLVM's poison,
    which x86 computes as a shift by the count mod 32, ``0xFFFFFFFF >> 40`` gave 16777215;
    NumPy gives 0)."""
    u = np.array([2**32 - 1, 2**31, 12345, 7, 2**32 - 1, 1], np.uint32)
    s = np.array([40, 32, 33, 63, 31, 0], np.uint32)
    hi, lo = compiled(_unsigned_shifts)(u, s)
    _same_bits(hi, u >> s, ">>")
    _same_bits(lo, u << s, "<<")


@kp.fusion
def _complex_means(z: C128_ABC, w: C64_ABC):
    return z.mean(axis=(0, 2)), z.mean(axis=2), w.mean(axis=(0, 2)), z.mean()


@kp.fusion
def _long_sums(x: F64_ABC):
    return x.sum(axis=(0, 2)), x.mean(axis=(0, 2))


def test_complex_means_and_compensated_sums():
    """Kills M145 (a complex mean dividing only the real part by the count) and M146/M148
    (the fallback loop's Neumaier compensation taken from the wrong branch, or not
    accumulated): one thread sums 10^5 float64 terms over axes (0, 2), where a plain running
    sum drifts ~1e-11 from the exact one; with the compensation it stays within 1e-14 (NumPy's
    pairwise sum within 1e-12, the issue's float64 tolerance)."""
    rng = np.random.default_rng(6565)
    z = rng.standard_normal((3, 4, 5)) + 1j * rng.standard_normal((3, 4, 5))
    w = z.astype(np.complex64)
    got = compiled(_complex_means)(z, w)
    refs = (z.mean(axis=(0, 2)), z.mean(axis=2), w.astype(np.complex128).mean(axis=(0, 2)),
            z.mean())
    for k, (g, r) in enumerate(zip(got, refs)):
        tol = 1e-6 if k == 2 else 1e-12
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol, err_msg=f"mean {k}")
    x = np.full((100, 2, 1000), 0.1)
    x[::3, :, ::7] = 3.3
    s, m = compiled(_long_sums)(x)
    exact = np.array([math.fsum(x[:, j, :].ravel()) for j in range(2)])
    np.testing.assert_allclose(s, exact, rtol=1e-14, atol=0)
    np.testing.assert_allclose(m, exact / 1e5, rtol=1e-14, atol=0)
    np.testing.assert_allclose(s, x.sum(axis=(0, 2)), rtol=1e-12, atol=0)


def test_compensated_sums_of_infinite_terms_stay_infinite():
    """Kills C39/C58 (the fallback loop's total taken with its compensation even where that is
    NaN): an infinite term makes Neumaier's compensation ``inf - inf``, so the sum of a row
    holding ``inf`` came out NaN, NumPy inf (and -inf, and NaN only where NumPy has one)."""
    x = np.full((3, 2, 5), 0.5)
    x[1, 0, 2] = np.inf
    x[2, 1, 4] = -np.inf
    s, m = compiled(_long_sums)(x)
    _same_bits(s, x.sum(axis=(0, 2)), "sum with inf")
    _same_bits(m, x.mean(axis=(0, 2)), "mean with inf")
    y = x.copy()
    y[0, 1, 0] = np.inf
    with np.errstate(invalid="ignore"):
        _same_bits(compiled(_long_sums)(y)[0], y.sum(axis=(0, 2)), "inf - inf")


@kp.fusion
def _padded(x: F32_BN, z: C128_M):
    return kp.pad(x, x.shape[1] + 3) * 2.0 - 1.0, kp.pad(z, z.shape[0] + 2)


def test_padded_elements_are_zero():
    """Kills C59 (``zero_unless`` filling with 1: the padded elements came out 1) and C35
    (the pad's bound ``<=``: the first padded element read one past the row, the next
    row's first value or past the buffer). NumPy's ``np.pad`` with zeros."""
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    z = np.array([1 + 2j, -3 + 0.5j, 4j])
    a, c = compiled(_padded)(x, z)
    np.testing.assert_array_equal(a, np.pad(x, ((0, 0), (0, 3))) * np.float32(2) - 1)
    np.testing.assert_array_equal(c, np.pad(z, (0, 2)))


# ---- complex: exp of a literal real part, division scaled by the larger part -------------------

@kp.fusion
def _cexp_literal(y: F64_N):
    return kp.exp(kp.complex(1.0, y)), kp.exp(kp.complex(0.0, y))


def test_complex_exp_of_a_literal_real_part():
    """Kills M018 (the shortcut for ``exp`` of a purely imaginary value taken for a literal
    real part of 1.0): ``kp.exp(kp.complex(1.0, y))`` gave ``cos y + i sin y``, without the
    factor e; M017 (that shortcut's parts swapped: ``kp.exp(kp.complex(0.0, y))`` gave
    ``sin y + i cos y``)."""
    y = np.array([0.0, -0.0, 0.5, -2.0, 3.0, 100.0])
    one, zero = compiled(_cexp_literal)(y)
    for got, ref, what in ((one, np.exp(1.0 + 1j * y), "exp(1+iy)"),
                           (zero, np.exp(1j * y), "exp(iy)")):
        np.testing.assert_allclose(got.real, ref.real, rtol=1e-12, atol=1e-300, err_msg=what)
        np.testing.assert_allclose(got.imag, ref.imag, rtol=1e-12, atol=1e-300, err_msg=what)


@kp.fusion
def _cneg(z: C128_N, w: C64_N):
    return -z, -w


def test_negated_complex_values_negate_both_parts():
    """Kills M012 (``-z`` negating only the real part): ``-(1+2j)`` gave ``-1+2j``; the
    signs of zero parts flip too, as NumPy's."""
    z = np.array([1 + 2j, complex(-0.0, 0.0), complex(3.0, -0.0), complex(np.inf, np.nan)])
    w = z.astype(np.complex64)
    for got, ref in zip(compiled(_cneg)(z, w), (-z, -w)):
        _same_bits(got.real, ref.real, "-z real")
        _same_bits(got.imag, ref.imag, "-z imag")


@kp.fusion
def _cdiv(z: C128_N, d: C128_N, w: C64_N, e: C64_N):
    return z / d, w / e


def test_complex_division_scales_by_the_larger_part_of_the_divisor():
    """Kills M095 (Smith's division scaled by the smaller part of the divisor): with parts
    far apart (``1e200 + 1e-200j``) the ratio of the parts overflows and the quotient came
    out NaN (complex128; complex64 from 1e20 on) where NumPy gives a finite value."""
    z = np.array([1 + 1j, 3 - 2j, 1e100 + 1j, -2 + 5j])
    d = np.array([1e200 + 1e-200j, 1e-200 + 1e200j, 2 + 1e-300j, 4e-310 + 3.0j])
    w = np.array([1 + 1j, 3 - 2j, 1e10 + 1j, -2 + 5j], np.complex64)
    e = np.array([1e20 + 1e-20j, 1e-20 + 1e20j, 2 + 1e-30j, 4e-40 + 3.0j], np.complex64)
    q128, q64 = compiled(_cdiv)(z, d, w, e)
    for got, ref, tol in ((q128, z / d, 1e-12), (q64, w / e, 1e-5)):
        assert np.isfinite(got).all(), got
        np.testing.assert_allclose(got.real, ref.real, rtol=tol, atol=0)
        np.testing.assert_allclose(got.imag, ref.imag, rtol=tol, atol=0)


@kp.fusion
def _ceq(z: C128_N, w: C128_N, u: C64_N, v: C64_N):
    return z == w, z != w, u == v, u != v, z * w, z - w


def test_complex_equality_products_and_differences_are_numpys():
    """Kills M092 (complex ``==`` true when either part agrees), M093 (``!=`` false for a
    NaN real part) and the product/difference mutants M090, M091, M094 (a sign flipped in
    one part)."""
    z = np.array([1 + 2j, 1 + 2j, 1 + 2j, complex(np.nan, 1), complex(1, np.nan), 3 - 4j,
                  complex(-0.0, 0.0)])
    w = np.array([1 + 2j, 1 + 3j, 5 + 2j, complex(np.nan, 1), complex(1, 2), -2 + 0.5j,
                  complex(0.0, -0.0)])
    u, v = z.astype(np.complex64), w.astype(np.complex64)
    got = compiled(_ceq)(z, w, u, v)
    refs = (z == w, z != w, u == v, u != v, z * w, z - w)
    for k, (g, r) in enumerate(zip(got, refs)):
        if r.dtype.kind == "c":
            np.testing.assert_array_equal(g.real, r.real, err_msg=f"output {k} real")
            np.testing.assert_array_equal(g.imag, r.imag, err_msg=f"output {k} imag")
        else:
            np.testing.assert_array_equal(g, r, err_msg=f"output {k}")


@kp.fusion
def _cabs(z: C128_N):
    return abs(z)


def test_complex128_abs_between_the_scaling_thresholds():
    """Kills M083/M084 (the scaling of ``|z|`` starting at 2^600 / below 2^-600 instead of
    2^500 / 2^-500): parts between 1e151 and 1e180 squared overflow to inf (``|1e170 +
    1e170j|`` came out inf) and parts between 1e-180 and 1e-151 squared underflow to 0
    (``|1e-170 + 1e-170j|`` came out 0). NumPy: 1.414e170 and 1.414e-170."""
    z = np.array([1e170 + 1e170j, 3e160 + 4e160j, 1e-170 + 1e-170j, 3e-160 - 4e-160j,
                  1e155 + 1j, -1e-155 + 0j, 2.0 ** 550 + 2.0 ** 549 * 1j])
    got = compiled(_cabs)(z)[0]
    np.testing.assert_allclose(got, np.abs(z), rtol=1e-15, atol=0)


# ---- NaN in comparisons -------------------------------------------------------------------------

@kp.fusion
def _compares(x: F32_N, y: F32_N, a: F64_N, b: F64_N):
    return (x < y, x <= y, x > y, x >= y, x == y, x != y,
            a < b, a <= b, a > b, a >= b, a == b, a != b)


def test_comparisons_with_nan_and_equal_values_are_numpys():
    """Kills M062 (``!=`` ordered: ``nan != 1`` was False), M063 (the other comparisons
    unordered: ``nan < 1`` was True), M064/M065 (``<=``/``>=`` as ``<``/``>``: equal values
    compared False)."""
    xs = [1.0, 2.0, np.nan, 1.0, np.nan, -0.0, np.inf, -np.inf]
    ys = [1.0, 1.0, 1.0, np.nan, np.nan, 0.0, np.inf, 3.0]
    x, y = np.array(xs, np.float32), np.array(ys, np.float32)
    a, b = x.astype(np.float64), y.astype(np.float64)
    got = compiled(_compares)(x, y, a, b)
    refs = (x < y, x <= y, x > y, x >= y, x == y, x != y, a < b, a <= b, a > b, a >= b,
            a == b, a != b)
    for k, (g, r) in enumerate(zip(got, refs)):
        np.testing.assert_array_equal(g, r, err_msg=f"comparison {k}")


# ---- integers: abs, negation, invert ----------------------------------------------------------

@kp.fusion
def _int_unary(a: I8_N, u: U8_N, q: I64_N, p: BOOL_N):
    return abs(a), abs(u), -a, ~a, abs(q), -q, ~u, ~p


def test_integer_abs_negation_and_invert_are_numpys():
    """Kills M023 (integer ``abs`` negating the positive values: ``abs(5)`` gave -5), M024
    (unsigned ``abs`` through the signed compare: ``abs(uint8(200))`` gave 56) and the
    neighbouring negation/invert mutants (M021, M026): wrapping at the smallest value as
    NumPy (``abs(int8(-128))`` is -128)."""
    a = np.array([5, -5, 0, 127, -128, -1, 1, 100], np.int8)
    u = np.array([200, 0, 255, 128, 127, 1, 3, 90], np.uint8)
    q = np.array([2**62, -2**63, -7, 0, 7, -1, 2**40, -2**40], np.int64)
    p = np.array([True, False, True, True, False, False, True, False])
    got = compiled(_int_unary)(a, u, q, p)
    with np.errstate(all="ignore"):
        refs = (np.abs(a), np.abs(u), -a, ~a, np.abs(q), -q, ~u, ~p)
    for g, r, what in zip(got, refs, ["abs i8", "abs u8", "-i8", "~i8", "abs i64", "-i64",
                                      "~u8", "~bool"]):
        _same_bits(g, r, what)


# ---- integers: shifts past the width, unsigned order, powers ------------------------------------

@kp.fusion
def _int_corners(a: I32_N, s: I32_N, u: U8_N, v: U8_N,
                 e: I32_N, f: U8_N):
    return (a >> s, u < v, u <= v, u > v, u >= v, kp.maximum(u, v), kp.minimum(u, v),
            a ** e, u ** f)


def test_integer_shifts_orders_and_powers_are_numpys():
    """Kills M129 (an arithmetic ``>>`` by the width or more taken as one by width - 2:
    ``2**30 >> 40`` gave 1, NumPy 0), M113/M114 (unsigned comparisons and max/min signed:
    ``200 < 100`` was True for uint8), M133/M139 (the top exponent bits dropped from integer
    powers: ``3 ** (2**30 + 1)`` in int32 and ``3 ** 129`` in uint8 wrap differently),
    M136-M138 (negative integer exponents: NumPy refuses them for arrays; the kernel gives the
    truncated real power, 1 for 1, ±1 for -1, 0 otherwise)."""
    a = np.array([2**30, -2**30, 2**30 + 5, -7, 3, 3, 1, -1, -1, 2, 0, 1], np.int32)
    s = np.array([40, 40, 31, 32, 33, -1, 0, 1, 2, 5, 31, 30], np.int32)
    e = np.array([2**30 + 1, 2**30, 2**30 + 3, 7, 2**30 + 1, -1, -5, -3, -4, -1, 3, 2],
                 np.int32)
    u = np.array([200, 100, 255, 0, 128, 3, 3, 7, 1, 2, 9, 250], np.uint8)
    v = np.array([100, 200, 0, 255, 127, 3, 129, 200, 7, 128, 4, 250], np.uint8)
    f = np.array([129, 255, 128, 3, 200, 0, 129, 200, 7, 128, 4, 250], np.uint8)
    got = compiled(_int_corners)(a, s, u, v, e, f)
    # NumPy refuses negative exponents: the truncated real power of the docstring instead
    trunc = np.where(a == 1, 1, np.where(a == -1, np.where(e % 2 == 1, -1, 1), 0))
    with np.errstate(all="ignore"):
        pos = np.power(a, np.where(e < 0, 0, e))
    refs = (np.right_shift(a, s), u < v, u <= v, u > v, u >= v, np.maximum(u, v),
            np.minimum(u, v), np.where(e < 0, trunc, pos).astype(np.int32), u ** f)
    names = [">>", "<", "<=", ">", ">=", "maximum", "minimum", "int32 **", "uint8 **"]
    for g, r, what in zip(got, refs, names):
        _same_bits(g, r, what)


# ---- buffers aligned to less than 16 bytes (views of larger buffers) ---------------------------

# Every load and store that claims an alignment checks it at run time (the host forgives what
# the GPU faults on: a 16-byte ld.v4 or a complex st.v2 at an address it does not divide)
_ACCESS = re.compile(r'^(\s*)((?:%\S+ = )?(?:load|store) .*ptr (%"[^"]+"|%[\w.]+), align (\d+))$',
                     re.M)
_CHECK = """
@kp_misaligned = global i64 0
define void @kp_align_check(ptr %p, i64 %n) {
  %a = ptrtoint ptr %p to i64
  %m = sub i64 %n, 1
  %low = and i64 %a, %m
  %bad = icmp ne i64 %low, 0
  br i1 %bad, label %no, label %ok
no:
  %o = atomicrmw add ptr @kp_misaligned, i64 1 monotonic
  ret void
ok:
  ret void
}
"""


def _checked(f: kp.fusion) -> tuple[Kernels, ctypes.c_int64]:
    """``f`` for the emulator with every aligned access checked first, and the count of
    accesses whose address the claimed alignment did not divide."""
    k = Kernels(f)
    text = _ACCESS.sub(lambda m: f"{m[1]}call void @kp_align_check(ptr {m[3]}, i64 {m[4]})\n"
                                 f"{m[1]}{m[2]}", k._ir) + _CHECK
    k._native = simt._Jit(text, k._kernels, native=True)
    count = ctypes.c_int64.from_address(k._native.engine.get_global_value_address(
        "kp_misaligned"))
    return k, count


def _offset_copy(arr: np.ndarray, shift: int) -> np.ndarray:
    """``arr``'s values in a new array whose data starts ``shift`` bytes past a 64-byte
    boundary (a view into a larger buffer, as a user's ``x[1:]`` or a complex view of a
    float buffer is)."""
    raw = np.zeros(arr.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift
    out = raw[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


@kp.fusion
def _misaligned(z: C64_N, x: F32_N, y: F64_N):
    return z * 2 + 1j, x * 3.0 + 1.0, y - 0.5


@kp.fusion
def _misaligned_rows(z: C64_BN, x: F32_BN):
    return z - z.sum(axis=1, keepdims=True), x * x.max(axis=1, keepdims=True)


@kp.fusion
def _one_width(x: F32_BN, w: F32_N):
    return x * w + 1.0, x - w


@kp.fusion
def _one_width_complex(z: C64_BN, v: C64_N):
    return z * v - 1j


def _shifted(k: Kernels, shifts: dict):  # type: ignore[no-untyped-def]
    """A launcher for :meth:`Kernels.run` that moves every buffer ``shifts[dtype]`` bytes
    past a 64-byte boundary first."""
    def launch(launch, buffers: dict, values: dict, plan) -> None:  # type: ignore[no-untyped-def]
        for name, arr in list(buffers.items()):
            buffers[name] = _offset_copy(arr, shifts[arr.dtype])
        k._launch(launch, buffers, values)
    return launch


def _run_mixed(shifts: tuple[int, int, int]) -> int:
    """``_misaligned`` (pointwise) and ``_misaligned_rows`` with complex64, float32 and
    float64 buffers ``shifts`` bytes past a 16-byte boundary: the values checked, and the
    number of accesses whose claimed alignment did not hold."""
    size = dict(zip(map(np.dtype, (np.complex64, np.float32, np.float64)), shifts))
    k, bad = _checked(_misaligned)
    n = 45
    z = (np.arange(n) - 1j * np.arange(n)[::-1]).astype(np.complex64)
    x = np.linspace(-4, 4, n, dtype=np.float32)
    y = np.linspace(-9, 9, n)
    a, b, c = k.run((z, x, y), _shifted(k, size))
    np.testing.assert_array_equal(a, z * np.complex64(2) + np.complex64(1j))
    np.testing.assert_array_equal(b, x * np.float32(3) + np.float32(1))
    np.testing.assert_array_equal(c, y - 0.5)
    kr, bad_rows = _checked(_misaligned_rows)
    zr, xr = z[:44].reshape(4, 11), x[:44].reshape(4, 11)
    d, e = kr.run((zr, xr), _shifted(kr, size))
    np.testing.assert_allclose(d, zr - zr.astype(np.complex128).sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(e, xr * xr.max(1, keepdims=True), rtol=1e-6)
    return int(bad.value + bad_rows.value)


@pytest.mark.parametrize("shifts", [(4, 4, 8), (8, 8, 8), (8, 4, 0), (0, 8, 8)], ids=str)
def test_buffers_aligned_to_less_than_16_bytes_take_the_element_paths(shifts):
    """Kills D10 (a complex element stored part by part writing its imaginary part over the
    real one), D01/D02/D14 (the 16-byte paths taken for buffers aligned to 8 bytes: the mask
    7, the addresses and-ed, only the first buffer checked) and D03/D09 (a complex
    ``st.v2`` where the buffer is aligned to its part, not its element). Buffers start 4 or 8
    bytes past a 16-byte boundary (``shifts``: complex64, float32, float64), as views of
    larger buffers do; on the GPU an access whose claimed alignment does not hold is a
    misaligned-address fault (the host forgives it: here each one checks its address)."""
    assert _run_mixed(shifts) == 0


def test_accesses_of_16_byte_groups_claim_only_what_they_have():
    """Kills D04 (a broadcast input, not contiguous, loaded with a 16-byte group's alignment)
    and D05/D11/D16 (a complex part or element claiming the alignment of the next one): all
    buffers 16-byte aligned, every buffer of one width (see the test below for mixed
    widths), each access's claim checked at its address."""
    x = np.linspace(-3, 3, 3 * 10, dtype=np.float32).reshape(3, 10)
    w = np.linspace(1, 2, 10, dtype=np.float32)
    z = (x + 1j * x[::-1]).astype(np.complex64)
    v = (w - 2j * w).astype(np.complex64)
    aligned = {np.dtype(np.float32): 0, np.dtype(np.complex64): 0}
    k, bad = _checked(_one_width)
    a, b = k.run((x, w), _shifted(k, aligned))
    np.testing.assert_array_equal(a, x * w + np.float32(1))
    np.testing.assert_array_equal(b, x - w)
    kc, bad_complex = _checked(_one_width_complex)
    (c,) = kc.run((z, v), _shifted(kc, aligned))
    np.testing.assert_allclose(c, z * v - np.complex64(1j), rtol=1e-6)
    assert bad.value == 0 and bad_complex.value == 0, (bad.value, bad_complex.value)


def test_narrower_buffers_of_a_mixed_width_group_claim_only_their_alignment():
    """Bug found here (latent), fixed in session 47: a pointwise kernel's 16-byte groups hold
    ``16 / widest itemsize`` elements (2 when a complex64 or float64 buffer is there), so a
    float32 buffer's group starts 8 bytes past a 16-byte boundary every other group;
    ``Memory._align`` computed ``gcd(16, lane · itemsize)`` as if each buffer's group were 16
    bytes and claimed ``align 16`` for lane 0 of the float32 buffer (``x * 3.0 + 1.0`` beside
    a complex64 output). LLVM IR makes a wrong claim undefined behaviour; the PTX merged those
    lanes into ``v2`` accesses only (8-byte aligned, no fault), so nothing showed. Now the
    claim is ``gcd(16, group span, offset)`` (the PTX of 250 fusions is byte-identical). All
    buffers 16-byte aligned here."""
    assert _run_mixed((0, 0, 0)) == 0


@kp.fusion
def _f32_extremes(x: F32_N, y: F32_N):
    return kp.maximum(x, y), kp.minimum(x, y)


@kp.fusion
def _f64_extremes(x: F64_N, y: F64_N):
    return kp.maximum(x, y), kp.minimum(x, y)


def test_maximum_and_minimum_of_zeros_of_both_signs_are_as_documented():
    """Finding (minor, kept and documented in the README): float32 ``kp.maximum(0.0, -0.0)``
    is ``+0.0`` where NumPy gives ``-0.0`` (its maximum returns the second operand when
    neither is greater), and ``kp.minimum(-0.0, 0.0)`` is ``-0.0`` where NumPy gives
    ``+0.0``: ``llvm.maximum``/``llvm.minimum`` (one ``max.NaN.f32`` on sm_80, the reason it
    is used: softmax's row max) order -0 below +0, as IEEE 754-2019's maximum/minimum do.
    float64 takes the compare-and-select form and returns the second of equal operands, as
    NumPy does. Only the sign of a zero differs (seen through ``1 / x``, ``copysign``)."""
    x = np.array([0.0, -0.0, 0.0, -0.0], np.float32)
    y = np.array([-0.0, 0.0, 0.0, -0.0], np.float32)
    mx, mn = compiled(_f32_extremes)(x, y)
    _same_bits(mx, np.array([0.0, 0.0, 0.0, -0.0], np.float32), "float32 maximum")
    _same_bits(mn, np.array([-0.0, -0.0, 0.0, -0.0], np.float32), "float32 minimum")
    mx, mn = compiled(_f64_extremes)(x.astype(np.float64), y.astype(np.float64))
    _same_bits(mx, np.maximum(x, y).astype(np.float64), "float64 maximum")
    _same_bits(mn, np.minimum(x, y).astype(np.float64), "float64 minimum")
