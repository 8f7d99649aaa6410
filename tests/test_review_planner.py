"""Adversarial review of expressions, the evaluator and the planners: regressions for what it
found (exponential walks of shared expressions, folding that dropped errors, loose symbol
values, too-deep trees) and a seeded differential check of every evaluation path."""

from __future__ import annotations

import random
import time
from typing import Any, Callable

import pytest

import kernelpack as kp
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.errors import ConstraintError, ExpressionError
from kernelpack.expr import INT64_MAX, INT64_MIN, Expr, const, sym
from kernelpack.expr_program import ExprEncoder
from kernelpack.limits import MAX_EXPR_DEPTH
from kernelpack.planner import Planner
from kernelpack.summary import Arg, Compiled, KernelSummary, Launch, Module, Scalar, Tensor, Variant

import kp_samples

n, m, k = sym("n"), sym("m"), sym("k")


def computing(value: Expr, *inputs: Any) -> KernelSummary:
    """A program whose computed scalar ``r`` is ``value`` (also passed as a value argument)."""
    return KernelSummary("p", (*inputs, Scalar("r", kp.i64, value=value)),
                         (Variant((Launch("k", "m", (1,), (1,),
                                          (Arg.scalar("r"), Arg.of(value, kp.i64))),)),))


def loaded(summary: KernelSummary) -> Any:
    module = Module("m", ("k",), (kp_samples.fake_image(),))
    return kp.load(kp.save([Compiled(summary, (module,))]))[summary.name]


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except (ConstraintError, TypeError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


def every_planner(summary: KernelSummary) -> list[Callable[..., Any]]:
    """Planner (cached and not), the reference planner, and the loaded program's plan."""
    ref = ReferencePlanner(summary)
    nt = sum(isinstance(p, Tensor) for p in summary.inputs)

    def reference(*args: Any) -> Any:  # inputs here are tensors first, then scalars
        return ref.plan_shapes(list(args[:nt]), list(args[nt:]))

    return [Planner(summary).plan, Planner(summary, cache_size=0).plan, reference,
            loaded(summary).plan]


def same_everywhere(summary: KernelSummary, *args: Any) -> tuple[str, Any]:
    results = [outcome(lambda: f(*args)) for f in every_planner(summary)]
    assert all(r == results[0] for r in results), results
    return results[0]


# ---- shared subexpressions (a loaded program's LOADs) must not cost their tree size ----------
def doubling_chain(levels: int) -> Expr:
    e = n
    for _ in range(levels):
        e = e + e * m  # a DAG of 2 * levels nodes, a tree of about 3^levels
    return e


def test_symbols_and_printing_of_a_shared_chain_are_bounded() -> None:
    e = doubling_chain(60)
    start = time.perf_counter()
    assert e.symbols() == {"n", "m"}
    assert len(str(e)) < 10_000 and str(e).endswith("...")
    assert time.perf_counter() - start < 1.0


def test_an_error_in_a_shared_chain_is_worded_quickly() -> None:
    s = computing(doubling_chain(60), Tensor("x", kp.f32, ("n", "m")))
    program = loaded(s)  # decoding checks the summary (symbols()) too
    assert program.plan((1, 1)).computed == {"r": 1 << 60}
    start = time.perf_counter()
    with pytest.raises(ExpressionError, match="int64 overflow") as info:
        program.plan((1, 3))
    assert len(str(info.value)) < 10_000
    assert time.perf_counter() - start < 1.0


def test_equal_copies_of_a_shared_chain_compare_quickly() -> None:
    a, b = doubling_chain(80), doubling_chain(80)  # equal, but no node shared between them
    start = time.perf_counter()
    assert a is not b and a == b and hash(a) == hash(b) and not a != b
    assert a != doubling_chain(79) * 1 + 0 and a != b + 1
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n", "m")), Scalar("r", kp.i64, value=a)),
                      (Variant((Launch("k", "m", (1,), (1,), (Arg.scalar("r"),)),)),),
                      (kp.summary.Constraint(kp.ge(b, 0)),))
    assert same_everywhere(s, (2, 0))[1].computed == {"r": 2}
    assert time.perf_counter() - start < 2.0


# ---- folding must not drop a part that can fail -----------------------------------------------
@pytest.mark.parametrize("build", [lambda: (1 // n) * 0, lambda: (1 // n) - (1 // n),
                                   lambda: kp.select(1 // n, 5, 5),
                                   lambda: kp.shl(m, 64 + n) * 0])
def test_folding_keeps_parts_that_can_fail(build: Callable[[], Expr]) -> None:
    e = build()
    assert not e.is_const
    with pytest.raises(ExpressionError):
        e.evaluate(n=0, m=1)
    kind, message = same_everywhere(computing(e, Tensor("x", kp.f32, ("n", "m"))), (0, 1))
    assert kind == "ExpressionError" and "scalar r" in message


def test_folding_still_applies_where_nothing_can_fail() -> None:
    assert n * 0 == const(0) and n - n == const(0)
    assert kp.select(n > 0, m, m) == m
    assert kp.emin(n, m) - kp.emin(n, m) == const(0)


# ---- symbol values: integers within int64 -----------------------------------------------------
@pytest.mark.parametrize("value", [2.7, "3", None, 1 << 63])
def test_evaluate_refuses_symbol_values_that_are_no_int64(value: Any) -> None:
    with pytest.raises(ExpressionError, match="symbol 'n'|overflow in symbol"):
        (n + 1).evaluate(n=value)


def test_uint64_scalar_above_int64_is_an_expression_error_where_read() -> None:
    s = computing(k // 4, Scalar("k", kp.u64))
    assert same_everywhere(s, INT64_MAX)[1].computed == {"r": INT64_MAX // 4}
    for value in (1 << 63, (1 << 64) - 1):
        kind, message = same_everywhere(s, value)
        assert kind == "ExpressionError" and f"'k' = {value} is outside int64" in message
    # a uint64 that no expression reads (a seed) keeps its full range
    seed = KernelSummary("s", (Tensor("x", kp.f32, ("n",)), Scalar("seed", kp.u64)),
                         (Variant((Launch("k", "m", (kp.cdiv(n, 256),), (256,),
                                          (Arg.buffer("x"), Arg.scalar("seed"))),)),))
    planner = Planner(seed)
    assert planner._fast([(5,)], [(1 << 64) - 1]) is not None
    kind, plan = same_everywhere(seed, (5,), (1 << 64) - 1)
    assert kind == "ok" and plan.symbols == {"n": 5, "seed": (1 << 64) - 1}


# ---- nesting deeper than the format allows: one ValueError, never RecursionError ---------------
@pytest.mark.parametrize("levels", [MAX_EXPR_DEPTH + 10, 3000])
def test_too_deep_expressions_are_refused_the_same_everywhere(levels: int) -> None:
    e = n
    for i in range(levels):
        e = kp.emin(e, m + i) if i % 2 else kp.emax(e, i)  # no folding applies
    with pytest.raises(ExpressionError, match="deeper than MAX_EXPR_DEPTH"):
        e.evaluate(n=1, m=1)
    assert len(str(e)) < 10_000
    enc = ExprEncoder()
    enc.add(e)
    with pytest.raises(ValueError, match="nested deeper"):
        enc.finish()
    s = computing(e, Tensor("x", kp.f32, ("n", "m")))
    for planner in (Planner(s), Planner(s, cache_size=0)):
        for args in [((1, 1),), ((1,),), ((1, -1),)]:  # good and bad calls: the same error
            with pytest.raises(ValueError, match="nested deeper"):
                planner.plan(*args)
    with pytest.raises(ValueError, match="nested deeper"):
        ReferencePlanner(s)


# ---- every evaluation path agrees on random expressions at int64 edges ------------------------
EDGES = (0, 1, -1, 2, -2, 3, 7, 63, 64, -64, 1 << 31, -(1 << 32), INT64_MIN, INT64_MAX,
         INT64_MIN + 1, INT64_MAX - 1)
BINARY: tuple[Callable[[Any, Any], Expr], ...] = (
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a // b,
    lambda a, b: a % b, kp.cdiv, kp.emin, kp.emax, kp.shl, kp.shr, kp.eq, kp.lt, kp.ge,
    kp.land, kp.lor)


def random_expr(rng: random.Random, depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.25:
        return sym(rng.choice("nmk")) if rng.random() < 0.6 else const(rng.choice(EDGES))
    r = rng.random()
    if r < 0.1:
        return -random_expr(rng, depth - 1)
    if r < 0.15:
        return kp.lnot(random_expr(rng, depth - 1))
    if r < 0.25:
        return kp.select(*(random_expr(rng, depth - 1) for _ in range(3)))
    return rng.choice(BINARY)(random_expr(rng, depth - 1), random_expr(rng, depth - 1))


def test_differential_random_expressions() -> None:
    rng = random.Random(7)
    scalars = (Scalar("n", kp.i64), Scalar("m", kp.i64), Scalar("k", kp.i64))
    for _ in range(150):
        e = random_expr(rng, rng.randint(1, 4))
        s = computing(e, *scalars)
        planners = every_planner(s)
        enc = ExprEncoder("nmk")
        enc.add(e)
        encoded, (root,) = enc.finish()
        program = enc.program
        assert program is not None
        for _ in range(5):
            env = {name: rng.choice(EDGES) if rng.random() < 0.8
                   else rng.randint(INT64_MIN, INT64_MAX) for name in "nmk"}
            direct = outcome(lambda: e.evaluate(env))
            frame = program.new_frame([env[name] for name in encoded.symbols])
            assert outcome(lambda: program.value(frame, root))[0] == direct[0]
            values = [env[name] for name in "nmk"]
            results = [outcome(lambda: f(*values)) for f in planners]
            assert all(r == results[0] for r in results), (e, env, results)
            if direct[0] == "ok":
                assert results[0][0] == "ok" and results[0][1].computed == {"r": direct[1]}
            else:
                assert results[0][0] == "ExpressionError", (e, env, results[0])
