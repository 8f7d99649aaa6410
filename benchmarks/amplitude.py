"""Amplitude encoding on the GPU: rows padded to a much longer output, before and after
``lowering/longrows.py``, against PyTorch eager.

The amplitude encoding (``lowering/workloads.py``; math in the shared qdp-workloads notes)
normalizes each row of ``v`` (b, l) and writes it, zero-padded, into a complex row of
``1 << n`` amplitudes. Before ``longrows.py`` the row schedule was chosen from the reduced
length ``l`` alone, so one warp or one block wrote each whole output row: at b = 1, l = 1000,
n = 20, 32 threads wrote 2^20 amplitudes. Now long output rows get a reduction stage and a
pointwise stage over the whole output. This script compiles the workload twice in one
process, as ``kp.compile`` does now and with ``longrows.OUT_PER_THREAD`` raised past any
shape (every row fused into one kernel: what ran before), and times both and PyTorch eager
on the same inputs (CUDA events, L2 flushed, medians; ``_gpu_timing``). Results are checked
against float64/complex128 torch before timing. Each build is a real compile (``kp.compile``'s
per-process memo emptied around it, a counter around the lowering; ``_compiles.py``), and the
two builds must differ for each dtype, or the script stops.

    python benchmarks/amplitude.py [--quick] [--no-results] [--dry-run]

``--dry-run`` needs no GPU: it builds both ways for sm_90 and checks that the builds differ.

Bandwidth: bytes read (v) + written (the complex output) once / time, as a fraction of the
device-to-device copy bandwidth of the same run.
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
from _compiles import CompileCounter, fresh_compile, must_differ  # noqa: E402
from _gpu_timing import (RESULTS, append_results, copy_bandwidth,  # noqa: E402
                         cuda_torch, markdown_table, median_ms, rel_err, time_cell)

# (b, l, n): long padded rows (the fix), and shapes the fix must leave alone
SHAPES = [(1, 1000, 20), (1, 1 << 20, 20), (128, 1000, 20), (16, 1000, 16), (128, 1024, 10),
          (4096, 256, 8)]
QUICK = [(1, 1000, 20), (128, 1000, 20), (4096, 256, 8)]
DTYPES = ("float32", "float64")


def build(after: bool, workdir: Path, tag: str,
          target: str | None = None) -> tuple[Any, list[Any]]:
    """The amplitude workload for both dtypes, compiled for ``target`` (default: this GPU),
    with or without the long-row stages, each a real compile; the loaded pack and the
    compiled programs."""
    from kernelpack.lowering import longrows, workloads

    if target is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        target = f"sm_{major}{minor}"
    saved = longrows.OUT_PER_THREAD
    longrows.OUT_PER_THREAD = saved if after else 1 << 40
    try:
        with CompileCounter() as counter:
            compiled = [fresh_compile(workloads.make(getattr(kp, d))["amplitude"], counter,
                                      targets=[target]) for d in DTYPES]
    finally:
        longrows.OUT_PER_THREAD = saved
    path = workdir / f"amplitude_{tag}.kpack"
    kp.save(compiled, str(path))
    return kp.load(str(path)), compiled


def build_both(workdir: Path, target: str | None = None) -> dict[str, Any]:
    """'after' and 'before' packs; stops when a dtype's two builds are the same code."""
    after, after_c = build(True, workdir, "after", target)
    before, before_c = build(False, workdir, "before", target)
    for dname, a, b in zip(DTYPES, after_c, before_c):
        must_differ(a, b, f"amplitude.py {dname}: after vs before")
    return {"after": after, "before": before}


def _eager(torch: Any, v: Any, n: int) -> Any:
    ctype = torch.complex64 if v.dtype == torch.float32 else torch.complex128
    out = torch.zeros((v.shape[0], 1 << n), dtype=ctype, device=v.device)
    out[:, :v.shape[1]] = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return out


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build both ways for sm_90 and check that they differ")
    args = ap.parse_args()
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            build_both(Path(tmp), "sm_90")
        print(f"amplitude.py dry run: after and before builds differ ({', '.join(DTYPES)})")
        return 0
    torch = cuda_torch("amplitude.py")
    if torch is None:
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        packs = build_both(Path(tmp))
        copy_bw = copy_bandwidth()
        for dname in DTYPES:
            dtype = getattr(torch, dname)
            for b, l, n in (QUICK if args.quick else SHAPES):
                gen = torch.Generator(device="cuda").manual_seed(b * 7919 + l * 31 + n)
                v = torch.randn((b, l), device="cuda", dtype=dtype, generator=gen)
                ref = _eager(torch, v.double(), n)
                t = {}
                for kind in ("after", "before"):
                    prog = packs[kind][f"amplitude_{dname}"]
                    err = rel_err(prog(v, n), ref)
                    if not err <= (1e-5 if dname == "float32" else 1e-12):
                        raise SystemExit(f"amplitude {dname} {(b, l, n)} {kind}: relative "
                                         f"error {err:.2e}")
                    t[kind] = median_ms(lambda p=prog, v=v: p(v, n), rep_ms=50, max_reps=200)
                t["eager"] = median_ms(lambda v=v: _eager(torch, v, n), rep_ms=50,
                                       max_reps=200)
                nbytes = b * l * v.element_size() + b * (1 << n) * 2 * v.element_size()
                cells = [time_cell(t[k], nbytes, copy_bw, 3)
                         for k in ("after", "before", "eager")]
                rows.append([dname, f"({b}, {l}, {n})", *cells,
                             f"{t['before'] / t['after']:.1f}x",
                             f"{t['after'] / t['eager']:.2f}"])
                print(" | ".join(rows[-1]), flush=True)
                del v, ref
    body = [
        "`python benchmarks/amplitude.py`: amplitude encoding (normalize each row of v (b, l), "
        "zero-pad to 1 << n complex amplitudes). 'after' is the code as compiled now "
        "(lowering/longrows.py: long output rows get a reduction stage and a pointwise stage "
        "over the whole output); 'before' the same workload with every row fused into one "
        "kernel (longrows.OUT_PER_THREAD raised past any shape: what ran before); eager: "
        "`zeros` + `v / vector_norm(v)` into the first l columns. Cells: median time (CUDA "
        "events, L2 flushed) and bytes read + written once / time as a fraction of this run's "
        f"copy bandwidth ({copy_bw / 1e9:.0f} GB/s). Every result checked against complex128 "
        "torch (relative error <= 1e-5 float32, 1e-12 float64) before timing. Both builds are "
        "real compiles (kp.compile's memo emptied) and differ for each dtype.",
        "",
        *markdown_table(["dtype", "(b, l, n)", "after", "before", "torch eager",
                         "before / after", "after / eager"], rows),
    ]
    section = append_results("Amplitude encoding, long padded rows (`benchmarks/amplitude.py`)",
                             body, results=None if args.no_results else RESULTS)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
