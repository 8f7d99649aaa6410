"""Row kernels: a group of threads (one thread, a warp, or a block) owns a row at a time.

For each row, the reductions are computed level by level — a level holds the reductions that
need no other reduction of this kernel (level 0), then those that need only level 0, and so
on — with every reduction of a level accumulated in the *same* pass over the row, so a masked
mean reads its row once and a softmax twice plus once for the output. Each value is then
combined across the group (shuffles, shared memory) and kept for the rest of the row.

With ``spec.slots = K`` the row is instead held in registers (:mod:`.regrows`): each
thread owns K chunks of ``spec.vec`` elements (16 bytes), computed once, straight-line, so the
emitter's value cache shares every load and intermediate between the reduction passes and the
output — one read and one write of the row. A launch takes 16-byte loads/stores when its
buffers are 16-byte aligned and rows a whole number of chunks, else coalesced scalars (one
uniform branch). Elements past the row's end are guarded: not loaded, masked out, not stored.
A thread that owns a row alone (<= 32 terms) reduces it in unrolled groups (:mod:`.threadrows`);
the one-row-per-thread variant of such a kernel differs only in its launch bounds.
"""

from __future__ import annotations

from llvmlite import ir

from ..dtypes import DType, float32
from ..graph import Graph
from .codegen import ZERO, Ctx, Emitter, acc_dtype
from .groups import block_reduce, warp_reduce
from . import threadrows
from .irutil import I1, I64, Val, convert, sreg
from .mathops import combine, finalize, identity
from .regrows import RegisterRows
from .schedule import KernelSpec
from . import tuning
from .tuning import MIN_THREADS_PER_SM
from .threadrows import thread_terms
from .tiles import tiles

__all__ = ["row", "levels", "PARTIAL_F32"]

PARTIAL_F32 = True  # float32 sums: a thread's partial over its registers in float32 (_part)


def levels(graph: Graph, reduces: tuple[int, ...]) -> list[list[int]]:
    """The kernel's reductions grouped by dependency depth (each list in id order)."""
    inside = set(reduces)
    depth: dict[int, int] = {}
    for r in sorted(reduces):
        deps: set[int] = set()
        stack, seen = list(graph.nodes[r].inputs), set()
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            if nid in inside:
                deps.add(nid)
            stack.extend(graph.nodes[nid].inputs)
        depth[r] = 1 + max((depth[d] for d in deps), default=-1)
    out: list[list[int]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for r in sorted(reduces):
        out[depth[r]].append(r)
    return out


def row(em: Emitter, spec: KernelSpec) -> None:
    b, m = em.b, em.module
    tid, bid, nb = sreg(b, m, "tid"), sreg(b, m, "ctaid"), sreg(b, m, "nctaid")
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    # rows per block as the schedule sized the grid with (spec.block threads, one row per
    # thread or per warp), not the default block's: a group of another block size would
    # otherwise skip rows
    if spec.group == "thread":
        per = c(spec.block)
        gid, lane, gstride, size = b.add(b.mul(bid, per), tid), ZERO, b.mul(nb, per), 1
    elif spec.group == "warp":
        per = c(spec.block // 32)
        gid = b.add(b.mul(bid, per), b.lshr(tid, c(5)))
        lane, gstride, size = b.and_(tid, c(31)), b.mul(nb, per), 32
    else:
        gid, lane, gstride, size = bid, tid, nb, spec.block
    group = _Group(em, spec, tid, lane, size)
    _launch_bounds(em, spec)

    def rows(body) -> None:  # type: ignore[no-untyped-def]
        with em.loops.range(gid, em.numel(spec.shape), gstride, "row") as r:
            em.push()
            body(r, em.unravel(r, spec.shape))
            em.pop()
        em.rowcache.clear()

    if not spec.slots:
        rows(group.loops)
        return
    held = (lambda r, outer, v: tiles(group, r, outer, v)) if spec.tiled else group.registers
    if spec.vec == 1:
        rows(lambda r, outer: held(r, outer, False))
        return
    # 16-byte groups when every buffer they touch is 16-byte aligned and rows are a whole
    # number of groups (a uniform branch, decided once per launch); coalesced scalars otherwise
    flag = em.loops.alloca(I1, "vector")
    with b.if_else(b.load(flag, typ=I1)) as (vec, scalar):
        with vec:
            rows(lambda r, outer: held(r, outer, True))
        with scalar:
            rows(lambda r, outer: held(r, outer, False))
    first = em.graph.nodes[em.graph.nodes[spec.reduces[0]].inputs[0]]
    length = em.numel(first.shape[len(spec.shape):])
    whole = em.entry.icmp_unsigned("==", em.entry.urem(length, c(spec.vec)), ZERO)
    em.entry.store(em.entry.and_(em.aligned16(), whole), flag)


def _launch_bounds(em: Emitter, spec: KernelSpec) -> None:
    """``__launch_bounds__(block, MIN_THREADS_PER_SM / block)`` as NVVM annotations (LLVM
    emits ``.maxntid``/``.minnctapersm``): ptxas keeps a register-held row within the register
    budget of that many resident threads per SM instead of taking ~250 registers. Thread rows
    are bounded only where the schedule asks (the one-row-per-thread variant,
    ``tuning.ONE_ROW_MIN_THREADS``) or ``threadrows.MIN_THREADS`` does."""
    most = 0
    if spec.slots:
        most = spec.min_threads or MIN_THREADS_PER_SM
    elif spec.group == "thread":
        most = spec.min_threads or threadrows.MIN_THREADS[threadrows.width(em, spec.reduces)]
    em.launch_bounds(spec.block, max(1, most // spec.block) if most else 0)


class _Group(RegisterRows):
    """The per-row work of one kernel; ``size`` threads cooperate, this one is ``lane``."""

    def __init__(self, em: Emitter, spec: KernelSpec, tid: ir.Value, lane: ir.Value,
                 size: int) -> None:
        self.em, self.spec, self.tid, self.lane, self.size = em, spec, tid, lane, size
        self.g = em.graph
        self.levels = levels(self.g, spec.reduces)
        self.overrides = {r: (ws, count) for r, ws, count in spec.partials}
        self.values = dict(spec.values)  # reductions a combine kernel finished (fullred.py)

    def _acc(self, kind: str, dt: DType) -> DType:
        """The accumulator dtype. A thread owns a row only for rows of at most
        ``THREAD_ROW_MAX`` elements: float32 sums and products of so few terms accumulate in
        float32, as NumPy's own float32 reductions do (no float64 conversion per element, a
        16/clk/SM instruction on sm_90; see notes/encoding-perf.md). Longer rows: float64."""
        if self.spec.group == "thread" and kind in ("sum", "mean", "prod") and dt.kind == "f":
            return dt if dt.itemsize >= 4 else float32
        return acc_dtype(kind, dt)

    def _acc_of(self, r: int) -> DType:
        """The accumulator of reduction ``r`` here: the workspace's dtype where it combines
        partials (stored in :func:`~.codegen.acc_dtype`'s, float64 for float32 sums, also
        when a thread combines them: columns.py's thread finals), else :meth:`_acc`'s."""
        node = self.g.nodes[r]
        if r in self.overrides:
            return acc_dtype(node.attrs[0], node.dtype)
        return self._acc(node.attrs[0], node.dtype)

    def _part(self, kind: str, dt: DType) -> DType:
        """The dtype of one thread's pairwise partial over its register chunks (<= 32 terms)
        before the float64 accumulator: float32 sums of so few terms round like NumPy's own
        pairwise float32 sums (no float64 conversion and add per element: softmax's sum had
        ~25 SASS instructions per element, 3 of them for float64)."""
        acc = self._acc(kind, dt)
        if PARTIAL_F32 and kind in ("sum", "mean") and dt.kind == "f" and dt.itemsize <= 4 \
                and acc.itemsize > 4:
            return float32
        return acc

    def _finish(self, r: int, acc: Val, outer: tuple[ir.Value, ...],
                acc_dt: DType | None = None) -> None:
        """Combine ``acc`` (of dtype ``acc_dt``, by default :meth:`_acc`'s) across the group,
        finalize (mean), keep it for this row."""
        em, node = self.em, self.g.nodes[r]
        kind = node.attrs[0]
        acc_dt = acc_dt or self._acc(kind, node.dtype)
        if self.spec.group == "warp":
            acc = warp_reduce(em, kind, acc_dt, acc)
        elif self.spec.group == "block":
            acc = block_reduce(em, kind, acc_dt, acc, self.tid, self.size)
        src = self.g.nodes[node.inputs[0]]
        # the reduced axes' length (the trailing ones for rows and full reductions; a
        # column reduction's outputs are rows of partials, columns.py)
        total = em.numel([src.shape[a] for a in sorted(node.attrs[1])])
        val = convert(em.b, finalize(em, kind, acc_dt, acc, total), acc_dt, node.dtype)
        em.rowcache[r] = (val, outer)

    def _combine_partials(self, kind: str, acc_dt: DType, ws: str, count: ir.Value,
                          start: ir.Value | None, acc: tuple[ir.Value, ...]) -> None:
        """Combine this row's ``count`` partials ``ws[start + p]`` (``start`` None: from 0)
        into ``acc``: this lane's partials ``lane, lane + size, ...`` go
        :data:`~.tuning.COMBINE_UNROLL` at a time into as many accumulators, whole rounds
        without bounds checks, then the rest into the first. One accumulator had one load in
        flight per thread: the combine kernel of a 268M-element float32 sum took 5.2 µs
        against 3.9 for Triton's (H200, torch.profiler; notes/row-perf.md). The order of the
        terms is fixed by the launch shape, as before."""
        em, b = self.em, self.em.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        unroll = tuning.COMBINE_UNROLL
        size, stride = c(self.size), c(self.size * unroll)  # a lane's step; a round's
        slots = [acc] + [em.acc_slots(acc_dt, identity(kind, acc_dt))
                         for _ in range(unroll - 1)]

        def add(slot: tuple[ir.Value, ...], p: ir.Value) -> None:
            v = em.load(ws, acc_dt, p if start is None else b.add(start, p))
            em.acc_store(slot, combine(em, kind, acc_dt, em.acc_load(slot, acc_dt), v))

        lane = self.lane
        mine = b.select(b.icmp_signed("<", lane, count),
                        b.udiv(b.add(b.sub(count, lane), c(self.size - 1)), size), c(0))
        rounds_end = b.add(lane, b.mul(b.udiv(mine, c(unroll)), stride))
        with em.loops.range(lane, rounds_end, stride, "p") as p:
            for k, slot in enumerate(slots):
                add(slot, b.add(p, c(k * self.size)) if k else p)
        with em.loops.range(rounds_end, count, size, "q") as p:
            add(slots[0], p)
        total = em.acc_load(slots[0], acc_dt)
        for slot in slots[1:]:
            total = combine(em, kind, acc_dt, total, em.acc_load(slot, acc_dt))
        em.acc_store(acc, total)

    # ---- loop schedule ------------------------------------------------------------------------
    def loops(self, r: ir.Value, outer: tuple[ir.Value, ...]) -> None:
        em, b = self.em, self.em.b
        step = ir.Constant(I64, self.size)
        for level in self.levels:
            passes: dict[object, list[int]] = {}
            for red in level:
                if red in self.values:  # one load of the finalized value, nothing to combine
                    # (one per row, rows split across blocks: rowsplit.py; one: fullred.py)
                    at = r if self.spec.shape else ZERO
                    em.rowcache[red] = (em.load(self.values[red], self.g.nodes[red].dtype, at),
                                        outer)
                    continue
                src = self.g.nodes[self.g.nodes[red].inputs[0]]
                passes.setdefault(("ws", red) if red in self.overrides else src.shape,
                                  []).append(red)
            for key, reds in passes.items():
                accs = {}
                for red in reds:
                    node = self.g.nodes[red]
                    acc_dt = self._acc_of(red)
                    accs[red] = em.acc_slots(acc_dt, identity(node.attrs[0], acc_dt))
                if isinstance(key, tuple) and key and key[0] == "ws":
                    (red,) = reds
                    ws, count = self.overrides[red]
                    node = self.g.nodes[red]
                    acc_dt = self._acc_of(red)
                    # a row per output (column partials, columns.py): its `count`
                    # partials follow each other; one row (full reductions): the workspace
                    start = b.mul(r, em.expr(count)) if self.spec.shape else None
                    self._combine_partials(node.attrs[0], acc_dt, ws, em.expr(count), start,
                                           accs[red])
                else:
                    shape = key  # the reduced tensors' shape (outer + inner)
                    inner = shape[len(self.spec.shape):]  # type: ignore[index]
                    length = em.numel(inner)
                    def term(j: ir.Value) -> None:
                        em.push()
                        ctx = Ctx(shape, outer + em.unravel(j, inner), b.add(b.mul(r, length), j))  # type: ignore[arg-type]
                        for red in reds:
                            node = self.g.nodes[red]
                            src = self.g.nodes[node.inputs[0]]
                            acc_dt = self._acc(node.attrs[0], node.dtype)
                            v = convert(b, em.value(src.id, ctx), src.dtype, acc_dt)
                            em.acc_store(accs[red], combine(em, node.attrs[0], acc_dt,
                                                            em.acc_load(accs[red], acc_dt), v))
                        em.pop()

                    if self.spec.group == "thread":  # <= THREAD_ROW_MAX terms: unrolled groups
                        thread_terms(em, length, term)
                    else:
                        with em.loops.range(self.lane, length, step, "j") as j:
                            term(j)
                for red in reds:
                    acc_dt = self._acc_of(red)
                    self._finish(red, em.acc_load(accs[red], acc_dt), outer, acc_dt)
        for name, nid in self.spec.outputs:
            shape = self.g.nodes[nid].shape
            inner = shape[len(self.spec.shape):]
            length = em.numel(inner)
            with em.loops.range(self.lane, length, step, "o") as j:
                em.push()
                lin = b.add(b.mul(r, length), j)
                ctx = Ctx(shape, outer + em.unravel(j, inner), lin)
                em.store(name, self.g.nodes[nid].dtype, lin, em.value(nid, ctx))
                em.pop()
