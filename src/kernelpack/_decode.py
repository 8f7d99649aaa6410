"""Verified FlatBuffer tables → summary dataclasses (the inverse of the serializer).

Only ever called on buffers that :mod:`kernelpack.verify` has walked, so the reader
(:mod:`kernelpack._fbread`) cannot read out of bounds; what remains to check here is *meaning*: root indices
inside the expression program, dtype codes, names, and everything the summary dataclasses
validate (turned into FormatError naming the program).
"""

from __future__ import annotations

from typing import Any

from .dtypes import DType, dtype_from_code
from .errors import FormatError
from .expr import Expr
from .expr_program import EncodedExprs, ExprProgram
from ._fbread import Table
from .summary import (ROLES, Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                      Variant)

__all__ = ["decode_program", "ARG_KINDS"]

ARG_KINDS = ("buffer", "scalar", "value")


class _Ctx:
    """Checked lookups for one program. ``where`` names the field for messages; it is given
    in parts (joined only when something is wrong: this is the load path)."""

    def __init__(self, name: str, prog: ExprProgram) -> None:
        self.name = name
        self.exprs = prog.exprs
        self.n = prog.root_count

    def root(self, index: int, *where: object) -> Expr:
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
        for r in roots:  # the common case in one pass; a bad index is named by root()
            if not 0 <= r < n:
                return tuple(self.root(r, *where, ".shape[", i, "]")
                             for i, r in enumerate(roots))
        return tuple([exprs[r] for r in roots])

    def dims(self, roots: tuple[int, ...], where: str, field: str) -> tuple[Expr, ...]:
        """A launch's grid or block: :meth:`root` of each index, without a call per index."""
        n, exprs = self.n, self.exprs
        for r in roots:
            if not 0 <= r < n:
                return tuple(self.root(v, where, field) for v in roots)
        return tuple([exprs[r] for r in roots])


_PROGRAM = ("name", "symbols", "ops", "imms")
_PARAM = ("kind", "name", "dtype", "role", "zero_init", "shape", "value")
_ARG = ("kind", "name", "value", "dtype")
_LAUNCH = ("kernel", "module", "grid", "block", "shared_mem", "count", "loop", "args")
_SCRATCH = ("name", "dtype", "shape", "zero_init")
_VARIANT = ("predicate", "scratch", "launches")


def _params(c: _Ctx, fp: Table) -> list[Any]:
    out: list[Any] = []
    for i, p in enumerate(fp.get("params")):
        kind, name, code, role, zero, shape, value = p.values(_PARAM)
        where = ("parameter ", i, " (", name, ")")
        dtype = c.dtype(code, *where)
        if kind == 0:
            out.append(Tensor(name, dtype, c.shape(shape, *where), ROLES[role], bool(zero)))
        else:
            out.append(Scalar(name, dtype, c.opt_root(value, *where, " value")))
    return out


def _launch(c: _Ctx, ln: Table, where: str) -> Launch:
    kernel, module, grid, block, smem, count, loop, fargs = ln.values(_LAUNCH)
    args = []
    for k, a in enumerate(fargs):
        kind, name, value, code = a.values(_ARG)
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
        count=c.opt_root(count, where, " count"), loop=loop)


def _variants(c: _Ctx, fp: Table) -> list[Variant]:
    out = []
    for vi, v in enumerate(fp.get("variants")):
        predicate, fscratch, flaunches = v.values(_VARIANT)
        scratch = []
        for s in fscratch:
            name, code, shape, zero = s.values(_SCRATCH)
            where = ("variant ", vi, " scratch ", name)
            scratch.append(Scratch(name, c.dtype(code, *where), c.shape(shape, *where),
                                   bool(zero)))
        launches = [_launch(c, ln, f"variant {vi} launch {li}")
                    for li, ln in enumerate(flaunches)]
        out.append(Variant(tuple(launches), tuple(scratch),
                           c.opt_root(predicate, "variant ", vi, " predicate")))
    return out


def decode_program(fp: Table) -> KernelSummary:
    """Rebuild the :class:`KernelSummary` of a verified ``Program`` table.

    Raises FormatError for a malformed expression program, a bad root index or dtype, or a
    summary that its own dataclasses reject (names, unbound symbols, limits).
    """
    name, symbols, ops, imms = fp.values(_PROGRAM)
    try:
        prog = ExprProgram(EncodedExprs(tuple(symbols), ops, imms))
        c = _Ctx(name, prog)
        constraints = [Constraint(c.root(k.get("predicate"), "constraint ", i), k.get("message"))
                       for i, k in enumerate(fp.get("constraints"))]
        return KernelSummary(name, tuple(_params(c, fp)), tuple(_variants(c, fp)),
                             tuple(constraints))
    except FormatError as exc:
        if str(exc).startswith("program "):
            raise
        raise FormatError(f"program {name!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise FormatError(f"program {name!r}: invalid summary: {exc}") from None
