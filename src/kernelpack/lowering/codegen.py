"""Expression codegen: the value of any graph node at a multi-index, as LLVM IR.

Every kernel schedule (:mod:`kernelpack.lowering.kernels`) reduces to "compute node N at index
(i0, i1, ...)". :meth:`Emitter.value` does that recursively: elementwise nodes compute their
inputs at the broadcast-mapped index, views remap axes, loads compute an offset (the flat
index itself when shapes agree, so plain pointwise kernels do no div/mod per input), and a
reduction either returns the value its schedule already computed for this row or loops over
the reduced indices itself (the general fallback). Dims are i64 kernel arguments; all index
math is 64-bit.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from llvmlite import ir

from ..dtypes import DType, complex64, complex128, float64, int64
from ..errors import CompileError
from ..expr import Expr
from ..graph import BINARY, COMPARE, UNARY, Graph, Node
from .bounds import int_max, shift_count_syms
from .irutil import I32, I64, Loops, Val, call_function, component, const_of, convert, \
    drop_unused_arguments, int_expr_op, parts_of, round_result, storage_type, to_compute
from .memory import Memory

__all__ = ["Ctx", "Emitter", "NotRowSchedulable", "acc_dtype", "ZERO"]

ZERO = ir.Constant(I64, 0)
# ops whose inputs are computed at the same index (child_ctx): the bottom-up pass of deep
# chains (Emitter._inputs_first) walks these; past _DEEP nested value() calls it takes over
_ELEMENTWISE = frozenset(UNARY) | frozenset(BINARY) | {"cast", "where"}
_DEEP = 48
_LIBM = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
         "floor", "ceil"}


class NotRowSchedulable(Exception):
    """A reduction cached per row was read at another row (``d[None, :]`` of a row sum
    ``d``): the pipeline computes that reduction into a workspace first
    (:func:`.materialize.materialize_nodes`), or, failing that, schedules the stage general."""

    def __init__(self, node: int) -> None:
        super().__init__(f"reduction {node} read at another row")
        self.node = node
        self.kernel: str | None = None  # the kernel being emitted (set by the pipeline)


class Ctx(NamedTuple):
    """Where a value is computed: the node's shape, one i64 index per axis, and the flat
    row-major index when it is known (None after a broadcast)."""

    shape: tuple[Expr, ...]
    comps: tuple[ir.Value, ...]
    linear: ir.Value | None


def acc_dtype(kind: str, dt: DType) -> DType:
    """Reductions of narrow floats accumulate in float64 (NumPy-level accuracy for long rows)."""
    if kind in ("sum", "mean", "prod") and dt.kind == "f" and dt.itemsize < 8:
        return float64
    if kind in ("sum", "mean", "prod") and dt.kind == "c" and dt.itemsize == 8:
        return dt  # complex64 stays (the fallback loop widens it: _reduce)
    return dt


def _same(a: ir.Value, b: ir.Value) -> bool:
    if a is b:
        return True
    return (isinstance(a, ir.Constant) and isinstance(b, ir.Constant)
            and a.constant == b.constant)


class Emitter(Memory):
    """Builds one kernel function. ``buffers``/``scalars`` are the kernel's pointer and value
    parameters (name, dtype) in order; ``symbols`` the i64 dim parameters that follow."""

    def launch_bounds(self, threads: int, blocks_per_sm: int = 0) -> None:
        """``__launch_bounds__(threads, blocks_per_sm)`` as NVVM annotations (LLVM emits
        ``.maxntid`` and, when ``blocks_per_sm`` is given, ``.minnctapersm``): what ptxas may
        assume about the block, and how many blocks per SM its register budget must allow."""
        ann = [("maxntidx", threads)] + ([("minctasm", blocks_per_sm)] if blocks_per_sm else [])
        for key, value in ann:
            self.module.add_named_metadata("nvvm.annotations", [
                self.fn, ir.MetaDataString(self.module, key), ir.Constant(I32, value)])

    def __init__(self, module: ir.Module, graph: Graph, name: str,
                 buffers: Sequence[tuple[str, DType]], scalars: Sequence[tuple[str, DType]],
                 symbols: Sequence[str]) -> None:
        self.module, self.graph = module, graph
        # Scalars are declared in their *storage* type (half, bf16 bits, i8 for bool): the
        # runtime packs each one with the width of its summary dtype, so the two must agree.
        types = [ir.PointerType()] * len(buffers) + [storage_type(d) for _, d in scalars] \
            + [I64] * len(symbols)
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), types), name)
        self.fn.calling_convention = "ptx_kernel"
        args = list(self.fn.args)
        self.buffers = {n: (a, d) for (n, d), a in zip(buffers, args)}
        self.scalars = {n: (a, d) for (n, d), a in zip(scalars, args[len(buffers):])}
        self.dims = dict(zip(symbols, args[len(buffers) + len(scalars):]))
        for arg, (n, _) in zip(args, list(buffers) + list(scalars)):
            arg.name = n
        for n, a in self.dims.items():
            a.name = "dim_" + n
        entry = self.fn.append_basic_block("entry")
        self.body = self.fn.append_basic_block("body")
        self.entry = ir.IRBuilder(entry)
        self.b = ir.IRBuilder(self.body)
        self.loops = Loops(self.b, self.entry)
        self.scopes: list[dict] = [{}]
        self.exprs: dict[Expr, ir.Value] = {}
        self.rowcache: dict[int, tuple[Val, tuple[ir.Value, ...]]] = {}
        # reduction -> workspace of its shape holding its values (a pointwise kernel after
        # the kernel that reduced them, lowering/longrows.py): loaded, not recomputed
        self.stored: dict[int, str] = {}
        self.uses_libdevice = False
        self.scalars = {n: (to_compute(self.entry, a, d), d) for n, (a, d) in self.scalars.items()}
        self.vec_lane: int | None = None  # lane within a 16-byte group (vectorized loops)
        self.vec_lanes = 1  # elements per such group (16 bytes of the widest dtype)
        self.touched: set[str] = set()    # buffers accessed as 16-byte groups
        self.guard: ir.Value | None = None  # i1: loads happen only where it holds (else 0)
        self.recips: dict[int, ir.Value] = {}  # div node id -> 1/divisor (row-uniform divisor)
        self.aligned: dict[tuple, ir.Value] = {}  # (buffer, size) -> i1 alignment check
        self.shift_syms = shift_count_syms(graph)  # dims known to be in 0..63
        self.splits: dict[int, tuple[ir.Value, ir.Value, int]] = {}  # see split_index
        self.depth = 0  # nested value() calls (see _inputs_first)
        for n, (a, d) in self.buffers.items():
            a.add_attribute("noalias")

    def split_index(self, base: ir.Value, offset: int) -> ir.Value:
        """``base + offset`` (i64, ``base >= 0``), recorded so that a shift by it is emitted
        as a shift by ``base`` and then by the constant ``offset`` (equal for in-range
        counts): unrolled terms share the first shift and test constant bits
        (:mod:`.threadrows`)."""
        j = base if not offset else self.b.add(base, ir.Constant(I64, offset))
        self.splits[id(j)] = (j, base, offset)
        return j

    def finish(self) -> None:
        """Close the function and remove the buffer parameters its body never uses
        (:func:`~.irutil.drop_unused_arguments`); :attr:`buffers` keeps the others, in
        parameter order, which the summary's launch arguments follow."""
        self.entry.branch(self.body)
        self.b.ret_void()
        dropped = drop_unused_arguments(self.fn, [a for a, _ in self.buffers.values()])
        if dropped:
            gone = {id(a) for a in dropped}
            self.buffers = {n: v for n, v in self.buffers.items() if id(v[0]) not in gone}

    # ---- integer expressions over dims (emitted once, in the entry block) ---------------------
    def expr(self, e: Expr) -> ir.Value:
        hit = self.exprs.get(e)
        if hit is not None:
            return hit
        b = self.entry
        if e.op == "const":
            out: ir.Value = ir.Constant(I64, int(e.value))  # type: ignore[arg-type]
        elif e.op == "sym":
            if e.value not in self.dims:
                raise CompileError(f"dim {e.value!r} is not bound by any input tensor shape")
            out = self.dims[e.value]  # type: ignore[index]
        else:
            a = [self.expr(x) for x in e.args]
            out = int_expr_op(b, e.op, a)
        self.exprs[e] = out
        return out

    def numel(self, shape: Sequence[Expr]) -> ir.Value:
        total: Expr | int = 1
        for d in shape:
            total = total * d
        return self.expr(total if isinstance(total, Expr) else Expr("const", (), total))

    def unravel(self, i: ir.Value, shape: Sequence[Expr]) -> tuple[ir.Value, ...]:
        comps: list[ir.Value] = []
        rest = i
        for d in reversed(shape[1:]):
            if d.is_const and d.value == 1:
                comps.append(ZERO)
                continue
            dv = self.expr(d)
            comps.append(self.b.urem(rest, dv))
            rest = self.b.udiv(rest, dv)
        if shape:
            comps.append(ZERO if shape[0].is_const and shape[0].value == 1 else rest)
        return tuple(reversed(comps))

    def ravel(self, comps: Sequence[ir.Value], shape: Sequence[Expr]) -> ir.Value:
        off: ir.Value = ZERO
        for c, d in zip(comps, shape):
            if d.is_const and d.value == 1:
                continue
            off = self.b.add(self.b.mul(off, self.expr(d)), c) if off is not ZERO else c
        return off

    # ---- node values -------------------------------------------------------------------------
    def push(self) -> None:
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def child_ctx(self, ctx: Ctx, shape: tuple[Expr, ...]) -> Ctx:
        if shape == ctx.shape:
            return ctx
        r, rc = len(ctx.shape), len(shape)
        comps = tuple(ZERO if d.is_const and d.value == 1 else ctx.comps[r - rc + k]
                      for k, d in enumerate(shape))
        return Ctx(shape, comps, None)

    @staticmethod
    def _key(nid: int, ctx: Ctx) -> tuple:
        return (nid, tuple(id(c) for c in ctx.comps), id(ctx.linear))

    def prime(self, nid: int, ctx: Ctx, v: Val) -> None:
        """Record ``v`` as node ``nid``'s value at ``ctx`` in the current scope (the row
        schedules load 16-byte groups themselves and hand the elements to :meth:`value`)."""
        self.scopes[-1][self._key(nid, ctx)] = v
        self.scopes[-1][("keep", nid, id(ctx))] = ctx  # keeps the ids in the key alive

    def _cached(self, key: tuple) -> bool:
        return any(key in scope for scope in self.scopes)

    def value(self, nid: int, ctx: Ctx) -> Val:
        key = self._key(nid, ctx)
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        node = self.graph.nodes[nid]
        if self.depth >= _DEEP and node.op in _ELEMENTWISE:
            self._inputs_first(node, ctx)
        self.depth += 1
        try:
            out = self._compute(node, ctx)
        finally:
            self.depth -= 1
        self.scopes[-1][key] = out
        return out

    def _inputs_first(self, root: Node, ctx: Ctx) -> None:
        """Compute the elementwise subgraph below ``root`` bottom-up, in the order the recursion
        of :meth:`value` would (each input's subgraph in full, inputs in order), so that
        computing ``root`` then finds its inputs cached. Without it a chain of ~250 dependent
        operations (a long polynomial) exhausted Python's recursion limit: four frames per
        node. Only reached past :data:`_DEEP` nested calls, so ordinary fusions emit the same
        IR as before; other nodes (views, pads, reductions, loads) are computed where they
        occur and recurse on their own."""
        order: list[tuple[int, Ctx]] = []
        expanded: set[tuple] = set()
        emitted: set[tuple] = set()
        stack: list[tuple[Node, Ctx, bool]] = [(root, ctx, False)]
        while stack:
            node, c, done = stack.pop()
            key = self._key(node.id, c)
            if done:
                if key not in emitted and node is not root:
                    emitted.add(key)
                    order.append((node.id, c))
                continue
            if key in expanded:
                continue
            expanded.add(key)
            stack.append((node, c, True))
            for i in reversed(node.inputs):
                child = self.graph.nodes[i]
                cc = self.child_ctx(c, child.shape)
                if not self._cached(self._key(i, cc)):
                    stack.append((child, cc, child.op not in _ELEMENTWISE))
        for nid, c in order:
            self.value(nid, c)

    def operand(self, nid: int, ctx: Ctx, dt: DType) -> Val:
        node = self.graph.nodes[nid]
        return convert(self.b, self.value(nid, self.child_ctx(ctx, node.shape)), node.dtype, dt)

    def _compute(self, node: Node, ctx: Ctx) -> Val:
        op, dt, b = node.op, node.dtype, self.b
        if op == "input":
            if ctx.linear is not None:
                load = lambda: self.load(node.attrs[0], dt, ctx.linear, contiguous=True)  # noqa: E731
            else:
                off = self.ravel(ctx.comps, node.shape)
                load = lambda: self.load(node.attrs[0], dt, off)  # noqa: E731
            return load() if self.guard is None else self.guarded(dt, load)
        if op == "scalar":
            return self.scalars[node.attrs[0]][0]
        if op == "const":
            return const_of(dt, node.attrs[0])
        if op == "dim":
            return convert(b, self.expr(node.attrs[0]), int64, dt)
        if op == "iota":
            return convert(b, ctx.comps[node.attrs[0]], int64, dt)
        if op == "cast":
            return self.operand(node.inputs[0], ctx, dt)
        if op == "view":
            (mapping,) = node.attrs
            src = self.graph.nodes[node.inputs[0]]
            comps = [ZERO] * len(src.shape)
            for out_axis, in_axis in enumerate(mapping):
                if in_axis is not None:
                    comps[in_axis] = ctx.comps[out_axis]
            return self.value(src.id, Ctx(src.shape, tuple(comps), ctx.linear))
        if op == "where":
            c = self.operand(node.inputs[0], ctx, node_dtype(self.graph, node.inputs[0]))
            x, y = (self.operand(i, ctx, dt) for i in node.inputs[1:])
            if dt.is_complex:
                return (b.select(c, x[0], y[0]), b.select(c, x[1], y[1]))
            return b.select(c, x, y)
        if op == "pad":
            return self._pad(node, ctx)
        if op == "reduce":
            return self._reduce(node, ctx)
        from .mathops import binary, unary

        if len(node.inputs) == 1:
            src = self.graph.nodes[node.inputs[0]]
            in_dt = src.dtype if op in ("real", "imag", "abs") else dt
            return round_result(b, unary(self, op, self.operand(src.id, ctx, in_dt), in_dt, dt),
                                op, dt)
        da, db_ = (node_dtype(self.graph, i) for i in node.inputs)
        common = operand_dtype(op, da, db_, dt)
        if op == "div" and node.id in self.recips:  # x / (per-row y) as x · (1/y): see rows
            return round_result(b, b.fmul(self.operand(node.inputs[0], ctx, common),
                                          self.recips[node.id]), op, dt)
        x, y = (self.operand(i, ctx, common) for i in node.inputs)
        if op in ("shl", "shr") and common.kind in "iu":
            top = self.int_max(node.inputs[1])
            exact = top is not None and top < 8 * common.itemsize
            split = self.splits.get(id(y)) if exact else None
            if split is not None and split[0] is y and split[2]:
                x = binary(self, op, x, split[1], common, count_in_range=True)
                y = ir.Constant(y.type, split[2])
            return binary(self, op, x, y, common, count_in_range=exact)
        return round_result(b, binary(self, op, x, y, common), op, dt)

    def int_max(self, nid: int) -> int | None:
        """An upper bound of integer node ``nid``'s values where they are known to be >= 0."""
        return int_max(self.graph, nid, self.shift_syms)

    def guarded(self, dt: DType, load) -> Val:  # type: ignore[no-untyped-def]
        """``load()`` where ``self.guard`` holds, zero elsewhere (register-cached rows
        compute a few slots past the row's end)."""
        return self.zero_unless(self.guard, dt, load)

    def zero_unless(self, cond: ir.Value, dt: DType, compute) -> Val:  # type: ignore[no-untyped-def]
        """``compute()`` emitted under ``if cond`` (its values stay inside), zero otherwise."""
        b = self.b
        zero = const_of(dt, 0)
        parts = parts_of(zero)
        slots = [self.loops.alloca(component(dt)) for _ in parts]
        for s, z in zip(slots, parts):
            b.store(z, s)
        with b.if_then(cond):
            self.push()
            v = compute()
            for s, p in zip(slots, parts_of(v)):
                b.store(p, s)
            self.pop()
        loaded = tuple(b.load(s, typ=component(dt)) for s in slots)
        return loaded if dt.is_complex else loaded[0]

    def _pad(self, node: Node, ctx: Ctx) -> Val:
        (axis,) = node.attrs
        src = self.graph.nodes[node.inputs[0]]
        inside = self.b.icmp_signed("<", ctx.comps[axis], self.expr(src.shape[axis]))
        return self.zero_unless(inside, node.dtype,
                                lambda: self.value(src.id, Ctx(src.shape, ctx.comps, None)))

    def _reduce(self, node: Node, ctx: Ctx) -> Val:
        if node.id in self.rowcache:
            val, outer = self.rowcache[node.id]
            if not all(_same(a, c) for a, c in zip(ctx.comps[:len(outer)], outer)):
                raise NotRowSchedulable(node.id)
            return val
        if node.id in self.stored:
            return self.load(self.stored[node.id], node.dtype, self.ravel(ctx.comps, node.shape))
        kind, axes = node.attrs
        src = self.graph.nodes[node.inputs[0]]
        dims = [src.shape[a] for a in axes]
        acc_dt = acc_dtype(kind, node.dtype)
        if acc_dt is complex64 and kind in ("sum", "mean"):
            # one thread sums the whole axis: in complex64 even a compensated sum of 1e6
            # terms drifted 6e-5 (its compensation term's own rounding), 1e-2 without
            acc_dt = complex128
        from .mathops import combine, fabs, finalize, identity, neumaier_add

        slots = self.acc_slots(acc_dt, identity(kind, acc_dt))
        # One thread runs the whole reduction here, in order: a float sum carries Neumaier's
        # compensation, or a sum of 1e5 float64 terms drifted past 1e-12 of NumPy's pairwise
        # one (GPU fuzz seed 3349). Only this fallback loop pays for it.
        # (a complex sum per part)
        compensated = kind in ("sum", "mean") and acc_dt.kind in "fc"
        zero = ir.Constant(component(acc_dt), 0.0)
        comp = self.acc_slots(acc_dt, (zero, zero) if acc_dt.is_complex else zero) \
            if compensated else ()
        self.push()
        with self.loops.range(ZERO, self.numel(dims), ir.Constant(I64, 1), "r") as k:
            comps = list(ctx.comps)
            for a, c in zip(axes, self.unravel(k, dims)):
                comps[a] = c
            v = convert(self.b, self.value(src.id, Ctx(src.shape, tuple(comps), None)),
                        src.dtype, acc_dt)
            if compensated:
                for sum_slot, comp_slot, part in zip(slots, comp, parts_of(v)):
                    neumaier_add(self.b, sum_slot, comp_slot, part)
            else:
                self.acc_store(slots, combine(self, kind, acc_dt, self.acc_load(slots, acc_dt),
                                              v))
        self.pop()
        total = self.acc_load(slots, acc_dt)
        if compensated:  # an infinite term makes the compensation NaN: the plain sum then
            parts = []
            for t, c in zip(parts_of(total), parts_of(self.acc_load(comp, acc_dt))):
                finite = self.b.fcmp_ordered("<", fabs(self.b, c),
                                             ir.Constant(c.type, float("inf")))
                parts.append(self.b.select(finite, self.b.fadd(t, c), t))
            total = tuple(parts) if acc_dt.is_complex else parts[0]
        return convert(self.b, finalize(self, kind, acc_dt, total, self.numel(dims)), acc_dt,
                       node.dtype)

    # accumulators in entry-block allocas (SROA makes them registers)
    def acc_slots(self, dt: DType, init: Val) -> tuple[ir.Value, ...]:
        parts = parts_of(init)
        slots = tuple(self.loops.alloca(component(dt)) for _ in parts)
        for s, p in zip(slots, parts):
            self.b.store(p, s)
        return slots

    def acc_load(self, slots: tuple[ir.Value, ...], dt: DType) -> Val:
        vals = tuple(self.b.load(s, typ=component(dt)) for s in slots)
        return vals if dt.is_complex else vals[0]

    def acc_store(self, slots: tuple[ir.Value, ...], v: Val) -> None:
        for s, p in zip(slots, parts_of(v)):
            self.b.store(p, s)

    def libcall(self, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
        if name.startswith("__nv_"):
            self.uses_libdevice = True
        return call_function(self.b, name, ret, list(args))


def node_dtype(graph: Graph, nid: int) -> DType:
    return graph.nodes[nid].dtype


_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def operand_dtype(op: str, da: DType, db: DType, out: DType) -> DType:
    """The dtype both operands are converted to before ``op``."""
    if op == "complex":
        return out.real
    if op in COMPARE or op in ("and", "or", "xor"):
        if da == db:
            return da
        return da if _RANK[da.kind] >= _RANK[db.kind] else db
    return out
