"""Symbolic expressions: building, folding, identities, printing, checked evaluation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelpack as kp
from kernelpack.errors import ConstraintError, ExpressionError
from kernelpack.expr import (INT64_MAX, INT64_MIN, OPERATORS, Expr, as_expr, const, evaluate,
                             floordiv, mod, sym)

n, m = kp.sym("n"), kp.sym("m")


# ---- building -----------------------------------------------------------------------------------
def test_as_expr_accepts_int_str_expr() -> None:
    assert as_expr(3) == const(3)
    assert as_expr("n") == n
    assert as_expr(n) is n
    assert as_expr(True) == const(1)


@pytest.mark.parametrize("bad", [1.5, None, b"n", [1]])
def test_as_expr_rejects_other_types(bad: object) -> None:
    with pytest.raises(TypeError, match="got"):
        as_expr(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "1n", "a-b", "x y"])
def test_symbol_names_must_be_identifiers(bad: str) -> None:
    with pytest.raises(ValueError, match="identifier"):
        sym(bad)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1])
def test_constants_must_fit_int64(value: int) -> None:
    with pytest.raises(ValueError, match="int64"):
        const(value)


def test_structural_equality_and_hashing() -> None:
    assert kp.cdiv("n", 256) == kp.cdiv(n, 256)
    assert hash(n + 1) == hash(kp.sym("n") + 1)
    assert (n + 1) != (n + 2)
    assert {n * 2: "x"}[kp.sym("n") * 2] == "x"


def test_truth_of_symbolic_expression_is_an_error() -> None:
    with pytest.raises(TypeError, match="unknown until evaluated"):
        bool(n > 0)
    assert bool(const(1)) and not bool(const(0))


def test_index_only_for_constants() -> None:
    assert int(const(7)) == 7
    with pytest.raises(TypeError, match="not a constant"):
        int(n)


def test_symbols() -> None:
    assert (kp.cdiv(n, "b") + m * 2).symbols() == {"n", "b", "m"}
    assert const(4).symbols() == set()


def test_substitute_resimplifies() -> None:
    e = kp.cdiv(n, "b")
    assert e.substitute({"b": 1}) == n
    assert e.substitute({"n": 1000, "b": 256}) == const(4)
    assert (n + m).substitute({"m": "k"}) == n + kp.sym("k")


# ---- folding and identities ---------------------------------------------------------------------
@pytest.mark.parametrize("built, expected", [
    (const(2) + 3, const(5)),
    (kp.cdiv(1000, 256), const(4)),
    (kp.shl(1, 10), const(1024)),
    (kp.emin(3, 9), const(3)),
    (n + 0, n),
    (n - 0, n),
    (n * 1, n),
    (n * 0, const(0)),
    (kp.cdiv(n, 1), n),
    (floordiv(n, 1), n),
    (kp.shl(n, 0), n),
    (kp.shr(n, 0), n),
    (n - n, const(0)),
    (kp.emin(n, n), n),
    (kp.emax(n, n), n),
    (-(-n), n),
    ((n + 1) + 2, n + 3),
    ((n * 2) * 3, n * 6),
    (2 + n, n + 2),  # constants move right in commutative operators
    (kp.select(1, n, m), n),
    (kp.select(0, n, m), m),
    (kp.select(n > 0, m, m), m),
])
def test_folding(built: Expr, expected: Expr) -> None:
    assert built == expected


def test_folding_keeps_erroring_constants_for_evaluation() -> None:
    e = kp.cdiv(8, 0)
    assert not e.is_const
    with pytest.raises(ExpressionError, match="division by zero"):
        e.evaluate()
    big = const(INT64_MAX) + 1
    assert not big.is_const
    with pytest.raises(ExpressionError, match="overflow"):
        big.evaluate()


# ---- printing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("e, text", [
    (kp.cdiv(n, 256), "cdiv(n, 256)"),
    ((n + 1) * 2, "(n + 1) * 2"),
    (n + m * 2, "n + m * 2"),
    ((n - m) - 1, "n - m - 1"),
    (n - (m - 1), "n - (m - 1)"),
    (kp.select(n > 0, m // n, 0), "select(n > 0, m // n, 0)"),
    (-(n + m), "-(n + m)"),
    (kp.emin(n, m), "min(n, m)"),
    (kp.emax(n, 4), "max(n, 4)"),
    (kp.shl(1, "s"), "1 << s"),
    (mod(n, 4), "n % 4"),
    (kp.land(n > 1, m < 2), "n > 1 and m < 2"),
    (kp.lnot(n < 3), "not n < 3"),
    (kp.eq(n, m), "n == m"),
])
def test_printer(e: Expr, text: str) -> None:
    assert str(e) == text
    assert repr(e) == f"Expr({text})"


# ---- checked evaluation -------------------------------------------------------------------------
def test_evaluate_basic() -> None:
    assert kp.cdiv(n, 256).evaluate(n=1000) == 4
    assert kp.cdiv(n, 256).evaluate({"n": 1024}) == 4
    assert (n * m + 1).evaluate(n=3, m=4) == 13
    assert kp.shl(1, "s").evaluate(s=62) == 1 << 62


def test_python_floor_semantics_for_negative_operands() -> None:
    assert floordiv(n, 4).evaluate(n=-7) == -2
    assert kp.cdiv(n, 4).evaluate(n=-7) == -1
    assert mod(n, 4).evaluate(n=-7) == 1


@pytest.mark.parametrize("e, env, message", [
    (n * m, {"n": 1 << 32, "m": 1 << 32}, "overflow in mul"),
    (n + 1, {"n": INT64_MAX}, "overflow in add"),
    (n - 1, {"n": INT64_MIN}, "overflow in sub"),
    (-n, {"n": INT64_MIN}, "overflow in neg"),
    (floordiv(n, m), {"n": INT64_MIN, "m": -1}, "overflow in floordiv"),
    (floordiv(n, m), {"n": 1, "m": 0}, "division by zero"),
    (kp.cdiv(n, m), {"n": 1, "m": 0}, "division by zero"),
    (mod(n, m), {"n": 1, "m": 0}, "division by zero"),
    (kp.shl(1, n), {"n": 64}, "shift count 64"),
    (kp.shl(1, n), {"n": -1}, "shift count -1"),
    (kp.shr(m, n), {"n": 64, "m": 1}, "shift count"),
    (kp.shl(n, 1), {"n": 1 << 62}, "overflow in shl"),
    (n + 0 * m, {"n": 1 << 64}, "symbol .n. is 18446744073709551616, outside int64"),
])
def test_checked_evaluation_errors(e: Expr, env: dict[str, int], message: str) -> None:
    with pytest.raises(ExpressionError, match=message) as info:
        e.evaluate(env)
    assert str(e) in str(info.value)  # the message names the expression
    assert isinstance(info.value, ConstraintError)


def test_unbound_symbol() -> None:
    with pytest.raises(ExpressionError, match="symbol 'm' has no value"):
        (n + m).evaluate(n=1)


def test_select_is_lazy() -> None:
    e = kp.select(n > 0, m // n, 0)
    assert e.evaluate(n=0, m=5) == 0
    assert e.evaluate(n=2, m=5) == 2
    # the untaken branch may even read an unbound symbol
    assert kp.select(n, 1, kp.sym("unbound")).evaluate(n=1) == 1


def test_logic_ops_give_zero_or_one() -> None:
    assert kp.land(n, m).evaluate(n=5, m=-3) == 1
    assert kp.lor(n, m).evaluate(n=0, m=0) == 0
    assert kp.lnot(n).evaluate(n=7) == 0
    assert (n >= m).evaluate(n=3, m=3) == 1
    assert kp.ne(n, m).evaluate(n=3, m=3) == 0


# ---- property: folding never changes a value that the unfolded tree computes ------------------
_SYMS = ("a", "b", "c")


def _raw_trees() -> st.SearchStrategy[Expr]:
    """Unfolded trees (built with the raw constructor), small constants to hit edge cases."""
    leaves = st.one_of(
        st.integers(-9, 9).map(lambda v: Expr("const", (), v)),
        st.sampled_from([INT64_MAX, INT64_MIN, 62, 63, 64]).map(lambda v: Expr("const", (), v)),
        st.sampled_from(_SYMS).map(lambda s: Expr("sym", (), s)),
    )

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        ops = sorted(OPERATORS)
        return st.sampled_from(ops).flatmap(
            lambda op: st.tuples(*[children] * OPERATORS[op]).map(lambda args: Expr(op, args)))

    return st.recursive(leaves, extend, max_leaves=12)


def _rebuild(e: Expr) -> Expr:
    """The same tree through the folding constructors."""
    if e.op == "const":
        return const(int(e.value))  # type: ignore[arg-type]
    if e.op == "sym":
        return sym(str(e.value))
    from kernelpack.expr import _make  # the single constructor every helper uses

    return _make(e.op, *(_rebuild(a) for a in e.args))


@settings(max_examples=300, deadline=None)
@given(_raw_trees(), st.lists(st.integers(-70, 70) | st.integers(INT64_MIN, INT64_MAX),
                              min_size=3, max_size=3))
def test_folding_preserves_values(raw: Expr, values: list[int]) -> None:
    env = dict(zip(_SYMS, values))
    try:
        expected = evaluate(raw, env)
    except ExpressionError:
        return  # folding may remove an error (x * 0), never introduce one on this path
    assert evaluate(_rebuild(raw), env) == expected


def test_printer_does_not_chain_comparisons() -> None:
    # "(n < m) < 3" printed as "n < m < 3" would read as Python's chained comparison
    assert str(kp.lt(n < m, 3)) == "(n < m) < 3"
    assert str(kp.eq(n, m < 3)) == "n == (m < 3)"


def test_symbol_names_are_checked_by_type_then_value() -> None:
    """kp.sym(1) is API misuse (TypeError); kp.sym("1a") a bad value (ValueError)."""
    with pytest.raises(TypeError, match="a symbol name must be a str \\(got int: 1\\)"):
        kp.sym(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a Python identifier"):
        kp.sym("1a")


def test_a_constant_equals_and_hashes_as_its_int() -> None:
    # ``x.shape[1] == 3`` for a literal or static dim (review 27): a constant is its int in
    # ==, !=, hashing and containers; a symbolic expression equals no int, and bools stay apart
    three = kp.sym("n") * 0 + 3
    assert three.op == "const" and three == 3 and not (three != 3) and 3 == three
    assert hash(three) == hash(3) and three in {3} and {three: "x"}[3] == "x"
    assert three != 4 and kp.sym("n") != 3 and not (kp.sym("n") == 3)
    assert (const(1) == True) is False and const(0) != False  # noqa: E712
