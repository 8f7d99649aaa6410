"""Compile-time benchmark (CPU is enough): cold ``kp.compile`` per workload for sm_80 + sm_90 +
PTX, PTX/cubin sizes, and Triton's compile of the same pointwise math when Triton (and a GPU it
can target) is present: its first compile in fresh processes (the issue's peer) and a further
kernel in a warm process (like for like; ``_triton_compile.py``).

    PYTHONPATH=src python benchmarks/compile.py [--repeat 5] [--json]

"Cold" means a full compile with no cache: no kernelpack cache, and the CUDA compute cache that
nvJitLink 13.0 reads and fills is turned off (``CUDA_CACHE_DISABLE=1``): trace, schedule, IR,
LLVM O3 + PTX, nvJitLink per architecture (side by side). Process-level set-up (importing llvmlite, registering NVPTX,
parsing libdevice once) is paid by the first compile of the process and reported separately.

Every timed ``kp.compile`` is a real compile: ``kp.compile`` remembers the process's last
results by key (``compile_entry._RECENT``, since commit 4ef3a03), so the memo is emptied
before each one (``_compiles.forget_compiles``), and a counter around the lowering's
``compile_traced`` must see exactly one call per timed compile (else the script stops). The
set-up steps compile fusions of their own, not in the table, so that no row reuses their
work.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# nvJitLink 13.0 keeps assembled cubins in the CUDA compute cache (~/.nv/ComputeCache, shared
# by every process of the user): a repeated compile, in this process or a later one, then
# skips ptxas (640 ms -> 3 ms for a softmax on the H200 host). "Cold" means without it.
os.environ["CUDA_CACHE_DISABLE"] = "1"

import kernelpack as kp  # noqa: E402
from kernelpack.lowering.workloads import make  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _triton_compile as triton_compiles  # noqa: E402
from _compiles import CompileCounter, forget_compiles  # noqa: E402

TARGETS = ["sm_80", "sm_90", "ptx"]
T = kp.Tensor


# The set-up steps' fusions: not in the table (make()'s workloads), so no row can reuse them.
@kp.fusion(name="compile_py_setup")
def _setup_fusion(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):  # no libdevice call
    return x * 3.0 - y


@kp.fusion(name="compile_py_libdevice_setup")
def _libdevice_fusion(x: T[kp.f32, "n"]):  # exp: a libdevice call (__nv_expf)
    return kp.exp(x) * 0.5


def _compile_once(fusion: kp.fusion, counter: CompileCounter) -> tuple[float, kp.Compiled]:
    """Seconds of one real ``kp.compile`` (the memo emptied before the clock) and its result;
    raises when the lowering did not run exactly once inside it."""
    forget_compiles()
    before = counter.calls
    t0 = time.perf_counter()
    compiled = kp.compile(fusion, targets=TARGETS)
    seconds = time.perf_counter() - t0
    if counter.calls != before + 1:
        raise SystemExit(f"compile.py: kp.compile of {fusion.name} ran the lowering "
                         f"{counter.calls - before} times (expected 1): not a real compile")
    return seconds, compiled


def _time_compile(fusion: kp.fusion, repeat: int,
                  counter: CompileCounter) -> tuple[float, kp.Compiled]:
    """Median seconds of ``repeat`` real compiles of ``fusion``, and the last result."""
    times, compiled = [], None
    for _ in range(repeat):
        seconds, compiled = _compile_once(fusion, counter)
        times.append(seconds)
    return statistics.median(times), compiled  # type: ignore[return-value]


def main() -> None:
    from _cli import parser_for

    parser = parser_for(__doc__)
    parser.add_argument("--repeat", type=int, default=5,
                        help="real (cold) compiles per workload; the median is reported "
                             "(default 5)")
    parser.add_argument("--triton-processes", type=int, default=3,
                        help="fresh processes timing Triton's compiles of the same gelu "
                             "(its first compile is one per process; default 3)")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as JSON instead of the table (RESULTS.md is "
                             "then left alone)")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1 (got {args.repeat})")
    if args.triton_processes < 1:
        parser.error(f"--triton-processes must be at least 1 (got {args.triton_processes})")

    t0 = time.perf_counter()
    with CompileCounter() as counter:  # imports the lowering: the first compile's to pay
        importing = time.perf_counter() - t0
        # process-level set-up (imports, NVPTX init), then the first libdevice user (parses
        # libdevice once): fusions of their own, so the table's rows start from neither
        setup, _ = _compile_once(_setup_fusion, counter)
        setup += importing
        libdevice_first, _ = _compile_once(_libdevice_fusion, counter)
        rows = _rows(args.repeat, counter)
        compiles = counter.calls
    expected = 2 + args.repeat * len(rows)
    if compiles != expected:
        raise SystemExit(f"compile.py: {compiles} compiles ran, expected {expected}")
    print(f"{compiles} real compiles ran (2 set-up + {args.repeat} x {len(rows)} rows), each "
          f"checked through a counter around the lowering's compile_traced", file=sys.stderr)
    triton = triton_compiles.measure(args.triton_processes)
    if args.json:
        print(json.dumps({"setup_s": setup, "libdevice_first_s": libdevice_first,
                          "triton_first_compile_s": list(triton.first),
                          "triton_later_compile_s": list(triton.later),
                          "triton_not_measured": triton.why, "compiles": compiles,
                          "rows": rows}, indent=1))
        return
    lines = _section(rows, args.repeat, setup, libdevice_first, triton)
    print("\n".join(lines))
    if not args.no_write:
        _write_results(lines)


def _rows(repeat: int, counter: CompileCounter) -> list[dict]:
    rows = []
    for dt in (kp.float32, kp.float64):
        for name, fusion in make(dt).items():
            seconds, compiled = _time_compile(fusion, repeat, counter)
            module = compiled.modules[0]
            sizes = {i.target: len(i.data) for i in module.images}
            rows.append({"workload": name, "dtype": dt.name, "ms": round(seconds * 1e3, 1),
                         "kernels": len(module.kernels), "variants": len(compiled.summary.variants),
                         "ptx_bytes": sizes.get("compute_80", 0),
                         "cubin_sm80": sizes.get("sm_80", 0), "cubin_sm90": sizes.get("sm_90", 0)})
    return rows


BEGIN, END = "<!-- benchmarks/compile.py: begin -->", "<!-- benchmarks/compile.py: end -->"


def _section(rows: list[dict], repeat: int, setup: float, libdevice_first: float,
             triton: triton_compiles.TritonCompileTimes) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
               f"{platform.python_version()}, load average {load} at the end")
    if triton.why:
        triton_line = f"Triton: not measured ({triton.why})."
    else:
        triton_line = (
            f"Triton, the same gelu (fresh `TRITON_CACHE_DIR`, includes the launch, output "
            f"checked): first compile of a process {triton.first_median():.3f} s (median of "
            f"{len(triton.first)} fresh processes: Triton's own process set-up and the launcher "
            f"for this signature included); a further kernel of the same math in the same "
            f"process {triton.later_median() * 1e3:.0f} ms (median of {len(triton.later)}, "
            f"each under a name of its own: a real compile, like kernelpack's rows).")
    lines = [BEGIN, "## kp.compile time and image sizes (CPU, `benchmarks/compile.py`)", "",
             f"Command: `python benchmarks/compile.py --repeat {repeat} --triton-processes "
             f"{max(len(triton.first), 1)}` — {when}, {machine}.",
             "Each row is a full cold compile (trace → schedule → LLVM IR → LLVM O3 + PTX for the "
             "lowest arch → nvJitLink for sm_80 and sm_90 side by side, PTX image kept), no "
             "kernelpack cache, the CUDA compute cache off (`CUDA_CACHE_DISABLE=1`: nvJitLink "
             f"13.0 would answer the repeats from it), kp.compile's per-process memo of recent "
             f"results emptied before each compile (a repeat is otherwise a lookup; a counter "
             f"around the lowering checks that each timed call compiled), median of {repeat}.",
             "",
             f"First compile of the process (imports, NVPTX init; a small pointwise fusion not "
             f"in the table): {setup * 1e3:.0f} ms; first libdevice user (parses libdevice "
             f"once; an `exp` fusion not in the table): {libdevice_first * 1e3:.0f} ms.  ",
             triton_line,
             "", "| workload | dtype | ms | kernels | variants | PTX B | sm_80 cubin B | sm_90 cubin B |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['dtype']} | {r['ms']} | {r['kernels']} | "
                     f"{r['variants']} | {r['ptx_bytes']} | {r['cubin_sm80']} | {r['cubin_sm90']} |")
    gelu = next(r["ms"] for r in rows if r["workload"] == "gelu" and r["dtype"] == "float32")
    if triton.why:
        ratios = "Triton / kernelpack not measured"
    else:
        first = triton.first_median() * 1e3 / gelu
        later = triton.later_median() * 1e3 / gelu
        ratios = (f"gelu float32: Triton's first compile / kernelpack = {first:.1f}x "
                  f"({'met' if first >= 10 else 'not met'}); like for like, Triton's further "
                  f"kernel / kernelpack = {later:.1f}x")
    lines += ["", f"Target: <= 100 ms for a pointwise fusion and >= 10x faster than Triton's first "
              f"compile of the same kernel ({ratios}). Row "
              "kernels compile every variant of the summary (warp/block/loop schedules, "
              "register-resident rows in several widths), which is why softmax and layernorm "
              "take longer.", END]
    return lines


def _write_results(lines: list[str]) -> None:
    section = "\n".join(lines)
    out = os.environ.get("OUT")  # the GPU machine's result folder, when run there
    if out:
        Path(out, "compile.md").write_text(section + "\n")
    path = Path(__file__).with_name("RESULTS.md")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
