"""Row stages whose written rows can be much longer than the rows they reduce.

``kp.pad(v * rsqrt((v * v).sum(-1, keepdims=True)), 1 << n)`` (the amplitude encoding) reduces
rows of ``l`` elements but writes rows of ``2^n``. The row schedule chose its group by the
*reduced* length alone, so ``l = 1000, n = 20`` took a warp per row: at ``b = 1`` one warp
wrote 2^20 complex amplitudes, at ``b = 128`` 4096 threads wrote 134 M of them (an H200 holds
~270 k resident threads). A fused row kernel is kept only while its group writes at most
:data:`OUT_PER_THREAD` elements per thread of a row (a warp: 2048, the longest reduced row it
takes anyway; a block of ``ROW_BLOCK`` threads: 32768), so the benchmark shapes
(``n = ceil(log2 l)``, ``2^n < 2 l``) keep their kernels up to ``l = 16384``.

Longer output rows take two kernels instead: the reductions the outputs read are written to a
workspace of their own shape (one value per row) by a reduce-only row kernel, scheduled like a
masked mean's (a thread, a warp of tiles or a block of tiles per row, by the reduced length),
then a pointwise kernel over the whole output on a full grid loads the row's value where it
needs it (:attr:`~.schedule.KernelSpec.values`). The cost is one more read of the reduced rows
(``l`` elements per ``2^n`` written: little wherever this applies) and one launch.

A single row (``rows == 1``: one long state vector) would still be reduced by one block of that
first kernel; such rows take the full-reduction kernels instead (:mod:`.fullred`: partials over
a grid, then a grid of blocks writing the outputs), which reduce and write across the GPU.
"""

from __future__ import annotations

from ..expr import Expr, cdiv, const, emax, emin, land, le, product
from ..graph import Graph
from ..summary import Scratch
from .schedule import Choice, KernelSpec, Stage, fresh_name, pointwise_spec, vector_width
from .tuning import BLOCK, GRID_CAP, ROW_BLOCK, WARP_KEEP_MAX

__all__ = ["OUT_PER_THREAD", "out_length", "long_row_stage", "values_pointwise"]

# a fused row kernel's group writes at most this many elements of a row per thread
# (2048 for a warp: WARP_KEEP_MAX, the longest reduced row a warp takes)
OUT_PER_THREAD = WARP_KEEP_MAX // 32



def out_length(graph: Graph, outs: list[tuple[str, int]], outer: tuple[Expr, ...]) -> Expr:
    """The longest row among the outputs ``outs`` (the product of their dims past ``outer``),
    as one expression."""
    lengths: list[Expr] = []
    for _, nid in outs:
        one = product(graph.nodes[nid].shape[len(outer):])
        if one not in lengths:
            lengths.append(one)
    longest = lengths[0]
    for one in lengths[1:]:
        longest = emax(longest, one)
    return longest


def values_pointwise(graph: Graph, name: str, shape: tuple[Expr, ...],
                     outs: list[tuple[str, int]], stored: list[tuple[int, str]]) -> KernelSpec:
    """A pointwise kernel writing ``outs`` (all of ``shape``) on a full grid (16-byte groups
    where :func:`~.schedule.vector_width` allows), loading the values of the reductions in
    ``stored`` (reduction, workspace of its shape) where it needs them: an earlier kernel
    wrote them (here, and :mod:`.rowsplit`'s combine kernels)."""
    return pointwise_spec(graph, name, shape, outs, vector_width(graph, [nid for _, nid in outs]),
                          tuple(stored))



def long_row_stage(graph: Graph, base: str, shape: tuple[Expr, ...],
                   outs: list[tuple[str, int]], outer: tuple[Expr, ...], length: Expr,
                   reduces: list[int], taken: set[str]) -> Stage:
    """The stage writing ``outs`` (all of ``shape``) whose reductions ``reduces`` reduce rows
    of at most ``length`` elements below the outer dims ``outer``, for outputs whose rows
    may be longer: fused row kernels where their groups suffice, else the reductions into a
    workspace and a pointwise kernel over the output (or the full-reduction kernels for a
    single row). Fused kernels keep the names and launches they had before."""
    from .fullred import direct_reduces, full_stage
    from .schedule import _stage  # noqa: PLC2701 (one module's helper, split for size)

    names = tuple(n for n, _ in outs)
    out_len = out_length(graph, outs, outer)
    rows = product(outer)
    alts: list[Choice] = []

    def add(pred: Expr | None, kernels: tuple[KernelSpec, ...],
            scratch: tuple[Scratch, ...] = ()) -> bool:
        """Append an alternative unless its predicate never holds; True once one always does."""
        if pred is not None and pred.is_const:
            if not pred.value:
                return False
            pred = None
        alts.append(Choice(kernels, scratch, pred))
        return pred is None

    fused = (("warp", land(le(length, WARP_KEEP_MAX), le(out_len, 32 * OUT_PER_THREAD)),
              BLOCK), ("block", le(out_len, ROW_BLOCK * OUT_PER_THREAD), ROW_BLOCK))
    for group, pred, block in fused:
        per_block = block // 32 if group == "warp" else 1
        grid = emin(cdiv(rows, per_block) if per_block > 1 else rows, GRID_CAP)
        spec = KernelSpec(f"{base}_row{group}", "row", tuple(outs), outer, block, grid,
                          group=group, reduces=tuple(reduces))
        if add(pred, (spec,)):
            return Stage(names, tuple(alts))
    # one row: partials over a grid, then a grid of blocks writing the row (fullred.py)
    single = full_stage(graph, f"{base}_one", outs, reduces, True, taken).alternatives[0]
    one = land(le(const(1), rows), le(rows, 1))
    if add(one, single.kernels, single.scratch):
        return Stage(names, tuple(alts))
    # the reductions the outputs read, one value per row in a workspace; then pointwise
    direct = direct_reduces(graph, [nid for _, nid in outs])
    spaces: list[Scratch] = []
    for k, r in enumerate(direct):
        ws = fresh_name(f"{base}_rv{k}", taken)
        taken.add(ws)
        spaces.append(Scratch(ws, graph.nodes[r].dtype, graph.nodes[r].shape))
    sub = _stage(graph, f"{base}_s", graph.nodes[direct[0]].shape,
                 [(s.name, r) for s, r in zip(spaces, direct)], False, taken)
    point = values_pointwise(graph, f"{base}_pointwise", shape, outs,
                             [(r, s.name) for s, r in zip(spaces, direct)])
    for alt in sub.alternatives:
        if add(alt.predicate, (*alt.kernels, point), (*alt.scratch, *spaces)):
            break
    return Stage(names, tuple(alts))
