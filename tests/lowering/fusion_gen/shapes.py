"""The universe of axes, the size sets, and broadcasting between values.

Every value's dims sit on axes of one universe (rank 1-3, symbolic or literal dims, sometimes one
symbol on two axes). Values of lower rank line up with its trailing axes (``realign`` inserts
``[:, None]`` views otherwise); ``kp.arange``/``kp.iota`` and ``[None]`` views are made here too.
"""

from __future__ import annotations

import math

from .builder import Builder
from .dtypes import BF16, F16, F32, F64, HALVES, I32, I64, kp_name
from .values import Val


class ShapeOps(Builder):
    """Axes, sizes, broadcasting, dims as values, arange/iota and views."""

    # -- the universe of axes and its sizes
    def make_universe(self) -> None:
        r = self.rng
        self.R = int(r.choice([1, 2, 3], p=[0.2, 0.45, 0.35]))
        names = ["a", "b", "c"]
        self.axes: list[str | int] = []
        for i in range(self.R):
            if self.chance(0.15):
                self.axes.append(int(self.pick([1, 3, 4, 5])))
            else:
                self.axes.append(names[i])
        syms = [i for i, a in enumerate(self.axes) if isinstance(a, str)]
        if len(syms) >= 2 and self.chance(0.12):
            # one dim on two axes (square): a reduction's result can be read at another row
            # (x.sum(axis=1)[None, :] + x), which the row schedules must hand to the fallback
            i, j = sorted(self.rng.choice(syms, size=2, replace=False).tolist())
            self.axes[j] = self.axes[i]
        self.sizes = self.make_sizes()
        # the largest extent of each axis over the size sets (interval bounds of reductions)
        self.extent = [max((s[a] if isinstance(a, str) else a) for s in self.sizes)
                       for a in self.axes]
        self.empty = [any((s[a] if isinstance(a, str) else a) == 0 for s in self.sizes)
                      for a in self.axes]

    def make_sizes(self) -> list[dict[str, int]]:
        syms = [a for a in self.axes if isinstance(a, str)]
        if self.scale == "gpu":
            budget, pools = 1 << 21, [1, 2, 3, 5, 7, 13, 31, 37, 64, 100, 129, 257, 1000, 1031,
                                     2049, 4100, 10007]
        else:
            budget, pools = 1200, [1, 2, 3, 5, 7, 8, 13, 17, 33, 37]
        sets = []
        tries = 0
        while len(sets) < (3 if self.scale == "gpu" else 2) and tries < 100:
            tries += 1
            s = {k: int(self.pick(pools)) for k in syms}
            if self.scale != "gpu" and syms and self.chance(0.12):
                s[self.pick(syms)] = int(self.pick([70, 129, 300]))
            elif self.scale != "gpu" and syms and self.chance(0.05):
                # one long row (block rows, tiles, row loops); the other dims tiny
                s = {k: int(self.pick([1, 2])) for k in syms}
                s[self.pick(syms)] = int(self.pick([1100, 2100, 4500]))
                if math.prod(s[a] if isinstance(a, str) else a for a in self.axes) <= 20000:
                    sets.append(s)
                continue
            if self.scale == "gpu" and syms and self.chance(0.3):
                s[self.pick(syms)] = int(self.pick([50000, 100003, 300000]))
            total = 1
            for a in self.axes:
                total *= s[a] if isinstance(a, str) else a
            if total > budget:
                continue
            sets.append(s)
        if syms:
            edge = {k: int(self.pick([1, 2, 3, 5])) for k in syms}
            edge[self.pick(syms)] = int(self.pick([0, 1]))
            if self.chance(0.7):
                sets.append(edge)
        if not sets:
            sets.append({k: 1 for k in syms})
        return sets

    # -- dims in the source
    def dim_src(self, p: int) -> str:
        """Source of the universe axis ``p``'s dim: ``x.shape[i]`` of an input spanning it."""
        a = self.axes[p]
        if isinstance(a, int):
            return str(a)
        for prm, v in self.inputs:
            if p in v.pos and not v.ones[v.pos.index(p)]:
                return f"{prm.name}.shape[{v.pos.index(p)}]"
        return ""

    # -- broadcasting
    def aligned(self, v: Val) -> bool:
        return v.pos == tuple(range(self.R - v.rank, self.R))

    def realign(self, v: Val) -> Val:
        """``v[:, None, ...]`` so that ``v``'s axes line up with the universe's trailing axes."""
        if self.aligned(v):
            return v
        start = v.pos[0]
        key, pos, ones = [], [], []
        for p in range(start, self.R):
            pos.append(p)
            if p in v.pos:
                key.append(":")
                ones.append(v.ones[v.pos.index(p)])
            else:
                key.append("None")
                ones.append(True)
        k = ", ".join(key)
        return self.emit(f"{v.name}[{k}]", f"{v.name}[{k}]", v.dt, pos, ones,
                         **self.same(v))

    def bshape(self, *vs: Val) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        rank = max(v.rank for v in vs)
        pos = tuple(range(self.R - rank, self.R))
        ones = []
        for p in pos:
            o = True
            for v in vs:
                if p in v.pos and not v.ones[v.pos.index(p)]:
                    o = False
            ones.append(o)
        return pos, tuple(ones)

    # -- ops on the universe's dims
    def op_index(self) -> Val | None:
        """``kp.arange`` / ``kp.iota`` over the universe's dims."""
        p = int(self.rng.integers(self.R))
        src = self.dim_src(p)
        if not src:
            return None
        n = self.extent[p]
        if self.chance(0.5):
            v = self.emit(f"kp.arange({src})", f"np.arange({src})", I64, (p,), (False,),
                          lo=0, hi=max(n - 1, 0))
            if self.chance(0.5):
                dt = self.pick([F32, F64, I32] + ([F16, BF16] if self.halves else []))
                if not self.half_ok(dt, 0, n):
                    return v
                v = self.emit_cast(v, dt)
            return v
        dims = [self.dim_src(q) for q in range(self.R)]
        if not all(dims):
            return None
        dt = self.pick([I64, I32, F32, F64] + ([F16, BF16] if self.halves else []))
        if not self.half_ok(dt, 0, n):
            return None
        # the index converted (rounded) to dt: _model rounds the float64 arange for halves
        npdt = {"int64": "np.int64", "int32": "np.int32"}.get(dt.name, "np.float64")
        shape_src = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        np_src = (f"np.broadcast_to(np.arange({dims[p]}, dtype={npdt}).reshape("
                  f"{tuple(-1 if q == p else 1 for q in range(self.R))}), {shape_src})")
        ones = tuple(isinstance(self.axes[q], int) and self.axes[q] == 1 for q in range(self.R))
        return self.emit(f"kp.iota({shape_src}, {p}, kp.{kp_name(dt)})", np_src, dt,
                         tuple(range(self.R)), ones, lo=0, hi=max(n - 1, 0),
                         r32=dt == F32 and n > 1 << 24, exact=dt not in HALVES)

    def op_view(self) -> Val | None:
        a = self.choose(lambda v: self.aligned(v) and v.rank < self.R)
        if a is None:
            return None
        pos = (a.pos[0] - 1 if a.rank else self.R - 1,) + a.pos
        return self.emit(f"{a.name}[None]", f"{a.name}[None]", a.dt, pos, (True,) + a.ones,
                         **self.same(a))
