"""The reference planner: every summary field encoded into one validated
:class:`~kernelpack.expr_program.ExprProgram` and evaluated lazily, root by root, in the order
the checks need them.

:class:`kernelpack.planner.Planner` runs a faster straight-line evaluation and hands a call to
this one whenever anything is off (a failed check, an arithmetic error, a ``select`` whose
untaken branch would fail, a repeated launch): this module is the definition of what a plan is
and of every error message, the fast path only ever agrees with it.
"""

from __future__ import annotations

import operator
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ._plan_types import (MAX_GRID_X, MAX_GRID_YZ, NO_COMPUTED, Allocation, Plan,
                          PlannedLaunch, check_block, check_smem, dim, dim_at, dtype_range,
                          tensors_first)
from .dtypes import DType, is_numpy_bool
from .errors import ConstraintError, ExpressionError, RankError
from .expr import INT64_MAX, Expr
from .expr_program import ExprEncoder, ExprProgram
from .limits import MAX_LAUNCH_REPEAT, MAX_PLANNED_LAUNCHES, shown_int
from .summary import KernelSummary, Scalar, Tensor

__all__ = ["ReferencePlanner"]


class _Field:
    """A non-constant expression field: its root and a name for error messages."""

    __slots__ = ("root", "what")

    def __init__(self, root: int, what: str) -> None:
        self.root, self.what = root, what


class ReferencePlanner:
    """The reference evaluation of a summary (see module docstring)."""

    def __init__(self, summary: KernelSummary) -> None:
        self.summary = summary
        s = summary
        bound = s.bound_symbols()
        loops = [x for x in s.loop_symbols() if x not in bound]
        self._nbound = len(bound)
        self._bound_names = tuple(bound)
        enc = ExprEncoder([*bound, *loops])
        # Only a uint64 scalar can hold more than int64: where one is an input, note the
        # first field that reads each symbol, so that binding such a value to a symbol an
        # expression reads is refused whichever expressions this call happens to evaluate.
        track = any(not isinstance(p, Tensor) and p.is_symbol and dtype_range(p.dtype)[1] >
                    INT64_MAX for p in s.inputs)
        readers: dict[str, str] = {}

        def field(expr: Expr, what: str) -> Any:
            # Constant fields are folded to ints; others hold the encoder's handle until
            # finish() says which root it became.
            if expr.is_const:
                return int(expr.value)  # type: ignore[arg-type]
            if track:
                for name in expr.symbols():
                    readers.setdefault(name, what)
            return _Field(enc.add(expr), what)

        sym_index = {name: i for i, name in enumerate([*bound, *loops])}
        origin: dict[str, str] = {}
        self._tensors: list[tuple[str, tuple[tuple[int, Any, str], ...]]] = []
        self._scalars: list[tuple[str, int, str, tuple[int, int]]] = []
        deferred: list[tuple[Any, str]] = []
        # Tensors first: plan_shapes binds every dim before it reads a scalar, so a symbol
        # that a tensor dim and an integer scalar both name is set by the dim (in any order of
        # declaration) and the scalar is checked against it.
        for p in tensors_first(s.inputs):
            if isinstance(p, Tensor):
                dims: list[tuple[int, int | None, str]] = []
                for i, d in enumerate(p.shape):
                    where = f"{p.name}.shape[{i}]"
                    # (a symbol's value is its name)
                    if d.is_sym and d.value not in origin:
                        origin[d.value] = where  # type: ignore[index]
                        dims.append((0, sym_index[d.value], where))  # type: ignore[index]
                    elif d.is_sym:
                        dims.append((1, sym_index[d.value], origin[d.value]))  # type: ignore[index]
                    elif d.is_const:
                        dims.append((2, int(d.value), ""))  # type: ignore[arg-type]
                    else:
                        dims.append((3, None, ""))
                        deferred.append((field(d, where), where))
                self._tensors.append((p.name, tuple(dims)))
            else:
                if p.is_symbol:
                    first = p.name not in origin
                    origin.setdefault(p.name, f"scalar {p.name}")
                    self._scalars.append((p.name, sym_index[p.name],
                                          "" if first else origin[p.name], dtype_range(p.dtype)))
                else:
                    self._scalars.append((p.name, -1, "", (0, 0)))
        self._deferred = deferred
        # (filled in as the fields below are made; read per call, so complete by then)
        self._readers = readers
        self._computed = [(p.name, field(p.value, f"scalar {p.name}"), dtype_range(p.dtype))
                          for p in s.params if isinstance(p, Scalar) and p.value is not None]
        self._constraints = [(field(c.predicate, "constraint"), c) for c in s.constraints]
        self._outputs = [(t.name, "output", t.dtype,
                          [field(d, f"output {t.name}.shape[{i}]") for i, d in enumerate(t.shape)],
                          t.zero_init) for t in s.outputs]
        self._variants = []
        for vi, v in enumerate(s.variants):
            pred: Any = (field(v.predicate, f"variant {vi} predicate")
                         if v.predicate is not None else 1)
            scratch = [(sc.name, "scratch", sc.dtype,
                        [field(d, f"scratch {sc.name}.shape[{i}]") for i, d in enumerate(sc.shape)],
                        sc.zero_init) for sc in v.scratch]
            launches = []
            for li, ln in enumerate(v.launches):
                w = f"variant {vi} launch {li} ({ln.kernel})"
                args = tuple(("value", field(a.value, f"{w} value argument {k}"), a.dtype,  # type: ignore[arg-type]
                              dtype_range(a.dtype)) if a.kind == "value" else (a.kind, a.name)  # type: ignore[arg-type]
                             for k, a in enumerate(ln.args))
                launches.append((ln.kernel, ln.module,
                                 tuple(field(g, f"{w} grid.{'xyz'[i]}") for i, g in enumerate(ln.grid)),
                                 tuple(field(b, f"{w} block.{'xyz'[i]}") for i, b in enumerate(ln.block)),
                                 field(ln.shared_mem, f"{w} shared_mem"),
                                 field(ln.count, f"{w} count") if ln.count is not None else None,
                                 sym_index[ln.loop] if ln.loop else -1, args, w, li))
            self._variants.append((pred, scratch, tuple(launches)))
        encoded, positions = enc.finish()
        self.program = ExprProgram(encoded)
        for f in self._all_fields():
            f.root = positions[f.root]
        self._nsym = len(encoded.symbols)
        self._value_launches = {id(ln) for _, _, lns in self._variants for ln in lns
                                if any(a[0] == "value" for a in ln[7])}
        self._prepare()

    def _all_fields(self) -> list[_Field]:
        out: list[Any] = [f for f, _ in self._deferred]
        out += [f for _, f, _ in self._computed] + [f for f, _ in self._constraints]
        for _, _, _, dims, _ in self._outputs:
            out += dims
        for pred, scratch, launches in self._variants:
            out.append(pred)
            for _, _, _, dims, _ in scratch:
                out += dims
            for _, _, grid, block, smem, count, _, args, _, _ in launches:
                out += [*grid, *block, smem, count]
                out += [a[1] for a in args if a[0] == "value"]
        return [f for f in out if isinstance(f, _Field)]

    # ---- per call ------------------------------------------------------------------------------
    # Launch parts that are constant are checked once here and reused.
    def _prepare(self) -> None:
        self._template = self.program.new_frame([None] * self._nsym)
        self._static: dict[int, Any] = {}
        for _, _, launches in self._variants:
            for launch in launches:
                kernel, module, grid, block, smem, count, _, args, where, _ = launch
                consts = [*block, smem]
                if all(v.__class__ is int for v in consts):
                    bx, by, bz, sm = consts
                    try:
                        check_block(bx, by, bz, where)
                        check_smem(sm, where)
                    except ConstraintError:
                        continue  # stays dynamic, so that plan() raises it
                    self._static[id(launch)] = ((bx, by, bz), sm)

    def plan_shapes(self, shapes: Sequence[Sequence[int]], scalars: Sequence[Any]) -> Plan:
        """Plan from input tensor shapes and caller scalars, each in ``summary.inputs`` order;
        raises TypeError, ConstraintError or ExpressionError naming what is wrong."""
        if len(shapes) != len(self._tensors) or len(scalars) != len(self._scalars):
            raise TypeError(f"{self.summary.name}: expected {len(self._tensors)} shapes and "
                            f"{len(self._scalars)} scalars (got {len(shapes)} and {len(scalars)})")
        frame = self._template.copy()  # [symbol values..., root cache...]
        for (pname, dims), shape in zip(self._tensors, shapes):
            if len(shape) != len(dims):
                raise RankError(f"{pname} has rank {len(shape)} (shape {_shown_shape(shape)}), "
                                f"expected rank {len(dims)}")
            for i, ((kind, a, src), d) in enumerate(zip(dims, shape)):
                if d.__class__ is not int or d < 0 or d > INT64_MAX:
                    d = dim(d, f"{pname}.shape[{i}]")
                if kind == 0:
                    frame[a] = d
                elif kind == 1:
                    if frame[a] != d:
                        raise ConstraintError(f"{pname}.shape[{i}] is {d} but "
                                              f"{self._sym_name(a)} = {frame[a]} from {src}")
                elif kind == 2 and a != d:
                    raise ConstraintError(f"{pname}.shape[{i}] is {d}, expected {a}")
        for (pname, idx, src, (lo, hi)), value in zip(self._scalars, scalars):
            if idx < 0:
                continue
            if is_numpy_bool(value):  # a NumPy comparison's flag: 0/1 (asked first: NumPy
                v = 1 if value else 0  # before 2.3 gives it a deprecated __index__)
            else:
                try:
                    v = operator.index(value)
                except TypeError:
                    raise TypeError(f"scalar {pname} must be an integer (got {value!r})") \
                        from None
            if not lo <= v <= hi:
                raise ConstraintError(f"scalar {pname} = {shown_int(v)} is outside its dtype "
                                      f"range {lo}..{hi}")
            if src and frame[idx] != v:
                raise ConstraintError(f"scalar {pname} is {v} but {pname} = {frame[idx]} "
                                      f"from {src}")
            if v > INT64_MAX and pname in self._readers:
                # a lazy evaluation (an untaken select branch, a variant not chosen) would
                # let it through for some shapes and refuse it for others
                raise ExpressionError(f"scalar {pname!r} = {v} is outside int64, but "
                                      f"{self._readers[pname]} reads {pname!r} and expressions "
                                      f"are evaluated over int64 (a uint64 scalar that no "
                                      f"expression reads may take its full range)")
            frame[idx] = v
        value = self.program.value
        for f, where in self._deferred:
            expected = value(frame, f.root, f.what)
            actual = dim_at(shapes, self._tensors, where)
            if actual != expected:
                raise ConstraintError(f"{where} is {actual}, expected "
                                      f"{self.program.exprs[f.root]} = {expected}")
        symbols = dict(zip(self._bound_names, frame))
        computed = {}
        for f, c in self._constraints:
            try:
                holds = f if f.__class__ is int else value(frame, f.root, f.what)
            except ExpressionError as exc:
                if not c.message or exc.reason is None:
                    raise
                # the constraint's own words, not its encoding (a size check is a select)
                raise ExpressionError(f"{self.summary.name}: constraint failed: {c.message}: "
                                      f"{exc.reason} (with {self._env(symbols)})") from None
            if not holds:
                raise ConstraintError(f"{self.summary.name}: constraint failed: "
                                      f"{c.message or c.predicate} (with {self._env(symbols)})")
        for name, f, (lo, hi) in self._computed:
            v = f if f.__class__ is int else value(frame, f.root, f.what)
            if not lo <= v <= hi:
                raise ConstraintError(f"computed scalar {name} = {v} is outside its dtype "
                                      f"range {lo}..{hi}")
            symbols.setdefault(name, v)
            computed[name] = v
        for vi, (pred, scratch, launches) in enumerate(self._variants):
            if pred if pred.__class__ is int else value(frame, pred.root, pred.what):
                break
        else:
            raise ConstraintError(f"{self.summary.name}: no variant applies to "
                                  f"{self._env(symbols)} (predicates: "
                                  f"{[str(v.predicate) for v in self.summary.variants]})")
        allocations = {}
        for entry in (*self._outputs, *scratch) if scratch else self._outputs:
            allocations[entry[0]] = self._allocation(frame, *entry)
        planned = []
        for launch in launches:
            count = launch[5]
            if count is None:
                planned.append(self._launch(frame, launch))
                continue
            n = count if count.__class__ is int else value(frame, count.root, count.what)
            if not 0 <= n <= MAX_LAUNCH_REPEAT:
                raise ConstraintError(f"{launch[8]} count = {n}, expected 0..{MAX_LAUNCH_REPEAT}")
            if len(planned) + n > MAX_PLANNED_LAUNCHES:
                raise ConstraintError(f"{launch[8]} count = {n} makes the plan "
                                      f"{len(planned) + n} launches, more than "
                                      f"MAX_PLANNED_LAUNCHES {MAX_PLANNED_LAUNCHES}")
            for i in range(n):
                f = frame.copy()
                if launch[6] >= 0:
                    f[launch[6]] = i
                planned.append(self._launch(f, launch))
        # read-only views: the planners cache plans, so a caller's change would reach every
        # later call with the same shapes
        return Plan(program=self.summary.name, variant=vi, symbols=MappingProxyType(symbols),
                    allocations=MappingProxyType(allocations), launches=tuple(planned),
                    computed=MappingProxyType(computed) if computed else NO_COMPUTED)

    def _allocation(self, frame: list, name: str, kind: str, dtype: DType, dims: list,
                    zero: bool) -> Allocation:
        value = self.program.value
        shape = tuple(d if d.__class__ is int else value(frame, d.root, d.what) for d in dims)
        nbytes = dtype.itemsize
        for i, n in enumerate(shape):
            if n < 0:
                raise ConstraintError(f"{kind} {name}.shape[{i}] = {n} is negative")
            nbytes *= n
        if nbytes > INT64_MAX:
            raise ConstraintError(f"{kind} {name} of shape {shape} needs {nbytes} bytes, "
                                  f"more than int64 can hold")
        return Allocation(name=name, kind=kind, dtype=dtype, shape=shape, nbytes=nbytes,
                          zero_init=zero)

    def _launch(self, frame: list, launch: tuple) -> PlannedLaunch:
        kernel, module, (gx, gy, gz), block_f, smem_f, _, _, args_f, where, index = launch
        value = self.program.value
        if gx.__class__ is not int:
            gx = value(frame, gx.root, gx.what)
        if gy.__class__ is not int:
            gy = value(frame, gy.root, gy.what)
        if gz.__class__ is not int:
            gz = value(frame, gz.root, gz.what)
        if not (0 <= gx <= MAX_GRID_X and 0 <= gy <= MAX_GRID_YZ and 0 <= gz <= MAX_GRID_YZ):
            raise ConstraintError(f"{where}: grid ({gx}, {gy}, {gz}) outside the limits "
                                  f"x 0..{MAX_GRID_X}, y/z 0..{MAX_GRID_YZ}")
        # An empty grid (size-0 tensors) is never launched: its block, shared memory and value
        # arguments are evaluated but not held to the launch limits, so that a block of
        # min(n, 256) or an argument of n - 1 does not refuse a call with n = 0.
        launched = gx and gy and gz
        static = self._static.get(id(launch))
        if static is not None:
            block, smem = static
        else:
            bx, by, bz, smem = (v if v.__class__ is int else value(frame, v.root, v.what)
                                for v in (*block_f, smem_f))
            if launched:
                check_block(bx, by, bz, where)
                check_smem(smem, where)
            block = (bx, by, bz)
        args = args_f
        if id(launch) in self._value_launches:
            args = []
            for a in args_f:
                if a[0] == "value":
                    f = a[1]
                    v = f if f.__class__ is int else value(frame, f.root, f.what)
                    lo, hi = a[3]
                    if launched and not lo <= v <= hi:
                        what = f.what if f.__class__ is _Field else where + " value argument"
                        raise ConstraintError(f"{what} = {v} does not fit {a[2]}")
                    args.append(("value", v, a[2]))
                else:
                    args.append(a)
            args = tuple(args)
        return PlannedLaunch(kernel=kernel, module=module, grid=(gx, gy, gz), block=block,
                             shared_mem=smem, args=args, index=index)

    def _sym_name(self, index: int) -> str:
        return self.program.symbols[index]

    @staticmethod
    def _env(symbols: Mapping[str, int]) -> str:
        return ", ".join(f"{k}={v}" for k, v in symbols.items()) or "no symbols"


def _shown_shape(shape: Sequence[object]) -> str:
    """A wrong-rank shape for its error: its first entries only (data passed where a shape
    belongs made a message of megabytes: review 35), each int by :func:`shown_int`."""
    def entry(d: object) -> str:
        return shown_int(d) if isinstance(d, int) else f"{d!r:.40}"

    shown = ", ".join(entry(d) for d in list(shape[:8]))
    if len(shape) > 8:
        return f"({shown}, ... {len(shape) - 8} more)"
    return f"({shown},)" if len(shape) == 1 else f"({shown})"
