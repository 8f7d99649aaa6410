"""The generator: the op mixins combined, a whole program (inputs, steps, outputs) and its
sources exec'd into a :class:`.Case`.
"""

from __future__ import annotations

import ast

import numpy as np

import kernelpack as kp

from .arith import ArithOps
from .case import Case
from .complexes import ComplexOps
from .dtypes import F32, I64, kp_name
from .integers import IntOps
from .params import ParamOps
from .reference import modes_of, ref_namespace
from .rows import RowOps
from .unary import UnaryOps
from .values import Param, Val
from .where import WhereOps


class Generator(ArithOps, IntOps, UnaryOps, WhereOps, ComplexOps, RowOps, ParamOps):
    """One seed's program: ``Generator(seed, scale).program()``."""

    # -- one step: a random op (another where it declines)
    def step(self) -> None:
        ops = [(self.op_arith, 6), (self.op_unary, 4), (self.op_compare_where, 3),
               (self.op_cast, 2), (self.op_reduce, 4), (self.op_int, 3), (self.op_div, 2),
               (self.op_pattern, 3), (self.op_complex, 1), (self.op_index, 1),
               (self.op_minmax, 1), (self.op_pow, 1), (self.op_view, 1)]
        fns = [f for f, _ in ops]
        w = np.array([float(x) for _, x in ops])
        for _ in range(20):
            fn = fns[int(self.rng.choice(len(fns), p=w / w.sum()))]
            if fn() is not None:
                return

    # -- a whole program
    def program(self) -> Case:
        self.make_universe()
        self.inputs: list[tuple[Param, Val]] = []
        self.nan = self.chance(0.12)
        n_in = int(self.rng.integers(1, 4))
        for _ in range(n_in):
            self.add_input()
        if self.chance(0.35):
            self.pool.append(self.add_scalar())
        for _ in range(int(self.rng.integers(3, 10))):
            self.step()
        outs = self.pick_outputs()
        return self.finish(outs)

    def pick_outputs(self) -> list[Val]:
        made = [v for v in self.pool if not v.leaf]
        if not made:
            made = [self.op_cast() or self.pool[0]]
            made = [v for v in self.pool if not v.leaf] or [self.pool[0]]
        outs = [made[-1]]
        extra = int(self.rng.choice([0, 1, 2], p=[0.45, 0.4, 0.15]))
        for _ in range(extra):
            v = self.pick(made)
            if v not in outs:
                outs.append(v)
        if self.chance(0.2):
            full = self.op_reduce(self.pick(made))
            if full is not None and full not in outs:
                outs.append(full)
        if self.chance(0.1):
            # an arange over a dim expression of its own (its own output shape)
            p = int(self.rng.integers(self.R))
            src = self.dim_src(p)
            if src:
                options = [f"{src} + 1", f"2 * {src}", f"{src} // 2"]
                for prm in self.params:  # an integer scalar in a size (bound: planned too)
                    if prm.kind == "scalar" and prm.dt.kind == "i" and prm.value > 0:
                        n = prm.name if prm.dt == I64 else f"{prm.name}.astype(kp.int64)"
                        options += [f"{n} + {src}", f"{n} * 2"]
                expr = self.pick(options)
                v = self.emit(f"kp.arange({expr}).astype(kp.float32) * 0.5",
                              f"np.arange({expr.replace('.astype(kp.int64)', '')}) * 0.5", F32,
                              (-1,), (False,), lo=0, hi=1e6, r32=False)
                outs.append(v)
        return outs

    def finish(self, outs: list[Val]) -> Case:
        name = f"rand{self.seed}"
        sig = []
        for p in self.params:
            if p.kind == "tensor":
                dims = ", ".join(repr(d) for d in p.dims)
                sig.append(f"{p.name}: T[kp.{kp_name(p.dt)}{', ' if dims else ''}{dims}]")
            else:
                sig.append(f"{p.name}: kp.{kp_name(p.dt)}")
        named = self.chance(0.3)
        if named:
            ret_kp = "{" + ", ".join(f"'o{i}': {v.name}" for i, v in enumerate(outs)) + "}"
        elif len(outs) == 1 and self.chance(0.7):
            ret_kp = outs[0].name
        else:
            ret_kp = ", ".join(v.name for v in outs) + ("," if len(outs) == 1 else "")
        body = "\n".join("    " + line for line in self.kp)
        source = (f"@kp.fusion(name={name!r})\ndef {name}({', '.join(sig)}):\n{body}\n"
                  f"    return {ret_kp}\n")
        head = f"def reference({', '.join(p.name for p in self.params)}):\n"
        tail = f"    return [{', '.join(v.name for v in outs)}]\n"
        ref_source = head + "".join(f"    {line}\n" for line in self.np) + tail
        # what runs: the lines the outputs depend on (the whole text stays the case's record)
        run_source = head + "".join(f"    {line}\n" for line in live_lines(self.np, outs)) + tail
        ns: dict = {"kp": kp, "T": kp.Tensor}
        exec(compile(source, f"<fusion_gen seed {self.seed}>", "exec", dont_inherit=True), ns)
        refs = {}
        for mode in modes_of(self.halves):
            rns = ref_namespace(mode, self.halves)
            exec(compile(run_source, f"<fusion_gen reference {self.seed}>", "exec",
                         dont_inherit=True), rns)
            refs[mode] = rns["reference"]
        return Case(self.seed, name, source, ref_source, ns[name], refs,
                    list(self.params), self.sizes, [v.dt for v in outs],
                    [v.r32 for v in outs], self.nan, [v.fuzz for v in outs], self.halves,
                    [max(abs(v.lo), abs(v.hi)) for v in outs])


def live_lines(lines: list[str], outs: list[Val]) -> list[str]:
    """The reference's ``lines`` that the outputs ``outs`` depend on: a line ``vN = expr``
    whose name nothing later reads is dropped (any other line is kept). The generator writes
    values no output uses, and the reference modes computed them all: eight modes of a half
    case over 2.05 M elements spent 13.5 s in exact sums and exps of values its one output
    (a cast) never read (GPU fuzz, half mode, seed 9492: a TIMEOUT)."""
    live = {v.name for v in outs}
    kept: list[str] = []
    for line in reversed(lines):
        tree = ast.parse(line)
        stmt = tree.body[0] if len(tree.body) == 1 else None
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id not in live):
            continue
        kept.append(line)
        live |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Load)}
    return kept[::-1]


def generate(seed: int, scale: str = "emulator", halves: bool = False,
             elsewhere: bool = False) -> Case:
    """The random case of ``seed``. ``scale``: "emulator" (small sizes: an emulated block
    with barriers runs as one OS thread per GPU thread) or "gpu" (sizes up to a few million
    elements). ``halves``: the half mode (float16/bfloat16 arithmetic; see the package
    docstring), a seed space of its own: a seed without it is the case it always was.
    ``elsewhere``: reductions read at other rows and row reductions beside general ones
    (:mod:`.elsewhere`), a seed space of its own too."""
    if elsewhere:
        from .elsewhere import ElsewhereGenerator  # imports this module

        return ElsewhereGenerator(seed, scale, halves).program()
    return Generator(seed, scale, halves).program()
