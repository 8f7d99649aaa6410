"""Register-held rows: each thread keeps ``slots`` 16-byte chunks of its row in registers.

The register schedule of :mod:`kernelpack.lowering.rows` (a mixin of its ``_Group``): every
element is loaded once (16-byte loads where the launch allows, :meth:`RegisterRows._prime`),
every intermediate is shared by the reduction passes and the outputs through the emitter's
value cache, and a division by a per-row value becomes one reciprocal per row. The tiled
loops (:mod:`.tiles`) reuse the 16-byte loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..dtypes import DType
from ..graph import Graph
from .codegen import ZERO, Ctx, Emitter
from .irutil import I1, I32, I64, Val, call_function, component, const_of, convert, storage_type, \
    to_compute, to_storage
from .mathops import combine, identity
from .schedule import KernelSpec, per_row
from .tuning import MIN_THREADS_PER_SM

__all__ = ["RegisterRows"]

GROUP_F32 = True  # float32 sums of a register row combine across the group in float32


class RegisterRows:
    """The register schedule (mixed into the row kernels' group)."""

    if TYPE_CHECKING:
        em: Emitter
        spec: KernelSpec
        g: Graph
        lane: ir.Value
        size: int
        levels: list[list[int]]

        def _acc(self, kind: str, dt: DType) -> DType: ...
        def _part(self, kind: str, dt: DType) -> DType: ...
        def _finish(self, r: int, acc: Val, outer: tuple[ir.Value, ...],
                    acc_dt: DType | None = None) -> None: ...

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
        # Whether element `lane0 + off` lies in the row. With 4 or more chunks per thread in a
        # kernel bounded for more resident threads than the default, as `length - lane0 >
        # off`: one value for every chunk, where `lane0 + off < length` had LLVM hoist a
        # 64-bit `lane0 + off` per chunk out of the row loop (float32 softmax, 32 per thread:
        # 114 -> 80 registers, so 3 rows per SM without spills at 768 resident threads;
        # H200 8192 x 8192 1.017 -> 1.007 of Triton, 8192 x 8190 1.13 -> 0.99). Elsewhere the
        # first form stays: layernorm's rows (the default bound) measured ~1% slower with the
        # second, and the warp groups (1-2 chunks) spilled 8 bytes more.
        lean = K >= 4 and self.spec.min_threads > MIN_THREADS_PER_SM
        rem = b.sub(length, lane0) if lean else None

        def in_row(j: ir.Value, off: int) -> ir.Value:
            if rem is None:
                return b.icmp_signed("<", j, length)
            return b.icmp_signed(">", rem, c(off))

        for s in range(K):
            if vector:
                first = b.add(lane0, c(s * G * V)) if s else lane0
                valid = in_row(first, s * G * V)
                ctxs = [ctx_of(b.add(first, c(k)) if k else first) for k in range(V)]
                chunks.append((valid, first, ctxs))
                elems += [(x, valid) for x in ctxs]
                continue
            for k in range(V):
                j = b.add(lane0, c(G * (s * V + k))) if s or k else lane0
                elems.append((ctx_of(j), in_row(j, G * (s * V + k))))
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
                if self._group_f32(kind, part_dt):
                    self._finish(red, vals[0], outer, part_dt)
                else:
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
            mag = call_function(b, "llvm.fabs.f32" if isinstance(t, ir.FloatType)
                                else "llvm.fabs.f64", t, [rcp])
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

    def _group_f32(self, kind: str, part_dt: DType) -> bool:
        """Whether a float32 sum's thread partials combine across the group in float32 too.

        A register row has at most 8192 elements: ≤ 32 per thread pairwise, then a butterfly
        over the warp and one pass over ≤ 16 warps: each term goes through at most ~30 float32
        roundings, the order of NumPy's pairwise float32 sum (1e-6 relative to the sum of
        magnitudes), where the float64 group combination cost two shuffles, a conversion and a
        float64 add per step (softmax 1024: 44 -> fewer registers, so more rows per SM)."""
        return GROUP_F32 and kind in ("sum", "mean") and part_dt.kind == "f" \
            and part_dt.itemsize == 4

    def _uniform_divisions(self, ctx: Ctx) -> list[tuple[int, ir.Value]]:
        """Float divisions in the outputs whose divisor is one value per row (built from this
        kernel's reductions, scalars and constants), with that value at ``ctx``."""
        g, em = self.g, self.em
        uniform = per_row(g, self.spec.reduces)  # the kernel's reductions count as per-row
        found: list[tuple[int, ir.Value]] = []
        for nid in sorted(g.reachable((nid for _, nid in self.spec.outputs),
                                      through=lambda n: not uniform(n))):
            node = g.nodes[nid]
            if (node.op == "div" and node.dtype.kind == "f" and uniform(node.inputs[1])
                    and g.nodes[node.inputs[1]].dtype == node.dtype):
                y = em.value(node.inputs[1], em.child_ctx(ctx, g.nodes[node.inputs[1]].shape))
                found.append((nid, y))
        return found

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
        em = self.em
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
