"""The public op functions of the fusion DSL: ``kp.exp``, ``kp.where``, ``kp.arange``, ...

Each is a thin, documented entry point over the builders and typing rules of
:mod:`kernelpack.tracing`; keeping them apart from those rules keeps each module about one thing
(``kp.pow`` and ``kp.astype`` live in :mod:`kernelpack.tracing`, because traced values' own
operators use them, and are re-exported here). Several names shadow builtins (``abs``, ``pow``,
``min``, ``max``, ``complex``) on purpose, mirroring NumPy; on plain ints and
:class:`~kernelpack.expr.Expr` dims the min/max/abs/where ops fall back to their symbolic forms.
Pure Python with no heavy imports: ``import kernelpack`` stays light.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .dtypes import as_dtype, bool_, int64
from .errors import TraceError
from .expr import Expr, as_expr, const, emax, emin, select
# The underscore builders are package-internal: this module and tracing are one layer, split
# so the rules and the public entry points each stay readable.
from .tracing import (Value, _axes, _binary, _desc, _fmt, _graph_of, _promote, _reduce, _unary,
                      astype, broadcast_shapes, current_graph, pow, trace_value)

__all__ = [
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
    "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum", "min", "max",
    "arange", "iota", "complex", "real", "imag", "pad", "astype", "dim_expr",
]


def _math(op: str) -> Callable[[object], Value]:
    def fn(x: object) -> Value:
        if isinstance(x, (int, float, Expr)) and not isinstance(x, bool):
            raise TraceError(f"kp.{op}: expects a traced tensor (got {x!r}); use "
                             f"kp.arange / x.astype to make one from a dim")
        return _unary(op, x)  # type: ignore[return-value]
    fn.__name__ = op
    fn.__doc__ = f"Elementwise ``{op}`` of a traced tensor (libdevice or an LLVM intrinsic)."
    return fn


exp, exp2, log, log2 = _math("exp"), _math("exp2"), _math("log"), _math("log2")
sqrt, rsqrt, sin, cos, tan = _math("sqrt"), _math("rsqrt"), _math("sin"), _math("cos"), _math("tan")
tanh, erf, sigmoid = _math("tanh"), _math("erf"), _math("sigmoid")
floor, ceil = _math("floor"), _math("ceil")


def abs(x: object) -> object:  # noqa: A001 - mirrors numpy/builtins
    """``|x|`` of a traced tensor (complex gives the magnitude); of an int or Expr, the
    symbolic absolute value."""
    return _unary("abs", x)


def maximum(a: object, b: object) -> object:
    """Elementwise maximum (NaN-propagating, like NumPy); on ints/Exprs, ``kp.emax``."""
    if not isinstance(a, Value) and not isinstance(b, Value):
        return emax(a, b)  # type: ignore[arg-type]
    return _binary("max", a, b)


def minimum(a: object, b: object) -> object:
    """Elementwise minimum (NaN-propagating); on ints/Exprs, ``kp.emin``."""
    if not isinstance(a, Value) and not isinstance(b, Value):
        return emin(a, b)  # type: ignore[arg-type]
    return _binary("min", a, b)


def max(a: object, b: object = None, *, axis=None, keepdims=False) -> object:  # noqa: A001
    """``kp.max(x, axis=...)`` reduces; ``kp.max(a, b)`` is the elementwise maximum."""
    if b is None:
        return _reduce("max", a, axis, keepdims) if isinstance(a, Value) else a
    return maximum(a, b)


def min(a: object, b: object = None, *, axis=None, keepdims=False) -> object:  # noqa: A001
    """``kp.min(x, axis=...)`` reduces; ``kp.min(a, b)`` is the elementwise minimum."""
    if b is None:
        return _reduce("min", a, axis, keepdims) if isinstance(a, Value) else a
    return minimum(a, b)


def where(cond: object, a: object, b: object) -> object:
    """``a`` where ``cond`` holds, else ``b`` (broadcasting); on Exprs, ``kp.select``."""
    if not any(isinstance(v, Value) for v in (cond, a, b)):
        return select(cond, a, b)  # type: ignore[arg-type]
    g = _graph_of(cond, a, b)
    vc = trace_value(g, cond)
    if vc.dtype != bool_:
        raise TraceError(f"where: condition must be bool (got {_desc(vc)})")
    like = a.dtype if isinstance(a, Value) else b.dtype if isinstance(b, Value) else None
    va = trace_value(g, a, like)
    vb = trace_value(g, b, va.dtype)
    va, vb, dt = _promote("where", va, vb)
    shape = broadcast_shapes("where", vc.shape, va.shape, vb.shape)
    return g.add("where", dt, shape, (vc.id, va.id, vb.id))


def complex(re: object, im: object) -> Value:  # noqa: A001
    """``re + i·im`` from float32 (→ complex64) or float64 (→ complex128) parts."""
    return _binary("complex", re, im)


def real(x: Value) -> Value:
    return _unary("real", x)  # type: ignore[return-value]


def imag(x: Value) -> Value:
    return _unary("imag", x)  # type: ignore[return-value]


def arange(n: object, dtype: object = int64) -> Value:
    """``0, 1, ..., n-1`` where ``n`` is a dim expression (``1 << x.shape[1]``) or an int."""
    graph = current_graph()
    if graph is None:
        raise TraceError("kp.arange is only available inside a @kp.fusion trace")
    return iota((n,), 0, dtype)


_EXPR_OPS = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "floordiv": "__floordiv__",
             "mod": "__mod__", "shl": "__lshift__", "shr": "__rshift__"}


def dim_expr(v: object) -> Expr:
    """A size as an Expr: an int, an Expr (``x.shape[0]``), or a traced integer computed from
    integer scalar parameters, dims and constants (``1 << n`` for a parameter ``n: kp.i64``)."""
    if isinstance(v, Value):
        node = v.node
        if node.dtype.kind not in "iu" or node.shape:
            raise TraceError(f"a size must be an integer scalar (got {_desc(v)})")
        if node.op == "scalar":
            return as_expr(node.attrs[0])
        if node.op == "const":
            return const(int(node.attrs[0]))
        if node.op == "dim":
            return node.attrs[0]
        if node.op == "cast":
            return dim_expr(Value(v.graph, node.inputs[0]))
        if node.op in _EXPR_OPS:
            a, b = (dim_expr(Value(v.graph, i)) for i in node.inputs)
            return getattr(a, _EXPR_OPS[node.op])(b)
        raise TraceError(f"size computed by {node.op!r} cannot be expressed symbolically")
    if isinstance(v, bool):
        raise TraceError(f"a size must be an integer (got {v!r})")
    try:
        return as_expr(v)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TraceError(f"a size must be an int, a dim or an integer scalar (got {v!r})") from exc


def iota(shape: Sequence[object], axis: int = 0, dtype: object = int64) -> Value:
    """A tensor of ``shape`` holding its index along ``axis``."""
    graph = current_graph()
    if graph is None:
        raise TraceError("kp.iota is only available inside a @kp.fusion trace")
    dims = tuple(dim_expr(d) for d in shape)
    if not 0 <= axis < len(dims):
        raise TraceError(f"iota: axis {axis} out of range for shape {_fmt(dims)}")
    dt = as_dtype(dtype)
    if dt.is_complex or dt.kind == "b":
        raise TraceError(f"iota: dtype must be integer or float (got {dt})")
    return graph.add("iota", dt, dims, attrs=(axis,))


def pad(x: Value, size: object, axis: int = -1) -> Value:
    """Zero-pad (at the end) axis ``axis`` of ``x`` to length ``size`` (an Expr or int; it must
    be at least the current length at run time)."""
    if not isinstance(x, Value):
        raise TraceError(f"pad: expects a traced tensor (got {x!r})")
    (ax,) = _axes("pad", x, axis)
    shape = list(x.shape)
    shape[ax] = dim_expr(size)
    if shape[ax].is_const and x.shape[ax].is_const and shape[ax].value < x.shape[ax].value:
        raise TraceError(f"pad: size {shape[ax]} is below the length {x.shape[ax]} of axis {ax} "
                         f"of {_desc(x)} (pad only adds zeros at the end)")
    return x.graph.add("pad", x.dtype, shape, (x.id,), attrs=(ax,))
