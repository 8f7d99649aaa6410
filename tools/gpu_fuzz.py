"""GPU fuzz of the lowering beyond the test suite's seeds.

Random fusions from tests/lowering/fusion_gen at GPU sizes are compiled for sm_90 in a process
pool, then loaded and launched one by one with torch tensors (``out=`` poisoned, and
allocating), each checked as tests/gpu/test_random_fusions.py checks it (a float64 NumPy
reference, a tolerance per dtype). Run on the GPU machine from a tree holding src/ and tests/:

    bash tools/gpu-run.sh .gpu/tree "tools/gpu_fuzz.py LO HI"    # seeds LO .. HI-1
    SKIP=2078,2163 bash tools/gpu-run.sh ...                     # seeds to leave out
    HALVES=1 bash tools/gpu-run.sh ...                           # the half mode's cases
    ELSEWHERE=1 bash tools/gpu-run.sh ...                        # the elsewhere mode's cases
    RUN_BUDGET_S=200 bash tools/gpu-run.sh ...                   # start no seed after 200 s
    SEED_TIMEOUT_S=120 bash tools/gpu-run.sh ...                 # a seed's limit (default 25)

The elsewhere mode (fusion_gen/elsewhere.py, a seed space of its own; with HALVES=1 too, both)
reads reductions at other rows of square tensors and puts row reductions beside general ones:
the lowering's workspaces for them (materialize_nodes, materialize_rows).

A seed still running after 25 s (``SEED_TIMEOUT_S``) is reported as "seed N: TIMEOUT" and the
run goes on, where the time goes to Python (the NumPy reference's exact sums over millions of
outputs: seed 43305 ended a session-40 run this way; since session 54 those sums take a Python
step only for rows of two or more finite terms, and seeds 43305, 48145, 48458, 48565 and 49893,
timeouts before, each finish in 5-30 s); after 75 s (or ``SEED_TIMEOUT_S`` + 50;
a kernel that never finishes cannot be interrupted) the process dumps its Python stack and
ends: the last "seed N start" line names it. Every wrong result is printed as "seed N: FAIL
..." with the generated source and sizes; a summary line ends the run.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import signal
import multiprocessing as mp
import os
import pathlib
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path.cwd()
sys.path.insert(0, str(ROOT / "src"))
# then the seed is abandoned (Python code only: SIGALRM); SEED_TIMEOUT_S=120 to check one that
# timed out (seed 10281 in half mode: ~10 s of its NumPy references on the 2-CPU box)
SEED_TIMEOUT_S = int(os.environ.get("SEED_TIMEOUT_S", "25"))
STUCK_S = max(75, SEED_TIMEOUT_S + 50)  # then the run ends with the stack (a kernel that
# never finishes)


class SeedTimeout(Exception):
    """Raised in the main thread by SIGALRM when a seed runs past SEED_TIMEOUT_S."""


def _alarm(signum: int, frame: Any) -> None:
    raise SeedTimeout(f"still running after {SEED_TIMEOUT_S} s")


def run_seed(check: Callable[[], str | None], seconds: int = SEED_TIMEOUT_S
             ) -> tuple[str, str]:
    """``("ok", "")``, ``("fail", why)`` or ``("timeout", why)`` for one seed's ``check``
    (which returns a failure's text or None), abandoned after ``seconds`` while it runs
    Python code. Call from the main thread (SIGALRM)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        failure = check()
        signal.alarm(0)
        return ("fail", failure) if failure else ("ok", "")
    except SeedTimeout as exc:
        return "timeout", str(exc)
    except Exception as exc:  # noqa: BLE001 - reported per seed
        signal.alarm(0)
        return "fail", f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
HALVES = os.environ.get("HALVES", "") not in ("", "0")  # fusion_gen's half mode
ELSEWHERE = os.environ.get("ELSEWHERE", "") not in ("", "0")  # fusion_gen's elsewhere mode
# stop starting seeds after this many seconds (the device tool allows 600 s a call; lower it
# with RUN_BUDGET_S=... to run several modes in one call)
RUN_BUDGET_S = float(os.environ.get("RUN_BUDGET_S", "480"))


def load_generator() -> Callable[..., Any]:
    """tests/lowering/fusion_gen's ``generate``, imported by path (its ``torch_io`` module is
    ``generate.torch_io``)."""
    path = ROOT / "tests" / "lowering" / "fusion_gen"
    spec = importlib.util.spec_from_file_location("kp_fusion_gen", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    generate = module.generate
    generate.torch_io = module.torch_io
    return generate


def compile_seed(seed: int) -> tuple[int, bytes | None, str | None]:
    """(seed, the artifact, None) or (seed, None, why it did not compile)."""
    import kernelpack as kp

    try:
        case = load_generator()(seed, "gpu", halves=HALVES, elsewhere=ELSEWHERE)
        compiled = kp.compile(case.fusion, targets=["sm_90"])
        return seed, bytes(kp.save([compiled])), None
    except Exception as exc:  # noqa: BLE001 - reported per seed
        return seed, None, f"{type(exc).__name__}: {exc}"[:400]


def main() -> None:
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    skip = {int(v) for v in os.environ.get("SKIP", "").split(",") if v}
    t0 = time.time()
    with mp.get_context("fork").Pool(min(15, os.cpu_count() or 4)) as pool:
        built = pool.map(compile_seed, range(lo, hi), chunksize=4)
    print(f"compiled {hi - lo} seeds in {time.time() - t0:.0f} s", flush=True)

    import torch

    import kernelpack as kp

    generate = load_generator()
    io = generate.torch_io

    ok = bad = uncompiled = slow = 0
    for seed, data, err in built:
        if seed in skip:
            continue
        if data is None:
            uncompiled += 1
            print(f"seed {seed}: COMPILE ERROR {err}", flush=True)
            continue
        case = generate(seed, "gpu", halves=HALVES, elsewhere=ELSEWHERE)
        print(f"seed {seed} start", flush=True)
        faulthandler.dump_traceback_later(STUCK_S, exit=True)
        program = kp.load(data)[case.name]
        outcome, why = run_seed(lambda: io.run_and_check(torch, case, program, max_lines=5))
        if outcome == "ok":
            ok += 1
        elif outcome == "timeout":
            slow += 1
            print(f"seed {seed}: TIMEOUT {why} (not counted as ok)", flush=True)
            torch.cuda.synchronize()  # whatever it launched finishes before the next seed
        else:
            bad += 1
            print(f"seed {seed}: FAIL {why[:1500]}", flush=True)
        faulthandler.cancel_dump_traceback_later()
        if time.time() - t0 > RUN_BUDGET_S:
            print(f"time budget reached at seed {seed}", flush=True)
            break
    mode = "".join(f" ({m} mode)" for m, on in (("half", HALVES), ("elsewhere", ELSEWHERE))
                   if on)
    print(f"seeds {lo}..{hi}{mode}: ok {ok}, failed {bad}, timed out {slow}, compile errors "
          f"{uncompiled}, {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
