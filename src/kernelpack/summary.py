"""The kernel summary: everything a loader needs to run compiled code, and nothing more.

Plain frozen dataclasses, no GPU, no FlatBuffers. The lowering produces these; ``kp.external``
lets a user declare them; the serializer stores them; the loader rebuilds them.

A :class:`KernelSummary` describes one *program* (what a user calls): its parameters in call
order, constraints, and one or more :class:`Variant` s — alternative launch lists guarded by
predicates, the first whose predicate holds is run. Sizes and launch dimensions are
:class:`~kernelpack.expr.Expr` over *symbols*: a tensor dim written as a name (``"n"``) binds
that name on first use and requires equality on every later use; an integer scalar parameter
passed by the caller is a symbol under its own name; a repeated launch's loop counter is a
symbol inside that launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence, Union

from .dtypes import DType, as_dtype, is_numpy_bool
from .expr import Expr, ExprLike, as_expr, const
from .limits import (MAX_ARGS, MAX_CONSTRAINTS, MAX_LAUNCHES, MAX_NAME_LENGTH, MAX_PARAMS,
                     MAX_RANK, MAX_SCRATCH, MAX_VARIANTS)

__all__ = [
    "Tensor", "TensorType", "Scalar", "Param", "Constraint", "Scratch", "Arg", "Launch", "Variant",
    "KernelSummary", "Image", "Module", "Compiled", "ROLES", "IMAGE_KINDS",
]

ROLES = ("in", "out", "inout")


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be an identifier of at most {MAX_NAME_LENGTH} characters "
                         f"(got {value!r})")
    return value


def _dim(value: object, what: str) -> Expr:
    """One dimension. A bool is refused: ``True`` would silently become 1."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, a symbol name or an expression (got {value!r})")
    try:
        return as_expr(value)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def _flag(value: object, what: str) -> bool:
    """A yes/no field: a bool, NumPy's, or the int 0/1 (stored as the bool). ``"no"`` would be
    truthy, and the serializer's FlatBuffers builder fails on anything but a bool or 0/1 with
    an error naming nothing of the caller's."""
    if value.__class__ is bool:
        return value  # type: ignore[return-value]
    if is_numpy_bool(value):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{what} must be a bool (got {value!r:.80})")


def _shape(shape: Iterable[ExprLike], what: str) -> tuple[Expr, ...]:
    if isinstance(shape, (str, bytes, int, Expr)) or not isinstance(shape, Iterable):
        raise TypeError(f"{what}: shape must be a sequence of dims (got {shape!r})")
    dims = tuple(_dim(d, f"{what}: shape[{i}]") for i, d in enumerate(shape))
    if len(dims) > MAX_RANK:
        raise ValueError(f"{what}: rank {len(dims)} exceeds the limit {MAX_RANK}")
    for i, d in enumerate(dims):
        if d.is_const and int(d.value) < 0:  # type: ignore[arg-type]
            raise ValueError(f"{what}: shape[{i}] = {d.value} is negative")
    return dims


def _items(values: object, kinds: type | tuple[type, ...], what: str) -> tuple:
    """A list field as a tuple of ``kinds``: a str would be iterated into its letters, and a
    wrong item would fail later with an AttributeError naming nothing of the caller's."""
    names = " or ".join(f"kp.{k.__name__}"
                        for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of {names} (got {values!r:.80})")
    items = tuple(values)
    for i, item in enumerate(items):
        if not isinstance(item, kinds):
            raise TypeError(f"{what}[{i}] must be a {names} (got {item!r:.80})")
    return items


def _dim3(values: ExprLike | Sequence[ExprLike], what: str) -> tuple[Expr, Expr, Expr]:
    if isinstance(values, (int, str, Expr)):
        values = (values,)
    elif isinstance(values, bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be an int, a symbol name, an expression or a tuple of 1 "
                        f"to 3 of them (got {values!r})")
    dims = [_dim(v, what) for v in values]
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} takes 1 to 3 dimensions (got {len(dims)})")
    dims += [const(1)] * (3 - len(dims))
    return dims[0], dims[1], dims[2]


@dataclass(frozen=True)
class Tensor:
    """A tensor parameter. ``shape`` dims are ints, symbol names or expressions.

    ``role="out"`` tensors are allocated by the loader (or passed with ``out=``) and zero-filled
    first when ``zero_init``; ``"inout"`` tensors are passed by the caller and written.
    """

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    role: str = "in"
    zero_init: bool = False

    def __class_getitem__(cls, item: object) -> "TensorType":
        """``kp.Tensor[kp.f32, "b", "n"]``: an annotation for ``@kp.fusion`` parameters."""
        items = item if isinstance(item, tuple) else (item,)
        if not items:
            raise TypeError("kp.Tensor[...] needs a dtype and dims, e.g. kp.Tensor[kp.f32, 'n']")
        return TensorType(as_dtype(items[0]), tuple(items[1:]))

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "tensor name"))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        object.__setattr__(self, "shape", _shape(self.shape, f"tensor {self.name!r}"))
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name!r}: role must be one of {ROLES} (got {self.role!r})")
        object.__setattr__(self, "zero_init", _flag(self.zero_init, f"tensor {self.name!r}: zero_init"))
        if self.zero_init and self.role != "out":
            raise ValueError(f"tensor {self.name!r}: zero_init applies to role='out' only")

    @property
    def is_input(self) -> bool:
        return self.role in ("in", "inout")


@dataclass(frozen=True)
class Scalar:
    """A scalar parameter. With ``value=None`` the caller passes it (an integer one is then also
    a symbol); with an expression it is computed from the symbols and never passed."""

    name: str
    dtype: DType
    value: Expr | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "scalar name"))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        if self.dtype.is_complex:
            raise ValueError(f"scalar {self.name!r}: complex scalars are not supported")
        if self.value is not None:
            object.__setattr__(self, "value", _dim(self.value, f"scalar {self.name!r}: value"))
            if not self.dtype.is_integer:
                raise ValueError(f"scalar {self.name!r}: a computed scalar must have an integer "
                                 f"dtype (got {self.dtype})")

    @property
    def is_symbol(self) -> bool:
        """Passed by the caller and integral: usable in expressions under its name."""
        return self.value is None and (self.dtype.is_integer or self.dtype.kind == "b")


Param = Union[Tensor, Scalar]


@dataclass(frozen=True)
class TensorType:
    """The annotation ``kp.Tensor[dtype, dim, ...]``: dims are names (symbolic) or ints."""

    dtype: DType
    dims: tuple[str | int, ...]

    def __post_init__(self) -> None:
        for d in self.dims:
            if isinstance(d, bool) or not isinstance(d, (str, int)):
                raise TypeError(f"kp.Tensor dims must be names or ints (got {d!r})")
            if isinstance(d, str) and not d.isidentifier():
                raise ValueError(f"kp.Tensor dim name must be an identifier (got {d!r})")
            if isinstance(d, int) and d < 0:
                raise ValueError(f"kp.Tensor dim must be >= 0 (got {d})")


@dataclass(frozen=True)
class Constraint:
    """A predicate over the symbols that must hold (non-zero) for the program to run."""

    predicate: Expr
    message: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicate", as_expr(self.predicate))
        if not isinstance(self.message, str):
            raise TypeError(f"constraint message must be a str (got {self.message!r:.80})")


@dataclass(frozen=True)
class Scratch:
    """A global workspace buffer, allocated per call and freed after the stream finishes."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    zero_init: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "scratch name"))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        object.__setattr__(self, "shape", _shape(self.shape, f"scratch {self.name!r}"))
        object.__setattr__(self, "zero_init",
                           _flag(self.zero_init, f"scratch {self.name!r}: zero_init"))


@dataclass(frozen=True)
class Arg:
    """What one kernel argument is bound to.

    - ``kind="buffer"``: the device pointer of tensor parameter or scratch ``name``;
    - ``kind="scalar"``: the caller's scalar parameter ``name`` (or a computed one);
    - ``kind="value"``: ``value`` evaluated and passed as ``dtype`` (an integer type).
    """

    kind: str
    name: str = ""
    value: Expr | None = None
    dtype: DType | None = None

    def __post_init__(self) -> None:
        if self.kind in ("buffer", "scalar"):
            _name(self.name, f"{self.kind} argument")
            if self.value is not None or self.dtype is not None:
                raise ValueError(f"{self.kind} argument {self.name!r} takes no value or dtype")
        elif self.kind == "value":
            if self.value is None or self.dtype is None:
                raise ValueError("a value argument needs value= and dtype=")
            object.__setattr__(self, "value", _dim(self.value, "value argument"))
            object.__setattr__(self, "dtype", as_dtype(self.dtype))
            if not self.dtype.is_integer:
                raise ValueError(f"a value argument must have an integer dtype (got {self.dtype})")
            if self.name:
                raise ValueError("a value argument has no name")
        else:
            raise ValueError(f"argument kind must be 'buffer', 'scalar' or 'value' (got {self.kind!r})")

    @staticmethod
    def buffer(name: str) -> "Arg":
        return Arg("buffer", name)

    @staticmethod
    def scalar(name: str) -> "Arg":
        return Arg("scalar", name)

    @staticmethod
    def of(value: ExprLike, dtype: DType) -> "Arg":
        return Arg("value", value=value, dtype=dtype)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Launch:
    """One kernel launch. With ``count`` it repeats ``count`` times in order, and ``loop`` names
    the symbol (0, 1, ...) usable in its grid, block, shared memory and value arguments."""

    kernel: str
    module: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    args: tuple[Arg, ...]
    shared_mem: Expr = field(default_factory=lambda: const(0))
    count: Expr | None = None
    loop: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel or len(self.kernel) > MAX_NAME_LENGTH:
            raise ValueError(f"launch kernel must be a non-empty entry name of at most "
                             f"{MAX_NAME_LENGTH} characters (got {self.kernel!r:.80})")
        if not isinstance(self.loop, str):  # None would reach the serializer as a string
            raise TypeError(f"launch {self.kernel!r}: loop must be a symbol name or '' "
                            f"(got {self.loop!r})")
        _name(self.module, "launch module")
        object.__setattr__(self, "grid", _dim3(self.grid, "grid"))
        object.__setattr__(self, "block", _dim3(self.block, "block"))
        object.__setattr__(self, "shared_mem",
                           _dim(self.shared_mem, f"launch {self.kernel!r}: shared_mem"))
        object.__setattr__(self, "args",
                           _items(self.args, Arg, f"launch {self.kernel!r}: args"))
        if len(self.args) > MAX_ARGS:
            raise ValueError(f"launch {self.kernel!r}: {len(self.args)} arguments exceed {MAX_ARGS}")
        if self.count is not None:
            object.__setattr__(self, "count", _dim(self.count, f"launch {self.kernel!r}: count"))
            if self.loop:
                _name(self.loop, "loop symbol")
        elif self.loop:
            raise ValueError(f"launch {self.kernel!r}: loop symbol {self.loop!r} given without count")

    def expressions(self) -> Iterator[Expr]:
        yield from self.grid
        yield from self.block
        yield self.shared_mem
        if self.count is not None:
            yield self.count
        for arg in self.args:
            if arg.value is not None:
                yield arg.value


@dataclass(frozen=True)
class Variant:
    """An implementation: scratch buffers and launches, run when ``predicate`` holds (None:
    always)."""

    launches: tuple[Launch, ...]
    scratch: tuple[Scratch, ...] = ()
    predicate: Expr | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "launches", _items(self.launches, Launch, "variant launches"))
        object.__setattr__(self, "scratch", _items(self.scratch, Scratch, "variant scratch"))
        if self.predicate is not None:
            object.__setattr__(self, "predicate", as_expr(self.predicate))
        if len(self.launches) > MAX_LAUNCHES:
            raise ValueError(f"{len(self.launches)} launches exceed the limit {MAX_LAUNCHES}")
        if len(self.scratch) > MAX_SCRATCH:
            raise ValueError(f"{len(self.scratch)} scratch buffers exceed the limit {MAX_SCRATCH}")


@dataclass(frozen=True)
class KernelSummary:
    """A program's summary: parameters in call order, constraints, variants."""

    name: str
    params: tuple[Param, ...]
    variants: tuple[Variant, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "program name"))
        where = f"program {self.name!r}"
        object.__setattr__(self, "params",
                           _items(self.params, (Tensor, Scalar), f"{where}: params"))
        object.__setattr__(self, "variants", _items(self.variants, Variant, f"{where}: variants"))
        object.__setattr__(self, "constraints",
                           _items(self.constraints, Constraint, f"{where}: constraints"))
        if len(self.params) > MAX_PARAMS:
            raise ValueError(f"program {self.name!r}: {len(self.params)} parameters exceed {MAX_PARAMS}")
        if not 1 <= len(self.variants) <= MAX_VARIANTS:
            raise ValueError(f"program {self.name!r}: needs 1 to {MAX_VARIANTS} variants "
                             f"(got {len(self.variants)})")
        if len(self.constraints) > MAX_CONSTRAINTS:
            raise ValueError(f"program {self.name!r}: too many constraints")
        self.check()

    # ---- derived facts ---------------------------------------------------------------------
    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[Param, ...]:
        """What the caller passes, in order: input tensors and non-computed scalars."""
        return tuple(p for p in self.params
                     if (isinstance(p, Tensor) and p.is_input)
                     or (isinstance(p, Scalar) and p.value is None))

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(p for p in self.params if isinstance(p, Tensor) and p.role == "out")

    def bound_symbols(self) -> list[str]:
        """Symbols the caller's arguments define, in binding order: bare-name dims of input
        tensors (first occurrence) and integer scalars passed by the caller."""
        names: list[str] = []
        for p in self.params:
            if isinstance(p, Tensor) and p.is_input:
                for d in p.shape:
                    if d.is_sym and d.value not in names:
                        names.append(str(d.value))
            elif isinstance(p, Scalar) and p.is_symbol and p.name not in names:
                names.append(p.name)
        return names

    def loop_symbols(self) -> list[str]:
        out: list[str] = []
        for v in self.variants:
            for launch in v.launches:
                if launch.loop and launch.loop not in out:
                    out.append(launch.loop)
        return out

    # ---- consistency -----------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError if names clash or an expression reads a symbol nothing binds."""
        seen: set[str] = set()
        for p in self.params:
            if p.name in seen:
                raise ValueError(f"program {self.name!r}: parameter {p.name!r} appears twice")
            seen.add(p.name)
        bound = set(self.bound_symbols())
        symbols = _symbols_of_many()

        def need(expr: Expr, where: str, extra: frozenset[str] = frozenset()) -> None:
            missing = symbols(expr) - bound - extra
            if missing:
                raise ValueError(f"program {self.name!r}: {where} reads unbound symbol(s) "
                                 f"{sorted(missing)} (bound: {sorted(bound)})")

        for p in self.params:
            if isinstance(p, Tensor):
                for i, d in enumerate(p.shape):
                    need(d, f"{p.name}.shape[{i}]")
            elif p.value is not None:
                need(p.value, f"scalar {p.name}")
        for c in self.constraints:
            need(c.predicate, "a constraint")
        tensors = {p.name for p in self.params if isinstance(p, Tensor)}
        scalars = {p.name for p in self.params if isinstance(p, Scalar)}
        for vi, variant in enumerate(self.variants):
            if variant.predicate is not None:
                need(variant.predicate, f"variant {vi} predicate")
            buffers = set(tensors)
            for s in variant.scratch:
                if s.name in buffers or s.name in scalars:
                    raise ValueError(f"program {self.name!r}: scratch {s.name!r} clashes with "
                                     f"another name")
                buffers.add(s.name)
                for i, d in enumerate(s.shape):
                    need(d, f"scratch {s.name}.shape[{i}]")
            for li, launch in enumerate(variant.launches):
                where = f"variant {vi} launch {li} ({launch.kernel})"
                loop = frozenset([launch.loop]) if launch.loop else frozenset()
                if launch.loop and launch.loop in bound:
                    raise ValueError(f"{where}: loop symbol {launch.loop!r} shadows a bound symbol")
                if launch.loop in scalars:  # computed scalars share the symbols' namespace
                    raise ValueError(f"{where}: loop symbol {launch.loop!r} is also the name of "
                                     f"a scalar parameter")
                if launch.count is not None:
                    need(launch.count, where + " count")
                for expr in launch.expressions():
                    need(expr, where, loop)
                for arg in launch.args:
                    if arg.kind == "buffer" and arg.name not in buffers:
                        raise ValueError(f"{where}: buffer argument {arg.name!r} is neither a "
                                         f"tensor parameter nor a scratch buffer")
                    if arg.kind == "scalar" and arg.name not in scalars:
                        raise ValueError(f"{where}: scalar argument {arg.name!r} is not a "
                                         f"scalar parameter")


def _symbols_of_many() -> Callable[[Expr], frozenset[str]]:
    """``Expr.symbols()`` for many expressions that share nodes, each node's symbols computed
    once: check() asks it of every field, and the fields of a loaded summary can all read one
    large shared expression (LOAD), which one walk per field made quadratic. The nodes are
    the summary's, alive for the whole check, so their ids are stable keys."""
    memo: dict[int, frozenset[str]] = {}
    empty: frozenset[str] = frozenset()

    def symbols(root: Expr) -> frozenset[str]:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in memo:
                continue
            if node.op == "sym":
                memo[id(node)] = frozenset((node.value,))  # type: ignore[arg-type]
            elif not node.args:
                memo[id(node)] = empty
            elif expanded:
                memo[id(node)] = empty.union(*(memo[id(a)] for a in node.args))
            else:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args if id(a) not in memo)
        return memo[id(root)]

    return symbols


_COMPILED = frozenset({"Image", "Module", "Compiled", "IMAGE_KINDS"})


def __getattr__(name: str) -> object:
    """The compiled code that travels with a summary (images, modules, ``kp.Compiled``) lives
    in :mod:`kernelpack.compiled`; these names resolve here too, where the whole data model
    used to be (imported on first use: :mod:`kernelpack.compiled` imports this module)."""
    if name in _COMPILED:
        from . import compiled

        return getattr(compiled, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
