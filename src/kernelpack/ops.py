"""The public op functions of the fusion DSL: ``kp.exp``, ``kp.where``, ``kp.arange``, ...

Each is a thin, documented entry point over the builders and typing rules of
:mod:`kernelpack.tracing`; keeping them apart from those rules keeps each module about one thing
(``kp.pow`` and ``kp.astype`` live in :mod:`kernelpack.tracing`, because traced values' own
operators use them, and are re-exported here). Several names shadow builtins (``abs``, ``pow``,
``min``, ``max``, ``complex``) on purpose, mirroring NumPy; on plain ints and
:class:`~kernelpack.expr.Expr` dims the min/max/abs/where ops fall back to their symbolic forms,
and the math functions on plain Python numbers give the host's float, as ``np.sqrt(2)`` does.
Pure Python with no heavy imports: ``import kernelpack`` stays light.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, Callable, Sequence, cast

from .dtypes import DType, bool_, int64, is_numpy_bool, strict_index
from ._host_math import (as_float, host_extremum, host_where, on_host, plain_floats,
                         plain_numbers)
from .errors import TraceError
from .expr import Expr, as_expr, cdiv, const, emax, emin
from .limits import MAX_EXPR_DEPTH
from .promotion import dsl_dtype
# The underscore builders are package-internal: this module and tracing are one layer, split
# so the rules and the public entry points each stay readable.
from .tracing import (Value, _axes, _binary, _desc, _fmt, _graph_of, _promote,
                      _unary, astype, broadcast_shapes, conj, current_graph, pow, reduce_api,
                      reduction_keywords, trace_value)

__all__ = [
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
    "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum", "min", "max",
    "sum", "prod", "mean", "arange", "iota", "complex", "real", "imag", "conj", "pad", "astype",
    "dim_expr",
]


# The DSL's functions answer Any to a type checker: a traced tensor (Value) in a fusion, a
# Python float or int of plain numbers, an Expr of dims: a union would need narrowing at every
# use of the README's own fusions (review 37)
def _math(op: str) -> Callable[[Any], Any]:
    def fn(x: object) -> Any:
        if plain_numbers(x):
            return on_host(op, x)  # type: ignore[arg-type]
        if isinstance(x, builtins.complex):
            raise TraceError(f"kp.{op}: a Python complex number ({x!r}) is not computed on the "
                             f"host; pass it as a complex tensor or scalar parameter, or make "
                             f"it from traced float tensors with kp.complex(re, im)")
        graph = current_graph()
        if isinstance(x, Expr) and graph is not None:
            # kp.sqrt(x.shape[-1]): the dim as a traced int64 (a float64 result, weak beside
            # narrower float tensors, as math.sqrt's Python float is in NumPy)
            x = trace_value(graph, x)
        if isinstance(x, Expr):
            raise TraceError(f"kp.{op}: expects a traced tensor (got {x!r}); use "
                             f"kp.arange / x.astype to make one from a dim")
        return _unary(op, x)
    fn.__name__ = op
    fn.__qualname__ = f"kp.{op}"  # kp.exp(x, y): "kp.exp() takes 1 positional argument",
    # not "_math.<locals>.fn() takes ..."
    plain = ("an int stays the int; a float gives" if op in ("floor", "ceil")
             else "an int or a float gives")
    fn.__doc__ = (f"Elementwise ``{op}`` of a traced tensor (libdevice or an LLVM intrinsic). "
                  f"On a plain Python number, {plain} the float64 result computed on the host "
                  f"with NumPy's semantics (nan/inf, never an exception), so ``kp.{op}(2.0)`` "
                  f"is a weak scalar in a fusion, as the literal would be.")
    return fn


exp, exp2, log, log2 = _math("exp"), _math("exp2"), _math("log"), _math("log2")
sqrt, rsqrt, sin, cos, tan = _math("sqrt"), _math("rsqrt"), _math("sin"), _math("cos"), _math("tan")
tanh, erf, sigmoid = _math("tanh"), _math("erf"), _math("sigmoid")
floor, ceil = _math("floor"), _math("ceil")


def abs(x: object) -> Any:  # noqa: A001 - mirrors numpy/builtins
    """``|x|`` of a traced tensor (complex gives the magnitude); of an int or Expr, the
    symbolic absolute value; of a Python float, the float (``np.abs(-2.5)``)."""
    if isinstance(x, float):
        return float(builtins.abs(x))
    return _unary("abs", x)


def maximum(a: object, b: object) -> Any:
    """Elementwise maximum (NaN-propagating, like NumPy); on ints/Exprs, ``kp.emax``; on two
    plain numbers with a float among them, the host's float (``emax`` takes no float)."""
    if plain_floats(a, b):
        return host_extremum("maximum", cast(float, a), cast(float, b))
    if not isinstance(a, Value) and not isinstance(b, Value):
        return emax(a, b)  # type: ignore[arg-type]
    return _binary("max", a, b)


def minimum(a: object, b: object) -> Any:
    """Elementwise minimum (NaN-propagating); on ints/Exprs, ``kp.emin``; on two plain numbers
    with a float among them, the host's float."""
    if plain_floats(a, b):
        return host_extremum("minimum", cast(float, a), cast(float, b))
    if not isinstance(a, Value) and not isinstance(b, Value):
        return emin(a, b)  # type: ignore[arg-type]
    return _binary("min", a, b)


def _two_operands(name: str, axis: object, keepdims: object) -> None:
    """``kp.max(a, b, axis=0)`` used to ignore ``axis`` (and ``keepdims``) silently and give
    the elementwise maximum."""
    if axis is not None or keepdims:
        raise TraceError(f"kp.{name}(a, b) is the elementwise {name}imum and takes no axis or "
                         f"keepdims; reduce one tensor with kp.{name}(x, axis=...) (got "
                         f"axis={axis!r}, keepdims={keepdims!r})")


def max(a: object, b: object = None, *, axis: object = None,  # noqa: A001
        keepdims: object = False, **unknown: object) -> Any:
    """``kp.max(x, axis=...)`` reduces; ``kp.max(a, b)`` is the elementwise maximum."""
    reduction_keywords("max", unknown, "kp")
    if b is None:
        # keepdims checked as x.max() and kp.sum() check it (a non-bool kept the axis)
        return reduce_api("max", a, axis, None, None, keepdims) if isinstance(a, Value) else a
    _two_operands("max", axis, keepdims)
    return maximum(a, b)


def min(a: object, b: object = None, *, axis: object = None,  # noqa: A001
        keepdims: object = False, **unknown: object) -> Any:
    """``kp.min(x, axis=...)`` reduces; ``kp.min(a, b)`` is the elementwise minimum."""
    reduction_keywords("min", unknown, "kp")
    if b is None:
        # keepdims checked as x.min() and kp.sum() check it (a non-bool kept the axis)
        return reduce_api("min", a, axis, None, None, keepdims) if isinstance(a, Value) else a
    _two_operands("min", axis, keepdims)
    return minimum(a, b)


def _reduction(kind: str) -> Callable[..., Value]:
    def fn(x: object, axis: object = None, dtype: object = None, out: object = None,
           keepdims: object = False, **unknown: object) -> Value:
        reduction_keywords(kind, unknown, "kp")
        if not isinstance(x, Value):
            raise TraceError(f"kp.{kind}: expects a traced tensor (got {x!r:.60})")
        return reduce_api(kind, x, axis, dtype, out, keepdims)
    fn.__name__ = kind
    fn.__qualname__ = f"kp.{kind}"  # a misspelled keyword: "kp.sum() got an unexpected ..."
    fn.__doc__ = (f"``np.{kind}(x, axis, dtype, keepdims=...)`` of a traced tensor: the same "
                  f"as ``x.{kind}(...)``.")
    return fn


# NumPy's functional forms beside the methods (kp.max / kp.min are above: they also take two
# operands). Defined after every use of the builtins in this module.
sum, prod, mean = _reduction("sum"), _reduction("prod"), _reduction("mean")  # noqa: A001


def where(cond: object, a: object, b: object) -> Any:
    """``a`` where ``cond`` holds, else ``b`` (broadcasting). With no traced tensor: on plain
    numbers with a float branch, NumPy's float (computed on the host); on ints and Exprs,
    ``kp.select`` (see :func:`~kernelpack._host_math.host_where`)."""
    if not any(isinstance(v, Value) for v in (cond, a, b)):
        return host_where(cond, a, b)
    g = _graph_of(cond, a, b)
    vc = trace_value(g, cond)
    if isinstance(cond, Expr):  # kp.where(x.shape[0] > 3, ...): a symbolic comparison is 0/1
        vc = _binary("ne", vc, 0)
    if vc.dtype != bool_:
        # NumPy's truth of a number: non-zero is true (NaN too, -0.0 not), for any dtype
        vc = _binary("ne", vc, 0)
    like = a.dtype if isinstance(a, Value) else b.dtype if isinstance(b, Value) else None
    va = trace_value(g, a, like)
    vb = trace_value(g, b, va.dtype)
    va, vb, dt = _promote("where", va, vb)
    shape = broadcast_shapes("where", vc.shape, va.shape, vb.shape)
    return g.add("where", dt, shape, (vc.id, va.id, vb.id))


def complex(re: object, im: object) -> Any:  # noqa: A001
    """``re + i·im`` from float32 (→ complex64) or float64 (→ complex128) parts. Of two plain
    Python numbers, the Python complex computed on the host (a weak scalar in a fusion, as
    the literal ``1j`` is), as the math functions of plain numbers are: ``kp.exp(1j)``'s
    error points here."""
    if plain_numbers(re, im):
        parts = (as_float("kp.complex", re), as_float("kp.complex", im))  # type: ignore[arg-type]
        return builtins.complex(*parts)
    return _binary("complex", re, im)


def real(x: Value) -> Value:
    return _unary("real", x)  # type: ignore[return-value]


def imag(x: Value) -> Value:
    return _unary("imag", x)  # type: ignore[return-value]


def _is_dtype(v: object) -> bool:
    if isinstance(v, (bool, int, Expr, Value)):
        return False
    try:
        dsl_dtype(v)
    except TypeError:
        return False
    return True


def _dtype(op: str, v: object) -> DType:
    try:
        return dsl_dtype(v)
    except TypeError as exc:
        raise TraceError(f"{op}: {exc}") from None


def arange(start: object, stop: object = None, step: object = None,
           dtype: object = None) -> Value:
    """NumPy's ``arange`` over sizes: ``kp.arange(n)`` is ``0, 1, ..., n-1`` for a dim
    expression (``1 << x.shape[1]``), an int or an integer scalar; ``kp.arange(start, stop,
    step)`` takes such bounds and a nonzero int step (empty where the range is). The second
    argument may also be the dtype (``kp.arange(n, kp.f32)``), as before; ``kp.arange(0, n)``
    used to read n as a dtype (a raw TypeError)."""
    graph = current_graph()
    if graph is None:
        raise TraceError("kp.arange is only available inside a @kp.fusion trace")
    if stop is not None and step is None and dtype is None and _is_dtype(stop):
        stop, dtype = None, stop
    dt = int64 if dtype is None else _dtype("kp.arange", dtype)
    if stop is None and step is None:
        return iota((_at_least_zero(dim_expr(start), graph),), 0, dt)
    if stop is None:
        start, stop = 0, start
    lo, hi = dim_expr(start), dim_expr(stop)
    try:
        by = 1 if step is None else strict_index(step)
    except TypeError:
        raise TraceError(f"kp.arange: step must be a nonzero int (got {step!r:.40})") from None
    if by == 0:
        raise TraceError("kp.arange: step must be a nonzero int (got 0)")
    if lo.is_const and lo.value == 0 and by == 1:
        return iota((_at_least_zero(hi, graph),), 0, dt)  # the same as kp.arange(stop)
    count = emax(cdiv(hi - lo, by) if by > 0 else cdiv(lo - hi, -by), 0)
    idx: Any = iota((count,), 0, int64)
    if by != 1:
        idx = idx * by
    return (idx + lo).astype(dt)


_NONNEG_ALL = frozenset({"add", "mul", "floordiv", "ceildiv", "min"})
_BOOLEAN = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"})


def _at_least_zero(n: Expr, graph: Any) -> Expr:
    """``max(n, 0)`` unless ``n`` is known not to be negative: NumPy's ``arange`` of a negative
    count is empty, while an output dim that evaluates below 0 is a ConstraintError at plan
    time (``kp.arange(x.shape[0] - 1)`` for an empty ``x``). A plain dim (``arange(n)``,
    ``arange(1 << n)``) keeps its shape, so it still broadcasts against tensors of dim ``n``."""
    dims = frozenset(d.value for _, kind, _, shape in graph.params if kind == "tensor"
                     for d in shape if d.op == "sym")

    def nonneg(e: Expr) -> bool:
        if e.op == "const":
            return int(e.value) >= 0  # type: ignore[arg-type]
        if e.op == "sym":
            return e.value in dims  # a tensor's dim; a scalar parameter may be negative
        if e.op in _BOOLEAN:
            return True
        if e.op in _NONNEG_ALL:
            return all(nonneg(a) for a in e.args)
        if e.op in ("shl", "shr"):  # a negative count or shl into the sign fails the plan
            return nonneg(e.args[0])
        if e.op == "max":
            return any(nonneg(a) for a in e.args)
        if e.op == "select":
            return nonneg(e.args[1]) and nonneg(e.args[2])
        return False

    if nonneg(n):
        return n
    return const(0) if n.is_const else emax(n, 0)


_EXPR_OPS = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "floordiv": "__floordiv__",
             "mod": "__mod__", "shl": "__lshift__", "shr": "__rshift__"}


def _power_of_two(base: Value, exponent: Value) -> Expr:
    """``2 ** n`` (``4 ** n``, ...) as a size: ``1 << (k·n)`` for a base of ``2 ** k``, which
    the summary's expressions can say (they have no power); how a user writes "N = 2^n". A
    negative or too large ``n`` fails at plan time like ``1 << n``."""
    b, n = dim_expr(base), dim_expr(exponent)
    if b.is_const and int(b.value) >= 1 and int(b.value) & (int(b.value) - 1) == 0:  # type: ignore[arg-type]
        k = int(b.value).bit_length() - 1  # type: ignore[arg-type]
        return const(1) << (n if k == 1 else n * k)
    raise TraceError(f"a size computed as ({b}) ** ({n}) cannot be expressed symbolically: "
                     f"only a power-of-two base is (2 ** n, the same as 1 << n)")


def dim_expr(v: object) -> Expr:
    """A size as an Expr: an int, an Expr (``x.shape[0]``), or a traced integer computed from
    integer scalar parameters, dims and constants (``1 << n`` for a parameter ``n: kp.i64``).
    A size nested deeper than a summary may hold is refused here, by name: ``kp.arange`` of
    one ran out of Python's stack, and ``kp.iota``/``kp.pad`` compiled what ``kp.save`` then
    refused (review 35)."""
    try:
        e = _dim_expr(v)
    except RecursionError:  # a size traced through more steps than Python's stack allows
        e = None
    if e is None or e._depth > MAX_EXPR_DEPTH - SIZE_DEPTH_MARGIN:
        graph = current_graph()
        where = f"fusion {graph.name}: " if graph is not None else ""
        deep = "computed in too many traced steps" if e is None else \
            f"nested {e._depth} deep"
        raise TraceError(f"{where}a size expression is {deep}, deeper than a summary may hold "
                         f"once a launch's grid or a constraint wraps it (MAX_EXPR_DEPTH "
                         f"{MAX_EXPR_DEPTH}, less {SIZE_DEPTH_MARGIN}): it could be compiled "
                         f"but never saved, cached or loaded")
    return e


# The levels a summary may add around a size: a grid's cdiv of it, a variant's or a
# constraint's comparison of it (a size of depth 255 traced, then failed at kp.save).
SIZE_DEPTH_MARGIN = 16


def _dim_expr(v: object) -> Expr:
    """:func:`dim_expr` before its depth check."""
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
            return _dim_expr(Value(v.graph, node.inputs[0]))
        if node.op in _EXPR_OPS:
            a, b = (_dim_expr(Value(v.graph, i)) for i in node.inputs)
            return getattr(a, _EXPR_OPS[node.op])(b)
        if node.op == "pow":
            return _power_of_two(*(Value(v.graph, i) for i in node.inputs))
        raise TraceError(f"size computed by {node.op!r} cannot be expressed symbolically")
    if isinstance(v, bool) or is_numpy_bool(v):
        raise TraceError(f"a size must be an integer (got {v!r})")
    if not isinstance(v, (int, str, Expr)) and hasattr(v, "__index__"):
        v = operator.index(v)  # np.int64(4)
    try:
        return as_expr(v)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:  # ValueError: an int outside int64
        raise TraceError(f"a size must be an int64, a dim or an integer scalar (got "
                         f"{v!r:.60}): {exc}") from None


def iota(shape: Sequence[object] | object, axis: int = 0, dtype: object = int64) -> Value:
    """A tensor of ``shape`` (a sequence of sizes, or one size for 1-D) holding its index
    along ``axis`` (negative counts from the end, as NumPy's axes do)."""
    graph = current_graph()
    if graph is None:
        raise TraceError("kp.iota is only available inside a @kp.fusion trace")
    items = shape if isinstance(shape, (tuple, list)) else (shape,)
    dims = tuple(dim_expr(d) for d in items)
    # (a constant's value is an int)
    negative = [d for d in dims if d.is_const and d.value < 0]  # type: ignore[operator]
    if negative:
        raise TraceError(f"iota: shape {_fmt(dims)} has a negative size")
    try:
        ax = strict_index(axis)
    except TypeError:
        raise TraceError(f"iota: axis must be an int (got {axis!r:.40})") from None
    if not -len(dims) <= ax < len(dims):
        raise TraceError(f"iota: axis {ax} out of range for shape {_fmt(dims)}")
    dt = _dtype("iota", dtype)
    if dt.is_complex or dt.kind == "b":
        raise TraceError(f"iota: dtype must be integer or float (got {dt})")
    return graph.add("iota", dt, dims, attrs=(ax % len(dims),))


def pad(x: Value, size: object, axis: int = -1) -> Value:
    """Zero-pad (at the end) axis ``axis`` of ``x`` to length ``size`` (an Expr or int; it must
    be at least the current length at run time)."""
    if not isinstance(x, Value):
        raise TraceError(f"pad: expects a traced tensor (got {x!r})")
    (ax,) = _axes("pad", x, axis)
    shape = list(x.shape)
    shape[ax] = dim_expr(size)
    if shape[ax].is_const and shape[ax].value < 0:  # type: ignore[operator]
        raise TraceError(f"pad: size {shape[ax]} of axis {ax} of {_desc(x)} is negative")
    if (shape[ax].is_const and x.shape[ax].is_const  # (a constant's value is an int)
            and shape[ax].value < x.shape[ax].value):  # type: ignore[operator]
        raise TraceError(f"pad: size {shape[ax]} is below the length {x.shape[ax]} of axis {ax} "
                         f"of {_desc(x)} (pad only adds zeros at the end)")
    return x.graph.add("pad", x.dtype, shape, (x.id,), attrs=(ax,))
