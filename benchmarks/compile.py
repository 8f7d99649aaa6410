"""Compile-time benchmark (CPU is enough): cold ``kp.compile`` per workload for sm_80 + sm_90 +
PTX, PTX/cubin sizes, and Triton's first compile of the same pointwise math when Triton (and a
GPU it can target) is present.

    PYTHONPATH=src python benchmarks/compile.py [--repeat 5] [--json]

"Cold" means a full compile with no kernelpack cache: trace, schedule, IR, LLVM O3 + PTX,
nvJitLink per architecture. Process-level set-up (importing llvmlite, registering NVPTX,
parsing libdevice once) is paid by the first compile of the process and reported separately.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

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
    """Seconds for Triton's first compile of a pointwise axpy+gelu kernel, or why not."""
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
    print(f"# kp.compile, targets {TARGETS}, median of {args.repeat}; "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"first compile of the process (imports, NVPTX init): {setup * 1e3:.0f} ms; "
          f"first libdevice user (parses libdevice once): {libdevice_first * 1e3:.0f} ms")
    print(f"Triton first compile of gelu (s): {triton}")
    print()
    print("| workload | dtype | ms | kernels | variants | PTX B | sm_80 cubin B | sm_90 cubin B |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['dtype']} | {r['ms']} | {r['kernels']} | {r['variants']} "
              f"| {r['ptx_bytes']} | {r['cubin_sm80']} | {r['cubin_sm90']} |")


if __name__ == "__main__":
    main()
