"""Regressions (review 9): NumPy's results where the tracer refused a NumPy-like program or
the generated code differed.

- A 64-bit integer tensor compared with a Python int past its range (``u64 > -1``,
  ``i64 < 2**63``, ``i32 != 2**70``) was a TraceError ("Python integer -1 is out of bounds for
  uint64"); NumPy 2 compares exactly, so every element has the same, known answer. A bool
  tensor beside such a literal stays refused, as NumPy's OverflowError.
- A float16 ``h ** 3`` rounded after each product of its chain; NumPy rounds its power once.

Numerics run through the SIMT emulator (:mod:`.simt`) and compare exactly with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels

T = kp.Tensor


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    assert np.array_equal(got, ref, equal_nan=ref.dtype.kind in "fc"), f"{what}: {got} != {ref}"


def _huge_comparisons(m, u, l, i):  # noqa: E741 - l is the int64 tensor
    return (u > -1, u == -1, -1 < u, u >= -(2**70), u != -3, u <= -1, l < 2**63, l == 2**64,
            2**64 > l, l > -(2**63) - 1, -(2**65) >= l, m.less(l, 2**63), 2**63 <= l,
            i < 2**70, i != 2**70)


def test_comparisons_with_literals_past_64_bits_are_exact_like_numpy():
    @kp.fusion
    def cmp(u: T[kp.u64, "n"], l: T[kp.i64, "n"], i: T[kp.i32, "n"]):  # noqa: E741
        return _huge_comparisons(np, u, l, i)

    u = np.array([0, 5, 2**64 - 1], np.uint64)
    l = np.array([-(2**63), 0, 2**63 - 1])  # noqa: E741
    i = np.array([1, -1, 2**31 - 1], np.int32)
    refs = _huge_comparisons(np, u, l, i)
    for k, (got, ref) in enumerate(zip(Kernels(cmp)(u, l, i), refs)):
        _same(got, ref, f"comparison {k}")


def test_bool_tensors_beside_literals_past_int64_stay_refused():
    @kp.fusion
    def cmp(b: T[kp.bool_, "n"]):
        return b == 2**64

    with pytest.raises(OverflowError):
        np.array([True]) == 2**64  # noqa: B015 - NumPy's own answer
    with pytest.raises(kp.TraceError, match=r"Python integer 18446744073709551616 is out of "
                                            r"bounds for int64"):
        cmp.trace()


def test_half_precision_integer_powers_round_once_like_numpy():
    """``h ** 3`` of a float16 tensor was the product chain ``(h * h) * h``, rounded to
    float16 after each product: a quarter of the values came out 1 ulp off. NumPy's power is
    one operation (powf in float32, rounded to float16 once), as ``h ** 2`` (its square) was
    already here."""

    @kp.fusion
    def powers(h: T[kp.f16, "n"]):
        return h ** 3, h ** 4, kp.pow(h, 5), np.power(h, 7), h ** 8, h ** 2

    h = np.arange(-2000, 2000, dtype=np.float16) * np.float16(0.0137)
    got = Kernels(powers)(h)
    with np.errstate(over="ignore"):
        refs = (h ** 3, h ** 4, np.power(h, 5), np.power(h, 7), h ** 8, h ** 2)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"power {k}")
