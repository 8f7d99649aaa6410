"""Reductions (sum prod max min mean over any axes, with and without keepdims) and the row
patterns that consume them (softmax, log-sum-exp, layernorm, share of a sum, centring).
"""

from __future__ import annotations

import math
from typing import Callable

from .dtypes import F32, F64, HALVES
from .reductions import reduced_shape, reduction
from .shapes import ShapeOps
from .values import Val


class RowOps(ShapeOps):
    """Reductions and row patterns over any axis."""

    def op_reduce(self, a: Val | None = None) -> Val | None:
        if a is None:
            a = self.choose(lambda v: v.rank >= 1 or self.chance(0.05))
        if a is None:
            return None
        kinds = ["sum", "max", "min", "mean", "prod"]
        if a.dt.kind == "c":
            kinds = ["sum", "mean", "prod"]
        kind = self.pick(kinds)
        r = a.rank
        if r == 0:
            axes: tuple[int, ...] | None = None
        else:
            k = int(self.rng.integers(1, r + 1))
            if self.chance(0.6):  # trailing axes: rows (the row schedules)
                axes = tuple(range(r - k, r))
            else:
                axes = tuple(sorted(self.rng.choice(r, size=k, replace=False).tolist()))
        full = axes is None or len(axes) == r
        red = reduction(self, a, kind, axes)  # draws nothing: the draws below keep their order
        if red is None:
            return None
        keep = self.chance(0.5)
        style = self.chance(0.5)
        if axes is None:
            ax_src = "None"
        elif len(axes) == 1:
            ax = axes[0] - (r if self.chance(0.3) else 0)
            ax_src = repr(ax)
        else:
            ax_src = repr(axes)
        if full and self.chance(0.4) and not keep:
            call_kp = f"{a.name}.{kind}()"
        elif style and kind in ("max", "min"):
            call_kp = f"kp.{kind}({a.name}, axis={ax_src}, keepdims={keep})"
        else:
            call_kp = f"{a.name}.{kind}(axis={ax_src}, keepdims={keep})"
        ref_axis = "None" if axes is None else repr(axes)
        call_np = f"_red({kind!r}, {a.name}, {ref_axis}, {keep}, {red.dt.name!r})"
        pos, ones = reduced_shape(a, axes, keep)
        return self.emit(call_kp, call_np, red.dt, pos, ones, lo=red.lo, hi=red.hi, r32=red.r32,
                         amin=red.amin, nan=red.nan, fuzz=red.fuzz)

    def op_pattern(self) -> Val | None:
        """Row patterns over any axis: softmax, log-sum-exp, layernorm, share of a sum."""
        a = self.choose(lambda v: v.dt in (F32, F64) + HALVES and v.rank >= 1
                        and v.bounded(50))
        if a is None:
            return None
        a = self.realign(a)
        r = a.rank
        ax = r - 1 if self.chance(0.6) else int(self.rng.integers(r))
        ax_src = repr(ax - r if self.chance(0.4) else ax)
        x = a.name
        kind = self.pick(["softmax", "layernorm", "lse", "share", "center"])
        if kind == "share" and a.lo < 0.1:
            kind = "softmax"
        r32 = a.r32 or a.dt == F32
        nm = self.fresh
        if a.dt in HALVES:
            n = max(self.extent[a.pos[ax]], 1)
            if not self.half_ok(a.dt, 0.0, n * max(1.0, a.hi)):
                return None  # a float16 sum of the row would overflow
            return self.half_pattern(kind, a, ax, ax_src)
        if kind == "layernorm":
            mu, d, var = nm(), nm(), nm()
            eps = 1e-5 if a.dt == F32 else 1e-9
            lines = [f"{mu} = {x}.mean(axis={ax_src}, keepdims=True)", f"{d} = {x} - {mu}",
                     f"{var} = ({d} * {d}).mean(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{mu} = _red('mean', {x}, {ax}, True, {a.dt.name!r})", f"{d} = {x} - {mu}",
                        f"{var} = _red('mean', {d} * {d}, {ax}, True, {a.dt.name!r})"]
            out, np_out = f"{d} * kp.rsqrt({var} + {eps!r})", f"{d} / np.sqrt({var} + {eps!r})"
            n = max(self.extent[a.pos[ax]], 1)
            lo, hi = -math.sqrt(n), math.sqrt(n)
            if a.dt == F32:
                r32 = True
        else:
            lines, np_lines, out, np_out, lo, hi = self._row_lines(kind, a, ax, ax_src, str)
        self.kp.extend(lines)
        self.np.extend(np_lines)
        return self.emit(out, np_out, a.dt, a.pos, a.ones, lo=lo, hi=hi, r32=r32, nan=a.nan)

    def _row_lines(self, kind: str, a: Val, ax: int, ax_src: str,
                   h: Callable[[str], str]) -> tuple:
        """The softmax, log-sum-exp, share (``x / x.sum``) and center (``x - x.mean``)
        patterns: (kp lines, reference lines, kp result, reference result, lo, hi). ``h``
        wraps a reference expression whose result the kernel rounds (the half mode's
        ``_model``; ``str`` otherwise: ``emit`` models the result itself)."""
        x, nm = a.name, self.fresh

        def red(fn: str, src: str) -> str:
            return f"_red({fn!r}, {src}, {ax}, True, {a.dt.name!r})"

        if kind == "softmax":
            m, e, s = nm(), nm(), nm()
            lines = [f"{m} = {x}.max(axis={ax_src}, keepdims=True)",
                     f"{e} = kp.exp({x} - {m})",
                     f"{s} = {e}.sum(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{m} = {red('max', x)}", f"{e} = {h('np.exp(' + h(f'{x} - {m}') + ')')}",
                        f"{s} = {red('sum', e)}"]
            return lines, np_lines, f"{e} / {s}", f"{e} / {s}", 0.0, 1.0
        if kind == "lse":
            m, s = nm(), nm()
            lines = [f"{m} = kp.max({x}, axis={ax_src}, keepdims=True)",
                     f"{s} = kp.exp({x} - {m}).sum(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{m} = {red('max', x)}",
                        f"{s} = {red('sum', h('np.exp(' + h(f'{x} - {m}') + ')'))}"]
            hi = a.hi + math.log(max(self.extent[a.pos[ax]], 1))
            return lines, np_lines, f"kp.log({s}) + {m}", f"{h(f'np.log({s})')} + {m}", a.lo, hi
        s = nm()
        fn = "sum" if kind == "share" else "mean"
        lines = [f"{s} = {x}.{fn}(axis={ax_src}, keepdims=True)"]
        np_lines = [f"{s} = {red(fn, x)}"]
        if kind == "share":
            return lines, np_lines, f"{x} / {s}", f"{x} / {s}", 0.0, 1.0
        return lines, np_lines, f"{x} - {s}", f"{x} - {s}", a.lo - a.hi, a.hi - a.lo

    def half_pattern(self, kind: str, a: Val, ax: int, ax_src: str) -> Val:
        """:meth:`op_pattern` over a float16/bfloat16 row: the same DSL source; the
        reference rounds (``_model``) after every operation the kernel rounds after. Every
        pattern is fuzzy (exp, reductions, a row's reciprocal)."""
        x, d, nm = a.name, a.dt.name, self.fresh

        def h(src: str) -> str:
            return f"_model({src}, {d!r})"

        def red(kind: str, src: str) -> str:
            return f"_red({kind!r}, {src}, {ax}, True, {d!r})"

        if kind == "layernorm":
            mu, dd, var = nm(), nm(), nm()
            lines = [f"{mu} = {x}.mean(axis={ax_src}, keepdims=True)", f"{dd} = {x} - {mu}",
                     f"{var} = ({dd} * {dd}).mean(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{mu} = {red('mean', x)}", f"{dd} = {h(f'{x} - {mu}')}",
                        f"{var} = {red('mean', h(f'{dd} * {dd}'))}"]
            out = f"{dd} * kp.rsqrt({var} + 1e-05)"
            shifted = h(f"{var} + {self.np_const(1e-5, a.dt)}")
            np_out = f"{dd} * {h(f'1 / np.sqrt({shifted})')}"
            n = max(self.extent[a.pos[ax]], 1)
            lo, hi = -math.sqrt(n), math.sqrt(n)
        else:
            lines, np_lines, out, np_out, lo, hi = self._row_lines(kind, a, ax, ax_src, h)
        self.kp.extend(lines)
        self.np.extend(np_lines)
        return self.emit(out, np_out, a.dt, a.pos, a.ones, lo=lo, hi=hi, r32=True, nan=a.nan,
                         fuzz=self.fuzz_of(a.dt))
