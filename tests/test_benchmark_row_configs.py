"""benchmarks/row_configs.py without a GPU: the configurations and their registers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "benchmarks" / "row_configs.py")

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=600)


def test_list_names_every_configuration() -> None:
    out = _run("--list")
    assert out.returncode == 0, out.stderr
    names = [line.split(":")[0] for line in out.stdout.splitlines()]
    assert names[0] == "current" and "softmax-8192-at-512" in names and len(names) >= 5


def test_registers_show_what_a_configuration_changes() -> None:
    """The 8192 group bounded for 768 resident threads (as it is) fits 85 registers without
    spills; bounded for 512, as before session 51, ptxas takes more."""
    out = _run("--registers", "--workloads", "softmax", "--config", "current",
               "--config", "softmax-8192-at-512")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split(" | ")[:2] for line in lines] == [["this tree", "current"],
                                                        ["this tree", "softmax-8192-at-512"]]
    regs = [re.search(r"rowblock256x32=(\d+)( \(spills)?", line) for line in lines]
    assert regs[0] and regs[1] and not regs[0].group(2), lines
    assert int(regs[0].group(1)) * 768 <= 65536 < int(regs[1].group(1)) * 768, lines


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    out = _run("--config", "nope")
    assert out.returncode == 2 and "unknown --config 'nope'" in out.stderr
    out = _run("--against", str(tmp_path))
    assert out.returncode == 2 and "no kernelpack package" in out.stderr
    out = _run("--cells", "8x")
    assert out.returncode == 2 and "--cells" in out.stderr
    out = _run("--workloads", "gelu")
    assert out.returncode == 2 and "--workloads" in out.stderr
