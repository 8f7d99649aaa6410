"""A constraint that makes the plan evaluate every size the kernels compute.

Why: a kernel computes some dim expressions itself, at run time: a dim used as a value
(``x + x.shape[0] // y.shape[0]``, ``x * (1 << x.shape[0])``), the shapes of intermediate
values (``kp.arange(1 << k)`` summed away) and the element count a general-schedule reduction
loops over. The planner evaluates only what the summary holds (parameter shapes, constraints,
the chosen variant's launches), so a size that fails to evaluate — a division by a zero dim,
an int64 overflow, a shift count outside 0..63, where NumPy raises or the value is exact —
went unchecked: the kernel divided by zero, wrapped, or looped to LLVM poison. Those sizes are
gathered into one constraint whose only job is to be evaluated (it holds whenever they can be
computed), so the plan raises ``ExpressionError`` (a ``ConstraintError``) naming them. The
shift guards that ``bounds.shift_count_syms`` drops rely on this too.
"""

from __future__ import annotations

from typing import Iterable

from ..expr import Expr, can_fail, emax, eq, product, select
from ..graph import Graph
from ..summary import Constraint

__all__ = ["computed_size_constraints", "kernel_sizes", "surely_evaluated"]

_NAMED = 6  # sizes the constraint's message names (then "and N more")


def surely_evaluated(roots: Iterable[Expr]) -> set[Expr]:
    """Every node that evaluating ``roots`` computes whatever the symbols: all operands,
    except the arms of a ``select`` (the evaluator computes only the arm its condition
    takes)."""
    seen: set[Expr] = set()
    stack = list(roots)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        stack.extend(e.args[:1] if e.op == "select" else e.args)
    return seen


def kernel_sizes(graph: Graph) -> list[Expr]:
    """The size expressions the kernels may compute, of the nodes the outputs read: their
    shapes, the values of dims used as values, and a reduction's element count (the general
    schedule loops over that many terms)."""
    live = [graph.nodes[nid] for nid in sorted(graph.reachable(nid for _, nid in graph.outputs))]
    sizes: list[Expr] = []
    for node in live:
        sizes += node.shape
        if node.op == "dim":
            sizes += [a for a in node.attrs if isinstance(a, Expr)]
        if node.op == "reduce":
            src = graph.nodes[node.inputs[0]]
            sizes.append(product(src.shape[a] for a in node.attrs[1]))
    return sizes


def computed_size_constraints(graph: Graph, evaluated: Iterable[Expr]) -> tuple[Constraint, ...]:
    """One constraint over the :func:`kernel_sizes` that can fail to evaluate and that the
    plan does not surely evaluate anyway (``evaluated``: the parameters' shapes and the other
    constraints); none when there are no such sizes."""
    done = surely_evaluated(evaluated)
    sizes: list[Expr] = []
    for e in kernel_sizes(graph):
        if e.is_const or e in done or not can_fail(e):
            continue
        done.add(e)
        sizes.append(e)
    if not sizes:
        return ()
    # select(c, 1, 1) with a fallible c is kept by the simplifier and is 1 whenever c can be
    # computed; a balanced max over them evaluates each (max is not lazy), in one constraint
    # however many sizes there are (the summary allows MAX_CONSTRAINTS)
    terms = [select(eq(e, 0), 1, 1) for e in sizes]
    while len(terms) > 1:
        terms = [emax(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    named = ", ".join(str(e) for e in sizes[:_NAMED])
    more = f" and {len(sizes) - _NAMED} more" if len(sizes) > _NAMED else ""
    noun = "size" if len(sizes) == 1 else "sizes"
    return (Constraint(terms[0], f"{noun} {named}{more} must be computable (no division by "
                                 f"zero, no int64 overflow, shift counts 0..63)"),)
