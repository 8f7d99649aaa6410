"""The DSL's math functions on plain Python numbers, computed on the host.

``kp.sqrt(2.0 / math.pi)`` in a GELU reads as NumPy's ``np.sqrt(2 / np.pi)``: it gives a Python
float, a weak scalar like the literal it replaces (``x_f32 * c`` stays float32), with NumPy's
IEEE results where :mod:`math` raises. :mod:`kernelpack.ops` asks here before tracing anything;
a module of its own because these rules (one per function, in float64) are about numbers, not
about the traced graph. ``kp.where`` and ``kp.pow`` on plain numbers come here too (NumPy's
``np.where``/``np.power`` of Python scalars), and so does ``kp.where``'s symbolic select on sizes,
so that a float it cannot hold is a TraceError saying what to write.
"""

from __future__ import annotations

import math
from typing import Callable, cast

from .errors import TraceError
from .expr import INT64_MAX, INT64_MIN, Expr, select

__all__ = ["on_host", "as_float", "plain_numbers", "plain_floats", "host_extremum", "host_where",
           "host_pow"]


# The math functions of a plain Python number, on the host in float64: a GELU's
# ``c = kp.sqrt(2.0 / math.pi)`` reads as NumPy's ``np.sqrt(2 / np.pi)`` and gives a Python
# float, a weak scalar like the literal it replaces (``x_f32 * c`` stays float32). NumPy's IEEE
# results where ``math`` raises: log(0) is -inf, and on_host maps the domain errors
# (sqrt(-1), log(-1), sin(inf)) to nan and overflow (exp(1000)) to inf.
def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _rounded(f: Callable[[float], int]) -> Callable[[float], float]:
    """floor/ceil as NumPy's floats: inf and nan pass through (``math.floor`` raises), and the
    sign is ``v``'s, so ``ceil(-0.5)`` is ``-0.0`` (``float(0)`` would lose it)."""
    return lambda v: math.copysign(float(f(v)), v) if math.isfinite(v) else v


_HOST: dict[str, Callable[[float], float]] = {
    "exp": _exp, "exp2": getattr(math, "exp2", lambda v: math.pow(2.0, v)),  # exp2: 3.11+
    "log": lambda v: -math.inf if v == 0 else math.log(v),
    "log2": lambda v: -math.inf if v == 0 else math.log2(v),
    "sqrt": math.sqrt, "sin": math.sin, "cos": math.cos, "tan": math.tan, "tanh": math.tanh,
    "erf": math.erf, "floor": _rounded(math.floor), "ceil": _rounded(math.ceil),
    # rsqrt(±0) is ±inf, as 1 / np.sqrt(±0.0) and the GPU's rsqrt; sigmoid is the kernel's
    # 1 / (1 + exp(-x)), so 0.0 for x = -1000 (exp overflows to inf) and 1.0 for +1000
    "rsqrt": lambda v: math.copysign(math.inf, v) if v == 0 else 1.0 / math.sqrt(v),
    "sigmoid": lambda v: 1.0 / (1.0 + _exp(-v)),
}


def as_float(op: str, x: int | float) -> float:
    """``float(x)``, or a TraceError for an int beyond float64 (NumPy cannot convert it
    either), which names the int without ``str()`` (refused past 4300 digits)."""
    try:
        return float(x)
    except OverflowError:  # only an int overflows float()
        bits = cast(int, x).bit_length()
        digits = int((bits - 1) * math.log10(2))  # an exponent that fits a message
        raise TraceError(f"{op}: an int too large for a float64 (got one of magnitude "
                         f"1e{digits} or more, {bits} bits)") from None


def on_host(op: str, x: int | float) -> int | float:
    """``kp.<op>`` of a Python int or float (not bool): a float64 result that never raises for
    a float; floor/ceil of an int is the int (NumPy 2 keeps an integer dtype, as the traced
    op does)."""
    if isinstance(x, int) and op in ("floor", "ceil"):
        return int(x)
    try:
        return _HOST[op](as_float(f"kp.{op}", x))
    except ValueError:  # math's domain errors: sqrt(-1), log(-1), sin(inf)
        return math.nan
    except OverflowError:  # exp2(1024)
        return math.inf


def plain_numbers(*values: object) -> bool:
    """Whether every value is a Python int or float (a subclass such as ``np.float64`` too) and
    none a bool: a bool is a condition or a mask, never a number these functions compute on
    (``kp.exp(True)`` stays an error, as a traced bool tensor's ``exp`` is not a float op)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plain_floats(a: object, b: object) -> bool:
    """Two Python ints/floats (no bool), one a float: ``kp.maximum(0.5, 1)`` is computed here,
    where ``emax`` raised a bare TypeError on the float."""
    return plain_numbers(a, b) and (isinstance(a, float) or isinstance(b, float))


def host_extremum(op: str, a: int | float, b: int | float) -> float:
    """``np.maximum``/``np.minimum`` of two plain numbers: NaN-propagating, and ``b`` on a tie
    (``maximum(-0.0, 0.0)`` is ``0.0``), as NumPy and the float64 kernel's ``a > b ? a : b``."""
    fa, fb = as_float(f"kp.{op}", a), as_float(f"kp.{op}", b)
    if fa != fa or fb != fb:
        return math.nan
    return fa if (fa > fb if op == "maximum" else fa < fb) else fb


def _truth(cond: object) -> bool | None:
    """NumPy's truth of a plain condition (``np.where`` casts it to bool: nonzero and NaN are
    true, ``-0.0`` false): a Python bool, int or float, or a NumPy scalar of those kinds (what
    ``np.float64(a) > b`` gives); None for anything else (a symbolic Expr, a str symbol name)."""
    if isinstance(cond, (bool, int, float)):
        return bool(cond)
    if getattr(getattr(cond, "dtype", None), "kind", None) in ("b", "i", "u", "f") \
            and getattr(cond, "shape", None) == ():
        return bool(cond)  # type: ignore[arg-type]
    return None


def host_where(cond: object, a: object, b: object) -> float | Expr:
    """``kp.where`` with no traced tensor. A plain condition with int/float branches, one a
    float, gives ``np.where``'s float64 as a Python float (``float(a) if cond else float(b)``,
    both branches converted as NumPy converts them); int and dim branches keep the symbolic
    :func:`~kernelpack.expr.select` (an Expr: ``kp.where(x.shape[0] > 3, 4, 8)`` is a size).
    A float beside a symbolic condition or size has no such form: a TraceError says what does
    (a traced tensor operand, or a float computed from a selected size), where ``select`` used
    to raise a bare TypeError naming the float."""
    truth = _truth(cond)
    if truth is not None and plain_floats(a, b):
        fa, fb = as_float("kp.where", a), as_float("kp.where", b)  # type: ignore[arg-type]
        return fa if truth else fb
    try:
        return select(cond if truth is None else truth, a, b)  # type: ignore[arg-type]
    except TypeError:
        got = f"got cond={_show(cond, 60)}, a={_show(a, 40)}, b={_show(b, 40)}"
        if any(isinstance(v, Expr) for v in (cond, a, b)):
            raise TraceError(
                f"kp.where: a symbolic condition or size selects only between ints and dims "
                f"(sizes are known only at launch; {got}); for float branches give a traced "
                f"tensor operand (kp.where(cond, x, 2.0) chooses elementwise) or compute the "
                f"float from a selected size (kp.where(x.shape[0] > 3, 2, 4) * 0.5)") from None
        raise TraceError(
            f"kp.where: without a traced tensor the condition must be a bool or a number and "
            f"the branches Python ints or floats (not bools), or ints and dims for a size "
            f"({got})") from None


def _show(v: object, width: int) -> str:
    """``repr(v)`` cut to ``width`` for a message (an int past 4300 digits has none)."""
    return _int_text(v) if isinstance(v, int) else f"{v!r:.{width}}"


def _odd(y: float) -> bool:
    """Whether ``y`` is an odd integer (every float from 2**53 up is even)."""
    return math.isfinite(y) and math.fmod(y, 2.0) in (1.0, -1.0)


def _float_pow(x: float, y: float) -> float:
    """C99's ``pow`` as NumPy's float64 ``np.power`` gives it, where :func:`math.pow` raises:
    overflow is ``±inf`` (``(-10.0) ** 401`` is ``-inf``), ``±0.0`` to a negative power the
    pole ``±inf`` (``-inf`` only for ``-0.0`` to an odd integer), and a negative finite base to
    a non-integer power ``nan`` (Python's ``**`` would give a complex)."""
    try:
        return math.pow(x, y)
    except OverflowError:
        return -math.inf if x < 0 and _odd(y) else math.inf
    except ValueError:
        if x == 0:
            return math.copysign(math.inf, x) if _odd(y) else math.inf
        return math.nan


def _int_text(v: int) -> str:
    """An int for a message: ``str()`` refuses ints past 4300 digits."""
    return str(v) if v.bit_length() <= 256 else f"<an int of {v.bit_length()} bits>"


def host_pow(x: int | float, y: int | float) -> int | float:
    """``np.power`` of two plain Python numbers (see :func:`plain_numbers`). Int ** int is the
    exact int, as NumPy's int64 (``kp.pow(2, 3)`` is 8); a negative int exponent is NumPy's
    error. Operands and results must fit int64, as every Python int in the DSL must (an Expr
    constant, a literal beside a tensor): NumPy refuses such operands too, but wraps an
    overflowing result silently (``np.power(2, 63)`` is ``-2**63``), which kernelpack reports
    instead. With a float among them, NumPy's float64 result (C's ``pow``, :func:`_float_pow`,
    or ``sqrt`` for an exponent of 0.5).

    Raises:
        TraceError: int ** negative int, an int operand or result outside int64, or an int
            too large for a float64 beside a float.
    """
    if isinstance(x, float) or isinstance(y, float):
        fx, fy = as_float("kp.pow", x), as_float("kp.pow", y)
        # NumPy's np.power takes sqrt for an exponent of 0.5, as the traced ``x ** 0.5`` does:
        # -0.0 for -0.0 and nan for -inf, where C's pow gives 0.0 and inf
        return on_host("sqrt", fx) if fy == 0.5 else _float_pow(fx, fy)
    x, y = int(x), int(y)  # an int subclass (IntEnum) as the plain int
    what = f"{_int_text(x)} ** {_int_text(y)}"
    if not (INT64_MIN <= x <= INT64_MAX and INT64_MIN <= y <= INT64_MAX):
        raise TraceError(f"kp.pow: int operands must fit int64, as in NumPy (got {what}); make "
                         f"one a float for a float64 result")
    if y < 0:
        raise TraceError(f"kp.pow: integers to negative integer powers are not allowed, as in "
                         f"NumPy (got {what}); make one a float (kp.pow({x}.0, {y}))")
    # |x| >= 2 to a power of 64 or more is beyond int64: never build that int
    result = x ** y if abs(x) <= 1 or y < 64 else None
    if result is None or not INT64_MIN <= result <= INT64_MAX:
        raise TraceError(f"kp.pow: {what} is outside int64 (NumPy's int64 np.power wraps it "
                         f"silently; kernelpack refuses it, as any Python int beyond int64); "
                         f"make one a float (kp.pow({x}.0, {y})) for a float64 result")
    return result
