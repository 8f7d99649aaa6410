"""Segmentation and scheduling: which kernels a traced graph becomes, and how each is launched.

Pure Python over the graph and :class:`~kernelpack.expr.Expr` (no LLVM). Outputs of one shape
share a kernel. A kernel without reductions is *pointwise* (one thread per element in a
grid-stride loop). A kernel whose reductions all reduce the trailing axes of tensors sharing
the leading *outer* dims is a *row* kernel: a group of threads owns a row, reduces it
cooperatively, keeps the results, and writes the row's outputs (softmax, layernorm, masked
means, the quantum encodings). Its group size is chosen at run time from the row length by
variant predicates: a thread per row for short reduce-only rows; rows that are written back
(softmax, layernorm) are held in registers — a warp per row up to 256 elements (float32), then
blocks of 64..256 threads per row up to 8192 (:data:`REG_GROUPS`) — and longer rows loop. Full reductions (outer dims empty) run in two launches: a
*partial* kernel writes one partial result per 16384 elements into a global workspace of
``cdiv(n, 16384)`` entries, then one block combines them. Anything else falls back to the
general schedule: one thread per output element, looping over the reduced indices.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..expr import Expr, cdiv, const, emin, ge, land, le
from ..graph import Graph
from ..summary import Scratch

__all__ = ["KernelSpec", "Choice", "Stage", "plan", "variants", "reduces_of", "row_outer",
           "vector_width", "BLOCK", "UNROLL", "ROW_BLOCK", "WARP_ROWS", "CHUNK", "GRID_CAP",
           "THREAD_ROW_MAX", "WARP_ROW_MAX", "WARP_KEEP_MAX", "REG_GROUPS", "REG_GROUPS_LIGHT",
           "MIN_THREADS_PER_SM"]

BLOCK = 256            # threads per block of pointwise, thread-per-row and partial kernels
ROW_BLOCK = 512        # threads of a block-per-row kernel
WARP_ROWS = BLOCK // 32
CHUNK = 16384          # elements per partial of a full reduction (64 per thread)
UNROLL = 4             # independent accumulators per thread in a partial
GRID_CAP = 65535       # grid-stride loops cover the rest; keeps grids launchable everywhere
THREAD_ROW_MAX = 32    # reduce-only rows this short: one thread per row
WARP_ROW_MAX = 4096    # reduce-only rows up to this: one warp per row
WARP_KEEP_MAX = 2048   # rows that are also written back (softmax): warp up to this
MIN_THREADS_PER_SM = 512  # register-held rows: ptxas keeps registers within 65536 / this
# register-held rows: (group, 16-byte chunks per thread, threads per block), in order; each
# holds rows up to (32 or threads)·chunks·vec elements. Up to 1024 f32: 8 per thread, more
# threads per row as rows grow (exp-heavy rows need the warps); past that, blocks stay at 256
# threads and hold 16/32 per thread: blocks of 512/1024 fit one per SM and run in lockstep
# (H200, float32: layernorm 8192x8192 43% -> 89% of copy bandwidth, 16384x4096 37% -> 68%,
# softmax 8192x8192 42% -> 58%; see notes/row-perf.md)
REG_GROUPS = (("warp", 1, BLOCK), ("warp", 2, BLOCK), ("block", 2, 64), ("block", 2, 128),
              ("block", 2, 256), ("block", 4, 256), ("block", 8, 256))
# rows without per-element transcendentals or divisions (layernorm): up to 32 f32 per thread,
# more bytes in flight per register (65536 x 1024 float32 on an H200: 91% of copy bandwidth
# for a warp per row with 32 per thread against 81% for 128 threads with 8 per thread; softmax,
# with its exp, the other way round: 59% against 84%)
REG_GROUPS_LIGHT = (("warp", 1, BLOCK), ("warp", 2, BLOCK), ("block", 2, 64), ("warp", 8, BLOCK),
                    ("block", 2, 256), ("block", 4, 256), ("block", 8, 256))


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
        vec = 1
        if uniform and (keeps_row or len(_depths(graph, reduces)) > 1):
            # the row in registers, `slots` 16-byte chunks per thread: a warp per row (several
            # rows per block) up to 32·vec·8 elements, then a block of 256 per row; the
            # capacities double, so at most half of a thread's chunks lie past the row's end
            vec = vector_width(graph, [n for _, n in outs])
            nonempty = ge(length, 1)  # empty rows: the loop schedule (nothing to load)
            light = not _heavy(graph, [n for _, n in outs], set(reduces))
            for group, k, threads in (REG_GROUPS_LIGHT if light else REG_GROUPS):
                cap = (32 if group == "warp" else threads) * vec * k
                options.append((group, land(nonempty, le(length, cap)), k, threads))
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
            tag = "" if not slots else (f"{slots * vec}" if group == "warp"
                                        else f"{block}x{slots * vec}")
            spec = KernelSpec(f"{base}_row{group}{tag}", "row",
                              tuple(outs), outer, block, grid, group=group,
                              reduces=tuple(reduces), slots=slots, vec=vec if slots else 1)
            alts.append(Choice((spec,), predicate=pred))
            if pred is None:
                break
        stages.append(Stage(names, tuple(alts)))
    return stages


_HEAVY = frozenset({"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
                    "erf", "sigmoid", "div", "pow", "floordiv", "mod"})


def _heavy(graph: Graph, roots: list[int], reduces: set[int]) -> bool:
    """Whether the per-element work of a row kernel includes a transcendental or a division
    (softmax's exp): such rows want more threads per row, not more elements per thread. Work
    on per-row values (layernorm's rsqrt of the variance) does not count."""
    per_row: dict[int, bool] = {}

    def uniform(nid: int) -> bool:
        if nid not in per_row:
            node = graph.nodes[nid]
            per_row[nid] = nid in reduces or node.op in ("scalar", "const", "dim") or (
                node.op not in ("input", "iota", "reduce", "pad") and bool(node.inputs)
                and all(uniform(i) for i in node.inputs))
        return per_row[nid]

    seen: set[int] = set()
    stack = list(roots) + [graph.nodes[r].inputs[0] for r in reduces]
    while stack:
        nid = stack.pop()
        if nid in seen or uniform(nid):
            continue
        seen.add(nid)
        node = graph.nodes[nid]
        if node.op in _HEAVY and node.dtype.kind in "fc":
            return True
        stack.extend(node.inputs)
    return False


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

