"""Sweep of the column split schedule's constants on a GPU (notes/column-perf.md):
``python benchmarks/_columns_sweep.py``. Each configuration patches
``kernelpack.lowering.columns`` before compiling a column sum; results are checked against
float64 torch, then timed (``_gpu_timing.median_ms``) against ``x.sum(0)``."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import torch  # noqa: E402

import kernelpack as kp  # noqa: E402
from kernelpack.lowering import columns  # noqa: E402
from _gpu_timing import median_ms, rel_err  # noqa: E402

T = kp.Tensor


def colsum_of(dt):  # type: ignore[no-untyped-def]
    @kp.fusion(name=f"colsum_{dt.name}")
    def colsum(x: T[dt, "a", "b"]):
        return x.sum(axis=0)

    return colsum


SHAPES = [(100_000, 64), (1_000_000, 16), (8192, 8192), (65536, 1024), (2048, 32768)]
major, minor = torch.cuda.get_device_capability()
gen = torch.Generator(device="cuda").manual_seed(0)
inputs = {(s, d): torch.randn(s, device="cuda", dtype=d, generator=gen)
          for s in SHAPES for d in (torch.float32, torch.float64)}
print("eager:", {f"{s}/{str(d)[6:]}": round(median_ms(lambda x=x: x.sum(0)), 4)
                 for (s, d), x in inputs.items()}, flush=True)
for target, unroll, vector in itertools.product((1 << 18, 1 << 19), (2, 4), (True, False)):
    columns.TARGET_THREADS, columns.UNROLL, columns.VECTOR = target, unroll, vector
    progs = {d: kp.load(kp.save([kp.compile(colsum_of(kd), targets=[f"sm_{major}{minor}"])]))
             [f"colsum_{kd.name}"] for d, kd in ((torch.float32, kp.f32), (torch.float64, kp.f64))}
    row = []
    for (s, d), x in inputs.items():
        p = progs[d]
        err = rel_err(p(x), x.double().sum(0))
        assert err < (1e-6 if d == torch.float32 else 1e-13), (s, d, err)
        row.append(f"{s}/{str(d)[6:]} {median_ms(lambda p=p, x=x: p(x)):.4f}")
    print(f"target 2^{target.bit_length() - 1} unroll {unroll} vector {vector}: " + "; ".join(row),
          flush=True)
