"""Reductions over chosen axes for the elsewhere mode (:mod:`.elsewhere`): a reduction's
value with :meth:`.rows.RowOps.op_reduce`'s rules, its shape, and where else it can be read.

``op_reduce`` draws its own axes and call style from the generator's random stream; these take
the axes as given, so the elsewhere mode can reduce exactly the axes a pattern needs. Both take
the result's dtype, interval and flags from :func:`reduction`, which draws nothing: op_reduce
keeps its own draws (axes, call style) in their order, and so every default-mode program.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelpack.dtypes import DType

from .dtypes import C64, F32, F64, I32, I64, IMAX, INF, ISAFE
from .values import Val, powb

__all__ = ["Reduced", "reduction", "reduce_val", "reduced_shape", "relocations"]


@dataclass(frozen=True)
class Reduced:
    """What a reduction's result is: dtype, value interval and the generator's flags."""

    dt: DType
    lo: float
    hi: float
    r32: bool
    amin: float
    fuzz: float
    nan: bool


def reduction(g: Any, a: Val, kind: str, axes: Sequence[int] | None) -> Reduced | None:
    """``a.kind`` over ``axes`` (indices into ``a``'s dims; None: all) in generator ``g``: its
    dtype, interval and flags; None where the mode declines it (a sum or product that may
    overflow, a float one past 1e8, a half value out of range). Draws nothing from ``g``'s
    random stream, so :meth:`.rows.RowOps.op_reduce` and :func:`reduce_val` share it without
    changing any program."""
    r = a.rank
    n, empty = 1, False
    for i in (axes if axes is not None else range(r)):
        n *= 1 if a.ones[i] else g.extent[a.pos[i]]
        empty = empty or (not a.ones[i] and g.empty[a.pos[i]])
    lo, hi, r32, amin, dt = a.lo, a.hi, a.r32, 0.0, a.dt
    if kind in ("sum", "prod") and (dt.kind == "b" or dt == I32):
        dt = I64
    if kind == "mean" and dt.kind in "bi":
        dt = F64
    m = max(abs(lo), abs(hi))
    if kind == "sum":
        lo, hi = (min(0.0, lo * n), max(0.0, hi * n)) if dt.kind != "c" else (-m * n, m * n)
    elif kind == "mean" and dt.kind == "c":
        lo, hi = -m, m
    elif kind == "prod":
        if dt.kind == "c":
            if m * 2 ** 0.5 > 1.25 or n > 64:
                return None
            lo, hi = -2.0, 2.0
        elif dt.kind == "f":
            if m > 1.6 or powb(m, n) > 1e12 and m > 1:
                return None
            big = powb(max(m, 1.0), n)
            lo, hi = (-big if lo < 0 else 0.0), big
            amin = powb(a.amin, n) if a.amin > 0 else 0.0
        else:
            big = powb(m, n) if m else 0.0
            lo, hi = (-big if lo < 0 else 0.0, big)
    elif kind in ("max", "min") and empty:  # the identity
        lo, hi = (-IMAX[dt.name] - 1, IMAX[dt.name]) if dt.kind == "i" else (-INF, INF)
    if kind in ("sum", "mean", "prod"):
        r32 = r32 or dt in (F32, C64)
    if dt.kind == "i" and not (-ISAFE[dt.name] <= lo and hi <= ISAFE[dt.name]):
        lo, hi = -IMAX[dt.name] - 1, IMAX[dt.name]
    if dt.kind == "f" and n and not (abs(lo) < 1e8 and abs(hi) < 1e8):
        return None
    if n and not g.half_ok(dt, lo, hi):
        return None
    # half sums, means and products: accumulated wider (float32 partials in some schedules,
    # float64 in others) and rounded once: the order is not modelled
    fuzz = g.fuzz_of(dt) if kind in ("sum", "mean", "prod") else 0.0
    nan = a.nan or (kind == "mean" and empty) and dt.kind in "fc"
    return Reduced(dt, lo, hi, r32, amin, fuzz, nan)


def reduce_val(g: Any, a: Val, kind: str, axes: tuple[int, ...] | None, keep: bool
               ) -> Val | None:
    """``a.kind(axis=axes, keepdims=keep)`` emitted into generator ``g`` (:func:`reduction`'s
    dtype, interval and flags, op_reduce's reference); None where :func:`reduction` declines.
    ``axes``: sorted indices into ``a``'s dims; None: all."""
    red = reduction(g, a, kind, axes)
    if red is None:
        return None
    r = a.rank
    ax_src = repr(axes[0] - (r if g.chance(0.3) else 0)) if axes is not None and len(
        axes) == 1 else repr(None if axes is None else tuple(axes))
    if (axes is None or len(axes) == r) and not keep and g.chance(0.4):
        call = f"{a.name}.{kind}()"
    elif kind in ("max", "min") and g.chance(0.5):
        call = f"kp.{kind}({a.name}, axis={ax_src}, keepdims={keep})"
    else:
        call = f"{a.name}.{kind}(axis={ax_src}, keepdims={keep})"
    ref_axis = "None" if axes is None else repr(tuple(axes))
    pos, ones = reduced_shape(a, axes, keep)
    return g.emit(call, f"_red({kind!r}, {a.name}, {ref_axis}, {keep}, {red.dt.name!r})",
                  red.dt, pos, ones, lo=red.lo, hi=red.hi, r32=red.r32, amin=red.amin,
                  fuzz=red.fuzz, nan=red.nan)


def reduced_shape(a: Val, axes: Sequence[int] | None, keep: bool
                  ) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """(pos, ones) of ``a`` reduced over ``axes`` (indices into its dims; None: all)."""
    red = set(axes if axes is not None else range(a.rank))
    if keep:
        return a.pos, tuple(True if i in red else o for i, o in enumerate(a.ones))
    return (tuple(p for i, p in enumerate(a.pos) if i not in red),
            tuple(o for i, o in enumerate(a.ones) if i not in red))


def relocations(axes: Sequence[str | int], pos: Sequence[int], ones: Sequence[bool]
                ) -> list[tuple[int, ...]]:
    """The other universe axes a value on ``pos`` can be read at: as many increasing
    positions, each of the dim it replaces (a literal-1 dim goes anywhere), at least one dim
    that is not 1 moved: each entry is then read at positions other than its own
    (``r[None, :]`` of row sums: row j's sum at row i)."""
    return [q for q in itertools.combinations(range(len(axes)), len(pos))
            if all(o or axes[a] == axes[b] for a, b, o in zip(q, pos, ones))
            and any(a != b and not o for a, b, o in zip(q, pos, ones))]
