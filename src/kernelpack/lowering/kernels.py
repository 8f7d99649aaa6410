"""Kernel templates: the loops of each schedule around :meth:`Emitter.value`.

- ``pointwise``: ``for i in grid-stride(total)``: store every output at ``i``.
- ``row``: see :mod:`kernelpack.lowering.rows`.
- ``partial``: each block reduces ``CHUNK`` consecutive elements into one workspace entry
  (reductions its source reads are loaded once from their one-entry workspaces).
- ``colsplit``: a column reduction's indices split across threads: see :mod:`.columns`.
"""

from __future__ import annotations

from typing import Sequence

from llvmlite import ir

from ..dtypes import DType
from ..expr import cdiv, product
from ..graph import Graph
from .codegen import ZERO, Ctx, Emitter, acc_dtype
from .columns import emit_split
from .groups import block_reduce
from .irutil import I64, convert, sreg
from .mathops import combine, identity
from .rows import row
from .schedule import KernelSpec
from .tuning import CHUNK, UNROLL

__all__ = ["signature", "emit"]


def signature(graph: Graph, spec: KernelSpec, scratch: dict[str, DType]
              ) -> tuple[list[tuple[str, DType]], list[tuple[str, DType]]]:
    """(buffers, scalars) of a kernel, in parameter order: its outputs (or workspace), the
    workspaces it reads, every input tensor, every materialized reduction's workspace, every
    scalar. Dims (i64) follow them. The kernel is emitted with all of these; the buffers its
    body never uses are then dropped (:meth:`.codegen.Emitter.finish`), and the summary's
    launch passes the rest (``Build.kernel_buffers``)."""
    buffers: list[tuple[str, DType]] = []
    for name, nid in spec.outputs:
        buffers.append((name, scratch[name] if name in scratch else graph.nodes[nid].dtype))
    for ws in spec.scratch:
        if all(ws != n for n, _ in buffers):
            buffers.append((ws, scratch[ws]))
    for pname, kind, dt, _ in graph.params:
        if kind == "tensor":
            buffers.append((pname, dt))
    params = {p[0] for p in graph.params}
    for node in graph.nodes:  # materialized reductions' workspaces (lowering/materialize.py)
        if node.op == "input" and node.attrs[0] not in params \
                and all(node.attrs[0] != n for n, _ in buffers):
            buffers.append((node.attrs[0], node.dtype))
    scalars = [(pname, dt) for pname, kind, dt, _ in graph.params if kind == "scalar"]
    return buffers, scalars


def emit(module: ir.Module, graph: Graph, spec: KernelSpec, scratch: dict[str, DType],
         symbols: Sequence[str]) -> Emitter:
    buffers, scalars = signature(graph, spec, scratch)
    em = Emitter(module, graph, spec.name, buffers, scalars, symbols)
    {"pointwise": _pointwise, "row": row, "partial": _partial,
     "colsplit": emit_split}[spec.kind](em, spec)
    em.finish()
    return em


def _pointwise(em: Emitter, spec: KernelSpec) -> None:
    """Grid-stride loop; with ``spec.vec > 1`` a first loop handles groups of ``vec``
    elements (16 bytes of the widest tensor) when every buffer it touches is 16-byte aligned
    (checked in the kernel), and the scalar loop takes the rest. With ``spec.groups > 1`` each
    thread takes that many groups a block apart (:data:`~.tuning.HEAVY_POINTWISE`): all of
    their loads first, then the math, then the stores."""
    b, m = em.b, em.module
    tid, bid, nb = sreg(b, m, "tid"), sreg(b, m, "ctaid"), sreg(b, m, "nctaid")
    blk = ir.Constant(I64, spec.block)
    gid, stride, total = b.add(b.mul(bid, blk), tid), b.mul(nb, blk), em.numel(spec.shape)
    start = em.loops.alloca(I64, "start")
    b.store(ZERO, start)
    em.stored = dict(spec.values)  # per-row reductions an earlier kernel wrote (longrows.py)
    if spec.vec > 1:
        flag = em.loops.alloca(ir.IntType(1), "aligned")
        vec = ir.Constant(I64, spec.vec)
        nvec = b.udiv(total, vec)
        with b.if_then(b.load(flag, typ=ir.IntType(1))):
            if spec.groups > 1:
                _grouped_vectors(em, spec, nvec)
            else:
                with em.loops.range(gid, nvec, stride, "v") as v:
                    _vectors(em, spec, [v])
            b.store(b.mul(nvec, vec), start)
        em.entry.store(em.aligned16(), flag)
    with em.loops.range(b.add(b.load(start, typ=I64), gid), total, stride) as i:
        em.push()
        _store_outputs(em, spec, i)
        em.pop()


def _grouped_vectors(em: Emitter, spec: KernelSpec, nvec: ir.Value) -> None:
    """``spec.groups`` 16-byte groups per thread, ``spec.block`` apart (coalesced per warp), over
    a grid-stride loop of *rounds* of ``block·groups`` groups: a whole round without bounds
    checks, a partial last one group by group (a loop: one more copy of the math, not
    ``groups``)."""
    b, m = em.b, em.module
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    tid, bid, nb = sreg(b, m, "tid"), sreg(b, m, "ctaid"), sreg(b, m, "nctaid")
    per = spec.block * spec.groups
    rounds = b.udiv(b.add(nvec, c(per - 1)), c(per))
    with em.loops.range(bid, rounds, nb, "r") as r:
        first = b.add(b.mul(r, c(per)), tid)
        groups = [b.add(first, c(u * spec.block)) if u else first for u in range(spec.groups)]
        whole = b.icmp_signed("<=", b.mul(b.add(r, c(1)), c(per)), nvec)
        with b.if_else(whole) as (yes, no):
            with yes:
                _vectors(em, spec, groups)
            with no:  # the last, partial round: this thread's groups below nvec, one by one
                with em.loops.range(first, nvec, c(spec.block), "g") as v:
                    _vectors(em, spec, [v])


def _vectors(em: Emitter, spec: KernelSpec, groups: list[ir.Value]) -> None:
    """The outputs at the 16-byte groups ``groups`` (group indices): every load first, then the
    math, then every store (LLVM's load/store vectorizer merges only accesses it can see side
    by side, and loads issued together are in flight together)."""
    b = em.b
    vec = ir.Constant(I64, spec.vec)
    em.vec_lanes = spec.vec
    em.push()
    lanes = []
    for v in groups:
        base = b.mul(v, vec)
        for k in range(spec.vec):
            em.vec_lane = k
            i = b.add(base, ir.Constant(I64, k)) if k else base
            ctx = Ctx(spec.shape, em.unravel(i, spec.shape), i)
            for leaf in _same_shape_inputs(em.graph, spec):
                em.value(leaf, ctx)
            lanes.append((k, i, ctx))
    pending = []
    for k, i, ctx in lanes:
        em.vec_lane = k
        pending += [(k, name, nid, i, em.value(nid, ctx)) for name, nid in spec.outputs]
    for k, name, nid, i, val in pending:
        em.vec_lane = k
        em.store(name, em.graph.nodes[nid].dtype, i, val, contiguous=True)
    em.vec_lane = None
    em.pop()


def _same_shape_inputs(graph, spec: KernelSpec) -> list[int]:
    return sorted(nid for nid in graph.reachable(nid for _, nid in spec.outputs)
                  if graph.nodes[nid].op == "input" and graph.nodes[nid].shape == spec.shape)


def _store_outputs(em: Emitter, spec: KernelSpec, i: ir.Value) -> None:
    """Element ``i`` of every output: every value first, then the stores, so that the
    thread has loaded all it reads before it stores anything (``Launch.stores_after_loads``:
    an output may then be over an input another output reads, as an optimizer step's
    ``out=(p, m)`` is; storing each output as it was computed let the next one load the
    stored value, review 48 B)."""
    ctx = Ctx(spec.shape, em.unravel(i, spec.shape), i)
    values = [em.value(nid, ctx) for _, nid in spec.outputs]
    for (name, nid), value in zip(spec.outputs, values):
        em.store(name, em.graph.nodes[nid].dtype, i, value, contiguous=True)


def _partial(em: Emitter, spec: KernelSpec) -> None:
    """One block reduces ``CHUNK`` (``spec.chunk``) consecutive elements into ``ws[block]``.
    Each thread keeps ``UNROLL`` independent accumulators (loads in flight together, no serial
    FP add chain), then the block combines them. Reductions the source reads (``spec.values``:
    the mean inside a variance) are loaded once, before the loops. (Taking such a pass's
    chunks last to first, so that its first blocks find the previous pass's last chunks in L2,
    measured no faster: H200, variance of 1e8 float32, 0.204 against 0.203 ms.)

    With ``spec.outer`` leading dims of rows (:mod:`.rowsplit`), block ``row·P + p`` takes
    chunk ``p`` of row ``row`` (``P`` chunks per row; a row's last chunk may be short) and
    loads the row's values of the reductions its source reads."""
    b, m, g = em.b, em.module, em.graph
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    tid, bid = sreg(b, m, "tid"), sreg(b, m, "ctaid")
    ((ws, r),) = spec.outputs
    node = g.nodes[r]
    src = g.nodes[node.inputs[0]]
    kind, _ = node.attrs
    acc_dt = acc_dtype(kind, node.dtype)
    chunk = spec.chunk or CHUNK
    outer, inner = spec.shape[:spec.outer], spec.shape[spec.outer:]
    total = em.numel(inner)  # one row's length (the whole tensor: one row)
    row, part, row0, comps = ZERO, bid, None, ()
    if spec.outer:
        per = em.expr(cdiv(product(inner), chunk))
        row, part = b.udiv(bid, per), b.urem(bid, per)
        row0, comps = b.mul(row, total), em.unravel(row, outer)
    for red, val in spec.values:  # reductions the source reads, finished by a combine kernel
        em.rowcache[red] = (em.load(val, g.nodes[red].dtype, row), comps)
    start = b.mul(part, c(chunk))
    end_ = b.add(start, c(chunk))
    end = b.select(b.icmp_signed("<", end_, total), end_, total)
    accs = [em.acc_slots(acc_dt, identity(kind, acc_dt)) for _ in range(UNROLL)]

    def add(slots: tuple, j: ir.Value) -> None:
        ctx = Ctx(spec.shape, comps + em.unravel(j, inner), j if row0 is None else b.add(row0, j))
        v = convert(b, em.value(src.id, ctx), src.dtype, acc_dt)
        em.acc_store(slots, combine(em, kind, acc_dt, em.acc_load(slots, acc_dt), v))

    # A full chunk is a whole number of UNROLL·block strides: no bounds checks inside, so the
    # UNROLL loads of an iteration are all in flight together. The last chunk loops simply.
    with b.if_else(b.icmp_signed("<=", end_, total)) as (full, tail):
        with full:
            with em.loops.range(b.add(start, tid), end_, c(spec.block * UNROLL)) as i:
                em.push()
                for k, slots in enumerate(accs):
                    add(slots, b.add(i, c(k * spec.block)) if k else i)
                em.pop()
        with tail:
            with em.loops.range(b.add(start, tid), end, c(spec.block)) as i:
                em.push()
                add(accs[0], i)
                em.pop()
    acc = em.acc_load(accs[0], acc_dt)
    for slots in accs[1:]:
        acc = combine(em, kind, acc_dt, acc, em.acc_load(slots, acc_dt))
    acc = block_reduce(em, kind, acc_dt, acc, tid, spec.block)
    with b.if_then(b.icmp_unsigned("==", tid, ZERO)):
        em.store(ws, acc_dt, bid, acc)

