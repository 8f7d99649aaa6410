"""tools/gpu_fuzz.py's per-seed timeout, which needs no GPU: a seed whose check spends too
long in Python (the NumPy reference's exact sums over millions of outputs: seed 43305 ended
session 40's run, whose timeout then killed the process) is reported and the run goes on."""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[1] / "tools" / "gpu_fuzz.py"


@pytest.fixture(scope="module")
def fuzz():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kp_gpu_fuzz_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_slow_check_is_abandoned_and_reported(fuzz) -> None:  # type: ignore[no-untyped-def]
    finished = []

    def slow() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # Python code: the alarm interrupts it
            sum(range(1000))
        finished.append(True)

    outcome, why = fuzz.run_seed(slow, seconds=1)
    assert outcome == "timeout" and "still running after" in why
    assert not finished  # abandoned, not run to its end


def test_outcomes_of_a_check(fuzz) -> None:  # type: ignore[no-untyped-def]
    assert fuzz.run_seed(lambda: None, seconds=5) == ("ok", "")
    assert fuzz.run_seed(lambda: "out0: 3 elements off", seconds=5) == (
        "fail", "out0: 3 elements off")

    def broken() -> None:
        raise ValueError("bad shape")

    assert fuzz.run_seed(broken, seconds=5) == ("fail", "ValueError: bad shape")
    assert signal.alarm(0) == 0  # no alarm is left pending after any of them
