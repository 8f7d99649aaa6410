"""The elsewhere mode (``generate(seed, elsewhere=True)``, a seed space of its own): reductions
read at positions other than their own, and row reductions beside general ones.

Two lowering paths the default mode (almost) never reaches: a row reduction read at another
row (``d = kp.rsqrt(a.sum(-1)); a * d[:, None] * d[None, :]``), computed into a workspace by
``pipeline._row_read_elsewhere``; and a row reduction in a stage on the general schedule
(``a.sum(-1)`` beside ``c.sum(axis=(0, 2))``), a workspace of its own
(``materialize.materialize_rows``) unless its rows are at most ``materialize.SHORT_ROW`` (32)
elements known at compile time.

Universes are *square*: two or three axes share the symbol ``a``; a third is ``b`` or a
literal, short (3, 7, 32) or long (33, 40). Size sets hold ``a`` = 1, and ``a`` = 0 half the
time (a float max over an axis that may be empty is declined, as in the default mode).

A program is the default mode's (ops, intervals, references, tolerances, outputs) with
patterns woven in (:meth:`ElsewhereGenerator.pattern`): *read* — a reduction (mostly of
trailing axes), sometimes through a pointwise op (``kp.rsqrt(r)``), moved to other axes of
its dims (``r[None, :]``, ``r[:, None, None]``, or implicitly: NumPy lines a rank-1 ``r`` up
with a matrix's last axis), sometimes through another op, combined with a value over the axes
it came from, sometimes read at its own position too; *normalize* — both reads with an op
between; *chain* — a read reduced and read elsewhere again; *several* — reads of one source
combined; *beside* — a row reduction and one of its shape over axes (0, 2), leading axes or
all. The reductions are often returned beside their readers. Other steps are mostly
pointwise: a general stage makes the lowering materialize every reduction below it up front,
before the code generator sees a read elsewhere. Reductions come from :func:`.reductions.reduce_val`
(op_reduce's rules for given axes); other ops are the default mode's, on a pool narrowed to a
pattern's operands, rolled back where the result does not read them.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Sequence

from .case import Case
from .dtypes import BF16, C64, C128, F16, F32, F64, I32, I64, B
from .generator import Generator
from .reductions import reduce_val, reduced_shape, relocations
from .values import Val

__all__ = ["LONG_DIMS", "SHORT_DIMS", "ElsewhereGenerator", "reduce_val", "reduced_shape",
           "relocations"]

#: literal third dims: rows of at most materialize.SHORT_ROW (32) constant elements stay
#: inline in a general stage, longer ones get a workspace
SHORT_DIMS = (3, 7, 32)
LONG_DIMS = (33, 40)
_LINE = re.compile(r"^(\w+) = (.*)$")
_NAMES = re.compile(r"\b[vxs]\d+\b")
_REDUCES = re.compile(r"axis=|\.(sum|mean|max|min|prod)\(\)")  # a reduction's line


class ElsewhereGenerator(Generator):
    """One seed's program of the elsewhere mode: ``ElsewhereGenerator(seed, scale,
    halves).program()`` (see the module docstring)."""

    def make_universe(self) -> None:
        self.R = int(self.rng.choice([2, 3], p=[0.55, 0.45]))
        self.axes: list[str | int] = ["a", "a"]
        if self.R == 3:
            third = self.pick(["a", "b", "b"] + [int(d) for d in SHORT_DIMS + LONG_DIMS])
            # a literal mostly last: rows over it are constant (beside: short or long)
            p = [0.6, 0.2, 0.2] if isinstance(third, int) else [0.3, 0.4, 0.3]
            pair = [(0, 1), (1, 2), (0, 2)][int(self.rng.choice(3, p=p))]
            self.axes = [third if i not in pair else "a" for i in range(3)]
        self.sizes = self.make_sizes()
        size = [[s[a] if isinstance(a, str) else a for s in self.sizes] for a in self.axes]
        self.extent = [max(s) for s in size]
        self.empty = [0 in s for s in size]

    def make_sizes(self) -> list[dict[str, int]]:
        sets = super().make_sizes()
        syms = sorted({a for a in self.axes if isinstance(a, str)})
        for n in (0, 1) if self.chance(0.5) else (1,):
            if not any(s["a"] == n for s in sets):
                sets.append({k: n if k == "a" else int(self.pick([1, 2, 3, 5])) for k in syms})
        return sets

    def program(self) -> Case:
        self.make_universe()
        self.inputs = []
        self.nan = self.chance(0.12)
        self.reds: list[Val] = []  # reductions read at another position
        self.must: list[Val] = []  # values a pattern wants returned
        self.results: list[Val] = []  # what the patterns made
        self.host_input()
        for _ in range(int(self.rng.integers(0, 3))):
            self.add_input()
        if self.chance(0.3):
            self.pool.append(self.add_scalar())
        for _ in range(int(self.rng.integers(0, 3))):
            self.step()
        wanted = int(self.rng.integers(1, 4))
        for tries in range(12):
            if self.pattern() is not None:
                wanted -= 1
                if self.chance(0.4):
                    self.step()
            if wanted <= 0 and (self.reds or tries >= 5):
                break
        return self.finish(self.pick_outputs())

    def host_input(self) -> Val:
        """A full-rank input over the whole square (floats mostly): what the first reductions
        reduce and their reads elsewhere broadcast against."""
        dt = self.pick([F32] * 4 + [F64] * 4 + [I32, I64, B, C64, C128]
                       + ([F16, BF16] * 4 if self.halves else []))
        for _ in range(40):
            v = self.attempt(lambda: self.add_input(dt, aligned=True),
                             lambda v: self.inputs[-1][1].rank == self.R
                             and not any(self.inputs[-1][1].ones))
            if v is not None:
                return v
        return self.add_input(dt, aligned=True)

    def step(self) -> None:
        """Mostly a pointwise step (the default mode's ops less reductions): see the module
        docstring."""
        if self.chance(0.3):
            return super().step()
        ops = [self.op_arith] * 6 + [self.op_unary] * 4 + [self.op_compare_where] * 3 + [
            self.op_cast, self.op_cast, self.op_int, self.op_div, self.op_minmax, self.op_pow,
            self.op_complex, self.op_index, self.op_view]
        for _ in range(20):
            if self.pick(ops)() is not None:
                break
        return None

    def pick_outputs(self) -> list[Val]:
        """The default mode's outputs, then what the patterns want returned (a reduction
        beside its readers), then every pattern result no output reads (8 outputs at most)."""
        outs = super().pick_outputs()
        live = {n for o in outs for n in self.reads(o) | {o.name}}
        extra = list(self.must) + ([self.pick(self.reds)] if self.reds and self.chance(0.6)
                                   else [])
        extra += [v for v in self.results[::-1] if v.name not in live]
        for v in extra:
            if len(outs) < 8 and v.name not in live | {o.name for o in outs}:
                outs.append(v)
                live |= self.reads(v) | {v.name}
        return outs

    def pattern(self) -> Val | None:
        # beside: the rows path needs a third axis (a general stage over axes (0, 2))
        kind = self.pick(["read"] * 5 + ["normalize", "chain", "several"] * 2
                         + ["beside"] * (5 if self.R == 3 else 2))
        if kind == "normalize":
            out = self.read_elsewhere(kinds=("sum", "mean", "max"), pre=1.0, mixed=1.0)
        elif kind == "chain":
            out = self.read_elsewhere()
            if out is not None and out.rank >= 2:
                out = self.read_elsewhere(src=out) or out
        elif kind == "several":
            src = self.source()
            got = [self.read_elsewhere(src=src) for _ in range(int(self.rng.integers(2, 4)))]
            got = [v for v in got if v is not None]
            out = got[0] if got else None
            for v in got[1:]:
                out = self.combine(out, v) or out
        elif kind == "beside":
            mark = len(self.pool)
            out = self.beside()
            del self.pool[mark:]  # reduced again, they would be materialized up front
        else:
            out = self.read_elsewhere()
        if out is not None:
            self.results.append(out)
        return out

    # -- the default mode's ops on chosen operands
    def attempt(self, fn: Callable[[], Val | None], accept: Callable[[Val], bool]
                ) -> Val | None:
        """``fn()`` when ``accept`` takes its value; else None, whatever it emitted, added or
        declared rolled back (the random draws stay drawn)."""
        mark = (len(self.kp), len(self.np), len(self.pool), len(self.params),
                len(self.inputs), self.counter, dict(self.vals))
        v = fn()
        if v is not None and accept(v):
            return v
        del self.kp[mark[0]:], self.np[mark[1]:], self.pool[mark[2]:]
        del self.params[mark[3]:], self.inputs[mark[4]:]
        self.counter, self.vals = mark[5], mark[6]
        return None

    def narrowed(self, vals: Sequence[Val], fn: Callable[[], Val | None]) -> Val | None:
        """``fn()`` (an op picking its operands from the pool) on a pool of ``vals`` alone;
        what it emits joins the whole pool."""
        saved, self.pool = self.pool, list(vals)
        try:
            return fn()
        finally:
            self.pool = saved + self.pool[len(vals):]

    def reads(self, v: Val, since: int = 0) -> set[str]:
        """The names ``v`` reads, through the lines emitted from line ``since`` on."""
        lines = {}
        for line in self.kp[since:]:
            m = _LINE.match(line)
            if m:
                lines[m.group(1)] = set(_NAMES.findall(m.group(2)))
        seen, stack = set(), [v.name]
        while stack:
            new = lines.get(stack.pop(), set()) - seen
            seen |= new
            stack += new
        return seen

    def pure(self, v: Val) -> bool:
        """Whether no reduction went into ``v`` (a pointwise function of the inputs)."""
        names = self.reads(v) | {v.name}
        return not any(_REDUCES.search(line) for line in self.kp
                       if (m := _LINE.match(line)) and m.group(1) in names)

    def combine(self, x: Val, y: Val) -> Val | None:
        """A default-mode binary op (arithmetic, division, min/max, where, power) reading
        ``x`` and ``y``; None when a few tries gave none."""
        return self.op_on([x, y], [self.op_arith] * 5 + [self.op_div] * 2 + [
            self.op_minmax, self.op_compare_where, self.op_pow], 12)

    def through(self, x: Val) -> Val | None:
        """A default-mode op of ``x`` alone that keeps its shape (a function, a constant, a
        cast, a power): the pointwise step between a reduction and its read."""
        return self.op_on([x], [self.op_unary] * 3 + [self.op_arith, self.op_cast,
                                                      self.op_pow], 8)

    def op_on(self, vals: list[Val], ops: list[Callable[[], Val | None]], tries: int
              ) -> Val | None:
        """One of ``ops`` on a pool of ``vals`` alone, reading every one of them (and of
        their shape, for one)."""
        for _ in range(tries):
            op, since = self.pick(ops), len(self.kp)
            v = self.attempt(lambda op=op: self.narrowed(vals, op), lambda v, since=since: (
                len(vals) > 1 or v.pos == vals[0].pos) and {x.name for x in vals} <= self.reads(
                    v, since))
            if v is not None:
                return v
        return None

    def reduce_some(self, v: Val, axes: tuple[int, ...] | None, keep: bool = False,
                    kinds: Sequence[str] | None = None) -> Val | None:
        """A reduction of ``v`` over ``axes``, of one of ``kinds`` (of those op_reduce draws
        for its dtype), another where one declines."""
        allowed = ["sum", "mean", "prod"] + (["max", "min"] if v.dt.kind != "c" else [])
        names = [k for k in kinds or allowed if k in allowed] or ["sum"]
        for _ in range(4):
            r = reduce_val(self, v, self.pick(names), axes, keep)
            if r is not None:
                return r
        return None

    # -- the patterns
    def source(self) -> Val | None:
        """A value to reduce, of the universe's rank mostly: its rows are then the leading
        axes of what reads the reduction elsewhere, the rows of the kernel computing both."""
        full = self.choose(lambda v: v.rank == self.R and not any(v.ones))
        if full is not None and self.chance(0.8):
            return full
        return self.choose(lambda v: v.rank >= 2 and not all(v.ones))

    def relocate(self, v: Val, lowest: int = 0) -> Val | None:
        """``v`` read at other axes of its dims (:func:`relocations`): a view with ``None``
        for the universe's axes it is not on (from ``q[0]``, or some axis from ``lowest``
        on), or ``v`` itself relabelled where the new axes are the trailing ones."""
        cands = relocations(self.axes, v.pos, v.ones)
        if not cands:
            return None
        q = self.pick(cands)
        start = q[0]
        if self.chance(0.3) and lowest < q[0]:
            start = int(self.rng.integers(lowest, q[0] + 1))
        if start == q[0] and q == tuple(range(self.R - v.rank, self.R)):
            moved = dataclasses.replace(v, pos=q)  # NumPy lines it up with the last axes
            self.pool.append(moved)
            return moved
        key = ", ".join(":" if p in q else "None" for p in range(start, self.R))
        ones = tuple(v.ones[q.index(p)] if p in q else True for p in range(start, self.R))
        return self.emit(f"{v.name}[{key}]", f"{v.name}[{key}]", v.dt,
                         tuple(range(start, self.R)), ones, **self.same(v))

    def read_elsewhere(self, src: Val | None = None, kinds: Sequence[str] | None = None,
                       pre: float = 0.4, mixed: float = 0.35) -> Val | None:
        """The *read* pattern: a reduction of ``src`` (a pool value by default) read at
        other positions, combined with a value over the positions it came from."""
        src = src or self.source()
        if src is None:
            return None
        options, weights = [], []  # rows (trailing axes) mostly
        for k in range(1, src.rank):
            for axes in itertools.combinations(range(src.rank), k):
                for keep in (False, True):
                    if relocations(self.axes, *reduced_shape(src, axes, keep)):
                        options.append((axes, keep))
                        row = axes == tuple(range(src.rank - k, src.rank))
                        weights.append((8.0 if row else 0.5) * (0.5 if keep else 1.0))
        if not options:
            return None
        axes, keep = options[int(self.rng.choice(len(options),
                                                 p=[w / sum(weights) for w in weights]))]
        r = self.reduce_some(src, axes, keep, kinds)
        if r is None:
            return None
        self.reds.append(r)
        x = (self.through(r) or r) if self.chance(pre) else r
        moved = first = self.relocate(x, lowest=min(src.pos))
        if moved is None:
            return None
        if self.chance(0.25):  # read through another op after the move
            moved = self.through(moved) or moved
        host = src if self.chance(0.7) else self.host_for(src, r, moved) or src
        out = self.combine(host, moved)
        if out is not None and self.chance(mixed):
            out = self.combine(out, x) or out  # at its own position too
        # read by other steps at other shapes, the moved read would put their stages on the
        # general schedule (and r into a workspace up front)
        self.pool = [v for v in self.pool if v is not first and v is not moved]
        return out

    def host_for(self, src: Val, r: Val, moved: Val) -> Val | None:
        """A pool value within ``src``'s axes over an axis ``r``'s entries were moved from:
        combined with the moved read, it reads ``r`` at other rows of the kernel computing
        ``r`` (a host of more axes would make the moved axes that kernel's rows)."""
        left = {p for p, o in zip(r.pos, r.ones) if not o} - {
            p for p, o in zip(moved.pos, moved.ones) if not o}
        return self.choose(lambda v: v.name not in (r.name, moved.name) and set(v.pos) <= set(
            src.pos) and any(p in left and not o for p, o in zip(v.pos, v.ones)))

    def beside(self) -> Val | None:
        """The *beside* pattern: a row reduction and a reduction of the same shape over axes
        (0, 2) (a general stage), leading axes (a column) or all, of pointwise values."""
        big = self.R == 3 and self.chance(0.8)
        w = self.choose(lambda v: v.rank >= (3 if big else 2) and not any(v.ones)
                        and self.pure(v))
        if w is None:
            return None
        if w.rank == 3 and self.chance(0.8):
            axes: tuple[int, ...] | None = (0, 2)
        else:
            axes = tuple(range(int(self.rng.integers(1, w.rank)))) if self.chance(0.75) else None
        partner = self.reduce_some(w, axes)
        if partner is None:
            return None
        shape = self.dims(partner)
        rows = [(v, k) for v in self.pool if v.rank >= 2 and self.pure(v)
                for k in range(1, v.rank) if not shape and k == 1
                or self.dims(v, v.rank - k) == shape]
        # an input on axes (1, 2) beside it: rows over axis 2, constant (short or long)
        # where that axis is a literal
        want = axes == (0, 2) and (not rows or isinstance(self.axes[2], int) and self.chance(0.7))
        for _ in range(10 if want else 0):
            v = self.attempt(lambda: self.add_input(w.dt if self.chance(0.5) else None, True),
                             lambda v: self.inputs[-1][1].pos == (1, 2)
                             and not any(self.inputs[-1][1].ones))
            if v is not None:
                rows = [(v, 1)]
                break
        row = None
        if rows:
            v, k = self.pick(rows)
            row = self.reduce_some(v, tuple(range(v.rank - k, v.rank)))
        if row is None or shape and self.chance(0.5):
            self.must += [partner] + ([row] if row is not None else [])
            return row or partner
        x, y = row, partner
        if shape and row.pos != partner.pos:  # one shape on other axes: line them up
            trailing = tuple(range(self.R - row.rank, self.R))
            x, y = self.relabel(row, trailing), self.relabel(partner, trailing)
            if x is None or y is None:
                self.must += [row, partner]
                return row
        out = self.combine(x, y)
        if out is not None and self.chance(0.4):
            self.must.append(row if self.chance(0.5) else partner)
        return out

    def relabel(self, v: Val, pos: tuple[int, ...]) -> Val | None:
        """``v`` on the trailing axes ``pos`` (where NumPy lines it up when it broadcasts),
        or None where their dims are not ``v``'s."""
        if any(not o and self.axes[a] != self.axes[b] for a, b, o in zip(pos, v.pos, v.ones)):
            return None
        return dataclasses.replace(v, pos=pos)

    def dims(self, v: Val, rank: int | None = None) -> tuple[str | int, ...]:
        """The dims of ``v``'s first ``rank`` axes (all: None), 1 for literal-1 ones."""
        n = v.rank if rank is None else rank
        return tuple(1 if o else self.axes[p] for p, o in zip(v.pos[:n], v.ones[:n]))
