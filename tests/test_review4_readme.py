"""The README is what a newcomer runs first: its claims are checked against the code here.

Each check reads README.md and compares it with the live objects (the CLI's argument parser,
the environment knobs declared in :mod:`kernelpack.config`, the public ``kp`` names, the
example build), so an option, variable or name added or renamed without the README following
fails here rather than in a reader's shell.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import config
from kernelpack.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _command_rows() -> dict[str, str]:
    """The README's command table: subcommand name -> its first cell (the usage)."""
    rows = {}
    for line in README.splitlines():
        m = re.match(r"\| `kernelpack (\w+)([^`]*)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    raise AssertionError("kernelpack's parser has no subcommands")


def _options(sub: argparse.ArgumentParser) -> set[str]:
    """The long options of a subcommand (``-o`` where it has no long form), without --help."""
    out = set()
    for action in sub._actions:  # noqa: SLF001
        if not action.option_strings or "--help" in action.option_strings:
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        out.add(longs[0] if longs else action.option_strings[0])
    return out


def test_every_subcommand_is_in_the_table():
    assert set(_command_rows()) == set(_subparsers())


@pytest.mark.parametrize("name", ["inspect", "verify", "extract", "eval", "diff", "keygen",
                                  "sign"])
def test_every_option_is_documented(name):
    """Both ways: each option the parser takes is in the README row, and each option the row
    names exists (``extract --max-bytes`` was missing from the row)."""
    usage = _command_rows()[name]
    documented = set(re.findall(r"(--[a-z][a-z-]*|-o\b)", usage))
    sub = _subparsers()[name]
    actual = _options(sub)
    accepted = {o for a in sub._actions for o in a.option_strings}  # noqa: SLF001
    undocumented = {o for o in actual
                    if o not in documented and not (o == "--output" and "-o" in documented)}
    assert not undocumented, f"kernelpack {name}: options missing from the README: {undocumented}"
    unknown = documented - accepted
    assert not unknown, f"kernelpack {name}: README names options that do not exist: {unknown}"


def test_extract_max_bytes_default_matches():
    """The README says the default is 4G (powers of 1024)."""
    assert "default `4G`" in README
    args = build_parser().parse_args(["extract", "f.kpack", "-o", "d"])
    assert args.max_bytes == 4 << 30


def test_environment_variables_exist():
    named = set(re.findall(r"KERNELPACK_[A-Z_]+", README))
    assert named, "the README names no environment variable"
    declared = set(config._REGISTRY)  # noqa: SLF001 - the knob registry
    assert named <= declared, f"README names undeclared variables: {named - declared}"


def test_public_names_exist():
    names = set(re.findall(r"\bkp\.([A-Za-z_]\w*)", README))
    missing = sorted(n for n in names if not hasattr(kp, n))
    assert not missing, f"README uses kp names that do not exist: {missing}"


def test_quick_start_and_eval_example(tmp_path):
    """examples/build_example.py writes the artifact whose plan and `kernelpack eval` output
    the README shows."""
    out = tmp_path / "example.kpack"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example.py"), str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    pack = kp.load(out)
    assert pack.programs == ["axpy"]
    plan = pack["axpy"].plan(x=(1_000_000,), y=(1_000_000,), a=0.5)
    assert plan.launches[0].grid == (3907, 1, 1)
    with pytest.raises(kp.ConstraintError, match=r"y\.shape\[0\] is 11 but n = 10"):
        pack["axpy"].plan(x=(10,), y=(11,), a=0.5)
    res = subprocess.run([sys.executable, "-m", "kernelpack", "eval", str(out), "axpy",
                          "x=1000000", "y=1000000", "a=0.5"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    block = README.split("$ kernelpack eval example.kpack axpy x=1000000 y=1000000 a=0.5\n")[1]
    block = block.split("```")[0]
    for line in block.splitlines():
        assert line.rstrip() in {row.rstrip() for row in res.stdout.splitlines()}, line
