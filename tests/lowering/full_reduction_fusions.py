"""The chained full reductions both tests/lowering/test_full_reductions.py (plans, emulator
numerics) and tests/lowering/test_gpu_full_reductions.py (the GPU) check: a variance and its
square root, three levels of moments, a vector over its norm (float32 and float64), two chains
in one fusion, a 2-D tensor reduced over every axis."""

from __future__ import annotations

import kernelpack as kp

__all__ = ["var_std", "moments", "unit", "unit64", "two", "var2d"]

T = kp.Tensor


@kp.fusion
def var_std(x: T[kp.f32, "n"]):
    v = ((x - x.mean()) ** 2).mean()
    return v, kp.sqrt(v)


@kp.fusion
def moments(x: T[kp.f64, "n"]):
    d = x - x.mean()
    v = (d * d).mean()
    z = d / kp.sqrt(v)
    return v, kp.sqrt(v), (z * z * z * z).mean()  # the kurtosis reads the variance: 3 levels


@kp.fusion
def unit(x: T[kp.f32, "n"]):
    y = x - x.mean()
    return y / kp.sqrt((y * y).sum())


@kp.fusion
def unit64(x: T[kp.f64, "n"]):
    y = x - x.mean()
    return y / kp.sqrt((y * y).sum())


@kp.fusion
def two(x: T[kp.f32, "n"], y: T[kp.f32, "m"]):
    return ((x - x.mean()) ** 2).mean(), ((y - y.mean()) ** 2).sum() + x.sum() * y.max()


@kp.fusion
def var2d(x: T[kp.f32, "a", "b"]):
    d = x - x.mean()
    return (d * d).mean(), d / kp.sqrt((d * d).sum())
