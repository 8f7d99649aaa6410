"""How a program runs: its variants, their kernel launches, launch arguments and scratch buffers.

Part of the data model of :mod:`kernelpack.summary` (import these names from there): a
:class:`~kernelpack.summary.KernelSummary` says what a program takes (parameters, constraints);
each :class:`Variant` is one way to run it, a list of :class:`Launch` es guarded by a
predicate. Grids, blocks, shared memory, counts and value arguments are
:class:`~kernelpack.expr.Expr` over the program's symbols; that every symbol and buffer they
name exists is checked by ``KernelSummary.check``, which sees the whole program.
"""

from __future__ import annotations

from dataclasses import field
from typing import Iterable, Iterator, Sequence, Union

from ._frozen import frozen_dataclass
from ._fields import DTypeLike, _dim, _dim3, _dtype, _flag, _items, _name, _set, _shape
from .dtypes import DType, as_dtype
from .expr import Expr, ExprLike, as_expr, const
from .limits import MAX_ARGS, MAX_LAUNCHES, MAX_NAME_LENGTH, MAX_SCRATCH, fits_name

__all__ = ["Scratch", "Arg", "Launch", "Variant"]

# What the constructors take (each class writes its __init__: see kernelpack._fields)
Dim3Like = Union[ExprLike, Sequence[ExprLike]]


@frozen_dataclass
class Scratch:
    """A global workspace buffer, allocated per call and freed after the stream finishes."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    zero_init: bool = False

    def __init__(self, name: str, dtype: DTypeLike, shape: Iterable[ExprLike],
                 zero_init: bool = False) -> None:
        _set(self, "name", name)
        _set(self, "dtype", dtype)
        _set(self, "shape", shape)
        _set(self, "zero_init", zero_init)
        self.__post_init__()

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _name(self.name, "scratch name"))
        object.__setattr__(self, "dtype", _dtype(self.dtype, f"scratch {self.name!r}"))
        object.__setattr__(self, "shape", _shape(self.shape, f"scratch {self.name!r}"))
        object.__setattr__(self, "zero_init",
                           _flag(self.zero_init, f"scratch {self.name!r}: zero_init"))


@frozen_dataclass
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

    def __init__(self, kind: str, name: str = "", value: Expr | None = None,
                 dtype: DType | None = None) -> None:
        _set(self, "kind", kind)
        _set(self, "name", name)
        _set(self, "value", value)
        _set(self, "dtype", dtype)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.kind in ("buffer", "scalar"):
            _name(self.name, "buffer argument" if self.kind == "buffer" else "scalar argument")
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


@frozen_dataclass
class Launch:
    """One kernel launch. With ``count`` it repeats ``count`` times in order, and ``loop`` names
    the symbol (0, 1, ...) usable in its grid, block, shared memory and value arguments.

    ``reads_elsewhere`` names (kept sorted) the buffer arguments the kernel may read at
    elements other than the ones it stores: ``x @ x.T`` as one kernel reads row ``j`` of
    ``x`` for ``out[i, j]``. The runtime then never runs an output of this launch over such
    an input in place (it reads the input from a copy: :mod:`kernelpack.runtime.in_place`).
    Empty says the kernel
    reads each input element only to compute the output elements stored over it, as an
    elementwise kernel or a row kernel that reads its whole row before storing it does. The
    lowering fills it for every kernel it emits; a hand-written (external) launch must name
    what its kernel reads elsewhere, or in-place calls can give wrong results.

    ``stores_after_loads`` says each thread (or group of threads storing a unit of the
    outputs together) loads every element it reads before it stores any. A kernel storing
    several arrays may then have each over an input it reads where in place is otherwise
    right (an optimizer step ``out=(p, m)`` over its own ``p`` and ``m``); without it such a
    launch's outputs are never run over its inputs in place. The lowering sets it on its
    pointwise kernels. Both fields: format 1.1.
    """

    kernel: str
    module: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    args: tuple[Arg, ...]
    shared_mem: Expr = field(default_factory=lambda: const(0))
    count: Expr | None = None
    loop: str = ""
    reads_elsewhere: tuple[str, ...] = ()
    stores_after_loads: bool = False

    def __init__(self, kernel: str, module: str, grid: Dim3Like, block: Dim3Like,
                 args: Iterable[Arg], shared_mem: ExprLike = 0, count: ExprLike | None = None,
                 loop: str = "", reads_elsewhere: Iterable[str] = (),
                 stores_after_loads: bool = False) -> None:
        _set(self, "kernel", kernel)
        _set(self, "module", module)
        _set(self, "grid", grid)
        _set(self, "block", block)
        _set(self, "args", args)
        _set(self, "shared_mem", shared_mem)
        _set(self, "count", count)
        _set(self, "loop", loop)
        _set(self, "reads_elsewhere", reads_elsewhere)
        _set(self, "stores_after_loads", stores_after_loads)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel or not fits_name(self.kernel):
            raise ValueError(f"launch kernel must be a non-empty entry name of at most "
                             f"{MAX_NAME_LENGTH} UTF-8 bytes (got {self.kernel!r:.80})")
        if not isinstance(self.loop, str):  # None would reach the serializer as a string
            raise TypeError(f"launch {self.kernel!r}: loop must be a symbol name or '' "
                            f"(got {self.loop!r})")
        _name(self.module, "launch module")
        object.__setattr__(self, "grid", _dim3(self.grid, "grid"))
        object.__setattr__(self, "block", _dim3(self.block, "block"))
        # (checked only where not already the checked form: a decoded summary makes a few
        # launches per program, and each message below is a formatted string)
        if self.shared_mem.__class__ is not Expr:
            object.__setattr__(self, "shared_mem",
                               _dim(self.shared_mem, f"launch {self.kernel!r}: shared_mem"))
        args = self.args
        if args.__class__ is not tuple or not all(a.__class__ is Arg for a in args):
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
        if self.reads_elsewhere.__class__ is not tuple or self.reads_elsewhere:
            self._check_reads_elsewhere()
        if self.stores_after_loads is not False:
            object.__setattr__(self, "stores_after_loads", _flag(
                self.stores_after_loads, f"launch {self.kernel!r}: stores_after_loads"))

    def _check_reads_elsewhere(self) -> None:
        """``reads_elsewhere`` as a tuple of distinct names of this launch's buffer arguments."""
        names = self.reads_elsewhere
        where = f"launch {self.kernel!r}: reads_elsewhere"
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise TypeError(f"{where} must be a sequence of buffer argument names "
                            f"(got {names!r:.80})")
        names = tuple(names)
        buffers = {a.name for a in self.args if a.kind == "buffer"}
        for name in names:
            if not isinstance(name, str) or name not in buffers:
                raise ValueError(f"{where}: {name!r:.80} is not a buffer argument of the launch "
                                 f"(its buffers: {sorted(buffers)})")
        if len(set(names)) != len(names):
            raise ValueError(f"{where} names a buffer twice: {list(names)}")
        # kept sorted: the field is a set of names, so a set given here (kp.external's
        # Iterable) or two orders of one list must make equal launches and the same bytes,
        # not bytes that follow PYTHONHASHSEED (review 72a)
        object.__setattr__(self, "reads_elsewhere", tuple(sorted(names)))

    def expressions(self) -> Iterator[Expr]:
        yield from self.grid
        yield from self.block
        yield self.shared_mem
        if self.count is not None:
            yield self.count
        for arg in self.args:
            if arg.value is not None:
                yield arg.value


@frozen_dataclass
class Variant:
    """An implementation: scratch buffers and launches, run when ``predicate`` holds (None:
    always)."""

    launches: tuple[Launch, ...]
    scratch: tuple[Scratch, ...] = ()
    predicate: Expr | None = None

    def __init__(self, launches: Iterable[Launch], scratch: Iterable[Scratch] = (),
                 predicate: ExprLike | None = None) -> None:
        _set(self, "launches", launches)
        _set(self, "scratch", scratch)
        _set(self, "predicate", predicate)
        self.__post_init__()

    def __post_init__(self) -> None:
        object.__setattr__(self, "launches", _items(self.launches, Launch, "variant launches"))
        object.__setattr__(self, "scratch", _items(self.scratch, Scratch, "variant scratch"))
        if self.predicate is not None:
            object.__setattr__(self, "predicate", as_expr(self.predicate))
        if len(self.launches) > MAX_LAUNCHES:
            raise ValueError(f"{len(self.launches)} launches exceed the limit {MAX_LAUNCHES}")
        if len(self.scratch) > MAX_SCRATCH:
            raise ValueError(f"{len(self.scratch)} scratch buffers exceed the limit {MAX_SCRATCH}")

