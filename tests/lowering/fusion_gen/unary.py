"""Unary ops: negation, ``abs``, math functions on their domains, floor/ceil, ``~``, and casts.
"""

from __future__ import annotations

import warnings

import numpy as np

from .builder import Builder
from .dtypes import B, BF16, C64, C128, F16, F32, F64, HALVES, I32, I64
from .values import Val, iv


class UnaryOps(Builder):
    """Functions of one value, and casts between dtypes."""

    def op_unary(self) -> Val | None:
        a = self.choose(lambda v: v.dt.kind in "if")
        if a is None:
            return None
        fdt = a.dt if a.dt.kind == "f" else F64  # math on integers is float64
        r32 = a.r32 or fdt == F32
        lo, hi = a.lo, a.hi
        cands = ["neg", "abs", "sin", "cos", "tanh", "erf", "sigmoid"]
        # e^10 = 22026 (float16's largest value is 65504)
        if hi <= (10 if fdt == F16 else 15 if fdt == F32 else 30) and lo > -60:
            cands += ["exp", "exp2"]
        if lo >= 0.1:
            cands += ["log", "log2", "sqrt", "rsqrt"]
        if a.bounded(1.2):
            cands += ["tan"]
        if not a.r32 and a.bounded(1e6):
            cands += ["floor", "ceil"]
        if a.bounded(1e4) or not a.nan:
            cands += ["sq"]  # x*x + 0.5: a positive value for log/sqrt/division later
        if a.dt.kind == "i":
            cands += ["ineg", "iabs", "invert"]
        else:
            cands += ["real", "imag"]  # of a real tensor: itself, zeros (NaN or not)
        op = self.pick(cands)
        name = a.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if op == "neg":
                return self.emit(f"-{name}", f"-{name}", a.dt, a.pos, a.ones,
                                 **self.same(a, lo=-hi, hi=-lo))
            if op in ("real", "imag"):
                src = self.pick([f"{name}.{op}", f"kp.{op}({name})"])
                kw = self.same(a) if op == "real" else dict(lo=0.0, hi=0.0, r32=False)
                return self.emit(src, f"np.{op}({name})", a.dt, a.pos, a.ones, **kw)
            if op == "ineg":
                return self.emit(f"-{name}", f"-{name}", a.dt, a.pos, a.ones,
                                 **self.same(a, lo=-hi, hi=-lo, neg1=a.neg1 and False or True))
            if op in ("abs", "iabs"):
                m = max(abs(lo), abs(hi))
                src = self.pick([f"kp.abs({name})", f"abs({name})"])
                return self.emit(src, f"np.abs({name})", a.dt, a.pos, a.ones,
                                 **self.same(a, lo=min(a.amin, m), hi=m, neg1=False))
            if op in ("floor", "ceil") and a.dt.kind == "i":  # integral already: same dtype
                return self.emit(f"kp.{op}({name})", name, a.dt, a.pos, a.ones, **self.same(a))
            if op == "invert":
                return self.emit(f"~{name}", f"~{name}", a.dt, a.pos, a.ones,
                                 **self.same(a, lo=-hi - 1, hi=-lo - 1, amin=0, neg1=True))
            if op == "sq":
                if not a.bounded(1e3):
                    return None
                m = max(abs(lo), abs(hi)) ** 2 + 0.5
                if not self.half_ok(fdt, 0.0, m):
                    return None
                # two operations: a half type rounds the square before adding
                sq = f"_model({name} * {name}, {fdt.name!r})" if fdt in HALVES \
                    else f"{name} * {name}"
                return self.emit(f"{name} * {name} + 0.5", f"{sq} + 0.5", fdt
                                 if a.dt.kind == "f" else a.dt, a.pos, a.ones,
                                 **self.same(a, lo=0.5, hi=m, r32=r32 if a.dt.kind == "f" else False,
                                             amin=0.5, exact=False)) if a.dt.kind == "f" else None
            fn = {"exp": (np.exp, "np.exp"), "exp2": (np.exp2, "np.exp2"),
                  "log": (np.log, "np.log"), "log2": (np.log2, "np.log2"),
                  "sqrt": (np.sqrt, "np.sqrt"), "rsqrt": (lambda x: 1 / np.sqrt(x), "1 / np.sqrt"),
                  "sin": (None, "np.sin"), "cos": (None, "np.cos"), "tanh": (None, "np.tanh"),
                  "erf": (None, "_erf"), "sigmoid": (None, "_sigmoid"), "tan": (np.tan, "np.tan"),
                  "floor": (np.floor, "np.floor"), "ceil": (np.ceil, "np.ceil")}[op]
            mono, np_fn = fn
            if mono is not None:
                lo2, hi2 = iv(float(mono(lo)), float(mono(hi)))
            else:
                lo2, hi2 = (0.0, 1.0) if op == "sigmoid" else (-1.0, 1.0)
            amin = 0.0
            if op in ("exp", "exp2", "sqrt", "rsqrt", "sigmoid") and lo2 > 0:
                amin = lo2
            if op in ("floor", "ceil"):
                r = False if fdt == F64 or not a.r32 else True
            else:
                r = r32
            src = f"kp.{op}({name})" if op != "rsqrt" else f"kp.rsqrt({name})"
            # an integer argument in the mode's float64 model: the "ld" reference takes the
            # function in long double, so an output that its last ulp decides shows (seed 1978)
            arg = name if a.dt.kind == "f" else f'_model({name}, "float64")'
            # floor/ceil/sqrt are exact (IEEE) in float32 on both sides; libdevice's (libm's)
            # exp, sin ... an ulp from NumPy's may round to the other half value
            fuzz = self.fuzz_of(fdt) if op not in ("floor", "ceil", "sqrt") else 0.0
            return self.emit(src, f"{np_fn}({arg})", fdt, a.pos, a.ones, lo=lo2, hi=hi2, r32=r,
                             amin=amin, nan=a.nan, fuzz=fuzz)

    def op_cast(self) -> Val | None:
        a = self.choose(lambda v: True)
        if a is None:
            return None
        targets = [B, I32, I64, F32, F64]
        if a.dt.kind == "f" and (a.r32 or a.nan or not a.bounded(1e9)):
            targets = [B, F32, F64] if not a.nan else [F32, F64]
        if a.dt.kind == "c":
            targets = [F32, F64, C64, C128] if not (a.r32) else [F32, C64]
            if not a.r32 and not a.nan:
                targets.append(B)
        if a.dt.kind == "f" and not a.nan:
            targets += [C64, C128]
        if a.dt.kind == "f" and a.r32 and B in targets:
            targets.remove(B)
        if self.halves and a.dt.kind in "bif":  # half mode: into the half types often
            targets += [t for t in (F16, BF16) * 2 if self.half_ok(t, a.lo, a.hi)]
        targets = [t for t in targets if t != a.dt]
        if a.dt.kind == "c":  # complex -> float: the part's width must match ours
            targets = [t for t in targets if t.kind == "c" or t == a.dt.real or not a.r32]
        dt = self.pick(targets)
        if dt.kind == "i" and a.dt.kind == "f" and not a.bounded(2 ** 30 if dt == I32 else 2 ** 52):
            return None
        return self.emit_cast(a, dt)
