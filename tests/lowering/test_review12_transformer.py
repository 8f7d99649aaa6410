"""Review 12: the fused ops of a transformer, written from README.md alone, held to NumPy.

An ML engineer porting a model writes each op the way the README shows (``@kp.fusion`` over
symbolic dims, ``x.max(axis=-1, keepdims=True)``, ``kp.where``, ``kp.arange``, several outputs
as a tuple), compiles it for ``sm_80``, ``sm_90`` and PTX, saves and loads the artifact, and
runs the *loaded* program's plan on the SIMT emulator (:mod:`.simt`): outputs start as NaN, so
an element the plan misses shows. Each result is compared with NumPy in float64: within 1e-5
(float32) / 1e-12 (float64) relative to the reference's largest magnitude, infinities in the
same places, integers and bools exactly. float16/bfloat16 outputs of float32 math are off by
their final rounding alone (half an ulp: 2^-11 and 2^-8 relative), so they are held to twice
that. Shapes include 0, 1, primes and non-multiples of the 4-wide vector groups.

What the DSL has no op for is written the way the README allows, and the test says so:
slicing (``x[..., :d // 2]``) is refused, so a packed gate/up projection or rotate-half is read
through a one-hot sum over a size-2 axis (or passed as two inputs); ``round``/``clip`` have no
op, so quantization spells out round-half-to-even with ``kp.floor`` and clips with
``kp.minimum``/``kp.maximum``. The error messages for those are checked at the end.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close
from .test_review11_stranger_workloads import loaded, planned_at_scale, rand, within_limits

T = kp.Tensor
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
       np.dtype(np.float16): 2.0 ** -10, "bfloat16": 2.0 ** -7}
ERF = np.vectorize(math.erf, otypes=[np.float64])


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as the uint16 bits the emulator
    stores (NumPy has no bfloat16)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def _value(v: Any) -> Any:
    """An input as the reference sees it: floats in float64, bfloat16 bits (uint16: no other
    uint16 input appears here) as their float64 values."""
    if isinstance(v, np.ndarray) and v.dtype == np.uint16:
        return (v.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float64)
    return v


def _float_dtype(inputs: tuple) -> np.dtype:
    floats = [v.dtype for v in inputs if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    return np.dtype(np.float64 if np.dtype(np.float64) in floats else np.float32)


def same(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """Integers and bools exactly; floats: infinities (a fully masked logsumexp) where the
    reference has them, the rest within ``tol`` (:func:`.simt.assert_close`)."""
    if want.dtype.kind in "biu":
        assert np.array_equal(got, want), f"{what}: {got} != {want}"
        return
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"{what}: infinities differ"
    assert_close(np.where(inf, 0, got), np.where(inf, 0, want), tol, what)


def check(fusion: kp.fusion, cases: list[tuple], ref: Callable[..., Any],
          dtypes: list[Any] | None = None, tol: float | None = None) -> Any:
    """Compile for two cubins + PTX, save, load; run every case under the loaded plan and
    compare each output's shape, byte size, dtype (``dtypes``, else the inputs' float width
    for float outputs and the reference's dtype for the rest) and values with ``ref`` run on
    float64 inputs. Returns the loaded program."""
    program = loaded(fusion)
    kernels = Kernels(fusion)
    kernels.planner = program.planner
    for inputs in cases:
        shapes = [v.shape if isinstance(v, np.ndarray) else v for v in inputs]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's mean of an empty axis
            want = ref(*[_value(v) for v in inputs])
        want = [np.asarray(w) for w in (want if isinstance(want, tuple) else (want,))]
        plan = program.plan(*shapes)
        outs = [a for a in plan.allocations.values() if a.kind == "output"]
        assert len(outs) == len(want), (fusion.name, shapes, [a.name for a in outs])
        got = kernels(*inputs)
        for i, (alloc, g, w) in enumerate(zip(outs, got, want)):
            what = f"{fusion.name} {shapes} {alloc.name}"
            assert alloc.shape == w.shape == g.shape, (what, alloc.shape, w.shape)
            assert alloc.nbytes == math.prod(alloc.shape) * alloc.dtype.itemsize, what
            expect = dtypes[i] if dtypes else (
                _float_dtype(inputs) if w.dtype.kind == "f" else w.dtype)
            if isinstance(expect, str):  # "bfloat16": the emulator's uint16 bits
                assert alloc.dtype.name == expect, (what, alloc.dtype)
                g = (g.astype(np.uint32) << 16).view(np.float32)
            else:
                assert alloc.dtype.name == np.dtype(expect).name == g.dtype.name, (what, g.dtype)
            key = expect if isinstance(expect, str) else np.dtype(expect)
            same(g, w if w.dtype.kind != "f" else w.astype(np.float64),
                 tol if tol is not None else TOL.get(key, 0.0), what)
        within_limits(plan)
    return program


def softmax_ref(z: np.ndarray, axis: int = -1) -> np.ndarray:
    if z.size == 0:
        return z
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


ROWS = ((1, 1), (3, 7), (2, 131), (0, 5), (2, 600))  # empty batch, one, primes, > a warp's row


# --------------------------------------------------------------------------- norms


def test_rmsnorm_with_weight_f32_and_a_literal_head_dim():
    @kp.fusion
    def rmsnorm(x: T[kp.f32, "b", "d"], w: T[kp.f32, "d"], eps: kp.f32):
        return x * kp.rsqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w

    @kp.fusion
    def qk_norm(q: T[kp.f32, "b", "h", 64], w: T[kp.f32, 64]):  # per-head norm, d fixed
        return q * kp.rsqrt(kp.mean(q ** 2, axis=-1, keepdims=True) + 1e-6) * w

    def ref(x, w, eps=1e-6):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    program = check(rmsnorm, [(rand(s), rand(s[1:], seed=1), 1e-6) for s in ROWS], ref)
    planned_at_scale(program, ((4096, 8192), (8192,), 1e-6), ((1, 1 << 20), (1 << 20,), 1e-6))
    check(qk_norm, [(rand((b, h, 64)), rand((64,), seed=1)) for b, h in ((1, 1), (3, 5), (0, 2))],
          ref)
    with pytest.raises(kp.ConstraintError, match="64"):
        loaded(qk_norm).plan((2, 3, 63), (63,))


@pytest.mark.parametrize("half", ["f16", "bf16"])
def test_rmsnorm_half_input_with_float32_math(half):
    """The usual mixed-precision form: upcast, normalize in float32, round once on the way
    out (a float32 weight, as Gemma's ``1 + w``)."""
    kdt = kp.f16 if half == "f16" else kp.bf16

    @kp.fusion
    def rmsnorm_half(x: T[kdt, "b", "d"], w: T[kp.f32, "d"]):
        xf = x.astype(kp.f32)
        y = xf * kp.rsqrt((xf * xf).mean(axis=-1, keepdims=True) + 1e-6)
        return (y * (1.0 + w)).astype(x.dtype)

    def make(v):
        return v.astype(np.float16) if half == "f16" else bf16(v)

    cases = [(make(rand(s)), rand(s[1:], seed=1)) for s in ROWS]
    check(rmsnorm_half, cases,
          lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (1 + w),
          dtypes=[np.float16 if half == "f16" else "bfloat16"])


def test_residual_add_layernorm_two_outputs_and_saved_statistics():
    @kp.fusion
    def add_layernorm(x: T[kp.f32, "b", "d"], r: T[kp.f32, "b", "d"], w: T[kp.f32, "d"],
                      bias: T[kp.f32, "d"]):
        h = x + r
        mu = h.mean(axis=-1, keepdims=True)
        var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
        return h, (h - mu) * kp.rsqrt(var + 1e-5) * w + bias

    @kp.fusion
    def layernorm_stats(x: T[kp.f32, "b", "d"], w: T[kp.f32, "d"], bias: T[kp.f32, "d"]):
        mu = x.mean(-1)
        xc = x - mu[:, None]
        rstd = kp.rsqrt((xc * xc).mean(-1) + 1e-5)
        return xc * rstd[:, None] * w + bias, mu, rstd  # the forward pass keeps mu, rstd

    def ln(h, w, b):
        mu = h.mean(-1, keepdims=True)
        rstd = 1 / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        return (h - mu) * rstd * w + b, mu[:, 0], rstd[:, 0]

    cases = [(rand(s) + 1, rand(s, seed=1), rand(s[1:], seed=2), rand(s[1:], seed=3))
             for s in ROWS]
    check(add_layernorm, cases, lambda x, r, w, b: (x + r, ln(x + r, w, b)[0]))
    check(layernorm_stats, [c[:1] + c[2:] for c in cases[1:4]], ln)


def test_l2_normalize_and_cosine_similarity():
    @kp.fusion
    def l2_normalize(x: T[kp.f32, "b", "d"]):
        return x / kp.maximum(kp.sqrt((x * x).sum(axis=-1, keepdims=True)), 1e-12)

    @kp.fusion
    def cosine(a: T[kp.f16, "b", "d"], c: T[kp.f16, "b", "d"]):  # half inputs, float32 sums
        af, cf = a.astype(kp.f32), c.astype(kp.f32)
        return (af * cf).sum(-1) / (kp.sqrt((af * af).sum(-1) * (cf * cf).sum(-1)) + 1e-8)

    check(l2_normalize, [(rand(s),) for s in ROWS],
          lambda x: x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), 1e-12))
    # rows of a thread (7), of a warp's tiles (131) and of a block's tiles (4099)
    cases = [(rand(s).astype(np.float16), rand(s, seed=4).astype(np.float16))
             for s in ((1, 1), (3, 7), (2, 131), (0, 5), (2, 4099))]
    check(cosine, cases,
          lambda a, c: (a * c).sum(-1) / (np.sqrt((a * a).sum(-1) * (c * c).sum(-1)) + 1e-8),
          dtypes=[np.float32])


# --------------------------------------------------------------------------- activations


def test_silu_gelu_erf_swiglu_geglu():
    @kp.fusion
    def silu(x: T[kp.f32, "n"]):
        return x * kp.sigmoid(x)

    @kp.fusion
    def gelu_erf(x: T[kp.f32, "n"]):
        return 0.5 * x * (1.0 + kp.erf(x / math.sqrt(2.0)))

    @kp.fusion
    def swiglu(g: T[kp.f32, "b", "f"], u: T[kp.f32, "b", "f"]):
        return g * kp.sigmoid(g) * u

    @kp.fusion
    def geglu(h: T[kp.f64, "b", "f"], u: T[kp.f64, "b", "f"]):
        return 0.5 * h * (1.0 + kp.erf(h * (1 / math.sqrt(2.0)))) * u

    sizes = (0, 1, 7, 13, 130)
    check(silu, [(rand((n,)) * 4,) for n in sizes], lambda x: x / (1 + np.exp(-x)))
    check(gelu_erf, [(rand((n,)) * 3,) for n in sizes], lambda x: 0.5 * x * (1 + ERF(x / 2 ** .5)))
    two = [(1, 1), (3, 7), (2, 131), (0, 4)]
    check(swiglu, [(rand(s) * 3, rand(s, seed=2)) for s in two],
          lambda g, u: g / (1 + np.exp(-g)) * u)
    check(geglu, [(rand(s, np.float64) * 3, rand(s, np.float64, 2)) for s in two],
          lambda h, u: 0.5 * h * (1 + ERF(h / 2 ** .5)) * u)


def test_swiglu_of_a_packed_gate_up_projection():
    """One (b, 2, f) input holding gate and up: slicing is refused (see the last test), so
    each half is a one-hot sum over the size-2 axis (or the host passes two views)."""
    @kp.fusion
    def swiglu_packed(gu: T[kp.f32, "b", 2, "f"]):
        which = kp.arange(2)[:, None]
        g = kp.where(which == 0, gu, 0.0).sum(axis=1)
        u = kp.where(which == 1, gu, 0.0).sum(axis=1)
        return g * kp.sigmoid(g) * u

    check(swiglu_packed, [(rand((b, 2, f)) * 3,) for b, f in ((1, 1), (3, 7), (2, 131), (0, 4),
                                                               (5, 0))],
          lambda gu: gu[:, 0] / (1 + np.exp(-gu[:, 0])) * gu[:, 1])


def test_bias_dropout_residual_and_logit_softcap():
    @kp.fusion
    def bias_dropout_add(x: T[kp.f32, "b", "s", "d"], bias: T[kp.f32, "d"],
                         keep: T[kp.bool_, "b", "s", "d"], res: T[kp.f32, "b", "s", "d"],
                         p: kp.f32):
        return res + kp.where(keep, (x + bias) / (1.0 - p), 0.0)

    @kp.fusion
    def softcap(x: T[kp.f32, "b", "v"], cap: kp.f32):
        return kp.tanh(x / cap) * cap

    cases = [(rand(s), rand(s[2:], seed=1), np.random.default_rng(2).random(s) < 0.9,
              rand(s, seed=3), 0.1) for s in ((1, 1, 1), (2, 3, 7), (0, 2, 4), (1, 5, 13))]
    check(bias_dropout_add, cases, lambda x, b, k, r, p: r + np.where(k, (x + b) / (1 - p), 0))
    check(softcap, [(rand(s) * 60, 30.0) for s in ((1, 1), (3, 7), (0, 4))],
          lambda x, c: np.tanh(x / c) * c)


# --------------------------------------------------------------------------- rotary


def _rope_tables(s: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    ang = np.arange(s)[:, None] * 10000.0 ** (-np.arange(r) / max(r, 1))[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def test_rotary_embedding_rotate_half_and_interleaved():
    """(s, r) cos/sin tables broadcast over (b, h, s, ...). The halves of the rotate-half
    layout are an axis of 2 (the host's free view of (b, h, s, d) as (b, h, s, 2, d/2));
    GPT-J's interleaved pairs are a trailing axis of 2."""
    @kp.fusion
    def rope_half(x: T[kp.f32, "b", "h", "s", 2, "r"], cos: T[kp.f32, "s", "r"],
                  sin: T[kp.f32, "s", "r"]):
        half = kp.arange(2)[:, None]
        x1 = kp.where(half == 0, x, 0.0).sum(axis=3, keepdims=True)
        x2 = kp.where(half == 1, x, 0.0).sum(axis=3, keepdims=True)
        c, s = cos[:, None, :], sin[:, None, :]
        return kp.where(half == 0, x1 * c - x2 * s, x2 * c + x1 * s)

    @kp.fusion
    def rope_pairs(x: T[kp.f32, "b", "s", "h", "r", 2], cos: T[kp.f32, "s", "r"],
                   sin: T[kp.f32, "s", "r"]):
        lane = kp.arange(2)
        x0 = kp.where(lane == 0, x, 0.0).sum(axis=-1, keepdims=True)
        x1 = kp.where(lane == 1, x, 0.0).sum(axis=-1, keepdims=True)
        c, s = cos[:, None, :, None], sin[:, None, :, None]
        return kp.where(lane == 0, x0 * c - x1 * s, x1 * c + x0 * s)

    def half_ref(x, c, s):
        b, h, n, _, r = x.shape
        flat = x.reshape(b, h, n, 2 * r)
        rot = np.concatenate([-flat[..., r:], flat[..., :r]], -1)
        out = flat * np.concatenate([c, c], -1) + rot * np.concatenate([s, s], -1)
        return out.reshape(x.shape)

    def pairs_ref(x, c, s):
        x0, x1, c, s = x[..., 0], x[..., 1], c[:, None, :], s[:, None, :]
        return np.stack([x0 * c - x1 * s, x1 * c + x0 * s], -1)

    check(rope_half, [(rand((b, h, n, 2, r)), *_rope_tables(n, r))
                      for b, h, n, r in ((1, 1, 1, 1), (2, 3, 5, 4), (1, 2, 7, 3), (0, 2, 3, 4))],
          half_ref)
    check(rope_pairs, [(rand((b, n, h, r, 2)), *_rope_tables(n, r))
                       for b, n, h, r in ((1, 1, 1, 1), (2, 5, 3, 3), (0, 2, 3, 4), (2, 3, 1, 0))],
          pairs_ref)


def test_rotary_tables_from_integer_scalars():
    """The cos/sin cache built from sizes alone: outputs of shape (s, r) for scalars s, r."""
    @kp.fusion
    def rope_cache(s: kp.i64, r: kp.i64, base: kp.f32):
        inv = base ** (-kp.arange(r).astype(kp.f32) / r)
        ang = kp.arange(s).astype(kp.f32)[:, None] * inv[None, :]
        return kp.cos(ang), kp.sin(ang)

    def ref(s, r, base):  # the angle rounded to float32 as the kernel forms it, then exact
        inv = (np.float32(base) ** (-np.arange(r, dtype=np.float32) / np.float32(max(r, 1))))
        ang = (np.arange(s, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
        return np.cos(ang), np.sin(ang)

    program = check(rope_cache, [(s, r, 10000.0) for s, r in ((1, 1), (5, 3), (0, 4), (7, 0),
                                                              (33, 8))],
                    ref, dtypes=[np.float32, np.float32])
    assert program.plan(4096, 64, 1e4).allocations["out0"].shape == (4096, 64)


# --------------------------------------------------------------------------- attention softmax


def test_causal_softmax_from_arange_comparisons():
    @kp.fusion
    def causal_softmax(x: T[kp.f32, "b", "s", "s"], scale: kp.f32):
        i = kp.arange(x.shape[-1])[:, None]
        j = kp.arange(x.shape[-1])[None, :]
        z = kp.where(j <= i, x * scale, -math.inf)
        e = kp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @kp.fusion
    def alibi_causal_softmax(x: T[kp.f32, "b", "h", "q", "k"], slopes: T[kp.f32, "h"]):
        q, k = x.shape[2], x.shape[3]
        i = kp.arange(q)[:, None] + (k - q)  # queries are the last q of k positions
        j = kp.arange(k)[None, :]
        z = kp.where(j <= i, x + slopes[:, None, None] * (j - i).astype(kp.f32), -math.inf)
        e = kp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def causal_ref(x, scale):
        s = x.shape[-1]
        return softmax_ref(np.where(np.tril(np.ones((s, s), bool)), x * scale, -np.inf))

    def alibi_ref(x, sl):
        q, k = x.shape[2:]
        i, j = np.arange(q)[:, None] + (k - q), np.arange(k)[None, :]
        return softmax_ref(np.where(j <= i, x + sl[:, None, None] * (j - i), -np.inf))

    program = check(causal_softmax, [(rand((b, s, s)), 0.125)
                                     for b, s in ((1, 1), (3, 5), (0, 4), (1, 37))],
                    causal_ref)
    planned_at_scale(program, ((32 * 64, 4096, 4096), 0.1), ((1, 1 << 17, 1 << 17), 0.1))
    check(alibi_causal_softmax, [(rand((b, h, q, k)), rand((h,), seed=5))
                                 for b, h, q, k in ((1, 1, 1, 1), (2, 2, 3, 5), (1, 3, 1, 13),
                                                    (0, 2, 2, 2))], alibi_ref)


def test_scaled_masked_softmax_with_a_bool_padding_mask():
    @kp.fusion
    def masked_softmax(x: T[kp.f32, "b", "h", "q", "k"], mask: T[kp.bool_, "b", 1, 1, "k"],
                       scale: kp.f32):
        z = kp.where(mask, x * scale, -1e9)
        e = kp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def case(b, h, q, k):
        m = np.random.default_rng(k).random((b, 1, 1, k)) < 0.7
        if b > 1:
            m[1] = False  # a fully padded sequence: uniform, as in NumPy
        return rand((b, h, q, k)), m, 0.3

    check(masked_softmax, [case(*s) for s in ((1, 1, 1, 1), (2, 3, 5, 7), (3, 2, 1, 13),
                                              (0, 2, 3, 4))],
          lambda x, m, s: softmax_ref(np.where(m, x * s, -1e9)))


def test_single_query_decode_attention_with_grouped_heads_and_lengths():
    """Scores, a length mask, softmax and the weighted sum of V in one fusion: reductions over
    d, then s, of broadcast (b, kv, g, s, d) products (grouped-query attention)."""
    @kp.fusion
    def gqa_decode(q: T[kp.f32, "b", "kv", "g", "d"], k: T[kp.f32, "b", "kv", "s", "d"],
                   v: T[kp.f32, "b", "kv", "s", "d"], lens: T[kp.i32, "b"]):
        scores = (q[:, :, :, None, :] * k[:, :, None]).sum(-1) / q.shape[-1] ** 0.5
        valid = kp.arange(k.shape[2], dtype=kp.i32) < lens[:, None, None, None]
        scores = kp.where(valid, scores, -math.inf)
        p = kp.exp(scores - scores.max(-1, keepdims=True))
        return ((p / p.sum(-1, keepdims=True))[..., None] * v[:, :, None]).sum(axis=3)

    def ref(q, k, v, lens):
        sc = (q[:, :, :, None, :] * k[:, :, None]).sum(-1) / np.sqrt(q.shape[-1])
        sc = np.where(np.arange(k.shape[2]) < lens[:, None, None, None], sc, -np.inf)
        return (softmax_ref(sc)[..., None] * v[:, :, None]).sum(3)

    def case(b, kv, g, s, d):
        lens = np.random.default_rng(s).integers(1, s + 1, b).astype(np.int32)
        return rand((b, kv, g, d)), rand((b, kv, s, d), seed=1), rand((b, kv, s, d), seed=2), lens

    check(gqa_decode, [case(*c) for c in ((1, 1, 1, 1, 1), (2, 2, 3, 5, 4), (1, 1, 4, 13, 8),
                                          (0, 2, 2, 3, 4))], ref)


# --------------------------------------------------------------------------- losses


def test_log_softmax_and_logsumexp():
    @kp.fusion
    def log_softmax(x: T[kp.f32, "b", "v"]):
        z = x - x.max(axis=-1, keepdims=True)
        return z - kp.log(kp.exp(z).sum(axis=-1, keepdims=True))

    @kp.fusion
    def logsumexp(x: T[kp.f64, "b", "v"]):
        m = x.max(axis=-1)
        return m + kp.log(kp.exp(x - m[:, None]).sum(axis=-1))

    def lse(x):  # an empty row: max is -inf (kp's identity), the sum 0, the result -inf
        m = x.max(-1) if x.shape[-1] else np.full(x.shape[:-1], -np.inf)
        return m + np.log(np.exp(x - m[:, None]).sum(-1))

    check(log_softmax, [(rand(s) * 5,) for s in ROWS],
          lambda x: x - lse(x)[:, None] if x.size else x)
    check(logsumexp, [(rand(s, np.float64) * 5,) for s in ROWS + ((3, 0),)], lse)


def _ce_case(b: int, v: int, dt: Any = np.int32) -> tuple[np.ndarray, np.ndarray]:
    return rand((b, v)) * 3, np.random.default_rng(b * v).integers(0, v, b).astype(dt)


def _nll(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True) if x.size else np.zeros((len(x), 1))
    lse = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]
    return lse - x[np.arange(len(labels)), np.where(labels < 0, 0, labels)]


def test_cross_entropy_from_logits_and_integer_labels():
    """One-hot by comparing ``kp.arange(v)`` with the label of each row, then the mean over the
    batch: a full reduction of row reductions. int32 labels need an int32 arange (an int64
    one beside them is a TraceError, checked below); int64 labels take the default."""
    @kp.fusion
    def cross_entropy(logits: T[kp.f32, "b", "v"], labels: T[kp.i32, "b"]):
        m = logits.max(axis=-1, keepdims=True)
        lse = m + kp.log(kp.exp(logits - m).sum(axis=-1, keepdims=True))
        onehot = kp.arange(logits.shape[1], dtype=kp.i32)[None, :] == labels[:, None]
        return (lse - kp.where(onehot, logits, 0.0).sum(axis=-1, keepdims=True)).mean()

    @kp.fusion
    def cross_entropy_rows(logits: T[kp.f32, "b", "v"], labels: T[kp.i64, "b"]):
        valid = labels != -100  # ignore_index
        m = logits.max(axis=1)
        lse = m + kp.log(kp.exp(logits - m[:, None]).sum(axis=1))
        picked = (logits * (kp.arange(logits.shape[1]) == labels[:, None])).sum(axis=1)
        nll = kp.where(valid, lse - picked, 0.0)
        return nll, nll.sum() / valid.sum()

    def rows_ref(x, labels):
        nll = np.where(labels != -100, _nll(x, labels), 0.0)
        return nll, nll.sum() / (labels != -100).sum()

    shapes = ((1, 1), (3, 7), (5, 131), (2, 600))
    program = check(cross_entropy, [_ce_case(*s) for s in shapes], lambda x, t: _nll(x, t).mean())
    # 8192 tokens of a 128256 vocabulary, one long row (split across blocks), many short rows
    planned_at_scale(program, ((8192, 128256), (8192,)), ((1, 1 << 20), (1,)),
                     ((10 ** 6, 7), (10 ** 6,)))
    assert program.plan((8192, 128256), (8192,)).allocations["out"].shape == ()
    cases = [_ce_case(*s, np.int64) for s in shapes + ((2, 1),)]
    for _, labels in cases:
        labels[::2] = -100  # the first row of each batch is padding; (1, 1) only padding: NaN
    check(cross_entropy_rows, cases, rows_ref)


def test_label_smoothing_cross_entropy_entropy_and_kl():
    @kp.fusion
    def smoothed_ce(logits: T[kp.f32, "b", "v"], labels: T[kp.i64, "b"], eps: kp.f32):
        z = logits - logits.max(axis=-1, keepdims=True)
        logp = z - kp.log(kp.exp(z).sum(axis=-1, keepdims=True))
        v = logits.shape[-1]
        target = (kp.arange(v) == labels[:, None]).astype(kp.f32) * (1.0 - eps) + eps / v
        return -(target * logp).sum(axis=-1).mean()

    @kp.fusion
    def entropy_kl(p_logits: T[kp.f32, "b", "v"], q_logits: T[kp.f32, "b", "v"]):
        lp = p_logits - p_logits.max(-1, keepdims=True)
        lp = lp - kp.log(kp.exp(lp).sum(-1, keepdims=True))
        lq = q_logits - q_logits.max(-1, keepdims=True)
        lq = lq - kp.log(kp.exp(lq).sum(-1, keepdims=True))
        return -(kp.exp(lp) * lp).sum(-1), (kp.exp(lp) * (lp - lq)).sum(-1)

    def logp(x):
        z = x - x.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    def smoothed(x, labels, eps):
        t = np.eye(x.shape[1])[labels] * (1 - eps) + eps / x.shape[1]
        return -(t * logp(x)).sum(-1).mean()

    check(smoothed_ce, [(*_ce_case(*s, np.int64), 0.1) for s in ((1, 1), (3, 7), (5, 131))],
          smoothed)
    check(entropy_kl, [(rand(s) * 2, rand(s, seed=9) * 2) for s in ((1, 1), (3, 7), (2, 131))],
          lambda a, b: (-(np.exp(logp(a)) * logp(a)).sum(-1),
                        (np.exp(logp(a)) * (logp(a) - logp(b))).sum(-1)))


# --------------------------------------------------------------------------- optimizer


def test_adam_and_adamw_steps_return_param_and_moments():
    """Several outputs for the in-place update (on a GPU: ``out=`` the input arrays). Outputs
    cannot take the parameters' names (a TraceError, checked at the end), so they are new."""
    @kp.fusion
    def adam(p: T[kp.f32, "n"], g: T[kp.f32, "n"], m: T[kp.f32, "n"], v: T[kp.f32, "n"],
             lr: kp.f32, b1: kp.f32, b2: kp.f32, eps: kp.f32, step: kp.i32):
        m2 = b1 * m + (1 - b1) * g
        v2 = b2 * v + (1 - b2) * g * g
        mhat, vhat = m2 / (1 - b1 ** step), v2 / (1 - b2 ** step)
        return {"p_new": p - lr * mhat / (kp.sqrt(vhat) + eps), "m_new": m2, "v_new": v2}

    @kp.fusion
    def adamw(p: T[kp.f32, "r", "c"], g: T[kp.f32, "r", "c"], m: T[kp.f32, "r", "c"],
              v: T[kp.f32, "r", "c"], lr: kp.f32, wd: kp.f32, step: kp.f32):
        m1 = 0.9 * m + 0.1 * g
        v1 = 0.95 * v + 0.05 * g * g
        upd = (m1 / (1.0 - 0.9 ** step)) / (kp.sqrt(v1 / (1.0 - 0.95 ** step)) + 1e-8)
        return p * (1.0 - lr * wd) - lr * upd, m1, v1

    def adam_ref(p, g, m, v, lr, b1, b2, eps, step, wd=0.0):
        m2, v2 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        upd = (m2 / (1 - b1 ** step)) / (np.sqrt(v2 / (1 - b2 ** step)) + eps)
        return p * (1 - lr * wd) - lr * upd, m2, v2

    def state(s):
        return rand(s), rand(s, seed=1), rand(s, seed=2) * 0.1, np.abs(rand(s, seed=3)) * 0.01

    program = check(adam, [(*state((n,)), 1e-3, 0.9, 0.999, 1e-8, 7) for n in (0, 1, 7, 130)],
                    adam_ref)
    plan = program.plan((5,), (5,), (5,), (5,), 1e-3, 0.9, 0.9, 1e-8, 2)
    assert sorted(plan.allocations) == ["m_new", "p_new", "v_new"]
    check(adamw, [(*state(s), 1e-3, 0.01, 3.0) for s in ((1, 1), (3, 7), (0, 4))],
          lambda p, g, m, v, lr, wd, t: adam_ref(p, g, m, v, lr, 0.9, 0.95, 1e-8, t, wd))


def test_gradient_clipping_by_global_norm():
    """A full reduction read by pointwise work over the same tensor, and returned too."""
    @kp.fusion
    def clip_sgd(p: T[kp.f32, "n"], g: T[kp.f32, "n"], lr: kp.f32, max_norm: kp.f32):
        norm = kp.sqrt((g * g).sum())
        return p - lr * g * kp.minimum(max_norm / (norm + 1e-6), 1.0), norm

    def ref(p, g, lr, mx):
        norm = np.sqrt((g * g).sum())
        return p - lr * g * min(mx / (norm + 1e-6), 1.0), norm

    check(clip_sgd, [(rand((n,)), rand((n,), seed=1) * s, 0.1, 1.0)
                     for n, s in ((0, 1), (7, 0.1), (1031, 1))], ref)  # ~1 s per case


# --------------------------------------------------------------------------- quantization


def test_int8_quantize_per_row_absmax_and_dequantize():
    """No round or clip op: round half to even (NumPy's and torch's) spelled with kp.floor,
    the clip with kp.minimum/kp.maximum; ties and the row maximum are in the data."""
    @kp.fusion
    def quantize(x: T[kp.f32, "b", "d"]):
        scale = kp.maximum(kp.abs(x).max(axis=-1, keepdims=True), 1e-8) / 127.0
        y = x / scale
        r = kp.floor(y)
        frac = y - r
        odd = r - 2.0 * kp.floor(r * 0.5)  # r % 2 is NumPy-exact but 4x the code
        r = kp.where(frac == 0.5, r + odd, kp.where(frac > 0.5, r + 1, r))
        return kp.minimum(kp.maximum(r, -127.0), 127.0).astype(kp.i8), scale

    @kp.fusion
    def dequantize(q: T[kp.i8, "b", "d"], scale: T[kp.f32, "b", 1]):
        return q.astype(kp.f32) * scale

    def ref(x):
        scale = np.maximum(np.abs(x).max(-1, keepdims=True) if x.size else x[:, :1], 1e-8) / 127
        return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale

    ties = np.zeros((2, 6), np.float32)
    ties[0] = [0.5, 1.5, 2.5, -0.5, -2.5, 127.0]  # scale 1: every tie rounds to even
    ties[1] = [-3.5, 4.5, 0.0, 1e-3, -127.0, 6.5]
    cases = [(rand(s) * 3,) for s in ((1, 1), (3, 7), (2, 131), (0, 5))] + [(ties,)]
    check(quantize, cases, ref, dtypes=[np.int8, np.float32])
    rng = np.random.default_rng(1)
    check(dequantize, [(rng.integers(-127, 128, s).astype(np.int8), np.abs(rand((s[0], 1))))
                       for s in ((1, 1), (3, 7), (2, 131), (0, 5))], lambda q, s: q * s)


# --------------------------------------------------------------------------- statistics


def test_batch_mean_and_variances_over_two_axes():
    @kp.fusion
    def batch_mean(x: T[kp.f32, "b", "d"]):
        return x.mean(axis=0)

    @kp.fusion
    def var_keepdims(x: T[kp.f64, "b", "s", "d"]):
        mu = x.mean(axis=(1, 2), keepdims=True)
        return ((x - mu) ** 2).mean(axis=(1, 2), keepdims=True)

    @kp.fusion
    def channel_stats(x: T[kp.f32, "b", "s", "d"]):
        mu = x.mean(axis=(0, 1))  # batch-norm style: over batch and sequence
        return mu, ((x - mu) ** 2).mean(axis=(0, 1))

    # (131, 7) and (300, 13) split each column across threads; (5, 0), (0, 5): empty
    check(batch_mean, [(rand(s),) for s in ((1, 1), (3, 7), (131, 7), (300, 13), (5, 0), (0, 5))],
          lambda x: x.mean(0))
    check(var_keepdims, [(rand(s, np.float64) + 1,) for s in ((1, 1, 1), (3, 5, 7), (2, 13, 3),
                                                              (0, 2, 2))],
          lambda x: x.var(axis=(1, 2), keepdims=True))
    check(channel_stats, [(rand(s) + 2,) for s in ((1, 1, 1), (2, 5, 3), (3, 7, 13), (0, 2, 3))],
          lambda x: (x.mean((0, 1)), x.var((0, 1))))


# --------------------------------------------------------------------------- backward passes


def test_layernorm_and_softmax_backward():
    """dx per row, and dgamma/dbeta as column sums over the batch, in one fusion."""
    @kp.fusion
    def layernorm_bwd(dy: T[kp.f32, "b", "d"], x: T[kp.f32, "b", "d"], w: T[kp.f32, "d"]):
        mu = x.mean(-1, keepdims=True)
        xc = x - mu
        rstd = kp.rsqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
        xhat, g = xc * rstd, dy * w
        dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
        return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)

    @kp.fusion
    def softmax_bwd(y: T[kp.f32, "b", "v"], dy: T[kp.f32, "b", "v"]):
        return y * (dy - (dy * y).sum(-1, keepdims=True))

    def ln_ref(dy, x, w):
        xc = x - x.mean(-1, keepdims=True)
        rstd = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
        xhat, g = xc * rstd, dy * w
        dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
        return dx, (dy * xhat).sum(0), dy.sum(0)

    check(layernorm_bwd, [(rand(s), rand(s, seed=1) + 1, rand(s[1:], seed=2))
                          for s in ((1, 1), (3, 7), (2, 131), (0, 5))], ln_ref)
    check(softmax_bwd, [(np.abs(rand(s)), rand(s, seed=1)) for s in ROWS[:4]],
          lambda y, dy: y * (dy - (dy * y).sum(-1, keepdims=True)))


# --------------------------------------------------------------------------- what has no op


def _trace_error(body: Callable[..., Any], **params: Any) -> str:
    """The TraceError message of a fusion of ``x: f32[b, d]`` (and ``params``, name to
    annotation) returning ``body(x, ...)``."""
    names = ["x", *params]
    fn = eval(f"lambda {', '.join(names)}: body({', '.join(names)})", {"body": body})  # noqa
    fn.__annotations__ = {"x": T[kp.f32, "b", "d"], **params}
    with pytest.raises(kp.TraceError) as info:
        kp.fusion(fn, name="refused").trace()
    return str(info.value)


@pytest.mark.parametrize("body,advice", [
    (lambda x: np.clip(x, -1, 1), "kp.minimum(kp.maximum(x, lo), hi)"),
    (lambda x: x.clip(-1, 1), "kp.minimum(kp.maximum(x, lo), hi)"),
    (lambda x: np.round(x), "kp.floor(x + 0.5) rounds halves up"),
    (lambda x: np.rint(x), "kp.floor(x + 0.5) rounds halves up"),
    (lambda x: round(x), "kp.floor(x + 0.5) rounds halves up"),
    (lambda x: x.round(), "kp.floor(x + 0.5) rounds halves up"),
    (lambda x: np.var(x, axis=-1), "((x - x.mean(axis, keepdims=True)) ** 2).mean(axis)"),
    (lambda x: x.std(axis=-1), "kp.sqrt(((x - x.mean(axis, keepdims=True)) ** 2).mean(axis))"),
    (lambda x: np.isnan(x), "x != x"),
    (lambda x: np.argmax(x, -1), "x == x.max(axis, keepdims=True) is the one-hot mask"),
    (lambda x: np.concatenate([x, x], -1), "pass each piece as an input of its own"),
    (lambda x: x.reshape(-1), "pass each piece as an input of its own"),
    (lambda x: x[..., : x.shape[-1] // 2], "pass each piece as an input of its own"),
    (lambda x: x[:, 0], "pick along a short axis with kp.where(kp.arange(2) == 0, x, 0)"),
], ids=["np.clip", "x.clip", "np.round", "np.rint", "round", "x.round", "np.var", "x.std",
        "np.isnan", "np.argmax", "np.concatenate", "x.reshape", "slice", "integer index"])
def test_numpy_functions_without_an_op_say_what_to_write(body, advice):
    """``np.clip``/``np.round``/``x.var``/slicing said only "not supported; use the kp op
    (kp.exp, kp.where, ...)" or listed the supported attributes, naming nothing that does
    the job (and there is no kp op for rounding): each now says what to write."""
    assert advice in _trace_error(body)


def test_the_rounding_and_clipping_advice_is_numpys():
    """The half-to-even spelling printed by ``np.round(x)``'s error, run as printed, is
    NumPy's ``round`` (ties included); the clip and trunc spellings likewise."""
    text = _trace_error(lambda x: np.round(x))
    steps = text.split("NumPy's halves to even is ")[1].split("; ")
    trunc = _trace_error(lambda x: np.trunc(x)).split("write ")[1]
    clip = _trace_error(lambda x: np.clip(x, -2, 2)).split("write ")[1]

    @kp.fusion
    def advice(x: T[kp.f64, "n"]):
        env = {"kp": kp, "x": x, "lo": -2.0, "hi": 2.0}
        for step in steps[:-1]:
            exec(step, env)  # noqa: S102 - the message's own statements
        return eval(steps[-1], env), eval(trunc, env), eval(clip, env)  # noqa: S307

    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994, -3.2, 7.7, 1e300,
                  -0.0, 4503599627370495.5, np.inf, -np.inf, np.nan])
    got = Kernels(advice)(x)
    for g, w in zip(got, (np.round(x), np.trunc(x), np.clip(x, -2, 2))):
        assert np.array_equal(g, w, equal_nan=True), (g, w)


def test_dtypes_the_user_never_wrote_are_explained():
    """int32 labels beside ``kp.arange(v)`` (int64) and Adam's ``1 - 0.9 ** step`` for an
    integer ``step`` (float64, as NumPy makes it) beside float32 tensors were "dtype mismatch
    int64[1, v] and int32[b, 1]" / "float64[]": now the message says where that dtype came
    from and what to write."""
    onehot = _trace_error(lambda x, t: kp.arange(x.shape[1])[None, :] == t[:, None],
                          t=T[kp.i32, "b"])
    assert "eq: dtype mismatch int64[1, d] and int32[b, 1]" in onehot
    assert "kp.arange(n, dtype=kp.int32)" in onehot
    adam = _trace_error(lambda x, step: x / (1 - 0.9 ** step), step=kp.i32)
    assert "float64[] is computed from the integer scalar(s) ['step']" in adam
    assert "step.astype(kp.float32)" in adam
    # a float64 parameter is the user's own choice: nothing to explain
    assert _trace_error(lambda x, s: x * s, s=kp.f64).endswith("cast one with .astype")


def test_outputs_named_like_their_inputs_are_refused():
    """An in-place update (``{"p": p - lr * g}``) cannot name an output like a parameter:
    both are keys of one namespace (plan, ``out=``); the error names the output."""
    @kp.fusion
    def sgd(p: T[kp.f32, "n"], g: T[kp.f32, "n"]):
        return {"p": p - 0.1 * g}

    with pytest.raises(kp.TraceError, match="output 'p' clashes with a parameter"):
        sgd.trace()
