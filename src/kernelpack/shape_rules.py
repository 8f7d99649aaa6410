"""The shape rules of traced operations: NumPy broadcasting over symbolic dims, reduction axes,
and the one form of indexing fusions have (``x[:, None]``: a new unit axis).

Split from :mod:`kernelpack.promotion` (which decides dtypes) so that each set of rules a
user's fusion is checked against reads in one short module. Dims are
:class:`~kernelpack.expr.Expr`: two dims broadcast when they are the same expression or one is
the literal 1 (``n`` and ``m`` are different dims even if equal at run time: a fusion's shapes
must agree for every value of its symbols). Like promotion, it takes traced values (anything
with ``dtype``, ``shape`` and ``ndim``) and imports no tracing code.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from .dtypes import strict_index
from .errors import TraceError
from .expr import Expr, const

if TYPE_CHECKING:
    from .tracing import Value
else:
    Value = Any

__all__ = ["broadcast_shapes", "index_axes"]


def _desc(v: Value) -> str:
    return f"{v.dtype}[{', '.join(str(d) for d in v.shape)}]"


def broadcast_shapes(op: str, *shapes: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """NumPy broadcasting with symbolic dims: equal dims match, a literal 1 stretches."""
    first = shapes[0]
    if all(s == first for s in shapes):  # the common case (same-shape operands): no work,
        return tuple(first)              # and the result the loop below would compute
    rank = builtins.max(len(s) for s in shapes)
    out: list[Expr] = []
    for axis in range(rank):
        dim: Expr = const(1)
        for s in shapes:
            d = s[axis - rank + len(s)] if axis - rank + len(s) >= 0 else const(1)
            if d == dim or (d.is_const and d.value == 1):
                continue
            if dim.is_const and dim.value == 1:
                dim = d
                continue
            raise TraceError(f"{op}: shapes {' and '.join(_fmt(s) for s in shapes)} do not "
                             f"broadcast (axis {axis}: {dim} vs {d})")
        out.append(dim)
    return tuple(out)

def _fmt(shape: tuple[Expr, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _axes(op: str, x: Value, axis: object) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        try:  # NumPy integers (axes computed with np.argmax, np.int64(1)) are axes too
            a = strict_index(a)
        except TypeError:
            raise TraceError(f"{op}: axis {a!r} must be an int or a tuple of ints") from None
        if not -x.ndim <= a < x.ndim:  # a 0-d tensor has no axis (NumPy: AxisError)
            raise TraceError(f"{op}: axis {a!r} out of range for {_desc(x)}")
        out.append(a % x.ndim)
    if len(set(out)) != len(out):
        raise TraceError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(out))


def index_axes(key: object, x: Value) -> tuple[int | None, ...]:
    """The axes of ``x[key]`` for the one form of indexing fusions have, axis insertion
    (``x[:, None]``, ``x[None]``, ``x[..., None]``): for each output axis, the input axis it
    reads, or None for a new unit axis."""
    items = key if isinstance(key, tuple) else (key,)
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise TraceError(f"index {key!r}: at most one '...'")
    explicit = sum(1 for k in items if k is not None and k is not Ellipsis)
    for k in items:
        # a slice's parts by identity: ``k == slice(None)`` compared a traced bound with None
        # (``x[:, :n]`` was "cannot use None in a fusion")
        if not (k is None or k is Ellipsis or (isinstance(k, slice) and k.start is None
                                               and k.stop is None and k.step is None)):
            from .numpy_interop import numpy_hint  # it builds on this module: imported on use

            raise TraceError(f"index {key!r} on {x!r}: only ':', '...' and None "
                             f"(new axis) are supported; {numpy_hint('take', '')}")
    if explicit > x.ndim:
        raise TraceError(f"index {key!r} has {explicit} axes, tensor has {x.ndim}")
    if Ellipsis not in items:
        items = items + (Ellipsis,)
    mapping: list[int | None] = []
    src = 0
    for k in items:
        if k is None:
            mapping.append(None)
        elif k is Ellipsis:
            for _ in range(x.ndim - explicit):
                mapping.append(src)
                src += 1
        else:
            mapping.append(src)
            src += 1
    return tuple(mapping)
