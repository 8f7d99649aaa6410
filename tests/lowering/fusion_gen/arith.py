"""Arithmetic ops: ``+ - *`` (with constants and dims as values), ``/ // %``, powers and
``maximum``/``minimum``, with their value intervals.
"""

from __future__ import annotations

import math

from .dtypes import C64, DECIMAL, DYADIC, F32, F64, HALVES, I64, IMAX, ISAFE
from .halves import UNIT
from .shapes import ShapeOps
from .values import Val, iv, mul_iv


class ArithOps(ShapeOps):
    """Arithmetic between values, constants and dims."""

    def op_arith(self) -> Val | None:
        a = self.choose(lambda v: self.numeric(v))
        if a is None:
            return None
        op = self.pick(["+", "-", "*"])
        if self.chance(0.3):  # with a constant or a dim
            return self.arith_const(a, op)
        b = self.choose(lambda v: self.numeric(v) and v is not a) or a
        a, b = self.realign(a), self.realign(b)
        a, b = self.harmonize(a, b)
        dt = self.result_dt(a.dt, b.dt)
        if dt.kind == "c":
            ma = max(abs(a.lo), abs(a.hi)) if a.dt.kind in "fc" else max(abs(a.lo), abs(a.hi))
            mb = max(abs(b.lo), abs(b.hi))
            m = ma + mb if op != "*" else 2 * ma * mb
            lo, hi = -m, m
        elif op == "+":
            lo, hi = iv(a.lo + b.lo, a.hi + b.hi)
        elif op == "-":
            lo, hi = iv(a.lo - b.hi, a.hi - b.lo)
        else:
            lo, hi = mul_iv((a.lo, a.hi), (b.lo, b.hi))
        if dt.kind == "i" and not (-ISAFE[dt.name] <= lo and hi <= ISAFE[dt.name]):
            lo, hi = -IMAX[dt.name] - 1, IMAX[dt.name]  # wraps: identical in NumPy
        if dt.kind == "f" and not (abs(lo) < 1e6 and abs(hi) < 1e6):
            return None
        if not self.half_ok(dt, lo, hi):
            return None
        amin = a.amin * b.amin if op == "*" else 0.0
        pos, ones = self.bshape(a, b)
        r32 = a.r32 or b.r32 or dt in (F32, C64)
        return self.emit(f"{a.name} {op} {b.name}",
                         f"{self.np_in(a, dt)} {op} {self.np_in(b, dt)}", dt, pos, ones,
                         lo=lo, hi=hi, r32=r32, amin=amin, nan=a.nan or b.nan)

    def arith_const(self, a: Val, op: str) -> Val | None:
        if a.dt.kind == "i" and self.chance(0.25) and a.dt == I64 and a.rank:
            # a dim as a value (int64)
            p = a.pos[int(self.rng.integers(a.rank))]
            src = self.dim_src(p)
            if not src:
                return None
            m = self.extent[p]
            c_src, c_lo, c_hi = src, 0, m
            c_np = c_src
        elif a.dt.kind == "f" and self.chance(0.2) and a.rank:
            p = a.pos[int(self.rng.integers(a.rank))]
            src = self.dim_src(p)
            if not src:
                return None
            c_src, c_lo, c_hi = src, 0, self.extent[p]
            # a dim in a half expression is converted to the half type (rounded) first
            c_np = f"_model({src}, {a.dt.name!r})" if a.dt in HALVES else src
        elif a.dt.kind == "i":
            c = int(self.pick([1, 2, 3, 5, -4, 7, 100]))
            c_src, c_lo, c_hi = repr(c), c, c
            c_np = c_src
        else:
            c = float(self.pick(DYADIC + (DECIMAL if a.dt not in (F32, C64) else ())))
            if self.chance(0.3):
                c = -c
            c_src, c_lo, c_hi = repr(c), c, c
            c_np = self.np_const(c, a.dt)
        left = self.chance(0.4)  # a dim on the left: ``x.shape[0] * x`` (Expr declines)
        x, y = (c_src, a.name) if left else (a.name, c_src)
        nx, ny = (c_np, a.name) if left else (a.name, c_np)
        iva, ivc = (a.lo, a.hi), (c_lo, c_hi)
        if op == "+":
            lo, hi = iv(a.lo + c_lo, a.hi + c_hi)
        elif op == "-":
            lo, hi = iv(c_lo - a.hi, c_hi - a.lo) if left else iv(a.lo - c_hi, a.hi - c_lo)
        else:
            lo, hi = mul_iv(iva, ivc)
        if a.dt.kind == "c":
            m = max(abs(lo), abs(hi), abs(a.lo), abs(a.hi)) * 2
            lo, hi = -m, m
        dt = a.dt
        if dt.kind == "i" and not (-ISAFE[dt.name] <= lo and hi <= ISAFE[dt.name]):
            lo, hi = -IMAX[dt.name] - 1, IMAX[dt.name]
        if dt.kind == "f" and not (abs(lo) < 1e6 and abs(hi) < 1e6):
            return None
        if not self.half_ok(dt, lo, hi):
            return None
        amin = a.amin * min(abs(c_lo), abs(c_hi)) if op == "*" else 0.0
        r32 = a.r32 or dt in (F32, C64) and not (op == "*" and c_src in ("1.0", "-1.0"))
        return self.emit(f"{x} {op} {y}", f"{nx} {op} {ny}", dt, a.pos, a.ones, lo=lo, hi=hi,
                         r32=r32, amin=amin, nan=a.nan)

    def op_div(self) -> Val | None:
        a = self.choose(lambda v: self.numeric(v))
        if a is None:
            return None
        floor_ops = a.dt.kind in "f" and not a.r32
        op = self.pick(["/", "/", "//", "%"] if floor_ops else ["/"])
        if a.dt.kind == "c":
            op = "/"

        def den_ok(v: Val) -> bool:
            if v.dt.kind == "c":
                return v.amin >= 0.5 and op == "/"
            if v.dt.kind not in "if":
                return False
            if op != "/" and (v.r32 or v.dt.kind != "f"):
                return False
            return v.amin >= 0.25
        b = self.choose(lambda v: den_ok(v) and v is not a)
        if b is None or self.chance(0.3):
            if a.dt.kind == "c":
                return None
            if a.dt == F32 or op != "/" and a.dt != F64:
                c = float(self.pick([0.5, 0.75, 1.5, -2.0, 0.25]))
            else:
                c = float(self.pick(DYADIC + DECIMAL + (-0.7,)))
            left = self.chance(0.3) and a.amin >= 0.25 and (a.dt.kind == "f" or op == "/")
            dt = a.dt if a.dt.kind == "f" else F64
            c_np = self.np_const(c, dt)
            if left:
                x_src, y_src = repr(c), a.name
                nx, ny = c_np, a.name
                mag = abs(c) / a.amin
            else:
                x_src, y_src = a.name, repr(c)
                nx, ny = a.name, c_np
                mag = max(abs(a.lo), abs(a.hi)) / abs(c)
            if op == "%":
                mag = abs(c) if not left else max(abs(a.lo), abs(a.hi))
            npop = {"/": "/", "//": "//", "%": "%"}[op]
            r32 = a.r32 or (dt == F32 and op in ("/", "%"))  # x % y + y rounds
            if not math.isfinite(mag) or mag > 1e7 or not self.half_ok(dt, -mag - 1, mag + 1):
                return None
            # a kernel with reductions divides by a per-row or constant divisor through its
            # reciprocal (lowering/regrows.py): exact only for powers of two
            fuzz = UNIT[dt.name] if dt in HALVES and op == "/" and (
                left or math.frexp(abs(c))[0] != 0.5) else 0.0
            return self.emit(f"{x_src} {op} {y_src}", f"{nx} {npop} {ny}", dt, a.pos,
                             a.ones, lo=-mag - 1, hi=mag + 1, r32=r32, nan=a.nan, fuzz=fuzz)
        a2, b2 = self.harmonize(self.realign(a), self.realign(b))
        if op != "/" and (a2.r32 or b2.r32):
            return None  # a step of // or % on a value with float32 rounding in it
        dt = self.result_dt(a2.dt, b2.dt)
        if dt.kind in "bi":
            dt = F64
        pos, ones = self.bshape(a2, b2)
        if op == "%":
            mag = max(abs(b2.lo), abs(b2.hi))
        else:
            ma = max(abs(a2.lo), abs(a2.hi))
            mag = ma / b2.amin * (1.5 if dt.kind == "c" else 1.0)
        if not math.isfinite(mag) or mag > 1e7 or not self.half_ok(dt, -mag - 1, mag + 1):
            return None
        r32 = a2.r32 or b2.r32 or (dt in (F32, C64) and op in ("/", "%"))
        fuzz = UNIT[dt.name] if dt in HALVES and op == "/" else 0.0  # see above: reciprocals
        return self.emit(f"{a2.name} {op} {b2.name}",
                         f"{self.np_in(a2, dt)} {op} {self.np_in(b2, dt)}", dt, pos, ones,
                         lo=-mag - 1, hi=mag + 1, r32=r32, nan=a2.nan or b2.nan, fuzz=fuzz)

    def op_minmax(self) -> Val | None:
        a = self.choose(lambda v: v.dt.kind in "if")
        b = self.choose(lambda v: v.dt.kind in "if" and v is not a)
        if a is None or b is None:
            return None
        a, b = self.harmonize(self.realign(a), self.realign(b))
        dt = self.result_dt(a.dt, b.dt)
        fn = self.pick(["maximum", "minimum", "max", "min"])
        pos, ones = self.bshape(a, b)
        np_fn = "np.maximum" if fn in ("maximum", "max") else "np.minimum"
        if fn in ("maximum", "max"):
            lo, hi = max(a.lo, b.lo), max(a.hi, b.hi)
        else:
            lo, hi = min(a.lo, b.lo), min(a.hi, b.hi)
        # an integer operand becomes float32 in a float32 result (kernelpack's promotion),
        # rounded above 2^24, while the reference keeps it exact (GPU fuzz seed 9562)
        r32 = a.r32 or b.r32 or dt in (F32, C64) and any(
            v.dt.kind in "iu" and max(abs(v.lo), abs(v.hi)) > 2**24 for v in (a, b))
        if not self.half_ok(dt, min(a.lo, b.lo), max(a.hi, b.hi)):
            return None
        return self.emit(f"kp.{fn}({a.name}, {b.name})",
                         f"{np_fn}({self.np_in(a, dt)}, {self.np_in(b, dt)})", dt, pos,
                         ones, lo=lo, hi=hi, r32=r32, nan=a.nan or b.nan,
                         amin=0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)))

    def op_pow(self) -> Val | None:
        a = self.choose(lambda v: v.dt.kind in "if")
        if a is None:
            return None
        if self.chance(0.5) and a.bounded(30):
            k = int(self.pick([0, 1, 2, 3, 4]))
            m = max(abs(a.lo), abs(a.hi)) ** k
            lo = 0.0 if k % 2 == 0 else -m
            if k == 0:
                lo, m = 1.0, 1.0
            if a.dt.kind == "i" and m > ISAFE[a.dt.name]:
                lo, m = -IMAX[a.dt.name] - 1, IMAX[a.dt.name]
            src = f"{a.name} ** {k}"
            np_src = f"np.power({a.name}, {k})" if a.dt.kind == "f" else f"{a.name} ** {k}"
            r32 = a.r32 or (a.dt == F32 and k >= 2)
            if not self.half_ok(a.dt, lo, m):
                return None
            # a half cube and up: powf or a product chain, rounded once (not modelled)
            fuzz = UNIT[a.dt.name] if a.dt in HALVES and k >= 3 else 0.0
            return self.emit(src, np_src, a.dt, a.pos, a.ones, lo=lo, hi=m, r32=r32,
                             nan=a.nan and k != 0, amin=1.0 if k == 0 else a.amin ** k,
                             fuzz=fuzz)
        if a.dt.kind == "f" and a.lo >= 0.25 and a.hi <= 10:
            e = self.choose(lambda v: v.dt.kind == "f" and v.bounded(3) and v is not a)
            if e is not None:
                a2, e2 = self.harmonize(self.realign(a), self.realign(e))
                pos, ones = self.bshape(a2, e2)
                lo, hi = iv(a2.lo ** -3, a2.hi ** 3)
                lo = min(a2.lo ** 3, a2.lo ** -3, a2.hi ** 3, a2.hi ** -3)
                hi = max(a2.lo ** 3, a2.lo ** -3, a2.hi ** 3, a2.hi ** -3)
                src = self.pick([f"{a2.name} ** {e2.name}", f"kp.pow({a2.name}, {e2.name})"])
                return self.emit(src, f"np.power({a2.name}, {e2.name})", a2.dt, pos, ones,
                                 lo=lo, hi=hi, r32=a2.r32 or e2.r32 or a2.dt == F32,
                                 nan=a2.nan or e2.nan, amin=lo, fuzz=self.fuzz_of(a2.dt))
            c = float(self.pick([0.5, 1.5, -0.5, 2.5]))
            lo, hi = iv(a.lo ** c, a.hi ** c)
            return self.emit(f"{a.name} ** {c!r}", f"np.power({a.name}, {c!r})", a.dt, a.pos,
                             a.ones, lo=lo, hi=hi, r32=a.r32 or a.dt == F32, nan=a.nan, amin=lo,
                             fuzz=self.fuzz_of(a.dt))
        if a.dt.kind == "f" and a.bounded(3):
            c = float(self.pick([2.0, 0.5, 1.5]))
            lo, hi = iv(c ** a.lo, c ** a.hi)
            return self.emit(f"{c!r} ** {a.name}", f"np.power({c!r}, {a.name})", a.dt, a.pos,
                             a.ones, lo=lo, hi=hi, r32=a.r32 or a.dt == F32, nan=a.nan, amin=lo,
                             fuzz=self.fuzz_of(a.dt))
        return None
