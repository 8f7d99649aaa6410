"""kernelpack's own sources type-check: ``mypy`` from the repository root passes.

kernelpack ships ``py.typed``, so its annotations are what a user's type checker reads; an
annotation that contradicts the code misleads every user. The configuration is pyproject.toml's
``[tool.mypy]`` (the default options, not --strict; generated flatbuffers code is skipped and
modules without stubs are ``Any``). One cold mypy run, its cache under ``tmp_path`` so that no
earlier run's cache can hide an error: about 5 s on a 2-core machine. Users' scripts are
type-checked with --strict in test_review37_typing.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"


def test_mypy_passes_on_src(tmp_path: Path) -> None:
    """``python -m mypy`` with the checked-in configuration (its ``files`` name src/kernelpack)
    exits 0; on failure the assertion shows mypy's report."""
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e .[dev])")
    assert "[tool.mypy]" in PYPROJECT.read_text(encoding="utf-8"), \
        "pyproject.toml has no [tool.mypy] section"
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT),
           "--cache-dir", str(tmp_path / "mypy_cache"), "--no-color-output"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    report = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"mypy failed (exit {proc.returncode}):\n{report}"
    # a configuration that checked nothing would pass too: the package must have been read
    assert "Success: no issues found in" in report, report
    checked = int(report.rsplit(" in ", 1)[1].split()[0])
    assert checked >= 100, f"mypy checked only {checked} source files:\n{report}"
