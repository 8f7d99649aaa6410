"""Regressions from a second adversarial review of expressions and planning: walks of shared
expressions in ``evaluate``/``substitute``, a complete canonical text for keys, the order in
which a stored program reports errors, and bools or unordered containers passed as shapes."""

from __future__ import annotations

import time
from typing import Any

import pytest

import kernelpack as kp
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.errors import ExpressionError
from kernelpack.expr import Expr, canonical_text, sym
from kernelpack.expr_program import ExprEncoder
from kernelpack.planner import Planner
from kernelpack.summary import KernelSummary, Launch, Tensor, Variant

import kp_samples
from test_review_planner import doubling_chain

n, m = sym("n"), sym("m")


# ---- shared subexpressions: each node once ----------------------------------------------------
# 22 levels: a tree of 2^22 paths over 44 distinct nodes (seconds when walked path by path,
# so the old walk fails the time bound instead of hanging the suite)
def test_evaluate_of_a_shared_chain_is_linear() -> None:
    e = doubling_chain(22)
    start = time.perf_counter()
    assert e.evaluate(n=1, m=0) == 1
    assert e.evaluate(n=3, m=1) == 3 << 22
    with pytest.raises(ExpressionError, match="int64 overflow"):
        e.evaluate(n=1 << 45, m=1)
    assert time.perf_counter() - start < 1.0
    assert doubling_chain(60).evaluate(n=5, m=0) == 5


def test_select_stays_lazy_with_shared_nodes() -> None:
    shared = 100 // n
    e = kp.select(n, shared, 0) + kp.select(n, shared + 1, 7)
    assert e.evaluate(n=0) == 7 and e.evaluate(n=10) == 21


def test_substitute_of_a_shared_chain_is_linear() -> None:
    e = doubling_chain(22)
    start = time.perf_counter()
    assert e.substitute({"m": 0}) == n
    assert e.substitute({"n": "k"}).symbols() == {"k", "m"}
    assert time.perf_counter() - start < 1.0


# ---- canonical text: complete, where printing is cut short -------------------------------------
def _long_max(last: int) -> Expr:
    e = n
    for i in range(300):
        e = kp.emax(e, n - i)
    return kp.emax(e, n - last)


def test_canonical_text_tells_apart_what_printing_cannot() -> None:
    a, b = _long_max(1000), _long_max(2000)
    assert str(a) == str(b)  # printing stops after a few hundred nodes
    assert canonical_text(a) != canonical_text(b)
    assert canonical_text(a) == canonical_text(_long_max(1000))


def test_canonical_text_is_linear_and_ignores_sharing() -> None:
    chain = doubling_chain(60)
    start = time.perf_counter()
    text = canonical_text(chain)
    assert len(text) < 10_000 and time.perf_counter() - start < 1.0
    assert canonical_text(doubling_chain(60)) == text  # equal copies, nothing shared
    assert canonical_text(kp.cdiv(n, 256)) == "s:n;c:256;ceildiv(0,1)"
    assert canonical_text(n - m) != canonical_text(m - n)


# ---- a stored program reports the error direct evaluation reports ------------------------------
def test_ceildiv_evaluates_its_operands_left_to_right() -> None:
    e = kp.cdiv(n * (1 << 62), 1 // m)  # the left operand overflows, the right divides by 0
    with pytest.raises(ExpressionError, match="overflow in mul") as direct:
        e.evaluate(n=4, m=0)
    enc = ExprEncoder(["n", "m"])
    enc.add(e)
    _, (root,) = enc.finish()
    assert enc.program is not None
    with pytest.raises(ExpressionError, match="overflow in mul") as stored:
        enc.program.value(enc.program.new_frame([4, 0]), root)
    assert str(direct.value).split(":")[-1] == str(stored.value).split(":")[-1].split(" (")[0]


# ---- shapes: integers only, in order ----------------------------------------------------------
def _planners() -> list[Any]:
    """Planner (cached and not) and a saved-then-loaded program's ``plan``."""
    loaded = kp.load(kp.save([kp_samples.axpy()]))["axpy"]
    s = kp_samples.axpy_summary()
    return [Planner(s).plan, Planner(s, cache_size=0).plan, loaded.plan]


@pytest.mark.parametrize("x", [(True,), (False,), [True]])
def test_a_bool_is_not_a_dim(x: Any) -> None:
    for plan in _planners():
        plan(x=(1,), y=(1,), a=0.5)  # a plan for n=1 in the cache must not answer for True
        with pytest.raises(TypeError, match=r"x.shape\[0\] must be an integer"):
            plan(x=x, y=(1,), a=0.5)
    s = kp_samples.axpy_summary()
    with pytest.raises(TypeError, match=r"x.shape\[0\] must be an integer, not a bool"):
        ReferencePlanner(s).plan_shapes([(True,), (1,)], [0.5])
    planner = Planner(s)
    assert planner._fast is not None and planner._fast([(True,), (1,)], [0.5]) is None


@pytest.mark.parametrize("shape", [{4: 1}, {4}, frozenset({4})])
def test_unordered_containers_are_not_shapes(shape: Any) -> None:
    for plan in _planners():
        with pytest.raises(TypeError, match="tensor x must be a shape tuple"):
            plan(x=shape, y=(4,), a=0.5)


def test_integer_like_dims_still_work() -> None:
    np = pytest.importorskip("numpy")
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n", "m")),),
                      (Variant((Launch("k", "m", (kp.cdiv(n * m, 128),), (128,), ()),)),))
    for plan in (Planner(s).plan, Planner(s, cache_size=0).plan):
        assert plan((np.int64(300), 2)).launches[0].grid == (5, 1, 1)
        assert plan(np.zeros((3, 100))).launches[0].grid == (3, 1, 1)


def test_a_numpy_bool_sets_a_bool_scalar() -> None:
    """``np.True_`` (what a NumPy comparison gives) has no ``__index__``; Python's True does."""
    np = pytest.importorskip("numpy")
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n",)), kp.Scalar("flag", kp.bool_)),
                      (Variant((Launch("k", "m", (kp.select("flag", n, 1),), (1,), ()),)),))
    for plan in (Planner(s).plan, Planner(s, cache_size=0).plan):
        assert plan((10,), np.True_).launches[0].grid == (10, 1, 1)
        assert plan((10,), np.False_).launches[0].grid == (1, 1, 1)
        assert plan((10,), True).symbols["flag"] == 1
    assert ReferencePlanner(s).plan_shapes([(10,)], [np.True_]).symbols["flag"] == 1
    with pytest.raises(TypeError, match="scalar flag must be an integer"):
        Planner(s).plan((10,), np.float32(1.0))
