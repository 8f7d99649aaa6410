"""The typing rules of traced operations: dtype promotion of two operands and weak Python
constants (the shape rules, broadcasting and reduction axes, are :mod:`kernelpack.shape_rules`).

Split from :mod:`kernelpack.tracing` (which builds the values and nodes) so that the rules a
user's fusion is checked against read in one short module. The functions take traced values
(anything with ``dtype``, ``shape``, ``weak``, ``node`` and ``graph``) and never construct
one themselves except through ``graph.add``, so this module imports no tracing code.

Typing rules (kept small on purpose): Python numbers are *weak* (they take the tensor's dtype),
and so are integer sizes computed from dims alone (``x.shape[0]`` is a Python int in NumPy)
and the floats computed from them (``x.shape[-1] ** 0.5``, a Python float in NumPy);
a value of a higher kind (bool < int < float < complex) absorbs a lower one; two tensors of the
same kind and different widths are a :class:`~kernelpack.errors.TraceError` (cast with
``.astype``) rather than a silent upcast.
"""

from __future__ import annotations

import builtins
import numbers
import operator
from typing import TYPE_CHECKING, Any, cast

from ._plan_types import dtype_range
from .dtypes import (DType, as_dtype, bool_, complex64, complex128, float16, float32, float64,
                     int8, int16, int32, int64, uint8, uint16, uint32, uint64)
from .errors import TraceError
from .expr import Expr
from .graph import COMPARE, current_graph, value_type
from .shape_rules import _desc

if TYPE_CHECKING:
    from .graph import Graph
    from .tracing import Value
else:
    Value = Any

__all__ = ["plain_int", "dim_number_error", "dsl_dtype", "math_dtype", "trace_value",
           "widen_for_comparison", "known_comparison", "from_sizes"]

_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _check_int_fits(v: int, dt: DType, given: object = None) -> None:
    """A Python int taking an integer tensor's dtype must fit it, as NumPy 2 requires
    (``int32 + 2**40`` and ``uint32 + -1`` raise OverflowError there): the constant would
    otherwise wrap silently in the kernel (``int64 + 2**70`` added 0). ``given``: the NumPy
    integer scalar ``v`` came from (weak like a Python int here), for the message."""
    if dt.kind not in "iu":
        return
    lo, hi = dtype_range(dt)
    if not lo <= v <= hi:
        what = (f"Python integer {v}" if given is None else
                f"{type(given).__name__} scalar {v} (a NumPy integer takes the tensor's dtype, "
                f"as a Python int does)")
        raise TraceError(f"{what} is out of bounds for {dt} (range {lo}..{hi}); "
                         f"cast the tensor with .astype or use a float")


def _const_dtype(v: Value, like: DType) -> Value:
    """Re-type a weak constant to ``like`` (a new node; the graph keeps the old one unused)."""
    node = v.node
    if isinstance(node.attrs[0], int) and not isinstance(node.attrs[0], bool):
        _check_int_fits(node.attrs[0], like)
    return v.graph.add("const", like, (), attrs=(node.attrs[0], True))


def _promote(op: str, a: Value, b: Value) -> tuple[Value, Value, DType]:
    a0, b0 = a, b
    ka, kb = _KIND_RANK[a.dtype.kind], _KIND_RANK[b.dtype.kind]
    if a.weak and not b.weak and ka <= kb:
        a = _const_dtype(a, b.dtype)
    elif b.weak and not a.weak and kb <= ka:
        b = _const_dtype(b, a.dtype)
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b, da
    a, b = _weak_dim_float(a, b), _weak_dim_float(b, a)
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b, da
    ka, kb = _KIND_RANK[da.kind], _KIND_RANK[db.kind]
    if ka == kb == 1 and _from_dims(a) != _from_dims(b):
        return _weak_size(op, a, b)
    if ka != kb:
        hi = da if ka > kb else db
        lo = db if ka > kb else da
        if hi.is_complex and lo.is_float and lo != hi.real:
            # a Python complex (a literal or one computed from dims) beside float16 is
            # complex64, as NumPy gives: ``x_f16 + 1j`` (trace_value already made it
            # complex64) was a dtype mismatch; the tensor is widened explicitly
            c0, f = (a0, b) if ka > kb else (b0, a)
            if lo == float16 and hi == complex64 and (c0.weak or _dim_float(c0)):
                f = f.graph.add("cast", complex64, f.shape, (f.id,))
                return (a, f, hi) if ka > kb else (f, b, hi)
            raise TraceError(f"{op}: dtype mismatch {_desc(a)} and {_desc(b)}; cast one with "
                             f".astype{_mismatch_hint(a, b)}")
        return a, b, hi
    raise TraceError(f"{op}: dtype mismatch {_desc(a)} and {_desc(b)}; cast one with "
                     f".astype{_mismatch_hint(a, b)}")


def _mismatch_hint(a: Value, b: Value) -> str:
    """Where a mismatched operand got a dtype the user never wrote, say where from: an
    ``int64`` ``kp.arange(v)`` beside int32 labels (a one-hot), or a 0-d float64 made of an
    integer scalar and Python floats (Adam's ``1 - 0.9 ** step``, float64 as in NumPy) beside
    float32 tensors. The bare message named only "int64[1, v]" or "float64[]"."""
    for v, other in ((a, b), (b, a)):
        node = v.node
        while node.op == "view":
            node = v.graph.nodes[node.inputs[0]]
        if node.op == "iota" and other.dtype.kind in "iu":
            return (f" (kp.arange and kp.iota are {v.dtype} unless told: kp.arange(n, "
                    f"dtype=kp.{other.dtype}) matches {other.dtype})")
        names = _int_scalars(v) if v.dtype.kind == "f" and other.dtype.kind == "f" else []
        if names:
            return (f" ({v.dtype}[] is computed from the integer scalar(s) {names} and Python "
                    f"numbers, which NumPy makes {v.dtype} too: cast the scalar first, "
                    f"{names[0]}.astype(kp.{other.dtype}), or declare it kp.{other.dtype})")
    return ""


def _int_scalars(v: Value) -> list[str]:
    """The integer scalar parameters a 0-d value is computed from, when it is computed from
    those, dims and Python numbers alone (else [])."""
    leaves = _leaves(v, _DIM_FLOAT_OPS)
    if leaves is None or not all(_dim_or_literal(n) or (n.op == "scalar" and n.dtype.kind in "iu")
                                 for n in leaves):
        return []
    return sorted(str(n.attrs[0]) for n in leaves if n.op == "scalar")


# integer ops that keep a size computed from dims a size (Expr arithmetic covers + - * // % <<
# >>; these are the ones a dim reaches as a traced value: x.shape[0] & 1, m ** 9)
_SIZE_OPS = frozenset({"add", "sub", "mul", "floordiv", "mod", "shl", "shr", "and", "or", "xor",
                       "pow", "max", "min", "neg", "abs"})


def _from_dims(v: Value) -> bool:
    """Whether ``v`` is a 0-d int64 computed from dims and Python ints alone: a Python int in
    NumPy (``x.shape[0]``, ``x.shape[1] & 1``), so as weak as an integer literal."""
    return _built_from_dims(v, _SIZE_OPS, frozenset({int64}))


# ops through which a 0-d value computed from dims and Python numbers stays such a value
_DIM_FLOAT_OPS = frozenset(_SIZE_OPS | {"div", "cast", "sqrt", "rsqrt", "exp", "exp2", "log",
                                        "log2", "sin", "cos", "tan", "tanh", "erf", "floor",
                                        "ceil", "complex", "real", "imag"})
_DIM_FLOAT_DTYPES = frozenset({bool_, int64, float64, complex128})


def _dim_float(v: Value) -> bool:
    """Whether ``v`` is a 0-d float64/complex128 computed from dims and Python numbers alone
    (``1.0 / x.shape[1]``, ``x.shape[-1] ** 0.5``, ``kp.sqrt(x.shape[0])``): in NumPy a Python
    float or complex, so weak beside a narrower float or complex tensor."""
    return (v.dtype in (float64, complex128)
            and _built_from_dims(v, _DIM_FLOAT_OPS, _DIM_FLOAT_DTYPES))


def from_sizes(v: Value) -> bool:
    """Whether ``v`` is a 0-d value computed from dims and Python numbers alone, comparisons
    included (``x.shape[0] / 1 == 0``, what ``np.arange(x.shape[0])`` asks the truth of)."""
    return _built_from_dims(v, _DIM_FLOAT_OPS | COMPARE, _DIM_FLOAT_DTYPES)


def _built_from_dims(v: Value, ops: frozenset, dtypes: frozenset) -> bool:
    """Whether every node ``v`` reads is 0-d, of one of ``dtypes``, and a dim, a Python-number
    literal or one of ``ops`` — with at least one dim among them."""
    leaves = _leaves(v, ops, dtypes)
    return (leaves is not None and all(_dim_or_literal(n) for n in leaves)
            and any(n.op == "dim" for n in leaves))


def _leaves(v: Value, ops: frozenset, dtypes: frozenset | None = None) -> list[Any] | None:
    """The nodes ``v`` is computed from through 0-d nodes of ``ops``, each once; None when a
    node on the way (or a leaf) has a shape, or a dtype outside ``dtypes`` (when given)."""
    g, stack, seen, leaves = v.graph, [v.id], set(), []
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = g.nodes[nid]
        if node.shape or (dtypes is not None and node.dtype not in dtypes):
            return None
        if node.op in ops:
            stack.extend(node.inputs)
        else:
            leaves.append(node)
    return leaves


def _dim_or_literal(node: Any) -> bool:
    """A dim, or a Python-number literal (a weak ``const``)."""
    return node.op == "dim" or (node.op == "const" and bool(node.attrs[1]))


def _weak_dim_float(w: Value, t: Value) -> Value:
    """``w`` re-typed as NumPy types a Python float/complex beside ``t`` when ``w`` is such a
    value computed from dims (see :func:`_dim_float`) and ``t`` a float16/float32/complex64
    tensor: ``x_f32 * (1.0 / x.shape[1])`` is float32, where it was a dtype-mismatch
    TraceError. Beside float64, complex128, integer and bool tensors nothing changes (NumPy
    gives float64/complex128 there too), so graphs that traced before are unchanged."""
    tk = t.dtype
    if tk.kind not in "fc" or tk in (float64, complex128) or not _dim_float(w) or _dim_float(t):
        return w
    if w.dtype == complex128:
        target = tk if tk.kind == "c" else complex64
    else:
        target = tk
    return w.graph.add("cast", target, (), (w.id,))


def _weak_size(op: str, a: Value, b: Value) -> tuple[Value, Value, DType]:
    """An integer tensor beside a size from dims (one of ``a``, ``b``): NumPy types the size
    like a Python int. Arithmetic takes the tensor's dtype (``i32 + x.shape[0]`` is int32;
    it was a dtype-mismatch TraceError); a comparison is exact, as NumPy 2 compares with a
    Python int: a narrow tensor widens to int64 (the size may not fit its dtype)."""
    size_first = _from_dims(a)
    t, w = (b, a) if size_first else (a, b)
    if op in COMPARE and t.dtype != uint64:
        t = t.graph.add("cast", int64, t.shape, (t.id,)) if t.dtype != int64 else t
    else:
        w = w.graph.add("cast", t.dtype, w.shape, (w.id,))
    dt = t.dtype
    return (w, t, dt) if size_first else (t, w, dt)


class _DimNumberError(TraceError, TypeError):
    """A Python number asked of a dim inside a trace (``float(x.shape[0])``,
    ``math.sqrt(x.shape[0])``, ``range(x.shape[0])``): a TraceError saying what to write, still
    the TypeError Python's protocols expect."""


def dim_number_error(e: Expr, what: str) -> TypeError:
    """``what`` of the symbolic size ``e``: outside a trace the plain TypeError it always was;
    inside one a :class:`_DimNumberError` naming the kp forms that keep the size symbolic."""
    if current_graph() is None:
        return TypeError(f"not a constant expression (got {e})")
    return _DimNumberError(
        f"{what} of the size {e}: sizes are known only at launch, so they have no Python "
        f"value while tracing; keep them in kp arithmetic: x / {e}, 1.0 / {e}, {e} ** 0.5, "
        f"kp.sqrt({e}), kp.log({e}), kp.arange({e})")


def trace_value(graph: Graph, v: object, like: DType | None = None) -> Value:
    """Turn a Python number, an Expr (a dim) or a Value into a traced Value."""
    if isinstance(v, value_type()):
        if v.graph is not graph:
            raise TraceError("a traced tensor from another fusion was used")
        return v
    if isinstance(v, Expr):
        return graph.add("dim", int64, (), attrs=(v,))
    if isinstance(v, bool):
        return graph.add("const", bool_, (), attrs=(v, True))
    if isinstance(v, int):
        numeric = like is not None and like.kind in ("i", "u", "f", "c")
        dt = cast(DType, like) if numeric else int64  # numeric: like is not None
        _check_int_fits(v, dt)
        return graph.add("const", dt, (), attrs=(v, True))
    if isinstance(v, float):
        dt = like if like is not None and like.kind in ("f", "c") else float64
        return graph.add("const", dt, (), attrs=(v, True))
    if isinstance(v, builtins.complex):
        # NumPy's weak complex scalar: complex64 beside float32/float16/complex64 tensors,
        # complex128 otherwise (a float64 or integer tensor, or no tensor)
        if like is not None and like.kind == "c":
            dt = like
        elif like is not None and like.kind == "f" and like.itemsize <= 4:
            dt = complex64
        else:
            dt = complex128
        return graph.add("const", dt, (), attrs=(v, True))
    # NumPy scalars (np.float32(2), np.int32(3), np.True_) and other registered numbers act as
    # the Python number of their kind (weak: NumPy 2 types them, torch does not; review 28
    # tried typing NumPy floats and found every rule built on weak numbers disagreeing with
    # it: sizes, pow, kp.where's branches); np.float64 is already a float and np.int64 has
    # __index__; a 0-d array is its element
    if not isinstance(v, (list, tuple)) and getattr(v, "ndim", 0) == 0:
        kind = getattr(getattr(v, "dtype", None), "kind", None)
        if kind in ("i", "u") and like is not None and like.kind in "iu":
            _check_int_fits(int(v), like, v)  # type: ignore[call-overload]
        if kind == "b":
            return trace_value(graph, bool(v), like)  # type: ignore[arg-type]
        if kind in ("i", "u", "f", "c") and not isinstance(v, numbers.Number):
            return trace_value(graph, v[()], like)  # type: ignore[index]
        if isinstance(v, numbers.Integral) or hasattr(v, "__index__"):
            try:
                return trace_value(graph, operator.index(v), like)
            except TypeError:
                pass
        elif isinstance(v, numbers.Real):
            return trace_value(graph, float(v), like)
        elif isinstance(v, numbers.Complex):
            return trace_value(graph, builtins.complex(v), like)
    raise TraceError(f"cannot use {v!r} ({type(v).__name__}) in a fusion: expected a traced "
                     f"tensor, a number or a dim")


def plain_int(v: object) -> object:
    """A NumPy integer scalar (or 0-d integer array) as the Python int it holds, so that it
    compares exactly as a Python int does (``x_i8 < np.int16(1000)`` was an out-of-bounds
    TraceError where ``x_i8 < 1000`` is all True); anything else unchanged."""
    if v.__class__ is int or isinstance(v, (bool, Expr)) or hasattr(v, "graph"):
        return v
    kind = getattr(getattr(v, "dtype", None), "kind", None)
    if kind in ("i", "u") and getattr(v, "ndim", 0) == 0:
        return operator.index(v)  # type: ignore[arg-type]
    return v


def widen_for_comparison(t: object, lit: object) -> object:
    """NumPy 2 compares an integer tensor with a Python int outside its dtype exactly
    (``int32 == 3_000_000_000`` is all False) where arithmetic would raise: widen the tensor
    to int64 for such a literal (one that fits int64) instead of a trace error."""
    dt = getattr(t, "dtype", None)
    if (isinstance(dt, DType) and dt.kind in "iu" and dt.itemsize < 8
            and isinstance(lit, int) and not isinstance(lit, bool)):
        try:
            _check_int_fits(lit, dt)
        except TraceError:
            _check_int_fits(lit, int64)
            return t.graph.add("cast", int64, t.shape, (t.id,))  # type: ignore[attr-defined]
    return t


_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def known_comparison(op: str, a: object, b: object) -> bool | None:
    """The result, the same for every element, of comparing an integer tensor with a Python
    int that no integer dtype of the kernel can hold beside it (past int64, or past uint64's
    range for a uint64 tensor): NumPy 2 compares such a literal exactly (``u64 > -1`` and
    ``i64 < 2**63`` are all True), where typing the literal as the tensor's dtype raised an
    out-of-bounds TraceError. None where the comparison is an ordinary one (a literal
    :func:`widen_for_comparison` makes exact by widening to int64 included) and for bool
    tensors, whose comparison with such a literal NumPy refuses (OverflowError) as we do."""
    t, lit, flip = (a, b, False) if isinstance(b, int) else (b, a, True)
    dt = getattr(t, "dtype", None)
    if not (isinstance(dt, DType) and dt.kind in "iu" and isinstance(lit, int)
            and not isinstance(lit, bool) and hasattr(t, "graph")):
        return None
    lo, hi = (0, (1 << 64) - 1) if dt == uint64 else (-(1 << 63), (1 << 63) - 1)
    if lo <= lit <= hi:
        return None
    op = _FLIPPED[op] if flip else op  # now "t op lit"
    above = lit > hi  # every element of t is below lit (else every element is above it)
    return {"lt": above, "le": above, "gt": not above, "ge": not above, "eq": False,
            "ne": True}[op]


_PY_TYPES: dict[type, DType] = {bool: bool_, int: int64, float: float64, complex: complex128}

# NumPy's dtype strings (np.dtype("f8")) that are not kernelpack names, or that kernelpack's
# shared name table reads otherwise: "float" is torch's float32 there, NumPy's float64 here.
_NUMPY_STRINGS: dict[str, DType] = {
    "float": float64, "int": int64, "complex": complex128, "single": float32, "b1": bool_,
    "?": bool_, "f2": float16, "f4": float32, "f8": float64, "c8": complex64, "c16": complex128,
    "i1": int8, "i2": int16, "i4": int32, "u1": uint8, "u2": uint16, "u4": uint32}
# with a byte order ("<i8", "=u8") a code is NumPy's alone: "i8" is int64 there, where the bare
# "i8" / "u8" stay kernelpack's short names (kp.i8 is int8)
_NUMPY_SIZED: dict[str, DType] = {**_NUMPY_STRINGS, "i8": int64, "u8": uint64}


def dsl_dtype(value: object) -> DType:
    """A dtype as NumPy's ``astype`` takes it: a kernelpack dtype or name, NumPy's scalar types
    (``np.float32``, ``np.bool_``), Python's ``bool int float complex`` (NumPy's bool,
    int64, float64, complex128) and NumPy's dtype strings (``"f8"``, ``"<i4"``, ``"float"``).
    ``x.astype(float)`` was a TraceError (not a dtype); ``x.astype("float")`` was float32."""
    if isinstance(value, type):
        if value in _PY_TYPES:
            return _PY_TYPES[value]
        name = getattr(value, "__name__", None)
        if getattr(value, "__module__", None) == "numpy" and isinstance(name, str):
            value = "bool" if name in ("bool_", "bool") else name
    if isinstance(value, str):
        if value[:1] in ("<", "=", "|") and value[1:] in _NUMPY_SIZED:
            return _NUMPY_SIZED[value[1:]]
        if value in _NUMPY_STRINGS:
            return _NUMPY_STRINGS[value]
    return as_dtype(value)


def math_dtype(dt: DType) -> DType:
    """The float dtype a math function (exp, sin, sqrt, ...) of a bool or integer tensor
    computes in, as NumPy picks its loop: float16 for 1-byte types, float32 for 2-byte ones,
    float64 otherwise (``np.exp(bool_array)`` is float16, ``np.sqrt(int16_array)`` float32)."""
    return {1: float16, 2: float32}.get(dt.itemsize, float64)
