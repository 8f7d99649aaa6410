"""Regressions from a third review of the DSL and its lowering, checked against NumPy through
the SIMT emulator (:mod:`.simt`), which runs the generated LLVM IR on the host."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels

T = kp.Tensor


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16 (nearest even), as float32: NumPy has no bfloat16."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def test_half_precision_arithmetic_rounds_every_result():
    """float16/bfloat16 compute in float32, and only casts and stores rounded: ``(h * h)
    .astype(f32)``, ``kp.exp(h) + ...`` and ``(b / 3).astype(f32)`` kept float32's extra
    bits (exp(float16(1)) came out 2.7182817, not float16's 2.71875)."""
    @kp.fusion
    def half(x: T[kp.f32, "n"]):
        h, b = x.astype(kp.f16), x.astype(kp.bf16)
        return ((h * h).astype(kp.f32), kp.exp(h).astype(kp.f32), (h / 3).astype(kp.f32),
                (kp.sqrt(h) + h).astype(kp.f32), (b * b).astype(kp.f32),
                kp.exp(b).astype(kp.f32), (b / 3).astype(kp.f32), (b + 0.001).astype(kp.f32))

    x = np.array([1.0, 0.1, -2.5, 3.0, 7.3, 0.0123], np.float32)
    h, b = x.astype(np.float16), _bf16(x)
    with np.errstate(invalid="ignore"):
        refs = [(h * h), np.exp(h), h / np.float16(3), np.sqrt(h) + h]
        refs = [r.astype(np.float32) for r in refs]
        refs += [_bf16(b * b), _bf16(np.exp(b)), _bf16(b / np.float32(3)),
                 _bf16(b + _bf16(np.array([0.001], np.float32))[0])]
    for k, (got, ref) in enumerate(zip(Kernels(half)(x), refs)):
        assert np.array_equal(got, ref, equal_nan=True), (k, got, ref)


def test_integer_mean_with_a_dtype_sums_in_that_dtype_like_numpy():
    """``x.mean(axis, dtype=kp.i32)`` averaged in float64 and cast back, where NumPy sums in
    int32 (wrapping), divides and truncates: int32 means of large values differed."""
    @kp.fusion
    def means(x: T[kp.i32, "a", "b", "c"]):
        return (x.mean(axis=(0, 2), dtype=kp.i32), x.mean(axis=1, dtype=kp.u8, keepdims=True),
                kp.mean(x, dtype=kp.i16), x.mean(axis=-1, dtype=kp.i64))

    x = np.random.default_rng(3).integers(-2**31, 2**31, (2, 3, 4)).astype(np.int32)
    refs = (x.mean(axis=(0, 2), dtype=np.int32), x.mean(axis=1, dtype=np.uint8, keepdims=True),
            np.mean(x, dtype=np.int16), x.mean(axis=-1, dtype=np.int64))
    for k, (got, ref) in enumerate(zip(Kernels(means)(x), refs)):
        assert got.dtype == ref.dtype and got.shape == ref.shape, k
        assert np.array_equal(got, ref), (k, got, ref)


def test_numpy_functions_on_traced_tensors_are_kp_ops():
    """``np.where(x > 0, x, 0)`` failed inside NumPy with a raw ValueError ("setting an array
    element with a sequence"): it is not a ufunc. NumPy's functions now reach kp through
    ``__array_function__``; the reductions keep NumPy's positional order, anything else is a
    TraceError naming the function."""
    @kp.fusion
    def f(x: T[kp.f32, "a", "b"], i: T[kp.i32, "b"]):
        return (np.where(x > 0, x, 0), np.sum(x, 0, kp.f64), np.max(x, 1, None, True),
                np.amin(x, axis=0), np.mean(x, axis=-1, keepdims=True), np.mean(i), np.prod(x))

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    i = np.arange(4, dtype=np.int32)
    refs = (np.where(x > 0, x, np.float32(0)), np.sum(x, 0, np.float64), np.max(x, 1, None, True),
            np.amin(x, axis=0), np.mean(x, axis=-1, keepdims=True), np.mean(i), np.prod(x))
    for k, (got, ref) in enumerate(zip(Kernels(f)(x, i), refs)):
        assert got.dtype == ref.dtype and got.shape == ref.shape, k
        np.testing.assert_allclose(got, ref, rtol=1e-6, err_msg=str(k))

    for body, match in [(lambda x: np.clip(x, 0, 1), r"np\.clip is not supported"),
                        (lambda x: np.sum(x, initial=1.0), r"np\.sum: \['initial'\] not"),
                        (lambda x: np.where(x > 0), r"np\.where is not supported")]:
        @kp.fusion
        def bad(x: T[kp.f32, "n"]):
            return body(x)

        with pytest.raises(kp.TraceError, match=match):
            bad.trace()
