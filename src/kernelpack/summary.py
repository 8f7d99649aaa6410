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

This module holds what a program takes (parameters, constraints) and the program itself, with
the check that its parts fit together; how it runs (:class:`Variant`, :class:`Launch`,
:class:`Arg`, :class:`Scratch`) is :mod:`kernelpack.launches`, and the checks of single fields
are :mod:`kernelpack._fields`. Import every name of the data model from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Union, cast

from ._frozen import frozen_dataclass
from ._fields import DTypeLike, _dim, _dtype, _flag, _items, _name, _set, _shape
from .dtypes import DType, as_dtype, strict_index
from .expr import Expr, ExprLike, as_expr
from .launches import Arg, Launch, Scratch, Variant
from .limits import MAX_CONSTRAINTS, MAX_PARAMS, MAX_VARIANTS

if TYPE_CHECKING:  # resolved on first use here (see __getattr__): compiled imports this module
    from .compiled import IMAGE_KINDS, Compiled, Image, Module

__all__ = [
    "Tensor", "TensorType", "Scalar", "Param", "Constraint", "Scratch", "Arg", "Launch", "Variant",
    "KernelSummary", "Image", "Module", "Compiled", "ROLES", "IMAGE_KINDS",
]

ROLES = ("in", "out", "inout")


@frozen_dataclass
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

    def __init__(self, name: str, dtype: DTypeLike, shape: Iterable[ExprLike],
                 role: str = "in", zero_init: bool = False) -> None:
        _set(self, "name", name)
        _set(self, "dtype", dtype)
        _set(self, "shape", shape)
        _set(self, "role", role)
        _set(self, "zero_init", zero_init)
        self.__post_init__()

    def __class_getitem__(cls, item: object) -> "TensorType":
        """``kp.Tensor[kp.f32, "b", "n"]``: an annotation for ``@kp.fusion`` parameters."""
        items = item if isinstance(item, tuple) else (item,)
        if not items:
            raise TypeError("kp.Tensor[...] needs a dtype and dims, e.g. kp.Tensor[kp.f32, 'n']")
        # (TensorType refuses a dim that is no name or int)
        return TensorType(as_dtype(items[0]), cast("tuple[str | int, ...]",
                                                   tuple(_annotated_dim(d) for d in items[1:])))

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "tensor name"))
        object.__setattr__(self, "dtype", _dtype(self.dtype, f"tensor {self.name!r}"))
        object.__setattr__(self, "shape", _shape(self.shape, f"tensor {self.name!r}"))
        if self.role not in ROLES:
            raise ValueError(f"tensor {self.name!r}: role must be one of {ROLES} (got {self.role!r})")
        if self.zero_init.__class__ is not bool:
            object.__setattr__(self, "zero_init",
                               _flag(self.zero_init, f"tensor {self.name!r}: zero_init"))
        if self.zero_init and self.role != "out":
            raise ValueError(f"tensor {self.name!r}: zero_init applies to role='out' only")

    @property
    def is_input(self) -> bool:
        return self.role in ("in", "inout")


@frozen_dataclass
class Scalar:
    """A scalar parameter. With ``value=None`` the caller passes it (an integer one is then also
    a symbol); with an expression it is computed from the symbols and never passed."""

    name: str
    dtype: DType
    value: Expr | None = None

    def __init__(self, name: str, dtype: DTypeLike, value: ExprLike | None = None) -> None:
        _set(self, "name", name)
        _set(self, "dtype", dtype)
        _set(self, "value", value)
        self.__post_init__()

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "scalar name"))
        object.__setattr__(self, "dtype", _dtype(self.dtype, f"scalar {self.name!r}"))
        if self.dtype.is_complex:
            raise ValueError(f"scalar {self.name!r}: complex scalars are not supported")
        if self.value is not None and self.value.__class__ is not Expr:
            object.__setattr__(self, "value", _dim(self.value, f"scalar {self.name!r}: value"))
        if self.value is not None:
            if not self.dtype.is_integer:
                raise ValueError(f"scalar {self.name!r}: a computed scalar must have an integer "
                                 f"dtype (got {self.dtype})")

    @property
    def is_symbol(self) -> bool:
        """Passed by the caller and integral: usable in expressions under its name."""
        return self.value is None and (self.dtype.is_integer or self.dtype.kind == "b")


Param = Union[Tensor, Scalar]


def _annotated_dim(d: object) -> object:
    """A NumPy integer (``kp.Tensor[kp.f32, np.int64(4)]``) is the int it holds; a bool and
    anything else stay as given, for TensorType's own check to refuse."""
    if isinstance(d, (str, int)) or not hasattr(d, "__index__"):
        return d
    try:
        return strict_index(d)
    except TypeError:
        return d


@frozen_dataclass
class TensorType:
    """The annotation ``kp.Tensor[dtype, dim, ...]``: dims are names (symbolic) or ints."""

    dtype: DType
    dims: tuple[str | int, ...]

    def __init__(self, dtype: DType, dims: tuple[str | int, ...]) -> None:
        _set(self, "dtype", dtype)
        _set(self, "dims", dims)
        self.__post_init__()

    def __post_init__(self) -> None:
        for d in self.dims:
            if isinstance(d, bool) or not isinstance(d, (str, int)):
                raise TypeError(f"kp.Tensor dims must be names or ints (got {d!r})")
            if isinstance(d, str) and not d.isidentifier():
                raise ValueError(f"kp.Tensor dim name must be an identifier (got {d!r})")
            if isinstance(d, int) and d < 0:
                raise ValueError(f"kp.Tensor dim must be >= 0 (got {d})")


@frozen_dataclass
class Constraint:
    """A predicate over the symbols that must hold (non-zero) for the program to run."""

    predicate: Expr
    message: str = ""

    def __init__(self, predicate: ExprLike, message: str = "") -> None:
        _set(self, "predicate", predicate)
        _set(self, "message", message)
        self.__post_init__()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "predicate", as_expr(self.predicate))
        except (TypeError, ValueError) as exc:  # named no constraint
            raise type(exc)(f"constraint {self.message!r:.60}: predicate: {exc}") from None
        if not isinstance(self.message, str):
            raise TypeError(f"constraint message must be a str (got {self.message!r:.80})")



@frozen_dataclass
class KernelSummary:
    """A program's summary: parameters in call order, constraints, variants."""

    name: str
    params: tuple[Param, ...]
    variants: tuple[Variant, ...]
    constraints: tuple[Constraint, ...] = ()

    def __init__(self, name: str, params: Iterable[Param], variants: Iterable[Variant],
                 constraints: Iterable[Constraint] = ()) -> None:
        _set(self, "name", name)
        _set(self, "params", params)
        _set(self, "variants", variants)
        _set(self, "constraints", constraints)
        self.__post_init__()

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

        def need(expr: Expr, where: tuple, extra: frozenset[str] = frozenset()) -> None:
            """``where``: the field's name in parts, joined only for a message (a loaded
            summary asks this of every field, and almost all pass)."""
            read = symbols(expr)
            if read <= bound:  # the common case, without making two sets
                return
            missing = read - bound - extra
            if missing:
                raise ValueError(f"program {self.name!r}: {_joined(where)} reads unbound "
                                 f"symbol(s) {sorted(missing)} (bound: {sorted(bound)})")

        for p in self.params:
            if isinstance(p, Tensor):
                for i, d in enumerate(p.shape):
                    need(d, (p.name, ".shape[", i, "]"))
            elif p.value is not None:
                need(p.value, ("scalar ", p.name))
        for c in self.constraints:
            need(c.predicate, ("a constraint",))
        tensors = {p.name for p in self.params if isinstance(p, Tensor)}
        scalars = {p.name for p in self.params if isinstance(p, Scalar)}
        for vi, variant in enumerate(self.variants):
            if variant.predicate is not None:
                need(variant.predicate, ("variant ", vi, " predicate"))
            buffers = set(tensors)
            for s in variant.scratch:
                if s.name in buffers or s.name in scalars:
                    raise ValueError(f"program {self.name!r}: scratch {s.name!r} clashes with "
                                     f"another name")
                buffers.add(s.name)
                for i, d in enumerate(s.shape):
                    need(d, ("scratch ", s.name, ".shape[", i, "]"))
            for li, launch in enumerate(variant.launches):
                where = ("variant ", vi, " launch ", li, " (", launch.kernel, ")")
                loop = frozenset([launch.loop]) if launch.loop else frozenset()
                if launch.loop and launch.loop in bound:
                    raise ValueError(f"{_joined(where)}: loop symbol {launch.loop!r} shadows a "
                                     f"bound symbol")
                if launch.loop in scalars:  # computed scalars share the symbols' namespace
                    raise ValueError(f"{_joined(where)}: loop symbol {launch.loop!r} is also the "
                                     f"name of a scalar parameter")
                if launch.count is not None:
                    need(launch.count, (*where, " count"))
                for expr in launch.expressions():
                    need(expr, where, loop)
                for arg in launch.args:
                    if arg.kind == "buffer" and arg.name not in buffers:
                        raise ValueError(f"{_joined(where)}: buffer argument {arg.name!r} is "
                                         f"neither a tensor parameter nor a scratch buffer")
                    if arg.kind == "scalar" and arg.name not in scalars:
                        raise ValueError(f"{_joined(where)}: scalar argument {arg.name!r} is not "
                                         f"a scalar parameter")


def _joined(parts: tuple) -> str:
    return "".join(map(str, parts))


def _symbols_of_many() -> Callable[[Expr], frozenset[str]]:
    """``Expr.symbols()`` for many expressions that share nodes, each node's symbols computed
    once: check() asks it of every field, and the fields of a loaded summary can all read one
    large shared expression (LOAD), which one walk per field made quadratic. The nodes are
    the summary's, alive for the whole check, so their ids are stable keys."""
    memo: dict[int, frozenset[str]] = {}
    empty: frozenset[str] = frozenset()

    def symbols(root: Expr) -> frozenset[str]:
        known = memo.get(id(root))
        if known is not None:  # a shared node asked again (a constant, a common dim)
            return known
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


def __getattr__(name: str) -> Any:
    """The compiled code that travels with a summary (images, modules, ``kp.Compiled``) lives
    in :mod:`kernelpack.compiled`; these names resolve here too, where the whole data model
    used to be (imported on first use: :mod:`kernelpack.compiled` imports this module)."""
    if name in _COMPILED:
        from . import compiled

        return getattr(compiled, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
