"""Full reductions (every axis of their inputs reduced): partial passes, combines, a last kernel.

A stage whose reductions all reduce every axis runs level by level (:func:`.rows.levels`: a
level's reductions read only reductions of earlier levels). Every reduction gets a *partial*
kernel: a grid of ``cdiv(numel, CHUNK)`` blocks, each reducing ``CHUNK`` consecutive elements
into one entry of a workspace. A reduction that a later one reads (the mean inside a variance)
is then finished by its level's *combine* kernel: one block combines the partials and stores the
finalized value (the mean, in the reduction's dtype) in a one-entry workspace, which each block
of the later partial kernels loads once. The last kernel combines the partials of the
reductions it reads that nothing else reads, loads the values of the others, and writes the
outputs in one block; outputs longer than one element (``x / x.sum()``, a normalized state
vector) are written by a pointwise grid instead, after a combine kernel has stored every value
they read. (Until session 20 a grid of up to 1024 blocks each combined the partials itself and
wrote its slice one scalar at a time: one load in flight per thread, ~1.35 TB/s on an H200,
e.g. ``x / x.sum()`` of 2^26 float32 in 553 µs.)

Why a combine kernel rather than every block of the next partial pass combining the first
partials itself: at n = 1e8 that pass has 12208 blocks, and each would re-read all 12208
partials (1.2 GB of L2 reads, three times the float32 input), where one block reads them
once for the price of a launch (a few microseconds). Before this, a reduction reading another
one ran inside the last kernel's single block: a float32 variance of 1e8 elements streamed the
input twice through one SM. H200, variance of 1e8 float32: 22.4 ms before, 0.203 ms now (92.6%
of copy bandwidth for the two passes; torch.var, one Welford pass, 0.159 ms); float64 0.378 ms
(torch 0.314); ``(x - mean) / norm`` 0.467 ms (torch 0.968; .gpu/h1-bench.py). The order of
every sum is fixed by the launch shape alone (no atomics), so results are deterministic.
"""

from __future__ import annotations

from ..expr import Expr, cdiv, const, emin, product
from ..graph import Graph
from ..summary import Scratch
from .schedule import Choice, KernelSpec, Stage, fresh_name
from .tuning import BLOCK, CHUNK, GRID_CAP, ROW_BLOCK

__all__ = ["full_stage", "finish_kernels", "passes", "direct_reduces"]


def direct_reduces(graph: Graph, roots: list[int]) -> list[int]:
    """The reductions ``roots`` read without going through another reduction (a root that is
    a reduction counts), in id order: those whose values a kernel computing the roots needs."""
    isreduce = lambda n: graph.nodes[n].op == "reduce"  # noqa: E731
    inner = graph.reachable(roots, through=lambda n: not isreduce(n))
    found = {i for n in inner for i in graph.nodes[n].inputs if isreduce(i)}
    return sorted(found | {r for r in roots if isreduce(r)})




def passes(graph: Graph, base: str, reduces: list[int], taken: set[str],
           outer: tuple[Expr, ...] = (), finish: frozenset[int] = frozenset(),
           chunk: int = CHUNK, block: int = BLOCK, combine_block: int = ROW_BLOCK
           ) -> tuple[list[KernelSpec], list[Scratch], dict[int, tuple[str, Expr]],
                      dict[int, str]]:
    """The partial and combine kernels of ``reduces`` (id order), level by level, for rows
    below the dims ``outer`` (empty: full reductions, one row): each reduction's partial
    kernel reduces blocks of ``chunk`` elements of a row (``block`` threads) into a workspace
    of ``cdiv(length, chunk)`` entries per row; the reductions another one reads, and those
    in ``finish``, are then finalized by their level's combine kernel (a block of
    ``combine_block`` threads per row) into a workspace of one value per row, which later
    partial kernels load once per block (:mod:`.rowsplit` shares this with full reductions).

    Returns (kernels, workspaces, reduction -> (partials workspace, entries per row),
    reduction -> finalized value's workspace)."""
    from .codegen import acc_dtype
    from .rows import levels

    read = {d for r in reduces for d in direct_reduces(graph, [graph.nodes[r].inputs[0]])}
    rows = product(outer)
    kernels: list[KernelSpec] = []
    scratch: list[Scratch] = []
    partials: dict[int, tuple[str, Expr]] = {}   # reduction -> (workspace, entries per row)
    values: dict[int, str] = {}                  # reduction -> finalized values' workspace
    for depth, level in enumerate(levels(graph, tuple(reduces))):
        for r in level:
            k = reduces.index(r)
            node = graph.nodes[r]
            src = graph.nodes[node.inputs[0]]
            count = cdiv(product(src.shape[len(outer):]), chunk)
            total = rows * count if outer else count
            ws = fresh_name(f"{base}_ws{k}", taken)
            scratch.append(Scratch(ws, acc_dtype(node.attrs[0], node.dtype), (total,)))
            needs = tuple((d, values[d]) for d in direct_reduces(graph, [src.id]))
            kernels.append(KernelSpec(f"{base}_partial{k}", "partial", ((ws, r),), src.shape,
                                      block, total, scratch=(ws, *(v for _, v in needs)),
                                      values=needs, outer=len(outer),
                                      chunk=0 if chunk == CHUNK else chunk))
            partials[r] = (ws, count)
        done = [r for r in level if r in read or r in finish]
        if not done:
            continue
        for r in done:
            values[r] = fresh_name(f"{base}_val{reduces.index(r)}", taken)
            scratch.append(Scratch(values[r], graph.nodes[r].dtype,
                                   graph.nodes[r].shape if outer else (const(1),)))
        kernels.append(KernelSpec(
            f"{base}_combine{depth}", "row", tuple((values[r], r) for r in done), outer,
            combine_block, emin(rows, GRID_CAP) if outer else const(1), group="block",
            reduces=tuple(done), partials=tuple((r, *partials[r]) for r in done),
            scratch=tuple(partials[r][0] for r in done)))
    return kernels, scratch, partials, values


def finish_kernels(graph: Graph, base: str, shape: tuple[Expr, ...],
                   outs: list[tuple[str, int]], reduces: list[int], keeps_row: bool,
                   taken: set[str], outer: tuple[Expr, ...] = (), chunk: int = CHUNK,
                   block: int = BLOCK, combine_block: int = ROW_BLOCK
                   ) -> tuple[list[KernelSpec], list[Scratch]]:
    """:func:`passes` for ``reduces`` (rows below ``outer``; none: full reductions) and the
    kernel writing ``outs`` (all of ``shape``) after them: ``{base}_pointwise`` when the outputs
    are rows (``keeps_row``: every reduction they read is finished by a combine kernel, and a
    pointwise grid, 16-byte groups where the buffers allow, loads the stored values), else
    ``{base}_rowblock`` (a block of ``combine_block`` threads per row combines the partials of
    what nothing else reads, loads the stored values, writes the outputs). Shared by
    :func:`full_stage` and :mod:`.rowsplit`."""
    from .longrows import values_pointwise

    last = direct_reduces(graph, [nid for _, nid in outs])
    kernels, scratch, partials, values = passes(
        graph, base, reduces, taken, outer, frozenset(last) if keeps_row else frozenset(),
        chunk, block, combine_block)
    if keeps_row:
        kernels.append(values_pointwise(graph, base + "_pointwise", shape, outs,
                                        [(r, values[r]) for r in last]))
        return kernels, scratch
    combined = tuple((r, *partials[r]) for r in last if r not in values)
    loaded = tuple((r, values[r]) for r in last if r in values)
    kernels.append(KernelSpec(
        base + "_rowblock", "row", tuple(outs), outer, combine_block,
        emin(product(outer), GRID_CAP) if outer else const(1), group="block",
        reduces=tuple(last), partials=combined, values=loaded,
        scratch=tuple(w for _, w, _ in combined) + tuple(v for _, v in loaded)))
    return kernels, scratch


def full_stage(graph: Graph, base: str, outs: list[tuple[str, int]], reduces: list[int],
               keeps_row: bool, taken: set[str]) -> Stage:
    """The stage computing outputs ``outs`` (name, node; all of one shape) whose reductions
    ``reduces`` (id order) all reduce every axis; ``keeps_row``: the outputs are longer than
    one element (``x / x.sum()``).

    Kernels are named ``{base}_partial{k}`` (``k``: the reduction's index in ``reduces``),
    ``{base}_combine{level}``, and last ``{base}_rowblock`` or, when the outputs are rows,
    ``{base}_pointwise`` (:func:`finish_kernels`). Workspaces are ``{base}_ws{k}`` (partials,
    the accumulator's dtype) and ``{base}_val{k}`` (one finalized value)."""
    kernels, scratch = finish_kernels(graph, base, graph.nodes[outs[0][1]].shape, outs,
                                      reduces, keeps_row, taken)
    return Stage(tuple(n for n, _ in outs), (Choice(tuple(kernels), tuple(scratch)),))
