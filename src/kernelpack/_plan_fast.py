"""The planner's fast path: a summary compiled into straight-line register code.

Every distinct expression node of the summary gets one register; constants are preloaded in
a template, bound symbols are written by the call's shapes and scalars, and each other node is
one step ``regs[out] = op(regs[a], regs[b], regs[c])`` with a checked int64 operator (data and
plain functions, never generated source). Steps are grouped so that a call computes only what
its path needs: the common part (deferred dims, constraints, computed scalars), then each
variant predicate in turn until one holds, then the chosen variant's allocations and launches.
A variant's allocations and launches are compiled when it is first chosen (under a lock;
registers added then are appended to the template, and a call that copied the template
earlier extends its copy), so building the planner of a many-variant program stays cheap.

The fast path never raises and never decides an error: :func:`compile_fast` returns a function
that gives a :class:`~kernelpack._plan_types.Plan` when every check passes, else ``None``, and
the caller then asks the reference planner (:mod:`kernelpack._plan_ref`), which defines the
results and words every error. Because operators are pure, evaluating a node eagerly (both
branches of a ``select``, a later variant's predicate) can only cause such a hand-over, never a
different answer. What the fast path does not handle (repeated launches, a symbol nothing binds)
is always handed over.
"""

from __future__ import annotations

import operator
import threading
from types import MappingProxyType as proxy
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from ._plan_types import (MAX_BLOCK_THREADS, MAX_GRID_X, MAX_GRID_YZ, NO_COMPUTED, Allocation,
                          Plan, PlannedLaunch, dtype_range, tensors_first)
from ._plan_ops import OPS as _OPS
from .dtypes import is_numpy_bool, strict_index
from .expr import INT64_MAX, Expr, sym
from .limits import MAX_EXPR_DEPTH
from .summary import KernelSummary, Scalar, Tensor

__all__ = ["compile_fast", "symbols_read"]

if TYPE_CHECKING:  # type aliases only: subscripting ``Callable`` costs a few hundred µs of
    # a process's first call when it runs at import
    FastPlan = Callable[[Sequence[Sequence[int]], Sequence[Any]], Optional[Plan]]
    Step = tuple[Callable[[int, int, int], int], int, int, int, int]

_ERRORS = (ArithmeticError, TypeError)


_PENDING = object()  # a variant body not compiled yet


class _Unsupported(Exception):
    """This part of the summary is left to the reference planner."""


class _Registers:
    """Register allocation and step emission, one register per distinct node."""

    def __init__(self, bound: list[str]) -> None:
        self.template: list[Any] = [None] * len(bound)
        self.memo: dict[Expr, int] = {sym(name): i for i, name in enumerate(bound)}
        self.consts: set[int] = set()
        self.leaves: set[int] = set(range(len(bound)))  # registers that are always set

    def fresh(self, value: Any = None) -> int:
        self.template.append(value)
        return len(self.template) - 1

    def emit(self, expr: Expr, done: set[int], steps: list[Step]) -> int:
        """The register of ``expr``, appending steps for nodes not yet in ``done``."""
        try:
            return self._emit(expr, done, steps)
        except RecursionError:  # a very deep tree: left to the reference planner
            raise _Unsupported("deep expression") from None

    def _emit(self, expr: Expr, done: set[int], steps: list[Step]) -> int:
        reg = self.memo.get(expr)
        if reg is not None and (reg in done or reg in self.leaves):
            return reg
        op = expr.op
        if op == "const":
            reg = self.memo[expr] = self.fresh(int(expr.value))  # type: ignore[arg-type]
            self.consts.add(reg)
            self.leaves.add(reg)
            return reg
        if op == "sym":  # a loop symbol, or one nothing binds
            raise _Unsupported(str(expr.value))
        args = [self._emit(a, done, steps) for a in expr.args]
        if reg is None:
            reg = self.memo[expr] = self.fresh()
        args += [args[-1]] * (3 - len(args))
        steps.append((_OPS[op], reg, *args))  # type: ignore[arg-type]
        done.add(reg)
        return reg

    def value(self, reg: int) -> int | None:
        return self.template[reg] if reg in self.consts else None


def _block_ok(bx: int, by: int, bz: int, smem: int) -> bool:
    return (1 <= bx <= 1024 and 1 <= by <= 1024 and 1 <= bz <= 64
            and bx * by * bz <= MAX_BLOCK_THREADS and 0 <= smem < (1 << 32))


def _grid_ok(gx: int, gy: int, gz: int) -> bool:
    return 0 <= gx <= MAX_GRID_X and 0 <= gy <= MAX_GRID_YZ and 0 <= gz <= MAX_GRID_YZ


def _allocation(r: _Registers, done: set[int], steps: list[Step], name: str, kind: str,
                dtype: Any, shape: Sequence[Expr], zero: bool) -> tuple:
    regs = tuple(r.emit(d, done, steps) for d in shape)
    values = [r.value(x) for x in regs]
    static = None
    if all(v is not None for v in values):
        nbytes = dtype.itemsize
        for v in values:
            if v < 0:  # type: ignore[operator]
                raise _Unsupported("negative shape")  # the reference raises it
            nbytes *= v  # type: ignore[operator]
        if nbytes > INT64_MAX:
            raise _Unsupported("too large")
        static = Allocation(name, kind, dtype, tuple(values), nbytes, zero)  # type: ignore[arg-type]
    return (name, static, kind, dtype, regs, zero, dtype.itemsize)


def _launch(r: _Registers, done: set[int], steps: list[Step], ln: Any, index: int) -> tuple:
    if ln.count is not None:
        raise _Unsupported("repeated launch")
    grid = tuple(r.emit(g, done, steps) for g in ln.grid)
    dyn = tuple(r.emit(e, done, steps) for e in (*ln.block, ln.shared_mem))
    block_values = [r.value(x) for x in dyn]
    block: Any = None
    if all(v is not None for v in block_values):
        if not _block_ok(*block_values):  # type: ignore[arg-type]
            raise _Unsupported("block")
        block, dyn = (tuple(block_values[:3]), block_values[3]), None  # type: ignore[assignment]
    args: Any = tuple((a.kind, a.name) for a in ln.args)
    values: list[tuple] = []
    for a in ln.args:
        if a.kind == "value":
            lo, hi = dtype_range(a.dtype)
            values.append((None, r.emit(a.value, done, steps), a.dtype, lo, hi))
        else:
            values.append(((a.kind, a.name), 0, None, 0, 0))
    if values and any(v[0] is None for v in values):
        args = tuple(values)
        value_args = True
    else:
        value_args = False
    static = None
    consts = [r.value(x) for x in grid] + [r.value(v[1]) for v in values if v[0] is None]
    if block is not None and all(v is not None for v in consts):
        if not _grid_ok(*consts[:3]):  # type: ignore[arg-type]
            raise _Unsupported("grid")
        planned_args = args
        if value_args:
            planned_args = []
            for fixed, reg, dtype, lo, hi in values:
                if fixed is None:
                    v = r.value(reg)
                    if not lo <= v <= hi:  # type: ignore[operator]
                        raise _Unsupported("value argument")
                    planned_args.append(("value", v, dtype))
                else:
                    planned_args.append(fixed)
            planned_args = tuple(planned_args)
        static = PlannedLaunch(ln.kernel, ln.module, tuple(consts[:3]), block[0],  # type: ignore[arg-type]
                               block[1], planned_args, index)
    return (static, ln.kernel, ln.module, *grid, block, dyn, value_args, args, index)


def _expressions(s: KernelSummary) -> list[Expr]:
    """Every expression of the summary (tensor dims included)."""
    exprs = [d for p in s.params if isinstance(p, Tensor) for d in p.shape]
    exprs += [p.value for p in s.params if isinstance(p, Scalar) and p.value is not None]
    exprs += [c.predicate for c in s.constraints]
    for v in s.variants:
        exprs += [v.predicate] if v.predicate is not None else []
        exprs += [d for sc in v.scratch for d in sc.shape]
        for ln in v.launches:
            exprs += ln.expressions()
    return exprs


def symbols_read(summary: KernelSummary) -> set[str]:
    """The symbols some expression of ``summary`` reads, a tensor's dim included. A caller's
    integer scalar outside this set (a seed, a flag the kernel alone reads) changes nothing in
    a plan but its own entry in ``Plan.symbols``: it may take uint64's full range, and the
    runtime's launch caches need not tell its values apart."""
    read: set[str] = set()
    for e in _expressions(summary):
        read |= e.symbols()
    return read


def compile_fast(summary: KernelSummary) -> FastPlan | None:
    """The fast plan function of ``summary`` (see module docstring), or None when every call
    must go to the reference planner."""
    s = summary
    exprs = _expressions(s)
    # Nested deeper than the format allows: the reference planner cannot encode it
    # (ValueError), so no call may get a plan here either.
    if any(e._depth > MAX_EXPR_DEPTH for e in exprs):
        return None
    read: set[str] = set()  # symbols some expression reads: their values must be int64
    if any(isinstance(p, Scalar) and dtype_range(p.dtype)[1] > INT64_MAX for p in s.inputs):
        read = symbols_read(s)  # (only a uint64 scalar can exceed int64)
    bound = s.bound_symbols()
    r = _Registers(bound)
    index = {name: i for i, name in enumerate(bound)}
    origin: set[str] = set()
    tensors: list[tuple[tuple[int, Any], ...]] = []
    sym_scalars: list[tuple[int, int, int, int, bool]] = []
    deferred_exprs: list[tuple[int, Expr]] = []
    nscalars = 0
    for p in tensors_first(s.inputs):  # as the reference planner decides origins
        if isinstance(p, Tensor):
            dims: list[tuple[int, Any]] = []
            for d in p.shape:
                if d.is_sym and d.value not in origin:
                    origin.add(d.value)  # type: ignore[arg-type]
                    dims.append((0, index[d.value]))  # type: ignore[index]
                elif d.is_sym:
                    dims.append((1, index[d.value]))  # type: ignore[index]
                elif d.is_const:
                    dims.append((2, int(d.value)))  # type: ignore[arg-type]
                else:
                    actual = r.fresh()
                    dims.append((3, actual))
                    deferred_exprs.append((actual, d))
            tensors.append(tuple(dims))
        else:
            if p.is_symbol:
                lo, hi = dtype_range(p.dtype)
                if p.name in read:  # a uint64 above INT64_MAX: the reference's error
                    hi = min(hi, INT64_MAX)
                sym_scalars.append((nscalars, index[p.name], lo, hi, p.name in origin))
                origin.add(p.name)
            nscalars += 1
    steps_a: list[Step] = []
    done: set[int] = set()
    try:
        deferred = tuple((actual, r.emit(d, done, steps_a)) for actual, d in deferred_exprs)
        constraints = tuple(r.emit(c.predicate, done, steps_a) for c in s.constraints)
        computed = []
        for p in s.params:
            if isinstance(p, Scalar) and p.value is not None:
                computed.append((p.name, r.emit(p.value, done, steps_a), *dtype_range(p.dtype)))
        variants = []
        dones = []
        for v in s.variants:
            pred_steps: list[Step] = []
            pred = r.emit(v.predicate if v.predicate is not None else Expr._node("const", (), 1),
                          done, pred_steps)
            variants.append((tuple(pred_steps), pred))
            dones.append(frozenset(done))
    except _Unsupported:
        return None
    lock = threading.Lock()
    bodies: list[Any] = [_PENDING] * len(variants)

    def body(vi: int) -> Any:
        """Variant ``vi``'s allocations and launches, compiled when first chosen (a program
        may have many variants; a process usually runs few of them)."""
        with lock:
            if bodies[vi] is _PENDING:
                v = s.variants[vi]
                vdone, steps_b = set(dones[vi]), []  # type: ignore[var-annotated]
                try:
                    allocs = [_allocation(r, vdone, steps_b, t.name, "output", t.dtype,
                                          t.shape, t.zero_init) for t in s.outputs]
                    allocs += [_allocation(r, vdone, steps_b, sc.name, "scratch", sc.dtype,
                                           sc.shape, sc.zero_init) for sc in v.scratch]
                    launches = [_launch(r, vdone, steps_b, ln, li)
                                for li, ln in enumerate(v.launches)]
                    bodies[vi] = (len(r.template), tuple(steps_b), tuple(allocs),
                                  tuple(launches))
                except _Unsupported:
                    bodies[vi] = None
            return bodies[vi]

    return _make_run(s.name, len(tensors), nscalars, tuple(tensors), tuple(sym_scalars),
                     tuple(steps_a), deferred, constraints, tuple(computed), tuple(variants),
                     bodies, body, tuple(bound), r.template)


def _make_run(name: str, ntensors: int, nscalars: int, tensors: tuple, sym_scalars: tuple,
              steps_a: tuple, deferred: tuple, constraints: tuple, computed: tuple,
              variants: tuple, bodies: list, build: Callable[[int], Any], bound: tuple,
              template: list) -> FastPlan:
    index = operator.index
    strict = strict_index
    numpy_bool = is_numpy_bool
    tnew = tuple.__new__
    errors = _ERRORS
    lmax = INT64_MAX
    one_symbol = len(bound) == 1
    pending = _PENDING
    no_computed = NO_COMPUTED

    def run(shapes: Sequence[Sequence[int]], scalars: Sequence[Any]) -> Plan | None:
        if len(shapes) != ntensors or len(scalars) != nscalars:
            return None
        regs = template.copy()
        for dims, shape in zip(tensors, shapes):
            if len(shape) != len(dims):
                return None
            for (kind, a), d in zip(dims, shape):
                if d.__class__ is not int:
                    try:  # a bool (Python's or NumPy's) is refused by the reference
                        d = strict(d)
                    except TypeError:
                        return None
                if d < 0 or d > lmax:
                    return None
                if kind == 0 or kind == 3:
                    regs[a] = d
                elif kind == 1:
                    if regs[a] != d:
                        return None
                elif a != d:
                    return None
        for pos, reg, lo, hi, same in sym_scalars:
            v = scalars[pos]
            if v.__class__ is not int:
                if numpy_bool(v):  # 0/1 to the reference (its __index__, where NumPy before
                    return None    # 2.3 has one, warns)
                try:
                    v = index(v)
                except TypeError:
                    return None
            if v < lo or v > hi:
                return None
            if same:
                if regs[reg] != v:
                    return None
            else:
                regs[reg] = v
        if steps_a:
            try:
                for fn, o, a, b, c in steps_a:
                    regs[o] = fn(regs[a], regs[b], regs[c])
            except errors:
                return None
            for actual, expected in deferred:
                if regs[actual] != regs[expected]:
                    return None
        if constraints:
            for reg in constraints:
                if not regs[reg]:
                    return None
        symbols = {bound[0]: regs[0]} if one_symbol else dict(zip(bound, regs))
        cvals = no_computed
        if computed:
            cvals = {}
            for sname, reg, lo, hi in computed:
                v = regs[reg]
                if v < lo or v > hi:
                    return None
                symbols.setdefault(sname, v)
                cvals[sname] = v
        vi = 0
        for pred_steps, pred in variants:
            if pred_steps:
                try:
                    for fn, o, a, b, c in pred_steps:
                        regs[o] = fn(regs[a], regs[b], regs[c])
                except errors:
                    return None
            if regs[pred]:
                break
            vi += 1
        else:
            return None
        body = bodies[vi]
        if body is pending:
            body = build(vi)
        if body is None:
            return None
        need, steps_b, allocs, launches = body
        if len(regs) < need:  # registers added since this call copied the template
            regs.extend(template[len(regs):need])
        if steps_b:
            try:
                for fn, o, a, b, c in steps_b:
                    regs[o] = fn(regs[a], regs[b], regs[c])
            except errors:
                return None
        allocations = {}
        for aname, static, kind, dtype, shape_regs, zero, nbytes in allocs:
            if static is not None:
                allocations[aname] = static
                continue
            shape = (regs[shape_regs[0]],) if len(shape_regs) == 1 else \
                tuple(map(regs.__getitem__, shape_regs))
            for n in shape:
                if n < 0:
                    return None
                nbytes *= n
            if nbytes > lmax:
                return None
            allocations[aname] = tnew(Allocation, (aname, kind, dtype, shape, nbytes, zero))
        planned = []
        for static, kernel, module, rx, ry, rz, block, dyn, value_args, args, li in launches:
            if static is not None:
                planned.append(static)
                continue
            gx, gy, gz = regs[rx], regs[ry], regs[rz]
            if gx < 0 or gx > 2147483647 or gy < 0 or gy > 65535 or gz < 0 or gz > 65535:
                return None
            if block is None:
                bx, by, bz, smem = regs[dyn[0]], regs[dyn[1]], regs[dyn[2]], regs[dyn[3]]
                if not _block_ok(bx, by, bz, smem):
                    return None
                blk = (bx, by, bz)
            else:
                blk, smem = block
            if value_args:
                out = []
                for fixed, reg, dtype, lo, hi in args:
                    if fixed is None:
                        v = regs[reg]
                        if v < lo or v > hi:
                            return None
                        out.append(("value", v, dtype))
                    else:
                        out.append(fixed)
                launch_args = tuple(out)
            else:
                launch_args = args
            planned.append(tnew(PlannedLaunch, (kernel, module, (gx, gy, gz), blk, smem,
                                                launch_args, li)))
        return tnew(Plan, (name, vi, proxy(symbols), proxy(allocations), tuple(planned),
                           proxy(cvals) if computed else cvals))  # read-only: plans are shared

    return run
