"""Expressions as text, and the walk over their nodes that every whole-tree pass shares.

Two texts of one :class:`~kernelpack.expr.Expr`, for two readers: the readable form
(``cdiv(n, 256)``, ``str(e)``) that summaries, the CLI and error messages print, cut short
after :data:`_PRINT_NODES` nodes so that a message stays a line; and :func:`canonical_text`,
complete, that cache keys hash. A loaded program's LOADs share nodes, so its tree can be
exponentially larger than the file: the readable form stops at its node budget, and
:func:`canonical_text` and :func:`iter_nodes` visit each distinct node once.

Split from :mod:`kernelpack.expr`, which builds and simplifies expressions; this module only
reads them (it imports no Expr at run time, so :mod:`kernelpack.expr` can import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .expr import Expr

__all__ = ["canonical_text", "iter_nodes", "whole_text"]

# operator name -> (printed sign, precedence) of the operators printed infix
_INFIX = {"add": ("+", 5), "sub": ("-", 5), "mul": ("*", 6), "floordiv": ("//", 6),
          "mod": ("%", 6), "shl": ("<<", 4), "shr": (">>", 4), "eq": ("==", 3), "ne": ("!=", 3),
          "lt": ("<", 3), "le": ("<=", 3), "gt": (">", 3), "ge": (">=", 3),
          "and": ("and", 1), "or": ("or", 0)}


# ---- printing ----------------------------------------------------------------------------------
# Printing walks the tree, which a loaded program's LOADs can make exponentially large, and
# error messages print expressions: past this many nodes the rest prints as "...".
_PRINT_NODES = 256


def _format(e: Expr, parent_prec: int, budget: list[int]) -> str:
    budget[0] -= 1
    if budget[0] < 0:
        return "..."
    if e.op == "const":
        return str(e.value)
    if e.op == "sym":
        return str(e.value)
    if e.op == "neg":
        inner = _format(e.args[0], 7, budget)
        return f"-{inner}"
    if e.op == "not":
        text = f"not {_format(e.args[0], 2, budget)}"
        return f"({text})" if parent_prec > 2 else text
    if e.op in _INFIX:
        sign, prec = _INFIX[e.op]
        # left-associative: the right operand needs parentheses at equal precedence; a
        # comparison's left one too, or "(a < b) < c" would read as Python's chained a < b < c
        left = prec + 1 if prec == 3 else prec
        lhs = _format(e.args[0], left, budget)
        text = f"{lhs} {sign} {_format(e.args[1], prec + 1, budget)}"
        return f"({text})" if prec < parent_prec else text
    name = {"ceildiv": "cdiv"}.get(e.op, e.op)
    return f"{name}({', '.join(_format(a, -1, budget) for a in e.args)})"


def whole_text(e: Expr, max_nodes: int) -> tuple[str | None, int]:
    """``str(e)`` complete, or None when printing it takes more than ``max_nodes`` nodes (a
    shared node counts at each use); and the nodes the attempt visited. For the CLI's facts
    (``inspect``, its JSON, ``diff``), which print expressions whole where they can."""
    budget = [max_nodes]
    text = _format(e, -1, budget)
    if budget[0] < 0:
        return None, max_nodes
    return text, max_nodes - budget[0]


def canonical_text(e: Expr) -> str:
    """A complete, deterministic text of ``e`` for cache keys: one entry per distinct node,
    children first, operands by index (``"s:n;c:256;ceildiv(0,1)"``).

    Why not ``str(e)``: printing stops after :data:`_PRINT_NODES` nodes (error messages must
    stay short), so two expressions that differ only past that point print alike and would
    share a key. This text is linear in the number of distinct nodes, never truncated, and
    equal exactly for structurally equal expressions (however their nodes are shared)."""
    index: dict[Expr, int] = {}
    out: list[str] = []
    for node in iter_nodes((e,)):
        if node.op == "const":
            text = f"c:{node.value}"
        elif node.op == "sym":
            text = f"s:{node.value}"
        else:
            text = f"{node.op}({','.join(str(index[a]) for a in node.args)})"
        index[node] = len(out)
        out.append(text)
    return ";".join(out)


def iter_nodes(roots: Iterable[Expr]) -> Iterable[Expr]:
    """Every node reachable from ``roots``, children before parents, each once."""
    seen: set[Expr] = set()
    for root in roots:
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in seen:
                continue
            if expanded or not node.args:
                seen.add(node)
                yield node
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.args))
