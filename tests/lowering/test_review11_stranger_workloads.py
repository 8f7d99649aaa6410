"""Review 11 (A): issue 3's workloads as a stranger writes them, checked end to end on the CPU.

Each fusion is written from DESIGN.md, README.md and the issue text alone, in several natural
formulations, then: ``kp.compile(f, targets=["sm_80", "sm_90", "ptx"])``; ``kp.save`` +
``kp.load``; the *loaded* program's plan drives the SIMT emulator (outputs and workspaces start
as NaN, so an element the plan's grid misses shows); the plan's allocations must have the
output shapes, dtypes and byte sizes NumPy's result has; and the numbers must match NumPy in
float64 within 1e-5 (f32) / 1e-12 (f64) relative to the reference's largest magnitude. Shapes
include 0, 1, primes, non-multiples of the vector width and size-1 broadcast dims.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering.tuning import CHUNK

from .simt import Kernels, assert_close

T = kp.Tensor
TARGETS = ["sm_80", "sm_90", "ptx"]
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
       np.dtype(np.complex64): 1e-5, np.dtype(np.complex128): 1e-12}
C = math.sqrt(2.0 / math.pi)


def loaded(fusion: kp.fusion) -> Any:
    """The fusion compiled for two cubins + PTX, saved and loaded: its program in the pack."""
    compiled = kp.compile(fusion, targets=TARGETS)
    kinds = sorted((img.kind, f"{img.arch.major}{img.arch.minor}") for m in compiled.modules
                   for img in m.images)
    assert kinds == [("cubin", "80"), ("cubin", "90"), ("ptx", "80")], kinds
    return kp.load(kp.save([compiled]))[fusion.name]


def check(fusion: kp.fusion, cases: list[tuple], ref: Callable[..., Any],
          tol: float | None = None, dtype: Any = None) -> Any:
    """Run every case (a tuple of NumPy arrays and scalars) on the emulator under the loaded
    program's plan and compare with ``ref`` (run on float64/complex128 copies); returns the
    loaded program. ``dtype``: the outputs' NumPy dtype where the inputs' float width does
    not give it."""
    program = loaded(fusion)
    kernels = Kernels(fusion)
    kernels.planner = program.planner  # the artifact's plan, not the in-memory one
    for inputs in cases:
        shapes = [v.shape if isinstance(v, np.ndarray) else v for v in inputs]
        wide = [_widen(v) for v in inputs]
        with np.errstate(all="ignore"):
            want = ref(*wide)
        want = list(want) if isinstance(want, tuple) else [np.asarray(want)]
        plan = program.plan(*shapes)
        outs = [a for a in plan.allocations.values() if a.kind == "output"]
        assert len(outs) == len(want), (fusion.name, shapes, [a.name for a in outs])
        got = kernels(*inputs)
        for alloc, g, w in zip(outs, got, want):
            what = f"{fusion.name} {shapes} {alloc.name}"
            assert alloc.shape == w.shape, (what, alloc.shape, w.shape)
            assert alloc.nbytes == math.prod(alloc.shape) * np.dtype(g.dtype).itemsize, what
            assert g.dtype == (dtype or _expected_dtype(inputs, w)), (what, g.dtype)
            assert_close(g, w, tol if tol is not None else TOL[np.dtype(g.dtype)], what)
        within_limits(plan)
        if all(a.nbytes for a in outs):
            assert any(min(la.grid) > 0 for la in plan.launches), (fusion.name, shapes)
    return program


def within_limits(plan: Any) -> None:
    """Every launch fits CUDA's limits (a grid of 0 is an empty launch the runtime skips)."""
    for la in plan.launches:
        (gx, gy, gz), (bx, by, bz) = la.grid, la.block
        assert 0 <= gx < 2 ** 31 and 0 <= gy <= 65535 and 0 <= gz <= 65535, (plan.program, la)
        assert 1 <= bx * by * bz <= 1024 and 0 <= la.shared_mem <= 48 * 1024, (plan.program, la)


def planned_at_scale(program: Any, *shapes: tuple) -> None:
    """Plans for shapes far too big to emulate (rows of 2^31 elements, a million rows): each
    within CUDA's launch limits, its outputs' byte sizes prod(shape) * itemsize."""
    for args in shapes:
        plan = program.plan(*args)
        within_limits(plan)
        for a in plan.allocations.values():
            assert a.nbytes == math.prod(a.shape) * a.dtype.itemsize, (program.name, args, a)


def _widen(v: object) -> object:
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.float64)
    if isinstance(v, np.ndarray) and v.dtype.kind == "c":
        return v.astype(np.complex128)
    return v


def _expected_dtype(inputs: tuple, want: np.ndarray) -> np.dtype:
    """The float width of the inputs, in the reference's kind (real or complex)."""
    floats = [v.dtype for v in inputs if isinstance(v, np.ndarray) and v.dtype.kind in "fc"]
    single = bool(floats) and all(d in (np.float32, np.complex64) for d in floats)
    if want.dtype.kind == "c":
        return np.dtype(np.complex64 if single else np.complex128)
    if want.dtype.kind == "b":
        return np.dtype(np.bool_)
    return np.dtype(np.float32 if single else np.float64)


def rand(shape: tuple[int, ...], dt: Any = np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 7 * sum(shape)).standard_normal(shape).astype(dt)


FLOATS = [(kp.f32, np.float32), (kp.f64, np.float64)]
IDS = ["f32", "f64"]

# 1-D sizes: empty, one, primes, around the 4/2-wide vector groups and a block
SIZES = (0, 1, 3, 7, 13, 130, 1021)


# --------------------------------------------------------------------------- axpy


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_axpy_formulations(kdt, ndt):
    @kp.fusion
    def axpy_scalar(x: T[kdt, "n"], y: T[kdt, "n"], a: kdt):
        return a * x + y

    @kp.fusion
    def axpy_const_right(x: T[kdt, "n"], y: T[kdt, "n"]):
        return y + x * 2.5

    for f, scalars, ref in ((axpy_scalar, (1.75,), lambda x, y, a: a * x + y),
                            (axpy_const_right, (), lambda x, y: y + x * 2.5)):
        check(f, [(rand((n,), ndt), rand((n,), ndt, 1), *scalars) for n in SIZES], ref)


def test_axpy_broadcasts_a_fixed_size_one_dim_and_a_row():
    """``(b, n) * (1, n) + (n,)``: the literal 1 dim and a missing leading dim broadcast."""

    @kp.fusion
    def axpy_rows(x: T[kp.f32, "b", "n"], a: T[kp.f32, 1, "n"], y: T[kp.f32, "n"]):
        return a * x + y

    cases = [(rand((b, n)), rand((1, n), seed=2), rand((n,), seed=3))
             for b, n in ((0, 3), (1, 1), (3, 5), (2, 0), (5, 131))]
    check(axpy_rows, cases, lambda x, a, y: a * x + y)
    plan = loaded(axpy_rows).plan((5, 131), (1, 131), (131,))
    assert plan.allocations["out"].shape == (5, 131)


# --------------------------------------------------------------------------- gelu


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(C * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_gelu_formulations(kdt, ndt):
    @kp.fusion
    def gelu_pow(x: T[kdt, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    @kp.fusion
    def gelu_poly(x: T[kdt, "n"]):
        inner = C * x + (C * 0.044715) * x * x * x  # the polynomial, expanded
        return x * (0.5 + 0.5 * kp.tanh(inner))

    @kp.fusion
    def gelu_scalars(x: T[kdt, "n"], c: kdt, k: kdt, half: kdt):
        return half * x * (1 + kp.tanh(c * (x + k * (x * x * x))))

    cases = [(rand((n,), ndt) * 3,) for n in SIZES]
    check(gelu_pow, cases, _gelu)
    check(gelu_poly, cases, _gelu)
    check(gelu_scalars, [(x, C, 0.044715, 0.5) for (x,) in cases],
          lambda x, c, k, h: h * x * (1 + np.tanh(c * (x + k * x ** 3))))


# --------------------------------------------------------------------------- softmax


def _softmax(x, s=1.0, axis=-1):
    z = x * s
    e = np.exp(z - z.max(axis=axis, keepdims=True)) if z.size else z
    return e / e.sum(axis=axis, keepdims=True) if z.size else z


# rows: (0, n), (b, 1), a prime length, non-multiples of 4, a size-1 batch and a block's row
ROWS = ((0, 5), (1, 1), (3, 1), (4, 13), (3, 130), (2, 600))


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_softmax_formulations(kdt, ndt):
    @kp.fusion
    def sm_last(x: T[kdt, "b", "n"]):
        e = kp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @kp.fusion
    def sm_axis1_scaled(x: T[kdt, "b", "n"], s: kdt):
        z = x * s
        e = kp.exp(z - kp.max(z, axis=1, keepdims=True))
        return e * (1 / kp.sum(e, axis=1, keepdims=True))

    @kp.fusion
    def sm_no_keepdims(x: T[kdt, "b", "n"]):
        e = kp.exp(x - x.max(-1)[:, None])
        return e / e.sum(1)[:, None]

    cases = [(rand(s, ndt) * 4,) for s in ROWS]
    program = check(sm_last, cases, _softmax)
    planned_at_scale(program, *[((b, n),) for b, n in ((1, 1 << 20), (4096, 1000), (10 ** 6, 3),
                                                        (1, 2 ** 31 + 1), (3, 65537))])
    # compiling eight row variants for three targets takes ~1 s: one dtype each
    if ndt == np.float32:
        check(sm_axis1_scaled, [(x, 0.5) for (x,) in cases[::2]], lambda x, s: _softmax(x, s))
    else:
        check(sm_no_keepdims, cases[1::2], _softmax)


def test_softmax_of_a_3d_tensor_over_its_last_axis():
    @kp.fusion
    def sm3(x: T[kp.f32, "a", "b", "n"]):
        e = kp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    check(sm3, [(rand(s) * 3,) for s in ((2, 3, 5), (2, 0, 4), (3, 1, 17))], _softmax)


# --------------------------------------------------------------------------- layernorm


def _layernorm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


LN_ROWS = ((1, 1), (3, 5), (2, 13), (1, 131), (2, 600), (0, 8))


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_layernorm_formulations(kdt, ndt):
    @kp.fusion
    def ln_moments(x: T[kdt, "b", "n"], w: T[kdt, "n"], b: T[kdt, "n"], eps: kdt):
        mu = x.mean(axis=-1, keepdims=True)
        var = (x * x).mean(axis=-1, keepdims=True) - mu * mu
        return (x - mu) / kp.sqrt(var + eps) * w + b

    @kp.fusion
    def ln_deviations(x: T[kdt, "b", "n"], w: T[kdt, "n"], b: T[kdt, "n"]):
        mu = kp.mean(x, axis=1, keepdims=True)
        d = x - mu
        var = kp.mean(d ** 2, axis=1, keepdims=True)
        return d * kp.rsqrt(var + 1e-5) * w + b

    @kp.fusion
    def ln_sums(x: T[kdt, "b", "n"], w: T[kdt, "n"], b: T[kdt, "n"]):
        n = x.shape[-1]
        mu = x.sum(-1) / n
        d = x - mu[:, None]
        var = (d * d).sum(-1, keepdims=True) / n
        return w * (d / (var + 1e-5) ** 0.5) + b

    def case(bn):
        x = rand(bn, ndt) + 0.5  # a nonzero mean: the moments form's cancellation is mild
        return x, rand(bn[1:], ndt, 1), rand(bn[1:], ndt, 2)

    cases = [case(bn) for bn in LN_ROWS]
    # the E[x^2] - E[x]^2 form loses digits to cancellation; NumPy written the same way
    # gives the reference for it
    check(ln_deviations, cases, _layernorm)
    if ndt == np.float32:  # one dtype each: see the softmax test
        check(ln_moments, [(*c, 1e-5) for c in cases[::2]],
              lambda x, w, b, eps: (x - x.mean(-1, keepdims=True)) / np.sqrt(
                  (x * x).mean(-1, keepdims=True) - x.mean(-1, keepdims=True) ** 2 + eps) * w + b)
    else:
        check(ln_sums, cases[1::2], _layernorm)


# --------------------------------------------------------------------------- full sums


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_full_sum_formulations(kdt, ndt):
    @kp.fusion
    def total_method(x: T[kdt, "n"]):
        return x.sum()

    @kp.fusion
    def total_function(x: T[kdt, "n"]):
        return kp.sum(x)

    @kp.fusion
    def total_axis0(x: T[kdt, "n"]):
        return x.sum(axis=0)

    @kp.fusion
    def total_keepdims(x: T[kdt, "n"]):
        return kp.sum(x, axis=-1, keepdims=True)

    # (the emulator runs a thread per GPU thread: each size costs ~1 s, so the formulations
    # share them) 20011 is prime and takes two partials
    cases = {n: (rand((n,), ndt),) for n in (0, 1, 7, 1021, 4099, 20011)}
    scalar = [check(total_method, [cases[n] for n in (0, 1, 20011)],
                    lambda x: np.asarray(x.sum())),
              check(total_function, [cases[1021]], lambda x: np.asarray(x.sum())),
              check(total_axis0, [cases[4099]], lambda x: np.asarray(x.sum()))]
    kept = check(total_keepdims, [cases[7]], lambda x: x.sum(keepdims=True))
    planned_at_scale(kept, *[((n,),) for n in (2 ** 31 - 1, 2 ** 31 + 5, 10 ** 12)])
    for program in scalar:  # a 0-d output; one partial per CHUNK elements
        plan = program.plan((70000,))
        assert plan.allocations["out"].shape == ()
        assert [math.prod(a.shape) for a in plan.allocations.values() if a.kind != "output"] \
            == [-(-70000 // CHUNK)], plan.allocations
    assert kept.plan((9001,)).allocations["out"].shape == (1,)


# --------------------------------------------------------------------------- masked mean


def _masked_mean(x, m):
    m = m != 0
    return np.where(m, x, 0).sum(-1) / m.sum(-1)


MASK_ROWS = ((1, 1), (3, 7), (4, 13), (2, 130), (0, 4), (3, 0))


def _mask_cases(ndt, mdt):
    out = []
    for i, bn in enumerate(MASK_ROWS):
        m = np.random.default_rng(i).random(bn) < 0.6
        if bn[0] > 1:
            m[0] = False  # an all-masked row: 0 / 0 = NaN, as NumPy
        out.append((rand(bn, ndt), m.astype(mdt)))
    return out


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_masked_mean_with_a_bool_mask(kdt, ndt):
    @kp.fusion
    def mm_where(x: T[kdt, "b", "n"], mask: T[kp.bool_, "b", "n"]):
        return kp.where(mask, x, 0).sum(-1) / mask.astype(kdt).sum(-1)

    @kp.fusion
    def mm_product(x: T[kdt, "b", "n"], mask: T[kp.bool_, "b", "n"]):
        m = mask.astype(x.dtype)
        return (x * m).sum(axis=1) / m.sum(axis=1)

    # one dtype each (a second emulated row kernel costs ~1 s): see the softmax test
    check(mm_where if ndt == np.float32 else mm_product, _mask_cases(ndt, np.bool_),
          _masked_mean)


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_masked_mean_with_an_int_mask(kdt, ndt):
    @kp.fusion
    def mm_int(x: T[kdt, "b", "n"], mask: T[kp.i32, "b", "n"]):
        keep = mask != 0
        return kp.where(keep, x, 0).sum(-1) / keep.astype(kdt).sum(-1)

    @kp.fusion
    def mm_int_count(x: T[kdt, "b", "n"], mask: T[kp.i32, "b", "n"]):
        keep = mask > 0
        return kp.where(keep, x, 0.0).sum(axis=-1) / keep.sum(axis=-1)  # int count, float sum

    program = check(mm_int if ndt == np.float32 else mm_int_count, _mask_cases(ndt, np.int32),
                    _masked_mean)
    planned_at_scale(program, *[((b, n), (b, n)) for b, n in ((1, 2 ** 31), (32, 10 ** 7),
                                                              (10 ** 6, 7), (4096, 4097))])
