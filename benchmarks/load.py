"""CPU cost of the load path: kp.load, Pack.verify and plan() for artifacts of 1, 100 and 1000
programs, and plan() per call in microseconds (target: < 5 µs for a program with 3 parameters
and one launch). No GPU.

    python benchmarks/load.py [--quick] [--no-write]
    python benchmarks/load.py --gpu [load_gpu.py's options]

``--gpu`` runs the GPU part instead (issue 4 names it "benchmarks/load.py (GPU part)"): it is
``benchmarks/load_gpu.py``, which this hands every other option to.

Every program of an artifact has 3 parameters and one launch, and they share one module with
two 16 KiB cubin images made by the tests' cubin-like generator (tests/test_zstd_inflate.py:
16-byte instructions, zero padding, symbol names; zstd makes them ~4-6x smaller, as real
cubins), stored as the serializer stores images. Load, verify and first plans: median of
``repeat`` runs; plan() per call: ``rounds`` rounds of many calls each, the median round and
the fastest one.

Writes (or replaces) its section of benchmarks/RESULTS.md with the date and the machine.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(1, str(ROOT / "tests"))  # the tests' cubin-like data generator

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


IMAGE_BYTES = 16384


def cubin_like(seed: int) -> bytes:
    """A 16 KiB image with a real cubin's byte statistics (tests/test_zstd_inflate.py's
    generator, as benchmarks/zstd_decode.py uses): the old period-251 byte pattern compressed
    ~40x, real cubins 4.5-6x, which made the stored images, and so the file and its reads
    and digests, unrealistically small."""
    from test_zstd_inflate import _cubin_like

    return _cubin_like(IMAGE_BYTES, random.Random(seed))


_IMAGES: tuple = ()


def images() -> tuple:
    """The two images (sm_80, sm_90) every artifact shares, made once."""
    global _IMAGES
    if not _IMAGES:
        _IMAGES = tuple(Image("cubin", arch, cubin_like(j), "bench", 12080)
                        for j, arch in enumerate(("sm_80", "sm_90")))
    return _IMAGES


def artifact(programs: int) -> bytes:
    module = Module("scale", ("scale",), images())
    return kp.save([Compiled(scale_summary(f"p{i:05d}"), (module,)) for i in range(programs)])


def median_s(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """µs per call of ``fn``: the median and the fastest of ``rounds`` rounds of ``calls``
    back-to-back calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times), min(times)


def main() -> None:
    if "--gpu" in sys.argv[1:]:  # before parsing: `--gpu --help` is load_gpu.py's help
        gpu = Path(__file__).resolve().with_name("load_gpu.py")
        passed = [a for a in sys.argv[1:] if a != "--gpu"]
        # a new process: load_gpu.py times fresh processes of its own
        sys.exit(subprocess.call([sys.executable, str(gpu), *passed]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cli import parser_for

    parser = parser_for(__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions (3 runs, 5 rounds of 20,000 calls; default 7 "
                             "runs, 7 rounds of 100,000 calls)")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument("--gpu", action="store_true",
                        help="run the GPU part instead: benchmarks/load_gpu.py (kp.load to the "
                             "first result against cuLibraryLoadData and Triton, and the import "
                             "cost), given every other option; see its --help")
    args, rest = parser.parse_known_args()  # (--gpu was handled above)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)} (those are load_gpu.py's: "
                     f"add --gpu)")
    repeat, rounds, calls = (3, 5, 20_000) if args.quick else (7, 7, 100_000)

    rows = []
    for count in (1, 100, 1000):
        data = artifact(count)
        t_load = median_s(lambda: kp.load(data), repeat)
        t_verify = median_s(lambda: kp.load(data).verify(), repeat)

        def first_plans() -> None:
            pack = kp.load(data)
            for name in pack.programs:
                pack[name].plan((4096,), 2.0)

        t_plan_all = median_s(first_plans, repeat) - t_load
        rows.append((count, len(data), t_load, t_verify, t_plan_all))
        print(f"{count:5d} programs {len(data):9d} B: load {t_load * 1e3:8.2f} ms  "
              f"load+verify {t_verify * 1e3:8.2f} ms  first plan of every program "
              f"{t_plan_all * 1e3:8.2f} ms")

    pack = kp.load(artifact(1))
    program = pack.programs[0]
    plan_cached = per_call_us(lambda: pack[program].plan((4096,), 2.0), calls, rounds)
    planner = pack[program].planner
    shapes_cached = per_call_us(lambda: planner.plan_shapes(((4096,),), (2.0,)), calls, rounds)
    uncached = Planner(pack[program].summary, cache_size=0)
    shapes_uncached = per_call_us(lambda: uncached.plan_shapes(((4096,),), (2.0,)), calls // 4,
                                  rounds)
    plan_uncached = per_call_us(lambda: uncached.plan((4096,), 2.0), calls // 4, rounds)
    print(f"plan() per call, median of {rounds} rounds: {plan_cached[0]:.2f} µs (repeated "
          f"shapes), {plan_uncached[0]:.2f} µs (cache off); plan_shapes(): "
          f"{shapes_cached[0]:.2f} µs / {shapes_uncached[0]:.2f} µs")
    raw = sum(len(i.data) for i in images())
    print(f"images: 2 cubin-like x {IMAGE_BYTES} B; 1-program file {rows[0][1]:,} B "
          f"(images {raw:,} B raw)")

    machine = (f"{platform.machine()} {platform.processor() or ''}".strip()
               + f", {os.cpu_count()} CPUs, Python {platform.python_version()}")
    lines = [BEGIN, "## kp.load / verify / plan (CPU, `benchmarks/load.py`)", "",
             f"{datetime.date.today().isoformat()} on {machine}"
             f"{' (--quick)' if args.quick else ''}. Median of {repeat} runs; each program has "
             f"3 parameters and one launch, all share one module with two 16 KiB cubin-like "
             f"images (tests/test_zstd_inflate.py's generator: a real cubin's byte statistics, "
             f"zstd ~4-6x; earlier tables used a period-251 pattern that compressed ~40x). The "
             f"machine is shared with other jobs, so expect noise of up to 2x.", "",
             "| programs | file bytes | kp.load | load + verify | first plan() of every program |",
             "|---:|---:|---:|---:|---:|"]
    for count, size, t_load, t_verify, t_plan in rows:
        lines.append(f"| {count} | {size:,} | {t_load * 1e3:.2f} ms | {t_verify * 1e3:.2f} ms | "
                     f"{t_plan * 1e3:.2f} ms |")
    lines += ["", f"plan() per call: {rounds} rounds of {calls:,} calls ({calls // 4:,} with the "
              f"cache off), µs per call of the median round and of the fastest.", "",
              "| plan() per call (3 params, 1 launch) | median µs | min µs |", "|---|---:|---:|"]
    for what, (med, low) in (
            ("`program.plan(x_shape, a)`, repeated shapes (plan cache hit)", plan_cached),
            ("`program.plan(x_shape, a)`, cache off (full evaluation)", plan_uncached),
            ("`planner.plan_shapes(...)` (runtime entry), repeated shapes", shapes_cached),
            ("`planner.plan_shapes(...)`, cache off", shapes_uncached)):
        lines.append(f"| {what} | {med:.2f} | {low:.2f} |")
    lines += ["", "Target: plan() < 5 µs per call (median).", END]
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
