"""Regressions (review 7): the DSL's op x dtype matrix against NumPy, on the SIMT emulator.

- ``z ** -n`` for a complex zero ``z`` was ``1 / 0j`` = ``inf+nanj``; NumPy's ``npy_cpow``
  gives ``nan+nanj`` (a zero to a negative power is ill-defined for the four complex zeros).
- ``kp.pow(b, 2)`` of a bool tensor was int8 (the operator's ``b ** 2``, NumPy's ``square``);
  ``kp.pow`` is ``np.power``, which gives int64.

Plus a compact bit-exact matrix (arithmetic, comparisons, min/max, where, casts, Python scalars
on either side, special values) per dtype kind, one fusion each.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels

T = kp.Tensor
FLOATS = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3e38, 1e-45, 2.5, -7.0, 0.5]


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal dtype and values bit for bit (NaN where NumPy has NaN, signed zeros kept)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    parts = ((got.real, ref.real), (got.imag, ref.imag)) if ref.dtype.kind == "c" else ((got, ref),)
    for g, r in parts:
        assert np.array_equal(g, r, equal_nan=r.dtype.kind == "f"), f"{what}: {g} != {r}"
        if r.dtype.kind == "f":
            zero = r == 0
            assert np.array_equal(np.signbit(g[zero]), np.signbit(r[zero])), f"{what}: -0"


@pytest.mark.parametrize("cdt", [kp.complex64, kp.complex128], ids=str)
def test_complex_zero_to_a_negative_power_is_nan_like_numpy(cdt):
    z = np.array([0j, complex(-0.0, 0.0), complex(0.0, -0.0), 1 + 2j, -0.5j, 2.0], cdt.name)

    @kp.fusion
    def powers(z: T[cdt, "n"]):
        return z ** -1, z ** -2, z ** -3, kp.pow(z, -1), z ** 0, z ** 2

    got = Kernels(powers)(z)
    with np.errstate(all="ignore"):
        refs = [z ** -1, z ** -2, z ** -3, np.power(z, -1), z ** 0, z ** 2]
    for k, (g, r) in enumerate(zip(got, refs)):
        if k < 4:  # the negative powers of the three zeros
            assert np.isnan(g[:3].real).all() and np.isnan(g[:3].imag).all(), f"{k}: {g[:3]}"
        np.testing.assert_allclose(g, r, rtol=1e-6, err_msg=f"output {k}")


def test_kp_pow_of_a_bool_is_np_power_int64_while_the_operator_squares_to_int8():
    b = np.array([True, False, True])

    @kp.fusion
    def powers(b: T[kp.bool_, "n"]):
        return kp.pow(b, 2), b ** 2, np.square(b), np.power(b, 2), kp.pow(b, 3)

    got = Kernels(powers)(b)
    refs = [np.power(b, 2), b ** 2, np.square(b), np.power(b, 2), np.power(b, 3)]
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"output {k}")


@pytest.mark.parametrize("dt", [kp.float16, kp.float32, kp.float64], ids=str)
def test_float_matrix_is_bit_exact_with_numpy(dt):
    with np.errstate(over="ignore"):  # 3e38 is inf in float16
        v = np.array(FLOATS, dt.name)
    a, b = np.repeat(v, len(v)), np.tile(v, len(v))

    def ops(m, a, b, where):
        return (a + b, a - b, a * b, a / b, a // b, a % b, a < b, a <= b, a == b, a != b,
                where(a < b, a, b), 2.5 + a, 1 - a, 3 / a, 7 // a, -7 % a, a ** 2, a ** -1,
                a ** 0.5, -a, m.abs(a), m.floor(a), m.ceil(a), a.astype(np.float64),
                a.astype(np.int32), a.astype(np.bool_), a.astype(np.complex64))

    @kp.fusion
    def matrix(a: T[dt, "n"], b: T[dt, "n"]):
        return ops(kp, a, b, kp.where)

    got = Kernels(matrix)(a, b)
    with np.errstate(all="ignore"):
        refs = ops(np, a, b, np.where)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"{dt} output {k}")


@pytest.mark.parametrize("dt", [kp.int32, kp.int64], ids=str)
def test_integer_matrix_is_bit_exact_with_numpy(dt):
    info = np.iinfo(dt.name)
    v = np.array([0, 1, -1, 2, -7, 31, 32, 63, 64, info.min, info.max], dt.name)
    a, b = np.repeat(v, len(v)), np.tile(v, len(v))

    def ops(m, a, b):
        return (a + b, a - b, a * b, a // b, a % b, m.maximum(a, b), m.minimum(a, b), a < b,
                a & b, a | b, a ^ b, ~a, a << b, a >> b, -a, m.abs(a), 7 // a, -7 % a,
                a << 3, a >> 3, a / b, a ** 3, a.astype(np.float32), a.astype(np.float16),
                a.astype(np.bool_))

    @kp.fusion
    def matrix(a: T[dt, "n"], b: T[dt, "n"]):
        return ops(kp, a, b)

    got = Kernels(matrix)(a, b)
    with np.errstate(all="ignore"):
        refs = ops(np, a, b)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, r, f"{dt} output {k}")
