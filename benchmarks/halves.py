"""Half-precision fusions on the GPU: kernelpack float16/bfloat16 against PyTorch eager.

Each workload runs in float16 and bfloat16 through kernelpack and through PyTorch eager in the
same dtype, and through kernelpack's own float32 kernel of the same math.

float16/bfloat16 compute in float32 and round after every operation (NumPy's float16 result;
the same rule for bfloat16), so their kernels do more per element than float32's while moving
half the bytes. This table shows what that costs: time, bandwidth as a fraction of the
device-to-device copy measured in the same run, the ratio to eager, and the error against a
float64 reference of the same rounded inputs. Every result, eager's too, is checked against
that reference before timing, within three units of the dtype's rounding (2^-11 float16, 2^-8
bfloat16: the largest error seen on the H200, softmax, is ~1.15 units for either half dtype,
so 3 units leave a margin of ~2.6x); float32 within 1e-5.

    python benchmarks/halves.py [--quick] [--reps N] [--no-write] [--md FILE]

Workloads (n = 2^27 elements, rows 8192 x 8192; --quick: 2^25 and 4096 x 4096): gelu (tanh
form) + y, x * sigmoid(x) * y (silu-gated), a * x + y, softmax over the last axis, rmsnorm
with a weight. Appends its table to benchmarks/RESULTS.md (device, driver, date).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import _gpu_timing as gt  # noqa: E402

import kernelpack as kp  # noqa: E402

GELU_C = 0.7978845608028654
# Normwise relative error allowed against float64: three units of the dtype's rounding. The
# H200 runs of 2026-11-25 saw at most 5.6e-4 float16 (softmax; 1.15 units of 2^-11) and 4.5e-3
# bfloat16 (softmax; 1.15 units of 2^-8), the other workloads 0.55-0.8 units; the old bounds
# (5e-3, 4e-2) were ~10x what was seen and would have passed a kernel off by several ulps.
TOLERANCE = {"float16": 3 * 2.0 ** -11, "bfloat16": 3 * 2.0 ** -8, "float32": 1e-5}


def fusions(dt: kp.DType) -> dict[str, Any]:
    """The workloads in ``dt``, by name."""

    @kp.fusion(name=f"gelu_{dt.name}")
    def gelu(x: kp.Tensor[dt, "n"], y: kp.Tensor[dt, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(GELU_C * (x + 0.044715 * x * x * x))) + y

    @kp.fusion(name=f"silu_{dt.name}")
    def silu(x: kp.Tensor[dt, "n"], y: kp.Tensor[dt, "n"]):
        return x * kp.sigmoid(x) * y

    @kp.fusion(name=f"axpy_{dt.name}")
    def axpy(x: kp.Tensor[dt, "n"], y: kp.Tensor[dt, "n"], a: dt):
        return a * x + y

    @kp.fusion(name=f"softmax_{dt.name}")
    def softmax(x: kp.Tensor[dt, "b", "n"]):
        e = kp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    @kp.fusion(name=f"rmsnorm_{dt.name}")
    def rmsnorm(x: kp.Tensor[dt, "b", "n"], w: kp.Tensor[dt, "n"]):
        return x * kp.rsqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * w

    return {"gelu": gelu, "silu": silu, "axpy": axpy, "softmax": softmax, "rmsnorm": rmsnorm}


def eager(torch: Any) -> dict[str, Callable[..., Any]]:
    f = torch.nn.functional
    return {"gelu": lambda x, y: f.gelu(x, approximate="tanh") + y,
            "silu": lambda x, y: f.silu(x) * y,
            "axpy": lambda x, y, a: torch.add(y, x, alpha=a),
            "softmax": lambda x: torch.softmax(x, -1),
            "rmsnorm": lambda x, w: f.rms_norm(x, (x.shape[-1],), w, 1e-6)}


def reference(torch: Any, name: str, args: tuple) -> Any:
    """The workload in float64 on the (already rounded) inputs."""
    wide = [a.double() if hasattr(a, "double") else a for a in args]
    if name == "gelu":
        x, y = wide
        return 0.5 * x * (1.0 + torch.tanh(GELU_C * (x + 0.044715 * x ** 3))) + y
    if name == "silu":
        x, y = wide
        return x * torch.sigmoid(x) * y
    if name == "axpy":
        x, y, a = wide
        return a * x + y
    if name == "softmax":
        return torch.softmax(wide[0], -1)
    x, w = wide
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def main() -> None:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--reps", type=int, default=3, help="rounds of medians (median kept)")
    ap.add_argument("--no-write", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--md", default=None, help="also write the section to this file "
                                               "(default $OUT/halves.md when $OUT is set)")
    args = ap.parse_args()
    torch = gt.cuda_torch("halves.py")
    if torch is None:
        return
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm_{major}{minor}"
    n = 1 << (25 if args.quick else 27)
    rows = 4096 if args.quick else 8192
    copy_bw = gt.copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(7)
    programs = {}
    for dt in (kp.f16, kp.bf16, kp.f32):
        pack = kp.load(kp.save([kp.compile(f, targets=[arch]) for f in fusions(dt).values()]))
        programs[dt.name] = {name: pack[f"{name}_{dt.name}"] for name in fusions(dt)}
    peers = eager(torch)
    table = []
    for name in ("gelu", "silu", "axpy", "softmax", "rmsnorm"):
        if name in ("softmax", "rmsnorm"):
            base = [torch.randn(rows, rows, device="cuda", generator=gen),
                    torch.rand(rows, device="cuda", generator=gen) + 0.5]
        else:
            base = [torch.randn(n, device="cuda", generator=gen),
                    torch.randn(n, device="cuda", generator=gen)]
        times: dict[str, float] = {}
        for tname, tdt in (("float16", torch.float16), ("bfloat16", torch.bfloat16),
                           ("float32", torch.float32)):
            inputs = tuple(b.to(tdt) for b in base)
            if name == "softmax":
                inputs = inputs[:1]
            call_args = inputs + ((1.5,) if name == "axpy" else ())
            prog = programs[tname][name]
            ref = reference(torch, name, call_args)
            got = prog(*call_args)
            err = gt.rel_err(got, ref)
            eager_err = None
            if tname != "float32":  # the peer is timed: its result is checked alike
                eager_got = peers[name](*call_args)
                eager_err = gt.rel_err(eager_got, ref)
                if eager_got.dtype != got.dtype or tuple(eager_got.shape) != tuple(got.shape):
                    raise SystemExit(f"halves.py: {name} {tname}: eager gives "
                                     f"{eager_got.dtype} {tuple(eager_got.shape)}, kernelpack "
                                     f"{got.dtype} {tuple(got.shape)}")
                del eager_got
            for who, e in (("kernelpack", err), ("torch eager", eager_err)):
                if e is not None and not e <= TOLERANCE[tname]:  # NaN fails too
                    raise SystemExit(f"halves.py: {name} {tname} {who}: relative error "
                                     f"{e:.2e} above {TOLERANCE[tname]:.1e}")
            del ref
            moved = sum(t.numel() * t.element_size() for t in inputs) + got.numel() * got.element_size()
            kp_ms = statistics.median(gt.median_ms(lambda: prog(*call_args))
                                      for _ in range(args.reps))
            times[tname] = kp_ms
            if tname == "float32":
                continue
            eager_ms = statistics.median(gt.median_ms(lambda: peers[name](*call_args))
                                         for _ in range(args.reps))
            table.append([name, tname, gt.time_cell(kp_ms, moved, copy_bw),
                          gt.time_cell(eager_ms, moved, copy_bw), f"{kp_ms / eager_ms:.2f}",
                          f"{err:.1e}", f"{eager_err:.1e}"])
        for row in table[-2:]:
            row.append(f"{times[row[1]] / times['float32']:.2f}")
    headers = ["workload", "dtype", "kernelpack", "torch eager", "kp/eager", "kp rel err",
               "eager rel err", "kp / kp float32"]
    body = [f"`python benchmarks/halves.py{' --quick' if args.quick else ''}`; torch "
            f"{torch.__version__}; kernelpack compiled for {arch}. n = {n:,}, rows {rows} x "
            f"{rows}. Copy bandwidth in this run: **{copy_bw / 1e9:.0f} GB/s** (read + write). "
            "Cells: median time (CUDA events, L2 flushed) and bytes read + written once / time "
            "as a fraction of the copy bandwidth. 'kp rel err' / 'eager rel err': normwise "
            "against float64 on the same rounded inputs (the half dtype's own rounding "
            "included), both checked before timing within "
            f"{TOLERANCE['float16']:.1e} float16, {TOLERANCE['bfloat16']:.1e} bfloat16 (three "
            "units of the dtype's rounding). 'kp / kp float32': "
            "time against kernelpack's float32 kernel of the same math (twice the bytes).", "",
            *gt.markdown_table(headers, table, "llrrrrrr")]
    md = args.md or (os.path.join(os.environ["OUT"], "halves.md") if os.environ.get("OUT")
                     else None)
    section = gt.append_results("Half-precision fusions (`benchmarks/halves.py`)", body,
                                results=None if args.no_write else gt.RESULTS, md_out=md)
    print(section)


if __name__ == "__main__":
    main()
