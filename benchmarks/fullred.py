"""Full reductions on the GPU (every axis reduced), with scalar and with input-long outputs,
against PyTorch eager on the same inputs.

``x / x.sum()`` and ``(x - mean) / rms`` reduce the whole vector and then write an output as
long as it: partial passes over a grid, a combine kernel per level that stores the finished
values, then a pointwise grid that loads them (``lowering/fullred.py``). ``x.sum()`` and the
variance end in one block instead. Every result is checked against float64 torch first
(relative error <= 1e-5 for float32, 1e-12 for float64), then timed (CUDA events, L2 flushed,
medians; ``_gpu_timing``). Bandwidth counts the minimum traffic the math needs, as
``rowsplit.py`` counts it: the input read once for a sum and for the variance (one pass can
accumulate the sum and the sum of squares), twice where the output is as long as the input and
depends on a full reduction (normalize, center: one pass for the reduction(s), one to write),
and each output written once; against this run's device-to-device copy. A kernel that makes
more passes (the variance's two, for accuracy) shows a lower fraction, not a higher count.

    python benchmarks/fullred.py [--quick] [--no-results] [--md FILE]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402

T = kp.Tensor
EPS = 1e-12
SIZES = [1 << 24, 1 << 26, 100_000_000]
# workload -> (reads of the input the math needs at least, output as long as the input)
TRAFFIC = {"sum": (1, False), "variance": (1, False), "normalize": (2, True),
           "center": (2, True)}


def fusions(dt: kp.DType) -> dict[str, Any]:
    @kp.fusion(name=f"sum_{dt.name}")
    def total(x: T[dt, "n"]):
        return x.sum()

    @kp.fusion(name=f"variance_{dt.name}")
    def variance(x: T[dt, "n"]):
        d = x - x.mean()
        return (d * d).mean()

    @kp.fusion(name=f"normalize_{dt.name}")
    def normalize(x: T[dt, "n"]):
        return x / x.sum()

    @kp.fusion(name=f"center_{dt.name}")
    def center(x: T[dt, "n"]):
        d = x - x.mean()
        return d * kp.rsqrt((d * d).mean() + EPS)

    return {"sum": total, "variance": variance, "normalize": normalize, "center": center}


def eager(name: str, x: Any) -> Callable[[], Any]:
    import torch

    def center() -> Any:
        d = x - x.mean()
        return d * torch.rsqrt((d * d).mean() + EPS)

    return {"sum": lambda: x.sum(), "variance": lambda: x.var(unbiased=False),
            "normalize": lambda: x / x.sum(), "center": center}[name]


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--quick", action="store_true", help="one size (2^26)")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--md", default=None, help="also write the section here (default "
                    "$OUT/fullred.md when $OUT is set)")
    args = ap.parse_args()
    from _gpu_timing import (RESULTS, append_results, copy_bandwidth, cuda_torch,
                             markdown_table, median_ms, rel_err, time_cell)

    torch = cuda_torch("fullred.py")
    if torch is None:
        return 0
    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}"
    copy_bw = copy_bandwidth()
    sizes = [1 << 26] if args.quick else SIZES
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        compiled = [kp.compile(f, targets=[target])
                    for dt in (kp.float32, kp.float64) for f in fusions(dt).values()]
        path = Path(tmp) / "fullred.kpack"
        kp.save(compiled, str(path))
        pack = kp.load(str(path))
        for dt, tdt, tol in ((kp.float32, torch.float32, 1e-5),
                             (kp.float64, torch.float64, 1e-12)):
            for n in sizes:
                gen = torch.Generator(device="cuda").manual_seed(n)
                x = torch.rand(n, device="cuda", dtype=tdt, generator=gen) + 0.5
                xd = x.double()
                for name, (passes, long_out) in TRAFFIC.items():
                    program = pack[f"{name}_{dt.name}"]
                    out = torch.empty_like(x) if long_out else torch.empty((), device="cuda",
                                                                           dtype=tdt)
                    ref = eager(name, xd)()
                    out.fill_(float("nan"))
                    program(x, out=out)
                    peer = eager(name, x)
                    for who, got in (("kernelpack", out), ("eager", peer())):
                        err = rel_err(got, ref)
                        if not err <= tol:
                            raise SystemExit(f"{who} {name} {dt.name} n={n}: relative error "
                                             f"{err:.2e} > {tol:g}")
                    nbytes = x.element_size() * n * (passes + long_out)
                    t_kp = median_ms(lambda: program(x, out=out), rep_ms=60, max_reps=400)
                    t_eager = median_ms(peer, rep_ms=60, max_reps=400)
                    traffic = f"{passes}R" + (" + 1W" if long_out else "")
                    rows.append([name, dt.name, f"{n:,}", traffic,
                                 time_cell(t_kp, nbytes, copy_bw),
                                 time_cell(t_eager, nbytes, copy_bw),
                                 f"{t_kp / t_eager:.2f}", f"{rel_err(out, ref):.1e}"])
                    print(" | ".join(rows[-1]), flush=True)
                del x, xd
                torch.cuda.empty_cache()
    body = [f"`python benchmarks/fullred.py{' --quick' if args.quick else ''}`: full "
            f"reductions of a vector of n uniform [0.5, 1.5) values, one artifact "
            f"(`kp.compile(..., targets=['{target}'])`), launched with `out=`; eager = "
            f"`x.sum()`, `x.var(unbiased=False)`, `x / x.sum()`, `d * rsqrt((d*d).mean() + "
            f"eps)` with `d = x - x.mean()`. Median CUDA-event times, L2 flushed; in "
            f"parentheses the minimum traffic the math needs ('min traffic': R = one read of "
            f"the input, W = one write of an output as long: a sum or a variance reads the "
            f"input once, normalize and center read it twice and write once) / time, against "
            f"this run's copy bandwidth ({copy_bw / 1e9:.0f} GB/s); a kernel that moves more "
            f"shows a lower fraction. Every result, eager's too, checked against float64 torch "
            f"first.", "",
            *markdown_table(["workload", "dtype", "n", "min traffic",
                             "kernelpack (ms, % copy bw at min traffic)",
                             "torch eager (ms, % copy bw at min traffic)", "kp / eager",
                             "kp rel err"], rows)]
    md = args.md or (os.path.join(os.environ["OUT"], "fullred.md") if os.environ.get("OUT")
                     else None)
    print(append_results("Full reductions (`benchmarks/fullred.py`)", body,
                         results=None if args.no_results else RESULTS, md_out=md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
