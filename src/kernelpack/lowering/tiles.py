"""Tiled row loops: reduce-only rows read in 16-byte chunks, several chunks in flight per thread.

The plain loop schedule (:meth:`kernelpack.lowering.rows._Group.loops`) reads one element per
thread per iteration; ptxas unrolls it about 4x, so a thread has ~4 scalar loads in flight (a
masked mean: 20 bytes). Rows that only reduce (masked means, norms) and do not fit a thread
need more: on an H200, 4096 x 16384 float32 with its bool mask ran at 42% of copy bandwidth
with 512-thread blocks holding ~10 KB in flight per SM. Here each iteration covers a *tile* of
``G·K·V`` elements — lane ``l`` loads chunks ``l + s·G`` (``s < K``) of ``V`` elements, one
16-byte load per chunk and input (:meth:`_Group._prime`) — all loads of the tile issued before
any arithmetic, the tile's values combined pairwise into the running per-thread accumulators.
Whole tiles need no bounds checks; the rest of the row (less than a tile) is read one chunk
(or element) per lane and iteration, bounded by the loop alone. Rows whose
length is not a whole number of chunks, or buffers not 16-byte aligned, take coalesced scalar
loads in the same pattern (the uniform branch of :func:`kernelpack.lowering.rows.row`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from .codegen import Ctx
from .irutil import I64, convert
from .mathops import combine, identity

if TYPE_CHECKING:
    from .rows import _Group

__all__ = ["tiles"]


def tiles(group: "_Group", r: ir.Value, outer: tuple[ir.Value, ...], vector: bool) -> None:
    """One row: every reduction level in tiled passes, then the per-row outputs."""
    em, b, g, spec = group.em, group.em.b, group.g, group.spec
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    V, K, G = spec.vec, spec.slots, group.size
    shape = g.nodes[g.nodes[spec.reduces[0]].inputs[0]].shape
    inner = shape[len(spec.shape):]
    length = em.numel(inner)
    row0 = b.mul(r, length)
    tile = G * K * V
    # whole tiles end at length - length % tile (emitted once, in the entry block)
    full_end = em.entry.sub(length, em.entry.urem(length, c(tile)))
    lane0 = b.mul(group.lane, c(V)) if vector else group.lane

    def pass_(level: list[int], accs: dict, base: ir.Value, k_: int, v_: int) -> None:
        """``k_`` chunks of ``v_`` elements from ``base`` (this lane's first index), every one
        inside the row: 16-byte chunks ``base + s·G·V`` (vector), else the coalesced scalars
        ``base + G·m``."""
        chunks: list = []   # (valid, first index within the row, ctxs)
        elems: list = []
        for s in range(k_):
            if vector:
                first = b.add(base, c(s * G * v_)) if s else base
                ctxs = [_ctx(em, shape, outer, inner, row0, b.add(first, c(k)) if k else first)
                        for k in range(v_)]
                chunks.append((None, first, ctxs))
                elems += ctxs
                continue
            for k in range(v_):
                j = b.add(base, c(G * (s * v_ + k))) if s or k else base
                elems.append(_ctx(em, shape, outer, inner, row0, j))
        if vector:
            group._prime([g.nodes[red].inputs[0] for red in level], chunks, set())
        for red in level:
            node = g.nodes[red]
            src = g.nodes[node.inputs[0]]
            kind = node.attrs[0]
            acc_dt, part_dt = group._acc(kind, node.dtype), group._part(kind, node.dtype)
            vals = [convert(b, em.value(src.id, ctx), src.dtype, part_dt) for ctx in elems]
            while len(vals) > 1:  # pairwise within the tile: independent loads, short chains
                vals = [combine(em, kind, part_dt, vals[i], vals[i + 1])
                        if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
            em.acc_store(accs[red], combine(em, kind, acc_dt, em.acc_load(accs[red], acc_dt),
                                            convert(b, vals[0], part_dt, acc_dt)))

    for level in group.levels:
        accs = {}
        for red in level:
            node = g.nodes[red]
            acc_dt = group._acc(node.attrs[0], node.dtype)
            accs[red] = em.acc_slots(acc_dt, identity(node.attrs[0], acc_dt))
        with em.loops.range(lane0, b.add(full_end, lane0), c(tile), "t") as t:
            em.push()
            pass_(level, accs, t, K, V)
            em.pop()
        # the rest (< one tile): one chunk (vector: rows are whole chunks) or one element
        # per lane and iteration; the loop bound is the only check
        step = G * V if vector else G
        with em.loops.range(b.add(full_end, lane0), length, c(step), "tail") as q:
            em.push()
            pass_(level, accs, q, 1, V if vector else 1)
            em.pop()
        for red in level:
            node = g.nodes[red]
            group._finish(red, em.acc_load(accs[red], group._acc(node.attrs[0], node.dtype)),
                          outer)
    group._outputs(r, outer, shape, vector, [], [])


def _ctx(em, shape: tuple, outer: tuple, inner: tuple, row0: ir.Value, j: ir.Value) -> Ctx:  # type: ignore[no-untyped-def]
    return Ctx(shape, outer + em.unravel(j, inner), em.b.add(row0, j))
