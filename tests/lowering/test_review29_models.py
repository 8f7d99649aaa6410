"""Review 29 (black box): an ML engineer ports a model's kernels to the DSL.

Each kernel is written the way README.md's authoring sections say it can be (``@kp.fusion``
over symbolic dims, reductions with ``axis``/``keepdims``, ``kp.where``, ``.astype``, scalar
parameters), compiled, saved and loaded (for the plans), and run on the SIMT emulator
(:mod:`.simt`) against NumPy in float64 with tolerances suited to the dtype: 1e-5 (float32),
1e-12 (float64) relative to the reference's largest magnitude (issue 3), a float16/bfloat16
output held to twice its final rounding (2^-10, 2^-7). Shapes are odd (1, 3, 257, 1000),
empty where the docs allow it, and the data holds NaN, infinities, -0.0, subnormals and large
offsets. Where the README says something is unsupported, the test checks it is refused at
trace time with an error that names the op and says what to write.

Findings: no kernel below disagreed with NumPy or the README, and every refusal the README
promises came at trace time with an error naming the op or dtypes; all tests pass on the code
reviewed. Semantics the docs leave open (not asserted here): the sign of a zero from
``kp.maximum(0.0, -0.0)`` (NumPy's own answer depends on its SIMD loop), ``kp.pow(x, 0.5)``
of a float16 -inf (NaN, as NumPy's float32/float64 ``power`` fast path gives; NumPy's float16
loop gives +inf), and a float32 full sum accumulating in float64 (``x.sum()`` of
[3e38, 3e38, -3e38] is 3e38 where NumPy's pairwise float32 sum and the DSL's own row sum
overflow to inf).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close

T = kp.Tensor
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
ERF = np.vectorize(math.erf, otypes=[np.float64])


# ------------------------------------------------------------------------------- harness


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even) as the uint16 bits the emulator
    stores (NumPy has no bfloat16)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def wide(v: Any, half: str | None = None) -> Any:
    """An input as the float64 reference sees it (bfloat16 bits when ``half == 'bf16'``)."""
    if isinstance(v, np.ndarray) and v.dtype == np.uint16 and half == "bf16":
        return from_bf16(v).astype(np.float64)
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float64)
    return v


def rand(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed + 31 * sum(shape))
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """Shapes equal; infinities where the reference has them (same sign); NaN where it has
    NaN; the rest within ``tol`` of the reference's largest finite magnitude."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, NumPy {want.shape}"
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"{what}: infinities {got[inf]} != {want[inf]}"
    assert not np.isinf(got[~inf]).any(), f"{what}: infinities where NumPy has none"
    assert_close(np.where(inf, 0, got), np.where(inf, 0, want), tol, what)


def loaded(fusion: kp.fusion, static: dict | None = None) -> Kernels:
    """The emulator for ``fusion``, driven by the planner of the program compiled for sm_80 +
    PTX, saved and loaded back (the artifact a fleet would run)."""
    compiled = kp.compile(fusion, targets=["sm_80", "ptx"], static=static)
    program = kp.load(kp.save([compiled]))[fusion.name]
    kernels = Kernels(fusion, static=static)
    kernels.planner = program.planner
    return kernels


def within_limits(kernels: Kernels, *args: Any) -> None:
    plan = kernels.planner.plan(*args)
    for la in plan.launches:
        (gx, gy, gz), (bx, by, bz) = la.grid, la.block
        assert 0 <= gx < 2 ** 31 and gy <= 65535 and gz <= 65535, la
        assert 1 <= bx * by * bz <= 1024 and 0 <= la.shared_mem <= 48 * 1024, la
    for a in plan.allocations.values():
        assert a.nbytes == math.prod(a.shape) * a.dtype.itemsize, a


def trace_error(body: Callable[..., Any], **annotations: Any) -> str:
    """The TraceError message of a fusion of ``annotations`` returning ``body(...)``."""
    names = list(annotations)
    fn = eval(f"lambda {', '.join(names)}: body({', '.join(names)})",  # noqa: S307
              {"body": body})
    fn.__annotations__ = dict(annotations)
    with pytest.raises(kp.TraceError) as info:
        kp.fusion(fn, name="refused").trace()
    return str(info.value)


def reference(fn: Callable[..., Any], *args: Any) -> list[np.ndarray]:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = fn(*args)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


# ------------------------------------------------------------------------------- norms


@pytest.mark.parametrize("half", ["f16", "bf16"])
def test_layernorm_affine_half_inputs_float32_statistics(half):
    """LayerNorm over the last axis: half input, weight and bias; statistics in float32 (the
    README: float16/bfloat16 compute in float32 and round at every pointwise op, so upcast
    before squaring); the normalized output rounds once to the input's dtype, and the saved
    mean and rstd are float32 outputs."""
    kdt = kp.f16 if half == "f16" else kp.bf16

    @kp.fusion
    def layernorm(x: T[kdt, "b", "d"], w: T[kdt, "d"], bias: T[kdt, "d"], eps: kp.f32):
        xf = x.astype(kp.f32)
        mu = xf.mean(axis=-1, keepdims=True)
        xc = xf - mu
        rstd = kp.rsqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
        y = xc * rstd * w.astype(kp.f32) + bias.astype(kp.f32)
        return y.astype(x.dtype), mu, rstd

    def make(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float16) if half == "f16" else bf16(v)

    def ref(x, w, b, eps):
        mu = x.mean(-1, keepdims=True)
        rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        return (x - mu) * rstd * w + b, mu, rstd

    k = loaded(layernorm)
    out_dtype = "float16" if half == "f16" else "bfloat16"
    for b, d in ((1, 1), (3, 257), (2, 1000), (0, 5)):
        # a large offset: the float32 two-pass statistics keep the variance
        x = make(rand((b, d), scale=2.0) + 100.0)
        w, bias = make(rand((d,), 1)), make(rand((d,), 2))
        got = k(x, w, bias, 1e-5)
        want = reference(ref, *(wide(v, half) for v in (x, w, bias)), 1e-5)
        y = got[0] if half == "f16" else from_bf16(got[0])
        assert got[0].dtype == (np.float16 if half == "f16" else np.uint16)
        close(y, want[0], TOL[out_dtype], f"layernorm {half} y {(b, d)}")
        for g, w_, name in zip(got[1:], want[1:], ("mu", "rstd")):
            assert g.dtype == np.float32, (name, g.dtype)
            # rstd of a d=1 row is 1/sqrt(eps): float32's eps and NumPy's 1e-5 differ a little
            close(g, w_, 1e-5 if d > 1 else 1e-4, f"layernorm {half} {name} {(b, d)}")
        within_limits(k, (b, d), (d,), (d,), 1e-5)


def test_rmsnorm_pure_float16_squares_round_to_float16_as_documented():
    """README: float16 math rounds to float16 after every pointwise op (``(h * h)`` is the
    float16 product), reductions accumulate wider and round once. So an RMSNorm written
    without an upcast overflows for |x| > 256 (x*x is inf in float16: the row comes out 0),
    and the float32-statistics form does not. Both are checked against NumPy op by op."""
    @kp.fusion
    def rms_pure(x: T[kp.f16, "b", "d"], w: T[kp.f16, "d"]):
        return x * kp.rsqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w

    @kp.fusion
    def rms_up(x: T[kp.f16, "b", "d"], w: T[kp.f16, "d"]):
        xf = x.astype(kp.f32)
        return (xf * kp.rsqrt((xf * xf).mean(axis=-1, keepdims=True) + 1e-6)
                * w.astype(kp.f32)).astype(kp.f16)

    x = rand((3, 257), scale=0.5).astype(np.float16)
    x[2, :] = 300.0                      # squares overflow float16 (65504)
    x[1, 5] = np.float16(6e-8)           # a float16 subnormal survives the upcast
    w = (rand((257,), 1) + 1).astype(np.float16)
    pure, up = Kernels(rms_pure)(x, w)[0], Kernels(rms_up)(x, w)[0]
    assert pure.dtype == up.dtype == np.float16
    # op by op in float16 (NumPy's float16 ufuncs round every result), the mean in float64
    sq = (x * x)
    ms = (sq.astype(np.float64).mean(-1, keepdims=True)).astype(np.float16)
    r = (1 / np.sqrt((ms + np.float16(1e-6)).astype(np.float32))).astype(np.float16)
    want_pure = (x * r) * w
    assert np.isinf(sq[2]).all() and (want_pure[2] == 0).all()
    assert np.array_equal(pure[2], want_pure[2]), pure[2]
    close(pure[:2].astype(np.float64), want_pure[:2].astype(np.float64), 2.0 ** -9,
          "rms pure f16 rows 0-1")
    xd = x.astype(np.float64)
    want_up = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * w
    close(up.astype(np.float64), want_up, TOL["float16"], "rms upcast")
    assert np.abs(up[2].astype(np.float64) - w).max() <= 2.0 ** -10 * 2, up[2]


# ------------------------------------------------------------------------------- softmax family


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    if z.size == 0:
        return z
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_and_log_softmax_over_a_middle_and_a_leading_axis():
    """Softmax over axis 1 of a 3-D tensor and log-softmax over axis 0 (keepdims, the
    statistics broadcast back); masked entries are -inf (exp gives 0)."""
    @kp.fusion
    def soft_mid(x: T[kp.f32, "a", "s", "c"]):
        e = kp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    @kp.fusion
    def log_soft_lead(x: T[kp.f32, "a", "s", "c"]):
        m = x.max(axis=0, keepdims=True)
        return x - (kp.log(kp.exp(x - m).sum(axis=0, keepdims=True)) + m)

    def log_softmax(z):
        if z.size == 0:
            return z
        m = z.max(0, keepdims=True)
        return z - (np.log(np.exp(z - m).sum(0, keepdims=True)) + m)

    ks, kl = Kernels(soft_mid), Kernels(log_soft_lead)
    for shape in ((3, 257, 5), (1, 1, 1), (257, 3, 1), (2, 0, 3)):
        x = rand(shape, scale=4.0)
        if x.size and shape[1] > 1:
            x[0, 0, :] = -np.inf         # one masked position per column (not a whole column)
        (y,) = ks(x)
        close(y, _softmax(wide(x), 1), 1e-5, f"softmax axis 1 {shape}")
        if x.size and shape[1] > 1:
            np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
        (ly,) = kl(x)
        close(ly, reference(log_softmax, wide(x))[0], 1e-5, f"log_softmax axis 0 {shape}")


def test_logsumexp_with_all_minus_inf_rows_and_empty_rows():
    """The usual guard for fully masked rows: shift by 0 where the max is -inf, so the row's
    logsumexp is log(0) = -inf (no NaN); an empty row is -inf too (README: max of an empty
    axis is -inf, sum 0); a row holding +inf gives NaN exactly as NumPy's formula does."""
    @kp.fusion
    def lse(x: T[kp.f32, "b", "n"]):
        m = x.max(axis=-1, keepdims=True)
        shift = kp.where(m == -math.inf, 0.0, m)
        s = kp.log(kp.exp(x - shift).sum(axis=-1, keepdims=True)) + shift
        return s, x - s

    def ref(x):
        if x.shape[1] == 0:
            s = np.full((x.shape[0], 1), -np.inf)
            return s, x - s
        m = x.max(-1, keepdims=True)
        shift = np.where(m == -np.inf, 0.0, m)
        s = np.log(np.exp(x - shift).sum(-1, keepdims=True)) + shift
        return s, x - s

    k = loaded(lse)
    x = rand((5, 257), scale=3.0)
    x[1] = -np.inf                        # fully masked
    x[2, :200] = -np.inf                  # partly masked
    x[3, 7] = np.inf                      # NaN row, as in NumPy
    x[4, 3] = 88.0                        # exp would overflow without the shift
    for inp in (x, np.zeros((3, 0), np.float32), rand((1, 1))):
        got = k(inp)
        want = reference(ref, wide(inp))
        for g, w, name in zip(got, want, ("lse", "log_probs")):
            assert g.dtype == np.float32
            close(g, w, 1e-5, f"{name} {inp.shape}")
    assert (k(x)[0][1] == -np.inf).all() and np.isnan(k(x)[0][3]).all()


def test_cross_entropy_mean_with_integer_labels_and_ignore_index():
    """Cross-entropy from logits: the label's logit picked by a one-hot compare with
    ``kp.arange(v, dtype=kp.int32)`` (gathers are refused, below), ignore_index -100 masked
    out of the batch mean (the README's per-row logsumexps reduced again by a full mean)."""
    @kp.fusion
    def xent(logits: T[kp.f32, "b", "v"], labels: T[kp.i32, "b"]):
        m = logits.max(axis=-1, keepdims=True)
        lse = kp.log(kp.exp(logits - m).sum(axis=-1)) + m.sum(axis=-1)
        onehot = kp.arange(logits.shape[1], dtype=kp.int32)[None, :] == labels[:, None]
        picked = kp.where(onehot, logits, 0.0).sum(axis=-1)
        valid = labels != -100
        per_row = kp.where(valid, lse - picked, 0.0)
        return per_row, per_row.sum() / valid.sum(), valid.sum()

    def ref(logits, labels):
        m = logits.max(-1, keepdims=True)
        lse = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
        valid = labels != -100
        picked = logits[np.arange(len(labels)), np.where(valid, labels, 0)]
        per_row = np.where(valid, lse - picked, 0.0)
        return per_row, per_row.sum() / valid.sum(), valid.sum()

    k = loaded(xent)
    for b, v in ((1, 1), (7, 1000), (33, 3)):
        rng = np.random.default_rng(b * v)
        logits = rand((b, v), scale=5.0)
        labels = rng.integers(0, v, b).astype(np.int32)
        labels[::3] = -100 if b > 1 else labels[::3]
        got = k(logits, labels)
        want = reference(ref, wide(logits), labels)
        assert got[0].dtype == np.float32 and got[1].dtype == np.float32, got[1].dtype
        assert got[1].shape == () and got[2].dtype == np.int64, (got[1].shape, got[2].dtype)
        close(got[0], want[0], 1e-5, f"per-row loss {(b, v)}")
        close(got[1], want[1], 1e-5, f"mean loss {(b, v)}")
        assert got[2] == want[2]
    # every label ignored: 0 / 0 is NaN as in NumPy (and torch)
    got = k(rand((3, 5)), np.full(3, -100, np.int32))
    assert np.isnan(got[1]) and (got[0] == 0).all()


@pytest.mark.parametrize("body,annotations,parts", [
    (lambda x, t: x[t], dict(x=T[kp.f32, "b", "v"], t=T[kp.i32, "b"]),
     ["only ':', '...' and None", "kp.where(kp.arange"]),
    (lambda x, t: np.take_along_axis(x, t[:, None], 1),
     dict(x=T[kp.f32, "b", "v"], t=T[kp.i32, "b"]), ["np.take_along_axis is not supported"]),
    (lambda x: np.argmax(x, -1), dict(x=T[kp.f32, "b", "v"]),
     ["x == x.max(axis, keepdims=True)"]),
    (lambda x, y: x @ y, dict(x=T[kp.f32, "b", "k"], y=T[kp.f32, "k", "n"]),
     ["matrix product", "float32[b, k]"]),
    (lambda x: np.squeeze(x, 1), dict(x=T[kp.f32, "b", 1]), ["no data movement"]),
    (lambda x, m: np.sum(x, axis=-1, where=m), dict(x=T[kp.f32, "b", "v"], m=T[kp.bool_, "b", "v"]),
     ["np.sum", "where"]),
    (lambda x, m: np.exp(x, where=m), dict(x=T[kp.f32, "b", "v"], m=T[kp.bool_, "b", "v"]),
     ["np.exp", "where"]),
    (lambda x: kp.sqrt(x.astype(kp.c64)), dict(x=T[kp.f32, "n"]), ["sqrt"]),
    (lambda x: x ** -1, dict(x=T[kp.i32, "n"]), []),
    (lambda x, s: x * s, dict(x=T[kp.f16, "n"], s=kp.f32), ["mul", "float16", "float32"]),
    (lambda x, y: x + y, dict(x=T[kp.f16, "n"], y=T[kp.f32, "n"]),
     ["add", "float16[n]", "float32[n]", ".astype"]),
    (lambda x, y: x + y, dict(x=T[kp.bf16, "n"], y=T[kp.f16, "n"]), ["bfloat16", "float16"]),
    (lambda x, y: x + y, dict(x=T[kp.u8, "n"], y=T[kp.i32, "n"]), ["uint8", "int32"]),
    (lambda x, y: x * y, dict(x=T[kp.i8, "n"], y=T[kp.i16, "n"]), ["mul", "int8", "int16"]),
    (lambda x: x + 300, dict(x=T[kp.u8, "n"]), ["300", "uint8"]),
    (lambda x: kp.arange(3 ** x.shape[0]), dict(x=T[kp.f32, "n"]), []),
    (lambda x: x << 1, dict(x=T[kp.f32, "n"]), ["shl", "integer"]),
], ids=["gather", "take_along_axis", "argmax", "matmul", "squeeze", "np.sum-where",
        "np.exp-where", "complex-sqrt", "int-negative-literal-power", "f16*f32-scalar",
        "f16+f32", "bf16+f16", "u8+i32", "i8*i16", "u8+300", "3**n-size", "float-shift"])
def test_unsupported_forms_are_refused_at_trace_time(body, annotations, parts):
    """What the README lists as unsupported (data movement, gathers, complex sqrt, a negative
    literal integer power, mixed widths and signedness, ``3 ** n`` as a size) is a TraceError
    when traced, naming the op or dtypes, never compiled into something else."""
    message = trace_error(body, **annotations)
    for part in parts:
        assert part in message, (part, message)


# ------------------------------------------------------------------------------- quantization


def test_int8_symmetric_quantize_round_half_even_clamp_and_dequantize():
    """Per-tensor symmetric int8: q = clip(round_half_even(x / scale), -127, 127) with the
    scale a float32 scalar parameter; rounding spelled with kp.floor (the DSL has no round
    op: the README lists floor/ceil), the clamp with kp.minimum/kp.maximum; ties, values past
    the clamp, infinities and -0.0 in the data. Dequantize multiplies back."""
    @kp.fusion
    def quantize(x: T[kp.f32, "n"], scale: kp.f32):
        y = x / scale
        r = kp.floor(y)
        frac = y - r
        odd = r - 2.0 * kp.floor(r * 0.5)
        r = kp.where(frac == 0.5, r + odd, kp.where(frac > 0.5, r + 1.0, r))
        return kp.minimum(kp.maximum(r, -127.0), 127.0).astype(kp.i8)

    @kp.fusion
    def dequantize(q: T[kp.i8, "n"], scale: kp.f32):
        return q.astype(kp.f32) * scale

    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.5, -127.5, 200.0,
                     -1e30, np.inf, -np.inf, -0.0, 0.49999997, 3.5000002], np.float32)
    k, kd = loaded(quantize), loaded(dequantize)
    for x, scale in ((ties, 1.0), (rand((1000,), scale=3.0), 0.05), (ties[:1], 0.25),
                     (np.zeros(0, np.float32), 1.0)):
        (q,) = k(x, scale)
        want = np.clip(np.round(x / np.float32(scale)), -127, 127).astype(np.int8)
        assert q.dtype == np.int8 and np.array_equal(q, want), (x, q, want)
        (dq,) = kd(q, scale)
        assert dq.dtype == np.float32
        assert np.array_equal(dq, q.astype(np.float32) * np.float32(scale))
    (q,) = k(ties, 1.0)
    assert list(q[:10]) == [0, 2, 2, 0, -2, -2, 126, -126, 127, -127]


# ------------------------------------------------------------------------------- activations


def test_rotary_embedding_from_positions_times_frequencies():
    """RoPE (rotate-half form, the two halves passed as inputs since slicing is refused):
    angle = position * inv_freq in float32, the position an int32 position id plus an
    integer offset scalar (a decode step); cos/sin of angles up to ~5000 rad."""
    @kp.fusion
    def rope(x1: T[kp.f32, "b", "s", "h", "d"], x2: T[kp.f32, "b", "s", "h", "d"],
             pos: T[kp.i32, "b", "s"], inv_freq: T[kp.f32, "d"], offset: kp.i32):
        ang = (pos + offset).astype(kp.f32)[:, :, None, None] * inv_freq
        c, s = kp.cos(ang), kp.sin(ang)
        return x1 * c - x2 * s, x2 * c + x1 * s

    k = loaded(rope)
    for b, s, h, d in ((1, 1, 1, 1), (2, 5, 3, 4), (1, 3, 1, 33)):
        x1, x2 = rand((b, s, h, d)), rand((b, s, h, d), 1)
        pos = np.arange(b * s, dtype=np.int32).reshape(b, s) * 1000
        inv = (10000.0 ** (-np.arange(d) * 2.0 / (2 * d))).astype(np.float32)
        offset = 7
        got = k(x1, x2, pos, inv, offset)
        ang = (pos + offset).astype(np.float32)[:, :, None, None] * inv  # float32, as the DSL
        c, sn = np.cos(ang.astype(np.float64)), np.sin(ang.astype(np.float64))
        X1, X2 = wide(x1), wide(x2)
        for g, w, name in zip(got, (X1 * c - X2 * sn, X2 * c + X1 * sn), ("o1", "o2")):
            assert g.dtype == np.float32
            close(g, w, 1e-5, f"rope {name} {(b, s, h, d)}")


@pytest.mark.parametrize("kdt,ndt,tol", [(kp.f32, np.float32, 1e-5), (kp.f64, np.float64, 1e-12),
                                         (kp.f16, np.float16, 2.0 ** -8)],
                         ids=["f32", "f64", "f16"])
def test_gelu_exact_and_tanh_silu_swiglu_with_edge_values(kdt, ndt, tol):
    """GELU (erf and tanh forms), SiLU and SwiGLU, with NaN, infinities, -0.0, subnormals and
    large values; the float64 reference applies the same formula, so a -inf input gives
    -inf * 0 = NaN in both. float16 rounds after every op (README), hence its tolerance."""
    c = math.sqrt(2.0 / math.pi)

    @kp.fusion
    def acts(x: T[kdt, "n"], g: T[kdt, "n"], u: T[kdt, "n"]):
        gelu = 0.5 * x * (1.0 + kp.erf(x * (1.0 / math.sqrt(2.0))))
        gelu_tanh = 0.5 * x * (1.0 + kp.tanh(c * (x + 0.044715 * x ** 3)))
        silu = x * kp.sigmoid(x)
        return gelu, gelu_tanh, silu, g * kp.sigmoid(g) * u

    def ref(x, g, u):
        sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
        return (0.5 * x * (1 + ERF(x / math.sqrt(2.0))),
                0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x ** 3))), x * sig(x),
                g * sig(g) * u)

    tiny = float(np.finfo(ndt).smallest_subnormal)
    big = float(np.finfo(ndt).max) / 4
    edge = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, big, -big, 1.0, -1.0,
                     -20.0, 20.0, 5.0], ndt)
    x = np.concatenate([edge, rand((243,), scale=3.0).astype(ndt)])
    g, u = rand((257,), 1, 3.0).astype(ndt), rand((257,), 2).astype(ndt)
    got = Kernels(acts)(x, g, u)
    want = reference(ref, wide(x), wide(g), wide(u))
    for name, gg, ww in zip(("gelu", "gelu_tanh", "silu", "swiglu"), got, want):
        assert gg.dtype == ndt, (name, gg.dtype)
        fin = np.abs(ww) < float(np.finfo(ndt).max)
        # NaN where the formula gives NaN, the same infinities, the finite rest within tol
        close(np.where(fin, gg, ww).astype(np.float64), ww, tol, f"{name} {ndt.__name__}")
        assert np.array_equal(np.isnan(gg), np.isnan(ww)), (name, gg[:14], ww[:14])
        # GELU/SiLU(-0.0) is -0.0 and (+0.0) is +0.0, as the float64 formula gives
        if name != "swiglu":
            assert np.signbit(gg[3]) == np.signbit(ww[3]) and gg[3] == 0, (name, gg[3])


# ------------------------------------------------------------------------------- statistics


def test_masked_mean_with_a_bool_mask_and_a_fully_masked_row():
    """Masked mean over the last axis: a bool mask, the count as a sum of the mask (int64);
    float32 / int64 stays float32 (README: an integer tensor with a float one takes the
    float's dtype); a fully masked row is 0/0 = NaN as in NumPy."""
    @kp.fusion
    def masked_mean(x: T[kp.f32, "b", "n"], m: T[kp.bool_, "b", "n"]):
        return kp.where(m, x, 0.0).sum(axis=-1) / m.sum(axis=-1), m.sum(axis=-1)

    k = Kernels(masked_mean)
    rng = np.random.default_rng(3)
    for shape in ((4, 257), (1, 1), (3, 0)):
        x = rand(shape)
        m = rng.random(shape) < 0.3
        if shape == (4, 257):
            m[1] = False
            x[2, ~m[2]] = np.nan        # NaN where masked out never leaks in
        got = k(x, m)
        want = reference(lambda x, m: (np.where(m, x, 0).sum(-1) / m.sum(-1), m.sum(-1)),
                         wide(x), m)
        assert got[0].dtype == np.float32 and got[1].dtype == np.int64
        close(got[0], want[0], 1e-5, f"masked mean {shape}")
        assert np.array_equal(got[1], want[1])
        if shape == (4, 257):
            assert np.isnan(got[0][1]) and not np.isnan(got[0][2])


def test_float32_variance_of_large_offsets_is_as_stable_as_numpy():
    """Variance of 1e6 + N(0, 1) in float32 (the two-pass form the README's reductions
    support) over a row, a column, and two non-adjacent axes. The mean's own float32 rounding
    (ulp 0.0625 at 1e6) bounds what any float32 kernel can do; NumPy's float32 two-pass
    result is the yardstick: within 3x its error (plus a float32 ulp of the variance). A
    naive float32 running sum (ulp 64 at 1e9) would be off by orders of magnitude."""
    @kp.fusion
    def var_rows(x: T[kp.f32, "b", "n"]):
        mu = x.mean(axis=-1, keepdims=True)
        return ((x - mu) ** 2).mean(axis=-1)

    @kp.fusion
    def var_cols(x: T[kp.f32, "n", "c"]):
        mu = x.mean(axis=0)
        return ((x - mu) ** 2).mean(axis=0)

    @kp.fusion
    def var_02(x: T[kp.f32, "a", "c", "b"]):
        mu = x.mean(axis=(0, 2), keepdims=True)
        return ((x - mu) ** 2).mean(axis=(0, 2))

    rng = np.random.default_rng(11)
    cases = [(var_rows, (3, 1000), -1), (var_cols, (1000, 3), 0), (var_02, (10, 3, 101), (0, 2))]
    for fusion, shape, axis in cases:
        x = (1e6 + rng.standard_normal(shape)).astype(np.float32)
        (got,) = Kernels(fusion)(x)
        exact = x.astype(np.float64).var(axis=axis)
        mu32 = x.mean(axis=axis, keepdims=True)
        numpy32 = ((x - mu32) ** 2).mean(axis=axis).astype(np.float64)
        err, np_err = np.abs(got - exact), np.abs(numpy32 - exact)
        assert got.dtype == np.float32 and got.shape == exact.shape
        assert (err <= 3 * np_err + 2e-7 * exact + 1e-3).all(), (fusion.name, got, exact, numpy32)


def test_reductions_over_several_axes_of_4d_tensors_with_size_one_dims():
    """Reductions over (0, 2), (1, 3), negative axes and every axis, keepdims or not, of a
    4-D tensor broadcast from size-1 dims, and the statistics broadcast back."""
    @kp.fusion
    def stats(x: T[kp.f32, "a", 1, "c", 1], y: T[kp.f32, 1, "b", 1, "d"]):
        z = x * y + y
        return (z.sum(axis=(0, 2)), z.max(axis=(1, 3), keepdims=True), z.mean(axis=(-1, -3)),
                z - z.mean(axis=(0, 2), keepdims=True), z.min(axis=(0, 1, 2, 3)),
                z.prod(axis=(0, 3), keepdims=True), x.sum(axis=1))

    def ref(x, y):
        z = x * y + y
        return (z.sum(axis=(0, 2)), z.max(axis=(1, 3), keepdims=True), z.mean(axis=(-1, -3)),
                z - z.mean(axis=(0, 2), keepdims=True), z.min(), z.prod(axis=(0, 3), keepdims=True),
                x.sum(axis=1))

    k = Kernels(stats)
    for a, b, c, d in ((2, 3, 5, 7), (1, 1, 1, 1), (3, 2, 1, 4)):
        x, y = rand((a, 1, c, 1)), rand((1, b, 1, d), 1)
        got = k(x, y)
        for j, (g, w) in enumerate(zip(got, reference(ref, wide(x), wide(y)))):
            assert g.dtype == np.float32, (j, g.dtype)
            close(g, w, 1e-5, f"stats output {j} {(a, b, c, d)}")


# ------------------------------------------------------------------------------- integers, dtypes


@pytest.mark.parametrize("kdt,ndt", [(kp.i8, np.int8), (kp.i16, np.int16), (kp.i64, np.int64),
                                     (kp.u8, np.uint8), (kp.u16, np.uint16), (kp.u64, np.uint64)],
                         ids=["i8", "i16", "i64", "u8", "u16", "u64"])
def test_integer_division_modulo_shifts_and_bitwise_like_numpy(kdt, ndt):
    """Floor division and modulo of negative numbers (NumPy's: towards -inf, the divisor's
    sign; x // 0 and x % 0 are 0; MIN // -1 wraps), shifts by counts past the width, and
    bitwise ops, for the widths review 28 did not cover (it checked int32)."""
    @kp.fusion
    def ints(a: T[kdt, "n"], d: T[kdt, "n"], s: T[kdt, "n"]):
        return a // d, a % d, a << s, a >> s, a & d, a | d, a ^ d, ~a, a * d, a - d

    info = np.iinfo(ndt)
    bits = info.bits
    if info.min < 0:
        a = np.array([7, -7, 7, -7, 0, info.min, info.min, 5, -5, info.max, -1, 3], ndt)
        d = np.array([2, 2, -2, -2, 3, -1, 1, 0, 0, -1, 3, info.min], ndt)
        s = np.array([0, 1, bits - 1, bits, bits + 1, 7, bits - 1, 3, 2, 1, bits, 4], ndt)
    else:
        a = np.array([7, 250, info.max, 0, 1, info.max, 3, 128], ndt)
        d = np.array([2, 3, info.max, 5, 0, 1, 7, 255], ndt)
        s = np.array([0, 1, bits - 1, bits, bits + 1, 3, min(200, info.max), 2], ndt)
    want = reference(lambda a, d, s: (a // d, a % d, np.left_shift(a, s), np.right_shift(a, s),
                                      a & d, a | d, a ^ d, ~a, a * d, a - d), a, d, s)
    for j, (g, w) in enumerate(zip(Kernels(ints)(a, d, s), want)):
        assert g.dtype == w.dtype and np.array_equal(g, w), (ndt.__name__, j, a, d, s, g, w)


def test_mixed_dtype_promotion_follows_the_readme():
    """bool with int32 is int32; bool with float16 float16; an integer tensor with a float
    one takes the float's dtype (int64 + float16 is float16, NumPy says float64); a Python
    float beside int8 is float64 (as NumPy); int32 == float32 compares in float32 so
    16777217 equals 16777216.0 (README); a size beside int8 stays int8 and wraps."""
    @kp.fusion
    def mixed(b: T[kp.bool_, "n"], i: T[kp.i32, "n"], h: T[kp.f16, "n"], q: T[kp.i64, "n"],
              f: T[kp.f32, "n"], s: T[kp.i8, "n"]):
        return b + i, b + h, q + h, s * 0.5, i == f, s + s.shape[0], i.astype(kp.f32) < f

    n = 300
    rng = np.random.default_rng(5)
    b = rng.random(n) < 0.5
    i = rng.integers(-1000, 1000, n).astype(np.int32)
    i[0], i[1] = 16777217, -16777217
    h = rand((n,)).astype(np.float16)
    q = rng.integers(-2000, 2000, n).astype(np.int64)
    f = rand((n,), 1)
    f[0], f[1] = 16777216.0, -16777216.0
    s = rng.integers(-128, 128, n).astype(np.int8)
    got = Kernels(mixed)(b, i, h, q, f, s)
    want = [b.astype(np.int32) + i, b.astype(np.float16) + h, q.astype(np.float16) + h,
            s * 0.5, i.astype(np.float32) == f, (s.astype(np.int64) + n).astype(np.int8),
            i.astype(np.float32) < f]
    dtypes = [np.int32, np.float16, np.float16, np.float64, np.bool_, np.int8, np.bool_]
    for j, (g, w, dt) in enumerate(zip(got, want, dtypes)):
        assert g.dtype == dt, (j, g.dtype, dt)
        assert np.array_equal(g, w), (j, g[:6], w[:6])
    assert got[4][0] and got[4][1]


# ------------------------------------------------------------------------------- edge values


def test_nan_propagates_through_max_min_and_their_elementwise_forms():
    """np.max/np.min propagate NaN, and so do np.maximum/np.minimum (kp.maximum is
    np.maximum, README); a ReLU of NaN is NaN; -inf rows reduce to -inf, +inf to +inf."""
    @kp.fusion
    def extrema(x: T[kp.f32, "a", "b"]):
        return (x.max(axis=-1), x.min(axis=0), x.max(), kp.maximum(x, 0.0),
                kp.minimum(x, 1.0), x.max(axis=0, keepdims=True) - x.min(axis=0, keepdims=True))

    x = rand((5, 257))
    x[0, 100] = np.nan
    x[1, :] = -np.inf
    x[2, 3] = np.inf
    x[3, 0] = np.float32(1e-45)          # a subnormal stays (NumPy does not flush)
    x[4, :] = -0.0
    got = Kernels(extrema)(x)
    want = reference(lambda x: (x.max(-1), x.min(0), x.max(), np.maximum(x, 0.0),
                                np.minimum(x, 1.0),
                                x.max(0, keepdims=True) - x.min(0, keepdims=True)), x)
    for j, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype == np.float32
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (j, np.argwhere(~same)[:5], g.ravel()[:5], w.ravel()[:5])
    assert got[3][3, 0] == np.float32(1e-45)


def test_half_sums_accumulate_wider_and_round_once():
    """README: float16/bfloat16 reductions accumulate wider and round once: 5000 ones sum to
    5000 (a float16 running sum stalls at 2048), and a bfloat16 row of 1 + many 2^-9 terms
    keeps them (a bfloat16 running sum would drop each)."""
    @kp.fusion
    def sums(h: T[kp.f16, "b", "n"], z: T[kp.bf16, "b", "n"]):
        return h.sum(axis=-1), z.sum(axis=-1), h.mean(axis=0)

    h = np.ones((2, 5000), np.float16)
    h[1] = np.float16(0.1)
    zf = np.full((2, 5000), 2.0 ** -9, np.float32)
    zf[:, 0] = 1.0
    got = Kernels(sums)(h, bf16(zf))
    assert got[0].dtype == np.float16 and got[1].dtype == np.uint16
    want_h = h.astype(np.float64).sum(-1).astype(np.float16)
    assert np.array_equal(got[0], want_h), (got[0], want_h)
    want_z = zf.astype(np.float64).sum(-1)       # 1 + 4999/512, exactly 10.763671875
    np.testing.assert_allclose(from_bf16(got[1]), want_z, rtol=2.0 ** -8)
    assert np.array_equal(got[2], h.astype(np.float64).mean(0).astype(np.float16))


def test_pure_arithmetic_ptx_does_not_flush_subnormals():
    """NumPy keeps subnormals; the emulator cannot see the GPU's flush-to-zero modes, so the
    PTX of a pure arithmetic fusion is checked: no ``.ftz`` on its adds, multiplies,
    divisions, square roots, min/max or conversions."""
    import re

    @kp.fusion
    def arith(x: T[kp.f32, "n"], y: T[kp.f32, "n"], h: T[kp.f16, "n"]):
        return (x * y + x / y - kp.sqrt(kp.abs(x)), kp.maximum(x, y),
                (h * h + h).astype(kp.f32), x.sum())

    compiled = kp.compile(arith, targets=["sm_80", "ptx"])
    ptx = [img.data for m in compiled.modules for img in m.images if img.kind == "ptx"][0]
    text = ptx.decode() if isinstance(ptx, bytes) else str(ptx)
    ops = set(re.findall(r"^\s*(?:@%p\d+\s+)?((?:add|sub|mul|div|sqrt|min|max|cvt|fma)"
                         r"[A-Za-z0-9_.]*)", text, re.M))
    assert any(op.startswith(("add", "mul")) and op.endswith("f32") for op in ops), ops
    assert not [op for op in ops if ".ftz" in op], sorted(ops)


# ------------------------------------------------------------------------------- more losses


def test_kl_divergence_and_entropy_of_two_logit_tensors_reduced_twice():
    """KL(softmax(p) || softmax(q)) per row and its batch mean, the mean entropy, a max of
    per-row values and a column sum reduced again: row reductions of two sources at one
    depth, then full reductions of their results (README: row kernels into workspaces, the
    outer reduction on a grid)."""
    def body(p, q, m):
        mp = p.max(-1, keepdims=True)
        lp = p - (m.log(m.exp(p - mp).sum(-1, keepdims=True)) + mp)
        mq = q.max(-1, keepdims=True)
        lq = q - (m.log(m.exp(q - mq).sum(-1, keepdims=True)) + mq)
        kl_rows = (m.exp(lp) * (lp - lq)).sum(-1)
        ent = -(m.exp(lp) * lp).sum(-1)
        return (kl_rows.mean(), kl_rows, ent.sum() / p.shape[0],
                (lp.max(-1) - lq.min(-1)).max(), lq.sum(0).mean())

    class NP:
        exp, log = staticmethod(np.exp), staticmethod(np.log)

    @kp.fusion
    def kl(p: T[kp.f32, "b", "v"], q: T[kp.f32, "b", "v"]):
        return body(p, q, kp)

    k = Kernels(kl)
    for b, v in ((1, 1), (300, 3), (2, 1000)):
        p, q = rand((b, v), 0, 3.0), rand((b, v), 1, 3.0)
        got = k(p, q)
        for j, (g, w) in enumerate(zip(got, reference(body, wide(p), wide(q), NP))):
            assert g.dtype == np.float32, (j, g.dtype)
            close(g, w, 1e-5, f"kl output {j} {(b, v)}")
        assert (got[1] >= -1e-6).all()


@pytest.mark.parametrize("half", ["f16", "bf16"])
def test_half_softmax_style_arithmetic_is_bit_exact_op_by_op(half):
    """README: float16/bfloat16 round to their own dtype after every pointwise op, and
    reductions accumulate wider and round once. Without transcendentals that fixes every
    bit: y = x - max(x), s = sum(y) (rounded once), y / s, y*y - 0.5, a column mean; rows
    of 5, 200, 1000 and 9000 (warp, block and block-loop kernels)."""
    kdt = kp.f16 if half == "f16" else kp.bf16

    @kp.fusion
    def arith(x: T[kdt, "b", "n"]):
        y = x - x.max(axis=-1, keepdims=True)
        s = y.sum(axis=-1, keepdims=True)
        return y / s, s, y * y - 0.5, x.mean(axis=0)

    def rnd(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, np.float32)
        with np.errstate(over="ignore"):
            return (v.astype(np.float16).astype(np.float32) if half == "f16"
                    else from_bf16(bf16(v)))

    k = Kernels(arith)
    rng = np.random.default_rng(8)
    for n in (5, 200, 1000, 9000):
        x = rnd(rng.standard_normal((3, n)) * 4)
        inp = x.astype(np.float16) if half == "f16" else bf16(x)
        got = [g.astype(np.float32) if half == "f16" else from_bf16(g) for g in k(inp)]
        y = rnd(x - x.max(-1, keepdims=True))
        s = rnd(y.astype(np.float64).sum(-1, keepdims=True))
        want = [rnd(y / s), s, rnd(rnd(y * y) - 0.5), rnd(x.astype(np.float64).mean(0))]
        for j, (g, w) in enumerate(zip(got, want)):
            bad = np.argwhere(g != w)
            assert not len(bad), (half, n, j, [(g[tuple(i)], w[tuple(i)]) for i in bad[:3]])


@pytest.mark.parametrize("body,kind,parts", [
    (lambda x: x / math.sqrt(x.shape[-1]), kp.TraceError, ["size d", "d ** 0.5"]),
    (lambda x: x / float(x.shape[-1]), kp.TraceError, ["size d", "no Python value"]),
    (lambda x: x + kp.f32(1e-5), TypeError, ["is a dtype", "write the number itself"]),
    (lambda x: max(x, 0.0), kp.TraceError, ["truth of a traced tensor", "kp.where"]),
    (lambda x: x.sum(-1, out=x), kp.TraceError, ["out=", "return the result"]),
    (lambda x: x.clamp(min=0), kp.TraceError, ["no attribute 'clamp'"]),
    (lambda x: x[-1], kp.TraceError, ["only ':', '...' and None"]),
    (lambda x: x[x > 0], kp.TraceError, ["only ':', '...' and None"]),
], ids=["math.sqrt(size)", "float(size)", "kp.f32(1e-5)", "builtin-max", "sum-out",
        "torch-clamp", "index", "boolean-mask-index"])
def test_porting_mistakes_are_trace_time_errors_that_say_what_to_write(body, kind, parts):
    """Mistakes an engineer porting from NumPy/torch makes first: each is refused while
    tracing (the README: float(n)/math.sqrt(n) are TraceErrors, kp.f32(1e-5) a TypeError
    saying what to write, out= refused), never compiled into something else."""
    @kp.fusion
    def ported(x: T[kp.f32, "b", "d"]):
        return body(x)

    with pytest.raises(kind) as info:
        ported.trace()
    for part in parts:
        assert part in str(info.value), (part, str(info.value))
