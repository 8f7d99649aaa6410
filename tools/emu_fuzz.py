"""CPU fuzz of the lowering beyond the test suite's seeds, through the SIMT emulator.

The same random fusions as tools/gpu_fuzz.py (tests/lowering/fusion_gen), at the emulator's
sizes, run by tests/lowering/simt.py (every buffer between guard bytes: a store past either
end fails) at each of the case's size sets and checked as tests/lowering/test_random_fusions.py
checks them (a float64 NumPy reference, a tolerance per dtype, ill-conditioned outputs
skipped). No GPU needed: what the GPU's time in a session cannot cover. From the checkout:

    .venv/bin/python tools/emu_fuzz.py LO HI                # seeds LO .. HI-1, default mode
    .venv/bin/python tools/emu_fuzz.py LO HI --halves       # the half mode's cases
    .venv/bin/python tools/emu_fuzz.py LO HI --elsewhere    # the elsewhere mode's (both: both)
    .venv/bin/python tools/emu_fuzz.py LO HI --budget 600   # stop after ~600 s

Seeds run in a process pool (``--jobs``, default the CPU count); a seed past ``--timeout``
seconds (Python code: SIGALRM in its worker) counts as timed out, not as passed. Every failure
prints the seed, the mode and the first lines of the check's report; ``python -m
tests.lowering.fusion_gen SEED`` prints the case again. The last line sums the run up; the
exit status is 1 when a seed failed or timed out.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "tools")]

from gpu_fuzz import run_seed  # noqa: E402 - SIGALRM per seed, shared with the GPU fuzz

MODE: dict = {}  # the run's mode, set in each worker by _init


def _init(mode: dict) -> None:
    MODE.update(mode)


def check_seed(seed: int) -> tuple[int, str, str, int]:
    """``(seed, "ok" | "fail" | "timeout", why, outputs skipped as ill-conditioned)``."""
    from tests.lowering.fusion_gen import generate
    from tests.lowering.simt import Kernels

    skipped = [0]

    def check() -> str | None:
        case = generate(seed, halves=MODE["halves"], elsewhere=MODE["elsewhere"])
        kernels = Kernels(case.fusion)
        for sizes in case.sizes:
            inputs = case.inputs(sizes)
            failures, skips = case.check(inputs, kernels(*inputs))
            skipped[0] += len(skips)
            if failures:
                return case.describe(sizes) + "\n" + "\n".join(failures[:5])
        return None

    outcome, why = run_seed(check, MODE["timeout"])
    return seed, outcome, why, skipped[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 every seed right; 1 a seed failed or "
                                        "timed out")
    ap.add_argument("lo", type=int, help="first seed")
    ap.add_argument("hi", type=int, help="one past the last seed")
    ap.add_argument("--halves", action="store_true", help="fusion_gen's half mode")
    ap.add_argument("--elsewhere", action="store_true", help="fusion_gen's elsewhere mode")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a seed may run")
    ap.add_argument("--budget", type=float, default=None,
                    help="stop after this many seconds: seeds not finished by then are not "
                         "counted (the summary says how many ran)")
    args = ap.parse_args()
    if args.hi <= args.lo:
        ap.error(f"HI ({args.hi}) must be above LO ({args.lo})")
    mode = {"halves": args.halves, "elsewhere": args.elsewhere, "timeout": args.timeout}
    name = {(False, False): " (default mode)", (True, False): " (half mode)",
            (False, True): " (elsewhere mode)", (True, True): " (half and elsewhere mode)"}[
        args.halves, args.elsewhere]
    t0 = time.time()
    counts = {"ok": 0, "fail": 0, "timeout": 0}
    skipped = done = 0
    with mp.get_context("fork").Pool(args.jobs, _init, (mode,)) as pool:
        for seed, outcome, why, skips in pool.imap_unordered(
                check_seed, range(args.lo, args.hi)):
            counts[outcome] += 1
            skipped += skips
            done += 1
            if outcome != "ok":
                print(f"seed {seed}{name}: {outcome.upper()} {why[:1500]}", flush=True)
            if done % 50 == 0:
                print(f"{done}/{args.hi - args.lo} seeds, {time.time() - t0:.0f} s", flush=True)
            if args.budget is not None and time.time() - t0 > args.budget:
                pool.terminate()
                print(f"time budget reached after {done} seeds", flush=True)
                break
    print(f"seeds {args.lo}..{args.hi}{name}: ok {counts['ok']}, failed {counts['fail']}, "
          f"timed out {counts['timeout']} of {done} run; {skipped} outputs skipped as "
          f"ill-conditioned; {time.time() - t0:.0f} s", flush=True)
    return 1 if counts["fail"] or counts["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
