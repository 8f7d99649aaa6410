"""Planning: symbol binding, checks with named errors, variants, repeats, launch limits."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, ExpressionError
from kernelpack.limits import MAX_LAUNCH_REPEAT
from kernelpack.planner import Allocation, Plan, PlannedLaunch, Planner
from kernelpack.summary import (Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                                Variant)

import kp_samples

n, m = kp.sym("n"), kp.sym("m")


def program(params, grid=(1,), block=(1,), shared_mem=0, count=None, loop="", args=(),
            constraints=(), variants=None, scratch=()) -> Planner:
    launch = Launch("k", "mod", grid, block, tuple(args), shared_mem, count, loop)
    variants = variants or (Variant((launch,), tuple(scratch)),)
    return Planner(KernelSummary("p", tuple(params), tuple(variants), tuple(constraints)))


def test_axpy_plan() -> None:
    planner = Planner(kp_samples.axpy_summary())
    plan = planner.plan(x=(1000,), y=(1000,), a=2.0)
    assert plan == Plan("axpy", 0, {"n": 1000, "n32": 1000}, {}, (
        PlannedLaunch("axpy", "axpy", (4, 1, 1), (256, 1, 1), 0,
                      (("buffer", "x"), ("buffer", "y"), ("scalar", "a"), ("scalar", "n32"))),),
        {"n32": 1000})
    assert planner.plan_shapes([(1000,), (1000,)], [2.0]) == plan
    assert planner.plan((1000,), (1000,), 2.0) == plan


def test_objects_with_shape() -> None:
    class Arr:
        shape = (257,)
    plan = Planner(kp_samples.axpy_summary()).plan(Arr(), Arr(), 1.0)
    assert plan.launches[0].grid == (2, 1, 1)


def test_mismatch_names_parameter_dim_and_origin() -> None:
    planner = Planner(kp_samples.rich().summary)
    with pytest.raises(ConstraintError, match=r"scalar m is 5 but m = 4 from x.shape\[1\]"):
        planner.plan((3, 4), 5, 1.0)
    p = program([Tensor("x", kp.f32, ("a", "n")), Tensor("y", kp.f32, ("n",))])
    with pytest.raises(ConstraintError, match=r"y.shape\[0\] is 5 but n = 4 from x.shape\[1\]"):
        p.plan((2, 4), (5,))


def test_rank_int_and_expression_dims() -> None:
    p = program([Tensor("x", kp.f32, ("n", 3)), Tensor("y", kp.f32, (2 * n,))],
                grid=(n,))
    assert p.plan((4, 3), (8,)).launches[0].grid == (4, 1, 1)
    with pytest.raises(ConstraintError, match=r"x has rank 1 \(shape \(4,\)\), expected rank 2"):
        p.plan((4,), (8,))
    # a call's wrong rank is a LaunchError (README), plan()'s a ConstraintError: one class
    with pytest.raises(kp.RankError) as info:
        p.plan((4, 3, 1), (8,))
    assert isinstance(info.value, kp.LaunchError) and isinstance(info.value, ConstraintError)
    with pytest.raises(ConstraintError, match=r"x.shape\[1\] is 4, expected 3"):
        p.plan((4, 4), (8,))
    with pytest.raises(ConstraintError, match=r"y.shape\[0\] is 9, expected n \* 2 = 8"):
        p.plan((4, 3), (9,))
    with pytest.raises(ConstraintError, match=r"x.shape\[0\] is -1, a negative size"):
        p.plan((-1, 3), (8,))
    with pytest.raises(TypeError, match=r"x.shape\[0\] must be an integer"):
        p.plan((4.5, 3), (8,))


def test_scalars() -> None:
    p = program([Tensor("x", kp.f32, ("n",)), Scalar("k", kp.i32), Scalar("f", kp.f32)],
                grid=(n + kp.sym("k"),))
    assert p.plan((4,), 3, 1.5).launches[0].grid == (7, 1, 1)
    assert p.plan((4,), 3, 1.5).symbols == {"n": 4, "k": 3}
    with pytest.raises(TypeError, match="scalar k must be an integer"):
        p.plan((4,), 1.5, 1.0)
    with pytest.raises(ConstraintError, match="scalar k = 2147483648 is outside its dtype range"):
        p.plan((4,), 1 << 31, 1.0)


def test_argument_mapping_errors() -> None:
    p = Planner(kp_samples.axpy_summary())
    with pytest.raises(TypeError, match="has no input 'z'"):
        p.plan(x=(1,), y=(1,), a=1, z=2)
    with pytest.raises(TypeError, match="missing input\\(s\\) \\['y'\\]"):
        p.plan((1,), a=1.0)
    with pytest.raises(TypeError, match="input 'x' given twice"):
        p.plan((1,), x=(1,))
    with pytest.raises(TypeError, match="takes 3 inputs"):
        p.plan((1,), (1,), 1, 2)
    with pytest.raises(TypeError, match="tensor x must be a shape"):
        p.plan(5, (1,), 1)


def test_constraints_and_variants() -> None:
    planner = Planner(kp_samples.rich().summary)
    assert planner.plan((2, 1024), 1024, 1.0).variant == 0
    assert planner.plan((2, 1025), 1025, 1.0).variant == 1
    with pytest.raises(ConstraintError, match="constraint failed: need at least one row"):
        planner.plan((0, 10), 10, 1.0)
    guarded = Variant((Launch("k", "mod", (1,), (1,), ()),), predicate=n > 10)
    p = program([Tensor("x", kp.f32, ("n",))], variants=[guarded])
    with pytest.raises(ConstraintError, match="no variant applies to n=3"):
        p.plan((3,))


def test_allocations() -> None:
    planner = Planner(kp_samples.rich().summary)
    plan = planner.plan((3, 5000), 5000, 1.0)
    assert plan.allocations == {
        "out": Allocation("out", "output", kp.f32, (3,), 12, True),
        "ws": Allocation("ws", "scratch", kp.f32, (3, 5), 60, True)}
    neg = program([Tensor("x", kp.f32, ("n",)), Tensor("o", kp.f32, (n - 5,), role="out")])
    with pytest.raises(ConstraintError, match=r"output o.shape\[0\] = -2 is negative"):
        neg.plan((3,))
    huge = program([Tensor("x", kp.f32, ("n",)), Tensor("o", kp.f64, (n, n, n), role="out")])
    with pytest.raises(ConstraintError, match="more than int64"):
        huge.plan((1 << 20,))


def test_repeated_launches_expand_in_order() -> None:
    p = program([Tensor("x", kp.f32, ("n",))], grid=(kp.shl(1, "s"),), count=n, loop="s",
                args=[Arg.of(kp.sym("s") * 10, kp.i32)])
    plan = p.plan((4,))
    assert [ln.grid[0] for ln in plan.launches] == [1, 2, 4, 8]
    assert [ln.args[0][1] for ln in plan.launches] == [0, 10, 20, 30]
    assert p.plan((0,)).launches == ()
    with pytest.raises(ConstraintError, match=f"count = {MAX_LAUNCH_REPEAT + 1}"):
        program([Tensor("x", kp.f32, ("n",))], count=n).plan((MAX_LAUNCH_REPEAT + 1,))


def test_a_plan_holds_a_bounded_number_of_launches(monkeypatch) -> None:
    """Repeats are capped per launch and in total: several launches of 2^20 repeats each
    would otherwise cost gigabytes and minutes to plan (a hostile summary can ask for it)."""
    from kernelpack import _plan_ref

    monkeypatch.setattr(_plan_ref, "MAX_PLANNED_LAUNCHES", 10)
    p = program([Tensor("x", kp.f32, ("n",))], count=n)
    assert len(p.plan((10,)).launches) == 10
    with pytest.raises(ConstraintError, match="makes the plan 11 launches, more than "
                                              "MAX_PLANNED_LAUNCHES 10"):
        program([Tensor("x", kp.f32, ("n",))], count=n).plan((11,))


@pytest.mark.parametrize("kw, shape, match", [
    ({"block": (n,)}, 0, r"block \(0, 1, 1\) outside the limits"),
    ({"block": (n,)}, 1025, r"block \(1025, 1, 1\)"),
    ({"block": (n, 2)}, 600, r"block \(600, 2, 1\)"),
    ({"grid": (n,)}, 1 << 31, r"grid \(2147483648, 1, 1\) outside the limits"),
    ({"grid": (1, n)}, 65536, r"grid \(1, 65536, 1\)"),
    ({"grid": (n,)}, -0, None),
    ({"shared_mem": n - 1}, 0, "shared_mem = -1"),
    ({"args": [Arg.of(n, kp.u8)]}, 256, "value argument 0 = 256 does not fit uint8"),
])
def test_launch_limits(kw, shape, match) -> None:
    p = program([Tensor("x", kp.f32, ("n",))], **kw)
    if match is None:
        assert p.plan((shape,)).launches[0].grid == (0, 1, 1)  # zero grid: legal
        return
    with pytest.raises(ConstraintError, match=match):
        p.plan((shape,))


def test_checked_arithmetic() -> None:
    p = program([Tensor("x", kp.f32, ("n",))], grid=(kp.cdiv(1 << 40, n),))
    with pytest.raises(ExpressionError, match="division by zero"):
        p.plan((0,))
    over = program([Tensor("x", kp.f32, ("n",))], grid=(n * n * n,))
    with pytest.raises(ExpressionError, match="overflow"):
        over.plan((1 << 30,))


def test_scalar_and_dim_share_a_name() -> None:
    p = program([Tensor("x", kp.f32, ("k",)), Scalar("k", kp.i64)], grid=(kp.sym("k"),))
    assert p.plan((5,), 5).launches[0].grid == (5, 1, 1)
    with pytest.raises(ConstraintError, match=r"scalar k is 6 but k = 5 from x.shape\[0\]"):
        p.plan((5,), 6)


def test_constant_false_variant_is_skipped() -> None:
    never = Variant((Launch("k", "mod", (1,), (1,), ()),), predicate=kp.lt(1, 0))
    always = Variant((Launch("k", "mod", (2,), (1,), ()),))
    p = program([Tensor("x", kp.f32, ("n",))], variants=[never, always])
    assert p.plan((3,)).variant == 1


def test_repeated_shapes_hit_the_plan_cache() -> None:
    p = Planner(kp_samples.axpy_summary())
    first = p.plan((10,), (10,), 1.0)
    assert p.plan((10,), (10,), 2.0) is first  # float scalars do not change a plan
    assert p.plan((11,), (11,), 1.0) is not first
    off = Planner(kp_samples.axpy_summary(), cache_size=0)
    assert off.plan((10,), (10,), 1.0) == first and off._cache == {}


def test_plan_is_frozen() -> None:
    plan = Planner(kp_samples.axpy_summary()).plan((3,), (3,), 1.0)
    with pytest.raises(AttributeError):
        plan.variant = 2  # type: ignore[misc]


def test_computed_values_and_launch_index() -> None:
    """``computed`` keeps a computed scalar's value even where a bound symbol of the same name
    wins in ``symbols``; ``index`` maps each (repeated) launch back to its summary launch."""
    plain = Launch("k2", "mod", (1,), (1,), (Arg.buffer("x"), Arg.scalar("n")))
    repeated = Launch("k", "mod", (kp.sym("s") + 1,), (1,), (Arg.buffer("x"),), count=n - 1,
                      loop="s")
    p = program([Tensor("x", kp.f32, ("n",)), Scalar("n", kp.i32, value=n * 2)],
                variants=[Variant((repeated, plain))])
    for planner in (p, Planner(p.summary, cache_size=0)):
        plan = planner.plan((3,))
        assert plan.symbols == {"n": 3} and plan.computed == {"n": 6}
        assert [(ln.kernel, ln.grid[0], ln.index) for ln in plan.launches] == \
            [("k", 1, 0), ("k", 2, 0), ("k2", 1, 1)]
        assert plan == p.reference.plan_shapes([(3,)], [])
    assert p.plan((1,)).launches == (PlannedLaunch("k2", "mod", (1, 1, 1), (1, 1, 1), 0,
                                                   (("buffer", "x"), ("scalar", "n")), 1),)


def test_scalars_no_expression_reads_may_be_left_out() -> None:
    # DESIGN.md: pack["scaled_softmax"].plan(x=(4096, 1000)) -- the float scale cannot change
    # a plan, so plan() does not need it (the GPU call still does)
    p = Planner(kp_samples.axpy_summary())
    full = p.plan(x=(1000,), y=(1000,), a=0.5)
    assert p.plan(x=(1000,), y=(1000,)) == full
    assert p.plan((1000,), (1000,)) == full
    rich = Planner(kp_samples.rich().summary)  # x, m (int32), scale (float64)
    assert rich.plan(x=(2, 8), m=8) == rich.plan((2, 8), 8, 1.0)
    with pytest.raises(TypeError, match="missing input\\(s\\) \\['m'\\]"):
        rich.plan(x=(2, 8), scale=1.0)  # integer scalars stay required


def test_float_dims_are_refused_even_after_an_int_plan_was_cached() -> None:
    # 10.0 == 10 and hash(10.0) == hash(10): the plan cache must not turn a float into a hit
    p = Planner(kp_samples.axpy_summary())
    p.plan(x=(10,), y=(10,), a=1.0)
    for bad in (10.0, "10"):
        with pytest.raises(TypeError, match=r"x.shape\[0\] must be an integer"):
            p.plan(x=(bad,), y=(10,), a=1.0)
    with pytest.raises(TypeError, match=r"y.shape\[0\] must be an integer"):
        p.plan(x=[10], y=[10.0], a=1.0)
    np = pytest.importorskip("numpy")
    assert p.plan(x=(np.int64(10),), y=(np.int32(10),), a=1.0).launches[0].grid == (1, 1, 1)
    rich = Planner(kp_samples.rich().summary)
    rich.plan((2, 8), 8, 1.0)
    with pytest.raises(TypeError, match="scalar m must be an integer"):
        rich.plan((2, 8), 8.0, 1.0)


def test_keywords_naming_outputs_or_computed_scalars_say_so() -> None:
    p = Planner(kp_samples.axpy_summary())
    with pytest.raises(TypeError, match="'n32' is not an input, it is computed"):
        p.plan(x=(1,), y=(1,), n32=1)
    rich = Planner(kp_samples.rich().summary)
    with pytest.raises(TypeError, match="'out' is not an input, it is an output"):
        rich.plan(x=(2, 8), m=8, out=(2,))
    with pytest.raises(TypeError, match="has no input 'zz'"):
        rich.plan(x=(2, 8), m=8, zz=1)


def test_plans_are_read_only_so_the_cache_cannot_be_changed_by_a_caller() -> None:
    p = Planner(kp_samples.axpy_summary())
    plan = p.plan((10,), (10,), 1.0)
    with pytest.raises(TypeError):
        plan.symbols["n"] = 99  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.allocations["z"] = None  # type: ignore[index]
    assert p.plan((10,), (10,), 1.0).symbols["n"] == 10
    fast = kp.load(kp.save([kp_samples.axpy()]))["axpy"].plan((10,), (10,), 1.0)
    with pytest.raises(TypeError):
        fast.symbols["n"] = 99  # type: ignore[index]
    assert fast == plan


def test_the_repr_of_a_plan_of_many_launches_is_bounded() -> None:
    """Review 32c: a notebook cell ending in the plan of a repeated launch (count= up to
    2^20) printed every launch (158 MB at the maximum); now the first launches and a count,
    and a small plan's repr is a named tuple's as before."""
    s = KernelSummary(
        "rep", (Tensor("x", kp.f32, ("n",)), Scalar("k", kp.i32)),
        (Variant((Launch("st", "m", (kp.cdiv("n", 256),), (256,),
                         (Arg.buffer("x"), Arg.of(kp.sym("i"), kp.i32)),
                         count=kp.sym("k"), loop="i"),)),))
    plan = Planner(s).plan(x=(1000,), k=5000)
    assert len(plan.launches) == 5000
    for text in (repr(plan), str(plan)):
        assert len(text) < 20_000 and "4980 more of 5000 launches" in text, text[:300]
    small = Planner(s).plan(x=(1000,), k=2)
    assert repr(small) == "Plan(" + ", ".join(f"{n}={getattr(small, n)!r}"
                                              for n in small._fields) + ")"
