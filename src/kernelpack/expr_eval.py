"""Checked int64 arithmetic of symbolic expressions, and their direct evaluation.

Shared by :mod:`kernelpack.expr` (constant folding) and the reference evaluator below; the
loader evaluates through :mod:`kernelpack.expr_program`, whose operators must give the same
values and the same errors (tests compare all the paths). Split from :mod:`kernelpack.expr`,
which builds and prints the trees.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Mapping

from .limits import MAX_EXPR_DEPTH, shown_int

if TYPE_CHECKING:
    from .expr import Expr

__all__ = ["INT64_MIN", "INT64_MAX", "ExprEvalError", "apply_op", "evaluate"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


class ExprEvalError(ArithmeticError):
    """Raised inside evaluation; callers turn it into a ConstraintError with context."""


# ---- checked arithmetic (shared by folding and by the evaluator) -------------------------------
def _checked(r: int, op: str) -> int:
    if INT64_MIN <= r <= INT64_MAX:
        return r
    raise ExprEvalError(f"int64 overflow in {op}")


def _div_check(b: int, op: str) -> None:
    if b == 0:
        raise ExprEvalError(f"division by zero in {op}")


def _shift_check(b: int, op: str) -> None:
    if not 0 <= b <= 63:
        raise ExprEvalError(f"shift count {b} outside 0..63 in {op}")


def apply_op(op: str, a: int, b: int = 0, c: int = 0) -> int:
    """Apply one operator to concrete int64 values with overflow/zero-division checks."""
    if op == "add": return _checked(a + b, op)
    if op == "sub": return _checked(a - b, op)
    if op == "mul": return _checked(a * b, op)
    if op == "floordiv": _div_check(b, op); return _checked(a // b, op)
    if op == "ceildiv": _div_check(b, op); return _checked(-((-a) // b), op)
    if op == "mod": _div_check(b, op); return a % b
    if op == "min": return a if a <= b else b
    if op == "max": return a if a >= b else b
    if op == "shl": _shift_check(b, op); return _checked(a << b, op)
    if op == "shr": _shift_check(b, op); return a >> b
    if op == "eq": return int(a == b)
    if op == "ne": return int(a != b)
    if op == "lt": return int(a < b)
    if op == "le": return int(a <= b)
    if op == "gt": return int(a > b)
    if op == "ge": return int(a >= b)
    if op == "and": return int(bool(a) and bool(b))
    if op == "or": return int(bool(a) or bool(b))
    if op == "not": return int(not a)
    if op == "neg": return _checked(-a, op)
    if op == "select": return b if a else c
    raise ValueError(f"unknown expression operator {op!r}")


# ---- direct evaluation (reference path; the loader uses expr_program) --------------------------
def evaluate(e: Expr, env: Mapping[str, int]) -> int:
    """Evaluate ``e`` with checked arithmetic; lazily for ``select``.

    Raises :class:`kernelpack.errors.ExpressionError` naming the expression.
    """
    from .errors import ExpressionError

    if e._depth > MAX_EXPR_DEPTH:
        raise ExpressionError(f"cannot evaluate an expression nested deeper than "
                              f"MAX_EXPR_DEPTH ({MAX_EXPR_DEPTH})")
    try:
        return _eval(e, env, {})
    except ExprEvalError as exc:
        raise ExpressionError(f"cannot evaluate {e}: {exc}") from None


def _eval(e: Expr, env: Mapping[str, int], done: dict[int, int]) -> int:
    """``done`` maps ``id(node)`` to its value for this call: a node shared by several
    parents is computed once (without it, ``e = e + e * m`` built 40 times over costs 3^40
    steps). Only evaluated nodes are recorded, so ``select`` stays lazy."""
    if e.op == "const":
        return int(e.value)  # type: ignore[arg-type]
    if e.op == "sym":
        try:
            value = env[e.value]  # type: ignore[index]
        except KeyError:
            raise ExprEvalError(f"symbol {e.value!r} has no value") from None
        try:  # int() would take 2.5 or "3"
            number = operator.index(value)
        except TypeError:
            raise ExprEvalError(f"symbol {e.value!r} is {value!r}, not an integer") from None
        if not INT64_MIN <= number <= INT64_MAX:
            raise ExprEvalError(f"symbol {e.value!r} is {shown_int(number)}, outside int64")
        return number
    result = done.get(id(e))
    if result is None:
        if e.op == "select":
            result = _eval(e.args[1] if _eval(e.args[0], env, done) else e.args[2], env, done)
        else:
            result = apply_op(e.op, *(_eval(a, env, done) for a in e.args))
        done[id(e)] = result
    return result
