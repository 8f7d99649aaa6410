"""The DSL's math functions on plain Python numbers, computed on the host.

``kp.sqrt(2.0 / math.pi)`` in a GELU reads as NumPy's ``np.sqrt(2 / np.pi)``: it gives a Python
float, a weak scalar like the literal it replaces (``x_f32 * c`` stays float32), with NumPy's
IEEE results where :mod:`math` raises. :mod:`kernelpack.ops` asks here before tracing anything;
a module of its own because these rules (one per function, in float64) are about numbers, not
about the traced graph.
"""

from __future__ import annotations

import math
from typing import Callable

from .errors import TraceError

__all__ = ["on_host", "as_float", "plain_floats", "host_extremum"]


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
    except OverflowError:
        digits = int((x.bit_length() - 1) * math.log10(2))  # an exponent that fits a message
        raise TraceError(f"{op}: an int too large for a float64 (got one of magnitude "
                         f"1e{digits} or more, {x.bit_length()} bits)") from None


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


def plain_floats(a: object, b: object) -> bool:
    """Two Python ints/floats (no bool), one a float: ``kp.maximum(0.5, 1)`` is computed here,
    where ``emax`` raised a bare TypeError on the float."""
    plain = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return plain and (isinstance(a, float) or isinstance(b, float))


def host_extremum(op: str, a: int | float, b: int | float) -> float:
    """``np.maximum``/``np.minimum`` of two plain numbers: NaN-propagating, and ``b`` on a tie
    (``maximum(-0.0, 0.0)`` is ``0.0``), as NumPy and the float64 kernel's ``a > b ? a : b``."""
    fa, fb = as_float(f"kp.{op}", a), as_float(f"kp.{op}", b)
    if fa != fa or fb != fb:
        return math.nan
    return fa if (fa > fb if op == "maximum" else fa < fb) else fb
