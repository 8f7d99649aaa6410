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
    def __init__(self, name: str, prog: ExprProgram) -> None:
        self.name = name
        self.prog = prog
        self.n = prog.root_count

    def root(self, index: int, where: str) -> Expr:
        if not 0 <= index < self.n:
            raise FormatError(f"program {self.name!r}: {where} refers to expression root "
                              f"{index}, but the program has {self.n} roots")
        return self.prog.exprs[index]

    def opt_root(self, index: int, where: str) -> Expr | None:
        return None if index == -1 else self.root(index, where)

    def dtype(self, code: int, where: str) -> DType:
        dtype = dtype_from_code(code)
        if dtype is None:
            raise FormatError(f"program {self.name!r}: {where} has dtype code {code}, which "
                              f"is not a known dtype")
        return dtype

    def shape(self, t: Table, where: str) -> tuple[Expr, ...]:
        return tuple(self.root(r, f"{where}.shape[{i}]") for i, r in enumerate(t.get("shape")))


def _params(c: _Ctx, fp: Table) -> list[Any]:
    out: list[Any] = []
    for i, p in enumerate(fp.get("params")):
        name = p.get("name")
        where = f"parameter {i} ({name})"
        dtype = c.dtype(p.get("dtype"), where)
        if p.get("kind") == 0:
            out.append(Tensor(name, dtype, c.shape(p, where), ROLES[p.get("role")],
                              bool(p.get("zero_init"))))
        else:
            out.append(Scalar(name, dtype, c.opt_root(p.get("value"), where + " value")))
    return out


def _launch(c: _Ctx, ln: Table, where: str) -> Launch:
    args = []
    for k, a in enumerate(ln.get("args")):
        kind = ARG_KINDS[a.get("kind")]
        if kind == "value":
            args.append(Arg("value", value=c.root(a.get("value"), f"{where} arg {k}"),
                            dtype=c.dtype(a.get("dtype"), f"{where} arg {k}")))
        else:
            args.append(Arg(kind, a.get("name")))
    grid, block = ln.get("grid"), ln.get("block")
    if grid is None or block is None:
        raise FormatError(f"program {c.name!r}: {where} has no "
                          f"{'grid' if grid is None else 'block'}")
    return Launch(
        kernel=ln.get("kernel"), module=ln.get("module"),
        grid=tuple(c.root(v, f"{where} grid") for v in grid),
        block=tuple(c.root(v, f"{where} block") for v in block),
        args=tuple(args), shared_mem=c.root(ln.get("shared_mem"), f"{where} shared_mem"),
        count=c.opt_root(ln.get("count"), f"{where} count"), loop=ln.get("loop"))


def _variants(c: _Ctx, fp: Table) -> list[Variant]:
    out = []
    for vi, v in enumerate(fp.get("variants")):
        scratch = []
        for s in v.get("scratch"):
            name = s.get("name")
            where = f"variant {vi} scratch {name}"
            scratch.append(Scratch(name, c.dtype(s.get("dtype"), where), c.shape(s, where),
                                   bool(s.get("zero_init"))))
        launches = [_launch(c, ln, f"variant {vi} launch {li}")
                    for li, ln in enumerate(v.get("launches"))]
        out.append(Variant(tuple(launches), tuple(scratch),
                           c.opt_root(v.get("predicate"), f"variant {vi} predicate")))
    return out


def decode_program(fp: Table) -> KernelSummary:
    """Rebuild the :class:`KernelSummary` of a verified ``Program`` table.

    Raises FormatError for a malformed expression program, a bad root index or dtype, or a
    summary that its own dataclasses reject (names, unbound symbols, limits).
    """
    name = fp.get("name")
    try:
        prog = ExprProgram(EncodedExprs(tuple(fp.get("symbols")), fp.get("ops"), fp.get("imms")))
        c = _Ctx(name, prog)
        constraints = [Constraint(c.root(k.get("predicate"), f"constraint {i}"), k.get("message"))
                       for i, k in enumerate(fp.get("constraints"))]
        return KernelSummary(name, tuple(_params(c, fp)), tuple(_variants(c, fp)),
                             tuple(constraints))
    except FormatError as exc:
        if str(exc).startswith("program "):
            raise
        raise FormatError(f"program {name!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise FormatError(f"program {name!r}: invalid summary: {exc}") from None
