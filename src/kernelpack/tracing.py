"""Traced tensor values and the typing rules every traced operation goes through.

Inside a ``@kp.fusion`` trace, parameters are :class:`Value` handles: their operators record
nodes of a :class:`~kernelpack.graph.Graph` and compute nothing. This module holds what all ops
share — turning numbers and dims into values, dtype promotion, symbolic broadcasting, and the
unary/binary/reduction/view builders — apart from the public op functions
(:mod:`kernelpack.ops`) and the decorator (:mod:`kernelpack.fusion`), so the rules live in one
place. Pure Python with no heavy imports: ``import kernelpack`` stays light. The typing rules
themselves (promotion, weak constants and sizes, numbers into values, dtypes as NumPy names
them) are in :mod:`kernelpack.promotion`, broadcasting, reduction axes and indexing in
:mod:`kernelpack.shape_rules`; NumPy ufuncs on traced values map to kp ops in
:mod:`kernelpack.numpy_interop`.
"""

from __future__ import annotations

import builtins
from typing import Any

from .dtypes import (DType, bfloat16, bool_, complex64, complex128, float16, float32, float64,
                     int8, int64, uint64)
from ._host_math import host_pow, plain_numbers
from .errors import TraceError
from .expr import Expr, const, select
from .graph import BITWISE, COMPARE, Graph, Node, active_graph, current_graph
from .promotion import (_from_dims, _promote, dsl_dtype, from_sizes, known_comparison,
                        math_dtype, plain_int, trace_value, widen_for_comparison)
from .shape_rules import _axes, _desc, _fmt, broadcast_shapes, index_axes

__all__ = ["Value", "trace_value", "broadcast_shapes", "astype", "pow", "conj", "active_graph",
           "current_graph", "reduce_api", "reduction_keywords", "hashing_explained"]

# ---- traced values ----------------------------------------------------------------------------
class _NoAttribute(TraceError, AttributeError):
    """A missing attribute of a traced tensor (``x.T``, ``x.reshape``): a TraceError for the
    user, still an AttributeError for ``hasattr`` and Python's protocols."""


class _ShapeIndexError(TraceError, IndexError):
    """``x.shape[i]`` past the rank: a TraceError naming the shape, still an IndexError."""


class _Shape(tuple):
    """``x.shape``: the dims (:class:`~kernelpack.expr.Expr`), indexable like any tuple; an
    index past the rank names the tensor's shape instead of a bare "tuple index out of
    range"."""

    __slots__ = ()

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        try:
            return tuple.__getitem__(self, i)
        except IndexError:
            raise _ShapeIndexError(f"shape index {i!r} out of range for a tensor of shape "
                                   f"{_fmt(tuple(self))} (rank {len(self)})") from None


class _HashedValue(TraceError, TypeError):
    """A traced tensor hashed inside a fusion's function: a TraceError that says how it came
    about, still the TypeError Python raised (``except TypeError`` keeps working)."""


class hashing_explained:
    """``with hashing_explained(fusion):`` around a fusion's function: a TypeError that Python
    raised on hashing a traced tensor comes out as a TraceError that says how it came about.

    Why: a :class:`Value` is unhashable (``__hash__ = None``, as a NumPy array), so a fusion
    written over ``@functools.cache`` / ``lru_cache`` (which hash their arguments), or one that
    puts a tensor in a set or uses it as a dict key, failed with a bare "unhashable type:
    'Value'" that named neither the cause nor the fix. Python's own wording is matched, since
    only the message tells this TypeError from others (3.14 words it "cannot use 'Value' as a
    dict key (unhashable type: 'Value')"). An inlined fusion's error is named by it and passes
    the enclosing fusions unchanged (no longer a plain TypeError). A class, not a generator
    context manager: every trace of a warm start's cache hits runs one (~0.3 against ~2 µs)."""

    __slots__ = ("fusion",)

    def __init__(self, fusion: str) -> None:
        self.fusion = fusion

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if kind is TypeError and f"unhashable type: '{Value.__name__}'" in str(exc):
            raise _HashedValue(
                f"fusion {self.fusion}: a traced tensor was hashed: it stands for values only "
                f"known when the kernel runs, so it cannot be a dict key or a set member, nor "
                f"pass through a decorator that hashes its arguments (functools.cache, "
                f"functools.lru_cache): apply @kp.fusion to the function itself ({exc})"
            ) from exc


def _no_value(what: str) -> TraceError:
    return TraceError(f"{what} of a traced tensor: it has no value while tracing; use kp ops "
                      f"(kp.exp, .astype, kp.where, x.shape[i] for sizes)")


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
        return _Shape(self.node.shape)

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def size(self) -> Expr:
        """The element count, like NumPy's ``size``: the product of the dims."""
        total: Expr = const(1)
        for d in self.node.shape:
            total = total * d
        return total

    @property
    def weak(self) -> bool:
        return self.node.op == "const" and bool(self.node.attrs[1])

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"<traced {self.dtype}[{dims}] from {self.node.op}>"

    def __bool__(self) -> bool:
        if from_sizes(self):
            # np.arange(x.shape[0]) and range() get here: NumPy divides the size by the step
            # (a traced value) and asks whether the result is positive
            raise TraceError(f"the truth of {_desc(self)} computed from sizes is unknown while "
                             f"tracing (sizes are known only at launch); use kp.arange for "
                             f"np.arange/range of a size, kp.where for a choice")
        raise TraceError("the truth of a traced tensor is unknown while tracing; use kp.where")

    def __getattr__(self, name: str) -> object:
        # only reached for names Value lacks: NumPy methods such as x.reshape or x.T; for
        # the ones a port reaches for (x.clip, x.round, x.var), what to write instead
        from .numpy_interop import numpy_hint

        hint = numpy_hint(name, "")
        raise _NoAttribute(f"traced tensors have no attribute {name!r} (supported: astype, "
                           f"real, imag, conj, sum, prod, max, min, mean, shape, size, dtype, "
                           f"ndim, indexing with None)" + (f"; {hint}" if hint else ""))

    def __len__(self) -> int:
        raise _no_value("len()")

    def __float__(self) -> float:
        raise _no_value("float()")

    def __int__(self) -> int:
        raise _no_value("int()")

    def __complex__(self) -> complex:
        raise _no_value("complex()")

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
    def __pow__(self, o): return _power(self, o)
    def __rpow__(self, o): return _power(o, self)
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
    def astype(self, dtype: object, order: str = "K", casting: str = "unsafe",
               subok: bool = True, copy: bool = True) -> "Value":
        """NumPy's ``astype`` signature: ``copy=False`` (common in NumPy code) means nothing in
        a fusion, which never aliases; memory order, subclasses and a casting rule other than
        NumPy's default ``"unsafe"`` do not exist here, so they are refused by name."""
        if order not in ("K", "A", "C") or casting != "unsafe" or subok is not True:
            raise TraceError(f"astype of {_desc(self)}: order={order!r}, casting={casting!r}, "
                             f"subok={subok!r} are not supported (a fusion casts elementwise, "
                             f"as NumPy's casting='unsafe')")
        return astype(self, dtype)

    @property
    def real(self) -> "Value":
        return _unary("real", self)  # type: ignore[return-value]

    @property
    def imag(self) -> "Value":
        return _unary("imag", self)  # type: ignore[return-value]

    def conj(self) -> "Value":
        return conj(self)

    conjugate = conj

    # NumPy's signatures: x.sum(0, np.float64) passes a dtype, x.max(0, None, True) keepdims
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **unknown):
        reduction_keywords("sum", unknown)
        return reduce_api("sum", self, axis, dtype, out, keepdims)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, **unknown):
        reduction_keywords("prod", unknown)
        return reduce_api("prod", self, axis, dtype, out, keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **unknown):
        reduction_keywords("mean", unknown)
        return reduce_api("mean", self, axis, dtype, out, keepdims)

    def max(self, axis=None, out=None, keepdims=False, **unknown):
        reduction_keywords("max", unknown)
        return reduce_api("max", self, axis, None, out, keepdims)

    def min(self, axis=None, out=None, keepdims=False, **unknown):
        reduction_keywords("min", unknown)
        return reduce_api("min", self, axis, None, out, keepdims)

    # NumPy functions (np.exp(x), np.maximum(x, 0)) on traced tensors: kernelpack.numpy_interop
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from .numpy_interop import array_ufunc

        return array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from .numpy_interop import array_function

        return array_function(func, args, kwargs)

    def __matmul__(self, o): raise _unsupported("@ (matrix product)", self, o)
    def __rmatmul__(self, o): raise _unsupported("@ (matrix product)", o, self)
    def __divmod__(self, o): return _binary("floordiv", self, o), _binary("mod", self, o)
    def __rdivmod__(self, o): return _binary("floordiv", o, self), _binary("mod", o, self)

    def __round__(self, ndigits=None):
        from .numpy_interop import numpy_hint

        raise TraceError(f"round() is not supported on traced tensors (got {_desc(self)}); "
                         f"{numpy_hint('round', '')}")

    def __iter__(self):
        raise _unsupported("iteration", self)

    def __contains__(self, item):
        raise _unsupported("'in'", self)

    def __getitem__(self, key: object) -> "Value":
        """Only axis insertion: ``x[:, None]``, ``x[None]``, ``x[..., None]``."""
        return _view(self, index_axes(key, self))

    def __setitem__(self, key: object, value: object) -> None:
        raise TraceError(f"item assignment is not supported on traced tensors (got "
                         f"{_desc(self)}[...] = ...): a fusion builds new values; write "
                         f"kp.where(mask, value, x) and return it")


def _unsupported(what: str, *operands: object) -> TraceError:
    got = ", ".join(_desc(v) if isinstance(v, Value) else type(v).__name__ for v in operands)
    return TraceError(f"{what} is not supported on traced tensors (got {got}); fusions hold "
                      f"elementwise math, broadcasting and reductions")


def _graph_of(*values: object) -> Graph:
    for v in values:
        if isinstance(v, Value):
            return v.graph
    if current_graph() is not None:  # inside a fusion: "call them inside" would mislead
        raise TraceError(f"kp operations need at least one traced tensor among their operands "
                         f"(got {', '.join(f'{v!r:.40}' for v in values)})")
    raise TraceError("kp operations need at least one traced tensor (call them inside @kp.fusion)")


def _binary(op: str, a: object, b: object) -> Value:
    g = _graph_of(a, b)
    if op in COMPARE:
        a, b = plain_int(a), plain_int(b)
        known = known_comparison(op, a, b)
        if known is not None:  # u64 > -1, i64 < 2**63: the same for every element
            t = a if isinstance(a, Value) else b
            return _binary("eq" if known else "ne", _zeros_like(t), 0)  # type: ignore[arg-type]
        a, b = widen_for_comparison(a, b), widen_for_comparison(b, a)
    like = b.dtype if isinstance(b, Value) else a.dtype if isinstance(a, Value) else None
    va = trace_value(g, a, like if not isinstance(a, Value) else None)
    vb = trace_value(g, b, va.dtype if not isinstance(b, Value) else None)
    va, vb, dt = _promote(op, va, vb)
    shape = broadcast_shapes(op, va.shape, vb.shape)
    if op in BITWISE and dt.kind not in "iub":
        raise TraceError(f"{op}: needs integer or bool operands (got {_desc(va)}, {_desc(vb)})")
    if op in ("shl", "shr") and dt.kind == "b":  # NumPy shifts two bools in int8
        va, vb, dt = astype(va, int8), astype(vb, int8), int8
    if op == "complex":
        if dt.kind != "f" or dt not in (float32, float64):
            raise TraceError(f"complex: needs float32 or float64 parts (got {_desc(va)}, "
                             f"{_desc(vb)})")
        return g.add(op, complex64 if dt == float32 else complex128, shape, (va.id, vb.id))
    if op in ("floordiv", "mod", "max", "min") and dt.is_complex:
        raise TraceError(f"{op}: not defined for complex operands (got {_desc(va)}, "
                         f"{_desc(vb)})")
    if op == "pow" and dt.is_complex:  # small integer exponents never get here (see pow)
        raise TraceError(f"pow: complex powers support only integer exponents -8..8 (got "
                         f"{_desc(va)} ** {_desc(vb)})")
    if op in COMPARE:
        if dt.is_complex and op not in ("eq", "ne"):
            raise TraceError(f"{op}: complex numbers are not ordered (got {_desc(va)}, "
                             f"{_desc(vb)})")
        return g.add(op, bool_, shape, (va.id, vb.id))
    if op == "div" and dt.kind in "iub":
        va, vb, dt = astype(va, float64), astype(vb, float64), float64
    if op in ("add", "mul") and dt.kind == "b":  # NumPy: logical or / and, still bool
        return g.add("or" if op == "add" else "and", dt, shape, (va.id, vb.id))
    if op in ("floordiv", "mod", "pow") and dt.kind == "b":  # NumPy computes these in int8
        va, vb, dt = astype(va, int8), astype(vb, int8), int8
    if op == "sub" and dt.kind == "b":
        raise TraceError(f"{op}: arithmetic on bool tensors ({_desc(va)}, {_desc(vb)}); NumPy "
                         f"refuses it too: use ^ or cast with .astype first")
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
            if op == "abs":
                return x  # NumPy: the absolute value of a bool is itself
            raise TraceError(f"{op}: not defined for bool tensors (got {_desc(x)})")
        return x.graph.add(op, dt.real if op == "abs" else dt, x.shape, (x.id,))
    if op in ("floor", "ceil") and dt.kind in "iub":
        return x  # integral already: NumPy 2 keeps the dtype (no float64 round trip)
    if dt.kind in "iub":
        dt = math_dtype(dt)
        x = astype(x, dt)
    if dt.is_complex and op != "exp":  # the lowering has complex neg, abs, real, imag, exp
        raise TraceError(f"{op}: complex arguments are not supported (got {_desc(x)})")
    return x.graph.add(op, dt, x.shape, (x.id,))


def conj(x: object) -> Value:
    """NumPy's ``conjugate``: ``re - i·im`` for a complex tensor (the imaginary part negated, so
    ``0j`` gives ``-0j`` as in NumPy), the tensor itself for a real or bool one."""
    if not isinstance(x, Value):
        raise TraceError(f"conj: expects a traced tensor (got {x!r:.80})")
    if not x.dtype.is_complex:
        return x
    return _binary("complex", _unary("real", x), _unary("neg", _unary("imag", x)))


def _zeros_like(x: Value) -> Value:
    """Zeros of ``x``'s dtype and shape that never depend on its values: ``0 * x`` would be NaN
    where x is NaN or infinite, where NumPy's ``x.imag`` (real x) and ``x ** 0`` give 0 and 1.
    A select on a constant condition: the code generator folds it to the constant."""
    g = x.graph
    true = g.add("const", bool_, (), attrs=(True, False))
    zero = g.add("const", x.dtype, (), attrs=(0, False))
    return g.add("where", x.dtype, x.shape, (true.id, zero.id, x.id))


def _view(x: Value, mapping: tuple[int | None, ...]) -> Value:
    shape = tuple(const(1) if m is None else x.shape[m] for m in mapping)
    return x.graph.add("view", x.dtype, shape, (x.id,), attrs=(mapping,))


def _reduce(kind: str, x: Value, axis: object, keepdims: bool) -> Value:
    if not isinstance(x, Value):
        raise TraceError(f"{kind}: expects a traced tensor (got {x!r})")
    axes = _axes(kind, x, axis)
    dt = x.dtype
    if kind in ("max", "min") and dt.is_complex:
        raise TraceError(f"{kind}: complex numbers are not ordered (got {_desc(x)})")
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


def reduction_keywords(kind: str, unknown: dict, owner: str = "x") -> None:
    """TypeError for keywords a reduction does not take, as Python words it, with a hint
    for torch's spellings (``x.mean(dim=-1, keepdim=True)``, the commonest port of a torch
    kernel): kernelpack reads NumPy's ``axis=``/``keepdims=``. ``owner``: "x" for the method,
    "kp" for the function."""
    if not unknown:
        return
    key = next(iter(unknown))
    hint = (": kernelpack takes NumPy's axis= and keepdims=, not torch's dim= and keepdim="
            if key in ("dim", "keepdim") else "")
    raise TypeError(f"{owner}.{kind}() got an unexpected keyword argument {key!r}{hint}")


def reduce_api(kind: str, x: Value, axis: object, dtype: object, out: object,
               keepdims: object) -> Value:
    """A reduction as NumPy's method takes it. ``dtype=`` reduces in that dtype and returns
    it (``x.sum(-1, np.float64)``: the float64 sum of a float32 tensor); ``out=`` cannot be
    honoured (a fusion's outputs are what it returns). ``keepdims`` must be a bool: a dtype
    passed where NumPy expects it (``x.sum(0, kp.f64)``) used to land in keepdims and keep
    the axis silently."""
    if out is not None:
        raise TraceError(f"{kind}: out= is not supported in a fusion (return the result; got "
                         f"out={out!r:.60})")
    flag = getattr(getattr(keepdims, "dtype", None), "kind", None) == "b" or (
        isinstance(keepdims, int) and keepdims in (0, 1))  # bool, np.bool_, 0/1
    if not flag:
        raise TraceError(f"{kind}: keepdims must be True or False (got {keepdims!r:.60})")
    if dtype is None or not isinstance(x, Value):
        return _reduce(kind, x, axis, bool(keepdims))
    x = astype(x, dtype)
    if kind == "mean" and x.dtype.kind in "iu":
        # NumPy's integer mean: the sum in that dtype (wrapping), then divided and truncated
        # (np.mean(i32, dtype=np.int32)); a float64 mean cast back kept the bits past 32
        count: Expr = const(1)
        for a in _axes(kind, x, axis):
            count = count * x.shape[a]
        total = astype(astype(_reduce("sum", x, axis, bool(keepdims)), x.dtype), float64)
        return astype(_binary("div", total, count), x.dtype)
    return astype(_reduce(kind, x, axis, bool(keepdims)), x.dtype)


def astype(x: Value, dtype: object) -> Value:
    """Convert to ``dtype`` (NumPy ``astype`` semantics; complex → real keeps the real part)."""
    try:
        dt = dsl_dtype(dtype)
    except TypeError as exc:
        raise TraceError(f"astype of {_desc(x)}: {exc}") from None
    if x.dtype == dt:
        return x
    return x.graph.add("cast", dt, x.shape, (x.id,))


def pow(x: object, y: object) -> Any:  # noqa: A001 (Any: see ops._math)
    """``kp.pow(x, y)``, NumPy's ``np.power``: as ``x ** y``, except that a bool base with an
    int exponent is int64 (``np.power(b, 2)``), where the operator's ``b ** 2`` is NumPy's int8
    ``square``. Two plain Python numbers give the host's result (``host_pow``); a dim
    (``x.shape[0]``) with no tensor is what ``x.shape[0] ** 2`` is in a trace."""
    if plain_numbers(x, y):
        return host_pow(x, y)  # type: ignore[arg-type]
    if (isinstance(x, Expr) or isinstance(y, Expr)) and current_graph() is not None \
            and not isinstance(x, Value) and not isinstance(y, Value):
        return x ** y  # type: ignore[operator,no-any-return]
    if isinstance(x, Value) and x.dtype == bool_ and isinstance(y, int) \
            and not isinstance(y, bool):
        x = astype(x, int64)
    return _power(x, y)


def _power(x: object, y: object) -> Value:
    """``x ** y``; a small integer exponent becomes multiplications (exact and fast), a small
    negative one on a complex base their reciprocal (NumPy's result, nan+nanj for a zero base;
    complex pow is otherwise not lowered). An integer base with a negative literal exponent is
    an error, as in NumPy.
    A float base takes NumPy's exact forms: ``** 0.5`` is ``sqrt``, ``** -1`` ``1 / x`` (powf
    is up to 2 ulp off), ``** 2.0`` a square. A NumPy number as exponent takes the same forms
    as the Python number of its value (NumPy's own power does: ``x ** np.float32(0.5)`` is
    its sqrt, so ``-0.0`` stays ``-0.0``)."""
    if (y.__class__.__module__ == "numpy" and getattr(y, "ndim", None) == 0
            and getattr(getattr(y, "dtype", None), "kind", "") in ("f", "i", "u")):
        y = y.item()  # type: ignore[attr-defined]
    if isinstance(x, Value) and x.dtype.kind == "f" and isinstance(y, (int, float)) \
            and not isinstance(y, bool):
        if y == 0.5:
            return _unary("sqrt", x)  # type: ignore[return-value]
        if y == -1:
            return _binary("div", 1, x)
        if isinstance(y, float) and y in (0.0, 1.0, 2.0):
            y = int(y)
    if isinstance(x, Value) and x.dtype.kind == "b" and type(y) is int:  # NumPy: int64 as
        x = astype(x, int8 if y == 2 else int64)  # bool + int (** 2: np.square's int8), no and
    if isinstance(x, Value) and isinstance(y, int) and not isinstance(y, bool):
        if x.dtype.kind in "iu" and y < 0 and _from_dims(x):
            return _power(astype(x, float64), y)  # a size is a Python int: n ** -1 is a float
        if x.dtype.kind in "iu" and y < 0:
            raise TraceError(f"pow: integers to negative integer powers are not allowed "
                             f"({_desc(x)} ** {y}); cast to a float dtype first")
        if x.dtype.is_complex and -8 <= y < 0:
            # NumPy (npy_cpow): a zero base to a negative power is nan+nanj (the four complex
            # zeros make it ill-defined), where 1 / 0j alone would give inf+nanj
            inv = _binary("div", 1, _power(x, -y))
            nan = trace_value(x.graph, builtins.complex(float("nan"), float("nan")), inv.dtype)
            return x.graph.add("where", inv.dtype, inv.shape,
                               (_binary("eq", x, 0).id, nan.id, inv.id))
    if isinstance(x, Value) and isinstance(y, int) and not isinstance(y, bool) and 0 <= y <= 8:
        if y == 0:
            return _binary("add", _zeros_like(x), 1)
        if y >= 3 and x.dtype in (float16, bfloat16):
            # one operation in NumPy (powf in float32, rounded to float16 once): the chain
            # rounding after every product was 1 ulp off for a quarter of h ** 3 values
            return astype(_power(astype(x, float32), y), x.dtype)
        out = x
        for _ in range(y - 1):
            out = _binary("mul", out, x)
        return out
    return _binary("pow", x, y)
