"""Regressions from an adversarial review of the segmentation and scheduling of reductions.

Numerics run through the SIMT emulator (:mod:`.simt`) against NumPy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close
from .split_consts import kernel_names, use_small_split

T = kp.Tensor


@kp.fusion
def _two_lengths(x: T[kp.f32, "b", "m"], y: T[kp.f32, "b", "n"]):
    return x.sum(-1) + y.sum(-1), y.mean(-1)


@pytest.fixture(scope="module")
def two_lengths() -> Kernels:
    return Kernels(_two_lengths)


@pytest.mark.parametrize("m, n, thread", [(2, 100_000, False), (40, 3, False),
                                          (2, 32, True), (32, 5, True)])
def test_row_schedule_fits_the_longest_reduction(two_lengths, m, n, thread):
    """Row reductions of different lengths in one kernel were scheduled by the *first* one's
    length: ``x.sum(-1) + y.sum(-1)`` with x 2 long took a thread per row, whose float32 sums
    accumulate in float32 (meant for <= 32 terms), for y a million long: 1.3e-5 relative error
    (4.6e-5 at 4 million), and one thread reduced each long row alone. A million-long y is
    split across blocks: see the two tests below (run at full size in the emulator, that split
    is ~1,000 blocks of 256 OS threads, four and a half minutes of CI)."""
    names = [ln.kernel for ln in two_lengths.planner.plan((2, m), (2, n)).launches]
    assert ("rowthread" in names[0]) == thread, names
    rng = np.random.default_rng(0)
    x = rng.random((2, m)).astype(np.float32)
    y = (rng.random((2, n)) + 0.5).astype(np.float32)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    s, mean = two_lengths(x, y)
    assert_close(s, xd.sum(-1) + yd.sum(-1), 1e-6, "sum")
    assert_close(mean, yd.mean(-1), 1e-6, "mean")


def test_a_million_long_second_reduction_is_split_across_blocks(two_lengths):
    """The plan at the size the bug was found at: the long row is split, never a thread's."""
    names = kernel_names(two_lengths, (2, 2), (2, 1_000_000))
    assert not any("rowthread" in name for name in names), names
    assert any("split_partial" in name for name in names), names


def test_short_first_long_second_split_matches_numpy(monkeypatch):
    """The same split, its numerics: the split constants made small enough for the emulator
    (:mod:`.split_consts`), x two long and first, y split across blocks."""
    use_small_split(monkeypatch)
    k = Kernels(_two_lengths)
    names = kernel_names(k, (2, 2), (2, 1000))
    assert not any("rowthread" in name for name in names), names
    assert any("split_partial" in name for name in names), names
    rng = np.random.default_rng(1)
    x = rng.random((2, 2)).astype(np.float32)
    y = (rng.random((2, 1000)) + 0.5).astype(np.float32)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    s, mean = k(x, y)
    assert_close(s, xd.sum(-1) + yd.sum(-1), 1e-6, "sum")
    assert_close(mean, yd.mean(-1), 1e-6, "mean")
