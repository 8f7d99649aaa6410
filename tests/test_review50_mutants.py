"""Review 50: tests that kill mutants which survived the existing suite.

A throw-away mutator (outside the repo) changed ``expr.py``, ``expr_eval.py``,
``expr_program.py``, ``_plan_ref.py``, ``_plan_fast.py``, ``_plan_ops.py``, ``planner.py`` and
``_plan_types.py`` one site at a time (flipped comparisons and boolean operators, dropped
conditions and raises, constants and overflow bounds off by one, swapped branches; plus 57
hand-written ones: wrong identities, C-style division and modulo, a logical shift, shift counts
of 64, dropped ``_cannot_fail`` guards, widened grid/block/dtype bounds, a plan cache keyed
on shapes alone) and ran the tests that exercise each module. 215 mutants: 157 killed by the
suite, 39 by the tests here, 19 equivalent. No C mutants: ``runtime/_fastcall_spec.c`` builds
the fast call's layouts and evaluates no expression. Every test here passes on the current
code; no real bug was found. The tests compare every evaluation path (``apply_op``,
``Expr.evaluate``, the stored program, the fast path's OPS, both planners end to end) with an
exact rational specification over int64 edge values, check each builder's simplification
against the node as written, and plan at each documented limit and one past it, asserting
that the fast path makes the plan itself where it should. About 3 s.

Survivors judged equivalent (no test can tell them apart): ``Expr.__eq__``'s small-tree
threshold, the small-constant cache and validation's shared constant nodes, closures rebuilt
on each ``value`` call, the dedicated ``ceildiv`` closure dropped (``apply_op`` gives the same),
``min``/``max`` returning the other operand on a tie (three sites), the dead attribute
``ReferencePlanner._symbol_scalars`` (deleted since), the fast path's ``RecursionError`` guard (depth is
bounded first), its static negative-dim check (constant dims are refused when a Tensor or
Scratch is made), ``if constraints`` made always true, static allocations recomputed from
constant registers, a uint64 clamp set computed for every scalar, a non-value argument's
unused register, three plan-cache bookkeeping changes (a plan stored under ``None`` and never
read, eviction one plan early, an eviction guard), and block x/y at most 1025 (the product
bound of 1024 already refuses it).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any, Callable

import pytest

import kernelpack as kp
from kernelpack import expr as E
from kernelpack._plan_fast import compile_fast
from kernelpack._plan_ops import OPS
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.errors import ConstraintError, ExpressionError, FormatError
from kernelpack.expr import INT64_MAX, INT64_MIN, Expr, apply_op
from kernelpack.expr_program import EncodedExprs, ExprEncoder, ExprProgram
from kernelpack.planner import Planner
from kernelpack.summary import (Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                                Variant)

n, m = kp.sym("n"), kp.sym("m")
BINARY = ("add", "sub", "mul", "floordiv", "ceildiv", "mod", "min", "max", "shl", "shr",
          "eq", "ne", "lt", "le", "gt", "ge", "and", "or")


# ==== an exact specification of every operator, written without Python's // % << >> ===========

def _spec(op: str, a: int, b: int = 0) -> int | None:
    """The documented int64 result of ``op`` (FORMAT.md §2), or None where it is an error."""
    if op in ("floordiv", "ceildiv", "mod") and b == 0:
        return None
    if op in ("shl", "shr") and not 0 <= b <= 63:
        return None
    q = Fraction(a, b) if op in ("floordiv", "ceildiv", "mod") else None
    r = {
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
        "floordiv": lambda: q.__floor__(), "ceildiv": lambda: q.__ceil__(),
        "mod": lambda: a - b * q.__floor__(), "min": lambda: a if a < b else b,
        "max": lambda: b if a < b else a, "shl": lambda: a * 2 ** b,
        "shr": lambda: Fraction(a, 2 ** b).__floor__(), "eq": lambda: int(a == b),
        "ne": lambda: int(a != b), "lt": lambda: int(a < b), "le": lambda: int(a <= b),
        "gt": lambda: int(a > b), "ge": lambda: int(a >= b),
        "and": lambda: int(a != 0 and b != 0), "or": lambda: int(a != 0 or b != 0),
        "neg": lambda: -a, "not": lambda: int(a == 0),
    }[op]()
    return r if INT64_MIN <= r <= INT64_MAX else None


EDGES = (INT64_MIN, INT64_MIN + 1, -(1 << 32), -7, -2, -1, 0, 1, 2, 3, 7, 63, 64, 1 << 32,
         INT64_MAX - 1, INT64_MAX)


def _program_value(e: Expr, env: dict[str, int]) -> Any:
    enc = ExprEncoder(list(env))
    enc.add(e)
    _, roots = enc.finish()
    prog = enc.program
    assert prog is not None
    try:
        return prog.value(prog.new_frame(list(env.values())), roots[0])
    except ExpressionError:
        return None


def _direct_value(e: Expr, env: dict[str, int]) -> Any:
    try:
        return e.evaluate(env)
    except ExpressionError:
        return None


def _ops_value(op: str, a: int, b: int) -> Any:
    try:
        return OPS[op](a, b, b)
    except ArithmeticError:
        return None


def test_every_operator_matches_the_exact_spec_on_every_path():
    """apply_op, Expr.evaluate, the stored program and the fast path's OPS against an exact
    rational specification over int64 edge values (negative floordiv/mod/ceildiv, shifts of
    negatives, counts 63/64, the overflow bounds). Kills mutants of all four evaluators."""
    bad = []
    for op in BINARY:
        node = Expr(op, (kp.sym("a"), kp.sym("b")))
        for a, b in itertools.product(EDGES, EDGES):
            want = _spec(op, a, b)
            try:
                got_apply = apply_op(op, a, b)
            except E.ExprEvalError:
                got_apply = None
            env = {"a": a, "b": b}
            got = (got_apply, _direct_value(node, env), _ops_value(op, a, b))
            if got != (want,) * 3:
                bad.append((op, a, b, want, got))
    for op in ("neg", "not"):
        node = Expr(op, (kp.sym("a"),))
        for a in EDGES:
            want = _spec(op, a)
            got = (_direct_value(node, {"a": a}), _ops_value(op, a, 0))
            if got != (want, want):
                bad.append((op, a, want, got))
    assert not bad, bad[:5]


def test_the_stored_program_matches_the_spec():
    """The same table through ExprEncoder/ExprProgram closures (dedicated add, mul and ceildiv
    closures, select, the symbol range check)."""
    bad = []
    for op in BINARY + ("neg", "not"):
        arity = 1 if op in ("neg", "not") else 2
        node = Expr(op, (kp.sym("a"), kp.sym("b"))[:arity])
        enc = ExprEncoder(["a", "b"])
        enc.add(node)
        _, roots = enc.finish()
        prog = enc.program
        assert prog is not None
        for a, b in itertools.product(EDGES, EDGES if arity == 2 else (0,)):
            try:
                got = prog.value(prog.new_frame([a, b]), roots[0])
            except ExpressionError:
                got = None
            want = _spec(op, a, b)
            if got != want:
                bad.append((op, a, b, want, got))
    assert not bad, bad[:5]


def test_stored_select_takes_the_right_branch_lazily():
    """select in a stored program: the chosen branch, and the other never evaluated."""
    e = kp.select(kp.lt(kp.sym("a"), 3), kp.sym("a") * 10, kp.sym("a") // kp.sym("b"))
    assert _program_value(e, {"a": 1, "b": 0}) == 10
    assert _program_value(e, {"a": 7, "b": 2}) == 3
    assert _program_value(e, {"a": 7, "b": 0}) is None


def test_stored_program_refuses_a_symbol_outside_int64():
    """A frame value beyond int64 (a uint64 scalar) is an ExpressionError, not a value."""
    enc = ExprEncoder(["a"])
    enc.add(kp.sym("a") + 1)
    _, roots = enc.finish()
    prog = enc.program
    assert prog is not None
    for v in (1 << 63, INT64_MIN - 1):
        with pytest.raises(ExpressionError, match="outside int64"):
            prog.value(prog.new_frame([v]), roots[0])
    assert prog.value(prog.new_frame([INT64_MAX - 1]), roots[0]) == INT64_MAX


# ==== simplification: what the builders fold agrees with the node as written ===================

_FORMS: tuple[Any, ...] = (n, m, 0, 1, -1, 2, -n, n + 3, n * 3, 1 // n, E.shr(5, n),
                           E.shl(1, m))
_ENV_VALUES = (INT64_MIN, -3, -1, 0, 1, 2, 64, INT64_MAX)


def _outcome(e: Expr, env: dict[str, int]) -> tuple[str, Any]:
    try:
        return ("value", e.evaluate(env))
    except ExpressionError as exc:
        return ("error", str(exc))


def _agrees(simplified: Expr, raw: Expr, envs: list[dict[str, int]]) -> list:
    """Where the node as written has a value, the simplified one has the same; where it fails
    for a reason other than overflow (division by zero, a shift count), the simplified one
    fails too (a fold may only remove an intermediate overflow: FORMAT.md, expr.py)."""
    bad = []
    for env in envs:
        r, s = _outcome(raw, env), _outcome(simplified, env)
        if r[0] == "value" and s != r:
            bad.append((str(raw), str(simplified), env, r, s))
        elif r[0] == "error" and "overflow" not in r[1] and s[0] != "error":
            bad.append((str(raw), str(simplified), env, r, s))
    return bad


def test_builder_simplifications_are_exact():
    """Every binary builder over operands of many shapes (symbols, constants, -n, n + 3, n * 3,
    and operands that can fail: 1 // n, 5 >> n, 1 << m) agrees with the unsimplified node
    (``Expr(op, args)``). Kills identities applied to the wrong operator (``-n + m`` became
    ``n``), wrong constants (``x // -1`` as ``x``), and dropped ``_cannot_fail`` guards."""
    envs = [{"n": a, "m": b} for a in _ENV_VALUES for b in _ENV_VALUES]
    bad = []
    for op in BINARY:
        for a, b in itertools.product(_FORMS, _FORMS):
            ea, eb = E.as_expr(a), E.as_expr(b)
            simplified = E._make(op, ea, eb)
            bad += _agrees(simplified, Expr(op, (ea, eb)), envs)
            if len(bad) > 5:
                break
    assert not bad, bad[:5]


def test_unary_and_select_simplifications_are_exact():
    envs = [{"n": a, "m": b} for a in _ENV_VALUES for b in _ENV_VALUES]
    bad = []
    for a in _FORMS:
        ea = E.as_expr(a)
        bad += _agrees(-ea, Expr("neg", (ea,)), envs)
        bad += _agrees(E.lnot(ea), Expr("not", (ea,)), envs)
        for t, f in itertools.product(_FORMS, (n, 2, 1 // n)):
            et, ef = E.as_expr(t), E.as_expr(f)
            bad += _agrees(E.select(ea, et, ef), Expr("select", (ea, et, ef)), envs)
            bad += _agrees(E.select(ea, et, et), Expr("select", (ea, et, et)), envs)
    assert not bad, bad[:5]


def test_named_identities():
    """The identities a summary relies on, spelled out (each a surviving mutant's case)."""
    assert (-n + m).evaluate(n=1, m=2) == 1
    assert E.emin(-n, 3).evaluate(n=5) == -5
    assert (n // -1).evaluate(n=5) == -5
    assert E.cdiv(n, -1).evaluate(n=5) == -5
    assert (n * -1).evaluate(n=5) == -5
    assert (3 - n).evaluate(n=1) == 2
    assert E.lt(3, n).evaluate(n=5) == 1
    assert E.select(1, n, m) is n and E.select(0, n, m) is m
    assert E.select(E.lt(n, 4), m, m) is m  # a condition that cannot fail is dropped
    # ... and one that can fail is kept, so that evaluation still reports it
    for fallible in (1 // n, E.shr(1, n), E.shl(1, n), n % m, n - 1):
        e = E.select(fallible, m, m)
        assert e is not m and e.op == "select"
    with pytest.raises(ExpressionError, match="division by zero"):
        (1 // n - 1 // n).evaluate(n=0)
    with pytest.raises(ExpressionError, match="division by zero"):
        ((1 // n) * 0).evaluate(n=0)
    # reassociated constants: folded exactly, and kept unfolded where the sum leaves int64
    assert ((n + INT64_MAX) + INT64_MAX).evaluate(n=-INT64_MAX) == INT64_MAX
    assert ((n * (1 << 40)) * (1 << 40)).evaluate(n=0) == 0
    with pytest.raises(ExpressionError, match="overflow"):
        ((n + INT64_MAX) + 1).evaluate(n=0)


def test_round_with_a_negative_or_odd_ndigits():
    assert round(E.const(1234), -2) == 1200
    with pytest.raises(TypeError, match="ndigits"):
        round(E.const(5), 1.5)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="ndigits"):
        round(n, -1)


# ==== the expression program's validation ========================================================

@pytest.mark.parametrize("ops, imms, what", [
    (bytes([2, 0]), (1,), "SYM index 1"),           # one symbol: index 1 is out of range
    (bytes([2, 0]), (-1,), "SYM index -1"),
    (bytes([1, 0, 3, 0]), (5, 1), "LOAD 1"),        # root 1 is the one being defined
    (bytes([1, 1, 0]), (5, 6), "END at 2 with 2"),  # two values on the stack at END
    (bytes([1, 10, 0]), (5,), "underflow"),
    (bytes([1, 1, 10]), (5, 6), "does not end with END"),
    (bytes([1, 0]), (5, 6), "unused"),
    (bytes([1, 0, 1, 0]), (5,), "no immediate"),
    (bytes([1, 9, 0]), (5,), "unknown expression opcode 9"),
])
def test_program_validation_refuses(ops: bytes, imms: tuple, what: str):
    with pytest.raises(FormatError, match=what):
        ExprProgram(EncodedExprs(("n",), ops, imms))


def test_program_validation_accepts_the_edges():
    prog = ExprProgram(EncodedExprs(("n",), bytes([2, 0, 3, 3, 10, 0]), (0, 0, 0)))
    assert prog.value(prog.new_frame([21]), 1) == 42


# ==== planning: the fast path, the reference planner and hand-computed answers ==================

def _summary(params: list, launches: list, constraints: tuple = (), scratch: tuple = (),
             variants: list | None = None) -> KernelSummary:
    vs = variants if variants is not None else [Variant(tuple(launches), scratch)]
    return KernelSummary("p", tuple(params), tuple(vs), constraints)


def _launch(grid: tuple = (1,), block: tuple = (32,), args: tuple = (), smem: Any = 0,
            **kw: Any) -> Launch:
    return Launch("k", "mod", grid, block, args, smem, **kw)


def _outcome_of(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("plan", fn(*args))
    except (ConstraintError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def _plans(s: KernelSummary, shapes: list, scalars: list = (), fast_expected: bool = True
           ) -> tuple[str, Any]:
    """The outcome of both planners, which must agree; ``fast_expected``: the fast path
    itself gives the plan where the reference does (no needless hand-over)."""
    ref = _outcome_of(ReferencePlanner(s).plan_shapes, shapes, list(scalars))
    planner = Planner(s, cache_size=0)
    got = _outcome_of(planner.plan_shapes, shapes, list(scalars))
    assert got == ref, (shapes, scalars, got, ref)
    fast = compile_fast(s)
    assert fast is not None
    direct = fast(shapes, list(scalars))
    if ref[0] == "plan":
        if fast_expected:
            assert direct == ref[1], (shapes, scalars, direct, ref)
        else:
            assert direct is None or direct == ref[1]
    else:
        assert direct is None, (shapes, scalars, direct, ref)
    return ref


def _ok(outcome: tuple[str, Any]) -> Any:
    assert outcome[0] == "plan", outcome
    return outcome[1]


def _refused(outcome: tuple[str, Any], match: str = "") -> None:
    assert outcome[0] != "plan", outcome
    assert match in outcome[1], outcome


def test_grid_limits_are_exact_on_both_paths():
    """Grid x 0..2^31-1, y and z 0..65535: each bound and one past it; an empty grid (0) is a
    plan the fast path makes itself."""
    s = _summary([Tensor("x", kp.f32, ("a", "b", "c"))], [_launch(grid=("a", "b", "c"))])
    for shape, ok in [((0, 1, 1), True), ((1, 0, 1), True), ((1, 1, 0), True),
                      ((2**31 - 1, 65535, 65535), True), ((2**31, 1, 1), False),
                      ((1, 65536, 1), False), ((1, 1, 65536), False), ((1, 1, 65535), True)]:
        out = _plans(s, [shape])
        if ok:
            assert _ok(out).launches[0].grid == shape
        else:
            _refused(out, "grid")
    # a constant grid is checked once, when the fast path compiles the variant: the same limits
    for grid, ok in [((2**31 - 1, 65535, 65535), True), ((2**31, 1, 1), False),
                     ((1, 65536, 1), False), ((1, 1, 65536), False), ((0, 1, 1), True)]:
        s = _summary([Tensor("x", kp.f32, ("a",))], [_launch(grid=grid)])
        out = _plans(s, [(3,)])
        if ok:
            assert _ok(out).launches[0].grid == grid
        else:
            _refused(out, "grid")


def test_block_and_shared_memory_limits_are_exact_on_both_paths():
    s = _summary([Tensor("x", kp.f32, ("a", "b", "c", "d"))],
                 [_launch(block=("a", "b", "c"), smem="d")])
    cases = [((1024, 1, 1, 0), True), ((1, 1024, 1, 0), True), ((1, 16, 64, 0), True),
             ((1025, 1, 1, 0), False), ((1, 1025, 1, 0), False), ((1, 1, 65, 0), False),
             ((0, 1, 1, 0), False), ((1, 0, 1, 0), False), ((1, 1, 0, 0), False),
             ((32, 32, 2, 0), False), ((33, 32, 1, 0), False), ((33, 31, 1, 0), True),
             ((32, 32, 1, 0), True),
             ((1, 1, 1, 2**32 - 1), True), ((1, 1, 1, 2**32), False)]
    for shape, ok in cases:
        out = _plans(s, [shape])
        if ok:
            launch = _ok(out).launches[0]
            assert launch.block == shape[:3] and launch.shared_mem == shape[3]
        else:
            _refused(out)
    # constant parts are checked once, at build: the same limits
    for block, smem, ok in [((1024,), 0, True), ((1025,), 0, False), ((1,), 2**32 - 1, True),
                            ((1,), 2**32, False), ((8, 8, 16), 0, True), ((8, 8, 17), 0, False)]:
        s = _summary([Tensor("x", kp.f32, ("a",))], [_launch(grid=("a",), block=block,
                                                              smem=smem)])
        out = _plans(s, [(3,)])
        _ok(out) if ok else _refused(out)


def test_an_empty_grid_is_not_held_to_the_launch_limits():
    """Grid 0 (size-0 tensors): block, shared memory and value arguments are evaluated but not
    checked; a launched grid checks all three."""
    s = _summary([Tensor("x", kp.f32, ("a", "b"))],
                 [_launch(grid=("a",), block=("b",), smem=E.sym("b") * 2**30,
                          args=(Arg.of(E.sym("b") * 2**30, kp.i32),))])
    plan = _ok(_plans(s, [(0, 4096)], fast_expected=False))
    assert plan.launches[0].block == (4096, 1, 1)
    assert plan.launches[0].args == (("value", 4096 * 2**30, kp.i32),)
    _refused(_plans(s, [(1, 4096)]))
    s = _summary([Tensor("x", kp.f32, ("a", "b"))],
                 [_launch(grid=(1, "a"), args=(Arg.of(E.sym("b") - 1, kp.i32),))])
    assert _ok(_plans(s, [(0, 2**31 + 1)], fast_expected=False)).launches[0].args[0][1] == 2**31
    _refused(_plans(s, [(1, 2**31 + 1)]), "does not fit")
    assert _ok(_plans(s, [(1, 2**31)])).launches[0].args[0][1] == 2**31 - 1


def test_value_arguments_at_their_dtype_bounds():
    for dtype, lo, hi in [(kp.i32, -2**31, 2**31 - 1), (kp.u8, 0, 255), (kp.i64, INT64_MIN,
                                                                           INT64_MAX)]:
        s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("v", kp.i64)],
                     [_launch(args=(Arg.of(E.sym("v"), dtype),))])
        for v, ok in [(lo, True), (hi, True), (lo - 1, False), (hi + 1, False)]:
            if not INT64_MIN <= v <= INT64_MAX:
                continue
            out = _plans(s, [(1,)], [v])
            if ok:
                assert _ok(out).launches[0].args == (("value", v, dtype),)
            else:
                _refused(out, "does not fit")


def test_computed_scalars_at_their_dtype_bounds():
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("c", kp.i8, E.sym("a") - 100)],
                 [_launch(args=(Arg.scalar("c"),))])
    assert _ok(_plans(s, [(227,)])).computed == {"c": 127}
    assert _ok(_plans(s, [(0,)])).computed == {"c": -100}
    _refused(_plans(s, [(228,)]), "outside its dtype range")
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("c", kp.u8, E.sym("a") - 100)],
                 [_launch(args=(Arg.scalar("c"),))])
    _refused(_plans(s, [(99,)]), "outside its dtype range")
    assert _ok(_plans(s, [(100,)])).computed == {"c": 0}


def test_allocation_bytes_at_the_int64_bound():
    """An output of exactly INT64_MAX bytes is planned, one of 2^63 bytes is refused, and a
    negative dim is refused on both paths."""
    big = INT64_MAX // 7
    assert big * 7 == INT64_MAX
    s = _summary([Tensor("x", kp.f32, ("a", "b")), Tensor("y", kp.u8, ("a", "b"), "out")],
                 [_launch()])
    assert _ok(_plans(s, [(7, big)])).allocations["y"].nbytes == INT64_MAX
    _refused(_plans(s, [(2, 1 << 62)]), "more than int64")
    s = _summary([Tensor("x", kp.f32, ("a", "b")), Tensor("y", kp.f16, ("a", "b"), "out")],
                 [_launch()])
    _refused(_plans(s, [(7, big)]), "more than int64")
    assert _ok(_plans(s, [(1, (1 << 62) - 1)])).allocations["y"].nbytes == (1 << 63) - 2
    _refused(_plans(s, [(1, 1 << 62)]), "more than int64")
    s = _summary([Tensor("x", kp.f32, ("a",)), Tensor("y", kp.f32, (E.sym("a") - 5,), "out")],
                 [_launch()])
    assert _ok(_plans(s, [(5,)])).allocations["y"].shape == (0,)
    _refused(_plans(s, [(4,)]), "negative")
    _refused(_plans(s, [(0,)]), "negative")
    # constant shapes: decided once, the same answers
    for shape, ok in [((7, big), True), ((2, 1 << 62), False), ((0,), True),
                      ((Expr("sub", (E.const(3), E.const(5))),), False)]:
        s = _summary([Tensor("x", kp.f32, ("a",)), Tensor("y", kp.u8, shape, "out")],
                     [_launch()])
        out = _plans(s, [(3,)])
        _ok(out) if ok else _refused(out)


def test_scratch_shapes_are_planned_like_outputs():
    s = _summary([Tensor("x", kp.f32, ("a",))], [_launch()],
                 scratch=(Scratch("w", kp.i64, (E.cdiv("a", 256),)),))
    for a in (0, 1, 256, 257, INT64_MAX):
        assert _ok(_plans(s, [(a,)])).allocations["w"].shape == (-(-a // 256),)


def test_dims_outside_int64_are_refused_on_both_paths():
    """A dim of 2^63 (a Python int) is refused even where no expression reads it."""
    class Index:
        def __init__(self, v: int) -> None:
            self.v = v

        def __index__(self) -> int:
            return self.v

    s = _summary([Tensor("x", kp.f32, ("a",)), Tensor("y", kp.f32, (4,), "out")], [_launch()])
    for d in (1 << 63, Index(1 << 63), Index(1 << 64)):
        _refused(_plans(s, [(d,)]), "outside int64")
    for d in (INT64_MAX, Index(INT64_MAX)):
        assert _ok(_plans(s, [(d,)], fast_expected=False)).symbols["a"] == INT64_MAX
    _refused(_plans(s, [(-1,)]), "negative")


def test_a_uint64_scalar_read_by_an_expression_must_fit_int64():
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("k", kp.u64)],
                 [_launch(grid=(kp.select(E.lt("a", 0), E.sym("k"), 1),))])
    _refused(_plans(s, [(3,)], [1 << 63]), "outside int64")
    assert _ok(_plans(s, [(3,)], [INT64_MAX])).symbols["k"] == INT64_MAX
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("k", kp.u64)],
                 [_launch(args=(Arg.scalar("k"),))])
    assert _ok(_plans(s, [(3,)], [2**64 - 1])).symbols["k"] == 2**64 - 1
    _refused(_plans(s, [(3,)], [2**64]), "outside its dtype range")
    _refused(_plans(s, [(3,)], [-1]), "outside its dtype range")


def test_a_scalar_that_a_dim_binds_must_equal_it():
    s = _summary([Scalar("n", kp.i32), Tensor("x", kp.f32, ("n",))], [_launch(grid=("n",))])
    assert _ok(_plans(s, [(4,)], [4])).launches[0].grid == (4, 1, 1)
    _refused(_plans(s, [(4,)], [5]), "scalar n is 5 but n = 4")
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("n", kp.i32)], [_launch(grid=("n",))])
    assert _ok(_plans(s, [(4,)], [5])).launches[0].grid == (5, 1, 1)


def test_repeated_dims_and_expression_dims_are_checked():
    s = _summary([Tensor("x", kp.f32, ("a", "b")), Tensor("y", kp.f32, ("b", E.sym("a") * 2, 3))],
                 [_launch(grid=("a", "b"))])
    assert _ok(_plans(s, [(2, 5), (5, 4, 3)])).launches[0].grid == (2, 5, 1)
    _refused(_plans(s, [(2, 5), (4, 4, 3)]), "y.shape[0] is 4 but b = 5")
    _refused(_plans(s, [(2, 5), (5, 5, 3)]), "y.shape[1] is 5, expected")
    _refused(_plans(s, [(2, 5), (5, 4, 2)]), "y.shape[2] is 2, expected 3")
    _refused(_plans(s, [(2, 5), (5, 4)]), "rank")


def test_constraints_and_variant_predicates():
    s = _summary([Tensor("x", kp.f32, ("a",))], [], variants=[
        Variant((_launch(grid=(1,)),), (), E.lt("a", 10)),
        Variant((_launch(grid=(2,)),), (), E.lt("a", 100)),
    ], constraints=(Constraint(E.ne(E.sym("a") % 2, 1), "a is even"),))
    assert _ok(_plans(s, [(8,)])).variant == 0
    assert _ok(_plans(s, [(10,)])).variant == 1
    assert _ok(_plans(s, [(98,)])).launches[0].grid == (2, 1, 1)
    _refused(_plans(s, [(100,)]), "no variant")
    _refused(_plans(s, [(9,)]), "a is even")


def test_repeated_launch_counts_bind_the_loop_symbol():
    s = _summary([Tensor("x", kp.f32, ("a",))],
                 [_launch(grid=(E.sym("i") + 1,), count=E.sym("a"), loop="i")])
    plan = _ok(_plans(s, [(3,)], fast_expected=False))
    assert [ln.grid[0] for ln in plan.launches] == [1, 2, 3]
    assert _ok(_plans(s, [(0,)], fast_expected=False)).launches == ()
    s = _summary([Tensor("x", kp.f32, ("a",))],
                 [_launch(count=E.sym("a") - 2)])
    _refused(_plans(s, [(1,)]), "variant 0 launch 0 (k) count = -1, expected 0..")


def test_the_plan_cache_keys_on_integer_scalars():
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("k", kp.i32)],
                 [_launch(grid=(E.sym("k") + 1,))])
    planner = Planner(s)
    assert planner.plan_shapes([(3,)], [1]).launches[0].grid == (2, 1, 1)
    assert planner.plan_shapes([(3,)], [5]).launches[0].grid == (6, 1, 1)
    assert planner.plan(x=(3,), k=1).launches[0].grid == (2, 1, 1)
    assert planner.plan((4,), 7).launches[0].grid == (8, 1, 1)


def test_an_evaluation_error_names_only_the_symbols_that_have_values():
    """The message lists the frame's bound symbols, not an unset one as ``b=None``."""
    enc = ExprEncoder(["a", "b"])
    enc.add(1 // kp.sym("a"))
    _, roots = enc.finish()
    prog = enc.program
    assert prog is not None
    with pytest.raises(ExpressionError) as info:
        prog.value(prog.new_frame([0, None]), roots[0])
    assert "(with a=0)" in str(info.value) and "None" not in str(info.value)


def test_program_validation_refuses_too_many_roots():
    from kernelpack.limits import MAX_EXPR_ROOTS

    count = MAX_EXPR_ROOTS + 1
    with pytest.raises(FormatError, match="roots"):
        ExprProgram(EncodedExprs((), bytes([1, 0]) * count, (7,) * count))


def test_both_planners_agree_with_the_spec_on_value_arguments():
    """Each operator over two int64 scalars, passed as an i64 value argument: the fast path
    gives the spec's value itself, and where the spec has none both planners refuse alike."""
    for op in BINARY + ("neg", "not", "select"):
        arity = {"neg": 1, "not": 1, "select": 3}.get(op, 2)
        node = Expr(op, (kp.sym("a"), kp.sym("b"), kp.sym("a"))[:arity])
        s = _summary([Tensor("x", kp.f32, ("n",)), Scalar("a", kp.i64), Scalar("b", kp.i64)],
                     [_launch(args=(Arg.of(node, kp.i64),))])
        for a, b in itertools.product(EDGES, EDGES if arity > 1 else (0,)):
            want = a and b if op == "select" else _spec(op, a, b)
            out = _plans(s, [(1,)], [a, b])
            if want is None:
                _refused(out, "cannot evaluate")
            else:
                assert _ok(out).launches[0].args == (("value", want, kp.i64),), (op, a, b)


def test_a_repeated_launch_without_a_loop_symbol_keeps_its_values():
    """Copies of a repeated launch with no loop counter: every copy gets the same values (the
    copy's frame must not have a counter written into a root's slot: with a constant count,
    the launch's shared memory is the program's last root)."""
    s = _summary([Tensor("x", kp.f32, ("a",))],
                 [_launch(grid=(E.cdiv("a", 2),), args=(Arg.of(E.sym("a") * 3, kp.i32),),
                          smem=E.sym("a") * 4, count=3)])
    plan = _ok(_plans(s, [(4,)], fast_expected=False))
    assert [ln.args for ln in plan.launches] == [(("value", 12, kp.i32),)] * 3
    assert [(ln.grid, ln.shared_mem) for ln in plan.launches] == [((2, 1, 1), 16)] * 3


def test_launch_count_bound_and_bool_scalar_range():
    """A count one past MAX_LAUNCH_REPEAT is refused by the count check itself (before any
    copy is planned); a bool caller scalar is 0 or 1."""
    from kernelpack.limits import MAX_LAUNCH_REPEAT

    s = _summary([Tensor("x", kp.f32, ("a",))], [_launch(count=E.sym("a"))])
    _refused(_plans(s, [(MAX_LAUNCH_REPEAT + 1,)]),
             f"count = {MAX_LAUNCH_REPEAT + 1}, expected 0..{MAX_LAUNCH_REPEAT}")
    s = _summary([Tensor("x", kp.f32, ("a",)), Scalar("f", kp.bool_)],
                 [_launch(grid=(E.sym("f") + 1,))])
    assert _ok(_plans(s, [(2,)], [1])).launches[0].grid == (2, 1, 1)
    assert _ok(_plans(s, [(2,)], [True])).launches[0].grid == (2, 1, 1)
    _refused(_plans(s, [(2,)], [2]), "outside its dtype range 0..1")


def test_constraint_errors_name_the_predicate_or_the_message():
    """A constraint without a message names its predicate; one whose evaluation fails is
    worded with its message and the evaluator's reason, or left as the evaluator's error
    where it has no message."""
    x = Tensor("x", kp.f32, ("a", "b"))
    s = _summary([x], [_launch()], constraints=(Constraint(E.lt("a", "b")),))
    _refused(_plans(s, [(5, 5)]), "constraint failed: a < b (with a=5, b=5)")
    s = _summary([x], [_launch()], constraints=(Constraint(E.lt(E.sym("a") // "b", 3)),))
    out = _plans(s, [(5, 0)])
    _refused(out, "cannot evaluate")
    assert "constraint failed" not in out[1] and "division by zero in floordiv" in out[1]
    s = _summary([x], [_launch()],
                 constraints=(Constraint(E.lt(E.sym("a") // "b", 3), "a small ratio"),))
    _refused(_plans(s, [(5, 0)]), "p: constraint failed: a small ratio: division by zero in "
                                  "floordiv (with a=5, b=0)")
