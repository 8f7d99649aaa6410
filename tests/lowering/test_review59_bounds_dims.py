"""Review 59 (part 3 of 3): shift guards (:mod:`kernelpack.lowering.bounds`) and the dim
arithmetic the kernels compute themselves (:func:`kernelpack.lowering.irutil.int_expr_op`);
see :mod:`.test_review59_codegen_mutants` for the mutant table.

Kills B01, B07, B09 (shift guards dropped where a count can reach the width or be
negative), I04, I05, I08, I10, I11, I12 (floor/ceiling division, modulo, ``<=`` and ``max`` of
negative dim values; a zero divisor in a ``where`` arm that is not taken).
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .test_review59_codegen_mutants import compiled

T = kp.Tensor


# ---- shift guards ---------------------------------------------------------------------------

@kp.fusion
def shifts33(x: T[kp.i32, "b", 33]):
    k = kp.arange(33).astype(kp.i32)
    return x << k[None, :], x >> k[None, :]


@kp.fusion
def shifts_negated(x: T[kp.i32, "b", 8]):
    k = -kp.arange(8).astype(kp.i32)
    return x << k[None, :], x >> k[None, :], x << -3, x >> -3


def test_a_count_that_reaches_the_width_keeps_its_guard():
    """``x << arange(33)`` on int32: counts 0..32, so the last one is the width and NumPy
    gives 0 (and -1 or 0 for ``>>``); a bound of the iota one short of its true maximum
    drops the guard, and x86 (as PTX's ``shl.b32`` clamps differently) shifts by 32 mod 32."""
    x = np.array([[-5] * 33, [7] * 33], np.int32)
    lo, hi = compiled(shifts33)(x)
    k = np.arange(33, dtype=np.int32)[None, :]
    np.testing.assert_array_equal(lo, x << k)
    np.testing.assert_array_equal(hi, x >> k)


def test_negative_counts_keep_their_guard():
    """Counts ``-arange(8)`` (0, -1, ..., -7): NumPy shifts by a negative count as by a huge
    one (0, or -1 for a negative ``>>``); a bound that passes through the negation (or a
    negative constant taken as a bound: ``x << -3``) would drop the guard."""
    x = np.array([[-5] * 8, [7] * 8], np.int32)
    lo, hi, lo3, hi3 = compiled(shifts_negated)(x)
    k = -np.arange(8, dtype=np.int32)[None, :]
    np.testing.assert_array_equal(lo, np.left_shift(x, k))
    np.testing.assert_array_equal(hi, np.right_shift(x, k))
    np.testing.assert_array_equal(lo3, np.left_shift(x, np.int32(-3)))
    np.testing.assert_array_equal(hi3, np.right_shift(x, np.int32(-3)))


# ---- dim arithmetic inside kernels ---------------------------------------------------------

@kp.fusion
def dim_arith(x: T[kp.i64, "n"], y: T[kp.i64, "m"]):
    a = x.shape[0] - y.shape[0]
    return (x + a // 3, x + a % 3, x + kp.cdiv(a, 3), x + kp.cdiv(a, y.shape[0] - 5),
            x + kp.where(y.shape[0] > 2, a // (y.shape[0] - 2), 7), x + kp.emax(a, -1),
            x + kp.emin(a, 1), x + a % (y.shape[0] - 5), x + kp.where(a <= 0, 1, 2), x + (a >> 1))


@pytest.mark.parametrize("n, m", [(3, 10), (10, 3), (3, 11), (3, 2), (4, 1), (9, 3), (8, 3),
                                  (6, 6)])
def test_dim_arithmetic_of_negative_values_is_pythons(n, m):
    """Differences of dims are negative values the kernels compute themselves (no plan
    evaluates them): floor division, modulo and ceiling division round as Python's do for
    either sign of either operand (and ``>>`` is arithmetic), and the division in a ``where``
    arm that is not taken (``m - 2 == 0``) is by a divisor made non-zero (x86 traps on a
    division by zero, and it is undefined behaviour in LLVM)."""
    x, y = np.zeros(n, np.int64), np.zeros(m, np.int64)
    got = compiled(dim_arith)(x, y)
    a = n - m
    want = [a // 3, a % 3, -(-a // 3), -(-a // (m - 5)), a // (m - 2) if m > 2 else 7,
            max(a, -1), min(a, 1), a % (m - 5), 1 if a <= 0 else 2, a >> 1]
    assert [int(g[0]) for g in got] == want
    assert all((g == g[0]).all() for g in got)
