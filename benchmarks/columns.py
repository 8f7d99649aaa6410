"""Column reductions on the GPU: the split schedule against the general one and PyTorch eager.

``x.sum(axis=0)`` and friends reduce leading axes, so they are not rows. Before
``lowering/columns.py`` they ran on the general schedule, one thread per output element
looping over its column; now a split kernel and a final kernel take them where the shapes
give enough splits. This script compiles each workload twice in one process: as
``kp.compile`` does now, and with the split schedule switched off (``columns.SPLIT_MIN``
raised past any shape: what the general schedule did before), and times both against
PyTorch eager on the same inputs (CUDA events, L2 flushed, medians with the same repetition
settings for every method; ``_gpu_timing``). Every result, eager's too, is checked against
float64 torch before timing. Each build is a real compile (``kp.compile``'s per-process memo
emptied around it, a counter around the lowering; ``_compiles.py``), and the two builds of each
fusion must differ, or the script stops.

    python benchmarks/columns.py [--quick] [--no-results] [--dtype float32|float64] [--dry-run]

``--dry-run`` needs no GPU: it builds both ways for sm_90 and checks that the builds differ.

Workloads (float32, or float64 with ``--dtype float64``): a column sum, a column mean-and-centre (``x - x.mean(0)``: the mean is
materialized, then a pointwise pass) and a column standard deviation, on tall, square and
wide matrices. Bandwidth is bytes read + written once / time, as a fraction of the
device-to-device copy bandwidth of the same run.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from _compiles import CompileCounter, fresh_compile, must_differ  # noqa: E402
from _gpu_timing import (RESULTS, append_results, copy_bandwidth,  # noqa: E402
                         cuda_torch, markdown_table, median_ms, rel_err, time_cell)

T = kp.Tensor


def fusions(dt: Any) -> dict[str, Any]:
    """The three workloads over ``dt`` matrices (kp.f32 or kp.f64)."""
    @kp.fusion
    def colsum(x: T[dt, "a", "b"]):
        return x.sum(axis=0)

    @kp.fusion
    def colcentre(x: T[dt, "a", "b"]):
        return x - x.mean(axis=0, keepdims=True)

    @kp.fusion
    def colstd(x: T[dt, "a", "b"]):
        m = x.mean(axis=0, keepdims=True)
        return kp.sqrt(((x - m) * (x - m)).mean(axis=0))

    return {"colsum": colsum, "colcentre": colcentre, "colstd": colstd}


FUSIONS = tuple(fusions(kp.f32))
# (512, 65536) and (300, 70000): 4-19 splits per output (by dtype), which one thread combines;
# (100, 64) and (64, 4096): short columns, 7 and 4 splits (the general schedule below 4)
SHAPES = [(100_000, 64), (1_000_000, 16), (8192, 8192), (65536, 1024), (512, 65536),
          (300, 70000), (100, 64), (64, 4096)]
QUICK = [(100_000, 64), (8192, 8192)]
DTYPES = {"float32": (kp.f32, 4, 1e-5), "float64": (kp.f64, 8, 1e-12)}  # kp dtype, bytes, tol
TIMING = {"rep_ms": 50, "max_reps": 200}  # median_ms settings, the same for every method


def _eager(name: str, torch: Any) -> Callable[[Any], Any]:
    if name == "colsum":
        return lambda x: x.sum(0)
    if name == "colcentre":
        return lambda x: x - x.mean(0, keepdim=True)
    return lambda x: x.std(0, correction=0)


def _reference(name: str, x: Any) -> Any:
    xd = x.double()
    if name == "colsum":
        return xd.sum(0)
    if name == "colcentre":
        return xd - xd.mean(0, keepdim=True)
    return xd.std(0, correction=0)


def _bytes(name: str, shape: tuple[int, int], itemsize: int) -> int:
    a, b = shape
    read = a * b * itemsize * (2 if name != "colsum" else 1)  # two passes: the centred forms
    written = (a * b if name == "colcentre" else b) * itemsize
    return read + written


def build(split: bool, workdir: Path, tag: str, dt: Any,
          target: str | None = None) -> tuple[Any, list[Any]]:
    """The three fusions over ``dt`` compiled for ``target`` (default: this GPU), with or
    without the split schedule, each a real compile; the loaded pack and the compiled
    programs (for :func:`_compiles.must_differ`)."""
    from kernelpack.lowering import columns

    if target is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        target = f"sm_{major}{minor}"
    saved = columns.SPLIT_MIN
    columns.SPLIT_MIN = saved if split else 1 << 62
    try:
        with CompileCounter() as counter:
            compiled = [fresh_compile(f, counter, targets=[target])
                        for f in fusions(dt).values()]
    finally:
        columns.SPLIT_MIN = saved
    path = workdir / f"columns_{tag}.kpack"
    kp.save(compiled, str(path))
    return kp.load(str(path)), compiled


def build_both(workdir: Path, dt: Any, target: str | None = None) -> dict[str, Any]:
    """'split' and 'general' packs; stops when a fusion's two builds are the same code."""
    split, split_c = build(True, workdir, "split", dt, target)
    general, general_c = build(False, workdir, "general", dt, target)
    for name, a, b in zip(FUSIONS, split_c, general_c):
        must_differ(a, b, f"columns.py {name} {dt.name}: split vs general")
    return {"split": split, "general": general}


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                    help="element type of the matrices (default float32)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build both ways for sm_90 and check that they differ")
    args = ap.parse_args()
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            build_both(Path(tmp), DTYPES[args.dtype][0], "sm_90")
        print(f"columns.py dry run: split and general builds differ for {', '.join(FUSIONS)} "
              f"({args.dtype})")
        return 0
    torch = cuda_torch("columns.py")
    if torch is None:
        return 0
    dt, itemsize, tol = DTYPES[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        packs = build_both(Path(tmp), dt)
        copy_bw = copy_bandwidth()
        shapes = QUICK if args.quick else SHAPES
        times: dict[tuple, float] = {}
        # Two passes: the split kernels and torch first, the slow general kernels after, so
        # that no fast kernel is timed right after seconds of one-SM work (clocks, power);
        # each shape's input is drawn again from its own seed in the second pass.
        for kinds in (("split", "eager"), ("general",)):
            for shape in shapes:
                gen = torch.Generator(device="cuda").manual_seed(shape[0] * 7919 + shape[1])
                x = torch.randn(shape, device="cuda", dtype=getattr(torch, args.dtype),
                                generator=gen)
                for name in FUSIONS:
                    ref = _reference(name, x)
                    for kind in kinds:
                        fn = (_eager(name, torch) if kind == "eager" else packs[kind][name])
                        err = rel_err(fn(x), ref)
                        if not err <= tol:
                            raise SystemExit(f"{name} {shape} {kind}: relative error {err:.2e}")
                        t0 = time.perf_counter()
                        times[name, shape, kind] = median_ms(lambda p=fn, x=x: p(x), **TIMING)
                        print(f"{name} {shape} {kind}: {times[name, shape, kind]:.3f} ms "
                              f"(err {err:.1e}, {time.perf_counter() - t0:.1f} s)", flush=True)
                del x
        rows = []
        for shape in shapes:
            for name in FUSIONS:
                t = {k: times[name, shape, k] for k in ("split", "general", "eager")}
                nbytes = _bytes(name, shape, itemsize)
                cells = [time_cell(t[k], nbytes, copy_bw, 3)
                         for k in ("split", "general", "eager")]
                rows.append([name, f"{shape[0]}x{shape[1]}", *cells,
                             f"{t['general'] / t['split']:.1f}x",
                             f"{t['split'] / t['eager']:.2f}"])
    body = [
        f"`python benchmarks/columns.py --dtype {args.dtype}`; {args.dtype}. 'split' is the "
        "code as compiled now "
        "(lowering/columns.py); 'general' the same fusions compiled with the split schedule "
        "switched off (one thread per output element, what ran before), timed after every "
        "split and torch kernel. Cells: median time "
        "(CUDA events, L2 flushed; the same repetition settings for every method) and bytes "
        "read + written once / time as a fraction of the "
        f"copy bandwidth of this run ({copy_bw / 1e9:.0f} GB/s). Every result, torch eager's "
        f"too, checked against float64 torch (relative error <= {tol:g}) before timing. Both "
        "builds are real compiles (kp.compile's memo emptied) and differ for every fusion.",
        "",
        *markdown_table(["workload", "shape", "split", "general (before)", "torch eager",
                         "general / split", "split / eager"], rows),
    ]
    section = append_results("Column reductions (`benchmarks/columns.py`)", body,
                             results=None if args.no_results else RESULTS)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
