"""What ``@kp.fusion`` accepts as a function, and how it reads the function's signature: the
checks that run when a fusion is declared or inlined into another one, before any tracing.

Why a module of its own: each rule here answers a way users actually write fusions (review
28): a default value the compiled program could never honour, a parameter named like the
loaded program's ``out=``/``stream=`` keywords, annotations written as strings and evaluated
in the wrong scope, a fusion that calls itself, an inlined fusion called with arguments its
annotations refuse. Each is a clear error where the user wrote it, not a program that
misbehaves after it was compiled and shipped.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from .dtypes import DType
from .errors import TraceError
from .limits import MAX_NAME_LENGTH, fits_name
from .summary import TensorType

if TYPE_CHECKING:
    from .fusion import Fusion

__all__ = ["check_function", "annotations", "check_parameter", "check_inlined_arguments",
           "check_wrappers_agree", "running", "wrapped_chain", "CALL_KEYWORDS"]

# A loaded program's call takes these by name (``program(x, out=y, stream=s)``): an input of
# that name could be passed only by position.
CALL_KEYWORDS = ("out", "stream")

# How far up the stack the frame that defined a fusion's function is looked for.
_DEFINING_FRAME_SEARCH = 16


def check_function(fn: object) -> None:
    """``fn`` must be a function (or a wrapper of one, a staticmethod): a class, a partial or
    a number got as far as a message about the fusion's name or its annotations."""
    if isinstance(fn, functools.partial):
        raise TypeError("kp.fusion needs a function, not a functools.partial: write a small "
                        "function that calls it (its fixed arguments become constants of the "
                        "fusion)")
    if isinstance(fn, classmethod):  # its first parameter would be the class, no input
        raise TypeError(f"kp.fusion decorates a function or a staticmethod, not a classmethod "
                        f"({fn.__func__.__qualname__}): a fusion's parameters are all traced "
                        f"inputs; write @staticmethod above @kp.fusion instead")
    target = inspect.unwrap(fn.__func__ if isinstance(fn, staticmethod) else fn)  # type: ignore
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        # a class, a number, an object with __call__: its signature is not its inputs'
        raise TypeError(f"kp.fusion decorates a function (got {type(fn).__name__} "
                        f"{fn!r:.60}); write @kp.fusion or @kp.fusion(name='...') above a def")


# (``from __future__ import annotations`` binds this name too; mypy keeps that binding)
def annotations(fn: Callable[..., Any], name: str,  # type: ignore[no-redef]
                extra_locals: Mapping[str, Any] | None = None,
                interpret: Interpret | None = None) -> dict[str, Any]:
    """The parameters' annotations, string ones (``from __future__ import annotations``, or
    quoted) evaluated where the function was defined: its module's globals, then the locals of
    the frame that defined it (found on the stack, as a decorator runs right after the def),
    and its closure. Evaluating them in the frame that called kp.fusion read a registering
    decorator's locals instead (``def register(fn, dt=kp.f32)`` turned a float64 fusion into
    a float32 one).

    They are read from the function ``fn`` wraps (``inspect.unwrap``), as its signature is:
    from Python 3.14 (PEP 649) ``functools.update_wrapper`` copies ``__annotate__`` instead of
    ``__annotations__``, and a wrapper that is not a function (a :class:`Fusion` given to
    ``kp.fusion(name=...)``) answered no annotations at all. There also, annotations are
    evaluated when first read, so a name they use that does not exist is an error here (the
    ``def`` itself raised it before 3.14): a TraceError naming the fusion, as for strings.
    ``interpret`` reads an annotation as the fusion does (see :func:`check_wrappers_agree`)."""
    scope: dict[str, Any] = dict(extra_locals or {})
    target = inspect.unwrap(fn)
    try:
        raw = getattr(target, "__annotations__", None) or {}
        if any(isinstance(v, str) for v in raw.values()):  # else nothing is evaluated: no scope
            scope.update(_defining_locals(fn))
            scope.update(_closure_values(fn))
        hints = inspect.get_annotations(target, eval_str=True, locals=scope)
        for key, value in hints.items():
            if isinstance(value, str):  # quoted under the future import: a string of a string
                hints[key] = eval(value, getattr(target, "__globals__", {}), scope)
    except Exception as exc:
        which = _failing_parameter(fn, target, scope)
        where = "annotations" if which is None else f"the annotation of parameter {which!r}"
        raise TraceError(f"fusion {name}: cannot read {where}: {exc}") from exc
    check_wrappers_agree(fn, target, hints, name, interpret)
    return hints


def _failing_parameter(fn: Callable[..., Any], target: Any,
                       scope: Mapping[str, Any]) -> str | None:
    """Which parameter's annotation cannot be evaluated (for the error message only): each
    one's source text, the strings themselves or, from Python 3.14, ``annotationlib``'s STRING
    format, evaluated on its own where the function was defined. None when no single one
    fails (an ``__annotate__`` written by hand that raises for all)."""
    try:
        raw = target.__annotations__
        texts = raw if all(isinstance(v, str) for v in raw.values()) else None
    except Exception:  # from 3.14: evaluating them is what failed
        texts = None
    try:
        if texts is None:
            import annotationlib  # type: ignore[import-not-found]  # Python 3.14+

            texts = annotationlib.get_annotations(target, format=annotationlib.Format.STRING)
        where = {**scope, **_defining_locals(fn), **_closure_values(fn)}
        for key, text in texts.items():
            try:
                value = eval(text, getattr(target, "__globals__", {}), where)
                if isinstance(value, str):  # quoted under the future import
                    eval(value, getattr(target, "__globals__", {}), where)
            except Exception:
                return str(key)
    except Exception:
        return None
    return None


# How a fusion reads one annotation (``Annotated[Any, kp.Tensor[...]]`` as ``kp.Tensor[...]``,
# ``np.float32`` as ``kp.f32``), given the annotation and where it is for errors.
Interpret = Callable[[object, str], object]


def check_wrappers_agree(fn: Callable[..., Any], target: Any, hints: Mapping[str, Any],
                         name: str, interpret: Interpret | None = None) -> None:
    """A function on ``fn``'s ``__wrapped__`` chain above ``target`` (a decorator's wrapper
    made with functools.wraps) must not hold other annotations than the ones read from
    ``target`` (``hints``). They are one dict before Python 3.14; from 3.14 (PEP 649) each
    function evaluates them when they are first read, so a registering decorator that read its
    wrapper's inside a ``for dt in ...`` loop saw each dtype while kp.fusion, later, read the
    loop's last one from the function (review 70). Neither may silently win. Two spellings the
    fusion reads alike (``interpret``: ``Annotated[Any, kp.Tensor[kp.f32, "n"]]`` and
    ``kp.Tensor[kp.f32, "n"]``) agree (review 72b: they were a TraceError)."""
    for obj in wrapped_chain(fn):
        if obj is target:
            return
        if inspect.isfunction(obj):
            try:
                own = dict(obj.__annotations__)
            except Exception:  # its own evaluation fails: it is not what kp.fusion reads
                own = {}
            for key, value in own.items():
                if (key == "return" or key not in hints or isinstance(value, str)
                        or _agree(value, hints[key], interpret, f"fusion {name}: {key!r}")):
                    continue  # (a return annotation is no input: kp.fusion never reads it)
                raise TraceError(
                    f"fusion {name}: parameter {key!r} is annotated {value!r} on the wrapper "
                    f"{getattr(obj, '__qualname__', obj)!r} but {hints[key]!r} on the "
                    f"function it wraps (a wrapper's annotations were set apart from the "
                    f"function's, or, from Python 3.14, each evaluated them when first read and "
                    f"saw different values); evaluate them once, e.g. pass the dtype into a "
                    f"factory function")


def _agree(a: object, b: object, interpret: Interpret | None, where: str) -> bool:
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:
        pass
    if interpret is None:
        return False
    try:
        return bool(interpret(a, where) == interpret(b, where))
    except Exception:  # one of them cannot be read as the fusion reads: not the same
        return False


def wrapped_chain(fn: object) -> Iterator[Any]:
    """``fn``, then each object its ``__wrapped__`` attributes lead to, as ``inspect.unwrap``
    walks them (a staticmethod stands for its function). Ends where there is none, or at the
    first repeat of a chain that loops (inspect.unwrap raises for that one when the signature
    is read), within the recursion limit as unwrap's walk."""
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen and len(seen) < sys.getrecursionlimit():
        seen.add(id(fn))
        if isinstance(fn, staticmethod):
            fn = fn.__func__
            continue
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def _defining_locals(fn: Callable[..., Any]) -> Mapping[str, Any]:
    """The locals visible where ``fn`` was defined: of the frame running the code that holds
    ``fn``'s code, and of the frames enclosing that one in turn (a class body inside a
    function sees the function's locals, as annotations evaluated at the def would), inner
    names first; up to the module, whose names are the function's globals anyway."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return {}
    scope: dict[str, Any] = {}
    frame = inspect.currentframe()
    try:
        for _ in range(_DEFINING_FRAME_SEARCH):
            if frame is None or frame.f_code.co_name == "<module>":
                break
            if code in frame.f_code.co_consts:
                for name, value in frame.f_locals.items():
                    scope.setdefault(name, value)  # an inner scope's name wins
                code = frame.f_code  # next: the frame that defined this one's code
            frame = frame.f_back
        return scope
    finally:
        del frame  # a frame held by a local is a reference cycle


def _closure_values(fn: Callable[..., Any]) -> dict[str, Any]:
    target = inspect.unwrap(fn)
    code, cells = getattr(target, "__code__", None), getattr(target, "__closure__", None)
    if code is None or not cells:
        return {}
    values = {}
    for var, cell in zip(code.co_freevars, cells):
        try:
            values[var] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            pass
    return values


def check_parameter(fusion: str, p: inspect.Parameter) -> None:
    """One parameter of a fusion's signature: what a compiled program can take."""
    if p.default is not p.empty:
        raise TraceError(f"fusion {fusion}: parameter {p.name!r} has a default value "
                         f"({p.default!r:.40}); a compiled program takes every input at each "
                         f"call, so drop the default (a constant can be a closure variable or "
                         f"a module constant, a fixed size kp.compile(..., static=...))")
    if p.name in CALL_KEYWORDS:
        raise TraceError(f"fusion {fusion}: parameter {p.name!r} is named like the loaded "
                         f"program's {p.name}= keyword, so it could not be passed by name; "
                         f"rename it")
    if not fits_name(p.name):
        raise TraceError(f"fusion {fusion}: parameter name {p.name!r:.40} is longer than "
                         f"{MAX_NAME_LENGTH} UTF-8 bytes")


def check_inlined_arguments(fusion: Fusion, arguments: Mapping[str, Any]) -> None:
    """A fusion called inside another one runs its function on the caller's traced values: the
    values must be what its annotations declare, as a top-level call's would be. Tensors:
    dtype, rank, literal sizes, and one size per dim name; scalar parameters: no tensors, and
    a traced scalar of the declared dtype (numbers are weak, as everywhere in a fusion)."""
    from .tracing import Value

    where = f"fusion {fusion.name} called inside a trace"
    dims: dict[str, tuple[object, str, int]] = {}
    for pname, ann in fusion.params:
        if pname not in arguments:
            continue
        v = arguments[pname]
        if isinstance(ann, DType) and not isinstance(v, Value):
            _check_inlined_number(where, pname, ann, v)
            continue
        if not isinstance(v, Value):
            continue
        if isinstance(ann, TensorType):
            if v.dtype != ann.dtype or v.ndim != len(ann.dims):
                raise TraceError(f"{where}: {pname} is {v.dtype} of rank {v.ndim}, annotated "
                                 f"{ann.dtype} of rank {len(ann.dims)}")
            for i, (want, got) in enumerate(zip(ann.dims, v.shape)):
                if isinstance(want, int):
                    # (a constant's value is an int)
                    if not (got.is_const and int(got.value) == want):  # type: ignore[arg-type]
                        raise TraceError(f"{where}: {pname}.shape[{i}] is {got}, annotated "
                                         f"{want}")
                    continue
                first = dims.setdefault(want, (got, pname, i))
                if first[0] is not got and not bool(first[0] == got):
                    raise TraceError(f"{where}: {pname}.shape[{i}] is {got} but {want} = "
                                     f"{first[0]} from {first[1]}.shape[{first[2]}] (one "
                                     f"name, one size)")
        elif isinstance(ann, DType):
            if v.ndim:
                raise TraceError(f"{where}: {pname!r} is a scalar parameter ({ann}), got a "
                                 f"tensor {v.dtype} of rank {v.ndim}")
            if v.dtype != ann:
                raise TraceError(f"{where}: {pname!r} is {v.dtype}, annotated {ann}; convert "
                                 f"it with .astype({ann})")


def _check_inlined_number(where: str, pname: str, ann: DType, v: object) -> None:
    """A number (or a size) for an inlined fusion's scalar parameter: of the parameter's kind
    and within an integer dtype's range, as a call's would have to be. It stays weak, as
    numbers are everywhere in a fusion: only what a call would refuse is refused."""
    import numbers

    from ._plan_types import dtype_range
    from .dtypes import is_numpy_bool
    from .expr import Expr
    from .promotion import plain_int

    v = plain_int(v)
    is_bool = v.__class__ is bool or is_numpy_bool(v)
    if ann.kind == "b":
        ok = is_bool
    elif ann.kind in "iu":
        ok = isinstance(v, Expr) or (isinstance(v, int) and not is_bool)
        if ok and isinstance(v, int):
            lo, hi = dtype_range(ann)
            if not lo <= v <= hi:
                raise TraceError(f"{where}: {pname!r} = {v} is outside {ann}'s range "
                                 f"{lo}..{hi}")
    else:  # a float parameter takes any real number (a call converts it)
        ok = isinstance(v, (Expr, numbers.Real)) and not is_bool
    if not ok:
        raise TraceError(f"{where}: {pname!r} is a {ann} parameter, got {v!r:.40} "
                         f"({type(v).__name__})")


_active = threading.local()


@contextlib.contextmanager
def running(fusion: Fusion) -> Iterator[None]:
    """Mark ``fusion`` as being traced on this thread: a fusion that calls itself (directly
    or through others) is a TraceError naming the cycle, not a RecursionError after a
    thousand frames. Inlining copies the body, so a fusion cannot recurse."""
    stack: list[Fusion] = _active.__dict__.setdefault("stack", [])
    if any(f is fusion for f in stack):
        start = next(i for i, f in enumerate(stack) if f is fusion)
        cycle = " -> ".join(f.name for f in stack[start:])
        raise TraceError(f"fusion {fusion.name} calls itself ({cycle} -> {fusion.name}): a "
                         f"fusion called inside another is inlined, so it cannot recurse; "
                         f"unroll it with a Python loop over a fixed count")
    stack.append(fusion)
    try:
        yield
    finally:
        stack.pop()
