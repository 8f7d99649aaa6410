"""Complex ops: ``kp.complex`` from two floats, real/imag/abs/exp/negation, equality and mixed
complex-real arithmetic.
"""

from __future__ import annotations

import math

from .dtypes import B, C64, C128, F32, F64, HALVES
from .shapes import ShapeOps
from .values import Val


class ComplexOps(ShapeOps):
    """Making and using complex values."""

    def op_complex(self) -> Val | None:
        z = self.choose(lambda v: v.dt.kind == "c")
        if z is None or self.chance(0.3):
            re = self.choose(lambda v: v.dt in (F32, F64) and v.bounded(100))
            if re is None:
                return None
            im = self.choose(lambda v: v.dt.kind in "f" and v.bounded(100) and v is not re) or re
            re, im = self.harmonize(self.realign(re), self.realign(im))
            if re.dt in HALVES:
                return None  # no complex type has half parts
            pos, ones = self.bshape(re, im)
            m = max(abs(re.lo), abs(re.hi), abs(im.lo), abs(im.hi))
            dt = C64 if re.dt == F32 else C128
            return self.emit(f"kp.complex({re.name}, {im.name})",
                             f"_complex({re.name}, {im.name})", dt, pos, ones, lo=-m, hi=m,
                             r32=re.r32 or im.r32, nan=re.nan or im.nan,
                             amin=max(re.amin, im.amin))
        op = self.pick(["real", "imag", "abs", "exp", "neg", "conjmul", "eq"])
        m = max(abs(z.lo), abs(z.hi))
        if op in ("real", "imag"):
            src = self.pick([f"{z.name}.{op}", f"kp.{op}({z.name})"])
            return self.emit(src, f"np.{op}({z.name})", z.dt.real, z.pos, z.ones, lo=z.lo,
                             hi=z.hi, r32=z.r32, nan=z.nan)
        if op == "abs":
            return self.emit(f"kp.abs({z.name})", f"np.abs({z.name})", z.dt.real, z.pos, z.ones,
                             lo=z.amin, hi=m * 1.5, r32=z.r32 or z.dt == C64, nan=z.nan,
                             amin=z.amin)
        if op == "exp":
            if m > 20:
                return None
            e = math.exp(m)
            return self.emit(f"kp.exp({z.name})", f"np.exp({z.name})", z.dt, z.pos, z.ones,
                             lo=-e, hi=e, r32=z.r32 or z.dt == C64, nan=z.nan, amin=math.exp(-m))
        if op == "neg":
            return self.emit(f"-{z.name}", f"-{z.name}", z.dt, z.pos, z.ones, **self.same(z))
        if op == "eq":
            w = self.choose(lambda v: v.dt.kind == "c" and v is not z) or z
            if z.r32 or w.r32:
                return None
            z2, w2 = self.harmonize(self.realign(z), self.realign(w))
            pos, ones = self.bshape(z2, w2)
            cmp = self.pick(["==", "!="])
            return self.emit(f"{z2.name} {cmp} {w2.name}", f"{z2.name} {cmp} {w2.name}", B,
                             pos, ones, lo=0, hi=1)
        # z * (re - i im) with a real factor: mixed complex/real arithmetic
        f = self.choose(lambda v: v.dt.kind in "fi" and v.bounded(100))
        if f is None:
            return None
        z2, f2 = self.harmonize(self.realign(z), self.realign(f))
        pos, ones = self.bshape(z2, f2)
        mf = max(abs(f2.lo), abs(f2.hi))
        return self.emit(f"{z2.name} * {f2.name} - {z2.name}",
                         f"{z2.name} * {f2.name} - {z2.name}", z2.dt, pos, ones,
                         lo=-(m * mf + m), hi=m * mf + m, r32=z2.r32 or f2.r32 or z2.dt == C64,
                         nan=z2.nan or f2.nan)
