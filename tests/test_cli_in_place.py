"""``kernelpack inspect`` lists, per variant, the ``out=`` / ``inout`` over input pairs the
runtime refuses as in-place use, with why (cli_facts.in_place_facts; the rule is
runtime/in_place.py's, the very function the runtime calls). No GPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import cli_facts, cli_render
from kernelpack.cli import main
from kernelpack.runtime.binding import BoundSummary
from kernelpack.runtime.in_place import refused_in_variant
from kernelpack.summary import Arg, KernelSummary, Launch, Tensor as TensorSpec, Variant

T = kp.Tensor


def _launch(kernel: str, *buffers: str, count: object = None) -> Launch:
    return Launch(kernel, "m", (1,), (32,), tuple(Arg.buffer(b) for b in buffers),
                  count=count)


def _two_kernels() -> KernelSummary:
    """``k0`` stores ``z`` from ``x``; ``k1`` stores ``s`` from ``y`` (and ``k1`` of the second
    variant reads ``x`` too); a float64 output ``d``."""
    params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",)),
              TensorSpec("z", kp.f32, ("n",), role="out"),
              TensorSpec("s", kp.f32, ("n",), role="out"),
              TensorSpec("d", kp.f64, ("n",), role="out"))
    return KernelSummary("two", params, (
        Variant((_launch("k0", "z", "x"), _launch("k1", "s", "d", "y")),
                predicate=kp.sym("n") < 100),
        Variant((_launch("k0", "z", "x"), _launch("k1", "s", "x"), _launch("k2", "d", "y"))),
    ))


def test_facts_list_what_the_runtime_refuses_with_why() -> None:
    summary = _two_kernels()
    facts = cli_facts.summary_facts(summary)
    first, second = (v["in_place_refused"] for v in facts["variants"])
    pairs = [(r["output"], r["input"]) for r in first]
    assert pairs == sorted(pairs)
    assert ("z", "y") in pairs and ("z", "x") not in pairs  # k1 reads y after k0 stored z
    assert ("s", "y") in pairs  # k1 stores s and d: it may reload y after storing s
    assert ("d", "x") in pairs  # 8-byte elements over 4-byte ones
    why = {(r["output"], r["input"]): r["why"] for r in first}
    assert "a later kernel of the program reads 'y'" in why[("z", "y")]
    assert "stores to another array too" in why[("s", "y")]
    assert "8-byte elements" in why[("d", "x")]
    assert ("z", "x") in [(r["output"], r["input"]) for r in second]  # k1 reads x now
    bound = BoundSummary(summary)
    for i, variant in enumerate(facts["variants"]):
        listed = {(r["output"], r["input"]): r["why"] for r in variant["in_place_refused"]}
        assert listed == bound.in_place_refused(i) == refused_in_variant(summary, i)


def test_an_inout_argument_counts_as_written() -> None:
    params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",), role="inout"))
    summary = KernelSummary("bump", params, (Variant((_launch("k", "y", "x", count=3),)),))
    (variant,) = cli_facts.summary_facts(summary)["variants"]
    assert [(r["output"], r["input"]) for r in variant["in_place_refused"]] == [("y", "x")]
    assert "runs again" in variant["in_place_refused"][0]["why"]


def test_too_large_a_program_is_not_worked_out(monkeypatch: pytest.MonkeyPatch) -> None:
    summary = _two_kernels()
    first, second = 2 * (3 + 2) + 3 * 2, 3 * (3 + 2) + 3 * 2  # launches x (3 + 2) + pairs
    monkeypatch.setattr(cli_facts, "IN_PLACE_WORK", first - 1)
    assert cli_facts.in_place_facts(summary, 0) is None
    assert cli_facts.in_place_facts(summary, 1) is None  # 3 launches
    monkeypatch.setattr(cli_facts, "IN_PLACE_WORK", first)
    assert cli_facts.in_place_facts(summary, 0) is not None
    # one budget for the whole artifact: the first variant uses it up, the second gets None
    monkeypatch.setattr(cli_facts, "IN_PLACE_WORK", first + second - 1)
    listed = [v["in_place_refused"] for v in cli_facts.summary_facts(summary)["variants"]]
    assert listed[0] is not None and listed[1] is None


def _rendered(summary: KernelSummary) -> str:
    from rich.console import Console

    con = Console(width=200, record=True, force_terminal=False)
    program = cli_facts.summary_facts(summary)
    for i, variant in enumerate(program["variants"]):
        cli_render._render_in_place(con, variant["in_place_refused"])
    return con.export_text()


def test_the_text_shows_a_few_and_counts_the_rest() -> None:
    names = [f"o{i}" for i in range(6)]
    params = (TensorSpec("x", kp.f32, ("n",)), TensorSpec("y", kp.f32, ("n",))) + tuple(
        TensorSpec(o, kp.f32, ("n",), role="out") for o in names)
    summary = KernelSummary("many", params, (Variant((_launch("k", *names, "x", "y"),)),))
    text = _rendered(summary)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == cli_render.IN_PLACE_LINES + 1
    assert "in place: o0 over x reads x from a copy: the kernel that stores to 'o0'" in lines[0]
    assert lines[-1].strip() == (f"in place: {12 - cli_render.IN_PLACE_LINES} more pairs "
                                 f"read from a copy (--json lists them)")
    assert "not worked out" in _render_none()


def _render_none() -> str:
    from rich.console import Console

    con = Console(width=200, record=True, force_terminal=False)
    cli_render._render_in_place(con, None)
    return con.export_text()


_COMPILES = all(importlib.util.find_spec(m) is not None
                for m in ("llvmlite", "cuda.bindings.nvjitlink"))


@kp.fusion
def double_and_sum(x: T[kp.f32, "n"]):
    return x * 2, x.sum()


@kp.fusion
def double_and_other_sum(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y.sum()


@kp.fusion
def double_and_colsum(x: T[kp.f32, "n", "m"]):
    return x * 2, x.sum(0)  # a column sum: several variants, each refusing out0 over x


@pytest.mark.skipif(not _COMPILES, reason="the lowering (kernelpack[compile]) is missing")
def test_inspect_of_compiled_fusions(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    path = tmp_path / "two.kpack"
    kp.save([kp.compile(f, targets=["sm_80"])
             for f in (double_and_sum, double_and_other_sum, double_and_colsum)], str(path))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    # once per program (double_and_sum, double_and_colsum's variant 0), then referred to;
    # and once more for double_and_colsum's last variant (one thread per column sum), whose
    # kernel storing out1 reads x down a column: a pair of its own (format 1.1)
    late = ("in place: out0 over x reads x from a copy: a later kernel of the program reads "
            "'x' after an earlier one stored to 'out0'")
    assert out.count(late) == 3
    assert out.count("in place: out1 over x reads x from a copy: the kernel that stores to "
                     "'out1' reads 'x' at other elements than the ones it stores") == 1
    variants = len(kp.load(str(path))["double_and_colsum"].summary.variants)
    assert variants > 2
    assert out.count("in place: the same pairs copied as in variant 0") == variants - 2
    assert "out0 over y reads y from a copy" in out  # the other program: the sum reads y, not x
    assert main(["inspect", str(path), "--json"]) == 0
    programs = {p["name"]: p for p in json.loads(capsys.readouterr().out)["programs"]}
    refused = programs["double_and_other_sum"]["variants"][0]["in_place_refused"]
    assert [(r["output"], r["input"]) for r in refused] == [("out0", "y")]


def test_diff_names_a_refusal_that_came_or_went() -> None:
    """``kernelpack diff`` compares these facts too: a rebuild that changes which pairs are
    refused says so in a few words."""
    summary = _two_kernels()
    a = {"programs": [cli_facts.summary_facts(summary)], "modules": []}
    fewer = KernelSummary("two", summary.params, (summary.variants[1],))
    b = {"programs": [cli_facts.summary_facts(fewer)], "modules": []}
    lines = cli_facts.diff_facts(a, b)
    assert any("in_place_refused" in line or "in place" in line for line in lines), lines
    one = KernelSummary("two", summary.params, (Variant((_launch("k0", "z", "x"),
                                                          _launch("k1", "s", "y"),
                                                          _launch("k2", "d", "y"))),))
    c = {"programs": [cli_facts.summary_facts(one)], "modules": []}
    lines = cli_facts.diff_facts(b, c)
    assert "    variants[0].in_place_refused[4]: <in place z over y> -> (absent)" in lines, lines
