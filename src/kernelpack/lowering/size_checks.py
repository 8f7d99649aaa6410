"""Constraints that make the plan evaluate every size the kernels compute.

Why: a kernel computes some dim expressions itself, at run time: a dim used as a value
(``x + x.shape[0] // y.shape[0]``, ``x * (1 << x.shape[0])``) and the shapes of intermediate
values (``kp.arange(1 << k)`` summed away). The planner evaluates only what the summary holds
(parameter shapes, constraints, the chosen variant's launches), so a size that fails to
evaluate — a division by a zero dim, an int64 overflow, a shift count outside 0..63, where
NumPy raises or the value is exact — went unchecked: the kernel divided by zero, wrapped, or
looped to LLVM poison. Each such expression becomes a constraint whose only job is to be
evaluated (it holds whenever it can be computed), so the plan raises ``ExpressionError`` (a
``ConstraintError``) naming it. The shift guards that ``bounds.shift_count_syms`` drops rely
on this too.
"""

from __future__ import annotations

from typing import Iterable

from ..expr import Expr, can_fail, eq, select
from ..expr_text import iter_nodes
from ..graph import Graph
from ..summary import Constraint

__all__ = ["computed_size_constraints"]


def computed_size_constraints(graph: Graph, evaluated: Iterable[Expr]) -> tuple[Constraint, ...]:
    """A constraint for each size the kernels may compute that can fail to evaluate and that
    the plan does not evaluate anyway (``evaluated``: the parameters' shapes and the other
    constraints, with their subexpressions). Only nodes the outputs read count."""
    done = set(iter_nodes(list(evaluated)))
    live = [graph.nodes[nid] for nid in sorted(graph.reachable(nid for _, nid in graph.outputs))]
    out: list[Constraint] = []
    for node in live:
        sizes = list(node.shape)
        if node.op == "dim":
            sizes += [a for a in node.attrs if isinstance(a, Expr)]
        for e in sizes:
            if e.is_const or e in done or not can_fail(e):
                continue
            done.add(e)
            # select(c, 1, 1) with a fallible c is kept by the simplifier and holds whenever
            # c can be computed: the constraint only asks the plan to compute it
            out.append(Constraint(select(eq(e, 0), 1, 1),
                                  f"size {e} must be computable (no division by zero, no "
                                  f"int64 overflow, shift counts 0..63)"))
    return tuple(out)
