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


# Below this depth a node is printed recursively (faster); deeper ones from an explicit stack.
_RECURSIVE_DEPTH = 24


def _format(e: Expr, parent_prec: int, budget: list[int]) -> str:
    """``e`` printed within ``parent_prec`` (parenthesized where it binds weaker), each node
    taking one of ``budget`` in pre-order, "..." once it is spent. Deep trees from an explicit
    stack: an expression as deep as a summary may hold (MAX_EXPR_DEPTH) printed recursively
    overflowed the C stack of a 128 KiB thread (each level a ``str.join`` over a generator,
    ~0.6 KiB: review 34)."""
    if e._depth <= _RECURSIVE_DEPTH:
        return _format_small(e, parent_prec, budget)
    done: list[str] = []  # texts of finished nodes, in order
    # (False, node, precedence): print node; (True, ...): join its operands' texts in done
    tasks: list[tuple[bool, Expr, int]] = [(False, e, parent_prec)]
    while tasks:
        built, node, prec_in = tasks.pop()
        if built:
            n = len(node.args)
            parts = done[len(done) - n:]
            del done[len(done) - n:]
            done.append(_joined(node, parts, prec_in))
        elif node._depth <= _RECURSIVE_DEPTH:
            done.append(_format_small(node, prec_in, budget))
        else:  # (a deep node has operands: leaves are depth 1)
            budget[0] -= 1
            if budget[0] < 0:
                done.append("...")
                continue
            tasks.append((True, node, prec_in))
            tasks.extend(reversed(list(zip([False] * len(node.args), node.args,
                                           _operand_precedences(node)))))
    return done[0]


def _format_small(e: Expr, parent_prec: int, budget: list[int]) -> str:
    """:func:`_format` of a shallow tree, recursively."""
    budget[0] -= 1
    if budget[0] < 0:
        return "..."
    if e.op == "const" or e.op == "sym":
        return str(e.value)
    return _joined(e, [_format_small(a, prec, budget) for a, prec in
                       zip(e.args, _operand_precedences(e))], parent_prec)


def _operand_precedences(node: Expr) -> list[int]:
    """The precedence each operand of ``node`` is printed within."""
    if node.op == "neg":
        return [7]
    if node.op == "not":
        return [2]
    if node.op in _INFIX:
        prec = _INFIX[node.op][1]
        # left-associative: the right operand needs parentheses at equal precedence; a
        # comparison's left one too, or "(a < b) < c" would read as Python's chained a < b < c
        return [prec + 1 if prec == 3 else prec, prec + 1]
    return [-1] * len(node.args)


def _joined(node: Expr, parts: list[str], parent_prec: int) -> str:
    """``node`` printed from its operands' texts."""
    if node.op == "neg":
        return f"-{parts[0]}"
    if node.op == "not":
        text = f"not {parts[0]}"
        return f"({text})" if parent_prec > 2 else text
    if node.op in _INFIX:
        sign, prec = _INFIX[node.op]
        text = f"{parts[0]} {sign} {parts[1]}"
        return f"({text})" if prec < parent_prec else text
    name = {"ceildiv": "cdiv"}.get(node.op, node.op)
    return f"{name}({', '.join(parts)})"


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
