"""A row reduction read at other rows on the GPU: the symmetric normalization of a matrix,
against PyTorch eager.

``d = rsqrt(a.sum(-1)); a * d[:, None] * d[None, :]`` (D^-1/2 A D^-1/2, a graph Laplacian's
normalization) reads each row sum at its own row and, through ``d[None, :]``, at every other
row. A row kernel cannot keep such a value; the lowering used to put the stage on the general
schedule, where every element summed two whole rows (O(n^3) loads). It now computes the sums
once into a workspace (a row kernel) and a pointwise kernel reads them
(``lowering/pipeline._row_read_elsewhere``). This script compiles the fusion both ways in one
process (``materialize.ROWS_READ_ELSEWHERE`` True: now; False: before) and times them against
torch eager on the same inputs (CUDA events, L2 flushed, medians; ``_gpu_timing``), after
checking every result against float64 torch. The 'before' schedule is timed on the small
shapes only. Both builds are real compiles (``_compiles.py``) and must differ.

    python benchmarks/reads_elsewhere.py [--no-results] [--md FILE] [--dry-run]

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
SIZES = [512, 1024, 2048, 4096, 8192, 16384]
BEFORE_MAX = 2048  # n: the general schedule's n^3 loads are timed up to this size


@kp.fusion
def sym_norm(a: T[kp.f32, "n", "n"]):
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


def build_both(target: str, tmp: Path) -> tuple[Any, Any]:
    """'now' and 'before' programs (``materialize.ROWS_READ_ELSEWHERE`` True and False);
    stops when the two builds are the same code."""
    return now_and_before(sym_norm, materialize, "ROWS_READ_ELSEWHERE", target, tmp,
                          "reads_elsewhere.py sym_norm: now vs before")


def main() -> int:
    from _cli import comparison_args

    args = comparison_args(__doc__, "reads_elsewhere")
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            build_both("sm_90", Path(tmp))
        print("reads_elsewhere.py dry run: now and before builds differ")
        return 0
    from _gpu_timing import (RESULTS, append_results, copy_bandwidth, cuda_torch,
                             markdown_table, median_ms, rel_err, time_cell)

    torch = cuda_torch("reads_elsewhere.py")
    if torch is None:
        return 0

    def eager(a: Any) -> Any:
        d = torch.rsqrt(a.sum(-1))
        return a * d[:, None] * d[None, :]

    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}"
    copy_bw = copy_bandwidth()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        now, before = build_both(target, Path(tmp))
        for n in SIZES:
            gen = torch.Generator(device="cuda").manual_seed(n)
            a = torch.rand(n, n, device="cuda", generator=gen) + 0.5
            ref = eager(a.double())
            nbytes = 2 * a.numel() * 4  # the matrix read once and the result written
            cells = {}
            for name, fn in (("now", lambda: now(a)), ("before", lambda: before(a)),
                             ("eager", lambda: eager(a))):
                if name == "before" and n > BEFORE_MAX:
                    continue
                err = rel_err(fn(), ref)
                if not err <= 1e-5:
                    raise SystemExit(f"{name} n={n}: relative error {err:.2e}")
                cells[name] = median_ms(fn, rep_ms=50, max_reps=300)
            rows.append([f"{n}x{n}", f"{nbytes / 2**20:.0f}",
                         time_cell(cells["now"], nbytes, copy_bw),
                         f"{cells['before']:.3f} ms" if "before" in cells else "(not timed)",
                         time_cell(cells["eager"], nbytes, copy_bw),
                         f"{cells['before'] / cells['now']:.0f}x" if "before" in cells else "",
                         f"{cells['now'] / cells['eager']:.2f}"])
            print(rows[-1], flush=True)
    body = [f"`python benchmarks/reads_elsewhere.py`: `d = rsqrt(a.sum(-1)); a * d[:, None] * "
            f"d[None, :]` for float32 (n, n), one fusion (`kp.compile(..., targets=['{target}"
            f"'])`); 'now' = the row sums as a workspace (a row kernel, then a pointwise one); "
            f"'before' = the general schedule (`materialize.ROWS_READ_ELSEWHERE = False`), "
            f"timed up to n = {BEFORE_MAX}; eager = the same three torch lines. Median "
            f"CUDA-event times, L2 flushed; in parentheses the matrix read and the result "
            f"written once / time against this run's copy bandwidth ({copy_bw / 1e9:.0f} GB/s). "
            f"Every result checked against float64 torch (relative error <= 1e-5) first. Both "
            f"builds are real compiles (kp.compile's memo emptied) and differ.", "",
            *markdown_table(["shape", "MiB moved", "kernelpack now", "kernelpack before",
                             "torch eager", "before / now", "now / eager"], rows)]
    print(append_results("A row reduction read at other rows (`benchmarks/reads_elsewhere.py`)",
                         body, results=None if args.no_results else RESULTS, md_out=args.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
