"""``@kp.fusion``: a tracing DSL that turns tensor math over symbolic shapes into a graph.

Calling the decorated function with *symbolic tensors* (one per ``kp.Tensor[...]`` parameter)
records every operation as a :class:`Node` of a :class:`Graph`. Dims are
:class:`~kernelpack.expr.Expr` (``x.shape[1]`` is the symbol ``n``), so output shapes come out
as expressions (``shl(1, n)`` for ``kp.arange(1 << n)``). The lowering
(:mod:`kernelpack.lowering`) turns the graph into kernels and the summary; this module is pure
Python and imports nothing heavy, so ``import kernelpack`` stays light.

Typing rules (kept small on purpose): Python numbers are *weak* (they take the tensor's dtype);
a value of a higher kind (bool < int < float < complex) absorbs a lower one; two tensors of the
same kind and different widths are a :class:`~kernelpack.errors.TraceError` (cast with
``.astype``) rather than a silent upcast.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .dtypes import DType, as_dtype, bool_, complex64, complex128, float32, float64, int64, uint64
from .errors import TraceError
from .expr import Expr, as_expr, const, emax, emin, select
from .summary import TensorType

__all__ = [
    "Node", "Graph", "Fusion", "Value", "fusion", "trace_value",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
    "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum", "min", "max",
    "arange", "iota", "complex", "real", "imag", "pad", "astype", "dim_expr",
]

UNARY = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
         "erf", "sigmoid", "floor", "ceil", "invert", "real", "imag")
FLOAT_ONLY = frozenset({"exp2", "log2", "rsqrt", "tan", "tanh", "erf", "sigmoid", "floor", "ceil"})
BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "max", "min", "lt", "le", "gt",
          "ge", "eq", "ne", "and", "or", "xor", "shl", "shr", "complex")
COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
BITWISE = frozenset({"and", "or", "xor", "shl", "shr"})
REDUCTIONS = ("sum", "prod", "max", "min", "mean")
_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


@dataclass(frozen=True)
class Node:
    """One operation of a traced graph. ``attrs`` holds plain, printable data only (strings,
    numbers, Exprs, tuples of those) so the graph serializes deterministically."""

    id: int
    op: str
    dtype: DType
    shape: tuple[Expr, ...]
    inputs: tuple[int, ...] = ()
    attrs: tuple = ()


@dataclass
class Graph:
    """A traced fusion: nodes in creation (topological) order, parameters, named outputs."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    params: list[tuple[str, str, DType, tuple[Expr, ...]]] = field(default_factory=list)
    outputs: list[tuple[str, int]] = field(default_factory=list)

    def add(self, op: str, dtype: DType, shape: Sequence[Expr], inputs: Sequence[int] = (),
            attrs: tuple = ()) -> "Value":
        node = Node(len(self.nodes), op, dtype, tuple(shape), tuple(inputs), attrs)
        self.nodes.append(node)
        return Value(self, node.id)

    def canonical(self) -> dict:
        """A JSON-ready description with no ids of Python objects: stable across processes."""
        def enc(a: object) -> object:
            if isinstance(a, Expr):
                return "expr:" + str(a)
            if isinstance(a, DType):
                return "dtype:" + a.name
            if isinstance(a, float):
                return "float:" + repr(a)
            if isinstance(a, tuple):
                return [enc(x) for x in a]
            return a
        return {
            "name": self.name,
            "params": [[n, k, d.name, [str(s) for s in shp]] for n, k, d, shp in self.params],
            "nodes": [[n.op, n.dtype.name, [str(s) for s in n.shape], list(n.inputs),
                       enc(n.attrs)] for n in self.nodes],
            "outputs": [[n, i] for n, i in self.outputs],
        }


# ---- traced values ----------------------------------------------------------------------------
class Value:
    """A symbolic tensor inside a trace: operators record nodes; nothing is computed."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # NumPy scalars on the left defer to us

    def __init__(self, graph: Graph, node_id: int) -> None:
        self.graph = graph
        self.id = node_id

    @property
    def node(self) -> Node:
        return self.graph.nodes[self.id]

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def shape(self) -> tuple[Expr, ...]:
        return self.node.shape

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def weak(self) -> bool:
        return self.node.op == "const" and bool(self.node.attrs[1])

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"<traced {self.dtype}[{dims}] from {self.node.op}>"

    def __bool__(self) -> bool:
        raise TraceError("the truth of a traced tensor is unknown while tracing; use kp.where")

    # arithmetic
    def __add__(self, o): return _binary("add", self, o)
    def __radd__(self, o): return _binary("add", o, self)
    def __sub__(self, o): return _binary("sub", self, o)
    def __rsub__(self, o): return _binary("sub", o, self)
    def __mul__(self, o): return _binary("mul", self, o)
    def __rmul__(self, o): return _binary("mul", o, self)
    def __truediv__(self, o): return _binary("div", self, o)
    def __rtruediv__(self, o): return _binary("div", o, self)
    def __floordiv__(self, o): return _binary("floordiv", self, o)
    def __rfloordiv__(self, o): return _binary("floordiv", o, self)
    def __mod__(self, o): return _binary("mod", self, o)
    def __rmod__(self, o): return _binary("mod", o, self)
    def __pow__(self, o): return pow(self, o)
    def __rpow__(self, o): return pow(o, self)
    def __and__(self, o): return _binary("and", self, o)
    def __rand__(self, o): return _binary("and", o, self)
    def __or__(self, o): return _binary("or", self, o)
    def __ror__(self, o): return _binary("or", o, self)
    def __xor__(self, o): return _binary("xor", self, o)
    def __rxor__(self, o): return _binary("xor", o, self)
    def __lshift__(self, o): return _binary("shl", self, o)
    def __rlshift__(self, o): return _binary("shl", o, self)
    def __rshift__(self, o): return _binary("shr", self, o)
    def __rrshift__(self, o): return _binary("shr", o, self)
    def __neg__(self): return _unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _unary("abs", self)
    def __invert__(self): return _unary("invert", self)
    def __lt__(self, o): return _binary("lt", self, o)
    def __le__(self, o): return _binary("le", self, o)
    def __gt__(self, o): return _binary("gt", self, o)
    def __ge__(self, o): return _binary("ge", self, o)
    def __eq__(self, o): return _binary("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return _binary("ne", self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    # methods
    def astype(self, dtype: object) -> "Value":
        return astype(self, dtype)

    @property
    def real(self) -> "Value":
        return real(self)

    @property
    def imag(self) -> "Value":
        return imag(self)

    def sum(self, axis=None, keepdims=False): return _reduce("sum", self, axis, keepdims)
    def prod(self, axis=None, keepdims=False): return _reduce("prod", self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return _reduce("max", self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return _reduce("min", self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return _reduce("mean", self, axis, keepdims)

    def __getitem__(self, key: object) -> "Value":
        """Only axis insertion: ``x[:, None]``, ``x[None]``, ``x[..., None]``."""
        items = key if isinstance(key, tuple) else (key,)
        if sum(1 for k in items if k is Ellipsis) > 1:
            raise TraceError(f"index {key!r}: at most one '...'")
        explicit = sum(1 for k in items if k is not None and k is not Ellipsis)
        for k in items:
            if not (k is None or k is Ellipsis or (isinstance(k, slice) and k == slice(None))):
                raise TraceError(f"index {key!r} on {self!r}: only ':', '...' and None "
                                 f"(new axis) are supported")
        if explicit > self.ndim:
            raise TraceError(f"index {key!r} has {explicit} axes, tensor has {self.ndim}")
        if Ellipsis not in items:
            items = items + (Ellipsis,)
        mapping: list[int | None] = []  # output axis -> input axis (None: new unit axis)
        src = 0
        for k in items:
            if k is None:
                mapping.append(None)
            elif k is Ellipsis:
                for _ in range(self.ndim - explicit):
                    mapping.append(src)
                    src += 1
            else:
                mapping.append(src)
                src += 1
        return _view(self, tuple(mapping))


def _graph_of(*values: object) -> Graph:
    for v in values:
        if isinstance(v, Value):
            return v.graph
    raise TraceError("kp operations need at least one traced tensor (call them inside @kp.fusion)")


def trace_value(graph: Graph, v: object, like: DType | None = None) -> Value:
    """Turn a Python number, an Expr (a dim) or a Value into a traced Value."""
    if isinstance(v, Value):
        if v.graph is not graph:
            raise TraceError("a traced tensor from another fusion was used")
        return v
    if isinstance(v, Expr):
        return graph.add("dim", int64, (), attrs=(v,))
    if isinstance(v, bool):
        return graph.add("const", bool_, (), attrs=(v, True))
    if isinstance(v, int):
        numeric = like is not None and like.kind in ("i", "u", "f", "c")
        return graph.add("const", like if numeric else int64, (), attrs=(v, True))
    if isinstance(v, float):
        dt = like if like is not None and like.kind in ("f", "c") else float64
        return graph.add("const", dt, (), attrs=(v, True))
    index = getattr(v, "__index__", None)
    if index is not None and not isinstance(v, (list, tuple)):
        return trace_value(graph, int(index()), like)
    raise TraceError(f"cannot use {v!r} ({type(v).__name__}) in a fusion: expected a traced "
                     f"tensor, a number or a dim")


def _const_dtype(v: Value, like: DType) -> Value:
    """Re-type a weak constant to ``like`` (a new node; the graph keeps the old one unused)."""
    node = v.node
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
            raise TraceError(f"{op}: dtype mismatch {da} and {db}; cast one with .astype")
        return a, b, hi
    raise TraceError(f"{op}: dtype mismatch {_desc(a)} and {_desc(b)}; cast one with .astype")


def _desc(v: Value) -> str:
    return f"{v.dtype}[{', '.join(str(d) for d in v.shape)}]"


def broadcast_shapes(op: str, *shapes: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """NumPy broadcasting with symbolic dims: equal dims match, a literal 1 stretches."""
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


def _binary(op: str, a: object, b: object) -> Value:
    g = _graph_of(a, b)
    like = b.dtype if isinstance(b, Value) else a.dtype if isinstance(a, Value) else None
    va = trace_value(g, a, like if not isinstance(a, Value) else None)
    vb = trace_value(g, b, va.dtype if not isinstance(b, Value) else None)
    va, vb, dt = _promote(op, va, vb)
    shape = broadcast_shapes(op, va.shape, vb.shape)
    if op in BITWISE and dt.kind not in "iub":
        raise TraceError(f"{op}: needs integer or bool operands (got {_desc(va)}, {_desc(vb)})")
    if op in ("shl", "shr") and dt.kind == "b":
        raise TraceError(f"{op}: needs integer operands (got {dt})")
    if op == "complex":
        if dt.kind != "f" or dt not in (float32, float64):
            raise TraceError(f"complex: needs float32 or float64 parts (got {_desc(va)}, "
                             f"{_desc(vb)})")
        return g.add(op, complex64 if dt == float32 else complex128, shape, (va.id, vb.id))
    if op in ("floordiv", "mod", "max", "min") and dt.is_complex:
        raise TraceError(f"{op}: not defined for complex operands ({dt})")
    if op in COMPARE:
        if dt.is_complex and op not in ("eq", "ne"):
            raise TraceError(f"{op}: complex numbers are not ordered")
        return g.add(op, bool_, shape, (va.id, vb.id))
    if op == "div" and dt.kind in "iub":
        va, vb, dt = astype(va, float64), astype(vb, float64), float64
    if op in ("add", "sub", "mul", "floordiv", "mod", "pow") and dt.kind == "b":
        raise TraceError(f"{op}: arithmetic on bool tensors; cast with .astype first")
    return g.add(op, dt, shape, (va.id, vb.id))


def _unary(op: str, x: object) -> Value | Expr | int:
    if not isinstance(x, Value):
        if op == "abs" and isinstance(x, int) and not isinstance(x, bool):
            return builtins.abs(x)
        if op == "abs" and isinstance(x, Expr):
            return select(x < 0, -x, x)
        raise TraceError(f"{op}: expects a traced tensor (got {x!r}); make one from a dim "
                         f"with kp.arange or x.astype")
    if op in ("real", "imag"):
        if not x.dtype.is_complex:
            return x if op == "real" else _zeros_like(x)
        return x.graph.add(op, x.dtype.real, x.shape, (x.id,))
    dt = x.dtype
    if op == "invert":
        if dt.kind not in "iub":
            raise TraceError(f"~: needs an integer or bool tensor (got {_desc(x)})")
        return x.graph.add(op, dt, x.shape, (x.id,))
    if op in ("neg", "abs"):
        if dt.kind == "b":
            raise TraceError(f"{op}: not defined for bool tensors")
        return x.graph.add(op, dt.real if op == "abs" else dt, x.shape, (x.id,))
    if dt.kind in "iub":
        x, dt = astype(x, float64), float64
    if dt.is_complex and op in FLOAT_ONLY | {"sin", "cos", "sqrt"}:
        raise TraceError(f"{op}: complex arguments are not supported (got {_desc(x)})")
    return x.graph.add(op, dt, x.shape, (x.id,))


def _zeros_like(x: Value) -> Value:
    zero = x.graph.add("const", x.dtype, (), attrs=(0, False))
    return _binary("mul", zero, x)


def _view(x: Value, mapping: tuple[int | None, ...]) -> Value:
    shape = tuple(const(1) if m is None else x.shape[m] for m in mapping)
    return x.graph.add("view", x.dtype, shape, (x.id,), attrs=(mapping,))


def _axes(op: str, x: Value, axis: object) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int) or not -x.ndim <= a < builtins.max(x.ndim, 1):
            raise TraceError(f"{op}: axis {a!r} out of range for {_desc(x)}")
        out.append(a % x.ndim)
    if len(set(out)) != len(out):
        raise TraceError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(out))


def _reduce(kind: str, x: Value, axis: object, keepdims: bool) -> Value:
    if not isinstance(x, Value):
        raise TraceError(f"{kind}: expects a traced tensor (got {x!r})")
    axes = _axes(kind, x, axis)
    dt = x.dtype
    if kind in ("max", "min") and dt.is_complex:
        raise TraceError(f"{kind}: complex numbers are not ordered")
    if kind in ("sum", "prod") and dt.kind in "bi" and dt.itemsize < 8:
        dt = int64
    elif kind in ("sum", "prod") and dt.kind == "u":
        dt = uint64
    elif kind == "mean" and dt.kind in "iub":
        x, dt = astype(x, float64), float64
    kept = tuple(const(1) if i in axes else d for i, d in enumerate(x.shape))
    red = x.graph.add("reduce", dt, kept, (x.id,), attrs=(kind, axes))
    if keepdims or not axes:
        return red
    return _view(red, tuple(i for i in range(x.ndim) if i not in axes))


# ---- public ops ----------------------------------------------------------------------------------
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


def pow(x: object, y: object) -> Value:  # noqa: A001
    """``x ** y``; a small integer exponent becomes multiplications (exact and fast)."""
    if isinstance(x, Value) and isinstance(y, int) and not isinstance(y, bool) and 0 <= y <= 8:
        if y == 0:
            return _binary("add", _zeros_like(x), 1)
        out = x
        for _ in range(y - 1):
            out = _binary("mul", out, x)
        return out
    return _binary("pow", x, y)


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


def astype(x: Value, dtype: object) -> Value:
    """Convert to ``dtype`` (NumPy ``astype`` semantics; complex → real keeps the real part)."""
    dt = as_dtype(dtype)
    if x.dtype == dt:
        return x
    return x.graph.add("cast", dt, x.shape, (x.id,))


def complex(re: object, im: object) -> Value:  # noqa: A001
    """``re + i·im`` from float32 (→ complex64) or float64 (→ complex128) parts."""
    return _binary("complex", re, im)


def real(x: Value) -> Value:
    return _unary("real", x)  # type: ignore[return-value]


def imag(x: Value) -> Value:
    return _unary("imag", x)  # type: ignore[return-value]


def arange(n: object, dtype: object = int64) -> Value:
    """``0, 1, ..., n-1`` where ``n`` is a dim expression (``1 << x.shape[1]``) or an int."""
    graph = _CURRENT[-1] if _CURRENT else None
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
    if not _CURRENT:
        raise TraceError("kp.iota is only available inside a @kp.fusion trace")
    dims = tuple(dim_expr(d) for d in shape)
    if not 0 <= axis < len(dims):
        raise TraceError(f"iota: axis {axis} out of range for shape {_fmt(dims)}")
    dt = as_dtype(dtype)
    if dt.is_complex or dt.kind == "b":
        raise TraceError(f"iota: dtype must be integer or float (got {dt})")
    return _CURRENT[-1].add("iota", dt, dims, attrs=(axis,))


def pad(x: Value, size: object, axis: int = -1) -> Value:
    """Zero-pad (at the end) axis ``axis`` of ``x`` to length ``size`` (an Expr or int; it must
    be at least the current length at run time)."""
    if not isinstance(x, Value):
        raise TraceError(f"pad: expects a traced tensor (got {x!r})")
    (ax,) = _axes("pad", x, axis)
    shape = list(x.shape)
    shape[ax] = dim_expr(size)
    return x.graph.add("pad", x.dtype, shape, (x.id,), attrs=(ax,))


# ---- the decorator ------------------------------------------------------------------------------
_CURRENT: list[Graph] = []


class Fusion:
    """A traced-on-demand fusion. ``trace(static=...)`` gives its :class:`Graph`."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None,
                 localns: Mapping[str, Any] | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        sig = inspect.signature(fn)
        try:
            # string annotations (``from __future__ import annotations``) may name locals of
            # the defining function, e.g. a dtype variable: evaluate them there too
            hints = inspect.get_annotations(fn, eval_str=True, locals=dict(localns or {}))
        except Exception as exc:
            raise TraceError(f"fusion {self.name}: cannot read annotations: {exc}") from exc
        self.params: list[tuple[str, object]] = []
        for p in sig.parameters.values():
            ann = hints.get(p.name)
            if not isinstance(ann, (TensorType, DType)):
                raise TraceError(f"fusion {self.name}: parameter {p.name!r} needs an annotation "
                                 f"kp.Tensor[dtype, dims...] or a scalar dtype such as kp.f32 "
                                 f"(got {ann!r})")
            if isinstance(ann, DType) and ann.is_complex:
                raise TraceError(f"fusion {self.name}: complex scalar {p.name!r} is not supported")
            self.params.append((p.name, ann))

    def __repr__(self) -> str:
        return f"<kp.fusion {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name} is a kp.fusion: compile it with kp.compile({self.name}) "
                        f"and call the loaded program")

    def trace(self, static: Mapping[str, int] | None = None) -> Graph:
        """Run the function on symbolic tensors. ``static`` fixes named dims to ints."""
        static = dict(static or {})
        fixed = {k: const(int(v)) for k, v in static.items()}
        g = Graph(self.name)
        args = []
        for pname, ann in self.params:
            if isinstance(ann, TensorType):
                shape = tuple(as_expr(d).substitute(fixed) for d in ann.dims)
                g.params.append((pname, "tensor", ann.dtype, shape))
                args.append(g.add("input", ann.dtype, shape, attrs=(pname,)))
            else:
                g.params.append((pname, "scalar", ann, ()))  # type: ignore[arg-type]
                args.append(g.add("scalar", ann, (), attrs=(pname,)))  # type: ignore[arg-type]
        _CURRENT.append(g)
        try:
            result = self.fn(*args)
        finally:
            _CURRENT.pop()
        items = _outputs(self.name, result)
        for oname, value in items:
            if oname in {p[0] for p in g.params}:
                raise TraceError(f"fusion {self.name}: output {oname!r} clashes with a parameter")
            v = trace_value(g, value)
            g.outputs.append((oname, v.id))
        _check_bound(g)
        return g

    def canonical_bytes(self, static: Mapping[str, int] | None = None,
                        options: Mapping[str, object] | None = None) -> bytes:
        """A deterministic serialization of the traced graph plus options: the cache key's
        ``source``. Stable across processes (no ids, hashes or addresses)."""
        doc = {"graph": self.trace(static).canonical(),
               "static": {k: int(v) for k, v in sorted((static or {}).items())},
               "options": {k: repr(v) for k, v in sorted((options or {}).items())}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _check_bound(g: Graph) -> None:
    """Every size must be computable from what the caller passes: input dims and integer
    scalars. Anything else could not be planned at load time."""
    bound: set[str] = set()
    for pname, kind, dt, shape in g.params:
        if kind == "tensor":
            bound.update(str(d.value) for d in shape if d.is_sym)
        elif dt.kind in "iub":
            bound.add(pname)
    for node in g.nodes:
        exprs = list(node.shape) + [a for a in node.attrs if isinstance(a, Expr)]
        for e in exprs:
            missing = e.symbols() - bound
            if missing:
                raise TraceError(f"fusion {g.name}: {node.op} uses dim(s) {sorted(missing)} that "
                                 f"no input shape or integer scalar binds (bound: {sorted(bound)}); "
                                 f"unbound symbol")


def _outputs(name: str, result: object) -> list[tuple[str, object]]:
    if isinstance(result, dict):
        items = list(result.items())
        for k, _ in items:
            if not isinstance(k, str) or not k.isidentifier():
                raise TraceError(f"fusion {name}: output names must be identifiers (got {k!r})")
        return items
    if isinstance(result, (tuple, list)):
        if not result:
            raise TraceError(f"fusion {name}: returns no outputs")
        return [(f"out{i}", v) for i, v in enumerate(result)]
    if result is None:
        raise TraceError(f"fusion {name}: returns nothing; return the output tensor(s)")
    return [("out", result)]


def fusion(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorate a function of ``kp.Tensor[...]``/scalar-annotated parameters as a fusion.

    Returns a :class:`Fusion`; ``kp.compile`` traces and lowers it. Usable as ``@kp.fusion`` or
    ``@kp.fusion(name="...")``.
    """
    caller = inspect.currentframe()
    localns = dict(caller.f_back.f_locals) if caller is not None and caller.f_back else {}
    del caller
    if fn is None:
        return lambda f: Fusion(f, name, localns)
    return Fusion(fn, name, localns)
