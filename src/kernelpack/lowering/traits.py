"""What a row kernel's work looks like, for the schedule's choices: which values are one per row,
and whether the per-element or per-row work has transcendentals or divisions.

Pure Python over the graph (no LLVM): :mod:`.schedule` picks register-row tables, tiles and the
one-row-per-thread variant from these; :mod:`.regrows` finds divisions by per-row values.
"""

from __future__ import annotations

from typing import Callable, Iterable

from ..dtypes import float32, float64
from ..graph import Graph, Node

__all__ = ["per_row", "heavy", "elementwise_heavy", "long_inlined_math", "row_transcendental"]

_HEAVY = frozenset({"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
                    "erf", "sigmoid", "div", "pow", "floordiv", "mod"})


def per_row(graph: Graph, reduces: Iterable[int]) -> Callable[[int], bool]:
    """A test of whether a node has one value per row of a kernel whose reductions are
    ``reduces``: it is built from them, scalars, dims and constants only (memoized)."""
    reduced = set(reduces)
    memo: dict[int, bool] = {}

    def uniform(nid: int) -> bool:
        # iterative (a recursive walk exhausted Python's stack on a chain of ~1000 operations)
        stack = [nid]
        while stack:
            top = stack[-1]
            if top in memo:
                stack.pop()
                continue
            node = graph.nodes[top]
            if top in reduced or node.op in ("scalar", "const", "dim"):
                memo[top] = True
            elif node.op in ("input", "iota", "reduce", "pad") or not node.inputs:
                memo[top] = False
            else:
                missing = [i for i in node.inputs if i not in memo]
                if missing:
                    stack.extend(missing)
                    continue
                memo[top] = all(memo[i] for i in node.inputs)
            stack.pop()
        return memo[nid]

    return uniform


def heavy(graph: Graph, roots: list[int], reduces: set[int]) -> bool:
    """Whether the per-element work of a row kernel includes a transcendental or a division
    (softmax's exp): such rows want more threads per row, not more elements per thread. Work
    on per-row values (layernorm's rsqrt of the variance) does not count."""
    return _heavy_from(graph, [*roots, *(graph.nodes[r].inputs[0] for r in reduces)], reduces)


def elementwise_heavy(graph: Graph, roots: list[int]) -> bool:
    """Whether a pointwise kernel computing ``roots`` does a transcendental or a division per
    element (gelu's tanh, not axpy): values of reductions it loads (a softmax's row sums, from
    a workspace) and work on them alone do not count."""
    return any(node.op in _HEAVY for node in _elementwise_floats(graph, roots))


def long_inlined_math(graph: Graph, roots: list[int]) -> bool:
    """Whether a pointwise kernel's per-element work (as for :func:`elementwise_heavy`) is led
    by a libdevice routine long enough that fewer elements per thread pay: a sine, cosine or
    tangent of a float of at most 32 bits (a complex64 ``exp`` takes both) with no ``pow``, or
    a float64 ``tanh`` / ``sigmoid`` or a float32 ``tanh`` with no other transcendental
    (divisions allowed).
    libdevice's routines are always inlined, once per element a thread holds: such kernels
    compile in about half the time with half the elements per thread and run as fast or
    faster (fewer registers spill); a pow, a float64 sine or exp wants the elements in flight
    (H200 figures at :data:`.tuning.LONG_MATH_POINTWISE`), and so, by about 1%, does a
    float32 sigmoid."""
    floats = _elementwise_floats(graph, roots)
    if any(node.op == "pow" for node in floats):
        return False
    if any((node.op in _TRIG and node.dtype.kind == "f" and node.dtype.itemsize <= 4)
           or (node.op == "exp" and node.dtype.kind == "c" and node.dtype.itemsize <= 8)
           for node in floats):
        return True
    long_ops = [node for node in floats if node.op in _HEAVY and node.op != "div"]
    return (any((node.op in _TANH_LIKE and node.dtype == float64)
                or (node.op == "tanh" and node.dtype == float32) for node in long_ops)
            and all(node.op in _TANH_LIKE for node in long_ops))


_TRIG = frozenset({"sin", "cos", "tan"})
_TANH_LIKE = frozenset({"tanh", "sigmoid"})


def _heavy_from(graph: Graph, starts: list[int], reduces: Iterable[int]) -> bool:
    return any(node.op in _HEAVY for node in _float_work(graph, starts, reduces))


def _elementwise_floats(graph: Graph, roots: list[int]) -> list[Node]:
    """The float and complex operations of a pointwise kernel's per-element work: the
    reductions whose values it loads, and work on those alone, left out."""
    reduces = {n for n in graph.reachable(roots) if graph.nodes[n].op == "reduce"}
    return _float_work(graph, list(roots), reduces)


def _float_work(graph: Graph, starts: list[int], reduces: Iterable[int]) -> list[Node]:
    """The float and complex nodes reached from ``starts`` through nodes that are not one
    value per row of ``reduces`` (:func:`per_row`)."""
    uniform = per_row(graph, reduces)
    return [graph.nodes[n] for n in graph.reachable(starts, through=lambda n: not uniform(n))
            if graph.nodes[n].dtype.kind in "fc"]


_TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log2", "sin", "cos", "tan", "tanh", "erf",
                             "sigmoid", "pow"})


def row_transcendental(graph: Graph, roots: list[int]) -> bool:
    """Whether the work on a kernel's reduction results (after the row's reductions) includes a
    transcendental: phase's sincos of the summed phase, not masked_mean's division. With one
    row per thread that long dependent chain is what more resident threads hide; memory-bound
    terms (masked_mean float64, rows of 8..32) were 3-8% slower with the bound instead."""
    terms = graph.reachable(roots, through=lambda n: graph.nodes[n].op != "reduce")
    return any(graph.nodes[n].op in _TRANSCENDENTAL and graph.nodes[n].dtype.kind in "fc"
               for n in terms)
