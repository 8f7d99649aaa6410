"""Value ranges of integer graph nodes, known at compile time.

Why: NumPy defines shifts by the type width or more (0, or the sign), LLVM does not (poison),
so every shift carries a guard — a 64-bit compare or ``min`` per element. Where the count is
provably below the width (the encodings' ``arange(1 << n) >> arange(n)``: k < n <= 63) the
guard is dead weight in the innermost loop; these bounds let the emitter drop it.
"""

from __future__ import annotations

from ..expr import Expr
from ..graph import Graph
from .size_checks import kernel_sizes, surely_evaluated

__all__ = ["int_max", "shift_count_syms", "expr_max"]


def shift_count_syms(graph: Graph) -> frozenset[str]:
    """Dims that are the count of a shift in some shape or dim of the graph (``1 << n``): an
    Expr shift is defined only for counts 0..63 (the planner raises on others, and the kernel's
    own ``shl`` of that shape would be poison), so wherever a kernel runs, those dims are <= 63.
    Only nodes the outputs read count: the planner never evaluates a dead node's shape (an
    unused ``kp.arange(1 << n)``), so it bounds nothing, and with it ``x >> kp.arange(n)``
    lost its guard and shifted by 64..n-1 modulo the width instead of giving 0 or -1."""
    # what the plan surely evaluates of them (lowering/size_checks): a select's arms are
    # evaluated only when taken, so a shift in one bounds nothing (kp.where(k < 63, 1 << k, 1)
    # plans k = 66)
    return frozenset(str(e.args[1].value) for e in surely_evaluated(kernel_sizes(graph))
                     if e.op in ("shl", "shr") and e.args[1].op == "sym")


def expr_max(e: Expr, shift_syms: frozenset[str]) -> int | None:
    """An upper bound of a dim expression's value, where one is known (constants, dims that
    are shift counts, ``min`` of those)."""
    if e.is_const:
        return int(e.value)  # type: ignore[arg-type]
    if e.op == "sym":
        return 63 if e.value in shift_syms else None
    if e.op == "min":
        tops = [t for t in (expr_max(a, shift_syms) for a in e.args) if t is not None]
        return min(tops) if tops else None
    return None


def int_max(graph: Graph, nid: int, shift_syms: frozenset[str]) -> int | None:
    """An upper bound of integer node ``nid``'s values where they are known to be >= 0, else
    None: ``iota`` over an axis of known extent, views, non-narrowing casts, non-negative
    constants, dims, ``&`` with such a value (``x & m`` lies in 0..m for m >= 0)."""
    node = graph.nodes[nid]
    if node.dtype.kind not in "iu":
        return None
    if node.op == "iota":
        top = expr_max(node.shape[node.attrs[0]], shift_syms)
        return None if top is None else max(top - 1, 0)
    if node.op == "dim":
        return expr_max(node.attrs[0], shift_syms)
    if node.op == "const":
        v = int(node.attrs[0])
        return v if v >= 0 else None
    if node.op in ("view", "cast"):
        src = graph.nodes[node.inputs[0]]
        top = int_max(graph, src.id, shift_syms) if src.dtype.kind in "iu" else None
        return top if top is not None and top < 1 << (8 * node.dtype.itemsize - 1) else None
    if node.op == "and":
        tops = [t for t in (int_max(graph, i, shift_syms) for i in node.inputs) if t is not None]
        return min(tops) if tops else None
    return None
