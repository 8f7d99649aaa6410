"""Plans are cached and shared between calls with the same shapes, so every mapping in one is
read-only: ``computed`` was a plain dict, and a caller's change reached later calls."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.planner import Planner
from kernelpack.summary import Arg, KernelSummary, Launch, Scalar, Tensor, Variant


def _summary() -> KernelSummary:
    n = kp.sym("n")
    return KernelSummary("p", (Tensor("x", kp.f32, ("n",)), Scalar("h", kp.i32, value=n // 2)),
                         (Variant((Launch("k", "m", (n,), (1,), (Arg.scalar("h"),)),)),))


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_computed_values_are_read_only(path: str) -> None:
    planner = Planner(_summary())
    plan = planner.plan((8,)) if path == "fast" else planner.reference.plan_shapes([(8,)], [])
    assert plan.computed == {"h": 4}
    with pytest.raises(TypeError):
        plan.computed["h"] = 999  # type: ignore[index]
    for mapping in (plan.symbols, plan.allocations):
        with pytest.raises(TypeError):
            mapping["n"] = 1  # type: ignore[index]


def test_a_cached_plan_keeps_its_computed_values() -> None:
    planner = Planner(_summary())
    first = planner.plan((10,))
    try:
        first.computed["h"] = 999  # type: ignore[index]
    except TypeError:
        pass
    assert planner.plan((10,)).computed["h"] == 5
    assert ReferencePlanner(_summary()).plan_shapes([(10,)], []).computed == {"h": 5}
