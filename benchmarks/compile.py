"""Compile-time benchmark (CPU is enough): cold ``kp.compile`` per workload for sm_80 + sm_90 +
PTX, PTX/cubin sizes, and Triton's first compile of the same pointwise math when Triton (and a
GPU it can target) is present.

    PYTHONPATH=src python benchmarks/compile.py [--repeat 5] [--json]

"Cold" means a full compile with no cache: no kernelpack cache, and the CUDA compute cache that
nvJitLink 13.0 reads and fills is turned off (``CUDA_CACHE_DISABLE=1``): trace, schedule, IR,
LLVM O3 + PTX, nvJitLink per architecture (side by side). Process-level set-up (importing llvmlite, registering NVPTX,
parsing libdevice once) is paid by the first compile of the process and reported separately.
"""

from __future__ import annotations

import argparse
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

TARGETS = ["sm_80", "sm_90", "ptx"]


def _time_compile(fusion: kp.fusion, repeat: int) -> tuple[float, kp.Compiled]:
    times, compiled = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        compiled = kp.compile(fusion, targets=TARGETS)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), compiled  # type: ignore[return-value]


def _triton_first_compile() -> str:
    """Seconds for Triton's first compile of a pointwise gelu kernel (empty cache), or why not."""
    import tempfile

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kp-triton-cache-")  # a cold cache
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError as exc:
        return f"not measured: {exc.name} is not importable here"
    if not torch.cuda.is_available():
        return "not measured: Triton needs a GPU to compile for"

    @triton.jit
    def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
        tl.store(out_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)

    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    t0 = time.perf_counter()
    gelu_kernel[(4,)](x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    return f"{time.perf_counter() - t0:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()

    t0 = time.perf_counter()
    first = make(kp.float32)["axpy"]
    kp.compile(first, targets=TARGETS)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    kp.compile(make(kp.float32)["gelu"], targets=TARGETS)  # first libdevice user: parses it
    libdevice_first = time.perf_counter() - t0

    rows = []
    for dt in (kp.float32, kp.float64):
        for name, fusion in make(dt).items():
            seconds, compiled = _time_compile(fusion, args.repeat)
            module = compiled.modules[0]
            sizes = {i.target: len(i.data) for i in module.images}
            rows.append({"workload": name, "dtype": dt.name, "ms": round(seconds * 1e3, 1),
                         "kernels": len(module.kernels), "variants": len(compiled.summary.variants),
                         "ptx_bytes": sizes.get("compute_80", 0),
                         "cubin_sm80": sizes.get("sm_80", 0), "cubin_sm90": sizes.get("sm_90", 0)})
    triton = _triton_first_compile()
    if args.json:
        print(json.dumps({"setup_s": setup, "libdevice_first_s": libdevice_first,
                          "triton_first_compile_s": triton, "rows": rows}, indent=1))
        return
    lines = _section(rows, args.repeat, setup, libdevice_first, triton)
    print("\n".join(lines))
    if not args.no_write:
        _write_results(lines)


BEGIN, END = "<!-- benchmarks/compile.py: begin -->", "<!-- benchmarks/compile.py: end -->"


def _section(rows: list[dict], repeat: int, setup: float, libdevice_first: float,
             triton: str) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    lines = [BEGIN, "## kp.compile time and image sizes (CPU, `benchmarks/compile.py`)", "",
             f"Command: `python benchmarks/compile.py --repeat {repeat}` — {when}, {machine}.",
             "Each row is a full cold compile (trace → schedule → LLVM IR → LLVM O3 + PTX for the "
             "lowest arch → nvJitLink for sm_80 and sm_90 side by side, PTX image kept), no "
             "kernelpack cache, the CUDA compute cache off (`CUDA_CACHE_DISABLE=1`: nvJitLink "
             f"13.0 would answer the repeats from it), median of {repeat}.", "",
             f"First compile of the process (imports, NVPTX init): {setup * 1e3:.0f} ms; first "
             f"libdevice user (parses libdevice once): {libdevice_first * 1e3:.0f} ms.  ",
             f"Triton first compile of the same gelu (fresh cache, includes launch): {triton} s.",
             "", "| workload | dtype | ms | kernels | variants | PTX B | sm_80 cubin B | sm_90 cubin B |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['dtype']} | {r['ms']} | {r['kernels']} | "
                     f"{r['variants']} | {r['ptx_bytes']} | {r['cubin_sm80']} | {r['cubin_sm90']} |")
    gelu = next(r["ms"] for r in rows if r["workload"] == "gelu" and r["dtype"] == "float32")
    try:
        ratio = f"{float(triton) * 1e3 / gelu:.1f}x"
    except ValueError:
        ratio = "not measured"
    lines += ["", f"Target: <= 100 ms for a pointwise fusion and >= 10x faster than Triton's first "
              f"compile of the same kernel (gelu float32: Triton / kernelpack = {ratio}). Row "
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
