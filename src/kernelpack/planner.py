"""Planning: actual shapes and scalars → allocation sizes and launch dimensions. No GPU.

A :class:`Planner` is built once per program: it encodes the summary's expressions into one
validated :class:`~kernelpack.expr_program.ExprProgram`, folds constant fields to ints, and
turns the binding rules into flat instruction lists. :meth:`Planner.plan_shapes` (the
runtime's entry) then only binds symbols, evaluates the roots it needs with checked int64
arithmetic and checks the results against the hardware launch limits. Every failure is a
:class:`~kernelpack.errors.ConstraintError` naming the parameter or field and both values.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .dtypes import DType
from .errors import ConstraintError
from .expr import INT64_MAX, INT64_MIN, Expr
from .expr_program import ExprEncoder, ExprProgram
from .limits import MAX_LAUNCH_REPEAT
from .summary import KernelSummary, Scalar, Tensor

__all__ = ["Plan", "Allocation", "PlannedLaunch", "Planner", "MAX_BLOCK_THREADS",
           "MAX_GRID_X", "MAX_GRID_YZ"]

MAX_BLOCK_THREADS = 1024
MAX_GRID_X = (1 << 31) - 1
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Allocation:
    """A buffer the caller (or runtime) must provide: an output or a scratch workspace."""

    name: str
    kind: str               # "output" | "scratch"
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    zero_init: bool


@dataclass(frozen=True)
class PlannedLaunch:
    """One kernel launch with concrete dimensions. ``args`` items are ``("buffer", name)``,
    ``("scalar", name)`` or ``("value", int, DType)``."""

    kernel: str
    module: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class Plan:
    """The evaluated summary for one call. ``symbols`` holds every bound symbol and each
    computed scalar parameter's value; repeated launches are expanded in order."""

    program: str
    variant: int
    symbols: dict[str, int]
    allocations: dict[str, Allocation]
    launches: tuple[PlannedLaunch, ...]


class _Field:
    """A non-constant expression field: its root and a name for error messages."""

    __slots__ = ("root", "what")

    def __init__(self, root: int, what: str) -> None:
        self.root, self.what = root, what


def _range(dtype: DType) -> tuple[int, int]:
    bits = 8 * dtype.itemsize
    if dtype.kind == "b":
        return 0, 1
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)


class Planner:
    """The per-program compiled form of a summary (see module docstring)."""

    def __init__(self, summary: KernelSummary, *, cache_size: int = 256) -> None:
        self.summary = summary
        self._cache: dict[Any, Plan] = {}
        self._cache_size = cache_size
        s = summary
        bound = s.bound_symbols()
        loops = [x for x in s.loop_symbols() if x not in bound]
        self._nbound = len(bound)
        self._bound_names = tuple(bound)
        enc = ExprEncoder([*bound, *loops])

        def field(expr: Expr, what: str) -> Any:
            # Constant fields are folded to ints; others hold the encoder's handle until
            # finish() says which root it became.
            if expr.is_const:
                return int(expr.value)  # type: ignore[arg-type]
            return _Field(enc.add(expr), what)

        sym_index = {name: i for i, name in enumerate([*bound, *loops])}
        origin: dict[str, str] = {}
        self._tensors: list[tuple[str, tuple[tuple[int, Any, str], ...]]] = []
        self._scalars: list[tuple[str, int, str, tuple[int, int]]] = []
        deferred: list[tuple[Any, str]] = []
        for p in s.inputs:
            if isinstance(p, Tensor):
                dims = []
                for i, d in enumerate(p.shape):
                    where = f"{p.name}.shape[{i}]"
                    if d.is_sym and d.value not in origin:
                        origin[d.value] = where  # type: ignore[index]
                        dims.append((0, sym_index[d.value], where))
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
                                          "" if first else origin[p.name], _range(p.dtype)))
                else:
                    self._scalars.append((p.name, -1, "", (0, 0)))
        self._deferred = deferred
        self._symbol_scalars = tuple(i for i, sc in enumerate(self._scalars) if sc[1] >= 0)
        self._computed = [(p.name, field(p.value, f"scalar {p.name}"), _range(p.dtype))
                          for p in s.params if isinstance(p, Scalar) and p.value is not None]
        self._constraints = [(field(c.predicate, "constraint"), c) for c in s.constraints]
        self._outputs = [(t.name, "output", t.dtype,
                          [field(d, f"output {t.name}.shape[{i}]") for i, d in enumerate(t.shape)],
                          t.zero_init) for t in s.outputs]
        self._variants = []
        for vi, v in enumerate(s.variants):
            pred = field(v.predicate, f"variant {vi} predicate") if v.predicate is not None else 1
            scratch = [(sc.name, "scratch", sc.dtype,
                        [field(d, f"scratch {sc.name}.shape[{i}]") for i, d in enumerate(sc.shape)],
                        sc.zero_init) for sc in v.scratch]
            launches = []
            for li, ln in enumerate(v.launches):
                w = f"variant {vi} launch {li} ({ln.kernel})"
                args = tuple(("value", field(a.value, f"{w} value argument {k}"), a.dtype,  # type: ignore[arg-type]
                              _range(a.dtype)) if a.kind == "value" else (a.kind, a.name)  # type: ignore[arg-type]
                             for k, a in enumerate(ln.args))
                launches.append((ln.kernel, ln.module,
                                 tuple(field(g, f"{w} grid.{'xyz'[i]}") for i, g in enumerate(ln.grid)),
                                 tuple(field(b, f"{w} block.{'xyz'[i]}") for i, b in enumerate(ln.block)),
                                 field(ln.shared_mem, f"{w} shared_mem"),
                                 field(ln.count, f"{w} count") if ln.count is not None else None,
                                 sym_index[ln.loop] if ln.loop else -1, args, w))
            self._variants.append((pred, scratch, tuple(launches)))
        encoded, positions = enc.finish()
        self.program = ExprProgram(encoded)
        for f in self._all_fields():
            f.root = positions[f.root]
        self._nsym = len(encoded.symbols)
        self._input_names = tuple(p.name for p in s.inputs)
        self._input_index = {name: i for i, name in enumerate(self._input_names)}
        self._is_tensor = tuple(isinstance(p, Tensor) for p in s.inputs)
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
            for _, _, grid, block, smem, count, _, args, _ in launches:
                out += [*grid, *block, smem, count]
                out += [a[1] for a in args if a[0] == "value"]
        return [f for f in out if isinstance(f, _Field)]

    # ---- per call ------------------------------------------------------------------------------
    # The hot path (the runtime plans on every call): no per-field method calls for constant
    # fields, launch parts that are constant are checked once here and reused, and the frozen
    # result objects are filled without going through their generated __init__.
    def _prepare(self) -> None:
        self._template = self.program.new_frame([None] * self._nsym)
        self._static: dict[int, Any] = {}
        for _, _, launches in self._variants:
            for launch in launches:
                kernel, module, grid, block, smem, count, _, args, where = launch
                consts = [*block, smem]
                if all(v.__class__ is int for v in consts):
                    bx, by, bz, sm = consts
                    try:
                        _check_block(bx, by, bz, where)
                        _check_smem(sm, where)
                    except ConstraintError:
                        continue  # stays dynamic, so that plan() raises it
                    self._static[id(launch)] = ((bx, by, bz), sm)

    def plan_shapes(self, shapes: Sequence[Sequence[int]], scalars: Sequence[Any]) -> Plan:
        """Plan from input tensor shapes and caller scalars, each in ``summary.inputs`` order.

        A plan depends only on the shapes and the integer (symbol) scalars, so recent plans
        are kept in a small cache keyed by exactly those: a repeated call costs one dict
        lookup. Plans are shared between such calls: treat them as read-only.
        """
        try:
            key: Any = (tuple(shapes), *[scalars[i] for i in self._symbol_scalars]) \
                if self._symbol_scalars else tuple(shapes)
            plan = self._cache.get(key)
        except (TypeError, IndexError):  # unhashable (lists as shapes) or wrong arity
            key, plan = None, None
        if plan is not None:
            return plan
        plan = self._plan(shapes, scalars)
        if key is not None and self._cache_size:
            cache = self._cache
            if len(cache) >= self._cache_size:
                try:  # evict the oldest; another thread may be doing the same
                    cache.pop(next(iter(cache)), None)
                except (RuntimeError, StopIteration):
                    cache.clear()
            cache[key] = plan
        return plan

    def _plan(self, shapes: Sequence[Sequence[int]], scalars: Sequence[Any]) -> Plan:
        if len(shapes) != len(self._tensors) or len(scalars) != len(self._scalars):
            raise TypeError(f"{self.summary.name}: expected {len(self._tensors)} shapes and "
                            f"{len(self._scalars)} scalars (got {len(shapes)} and {len(scalars)})")
        frame = self._template.copy()  # [symbol values..., root cache...]
        for (pname, dims), shape in zip(self._tensors, shapes):
            if len(shape) != len(dims):
                raise ConstraintError(f"{pname} has rank {len(shape)} (shape {tuple(shape)}), "
                                      f"expected rank {len(dims)}")
            for i, ((kind, a, src), d) in enumerate(zip(dims, shape)):
                if d.__class__ is not int or d < 0 or d > INT64_MAX:
                    d = _dim(d, f"{pname}.shape[{i}]")
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
            try:
                v = operator.index(value)
            except TypeError:
                raise TypeError(f"scalar {pname} must be an integer (got {value!r})") from None
            if not lo <= v <= hi:
                raise ConstraintError(f"scalar {pname} = {v} is outside its dtype range "
                                      f"{lo}..{hi}")
            if src and frame[idx] != v:
                raise ConstraintError(f"scalar {pname} is {v} but {pname} = {frame[idx]} "
                                      f"from {src}")
            frame[idx] = v
        value = self.program.value
        for f, where in self._deferred:
            expected = value(frame, f.root, f.what)
            actual = _dim_at(shapes, self._tensors, where)
            if actual != expected:
                raise ConstraintError(f"{where} is {actual}, expected "
                                      f"{self.program.exprs[f.root]} = {expected}")
        symbols = dict(zip(self._bound_names, frame))
        for f, c in self._constraints:
            if not (f if f.__class__ is int else value(frame, f.root, f.what)):
                raise ConstraintError(f"{self.summary.name}: constraint failed: "
                                      f"{c.message or c.predicate} (with {self._env(symbols)})")
        for name, f, (lo, hi) in self._computed:
            v = f if f.__class__ is int else value(frame, f.root, f.what)
            if not lo <= v <= hi:
                raise ConstraintError(f"computed scalar {name} = {v} is outside its dtype "
                                      f"range {lo}..{hi}")
            symbols.setdefault(name, v)
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
            for i in range(n):
                f = frame.copy()
                if launch[6] >= 0:
                    f[launch[6]] = i
                planned.append(self._launch(f, launch))
        return _new(Plan, program=self.summary.name, variant=vi, symbols=symbols,
                    allocations=allocations, launches=tuple(planned))

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
        return _new(Allocation, name=name, kind=kind, dtype=dtype, shape=shape, nbytes=nbytes,
                    zero_init=zero)

    def _launch(self, frame: list, launch: tuple) -> PlannedLaunch:
        kernel, module, (gx, gy, gz), block_f, smem_f, _, _, args_f, where = launch
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
        static = self._static.get(id(launch))
        if static is not None:
            block, smem = static
        else:
            bx, by, bz, smem = (v if v.__class__ is int else value(frame, v.root, v.what)
                                for v in (*block_f, smem_f))
            _check_block(bx, by, bz, where)
            _check_smem(smem, where)
            block = (bx, by, bz)
        args = args_f
        if id(launch) in self._value_launches:
            args = []
            for a in args_f:
                if a[0] == "value":
                    f = a[1]
                    v = f if f.__class__ is int else value(frame, f.root, f.what)
                    lo, hi = a[3]
                    if not lo <= v <= hi:
                        what = f.what if f.__class__ is _Field else where + " value argument"
                        raise ConstraintError(f"{what} = {v} does not fit {a[2]}")
                    args.append(("value", v, a[2]))
                else:
                    args.append(a)
            args = tuple(args)
        return _new(PlannedLaunch, kernel=kernel, module=module, grid=(gx, gy, gz), block=block,
                    shared_mem=smem, args=args)

    def _sym_name(self, index: int) -> str:
        return self.program.symbols[index]

    @staticmethod
    def _env(symbols: Mapping[str, int]) -> str:
        return ", ".join(f"{k}={v}" for k, v in symbols.items()) or "no symbols"

    # ---- the user-facing entry ---------------------------------------------------------------
    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """Plan from call arguments: positional in ``summary.inputs`` order, or by name.
        Tensors are shapes (tuples of ints) or objects with ``.shape``."""
        names = self._input_names
        values: Sequence[Any] = args
        if kwargs or len(args) != len(names):
            values = self._bind(args, kwargs)
        shapes, scalars = [], []
        for name, value, is_tensor in zip(names, values, self._is_tensor):
            if not is_tensor:
                scalars.append(value)
            elif value.__class__ is tuple:
                shapes.append(value)
            else:
                shape = getattr(value, "shape", value)
                if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
                    raise TypeError(f"tensor {name} must be a shape tuple or have .shape "
                                    f"(got {value!r:.60})")
                shapes.append(tuple(shape))
        return self.plan_shapes(shapes, scalars)

    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        names = self._input_names
        if len(args) > len(names):
            raise TypeError(f"{self.summary.name} takes {len(names)} inputs {list(names)} "
                            f"(got {len(args)} positional)")
        values: list[Any] = [*args, *([_MISSING] * (len(names) - len(args)))]
        for key, value in kwargs.items():
            i = self._input_index.get(key)
            if i is None:
                raise TypeError(f"{self.summary.name} has no input {key!r} (inputs: {list(names)})")
            if values[i] is not _MISSING:
                raise TypeError(f"{self.summary.name}: input {key!r} given twice")
            values[i] = value
        missing = [n for n, v in zip(names, values) if v is _MISSING]
        if missing:
            raise TypeError(f"{self.summary.name}: missing input(s) {missing}")
        return values


_MISSING = object()


def _new(cls: type, **fields: Any) -> Any:
    """Fill a frozen dataclass without its generated __init__ (twice as fast on the hot
    path); only for values this module has already validated."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _check_block(bx: int, by: int, bz: int, where: str) -> None:
    if not (1 <= bx <= 1024 and 1 <= by <= 1024 and 1 <= bz <= 64
            and bx * by * bz <= MAX_BLOCK_THREADS):
        raise ConstraintError(f"{where}: block ({bx}, {by}, {bz}) outside the limits "
                              f"(each dim 1..1024, z 1..64, product <= {MAX_BLOCK_THREADS})")


def _check_smem(smem: int, where: str) -> None:
    if not 0 <= smem < (1 << 32):
        raise ConstraintError(f"{where}: shared_mem = {smem}, expected 0..2^32-1")


def _dim(value: Any, where: str) -> int:
    try:
        d = operator.index(value)
    except TypeError:
        raise TypeError(f"{where} must be an integer (got {value!r})") from None
    if d < 0:
        raise ConstraintError(f"{where} is {d}, a negative size")
    if d > INT64_MAX or d < INT64_MIN:
        raise ConstraintError(f"{where} is {d}, outside int64")
    return d


def _dim_at(shapes: Sequence[Sequence[int]], tensors: list, where: str) -> int:
    name, _, rest = where.partition(".shape[")
    index = int(rest[:-1])
    for (pname, _), shape in zip(tensors, shapes):
        if pname == name:
            return _dim(shape[index], where)
    raise AssertionError(where)  # pragma: no cover - where always names a tensor input
