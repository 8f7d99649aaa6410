"""Comparisons, bool logic and ``kp.where`` (only on values without float32 rounding: a
comparison is a step the float64 reference must see on the same side).
"""

from __future__ import annotations

from .dtypes import B, F32, F64
from .shapes import ShapeOps
from .values import Val


class WhereOps(ShapeOps):
    """Conditions and selections."""

    def op_compare_where(self) -> Val | None:
        def ok(v: Val) -> bool:
            return v.dt.kind in "bif" and not v.r32
        a = self.choose(ok)
        if a is None:
            return None
        if a.dt.kind == "b":
            cond = a
        else:
            op = self.pick(["<", "<=", ">", ">=", "==", "!="])
            if self.chance(0.5):
                c = 0 if a.dt.kind == "i" else self.pick([0.0, 0.5, -0.25, 1.0])
                if a.dt.kind == "i":
                    c = int(self.pick([0, 1, -3, 5]))
                cond = self.emit(f"{a.name} {op} {c!r}", f"{a.name} {op} {c!r}", B, a.pos,
                                 a.ones, lo=0, hi=1)
            else:
                b = self.choose(lambda v: v.dt.kind in "if" and not v.r32 and v is not a)
                if b is None:
                    return None
                a2, b2 = self.harmonize(self.realign(a), self.realign(b))
                if a2.r32 or b2.r32:
                    return None
                pos, ones = self.bshape(a2, b2)
                # an integer compared with a half value is converted to the half type first
                common = self.result_dt(a2.dt, b2.dt)
                cond = self.emit(f"{a2.name} {op} {b2.name}",
                                 f"{self.np_in(a2, common)} {op} {self.np_in(b2, common)}", B,
                                 pos, ones, lo=0, hi=1)
        if self.chance(0.25):
            # bool logic
            other = self.choose(lambda v: v.dt == B and v is not cond)
            if other is not None:
                c1, c2 = self.realign(cond), self.realign(other)
                pos, ones = self.bshape(c1, c2)
                op = self.pick(["&", "|", "^"])
                cond = self.emit(f"({c1.name} {op} {c2.name})", f"({c1.name} {op} {c2.name})",
                                 B, pos, ones, lo=0, hi=1)
            elif self.chance(0.5):
                cond = self.emit(f"~{cond.name}", f"~{cond.name}", B, cond.pos, cond.ones,
                                 lo=0, hi=1)
        if self.chance(0.2):
            return cond  # a bool value (an output, a where, a cast later)
        x = self.choose(lambda v: v.dt.kind in "ifc")
        if x is None:
            return cond
        cond, x = self.realign(cond), self.realign(x)
        if self.chance(0.4) and x.dt.kind != "c":
            if x.dt.kind == "i":
                c = int(self.pick([0, -1, 7]))
            else:
                c = float(self.pick([0.0, 1.0, -0.5] + ([0.1] if x.dt == F64 else [])))
            swap = self.chance(0.5)
            a_src, b_src = (repr(c), x.name) if swap else (x.name, repr(c))
            pos, ones = self.bshape(cond, x)
            lo, hi = min(x.lo, c), max(x.hi, c)
            r32 = x.r32 or (x.dt == F32 and c not in (0.0, 1.0, -0.5, 0, -1, 7))
            return self.emit(f"kp.where({cond.name}, {a_src}, {b_src})",
                             f"np.where({cond.name}, {a_src}, {b_src})", x.dt, pos, ones,
                             lo=lo, hi=hi, r32=r32, amin=0.0, nan=x.nan,
                             neg1=x.neg1 or c == -1)
        y = self.choose(lambda v: v.dt.kind in "ifc" and v is not x) or x
        y = self.realign(y)
        x, y = self.harmonize(x, y)
        dt = self.result_dt(x.dt, y.dt)
        if not self.half_ok(dt, min(x.lo, y.lo), max(x.hi, y.hi)):
            return None
        pos, ones = self.bshape(cond, x, y)
        return self.emit(f"kp.where({cond.name}, {x.name}, {y.name})",
                         f"np.where({cond.name}, {x.name}, {y.name})", dt, pos, ones,
                         lo=min(x.lo, y.lo), hi=max(x.hi, y.hi), r32=x.r32 or y.r32,
                         amin=min(x.amin, y.amin), nan=x.nan or y.nan, neg1=x.neg1 or y.neg1)
