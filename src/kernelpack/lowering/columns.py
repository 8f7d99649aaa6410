"""Column reductions: reductions over leading or middle axes, split across many threads.

A reduction whose reduced axes are a contiguous block that does not reach the last axis
(``x.sum(axis=0)`` of a matrix, ``y.mean(axis=1)`` of ``(b, n, c)``) keeps trailing elements
apart, so it is not a row. The general schedule gave it one thread per output element, each
looping over the whole reduced length: a column sum of a 100000 x 64 tensor ran on 64 threads.

Here such a stage runs as two launches. The *split* kernel gives each output element ``S``
threads (``S`` is an expression of the shapes, :func:`split`): thread ``g = s·M + f`` (``M``
outputs) reduces the reduced indices ``s, s + S, s + 2S, ...`` of output ``f`` with
:data:`UNROLL` independent accumulators, and writes its partial to ``ws[f·S + s]``
(the accumulator's dtype). Neighbouring threads take neighbouring outputs, i.e. neighbouring
addresses of the source, so every load is coalesced whatever the shape. The *final* kernel is
a row kernel (:mod:`.rows`) over the outputs whose rows are the ``S`` partials of each: a
thread per output up to :data:`THREAD_SPLITS` partials, a warp up to :data:`WARP_SPLITS` and a
block beyond; it combines them, finalizes (``mean`` divides by the reduced length) and writes
the outputs. (A warp per output for S = 8 used a quarter of its lanes on one 32-byte load each:
the final kernel of a (256, 1024, 256) middle-axis sum took 30.8 µs after a 75.9 µs split pass
on an H200; notes/column-perf.md.)

The split threads' sums are plain (float32 and narrower terms accumulate in float64; float64
terms in float64, uncompensated): a thread takes at most an eighth of a column (``S >= 8``),
usually a few dozen terms, spread over its :data:`UNROLL` accumulators, and the partials then
combine in a tree. Neumaier's compensation, as the general schedule's single loop carries,
made float64 column sums 50-60% slower on an H200 (8192 x 8192: 0.245 against 0.148 ms;
torch 0.139) and float32 ones twice as slow, for error that is already NumPy's pairwise level.

Where every buffer the split kernel reads is 16-byte aligned and the kept trailing length
is a whole number of 16-byte groups of the widest input, each thread takes a group of
neighbouring outputs (4 float32, 2 float64) and loads 16 bytes per reduced index
(:func:`emit_split`); otherwise one output per thread.

Constants measured on an H200 (benchmarks/_columns_sweep.py, notes/column-perf.md): 2^19
target threads against 2^18 and 2^20; 4 accumulators per thread against 2 and 8 with one
output each, 2 per lane with 16-byte groups (4 were slower there). The groups made float32
column sums of 8192 x 8192 and 65536 x 1024 10% faster (0.093 -> 0.084 ms; torch 0.082 and
0.101). Pairs of float64 outputs over leading axes aim for :data:`PAIR_TARGET` (see
:func:`split`). Sums, means, maxima and minima of a float32 input over leading axes
(:func:`quad`) take a split kernel of their own where the width is a multiple of 4: 2^18
output splits, :data:`QUAD_UNROLL` = 4 accumulators per lane, ``__launch_bounds__(256)``
(column sums 0.69-0.87 of the shared kernel's time on an H200, 8192 x 8192 98 -> 85 µs);
the one-output body, which would run at that kernel's occupancy, is a kernel of its own
(``colsplit1``) for the other widths, and the launch that does not apply has an empty grid.
Their predicates read the one-output schedule's splits, as the other column stages over the
same tensor do, so that the stages stay in lockstep (one set of variants).

When ``S`` would be small (short reductions, or so many outputs that one thread each already
fills the GPU) the stage keeps the general schedule, chosen at run time by the variants'
predicates: below :data:`SPLIT_MIN` = 4 splits. (It was 8; the general schedule's one thread
per output loops over a whole column, one load after another: a 100 x 64 float32 column sum
took 37.7 µs that way and 13.6 µs split 7 ways, a (1024, 512, 128) middle-axis sum 138 µs
against 85, on an H200.) Only stages whose outputs are exactly such reductions, of one source
shape and axes, take this schedule; :mod:`.materialize` gives column reductions read by other
work a stage of their own, so that they qualify.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from llvmlite import ir

from ..expr import Expr, cdiv, const, emax, emin, eq, ge, land, le, mod, product, select
from ..graph import Graph
from ..summary import Scratch
from .codegen import Ctx, Emitter, acc_dtype
from .irutil import I1, I64, convert, sreg
from .mathops import combine, identity
from .schedule import Choice, KernelSpec, fresh_name, vector_width
from .tuning import BLOCK, GRID_CAP, ROW_BLOCK, WARP_ROWS

__all__ = ["column_axes", "row_axes", "base_reduction", "column_group", "column_choices", "split",
           "emit_split", "TARGET_THREADS", "ROWS_MIN", "SPLIT_MIN", "SPLIT_MAX", "THREAD_SPLITS",
           "WARP_SPLITS", "PAIR_TARGET", "QUAD_TARGET", "QUAD_UNROLL", "quad",
           "whole_groups",
           "UNROLL", "VECTOR", "VECTOR_UNROLL"]

TARGET_THREADS = 1 << 19  # split threads to aim for (about 4000 per SM of an H200)
PAIR_TARGET = 1 << 18     # output splits to aim for over leading axes in pairs of 8-byte outputs
ROWS_MIN = 16             # reduced indices per split thread at least (4 unrolled iterations)
SPLIT_MIN = 4             # fewer splits than this: the general schedule (one thread each)
QUAD_TARGET = 1 << 18     # output splits for plain leading-axis reductions in groups of 4
QUAD_UNROLL = 4           # accumulators per lane in those groups
SPLIT_MAX = 16384         # partials per output at most (the final kernel reads them all)
THREAD_SPLITS = 32        # a thread combines up to this many partials of its output alone
WARP_SPLITS = 512         # a warp combines up to this many partials, a block more
UNROLL = 4                # independent accumulators per split thread (one output each)
VECTOR = True             # 16-byte loads of neighbouring outputs where alignment allows
VECTOR_UNROLL = 2         # the same per lane when each thread takes a 16-byte group


def _reduced(graph: Graph, nid: int) -> tuple[tuple[int, ...], int] | None:
    """The sorted reduced axes of node ``nid`` and its source's rank, when it is a reduction
    over a contiguous block of axes; else None."""
    node = graph.nodes[nid]
    if node.op != "reduce":
        return None
    _, axes = node.attrs
    axes = tuple(sorted(axes))
    if not axes or axes != tuple(range(axes[0], axes[-1] + 1)):
        return None
    return axes, len(graph.nodes[node.inputs[0]].shape)


def column_axes(graph: Graph, nid: int) -> tuple[int, int] | None:
    """``(a, b)`` when node ``nid`` is a reduction over the axes ``a..b-1`` with ``b`` short
    of its source's last axis (a column reduction), else None."""
    got = _reduced(graph, nid)
    if got is None or got[0][-1] >= got[1] - 1:
        return None
    return got[0][0], got[0][-1] + 1


def row_axes(graph: Graph, nid: int) -> int | None:
    """The first reduced axis when node ``nid`` reduces its source's trailing axes and keeps
    at least one leading (outer) axis (a row reduction), else None."""
    got = _reduced(graph, nid)
    if got is None or got[0][0] == 0 or got[0][-1] != got[1] - 1:
        return None
    return got[0][0]


def base_reduction(graph: Graph, nid: int) -> int:
    """``nid`` seen through views that only add or drop size-1 axes, in order (what a
    reduction without ``keepdims`` returns): the node whose flat elements it shares."""
    node = graph.nodes[nid]
    while node.op == "view":
        (mapping,) = node.attrs
        src = graph.nodes[node.inputs[0]]
        kept = [a for a in mapping if a is not None]
        dropped = [d for a, d in enumerate(src.shape) if a not in kept]
        if kept != sorted(set(kept)) or not all(d.is_const and d.value == 1 for d in dropped):
            break
        node = src
    return node.id


def column_group(graph: Graph, outputs: list[int]) -> list[int] | None:
    """The column reductions a stage with these output nodes computes (each output is one
    of them, possibly without ``keepdims``), when they share one source shape and axis block
    (:func:`column_axes`) and none of them reads another: the stage can take the split
    schedule. Else None.

    A reduction below another's terms (``m = x.mean(0)`` returned beside
    ``((x - m) ** 2).sum(0)``) would be recomputed inline for every term the split kernel
    reads: a loop over the whole column per term (K² loads per column). Such a group goes
    to the general schedule instead, whose reductions :mod:`.materialize` gives stages of
    their own, in dependency order, each split. (A reduction outside the group below one
    of them, ``x.sum(2).sum(0)``, does not count here: :func:`column_choices` then finds
    the stage's reductions differ from the group's.)"""
    bases = [base_reduction(graph, n) for n in outputs]
    keys = {(column_axes(graph, r), graph.nodes[graph.nodes[r].inputs[0]].shape)
            if graph.nodes[r].op == "reduce" else None for r in bases}
    # (the key's [0] is read once None is known not to be in keys)
    if len(keys) != 1 or None in keys or next(iter(keys))[0] is None:  # type: ignore[index]
        return None
    below = graph.reachable([graph.nodes[r].inputs[0] for r in set(bases)])
    if any(n in bases for n in below):
        return None
    return sorted(set(bases))



def split(graph: Graph, r: int, vec: int = 1,
          quads: bool = False) -> tuple[Expr, Expr, Expr]:
    """(outputs M, reduced length K, splits S) of column reduction ``r``: ``S`` threads per
    output, enough for about :data:`TARGET_THREADS` in all, at least :data:`ROWS_MIN` reduced
    indices each, at most :data:`SPLIT_MAX`.

    ``vec``: the outputs per 16-byte group of the split kernel (:func:`emit_split`). A
    reduction over leading axes whose kept length is a whole number of pairs of 8-byte
    outputs (float64, int64, complex64) aims for :data:`PAIR_TARGET` output splits instead:
    twice the rows per thread and half the partials were 4-9% faster on an H200 for float64
    column sums and standard deviations from 100000 x 64 to 512 x 65536, but 12% slower for
    middle-axis sums such as (256, 1024, 256). ``quads`` (:func:`quad`, groups of 4): aim
    for :data:`QUAD_TARGET`, each lane with :data:`QUAD_UNROLL` accumulators. Either way no
    fewer than :data:`SPLIT_MIN` splits where :data:`TARGET_THREADS` gives that many: the
    smaller target alone would send 65537..131072 outputs to the general schedule."""
    node = graph.nodes[r]
    src = graph.nodes[node.inputs[0]]
    a, b = column_axes(graph, r)  # type: ignore[misc]
    kept = product(src.shape[:a] + src.shape[b:])
    length = product(src.shape[a:b])
    per_output = cdiv(const(TARGET_THREADS), emax(kept, const(1)))
    want = per_output
    group = 2 if vec == 2 and a == 0 else 4 if vec == 4 and quads else 0
    if group:
        fewer = emax(cdiv(const(PAIR_TARGET if group == 2 else QUAD_TARGET),
                          emax(kept, const(1))), emin(per_output, const(SPLIT_MIN)))
        want = select(whole_groups(graph, r, group), fewer, per_output)
    s = emin(emin(want, cdiv(length, ROWS_MIN)), const(SPLIT_MAX))
    return kept, length, s


def whole_groups(graph: Graph, r: int, group: int) -> Expr:
    """Whether the kept trailing length of column reduction ``r`` is a whole number of
    groups of ``group`` outputs (an expression of the shapes)."""
    src = graph.nodes[graph.nodes[r].inputs[0]]
    return eq(mod(product(src.shape[column_axes(graph, r)[1]:]), group), 0)  # type: ignore[index]


def quad(graph: Graph, reduces: Sequence[int]) -> bool:
    """Whether split kernels of ``reduces`` take groups of 4 the quad way: reductions over
    leading axes of an input itself (a column sum, mean, max or min of ``x``), whose body is
    one load per lane. Heavier bodies (the variance pass of a standard deviation) and
    middle-axis reductions were slower with it (notes/column-perf.md, session 21)."""
    for r in reduces:
        axes = column_axes(graph, r)
        if axes is None or axes[0] != 0 or graph.nodes[graph.nodes[r].inputs[0]].op != "input":
            return False
    return True


def column_choices(graph: Graph, base: str, outs: list[tuple[str, int]],
                   reduces: list[int], taken: set[str]) -> list[Choice] | None:
    """The split alternatives of a stage whose outputs ``outs`` are exactly the column
    reductions ``reduces`` (one source shape, one axis block), each with its predicate on
    the number of splits; None when the stage does not qualify. The caller appends the
    general schedule as the last alternative."""
    if column_group(graph, [nid for _, nid in outs]) != sorted(reduces):
        return None
    src_shape = graph.nodes[graph.nodes[reduces[0]].inputs[0]].shape
    vec = vector_width(graph, [graph.nodes[r].inputs[0] for r in reduces]) if VECTOR else 1
    quads = vec == 4 and quad(graph, reduces)
    kept, _, s = split(graph, reduces[0], vec, quads)
    scratch, parts = [], []
    for k, r in enumerate(reduces):
        name = fresh_name(f"{base}_col{k}", taken)
        node = graph.nodes[r]
        scratch.append(Scratch(name, acc_dtype(node.attrs[0], node.dtype), (kept, s)))
        parts.append((r, name))
    names = tuple(n for _, n in parts)
    grid = emin(cdiv(s * kept, BLOCK), GRID_CAP)
    splitter = KernelSpec(f"{base}_colsplit", "colsplit", tuple((n, r) for r, n in parts),
                          src_shape, BLOCK, grid, group="quad" if quads else "",
                          reduces=tuple(reduces), scratch=names, split=s)
    splitters = [splitter]
    if quads:
        # Two split kernels, one of which runs (the other's grid is empty): the quad kernel
        # where groups of 4 fit the kept length, a kernel of the one-output body alone
        # elsewhere, which keeps its own registers (the quad body's would halve its
        # occupancy: 1000 x 65537 float32 94 -> 166 µs). No variant more.
        fits = whole_groups(graph, reduces[0], 4)
        one = dataclasses.replace(splitter, name=f"{base}_colsplit1", group="one")
        if not fits.is_const:
            splitters = [dataclasses.replace(splitter, grid=select(fits, grid, 0)),
                         dataclasses.replace(one, grid=select(fits, 0, grid))]
        elif not fits.value:  # static dims: only the one kernel that can run is compiled
            splitters = [one]
    # the final kernel's rows are the reductions' elements (keepdims shape); an output
    # without keepdims shares their flat layout, so it is stored as the reduction itself
    out_shape = graph.nodes[reduces[0]].shape
    stored = tuple((name, base_reduction(graph, nid)) for name, nid in outs)
    # The predicates read the splits of the one-output schedule (2^19) even for a quad stage:
    # its own splits are never more and never below SPLIT_MIN where those are not (split()),
    # so every final still fits, and a quad stage keeps the predicates of the other column
    # stages over the same tensor (a standard deviation's variance pass): stages in
    # lockstep share one set of variants (4, not 4 x 4, and no trimming by fit_variants).
    by = split(graph, reduces[0], vec)[2] if quads else s
    finals = (("thread", BLOCK, emin(cdiv(kept, BLOCK), GRID_CAP), le(by, THREAD_SPLITS)),
              ("warp", BLOCK, emin(cdiv(kept, WARP_ROWS), GRID_CAP), le(by, WARP_SPLITS)),
              ("block", ROW_BLOCK, emin(kept, GRID_CAP), None))
    choices = []
    enough = ge(by, SPLIT_MIN)
    for group, threads, grid, final_fits in finals:
        pred = enough if final_fits is None else land(enough, final_fits)
        if pred.is_const and not pred.value:
            continue
        final = KernelSpec(f"{base}_colfinal{group}", "row", stored, out_shape, threads,
                           grid, group=group, reduces=tuple(reduces),
                           partials=tuple((r, n, s) for r, n in parts), scratch=names)
        choices.append(Choice((*splitters, final), tuple(scratch),
                              None if pred.is_const else pred))
        if pred.is_const:  # always holds: nothing after it can run
            break
    return choices


def emit_split(em: Emitter, spec: KernelSpec) -> None:
    """The split kernel (module docstring): a grid-stride loop over ``S·M`` threads' work.

    With :data:`VECTOR` and narrow enough inputs, a first body gives each thread ``vec``
    neighbouring outputs (16 bytes of the widest input per reduced index, one vector load
    each) where every buffer it reads is 16-byte aligned and the kept trailing length is a
    whole number of groups (a uniform branch, decided once per launch); the other body takes
    one output per thread."""
    g = em.graph
    src_ids = [g.nodes[r].inputs[0] for r in spec.reduces]
    vec = vector_width(g, src_ids) if VECTOR else 1
    if vec == 1 or spec.group == "one":
        _split_body(em, spec, 1)
        return
    if spec.group == "quad":
        # __launch_bounds__(BLOCK): measured faster than without (and than a bound of
        # 1024 resident threads, i.e. 64 registers) for the quad body on an H200
        em.launch_bounds(spec.block, 1)
    b = em.b
    flag = em.loops.alloca(I1, "vector")
    with b.if_else(b.load(flag, typ=I1)) as (wide, narrow):
        with wide:
            _split_body(em, spec, vec)
        with narrow:
            _split_body(em, spec, 1)
    lo, hi = column_axes(g, spec.reduces[0])  # type: ignore[misc]
    inner = em.numel(g.nodes[src_ids[0]].shape[hi:])
    whole = em.entry.icmp_unsigned("==", em.entry.urem(inner, ir.Constant(I64, vec)),
                                   ir.Constant(I64, 0))
    em.entry.store(em.entry.and_(em.aligned16(), whole), flag)


def _split_body(em: Emitter, spec: KernelSpec, vec: int) -> None:
    """One grid-stride loop of the split kernel, ``vec`` neighbouring outputs per thread
    (1: one; more: the lanes' loads side by side, each claiming its 16-byte group's
    alignment, so that LLVM merges them into vector loads)."""
    b, m, g = em.b, em.module, em.graph
    em.vec_lanes = vec
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    first = g.nodes[spec.reduces[0]]
    src_shape = g.nodes[first.inputs[0]].shape
    lo, hi = column_axes(g, spec.reduces[0])  # type: ignore[misc]
    kept_dims = src_shape[:lo] + src_shape[hi:]
    red_dims = src_shape[lo:hi]
    assert spec.split is not None
    splits, outputs = em.expr(spec.split), em.numel(kept_dims)
    length, inner = em.numel(red_dims), em.numel(src_shape[hi:])
    groups = b.udiv(outputs, c(vec)) if vec > 1 else outputs  # exact: inner % vec == 0
    tid, bid, nb = sreg(b, m, "tid"), sreg(b, m, "ctaid"), sreg(b, m, "nctaid")
    gid = b.add(b.mul(bid, c(spec.block)), tid)
    accs_of = {r: acc_dtype(g.nodes[r].attrs[0], g.nodes[r].dtype) for r in spec.reduces}
    unroll = UNROLL if vec == 1 else QUAD_UNROLL if spec.group == "quad" else VECTOR_UNROLL
    leaves = sorted(n for n in g.reachable([g.nodes[r].inputs[0] for r in spec.reduces])
                    if g.nodes[n].op == "input" and g.nodes[n].shape == src_shape)
    with em.loops.range(gid, b.mul(splits, groups), b.mul(nb, c(spec.block)), "g") as i:
        s = b.udiv(i, groups)
        f = b.sub(i, b.mul(s, groups))
        if vec > 1:
            f = b.mul(f, c(vec))
        lanes = range(vec)
        kept = [em.unravel(b.add(f, c(k)) if k else f, kept_dims) for k in lanes]
        # flat source index of reduced index t: (o·K + t)·I + i = base + t·I
        o, within = b.udiv(f, inner), b.urem(f, inner)
        base = b.add(b.mul(b.mul(o, length), inner), within)
        sets = [[{r: em.acc_slots(dt, identity(g.nodes[r].attrs[0], dt))
                  for r, dt in accs_of.items()} for _ in lanes] for _ in range(unroll)]

        def term(u: int, t: ir.Value) -> None:
            red = em.unravel(t, red_dims)
            at = b.add(base, b.mul(t, inner))
            ctxs = [Ctx(src_shape, kept[k][:lo] + red + kept[k][lo:],
                        b.add(at, c(k)) if k else at) for k in lanes]
            em.push()
            if vec > 1:  # every lane's loads first, side by side (LLVM merges them)
                for k in lanes:
                    em.vec_lane = k
                    for leaf in leaves:
                        em.value(leaf, ctxs[k])
            for k in lanes:
                em.vec_lane = k if vec > 1 else None
                for r, dt in accs_of.items():
                    node = g.nodes[r]
                    srcnode = g.nodes[node.inputs[0]]
                    v = convert(b, em.value(srcnode.id, ctxs[k]), srcnode.dtype, dt)
                    acc = sets[u][k][r]
                    em.acc_store(acc, combine(em, node.attrs[0], dt, em.acc_load(acc, dt), v))
            em.vec_lane = None
            em.pop()

        # this thread's indices s, s + S, ...: `count` of them, UNROLL at a time, then the rest
        more = b.icmp_signed("<", s, length)
        count = b.select(more, b.udiv(b.add(b.sub(length, s), b.sub(splits, c(1))), splits),
                         c(0))
        step = b.mul(splits, c(unroll))
        main_end = b.add(s, b.mul(b.udiv(count, c(unroll)), step))
        with em.loops.range(s, main_end, step, "t") as t:
            for u in range(unroll):
                term(u, b.add(t, b.mul(splits, c(u))) if u else t)
        with em.loops.range(main_end, length, splits, "tail") as t:
            term(0, t)
        for k in lanes:
            slot = b.add(b.mul(b.add(f, c(k)) if k else f, splits), s)
            for (ws, r) in spec.outputs:
                dt = accs_of[r]
                kind = g.nodes[r].attrs[0]
                acc = em.acc_load(sets[0][k][r], dt)
                for per_lane in sets[1:]:
                    acc = combine(em, kind, dt, acc, em.acc_load(per_lane[k][r], dt))
                em.store(ws, dt, slot, acc)
