"""Ninth review of the planner: a uint64 scalar above int64 bound to a symbol that an
expression reads must be refused whatever this call's shapes make the planner evaluate."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import kernelpack as kp
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.errors import ConstraintError, ExpressionError
from kernelpack.expr import INT64_MAX, sym
from kernelpack.planner import Planner
from kernelpack.summary import Arg, Compiled, KernelSummary, Launch, Module, Scalar, Tensor, Variant

import kp_samples

n, k = sym("n"), sym("k")
BIG = INT64_MAX + 6  # fits uint64, not int64


def program(*variants: Variant) -> KernelSummary:
    return KernelSummary("p", (Tensor("x", kp.f32, ("n",)), Scalar("k", kp.u64)), variants)


def launch(grid: Any) -> Launch:
    return Launch("f", "m", (grid,), (128,), (Arg.buffer("x"), Arg.scalar("k")))


def planners(summary: KernelSummary) -> list[Callable[..., Any]]:
    """Every way to plan: cached and uncached Planner, the reference, a loaded program."""
    ref = ReferencePlanner(summary)
    module = Module("m", ("f",), (kp_samples.fake_image(),))
    loaded = kp.load(kp.save([Compiled(summary, (module,))]))[summary.name]
    return [Planner(summary).plan, Planner(summary, cache_size=0).plan,
            lambda x, k: ref.plan_shapes([x], [k]), loaded.plan]


# k is read only by an untaken select branch, or only by a variant this shape does not choose:
# the old planner evaluated lazily, so k = 2^63 + 5 passed for n = 4 and failed for n = 0.
LAZY = {
    "select branch": program(Variant((launch(kp.select(n > 0, 1, k)),))),
    "later variant": program(Variant((launch(1),), predicate=n < 10), Variant((launch(k),))),
    "constraint operand": KernelSummary(
        "p", (Tensor("x", kp.f32, ("n",)), Scalar("k", kp.u64)), (Variant((launch(1),)),),
        (kp.Constraint(kp.select(n > 0, 1, k < 5), "k small when empty"),)),
}


@pytest.mark.parametrize("where", list(LAZY))
def test_uint64_above_int64_is_refused_where_any_expression_reads_it(where: str) -> None:
    for plan in planners(LAZY[where]):
        with pytest.raises(ExpressionError, match=rf"scalar 'k' = {BIG} is outside int64, but "
                                                  rf".* reads 'k'"):
            plan((4,), BIG)
        assert plan((4,), INT64_MAX).symbols["k"] == INT64_MAX  # int64's top still binds
    assert issubclass(ExpressionError, ConstraintError)


def test_the_refusal_names_the_reading_field() -> None:
    with pytest.raises(ExpressionError, match=r"variant 1 launch 0 \(f\) grid\.x reads 'k'"):
        Planner(LAZY["later variant"]).plan((4,), BIG)


def test_uint64_read_by_no_expression_keeps_its_full_range() -> None:
    seed = program(Variant((launch(kp.cdiv(n, 128)),)))
    for plan in planners(seed):
        assert plan((4,), (1 << 64) - 1).symbols["k"] == (1 << 64) - 1


# ---- size-0 tensors: a launch with an empty grid is never issued ------------------------------
def sized(block: Any = 128, shared_mem: Any = 0, args: tuple = (), grid: Any = None
          ) -> KernelSummary:
    return KernelSummary("z", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",),
                                                                    role="out")),
                         (Variant((Launch("f", "m", (kp.cdiv(n, 128) if grid is None else grid,),
                                          (block,), (Arg.buffer("x"), Arg.buffer("y"), *args),
                                          shared_mem),)),))


@pytest.mark.parametrize("what, summary", [
    ("block", sized(block=kp.emin(n, 128))),
    ("shared_mem", sized(shared_mem=(n - 1) * 4)),
    ("value argument", sized(args=(Arg.of(n - 1, kp.u32),))),
])
def test_empty_grid_is_not_held_to_the_launch_limits(what: str, summary: KernelSummary) -> None:
    """With n = 0 the launch is skipped (grid 0), yet its block 0, shared memory -4 or value
    argument -1 made plan() (and so the call) refuse what should give an empty output."""
    for plan in planners_of(summary):
        p = plan((0,))
        assert p.launches[0].grid == (0, 1, 1) and p.allocations["y"].shape == (0,)
        assert plan((3,)).launches[0].grid == (1, 1, 1)


def test_a_launched_grid_is_still_held_to_them() -> None:
    for plan in planners_of(sized(block=kp.emin(n, 128), grid=1)):
        with pytest.raises(ConstraintError, match=r"block \(0, 1, 1\) outside the limits"):
            plan((0,))
    for plan in planners_of(sized(args=(Arg.of(n - 1, kp.u32),), grid=1)):
        with pytest.raises(ConstraintError, match=r"value argument 2 = -1 does not fit uint32"):
            plan((0,))


def planners_of(summary: KernelSummary) -> list[Callable[..., Any]]:
    ref = ReferencePlanner(summary)
    return [Planner(summary).plan, Planner(summary, cache_size=0).plan,
            lambda x: ref.plan_shapes([x], [])]
