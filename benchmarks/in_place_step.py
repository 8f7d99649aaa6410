"""An optimizer step in place on the GPU: kernelpack with and without format 1.1's
``stores_after_loads``, against PyTorch eager's in-place ops.

``m = beta * m + g; p = p - lr * m`` as one fusion with two outputs, called with
``out=(p, m)`` over its own inputs. Since session 40 the pointwise kernel computes every output
of an element before storing any and says so (``Launch.stores_after_loads``), and the call runs
in place; before, the runtime's rule of a launch storing two arrays made every such call read
``p`` and ``m`` from copies made first (session 39; a LaunchError before that), on the general
path. Both are timed in one process from one compile: 'before' is the same program with the
flag cleared in its summary (what an artifact of the session-39 lowering says). Peer: torch
eager, ``m.mul_(beta).add_(g); p.add_(m, alpha=-lr)`` (two kernels). Each method's result is
checked against a float64 step first. Device times are CUDA-event medians with L2 flushed
(``_gpu_timing``); the host column times 1000 back-to-back calls at a small size, then a sync.

    python benchmarks/in_place_step.py [--no-results] [--md FILE] [--dry-run]

``--dry-run`` needs no GPU: it builds both programs for sm_90 and checks that they differ as
described (and that 'before' copies where 'now' does not).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402

T = kp.Tensor
SIZES = [1 << 20, 1 << 24, 1 << 26]  # float32 elements per array
HOST_N = 4096
LR, BETA = 0.01, 0.9


@kp.fusion
def momentum_step(p: T[kp.f32, "n"], m: T[kp.f32, "n"], g: T[kp.f32, "n"], lr: kp.f32,
                  beta: kp.f32):
    m_new = beta * m + g
    return p - lr * m_new, m_new


def build_both(target: str) -> tuple[Any, Any]:
    """'now' (the lowering's summary) and 'before' (``stores_after_loads`` cleared), each
    saved and loaded as a user would; stops unless 'before' copies ``p`` and ``m`` where
    'now' copies nothing."""
    from kernelpack.runtime.in_place import refused_in_variant

    now = kp.compile(momentum_step, targets=[target])
    summary = now.summary
    old = dataclasses.replace(summary, variants=tuple(
        dataclasses.replace(v, launches=tuple(dataclasses.replace(ln, stores_after_loads=False)
                                              for ln in v.launches))
        for v in summary.variants))
    before = kp.Compiled(old, now.modules)
    pairs = {("out0", "p"), ("out1", "m")}
    if pairs & set(refused_in_variant(summary, 0)) or not pairs <= set(
            refused_in_variant(old, 0)):
        raise SystemExit("in_place_step.py: 'now' should copy nothing and 'before' p and m")
    pack = kp.load(kp.save([now]))
    old_pack = kp.load(kp.save([before]))
    return pack["momentum_step"], old_pack["momentum_step"]


def main() -> int:
    from _cli import comparison_args

    args = comparison_args(__doc__, "in_place_step")
    if args.dry_run:
        build_both("sm_90")
        print("in_place_step.py dry run: 'now' runs in place, 'before' copies p and m")
        return 0
    from _gpu_timing import (RESULTS, append_results, copy_bandwidth, cuda_torch,
                             markdown_table, median_ms, per_call_us, rel_err, time_cell)

    torch = cuda_torch("in_place_step.py")
    if torch is None:
        return 0
    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}"
    now, before = build_both(target)

    def eager(p: Any, m: Any, g: Any) -> None:
        m.mul_(BETA).add_(g)
        p.add_(m, alpha=-LR)

    methods = {"now": lambda p, m, g: now(p, m, g, LR, BETA, out=(p, m)),
               "before": lambda p, m, g: before(p, m, g, LR, BETA, out=(p, m)),
               "eager": eager}
    copy_bw = copy_bandwidth()
    rows = []
    for n in SIZES:
        gen = torch.Generator(device="cuda").manual_seed(n)
        p0, m0, g = (torch.randn(n, device="cuda", generator=gen) for _ in range(3))
        m_ref = BETA * m0.double() + g.double()
        p_ref = p0.double() - LR * m_ref
        cells = {}
        for name, fn in methods.items():
            p, m = p0.clone(), m0.clone()
            fn(p, m, g)
            err = max(rel_err(p, p_ref), rel_err(m, m_ref))
            if not err <= 1e-6:
                raise SystemExit(f"{name} n={n}: relative error {err:.2e}")
            cells[name] = median_ms(lambda: fn(p, m, g), rep_ms=50, max_reps=300)
        nbytes = 5 * n * 4  # p, m, g read; p, m written
        rows.append([f"{n:,}", f"{nbytes / 2**20:.0f}", time_cell(cells["now"], nbytes, copy_bw),
                     time_cell(cells["before"], nbytes, copy_bw),
                     time_cell(cells["eager"], nbytes, copy_bw),
                     f"{cells['before'] / cells['now']:.2f}x",
                     f"{cells['now'] / cells['eager']:.2f}"])
        print(rows[-1], flush=True)
    p, m, g = (torch.randn(HOST_N, device="cuda") for _ in range(3))
    host = per_call_us({name: (lambda fn=fn: fn(p, m, g)) for name, fn in methods.items()},
                       torch.cuda.synchronize, calls=1000, reps=15)
    print({k: f"{v:.1f} µs" for k, v in host.items()}, flush=True)
    body = [f"`python benchmarks/in_place_step.py`: `m = {BETA} * m + g; p = p - {LR} * m` as "
            f"one float32 fusion with two outputs, called with `out=(p, m)` over its own "
            f"inputs (`kp.compile(..., targets=['{target}'])`); 'now' = format 1.1's "
            f"`stores_after_loads` (in place, no copy); 'before' = the same program with the "
            f"flag cleared (session 39: `p` and `m` read from copies, general path); eager = "
            f"`m.mul_(beta).add_(g); p.add_(m, alpha=-lr)`. Median CUDA-event times, L2 "
            f"flushed; in parentheses 5 arrays moved once / time against this run's copy "
            f"bandwidth ({copy_bw / 1e9:.0f} GB/s). Every method checked against a float64 "
            f"step first (relative error <= 1e-6).", "",
            *markdown_table(["n", "MiB moved", "kernelpack now", "kernelpack before",
                             "torch eager", "before / now", "now / eager"], rows), "",
            f"Host time per call at n = {HOST_N} (1000 calls back to back, then a sync; "
            f"median of 15 rounds): " + ", ".join(f"{k} {v:.1f} µs" for k, v in host.items())
            + "."]
    print(append_results("An optimizer step in place (`benchmarks/in_place_step.py`)", body,
                         results=None if args.no_results else RESULTS, md_out=args.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
