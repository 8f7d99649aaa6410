"""Reductions computed once into a workspace where the general schedule would recompute them.

The general (fallback) schedule gives every output element its own thread, which evaluates the
whole expression below that element, reductions included. A reduction whose value is then
*broadcast* — ``x - x.mean(axis=0, keepdims=True)``, one column mean read by every element of
its column — was therefore recomputed by every element that reads it: the work grew with the
reduced length times the broadcast size (centring the columns of a 100000 x 64 tensor: 6.4e11
loads, minutes on an H200, for what is two passes over 25 MB).

Such a reduction is *materialized*: a stage of its own (scheduled like any other output, before
the stages that read it) writes it to a workspace of its shape, declared as the program's
scratch (``{fusion}_m{k}``), and its readers load it from there (an ``input`` node naming the
workspace). Each materialized reduction gets its own stage, in dependency order, so no kernel
reads a workspace it is writing; column reductions of one source shape and axis block that do
not read one another share one (:func:`.schedule.plan`: one split kernel reads the source
once for a mean, a max and a sum of the same columns).

Column reductions below such a stage (``x.sum(axis=0)`` read by other work of its shape) are
materialized too, broadcast or not: a stage whose outputs are column reductions alone splits
them across many threads (:mod:`.columns`), where the general schedule loops over a whole
column in one thread. So are row reductions in a stage that is still general once those
workspaces are in place (``a.sum(-1)`` beside ``c.sum(axis=(0, 2))``, both of shape ``(n,)``:
one stage, general for the second; :func:`materialize_rows`), unless they reduce a few
elements known at compile time (:data:`SHORT_ROW`): a (4, 10^7) row sum was 4 threads.

A reduction that is reduced again (per-row losses averaged over the batch) is materialized too:
the general schedule gives the outer reduction's output one thread, which ran every inner
reduction as well; as workspaces the inner ones take row (or column) kernels and the outer one
reads a short workspace, on a grid of its own (:mod:`.fullred` for a full mean).

Only reductions below a stage that the scheduler put on the general schedule are considered:
the row kernels keep trailing-axis reductions per row and :mod:`.fullred` writes full ones'
outputs on a grid (``x / x.sum()``), and any other reduction read only at its own shape is
computed once per element that needs it anyway.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..expr import Expr
from ..graph import Graph, Node

__all__ = ["materialize", "materialize_rows", "materialize_nodes", "workspace_stages",
           "NESTED", "SHORT_ROW", "ROWS_READ_ELSEWHERE"]

#: materialize reductions that are reduced again (see the module docstring); False gives the
#: schedules from before, for benchmarks/losses.py's comparison
NESTED = True
#: row reductions of at most this many elements (constant) stay inline in a general stage
SHORT_ROW = 32
#: materialize a row reduction the codegen finds read at another row (materialize_nodes);
#: False gives the general schedule from before, for benchmarks/reads_elsewhere.py
ROWS_READ_ELSEWHERE = True


def _squeezed(shape: tuple[Expr, ...]) -> tuple[Expr, ...]:
    return tuple(d for d in shape if not (d.is_const and d.value == 1))


def _reaches(graph: Graph, users: dict[int, list[int]], nid: int,
             found: Callable[[Node], bool], through: Callable[[Node], bool]) -> bool:
    """Whether a node that reads ``nid`` (directly, or through readers for which ``through``
    holds) satisfies ``found``."""
    stack, seen = [nid], set()
    while stack:
        for user in users.get(stack.pop(), ()):
            if user in seen:
                continue
            seen.add(user)
            node = graph.nodes[user]
            if found(node):
                return True
            if through(node):
                stack.append(user)
    return False


def _broadcast(graph: Graph, users: dict[int, list[int]], nid: int) -> bool:
    """Whether the value of node ``nid`` is read at more positions than it has: by a node of
    another (squeezed) shape, directly or through nodes of its own shape (views that add or
    drop size-1 axes, elementwise ops: ``log(x.sum(0)) + m`` read by ``x - ...``). A
    reduction reading it reads each element once."""
    own = _squeezed(graph.nodes[nid].shape)
    return _reaches(graph, users, nid,
                    lambda n: n.op != "reduce" and _squeezed(n.shape) != own,
                    lambda n: n.op != "reduce")


def _nested(graph: Graph, users: dict[int, list[int]], nid: int) -> bool:
    """Whether the value of reduction ``nid`` is reduced again: read by another reduction,
    directly or through elementwise nodes (``(log(exp(x - m).sum(1)) - picked).mean()``, a
    cross-entropy's batch mean of per-row losses). On the general schedule the outer
    reduction's one thread then ran every inner one too: the whole (b, v) work of a loss
    mean on a single GPU thread."""
    return _reaches(graph, users, nid, lambda n: n.op == "reduce", lambda n: True)


def _users(graph: Graph) -> dict[int, list[int]]:
    """node id -> the ids of the nodes that read it."""
    users: dict[int, list[int]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            users.setdefault(i, []).append(node.id)
    return users


def _short_row(graph: Graph, nid: int) -> bool:
    """Whether row reduction ``nid`` reduces a constant number of elements, at most
    :data:`SHORT_ROW`: one thread per output sums it as fast as a row kernel would, without
    the workspace's extra launch (a static 3-vector's norm)."""
    node = graph.nodes[nid]
    src = graph.nodes[node.inputs[0]]
    count = 1
    for axis in node.attrs[1]:
        dim = src.shape[axis]
        if not dim.is_const:
            return False
        count *= dim.value
    return count <= SHORT_ROW


def materialize(graph: Graph, general: Iterable[Sequence[int]]
                ) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with reductions below the stages on the general schedule (``general``: each
    such stage's output nodes) computed into workspaces: every broadcast one, and every column
    reduction (:func:`.columns.column_axes`: a workspace stage of its own takes the split
    column schedule) except a stage's own outputs when that stage will take it itself. A new
    graph whose outputs are the workspaces (in dependency order) and then ``graph``'s
    outputs, and the workspaces' names; ``graph`` itself (and no names) when nothing needs
    it."""
    from .columns import column_axes, column_group

    users = _users(graph)
    groups = [list(g) for g in general]
    below = graph.reachable([n for g in groups for n in g])
    # a stage whose outputs are themselves column reductions of one source and axis block
    # takes the split schedule once what they read is materialized: they stay (not when
    # one reads another, `m` and `((x - m) ** 2).sum(0)`: each then gets a stage of its own)
    kept = {n for g in groups for n in (column_group(graph, g) or ())}
    chosen = [n.id for n in graph.nodes
              if n.id in below and n.op == "reduce" and (
                  _broadcast(graph, users, n.id) or (NESTED and _nested(graph, users, n.id))
                  or (column_axes(graph, n.id) is not None and n.id not in kept))]
    if not chosen:
        return graph, ()
    return materialize_nodes(graph, chosen, ())


def materialize_rows(graph: Graph, general: Iterable[Sequence[int]],
                     workspaces: Sequence[str]) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with the row reductions below the stages still on the general schedule once
    :func:`materialize`'s workspaces are in place (``general``: their output nodes) computed
    into workspaces too, and the names of all its workspaces (``workspaces`` first): see the
    module docstring. Left out: short constant rows (:data:`SHORT_ROW`), and reductions that
    are reduced again, which are :data:`NESTED`'s to decide. ``graph`` itself when none."""
    from .columns import row_axes

    users = _users(graph)
    below = graph.reachable([n for g in general for n in g])
    chosen = [n.id for n in graph.nodes
              if n.id in below and row_axes(graph, n.id) is not None
              and not _short_row(graph, n.id) and not _nested(graph, users, n.id)]
    if not chosen:
        return graph, tuple(workspaces)
    return materialize_nodes(graph, chosen, workspaces)


def materialize_nodes(graph: Graph, chosen: Sequence[int], workspaces: Sequence[str]
                      ) -> tuple[Graph, tuple[str, ...]]:
    """``graph`` with the reductions ``chosen`` (node ids) computed into new workspaces, and
    the names of all its workspaces: ``workspaces`` (those ``graph`` already has) and the
    new ones. The new graph lists every workspace output first, in dependency order (by the
    node computing it: a workspace added later may read one made before), then the other
    outputs.

    :func:`materialize` decides before scheduling; the pipeline also calls this when the
    codegen finds a row reduction read at another row (``rsqrt(a.sum(-1))[None, :]``, the
    symmetric normalization of a matrix), which no row kernel can keep: computed once into a
    workspace, the row sums are then read by a pointwise kernel, where the general schedule
    made every element sum two whole rows (O(n^3) loads for an n x n matrix)."""
    taken = {p[0] for p in graph.params} | {name for name, _ in graph.outputs}
    names: dict[int, str] = {}
    k = 0
    for nid in chosen:
        while f"{graph.name}_m{k}" in taken:
            k += 1
        names[nid] = f"{graph.name}_m{k}"
        taken.add(names[nid])
    out = Graph(graph.name, params=list(graph.params))
    computed: dict[int, int] = {}  # old id -> the new node computing it
    read: dict[int, int] = {}      # old id -> the new node its readers use
    for node in graph.nodes:
        inputs = tuple(read[i] for i in node.inputs)
        out.nodes.append(Node(len(out.nodes), node.op, node.dtype, node.shape, inputs,
                              node.attrs))
        computed[node.id] = read[node.id] = len(out.nodes) - 1
        if node.id in names:  # its readers load the workspace its own stage writes
            out.nodes.append(Node(len(out.nodes), "input", node.dtype, node.shape, (),
                                  (names[node.id],)))
            read[node.id] = len(out.nodes) - 1
    existing = set(workspaces)
    spaces = [(names[nid], computed[nid]) for nid in chosen] + [
        (name, computed[nid]) for name, nid in graph.outputs if name in existing]
    out.outputs = sorted(spaces, key=lambda o: o[1]) + [
        (name, read[nid]) for name, nid in graph.outputs if name not in existing]
    return out, tuple(name for name, _ in out.outputs[:len(spaces)])


def workspace_stages(graph: Graph, workspaces: Iterable[str]) -> list[tuple[tuple, str, int]]:
    """``(group key, name, node)`` of each materialized reduction (an output named in
    ``workspaces``), by depth (0: reads no other workspace; else one more than the deepest
    it reads), stable. Reductions with one key share a stage: column reductions of one
    source shape and axis block at one depth (one split kernel reads the source once for a
    mean, a max and a sum of the same columns), and likewise row reductions of one source
    shape over the same trailing axes at one depth, with one result shape (a cross-entropy's
    row max and picked logit: one row kernel, one pass over the logits); any other workspace
    is a stage of its own.
    A stage never reads a workspace that a later stage writes."""
    from .columns import column_axes, row_axes

    names = set(workspaces)
    level: dict[str, int] = {}
    out = []
    for name, nid in graph.outputs:  # the outputs list workspaces in dependency order
        if name not in names:
            continue
        below = [graph.nodes[n].attrs[0] for n in graph.reachable([nid])
                 if graph.nodes[n].op == "input" and graph.nodes[n].attrs[0] in level]
        level[name] = 1 + max((level[b] for b in below), default=-1)
        block = column_axes(graph, nid)
        key: tuple = ("workspace", name) if block is None else (
            "columns", level[name], block, graph.nodes[graph.nodes[nid].inputs[0]].shape)
        rows = row_axes(graph, nid) if block is None else None
        if rows is not None:
            key = ("rows", level[name], rows, graph.nodes[graph.nodes[nid].inputs[0]].shape,
                   graph.nodes[nid].shape)
        out.append((key, name, nid))
    return sorted(out, key=lambda o: level[o[1]])
