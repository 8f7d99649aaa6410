"""Segmentation and scheduling: which kernels a traced graph becomes, and how each is launched.

Pure Python over the graph and :class:`~kernelpack.expr.Expr` (no LLVM). Outputs of one shape
share a kernel. A kernel without reductions is *pointwise* (one thread per element in a
grid-stride loop). A kernel whose reductions all reduce the trailing axes of tensors sharing
the leading *outer* dims is a *row* kernel: a group of threads owns a row, reduces it
cooperatively, keeps the results, and writes the row's outputs (softmax, layernorm, masked
means, the quantum encodings). Its group size is chosen at run time from the row length by
variant predicates: a thread per row for short reduce-only rows (float64 sums of light terms
followed by a transcendental per row first in a kernel bounded for 2048 resident threads when
each thread gets one row: the phase encoding up to 2^16 amplitudes at B = 128), then a warp
and then a block
per row reading tiles of 16-byte chunks (:mod:`.tiles`); rows that are written back (softmax,
layernorm) are held in registers — a warp per row up to 256 elements (float32), then blocks of
64..512 threads per row up to 8192 (:data:`.tuning.REG_GROUPS`) — and longer rows
loop. Rows written much longer than they are reduced (``kp.pad`` to ``1 << n``) reduce into a
per-row workspace first, then a pointwise grid writes them (:mod:`.longrows`). Full
reductions (outer dims empty) run on a grid (:mod:`.fullred`): a
*partial* kernel writes one partial result per 16384 elements into a global workspace of
``cdiv(n, 16384)`` entries, then one block combines them (outputs as long as the input,
``x / x.sum()``, take a grid of such blocks, each combining the partials and writing a
slice); a reduction that reads another (a variance) takes its own partial pass after a
combine kernel has stored the other's value. Column reductions (a contiguous block of axes
short of the last: ``x.sum(axis=0)``) split each output's reduced indices across many
threads, then combine the partials (:mod:`.columns`), where the shapes give enough splits.
Few, long rows (``rows <= SPLIT_MAX_ROWS``, ``length >= SPLIT_MIN_LENGTH``; per-row outputs:
the ``SPLIT_REDUCE_`` pair) are split across blocks first (:mod:`.rowsplit`). Anything else
falls back to the general schedule: one thread per output element, looping over the reduced
indices. The sizes and thresholds these choices use, with the measurements behind each, are
:mod:`.tuning`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..expr import Expr, cdiv, const, emax, emin, ge, land, le, product
from ..graph import Graph
from ..summary import Scratch
from . import tuning
from .materialize import workspace_stages
from .traits import elementwise_heavy, heavy as _heavy, long_inlined_math, \
    per_row, row_transcendental as _row_transcendental

__all__ = ["KernelSpec", "Choice", "Stage", "plan", "variants", "lockstep", "reduces_of",
           "row_outer", "vector_width", "acc_width", "per_row", "pointwise_spec", "fresh_name"]


@dataclass(frozen=True)
class KernelSpec:
    """One kernel. ``kind``: ``pointwise`` | ``row`` | ``partial``. ``shape`` is the output
    shape (pointwise), the outer dims (row) or the reduced tensor's shape (partial)."""

    name: str
    kind: str
    outputs: tuple[tuple[str, int], ...]
    shape: tuple[Expr, ...]
    block: int
    grid: Expr
    group: str = ""
    reduces: tuple[int, ...] = ()
    partials: tuple[tuple[int, str, Expr], ...] = ()
    scratch: tuple[str, ...] = ()   # workspace buffers this kernel reads or writes
    vec: int = 1                    # elements per 16-byte group (1: no vectors)
    slots: int = 0                  # row: 16-byte chunks per thread held in registers (0: loops)
    tiled: bool = False             # row: `slots` chunks per thread per tile of a loop (tiles.py)
    min_threads: int = 0            # row with slots, or thread rows: resident threads per SM
    #                                 ptxas must allow (thread rows: 0 = no bound)
    # (reduction, workspace): full reductions whose value a combine kernel stored (fullred.py),
    # loaded once; pointwise: per-row values of the reduction's shape (longrows.py)
    values: tuple[tuple[int, str], ...] = ()
    split: Expr | None = None       # colsplit: threads per output element (lowering/columns.py)
    groups: int = 1                 # pointwise: 16-byte groups per thread, a block apart
    outer: int = 0                  # partial: leading dims of `shape` that are rows (rowsplit)
    chunk: int = 0                  # partial: elements per block (0: CHUNK)


@dataclass(frozen=True)
class Choice:
    """One way to run a stage: its launches in order, its workspaces, when it applies."""

    kernels: tuple[KernelSpec, ...]
    scratch: tuple[Scratch, ...] = ()
    predicate: Expr | None = None


@dataclass(frozen=True)
class Stage:
    """Work for one group of outputs; the first alternative whose predicate holds runs."""

    outputs: tuple[str, ...]
    alternatives: tuple[Choice, ...]
    general: bool = False



def fresh_name(name: str, taken: set[str]) -> str:
    """``name``, with underscores appended while a parameter, an output or another workspace
    in ``taken`` already has it (an output named ``f_0_ws0`` was a TraceError)."""
    while name in taken:
        name += "_"
    return name


def reduces_of(graph: Graph, roots: list[int]) -> list[int]:
    """Reduction nodes the roots depend on, in topological (id) order."""
    return sorted(n for n in graph.reachable(roots) if graph.nodes[n].op == "reduce")


def vector_width(graph: Graph, roots: list[int]) -> int:
    """Elements per 16-byte group for a pointwise kernel: 16 / the widest element it loads or
    stores (1 when that is 16 bytes, or when a pad's guarded load is involved)."""
    widest = max(graph.nodes[r].dtype.itemsize for r in roots)
    for nid in graph.reachable(roots):
        node = graph.nodes[nid]
        if node.op == "pad":
            return 1
        if node.op == "input":
            widest = max(widest, node.dtype.itemsize)
    return 16 // widest if widest <= 8 else 1


def pointwise_spec(graph: Graph, name: str, shape: tuple[Expr, ...],
                   outs: list[tuple[str, int]], vec: int,
                   stored: tuple[tuple[int, str], ...] = ()) -> KernelSpec:
    """The pointwise kernel ``name`` writing ``outs`` (all of ``shape``) in groups of ``vec``
    elements, loading the per-row values ``stored`` (reduction, workspace) where it reads them:
    one group per thread of a ``BLOCK`` on a capped grid-stride grid, or, where the work per
    element has a transcendental or a division (:data:`.tuning.HEAVY_POINTWISE`), several
    groups per thread in smaller blocks on a full grid (:data:`.tuning.LONG_MATH_POINTWISE` for
    the long libdevice routines of :func:`.traits.long_inlined_math`)."""
    n = product(shape)
    scratch = tuple(ws for _, ws in stored)
    roots = [nid for _, nid in outs]
    if vec > 1 and elementwise_heavy(graph, roots):
        block, groups = (tuning.LONG_MATH_POINTWISE if long_inlined_math(graph, roots)
                         else tuning.HEAVY_POINTWISE)
        return KernelSpec(name, "pointwise", tuple(outs), shape, block,
                          emin(cdiv(n, block * groups * vec), tuning.GRID_X_MAX), vec=vec,
                          groups=groups, scratch=scratch, values=stored)
    return KernelSpec(name, "pointwise", tuple(outs), shape, tuning.BLOCK,
                      emin(cdiv(n, tuning.BLOCK * vec), tuning.GRID_CAP), vec=vec, scratch=scratch,
                      values=stored)


def acc_width(graph: Graph, reduces: tuple[int, ...] | list[int]) -> int:
    """4 or 8: the widest result of a kernel's reductions in bytes (complex: one part)."""
    sizes = [graph.nodes[r].dtype.itemsize // (2 if graph.nodes[r].dtype.is_complex else 1)
             for r in reduces]
    return 8 if max(sizes, default=4) > 4 else 4


def row_outer(graph: Graph, reduces: list[int],
              out_shape: tuple[Expr, ...]) -> tuple[Expr, ...] | None:
    """The outer dims shared by every reduction (each reducing exactly the trailing axes), or
    None when the reductions do not line up as rows."""
    outer: tuple[Expr, ...] | None = None
    for r in reduces:
        node = graph.nodes[r]
        src = graph.nodes[node.inputs[0]]
        _, axes = node.attrs
        k = len(src.shape) - len(axes)
        if tuple(axes) != tuple(range(k, len(src.shape))):
            return None
        if outer is None:
            outer = src.shape[:k]
        elif src.shape[:k] != outer:
            return None
    if outer is None or out_shape[:len(outer)] != outer:
        return None
    return outer


def plan(graph: Graph, general: frozenset[str] = frozenset(),
         workspaces: frozenset[str] = frozenset()) -> list[Stage]:
    """The stages of ``graph``; the stages of outputs named in ``general`` are forced to the
    fallback schedule (the codegen found their reductions read across rows). Outputs named in
    ``workspaces`` are materialized reductions (:mod:`.materialize`): each is a stage of its
    own, declared as scratch of its shape, not a program output."""
    # workspaces avoid parameter and output names (an output "f_0_ws0" was a TraceError)
    taken = {p[0] for p in graph.params} | {name for name, _ in graph.outputs}
    groups: dict[tuple, list[tuple[str, int]]] = {}
    for key, name, nid in workspace_stages(graph, workspaces):
        groups.setdefault(key, []).append((name, nid))
    for name, nid in graph.outputs:
        if name not in workspaces:
            groups.setdefault(graph.nodes[nid].shape, []).append((name, nid))
    stages: list[Stage] = []
    for gi, outs in enumerate(groups.values()):
        shape = graph.nodes[outs[0][1]].shape
        forced = any(name in general for name, _ in outs)
        stage = _stage(graph, f"{graph.name}_{gi}", shape, outs, forced, taken)
        # nothing after an unconditional alternative can run (a column stage whose static
        # dims always give enough splits): neither compile nor list it as a variant
        always = next((i for i, c in enumerate(stage.alternatives) if c.predicate is None),
                      len(stage.alternatives) - 1)
        if always < len(stage.alternatives) - 1:
            stage = Stage(stage.outputs, stage.alternatives[:always + 1], stage.general)
        spaces = tuple(Scratch(name, graph.nodes[nid].dtype, graph.nodes[nid].shape)
                       for name, nid in outs if name in workspaces)
        if spaces:
            stage = Stage(stage.outputs, tuple(
                Choice(c.kernels, c.scratch + spaces, c.predicate) for c in stage.alternatives),
                stage.general)
        stages.append(stage)
    return stages


def _stage(graph: Graph, base: str, shape: tuple[Expr, ...], outs: list[tuple[str, int]],
           general: bool, taken: set[str]) -> Stage:
    """The stage computing the outputs ``outs`` (all of ``shape``)."""
    reduces = reduces_of(graph, [n for _, n in outs])
    outer = None if general or not reduces else row_outer(graph, reduces, shape)
    names = tuple(n for n, _ in outs)
    if outer is None:
        vec = 1 if reduces else vector_width(graph, [nid for _, nid in outs])
        spec = pointwise_spec(graph, base + "_pointwise", shape, outs, vec)
        columns = None
        if reduces and not general:  # column sums split across threads (columns.py)
            from .columns import column_choices

            columns = column_choices(graph, base, outs, reduces, taken)
        if columns:
            return Stage(names, (*columns, Choice((spec,))))
        return Stage(names, (Choice((spec,)),), general=bool(reduces))
    first = graph.nodes[graph.nodes[reduces[0]].inputs[0]]
    # the longest row among the reductions: a thread (or a warp) per row must suit every
    # one of them. The first's length alone gave a thread per row (float32 sums accumulated
    # in float32, meant for <= 32 terms) to `x.sum(-1) + y.sum(-1)` with x 2 long and y a
    # million: 1e-5 .. 5e-5 relative error, one thread reducing the whole long row
    lengths: list[Expr] = []
    for r in reduces:
        one = product(graph.nodes[graph.nodes[r].inputs[0]].shape[len(outer):])
        if one not in lengths:
            lengths.append(one)
    length = lengths[0]
    for one in lengths[1:]:
        length = emax(length, one)
    rows = product(outer)
    keeps_row = any(not product(graph.nodes[n].shape[len(outer):]).is_const
                    or product(graph.nodes[n].shape[len(outer):]).value != 1 for _, n in outs)
    if not outer:  # every axis reduced: partial passes over a grid (fullred.py)
        from .fullred import full_stage

        return full_stage(graph, base, outs, reduces, keeps_row, taken)
    uniform = all(graph.nodes[graph.nodes[r].inputs[0]].shape == first.shape
                  for r in reduces) and all(
        graph.nodes[n].shape == first.shape
        or product(graph.nodes[n].shape[len(outer):]) == const(1) for _, n in outs)
    if keeps_row and not uniform:
        # output rows maybe longer than the reduced ones (kp.pad to 1 << n): longrows.py
        from .longrows import long_row_stage, out_length

        out_len = out_length(graph, outs, outer)
        shorter = le(out_len, length)
        if out_len != length and not (shorter.is_const and shorter.value):
            return long_row_stage(graph, base, shape, outs, outer, length, reduces, taken)
    alts: list[Choice] = []
    if tuning.ROW_SPLIT and (uniform or not keeps_row):  # few, long rows: across blocks
        from .rowsplit import split_choice

        split = split_choice(graph, base, shape, outs, outer, length, reduces, keeps_row, taken)
        if split is not None:
            alts.append(split)
            if split.predicate is None:
                return Stage(names, tuple(alts))
    # (group, predicate, 16-byte chunks per thread, threads per block, tiled, resident
    # threads per SM to keep registers for)
    options: list[tuple[str, Expr | None, int, int, bool, int]] = []
    if not keeps_row:
        short = le(length, tuning.THREAD_ROW_MAX)
        most = tuning.ONE_ROW_MIN_THREADS.get(acc_width(graph, reduces), 0)
        if most and not _heavy(graph, [n for _, n in outs], set(reduces)) \
                and _row_transcendental(graph, [n for _, n in outs]):
            # one row per thread (the grid is not capped): the kernel bounded to `most`
            one_each = land(short, le(rows, tuning.GRID_CAP * tuning.BLOCK))
            options.append(("thread", one_each, 0, tuning.BLOCK, False, most))
        options.append(("thread", short, 0, tuning.BLOCK, False, 0))
    vec = 1
    if uniform and (keeps_row or len(_depths(graph, reduces)) > 1):
        # the row in registers, `slots` 16-byte chunks per thread: a warp per row (several
        # rows per block) up to 32·vec·8 elements, then a block of 256 per row; the
        # capacities double, so at most half of a thread's chunks lie past the row's end
        vec = vector_width(graph, [n for _, n in outs])
        nonempty = ge(length, 1)  # empty rows: the loop schedule (nothing to load)
        light = not _heavy(graph, [n for _, n in outs], set(reduces))
        if light:
            table: tuple[tuple[str, int, int] | tuple[str, int, int, int], ...] = (
                tuning.REG_GROUPS_LIGHT if vec >= 4 else tuning.REG_GROUPS_LIGHT_WIDE)
        else:
            table = tuning.REG_GROUPS if vec >= 4 else tuning.REG_GROUPS_WIDE
        for group, k, threads, *resident in table:
            cap = (32 if group == "warp" else threads) * vec * k
            options.append((group, land(nonempty, le(length, cap)), k, threads, False,
                            resident[0] if resident else tuning.MIN_THREADS_PER_SM))
    heavy_terms = _heavy(graph, [n for _, n in outs], set(reduces))
    if uniform and not keeps_row and tuning.TILE_CHUNKS and not heavy_terms:
        # Tiles keep loads in flight for memory-bound terms (masked means). Terms with a
        # transcendental or division (angle's sin/cos of every x_k) are bound by that
        # work, and unrolling it per chunk only multiplies the code: the angle encoding's
        # PTX grew from 20 to 395 KB with tiles. They take the plain loops below.
        # (after register-held rows, if any, the tiled warp would only see empty rows)
        held = any(o[2] for o in options)
        vec = vector_width(graph, [n for _, n in outs])
        if not held:
            options.append(("warp", le(length, tuning.TILE_WARP_MAX), tuning.TILE_CHUNKS,
                            tuning.BLOCK, True, tuning.MIN_THREADS_PER_SM))
        options.append(("block", None, tuning.TILE_CHUNKS, tuning.TILE_BLOCK, True,
                        tuning.MIN_THREADS_PER_SM))
    elif keeps_row and not uniform:
        options.append(("warp", le(length, tuning.WARP_KEEP_MAX), 0, tuning.BLOCK, False, 0))
    elif not keeps_row:
        options.append(("warp", le(length, tuning.WARP_ROW_MAX), 0, tuning.BLOCK, False, 0))
    options.append(("block", None, 0, tuning.ROW_BLOCK, False, 0))
    for group, pred, slots, block, tiled, most in options:
        if pred is not None and pred.is_const:
            if not pred.value:
                continue
            pred = None
        per_block = {"thread": block, "warp": block // 32, "block": 1}[group]
        grid = emin(cdiv(rows, per_block) if per_block > 1 else rows, tuning.GRID_CAP)
        sep = "t" if tiled else "x"
        tag = "" if not slots else (f"{sep if tiled else ''}{slots * vec}" if group == "warp"
                                    else f"{block}{sep}{slots * vec}")
        tag += "1" if group == "thread" and most else ""  # rowthread1: one row per thread
        spec = KernelSpec(f"{base}_row{group}{tag}", "row",
                          tuple(outs), outer, block, grid, group=group,
                          reduces=tuple(reduces), slots=slots, vec=vec if slots else 1,
                          tiled=tiled, min_threads=most)
        alts.append(Choice((spec,), predicate=pred))
        if pred is None:
            break
    return Stage(names, tuple(alts))


def _depths(graph: Graph, reduces: list[int]) -> set[int]:
    """Dependency depths among the reductions (several: they need more than one pass)."""
    from .rows import levels

    return {i for i, level in enumerate(levels(graph, tuple(reduces))) if level}


def lockstep(alternatives: list[tuple[Choice, ...]] | list[list[Choice]]) -> list[int | None]:
    """For each stage (given by its alternatives), an earlier stage whose alternatives have
    the same predicates in the same order, or None. The two pick the same alternative for
    every shape (the first whose predicate holds), so only those pairings are variants: three
    column sums of one tensor's columns (:mod:`.columns`) have three variants, not 27."""
    first: dict[tuple, int] = {}
    out: list[int | None] = []
    for i, alts in enumerate(alternatives):
        key = tuple(a.predicate for a in alts)
        out.append(first[key] if len(key) > 1 and key in first else None)
        first.setdefault(key, i)
    return out


def variants(stages: list[Stage]) -> list[tuple[Expr | None, list[Choice]]]:
    """The product of the stages' alternatives, in first-that-holds order (stages in
    :func:`lockstep` with an earlier one take the alternative of the same index)."""
    leader = lockstep([st.alternatives for st in stages])
    combos: list[tuple[Expr | None, list[Choice], list[int]]] = [(None, [], [])]
    for si, stage in enumerate(stages):
        nxt = []
        for pred, chosen, picked in combos:
            lead = leader[si]
            for j in range(len(stage.alternatives)) if lead is None else (picked[lead],):
                alt = stage.alternatives[j]
                p = pred if alt.predicate is None or lead is not None else (
                    alt.predicate if pred is None else land(pred, alt.predicate))
                nxt.append((p, chosen + [alt], picked + [j]))
        combos = nxt
    return [(p, chosen) for p, chosen, _ in combos]

