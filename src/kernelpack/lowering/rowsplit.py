"""Few, long rows split across blocks: the row stage's first alternative where it applies.

A row stage (reductions over the trailing axes: ``x.sum(-1)``, softmax, layernorm, masked
means) runs a thread, a warp or a block per row (:mod:`.schedule`). With few long rows that
leaves most of the GPU idle: a softmax of (1, 2^20) streamed its row three times through one
SM of an H200's 132, ``x.sum(-1)`` of (4, 10^7) through four. Where rows are few and long
(``rows <= SPLIT_MAX_ROWS`` and ``length >= SPLIT_MIN_LENGTH`` for rows written back, the
``SPLIT_REDUCE_`` pair for per-row outputs: a symbolic predicate over the dims, the same on
every device) this alternative takes the full reductions' passes
(:func:`.fullred.passes`) row by row instead:

- per reduction level, a *partial* kernel over ``rows · P`` blocks (``P = cdiv(length,
  SPLIT_CHUNK)``): block ``row · P + p`` reduces chunk ``p`` of its row into
  ``ws[row · P + p]``, with the accumulators and order of the full reductions' partials (no
  atomics: the result depends on the launch shape alone, so it is deterministic);
- a *combine* kernel per level whose reductions are needed later (a block per row) combining
  the row's ``P`` partials and storing the finalized value (a mean divided by the length) in
  a workspace of the reduction's shape; the next level's partials load their row's values
  once per block (softmax: the max, then the sum of ``exp(x - max)``);
- then the outputs: per-row outputs (``x.sum(-1)``, logsumexp) by one block per row that
  combines the last level's partials and loads the stored values (as :mod:`.fullred`'s last
  kernel does for one row); rows written back (softmax, layernorm, ``x - x.mean(-1,
  keepdims=True)``) by :func:`.longrows.values_pointwise`'s kernel over the whole output on a
  full grid, with 16-byte vectors where the pointwise kernel takes them.

The cost against a block per row: one more read of the input per written-back row (the
outputs' pass reads it again rather than from registers) and one launch per level; the gain:
every SM streams, with ``UNROLL`` loads in flight per thread. Stages whose written rows are
longer than the reduced ones (:mod:`.longrows`) and the general schedule keep theirs.
"""

from __future__ import annotations

from ..errors import CompileError
from ..expr import Expr, ge, land, le, product
from ..graph import Graph
from . import tuning
from .bounds import expr_max, shift_count_syms
from .schedule import Choice
from .tuning import UNROLL

__all__ = ["split_choice", "split_predicate"]


def split_predicate(rows: Expr, length: Expr, keeps_row: bool = True) -> Expr:
    """When a stage of ``rows`` rows of at most ``length`` elements splits its rows across
    blocks: rows written back (``keeps_row``) by ``SPLIT_MIN_LENGTH``/``SPLIT_MAX_ROWS``, per-row
    outputs by the ``SPLIT_REDUCE_`` pair (their tiled block-per-row kernels stream faster, so
    the split pays later). The constants are read at call time, so a benchmark or test can
    patch them."""
    least, most = _bounds(keeps_row)
    return land(ge(length, least), le(rows, most))


def _bounds(keeps_row: bool) -> tuple[int, int]:
    """(least row length, most rows) of the split, for rows written back or per-row outputs."""
    if keeps_row:
        return tuning.SPLIT_MIN_LENGTH, tuning.SPLIT_MAX_ROWS
    return tuning.SPLIT_REDUCE_MIN_LENGTH, tuning.SPLIT_REDUCE_MAX_ROWS


def split_choice(graph: Graph, base: str, shape: tuple[Expr, ...], outs: list[tuple[str, int]],
                 outer: tuple[Expr, ...], length: Expr, reduces: list[int], keeps_row: bool,
                 taken: set[str]) -> Choice | None:
    """The split alternative of the row stage writing ``outs`` (all of ``shape``), whose
    reductions ``reduces`` (id order) reduce rows of at most ``length`` elements below the
    outer dims ``outer``; ``keeps_row``: the outputs are rows written back. None when the
    predicate never holds (static dims outside it, or a length known to stay short: a shift
    count's dim is at most 63); a predicate of None: it always holds.

    Kernels are named ``{base}_split_partial{k}``, ``{base}_split_combine{level}`` and
    ``{base}_split_rowblock`` (per-row outputs) or ``{base}_split_pointwise`` (rows);
    workspaces ``{base}_split_ws{k}`` (partials) and ``{base}_split_val{k}`` (row values).

    Raises:
        CompileError: ``SPLIT_CHUNK`` is not a positive multiple of ``SPLIT_BLOCK·UNROLL``
            (a chunk's unrolled loop has no bounds checks; patched constants only).
    """
    from .fullred import finish_kernels

    chunk, block = tuning.SPLIT_CHUNK, tuning.SPLIT_BLOCK
    combine_block = tuning.SPLIT_COMBINE_BLOCK
    if chunk <= 0 or block <= 0 or chunk % (block * UNROLL):
        raise CompileError(f"tuning.SPLIT_CHUNK must be a positive multiple of SPLIT_BLOCK"
                           f" * UNROLL = {block * UNROLL} (got {chunk})")
    for name, threads in (("SPLIT_BLOCK", block), ("SPLIT_COMBINE_BLOCK", combine_block)):
        if threads % 32 or not 32 <= threads <= 1024:
            raise CompileError(f"schedule.{name} must be a multiple of 32 in 32..1024 "
                               f"(got {threads})")
    top = expr_max(length, shift_count_syms(graph))
    if top is not None and top < _bounds(keeps_row)[0]:
        return None  # rows bounded short (the encodings' n terms, a shift count: <= 63)
    rows = product(outer)
    pred: Expr | None = split_predicate(rows, length, keeps_row)
    assert pred is not None
    if pred.is_const:
        if not pred.value:
            return None
        pred = None
    kernels, scratch = finish_kernels(graph, f"{base}_split", shape, outs, reduces, keeps_row,
                                      taken, outer, chunk, block, combine_block)
    return Choice(tuple(kernels), tuple(scratch), pred)
