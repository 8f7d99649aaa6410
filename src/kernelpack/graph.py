"""The graph IR of a traced fusion: what ``@kp.fusion`` produces and the lowering consumes.

It sits in its own module so that the lowering (:mod:`kernelpack.lowering`) depends on the data
it reads — nodes, parameters, outputs and the op vocabulary — and not on the tracing front that
builds it. :meth:`Graph.canonical` is the deterministic description behind
``Fusion.canonical_bytes`` (the cache key's source), so its encoding must not change silently.
It also keeps, per thread, the graphs being traced (:func:`active_graph`), which ops that start
from dims alone (``kp.arange``) add to.
Pure Python with no heavy imports: ``import kernelpack`` stays light.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ._fields import _set
from ._frozen import frozen_dataclass
from .dtypes import DType
from .expr import Expr, canonical_text

if TYPE_CHECKING:
    from .tracing import Value

__all__ = ["Node", "Graph", "UNARY", "FLOAT_ONLY", "BINARY", "COMPARE", "BITWISE", "REDUCTIONS",
           "active_graph", "current_graph"]

# The op vocabulary shared by the tracer (which records these names) and the lowering.
UNARY = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
         "erf", "sigmoid", "floor", "ceil", "invert", "real", "imag")
FLOAT_ONLY = frozenset({"exp2", "log2", "rsqrt", "tan", "tanh", "erf", "sigmoid", "floor", "ceil"})
BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "max", "min", "lt", "le", "gt",
          "ge", "eq", "ne", "and", "or", "xor", "shl", "shr", "complex")
COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
BITWISE = frozenset({"and", "or", "xor", "shl", "shr"})
REDUCTIONS = ("sum", "prod", "max", "min", "mean")


@frozen_dataclass
class Node:
    """One operation of a traced graph. ``attrs`` holds plain, printable data only (strings,
    numbers, Exprs, tuples of those) so the graph serializes deterministically."""

    id: int
    op: str
    dtype: DType
    shape: tuple[Expr, ...]
    inputs: tuple[int, ...] = ()
    attrs: tuple = ()

    def __init__(self, id: int, op: str, dtype: DType, shape: tuple[Expr, ...],
                 inputs: tuple[int, ...] = (), attrs: tuple = ()) -> None:
        _set(self, "id", id)
        _set(self, "op", op)
        _set(self, "dtype", dtype)
        _set(self, "shape", shape)
        _set(self, "inputs", inputs)
        _set(self, "attrs", attrs)


_value_type: Any = None


def value_type() -> Any:
    """:class:`kernelpack.tracing.Value`, imported on first use and remembered: tracing builds
    on this module, so a module-level import would be circular, and an import statement run
    at every node cost ~1 µs of each of a trace's dozens of nodes (a cache key traces)."""
    global _value_type
    if _value_type is None:
        from .tracing import Value

        _value_type = Value
    return _value_type


@dataclass(init=False, repr=False, eq=False)
class Graph:
    """A traced fusion: nodes in creation (topological) order, parameters, named outputs.

    A (mutable) dataclass whose ``__init__``, ``__repr__`` and ``__eq__`` are written here:
    ``@dataclass`` generates them with ``exec``, ~0.25 ms of every process's ``import
    kernelpack`` on the 2-CPU box (see :mod:`kernelpack._frozen`). They behave as the
    generated ones: equality with the same class only, by the fields' tuple; no hash."""

    name: str
    nodes: list[Node]
    params: list[tuple[str, str, DType, tuple[Expr, ...]]]
    outputs: list[tuple[str, int]]

    def __init__(self, name: str, nodes: list[Node] | None = None,
                 params: list[tuple[str, str, DType, tuple[Expr, ...]]] | None = None,
                 outputs: list[tuple[str, int]] | None = None) -> None:
        self.name = name
        self.nodes = [] if nodes is None else nodes
        self.params = [] if params is None else params
        self.outputs = [] if outputs is None else outputs

    def __repr__(self) -> str:
        return (f"{type(self).__qualname__}(name={self.name!r}, nodes={self.nodes!r}, "
                f"params={self.params!r}, outputs={self.outputs!r})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.name, self.nodes, self.params, self.outputs) == \
            (other.name, other.nodes, other.params, other.outputs)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as the generated class: no hash

    def add(self, op: str, dtype: DType, shape: Sequence[Expr], inputs: Sequence[int] = (),
            attrs: tuple = ()) -> Value:
        """Append a node and return the traced :class:`~kernelpack.tracing.Value` naming it."""
        node = Node(len(self.nodes), op, dtype, tuple(shape), tuple(inputs), attrs)
        self.nodes.append(node)
        return (_value_type or value_type())(self, node.id)

    def reachable(self, roots: Iterable[int],
                  through: Callable[[int], bool] | None = None) -> set[int]:
        """Ids of ``roots`` and every node they depend on. With ``through``, the walk keeps
        only the nodes for which it holds and goes on from those alone (it stops at the
        others: a row's reductions, its per-row values)."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            nid = stack.pop()
            if nid not in seen and (through is None or through(nid)):
                seen.add(nid)
                stack.extend(self.nodes[nid].inputs)
        return seen

    def expressions(self) -> Iterator[tuple[Node, Expr]]:
        """Every distinct expression of the graph (node shapes and ``Expr`` attributes), once,
        with the first node that holds it: nodes share their shapes' expressions, and the
        checks that walk them (bound symbols, symbols a size reads) need each only once."""
        seen: set[Expr] = set()
        for node in self.nodes:
            for e in (*node.shape, *(a for a in node.attrs if isinstance(a, Expr))):
                if e not in seen:
                    seen.add(e)
                    yield node, e

    def canonical(self) -> dict:
        """A JSON-ready description with no ids of Python objects: stable across processes.
        Expressions are written in full (:func:`~kernelpack.expr.canonical_text`), never as
        ``str()``, which stops printing after a few hundred nodes: two fusions whose sizes
        differed past that point shared a cache key, and one was served the other's kernel."""
        texts: dict[Expr, str] = {}  # nodes share their shapes' expressions: one text each

        def text(e: Expr) -> str:
            t = texts.get(e)
            if t is None:
                t = texts[e] = canonical_text(e)
            return t

        return {
            "name": self.name,
            "params": [[n, k, d.name, [text(s) for s in shp]] for n, k, d, shp in self.params],
            "nodes": [[n.op, n.dtype.name, [text(s) for s in n.shape], list(n.inputs),
                       _encode_attr(n.attrs, text)] for n in self.nodes],
            "outputs": [[n, i] for n, i in self.outputs],
        }


def _encode_attr(a: object, text: Callable[[Expr], str]) -> object:
    """A node attribute as JSON-ready data (:meth:`Graph.canonical`). A function of its own,
    not a closure calling itself: such a closure holds itself through its cell, a reference
    cycle that every trace left to the garbage collector."""
    if isinstance(a, Expr):
        return "expr:" + text(a)
    if isinstance(a, DType):
        return "dtype:" + a.name
    if isinstance(a, float):
        return "float:" + repr(a)
    if isinstance(a, complex):  # a complex literal (json has no complex numbers)
        return "complex:" + repr(a)
    if isinstance(a, tuple):
        return [_encode_attr(x, text) for x in a]
    return a


# The graphs being traced, innermost last, per thread: ops that create a tensor from nothing but
# dims (kp.arange, kp.iota) need to know which graph to add to. One list shared by every thread
# gave a thread's kp.arange another thread's graph (two fusions traced at once, e.g. compiled
# from a thread pool: "a traced tensor from another fusion was used").
_CURRENT = threading.local()


def _stack() -> list[Graph]:
    stack = getattr(_CURRENT, "graphs", None)
    if stack is None:
        stack = _CURRENT.graphs = []
    return stack


@contextmanager
def active_graph(graph: Graph) -> Iterator[Graph]:
    """Make ``graph`` the one that dim-only ops (``kp.arange``, ``kp.iota``) add to, in this
    thread."""
    stack = _stack()
    stack.append(graph)
    try:
        yield graph
    finally:
        stack.pop()


def current_graph() -> Graph | None:
    """The innermost graph this thread is tracing, or ``None`` outside any ``@kp.fusion``
    trace."""
    stack = _stack()
    return stack[-1] if stack else None
