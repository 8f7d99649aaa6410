"""Regressions (review 4): floats computed from sizes are weak, as the Python floats NumPy
computes from ``x.shape`` are (``x_f32 / x.shape[-1] ** 0.5`` was a dtype-mismatch
TraceError); Python's numeric protocols on a dim (``abs``, ``round``, ``float``,
``math.sqrt``) either stay symbolic or raise a TraceError naming the kp form; and the
emulator's ``assert_close`` on an all-zero float32 reference.

Numerics run through the SIMT emulator (:mod:`.simt`) against NumPy with Python floats."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close

T = kp.Tensor


@pytest.mark.parametrize("dt", [kp.float16, kp.float32, kp.complex64], ids=str)
def test_floats_from_sizes_take_the_tensors_dtype(dt):
    """Attention scaling and mean-by-size beside float16/float32/complex64 tensors: the
    float64 computed from dims is rounded to the tensor's dtype, like NumPy's Python float."""

    @kp.fusion
    def scale(x: T[dt, "b", "n"]):
        n = x.shape[-1]
        return (x / n ** 0.5, x * (1.0 / x.shape[1]), x * kp.sqrt(n), x - 0.5 * n,
                kp.where(x == x, x, 2.0 / n))

    g = scale.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [dt] * 5
    npdt = np.dtype(dt.name)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 7))
    if dt.is_complex:
        x = x + 1j * rng.standard_normal((3, 7))
    x = x.astype(npdt)
    n = 7
    refs = (x / n ** 0.5, x * (1.0 / n), x * math.sqrt(n), x - 0.5 * n, x)
    tol = 2e-3 if dt == kp.float16 else 2e-6
    for k, (got, ref) in enumerate(zip(Kernels(scale)(x), refs)):
        assert got.dtype == npdt, f"output {k}"
        assert_close(got, ref.astype(npdt), tol, f"output {k}")


def test_floats_from_sizes_are_unchanged_beside_float64_and_integers():
    """Only narrower float/complex tensors re-type the value: beside float64 and int32 the
    result stays float64 (NumPy's Python float), and a float scalar parameter is no size."""

    @kp.fusion
    def keep(x: T[kp.f64, "n"], i: T[kp.i32, "n"]):
        m = x.shape[0]
        return x / m ** 0.5, i * (1.0 / m)

    g = keep.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [kp.float64, kp.float64]
    x = np.linspace(-1, 1, 5)
    i = np.arange(5, dtype=np.int32)
    got = Kernels(keep)(x, i)
    assert_close(got[0], x / 5 ** 0.5, 1e-15, "x / m ** 0.5")
    assert_close(got[1], i * (1.0 / 5), 1e-15, "i * (1.0 / m)")

    @kp.fusion
    def param(y: T[kp.f32, "n"], s: kp.f64):
        return y * (s / y.shape[0])  # a float64 parameter is a float64 value, not a size

    with pytest.raises(kp.TraceError, match=r"dtype mismatch float32\[n\] and float64\[\]"):
        param.trace()


def test_python_numeric_protocols_on_dims():
    """``abs``/``round``/``math.floor`` of a dim stay symbolic sizes; ``float``/``math.sqrt``/
    ``int``/``range`` of one were a raw ``TypeError("not a constant expression")`` (and
    ``abs`` "bad operand type"): a TraceError naming the kp form, still a TypeError."""

    @kp.fusion
    def sym(x: T[kp.f32, "n"]):
        n = x.shape[0]
        return x * abs(n - 5), x * round(n), x * math.floor(n), x * (round(n, 1) // 2)

    x = np.arange(3, dtype=np.float32)
    got = Kernels(sym)(x)
    for k, ref in enumerate((x * 2, x * 3, x * 3, x * 1)):
        assert_close(got[k], ref, 0, f"output {k}")

    for conv in (float, math.sqrt, math.log, int, range, complex):
        @kp.fusion
        def bad(x: T[kp.f32, "n"]):
            return x * conv(x.shape[0])

        with pytest.raises(kp.TraceError, match=r"of the size n: .*kp\.sqrt\(n\)") as info:
            bad.trace()
        assert isinstance(info.value, TypeError)

    n = kp.sym("n")
    with pytest.raises(TypeError, match="not a constant expression"):
        float(n)  # outside a trace: the plain TypeError
    assert float(n - n + 3) == 3.0 and abs(n - n - 3).evaluate() == 3
    assert abs(n - 5).evaluate(n=2) == 3 and round(n) is n


def test_assert_close_compares_a_zero_float32_reference_absolutely():
    zero = np.zeros(4, np.float32)
    assert_close(zero, zero, 0, "zeros")
    with pytest.raises(AssertionError, match="absolute error"):
        assert_close(zero + np.float32(1e-3), zero, 1e-6, "near zeros")


def test_python_complex_beside_float16_is_complex64():
    """``x_f16 + 1j`` was a dtype-mismatch TraceError although the literal was already typed
    complex64 (NumPy's result); so was a complex computed from dims. Two tensors still need a
    cast."""

    @kp.fusion
    def f16c(x: T[kp.f16, "n"]):
        return x + 1j, 2j * x, x * (x.shape[0] * 1j), kp.where(x > 0, x, 1j)

    g = f16c.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [kp.complex64] * 4
    x = np.linspace(-2, 2, 7).astype(np.float16)
    refs = (x + 1j, 2j * x, x * (7 * 1j), np.where(x > 0, x, np.complex64(1j)))
    for k, (got, ref) in enumerate(zip(Kernels(f16c)(x), refs)):
        assert got.dtype == np.complex64, f"output {k}"
        assert_close(got, ref, 1e-6, f"output {k}")

    @kp.fusion
    def two(x: T[kp.f16, "n"], z: T[kp.c64, "n"]):
        return x + z

    with pytest.raises(kp.TraceError, match=r"dtype mismatch float16\[n\] and complex64\[n\]"):
        two.trace()


def test_a_size_to_a_negative_power_is_a_float():
    """``x.shape[0] ** -1`` is a Python float in NumPy (the size is a Python int); it was
    "integers to negative integer powers are not allowed". An integer tensor still is."""

    @kp.fusion
    def inv(x: T[kp.f32, "n"]):
        return x * x.shape[0] ** -1, x * (2 * x.shape[0]) ** -2

    x = np.linspace(-1, 1, 5).astype(np.float32)
    got = Kernels(inv)(x)
    assert_close(got[0], x * np.float32(5 ** -1), 1e-7, "n ** -1")
    assert_close(got[1], x * np.float32(10 ** -2), 1e-7, "(2n) ** -2")

    @kp.fusion
    def tensor(i: T[kp.i32, "n"]):
        return i ** -1

    with pytest.raises(kp.TraceError, match="negative integer powers"):
        tensor.trace()


def test_numpy_ufuncs_and_divmod_of_a_size_inside_a_fusion():
    """``x / np.sqrt(x.shape[-1])`` (the attention scale) failed inside NumPy ("loop of ufunc
    does not support argument 0 of type Expr"), and ``divmod(n, 3)`` had no operator."""
    @kp.fusion
    def scaled(x: T[kp.f32, "b", "n"]):
        return x / np.sqrt(x.shape[-1]), divmod(x.shape[1], 3)[1] + x

    x = np.random.default_rng(5).standard_normal((3, 10)).astype(np.float32)
    a, b = Kernels(scaled)(x)
    assert a.dtype == np.float32 and b.dtype == np.float32  # weak, like kp.sqrt(n)
    assert_close(a, x.astype(np.float64) / np.sqrt(10.0), 1e-6, "np.sqrt(n)")
    assert_close(b, x.astype(np.float64) + 1, 1e-6, "divmod(n, 3)[1]")
    n = kp.sym("n")
    assert divmod(n, 4) == (n // 4, n % 4) and divmod(10, n) == (10 // n, 10 % n)
    with pytest.raises(TypeError):  # outside a trace a size has no value to compute with
        np.sqrt(n)
