"""Row kernels: a group of threads (one thread, a warp, or a block) owns a row at a time.

For each row, the reductions are computed level by level — a level holds the reductions that
need no other reduction of this kernel (level 0), then those that need only level 0, and so
on — with every reduction of a level accumulated in the *same* pass over the row, so a masked
mean reads its row once and a softmax twice plus once for the output. Each value is then
combined across the group (shuffles, shared memory) and kept for the rest of the row.

With ``spec.slots = K`` the row is instead held in registers (:meth:`_Group.registers`): each
thread owns K chunks of ``spec.vec`` elements (16 bytes), computed once, straight-line, so the
emitter's value cache shares every load and intermediate between the reduction passes and the
output — one read and one write of the row. A launch takes 16-byte loads/stores when its
buffers are 16-byte aligned and rows a whole number of chunks, else coalesced scalars (one
uniform branch). Elements past the row's end are guarded: not loaded, masked out, not stored.
"""

from __future__ import annotations

from llvmlite import ir

from ..dtypes import DType, float32
from ..graph import Graph
from .codegen import ZERO, Ctx, Emitter, acc_dtype
from .groups import block_reduce, warp_reduce
from .irutil import (I1, I32, I64, Val, component, const_of, convert, sreg, storage_type,
                     to_compute, to_storage)
from .mathops import combine, finalize, identity
from .schedule import BLOCK, MIN_THREADS_PER_SM, WARP_ROWS, KernelSpec
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
    if spec.group == "thread":
        gid, lane, gstride, size = b.add(b.mul(bid, c(BLOCK)), tid), ZERO, b.mul(nb, c(BLOCK)), 1
    elif spec.group == "warp":
        gid = b.add(b.mul(bid, c(WARP_ROWS)), b.lshr(tid, c(5)))
        lane, gstride, size = b.and_(tid, c(31)), b.mul(nb, c(WARP_ROWS)), 32
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
    budget of that many resident threads per SM instead of taking ~250 registers."""
    ann = [("maxntidx", spec.block)]
    if spec.slots:
        ann.append(("minctasm", max(1, (spec.min_threads or MIN_THREADS_PER_SM) // spec.block)))
    for key, value in ann:
        em.module.add_named_metadata("nvvm.annotations", [
            em.fn, ir.MetaDataString(em.module, key), ir.Constant(I32, value)])


def _fabs(em: Emitter, t: ir.Type) -> ir.Function:
    name = "llvm.fabs.f32" if isinstance(t, ir.FloatType) else "llvm.fabs.f64"
    return em.module.globals.get(name) or ir.Function(em.module, ir.FunctionType(t, [t]), name)


class _Group:
    """The per-row work of one kernel; ``size`` threads cooperate, this one is ``lane``."""

    def __init__(self, em: Emitter, spec: KernelSpec, tid: ir.Value, lane: ir.Value,
                 size: int) -> None:
        self.em, self.spec, self.tid, self.lane, self.size = em, spec, tid, lane, size
        self.g = em.graph
        self.levels = levels(self.g, spec.reduces)
        self.overrides = {r: (ws, count) for r, ws, count in spec.partials}

    def _acc(self, kind: str, dt: DType) -> DType:
        """The accumulator dtype. A thread owns a row only for rows of at most
        ``THREAD_ROW_MAX`` elements: float32 sums and products of so few terms accumulate in
        float32, as NumPy's own float32 reductions do (no float64 conversion per element, a
        16/clk/SM instruction on sm_90; see notes/encoding-perf.md). Longer rows: float64."""
        if self.spec.group == "thread" and kind in ("sum", "mean", "prod") and dt.kind == "f":
            return dt if dt.itemsize >= 4 else float32
        return acc_dtype(kind, dt)

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

    def _finish(self, r: int, acc: Val, outer: tuple[ir.Value, ...]) -> None:
        """Combine ``acc`` across the group, finalize (mean), keep it for this row."""
        em, node = self.em, self.g.nodes[r]
        kind = node.attrs[0]
        acc_dt = self._acc(kind, node.dtype)
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
                    acc_dt = self._acc(node.attrs[0], node.dtype)
                    accs[red] = em.acc_slots(acc_dt, identity(node.attrs[0], acc_dt))
                if isinstance(key, tuple) and key and key[0] == "ws":
                    (red,) = reds
                    ws, count = self.overrides[red]
                    node = self.g.nodes[red]
                    acc_dt = self._acc(node.attrs[0], node.dtype)
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
                            acc_dt = self._acc(node.attrs[0], node.dtype)
                            v = convert(b, em.value(src.id, ctx), src.dtype, acc_dt)
                            em.acc_store(accs[red], combine(em, node.attrs[0], acc_dt,
                                                            em.acc_load(accs[red], acc_dt), v))
                        em.pop()
                for red in reds:
                    node = self.g.nodes[red]
                    acc_dt = self._acc(node.attrs[0], node.dtype)
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
    def registers(self, r: ir.Value, outer: tuple[ir.Value, ...], vector: bool) -> None:
        """The row held in registers: ``slots`` chunks of ``vec`` elements per thread, every
        element loaded once and every intermediate shared by the passes (value cache). Chunk
        ``s`` of lane ``l`` is ``c = l + s·G``: elements ``c·vec + k`` when ``vector`` (one
        16-byte load/store per chunk), else ``l + G·(s·vec + k)`` (coalesced scalars).
        Out-of-row elements are guarded: not loaded (a uniform branch per chunk, which ptxas
        turns into predicated loads off one row pointer with constant offsets; clamping the
        index instead made one 64-bit address per chunk, hoisted out of the row loop, and
        ~250 registers), masked out of reductions, never stored."""
        em, b = self.em, self.em.b
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        V, K, G = self.spec.vec, self.spec.slots, self.size
        shape = self.g.nodes[self.g.nodes[self.spec.reduces[0]].inputs[0]].shape
        inner = shape[len(self.spec.shape):]
        length = em.numel(inner)
        row0 = b.mul(r, length)
        chunks: list[tuple[ir.Value, ir.Value, list[Ctx]]] = []  # (valid, first index, ctxs)
        elems: list[tuple[Ctx, ir.Value]] = []
        ctx_of = lambda j: Ctx(shape, outer + em.unravel(j, inner), b.add(row0, j))  # noqa: E731
        lane0 = b.mul(self.lane, c(V)) if vector else self.lane
        for s in range(K):
            if vector:
                first = b.add(lane0, c(s * G * V)) if s else lane0
                valid = b.icmp_signed("<", first, length)
                ctxs = [ctx_of(b.add(first, c(k)) if k else first) for k in range(V)]
                chunks.append((valid, first, ctxs))
                elems += [(x, valid) for x in ctxs]
                continue
            for k in range(V):
                j = b.add(lane0, c(G * (s * V + k))) if s or k else lane0
                elems.append((ctx_of(j), b.icmp_signed("<", j, length)))
        primed: set[int] = set()
        for level in self.levels:
            if vector:
                self._prime([self.g.nodes[red].inputs[0] for red in level], chunks, primed)
            for red in level:
                node = self.g.nodes[red]
                src = self.g.nodes[node.inputs[0]]
                kind = node.attrs[0]
                part_dt = self._part(kind, node.dtype)
                ident = identity(kind, part_dt)
                vals = []
                for ctx, valid in elems:
                    em.guard = valid
                    v = convert(b, em.value(src.id, ctx), src.dtype, part_dt)
                    em.guard = None
                    vals.append(tuple(b.select(valid, p, q) for p, q in zip(v, ident))
                                if isinstance(v, tuple) else b.select(valid, v, ident))
                while len(vals) > 1:  # pairwise: short dependency chains, better rounding
                    vals = [combine(em, kind, part_dt, vals[i], vals[i + 1])
                            if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
                self._finish(red, convert(b, vals[0], part_dt, self._acc(kind, node.dtype)),
                             outer)
        if vector:
            self._prime([nid for _, nid in self.spec.outputs], chunks, primed)
        divs = self._uniform_divisions(elems[0][0])
        if not divs:
            self._outputs(r, outer, shape, vector, chunks, elems)
            return
        # x / y with y one value per row (softmax's e / sum): one division per row and a
        # multiply per element (<= 1 ulp more rounding) where 1/y is a normal float; the exact
        # division elsewhere (a per-row branch: huge or tiny y keep NumPy's result)
        ok: ir.Value = ir.Constant(I1, 1)
        recips = {}
        for nid, y in divs:
            t = y.type
            rcp = b.fdiv(ir.Constant(t, 1.0), y)
            mag = b.call(_fabs(em, t), [rcp])
            tiny = 2.0 ** -126 if isinstance(t, ir.FloatType) else 2.0 ** -1022
            big = 2.0 ** 126 if isinstance(t, ir.FloatType) else 2.0 ** 1022
            ok = b.and_(ok, b.and_(b.fcmp_ordered(">=", mag, ir.Constant(t, tiny)),
                                   b.fcmp_ordered("<=", mag, ir.Constant(t, big))))
            recips[nid] = rcp
        with b.if_else(ok) as (fast, exact):
            with fast:
                em.push()
                em.recips = recips
                self._outputs(r, outer, shape, vector, chunks, elems)
                em.recips = {}
                em.pop()
            with exact:
                em.push()
                self._outputs(r, outer, shape, vector, chunks, elems)
                em.pop()

    def _uniform_divisions(self, ctx: Ctx) -> list[tuple[int, ir.Value]]:
        """Float divisions in the outputs whose divisor is one value per row (built from this
        kernel's reductions, scalars and constants), with that value at ``ctx``."""
        g, em = self.g, self.em
        memo: dict[int, bool] = {}

        def uniform(nid: int) -> bool:
            if nid not in memo:
                node = g.nodes[nid]
                if node.op in ("scalar", "const", "dim") or nid in self.spec.reduces:
                    memo[nid] = True
                elif node.op in ("input", "iota", "reduce", "pad") or not node.inputs:
                    memo[nid] = False
                else:
                    memo[nid] = all(uniform(i) for i in node.inputs)
            return memo[nid]

        found: list[tuple[int, ir.Value]] = []
        seen: set[int] = set()
        stack = [nid for _, nid in self.spec.outputs]
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            node = g.nodes[nid]
            if nid in self.spec.reduces or uniform(nid):
                continue
            if (node.op == "div" and node.dtype.kind == "f" and uniform(node.inputs[1])
                    and g.nodes[node.inputs[1]].dtype == node.dtype):
                y = em.value(node.inputs[1], em.child_ctx(ctx, g.nodes[node.inputs[1]].shape))
                found.append((nid, y))
            stack.extend(node.inputs)
        return sorted(found, key=lambda t: t[0])

    def _outputs(self, r: ir.Value, outer: tuple[ir.Value, ...], shape: tuple,
                 vector: bool, chunks: list, elems: list) -> None:
        em, b = self.em, self.em.b
        row0 = b.mul(r, em.numel(shape[len(self.spec.shape):]))
        for name, nid in self.spec.outputs:
            out = self.g.nodes[nid]
            if out.shape != shape:  # a per-row result (shape outer + 1s): lane 0 writes it
                with b.if_then(b.icmp_unsigned("==", self.lane, ZERO)):
                    em.push()
                    ctx = Ctx(out.shape, outer + (ZERO,) * (len(out.shape) - len(outer)), r)
                    em.store(name, out.dtype, r, em.value(nid, ctx))
                    em.pop()
                continue
            if vector and not out.dtype.is_complex:
                for valid, base, ctxs in chunks:
                    em.guard = valid
                    vals = [em.value(nid, x) for x in ctxs]
                    em.guard = None
                    with b.if_then(valid):
                        self._vstore(name, out.dtype, b.add(row0, base), vals)
                continue
            for ctx, valid in elems:
                em.guard = valid
                v = em.value(nid, ctx)
                em.guard = None
                with b.if_then(valid):
                    em.store(name, out.dtype, ctx.linear, v)

    def _leaves(self, roots: list[int]) -> list[int]:
        """Input tensors ``roots`` read per element (the walk stops at this kernel's
        reductions, whose values are per row)."""
        seen: set[int] = set()
        stack, out = list(roots), []
        inside = set(self.spec.reduces)
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            node = self.g.nodes[nid]
            if node.op == "input":
                out.append(nid)
            elif nid not in inside or nid in roots:
                stack.extend(node.inputs)
        return sorted(out)

    def _prime(self, roots: list[int], chunks: list, primed: set[int]) -> None:
        """One 16-byte load per chunk for every input tensor ``roots`` read that is laid out
        like the row (offset = row index) or like the row's inner dims (a weight: offset =
        index within the row); its elements go to the value cache."""
        em, b = self.em, self.em.b
        shape = chunks[0][2][0].shape
        outer_n = len(self.spec.shape)
        for nid in self._leaves(roots):
            node = self.g.nodes[nid]
            if nid in primed or node.dtype.is_complex:
                continue
            if node.shape == shape:
                row_like = True
            elif (len(shape) - outer_n == 1 and 1 <= len(node.shape) <= len(shape)
                  and node.shape[-1] == shape[-1]
                  and all(d.is_const and d.value == 1 for d in node.shape[:-1])):
                row_like = False
            else:
                continue
            primed.add(nid)
            for valid, base, ctxs in chunks:
                off = ctxs[0].linear if row_like else base
                load = lambda: self._vload(node.attrs[0], node.dtype, off, len(ctxs))  # noqa: E731
                got = load() if valid is None else self._guarded(valid, node.dtype, len(ctxs), load)
                for k, v in enumerate(got):
                    em.prime(nid, em.child_ctx(ctxs[k], node.shape), v)

    def _guarded(self, cond: ir.Value, dt: DType, n: int, load) -> list[ir.Value]:  # type: ignore[no-untyped-def]
        """``load()`` (n values) where ``cond`` holds, zeros elsewhere."""
        em, b = self.em, self.em.b
        slots = [em.loops.alloca(component(dt)) for _ in range(n)]
        zero = const_of(dt, 0)
        for slot in slots:
            b.store(zero, slot)
        with b.if_then(cond):
            for slot, v in zip(slots, load()):
                b.store(v, slot)
        return [b.load(slot, typ=component(dt)) for slot in slots]

    def _vtype(self, buf: str, dt: DType, n: int) -> tuple[ir.Value, ir.VectorType, int]:
        self.em.touched.add(buf)
        st = storage_type(dt)
        ptr = self.em.buffers[buf][0]
        return ptr, ir.VectorType(st, n), min(16, n * dt.itemsize)

    def _vload(self, buf: str, dt: DType, offset: ir.Value, n: int) -> list[ir.Value]:
        b = self.em.b
        ptr, vt, align = self._vtype(buf, dt, n)
        gep = b.gep(ptr, [offset], inbounds=True, source_etype=vt.element)
        vec = b.load(gep, typ=vt, align=align)
        return [to_compute(b, b.extract_element(vec, ir.Constant(I32, k)), dt) for k in range(n)]

    def _vstore(self, buf: str, dt: DType, offset: ir.Value, vals: list) -> None:
        b = self.em.b
        ptr, vt, align = self._vtype(buf, dt, len(vals))
        vec: ir.Value = ir.Constant(vt, None)
        for k, v in enumerate(vals):
            vec = b.insert_element(vec, to_storage(b, v, dt), ir.Constant(I32, k))
        b.store(vec, b.gep(ptr, [offset], inbounds=True, source_etype=vt.element), align=align)
