"""Review 27: composite, realistic fusions against NumPy, and their plans (no GPU).

The fusions ML and quantum-simulation users write, each built from several reductions and the
pointwise work around them: log-sum-exp over the last and the first axis, softmax over axis 0
and a middle axis, layer norm / RMS norm with weight and bias (keepdims and not), cross-entropy
from logits and int labels (label smoothing, an argmax-by-``where`` accuracy), attention score
scaling, batch/group norm over ``axis=(0, 2)`` / ``(1, 2)``, reductions broadcast back into the
input, several outputs sharing intermediates, ``kp.pad`` to ``1 << n`` and reductions over the
padded axis, ``kp.arange``/``kp.iota`` over size arithmetic, outputs that depend only on shapes
(or only on scalars), integer and bool reductions (NumPy's result dtypes), empty axes and empty
batches, and the four quantum state encodings of issue 3 (written here from the issue text),
symbolic and ``static=``.

They run through the host SIMT emulator (:mod:`tests.lowering.simt`), at shapes chosen to cross
the schedules' boundaries (rows of 1, 2, 31, 32, 33, 129, 257, 513; columns long enough for the
split column kernels), and are compared with float64 NumPy (exactly for integers and bools).
Plans come from ``kp.compile`` + ``kp.save`` + ``kp.load`` (and from the lowering's summary for
the wide sweeps): output shapes and dtypes, ``static=`` dims, and launch dimensions for huge
symbolic shapes within CUDA's limits, the fast planner agreeing with the reference planner.

Every test here passes: no wrong result and no wrong plan was found in this area. Noted, not
tested as bugs: a variant predicate can overflow int64 for an *empty* tensor whose other dims
multiply past 2^63 (softmax over axis 1 of shape (31, 0, 2^61): an ExpressionError where the
plan could be empty), and split row kernels refuse rows past ~2^43 elements (grid.x limit) with
a ConstraintError; neither size is reachable on a real device.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from lowering.simt import Kernels

import kernelpack as kp
from kernelpack._plan_fast import compile_fast
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.lowering import pipeline

T = kp.Tensor
# NumPy's references of empty means warn; kernelpack gives NaN there, as NumPy does
pytestmark = pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
RNG = np.random.default_rng(27)


def _check(got: object, ref: object, what: str, tol: float = 0.0) -> None:
    """Same dtype and shape as NumPy; equal (NaN where NumPy has NaN) for ``tol == 0``, else
    a max error relative to the reference's largest magnitude (at least 1)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    if ref.size == 0:
        return
    if tol == 0.0:
        assert np.array_equal(got, ref, equal_nan=ref.dtype.kind in "fc"), \
            f"{what}: {got.ravel()[:8].tolist()} != NumPy {ref.ravel()[:8].tolist()}"
        return
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    g, r = got.astype(wide), ref.astype(wide)
    assert np.array_equal(np.isnan(g), np.isnan(r)), f"{what}: NaN positions differ"
    assert np.array_equal(np.isinf(g), np.isinf(r)), f"{what}: infinities differ"
    keep = np.isfinite(r)
    if not keep.any():
        return
    err = float(np.max(np.abs(g[keep] - r[keep]))) / max(1.0, float(np.max(np.abs(r[keep]))))
    assert err <= tol, f"{what}: error {err:.2e} > {tol:.0e}"


def _f32(ref: np.ndarray) -> np.ndarray:
    return np.asarray(ref).astype(np.float32)


@functools.cache
def _kernels(fusion: kp.fusion, static: tuple = ()) -> Kernels:
    return Kernels(fusion, static=dict(static) or None)


def _summary(fusion: kp.fusion, static: dict | None = None):
    build = pipeline.run(pipeline.new_build(fusion, ["sm_80"], static or {}, {}),
                         stop="llvm_ir")
    return pipeline.summarize(build).summary


# ---- log-sum-exp and softmax over any axis ----------------------------------------------------

@kp.fusion
def logsumexp(x: T[kp.f32, "b", "n"], y: T[kp.f64, "a", "c"]):
    lse_last = kp.log(kp.exp(x - x.max(axis=-1, keepdims=True)).sum(axis=-1)) + x.max(axis=-1)
    m = y.max(axis=0, keepdims=True)
    lse_first = kp.log(kp.exp(y - m).sum(axis=0, keepdims=True)) + m
    return lse_last, lse_first


def _lse(x: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True) if x.shape[axis] else np.full_like(
        x.sum(axis=axis, keepdims=True), -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else out.squeeze(axis)


@pytest.mark.parametrize("sx,sy", [((1, 1), (1, 1)), ((2, 31), (33, 2)), ((3, 33), (300, 3)),
                                   ((2, 257), (64, 8)), ((3, 0), (0, 4)), ((0, 5), (2, 0))])
def test_logsumexp_over_the_last_and_the_first_axis(sx, sy):
    x = (RNG.standard_normal(sx) * 10).astype(np.float32)
    y = RNG.standard_normal(sy) * 30
    got = _kernels(logsumexp)(x, y)
    # an empty reduced axis: max is -inf (README), exp(x - m) sums to 0, log(0) + -inf = -inf
    _check(got[0], _f32(_lse(x.astype(np.float64), -1, False)), f"lse last {sx}", 1e-6)
    _check(got[1], _lse(y, 0, True), f"lse first {sy}", 1e-13)


@kp.fusion
def softmaxes(x: T[kp.f32, "a", "b", "c"]):
    e0 = kp.exp(x - x.max(axis=0, keepdims=True))
    e1 = kp.exp(x - x.max(axis=1, keepdims=True))
    return e0 / e0.sum(axis=0, keepdims=True), e1 / e1.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 4), (3, 33, 2), (31, 2, 3), (2, 300, 4),
                                   (1, 257, 1), (0, 3, 2), (2, 0, 3)])
def test_softmax_over_axis_zero_and_a_middle_axis(shape):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    xd = x.astype(np.float64)
    got = _kernels(softmaxes)(x)
    for axis, g in zip((0, 1), got):
        e = np.exp(xd - (xd.max(axis=axis, keepdims=True) if xd.size else 0))
        _check(g, _f32(e / e.sum(axis=axis, keepdims=True)), f"softmax axis {axis} {shape}", 1e-6)


# ---- normalizations --------------------------------------------------------------------------

@kp.fusion
def norms(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], bias: T[kp.f32, "n"], eps: kp.f32):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    layer = (x - mu) / kp.sqrt(var + eps) * w + bias
    ms = (x * x).mean(axis=-1)                                   # no keepdims: [:, None] back
    rms = x * kp.rsqrt(ms[:, None] + eps) * w
    return layer, rms, mu, var.sum(axis=-1), ms


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 129, 257, 513])
def test_layernorm_and_rmsnorm_with_weight_and_bias(n):
    x = RNG.standard_normal((3, n)).astype(np.float32)
    w, b = (RNG.standard_normal(n).astype(np.float32) for _ in range(2))
    got = _kernels(norms)(x, w, b, 1e-5)
    xd = x.astype(np.float64)
    mu = xd.mean(-1, keepdims=True)
    var = ((xd - mu) ** 2).mean(-1, keepdims=True)
    ms = (xd * xd).mean(-1)
    refs = ((xd - mu) / np.sqrt(var + 1e-5) * w + b, xd / np.sqrt(ms[:, None] + 1e-5) * w,
            mu, var.sum(-1), ms)
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, _f32(r), f"norm output {k}, n={n}", 2e-6)


@kp.fusion
def shared_intermediates(x: T[kp.f32, "b", "n"]):
    s = x.sum(axis=1)
    ss = (x * x).sum(axis=1)
    mu = s / x.shape[1]
    var = ss / x.shape[1] - mu * mu
    z = (x - mu[:, None]) * kp.rsqrt(var[:, None] + 1e-6)
    return s, ss, z, x.sum(axis=0), x.max(axis=0), x.min(axis=1), x - x.mean(axis=1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1), (2, 31), (3, 32), (2, 257), (33, 2)])
def test_several_outputs_share_sums_and_reduce_different_axes(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    got = _kernels(shared_intermediates)(x)
    xd = x.astype(np.float64)
    s, ss = xd.sum(1), (xd * xd).sum(1)
    # the normalized tensor goes through E[x^2] - E[x]^2, which cancels in float32: compare
    # it with NumPy's float32 evaluation of the same formula
    n = np.float32(shape[1])
    s32, ss32 = x.sum(1, dtype=np.float32), (x * x).sum(1, dtype=np.float32)
    mu32 = s32 / n
    z32 = (x - mu32[:, None]) / np.sqrt(ss32[:, None] / n - (mu32 * mu32)[:, None]
                                        + np.float32(1e-6))
    refs = (s, ss, z32, xd.sum(0), xd.max(0), xd.min(1), xd - xd.mean(1, keepdims=True))
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, _f32(r), f"output {k}, {shape}", 5e-5 if k == 2 else 2e-6)


@kp.fusion
def batch_and_group_norm(x: T[kp.f64, "a", "b", "c"], w: T[kp.f64, "b"], v: T[kp.f64, "c", "d"]):
    m = x.mean(axis=(0, 2), keepdims=True)
    var = ((x - m) ** 2).mean(axis=(0, 2), keepdims=True)
    bn = (x - m) / kp.sqrt(var + 1e-5) * w[None, :, None]
    gm = x.mean(axis=(1, 2), keepdims=True)
    gn = (x - gm) * kp.rsqrt(((x - gm) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5)
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    att = (e / e.sum(axis=-1, keepdims=True))[:, :, :, None] * v[None, None, :, :]
    centered = x - x.mean(axis=0, keepdims=True)
    gram = (x[:, :, None, :] * x[:, None, :, :]).sum(axis=-1)
    mx = x.max(axis=(0, 1), keepdims=True)
    lse01 = kp.log(kp.exp(x - mx).sum(axis=(0, 1), keepdims=True)) + mx
    return (x.mean(axis=(0, 2)), var, bn, gn, att.sum(axis=2), (centered ** 2).sum(axis=2),
            gram, lse01, x.sum(2).max(0), bn.sum(axis=0))


@pytest.mark.parametrize("shape,d", [((1, 1, 1), 1), ((2, 3, 4), 2), ((2, 2, 33), 3),
                                     ((33, 2, 2), 1)])
def test_batch_norm_group_norm_attention_and_gram_over_mixed_axes(shape, d):
    x, w, v = RNG.standard_normal(shape), RNG.standard_normal(shape[1]), \
        RNG.standard_normal((shape[2], d))
    got = _kernels(batch_and_group_norm)(x, w, v)
    m = x.mean((0, 2), keepdims=True)
    var = ((x - m) ** 2).mean((0, 2), keepdims=True)
    bn = (x - m) / np.sqrt(var + 1e-5) * w[None, :, None]
    gm = x.mean((1, 2), keepdims=True)
    gn = (x - gm) / np.sqrt(((x - gm) ** 2).mean((1, 2), keepdims=True) + 1e-5)
    e = np.exp(x - x.max(-1, keepdims=True))
    mx = x.max((0, 1), keepdims=True)
    refs = (x.mean((0, 2)), var, bn, gn, np.einsum("abc,cd->abd", e / e.sum(-1, keepdims=True), v),
            ((x - x.mean(0, keepdims=True)) ** 2).sum(2), np.einsum("abk,ack->abc", x, x),
            np.log(np.exp(x - mx).sum((0, 1), keepdims=True)) + mx, x.sum(2).max(0), bn.sum(0))
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, r, f"output {k}, {shape}", 1e-11)


@kp.fusion
def column_stats(x: T[kp.f32, "a", "b"], y: T[kp.f64, "p", "m", "c"], i: T[kp.i32, "a", "b"]):
    c = x - x.mean(axis=0, keepdims=True)
    e = kp.exp(x - x.max(axis=0, keepdims=True))
    yc = y - y.mean(axis=1, keepdims=True)
    return (c, (c * c).mean(axis=0), e / e.sum(axis=0, keepdims=True), y.mean(axis=1),
            (yc * yc).sum(axis=1), i.sum(axis=0), i.mean(axis=0), (i > 0).sum(axis=0),
            i.max(axis=0), y.max(axis=(0, 1)))


@pytest.mark.parametrize("sx,sy", [((300, 3), (2, 300, 4)), ((257, 8), (3, 64, 2)),
                                   ((1000, 1), (1, 1000, 2)), ((1, 4), (2, 1, 4))])
def test_column_reductions_broadcast_back_through_the_split_kernels(sx, sy):
    x = RNG.standard_normal(sx).astype(np.float32)
    y = RNG.standard_normal(sy)
    i = RNG.integers(-2 ** 31, 2 ** 31, sx).astype(np.int32)   # the int64 sums exceed int32
    k = _kernels(column_stats)
    got = k(x, y, i)
    xd = x.astype(np.float64)
    c = xd - xd.mean(0, keepdims=True)
    e = np.exp(xd - xd.max(0, keepdims=True))
    yc = y - y.mean(1, keepdims=True)
    refs = (_f32(c), _f32((c * c).mean(0)), _f32(e / e.sum(0, keepdims=True)), y.mean(1),
            (yc * yc).sum(1), i.sum(0), i.mean(0), (i > 0).sum(0), i.max(0), y.max((0, 1)))
    for j, (g, r) in enumerate(zip(got, refs)):
        _check(g, r, f"output {j}, {sx} {sy}",
               0.0 if r.dtype.kind in "iub" else (2e-6 if r.dtype == np.float32 else 1e-13))


# ---- cross-entropy, label smoothing, accuracy, attention scaling ------------------------------

@kp.fusion
def cross_entropy(logits: T[kp.f32, "b", "c"], labels: T[kp.i64, "b"], eps: kp.f32):
    C = logits.shape[1]
    m = logits.max(axis=1, keepdims=True)
    lse = kp.log(kp.exp(logits - m).sum(axis=1)) + logits.max(axis=1)
    picked = kp.where(kp.arange(C)[None, :] == labels[:, None], logits, 0.0).sum(axis=1)
    loss = lse - picked
    logp = logits - m - kp.log(kp.exp(logits - m).sum(axis=1, keepdims=True))
    onehot = (kp.arange(C)[None, :] == labels[:, None]).astype(kp.f32)
    smooth = -((onehot * (1 - eps) + eps / C) * logp).sum(axis=1).mean()
    argmax = kp.where(logits == m, kp.arange(C)[None, :], C).min(axis=1)
    return loss, loss.mean(), smooth, argmax, (argmax == labels).mean(), onehot.sum(axis=0)


@pytest.mark.parametrize("shape", [(1, 1), (3, 31), (4, 257), (33, 5), (0, 5)])
def test_cross_entropy_label_smoothing_and_argmax_accuracy(shape):
    b, c = shape
    logits = RNG.integers(-4, 4, shape).astype(np.float32)   # ties: argmax takes the first
    labels = RNG.integers(0, c, b)
    got = _kernels(cross_entropy)(logits, labels, 0.1)
    x = logits.astype(np.float64)
    with np.errstate(invalid="ignore"):
        m = x.max(1, keepdims=True) if b else np.zeros((0, 1))
        logp = x - m - np.log(np.exp(x - m).sum(1, keepdims=True))
        loss = -logp[np.arange(b), labels]
        onehot = (np.arange(c)[None, :] == labels[:, None])
        smooth = -((onehot * 0.9 + 0.1 / c) * logp).sum(1).mean()
        argmax = x.argmax(1) if b else np.zeros(0, np.int64)
        refs = (_f32(loss), np.float32(loss.mean()), np.float32(smooth), argmax,
                (argmax == labels).mean(), onehot.astype(np.float32).sum(0))
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, r, f"output {k}, {shape}", 0.0 if k in (3, 5) else 2e-6)


@kp.fusion
def attention_scale(q: T[kp.f32, "b", "h", "d"]):
    return q / q.shape[-1] ** 0.5, q * (1.0 / q.shape[-1]), q / np.sqrt(q.shape[-1])


def test_attention_score_scaling_by_a_size_is_float32_exact():
    # README: floats computed from sizes alone stay weak, so the divisor is float32(sqrt(d))
    for shape in [(1, 2, 3), (2, 3, 7), (1, 1, 64)]:
        q = RNG.standard_normal(shape).astype(np.float32)
        d = shape[-1]
        got = _kernels(attention_scale)(q)
        for g, r in zip(got, (q / np.float32(d ** 0.5), q * np.float32(1.0 / d),
                              q / np.float32(np.sqrt(d)))):
            _check(g, r, f"scaling {shape}")


# ---- integer and bool reductions: NumPy's dtypes ----------------------------------------------

@kp.fusion
def int_reductions(i: T[kp.i32, "b", "n"], m: T[kp.bool_, "b", "n"], u: T[kp.u8, "b", "n"],
                   p: T[kp.i64, "b", "n"], x: T[kp.f32, "b", "n"], h: T[kp.f16, "b", "n"]):
    return (i.sum(axis=1), i.sum(), i.mean(axis=1), i.mean(), m.sum(axis=1), m.sum(),
            m.mean(axis=1), p.prod(axis=1), i.prod(axis=0), u.sum(axis=0), u.prod(axis=1),
            (i > 0).sum(axis=(0, 1)), i.sum(axis=0, dtype=kp.i64), u.mean(axis=1), m.prod(axis=1),
            i.mean(axis=1, dtype=kp.f32), x.sum(axis=1, dtype=kp.f64), h.mean(axis=1),
            i.sum(axis=1) / i.shape[1], kp.arange(i.shape[1]) / i.shape[1], x.sum() / x.size,
            kp.where(x > 0, 1, 0).sum(axis=1), m.sum(axis=1, dtype=kp.i32))


def _int_refs(i, m, u, p, x, h):
    with np.errstate(all="ignore"):
        return (i.sum(1), i.sum(), i.mean(1), i.mean(), m.sum(1), m.sum(), m.mean(1), p.prod(1),
                i.prod(0), u.sum(0), u.prod(1), (i > 0).sum(axis=(0, 1)), i.sum(0, dtype=np.int64),
                u.mean(1), m.prod(1), i.mean(1, dtype=np.float32), x.sum(1, dtype=np.float64),
                h.mean(1), i.sum(1) / i.shape[1], np.arange(i.shape[1]) / i.shape[1],
                np.float32(x.sum() / np.float32(x.size)), np.where(x > 0, 1, 0).sum(1),
                m.sum(1, dtype=np.int32))


@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (33, 2), (0, 3), (3, 0)])
def test_integer_bool_and_mixed_reductions_take_numpys_dtypes(shape):
    i = RNG.integers(-2 ** 30, 2 ** 30, shape).astype(np.int32)
    m = RNG.random(shape) < 0.4
    u = RNG.integers(0, 256, shape).astype(np.uint8)
    p = RNG.integers(-3, 4, shape)
    x = RNG.standard_normal(shape).astype(np.float32)
    h = RNG.standard_normal(shape).astype(np.float16)
    got = _kernels(int_reductions)(i, m, u, p, x, h)
    for k, (g, r) in enumerate(zip(got, _int_refs(i, m, u, p, x, h))):
        r = np.asarray(r)
        tol = 0.0 if r.dtype.kind in "iub" else {np.float16: 1e-3, np.float32: 1e-6}.get(
            r.dtype.type, 1e-12)
        _check(g, r, f"reduction {k}, {shape}", tol)


# ---- pad, arange, iota, shape-only outputs ----------------------------------------------------

def _np_pad(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


@kp.fusion
def padded(x: T[kp.f32, "b", "l"], n: kp.i64):
    N = 1 << n
    p = kp.pad(x, N, axis=-1)
    e = kp.exp(p - p.max(axis=-1, keepdims=True))
    q = kp.pad(x, x.shape[0] + 2, axis=0)
    return (p.max(axis=-1), p.sum(axis=0), e / e.sum(axis=-1, keepdims=True), q.mean(axis=0),
            kp.pad(x - x.mean(axis=1, keepdims=True), N, axis=1),
            kp.pad(kp.pad(x, 2 * x.shape[1] + 1, axis=1), x.shape[0] + 1, axis=0))


@pytest.mark.parametrize("shape,n", [((1, 1), 0), ((2, 3), 2), ((1, 31), 5), ((2, 33), 6),
                                     ((3, 1), 8), ((2, 0), 1)])
def test_pad_to_a_power_of_two_then_reduce_over_the_zeros(shape, n):
    x = (-np.abs(RNG.standard_normal(shape)) - 1).astype(np.float32)  # negative: max sees 0s
    got = _kernels(padded)(x, n)
    xd, N = x.astype(np.float64), 1 << n
    p = _np_pad(xd, N, 1)
    e = np.exp(p - p.max(-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        centered = xd - xd.mean(1, keepdims=True)
    refs = (p.max(-1), p.sum(0), e / e.sum(-1, keepdims=True), _np_pad(xd, shape[0] + 2, 0).mean(0),
            _np_pad(centered, N, 1), _np_pad(_np_pad(xd, 2 * shape[1] + 1, 1), shape[0] + 1, 0))
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, _f32(r), f"output {k}, {shape} n={n}", 1e-6)


@kp.fusion
def sizes_only(x: T[kp.f32, "n", "m"]):
    n, m = x.shape
    return (kp.arange(2 * n), kp.arange(n, -1, -1), kp.arange(n).astype(kp.f32),
            kp.arange(1, 2 * n + 1, 2) * 1.0, kp.iota((n, 2 * m), 1, kp.i32), kp.arange(n).sum(),
            kp.arange(n, dtype=kp.f32).mean(), kp.iota((n, m), 1, kp.f64).sum(axis=1),
            (x * 0 + 1).sum(axis=1), kp.arange(n)[:, None] * kp.arange(m)[None, :] % 7,
            (kp.arange(m) < n).sum(), kp.arange(m + 1).max())


@pytest.mark.parametrize("shape", [(0, 0), (2, 7), (33, 0), (0, 5)])
def test_arange_and_iota_over_size_arithmetic_and_shape_only_outputs(shape):
    n, m = shape
    got = _kernels(sizes_only)(np.zeros(shape, np.float32))
    with np.errstate(invalid="ignore"):
        refs = (np.arange(2 * n), np.arange(n, -1, -1), np.arange(n).astype(np.float32),
                np.arange(1, 2 * n + 1, 2) * 1.0,
                np.broadcast_to(np.arange(2 * m, dtype=np.int32), (n, 2 * m)),
                np.arange(n).sum(), np.arange(n, dtype=np.float32).mean(),
                np.broadcast_to(np.arange(m, dtype=np.float64), (n, m)).sum(1),
                np.ones(shape, np.float32).sum(1), np.arange(n)[:, None] * np.arange(m) % 7,
                (np.arange(m) < n).sum(), np.arange(m + 1).max())
    for k, (g, r) in enumerate(zip(got, refs)):
        _check(g, r, f"output {k}, {shape}")


@kp.fusion
def scalars_only(n: kp.i64, t: kp.f32):
    a = kp.arange(n)
    return a.sum(), kp.arange(1 << n).astype(kp.f32) * t, (a * a).sum()


def test_a_fusion_of_scalars_alone_sizes_its_outputs_from_them():
    k = _kernels(scalars_only)
    for n in (0, 1, 5):
        got = k(n, 0.5)
        refs = (np.arange(n).sum(), np.arange(1 << n).astype(np.float32) * np.float32(0.5),
                (np.arange(n) ** 2).sum())
        for j, (g, r) in enumerate(zip(got, refs)):
            _check(g, r, f"output {j}, n={n}")


# ---- quantum encodings (issue 3), written from the issue text --------------------------------

def _encodings(dt, ct):
    @kp.fusion(name=f"encodings_{dt}")
    def encodings(x: T[dt, "b", "n"], j: T[kp.i64, "b"], v: T[dt, "b", "l"]):
        n = x.shape[1]
        N = 1 << n
        bits = (kp.arange(N)[:, None] >> kp.arange(n)[None, :]) & 1    # (N, n): bit k of b
        phi = (x[:, None, :] * bits[None, :, :]).sum(axis=-1)
        phase = kp.exp(1j * phi) * 2.0 ** (-n / 2)
        phase2 = kp.complex(kp.cos(phi), kp.sin(phi)) / kp.sqrt(2 ** n)
        angle = kp.where(bits[None] == 1, kp.sin(x)[:, None, :], kp.cos(x)[:, None, :])
        basis = (kp.arange(N)[None, :] == j[:, None]).astype(ct)
        amplitude = kp.pad(v * kp.rsqrt((v * v).sum(axis=-1, keepdims=True)), N, axis=-1)
        return phase, phase2, angle.prod(axis=-1), basis, amplitude
    return encodings


ENC = {"f32": _encodings(kp.f32, kp.c64), "f64": _encodings(kp.f64, kp.c128)}


def _encoding_refs(x, j, v):
    b, n = x.shape
    N = 1 << n
    bits = (np.arange(N)[:, None] >> np.arange(n)[None, :]) & 1
    phase = np.exp(1j * (x[:, None, :] * bits[None]).sum(-1)) * 2.0 ** (-n / 2)
    angle = np.where(bits[None] == 1, np.sin(x)[:, None, :], np.cos(x)[:, None, :]).prod(-1)
    basis = np.zeros((b, N), complex)
    basis[np.arange(b), j] = 1
    amplitude = _np_pad(v / np.linalg.norm(v, axis=1, keepdims=True), N, 1)
    return phase, phase, angle, basis, amplitude


@pytest.mark.parametrize("kind,real,cplx,tol", [("f32", np.float32, np.complex64, 2e-6),
                                                ("f64", np.float64, np.complex128, 1e-12)])
def test_quantum_encodings_for_one_to_five_qubits(kind, real, cplx, tol):
    k = _kernels(ENC[kind])
    for n, b in itertools.product(range(1, 6), (1, 3)):
        x = RNG.uniform(-3, 3, (b, n)).astype(real)
        j = RNG.integers(0, 1 << n, b)
        v = RNG.standard_normal((b, max(1, (1 << n) - 1))).astype(real)
        got = k(x, j, v)
        refs = _encoding_refs(x.astype(np.float64), j, v.astype(np.float64))
        for name, g, r, dt in zip(("phase", "phase2", "angle", "basis", "amplitude"), got, refs,
                                  (cplx, cplx, real, cplx, real)):
            _check(g, r.astype(dt), f"{name} {kind} n={n} B={b}", tol)


def test_quantum_encodings_of_zero_qubits_and_of_an_empty_batch():
    k = _kernels(ENC["f64"])
    for b in (0, 2):
        x, j, v = np.zeros((b, 0)), np.zeros(b, np.int64), np.ones((b, 1))
        phase, phase2, angle, basis, amp = k(x, j, v)
        _check(phase, np.ones((b, 1), complex), f"phase B={b}")
        _check(phase2, np.ones((b, 1), complex), f"phase2 B={b}")
        _check(angle, np.ones((b, 1)), f"angle B={b}")       # an empty product is 1
        _check(basis, np.ones((b, 1), complex), f"basis B={b}")
        _check(amp, np.ones((b, 1)), f"amplitude B={b}")


def test_static_qubit_count_gives_the_symbolic_results_and_fixes_the_plan():
    sym, static = _kernels(ENC["f32"]), _kernels(ENC["f32"], (("n", 4),))
    for b in (1, 3):
        x = RNG.uniform(-3, 3, (b, 4)).astype(np.float32)
        j = RNG.integers(0, 16, b)
        v = RNG.standard_normal((b, 9)).astype(np.float32)
        for k, (a, s) in enumerate(zip(sym(x, j, v), static(x, j, v))):
            _check(s, a, f"static output {k}, B={b}", 1e-7)
    plan = static.planner.plan((5, 4), (5,), (5, 16))
    outs = _outputs(plan)
    assert outs == {"out0": ((5, 16), "complex64"), "out1": ((5, 16), "complex64"),
                    "out2": ((5, 16), "float32"), "out3": ((5, 16), "complex64"),
                    "out4": ((5, 16), "float32")}, outs
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[1\] is 5, expected 4"):
        static.planner.plan((5, 5), (5,), (5, 16))
    with pytest.raises(kp.ConstraintError, match="pad"):   # v longer than 2^n
        static.planner.plan((5, 4), (5,), (5, 17))


@kp.fusion
def state_observables(a: T[kp.c64, "b", "N"], c: T[kp.c64, "b", "N"], n: kp.i64):
    p = (a * kp.conj(a)).real
    bits = (kp.arange(a.shape[1])[None, :] >> kp.arange(n)[:, None]) & 1     # (n, N)
    overlap = (kp.conj(a) * c).sum(axis=-1)
    return (a / kp.sqrt(p.sum(axis=-1, keepdims=True)),
            (p[:, None, :] * (1 - 2 * bits)[None, :, :]).sum(axis=-1),      # <Z_k>
            overlap, abs(overlap) ** 2, a.mean(axis=0), a.prod(axis=-1), abs(a).max(axis=1))


@pytest.mark.parametrize("b,n", [(1, 1), (3, 2), (2, 5), (33, 3)])
def test_state_norm_z_expectations_and_fidelity(b, n):
    N = 1 << n
    a, c = ((0.9 * (RNG.standard_normal((b, N)) + 1j * RNG.standard_normal((b, N))))
            .astype(np.complex64) for _ in range(2))
    got = _kernels(state_observables)(a, c, n)
    ad, cd = a.astype(np.complex128), c.astype(np.complex128)
    p = (ad * ad.conj()).real
    bits = (np.arange(N)[None, :] >> np.arange(n)[:, None]) & 1
    overlap = (ad.conj() * cd).sum(-1)
    refs = (ad / np.sqrt(p.sum(-1, keepdims=True)), (p[:, None, :] * (1 - 2 * bits)[None]).sum(-1),
            overlap, np.abs(overlap) ** 2, ad.mean(0), ad.prod(-1), np.abs(ad).max(1))
    for k, (g, r) in enumerate(zip(got, refs)):
        r = r.astype(np.complex64 if r.dtype.kind == "c" else np.float32)
        _check(g, r, f"output {k}, B={b} n={n}", 2e-6)


# ---- plans: compile, save, load; huge shapes -------------------------------------------------

@functools.lru_cache(maxsize=1)
def _pack() -> kp.Pack:
    static = kp.compile(norms, targets=["sm_80"], static={"n": 4})
    programs = [kp.compile(f, targets=["sm_80"])
                for f in (int_reductions, cross_entropy, padded, softmaxes)]
    return kp.load(kp.save(programs + [static]))


def _outputs(plan) -> dict:
    return {a.name: (a.shape, a.dtype.name) for a in plan.allocations.values()
            if a.kind == "output"}


def test_loaded_plans_give_numpys_output_shapes_and_dtypes():
    pack = _pack()
    for b, n in [(3, 5), (0, 2), (1, 0), (1 << 20, 4096)]:
        s = (b, n)
        outs = _outputs(pack["int_reductions"].plan(i=s, m=s, u=s, p=s, x=s, h=s))
        refs = _int_refs(*(np.zeros((min(b, 2), min(n, 2)), dt) for dt in
                           (np.int32, bool, np.uint8, np.int64, np.float32, np.float16)))
        for k, r in enumerate(refs):
            r = np.asarray(r)
            assert outs[f"out{k}"][1] == r.dtype.name, (k, outs[f"out{k}"], r.dtype)
            assert len(outs[f"out{k}"][0]) == r.ndim, (k, outs[f"out{k}"], r.shape)
        assert outs["out0"][0] == (b,) and outs["out2"][0] == (b,) and outs["out8"][0] == (n,)
        assert outs["out1"][0] == () and outs["out19"][0] == (n,)
    ce = pack["cross_entropy"].plan(logits=(7, 1000), labels=(7,), eps=0.1)
    assert _outputs(ce) == {"out0": ((7,), "float32"), "out1": ((), "float32"),
                            "out2": ((), "float32"), "out3": ((7,), "int64"),
                            "out4": ((), "float64"), "out5": ((1000,), "float32")}
    pad = pack["padded"].plan(x=(3, 5), n=4)
    assert _outputs(pad) == {"out0": ((3,), "float32"), "out1": ((16,), "float32"),
                             "out2": ((3, 16), "float32"), "out3": ((5,), "float32"),
                             "out4": ((3, 16), "float32"), "out5": ((4, 11), "float32")}
    with pytest.raises(kp.ConstraintError, match="pad"):
        pack["padded"].plan(x=(3, 17), n=4)
    static = pack["norms"]
    assert _outputs(static.plan(x=(9, 4), w=(4,), bias=(4,))) == {
        "out0": ((9, 4), "float32"), "out1": ((9, 4), "float32"), "out2": ((9, 1), "float32"),
        "out3": ((9,), "float32"), "out4": ((9,), "float32")}
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[1\] is 5, expected 4"):
        static.plan(x=(9, 5), w=(5,), bias=(5,))


def _within_limits(plan, what: str) -> None:
    for launch in plan.launches:
        grid, block = launch.grid, launch.block
        assert min(grid) >= 0 and min(block) >= 1, (what, launch)
        if 0 in grid:
            continue     # documented: never issued (an empty tensor, or the other colsplit)
        assert grid[0] <= 2 ** 31 - 1 and grid[1] <= 65535 and grid[2] <= 65535, (what, launch)
        assert block[0] * block[1] * block[2] <= 1024 and 0 <= launch.shared_mem <= 227 * 1024, \
            (what, launch)


def test_huge_symbolic_shapes_plan_within_cuda_limits():
    pack = _pack()
    sm = pack["softmaxes"]
    for shape in [(1, 1, 1), (70000, 2, 3), (2, 70000, 3), (1 << 20, 64, 4), (4, 1 << 20, 64),
                  (64, 4, 1 << 20), (1 << 16, 1 << 16, 1), (1 << 31, 1, 2)]:
        plan = sm.plan(x=shape)
        _within_limits(plan, f"softmaxes {shape}")
        assert _outputs(plan) == {"out0": (shape, "float32"), "out1": (shape, "float32")}
        assert any(0 not in launch.grid for launch in plan.launches)
    ce = pack["cross_entropy"]
    for shape in [(1 << 20, 4096), (1 << 31, 2), (2, 1 << 31), (70000, 70000), (1, 1 << 26)]:
        _within_limits(ce.plan(logits=shape, labels=shape[:1], eps=0.1), f"ce {shape}")
    for b, l, n in [(128, 1000, 20), (1 << 20, 3, 2), (1, 1 << 20, 30), (70000, 1, 10)]:
        plan = pack["padded"].plan(x=(b, l), n=n)
        _within_limits(plan, f"padded {(b, l, n)}")
        assert _outputs(plan)["out4"] == ((b, 1 << n), "float32")


@pytest.mark.parametrize("fusion", [softmaxes, norms, cross_entropy, column_stats, padded,
                                    batch_and_group_norm, ENC["f32"]], ids=lambda f: f.name)
def test_fast_planner_agrees_with_the_reference_on_a_sweep_of_sizes(fusion):
    summary = _summary(fusion)
    ref, fast = ReferencePlanner(summary), compile_fast(summary)
    sizes = [0, 1, 2, 31, 33, 257, 4096, 65537, 1 << 20, (1 << 31) + 1]
    rng = np.random.default_rng(7)
    tensors = [p for p in summary.inputs if isinstance(p, kp.Tensor)]
    n_scalars = len(summary.inputs) - len(tensors)
    planned = 0
    for _ in range(150):
        env: dict[str, int] = {}
        shapes = [tuple(int(d.value) if d.is_const else
                        env.setdefault(str(d), int(rng.choice(sizes))) for d in p.shape)
                  for p in tensors]
        scalars = [int(rng.choice([0, 3, 9, 20]))] * n_scalars
        try:
            want = ref.plan_shapes(shapes, scalars)
        except kp.ConstraintError:
            if fast is not None:
                assert fast(shapes, scalars) is None, (shapes, scalars)
            continue
        planned += 1
        _within_limits(want, f"{fusion.name} {shapes}")
        got = fast(shapes, scalars) if fast is not None else None
        if got is not None:
            assert (got.variant, got.launches, dict(got.allocations)) == \
                (want.variant, want.launches, dict(want.allocations)), (shapes, scalars)
    assert planned >= 25
