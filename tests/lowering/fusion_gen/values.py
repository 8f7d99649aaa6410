"""The values and parameters of a generated program, and the interval arithmetic on them.

Every :class:`Val` carries an interval (and a lower bound of its magnitude, whether it may be
-1, NaN or hold float32 rounding): what the generator consults so that ``log``/``sqrt`` get
positive arguments, divisors stay away from 0, ``exp`` cannot overflow and discontinuous
operations only see values the float64 reference agrees on.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import kernelpack as kp

from .dtypes import INF


@dataclass
class Val:
    """One named value of the generated program, in both sources."""

    name: str
    dt: kp.DType
    pos: tuple[int, ...]          # universe axis of each dim (strictly increasing)
    ones: tuple[bool, ...]        # whether each dim is a literal 1
    lo: float = -INF              # interval of the value (complex: of both parts)
    hi: float = INF
    r32: bool = False             # float32 rounding went into it
    amin: float = 0.0             # a lower bound of |value| (0: may be 0)
    neg1: bool = True             # integers: may be -1 (a divisor -1 needs a safe dividend)
    nan: bool = False             # may hold NaN
    leaf: bool = False
    # half mode (see .halves): the unit roundoff of the coarsest half-type rounding that the
    # kernel may take differently from the reference somewhere in this value's history (a
    # libdevice exp one float32 ulp off NumPy's, straddling a float16 tie), 0 for none
    fuzz: float = 0.0
    exact: bool = False           # float64: the kernel's value is the reference's, bit for bit

    @property
    def rank(self) -> int:
        return len(self.pos)

    @property
    def kind(self) -> str:
        return "f" if self.dt.kind == "f" else self.dt.kind

    def bounded(self, m: float) -> bool:
        return -m <= self.lo and self.hi <= m


@dataclass
class Param:
    """One parameter of the fusion: a tensor input or a scalar."""

    name: str
    kind: str                     # "tensor" | "scalar"
    dt: kp.DType
    dims: tuple = ()              # annotation entries: a symbol name or a literal int
    dist: str = ""                # how its values are drawn
    value: Any = None             # scalars: the value passed


# ---- interval arithmetic -----------------------------------------------------------------------
def iv(a: float, b: float) -> tuple[float, float]:
    lo, hi = min(a, b), max(a, b)
    if math.isnan(lo) or math.isnan(hi):
        return -INF, INF
    return lo, hi


def mul_iv(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps = []
        for x in a:
            for y in b:
                p = x * y
                ps.append(0.0 if math.isnan(p) else p)  # inf * 0: the 0 end of a bound
    return iv(min(ps), max(ps))


def powb(m: float, n: float) -> float:
    """``m ** n`` for interval bounds, inf where it overflows."""
    try:
        return float(m) ** n
    except OverflowError:
        return INF
