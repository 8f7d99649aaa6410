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
64..512 threads per row up to 8192 (:data:`REG_GROUPS`) — and longer rows loop. Rows written
much longer than they are reduced (``kp.pad`` to ``1 << n``) reduce into a per-row workspace
first, then a pointwise grid writes them (:mod:`.longrows`). Full
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
indices.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..expr import Expr, cdiv, const, emax, emin, ge, land, le, product
from ..graph import Graph
from ..summary import Scratch
from .materialize import workspace_stages
from .traits import elementwise_heavy, heavy as _heavy, long_inlined_math, \
    per_row, row_transcendental as _row_transcendental

__all__ = ["KernelSpec", "Choice", "Stage", "plan", "variants", "lockstep", "reduces_of",
           "row_outer", "vector_width", "BLOCK", "UNROLL", "ROW_BLOCK", "WARP_ROWS", "CHUNK", "GRID_CAP",
           "THREAD_ROW_MAX", "WARP_ROW_MAX", "SPREAD", "WARP_KEEP_MAX", "REG_GROUPS",
           "REG_GROUPS_WIDE",
           "REG_GROUPS_LIGHT", "REG_GROUPS_LIGHT_WIDE", "MIN_THREADS_PER_SM", "TILE_CHUNKS", "TILE_WARP_MAX",
           "TILE_BLOCK", "ONE_ROW_MIN_THREADS", "acc_width", "per_row", "ROW_SPLIT",
           "HEAVY_POINTWISE", "LONG_MATH_POINTWISE", "GRID_X_MAX", "pointwise_spec", "fresh_name",
           "SPLIT_MIN_LENGTH", "SPLIT_MAX_ROWS", "SPLIT_REDUCE_MIN_LENGTH",
           "SPLIT_REDUCE_MAX_ROWS", "SPLIT_CHUNK", "SPLIT_BLOCK",
           "SPLIT_COMBINE_BLOCK"]

BLOCK = 256            # threads per block of pointwise, thread-per-row and partial kernels
ROW_BLOCK = 512        # threads of a block-per-row kernel
WARP_ROWS = BLOCK // 32
CHUNK = 16384          # elements per partial of a full reduction (64 per thread)
UNROLL = 4             # independent accumulators per thread in a partial
GRID_CAP = 65535       # grid-stride loops cover the rest; keeps grids launchable everywhere
# a full reduction's outputs the size of its input (x / x.sum()): a block per this many
# outputs, at most this many blocks (each combines all cdiv(n, CHUNK) partials itself)
SPREAD = (4096, 1024)
THREAD_ROW_MAX = 32    # reduce-only rows this short: one thread per row
WARP_ROW_MAX = 4096    # reduce-only rows up to this: one warp per row
WARP_KEEP_MAX = 2048   # rows that are also written back (softmax): warp up to this
MIN_THREADS_PER_SM = 512  # register-held rows: ptxas keeps registers within 65536 / this
# thread rows whose terms are light (no transcendental or division per term: phase, not angle)
# and whose per-row work has a transcendental (phase's sincos, not masked_mean's division) get
# a second kernel for launches where every thread owns one row (rows <= GRID_CAP·BLOCK), with
# registers for this many resident threads per SM, by the accumulator width in bytes
# (:func:`acc_width`; 0: no such variant). One row per thread is latency-bound (a short sum,
# then one float64 sincos per thread): more resident threads hide it. H200, B = 128, phase
# float64 against the unbounded kernel (58 registers; 30 here): n = 14 / 15 / 16 -9 / -8 /
# -10%, kp/NVRTC 1.14 -> 1.03 (n = 14), 1.09 -> 0.96 (n = 16); at 2048 for every launch it
# was 6-9% slower at n = 18/20, angle and float32 kernels 0-4% slower at every n, masked_mean
# float64 (rows of 8..32) 3-8% slower one row per thread (notes/encoding-perf.md).
ONE_ROW_MIN_THREADS = {4: 0, 8: 2048}
# reduce-only rows (masked means) longer than a thread's: tiled loops (lowering/tiles.py), each
# lane TILE_CHUNKS 16-byte chunks per input in flight per iteration; a warp per row up to
# TILE_WARP_MAX elements, then TILE_BLOCK threads per row. The plain loops held ~20 bytes in
# flight per thread (H200, masked_mean 4096 x 16384 float32: 42% of copy bandwidth). Rows of
# 2049..4096 take blocks too: masked_mean 16384 x 4096 ran at 90.2% of copy bandwidth with a
# warp per row, 91.6% with 256 threads (Triton 92.1%; .gpu/h5/bench3.py, notes/row-perf.md).
TILE_CHUNKS = 4        # 0: the plain loops (kept for comparisons)
TILE_WARP_MAX = 2048
TILE_BLOCK = 256
# register-held rows: (group, 16-byte chunks per thread, threads per block[, resident threads
# per SM ptxas keeps registers for: MIN_THREADS_PER_SM when left out]), in order; each holds
# rows up to (32 or threads)·chunks·vec elements. Up to 1024 f32: 8 per thread, more threads
# per row as rows grow (exp-heavy rows need the warps), registers for 1536-2048 resident
# threads (40 registers at 1536, no spills); 2048 and 4096: 16 per thread in blocks of 128 and
# 256 (1024 resident, <= 64 registers); 8192: 32 per thread in blocks of 256 (114 registers,
# 2 rows per SM). H200, float32 softmax, % of copy bandwidth (and time / Triton's) after the
# float32 group sums and max.NaN.f32: 65536x1024 92.5 -> 98.1 (1.05 -> 0.99) with 1536 resident
# threads; 8192x8192 91.3 -> 94.4 (1.04 -> 1.01) with 256 x 32 against 512 x 16; 262144x256
# 89 -> 96 and 524288x128 79 -> 91 with 1536 / 2048 resident (2048 spills 24 bytes for 256);
# see notes/row-perf.md
REG_GROUPS = (("warp", 1, BLOCK, 2048), ("warp", 2, BLOCK, 1536), ("block", 2, 64, 1536),
              ("block", 2, 128, 1536), ("block", 4, 128, 1024), ("block", 4, 256, 1024),
              ("block", 8, 256, 512))
# the same for 8-byte elements (float64 softmax): the groups measured before the float32 tuning
# above (2048 resident threads would spill a float64 warp row; unmeasured otherwise)
REG_GROUPS_WIDE = (("warp", 1, BLOCK, 1024), ("warp", 2, BLOCK, 1024), ("block", 2, 64, 1024),
                   ("block", 2, 128, 1024), ("block", 4, 128, 1024), ("block", 4, 256, 1024),
                   ("block", 4, 512, 1024))
# rows without per-element transcendentals or divisions (layernorm): 32 f32 per thread from
# 513 on (~128 registers, 512 resident threads per SM): more bytes in flight per register.
# H200, float32 layernorm: 65536x1024 91% of copy bandwidth for a warp per row with 32 per
# thread against 81% for 128 threads with 8; 32768x2048 67 -> 93% and 16384x4096 70 -> 94% for
# 64/128 threads with 32 each against 256 threads with 8/16 (softmax, with its exp, the other
# way round: 32 per thread at 59% against 84% for 8 per thread at 1024)
REG_GROUPS_LIGHT = (("warp", 1, BLOCK), ("warp", 2, BLOCK), ("block", 2, 64), ("warp", 8, BLOCK),
                    ("block", 8, 64), ("block", 8, 128), ("block", 8, 256))
# the same for 8-byte elements (float64 layernorm: 32 per thread spills 72 bytes; unmeasured on
# a GPU, so the groups used before the change above stay)
REG_GROUPS_LIGHT_WIDE = REG_GROUPS_LIGHT[:4] + (("block", 2, 256), ("block", 4, 256),
                                                ("block", 8, 256))

# Few, long rows split across blocks (lowering/rowsplit.py): rows written back (softmax,
# layernorm) where length >= SPLIT_MIN_LENGTH and rows <= SPLIT_MAX_ROWS, per-row outputs
# (x.sum(-1), logsumexp) where length >= SPLIT_REDUCE_MIN_LENGTH and rows <=
# SPLIT_REDUCE_MAX_ROWS; blocks of SPLIT_BLOCK threads reduce SPLIT_CHUNK elements each (a
# multiple of SPLIT_BLOCK·UNROLL), a block of SPLIT_COMBINE_BLOCK per row combines them.
# H200, benchmarks/rowsplit.py (06:02 UTC; notes/rowsplit.md): chunk and block sizes from 2048
# to 16384 and 128 to 512 within noise of each other (512-thread partial blocks 5-30% slower),
# so 4096/256/256 stay. A block per row streams ~20 GB/s of a softmax row (3 reads + a write;
# (1, 2^20): 0.80 ms, split 0.040 ms) and the split costs ~40 us of fixed work (5 launches),
# so written-back rows split from 65536 (at 32768 the split lost 0.3-0.6x at 64-256 rows; at
# 65536 it won 1.1-1.3x from 128 rows); per-row outputs keep tiled blocks that stream ~3x
# faster: the split won at (32, 262144) 1.15x, (16, 2^20) 2.0x, (8, 10^6) 2.8x, and lost at
# (32, 65536) 0.87x, (256, 65536) 0.92x, tied at (64, 262144). ROW_SPLIT = False: the previous
# schedules.
# Pointwise kernels whose per-element work has a transcendental or a division (gelu's tanh):
# (threads per block, 16-byte groups per thread, a block apart, all loads issued first), on a
# grid of up to GRID_X_MAX blocks. H200, gelu float32 (time / torch eager, two runs): 64 x 2
# 0.995-1.008 (2^26) and 0.998-0.999 (2^28), 128 x 2 0.998-1.005 / 1.000-1.001, the one group
# of 256 threads on a capped grid it replaces 1.010-1.017 / 1.008-1.009; 64 x 1 and 32 x 2
# 1.24 (too few resident threads), 64 x 4 1.015-1.017. Light kernels (axpy) keep one group
# per thread: there every variant was within 0.5% of eager (.gpu/exptree/pw_probe*.py, 05:45).
HEAVY_POINTWISE = (64, 2)
# ... and those led by a long libdevice routine (:func:`.traits.long_inlined_math`): one group
# per thread in blocks of 128, since libdevice inlines the routine once per element a thread
# holds. H200 against HEAVY_POINTWISE (notes/compile-time.md, session 17; outputs identical):
# float32 sin/tan 0.99-1.00, sin+cos 0.91, float16 sin+cos 0.54, float64 gelu 0.98; compile
# about halved. Not with a pow, float64 trig or other transcendentals (1.00-1.08 slower).
LONG_MATH_POINTWISE = (128, 1)
GRID_X_MAX = 2**31 - 1  # the grid's x limit on every CUDA device kernelpack targets
ROW_SPLIT = True
SPLIT_MIN_LENGTH = 65536
SPLIT_MAX_ROWS = 256
SPLIT_REDUCE_MIN_LENGTH = 262144
SPLIT_REDUCE_MAX_ROWS = 32
SPLIT_CHUNK = 4096
SPLIT_BLOCK = 256
SPLIT_COMBINE_BLOCK = 256


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
    spread: bool = False            # a full reduction's last kernel over many blocks (SPREAD)
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
    element has a transcendental or a division (:data:`HEAVY_POINTWISE`), several groups per
    thread in smaller blocks on a full grid (:data:`LONG_MATH_POINTWISE` for the long libdevice
    routines of :func:`.traits.long_inlined_math`)."""
    n = product(shape)
    scratch = tuple(ws for _, ws in stored)
    roots = [nid for _, nid in outs]
    if vec > 1 and elementwise_heavy(graph, roots):
        block, groups = (LONG_MATH_POINTWISE if long_inlined_math(graph, roots)
                         else HEAVY_POINTWISE)
        return KernelSpec(name, "pointwise", tuple(outs), shape, block,
                          emin(cdiv(n, block * groups * vec), GRID_X_MAX), vec=vec,
                          groups=groups, scratch=scratch, values=stored)
    return KernelSpec(name, "pointwise", tuple(outs), shape, BLOCK,
                      emin(cdiv(n, BLOCK * vec), GRID_CAP), vec=vec, scratch=scratch,
                      values=stored)


def acc_width(graph: Graph, reduces: tuple[int, ...] | list[int]) -> int:
    """4 or 8: the widest result of a kernel's reductions in bytes (complex: one part)."""
    sizes = [graph.nodes[r].dtype.itemsize // (2 if graph.nodes[r].dtype.is_complex else 1)
             for r in reduces]
    return 8 if max(sizes, default=4) > 4 else 4


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


def plan(graph: Graph, general: frozenset[int] = frozenset(),
         workspaces: frozenset[str] = frozenset()) -> list[Stage]:
    """The stages of ``graph``; groups listed in ``general`` are forced to the fallback
    schedule (the codegen found their reductions read across rows). Outputs named in
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
        stage = _stage(graph, f"{graph.name}_{gi}", shape, outs, gi in general, taken)
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
    if ROW_SPLIT and (uniform or not keeps_row):  # few, long rows: across blocks (rowsplit.py)
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
        short = le(length, THREAD_ROW_MAX)
        most = ONE_ROW_MIN_THREADS.get(acc_width(graph, reduces), 0)
        if most and not _heavy(graph, [n for _, n in outs], set(reduces)) \
                and _row_transcendental(graph, [n for _, n in outs]):
            # one row per thread (the grid is not capped): the kernel bounded to `most`
            options.append(("thread", land(short, le(rows, GRID_CAP * BLOCK)), 0, BLOCK,
                            False, most))
        options.append(("thread", short, 0, BLOCK, False, 0))
    vec = 1
    if uniform and (keeps_row or len(_depths(graph, reduces)) > 1):
        # the row in registers, `slots` 16-byte chunks per thread: a warp per row (several
        # rows per block) up to 32·vec·8 elements, then a block of 256 per row; the
        # capacities double, so at most half of a thread's chunks lie past the row's end
        vec = vector_width(graph, [n for _, n in outs])
        nonempty = ge(length, 1)  # empty rows: the loop schedule (nothing to load)
        light = not _heavy(graph, [n for _, n in outs], set(reduces))
        if light:
            table = REG_GROUPS_LIGHT if vec >= 4 else REG_GROUPS_LIGHT_WIDE
        else:
            table = REG_GROUPS if vec >= 4 else REG_GROUPS_WIDE
        for group, k, threads, *most in table:
            cap = (32 if group == "warp" else threads) * vec * k
            options.append((group, land(nonempty, le(length, cap)), k, threads, False,
                            most[0] if most else MIN_THREADS_PER_SM))
    heavy_terms = _heavy(graph, [n for _, n in outs], set(reduces))
    if uniform and not keeps_row and TILE_CHUNKS and not heavy_terms:
        # Tiles keep loads in flight for memory-bound terms (masked means). Terms with a
        # transcendental or division (angle's sin/cos of every x_k) are bound by that
        # work, and unrolling it per chunk only multiplies the code: the angle encoding's
        # PTX grew from 20 to 395 KB with tiles. They take the plain loops below.
        # (after register-held rows, if any, the tiled warp would only see empty rows)
        held = any(o[2] for o in options)
        vec = vector_width(graph, [n for _, n in outs])
        if not held:
            options.append(("warp", le(length, TILE_WARP_MAX), TILE_CHUNKS, BLOCK, True,
                            MIN_THREADS_PER_SM))
        options.append(("block", None, TILE_CHUNKS, TILE_BLOCK, True, MIN_THREADS_PER_SM))
    elif keeps_row and not uniform:
        options.append(("warp", le(length, WARP_KEEP_MAX), 0, BLOCK, False, 0))
    elif not keeps_row:
        options.append(("warp", le(length, WARP_ROW_MAX), 0, BLOCK, False, 0))
    options.append(("block", None, 0, ROW_BLOCK, False, 0))
    for group, pred, slots, block, tiled, most in options:
        if pred is not None and pred.is_const:
            if not pred.value:
                continue
            pred = None
        per_block = {"thread": block, "warp": block // 32, "block": 1}[group]
        grid = emin(cdiv(rows, per_block) if per_block > 1 else rows, GRID_CAP)
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

