"""Sweep of the column split schedule's constants on a GPU (notes/column-perf.md):
``python benchmarks/_columns_sweep.py [--dry-run]``. Each configuration patches
``kernelpack.lowering.columns`` before compiling a column sum; results are checked against
float64 torch, then timed (``_gpu_timing.median_ms``) against ``x.sum(0)``.

Every configuration's build is a real compile (``kp.compile``'s per-process memo emptied around
it, a counter around the lowering; ``_compiles.py``: without that, every configuration got the
first one's kernels), and no two configurations may build the same code (their float32 and
float64 column sums saved together), or the sweep stops. ``--dry-run`` needs no GPU: it builds
every configuration for sm_90 and checks just that."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from kernelpack.lowering import columns  # noqa: E402
from _compiles import CompileCounter, artifact_digest, fresh_compile  # noqa: E402

T = kp.Tensor
CONFIGS = list(itertools.product((1 << 18, 1 << 19), (2, 4), (True, False)))
SHAPES = [(100_000, 64), (1_000_000, 16), (8192, 8192), (65536, 1024), (2048, 32768)]


def colsum_of(dt):  # type: ignore[no-untyped-def]
    @kp.fusion(name=f"colsum_{dt.name}")
    def colsum(x: T[dt, "a", "b"]):
        return x.sum(axis=0)

    return colsum


def build(config: tuple[int, int, bool], target: str) -> dict[str, Any]:
    """The float32 and float64 column sums compiled with ``config``'s constants (restored
    afterwards), by dtype name."""
    saved = (columns.TARGET_THREADS, columns.UNROLL, columns.VECTOR)
    columns.TARGET_THREADS, columns.UNROLL, columns.VECTOR = config
    try:
        with CompileCounter() as counter:
            return {kd.name: fresh_compile(colsum_of(kd), counter, targets=[target])
                    for kd in (kp.f32, kp.f64)}
    finally:
        columns.TARGET_THREADS, columns.UNROLL, columns.VECTOR = saved


def build_all(target: str) -> dict[tuple[int, int, bool], dict[str, Any]]:
    """Every configuration's build; SystemExit when two of them are the same code."""
    builds, seen = {}, {}
    for config in CONFIGS:
        builds[config] = build(config, target)
        digest = artifact_digest(list(builds[config].values()))
        if digest in seen:
            raise SystemExit(f"_columns_sweep.py: configurations {seen[digest]} and {config} "
                             f"(TARGET_THREADS, UNROLL, VECTOR) build the same code")
        seen[digest] = config
    return builds


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build every configuration for sm_90 and check that no two "
                         "are the same code")
    if ap.parse_args().dry_run:
        build_all("sm_90")
        print(f"_columns_sweep.py dry run: {len(CONFIGS)} configurations, all built afresh, "
              f"no two the same code")
        return 0
    import torch

    from _gpu_timing import median_ms, rel_err

    major, minor = torch.cuda.get_device_capability()
    builds = build_all(f"sm_{major}{minor}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = {(s, d): torch.randn(s, device="cuda", dtype=d, generator=gen)
              for s in SHAPES for d in (torch.float32, torch.float64)}
    print("eager:", {f"{s}/{str(d)[6:]}": round(median_ms(lambda x=x: x.sum(0)), 4)
                     for (s, d), x in inputs.items()}, flush=True)
    for (target, unroll, vector), built in builds.items():
        progs = {d: kp.load(kp.save([built[kd.name]]))[f"colsum_{kd.name}"]
                 for d, kd in ((torch.float32, kp.f32), (torch.float64, kp.f64))}
        row = []
        for (s, d), x in inputs.items():
            p = progs[d]
            err = rel_err(p(x), x.double().sum(0))
            assert err < (1e-6 if d == torch.float32 else 1e-13), (s, d, err)
            row.append(f"{s}/{str(d)[6:]} {median_ms(lambda p=p, x=x: p(x)):.4f}")
        print(f"target 2^{target.bit_length() - 1} unroll {unroll} vector {vector}: "
              + "; ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
