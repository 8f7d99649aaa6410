"""Losses averaged over a batch on the GPU: a mean of per-row reductions, against PyTorch eager.

A cross-entropy mean reduces per-row reductions (log-sum-exp, the picked logit) again over
the batch. The lowering used to put such a program on the general schedule, whose one output
element got one GPU thread, which then ran every row's reductions as well: the whole (b, v)
work on a single thread. The inner reductions are now workspaces computed by row kernels and
the mean a full reduction over them (``lowering/materialize.py``). This script compiles the
fusion both ways in one process (``materialize.NESTED`` True: now; False: before) and times
them against ``torch.nn.functional.cross_entropy`` on the same inputs (CUDA events, L2 flushed,
medians; ``_gpu_timing``), after checking every result against float64 torch. The 'before'
schedule is timed on the small shapes only (a (8192, 32000) call takes seconds on one thread).
Each build is a real compile (``kp.compile``'s per-process memo emptied around it, a counter
around the lowering; ``_compiles.py``), and the two builds must differ, or the script stops.

    python benchmarks/losses.py [--no-results] [--md FILE] [--dry-run]

``--dry-run`` needs no GPU: it builds both ways for sm_90 and checks that the builds differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from kernelpack.lowering import materialize  # noqa: E402
from _compiles import now_and_before  # noqa: E402

T = kp.Tensor
SHAPES = [(256, 1000), (1024, 4096), (8192, 32000), (65536, 1000), (1 << 20, 16)]
BEFORE_MAX = 1 << 22  # elements: the single-thread schedule is timed up to this size


@kp.fusion
def cross_entropy(x: T[kp.f32, "b", "v"], t: T[kp.i64, "b"]):
    m = x.max(axis=1, keepdims=True)
    lse = kp.log(kp.exp(x - m).sum(axis=1, keepdims=True)) + m
    picked = kp.where(kp.arange(x.shape[1])[None, :] == t[:, None], x, 0.0).sum(
        axis=1, keepdims=True)
    return (lse - picked).mean()


def build_both(target: str, tmp: Path) -> tuple[Any, Any]:
    """'now' and 'before' programs (``materialize.NESTED`` True and False); stops when the
    two builds are the same code."""
    return now_and_before(cross_entropy, materialize, "NESTED", target, tmp,
                          "losses.py cross_entropy: now vs before")


def main() -> int:
    from _cli import comparison_args

    args = comparison_args(__doc__, "losses")
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            build_both("sm_90", Path(tmp))
        print("losses.py dry run: now and before builds differ")
        return 0
    from _gpu_timing import (RESULTS, append_results, copy_bandwidth, cuda_torch,
                             markdown_table, median_ms, rel_err, time_cell)

    torch = cuda_torch("losses.py")
    if torch is None:
        return 0
    import torch.nn.functional as F

    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}"
    copy_bw = copy_bandwidth()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        now, before = build_both(target, Path(tmp))
        for b, v in SHAPES:
            gen = torch.Generator(device="cuda").manual_seed(b * 7 + v)
            x = torch.randn(b, v, device="cuda", generator=gen) * 3
            t = torch.randint(0, v, (b,), device="cuda", generator=gen)
            ref = F.cross_entropy(x.double(), t)
            nbytes = x.numel() * 4 + t.numel() * 8
            cells = {}
            for name, fn in (("now", lambda: now(x, t)),
                             ("before", lambda: before(x, t)),
                             ("eager", lambda: F.cross_entropy(x, t))):
                if name == "before" and b * v > BEFORE_MAX:
                    continue
                err = rel_err(fn().reshape(()), ref)
                if not err <= 1e-5:
                    raise SystemExit(f"{name} {b}x{v}: relative error {err:.2e}")
                cells[name] = median_ms(fn, rep_ms=50, max_reps=300)
            rows.append([f"{b}x{v}", f"{nbytes / 2**20:.0f}",
                         time_cell(cells["now"], nbytes, copy_bw),
                         f"{cells['before']:.3f} ms" if "before" in cells else "(not timed)",
                         time_cell(cells["eager"], nbytes, copy_bw),
                         f"{cells['before'] / cells['now']:.1f}x" if "before" in cells else "",
                         f"{cells['now'] / cells['eager']:.2f}"])
            print(rows[-1], flush=True)
    body = [f"`python benchmarks/losses.py`: cross-entropy mean of float32 logits (b, v) with "
            f"int64 labels, one fusion (`kp.compile(..., targets=['{target}'])`); 'now' = the "
            f"inner reductions as workspaces and the mean on a grid; 'before' = the general "
            f"schedule (`materialize.NESTED = False`), timed up to {BEFORE_MAX:,} elements; eager "
            f"= `F.cross_entropy(x, t)`. Median CUDA-event times, L2 flushed; in parentheses "
            f"bytes read once / time against this run's copy bandwidth "
            f"({copy_bw / 1e9:.0f} GB/s). Every result checked against float64 torch "
            f"(relative error <= 1e-5) first. Both builds are real compiles (kp.compile's memo "
            f"emptied) and differ.", "",
            *markdown_table(["shape", "MiB read", "kernelpack now", "kernelpack before",
                             "torch eager", "before / now", "now / eager"], rows)]
    print(append_results("Losses averaged over a batch (`benchmarks/losses.py`)", body,
                         results=None if args.no_results else RESULTS, md_out=args.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
