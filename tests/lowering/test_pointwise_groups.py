"""Pointwise kernels with a transcendental or a division per element take several 16-byte
groups per thread, a block apart, all loads first (tuning.HEAVY_POINTWISE); light ones
(axpy) keep one group per thread. Run on the SIMT emulator against NumPy float64 at sizes
that end in a whole round, a partial round, a scalar tail, misaligned, and with a grid too
small for one round per block (the grid-stride loop over rounds)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import tuning

from .simt import Kernels

T = kp.Tensor


@kp.fusion
def gelu32(x: T[kp.f32, "n"]):
    return 0.5 * x * (1.0 + kp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@kp.fusion
def ratio64(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return x / (y * y + 1.0), kp.exp(-x * x)


@kp.fusion
def axpy32(x: T[kp.f32, "n"], y: T[kp.f32, "n"], a: kp.f32):
    return a * x + y


@kp.fusion
def exp32(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return kp.exp(x) * y


def _gelu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def test_heavy_kernels_take_groups_light_ones_do_not():
    block, groups = tuning.HEAVY_POINTWISE
    g = kp.compile(exp32, targets=["sm_90"]).summary.variants[0].launches[0]
    assert int(g.block[0]) == block and g.grid[0] == kp.emin(kp.cdiv("n", block * groups * 4),
                                                              tuning.GRID_X_MAX)
    a = kp.compile(axpy32, targets=["sm_90"]).summary.variants[0].launches[0]
    assert int(a.block[0]) == tuning.BLOCK
    assert a.grid[0] == kp.emin(kp.cdiv("n", tuning.BLOCK * 4), tuning.GRID_CAP)


@pytest.mark.parametrize("n", [1, 3, 511, 512, 1000, 2051, 4 * 512 * 3])
def test_grouped_float32_sizes(n):
    x = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)
    (got,) = Kernels(gelu32)(x)
    np.testing.assert_allclose(got, _gelu(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("offset", [1, 2])
def test_misaligned_views_take_the_scalar_loop(offset):
    x = (np.random.default_rng(5).standard_normal(1200) * 2).astype(np.float32)
    base = (-x.ctypes.data // 4) % 4
    view = x[base + offset:base + offset + 1100]
    assert view.ctypes.data % 16
    (got,) = Kernels(gelu32)(view)
    np.testing.assert_allclose(got, _gelu(view), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("n", [255, 256, 257, 1001])
def test_a_grid_smaller_than_the_rounds_loops_over_them(monkeypatch, n):
    monkeypatch.setattr(tuning, "GRID_X_MAX", 2)  # 2 blocks: many rounds each
    k = Kernels(ratio64)
    assert k.planner.plan((n,), (n,)).launches[0].grid[0] == min(2, -(-n // 256))
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    q, e = k(x, y)
    np.testing.assert_allclose(q, x / (y * y + 1.0), rtol=1e-15)
    np.testing.assert_allclose(e, np.exp(-x * x), rtol=1e-15)


@kp.fusion
def trig32(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return kp.sin(x) * y + kp.cos(y)


@kp.fusion
def trig16(x: T[kp.f16, "n"]):
    return kp.tan(x * 0.5)


@kp.fusion
def cexp64(z: T[kp.c64, "n"]):
    return kp.exp(z)


@kp.fusion
def trig_pow32(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return kp.sin(x) + y ** x


@kp.fusion
def trig64(x: T[kp.f64, "n"]):
    return kp.sin(x)


@kp.fusion
def gelu64(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return 0.5 * x * (1.0 + kp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) / y


@kp.fusion
def silu64(x: T[kp.f64, "n"]):
    return x * kp.sigmoid(x)


@kp.fusion
def tanh_exp64(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return kp.tanh(x) + kp.exp(y)


@kp.fusion
def tanh_sin64(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return kp.tanh(x) + kp.sin(y)


@kp.fusion
def tanh32(x: T[kp.f32, "n"]):
    return kp.tanh(x)


@kp.fusion
def silu32(x: T[kp.f32, "n"]):
    return x * kp.sigmoid(x)


def _launch(f):
    return kp.compile(f, targets=["sm_90"]).summary.variants[0].launches[0]


@pytest.mark.parametrize("f, vec, expected", [
    (trig32, 4, "long"), (trig16, 8, "long"), (cexp64, 2, "long"), (gelu64, 2, "long"),
    (silu64, 2, "long"), (gelu32, 4, "long"), (tanh32, 4, "long"), (trig_pow32, 4, "heavy"),
    (trig64, 2, "heavy"), (tanh_exp64, 2, "heavy"), (tanh_sin64, 2, "heavy"),
    (ratio64, 2, "heavy"), (exp32, 4, "heavy"), (silu32, 4, "heavy")])
def test_long_libdevice_routines_take_one_group_per_thread(f, vec, expected):
    """float32-or-narrower sin/cos/tan (complex64 exp) without a pow, float64 tanh/sigmoid
    and float32 tanh with divisions only beside them: LONG_MATH_POINTWISE; float64 trig, a
    pow beside the trig, tanh beside another transcendental, float32 sigmoid, exp and
    divisions: HEAVY_POINTWISE."""
    block, groups = (tuning.LONG_MATH_POINTWISE if expected == "long"
                     else tuning.HEAVY_POINTWISE)
    launch = _launch(f)
    assert int(launch.block[0]) == block
    assert launch.grid[0] == kp.emin(kp.cdiv("n", block * groups * vec), tuning.GRID_X_MAX)


def test_long_math_and_heavy_schedules_differ():
    """The test above tells the two apart only while they differ."""
    assert tuning.LONG_MATH_POINTWISE != tuning.HEAVY_POINTWISE


@pytest.mark.parametrize("n", [1, 3, 127, 512, 513, 1000, 2051])
def test_one_group_trig_sizes(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    y = (rng.standard_normal(n) * 4).astype(np.float32)
    (got,) = Kernels(trig32)(x, y)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(got, np.sin(xd) * yd + np.cos(yd), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n", [5, 1024, 1031])
def test_one_group_half_and_complex_sizes(n):
    rng = np.random.default_rng(n)
    x = rng.uniform(-2, 2, n).astype(np.float16)
    (got,) = Kernels(trig16)(x)
    np.testing.assert_allclose(got.astype(np.float64), np.tan(x.astype(np.float64) * 0.5),
                               rtol=2e-3, atol=2e-3)
    z = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    (got,) = Kernels(cexp64)(z)
    np.testing.assert_allclose(got, np.exp(z.astype(np.complex128)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 1001])
def test_one_group_float64_tanh_sizes(n):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n) * 3, rng.uniform(0.5, 2.0, n)
    (got,) = Kernels(gelu64)(x, y)
    ref = 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))) / y
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-15)
