"""Checked int64 operators for the planner's fast path (:mod:`kernelpack._plan_fast`).

Each takes three operands (unary operators ignore the last two, binary ones the last) so that
every step of the straight-line code has the same shape. They agree with
:func:`kernelpack.expr.apply_op` on every result; on any failure (overflow, division by zero, a
shift count outside 0..63) they raise an ArithmeticError without a message, and the caller
hands the call to the reference planner, which words the error.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["OPS"]


def _add(a: int, b: int, c: int) -> int:
    r = a + b
    if -9223372036854775808 <= r <= 9223372036854775807:
        return r
    raise OverflowError


def _sub(a: int, b: int, c: int) -> int:
    r = a - b
    if -9223372036854775808 <= r <= 9223372036854775807:
        return r
    raise OverflowError


def _mul(a: int, b: int, c: int) -> int:
    r = a * b
    if -9223372036854775808 <= r <= 9223372036854775807:
        return r
    raise OverflowError


def _floordiv(a: int, b: int, c: int) -> int:
    r = a // b  # ZeroDivisionError is an ArithmeticError
    if -9223372036854775808 <= r <= 9223372036854775807:
        return r
    raise OverflowError


def _ceildiv(a: int, b: int, c: int) -> int:
    r = -((-a) // b)
    if -9223372036854775808 <= r <= 9223372036854775807:
        return r
    raise OverflowError


def _shl(a: int, b: int, c: int) -> int:
    if 0 <= b <= 63:
        r = a << b
        if -9223372036854775808 <= r <= 9223372036854775807:
            return r
    raise OverflowError


def _shr(a: int, b: int, c: int) -> int:
    if 0 <= b <= 63:
        return a >> b
    raise OverflowError


def _neg(a: int, b: int, c: int) -> int:
    r = -a
    if r <= 9223372036854775807:
        return r
    raise OverflowError


OPS: dict[str, Callable[[int, int, int], int]] = {
    "add": _add, "sub": _sub, "mul": _mul, "floordiv": _floordiv, "ceildiv": _ceildiv,
    "mod": lambda a, b, c: a % b,
    "min": lambda a, b, c: a if a <= b else b,
    "max": lambda a, b, c: a if a >= b else b,
    "shl": _shl, "shr": _shr,
    "eq": lambda a, b, c: 1 if a == b else 0,
    "ne": lambda a, b, c: 1 if a != b else 0,
    "lt": lambda a, b, c: 1 if a < b else 0,
    "le": lambda a, b, c: 1 if a <= b else 0,
    "gt": lambda a, b, c: 1 if a > b else 0,
    "ge": lambda a, b, c: 1 if a >= b else 0,
    "and": lambda a, b, c: 1 if a and b else 0,
    "or": lambda a, b, c: 1 if a or b else 0,
    "not": lambda a, b, c: 0 if a else 1,
    "neg": _neg,
    "select": lambda a, b, c: b if a else c,
}
