"""benchmarks/load.py's ``--gpu``: issue 4 names the GPU part "benchmarks/load.py (GPU part)";
it lives in load_gpu.py, which ``load.py --gpu`` runs with the other options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LOAD = Path(__file__).resolve().parents[1] / "benchmarks" / "load.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LOAD), *args], capture_output=True, text=True,
                          timeout=120)


def test_gpu_flag_hands_the_other_options_to_load_gpu() -> None:
    done = _run("--gpu", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: load_gpu.py" in done.stdout and "--stamps" in done.stdout


def test_load_gpus_options_without_gpu_say_to_add_it() -> None:
    done = _run("--stamps")
    assert done.returncode == 2
    assert "unrecognized arguments: --stamps (those are load_gpu.py's: add --gpu)" in done.stderr
