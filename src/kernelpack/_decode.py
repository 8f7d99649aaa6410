"""Verified FlatBuffer tables → summary dataclasses (the inverse of the serializer).

Only ever called on buffers that :mod:`kernelpack.verify` has walked, so the reader
(:mod:`kernelpack._fbread`) cannot read out of bounds; what remains to check here is *meaning*: root indices
inside the expression program, dtype codes, names, and everything the summary dataclasses
validate (turned into FormatError naming the program).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Iterable

from .dtypes import DType, dtype_from_code
from .errors import FormatError
from .expr import Expr, iter_nodes
from .limits import MAX_EXPR_WORK
from .expr_program import EncodedExprs, ExprProgram
from ._fbread import Table, tree_spec
from .summary import (ROLES, Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                      Variant)

__all__ = ["decode_program", "ARG_KINDS", "MAX_EXPR_WORK", "check_expression_work",
           "field_expressions"]

ARG_KINDS = ("buffer", "scalar", "value")

# What checking and planning a program may cost is capped by MAX_EXPR_WORK (limits.py): the
# planner's encoder and printing walk each field's expression on its own, so a few thousand
# fields that all read one large shared expression made loading quadratic (a 48 KB file took
# 1.4 s, a 3 MB one minutes).


def field_expressions(params: Iterable[Any], constraints: Iterable[Constraint],
                      variants: Iterable[Variant]) -> Iterable[Expr]:
    """Every expression a summary's fields hold: what KernelSummary.check walks."""
    for p in params:
        if isinstance(p, Tensor):
            yield from p.shape
        elif p.value is not None:
            yield p.value
    for k in constraints:
        yield k.predicate
    for v in variants:
        if v.predicate is not None:
            yield v.predicate
        for sc in v.scratch:
            yield from sc.shape
        for ln in v.launches:
            yield from ln.expressions()


def check_expression_work(refs: int, nodes: int, exprs: Callable[[], Iterable[Expr]]) -> None:
    """Raise FormatError when the ``refs`` expression fields of one program, ``exprs()``,
    read more than MAX_EXPR_WORK nodes in all (see there). ``nodes`` bounds the size of any
    one expression (the program's opcode count): below ``refs * nodes`` nothing is walked,
    so ordinary programs pay two multiplications."""
    if refs * nodes <= MAX_EXPR_WORK:
        return
    total = 0
    sizes: dict[int, int] = {}
    for expr in exprs():
        size = sizes.get(id(expr))
        if size is None:  # at most the budget left (+1) is walked: a refusal costs no more
            size = sum(1 for _ in islice(iter_nodes((expr,)), MAX_EXPR_WORK - total + 1))
            sizes[id(expr)] = size
        total += size
        if total > MAX_EXPR_WORK:
            raise FormatError(f"the expression fields read more than MAX_EXPR_WORK "
                              f"{MAX_EXPR_WORK} expression nodes in all ({refs} fields; a "
                              f"shared subexpression counts once per field that reads it)")


class _Ctx:
    """Checked lookups for one program. ``where`` names the field for messages; it is given
    in parts (joined only when something is wrong: this is the load path)."""

    def __init__(self, name: str, prog: ExprProgram) -> None:
        self.name = name
        self.exprs = prog.exprs
        self.n = prog.root_count
        self.refs = 0  # expression fields looked up (for check_expression_work)

    def root(self, index: int, *where: object) -> Expr:
        self.refs += 1
        if 0 <= index < self.n:
            return self.exprs[index]
        raise FormatError(f"program {self.name!r}: {''.join(map(str, where))} refers to "
                          f"expression root {index}, but the program has {self.n} roots")

    def opt_root(self, index: int, *where: object) -> Expr | None:
        return None if index == -1 else self.root(index, *where)

    def dtype(self, code: int, *where: object) -> DType:
        dtype = dtype_from_code(code)
        if dtype is None:
            raise FormatError(f"program {self.name!r}: {''.join(map(str, where))} has dtype "
                              f"code {code}, which is not a known dtype")
        return dtype

    def shape(self, roots: tuple[int, ...], *where: object) -> tuple[Expr, ...]:
        n, exprs = self.n, self.exprs
        self.refs += len(roots)
        for r in roots:  # the common case in one pass; a bad index is named by root()
            if not 0 <= r < n:
                return tuple(self.root(r, *where, ".shape[", i, "]")
                             for i, r in enumerate(roots))
        return tuple([exprs[r] for r in roots])

    def dims(self, roots: tuple[int, ...], where: str, field: str) -> tuple[Expr, ...]:
        """A launch's grid or block: :meth:`root` of each index, without a call per index."""
        n, exprs = self.n, self.exprs
        self.refs += 3
        for r in roots:
            if not 0 <= r < n:
                return tuple(self.root(v, where, field) for v in roots)
        return tuple([exprs[r] for r in roots])


_ARG = ("kind", "name", "value", "dtype")
_PARAM = ("kind", "name", "dtype", "role", "zero_init", "shape", "value")
_SCRATCH = ("name", "dtype", "shape", "zero_init")
_LAUNCH = ("kernel", "module", "grid", "block", "shared_mem", "count", "loop", ("args", _ARG),
           "reads_elsewhere", "stores_after_loads")
# A Program is read in steps, each checked before the next is read (Table.tree: one C call
# each where the extension is built): its expression program, parameters and constraints (all
# bounded by small limits), then each variant's own fields, then each of its launches with its
# arguments. Reading the whole tree first let a hostile file that fails at its first launch cost
# reading every launch of every variant (millions of empty ones share one vtable; review 23).
_HEAD = tree_spec("Program", ("name", "symbols", "ops", "imms", ("params", _PARAM),
                              ("constraints", ("predicate", "message"))))
_VARIANT = tree_spec("Variant", ("predicate", ("scratch", _SCRATCH)))
_LAUNCH_TREE = tree_spec("Launch", _LAUNCH)


def _params(c: _Ctx, fparams: list[list[Any]]) -> list[Any]:
    out: list[Any] = []
    for i, (kind, name, code, role, zero, shape, value) in enumerate(fparams):
        where = ("parameter ", i, " (", name, ")")
        dtype = c.dtype(code, *where)
        if kind == 0:
            out.append(Tensor(name, dtype, c.shape(shape, *where), ROLES[role], bool(zero)))
        else:
            out.append(Scalar(name, dtype, c.opt_root(value, *where, " value")))
    return out


def _launch(c: _Ctx, ln: list[Any], where: str) -> Launch:
    kernel, module, grid, block, smem, count, loop, fargs, elsewhere, loads_first = ln
    args = []
    for k, (kind, name, value, code) in enumerate(fargs):
        kind = ARG_KINDS[kind]
        if kind == "value":
            args.append(Arg("value", value=c.root(value, where, " arg ", k),
                            dtype=c.dtype(code, where, " arg ", k)))
        else:
            args.append(Arg(kind, name))
    if grid is None or block is None:
        raise FormatError(f"program {c.name!r}: {where} has no "
                          f"{'grid' if grid is None else 'block'}")
    return Launch(
        kernel=kernel, module=module,
        grid=c.dims(grid, where, " grid"), block=c.dims(block, where, " block"),
        args=tuple(args), shared_mem=c.root(smem, where, " shared_mem"),
        count=c.opt_root(count, where, " count"), loop=loop, reads_elsewhere=tuple(elsewhere),
        stores_after_loads=bool(loads_first))


def _variants(c: _Ctx, fvariants: list[Table]) -> list[Variant]:
    out = []
    for vi, v in enumerate(fvariants):
        predicate, fscratch = v.tree(_VARIANT)
        scratch = []
        for name, code, shape, zero in fscratch:
            where = ("variant ", vi, " scratch ", name)
            scratch.append(Scratch(name, c.dtype(code, *where), c.shape(shape, *where),
                                   bool(zero)))
        launches = [_launch(c, ln.tree(_LAUNCH_TREE), f"variant {vi} launch {li}")
                    for li, ln in enumerate(v.get("launches"))]
        out.append(Variant(tuple(launches), tuple(scratch),
                           c.opt_root(predicate, "variant ", vi, " predicate")))
    return out


def decode_program(fp: Table) -> KernelSummary:
    """Rebuild the :class:`KernelSummary` of a verified ``Program`` table.

    Raises FormatError for a malformed expression program, a bad root index or dtype, or a
    summary that its own dataclasses reject (names, unbound symbols, limits).
    """
    name, symbols, ops, imms, fparams, fconstraints = fp.tree(_HEAD)
    try:
        prog = ExprProgram(EncodedExprs(tuple(symbols), ops, imms))
        c = _Ctx(name, prog)
        constraints = [Constraint(c.root(predicate, "constraint ", i), message)
                       for i, (predicate, message) in enumerate(fconstraints)]
        params, variants = _params(c, fparams), _variants(c, fp.get("variants"))
        check_expression_work(c.refs, len(ops),
                              lambda: field_expressions(params, constraints, variants))
        return KernelSummary(name, tuple(params), tuple(variants), tuple(constraints))
    except FormatError as exc:
        if str(exc).startswith("program "):
            raise
        raise FormatError(f"program {name!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        hint = ""
        if "is also the name of a scalar parameter" in str(exc):  # a rule added 2026-11-24
            hint = ("; kernelpack before 2026-11-24 wrote such artifacts: rebuild it with "
                    "another loop name")
        raise FormatError(f"program {name!r}: invalid summary: {exc}{hint}") from None
