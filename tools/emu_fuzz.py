"""CPU fuzz of the lowering beyond the test suite's seeds, through the SIMT emulator.

The same random fusions as tools/gpu_fuzz.py (tests/lowering/fusion_gen), at the emulator's
sizes, run by tests/lowering/simt.py (every buffer between guard bytes: a store past either
end fails) at each of the case's size sets and checked as tests/lowering/test_random_fusions.py
checks them (a float64 NumPy reference, a tolerance per dtype, ill-conditioned outputs
skipped). No GPU needed: what the GPU's time in a session cannot cover. From the checkout:

    .venv/bin/python tools/emu_fuzz.py LO HI                # seeds LO .. HI-1, default mode
    .venv/bin/python tools/emu_fuzz.py LO HI --halves       # the half mode's cases
    .venv/bin/python tools/emu_fuzz.py LO HI --elsewhere    # the elsewhere mode's (both: both)
    .venv/bin/python tools/emu_fuzz.py LO HI --budget 600   # start no seed after 600 s

Each seed runs in a forked process of its own, ``--jobs`` at a time (default the CPU count);
one past ``--timeout`` seconds is killed and counts as timed out, not as passed, and one whose
process dies (a crash) counts as failed, with its exit status. Every failure
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
from multiprocessing.connection import wait
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

MODE: dict = {}  # the run's mode (set before any seed's process is forked)


def check_seed(seed: int) -> tuple[str, str, int]:
    """``("ok" | "fail", why, outputs skipped as ill-conditioned)`` for ``seed``; runs in a
    process of its own (:func:`_child`)."""
    from tests.lowering.fusion_gen import generate
    from tests.lowering.simt import Kernels

    skipped = 0
    case = generate(seed, halves=MODE["halves"], elsewhere=MODE["elsewhere"])
    kernels = Kernels(case.fusion)
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        failures, skips = case.check(inputs, kernels(*inputs))
        skipped += len(skips)
        if failures:
            return "fail", case.describe(sizes) + "\n" + "\n".join(failures[:5]), skipped
    return "ok", "", skipped


def _child(seed: int, conn: Any) -> None:
    try:
        result = check_seed(seed)
    except Exception as exc:  # noqa: BLE001 - reported per seed
        result = ("fail", f"{type(exc).__name__}: {exc}", 0)
    conn.send(result)
    conn.close()


def run_all(seeds: range, jobs: int, timeout: float, budget: float | None,
            report: Callable[[int, str, str, int], None]) -> int:
    """Each seed in a forked process of its own, ``jobs`` at a time: one past ``timeout``
    seconds is killed (the emulator's threads cannot be interrupted from Python: a SIGALRM
    that unwound the seed freed its JIT'd code under the running threads, and the process
    segfaulted), one that dies without an answer (a crash) is reported with its exit status.
    ``report(seed, outcome, why, skipped)`` per seed; returns how many ran."""
    ctx = mp.get_context("fork")
    todo = list(seeds)[::-1]
    running: dict[Any, tuple[int, Any, float]] = {}  # conn -> (seed, process, start)
    t0 = time.time()
    done = 0
    while todo or running:
        while todo and len(running) < jobs and (budget is None or time.time() - t0 < budget):
            seed = todo.pop()
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(seed, child), daemon=True)
            proc.start()
            child.close()
            running[parent] = (seed, proc, time.time())
        if not running:
            break  # the budget: no seed started
        for conn in wait(list(running), timeout=1.0):
            seed, proc, _ = running.pop(conn)
            try:
                answer = conn.recv()  # (before the join: a long report fills the pipe)
            except EOFError:  # died without an answer
                answer = None
            proc.join()
            conn.close()
            if answer is None:
                answer = ("fail", f"the process died (exit status {proc.exitcode})", 0)
            report(seed, *answer)
            done += 1
        for conn, (seed, proc, start) in list(running.items()):
            if time.time() - start > timeout:
                proc.kill()
                proc.join()
                del running[conn]
                conn.close()
                report(seed, "timeout", f"killed after {timeout:.0f} s", 0)
                done += 1
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="exit status: 0 every seed right; 1 a seed failed or "
                                        "timed out")
    ap.add_argument("lo", type=int, help="first seed")
    ap.add_argument("hi", type=int, help="one past the last seed")
    ap.add_argument("--halves", action="store_true", help="fusion_gen's half mode")
    ap.add_argument("--elsewhere", action="store_true", help="fusion_gen's elsewhere mode")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a seed may run")
    ap.add_argument("--budget", type=float, default=None,
                    help="start no seed after this many seconds (the summary says how many "
                         "ran)")
    args = ap.parse_args()
    if args.hi <= args.lo:
        ap.error(f"HI ({args.hi}) must be above LO ({args.lo})")
    name = {(False, False): " (default mode)", (True, False): " (half mode)",
            (False, True): " (elsewhere mode)", (True, True): " (half and elsewhere mode)"}[
        args.halves, args.elsewhere]
    MODE.update(halves=args.halves, elsewhere=args.elsewhere)
    import tests.lowering.fusion_gen  # noqa: F401 - imported once, before the forks
    import tests.lowering.simt  # noqa: F401

    t0 = time.time()
    counts = {"ok": 0, "fail": 0, "timeout": 0}
    skipped = 0

    def report(seed: int, outcome: str, why: str, skips: int) -> None:
        nonlocal skipped
        counts[outcome] += 1
        skipped += skips
        if outcome != "ok":
            print(f"seed {seed}{name}: {outcome.upper()} {why[:1500]}", flush=True)
        if (reported := sum(counts.values())) % 50 == 0:
            print(f"{reported}/{args.hi - args.lo} seeds, {time.time() - t0:.0f} s", flush=True)

    done = run_all(range(args.lo, args.hi), args.jobs, args.timeout, args.budget, report)
    if done < args.hi - args.lo:
        print(f"time budget reached after {done} seeds", flush=True)
    print(f"seeds {args.lo}..{args.hi}{name}: ok {counts['ok']}, failed {counts['fail']}, "
          f"timed out {counts['timeout']} of {done} run; {skipped} outputs skipped as "
          f"ill-conditioned; {time.time() - t0:.0f} s", flush=True)
    return 1 if counts["fail"] or counts["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
