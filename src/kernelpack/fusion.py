"""``@kp.fusion``: a tracing DSL that turns tensor math over symbolic shapes into a graph.

Calling the decorated function with *symbolic tensors* (one per ``kp.Tensor[...]`` parameter)
records every operation as a :class:`~kernelpack.graph.Node` of a
:class:`~kernelpack.graph.Graph`. Dims are :class:`~kernelpack.expr.Expr` (``x.shape[1]`` is the
symbol ``n``), so output shapes come out as expressions (``shl(1, n)`` for
``kp.arange(1 << n)``). The lowering (:mod:`kernelpack.lowering`) turns the graph into kernels
and the summary.

This module is the front only: the decorator, :class:`Fusion` (tracing on demand and
``canonical_bytes``, the cache key's source) and the checks on a finished trace. The pieces it
drives live in one module per concept — the graph IR in :mod:`kernelpack.graph`, traced values
and the typing rules in :mod:`kernelpack.tracing`, the op functions in :mod:`kernelpack.ops` —
and are re-exported here, so ``kernelpack.fusion.<name>`` keeps working for existing code. Pure
Python with no heavy imports, so ``import kernelpack`` stays light.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import typing
from typing import TYPE_CHECKING, Any, Callable, Mapping, overload

from .dtypes import DType, strict_index
from .errors import TraceError
from .expr import Expr, as_expr, const
from .fusion_signature import (annotations, check_function, check_inlined_arguments,
                               check_parameter, check_wrappers_agree, running, wrapped_chain)
from .graph import Graph, Node
from .limits import MAX_NAME_LENGTH, fits_name, shown_int
# Kept importable from here (outside __all__, as before the split): the op vocabulary and the
# broadcasting rule were attributes of this module; new code imports them from graph/tracing.
from .graph import BINARY, BITWISE, COMPARE, FLOAT_ONLY, REDUCTIONS, UNARY  # noqa: F401
from .ops import (abs, arange, ceil, complex, conj, cos, dim_expr, erf, exp, exp2, floor, imag,
                  iota, log, log2, max, maximum, mean, min, minimum, pad, prod, real, rsqrt,
                  sigmoid, sin, sqrt, sum, tan, tanh, where)
from .promotion import dsl_dtype
from .summary import TensorType
from .tracing import (Value, active_graph, astype, current_graph, hashing_explained, pow,
                      trace_value)
from .tracing import broadcast_shapes  # noqa: F401 - kept importable, as above

__all__ = [
    "Node", "Graph", "Fusion", "Value", "fusion", "trace_value",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
    "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum", "min", "max",
    "sum", "prod", "mean", "arange", "iota", "complex", "real", "imag", "conj", "pad", "astype",
    "dim_expr",
]


class Fusion:
    """A traced-on-demand fusion. ``trace(static=...)`` gives its :class:`Graph`."""

    if TYPE_CHECKING:
        __qualname__: str  # the function's, copied by functools.update_wrapper

    def __init__(self, fn: Callable[..., Any], name: str | None = None,
                 localns: Mapping[str, Any] | None = None) -> None:
        check_function(fn)
        if name is None:  # a fusion wrapped again keeps its program name, not its def's
            name = fn.name if isinstance(fn, Fusion) else getattr(fn, "__name__", None)
        checked = _program_name(name)
        # The function's attributes are copied here, not by update_wrapper (which merges its
        # __dict__ over this instance's), and the name and function are set after them: a
        # function's own ``name`` attribute (a registry's label), or a wrapped fusion's,
        # replaced the checked name (an unchecked one then aborted the process in LLVM's NVPTX
        # backend), and one named like a method (``trace``) replaced the method
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]
        if not isinstance(fn, Fusion):  # the function's own attributes, not over a method
            for key, value in getattr(fn, "__dict__", {}).items():
                if not hasattr(Fusion, key):
                    self.__dict__[key] = value
        self.fn: Callable[..., Any] = fn.fn if isinstance(fn, Fusion) else fn
        self.name: str = checked
        # A fusion (renamed, or under a wrapper) lends the parameters it was declared with:
        # evaluating its string annotations again read names as they are now (a global rebound
        # since, float64 where the fusion is float32) or failed outside the closure that
        # defined them (review 70).
        lender = _fusion_wrapped_by(fn)
        if lender is not None:
            hints: dict[str, Any] = dict(lender.params)
            written = lender.__dict__.get("__annotations__", {})
            # a wrapper above it is held to the lender's types, as one above a function is
            check_wrappers_agree(fn, lender, hints, self.name, _read_annotation)
        else:  # (mypy takes the name for fusion_signature's `from __future__ import annotations`)
            hints = annotations(fn, self.name, localns,  # type: ignore[operator]
                                _read_annotation)
            written = getattr(inspect.unwrap(fn), "__annotations__", {})
        # after the annotations: from Python 3.14 the signature evaluates them too, and a name
        # they use that does not exist was a bare NameError from inspect
        sig = inspect.signature(fn)
        # update_wrapper copied the function's __annotations__ here before Python 3.14, and
        # copies only __annotate__ from 3.14 (PEP 649), which a non-function wrapper does not
        # use: inspect.get_annotations(fusion) answered {} there. Kept as on every version, and
        # from the function whose annotations were read (a wrapper's own, evaluated at another
        # time from 3.14, may differ).
        self.__dict__["__annotations__"] = written
        self.params: list[tuple[str, object]] = []
        # per parameter, whether it is keyword-only (after a bare *): each trace passes those by
        # name, and reading the signature again per trace cost ~20 µs of a cache hit's key
        self._keyword_only = tuple(p.kind == p.KEYWORD_ONLY for p in sig.parameters.values())
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TraceError(f"fusion {self.name}: parameter {p.name!r} is variadic; every "
                                 f"input needs its own annotated parameter")
            check_parameter(self.name, p)
            ann = _read_annotation(hints.get(p.name), f"fusion {self.name}: parameter {p.name!r}")
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
        """Inside another fusion's trace, a fusion is inlined (``return gelu(x) * 2``): its
        function runs on the traced values, whose dtypes and ranks must match its
        annotations. Outside a trace it has nothing to run on."""
        if current_graph() is None:
            raise TypeError(f"{self.name} is a kp.fusion: compile it with kp.compile("
                            f"{self.name}) and call the loaded program")
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TraceError(f"fusion {self.name} called inside a trace: {exc}") from None
        check_inlined_arguments(self, bound.arguments)
        with running(self), hashing_explained(self.name):
            return self.fn(*args, **kwargs)

    def __reduce__(self) -> str:
        """Pickled by reference, as a function is: ``module.qualname`` is this object (the
        decorator replaced the function there), so pickle found "not the same object" and
        ``ProcessPoolExecutor().map(kp.compile, fusions)`` failed. A fusion that is no module
        attribute still cannot be pickled, with pickle's own error. A renamed fusion
        (``g16 = kp.fusion(name="g16")(g)``) carries ``g``'s qualname: it is found under the
        module attribute that holds it."""
        module = sys.modules.get(self.__module__)
        if module is not None and getattr(module, self.__qualname__, None) is not self:
            for key, value in list(vars(module).items()):
                if value is self:
                    return key
        return self.__qualname__

    def trace(self, static: Mapping[str, int] | None = None) -> Graph:
        """Run the function on symbolic tensors. ``static`` fixes named dims to ints."""
        fixed = {k: const(v) for k, v in self.static_dims(static).items()}
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
        # keyword-only parameters (after a bare *) are passed by name
        kwonly = self._keyword_only
        pos = [a for a, k in zip(args, kwonly) if not k]
        kw = {n: a for (n, _), a, k in zip(self.params, args, kwonly) if k}
        with active_graph(g), running(self), hashing_explained(self.name):
            result = self.fn(*pos, **kw)
        items = _outputs(self.name, result)
        pnames = {p[0] for p in g.params}
        if not isinstance(result, dict):
            # default names ("out", "out0", ...) step aside for a parameter of that name
            items = [(_free_name(oname, pnames), value) for oname, value in items]
        for oname, value in items:
            if oname in pnames:
                raise TraceError(f"fusion {self.name}: output {oname!r} clashes with a parameter")
            v = trace_value(g, value)
            g.outputs.append((oname, v.id))
        _check_bound(g)
        _check_constant_sizes(g)
        return g

    def static_dims(self, static: Mapping[str, int] | None) -> dict[str, int]:
        """``static=`` checked against this fusion's dims: every name must be a symbolic dim
        of a tensor parameter (a typo would otherwise compile a generic kernel silently) and
        every size a non-negative int (a negative one would compile a program that no shape
        can ever match)."""
        if not static:
            return {}
        if not isinstance(static, Mapping):
            raise TypeError(f"fusion {self.name}: static= must map dim names to sizes, e.g. "
                            f"{{'n': 1024}} (got {static!r:.80})")
        dims = sorted({name for _, ann in self.params if isinstance(ann, TensorType)
                       for d in ann.dims for name in as_expr(d).symbols()})
        unknown = sorted(str(k) for k in static if k not in dims)
        if unknown:
            raise TraceError(f"fusion {self.name}: static= names unknown dim(s) {unknown} "
                             f"(the fusion's dims: {dims})")
        out: dict[str, int] = {}
        for k, v in static.items():
            try:
                n = strict_index(v)  # a bool is an int to Python, never a size meant
            except TypeError:
                raise TypeError(f"fusion {self.name}: static[{k!r}] must be an int "
                                f"(got {v!r:.60})") from None
            if n < 0:
                raise ValueError(f"fusion {self.name}: static[{k!r}] = {n}: a dim cannot be "
                                 f"negative")
            if n >= 1 << 63:  # was Expr's "expression constant outside int64", naming no dim
                raise ValueError(f"fusion {self.name}: static[{k!r}] = {shown_int(n)} does not "
                                 f"fit int64")
            out[k] = n
        return out

    def canonical_bytes(self, static: Mapping[str, int] | None = None,
                        options: Mapping[str, object] | None = None, *,
                        graph: Graph | None = None) -> bytes:
        """A deterministic serialization of the traced graph plus options: the cache key's
        ``source``. Stable across processes (no ids, hashes or addresses). ``graph``: this
        fusion's trace with ``static`` already made, which ``kp.compile`` then lowers: a
        second trace could read other values (a global changed meanwhile by another thread)
        and file its code under the first trace's key."""
        import json  # here, not at the top: json is ~1 ms of ``import kernelpack``

        fixed = self.static_dims(static)
        if graph is None:
            graph = self.trace(fixed)
        doc = {"graph": graph.canonical(), "static": dict(sorted(fixed.items())),
               "options": {k: repr(v) for k, v in sorted((options or {}).items())}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _fusion_wrapped_by(fn: object) -> Fusion | None:
    """``fn`` itself when it is a :class:`Fusion`, else the first one on its ``__wrapped__``
    chain (a decorator written with functools.wraps above ``@kp.fusion``), else None."""
    return next((f for f in wrapped_chain(fn) if isinstance(f, Fusion)), None)


def _alias_value(ann: object, where: str) -> object:
    """The value of a PEP 695 alias (``type Rows = Annotated[Any, kp.Tensor[...]]``, Python
    3.12+), evaluated when first read; anything else unchanged. Aliases of aliases are followed
    a few levels (``type A = A`` would never end)."""
    for _ in range(_ALIAS_DEPTH):
        if _TYPE_ALIAS is None or not isinstance(ann, _TYPE_ALIAS):
            return ann
        try:
            ann = ann.__value__
        except Exception as exc:
            raise TraceError(f"{where} is annotated with the type alias {ann!r}, whose value "
                             f"cannot be evaluated: {exc}") from exc
    raise TraceError(f"{where} is annotated with a type alias nested more than {_ALIAS_DEPTH} "
                     f"levels deep (an alias of itself?)")


_ALIAS_DEPTH = 16
_TYPE_ALIAS = getattr(typing, "TypeAliasType", None)  # Python 3.12+


def _kernelpack_metadata(ann: object, where: str) -> object:
    """The kernelpack annotation inside ``typing.Annotated[T, kp.Tensor[...]]`` (or
    ``Annotated[float, kp.f32]``); ``T`` when the metadata holds none (PEP 593: metadata a
    tool does not know is ignored, so ``Annotated[np.float32, "doc"]`` is ``np.float32``); else
    ``ann``. How a mypy/pyright user annotates a fusion: ``kp.Tensor[kp.f32, "n"]`` is no type
    to them (its dims are strings), while ``T`` is what they see and kernelpack reads the
    metadata (README: "Type checkers"). Two different kernelpack annotations (a nested
    ``Annotated`` is flattened) are a TraceError: neither may silently win."""
    ann = _alias_value(ann, where)
    if getattr(ann, "__origin__", None) is None or not hasattr(ann, "__metadata__"):
        return ann
    found = [meta for meta in map(_numpy_scalar_type, ann.__metadata__)  # type: ignore
             if isinstance(meta, (TensorType, DType))]
    if any(meta != found[0] for meta in found[1:]):
        raise TraceError(f"{where} is annotated {ann!r}: its metadata holds "
                         f"{len(found)} different kernelpack annotations ({found[0]!r}, "
                         f"{next(m for m in found if m != found[0])!r}); give one")
    return found[0] if found else ann.__origin__  # type: ignore[attr-defined]


def _read_annotation(ann: object, where: str) -> object:
    """A parameter's annotation as the fusion takes it: the kernelpack annotation inside an
    ``Annotated`` or an alias, a NumPy scalar type as its dtype; anything else unchanged."""
    return _numpy_scalar_type(_kernelpack_metadata(ann, where))


def _numpy_scalar_type(ann: object) -> object:
    """A scalar parameter annotated with NumPy's type (``s: np.float32``, ``np.dtype("f4")``) as
    the kernelpack dtype, as ``kp.Tensor[np.float32, "n"]`` already takes it (it was "needs an
    annotation"); anything else unchanged. Python's ``float``/``int`` stay refused: NumPy
    treats those as weak numbers, which a typed scalar parameter is not."""
    cls = ann if isinstance(ann, type) else type(ann)
    if not str(getattr(cls, "__module__", "")).startswith("numpy"):
        return ann
    try:
        return dsl_dtype(ann)
    except TypeError:
        return ann


def _check_bound(g: Graph) -> None:
    """Every size must be computable from what the caller passes: input dims and integer
    scalars. Anything else could not be planned at load time."""
    bound: set[str] = set()
    for pname, kind, dt, shape in g.params:
        if kind == "tensor":
            bound.update(str(d.value) for d in shape if d.is_sym)
        elif dt.kind in "iub":
            bound.add(pname)
    for node, e in g.expressions():
        missing = e.symbols() - bound
        if missing:
            raise TraceError(f"fusion {g.name}: {node.op} uses dim(s) {sorted(missing)} that "
                             f"no input shape or integer scalar binds (bound: {sorted(bound)}); "
                             f"unbound symbol")


def _check_constant_sizes(g: Graph) -> None:
    """A size that reads no symbol must exist: it cannot be negative, ``1 << 64``
    (``kp.arange(1 << n)`` with ``static={"n": 64}``) cannot be evaluated, and an output of
    constant shape may need more bytes than int64 holds. Each would make every plan of the
    program fail, so the trace refuses it, as kp.external refuses constant launch sizes that
    CUDA cannot run."""
    from .errors import ExpressionError
    from .expr import INT64_MAX
    from .expr_eval import evaluate

    checked: set[Expr] = set()
    for nid in g.reachable(nid for _, nid in g.outputs):
        node = g.nodes[nid]
        values = [a for a in node.attrs if isinstance(a, Expr)] if node.op == "dim" else []
        for e in (*node.shape, *values):  # a dim used as a value is computed by the kernel
            if e.is_const and e.value < 0 and e not in values:  # type: ignore[operator]
                raise TraceError(f"fusion {g.name}: {node.op} has a negative size {e}")
            if e in checked or e.is_const or e.symbols():
                continue
            checked.add(e)
            try:
                evaluate(e, {})
            except ExpressionError as exc:
                raise TraceError(f"fusion {g.name}: {node.op} has a size {e} that no call can "
                                 f"have ({exc})") from None
    for oname, nid in g.outputs:
        node = g.nodes[nid]
        if all(d.is_const for d in node.shape):
            nbytes = node.dtype.itemsize
            for d in node.shape:
                nbytes *= int(d.value)  # type: ignore[arg-type]
            if nbytes > INT64_MAX:
                dims = ", ".join(str(d) for d in node.shape)
                raise TraceError(f"fusion {g.name}: output {oname!r} of shape ({dims}) needs "
                                 f"{nbytes} bytes, more than int64 can hold")


# Kernel names are the program name plus a suffix ("_0_rowblock256x32"): the name must be a PTX
# identifier, and leave room for the suffix within the format's name limit.
_PROGRAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SUFFIX_ROOM = 64


def _program_name(name: object) -> str:
    """The fusion's name, checked before anything is built from it: it names the kernels in the
    PTX, and LLVM's NVPTX backend *aborts the process* ("Symbol name with unsupported
    characters") on a ``-``, a space or a non-ASCII letter; a leading digit or a ``.`` got as
    far as ptxas. ``<lambda>`` (a lambda's name) is refused the same way."""
    most = MAX_NAME_LENGTH - _SUFFIX_ROOM
    if not isinstance(name, str) or not _PROGRAM_NAME.match(name) or len(name) > most:
        raise ValueError(f"a fusion's name must be an ASCII identifier ([A-Za-z_][A-Za-z0-9_]*) "
                         f"of at most {most} characters: it names the kernels; pass "
                         f"@kp.fusion(name=...) (got {name!r:.80})")
    return name


def _free_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with underscores appended until no parameter has it: a fusion
    with a parameter called ``out`` returning one tensor was a TraceError about an output name
    the user never chose."""
    while name in taken:
        name += "_"
    return name


def _outputs(name: str, result: object) -> list[tuple[str, object]]:
    if isinstance(result, dict):
        items = list(result.items())
        if not items:
            raise TraceError(f"fusion {name}: returns no outputs (an empty dict)")
        for k, _ in items:
            if not isinstance(k, str) or not k.isidentifier() or not fits_name(k):
                raise TraceError(f"fusion {name}: output names must be identifiers of at most "
                                 f"{MAX_NAME_LENGTH} UTF-8 bytes (got {k!r:.80})")
        return items
    if isinstance(result, (tuple, list)):
        if not result:
            raise TraceError(f"fusion {name}: returns no outputs")
        return [(f"out{i}", v) for i, v in enumerate(result)]
    if result is None:
        raise TraceError(f"fusion {name}: returns nothing; return the output tensor(s)")
    return [("out", result)]


@overload
def fusion(fn: Callable[..., Any], *, name: str | None = None) -> Fusion: ...


@overload
def fusion(fn: None = None, *, name: str | None = None) -> Callable[[Callable[..., Any]], Fusion]:
    ...


def fusion(fn: Callable[..., Any] | None = None, *,
           name: str | None = None) -> Fusion | Callable[[Callable[..., Any]], Fusion]:
    """Decorate a function of ``kp.Tensor[...]``/scalar-annotated parameters as a fusion.

    Returns a :class:`Fusion`; ``kp.compile`` traces and lowers it. Usable as ``@kp.fusion`` or
    ``@kp.fusion(name="...")``.
    """
    if fn is None:
        return lambda f: Fusion(f, name)
    return Fusion(fn, name)
