"""Regression (review 9): shift guards and dead nodes (:mod:`kernelpack.lowering.bounds`).

A dim that is a shift count somewhere (``1 << n``) is taken to be at most 63, since the planner
refuses larger counts, and shifts by values bounded through it lose their per-element guard.
A *dead* node (``kp.arange(1 << n)`` traced and never used) is never planned, so it bounds
nothing: with one in the graph, ``x >> kp.arange(n)`` for n = 70 shifted by 64..69 modulo the
width (``-5 >> 64`` gave -5, ``7 << 64`` gave 7) where NumPy gives -1, 0 and 0.
"""

from __future__ import annotations

import numpy as np

import kernelpack as kp
from kernelpack.lowering.bounds import shift_count_syms

from .simt import Kernels

T = kp.Tensor


def _shifts(x, k):
    return x >> k[None, :], x << k[None, :]


@kp.fusion
def dead_bound(x: T[kp.i64, "b", "n"]):
    unused = kp.arange(1 << x.shape[1])  # noqa: F841 - traced, never an output
    return _shifts(x, kp.arange(x.shape[1]))


@kp.fusion
def live_bound(x: T[kp.i64, "b", "n"], q: T[kp.i64, "c", "m"]):
    return _shifts(x, kp.arange(x.shape[1])) + (kp.arange(1 << q.shape[1]),)


def test_a_dead_shift_does_not_bound_its_count():
    assert shift_count_syms(dead_bound.trace()) == frozenset()
    assert shift_count_syms(live_bound.trace()) == frozenset({"m"})
    x = np.array([[-5] * 70, [7] * 70], np.int64)
    refs = _shifts(x, np.arange(70))
    for k, (got, ref) in enumerate(zip(Kernels(dead_bound)(x), refs)):
        assert np.array_equal(got, ref), (k, got[:, 62:], ref[:, 62:])


def test_a_live_shift_count_still_bounds_and_plans():
    kernels = Kernels(live_bound)
    x = np.array([[-5] * 9, [7] * 9], np.int64)
    q = np.zeros((1, 3), np.int64)
    got = kernels(x, q)
    for k, ref in enumerate(_shifts(x, np.arange(9)) + (np.arange(8),)):
        assert np.array_equal(got[k], ref), k
