"""Integer ops: bitwise ``& | ^``, shifts, and floor division/modulo with negative operands
(division by 0 and ``INT_MIN // -1`` some of the time: NumPy defines them, the DSL follows).
"""

from __future__ import annotations

import math

from .dtypes import B, I32, I64, IMAX, INF
from .shapes import ShapeOps
from .values import Val


class IntOps(ShapeOps):
    """Bit operations and integer division."""

    def op_int(self) -> Val | None:
        a = self.choose(lambda v: v.dt.kind == "i")
        if a is None:
            # make an integer from a float or bool value
            f = self.choose(lambda v: (v.dt.kind == "f" and not v.r32 and not v.nan
                                       and v.bounded(1e6)) or v.dt == B)
            if f is None:
                return None
            return self.emit_cast(f, self.pick([I32, I64]))
        op = self.pick(["&", "|", "^", "<<", ">>", "//", "%", "//", "%"])
        if op in ("//", "%"):
            # NumPy defines x // 0 = x % 0 = 0 and INT_MIN // -1 = INT_MIN (wrapping): allowed
            # some of the time (the lowering once divided by zero, undefined in LLVM IR)
            any_div = self.chance(0.25)
            b = self.choose(lambda v: v.dt.kind == "i" and (v.amin >= 1 or any_div)
                            and v is not a)
            if b is None or self.chance(0.3):
                c = int(self.pick([2, 3, 7, -2, -5, 16, 1, -1, 0]))
                if c == -1 and not (a.lo > -IMAX[a.dt.name]) and not any_div:
                    c = -3
                lo, hi = self.divmod_iv(op, (a.lo, a.hi), (c, c))
                left = self.chance(0.2) and a.amin >= 1 and (a.lo > -IMAX[a.dt.name] or not a.neg1)
                if left:
                    src = f"{c} {op} {a.name}"
                    lo, hi = self.divmod_iv(op, (c, c), (a.lo, a.hi))
                else:
                    src = f"{a.name} {op} {c}"
                return self.emit(src, src, a.dt, a.pos, a.ones, lo=lo, hi=hi, neg1=True)
            a2, b2 = self.harmonize(self.realign(a), self.realign(b))
            if not any_div and (b2.amin < 1 or b2.neg1 and not a2.lo > -IMAX[a2.dt.name]):
                return None
            pos, ones = self.bshape(a2, b2)
            lo, hi = self.divmod_iv(op, (a2.lo, a2.hi), (b2.lo, b2.hi))
            src = f"{a2.name} {op} {b2.name}"
            return self.emit(src, src, a2.dt, pos, ones, lo=lo, hi=hi, neg1=True)
        if op in ("<<", ">>"):
            k = self.choose(lambda v: v.dt.kind == "i" and v.lo >= 0 and v.hi <= 80)
            if k is None or self.chance(0.3):
                c = int(self.pick([1, 3, 5, 31, 63] if a.dt == I64 else [1, 3, 5, 31]))
                src = f"{a.name} {op} {c}"
                lo, hi = (a.lo, a.hi) if op == ">>" else (-IMAX[a.dt.name] - 1, IMAX[a.dt.name])
                if op == "<<" and a.bounded(1 << 10) and c <= 5:
                    lo, hi = a.lo * (1 << c), a.hi * (1 << c)
                return self.emit(src, src, a.dt, a.pos, a.ones, lo=min(lo, 0), hi=max(hi, 0))
            a2, k2 = self.harmonize(self.realign(a), self.realign(k))
            pos, ones = self.bshape(a2, k2)
            src = f"{a2.name} {op} {k2.name}"
            if op == ">>":
                lo, hi = min(a2.lo, 0, -1 if a2.lo < 0 else 0), max(a2.hi, 0)
            else:
                lo, hi = -IMAX[a2.dt.name] - 1, IMAX[a2.dt.name]
            return self.emit(src, src, a2.dt, pos, ones, lo=lo, hi=hi)
        b = self.choose(lambda v: v.dt.kind == "i" and v is not a)
        if b is None or self.chance(0.3):
            c = int(self.pick([1, 3, 0xFF, -8, 12]))
            src = f"{a.name} {op} {c}" if self.chance(0.6) else f"{c} {op} {a.name}"
            m = max(abs(a.lo), abs(a.hi), abs(c))
            bits = 1 << int(m).bit_length() if math.isfinite(m) else INF
            return self.emit(src, src, a.dt, a.pos, a.ones, lo=-bits, hi=bits)
        a2, b2 = self.harmonize(self.realign(a), self.realign(b))
        pos, ones = self.bshape(a2, b2)
        m = max(abs(a2.lo), abs(a2.hi), abs(b2.lo), abs(b2.hi))
        bits = 1 << int(m).bit_length() if math.isfinite(m) and m < 2 ** 62 else INF
        if bits == INF:
            lo, hi = -IMAX[a2.dt.name] - 1, IMAX[a2.dt.name]
        else:
            lo, hi = -bits, bits
        src = f"{a2.name} {op} {b2.name}"
        return self.emit(src, src, a2.dt, pos, ones, lo=lo, hi=hi)

    @staticmethod
    def divmod_iv(op: str, a: tuple, b: tuple) -> tuple[float, float]:
        mb = max(abs(b[0]), abs(b[1]))
        if op == "%":
            return -mb, mb
        ma = max(abs(a[0]), abs(a[1]))
        return -ma - 1, ma + 1
