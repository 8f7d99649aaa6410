"""A seeded generator of random ``@kp.fusion`` programs with NumPy references.

Differential testing the way an independent checker would: programs nobody wrote by hand.
:func:`generate` (seed) gives a :class:`Case`: the fusion (Python source generated as text and
exec'd, so annotations are real ``kp.Tensor[...]`` objects), the NumPy reference (generated
alongside it, line for line), an input builder and a few size assignments for the symbolic dims
(edge sizes 0 and 1, primes, non-multiples of 4/8, literal fixed dims).

What a case can hold: pointwise chains over bool/int32/int64/float32/float64 (and complex64/
complex128, float16 inputs), broadcasting between ranks 1-3 (literal-1 dims, ``[:, None]``
views), comparisons and ``kp.where``, casts, math functions, integer bitwise ops, shifts,
floor division and modulo with negative operands, reductions (sum prod max min mean) over any
axes with and without keepdims and their pointwise consumers (softmax/layernorm-like rows over
any axis), full reductions, several outputs of different shapes, scalar parameters, dims used
as values, ``kp.arange``/``kp.iota``.

How the comparison stays meaningful. Every value carries an interval (so ``log``/``sqrt`` get
positive arguments, divisors stay away from 0, ``exp`` cannot overflow, integer divisions never
see ``INT_MIN // -1``) and a flag ``r32``: whether float32 rounding went into it. Discontinuous
operations (comparisons, floor/ceil, ``//``, ``%``, float → int casts) only take values without
float32 rounding, because the reference computes in float64 and a rounded float32 value may sit
on the other side of a step. Outputs with float32 rounding in them are compared at 1e-5
(normwise), the others at 1e-12; integers and bools exactly. The reference follows the DSL's
typing rules (int32 arithmetic wraps at 32 bits, as in NumPy; ``sum`` of int32 is int64 ...),
with floats in float64 and complex in complex128.

Empty ``max``/``min`` reductions (an axis of size 0) give the reduction's identity (-inf, the
smallest integer, ...): NumPy raises there, the DSL defines a value; the reference follows the
DSL.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import kernelpack as kp

__all__ = ["Case", "generate", "compare", "model_inputs", "INF"]


INF = math.inf
B, I32, I64 = kp.bool_, kp.int32, kp.int64
F16, F32, F64, C64, C128 = kp.float16, kp.float32, kp.float64, kp.complex64, kp.complex128
_RANK = {"b": 0, "i": 1, "f": 2, "c": 3}
_NP_MODEL = {"bool": np.bool_, "int32": np.int32, "int64": np.int64, "float16": np.float64,
             "float32": np.float64, "float64": np.float64, "complex64": np.complex128,
             "complex128": np.complex128}
_NP_STORAGE = {"bool": np.bool_, "int32": np.int32, "int64": np.int64, "float16": np.float16,
               "float32": np.float32, "float64": np.float64, "complex64": np.complex64,
               "complex128": np.complex128}
_IMAX = {"int32": (1 << 31) - 1, "int64": (1 << 63) - 1}
# integer magnitudes that arithmetic may produce without giving up on the interval
_ISAFE = {"int32": 1 << 30, "int64": 1 << 62}
# dyadic constants: exact in float32, so a float32 step (//, %, comparison) sees the value the
# float64 reference sees
_DYADIC = (0.5, 0.75, 1.5, 2.0, 0.25, 3.0, 1.25, 4.0)
_DECIMAL = (0.1, 0.3, 0.7, 1.1, 2.5, 0.2)
_FLOAT_SCALARS = (0.5, -1.25, 2.0, 0.75, 3.0, -0.5)


# ---- the reference's helpers (exec'd into the reference namespace) ----------------------------
# The reference runs in three precisions: "64" is the reference (floats in float64); "32" keeps
# float32/complex64 values in their own precision (sums accumulate in float64, as the lowering
# does) and "ld" computes floats in long double. How far "32" (for outputs with float32 rounding
# in them) or "ld" (for the others) is from "64" says how well-conditioned an output is: where
# even a correct evaluation in the kernel's precision could not meet the tolerance (a mean of
# values centred on their mean is 0 plus rounding noise), the comparison means nothing and the
# output is skipped (and counted).
_MODES = {
    "64": _NP_MODEL,
    "32": dict(_NP_MODEL, float16=np.float32, float32=np.float32, complex64=np.complex64),
    "ld": dict(_NP_MODEL, float16=np.longdouble, float32=np.longdouble, float64=np.longdouble,
               complex64=np.clongdouble, complex128=np.clongdouble),
}


def _ref_namespace(mode: str) -> dict:
    types = _MODES[mode]

    def _model(v: Any, name: str) -> np.ndarray:
        """``v`` as the reference's array of the DSL dtype ``name``."""
        v = np.asarray(v)
        target = types[name]
        if v.dtype == target:
            return v
        if v.dtype.kind == "c" and np.dtype(target).kind != "c":
            v = v.real
        return v.astype(target)

    def _red(kind: str, v: np.ndarray, axis: Any, keepdims: bool, name: str) -> np.ndarray:
        v = np.asarray(v)
        if kind in ("max", "min"):
            if v.dtype.kind == "f":
                ident = -np.inf if kind == "max" else np.inf
            elif v.dtype.kind == "b":
                ident = kind == "min"
            else:
                info = np.iinfo(v.dtype)
                ident = info.min if kind == "max" else info.max
            fn = np.max if kind == "max" else np.min
            r = fn(v, axis=axis, keepdims=keepdims, initial=ident)
        elif v.dtype.kind in "bi" and kind != "mean":
            fn = np.sum if kind == "sum" else np.prod
            r = fn(v, axis=axis, keepdims=keepdims, dtype=np.int64)
        else:
            # floats: the lowering accumulates float32 in float64 (complex64 in complex64)
            acc = {np.dtype(np.float32): np.float64, np.dtype(np.float16): np.float64}
            if v.dtype.kind in "bi":
                acc_t = types["float64"]
            else:
                acc_t = acc.get(v.dtype, v.dtype)
            w = v.astype(acc_t)
            fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean}[kind]
            r = fn(w, axis=axis, keepdims=keepdims)
        return _model(r, name)

    def _erf(x: Any) -> np.ndarray:
        x = np.asarray(x)
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype if x.dtype.kind == "f"
                                                                    else np.float64)

    def _sigmoid(x: Any) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    return {"np": np, "_model": _model, "_red": _red, "_erf": _erf, "_sigmoid": _sigmoid,
            "_types": types}


# ---- values of the generated program ------------------------------------------------------------
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
    name: str
    kind: str                     # "tensor" | "scalar"
    dt: kp.DType
    dims: tuple = ()              # annotation entries: a symbol name or a literal int
    dist: str = ""                # how its values are drawn
    value: Any = None             # scalars: the value passed


@dataclass
class Case:
    """One generated program: ``fusion``, ``reference(*model_inputs)`` and its inputs."""

    seed: int
    name: str
    source: str
    ref_source: str
    fusion: Any
    reference: dict[str, Callable[..., list]]  # by precision mode
    params: list[Param]
    sizes: list[dict[str, int]]
    out_dtypes: list[kp.DType]
    out_r32: list[bool]
    nan: bool = False

    def shapes(self, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        return {p.name: tuple(sizes[d] if isinstance(d, str) else d for d in p.dims)
                for p in self.params if p.kind == "tensor"}

    def inputs(self, sizes: dict[str, int], rng: np.random.Generator | None = None) -> list:
        """The inputs in parameter order: NumPy arrays in their storage dtype, Python scalars."""
        rng = rng if rng is not None else np.random.default_rng(self.seed + 12345)
        shapes = self.shapes(sizes)
        out = []
        for p in self.params:
            if p.kind == "scalar":
                out.append(p.value)
            else:
                out.append(np.array(_draw(rng, p, shapes[p.name], self.nan),
                                    dtype=_NP_STORAGE[p.dt.name]))
        return out

    def expected(self, inputs: list, mode: str = "64") -> list[np.ndarray]:
        """The reference outputs (``mode``: see :data:`_MODES`)."""
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = model_inputs(self.params, inputs, mode)
            return [np.asarray(r) for r in self.reference[mode](*args)]

    def tolerance(self, i: int) -> float:
        dt = self.out_dtypes[i]
        if dt.kind in "bi":
            return 0.0
        return 1e-5 if self.out_r32[i] or dt in (F32, C64) else 1e-12

    def check(self, inputs: list, got: list) -> tuple[list[str], list[int]]:
        """Compare the kernel's outputs ``got`` with the reference: (failures, indices of
        outputs skipped as ill-conditioned)."""
        refs = self.expected(inputs)
        if len(got) != len(refs):
            return [f"{len(got)} outputs, expected {len(refs)}"], []
        failures, skipped = [], []
        other: dict[str, list] = {}
        for i, (g, r) in enumerate(zip(got, refs)):
            tol = self.tolerance(i)
            if tol and r.size:
                mode = "32" if tol > 1e-9 else "ld"
                if mode not in other:
                    other[mode] = self.expected(inputs, mode)
                alt = other[mode][i].astype(np.complex128 if r.dtype.kind == "c" else np.float64)
                if compare(alt.astype(_NP_STORAGE[self.out_dtypes[i].name]), r,
                           self.out_dtypes[i], tol / 4) is not None:
                    skipped.append(i)
                    continue
            msg = compare(g, r, self.out_dtypes[i], tol)
            if msg:
                failures.append(f"output {i} ({self.out_dtypes[i]}): {msg}")
        return failures, skipped

    def describe(self, sizes: dict[str, int] | None = None) -> str:
        text = f"seed {self.seed}\n{self.source}"
        if sizes is not None:
            text += f"sizes {sizes} shapes {self.shapes(sizes)}\n"
        return text


def model_inputs(params: list[Param], inputs: list, mode: str = "64") -> list:
    """The inputs as the reference takes them: arrays (and scalars) in the reference's types."""
    types = _MODES[mode]
    out = []
    for p, v in zip(params, inputs):
        if p.kind == "scalar":
            out.append(np.asarray(v, types[p.dt.name])[()])
        else:
            out.append(np.asarray(v).astype(types[p.dt.name]))
    return out


def _draw(rng: np.random.Generator, p: Param, shape: tuple[int, ...], nan: bool) -> np.ndarray:
    dt, dist = p.dt, p.dist
    st = _NP_STORAGE[dt.name]
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "i":
        if dist == "nonzero":  # no -1: x // -1 of the smallest integer is undefined
            mag = rng.integers(1, 10, size=shape)
            mag = np.where((mag == 1) & (rng.random(shape) < 0.5), 2, mag)
            sign = np.where(rng.random(shape) < 0.5, -1, 1)
            v = np.where(mag == 1, 1, sign * mag)
        elif dist == "count":
            v = rng.integers(0, 40 if dt == I32 else 70, size=shape)
        elif dist == "wide":
            m = 1 << (30 if dt == I32 else 40)
            v = rng.integers(-m, m, size=shape)
        else:
            v = rng.integers(-20, 21, size=shape)
        return v.astype(st)
    if dt.kind == "c":
        re = rng.uniform(-1.5, 1.5, size=shape)
        im = rng.uniform(-1.5, 1.5, size=shape)
        return (re + 1j * im).astype(st)
    if dist == "pos":
        v = rng.uniform(0.5, 2.5, size=shape)
    elif dist == "grid":
        v = rng.integers(-16, 17, size=shape) / 4.0
    elif dist == "decimal":  # values like 0.3: steps of // and % that decimal constants hit
        v = rng.integers(-30, 31, size=shape) / 10.0
    else:
        v = rng.uniform(-2.0, 2.0, size=shape)
    v = np.array(v, dtype=st)  # an array even for rank 0
    if nan and dt in (F32, F64) and v.size:
        v[rng.random(shape) < 0.1] = np.nan
    return v


# ---- comparison ---------------------------------------------------------------------------------
def compare(got: Any, ref: np.ndarray, dt: kp.DType, tol: float) -> str | None:
    """None when ``got`` (the kernel's output) matches ``ref``; else what differs."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    want = _NP_STORAGE[dt.name]
    if got.dtype != want:
        return f"dtype {got.dtype}, expected {np.dtype(want)}"
    if got.shape != ref.shape:
        return f"shape {got.shape}, expected {ref.shape}"
    if ref.size == 0:
        return None
    if dt.kind in "bi":
        if not np.array_equal(got, ref.astype(got.dtype)):
            bad = np.argwhere(got != ref.astype(got.dtype))
            i = tuple(bad[0])
            return f"{len(bad)} elements differ, first at {i}: got {got[i]!r}, expected {ref[i]!r}"
        return None
    parts = [(got.real, ref.real), (got.imag, ref.imag)] if dt.kind == "c" else [(got, ref)]
    scale = 0.0
    errs = []
    for g, r in parts:
        g = g.astype(np.float64)
        nan_r, nan_g = np.isnan(r), np.isnan(g)
        if not np.array_equal(nan_r, nan_g):
            i = tuple(np.argwhere(nan_r != nan_g)[0])
            return f"NaN positions differ, first at {i}: got {g[i]!r}, expected {r[i]!r}"
        inf_r = np.isinf(r)
        if not np.array_equal(np.isinf(g), inf_r) or not np.array_equal(g[inf_r], r[inf_r]):
            i = tuple(np.argwhere((np.isinf(g) != inf_r) | (inf_r & (g != r)))[0])
            return f"infinities differ, first at {i}: got {g[i]!r}, expected {r[i]!r}"
        fin = np.isfinite(r)
        if fin.any():
            scale = max(scale, float(np.max(np.abs(r[fin]))))
            errs.append((np.abs(g - r), fin))
    scale = max(scale, 1e-300)
    worst = 0.0
    where = None
    for e, fin in errs:
        e = np.where(fin, e, 0.0)
        k = int(np.argmax(e))
        if e.flat[k] > worst:
            worst, where = float(e.flat[k]), np.unravel_index(k, e.shape)
    if worst / scale > tol:
        return (f"normwise relative error {worst / scale:.3e} > {tol:.0e} (worst at {where}: "
                f"got {got[where]!r}, expected {ref[where]!r})")
    return None


# ---- the generator ------------------------------------------------------------------------------
def _iv(a: float, b: float) -> tuple[float, float]:
    lo, hi = min(a, b), max(a, b)
    if math.isnan(lo) or math.isnan(hi):
        return -INF, INF
    return lo, hi


def _mul_iv(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ps = []
        for x in a:
            for y in b:
                p = x * y
                ps.append(0.0 if math.isnan(p) else p)  # inf * 0: the 0 end of a bound
    return _iv(min(ps), max(ps))


def _powb(m: float, n: float) -> float:
    """``m ** n`` for interval bounds, inf where it overflows."""
    try:
        return float(m) ** n
    except OverflowError:
        return INF


def _kp(dt: kp.DType) -> str:
    """The attribute of ``kp`` that names ``dt``."""
    return "bool_" if dt == B else dt.name


class _Gen:
    def __init__(self, seed: int, scale: str) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.scale = scale
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

    # -- parameters
    def dim_src(self, p: int) -> str:
        """Source of the universe axis ``p``'s dim: ``x.shape[i]`` of an input spanning it."""
        a = self.axes[p]
        if isinstance(a, int):
            return str(a)
        for prm, v in self.inputs:
            if p in v.pos and not v.ones[v.pos.index(p)]:
                return f"{prm.name}.shape[{v.pos.index(p)}]"
        return ""

    def add_input(self, dt: kp.DType | None = None, aligned: bool | None = None) -> Val:
        r = self.rng
        if dt is None:
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
        if dt.kind == "f":
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
        v = Val(name, dt, pos, ones, lo, hi, False, amin, neg1, self.nan and dt in (F32, F64),
                leaf=True)
        self.inputs.append((prm, v))
        if dt == F16:  # float16 only as storage: widen first (exact), arithmetic in f32/f64
            return self.emit_cast(v, self.pick([F32, F64]))
        self.pool.append(v)
        return v

    def add_scalar(self) -> Val:
        dt = self.pick([F32, F64, F64, I32, I64, B])
        name = f"s{len(self.params)}"
        if dt.kind == "f":
            value = float(self.pick(_FLOAT_SCALARS))
        elif dt.kind == "i":
            value = int(self.pick([-7, -3, 2, 3, 5, 11]))
        else:
            value = bool(self.chance(0.5))
        prm = Param(name, "scalar", dt, (), "", value)
        self.params.append(prm)
        lo = hi = float(value)
        amin = abs(float(value))
        return Val(name, dt, (), (), lo, hi, False, amin, value != -1, False, leaf=True)

    # -- emitting
    def emit(self, kp_src: str, np_src: str, dt: kp.DType, pos, ones, **kw) -> Val:
        name = self.fresh()
        self.kp.append(f"{name} = {kp_src}")
        self.np.append(f"{name} = _model({np_src}, {dt.name!r})")
        v = Val(name, dt, tuple(pos), tuple(ones), **kw)
        self.pool.append(v)
        return v

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

    def same(self, v: Val, **over) -> dict:
        kw = dict(lo=v.lo, hi=v.hi, r32=v.r32, amin=v.amin, neg1=v.neg1, nan=v.nan)
        kw.update(over)
        return kw

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

    def emit_cast(self, v: Val, dt: kp.DType) -> Val:
        if v.dt == dt:
            return v
        lo, hi, r32, amin, neg1 = v.lo, v.hi, v.r32, v.amin, v.neg1
        if dt.kind in "iu":
            if v.dt.kind in "fc":
                lo, hi = _iv(math.trunc(lo) if math.isfinite(lo) else lo,
                             math.trunc(hi) if math.isfinite(hi) else hi)
                amin = math.floor(amin) if math.isfinite(amin) else 0
            if v.dt.kind == "i" and dt.itemsize < v.dt.itemsize and not v.bounded(_IMAX[dt.name]):
                lo, hi, amin = -_IMAX[dt.name] - 1, _IMAX[dt.name], 0  # wraps
            if v.dt.kind == "b":
                lo, hi, amin = 0, 1, 0
            neg1 = neg1 and v.dt.kind == "i"
        elif dt.kind == "b":
            lo, hi, amin = 0, 1, 0
        elif dt.kind == "f" and v.dt.kind == "c":
            pass
        if dt in (F32, C64) and not (v.dt.kind in "bi" and v.bounded(1 << 24)) \
                and v.dt not in (F32, F16, C64):
            r32 = True
        if v.dt.kind == "c" and dt.kind != "c":
            amin = 0.0
        return self.emit(f"{v.name}.astype(kp.{_kp(dt)})", f"{v.name}", dt, v.pos, v.ones,
                         lo=lo, hi=hi, r32=r32, amin=amin, neg1=neg1, nan=v.nan and dt.kind in "fc")

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

    # -- the ops
    def step(self) -> None:
        ops = [(self.op_arith, 6), (self.op_unary, 4), (self.op_compare_where, 3),
               (self.op_cast, 2), (self.op_reduce, 4), (self.op_int, 3), (self.op_div, 2),
               (self.op_pattern, 3), (self.op_complex, 1), (self.op_index, 1),
               (self.op_minmax, 1), (self.op_pow, 1), (self.op_view, 1)]
        fns = [f for f, _ in ops]
        w = np.array([float(x) for _, x in ops])
        for _ in range(20):
            fn = fns[int(self.rng.choice(len(fns), p=w / w.sum()))]
            if fn() is not None:
                return

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
            return self.emit_cast(a, wide), self.emit_cast(b, wide)
        if a.dt.kind == "c" and b.dt.kind == "f" and b.dt != a.dt.real:
            return a, self.emit_cast(b, a.dt.real)
        if b.dt.kind == "c" and a.dt.kind == "f" and a.dt != b.dt.real:
            return self.emit_cast(a, b.dt.real), b
        return a, b

    def result_dt(self, a: kp.DType, b: kp.DType) -> kp.DType:
        if a == b:
            return a
        return a if _RANK[a.kind] > _RANK[b.kind] else b

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
            lo, hi = _iv(a.lo + b.lo, a.hi + b.hi)
        elif op == "-":
            lo, hi = _iv(a.lo - b.hi, a.hi - b.lo)
        else:
            lo, hi = _mul_iv((a.lo, a.hi), (b.lo, b.hi))
        if dt.kind == "i" and not (-_ISAFE[dt.name] <= lo and hi <= _ISAFE[dt.name]):
            lo, hi = -_IMAX[dt.name] - 1, _IMAX[dt.name]  # wraps: identical in NumPy
        if dt.kind == "f" and not (abs(lo) < 1e6 and abs(hi) < 1e6):
            return None
        amin = a.amin * b.amin if op == "*" else 0.0
        pos, ones = self.bshape(a, b)
        r32 = a.r32 or b.r32 or dt in (F32, C64)
        return self.emit(f"{a.name} {op} {b.name}", f"{a.name} {op} {b.name}", dt, pos, ones,
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
        elif a.dt.kind == "f" and self.chance(0.2) and a.rank:
            p = a.pos[int(self.rng.integers(a.rank))]
            src = self.dim_src(p)
            if not src:
                return None
            c_src, c_lo, c_hi = src, 0, self.extent[p]
        elif a.dt.kind == "i":
            c = int(self.pick([1, 2, 3, 5, -4, 7, 100]))
            c_src, c_lo, c_hi = repr(c), c, c
        else:
            c = float(self.pick(_DYADIC + (_DECIMAL if a.dt not in (F32, C64) else ())))
            if self.chance(0.3):
                c = -c
            c_src, c_lo, c_hi = repr(c), c, c
        left = self.chance(0.4)  # a dim on the left: ``x.shape[0] * x`` (Expr declines)
        x, y = (c_src, a.name) if left else (a.name, c_src)
        iva, ivc = (a.lo, a.hi), (c_lo, c_hi)
        if op == "+":
            lo, hi = _iv(a.lo + c_lo, a.hi + c_hi)
        elif op == "-":
            lo, hi = _iv(c_lo - a.hi, c_hi - a.lo) if left else _iv(a.lo - c_hi, a.hi - c_lo)
        else:
            lo, hi = _mul_iv(iva, ivc)
        if a.dt.kind == "c":
            m = max(abs(lo), abs(hi), abs(a.lo), abs(a.hi)) * 2
            lo, hi = -m, m
        dt = a.dt
        if dt.kind == "i" and not (-_ISAFE[dt.name] <= lo and hi <= _ISAFE[dt.name]):
            lo, hi = -_IMAX[dt.name] - 1, _IMAX[dt.name]
        if dt.kind == "f" and not (abs(lo) < 1e6 and abs(hi) < 1e6):
            return None
        amin = a.amin * min(abs(c_lo), abs(c_hi)) if op == "*" else 0.0
        r32 = a.r32 or dt in (F32, C64) and not (op == "*" and c_src in ("1.0", "-1.0"))
        return self.emit(f"{x} {op} {y}", f"{x} {op} {y}", dt, a.pos, a.ones, lo=lo, hi=hi,
                         r32=r32, amin=amin, nan=a.nan)

    def op_unary(self) -> Val | None:
        a = self.choose(lambda v: v.dt.kind in "if")
        if a is None:
            return None
        fdt = a.dt if a.dt.kind == "f" else F64  # math on integers is float64
        r32 = a.r32 or fdt == F32
        lo, hi = a.lo, a.hi
        cands = ["neg", "abs", "sin", "cos", "tanh", "erf", "sigmoid"]
        if hi <= (15 if fdt == F32 else 30) and lo > -60:
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
            if op == "invert":
                return self.emit(f"~{name}", f"~{name}", a.dt, a.pos, a.ones,
                                 **self.same(a, lo=-hi - 1, hi=-lo - 1, amin=0, neg1=True))
            if op == "sq":
                if not a.bounded(1e3):
                    return None
                m = max(abs(lo), abs(hi)) ** 2 + 0.5
                return self.emit(f"{name} * {name} + 0.5", f"{name} * {name} + 0.5", fdt
                                 if a.dt.kind == "f" else a.dt, a.pos, a.ones,
                                 **self.same(a, lo=0.5, hi=m, r32=r32 if a.dt.kind == "f" else False,
                                             amin=0.5)) if a.dt.kind == "f" else None
            fn = {"exp": (np.exp, "np.exp"), "exp2": (np.exp2, "np.exp2"),
                  "log": (np.log, "np.log"), "log2": (np.log2, "np.log2"),
                  "sqrt": (np.sqrt, "np.sqrt"), "rsqrt": (lambda x: 1 / np.sqrt(x), "1 / np.sqrt"),
                  "sin": (None, "np.sin"), "cos": (None, "np.cos"), "tanh": (None, "np.tanh"),
                  "erf": (None, "_erf"), "sigmoid": (None, "_sigmoid"), "tan": (np.tan, "np.tan"),
                  "floor": (np.floor, "np.floor"), "ceil": (np.ceil, "np.ceil")}[op]
            mono, np_fn = fn
            if mono is not None:
                lo2, hi2 = _iv(float(mono(lo)), float(mono(hi)))
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
            arg = name if a.dt.kind == "f" else f"{name}.astype(np.float64)"
            return self.emit(src, f"{np_fn}({arg})", fdt, a.pos, a.ones, lo=lo2, hi=hi2, r32=r,
                             amin=amin, nan=a.nan)

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
                cond = self.emit(f"{a2.name} {op} {b2.name}", f"{a2.name} {op} {b2.name}", B,
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
        pos, ones = self.bshape(cond, x, y)
        return self.emit(f"kp.where({cond.name}, {x.name}, {y.name})",
                         f"np.where({cond.name}, {x.name}, {y.name})", dt, pos, ones,
                         lo=min(x.lo, y.lo), hi=max(x.hi, y.hi), r32=x.r32 or y.r32,
                         amin=min(x.amin, y.amin), nan=x.nan or y.nan, neg1=x.neg1 or y.neg1)

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
        targets = [t for t in targets if t != a.dt]
        if a.dt.kind == "c":  # complex -> float: the part's width must match ours
            targets = [t for t in targets if t.kind == "c" or t == a.dt.real or not a.r32]
        dt = self.pick(targets)
        if dt.kind == "i" and a.dt.kind == "f" and not a.bounded(2 ** 30 if dt == I32 else 2 ** 52):
            return None
        return self.emit_cast(a, dt)

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
        n = 1
        empty = False
        for i in (axes if axes is not None else range(r)):
            p = a.pos[i]
            n *= 1 if a.ones[i] else self.extent[p]
            empty = empty or (not a.ones[i] and self.empty[p])
        # value intervals
        lo, hi, r32, amin = a.lo, a.hi, a.r32, 0.0
        dt = a.dt
        if kind in ("sum", "prod") and dt.kind == "b" or kind in ("sum", "prod") and dt == I32:
            dt = I64
        if kind == "mean" and dt.kind in "bi":
            dt = F64
        m = max(abs(lo), abs(hi))
        if kind == "sum":
            lo, hi = (min(0.0, lo * n), max(0.0, hi * n)) if dt.kind != "c" else (-m * n, m * n)
            r32 = r32 or dt in (F32, C64)
        elif kind == "mean":
            r32 = r32 or dt in (F32, C64)
            if dt.kind == "c":
                lo, hi = -m, m
        elif kind == "prod":
            if dt.kind == "c":
                if m * math.sqrt(2) > 1.25 or n > 64:
                    return None
                lo, hi = -2.0, 2.0
            elif dt.kind == "f":
                if m > 1.6 or _powb(m, n) > 1e12 and m > 1:
                    return None
                big = _powb(max(m, 1.0), n)
                lo, hi = (-big if lo < 0 else 0.0), big
                if a.amin > 0:
                    amin = _powb(a.amin, n)
            else:
                big = _powb(m, n) if m else 0.0
                lo, hi = (-big if lo < 0 else 0.0, big)
            r32 = r32 or dt in (F32, C64)
        elif empty:  # max/min over an axis that may be empty: the identity
            lo, hi = (-INF, INF)
            if dt.kind == "i":
                lo, hi = -_IMAX[dt.name] - 1, _IMAX[dt.name]
        if dt.kind == "i" and not (-_ISAFE[dt.name] <= lo and hi <= _ISAFE[dt.name]):
            lo, hi = -_IMAX[dt.name] - 1, _IMAX[dt.name]
        if dt.kind == "f" and n and not (abs(lo) < 1e8 and abs(hi) < 1e8):
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
        call_np = f"_red({kind!r}, {a.name}, {ref_axis}, {keep}, {dt.name!r})"
        red = set(axes if axes is not None else range(r))
        if keep:
            pos, ones = a.pos, tuple(True if i in red else o for i, o in enumerate(a.ones))
        else:
            pos = tuple(p for i, p in enumerate(a.pos) if i not in red)
            ones = tuple(o for i, o in enumerate(a.ones) if i not in red)
        return self.emit(call_kp, call_np, dt, pos, ones, lo=lo, hi=hi, r32=r32, amin=amin,
                         nan=a.nan or (kind == "mean" and empty) and dt.kind in "fc")

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
                if c == -1 and not (a.lo > -_IMAX[a.dt.name]) and not any_div:
                    c = -3
                lo, hi = self.divmod_iv(op, (a.lo, a.hi), (c, c))
                left = self.chance(0.2) and a.amin >= 1 and (a.lo > -_IMAX[a.dt.name] or not a.neg1)
                if left:
                    src = f"{c} {op} {a.name}"
                    lo, hi = self.divmod_iv(op, (c, c), (a.lo, a.hi))
                else:
                    src = f"{a.name} {op} {c}"
                return self.emit(src, src, a.dt, a.pos, a.ones, lo=lo, hi=hi, neg1=True)
            a2, b2 = self.harmonize(self.realign(a), self.realign(b))
            if not any_div and (b2.amin < 1 or b2.neg1 and not a2.lo > -_IMAX[a2.dt.name]):
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
                lo, hi = (a.lo, a.hi) if op == ">>" else (-_IMAX[a.dt.name] - 1, _IMAX[a.dt.name])
                if op == "<<" and a.bounded(1 << 10) and c <= 5:
                    lo, hi = a.lo * (1 << c), a.hi * (1 << c)
                return self.emit(src, src, a.dt, a.pos, a.ones, lo=min(lo, 0), hi=max(hi, 0))
            a2, k2 = self.harmonize(self.realign(a), self.realign(k))
            pos, ones = self.bshape(a2, k2)
            src = f"{a2.name} {op} {k2.name}"
            if op == ">>":
                lo, hi = min(a2.lo, 0, -1 if a2.lo < 0 else 0), max(a2.hi, 0)
            else:
                lo, hi = -_IMAX[a2.dt.name] - 1, _IMAX[a2.dt.name]
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
            lo, hi = -_IMAX[a2.dt.name] - 1, _IMAX[a2.dt.name]
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
                c = float(self.pick(_DYADIC + _DECIMAL + (-0.7,)))
            left = self.chance(0.3) and a.amin >= 0.25 and (a.dt.kind == "f" or op == "/")
            if left:
                x_src, y_src = repr(c), a.name
                mag = abs(c) / a.amin
            else:
                x_src, y_src = a.name, repr(c)
                mag = max(abs(a.lo), abs(a.hi)) / abs(c)
            dt = a.dt if a.dt.kind == "f" else F64
            if op == "%":
                mag = abs(c) if not left else max(abs(a.lo), abs(a.hi))
            npop = {"/": "/", "//": "//", "%": "%"}[op]
            r32 = a.r32 or (dt == F32 and op in ("/", "%"))  # x % y + y rounds
            if not math.isfinite(mag) or mag > 1e7:
                return None
            return self.emit(f"{x_src} {op} {y_src}", f"{x_src} {npop} {y_src}", dt, a.pos,
                             a.ones, lo=-mag - 1, hi=mag + 1, r32=r32, nan=a.nan)
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
        if not math.isfinite(mag) or mag > 1e7:
            return None
        r32 = a2.r32 or b2.r32 or (dt in (F32, C64) and op in ("/", "%"))
        return self.emit(f"{a2.name} {op} {b2.name}", f"{a2.name} {op} {b2.name}", dt, pos, ones,
                         lo=-mag - 1, hi=mag + 1, r32=r32, nan=a2.nan or b2.nan)

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
        return self.emit(f"kp.{fn}({a.name}, {b.name})", f"{np_fn}({a.name}, {b.name})", dt, pos,
                         ones, lo=lo, hi=hi, r32=a.r32 or b.r32, nan=a.nan or b.nan,
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
            if a.dt.kind == "i" and m > _ISAFE[a.dt.name]:
                lo, m = -_IMAX[a.dt.name] - 1, _IMAX[a.dt.name]
            src = f"{a.name} ** {k}"
            np_src = f"np.power({a.name}, {k})" if a.dt.kind == "f" else f"{a.name} ** {k}"
            r32 = a.r32 or (a.dt == F32 and k >= 2)
            return self.emit(src, np_src, a.dt, a.pos, a.ones, lo=lo, hi=m, r32=r32,
                             nan=a.nan and k != 0, amin=1.0 if k == 0 else a.amin ** k)
        if a.dt.kind == "f" and a.lo >= 0.25 and a.hi <= 10:
            e = self.choose(lambda v: v.dt.kind == "f" and v.bounded(3) and v is not a)
            if e is not None:
                a2, e2 = self.harmonize(self.realign(a), self.realign(e))
                pos, ones = self.bshape(a2, e2)
                lo, hi = _iv(a2.lo ** -3, a2.hi ** 3)
                lo = min(a2.lo ** 3, a2.lo ** -3, a2.hi ** 3, a2.hi ** -3)
                hi = max(a2.lo ** 3, a2.lo ** -3, a2.hi ** 3, a2.hi ** -3)
                src = self.pick([f"{a2.name} ** {e2.name}", f"kp.pow({a2.name}, {e2.name})"])
                return self.emit(src, f"np.power({a2.name}, {e2.name})", a2.dt, pos, ones,
                                 lo=lo, hi=hi, r32=a2.r32 or e2.r32 or a2.dt == F32,
                                 nan=a2.nan or e2.nan, amin=lo)
            c = float(self.pick([0.5, 1.5, -0.5, 2.5]))
            lo, hi = _iv(a.lo ** c, a.hi ** c)
            return self.emit(f"{a.name} ** {c!r}", f"np.power({a.name}, {c!r})", a.dt, a.pos,
                             a.ones, lo=lo, hi=hi, r32=a.r32 or a.dt == F32, nan=a.nan, amin=lo)
        if a.dt.kind == "f" and a.bounded(3):
            c = float(self.pick([2.0, 0.5, 1.5]))
            lo, hi = _iv(c ** a.lo, c ** a.hi)
            return self.emit(f"{c!r} ** {a.name}", f"np.power({c!r}, {a.name})", a.dt, a.pos,
                             a.ones, lo=lo, hi=hi, r32=a.r32 or a.dt == F32, nan=a.nan, amin=lo)
        return None

    def op_pattern(self) -> Val | None:
        """Row patterns over any axis: softmax, log-sum-exp, layernorm, share of a sum."""
        a = self.choose(lambda v: v.dt in (F32, F64) and v.rank >= 1 and v.bounded(50))
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
        if kind == "softmax":
            m, e, s = nm(), nm(), nm()
            lines = [f"{m} = {x}.max(axis={ax_src}, keepdims=True)",
                     f"{e} = kp.exp({x} - {m})",
                     f"{s} = {e}.sum(axis={ax_src}, keepdims=True)"]
            out, lo, hi = f"{e} / {s}", 0.0, 1.0
            np_lines = [f"{m} = _red('max', {x}, {ax}, True, {a.dt.name!r})",
                        f"{e} = np.exp({x} - {m})",
                        f"{s} = _red('sum', {e}, {ax}, True, {a.dt.name!r})"]
            np_out = f"{e} / {s}"
        elif kind == "lse":
            m, s = nm(), nm()
            lines = [f"{m} = kp.max({x}, axis={ax_src}, keepdims=True)",
                     f"{s} = kp.exp({x} - {m}).sum(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{m} = _red('max', {x}, {ax}, True, {a.dt.name!r})",
                        f"{s} = _red('sum', np.exp({x} - {m}), {ax}, True, {a.dt.name!r})"]
            out, np_out = f"kp.log({s}) + {m}", f"np.log({s}) + {m}"
            lo, hi = a.lo, a.hi + math.log(max(self.extent[a.pos[ax]], 1))
        elif kind == "layernorm":
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
        elif kind == "share":
            s = nm()
            lines = [f"{s} = {x}.sum(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{s} = _red('sum', {x}, {ax}, True, {a.dt.name!r})"]
            out, np_out, lo, hi = f"{x} / {s}", f"{x} / {s}", 0.0, 1.0
        else:
            s = nm()
            lines = [f"{s} = {x}.mean(axis={ax_src}, keepdims=True)"]
            np_lines = [f"{s} = _red('mean', {x}, {ax}, True, {a.dt.name!r})"]
            out, np_out = f"{x} - {s}", f"{x} - {s}"
            lo, hi = a.lo - a.hi, a.hi - a.lo
        self.kp.extend(lines)
        self.np.extend(np_lines)
        return self.emit(out, np_out, a.dt, a.pos, a.ones, lo=lo, hi=hi, r32=r32, nan=a.nan)

    def op_complex(self) -> Val | None:
        z = self.choose(lambda v: v.dt.kind == "c")
        if z is None or self.chance(0.3):
            re = self.choose(lambda v: v.dt in (F32, F64) and v.bounded(100))
            if re is None:
                return None
            im = self.choose(lambda v: v.dt.kind in "f" and v.bounded(100) and v is not re) or re
            re, im = self.harmonize(self.realign(re), self.realign(im))
            pos, ones = self.bshape(re, im)
            m = max(abs(re.lo), abs(re.hi), abs(im.lo), abs(im.hi))
            dt = C64 if re.dt == F32 else C128
            return self.emit(f"kp.complex({re.name}, {im.name})",
                             f"{re.name} + 1j * {im.name}", dt, pos, ones, lo=-m, hi=m,
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
                dt = self.pick([F32, F64, I32])
                v = self.emit_cast(v, dt)
            return v
        dims = [self.dim_src(q) for q in range(self.R)]
        if not all(dims):
            return None
        dt = self.pick([I64, I32, F32, F64])
        npdt = {"int64": "np.int64", "int32": "np.int32", "float32": "np.float64",
                "float64": "np.float64"}[dt.name]
        shape_src = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        np_src = (f"np.broadcast_to(np.arange({dims[p]}, dtype={npdt}).reshape("
                  f"{tuple(-1 if q == p else 1 for q in range(self.R))}), {shape_src})")
        ones = tuple(isinstance(self.axes[q], int) and self.axes[q] == 1 for q in range(self.R))
        return self.emit(f"kp.iota({shape_src}, {p}, kp.{_kp(dt)})", np_src, dt,
                         tuple(range(self.R)), ones, lo=0, hi=max(n - 1, 0),
                         r32=dt == F32 and n > 1 << 24)

    def op_view(self) -> Val | None:
        a = self.choose(lambda v: self.aligned(v) and v.rank < self.R)
        if a is None:
            return None
        pos = (a.pos[0] - 1 if a.rank else self.R - 1,) + a.pos
        return self.emit(f"{a.name}[None]", f"{a.name}[None]", a.dt, pos, (True,) + a.ones,
                         **self.same(a))

    # -- a whole program
    def program(self) -> Case:
        self.make_universe()
        self.inputs: list[tuple[Param, Val]] = []
        self.nan = self.chance(0.12)
        n_in = int(self.rng.integers(1, 4))
        for _ in range(n_in):
            self.add_input()
        if self.chance(0.35):
            self.pool.append(self.add_scalar())
        for _ in range(int(self.rng.integers(3, 10))):
            self.step()
        outs = self.pick_outputs()
        return self.finish(outs)

    def pick_outputs(self) -> list[Val]:
        made = [v for v in self.pool if not v.leaf]
        if not made:
            made = [self.op_cast() or self.pool[0]]
            made = [v for v in self.pool if not v.leaf] or [self.pool[0]]
        outs = [made[-1]]
        extra = int(self.rng.choice([0, 1, 2], p=[0.45, 0.4, 0.15]))
        for _ in range(extra):
            v = self.pick(made)
            if v not in outs:
                outs.append(v)
        if self.chance(0.2):
            full = self.op_reduce(self.pick(made))
            if full is not None and full not in outs:
                outs.append(full)
        if self.chance(0.1):
            # an arange over a dim expression of its own (its own output shape)
            p = int(self.rng.integers(self.R))
            src = self.dim_src(p)
            if src:
                options = [f"{src} + 1", f"2 * {src}", f"{src} // 2"]
                for prm in self.params:  # an integer scalar in a size (bound: planned too)
                    if prm.kind == "scalar" and prm.dt.kind == "i" and prm.value > 0:
                        n = prm.name if prm.dt == I64 else f"{prm.name}.astype(kp.int64)"
                        options += [f"{n} + {src}", f"{n} * 2"]
                expr = self.pick(options)
                v = self.emit(f"kp.arange({expr}).astype(kp.float32) * 0.5",
                              f"np.arange({expr.replace('.astype(kp.int64)', '')}) * 0.5", F32, (-1,), (False,), lo=0, hi=1e6,
                              r32=False)
                outs.append(v)
        return outs

    def finish(self, outs: list[Val]) -> Case:
        name = f"rand{self.seed}"
        sig = []
        for p in self.params:
            if p.kind == "tensor":
                dims = ", ".join(repr(d) for d in p.dims)
                sig.append(f"{p.name}: T[kp.{_kp(p.dt)}{', ' if dims else ''}{dims}]")
            else:
                sig.append(f"{p.name}: kp.{_kp(p.dt)}")
        named = self.chance(0.3)
        if named:
            ret_kp = "{" + ", ".join(f"'o{i}': {v.name}" for i, v in enumerate(outs)) + "}"
        elif len(outs) == 1 and self.chance(0.7):
            ret_kp = outs[0].name
        else:
            ret_kp = ", ".join(v.name for v in outs) + ("," if len(outs) == 1 else "")
        body = "\n".join("    " + line for line in self.kp)
        source = (f"@kp.fusion(name={name!r})\ndef {name}({', '.join(sig)}):\n{body}\n"
                  f"    return {ret_kp}\n")
        np_body = "\n".join("    " + line for line in self.np)
        ref_source = (f"def reference({', '.join(p.name for p in self.params)}):\n{np_body}\n"
                      f"    return [{', '.join(v.name for v in outs)}]\n")
        ns: dict = {"kp": kp, "T": kp.Tensor}
        exec(compile(source, f"<fusion_gen seed {self.seed}>", "exec", dont_inherit=True), ns)
        refs = {}
        for mode in _MODES:
            rns = _ref_namespace(mode)
            exec(compile(ref_source, f"<fusion_gen reference {self.seed}>", "exec",
                         dont_inherit=True), rns)
            refs[mode] = rns["reference"]
        return Case(self.seed, name, source, ref_source, ns[name], refs,
                    list(self.params), self.sizes, [v.dt for v in outs],
                    [v.r32 for v in outs], self.nan)


def generate(seed: int, scale: str = "emulator") -> Case:
    """The random case of ``seed``. ``scale``: "emulator" (small sizes: every emulated GPU thread
    is an OS thread) or "gpu" (sizes up to a few million elements)."""
    return _Gen(seed, scale).program()


if __name__ == "__main__":  # pragma: no cover - a look at a few cases
    import sys

    for s in map(int, sys.argv[1:] or ["0", "1", "2"]):
        c = generate(s)
        print(textwrap.indent(c.describe(c.sizes[0]), "  "))
        print(textwrap.indent(c.ref_source, "  "))
