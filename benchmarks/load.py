"""CPU cost of the load path: kp.load, Pack.verify and plan() for artifacts of 1, 100 and 1000
programs, and plan() per call in microseconds (target: < 5 µs for a program with 3 parameters
and one launch). No GPU.

    python benchmarks/load.py [--quick] [--no-write]

Writes (or replaces) its section of benchmarks/RESULTS.md with the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import kernelpack as kp  # noqa: E402
from kernelpack.planner import Planner  # noqa: E402
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module,  # noqa: E402
                                Scalar, Tensor, Variant)

BEGIN, END = "<!-- benchmarks/load.py: begin -->", "<!-- benchmarks/load.py: end -->"


def scale_summary(name: str) -> KernelSummary:
    """3 parameters, one launch: y = a * x."""
    return KernelSummary(
        name, (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",), role="out"),
               Scalar("a", kp.f32)),
        (Variant((Launch("scale", "scale", (kp.cdiv("n", 256),), (256,),
                         (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"))),)),))


def artifact(programs: int) -> bytes:
    images = tuple(Image("cubin", arch, bytes((i * 7 + j) % 251 for i in range(16384)),
                         "bench", 12080) for j, arch in enumerate(("sm_80", "sm_90")))
    module = Module("scale", ("scale",), images)
    return kp.save([Compiled(scale_summary(f"p{i:05d}"), (module,)) for i in range(programs)])


def best(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return min(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    repeat, calls = (3, 20_000) if args.quick else (7, 100_000)

    rows = []
    for count in (1, 100, 1000):
        data = artifact(count)
        t_load = best(lambda: kp.load(data), repeat)
        t_verify = best(lambda: kp.load(data).verify(), repeat)

        def first_plans() -> None:
            pack = kp.load(data)
            for name in pack.programs:
                pack[name].plan((4096,), 2.0)

        t_plan_all = best(first_plans, repeat) - t_load
        rows.append((count, len(data), t_load, t_verify, t_plan_all))
        print(f"{count:5d} programs {len(data):9d} B: load {t_load * 1e3:8.2f} ms  "
              f"load+verify {t_verify * 1e3:8.2f} ms  first plan of every program "
              f"{t_plan_all * 1e3:8.2f} ms")

    pack = kp.load(artifact(1))
    program = pack.programs[0]
    plan_cached = per_call_us(lambda: pack[program].plan((4096,), 2.0), calls)
    planner = pack[program].planner
    shapes_cached = per_call_us(lambda: planner.plan_shapes(((4096,),), (2.0,)), calls)
    uncached = Planner(pack[program].summary, cache_size=0)
    shapes_uncached = per_call_us(lambda: uncached.plan_shapes(((4096,),), (2.0,)), calls // 4)
    plan_uncached = per_call_us(lambda: uncached.plan((4096,), 2.0), calls // 4)
    print(f"plan() per call: {plan_cached:.2f} µs (repeated shapes), {plan_uncached:.2f} µs "
          f"(cache off); plan_shapes(): {shapes_cached:.2f} µs / {shapes_uncached:.2f} µs")

    machine = (f"{platform.machine()} {platform.processor() or ''}".strip()
               + f", {os.cpu_count()} CPUs, Python {platform.python_version()}")
    lines = [BEGIN, "## kp.load / verify / plan (CPU, `benchmarks/load.py`)", "",
             f"{datetime.date.today().isoformat()} on {machine}"
             f"{' (--quick)' if args.quick else ''}. Median of {repeat} runs; each program has "
             f"3 parameters and one launch, all share one module with two 16 KiB cubins. The "
             f"machine is shared with other jobs, so expect noise of up to 2x.", "",
             "| programs | file bytes | kp.load | load + verify | first plan() of every program |",
             "|---:|---:|---:|---:|---:|"]
    for count, size, t_load, t_verify, t_plan in rows:
        lines.append(f"| {count} | {size:,} | {t_load * 1e3:.2f} ms | {t_verify * 1e3:.2f} ms | "
                     f"{t_plan * 1e3:.2f} ms |")
    lines += ["", "| plan() per call (3 params, 1 launch) | µs |", "|---|---:|",
              f"| `program.plan(x_shape, a)`, repeated shapes (plan cache hit) | {plan_cached:.2f} |",
              f"| `program.plan(x_shape, a)`, cache off (full evaluation) | {plan_uncached:.2f} |",
              f"| `planner.plan_shapes(...)` (runtime entry), repeated shapes | {shapes_cached:.2f} |",
              f"| `planner.plan_shapes(...)`, cache off | {shapes_uncached:.2f} |",
              "", "Target: plan() < 5 µs per call.", END]
    if args.no_write:
        return
    results = ROOT / "benchmarks" / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    section = "\n".join(lines)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    results.write_text(text)
    print(f"updated {results}")


if __name__ == "__main__":
    main()
