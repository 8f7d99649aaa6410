"""Row kernels: a group of threads (one thread, a warp, or a block) owns a row at a time.

For each row, the reductions are computed level by level — a level holds the reductions that
need no other reduction of this kernel (level 0), then those that need only level 0, and so
on — with every reduction of a level accumulated in the *same* pass over the row, so a masked
mean reads its row once and a softmax twice plus once for the output. Each value is then
combined across the group (shuffles, shared memory) and kept for the rest of the row.

With ``spec.slots = K`` the row is instead held in registers: each thread owns the fixed
elements ``lane + s·G`` (``s < K``), computed once, straight-line (no loop), so the emitter's
value cache shares every load and intermediate between the reduction passes and the output —
one read of the row from memory. Elements past the row's end are guarded: their loads do not
happen, their contributions are masked out, their stores are skipped.
"""

from __future__ import annotations

from llvmlite import ir

from ..fusion import Graph
from .codegen import ZERO, Ctx, Emitter, acc_dtype
from .groups import block_reduce, warp_reduce
from .irutil import I64, Val, convert, sreg
from .mathops import combine, finalize, identity
from .schedule import BLOCK, WARP_ROWS, KernelSpec

__all__ = ["row", "levels"]


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
    if spec.group == "thread":
        gid, lane, gstride, size = b.add(b.mul(bid, c(BLOCK)), tid), ZERO, b.mul(nb, c(BLOCK)), 1
    elif spec.group == "warp":
        gid = b.add(b.mul(bid, c(WARP_ROWS)), b.lshr(tid, c(5)))
        lane, gstride, size = b.and_(tid, c(31)), b.mul(nb, c(WARP_ROWS)), 32
    else:
        gid, lane, gstride, size = bid, tid, nb, spec.block
    group = _Group(em, spec, tid, lane, size)
    with em.loops.range(gid, em.numel(spec.shape), gstride, "row") as r:
        em.push()
        outer = em.unravel(r, spec.shape)
        if spec.slots:
            group.registers(r, outer)
        else:
            group.loops(r, outer)
        em.pop()
    em.rowcache.clear()


class _Group:
    """The per-row work of one kernel; ``size`` threads cooperate, this one is ``lane``."""

    def __init__(self, em: Emitter, spec: KernelSpec, tid: ir.Value, lane: ir.Value,
                 size: int) -> None:
        self.em, self.spec, self.tid, self.lane, self.size = em, spec, tid, lane, size
        self.g = em.graph
        self.levels = levels(self.g, spec.reduces)
        self.overrides = {r: (ws, count) for r, ws, count in spec.partials}

    def _finish(self, r: int, acc: Val, outer: tuple[ir.Value, ...]) -> None:
        """Combine ``acc`` across the group, finalize (mean), keep it for this row."""
        em, node = self.em, self.g.nodes[r]
        kind = node.attrs[0]
        acc_dt = acc_dtype(kind, node.dtype)
        if self.spec.group == "warp":
            acc = warp_reduce(em, kind, acc_dt, acc)
        elif self.spec.group == "block":
            acc = block_reduce(em, kind, acc_dt, acc, self.tid, self.size)
        src = self.g.nodes[node.inputs[0]]
        total = em.numel(src.shape[len(self.spec.shape):])
        val = convert(em.b, finalize(em, kind, acc_dt, acc, total), acc_dt, node.dtype)
        em.rowcache[r] = (val, outer)

    # ---- loop schedule ------------------------------------------------------------------------
    def loops(self, r: ir.Value, outer: tuple[ir.Value, ...]) -> None:
        em, b = self.em, self.em.b
        step = ir.Constant(I64, self.size)
        for level in self.levels:
            passes: dict[object, list[int]] = {}
            for red in level:
                src = self.g.nodes[self.g.nodes[red].inputs[0]]
                passes.setdefault(("ws", red) if red in self.overrides else src.shape,
                                  []).append(red)
            for key, reds in passes.items():
                accs = {}
                for red in reds:
                    node = self.g.nodes[red]
                    acc_dt = acc_dtype(node.attrs[0], node.dtype)
                    accs[red] = em.acc_slots(acc_dt, identity(node.attrs[0], acc_dt))
                if isinstance(key, tuple) and key and key[0] == "ws":
                    (red,) = reds
                    ws, count = self.overrides[red]
                    node = self.g.nodes[red]
                    acc_dt = acc_dtype(node.attrs[0], node.dtype)
                    with em.loops.range(self.lane, em.expr(count), step, "p") as j:
                        v = em.load(ws, acc_dt, j)
                        em.acc_store(accs[red], combine(em, node.attrs[0], acc_dt,
                                                        em.acc_load(accs[red], acc_dt), v))
                else:
                    shape = key  # the reduced tensors' shape (outer + inner)
                    inner = shape[len(self.spec.shape):]  # type: ignore[index]
                    length = em.numel(inner)
                    with em.loops.range(self.lane, length, step, "j") as j:
                        em.push()
                        ctx = Ctx(shape, outer + em.unravel(j, inner), b.add(b.mul(r, length), j))  # type: ignore[arg-type]
                        for red in reds:
                            node = self.g.nodes[red]
                            src = self.g.nodes[node.inputs[0]]
                            acc_dt = acc_dtype(node.attrs[0], node.dtype)
                            v = convert(b, em.value(src.id, ctx), src.dtype, acc_dt)
                            em.acc_store(accs[red], combine(em, node.attrs[0], acc_dt,
                                                            em.acc_load(accs[red], acc_dt), v))
                        em.pop()
                for red in reds:
                    node = self.g.nodes[red]
                    acc_dt = acc_dtype(node.attrs[0], node.dtype)
                    self._finish(red, em.acc_load(accs[red], acc_dt), outer)
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

    # ---- register schedule ----------------------------------------------------------------------
    def registers(self, r: ir.Value, outer: tuple[ir.Value, ...]) -> None:
        em, b = self.em, self.em.b
        first = self.g.nodes[self.g.nodes[self.spec.reduces[0]].inputs[0]]
        shape = first.shape
        inner = shape[len(self.spec.shape):]
        length = em.numel(inner)
        slots = []
        for s in range(self.spec.slots):
            j = b.add(self.lane, ir.Constant(I64, s * self.size)) if s else self.lane
            valid = b.icmp_signed("<", j, length)
            slots.append((Ctx(shape, outer + em.unravel(j, inner), b.add(b.mul(r, length), j)),
                          valid))
        for level in self.levels:
            for red in level:
                node = self.g.nodes[red]
                src = self.g.nodes[node.inputs[0]]
                kind = node.attrs[0]
                acc_dt = acc_dtype(kind, node.dtype)
                acc = identity(kind, acc_dt)
                for ctx, valid in slots:
                    em.guard = valid
                    v = convert(b, em.value(src.id, ctx), src.dtype, acc_dt)
                    new = combine(em, kind, acc_dt, acc, v)
                    acc = tuple(b.select(valid, n, o) for n, o in zip(new, acc)) \
                        if isinstance(acc, tuple) else b.select(valid, new, acc)
                em.guard = None
                self._finish(red, acc, outer)
        for name, nid in self.spec.outputs:
            out = self.g.nodes[nid]
            if out.shape != shape:  # a per-row result (shape outer + 1s): lane 0 writes it
                with b.if_then(b.icmp_unsigned("==", self.lane, ZERO)):
                    em.push()
                    ctx = Ctx(out.shape, outer + (ZERO,) * (len(out.shape) - len(outer)), r)
                    em.store(name, out.dtype, r, em.value(nid, ctx))
                    em.pop()
                continue
            for ctx, valid in slots:
                em.guard = valid
                v = em.value(nid, ctx)
                em.guard = None
                with b.if_then(valid):
                    em.store(name, out.dtype, ctx.linear, v)
