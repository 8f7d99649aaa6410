"""Combining workspace partials with several accumulators per thread (``rows._combine_partials``).

A row kernel that finishes a reduction from partials (full reductions, rows split across
blocks, column splits) gives each lane ``COMBINE_UNROLL`` accumulators: whole rounds of that many
partials without bounds checks, then the rest. The split constants are patched small (chunks of
128 elements, 32-thread combine blocks), so that rows of a few thousand elements already have
more partials than one round; the shapes below put partials in whole rounds only, in rounds and
the tail, and in the tail alone, and a NaN in each place a round's accumulator would hold it.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import tuning

from .simt import Kernels, assert_close
from .split_consts import kernel_names, use_small_split

T = kp.Tensor


@kp.fusion
def rowstats(x: T[kp.f32, "b", "n"]):
    return x.sum(-1), x.max(-1), x.min(-1), x.prod(-1)


@kp.fusion
def rowsum(x: T[kp.f64, "b", "n"]):
    return x.sum(-1)


_compiled: dict[object, Kernels] = {}


def _kernels(fusion, unroll: int) -> Kernels:
    """One emulator build per fusion and unroll (the constants are patched alike each time)."""
    key = (fusion, unroll)
    if key not in _compiled:
        _compiled[key] = Kernels(fusion)
    return _compiled[key]


def _partials(n: int) -> int:
    return -(-n // tuning.SPLIT_CHUNK)


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    use_small_split(monkeypatch)
    monkeypatch.setattr(tuning, "COMBINE_UNROLL", 2)


# one combine block of 32 threads, 2 accumulators: rounds of 64 partials
@pytest.mark.parametrize("n", [128 * 64,        # exactly one round
                               128 * 70 + 5,    # a round and 7 partials of tail
                               517])            # 5 partials: the tail alone
def test_row_statistics_every_split_of_rounds_and_tail(n):
    rng = np.random.default_rng(n)
    x = rng.uniform(0.999, 1.001, (1, n)).astype(np.float32)
    k = _kernels(rowstats, 2)
    assert kernel_names(k, x.shape)[-1] == "rowstats_0_split_rowblock"
    s, mx, mn, p = k(x)
    xd = x.astype(np.float64)
    assert_close(s, xd.sum(-1), 1e-6, f"sum of {_partials(n)} partials")
    assert_close(mx, xd.max(-1), 0, "max")
    assert_close(mn, xd.min(-1), 0, "min")
    assert_close(p, xd.prod(-1), 1e-6, "prod")


@pytest.mark.parametrize("at", [0, 128 * 33, 128 * 64 + 3])
def test_nan_propagates_from_any_accumulator(at):
    # partial at // 128: lane 0's first accumulator, lane 1's second, the tail
    x = np.ones((1, 128 * 70 + 5), np.float32)
    x[0, at] = np.nan
    s, mx, mn, p = _kernels(rowstats, 2)(x)
    assert np.isnan(s[0]) and np.isnan(mx[0]) and np.isnan(mn[0]) and np.isnan(p[0])


def test_default_unroll_over_rounds_and_tail(monkeypatch):
    monkeypatch.setattr(tuning, "COMBINE_UNROLL", 8)  # rounds of 256 partials
    x = np.random.default_rng(7).standard_normal((1, 128 * 270 + 77))
    k = _kernels(rowsum, 8)
    assert kernel_names(k, x.shape) == ["rowsum_0_split_partial0", "rowsum_0_split_rowblock"]
    (got,) = k(x)
    assert_close(got, x.sum(-1), 1e-12, "sum of 271 partials")
