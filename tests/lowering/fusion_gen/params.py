"""The program's parameters: tensor inputs (dtype, rank, broadcast dims, value distribution)
and scalars.
"""

from __future__ import annotations

import kernelpack as kp

from .dtypes import B, BF16, C64, C128, F16, F32, F64, FLOAT_SCALARS, HALVES, I32, I64, INF
from .shapes import ShapeOps
from .values import Param, Val


class ParamOps(ShapeOps):
    """Adds parameters (and their leaf values) to the program."""

    def add_input(self, dt: kp.DType | None = None, aligned: bool | None = None) -> Val:
        r = self.rng
        if dt is None and self.halves:
            dt = self.pick([F16] * 4 + [BF16] * 4 + [F32] * 3 + [F64] * 2 + [I32] * 2
                           + [I64, B])
        elif dt is None:
            dt = self.pick([F32] * 7 + [F64] * 5 + [I32] * 3 + [I64] * 2 + [B] * 2
                           + [C64, C128, F16])
        rank = int(r.integers(0 if self.chance(0.05) else 1, self.R + 1))
        if aligned is None:
            aligned = self.chance(0.8)
        if aligned:
            pos = tuple(range(self.R - rank, self.R))
        else:
            pos = tuple(sorted(r.choice(self.R, size=rank, replace=False).tolist()))
        ones = tuple(bool(self.chance(0.15)) for _ in pos)
        dims = tuple(1 if o else self.axes[p] for p, o in zip(pos, ones))
        ones = tuple(o or self.axes[p] == 1 for p, o in zip(pos, ones))
        name = f"x{len(self.params)}"
        dist = ""
        lo, hi, amin, neg1 = -INF, INF, 0.0, True
        if dt in HALVES and self.halves:
            # half mode: values of the half type itself (rounded from float64 draws), a
            # wider range too (float16's ulp is 1/16 from 128 on, bfloat16's 1)
            dist = self.pick(["hnormal", "hnormal", "hpos", "hgrid", "hwide"])
            lo, hi = {"hnormal": (-2, 2), "hpos": (0.5, 2.5), "hgrid": (-4, 4),
                      "hwide": (-200, 200)}[dist]
            amin = 0.5 if dist == "hpos" else 0.0
        elif dt.kind == "f":
            dist = self.pick(["normal", "normal", "pos", "grid"]
                             + (["decimal"] if dt == F64 else []))
            if dt == F16:
                dist = "grid"
            lo, hi = {"normal": (-2, 2), "pos": (0.5, 2.5), "grid": (-4, 4),
                      "decimal": (-3, 3)}[dist]
            amin = 0.5 if dist == "pos" else 0.0
        elif dt.kind == "i":
            dist = self.pick(["small", "small", "nonzero", "count", "wide"])
            m = 1 << (30 if dt == I32 else 40)
            lo, hi = {"small": (-20, 20), "nonzero": (-9, 9),
                      "count": (0, 39 if dt == I32 else 69), "wide": (-m, m)}[dist]
            amin = 1 if dist == "nonzero" else 0
            neg1 = dist != "nonzero"
        elif dt.kind == "c":
            lo, hi = -1.5, 1.5
        else:
            lo, hi = 0, 1
        prm = Param(name, "tensor", dt, dims, dist)
        self.params.append(prm)
        nan = self.nan and (dt in (F32, F64) or self.halves and dt in HALVES)
        v = Val(name, dt, pos, ones, lo, hi, False, amin, neg1, nan, leaf=True, exact=True)
        self.inputs.append((prm, v))
        if dt == F16 and not self.halves:  # float16 only as storage: widen first (exact),
            return self.emit_cast(v, self.pick([F32, F64]))  # arithmetic in f32/f64
        self.pool.append(v)
        return v

    def add_scalar(self) -> Val:
        dt = self.pick([F32, F64, F64, I32, I64, B])
        name = f"s{len(self.params)}"
        if dt.kind == "f":
            value = float(self.pick(FLOAT_SCALARS))
        elif dt.kind == "i":
            value = int(self.pick([-7, -3, 2, 3, 5, 11]))
        else:
            value = bool(self.chance(0.5))
        prm = Param(name, "scalar", dt, (), "", value)
        self.params.append(prm)
        lo = hi = float(value)
        amin = abs(float(value))
        return Val(name, dt, (), (), lo, hi, False, amin, value != -1, False, leaf=True,
                   exact=True)
