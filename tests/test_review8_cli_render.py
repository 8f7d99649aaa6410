"""Eighth review of the ``kernelpack`` command's rendering (fake images, no GPU, no toolkit)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import serializer
from kernelpack.cli import main
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar, Tensor,
                                Variant)

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _single(summary: KernelSummary, module: str = "m") -> Compiled:
    return Compiled(summary, (Module(module, ("k",), (kp_samples.fake_image("cubin", "sm_80"),)),))


def _repeated() -> Compiled:
    """Launches repeated ``lg`` times (loop ``i``), ``lg + 1`` times and twice."""
    n = kp.sym("n")
    launches = (
        Launch("k", "m", (kp.cdiv(n, kp.shl(1, "i")),), (256,),
               (Arg.buffer("x"), Arg.of(kp.shl(1, "i"), kp.u32)), count="lg", loop="i"),
        Launch("k", "m", (1,), (32,), (Arg.buffer("x"), Arg.scalar("lg")), count=kp.sym("lg") + 1),
        Launch("k", "m", (1,), (32,), (Arg.buffer("x"), Arg.scalar("lg")), count=2),
    )
    return _single(KernelSummary("rep", (Tensor("x", kp.f32, ("n",)), Scalar("lg", kp.i32)),
                                 (Variant(launches),)))


def _table_rows(out: str, kernel: str) -> list[str]:
    return [line for line in out.splitlines() if f"│ {kernel} " in line]


def test_inspect_brackets_a_repeat_count_that_is_an_expression(tmp_path, capsys) -> None:
    """Was: a launch repeated ``lg`` times with loop ``i`` showed ``lgx, loop i`` (read as a
    symbol ``lgx``), and ``lg + 1`` times showed ``lg + 1x``."""
    path = tmp_path / "rep.kpack"
    serializer.save([_repeated()], path)
    code, out, err = run(capsys, "inspect", path)
    assert (code, err) == (0, "")
    rows = _table_rows(out, "k")
    assert len(rows) == 3
    assert "(lg)x, loop i" in rows[0] and "lgx" not in out
    assert "(lg + 1)x" in rows[1] and "lg + 1x" not in out
    assert "│ 2x " in rows[2]  # a constant count reads as before
    # --json keeps the expression as it is
    code, out, _ = run(capsys, "inspect", path, "--json")
    launches = json.loads(out)["programs"][0]["variants"][0]["launches"]
    assert [(la["count"], la["loop"]) for la in launches] == [("lg", "i"), ("lg + 1", None),
                                                              ("2", None)]


def _hidden_computed() -> Compiled:
    """A computed scalar ``n = 2 * n`` named like the symbol it is computed from."""
    n = kp.sym("n")
    return _single(KernelSummary(
        "c", (Tensor("x", kp.f32, ("n",)), Scalar("n", kp.u32, value=n * 2)),
        (Variant((Launch("k", "m", (1,), (32,), (Arg.buffer("x"), Arg.scalar("n"))),)),)))


def test_eval_shows_the_value_a_computed_scalar_passes(tmp_path, capsys) -> None:
    """Was: ``eval`` printed ``symbols: n=5`` and the argument ``n``, but the runtime passes
    the computed parameter ``n`` = 10 (``Plan.computed``): the value was nowhere."""
    path = tmp_path / "c.kpack"
    serializer.save([_hidden_computed()], path)
    plan = kp.load(path)["c"].plan(x=(5,))
    assert dict(plan.computed) == {"n": 10} and dict(plan.symbols) == {"n": 5}
    code, out, err = run(capsys, "eval", path, "c", "x=5", "--json")
    assert (code, err) == (0, "")
    facts = json.loads(out)
    assert facts["symbols"] == {"n": 5} and facts["computed"] == {"n": 10}
    code, out, _ = run(capsys, "eval", path, "c", "x=5")
    assert code == 0 and "symbols: n=5\ncomputed: n=10\n" in out


def test_eval_text_does_not_repeat_a_computed_scalar_already_shown(tmp_path, capsys) -> None:
    """The ordinary case (``n32 = n``, shown among the symbols) prints as before; the JSON
    has the computed values too."""
    path = tmp_path / "axpy.kpack"
    serializer.save([kp_samples.axpy()], path)
    code, out, _ = run(capsys, "eval", path, "axpy", "x=1000003", "y=1000003", "a=0.5")
    assert code == 0 and "symbols: n=1000003, n32=1000003\n" in out and "computed" not in out
    code, out, _ = run(capsys, "eval", path, "axpy", "x=7", "y=7", "--json")
    assert json.loads(out)["computed"] == {"n32": 7}


def test_diff_of_variant_lists_of_different_lengths_is_readable(tmp_path, capsys) -> None:
    """Was: when a program gained or lost a variant (or a constraint, a launch, ...), ``diff``
    printed the whole of both lists as Python reprs on one line."""
    rich = kp_samples.rich()
    s = rich.summary
    fewer = dataclasses.replace(s, variants=s.variants[1:], constraints=s.constraints[:1])
    a, b = tmp_path / "a.kpack", tmp_path / "b.kpack"
    serializer.save([rich], a)
    serializer.save([Compiled(fewer, rich.modules)], b)
    code, out, err = run(capsys, "diff", a, b)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == "~ program rowsum"
    assert "    variants[1]: <variant when always: partial, stage, finish> -> (absent)" in lines
    assert "    variants[0].predicate: m <= 1024 -> None" in lines
    assert "    variants[0].launches[1]: (absent) -> <stage>" in lines
    assert "    constraints[1]: <constraint m >= 1> -> (absent)" in lines
    assert all(len(line) < 120 and "{'" not in line for line in lines)
    code, out, _ = run(capsys, "diff", b, a)  # and the other way round
    assert code == 1
    assert "    variants[1]: (absent) -> <variant when always: partial, stage, finish>" in out


def test_eval_json_matches_program_plan_on_edge_sizes(tmp_path, capsys) -> None:
    """``eval --json`` is ``Program.plan`` for sizes 0, 1, primes: variant, symbols,
    allocations and launches (repeats expanded)."""
    path = tmp_path / "rich.kpack"
    serializer.save([kp_samples.rich()], path)
    program = kp.load(path)["rowsum"]
    for n, m in ((1, 1), (1, 1024), (7, 1025), (13, 100003)):
        plan = program.plan(x=(n, m), m=m)
        code, out, err = run(capsys, "eval", path, "rowsum", f"x={n},{m}", f"m={m}", "--json")
        assert (code, err) == (0, "")
        facts = json.loads(out)
        assert facts["variant"] == plan.variant and facts["symbols"] == dict(plan.symbols)
        assert [(a["name"], a["kind"], a["shape"], a["nbytes"], a["zero_init"])
                for a in facts["allocations"]] == [
            (a.name, a.kind, list(a.shape), a.nbytes, a.zero_init)
            for a in plan.allocations.values()]
        assert [(la["kernel"], la["grid"], la["block"], la["shared_mem"])
                for la in facts["launches"]] == [
            (la.kernel, list(la.grid), list(la.block), la.shared_mem) for la in plan.launches]
    # n = 0 breaks the constraint: exit 1, the program's message
    code, out, err = run(capsys, "eval", path, "rowsum", "x=0,5", "m=5")
    assert (code, out) == (1, "") and "need at least one row" in err


def _bool_flag() -> Compiled:
    return _single(KernelSummary(
        "b", (Tensor("x", kp.f16, ()), Scalar("flag", kp.bool_)),
        (Variant((Launch("k", "m", (1,), (32,), (Arg.buffer("x"), Arg.scalar("flag"))),)),)))


def test_eval_takes_true_and_false_for_a_bool_scalar(tmp_path, capsys) -> None:
    """Was: ``flag=true`` was refused with "expected an integer", though ``Program.plan``
    takes ``flag=True``."""
    path = tmp_path / "b.kpack"
    serializer.save([_bool_flag()], path)
    for text, value in (("true", 1), ("False", 0), ("1", 1), ("0", 0)):
        code, out, err = run(capsys, "eval", path, "b", "x=", f"flag={text}", "--json")
        assert (code, err) == (0, "") and json.loads(out)["symbols"] == {"flag": value}
    code, out, err = run(capsys, "eval", path, "b", "x=", "flag=yes")
    assert (code, out) == (1, "") and err == "error: flag: expected true, false, 0 or 1 " \
                                             "(got 'yes')\n"
    code, _, err = run(capsys, "eval", path, "b", "x=", "flag=2")
    assert code == 1 and "flag = 2 is outside its dtype range 0..1" in err


def _counted(loop: bool) -> Compiled:
    args = (Arg.buffer("x"),) + ((Arg.of(kp.sym("i"), kp.i32),) if loop else ())
    launch = Launch("k", "m", (1,), (32,), args, count="lg", loop="i" if loop else "")
    return _single(KernelSummary("r", (Tensor("x", kp.f32, ("n",)), Scalar("lg", kp.i32)),
                                 (Variant((launch,)),)))


def test_eval_table_folds_identical_launches_and_stops_at_a_limit(tmp_path, capsys) -> None:
    """Was: ``eval`` drew one table row per launch; a launch repeated the format's limit of
    2**20 times took many minutes to lay out (20000 took 13 s). Identical consecutive
    launches are one row now, and at most MAX_PLAN_ROWS rows are drawn (--json has all)."""
    from kernelpack.cli_render import MAX_PLAN_ROWS

    same, varying = tmp_path / "same.kpack", tmp_path / "vary.kpack"
    serializer.save([_counted(loop=False)], same)
    serializer.save([_counted(loop=True)], varying)
    code, out, err = run(capsys, "eval", same, "r", "x=4", "lg=30000")
    assert (code, err) == (0, "")
    rows = _table_rows(out, "k")
    assert len(rows) == 1 and rows[0].split()[0] == "0..29999"
    n = MAX_PLAN_ROWS + 7
    code, out, _ = run(capsys, "eval", varying, "r", "x=4", f"lg={n}")
    assert code == 0 and len(_table_rows(out, "k")) == MAX_PLAN_ROWS
    assert f"int32({MAX_PLAN_ROWS - 1})" in out and f"int32({MAX_PLAN_ROWS})" not in out
    assert out.endswith(f"... launches {MAX_PLAN_ROWS}..{n - 1} not shown "
                        f"(--json lists every launch)\n")
    code, out, _ = run(capsys, "eval", varying, "r", "x=4", f"lg={n}", "--json")
    assert [la["args"][1] for la in json.loads(out)["launches"]] == [f"int32({i})"
                                                                      for i in range(n)]


def test_eval_takes_values_after_json(tmp_path, capsys) -> None:
    """Was: ``eval FILE PROG --json x=5`` was a usage error ("unrecognized arguments: x=5"):
    argparse ends the NAME=VALUE list at the first option. Unknown options still are."""
    path = tmp_path / "axpy.kpack"
    serializer.save([kp_samples.axpy()], path)
    code, out, err = run(capsys, "eval", path, "axpy", "x=5", "--json", "y=5", "a=0.5")
    assert (code, err) == (0, "") and json.loads(out)["symbols"] == {"n": 5, "n32": 5}
    code, out, err = run(capsys, "eval", path, "axpy", "--json", "x=5", "x=6")
    assert code == 1 and "x is given twice" in err
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(path), "axpy", "--json", "x=5", "--bogus"])
    # (argparse before Python 3.14 names "x=5 --bogus", from 3.14 only "--bogus")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unrecognized arguments:" in err and "--bogus" in err, err
    with pytest.raises(SystemExit) as exc:
        main(["inspect", str(path), "extra"])
    assert exc.value.code == 2 and "unrecognized arguments: extra" in capsys.readouterr().err
