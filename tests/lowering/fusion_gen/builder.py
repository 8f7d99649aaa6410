"""The generator's core: its state, randomness, and emitting values into both sources.

:class:`Builder` holds the two programs being written (``kp`` lines for the fusion, ``np`` lines
for the reference), the pool of values so far and the seeded RNG. The op mixins (shapes,
params, arith, integers, unary, where, complexes, rows) build on it; :mod:`.generator` combines
them.
"""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np

import kernelpack as kp

from .dtypes import C64, F32, F64, HALVES, IMAX, KIND_RANK, kp_name
from .halves import SAFE, UNIT, half_const
from .values import Param, Val, iv

_NAMES = re.compile(r"\b[vxs]\d+\b")  # the values a source line reads


class Builder:
    """State and primitives shared by every part of the generator."""

    def __init__(self, seed: int, scale: str, halves: bool = False) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.scale = scale
        self.halves = halves  # the half mode (see the package docstring)
        self.vals: dict[str, Val] = {}  # every emitted value by name
        self.kp: list[str] = []
        self.np: list[str] = []
        self.params: list[Param] = []
        self.pool: list[Val] = []
        self.counter = 0
        self.nan = False
        self.uses: set[str] = set()

    # -- randomness
    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    # -- emitting
    def emit(self, kp_src: str, np_src: str, dt: kp.DType, pos, ones, **kw) -> Val:
        """A new value ``kp_src`` (fusion) / ``np_src`` (reference). Its ``fuzz`` is at least
        that of every value the fusion line reads (and ``fuzz=``, for a half result the
        kernel may round differently); a float value with fuzz counts as rounded (``r32``),
        so steps (comparisons, floor, int casts) keep away from it. Without half values
        (the default mode) nothing here changes: every fuzz is 0."""
        name = self.fresh()
        self.kp.append(f"{name} = {kp_src}")
        self.np.append(f"{name} = _model({np_src}, {dt.name!r})")
        fuzz = max([kw.pop("fuzz", 0.0)] + [self.vals[n].fuzz for n in _NAMES.findall(kp_src)
                                            if n in self.vals])
        if dt in HALVES and kw.get("r32"):
            fuzz = max(fuzz, UNIT[dt.name])
        if fuzz and dt.kind in "fc":
            kw["r32"] = True
        v = Val(name, dt, tuple(pos), tuple(ones), fuzz=fuzz, **kw)
        self.vals[name] = v
        self.pool.append(v)
        return v

    def same(self, v: Val, **over) -> dict:
        kw = dict(lo=v.lo, hi=v.hi, r32=v.r32, amin=v.amin, neg1=v.neg1, nan=v.nan,
                  exact=v.exact)
        kw.update(over)
        return kw

    # -- half mode helpers
    def is_exact(self, v: Val) -> bool:
        """Whether the kernel's ``v`` is the reference's value exactly: integers and bools,
        float32/half values without rounding the reference does not model (``r32``),
        float64 inputs and exact casts/views of exact values (``Val.exact``)."""
        if v.dt.kind in "bi":
            return True
        if v.dt == F64 or v.dt.kind == "c":
            return v.exact and not v.r32
        return not v.r32

    def fuzz_of(self, dt: kp.DType) -> float:
        """The ``fuzz=`` of a result of dtype ``dt`` computed by a function the kernel and
        NumPy evaluate differently in float32 (libdevice's or libm's exp against NumPy's,
        a row's reciprocal, a float32 partial sum): an ulp there can move a half rounding."""
        return UNIT[dt.name] if dt in HALVES else 0.0

    def half_ok(self, dt: kp.DType, lo: float, hi: float) -> bool:
        """Whether an interval fits the half type ``dt`` (any interval fits other dtypes)."""
        return dt not in HALVES or (-SAFE[dt.name] <= lo and hi <= SAFE[dt.name])

    def np_in(self, v: Val, dt: kp.DType) -> str:
        """The reference's source for operand ``v`` of an operation of half result dtype
        ``dt``: kernelpack converts an integer or bool operand to ``dt`` first (rounding it),
        where NumPy would promote ``int32 + float32`` to float64."""
        if dt in HALVES and v.dt != dt:
            return f"_model({v.name}, {dt.name!r})"
        return v.name

    def np_const(self, c: float, dt: kp.DType) -> str:
        """The reference's source for the literal ``c`` in an expression of dtype ``dt``: a
        half type rounds it (``x16 + 0.1`` adds float16(0.1))."""
        return repr(half_const(c, dt.name)) if dt in HALVES else repr(c)

    def emit_cast(self, v: Val, dt: kp.DType) -> Val:
        if v.dt == dt:
            return v
        lo, hi, r32, amin, neg1 = v.lo, v.hi, v.r32, v.amin, v.neg1
        if dt.kind in "iu":
            if v.dt.kind in "fc":
                lo, hi = iv(math.trunc(lo) if math.isfinite(lo) else lo,
                            math.trunc(hi) if math.isfinite(hi) else hi)
                amin = math.floor(amin) if math.isfinite(amin) else 0
            if v.dt.kind == "i" and dt.itemsize < v.dt.itemsize and not v.bounded(IMAX[dt.name]):
                lo, hi, amin = -IMAX[dt.name] - 1, IMAX[dt.name], 0  # wraps
            if v.dt.kind == "b":
                lo, hi, amin = 0, 1, 0
            neg1 = neg1 and v.dt.kind == "i"
        elif dt.kind == "b":
            lo, hi, amin = 0, 1, 0
        elif dt.kind == "f" and v.dt.kind == "c":
            pass
        if dt in (F32, C64) and not (v.dt.kind in "bi" and v.bounded(1 << 24)) \
                and v.dt not in (F32, C64) + HALVES:
            r32 = True
        if v.dt.kind == "c" and dt.kind != "c":
            amin = 0.0
        fuzz = 0.0
        if dt in HALVES:  # one rounding, the same in the kernel unless ``v`` may differ
            r32 = not self.is_exact(v)
            fuzz = UNIT[dt.name] if r32 else 0.0
        exact = self.is_exact(v) and dt.kind != "c"
        return self.emit(f"{v.name}.astype(kp.{kp_name(dt)})", f"{v.name}", dt, v.pos,
                         v.ones, lo=lo, hi=hi, r32=r32, amin=amin, neg1=neg1,
                         nan=v.nan and dt.kind in "fc", fuzz=fuzz, exact=exact)

    # -- picking operands
    def pool_of(self, pred: Callable[[Val], bool]) -> list[Val]:
        return [v for v in self.pool if pred(v)]

    def choose(self, pred: Callable[[Val], bool]) -> Val | None:
        cands = self.pool_of(pred)
        if not cands:
            return None
        # prefer recent values: chains rather than many independent expressions
        w = np.array([1.0 + i for i in range(len(cands))]) ** 1.5
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    # -- operand types
    def numeric(self, v: Val) -> bool:
        return v.dt.kind in "ifc"

    def harmonize(self, a: Val, b: Val) -> tuple[Val, Val]:
        """Casts so that ``a op b`` traces: one kind with different widths, or a complex and a
        float of another width, is an error in the DSL."""
        if a.dt == b.dt:
            return a, b
        if a.dt.kind == b.dt.kind:
            wide = a.dt if a.dt.itemsize > b.dt.itemsize else b.dt
            if self.chance(0.3):
                wide = b.dt if wide == a.dt else a.dt
            if not all(self.half_ok(wide, v.lo, v.hi) for v in (a, b)):
                wide = b.dt if wide == a.dt else a.dt  # one would overflow float16
            return self.emit_cast(a, wide), self.emit_cast(b, wide)
        if a.dt.kind == "c" and b.dt.kind == "f" and b.dt != a.dt.real:
            return a, self.emit_cast(b, a.dt.real)
        if b.dt.kind == "c" and a.dt.kind == "f" and a.dt != b.dt.real:
            return self.emit_cast(a, b.dt.real), b
        return a, b

    def result_dt(self, a: kp.DType, b: kp.DType) -> kp.DType:
        if a == b:
            return a
        return a if KIND_RANK[a.kind] > KIND_RANK[b.kind] else b
