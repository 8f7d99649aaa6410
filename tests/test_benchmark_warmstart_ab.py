"""benchmarks/warmstart_ab.py runs: two trees, a cold run each, then interleaved disk hits."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")


def test_two_trees_are_timed_from_their_own_caches(tmp_path: Path) -> None:
    other = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "kernelpack", other / "kernelpack",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "warmstart_ab.py"),
                          "--against", str(other), "--runs", "2", "--kernels", "2"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("cold run") == 2 and "{'compiled': 2}" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| this tree", f"| {other}"]
    assert rows[0].endswith("| +0.00 |")


def test_a_directory_without_the_package_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "warmstart_ab.py"),
                          "--against", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no kernelpack package under it" in out.stderr
