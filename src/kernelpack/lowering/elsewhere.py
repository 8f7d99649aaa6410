"""Which inputs a kernel reads at elements other than those it stores (``reads_elsewhere``).

In-place use (``out=`` over an input) is right when every group of threads that stores a part
of the output reads, of the input under it, only that part, and reads it before storing over
it. Each schedule stores in *units*: a pointwise kernel one element per thread (or a few
16-byte groups, all loaded before any is stored); a row kernel one row of the outputs per
thread, warp or block, which it reads whole (its reductions) before it writes any of it. What
the summary cannot show is where inside an input a kernel reads: ``x * 2`` and ``x @ x.T``
written as ``(x[:, None, :] * x[None, :, :]).sum(-1)`` both take one ``(n, n)`` input and store
one ``(n, n)`` output in one launch, but the second reads row ``j`` of ``x`` for ``out[i, j]``,
which the threads of row ``j`` store over (review 54). This module finds such reads from the
graph, the way the code generator indexes (:meth:`.codegen.Emitter.child_ctx`, its views,
reductions and pads), so that the runtime copies those inputs first
(:mod:`kernelpack.runtime.in_place`).

Every axis of the kernel's iteration gets a label: the output's axes ``("o", j)``, a reduced
axis ``("r", node, axis)`` and an axis a broadcast or a view fixes at index 0 ``("zero",)``.
Walking from the outputs down to each input gives the labels the input's axes are read at (one
tuple per way of reaching it). An input is read *in its unit* when, for every such tuple, its
axes of other extent than a literal 1 are the unit's own outer axes (the output's first
``k`` axes of other extent than 1, same labels and extents, in order) followed by axes whose
extents multiply to the output row's length: its flat index then lies in the unit's flat
range of the output. Anything else (a reduced axis among the outer ones, an output axis the
input is broadcast along, a padded axis) is *elsewhere*: conservative where the extents could
match only at run time. Kernels that store only workspaces (partial and column-split passes)
list every input they read: nothing in place rests on them.
"""

from __future__ import annotations

from typing import Iterable

from ..expr import Expr, product
from ..graph import Graph
from .schedule import KernelSpec

__all__ = ["reads_elsewhere", "input_labels"]

Label = tuple  # ("o", j) | ("r", reduce node, axis) | ("zero",)
_ZERO: Label = ("zero",)


def reads_elsewhere(graph: Graph, spec: KernelSpec, buffers: Iterable[str]) -> tuple[str, ...]:
    """The names among ``buffers`` (the kernel's buffer parameters, in order) of program input
    tensors that kernel ``spec`` reads at elements other than those of its unit (module
    docstring)."""
    inputs = {pname for pname, kind, _, _ in graph.params if kind == "tensor"}
    wanted = [n for n in buffers if n in inputs]
    if not wanted:
        return ()
    reads = input_labels(graph, spec)
    if spec.kind not in ("pointwise", "row"):
        return tuple(n for n in wanted if n in reads)
    out_shape = graph.nodes[spec.outputs[0][1]].shape
    outer = len(out_shape) if spec.kind == "pointwise" else len(spec.shape)
    own = [(("o", j), d) for j, d in enumerate(out_shape[:outer]) if not _one(d)]
    row = product(d for d in out_shape[outer:] if not _one(d))
    elsewhere = []
    for name in wanted:
        if any(not _in_unit(labels, shape, own, row) for labels, shape in reads.get(name, ())):
            elsewhere.append(name)
    return tuple(elsewhere)


def input_labels(graph: Graph, spec: KernelSpec
                 ) -> dict[str, set[tuple[tuple[Label, ...], tuple[Expr, ...]]]]:
    """``{input name: {(labels of its axes, its shape)}}``: every way kernel ``spec`` indexes
    each input node it loads (module docstring). Reductions the kernel loads from a workspace
    (``spec.partials``, ``spec.values``) are not walked into: it reads no input for them."""
    cut = {r for r, *_ in spec.partials} | {r for r, _ in spec.values}
    out: dict[str, set[tuple[tuple[Label, ...], tuple[Expr, ...]]]] = {}
    seen: set[tuple[int, tuple[Label, ...]]] = set()
    stack: list[tuple[int, tuple[Label, ...]]] = []
    for _, nid in spec.outputs:
        stack.append((nid, tuple(("o", j) for j in range(len(graph.nodes[nid].shape)))))
    while stack:
        nid, labels = stack.pop()
        if (nid, labels) in seen:
            continue
        seen.add((nid, labels))
        node = graph.nodes[nid]
        if node.op == "input":
            out.setdefault(node.attrs[0], set()).add((labels, node.shape))
        elif node.op == "view":
            (mapping,) = node.attrs
            src = graph.nodes[node.inputs[0]]
            comps = [_ZERO] * len(src.shape)
            for out_axis, in_axis in enumerate(mapping):
                if in_axis is not None:
                    comps[in_axis] = labels[out_axis]
            stack.append((src.id, tuple(comps)))
        elif node.op == "reduce":
            if nid in cut:
                continue
            _, axes = node.attrs
            stack.append((node.inputs[0], tuple(("r", nid, a) if a in axes else lab
                                                for a, lab in enumerate(labels))))
        else:  # elementwise ops, casts, where, pad (same indices, guarded): broadcast inputs
            for i in node.inputs:
                stack.append((i, _broadcast(labels, graph.nodes[i].shape)))
    return out


def _broadcast(labels: tuple[Label, ...], shape: tuple[Expr, ...]) -> tuple[Label, ...]:
    """The labels of an operand of ``shape`` under a node indexed by ``labels``: aligned from
    the right, a literal 1 read at index 0 (``Emitter.child_ctx``)."""
    r, rc = len(labels), len(shape)
    return tuple(_ZERO if _one(d) else labels[r - rc + k] for k, d in enumerate(shape))


def _in_unit(labels: tuple[Label, ...], shape: tuple[Expr, ...],
             own: list[tuple[Label, Expr]], row: Expr) -> bool:
    """Whether an input of ``shape`` read at ``labels`` stays inside the unit that owns the
    outer axes ``own`` (label, extent) and a row of ``row`` elements."""
    axes = [(lab, d) for lab, d in zip(labels, shape) if not _one(d)]
    if axes[:len(own)] != own:
        return False
    rest = axes[len(own):]
    if any(lab == _ZERO for lab, _ in rest):  # one element read for many
        return False
    return product(d for _, d in rest) == row


def _one(d: Expr) -> bool:
    return d.is_const and d.value == 1
