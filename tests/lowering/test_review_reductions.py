"""Regressions from an adversarial review of the segmentation and scheduling of reductions.

Numerics run through the SIMT emulator (:mod:`.simt`) against NumPy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close

T = kp.Tensor


@kp.fusion
def _two_lengths(x: T[kp.f32, "b", "m"], y: T[kp.f32, "b", "n"]):
    return x.sum(-1) + y.sum(-1), y.mean(-1)


@pytest.fixture(scope="module")
def two_lengths() -> Kernels:
    return Kernels(_two_lengths)


@pytest.mark.parametrize("m, n, thread", [(2, 1_000_000, False), (40, 3, False),
                                          (2, 32, True), (32, 5, True)])
def test_row_schedule_fits_the_longest_reduction(two_lengths, m, n, thread):
    """Row reductions of different lengths in one kernel were scheduled by the *first* one's
    length: ``x.sum(-1) + y.sum(-1)`` with x 2 long took a thread per row, whose float32 sums
    accumulate in float32 (meant for <= 32 terms), for y a million long: 1.3e-5 relative error
    (4.6e-5 at 4 million), and one thread reduced each long row alone."""
    names = [ln.kernel for ln in two_lengths.planner.plan((2, m), (2, n)).launches]
    assert ("rowthread" in names[0]) == thread, names
    rng = np.random.default_rng(0)
    x = rng.random((2, m)).astype(np.float32)
    y = (rng.random((2, n)) + 0.5).astype(np.float32)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    s, mean = two_lengths(x, y)
    assert_close(s, xd.sum(-1) + yd.sum(-1), 1e-6, "sum")
    assert_close(mean, yd.mean(-1), 1e-6, "mean")
