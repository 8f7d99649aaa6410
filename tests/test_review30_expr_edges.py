"""Review 30: integer expressions at the edges, on every evaluation path.

Black-box: built from README.md, docs/FORMAT.md ("Expression programs", "Limits"), DESIGN.md
and the public docstrings only. The exact reference below is plain Python integers with the
documented semantics (FORMAT.md §2): floordiv/mod round toward negative infinity,
``ceildiv(a, b) = -((-a) // b)``, shift counts 0..63, ``shl`` exact (overflow is an error),
``shr`` arithmetic, comparisons and logic give 0/1, only the chosen side of ``select`` is
evaluated (``and``/``or`` are plain operators: both operands are evaluated). "Overflow" is any
operator result outside int64; overflow, division by zero and a bad shift are
``ConstraintError`` (``ExpressionError``).

The paths compared: ``Expr.evaluate`` (the tree), ``Planner.plan`` (the fast path, its plan
cache, its fallback to the reference planner), ``kp.save`` + ``kp.load`` + ``program.plan``
(the stored postfix program), ``kernelpack eval`` (text and ``--json``) and ``str()``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kernelpack as kp
from kernelpack import (Arg, Compiled, Expr, Image, KernelSummary, Launch, Module,
                        Scalar, Tensor, Variant)
from kernelpack.cli import main as cli_main
from kernelpack.planner import Planner

IMIN, IMAX = -2**63, 2**63 - 1
EDGE = (0, 1, -1, 2, -2, 3, 7, 63, 64, -64, 255, 256, 1024, 2**31 - 1, 2**31, -2**31,
        -2**31 - 1, 2**32, -2**32, 2**62, 2**62 - 1, -2**62, IMAX, IMAX - 1, IMIN, IMIN + 1)
SHIFTS = (0, 1, 31, 32, 62, 63, 64, 65, -1, -63)
BINOPS = ("add", "sub", "mul", "floordiv", "ceildiv", "mod", "min", "max", "shl", "shr",
          "eq", "ne", "lt", "le", "gt", "ge", "and", "or")
SYMS = ("a", "b", "c")


# ---------------------------------------------------------------- the exact reference

class Refused(Exception):
    """The reference's evaluation error (overflow, division by zero, bad shift)."""


def _fit(v: int) -> int:
    if not IMIN <= v <= IMAX:
        raise Refused("overflow")
    return v


def _div(a: int, b: int) -> int:
    if b == 0:
        raise Refused("division by zero")
    return a // b


def _count(k: int) -> int:
    if not 0 <= k <= 63:
        raise Refused("bad shift")
    return k


_BIN = {
    "add": lambda a, b: _fit(a + b), "sub": lambda a, b: _fit(a - b),
    "mul": lambda a, b: _fit(a * b), "floordiv": lambda a, b: _fit(_div(a, b)),
    "ceildiv": lambda a, b: _fit(-_div(-a, b)), "mod": lambda a, b: a - b * _div(a, b),
    "min": min, "max": max,
    "shl": lambda a, k: _fit(a << _count(k)), "shr": lambda a, k: a >> _count(k),
    "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
    "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b),
    "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
    "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b)),
}


def ref(t: tuple, env: dict) -> int:
    """Exact value of tree ``t`` (tuples: ("const", v), ("sym", name), (op, *children))."""
    op = t[0]
    if op == "const":
        return t[1]
    if op == "sym":
        return env[t[1]]
    if op == "select":
        return ref(t[2] if ref(t[1], env) else t[3], env)
    if op == "neg":
        return _fit(-ref(t[1], env))
    if op == "not":
        return int(not ref(t[1], env))
    return _BIN[op](ref(t[1], env), ref(t[2], env))


def raw(t: tuple) -> Expr:
    """The tree as documented Expr nodes, exactly as written (no builder simplification)."""
    op = t[0]
    if op == "const":
        return Expr("const", (), t[1])
    if op == "sym":
        return Expr("sym", (), t[1])
    return Expr(op, tuple(raw(x) for x in t[1:]))


_BUILD = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "ceildiv": kp.cdiv, "mod": lambda a, b: a % b,
    "min": kp.emin, "max": kp.emax, "shl": kp.shl, "shr": kp.shr, "eq": kp.eq, "ne": kp.ne,
    "lt": kp.lt, "le": kp.le, "gt": kp.gt, "ge": kp.ge, "and": kp.land, "or": kp.lor,
}


def built(t: tuple) -> Expr:
    """The tree through the public builders (operators, kp.cdiv, kp.select, ...)."""
    op = t[0]
    if op == "const":
        return kp.expr.const(t[1])
    if op == "sym":
        return kp.sym(t[1])
    if op == "select":
        return kp.select(built(t[1]), built(t[2]), built(t[3]))
    if op == "neg":
        return -built(t[1])
    if op == "not":
        return kp.lnot(built(t[1]))
    return _BUILD[op](built(t[1]), built(t[2]))


def outcome(f) -> tuple:
    """("ok", value) or ("refused",); anything but a ConstraintError is reported as is."""
    try:
        return ("ok", f())
    except (Refused, kp.ConstraintError):
        return ("refused",)
    except Exception as e:  # noqa: BLE001 - the test reports the foreign exception
        return ("crash", f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- programs around expressions

def _image() -> Image:
    return Image("cubin", "sm_80", b"\x7fELF" + bytes(range(120)), "review30", 12080)


def program(value: Expr, name: str = "p") -> Compiled:
    """``name(a: i64, b: i64, c: i64)`` whose computed scalar ``v`` (i64) is ``value``."""
    params = tuple(Scalar(s, kp.i64) for s in SYMS) + (Scalar("v", kp.i64, value=value),)
    launch = Launch("k", "m", (1,), (1,), (Arg.scalar("v"),))
    return Compiled(KernelSummary(name, params, (Variant((launch,)),)),
                    (Module("m", ("k",), (_image(),)),))


def save_bytes(programs: list) -> bytes:
    buf = io.BytesIO()
    kp.save(programs, buf)
    return buf.getvalue()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(list(argv))
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- strategies

_leaf = st.one_of(st.sampled_from(SYMS).map(lambda s: ("sym", s)),
                  st.sampled_from(EDGE + SHIFTS).map(lambda v: ("const", v)))


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(BINOPS), children, children),
        st.tuples(st.sampled_from(("shl", "shr")), children,
                  st.sampled_from(SHIFTS).map(lambda v: ("const", v))),
        children.map(lambda c: ("neg", c)),
        children.map(lambda c: ("not", c)),
        st.tuples(st.just("select"), children, children, children),
    )


trees = st.recursive(_leaf, _extend, max_leaves=10)
values = st.one_of(st.sampled_from(EDGE + SHIFTS), st.integers(IMIN, IMAX))
envs = st.fixed_dictionaries({s: values for s in SYMS})


# ---------------------------------------------------------------- properties (regressions)

@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.lists(envs, min_size=2, max_size=4))
def test_every_evaluation_path_matches_the_exact_int64_reference(tree, env_list):
    """Tree, fast planner (and its plan cache: the first env is planned again last), and the
    loaded postfix program all give the exact value, or refuse exactly when it overflows,
    divides by zero or shifts out of 0..63."""
    e = raw(tree)
    c = program(e)
    loaded = kp.load(save_bytes([c]))["p"]
    planner = Planner(c.summary)
    for env in env_list + env_list[:1]:
        want = outcome(lambda: ref(tree, env))
        assert outcome(lambda: e.evaluate(env)) == want, (e, env, "Expr.evaluate")
        assert outcome(lambda: planner.plan(**env).computed["v"]) == want, (e, env, "plan")
        assert outcome(lambda: loaded.plan(**env).computed["v"]) == want, (e, env, "loaded")


_BINARY_GRID = sorted(set(EDGE + SHIFTS))


def test_every_operator_on_every_pair_of_edge_values_fast_and_loaded():
    """Exhaustive: op(a, b) for each operator over all pairs of edge values (and neg, not,
    select), on the fast planner and the loaded program."""
    a, b, c = ("sym", "a"), ("sym", "b"), ("sym", "c")
    cases = {op: (op, a, b) for op in BINOPS}
    cases.update(neg=("neg", a), lnot=("not", a), select=("select", a, b, c))
    progs = [program(raw(t), name=name) for name, t in cases.items()]
    pack = kp.load(save_bytes(progs))
    bad = []
    for p in progs:
        t = cases[p.summary.name]
        fast, loaded = Planner(p.summary), pack[p.summary.name]
        for x in _BINARY_GRID:
            for y in _BINARY_GRID:
                env = {"a": x, "b": y, "c": IMIN}
                want = outcome(lambda: ref(t, env))
                for path, pl in (("fast", fast), ("loaded", loaded)):
                    got = outcome(lambda: pl.plan(**env).computed["v"])
                    if got != want:
                        bad.append((p.summary.name, path, env, want, got))
    assert not bad, bad[:10]


def _ast_eval(n: ast.AST, env: dict) -> int:
    """Evaluate printed expression text with the reference semantics (for str() fidelity)."""
    if isinstance(n, ast.Expression):
        return _ast_eval(n.body, env)
    if isinstance(n, ast.Constant):
        return n.value
    if isinstance(n, ast.Name):
        return env[n.id]
    if isinstance(n, ast.UnaryOp):
        v = _ast_eval(n.operand, env)
        return _fit(-v) if isinstance(n.op, ast.USub) else int(not v)
    if isinstance(n, ast.BinOp):
        op = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv",
              ast.Mod: "mod", ast.LShift: "shl", ast.RShift: "shr"}[type(n.op)]
        return _BIN[op](_ast_eval(n.left, env), _ast_eval(n.right, env))
    if isinstance(n, ast.BoolOp):
        vals = [_ast_eval(v, env) for v in n.values]
        return int(all(vals)) if isinstance(n.op, ast.And) else int(any(vals))
    if isinstance(n, ast.Compare):
        assert len(n.ops) == 1, f"printed a chained comparison: {ast.unparse(n)}"
        op = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt",
              ast.GtE: "ge"}[type(n.ops[0])]
        return _BIN[op](_ast_eval(n.left, env), _ast_eval(n.comparators[0], env))
    if isinstance(n, ast.Call):
        name = n.func.id
        if name == "select":
            return _ast_eval(n.args[1] if _ast_eval(n.args[0], env) else n.args[2], env)
        op = {"cdiv": "ceildiv", "min": "min", "max": "max"}[name]
        return _BIN[op](*(_ast_eval(x, env) for x in n.args))
    raise AssertionError(f"unexpected syntax in printed expression: {ast.dump(n)}")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(trees, envs)
def test_printed_expressions_read_back_to_the_same_value(tree, env):
    """str() of a built expression, read as Python syntax with the documented semantics,
    gives what the expression evaluates to (precedence, unary minus, not/and/or, negative
    constants, INT64_MIN)."""
    e = built(tree)
    text = str(e)
    parsed = ast.parse(text, mode="eval")
    assert outcome(lambda: _ast_eval(parsed, env)) == outcome(lambda: e.evaluate(env)), text


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(trees, envs)
def test_cli_eval_text_and_json_agree_with_plan(tree, env):
    """``kernelpack eval FILE p a=.. b=.. c=..`` (text and --json) shows the plan's value, or
    exits 1 with one ``error:`` line exactly when plan() refuses."""
    e = raw(tree)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.kpack")
        kp.save([program(e)], path)
        want = outcome(lambda: kp.load(path)["p"].plan(**env).computed["v"])
        assert want == outcome(lambda: ref(tree, env))
        args = ["eval", path, "p"] + [f"{k}={v}" for k, v in env.items()]
        rc, out, err = run_cli(*args, "--json")
        rc_text, out_text, err_text = run_cli(*args)
    if want[0] == "ok":
        assert rc == 0 and rc_text == 0, (err, err_text)
        assert json.loads(out)["computed"] == {"v": want[1]}
        assert re.search(rf"\bv={want[1]}(,|\s|$)", out_text), out_text
    else:
        assert (rc, rc_text) == (1, 1), (out, out_text)
        assert err.startswith("error: ") and err_text.startswith("error: ")
        assert "scalar v" in err, err


# ---------------------------------------------------------------- documented edges (regressions)

def test_summary_fields_refuse_at_their_documented_edges():
    """FORMAT §6 limits at the boundary, on the loaded program: the last good value plans,
    one past it is a ConstraintError naming the field."""
    a = kp.sym("a")

    def one(params, launch):
        return Compiled(KernelSummary("p", params, (Variant((launch,)),)),
                        (Module("m", ("k",), (_image(),)),))

    S = Scalar("a", kp.i64)
    cases = [
        ("grid.x", one((S,), Launch("k", "m", (a,), (1,), ())), 2**31 - 1, 2**31, "grid"),
        ("grid.y", one((S,), Launch("k", "m", (1, a), (1,), ())), 65535, 65536, "grid"),
        ("shared", one((S,), Launch("k", "m", (1,), (1,), (), shared_mem=a)), 2**32 - 1,
         2**32, "shared_mem"),
        ("count", one((S,), Launch("k", "m", (1,), (1,), (), count=a, loop="i")), 3,
         2**20 + 1, "count"),
        ("i32 value", one((S,), Launch("k", "m", (1,), (1,), (Arg.of(a, kp.i32),))), 2**31 - 1,
         2**31, "int32"),
        ("out bytes", one((S, Tensor("o", kp.f64, (a,), role="out")),
                          Launch("k", "m", (1,), (1,), (Arg.buffer("o"),))), 2**60 - 1, 2**60,
         "o"),
        ("negative dim", one((S, Tensor("o", kp.f32, (a,), role="out")),
                             Launch("k", "m", (1,), (1,), (Arg.buffer("o"),))), 0, -1, "o"),
    ]
    for what, c, good, bad, named in cases:
        prog = kp.load(save_bytes([c]))["p"]
        prog.plan(a=good)
        with pytest.raises(kp.ConstraintError, match=named):
            prog.plan(a=bad)
    # a uint64 scalar past int64 is fine unread, refused (by name) once an expression reads it
    u = Scalar("a", kp.u64)
    unread = kp.load(save_bytes([one((u,), Launch("k", "m", (1,), (1,), ()))]))["p"]
    assert unread.plan(a=2**64 - 1).symbols["a"] == 2**64 - 1
    read = kp.load(save_bytes([one((u,), Launch("k", "m", (a >> 40,), (1,), ()))]))["p"]
    with pytest.raises(kp.ConstraintError, match="'a'"):
        read.plan(a=2**63)


def test_exponential_sizes_of_a_fusion_refuse_exactly_past_int64():
    """``kp.arange(1 << n)``: 2**60 float32 elements plan; 2**61 (2**63 bytes) is refused;
    ``1 << 63`` overflows and ``1 << 64`` is a bad shift: ConstraintErrors naming out."""
    @kp.fusion
    def powers(x: kp.Tensor[kp.f32, "n"]):
        return kp.arange(1 << x.shape[0]).astype(kp.f32)

    prog = kp.load(save_bytes([kp.compile(powers, targets=["compute_80"])]))["powers"]
    assert prog.plan(x=(0,)).allocations["out"].shape == (1,)
    plan = prog.plan(x=(60,))
    assert plan.allocations["out"].nbytes == 2**62
    assert all(0 <= g <= 2**31 - 1 for launch in plan.launches for g in launch.grid[:1])
    for n in (61, 62, 63, 64, 65):
        with pytest.raises(kp.ConstraintError, match="out"):
            prog.plan(x=(n,))


# ---------------------------------------------------------------- findings (fail now)

@pytest.mark.parametrize("case", ["neg_neg", "times_minus1_twice", "times_2_then_0",
                                  "plus_1_plus_minus1"])
def test_builder_simplification_is_exact_where_the_written_form_overflows(case):
    """Decided (review 30): the builders fold by exact integer identities (``-(-a)`` is
    ``a``, ``a * 2 * 0`` is ``0``), so an intermediate of the form as written in Python that
    would overflow is never computed: the stored expression is the folded one, and it gives
    the exact value. The same tree made of plain ``Expr`` nodes (no folding) is evaluated as
    written and refuses the overflow; both agree wherever the written form fits."""
    a = ("sym", "a")
    tree, value = {
        "neg_neg": (("neg", ("neg", a)), IMIN),                                      # -(-a)
        "times_minus1_twice": (("mul", ("mul", a, ("const", -1)), ("const", -1)), IMIN),
        "times_2_then_0": (("mul", ("mul", a, ("const", 2)), ("const", 0)), 2**62),  # a*2*0
        "plus_1_plus_minus1": (("add", ("add", a, ("const", 1)), ("const", -1)), IMAX),
    }[case]
    env = {"a": value, "b": 0, "c": 0}
    exact = {"neg_neg": value, "times_minus1_twice": value, "times_2_then_0": 0,
             "plus_1_plus_minus1": value}[case]
    assert outcome(lambda: ref(tree, env)) == ("refused",)
    assert outcome(lambda: raw(tree).evaluate(env)) == ("refused",)
    e = built(tree)
    assert outcome(lambda: e.evaluate(env)) == ("ok", exact)
    for fits in (0, 1, -5, 2**40):
        small = {"a": fits, "b": 0, "c": 0}
        assert e.evaluate(small) == raw(tree).evaluate(small) == ref(tree, small)


def _wide(offset_at: int | None = None) -> Expr:
    """A balanced max-tree of 1024 leaves ``a + i`` (one leaf changed when asked)."""
    a = kp.sym("a")
    xs = [a + (i + 1_000_000 if i == offset_at else i) for i in range(1024)]
    while len(xs) > 1:
        xs = [kp.emax(xs[i], xs[i + 1]) for i in range(0, len(xs), 2)]
    return xs[0]


def test_cli_diff_sees_expressions_that_differ_past_the_printing_limit(tmp_path):
    """``kernelpack diff A B`` exits 0 only when the kernels are identical. Two programs whose
    computed scalar differs only in a leaf that ``str()`` does not reach plan differently
    (v = 1023 vs 1001000), so diff must report the change (exit 1)."""
    a_path, b_path = tmp_path / "a.kpack", tmp_path / "b.kpack"
    kp.save([program(_wide())], a_path)
    kp.save([program(_wide(offset_at=1000))], b_path)
    va = kp.load(a_path)["p"].plan(a=0, b=0, c=0).computed["v"]
    vb = kp.load(b_path)["p"].plan(a=0, b=0, c=0).computed["v"]
    assert (va, vb) == (1023, 1_001_000)
    rc, out, err = run_cli("diff", str(a_path), str(b_path))
    assert rc == 1, f"diff said identical (rc {rc}) for programs that plan v={va} vs v={vb}:" \
                    f" {out!r} {err!r}"


def test_cli_inspect_json_gives_whole_expressions(tmp_path):
    """``inspect --json`` prints "the same facts as JSON" for machines: an expression field
    must be the whole expression, not the human printer's truncated text ending in '...'."""
    path = tmp_path / "w.kpack"
    kp.save([program(_wide())], path)
    rc, out, err = run_cli("inspect", str(path), "--json")
    assert rc == 0, err
    (prog,) = json.loads(out)["programs"]
    value = next(p for p in prog["params"] if p["name"] == "v")["value"]
    assert "..." not in value, f"truncated: ...{value[-60:]!r}"
    assert "a + 1023" in value


def _deep(n: int) -> Expr:
    """Nesting n + 1 (left-deep chain alternating + b and - a; nothing folds)."""
    a, b = kp.sym("a"), kp.sym("b")
    e = a
    for i in range(n):
        e = e + b if i % 2 == 0 else e - a
    return e


def _tall_select(n: int) -> Expr:
    """n nested selects in the else-branch: nesting n + 1 but postfix stack about 2n."""
    a, b, c = kp.sym("a"), kp.sym("b"), kp.sym("c")
    e = a
    for i in range(n):
        e = kp.select(b + i, c, e)
    return e


def test_expression_limits_at_the_boundary_save_load_and_plan():
    """MAX_EXPR_DEPTH 256: nesting 256 saves, loads and plans; the stack limit likewise for
    the deepest select chain that fits."""
    pack = kp.load(save_bytes([program(_deep(255), name="deep"),
                               program(_tall_select(127), name="tall")]))
    assert pack["deep"].plan(a=1, b=1, c=0).computed["v"] == _deep(255).evaluate(a=1, b=1)
    assert pack["tall"].plan(a=5, b=-200, c=1).computed["v"] == 1


def _over_limit_program(kind: str) -> tuple[Compiled, str]:
    """A program one past a limit, and the name of the field that is too big."""
    if kind == "nesting":
        return program(_deep(256), name="over_nesting"), "v"
    if kind == "stack":
        s = KernelSummary("over_stack", (Scalar("a", kp.i64), Scalar("b", kp.i64),
                                         Scalar("c", kp.i64)),
                          (Variant((Launch("k", "m", (kp.emin(kp.emax(_tall_select(128), 1), 8),),
                                           (1,), ()),)),))
        return Compiled(s, (Module("m", ("k",), (_image(),)),)), "grid"
    raise AssertionError(kind)


def test_a_fusion_size_past_the_nesting_limit_is_refused_at_its_trace() -> None:
    """It used to compile (seconds of LLVM) and then fail at kp.save naming the field; since
    review 35 the trace refuses it, naming the fusion and the limit (kp.arange of such a size
    ran out of Python's stack, and nothing could ever save, cache or load the result)."""
    @kp.fusion
    def over_fusion(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "m"]):
        s = x.shape[0]
        for i in range(300):
            s = kp.emin(s, y.shape[0] + i) if i % 2 else kp.emax(s, y.shape[0] - i)
        return kp.arange(s).astype(kp.f32)

    with pytest.raises(kp.TraceError, match=r"^fusion over_fusion: a size expression is "
                                            r"nested 301 deep.*MAX_EXPR_DEPTH 256"):
        kp.compile(over_fusion, targets=["compute_80"])


@pytest.mark.parametrize("kind", ["nesting", "stack"])
def test_save_names_the_program_and_field_past_an_expression_limit(kind):
    """kp.save refuses what a reader would refuse with a ValueError "naming what a reader
    would refuse" (FORMAT §3): with several programs in one save, the message must say which
    program and which field is over the limit (it said only "expressions exceed the format's
    limits: expression nested deeper than 256" / "stack deeper than 256 at 510")."""
    over, field = _over_limit_program(kind)
    name = over.summary.name
    with pytest.raises(ValueError) as info:
        kp.save([program(kp.sym("a"), name="fine"), over], io.BytesIO())
    message = str(info.value)
    assert name in message and re.search(rf"\b{field}\b", message), message


@pytest.mark.parametrize("args", [
    pytest.param(("add", (kp.sym("a"),)), id="add_one_operand"),
    pytest.param(("add", ()), id="add_no_operand"),
    pytest.param(("select", (kp.sym("a"), kp.sym("b"))), id="select_two_operands"),
    pytest.param(("add", (kp.sym("a"), kp.sym("b"), kp.sym("c"))), id="add_three_operands"),
    pytest.param(("add", (kp.sym("a"), 5)), id="operand_not_an_expr"),
    pytest.param(("const", (), 1.5), id="const_float"),
    pytest.param(("const", (), "5"), id="const_str"),
    pytest.param(("const", (), 2**63), id="const_past_int64"),
    pytest.param(("sym", (), "1x"), id="sym_not_identifier"),
])
def test_expr_constructor_refuses_malformed_nodes(args):
    """``kp.Expr(op, args, value)`` is the documented node type ("op is const (value holds the
    int), sym (value holds the name) or an operator name from OPERATORS with args"). A node
    that is not one of those must be a ValueError/TypeError at construction, never an
    IndexError/AttributeError, and never accepted: ``Expr("const", (), 1.5)`` printed as 1.5
    but planned as 1; ``Expr("select", (a, b))`` evaluated to a; ``Expr("const", (), 2**63)``
    evaluated to 2**63, outside int64."""
    try:
        e = Expr(*args)
    except (ValueError, TypeError, kp.KernelPackError):
        return
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"Expr{args!r} raised {type(exc).__name__}: {exc}")
    pytest.fail(f"Expr{args!r} was accepted as {e!r}")


def test_evaluate_names_the_symbol_whose_value_is_outside_int64():
    """An ExpressionError must name what is wrong: for a symbol value past int64 it said
    "cannot evaluate a + b: int64 overflow in symbol" (which symbol? which value?)."""
    e = kp.sym("a") + kp.sym("b")
    with pytest.raises(kp.ExpressionError) as info:
        e.evaluate(a=2**63, b=0)
    message = str(info.value)
    assert "'a'" in message and str(2**63) in message, message
