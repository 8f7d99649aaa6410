"""Numerics of the generated kernels on the CPU, through the SIMT emulator (:mod:`.simt`).

The same LLVM IR that becomes PTX runs here with real cooperative semantics (warp shuffles,
barriers), so every schedule — pointwise with and without 16-byte groups, thread/warp/block
rows, two-launch full reductions, the general fallback — is checked against NumPy in float64
on machines without a GPU. Sizes stay small: every emulated GPU thread of a kernel with barriers
or shuffles is an OS thread.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering.workloads import REFERENCES, SCALARS, make

from .simt import Kernels, assert_close
from .split_consts import use_small_split

T = kp.Tensor
TOL = {kp.float32: 2e-6, kp.float64: 1e-13}
F32, F64 = make(kp.float32), make(kp.float64)


def _inputs(k: Kernels, shapes: dict, dt: kp.DType, rng) -> list:
    npdt = np.float32 if dt == kp.float32 else np.float64
    out = []
    for p in k.summary.inputs:
        s = shapes.get(p.name)
        if p.name == "mask":
            out.append(rng.random(s) < 0.6)
        elif p.name == "j":
            out.append(rng.integers(0, 1 << shapes["n"], size=s))
        elif p.name == "n":
            out.append(s)
        elif s is None:
            out.append(SCALARS[p.name])
        else:
            out.append(rng.random(s).astype(npdt))
    return out


CASES = [
    ("axpy", {"x": (0,), "y": (0,)}), ("axpy", {"x": (5,), "y": (5,)}),
    ("gelu", {"x": (13,)}),
    ("softmax", {"x": (3, 7)}), ("softmax", {"x": (1, 2100)}), ("softmax", {"x": (2, 1)}),
    ("softmax", {"x": (1, 4100)}),  # rows past 4096: the loop schedule
    ("layernorm", {"x": (4, 37), "w": (37,), "bias": (37,)}),
    ("layernorm", {"x": (1, 300), "w": (300,), "bias": (300,)}),
    ("total", {"x": (0,)}), ("total", {"x": (1,)}), ("total", {"x": (16390,)}),
    ("masked_mean", {"x": (3, 5), "mask": (3, 5)}), ("masked_mean", {"x": (8, 33), "mask": (8, 33)}),
    ("masked_mean", {"x": (1, 4200), "mask": (1, 4200)}),
    # tiled warp rows: 2 whole tiles of 512 + a 19-chunk tail (16-byte chunks), and the
    # coalesced scalar body (rows not a whole number of chunks): 2 tiles + 6 elements
    ("masked_mean", {"x": (3, 1100), "mask": (3, 1100)}),
    ("masked_mean", {"x": (2, 1030), "mask": (2, 1030)}),
    ("masked_mean", {"x": (2, 0), "mask": (2, 0)}),
    ("phase", {"x": (3, 5)}), ("angle", {"x": (2, 6)}),
    ("basis", {"j": (5,), "n": 4}), ("amplitude", {"v": (4, 5), "n": 3}),
]


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,shapes", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_workload_numerics(name, shapes, dt):
    k = Kernels((F32 if dt == kp.float32 else F64)[name])
    ins = _inputs(k, shapes, dt, np.random.default_rng(7))
    ref = REFERENCES[name](*[a.astype(np.float64) if isinstance(a, np.ndarray) and
                             a.dtype.kind == "f" else a for a in ins])
    assert_close(k(*ins)[0], ref, TOL[dt], f"{name} {shapes}")


def test_unaligned_inputs_use_the_scalar_loop():
    k = Kernels(F32["axpy"])
    base = np.random.default_rng(1).random(40).astype(np.float32)
    x, y = base[1:10], base[2:11]  # not 16-byte aligned
    assert_close(k(x, y, 2.0)[0], 2.0 * x.astype(np.float64) + y, 1e-6, "unaligned")


def test_complex_outputs_only_4_byte_aligned_use_scalar_stores():
    """Complex amplitudes go out as one 8-byte store where the output is 8-byte aligned; a
    view that is only 4-byte aligned takes the two-store branch and gets the same values."""
    k = Kernels(F32["phase"])
    x = np.random.default_rng(9).standard_normal((3, 5)).astype(np.float32)
    plan = k.planner.plan(x.shape)
    (alloc,) = plan.allocations.values()
    n = int(np.prod(alloc.shape))
    raw = np.full(2 * n + 1, np.nan, np.float32)
    out = raw[1:].view(np.complex64).reshape(alloc.shape)
    assert out.ctypes.data % 8 == 4
    for launch in plan.launches:
        k._launch(launch, {"x": x, alloc.name: out}, {"x": x})
    ref = REFERENCES["phase"](x.astype(np.float64))
    assert_close(out, ref, TOL[kp.float32], "4-byte aligned complex64 output")
    assert_close(k(x)[0], ref, TOL[kp.float32], "aligned complex64 output")


def test_general_schedule_and_broadcasting():
    @kp.fusion
    def mix(x: T[kp.f64, "a", "b", "c"], y: T[kp.f64, 1, "c"]):
        return x.sum(axis=0)[None] - x.max(axis=1, keepdims=True) + y[None]

    x = np.random.default_rng(2).standard_normal((3, 4, 5))
    y = np.random.default_rng(3).standard_normal((1, 5))
    assert_close(Kernels(mix)(x, y)[0], x.sum(0)[None] - x.max(1, keepdims=True) + y[None],
                 1e-13, "mix")


def test_integer_ops_follow_python_semantics():
    @kp.fusion
    def ints(i: T[kp.i64, "n"], k: T[kp.i32, "n"]):
        return ((i >> k.astype(kp.i64)) & 1) + (i % 7) - (i // 3) + (i << 2)

    rng = np.random.default_rng(4)
    i = rng.integers(-1000, 1000, size=101)
    k = rng.integers(0, 70, size=101).astype(np.int32)
    kk = k.astype(np.int64)
    expect = (np.where(kk >= 64, np.where(i < 0, -1, 0), i >> np.minimum(kk, 63)) & 1) \
        + (i % 7) - (i // 3) + (i << 2)
    assert np.array_equal(Kernels(ints)(i, k)[0], expect)


def test_shift_by_iota_over_a_plain_dim_keeps_numpy_semantics():
    """``i >> arange(m)``: m is no shift count anywhere, so counts may reach 64 and up (the
    guard stays); ``arange(1 << n) >> arange(n)`` needs none (n <= 63)."""
    @kp.fusion
    def bits(i: T[kp.i64, "b"], y: T[kp.f64, "m"]):
        k = kp.arange(y.shape[0])
        return ((i[:, None] >> k[None, :]) & 1).astype(kp.f64) * y[None, :]

    i = np.array([-5, 7, 1 << 62, -(1 << 63)], dtype=np.int64)
    y = np.arange(1, 71, dtype=np.float64)
    kk = np.arange(70)
    expect = (np.where(kk[None] >= 64, np.where(i[:, None] < 0, -1, 0),
                       i[:, None] >> np.minimum(kk, 63)[None]) & 1) * y[None]
    assert np.array_equal(Kernels(bits)(i, y)[0], expect)


def test_complex_arithmetic_and_reduction():
    @kp.fusion
    def cplx(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
        z = kp.complex(x, y)
        w = z * z / (z + 1.0)
        return w.real, w.imag, kp.abs(z), kp.exp(z), z.sum()

    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(77), rng.standard_normal(77)
    z = x + 1j * y
    w = z * z / (z + 1.0)
    for got, ref in zip(Kernels(cplx)(x, y), (w.real, w.imag, np.abs(z), np.exp(z), z.sum())):
        assert_close(got, ref, 1e-13, "complex")


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_math_functions_and_float_semantics(dt):
    @kp.fusion
    def maths(x: T[dt, "n"], y: T[dt, "n"]):
        return (kp.exp2(x), kp.log(y), kp.log2(y), kp.sqrt(y), kp.rsqrt(y), kp.tan(x),
                kp.tanh(x), kp.erf(x), kp.sigmoid(x), kp.floor(x * 3), kp.ceil(x * 3),
                kp.pow(y, x), kp.abs(x), kp.maximum(x, y), kp.minimum(x, y), x // 0.3, x % 0.3,
                kp.where(x < y, x, -y), (x >= 0).astype(dt), x ** 3)

    rng = np.random.default_rng(11)
    npdt = np.float32 if dt == kp.float32 else np.float64
    x = (rng.standard_normal(50) * 2).astype(npdt)
    y = (rng.random(50) + 0.1).astype(npdt)
    x[3], y[4] = np.nan, np.nan
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    from math import erf
    refs = (np.exp2(xd), np.log(yd), np.log2(yd), np.sqrt(yd), 1 / np.sqrt(yd), np.tan(xd),
            np.tanh(xd), np.vectorize(erf)(xd), 1 / (1 + np.exp(-xd)), np.floor(xd * 3),
            np.ceil(xd * 3), yd ** xd, np.abs(xd), np.maximum(xd, yd), np.minimum(xd, yd),
            xd // 0.3, xd % 0.3, np.where(xd < yd, xd, -yd), (xd >= 0).astype(np.float64),
            xd ** 3)
    tol = 1e-5 if dt == kp.float32 else 1e-12
    for i, (got, ref) in enumerate(zip(Kernels(maths)(x, y), refs)):
        if i in (15, 16) and dt == kp.float32:  # x // 0.3 in float32 rounds 0.3 differently
            ref = (x // npdt(0.3)) if i == 15 else (x % npdt(0.3))
        assert_close(got, ref, tol, f"output {i}")


def test_reductions_kinds_axes_and_keepdims():
    @kp.fusion
    def reds(x: T[kp.f64, "a", "b", "c"], i: T[kp.i32, "a", "b", "c"]):
        return (x.prod(axis=(0, 2)), x.min(axis=1, keepdims=True), x.max(), x.mean(axis=(1, 2)),
                i.sum(axis=-1), i.max(axis=0), (i > 0).sum())

    rng = np.random.default_rng(12)
    x = rng.random((3, 4, 5)) + 0.5
    i = rng.integers(-9, 9, size=(3, 4, 5)).astype(np.int32)
    refs = (x.prod(axis=(0, 2)), x.min(axis=1, keepdims=True), x.max(), x.mean(axis=(1, 2)),
            i.sum(axis=-1), i.max(axis=0), (i > 0).sum())
    for got, ref in zip(Kernels(reds)(x, i), refs):
        assert got.dtype == np.asarray(ref).dtype or got.dtype.kind == "f"
        assert_close(got.astype(np.float64), np.asarray(ref, np.float64), 1e-13, "reduction")


def test_register_rows_skip_elements_past_the_end():
    # rows of 3 with 8 register slots per lane: 29 of 32 lanes hold only out-of-row slots
    k = Kernels(F64["softmax"])
    x = np.random.default_rng(13).standard_normal((5, 3))
    assert_close(k(x)[0], REFERENCES["softmax"](x), 1e-13, "short rows")


def test_half_and_bfloat16_storage():
    @kp.fusion
    def halves(x: T[kp.f16, "n"], y: T[kp.bf16, "n"]):
        return (x * 2.0 + y.astype(kp.f16)), (y * 0.5).astype(kp.f32), x.astype(kp.bf16)

    rng = np.random.default_rng(14)
    x = rng.standard_normal(37).astype(np.float16)
    y32 = rng.standard_normal(37).astype(np.float32)
    y = (y32.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits (truncated)
    yf = (y.astype(np.uint32) << 16).view(np.float32)
    a, b, h = Kernels(halves)(x, y)
    assert np.array_equal(a, (x.astype(np.float32) * 2 + yf.astype(np.float16).astype(np.float32))
                          .astype(np.float16))
    assert np.array_equal(b, yf * np.float32(0.5))
    bits = x.astype(np.float32).view(np.uint32)
    rne = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    assert np.array_equal(h, rne)


def test_float64_to_float16_rounds_once():
    # x86 turns a double -> half fptrunc into a call of __truncdfhf2 (F16C converts only from
    # float); the emulator supplies it, and it must round once, as NumPy's direct conversion
    # does: ties, values a double rounding to float32 first would get wrong, the largest
    # finite value, overflow, subnormals, signed zeros, NaN and infinities.
    @kp.fusion
    def narrow(x: T[kp.f64, "n"]):
        return x.astype(kp.f16)

    ulp = 2.0 ** -10
    edges = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0 ** -40,
                      1 + ulp / 2 - 2.0 ** -40, -(1 + ulp / 2 + 2.0 ** -40), 65504.0, 65519.99,
                      65520.0, 1e300, -1e300, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 + 2.0 ** -60,
                      3 * 2.0 ** -26, 1e-300, -1e-300, 0.0, -0.0, np.inf, -np.inf, np.nan])
    rng = np.random.default_rng(16)
    x = np.concatenate([edges, rng.standard_normal(200) * 10.0 ** rng.integers(-8, 5, 200)])
    got = Kernels(narrow)(x)[0]
    with np.errstate(over="ignore"):  # 65520 and up overflow to infinity, as they should
        want = x.astype(np.float16)
    assert np.array_equal(got.view(np.uint16)[~np.isnan(want)],
                          want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()


@pytest.mark.parametrize("n", [1, 4, 5, 127, 128, 129, 509, 1024])
def test_register_rows_at_variant_edges(n):
    # each register variant holds rows up to its capacity (128, 256, 512, 1024 ... floats):
    # rows at, just past and well inside a capacity, primes and non-multiples of 4
    k = Kernels(F32["layernorm"])
    rng = np.random.default_rng(n)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((3, n), (n,), (n,)))
    ref = REFERENCES["layernorm"](x.astype(np.float64), w.astype(np.float64),
                                  bias.astype(np.float64), SCALARS["eps"])
    assert_close(k(x, w, bias, SCALARS["eps"])[0], ref, 2e-6, f"layernorm n={n}")


def test_register_rows_unaligned_rows_take_the_scalar_body():
    # a view starting 4 bytes into its buffer: the 16-byte groups are off, the scalar body runs
    base = np.random.default_rng(15).standard_normal(1 + 3 * 256).astype(np.float32)
    x = base[1:].reshape(3, 256)
    assert x.ctypes.data % 16 != 0
    assert_close(Kernels(F32["softmax"])(x)[0], REFERENCES["softmax"](x.astype(np.float64)),
                 2e-6, "unaligned softmax")


def test_division_by_a_row_value_keeps_exact_results_for_extreme_divisors():
    # x / row sum: a multiply by 1/sum where that is a normal float, the exact division for
    # rows whose sum is tiny (subnormal) or huge (1/sum subnormal)
    @kp.fusion
    def share(x: T[kp.f32, "b", "n"]):
        return x / x.sum(axis=-1, keepdims=True)

    rng = np.random.default_rng(16)
    x = (rng.random((3, 8)) + 0.5).astype(np.float32)
    x[1] *= np.float32(1e-39)
    x[2] *= np.float32(2e37)
    got = Kernels(share)(x)[0]
    xd = x.astype(np.float64)
    ref = xd / xd.sum(-1, keepdims=True)
    for i in range(3):
        assert_close(got[i], ref[i], 1e-6 if i != 1 else 1e-5, f"row {i}")


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_thread_rows_at_every_group_and_rest_length(dt):
    """Thread rows (<= 32 terms) reduce in unrolled groups of 8 and a rest
    (lowering/threadrows.py): masked means of rows 1..32 long cover every rest length with
    0..4 groups; phase and angle up to n = 10 shift by split counts."""
    W = F32 if dt == kp.float32 else F64
    npdt = np.float32 if dt == kp.float32 else np.float64
    rng = np.random.default_rng(17)
    k = Kernels(W["masked_mean"])
    for n in range(1, 33):
        x, m = rng.standard_normal((2, n)).astype(npdt), rng.random((2, n)) < 0.7
        m[:, 0] = True
        assert_close(k(x, m)[0], REFERENCES["masked_mean"](x.astype(np.float64), m), TOL[dt],
               f"masked_mean n={n}")
    for name in ("phase", "angle"):
        k = Kernels(W[name])
        for n in (1, 7, 8, 9, 10):
            x = ((rng.random((2, n)) * 2 - 1) * np.pi).astype(npdt)
            assert_close(k(x)[0], REFERENCES[name](x.astype(np.float64)), TOL[dt], f"{name} n={n}")


def test_one_row_thread_variant_matches_the_row_loop_kernel():
    """float64 phase (light terms, a sincos per row) has a second thread-row kernel, bounded for
    2048 resident threads, for launches that give each thread one row
    (tuning.ONE_ROW_MIN_THREADS): small shapes take it, and the unbounded row-loop kernel run
    on the same launch gives the same bits."""
    k = Kernels(F64["phase"])
    one, plain = "phase_float64_0_rowthread1", "phase_float64_0_rowthread"
    rng = np.random.default_rng(23)
    for n in (1, 7, 9, 10):
        x = ((rng.random((3, n)) * 2 - 1) * np.pi).astype(np.float64)
        plan = k.planner.plan(x.shape)
        assert plan.variant == 0 and [l.kernel for l in plan.launches] == [one]
        got = k(x)[0]
        assert_close(got, REFERENCES["phase"](x), TOL[kp.float64], f"phase n={n}")
        bounded = k.functions[one]
        k.functions[one] = k.functions[plain]  # the same launch through the row-loop kernel
        try:
            again = k(x)[0]
        finally:
            k.functions[one] = bounded
        assert np.array_equal(got, again), f"phase n={n}"


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_float_floor_division_and_modulo_follow_numpy(dt):
    """``//`` is NumPy's divmod quotient, not ``floor(x / y)``: ``1.0 // 0.1`` is 9 (0.1 is a
    little more than a tenth; the rounded division gives exactly 10), ``7 // -0.7`` is -11;
    inf // 1 is NaN, -1 // inf is -1, x // 0 is x / 0; remainders take the divisor's sign,
    zeros included. Bit for bit, signs of zeros too (found by tests/lowering/fusion_gen/)."""
    @kp.fusion
    def divmod_(x: T[dt, "n"], y: T[dt, "n"]):
        return x // y, x % y, x // 0.1, x % 0.1

    npdt = np.float32 if dt == kp.float32 else np.float64
    x = np.array([1.0, 0.3, -1.0, 7.0, 1e-30, np.inf, -1.0, 1.0, 0.0, -0.0, 3.0, -3.0, 2.0,
                  np.nan, 5.0, -5.0, 0.7, 1.0], npdt)
    y = np.array([0.1, 0.1, 0.1, -0.7, 1e30, 1.0, np.inf, -np.inf, 3.0, 3.0, -3.0, 3.0, 0.0,
                  1.0, np.nan, 0.0, 0.1, -0.1], npdt)
    with np.errstate(all="ignore"):
        refs = (x // y, x % y, x // npdt(0.1), x % npdt(0.1))
    for i, (got, ref) in enumerate(zip(Kernels(divmod_)(x, y), refs)):
        assert np.array_equal(got, ref, equal_nan=True), (i, got, ref)
        assert np.array_equal(np.signbit(got), np.signbit(ref)), (i, got, ref)


@pytest.mark.parametrize("dt", [kp.int32, kp.int64], ids=["i32", "i64"])
def test_integer_division_by_zero_and_minus_one_follow_numpy(dt):
    """NumPy defines ``x // 0 == x % 0 == 0`` and ``INT_MIN // -1 == INT_MIN`` (wrapping); in
    LLVM IR both are undefined behaviour (x86 traps, which killed the emulator)."""
    @kp.fusion
    def divs(x: T[dt, "n"], y: T[dt, "n"]):
        return x // y, x % y, x // 0, x % 0, x // -1, x % -1, x // 3, x % -3, 7 // y, -7 % y

    npdt = np.int32 if dt == kp.int32 else np.int64
    lo = np.iinfo(npdt).min
    x = np.array([7, -7, lo, 0, 5, lo, -9, 9, 1], npdt)
    y = np.array([0, 0, -1, -1, 2, 0, -4, -4, 1], npdt)
    with np.errstate(all="ignore"):
        refs = (x // y, x % y, x // 0, x % 0, x // -1, x % -1, x // 3, x % -3, 7 // y, -7 % y)
    for i, (got, ref) in enumerate(zip(Kernels(divs)(x, y), refs)):
        assert np.array_equal(got, np.asarray(ref).astype(npdt)), (i, got, ref)


def test_integer_division_on_register_rows_never_divides_by_a_padding_zero():
    """Lanes past a register row's end compute on guarded loads of 0 and drop the result: an
    integer division there once divided by zero (a SIGFPE in the emulator, undefined behaviour
    in the IR)."""
    @kp.fusion
    def rowmod(x: T[kp.i64, "b", "n"]):
        r = -5 % x
        return r - r.sum(axis=-1, keepdims=True)

    x = np.random.default_rng(18).integers(1, 9, size=(3, 17))
    k = Kernels(rowmod)
    assert [l.kernel for l in k.planner.plan(x.shape).launches] == ["rowmod_0_rowwarp2"]
    r = -5 % x
    assert np.array_equal(k(x)[0], r - r.sum(-1, keepdims=True))


def test_several_row_stages_fit_the_variant_limit():
    """Each row stage has up to ~10 schedules by row length and the summary holds one variant
    per combination (at most 64): three row stages of different shapes once failed to compile
    ("needs 1 to 64 variants (got 192)"). The widest stages lose their widest conditional
    schedules until the product fits; every length still has a schedule."""
    @kp.fusion
    def three(x: T[kp.f32, "a", "n"], y: T[kp.f64, "b", "m"], z: T[kp.f32, "c", "k"]):
        return x - x.max(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True), z.sum(axis=1)

    k = Kernels(three)
    assert len(k.summary.variants) <= 64
    rng = np.random.default_rng(19)
    for a, n in ((3, 5), (2, 40), (1, 300)):
        x = rng.standard_normal((a, n)).astype(np.float32)
        y = rng.standard_normal((a + 1, n + 2))
        z = rng.standard_normal((2, n)).astype(np.float32)
        refs = (x - x.max(1, keepdims=True), y - y.mean(1, keepdims=True),
                z.astype(np.float64).sum(1))
        for got, ref, tol in zip(k(x, y, z), refs, (1e-6, 1e-13, 1e-6)):
            assert_close(got, ref, tol, f"three {a}x{n}")
    c = kp.compile(three, targets=["sm_80"])
    plan = kp.load(kp.save([c]))["three"].plan((7, 100000), (7, 100000), (7, 100000))
    assert [l.kernel for l in plan.launches][-1].startswith("three_2_row")


def test_imag_of_real_and_power_zero_at_nan_and_inf():
    """NumPy: ``x.imag`` of a real array is 0 and ``x ** 0`` is 1 even where x is NaN or
    infinite (the zeros are constants of x's shape, not ``0 * x``)."""
    @kp.fusion
    def zeros(x: T[kp.f32, "n"], i: T[kp.i32, "n"]):
        return x.imag, x ** 0, kp.imag(i), x.shape[0] * x

    x = np.array([1.5, np.nan, np.inf, -np.inf, -0.0], np.float32)
    i = np.arange(5, dtype=np.int32)
    got = Kernels(zeros)(x, i)
    assert np.array_equal(got[0], np.zeros(5, np.float32))
    assert np.array_equal(got[1], np.ones(5, np.float32))
    assert np.array_equal(got[2], np.zeros(5, np.int32))
    assert np.array_equal(got[3], 5 * x, equal_nan=True)


def test_native_helpers_give_the_python_callbacks_bits(monkeypatch):
    """The emulator's native helpers (registers from pthread_getspecific, POSIX barriers)
    against the Python callbacks they replaced, on every launch of softmax and layernorm at
    shapes that take warp rows, block rows (several blocks) and softmax's split reduction
    (the emulator's small split: several 32-thread blocks, then a pointwise kernel): the same
    bits."""
    use_small_split(monkeypatch)
    rng = np.random.default_rng(45)
    shapes = {"softmax": ((4, 40), (5, 700), (1, 1000)), "layernorm": ((4, 40), (5, 700))}
    seen: dict[str, set] = {}
    for name, cases in shapes.items():
        k = Kernels(F32[name])
        kernels = seen[name] = set()
        for n, m in cases:
            inputs = _inputs(k, {"x": (n, m), "w": (m,), "bias": (m,)}, kp.float32, rng)
            native = k(*inputs)
            python = k.run(tuple(inputs), lambda launch, buffers, values, plan:
                           k._launch_in_python(launch, buffers, values))
            kernels.update(launch.kernel for launch in k.planner.plan(
                *[v.shape if isinstance(v, np.ndarray) else v for v in inputs]).launches)
            for got, want in zip(native, python):
                assert np.array_equal(got, want, equal_nan=True), (name, (n, m))
        assert sum(k._native.cooperative[kernel] for kernel in kernels) >= 2, kernels
    assert {"softmax_float32_0_split_partial0", "softmax_float32_0_split_pointwise",
            "softmax_float32_0_rowwarp4", "softmax_float32_0_rowblock128x8"} <= seen["softmax"], seen


def test_only_kernels_that_wait_for_each_other_run_threads_at_once():
    """A kernel with a barrier or a shuffle runs its block's threads at once; a pointwise
    kernel (neither) one thread after another."""
    k = Kernels(F32["softmax"])
    cooperative = k._native.cooperative
    assert set(cooperative) == set(k.functions)
    assert cooperative["softmax_float32_0_split_pointwise"] is False, cooperative
    assert all(cooperative[n] for n in cooperative if "rowblock" in n or "rowwarp" in n)
