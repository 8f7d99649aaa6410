"""The planner's fast path agrees with the reference planner: same plan, or the same error."""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import HealthCheck, assume, given, settings, strategies as st

import kernelpack as kp
from kernelpack._plan_ops import OPS
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.planner import Planner
from kernelpack.expr import INT64_MAX, INT64_MIN, Expr, apply_op
from kernelpack.summary import (Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                                Variant)

import kp_samples
from test_roundtrip import programs

VALUES = (0, 1, 2, 3, 7, 64, 1000, 1 << 20, 1 << 31, 1 << 62)
SMALL = (0, 1, 2, 3, 5, 8, 100, 1000)


def small_exprs(names: tuple[str, ...]) -> st.SearchStrategy[Expr]:
    """Mostly small, mostly non-negative expressions: plans that usually succeed."""
    leaves = st.one_of(st.integers(0, 300).map(kp.expr.const), st.sampled_from(names).map(kp.sym))

    def extend(inner: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        ops = st.sampled_from((lambda a, b: a + b, lambda a, b: a * b, kp.cdiv, kp.emin, kp.emax,
                               lambda a, b: a // b, lambda a, b: a % b, lambda a, b: a - b))
        return st.one_of(
            st.tuples(ops, inner, inner).map(lambda t: t[0](t[1], t[2])),
            st.tuples(st.sampled_from((kp.lt, kp.eq, kp.ge)), inner, inner, inner, inner).map(
                lambda t: kp.select(t[0](t[1], t[2]), t[3], t[4])),
            st.tuples(inner, st.integers(0, 70)).map(lambda t: kp.shl(t[0], t[1])))

    return st.recursive(leaves, extend, max_leaves=5)


@st.composite
def plannable(draw: st.DrawFn) -> KernelSummary:
    """Programs whose plans mostly succeed, so that the fast path is what gets compared."""
    e = small_exprs(("n", "m"))
    params: list = [Tensor("x", kp.f32, ("n", "m", *draw(st.sampled_from(((), (4,), ("n",)))))),
                    Scalar("a", kp.f32)]
    if draw(st.booleans()):
        params.append(Tensor("y", kp.f16, (draw(st.one_of(st.sampled_from(("n", "m")), e)),)))
    if draw(st.booleans()):
        params.append(Scalar("k", draw(st.sampled_from((kp.i32, kp.u8, kp.i64)))))
    if draw(st.booleans()):
        params.append(Scalar("c", kp.i32, draw(e)))
    for i in range(draw(st.integers(0, 2))):
        params.append(Tensor(f"o{i}", kp.f32, tuple(draw(st.lists(e, max_size=3))), "out"))
    variants = []
    for _ in range(draw(st.integers(1, 3))):
        launches = []
        for _ in range(draw(st.integers(1, 2))):
            repeat = draw(st.integers(0, 5)) == 5
            le = small_exprs(("n", "m", "i")) if repeat else e
            block = draw(st.one_of(st.tuples(st.sampled_from((1, 32, 256, 2048))),
                                   st.tuples(le), st.tuples(st.just(32), le)))
            args = draw(st.lists(st.one_of(st.just(Arg.buffer("x")), st.just(Arg.scalar("a")),
                                           st.tuples(le, st.sampled_from((kp.i64, kp.u8))).map(
                                               lambda t: Arg.of(*t))), max_size=3))
            launches.append(Launch("k", "mod", tuple(draw(st.lists(le, min_size=1, max_size=3))),
                                   block, tuple(args), draw(st.one_of(st.just(0), le)),
                                   draw(e) if repeat else None, "i" if repeat else ""))
        scratch = tuple(Scratch(f"w{j}", kp.i64, tuple(draw(st.lists(e, max_size=2))))
                        for j in range(draw(st.integers(0, 1))))
        variants.append(Variant(tuple(launches), scratch, draw(st.one_of(st.none(), e))))
    constraints = tuple(Constraint(draw(e)) for _ in range(draw(st.integers(0, 2))))
    return KernelSummary("p", tuple(params), tuple(variants), constraints)


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("plan", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the exact type and message are compared
        return (type(exc).__name__, str(exc))


def call_args(summary: KernelSummary, draw: Any, pool: tuple[int, ...] = VALUES
              ) -> tuple[list, list]:
    """Shapes and scalars that mostly bind consistently (each symbol one value), sometimes not
    (hypothesis favours small draws, so the rare cases are the largest ones)."""
    values: dict[str, int] = {}

    def value(name: str) -> int:
        if name not in values or draw(st.integers(0, 9)) == 9:
            values[name] = draw(st.sampled_from(pool))
        return values[name]

    shapes, scalars = [], []
    for p in summary.inputs:
        if isinstance(p, Tensor):
            shape = []
            for d in p.shape:
                if d.is_sym:
                    shape.append(value(str(d.value)))
                elif d.is_const and draw(st.integers(0, 5)) < 5:
                    shape.append(int(d.value))  # type: ignore[arg-type]
                else:
                    shape.append(draw(st.sampled_from(pool)))
            if draw(st.integers(0, 20)) == 20:
                shape.append(1)  # wrong rank
            shapes.append(tuple(shape))
        elif p.is_symbol:
            scalars.append(value(p.name))
        else:
            scalars.append(1.5)
    return shapes, scalars


def compare(summary: KernelSummary, data: st.DataObject, pool: tuple[int, ...]) -> None:
    planner = Planner(summary, cache_size=0)
    reference = ReferencePlanner(summary)
    for _ in range(4):
        shapes, scalars = call_args(summary, data.draw, pool)
        expected = outcome(reference.plan_shapes, shapes, scalars)
        assert outcome(planner.plan_shapes, shapes, scalars) == expected
        if planner._fast is not None:
            fast = planner._fast(shapes, scalars)
            assert fast is None or ("plan", fast) == expected


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_agrees_with_reference(data: st.DataObject) -> None:
    """Random programs of the round-trip test (their plans mostly fail: errors compared)."""
    try:
        summary = data.draw(programs()).summary
    except (ValueError, ArithmeticError, TypeError):
        assume(False)
        return
    compare(summary, data, VALUES)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_agrees_on_plannable_programs(data: st.DataObject) -> None:
    """Programs whose plans mostly succeed (plans compared)."""
    try:
        summary = data.draw(plannable())
    except (ValueError, ArithmeticError, TypeError):
        assume(False)
        return
    compare(summary, data, SMALL)


def test_fast_path_takes_the_common_programs() -> None:
    planner = Planner(kp_samples.axpy_summary(), cache_size=0)
    assert planner._fast is not None
    assert planner._fast([(1000,), (1000,)], [2.0]) == planner.plan((1000,), (1000,), 2.0)
    assert planner._ref is None  # nothing needed the reference planner
    rich = Planner(kp_samples.rich().summary, cache_size=0)
    plan = rich._fast([(2, 1000)], [1000, 1.0])  # the small variant
    assert plan is not None and plan.variant == 0
    assert plan.launches[0].args[3] == ("value", 2000, kp.i64)
    assert rich._ref is None


def test_select_untaken_branch_and_later_predicate_errors_fall_back() -> None:
    n = kp.sym("n")
    x = Tensor("x", kp.f32, ("n",))
    safe = Variant((Launch("k", "m", (kp.select(n > 0, kp.cdiv(1000, n), 1),), (1,), ()),),
                   predicate=n < 10)
    later = Variant((Launch("k", "m", (1,), (1,), ()),), predicate=kp.cdiv(10, n) > 0)
    planner = Planner(KernelSummary("p", (x,), (safe, later)), cache_size=0)
    assert planner.plan((0,)).launches[0].grid == (1, 1, 1)  # fast path bailed, reference ran
    assert planner.plan((4,)).launches[0].grid == (250, 1, 1)
    assert planner.plan((20,)).variant == 1


def test_numpy_like_ints_take_the_fast_path() -> None:
    class Index:
        def __init__(self, v: int) -> None:
            self.v = v

        def __index__(self) -> int:
            return self.v

    planner = Planner(kp_samples.axpy_summary(), cache_size=0)
    assert planner._fast([(Index(300),), (300,)], [1.0]) is not None
    assert planner.plan((Index(300),), (300,), 1.0).launches[0].grid == (2, 1, 1)


def test_computed_scalars_and_constraints() -> None:
    n = kp.sym("n")
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n",)), Scalar("h", kp.i32, value=n // 2)),
                      (Variant((Launch("k", "m", (n,), (1,), ()),)),))
    planner = Planner(s, cache_size=0)
    assert planner._fast([(9,)], []).symbols == {"n": 9, "h": 4}
    assert planner._fast([(1 << 33,)], []) is None  # h does not fit int32: the reference says so


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(OPS)), st.integers(-(1 << 64), 1 << 64),
       st.integers(-70, 70) | st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-5, 5))
def test_operators_agree_with_apply_op(op: str, a: int, b: int, c: int) -> None:
    a = max(INT64_MIN, min(INT64_MAX, a))
    try:
        expected: Any = apply_op(op, a, b, c)
    except ArithmeticError:
        expected = ArithmeticError
    try:
        actual: Any = OPS[op](a, b, c)
    except ArithmeticError:
        actual = ArithmeticError
    assert actual == expected


def test_variants_compiled_lazily_and_thread_safe() -> None:
    n = kp.sym("n")
    variants = tuple(Variant((Launch("k", "m", (kp.cdiv(n, 1 << i) + i,), (32,), ()),),
                             predicate=n < (10 ** (i + 1)) if i < 5 else None)
                     for i in range(6))
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n",)), Tensor("o", kp.f32, (2 * n,), "out")),
                      variants)
    reference = ReferencePlanner(s)
    sizes = [3, 30, 300, 3000, 30000, 300000, 3000000] * 20
    for _ in range(5):
        planner = Planner(s, cache_size=0)
        results: list[Any] = []

        def work(offset: int) -> None:
            for k in range(len(sizes)):
                size = sizes[(k + offset) % len(sizes)]
                results.append((size, planner.plan_shapes([(size,)], [])))

        threads = [threading.Thread(target=work, args=(i * 3,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4 * len(sizes)
        for size, plan in results:
            assert plan == reference.plan_shapes([(size,)], [])
        assert planner._ref is None  # every call took the fast path
