"""Segmentation and scheduling: which kernels a traced graph becomes, and how each is launched.

Pure Python over the graph and :class:`~kernelpack.expr.Expr` (no LLVM). Outputs of one shape
share a kernel. A kernel without reductions is *pointwise* (one thread per element in a
grid-stride loop). A kernel whose reductions all reduce the trailing axes of tensors sharing
the leading *outer* dims is a *row* kernel: a group of threads owns a row, reduces it
cooperatively, keeps the results, and writes the row's outputs (softmax, layernorm, masked
means, the quantum encodings). Its group size is chosen at run time from the row length by
variant predicates: a thread per row for short rows, a warp per row up to a few thousand
elements, a block per row beyond. Full reductions (outer dims empty) run in two launches: a
*partial* kernel writes one partial result per 16384 elements into a global workspace of
``cdiv(n, 16384)`` entries, then one block combines them. Anything else falls back to the
general schedule: one thread per output element, looping over the reduced indices.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..expr import Expr, cdiv, const, emin, land, le
from ..fusion import Graph
from ..summary import Scratch

__all__ = ["KernelSpec", "Choice", "Stage", "plan", "variants", "reduces_of", "row_outer",
           "vector_width", "BLOCK", "UNROLL", "ROW_BLOCK", "WARP_ROWS", "CHUNK", "GRID_CAP",
           "THREAD_ROW_MAX", "WARP_ROW_MAX", "WARP_KEEP_MAX", "REG_SLOTS"]

BLOCK = 256            # threads per block of pointwise, thread-per-row and partial kernels
ROW_BLOCK = 512        # threads of a block-per-row kernel
WARP_ROWS = BLOCK // 32
CHUNK = 16384          # elements per partial of a full reduction (64 per thread)
UNROLL = 4             # independent accumulators per thread in a partial
GRID_CAP = 65535       # grid-stride loops cover the rest; keeps grids launchable everywhere
THREAD_ROW_MAX = 32    # reduce-only rows this short: one thread per row
WARP_ROW_MAX = 4096    # reduce-only rows up to this: one warp per row
WARP_KEEP_MAX = 2048   # rows that are also written back (softmax): warp up to this
REG_SLOTS = 8          # elements per thread of the register-resident row schedules


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
    vec: int = 1                    # pointwise: elements per 16-byte group (1: no vectors)
    slots: int = 0                  # row: elements per thread held in registers (0: loops)


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


def _prod(dims: tuple[Expr, ...]) -> Expr:
    total: Expr = const(1)
    for d in dims:
        total = total * d
    return total


def reduces_of(graph: Graph, roots: list[int]) -> list[int]:
    """Reduction nodes the roots depend on, in topological (id) order."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        stack.extend(graph.nodes[nid].inputs)
    return sorted(n for n in seen if graph.nodes[n].op == "reduce")


def vector_width(graph: Graph, roots: list[int]) -> int:
    """Elements per 16-byte group for a pointwise kernel: 16 / the widest element it loads or
    stores (1 when that is 16 bytes, or when a pad's guarded load is involved)."""
    seen: set[int] = set()
    stack = list(roots)
    widest = max(graph.nodes[r].dtype.itemsize for r in roots)
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = graph.nodes[nid]
        if node.op == "pad":
            return 1
        if node.op == "input":
            widest = max(widest, node.dtype.itemsize)
        stack.extend(node.inputs)
    return 16 // widest if widest <= 8 else 1


def depends_on_reduce(graph: Graph, nid: int) -> bool:
    return bool(reduces_of(graph, list(graph.nodes[nid].inputs)))


def row_outer(graph: Graph, reduces: list[int], out_shape: tuple[Expr, ...]) -> tuple[Expr, ...] | None:
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


def plan(graph: Graph, general: frozenset[int] = frozenset()) -> list[Stage]:
    """The stages of ``graph``; groups listed in ``general`` are forced to the fallback
    schedule (the codegen found their reductions read across rows)."""
    from .codegen import acc_dtype

    groups: dict[tuple[Expr, ...], list[tuple[str, int]]] = {}
    for name, nid in graph.outputs:
        groups.setdefault(graph.nodes[nid].shape, []).append((name, nid))
    stages: list[Stage] = []
    for gi, (shape, outs) in enumerate(groups.items()):
        base = f"{graph.name}_{gi}"
        reduces = reduces_of(graph, [n for _, n in outs])
        outer = None if gi in general or not reduces else row_outer(graph, reduces, shape)
        names = tuple(n for n, _ in outs)
        if outer is None:
            n = _prod(shape)
            vec = 1 if reduces else vector_width(graph, [nid for _, nid in outs])
            spec = KernelSpec(base + "_pointwise", "pointwise", tuple(outs), shape, BLOCK,
                              emin(cdiv(n, BLOCK * vec), GRID_CAP), vec=vec)
            stages.append(Stage(names, (Choice((spec,)),), general=bool(reduces)))
            continue
        first = graph.nodes[graph.nodes[reduces[0]].inputs[0]]
        length = _prod(first.shape[len(outer):])
        rows = _prod(outer)
        keeps_row = any(not _prod(graph.nodes[n].shape[len(outer):]).is_const
                        or _prod(graph.nodes[n].shape[len(outer):]).value != 1 for _, n in outs)
        if not outer:
            partial_specs, scratch, overrides = [], [], []
            for k, r in enumerate(reduces):
                node = graph.nodes[r]
                src = graph.nodes[node.inputs[0]]
                if depends_on_reduce(graph, r):
                    continue
                count = cdiv(_prod(src.shape), CHUNK)
                ws = f"{base}_ws{k}"
                scratch.append(Scratch(ws, acc_dtype(node.attrs[0], node.dtype), (count,)))
                partial_specs.append(KernelSpec(f"{base}_partial{k}", "partial", ((ws, r),),
                                                src.shape, BLOCK, count, scratch=(ws,)))
                overrides.append((r, ws, count))
            final = KernelSpec(base + "_rowblock", "row", tuple(outs), (), ROW_BLOCK, const(1),
                               group="block", reduces=tuple(reduces), partials=tuple(overrides),
                               scratch=tuple(w for _, w, _ in overrides))
            stages.append(Stage(names, (Choice((*partial_specs, final), tuple(scratch)),)))
            continue
        uniform = all(graph.nodes[graph.nodes[r].inputs[0]].shape == first.shape
                      for r in reduces) and all(
            graph.nodes[n].shape == first.shape
            or _prod(graph.nodes[n].shape[len(outer):]) == const(1) for _, n in outs)
        # (group, predicate, registers per thread, threads per block)
        options: list[tuple[str, Expr | None, int, int]] = []
        if not keeps_row:
            options.append(("thread", le(length, THREAD_ROW_MAX), 0, BLOCK))
        if uniform and (keeps_row or len(_depths(graph, reduces)) > 1):
            # 8 registers per thread: a warp up to 256 elements, a block of 512 up to 4096
            options += [("warp", le(length, 32 * REG_SLOTS), REG_SLOTS, BLOCK),
                        ("block", le(length, ROW_BLOCK * REG_SLOTS), REG_SLOTS, ROW_BLOCK)]
        elif keeps_row:
            options.append(("warp", le(length, WARP_KEEP_MAX), 0, BLOCK))
        else:
            options.append(("warp", le(length, WARP_ROW_MAX), 0, BLOCK))
        options.append(("block", None, 0, ROW_BLOCK))
        alts: list[Choice] = []
        for group, pred, slots, block in options:
            if pred is not None and pred.is_const:
                if not pred.value:
                    continue
                pred = None
            per_block = {"thread": block, "warp": block // 32, "block": 1}[group]
            grid = emin(cdiv(rows, per_block) if per_block > 1 else rows, GRID_CAP)
            spec = KernelSpec(f"{base}_row{group}{slots or ''}", "row", tuple(outs), outer,
                              block, grid, group=group, reduces=tuple(reduces), slots=slots)
            alts.append(Choice((spec,), predicate=pred))
            if pred is None:
                break
        stages.append(Stage(names, tuple(alts)))
    return stages


def _depths(graph: Graph, reduces: list[int]) -> set[int]:
    """Dependency depths among the reductions (several: they need more than one pass)."""
    from .rows import levels

    return {i for i, level in enumerate(levels(graph, tuple(reduces))) if level}


def variants(stages: list[Stage]) -> list[tuple[Expr | None, list[Choice]]]:
    """The cartesian product of the stages' alternatives, in first-that-holds order."""
    combos: list[tuple[Expr | None, list[Choice]]] = [(None, [])]
    for stage in stages:
        nxt = []
        for pred, chosen in combos:
            for alt in stage.alternatives:
                p = pred if alt.predicate is None else (
                    alt.predicate if pred is None else land(pred, alt.predicate))
                nxt.append((p, chosen + [alt]))
        combos = nxt
    return combos

