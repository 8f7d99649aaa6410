"""The planner's result types and the checks both planning paths share.

Split out of :mod:`kernelpack.planner` so that the fast evaluator (``planner.py``) and the
reference evaluator (``_plan_ref.py``) build identical objects and word errors identically.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Sequence

from .dtypes import DType, strict_index
from .errors import ConstraintError
from .expr import INT64_MAX, INT64_MIN
from .limits import shown_int

__all__ = ["Plan", "Allocation", "PlannedLaunch", "MAX_BLOCK_THREADS", "MAX_GRID_X",
           "MAX_GRID_YZ", "NO_COMPUTED", "block_fits", "check_block", "check_smem", "dim", "dim_at",
           "dtype_range", "merge_inputs", "tensors_first"]

MAX_BLOCK_THREADS = 1024
MAX_GRID_X = (1 << 31) - 1
MAX_GRID_YZ = 65535


# Plain NamedTuples, not dataclasses: the planner makes three of these on every call, and a
# tuple is built about five times faster than a frozen dataclass. They are just as immutable
# (setting a field raises AttributeError), compare field by field and print the same way.
class Allocation(NamedTuple):
    """A buffer the caller (or runtime) must provide: an output or a scratch workspace."""

    name: str
    kind: str               # "output" | "scratch"
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    zero_init: bool


class PlannedLaunch(NamedTuple):
    """One kernel launch with concrete dimensions. ``args`` items are ``("buffer", name)``,
    ``("scalar", name)`` or ``("value", int, DType)``. ``index`` is the launch's position in
    its variant's ``launches`` (the copies of a repeated launch share it): the runtime keeps
    one parameter block and one loaded function per summary launch and finds them by it.

    A launch whose grid has a 0 dimension (size-0 tensors) stays in the plan but is never
    issued (CUDA refuses an empty grid): the runtime skips it, and the planner does not hold
    its block, shared memory or value arguments to the launch limits."""

    kernel: str
    module: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: tuple[tuple[Any, ...], ...]
    index: int = 0  # type: ignore[assignment]  # a field that shadows tuple.index


NO_COMPUTED: Mapping[str, int] = MappingProxyType({})


REPR_LAUNCHES = 20  # launches a Plan's repr shows before it counts the rest


class Plan(NamedTuple):
    """The evaluated summary for one call. ``symbols`` holds every bound symbol and each
    computed scalar parameter's value; repeated launches are expanded in order.

    ``computed`` holds each computed scalar parameter's value by name, on its own: in
    ``symbols`` a bound symbol of the same name wins, and a kernel argument ``("scalar",
    name)`` of a computed parameter must get the computed value (what the runtime writes)."""

    program: str
    variant: int
    symbols: Mapping[str, int]  # read-only views (plans are cached and shared)
    allocations: Mapping[str, Allocation]
    launches: tuple[PlannedLaunch, ...]
    computed: Mapping[str, int] = NO_COMPUTED

    def __repr__(self) -> str:
        """As a named tuple's, with at most :data:`REPR_LAUNCHES` launches and a count of the
        rest: a program of repeated launches plans up to 2^20 of them, and a notebook cell
        ending in such a plan built a 158 MB string (45 s)."""
        parts = []
        for name in self._fields:
            value = getattr(self, name)
            if name == "launches" and len(value) > REPR_LAUNCHES:
                text = (f"({', '.join(repr(v) for v in value[:REPR_LAUNCHES])}, ... "
                        f"{len(value) - REPR_LAUNCHES} more of {len(value)} launches)")
            else:
                text = repr(value)
            parts.append(f"{name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __str__(self) -> str:  # (not ``__str__ = __repr__``: type checkers read that as a field)
        return self.__repr__()

    def __reduce__(self) -> tuple:
        """Pickle the read-only views as dicts (a mappingproxy cannot be pickled: a plan sent
        to a worker process failed) and wrap them again on the other side."""
        return (_rebuild_plan, (self.program, self.variant, dict(self.symbols),
                                dict(self.allocations), self.launches, dict(self.computed)))


def _rebuild_plan(program: str, variant: int, symbols: dict, allocations: dict,
                  launches: tuple, computed: dict) -> Plan:
    return Plan(program, variant, MappingProxyType(symbols), MappingProxyType(allocations),
                launches, MappingProxyType(computed) if computed else NO_COMPUTED)


def tensors_first(inputs: Sequence[Any]) -> list[Any]:
    """``inputs`` with the tensors before the scalars (each kind in its own order): both
    planners decide which parameter sets a symbol in this order, and bind in it."""
    from .summary import Tensor  # (summary is loaded by then: the planners take one)

    return [p for p in inputs if isinstance(p, Tensor)] + \
        [p for p in inputs if not isinstance(p, Tensor)]


def dtype_range(dtype: DType) -> tuple[int, int]:
    """The integer values a scalar of ``dtype`` can hold (bool: 0..1)."""
    bits = 8 * dtype.itemsize
    if dtype.kind == "b":
        return 0, 1
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)


def block_fits(bx: int, by: int, bz: int) -> bool:
    """CUDA's block limits: each dim >= 1, x and y <= 1024, z <= 64, <= 1024 threads."""
    return (1 <= bx <= 1024 and 1 <= by <= 1024 and 1 <= bz <= 64
            and bx * by * bz <= MAX_BLOCK_THREADS)


def check_block(bx: int, by: int, bz: int, where: str) -> None:
    if not block_fits(bx, by, bz):
        raise ConstraintError(f"{where}: block ({bx}, {by}, {bz}) outside the limits "
                              f"(each dim 1..1024, z 1..64, product <= {MAX_BLOCK_THREADS})")


def check_smem(smem: int, where: str) -> None:
    if not 0 <= smem < (1 << 32):
        raise ConstraintError(f"{where}: shared_mem = {smem}, expected 0..2^32-1")


def dim(value: Any, where: str) -> int:
    """A caller's dimension as a checked int: TypeError / ConstraintError naming ``where``.
    A bool is refused although Python calls it an int: ``(True, 3)`` is never a shape the
    caller meant (a mask or a flag passed in the wrong place)."""
    if value.__class__ is bool:
        raise TypeError(f"{where} must be an integer, not a bool (got {value!r})")
    try:
        d = strict_index(value)  # a NumPy bool too, whatever NumPy's version
    except TypeError:
        raise TypeError(f"{where} must be an integer (got {value!r})") from None
    if d < 0:
        raise ConstraintError(f"{where} is {shown_int(d)}, a negative size")
    if d > INT64_MAX or d < INT64_MIN:
        raise ConstraintError(f"{where} is {shown_int(d)}, outside int64")
    return d


def dim_at(shapes: Sequence[Sequence[int]], tensors: list, where: str) -> int:
    """The caller's value of the dimension that ``where`` (``"x.shape[1]"``) names."""
    name, _, rest = where.partition(".shape[")
    index = int(rest[:-1])
    for (pname, _), shape in zip(tensors, shapes):
        if pname == name:
            return dim(shape[index], where)
    raise AssertionError(where)  # pragma: no cover - where always names a tensor input


_MISSING = object()


def merge_inputs(program: str, names: Sequence[str], args: Sequence[Any],
                 kwargs: dict[str, Any], optional: Sequence[str] = ()) -> list[Any]:
    """Positional and keyword inputs of a call in ``names`` (call) order; TypeError for too
    many, unknown, repeated or missing inputs. Shared by ``plan()`` and the runtime's call so
    both accept and word the same calling conventions. Inputs named in ``optional`` may be
    left out and are then ``None`` (``plan()``: scalars no expression can read)."""
    if len(args) > len(names):
        raise TypeError(f"{program} takes {len(names)} inputs {list(names)} "
                        f"(got {len(args)} positional)")
    values: list[Any] = [*args, *([_MISSING] * (len(names) - len(args)))]
    for key, value in kwargs.items():
        if key not in names:
            raise TypeError(f"{program} has no input {key!r} (inputs: {list(names)})")
        i = list(names).index(key)
        if values[i] is not _MISSING:
            raise TypeError(f"{program}: input {key!r} given twice")
        values[i] = value
    missing = [n for n, v in zip(names, values) if v is _MISSING and n not in optional]
    if optional:
        values = [None if v is _MISSING else v for v in values]
    if missing:
        raise TypeError(f"{program}: missing input(s) {missing}")
    return values
