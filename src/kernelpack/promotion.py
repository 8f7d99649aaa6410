"""The typing rules of traced operations: dtype promotion of two operands, weak Python
constants, NumPy broadcasting over symbolic dims, and reduction axes.

Split from :mod:`kernelpack.tracing` (which builds the values and nodes) so that the rules a
user's fusion is checked against read in one short module. The functions take traced values
(anything with ``dtype``, ``shape``, ``weak``, ``node`` and ``graph``) and never construct
one themselves except through ``graph.add``, so this module imports no tracing code.

Typing rules (kept small on purpose): Python numbers are *weak* (they take the tensor's dtype);
a value of a higher kind (bool < int < float < complex) absorbs a lower one; two tensors of the
same kind and different widths are a :class:`~kernelpack.errors.TraceError` (cast with
``.astype``) rather than a silent upcast.
"""

from __future__ import annotations

import builtins
import operator
from typing import TYPE_CHECKING, Any

from .dtypes import DType
from .errors import TraceError
from .expr import Expr, const

if TYPE_CHECKING:
    from .tracing import Value
else:
    Value = Any

__all__ = ["broadcast_shapes"]

_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _check_int_fits(v: int, dt: DType) -> None:
    """A Python int taking an integer tensor's dtype must fit it, as NumPy 2 requires
    (``int32 + 2**40`` and ``uint32 + -1`` raise OverflowError there): the constant would
    otherwise wrap silently in the kernel (``int64 + 2**70`` added 0)."""
    if dt.kind not in "iu":
        return
    bits = 8 * dt.itemsize
    lo, hi = (0, (1 << bits) - 1) if dt.kind == "u" else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if not lo <= v <= hi:
        raise TraceError(f"Python integer {v} is out of bounds for {dt} (range {lo}..{hi}); "
                         f"cast the tensor with .astype or use a float")


def _const_dtype(v: Value, like: DType) -> Value:
    """Re-type a weak constant to ``like`` (a new node; the graph keeps the old one unused)."""
    node = v.node
    if isinstance(node.attrs[0], int) and not isinstance(node.attrs[0], bool):
        _check_int_fits(node.attrs[0], like)
    return v.graph.add("const", like, (), attrs=(node.attrs[0], True))


def _promote(op: str, a: Value, b: Value) -> tuple[Value, Value, DType]:
    ka, kb = _KIND_RANK[a.dtype.kind], _KIND_RANK[b.dtype.kind]
    if a.weak and not b.weak and ka <= kb:
        a = _const_dtype(a, b.dtype)
    elif b.weak and not a.weak and kb <= ka:
        b = _const_dtype(b, a.dtype)
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b, da
    ka, kb = _KIND_RANK[da.kind], _KIND_RANK[db.kind]
    if ka != kb:
        hi = da if ka > kb else db
        lo = db if ka > kb else da
        if hi.is_complex and lo.is_float and lo != hi.real:
            raise TraceError(f"{op}: dtype mismatch {_desc(a)} and {_desc(b)}; cast one with "
                             f".astype")
        return a, b, hi
    raise TraceError(f"{op}: dtype mismatch {_desc(a)} and {_desc(b)}; cast one with .astype")


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
            if isinstance(a, bool):
                raise TypeError
            a = operator.index(a)
        except TypeError:
            raise TraceError(f"{op}: axis {a!r} must be an int or a tuple of ints") from None
        if not -x.ndim <= a < x.ndim:  # a 0-d tensor has no axis (NumPy: AxisError)
            raise TraceError(f"{op}: axis {a!r} out of range for {_desc(x)}")
        out.append(a % x.ndim)
    if len(set(out)) != len(out):
        raise TraceError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(out))
