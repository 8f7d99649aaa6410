"""Few, long rows on the GPU: rows split across blocks against a block per row and PyTorch eager.

A row stage (softmax, layernorm, ``x.sum(-1)``, logsumexp) ran one block per row at most, so
a softmax of (1, 2^20) used one SM of 132. ``lowering/rowsplit.py`` now splits rows across
blocks where ``rows <= SPLIT_MAX_ROWS`` and ``length >= SPLIT_MIN_LENGTH``
(``lowering/schedule.py``). This script compiles each workload twice in one process: as
``kp.compile`` does now ('split'), and with ``tuning.ROW_SPLIT = False`` ('rows': the
schedules that ran before), and times both against PyTorch eager on the same inputs (CUDA
events, L2 flushed, medians; ``_gpu_timing``). Every result is checked against float64 torch
before timing. Every build is a real compile (``kp.compile``'s per-process memo emptied around
it, a counter around the lowering; ``_compiles.py``); 'split' and 'rows' must differ for every
fusion and the plans must take the split kernels exactly where the predicate says
(``check_plans``), and no two ``--sweep`` configurations may build the same code, or the
script stops.

    python benchmarks/rowsplit.py [--quick] [--sweep] [--no-results] [--md FILE] [--dry-run]

``--sweep`` instead tries a few values of the split's constants (chunk size, threads per
partial block, combine block) on the same shapes, then times split against rows across a grid
of (rows, length) to place ``SPLIT_MAX_ROWS`` and ``SPLIT_MIN_LENGTH``; it prints its tables
(and writes them to ``--md``) without touching RESULTS.md. ``--dry-run`` needs no GPU: it
compiles every fusion (both ways, and every sweep configuration) and checks from the plans
which shapes take the split kernels.

Bandwidth is bytes read + written once / time, as a fraction of the device-to-device copy
bandwidth of the same run (a split softmax reads its input three times: 4 passes of traffic
where the cell counts 2).
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from kernelpack.lowering import tuning  # noqa: E402
from _compiles import CompileCounter, artifact_digest, fresh_compile, must_differ  # noqa: E402

T = kp.Tensor
EPS = 1e-5


def _softmax(dt: kp.DType, name: str) -> Any:
    @kp.fusion(name=name)
    def softmax(x: T[dt, "b", "n"]):
        e = kp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return softmax


@kp.fusion
def layernorm(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], bias: T[kp.f32, "n"]):
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * kp.rsqrt(var + EPS) * w + bias


@kp.fusion
def rowsum(x: T[kp.f32, "b", "n"]):
    return x.sum(axis=-1)


@kp.fusion
def logsumexp(x: T[kp.f32, "b", "n"]):
    m = x.max(axis=-1)
    return kp.log(kp.exp(x - m[:, None]).sum(axis=-1)) + m


FUSIONS = {"softmax": _softmax(kp.f32, "softmax"), "layernorm": layernorm, "rowsum": rowsum,
           "logsumexp": logsumexp, "softmax_f64": _softmax(kp.f64, "softmax_f64")}
# (1024, 16384) and (257, 65536) lie just outside the predicate (too many rows)
SHAPES = [(1, 1 << 20), (1, 1 << 24), (4, 10 ** 7), (8, 10 ** 6), (16, 1 << 20),
          (64, 262144), (256, 65536), (257, 65536), (1024, 16384)]
QUICK = [(1, 1 << 20), (8, 10 ** 6), (256, 65536), (1024, 16384)]
# --sweep: (SPLIT_CHUNK, SPLIT_BLOCK, SPLIT_COMBINE_BLOCK); chunks multiples of block * UNROLL
CONFIGS = [(c, b, 256) for c, b in itertools.product((2048, 4096, 8192, 16384), (128, 256, 512))
           if c % (b * tuning.UNROLL) == 0] + [(4096, 256, 128), (4096, 256, 512)]
CROSS_ROWS = (32, 64, 128, 256, 512, 1024)
CROSS_LENGTHS = (8192, 16384, 32768, 65536, 262144)


def _inputs(torch: Any, name: str, shape: tuple[int, int]) -> tuple[Any, ...]:
    gen = torch.Generator(device="cuda").manual_seed(shape[0] * 7919 + shape[1])
    dt = torch.float64 if name.endswith("f64") else torch.float32
    x = torch.randn(shape, device="cuda", dtype=dt, generator=gen) * 3
    if name != "layernorm":
        return (x,)
    w = torch.randn(shape[1], device="cuda", dtype=dt, generator=gen)
    return x + 5, w, torch.randn(shape[1], device="cuda", dtype=dt, generator=gen)


def _eager(name: str, torch: Any) -> Callable[..., Any]:
    if name.startswith("softmax"):
        return lambda x: torch.softmax(x, -1)
    if name == "layernorm":
        return lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, EPS)
    if name == "rowsum":
        return lambda x: x.sum(-1)
    return lambda x: torch.logsumexp(x, -1)


def _reference(name: str, torch: Any, args: tuple[Any, ...]) -> Any:
    wide = tuple(a.double() for a in args)
    return _eager(name, torch)(*wide)


def _bytes(name: str, shape: tuple[int, int]) -> int:
    rows, n = shape
    item = 8 if name.endswith("f64") else 4
    if name in ("rowsum", "logsumexp"):
        return rows * n * item + rows * item
    return 2 * rows * n * item + (2 * n * item if name == "layernorm" else 0)


def _shape_args(name: str, shape: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    if name == "layernorm":
        return {"x": shape, "w": (shape[1],), "bias": (shape[1],)}
    return {"x": shape}


def _takes_split(name: str, shape: tuple[int, int]) -> bool:
    if name in ("rowsum", "logsumexp"):  # per-row outputs
        return shape[1] >= tuning.SPLIT_REDUCE_MIN_LENGTH \
            and shape[0] <= tuning.SPLIT_REDUCE_MAX_ROWS
    return shape[1] >= tuning.SPLIT_MIN_LENGTH and shape[0] <= tuning.SPLIT_MAX_ROWS


_BUILT: dict[str, list[Any]] = {}  # tag -> the compiled programs of build(..., tag)


def build(split: bool, targets: list[str], workdir: Path, tag: str,
          names: tuple[str, ...] = tuple(FUSIONS)) -> Any:
    """The fusions compiled for ``targets``, with or without the split alternative, each a
    real compile (the memo emptied around it); the loaded pack (the compiled programs are
    kept in ``_BUILT[tag]`` for :func:`_differ`)."""
    saved = tuning.ROW_SPLIT
    tuning.ROW_SPLIT = split
    try:
        with CompileCounter() as counter:
            compiled = [fresh_compile(FUSIONS[n], counter, targets=targets) for n in names]
    finally:
        tuning.ROW_SPLIT = saved
    _BUILT[tag] = compiled
    path = workdir / f"rowsplit_{tag}.kpack"
    kp.save(compiled, str(path))
    return kp.load(str(path))


def _differ(tag_a: str, tag_b: str, names: tuple[str, ...] = tuple(FUSIONS)) -> None:
    """SystemExit unless builds ``tag_a`` and ``tag_b`` differ for every fusion of ``names``."""
    for name, a, b in zip(names, _BUILT[tag_a], _BUILT[tag_b]):
        must_differ(a, b, f"rowsplit.py {name}: {tag_a} vs {tag_b}")


def _distinct_configs(tags: dict[tuple[int, int, int], str]) -> None:
    """SystemExit when two sweep configurations built the same code (all their fusions)."""
    seen: dict[str, tuple[int, int, int]] = {}
    for cfg, tag in tags.items():
        digest = artifact_digest(_BUILT[tag])
        if digest in seen:
            raise SystemExit(f"rowsplit.py --sweep: configurations {seen[digest]} and {cfg} "
                             f"(SPLIT_CHUNK, SPLIT_BLOCK, SPLIT_COMBINE_BLOCK) build the same "
                             f"code")
        seen[digest] = cfg


class _Patched:
    """Context manager: ``tuning``'s split constants set for a compile, then restored."""

    def __init__(self, **values: int) -> None:
        self.values, self.saved = values, {k: getattr(tuning, k) for k in values}

    def __enter__(self) -> None:
        for k, v in self.values.items():
            setattr(tuning, k, v)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            setattr(tuning, k, v)


def check_plans(packs: dict[str, Any], shapes: list[tuple[int, int]]) -> list[str]:
    """Which kernels each workload launches per shape; raises SystemExit when a plan does
    not take the split kernels exactly where the predicate holds (or takes them unsplit)."""
    lines = []
    for name, shape in itertools.product(FUSIONS, shapes):
        for kind, pack in packs.items():
            kernels = [launch.kernel for launch in pack[name].plan(**_shape_args(name, shape))
                       .launches]
            split = any("_split_" in k for k in kernels)
            if split != (kind == "split" and _takes_split(name, shape)):
                raise SystemExit(f"{name} {shape} {kind}: kernels {kernels}")
            lines.append(f"{name} {shape} {kind}: {' '.join(kernels)}")
    return lines


def dry_run(sweep: bool) -> int:
    """Compile everything for sm_90 and check the plans; no GPU needed."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        packs = {"split": build(True, ["sm_90"], Path(tmp), "split"),
                 "rows": build(False, ["sm_90"], Path(tmp), "rows")}
        _differ("split", "rows")
        for line in check_plans(packs, SHAPES):
            print(line)
        if sweep:
            tags = {}
            for i, (chunk, block, comb) in enumerate(_sweep_configs()):
                with _Patched(SPLIT_CHUNK=chunk, SPLIT_BLOCK=block, SPLIT_COMBINE_BLOCK=comb):
                    pack = build(True, ["sm_90"], Path(tmp), f"sweep{i}", ("softmax", "rowsum"))
                    grid = pack["rowsum"].plan(x=(4, 10 ** 7)).launches[0].grid[0]
                    if grid != 4 * -(-10 ** 7 // chunk):
                        raise SystemExit(f"chunk {chunk}: partial grid {grid}")
                tags[chunk, block, comb] = f"sweep{i}"
                print(f"sweep config chunk {chunk} block {block} combine {comb}: compiled")
            _distinct_configs(tags)
        print(f"dry run: every plan as expected ({time.perf_counter() - t0:.1f} s)")
    return 0


def _sweep_configs() -> Iterator[tuple[int, int, int]]:
    yield from CONFIGS


def _time_one(prog: Any, args: tuple[Any, ...], ref: Any, what: str, tol: float) -> float:
    from _gpu_timing import median_ms, rel_err

    err = rel_err(prog(*args), ref)
    if not err <= tol:
        raise SystemExit(f"{what}: relative error {err:.2e} (tolerance {tol:.0e})")
    return median_ms(lambda: prog(*args), rep_ms=50, max_reps=200)


def _tol(name: str) -> float:
    return 1e-12 if name.endswith("f64") else 1e-5


def sweep(torch: Any, target: str, shapes: list[tuple[int, int]], md: str | None) -> int:
    """Split constants on the benchmark shapes, then split against rows across a grid of
    (rows, length) for softmax and rowsum (where the predicate's constants belong)."""
    from _gpu_timing import append_results, markdown_table

    names = ("softmax", "layernorm", "rowsum", "logsumexp")
    cells: dict[tuple, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        forced = dict(SPLIT_MIN_LENGTH=1, SPLIT_MAX_ROWS=1 << 40, SPLIT_REDUCE_MIN_LENGTH=1,
                      SPLIT_REDUCE_MAX_ROWS=1 << 40)  # split every shape
        packs, tags = {}, {}
        for i, (chunk, block, comb) in enumerate(_sweep_configs()):
            with _Patched(SPLIT_CHUNK=chunk, SPLIT_BLOCK=block, SPLIT_COMBINE_BLOCK=comb,
                          **forced):
                packs[chunk, block, comb] = build(True, [target], Path(tmp), f"s{i}", names)
            tags[chunk, block, comb] = f"s{i}"
        _distinct_configs(tags)
        for shape in shapes:
            for name in names:
                args = _inputs(torch, name, shape)
                ref = _reference(name, torch, args)
                for cfg, pack in packs.items():
                    cells[name, shape, cfg] = _time_one(pack[name], args, ref,
                                                        f"{name} {shape} {cfg}", _tol(name))
                print(f"{name} {shape}: " + "; ".join(
                    f"{c}/{b}/{m} {cells[name, shape, (c, b, m)]:.4f}" for c, b, m in packs),
                    flush=True)
                del args, ref
        rows = [[name, f"{s[0]}x{s[1]}", *(f"{cells[name, s, cfg]:.4f}" for cfg in packs)]
                for s in shapes for name in names]
        headers = ["workload", "shape", *(f"{c}/{b}/{m}" for c, b, m in packs)]
        with _Patched(**forced):
            split = build(True, [target], Path(tmp), "cross_split", ("softmax", "rowsum"))
        rowwise = build(False, [target], Path(tmp), "cross_rows", ("softmax", "rowsum"))
        _differ("cross_split", "cross_rows", ("softmax", "rowsum"))
        cross = []
        for name in ("softmax", "rowsum"):
            for n in CROSS_LENGTHS:
                line = [name, str(n)]
                for r in CROSS_ROWS:
                    args = _inputs(torch, name, (r, n))
                    ref = _reference(name, torch, args)
                    ts = _time_one(split[name], args, ref, f"{name} {(r, n)} split", 1e-5)
                    tr = _time_one(rowwise[name], args, ref, f"{name} {(r, n)} rows", 1e-5)
                    line.append(f"{tr / ts:.2f}")
                    del args, ref
                print(" ".join(line), flush=True)
                cross.append(line)
    body = [
        "`python benchmarks/rowsplit.py --sweep`; float32, every shape split (predicate "
        "forced). Columns: SPLIT_CHUNK/SPLIT_BLOCK/SPLIT_COMBINE_BLOCK; cells: median ms.",
        "", *markdown_table(headers, rows), "",
        "Time of the previous schedules / time split (> 1: the split is faster), by row "
        "length (lines) and rows (columns), at the current chunk and blocks:", "",
        *markdown_table(["workload", "length", *(str(r) for r in CROSS_ROWS)], cross)]
    print(append_results("Row split sweep (`benchmarks/rowsplit.py --sweep`)", body,
                         results=None, md_out=md))
    return 0


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--quick", action="store_true", help="four shapes only")
    ap.add_argument("--sweep", action="store_true", help="try the split's constants instead")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--md", default=None, help="also write the section to this file "
                    "(default $OUT/rowsplit.md when $OUT is set)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: compile everything and check the plans")
    args = ap.parse_args()
    if args.dry_run:
        return dry_run(args.sweep)
    from _gpu_timing import (RESULTS, append_results, copy_bandwidth, cuda_torch,
                             markdown_table, median_ms, time_cell)

    torch = cuda_torch("rowsplit.py")
    if torch is None:
        return 0
    major, minor = torch.cuda.get_device_capability()
    target = f"sm_{major}{minor}"
    shapes = QUICK if args.quick else SHAPES
    md = args.md or (str(Path(os.environ["OUT"]) / "rowsplit.md") if os.environ.get("OUT")
                     else None)
    if args.sweep:
        return sweep(torch, target, shapes, md)
    with tempfile.TemporaryDirectory() as tmp:
        packs = {"split": build(True, [target], Path(tmp), "split"),
                 "rows": build(False, [target], Path(tmp), "rows")}
        _differ("split", "rows")
        check_plans(packs, shapes)
        copy_bw = copy_bandwidth()
        times: dict[tuple, float] = {}
        # the split kernels and torch first, the one-block-per-row kernels after, so that no
        # fast kernel is timed right after seconds of few-SM work (clocks, power)
        for kinds in (("split", "eager"), ("rows",)):
            for shape in shapes:
                for name in FUSIONS:
                    args_ = _inputs(torch, name, shape)
                    ref = _reference(name, torch, args_)
                    for kind in kinds:
                        t0 = time.perf_counter()
                        if kind == "eager":
                            eager = _eager(name, torch)
                            times[name, shape, kind] = median_ms(lambda a=args_: eager(*a))
                        else:
                            times[name, shape, kind] = _time_one(
                                packs[kind][name], args_, ref, f"{name} {shape} {kind}",
                                _tol(name))
                        print(f"{name} {shape} {kind}: {times[name, shape, kind]:.4f} ms "
                              f"({time.perf_counter() - t0:.1f} s)", flush=True)
                    del args_, ref
        rows = []
        for shape in shapes:
            for name in FUSIONS:
                t = {k: times[name, shape, k] for k in ("split", "rows", "eager")}
                nbytes = _bytes(name, shape)
                cells = [time_cell(t[k], nbytes, copy_bw, 4)
                         for k in ("split", "rows", "eager")]
                rows.append([name, f"{shape[0]}x{shape[1]}",
                             "yes" if _takes_split(name, shape) else "no", *cells,
                             f"{t['rows'] / t['split']:.2f}x", f"{t['split'] / t['eager']:.2f}"])
    body = [
        "`python benchmarks/rowsplit.py`; float32 (softmax_f64: float64). 'split' is the code "
        "as compiled now (lowering/rowsplit.py, taken where 'split?' says yes: rows <= "
        f"{tuning.SPLIT_MAX_ROWS}, length >= {tuning.SPLIT_MIN_LENGTH}; rowsum and "
        f"logsumexp: rows <= {tuning.SPLIT_REDUCE_MAX_ROWS}, length >= "
        f"{tuning.SPLIT_REDUCE_MIN_LENGTH}); 'rows' the same "
        "fusions compiled with tuning.ROW_SPLIT = False (a thread, warp or block per row: "
        "what ran before), timed after every split and torch kernel. Cells: median time (CUDA "
        "events, L2 flushed) and bytes read + written once / time as a fraction of the copy "
        f"bandwidth of this run ({copy_bw / 1e9:.0f} GB/s). Every result checked against "
        "float64 torch (relative error <= 1e-5, float64 1e-12) before timing. Both builds are "
        "real compiles (kp.compile's memo emptied), differ for every fusion, and their plans "
        "take the split kernels exactly where 'split?' says yes.",
        "",
        *markdown_table(["workload", "shape", "split?", "split", "rows (before)",
                         "torch eager", "rows / split", "split / eager"], rows),
    ]
    section = append_results("Few, long rows split across blocks (`benchmarks/rowsplit.py`)",
                             body, results=None if args.no_results else RESULTS, md_out=md)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
