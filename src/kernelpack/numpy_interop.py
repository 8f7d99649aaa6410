"""NumPy's protocols on traced tensors: ``np.exp(x)``, ``np.where(c, x, y)``, ``x.sum()``'s
NumPy spellings, and the hints that say what to write for NumPy functions fusions have no op
for (``np.clip``, ``np.round``, ``np.concatenate``).

A port of NumPy code reaches a traced :class:`~kernelpack.tracing.Value` through
``__array_ufunc__`` and ``__array_function__``; without this module NumPy fails inside its own
machinery with messages that name neither the op nor what to use instead. Kept apart from
:mod:`kernelpack.ops` (the DSL's own entry points): this is translation, not new ops. NumPy
itself is never imported here; only its calls arrive.
"""

from __future__ import annotations

from typing import Any

from .errors import TraceError
from .ops import where
from .tracing import _binary, _power, _unary, conj, pow, reduce_api

__all__ = ["array_ufunc", "array_function", "numpy_hint"]


# NumPy ufuncs on traced tensors (np.exp(x), np.maximum(x, 0), np.float32(2) * x): the kp op of
# the same meaning. ``np.exp(x)`` used to fail inside NumPy ("loop of ufunc does not support
# argument 0 of type Value"), naming neither the op nor what to use instead.
_UFUNC_BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div",
                 "divide": "div", "floor_divide": "floordiv", "remainder": "mod",
                 "maximum": "max", "minimum": "min", "equal": "eq", "not_equal": "ne",
                 "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge",
                 "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor",
                 "left_shift": "shl", "right_shift": "shr"}
_UFUNC_UNARY = {"negative": "neg", "absolute": "abs", "invert": "invert", "exp": "exp",
                "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt", "sin": "sin",
                "cos": "cos", "tan": "tan", "tanh": "tanh", "floor": "floor", "ceil": "ceil"}


def array_ufunc(ufunc: Any, method: str, inputs: tuple, kwargs: dict) -> object:
    """``Value.__array_ufunc__``: a NumPy ufunc called on traced tensors, as the kp op."""
    name = getattr(ufunc, "__name__", repr(ufunc))
    if method == "__call__" and not kwargs:
        if name in _UFUNC_BINARY and len(inputs) == 2:
            return _binary(_UFUNC_BINARY[name], *inputs)
        if name == "power" and len(inputs) == 2:  # kp.pow is np.power (a bool base: int64)
            return pow(*inputs)
        if name in _UFUNC_UNARY and len(inputs) == 1:
            return _unary(_UFUNC_UNARY[name], inputs[0])
        if name in ("positive", "conjugate") and len(inputs) == 1:
            return conj(inputs[0]) if name == "conjugate" else inputs[0]
        if name == "square" and len(inputs) == 1:  # x ** 2: a bool squares to int8 as here
            return _power(inputs[0], 2)
    how = f"np.{name}" + ("" if method == "__call__" else f".{method}")
    extra = f" with {sorted(kwargs)}" if kwargs else ""
    raise TraceError(f"{how}{extra} is not supported on traced tensors; "
                     f"{numpy_hint(name, _USE_KP)}")


# What to write for the NumPy functions (and methods) a port reaches for that fusions have no
# op for: "use the kp op" named none of these (np.clip, np.round, x.var), and for rounding there
# is no kp op to find. Keys are NumPy's names; the same text serves ``x.clip``/``round(x)``.
_USE_KP = "use the kp op (kp.exp, kp.where, x.sum(axis=...), ...) or an operator"
_ROUND = ("there is no rounding op: kp.floor(x + 0.5) rounds halves up; NumPy's halves to "
          "even is r = kp.floor(x); f = x - r; kp.where(f == 0.5, r + r % 2, "
          "kp.where(f > 0.5, r + 1, r))")
_MOVE = ("fusions have no data movement (slicing, reshaping, joining): pass each piece as an "
         "input of its own (a view on the host costs nothing), or pick along a short axis "
         "with kp.where(kp.arange(2) == 0, x, 0).sum(axis=...)")
_NUMPY_HINTS = {
    "clip": "write kp.minimum(kp.maximum(x, lo), hi)",
    "round": _ROUND, "around": _ROUND, "rint": _ROUND,
    "trunc": "write kp.where(x < 0, kp.ceil(x), kp.floor(x))",
    "fix": "write kp.where(x < 0, kp.ceil(x), kp.floor(x))",
    "var": "write ((x - x.mean(axis, keepdims=True)) ** 2).mean(axis)",
    "std": "write kp.sqrt(((x - x.mean(axis, keepdims=True)) ** 2).mean(axis))",
    "isnan": "write x != x", "isinf": "write kp.abs(x) == math.inf",
    "isfinite": "write kp.abs(x) < math.inf", "reciprocal": "write 1 / x",
    "sign": "write (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)",
    "log1p": "write kp.log(1 + x)", "expm1": "write kp.exp(x) - 1",
    "logaddexp": "write m = kp.maximum(a, b); m + kp.log(kp.exp(a - m) + kp.exp(b - m))",
    "logical_and": "write a & b on bool tensors (x > 0) & (y > 0)",
    "logical_or": "write a | b on bool tensors", "logical_xor": "write a ^ b on bool tensors",
    "logical_not": "write ~m on a bool tensor (~(x > 0))",
    "argmax": "indices are not computed; x == x.max(axis, keepdims=True) is the one-hot mask",
    "argmin": "indices are not computed; x == x.min(axis, keepdims=True) is the one-hot mask",
    "matmul": "fusions hold elementwise math and reductions: (a[:, :, None] * b).sum(1)",
    "dot": "fusions hold elementwise math and reductions: (a * b).sum(-1)",
    "einsum": "fusions hold elementwise math and reductions: broadcast with [:, None] and sum",
    **{k: _MOVE for k in ("concatenate", "stack", "split", "reshape", "transpose", "take",
                          "squeeze", "expand_dims", "swapaxes", "moveaxis", "ravel", "flip",
                          "T", "flatten", "view")},
}


def numpy_hint(name: str, default: str) -> str:
    """What to write instead of NumPy's ``name`` in a fusion (``default`` where nothing
    specific is known): error messages of ``np.clip(x)``, ``x.clip()``, ``round(x)``."""
    return _NUMPY_HINTS.get(name, default)


# NumPy functions that are not ufuncs reach a traced tensor through __array_function__:
# np.where(c, x, y) failed inside NumPy ("setting an array element with a sequence"). Each
# reduction's positional parameters after the array, in NumPy's order.
_FUNCTION_REDUCTIONS = {"sum": ("sum", ("axis", "dtype", "out", "keepdims")),
                        "prod": ("prod", ("axis", "dtype", "out", "keepdims")),
                        "mean": ("mean", ("axis", "dtype", "out", "keepdims")),
                        "max": ("max", ("axis", "out", "keepdims")),
                        "amax": ("max", ("axis", "out", "keepdims")),
                        "min": ("min", ("axis", "out", "keepdims")),
                        "amin": ("min", ("axis", "out", "keepdims"))}


def array_function(func: Any, args: tuple, kwargs: dict) -> object:
    """``Value.__array_function__``: ``np.where`` and NumPy's reductions as the kp ops; any
    other NumPy function is a TraceError naming it."""
    name = getattr(func, "__name__", repr(func))
    if name == "where" and len(args) == 3 and not kwargs:
        return where(*args)
    if name in ("real", "imag") and len(args) == 1 and not kwargs:  # np.real(z), np.imag(z)
        return _unary(name, args[0])
    if name in _FUNCTION_REDUCTIONS and 1 <= len(args) <= 5:
        kind, names = _FUNCTION_REDUCTIONS[name]
        given = dict(zip(names, args[1:]))
        unknown = sorted(set(kwargs) - set(names))
        if len(args) - 1 <= len(names) and not unknown and not set(given) & set(kwargs):
            given.update(kwargs)
            keepdims = given.get("keepdims", False)
            keepdims = False if type(keepdims).__name__ == "_NoValueType" else keepdims
            return reduce_api(kind, args[0], given.get("axis"), given.get("dtype"),
                              given.get("out"), keepdims)
        if unknown:
            raise TraceError(f"np.{name}: {unknown} not supported on traced tensors")
    raise TraceError(f"np.{name} is not supported on traced tensors; "
                     f"{numpy_hint(name, _USE_KP)}")
