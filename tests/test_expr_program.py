"""The stored expression program: shared encoding, round trip, validation of hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelpack as kp
from kernelpack.errors import ExpressionError, FormatError
from kernelpack.expr import INT64_MAX, INT64_MIN, OPERATORS, Expr, const, evaluate, sym
from kernelpack.expr import _make  # the folding constructor all public helpers go through
from kernelpack.expr_program import (OP_CONST, OP_END, OP_LOAD, OP_SYM, OPCODES, EncodedExprs,
                                     ExprEncoder, ExprProgram)
from kernelpack.limits import MAX_EXPR_OPS, MAX_EXPR_STACK, MAX_SYMBOLS


def _encode(*exprs: Expr, symbols: tuple[str, ...] = ()) -> tuple[ExprProgram, list[int]]:
    enc = ExprEncoder(symbols)
    for e in exprs:
        enc.add(e)
    encoded, roots = enc.finish()
    return ExprProgram(encoded), roots


def _value(prog: ExprProgram, root: int, **env: int) -> int:
    frame = prog.new_frame([env.get(name) for name in prog.symbols])
    return prog.value(frame, root)


# ---- encoding ----------------------------------------------------------------------------------
def test_simple_program_layout() -> None:
    prog, roots = _encode(kp.cdiv("n", 256))
    enc = prog.encoded
    assert enc.symbols == ("n",)
    assert enc.ops == bytes([OP_SYM, OP_CONST, OPCODES["ceildiv"], OP_END])
    assert enc.imms == (0, 256)
    assert roots == [0]
    assert _value(prog, 0, n=1000) == 4


def test_common_subexpression_is_computed_once_via_load() -> None:
    nm = kp.sym("n") * kp.sym("m")
    grid = kp.cdiv(nm, 256)
    size = nm + 1
    prog, roots = _encode(grid, size)
    enc = prog.encoded
    assert enc.ops.count(OPCODES["mul"]) == 1  # n*m is encoded once ...
    assert enc.ops.count(OP_LOAD) == 2          # ... and loaded by both users
    assert prog.exprs[roots[0]] == grid
    assert prog.exprs[roots[1]] == size
    assert _value(prog, roots[0], n=100, m=30) == 12
    assert _value(prog, roots[1], n=100, m=30) == 3001


def test_duplicate_roots_share_an_index_and_preset_symbols_keep_order() -> None:
    e = kp.sym("b") + kp.sym("a")
    prog, roots = _encode(e, e, symbols=("a", "b"))
    assert roots[0] == roots[1]
    assert prog.symbols == ("a", "b")


def test_shared_root_is_cached_per_frame() -> None:
    nm = kp.sym("n") * kp.sym("m")
    prog, roots = _encode(nm + 1, nm + 2)
    frame = prog.new_frame([3, 4])
    assert prog.value(frame, roots[0]) == 13
    assert prog.value(frame, roots[1]) == 14
    fresh = prog.new_frame([5, 4])  # a new frame sees new values
    assert prog.value(fresh, roots[1]) == 22


def test_evaluation_errors_name_the_expression_and_field() -> None:
    prog, roots = _encode(kp.cdiv("n", "m"))
    frame = prog.new_frame([1, 0])
    with pytest.raises(ExpressionError, match=r"cdiv\(n, m\) \(grid\[0\]\): division by zero"
                                              r".* \(with n=1, m=0\)$"):
        prog.value(frame, roots[0], "grid[0]")  # the symbol values that made it fail


def test_unbound_symbol_in_program() -> None:
    prog, roots = _encode(kp.sym("n") + kp.sym("m"))
    with pytest.raises(ExpressionError, match="symbol 'm' has no value"):
        prog.value(prog.new_frame([1, None]), roots[0])


def test_select_is_lazy_in_program() -> None:
    n, m = kp.sym("n"), kp.sym("m")
    prog, roots = _encode(kp.select(n > 0, m // n, 0))
    assert _value(prog, roots[0], n=0, m=9) == 0
    assert _value(prog, roots[0], n=3, m=9) == 3


@pytest.mark.parametrize("e, env", [
    (kp.sym("n") * kp.sym("m"), {"n": 1 << 40, "m": 1 << 40}),
    (kp.sym("n") + 1, {"n": INT64_MAX}),
    (kp.cdiv("n", "m"), {"n": INT64_MIN, "m": -1}),
    (kp.shl(1, "n"), {"n": 70}),
    (-kp.sym("n"), {"n": INT64_MIN}),
])
def test_program_checks_arithmetic_like_expr(e: Expr, env: dict[str, int]) -> None:
    with pytest.raises(ExpressionError):
        e.evaluate(env)
    prog, roots = _encode(e)
    with pytest.raises(ExpressionError):
        _value(prog, roots[0], **env)


# ---- round trip property ----------------------------------------------------------------------
_SYMS = ("a", "b", "c", "d")


def _folded_trees() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(st.integers(-300, 300).map(const),
                       st.sampled_from([INT64_MAX, INT64_MIN, 63, 64]).map(const),
                       st.sampled_from(_SYMS).map(sym))

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.sampled_from(sorted(OPERATORS)).flatmap(
            lambda op: st.tuples(*[children] * OPERATORS[op]).map(lambda a: _make(op, *a)))

    return st.recursive(leaves, extend, max_leaves=16)


@settings(max_examples=200, deadline=None)
@given(st.lists(_folded_trees(), min_size=1, max_size=6),
       st.lists(st.integers(-1000, 1000) | st.integers(INT64_MIN, INT64_MAX),
                min_size=len(_SYMS), max_size=len(_SYMS)))
def test_round_trip_random_expressions(exprs: list[Expr], values: list[int]) -> None:
    prog, roots = _encode(*exprs)
    # the stored form survives a copy through plain Python values (what the serializer keeps)
    copy = ExprProgram(EncodedExprs(tuple(prog.symbols), bytes(prog.encoded.ops),
                                    tuple(int(i) for i in prog.encoded.imms)))
    env = dict(zip(_SYMS, values))
    frame = copy.new_frame([env[s] for s in copy.symbols])
    for expr, root in zip(exprs, roots):
        assert copy.exprs[root] == expr
        try:
            expected: int | type = evaluate(expr, env)
        except ExpressionError:
            expected = ExpressionError
        if expected is ExpressionError:
            with pytest.raises(ExpressionError):
                copy.value(frame, root)
        else:
            assert copy.value(frame, root) == expected


# ---- validation: every malformed program is a FormatError --------------------------------------
def _program(ops: list[int], imms: tuple[int, ...] = (), symbols: tuple[str, ...] = ()) -> None:
    ExprProgram(EncodedExprs(symbols, bytes(ops), imms))


@pytest.mark.parametrize("ops, imms, symbols, message", [
    ([OP_CONST, 99, OP_END], (1,), (), "unknown expression opcode 99 at 1"),
    ([OP_CONST, 4, OP_END], (1,), (), "unknown expression opcode 4"),
    ([OP_SYM, OP_END], (1,), ("n",), r"SYM index 1 at 0 outside 0..0"),
    ([OP_SYM, OP_END], (-1,), ("n",), "SYM index -1"),
    ([OP_SYM, OP_END], (0,), (), "SYM index 0"),
    ([OP_LOAD, OP_END], (0,), (), "LOAD 0 at 0 refers to a root not yet defined"),
    ([OP_CONST, OP_END, OP_LOAD, OP_END], (1, 1), (), "LOAD 1 at 2"),
    ([OP_CONST, OPCODES["add"], OP_END], (1,), (), "stack underflow at 1"),
    ([OPCODES["neg"], OP_END], (), (), "stack underflow at 0"),
    ([OP_CONST, OP_CONST, OP_CONST, OPCODES["select"], OPCODES["neg"], OPCODES["add"], OP_END],
     (1, 2, 3), (), "stack underflow at 5"),
    ([OP_END], (), (), "END at 0 with 0 values"),
    ([OP_CONST, OP_CONST, OP_END], (1, 2), (), "END at 2 with 2 values"),
    ([OP_CONST], (1,), (), "does not end with END"),
    ([OP_CONST, OP_END, OP_CONST], (1, 2), (), "does not end with END"),
    ([OP_CONST, OP_END], (1, 2), (), "1 unused immediates"),
    ([OP_CONST, OP_END], (), (), "has no immediate"),
    ([OP_CONST, OP_END], (INT64_MAX + 1,), (), "outside int64"),
])
def test_malformed_programs(ops: list[int], imms: tuple[int, ...], symbols: tuple[str, ...],
                            message: str) -> None:
    with pytest.raises(FormatError, match=message):
        _program(ops, imms, symbols)


def test_stack_depth_limit() -> None:
    depth = MAX_EXPR_STACK + 1
    ops = [OP_CONST] * depth + [OPCODES["add"]] * (depth - 1) + [OP_END]
    with pytest.raises(FormatError, match=f"deeper than {MAX_EXPR_STACK}"):
        _program(ops, tuple(range(depth)))
    ok = MAX_EXPR_STACK
    prog = ExprProgram(EncodedExprs((), bytes([OP_CONST] * ok + [OPCODES["add"]] * (ok - 1)
                                              + [OP_END]), tuple(range(ok))))
    assert prog.value(prog.new_frame([]), 0) == sum(range(ok))


def test_symbol_and_length_limits() -> None:
    with pytest.raises(FormatError, match="symbols"):
        _program([], (), tuple(f"s{i}" for i in range(MAX_SYMBOLS + 1)))
    with pytest.raises(FormatError, match="opcodes"):
        ExprProgram(EncodedExprs((), bytes(MAX_EXPR_OPS + 1), ()))


def test_empty_program_is_valid() -> None:
    assert ExprProgram(EncodedExprs((), b"", ())).root_count == 0


# ---- nesting depth: evaluation recurses, so a hostile file must not reach RecursionError -------
def test_unary_chain_deeper_than_limit_is_rejected() -> None:
    from kernelpack.limits import MAX_EXPR_DEPTH

    ops = [OP_CONST] + [OPCODES["neg"]] * 5000 + [OP_END]  # stack depth 1, nesting 5001
    with pytest.raises(FormatError, match=f"nested deeper than {MAX_EXPR_DEPTH}"):
        _program(ops, (1,))


def test_load_chain_deeper_than_limit_is_rejected() -> None:
    ops, imms = [OP_CONST, OP_END], [1]
    for k in range(1, 3000):  # root k = root k-1 + 1: each LOAD adds a level of recursion
        ops += [OP_LOAD, OP_CONST, OPCODES["add"], OP_END]
        imms += [k - 1, 1]
    with pytest.raises(FormatError, match="nested deeper"):
        _program(ops, tuple(imms))
    ops, imms = [OP_CONST, OP_END], [1]
    for k in range(1, 3000):  # LOAD-only roots: no nesting, but one frame per LOAD
        ops += [OP_LOAD, OP_END]
        imms += [k - 1]
    with pytest.raises(FormatError, match="more than 512 operators and LOADs on one path"):
        _program(ops, tuple(imms))


def test_loads_do_not_count_as_nesting_and_the_worst_path_evaluates_from_a_deep_stack() -> None:
    """Review 28: the spec bounds nesting "LOADs followed" (the tree's depth); counting each
    LOAD as a level too refused shared subexpressions kp.save wrote. The bound on frames
    (operators and LOADs on one path, 2 * MAX_EXPR_DEPTH) still keeps evaluation far from
    the recursion limit, even called from a caller already ~300 frames deep."""
    from kernelpack.limits import MAX_EXPR_DEPTH

    # root k = LOAD(k-1) + 1: an expression n + 1 + ... + 1 of MAX_EXPR_DEPTH levels whose
    # every level crosses a LOAD: 2 * MAX_EXPR_DEPTH - 1 frames
    ops, imms = [OP_SYM, OP_END], [0]
    for k in range(1, MAX_EXPR_DEPTH):
        ops += [OP_LOAD, OP_CONST, OPCODES["add"], OP_END]
        imms += [k - 1, 1]
    prog = ExprProgram(EncodedExprs(("n",), bytes(ops), tuple(imms)))
    assert prog.exprs[-1]._depth == MAX_EXPR_DEPTH

    def deep(levels: int) -> int:
        if levels:
            return deep(levels - 1)
        return prog.value(prog.new_frame([7]), MAX_EXPR_DEPTH - 1)

    assert deep(300) == 7 + MAX_EXPR_DEPTH - 1
    with pytest.raises(FormatError, match="nested deeper"):  # one level more: the tree
        ExprProgram(EncodedExprs(("n",), bytes(ops + [OP_LOAD, OP_CONST, OPCODES["add"],
                                                      OP_END]),
                                 tuple(imms + [MAX_EXPR_DEPTH - 1, 1])))


def test_nesting_at_the_limit_evaluates() -> None:
    from kernelpack.limits import MAX_EXPR_DEPTH

    ops = [OP_CONST] + [OPCODES["neg"]] * (MAX_EXPR_DEPTH - 1) + [OP_END]
    prog = ExprProgram(EncodedExprs((), bytes(ops), (5,)))
    assert prog.value(prog.new_frame([]), 0) == (5 if MAX_EXPR_DEPTH % 2 else -5)
    assert str(prog.exprs[0]).count("-") == MAX_EXPR_DEPTH - 1  # printing recurses too


def test_encoder_refuses_what_the_reader_refuses() -> None:
    from kernelpack.limits import MAX_EXPR_DEPTH

    e = kp.sym("n")
    for i in range(MAX_EXPR_DEPTH + 5):
        e = kp.emin(e, i) if i % 2 else kp.emax(e, i)  # no folding applies
    enc = ExprEncoder()
    enc.add(e)
    with pytest.raises(ValueError, match="nested deeper"):
        enc.finish()
