"""Planning: actual shapes and scalars → allocation sizes and launch dimensions. No GPU.

A :class:`Planner` is built once per program. :meth:`Planner.plan_shapes` (the runtime's
entry) first looks in a small cache of recent plans, then runs the fast path
(:mod:`kernelpack._plan_fast`: the summary compiled into straight-line register code over
checked int64 operators), and hands the call to the reference planner
(:mod:`kernelpack._plan_ref`, built on first need) whenever the fast path cannot vouch for the
result — a failed check, an arithmetic error, a part it does not handle. Every failure is
therefore raised by the reference planner: a :class:`~kernelpack.errors.ConstraintError`
(or ExpressionError, TypeError) naming the parameter or field and both values.

Building a Planner is cheap (no expression encoding or validation): the summary's expressions
were validated when they were made or loaded; the reference planner encodes them only when a
call needs it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Set
from typing import TYPE_CHECKING, Any, Sequence

from ._plan_types import (MAX_BLOCK_THREADS, MAX_GRID_X, MAX_GRID_YZ, Allocation, Plan,
                          PlannedLaunch, merge_inputs)
from .dtypes import strict_index
from .summary import KernelSummary, Tensor

from .expr_program import ExprProgram

if TYPE_CHECKING:  # imported when first needed: `import kernelpack` loads this module
    from ._plan_ref import ReferencePlanner

__all__ = ["Plan", "Allocation", "PlannedLaunch", "Planner", "MAX_BLOCK_THREADS",
           "MAX_GRID_X", "MAX_GRID_YZ"]


# The plan cache holds at most this many launches in all (a plan is ~350 B per launch): a
# bound on memory, not a count of plans alone, since one plan may repeat a launch 2^20 times
# (256 such plans held gigabytes for as long as the program lived: review 35). A plan of
# more launches than this is made at every call.
MAX_CACHED_LAUNCHES = 1 << 14


class Planner:
    """The per-program compiled form of a summary (see module docstring)."""

    def __init__(self, summary: KernelSummary, *, cache_size: int = 256) -> None:
        self.summary = summary
        self._cache: dict[Any, Plan] = {}
        self._cache_size = cache_size
        self._cached_launches = 0  # launches held by the cached plans
        inputs = summary.inputs
        self._input_names = tuple(p.name for p in inputs)
        self._is_tensor = tuple(isinstance(p, Tensor) for p in inputs)
        scalars = [p for p in inputs if not isinstance(p, Tensor)]
        self._symbol_scalars = tuple(i for i, p in enumerate(scalars) if p.is_symbol)
        # Scalars no expression can read (floats, complex): plan() does not need them.
        self._optional = tuple(p.name for p in scalars if not p.is_symbol)
        self._ref: ReferencePlanner | None = None
        from ._plan_fast import compile_fast

        self._fast = compile_fast(summary)

    @property
    def reference(self) -> Any:
        """The reference planner (a :class:`kernelpack._plan_ref.ReferencePlanner`, built on
        first use): it words every error. (Annotated ``Any``: naming the class would import
        that module with ``kernelpack``, or leave the hint unresolvable at run time.)"""
        ref = self._ref
        if ref is None:
            from ._plan_ref import ReferencePlanner

            ref = self._ref = ReferencePlanner(self.summary)
        return ref

    @property
    def program(self) -> ExprProgram:
        """The summary's expressions as one validated program (the reference planner's)."""
        return self.reference.program

    # ---- per call ------------------------------------------------------------------------------
    def plan_shapes(self, shapes: Sequence[Sequence[int]], scalars: Sequence[Any]) -> Plan:
        """Plan from input tensor shapes and caller scalars, each in ``summary.inputs`` order.

        A plan depends only on the shapes and the integer (symbol) scalars, so recent plans
        are kept in a small cache keyed by exactly those: a repeated call costs one dict
        lookup. Plans are shared between such calls: treat them as read-only.

        The callers pass checked values: dims and integer scalars of class ``int`` (the
        launcher reads them from arrays and converts scalars to their dtype; :meth:`plan`
        converts or refuses what a user passes). The cache does not check them again, as
        that would cost every call a walk over the dims: since ``1.0 == True == 1`` with
        equal hashes, a float or bool dim would find the plan cached for the int where the
        reference planner (a miss) refuses it.
        """
        if not self._cache_size:
            fast = self._fast
            plan = fast(shapes, scalars) if fast is not None else None
            return plan if plan is not None else self.reference.plan_shapes(shapes, scalars)
        try:
            key: Any = (tuple(shapes), *[scalars[i] for i in self._symbol_scalars]) \
                if self._symbol_scalars else tuple(shapes)
            plan = self._cache.get(key)
        except (TypeError, IndexError):  # unhashable (lists as shapes) or wrong arity
            key, plan = None, None
        if plan is not None:
            return plan
        fast = self._fast
        plan = fast(shapes, scalars) if fast is not None else None
        if plan is None:
            plan = self.reference.plan_shapes(shapes, scalars)
        n = len(plan.launches)
        if key is not None and n <= MAX_CACHED_LAUNCHES:
            cache = self._cache
            while cache and (len(cache) >= self._cache_size or
                             self._cached_launches + n > MAX_CACHED_LAUNCHES):
                try:  # evict the oldest; another thread may be doing the same
                    old = cache.pop(next(iter(cache)))
                    self._cached_launches -= len(old.launches)
                except (RuntimeError, StopIteration, KeyError):
                    cache.clear()
            if not cache:  # (a count that a race between threads made drift starts over)
                self._cached_launches = 0
            cache[key] = plan
            self._cached_launches += n
        return plan

    # ---- the user-facing entry ---------------------------------------------------------------
    def plan(self, *args: Any, **kwargs: Any) -> Plan:
        """Plan from call arguments: positional in ``summary.inputs`` order, or by name.
        Tensors are shapes (tuples of ints) or objects with ``.shape``. Scalars that no
        expression reads (floating-point ones) may be left out: they cannot change a plan.
        Dims and integer scalars must be integers (``operator.index``): TypeError otherwise."""
        values: Sequence[Any] = args
        if kwargs or len(args) != len(self._input_names):
            values = self._bind(args, kwargs)
        shapes, scalars = [], []
        for value, is_tensor, name in zip(values, self._is_tensor, self._input_names):
            if not is_tensor:
                scalars.append(value)
            elif value.__class__ is tuple and all(d.__class__ is int for d in value):
                shapes.append(value)
            else:
                shapes.append(self._shape_of(value, name))
        for i in self._symbol_scalars:  # 10.0 == 10 must not find the plan cached for 10
            v = scalars[i]
            if v.__class__ is not int and v.__class__ is not bool:
                try:
                    scalars[i] = operator.index(v)
                except TypeError:  # not through the cache: the reference words the error
                    return self.reference.plan_shapes(shapes, scalars)
        return self.plan_shapes(shapes, scalars)

    @staticmethod
    def _shape_of(value: Any, name: str) -> tuple:
        """A shape as a tuple of ints (NumPy integers converted): a float dim would compare
        equal to an int one in the plan cache, so it is refused here, naming the dim."""
        shape = getattr(value, "shape", value)
        # a dict or set has a length too, but no order of dims (a dict's keys would pass)
        if isinstance(shape, (str, bytes, Mapping, Set)) or not hasattr(shape, "__len__"):
            raise TypeError(f"tensor {name} must be a shape tuple or have .shape "
                            f"(got {value!r:.60})")
        out = []
        for i, d in enumerate(shape):
            if d.__class__ is not int:
                try:
                    d = strict_index(d)  # a bool, Python's or NumPy's, is no dim
                except TypeError:
                    raise TypeError(f"{name}.shape[{i}] must be an integer "
                                    f"(got {d!r:.60})") from None
            out.append(d)
        return tuple(out)

    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        for key in kwargs:
            if key not in self._input_names:
                self._not_an_input(key)
        return merge_inputs(self.summary.name, self._input_names, args, kwargs, self._optional)

    def _not_an_input(self, key: str) -> None:
        """TypeError for a keyword naming an output or a computed scalar: say which it is."""
        for p in self.summary.params:
            if p.name != key:
                continue
            what = ("an output: kernelpack allocates it (plan.allocations)"
                    if isinstance(p, Tensor) else "computed from the shapes, never passed")
            raise TypeError(f"{self.summary.name}: {key!r} is not an input, it is {what} "
                            f"(inputs: {list(self._input_names)})")
