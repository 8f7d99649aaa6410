"""Row kernels' schedule configurations, side by side: registers on the CPU, time on a GPU.

``benchmarks/kernels.py`` measures the schedule the lowering chooses. This script measures
others, the way session 51 chose softmax's 8192-element group (notes/row-perf.md): each
*configuration* patches ``kernelpack.lowering.tuning`` (which register-row groups exist, how
many resident threads each is bounded for) before compiling the float32 softmax and layernorm.
A source tree given with ``--against`` runs the same configurations with its own codegen, so a
codegen change is timed against the tree before it.

``--registers`` (no GPU needed): per configuration and tree, every register-row kernel's
registers and spilled bytes as ptxas reports them through nvJitLink (``-Xptxas=-v``, sm_90).

``--ncu`` (a GPU with Nsight Compute's ``ncu``, which needs the hardware counters: it fails
on a gVisor host): per configuration and tree, one process under ``ncu`` launches each cell's
kernelpack kernel and Triton kernel (after a checked first launch) and prints, for each, the
kernel, its launch, registers, the blocks per SM its registers allow, the warps active, DRAM
throughput, instructions and duration. Session 52 found this way why kernelpack's layernorm in
Triton's shape (128 x 8) ran 1.28x slower: 40 registers hold 12 blocks per SM where Triton's 32
hold 16, so a quarter fewer bytes are in flight (notes/row-perf.md).

Otherwise (a GPU with torch and Triton): per configuration, tree and round, one fresh process
compiles the two fusions for the device, then for each cell checks kernelpack's result against
float64 torch and times it beside the Triton kernel kernels.py uses (``run_case``: same inputs,
L2 flushed, CUDA events, medians). Rounds interleave the processes, so a slow moment of the
host hits every configuration alike. Prints kernelpack / Triton per cell and round. Nothing is
written to RESULTS.md: the output is a comparison for notes.

    python benchmarks/row_configs.py [--config NAME ...] [--against OLD_SRC ...] [--rounds N]
        [--workloads softmax,layernorm] [--cells 8192x8192,...] [--registers] [--ncu] [--list]

``--config current`` is the tuning as it is; ``--list`` names the others. OLD_SRC is a ``src/``
directory of another tree (``git archive REV src | tar -x -C /tmp/old``, then ``/tmp/old/src``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ARCH = "sm_90"


def _last_group(groups: str, group: tuple) -> Any:
    """A configuration's patch that replaces the last group of ``tuning.<groups>`` (the one
    holding the longest rows, 8192 elements) with ``group``."""
    return lambda t: {groups: getattr(t, groups)[:-1] + (group,)}


# name -> (what it is, {tuning attribute: value}); a value is a function of the tree's own
# tuning module, so that a configuration changes one entry and keeps the tree's others
CONFIGS: dict[str, tuple[str, Any]] = {
    "current": ("the tuning as it is", lambda t: {}),
    "softmax-8192-at-512": (
        "softmax's 8192 group (256 x 32) bounded for 512 resident threads (2 rows per SM; the "
        "choice before session 51)",
        _last_group("REG_GROUPS", ("block", 8, 256, 512))),
    "softmax-8192-at-1024": (
        "softmax's 8192 group bounded for 1024 resident threads (4 rows per SM)",
        _last_group("REG_GROUPS", ("block", 8, 256, 1024))),
    "softmax-8192-512x16": (
        "softmax's 8192 group as Triton's shape: 512 threads x 16, 1536 resident",
        _last_group("REG_GROUPS", ("block", 4, 512, 1536))),
    "layernorm-at-768": (
        "layernorm's groups of 32 per thread bounded for 768 resident threads",
        lambda t: {"REG_GROUPS_LIGHT": t.REG_GROUPS_LIGHT[:3] + tuple(
            g[:3] + (768,) for g in t.REG_GROUPS_LIGHT[3:])}),
    "layernorm-128x8": (
        "layernorm up to 1024 as Triton's shape: 128 threads x 8, 1536 resident",
        lambda t: {"REG_GROUPS_LIGHT": t.REG_GROUPS_LIGHT[:2] + (
            ("block", 2, 64, 1536), ("block", 2, 128, 1536)) + t.REG_GROUPS_LIGHT[4:]}),
    "layernorm-8192-at-768": (
        "layernorm's 8192 group (256 x 32) bounded for 768 resident threads (3 rows per SM)",
        _last_group("REG_GROUPS_LIGHT", ("block", 8, 256, 768))),
    "layernorm-8192-at-1024": (
        "layernorm's 8192 group (256 x 32) bounded for 1024 resident threads (4 rows per SM)",
        _last_group("REG_GROUPS_LIGHT", ("block", 8, 256, 1024))),
    "layernorm-8192-512x16": (
        "layernorm's 8192 group as Triton's shape: 512 threads x 16, 1024 resident",
        _last_group("REG_GROUPS_LIGHT", ("block", 4, 512, 1024))),
    "layernorm-8192-512x16-at-1536": (
        "layernorm's 8192 group as 512 threads x 16, 1536 resident (3 rows per SM)",
        _last_group("REG_GROUPS_LIGHT", ("block", 4, 512, 1536))),
    "layernorm-warp-in-128": (
        "layernorm's warp groups in blocks of 128 threads (4 rows per block instead of 8)",
        lambda t: {"REG_GROUPS_LIGHT": tuple((g[0], g[1], 128) + tuple(g[3:]) if g[0] == "warp"
                                             else g for g in t.REG_GROUPS_LIGHT)}),
}
CELLS = ["65536x1024", "8192x8192", "16384x4096", "32768x2048", "131072x512", "65536x1023",
         "8192x8190"]

CHILD = r'''
import json, sys
sys.path.insert(0, sys.argv[1])          # the tree's kernelpack, before kernels.py's own
import kernelpack as kp
from kernelpack.lowering import tuning
sys.path.insert(1, sys.argv[2])          # benchmarks/ of this tree
import row_configs
row_configs.apply(sys.argv[3], tuning)
print(json.dumps(row_configs.child(sys.argv[4], sys.argv[5].split(","), sys.argv[6].split(","))))
'''


def apply(name: str, tuning: Any) -> dict[str, Any]:
    """Patch ``tuning`` (a tree's ``kernelpack.lowering.tuning``) for configuration ``name``;
    returns what was set."""
    if name not in CONFIGS:
        raise SystemExit(f"unknown --config {name!r}; known: {', '.join(CONFIGS)}")
    patch = CONFIGS[name][1](tuning)
    for attr, value in patch.items():
        if not hasattr(tuning, attr):
            raise SystemExit(f"this tree's tuning has no {attr} (configuration {name!r})")
        setattr(tuning, attr, value)
    return patch


def _fusions(workloads: list[str]) -> dict[str, Any]:
    import kernels  # this tree's benchmarks/kernels.py (the fusions kernels.py times)
    import kernelpack as kp

    fusions = kernels.standard_fusions(kp.float32)
    return {w: fusions[w] for w in workloads}


def child(mode: str, workloads: list[str], cells: list[str]) -> Any:
    """In a fresh process with the configuration applied: ``registers`` ({workload: {kernel:
    [registers, spill bytes]}} of the register-row kernels), ``time`` ({workload cell:
    [kernelpack ms, Triton ms, kernelpack's relative error]}) or ``ncu`` (the launches made
    for Nsight Compute to profile: [[workload cell, "kp" or "triton"], ...] in launch
    order)."""
    from kernelpack.lowering import pipeline
    from kernelpack.targets import parse_arch
    from kernelpack.toolchain.nvjitlink import resource_usage

    fusions = _fusions(workloads)
    if mode == "registers":
        out: dict[str, Any] = {}
        for w, f in fusions.items():
            ptx = pipeline.run(pipeline.new_build(f, [ARCH], None, {}), stop="ptx").ptx
            used = resource_usage(ptx, parse_arch(ARCH))
            out[w] = {k.split("_0_", 1)[1]: list(v) for k, v in used.items()
                      if re.search(r"_0_row(warp|block)\d+x?\d*$", k)}
        return out
    if mode == "ncu":
        return _launch_for_ncu(fusions, cells)
    return _time(fusions, cells)


def _row_cases(fusions: dict[str, Any], cells: list[str]) -> Iterator[tuple[str, str, Any, Any]]:
    """(``workload cell``, workload, kernels.py's Case, kernelpack's builder) per workload and
    cell, on the fusions compiled for this GPU, saved and loaded as users launch them."""
    import torch

    import kernels as K
    import kernelpack as kp

    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    compiled = {w: kp.compile(f, targets=[arch]) for w, f in fusions.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.kpack")
        kp.save(list(compiled.values()), path)
        pack = kp.load(path)
        for w, c in compiled.items():
            for cell in cells:
                b, n = (int(v) for v in cell.split("x"))
                case = K.row_case(w, b, n)
                yield f"{w} {cell}", w, case, K.kp_builder(pack, c.name, case)


def _launch_for_ncu(fusions: dict[str, Any], cells: list[str]) -> list[list[str]]:
    """Each cell's kernelpack and Triton kernels launched twice (Triton compiles in its first
    launch; the profile keeps the second), then kernelpack's result checked against float64
    torch; returns every launch's label in order, so the profiled kernels can be told apart."""
    import torch

    import kernels as K

    order: list[list[str]] = []
    for label, w, case, kp_build in _row_cases(fusions, cells):
        d = case.make()
        run_kp, out = kp_build(d)
        run_triton, _ = K.triton_build(w, d)
        for _ in range(2):
            run_kp()
            run_triton()
            order += [[label, "kp"], [label, "triton"]]
        err = K.gt.rel_err(out, case.ref(d))
        if not err <= K.TOL[case.dtype]:
            raise SystemExit(f"{label}: kernelpack's result is wrong (rel err {err:.2e})")
        del d, out
        torch.cuda.empty_cache()
    return order


def _time(fusions: dict[str, Any], cells: list[str]) -> dict[str, Any]:
    import kernels as K

    out: dict[str, Any] = {}
    for label, w, case, kp_build in _row_cases(fusions, cells):
        r = K.run_case(case, {"kp": kp_build,
                              "triton": lambda d, w=w: K.triton_build(w, d)},
                       {"rep_ms": 150.0})
        kpm, trm = r["kp"], r["triton"]
        if kpm.ms is None or trm.ms is None:
            raise SystemExit(f"{label}: {kpm.note or trm.note}")
        out[label] = [kpm.ms, trm.ms, kpm.err]
    return out


def run_child(src: Path, config: str, mode: str, workloads: list[str],
              cells: list[str], wrapper: list[str] | None = None) -> Any:
    """The child's answer (its last line of output, JSON); ``wrapper`` runs it under another
    program (``ncu ...``)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([*(wrapper or []), sys.executable, "-c", CHILD, str(src), str(HERE),
                           config, mode, ",".join(workloads), ",".join(cells)],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{src} {config}: the child failed (rc {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# what --ncu collects: metric -> heading
NCU_METRICS = {
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "blocks/SM by registers",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active",
    "dram__bytes.sum.per_second": "DRAM",
    "smsp__inst_executed.sum": "instructions",
    "gpu__time_duration.sum": "duration",
}


def parse_ncu_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """``ncu --csv --page raw`` output: a header row, a units row, then one row per profiled
    kernel. Returns per kernel {column: (value, unit)} in profiling order; ncu's own messages
    (``==PROF==`` lines) are skipped."""
    import csv

    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if len(rows) < 2:
        return []
    header, units = rows[0], rows[1]
    if len(units) != len(header) or units[header.index("Kernel Name")] != "":
        raise ValueError("not ncu's raw page: the second row is not the units row")
    return [{h: (v, u) for h, v, u in zip(header, row, units)} for row in rows[2:]]


def attribute(order: list[list[str]], kernels: list[dict[str, tuple[str, str]]],
              workloads: list[str]) -> dict[tuple[str, str], list[dict[str, tuple[str, str]]]]:
    """The profiled kernels of each (cell, implementation)'s last launch. ``order`` lists the
    child's launches; a kernelpack launch may run several kernels (named after the fusion,
    ``WORKLOAD_float32_...``), a Triton launch runs one (``_t_WORKLOAD``)."""
    def impl_of(name: str) -> str:
        for w in workloads:
            if name == f"_t_{w}":
                return "triton"
            if name.startswith(f"{w}_float32_"):
                return "kp"
        raise ValueError(f"profiled kernel {name!r} belongs to no launch")

    out: dict[tuple[str, str], list[dict[str, tuple[str, str]]]] = {}
    i = 0
    for launch, (cell, impl) in enumerate(order, 1):
        mine = []
        while i < len(kernels) and impl_of(kernels[i]["Kernel Name"][0]) == impl:
            mine.append(kernels[i])
            i += 1
            if impl == "triton":
                break
        if not mine:
            raise ValueError(f"no profiled kernel for {cell} {impl} (launch {launch})")
        out[(cell, impl)] = mine  # the second launch replaces the first
    if i != len(kernels):
        raise ValueError(f"{len(kernels) - i} profiled kernels past the last launch")
    return out


def ncu_rows(tree_label: str, config: str,
             found: dict[tuple[str, str], list[dict[str, tuple[str, str]]]]) -> list[str]:
    """Markdown rows: one per profiled kernel, then kernelpack / Triton's duration per cell."""
    lines = []
    totals: dict[str, dict[str, float]] = {}
    for (cell, impl), kernels in found.items():
        for k in kernels:
            cols = " | ".join(f"{k[m][0]} {k[m][1]}".strip() if m in k else "?"
                              for m in NCU_METRICS)
            lines.append(f"| {tree_label} | {config} | {cell} | {impl} | "
                         f"{k['Kernel Name'][0]} | {cols} |")
            if "gpu__time_duration.sum" in k:
                value = float(k["gpu__time_duration.sum"][0].replace(",", ""))
                totals.setdefault(cell, {}).setdefault(impl, 0.0)
                totals[cell][impl] += value
    for cell, t in totals.items():
        if t.get("kp") and t.get("triton"):
            lines.append(f"| {tree_label} | {config} | {cell} | kp / Triton | | "
                         + " | " * (len(NCU_METRICS) - 1) + f"{t['kp'] / t['triton']:.3f} |")
    return lines


def run_ncu(ncu: str, src: Path, config: str, workloads: list[str],
            cells: list[str]) -> dict[tuple[str, str], list[dict[str, tuple[str, str]]]]:
    names = "|".join(f"{w}_float32_|_t_{w}$" for w in workloads)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        wrapper = [ncu, "--clock-control", "none", "--target-processes", "all", "--csv",
                   "--page", "raw", "--log-file", log, "--metrics", ",".join(NCU_METRICS),
                   "-k", f"regex:^({names})"]
        order = run_child(src, config, "ncu", workloads, cells, wrapper)
        text = Path(log).read_text() if os.path.exists(log) else ""
    kernels = parse_ncu_csv(text)
    if not kernels:
        raise SystemExit(f"{src} {config}: ncu profiled no kernel; its log:\n{text[-3000:]}")
    return attribute(order, kernels, workloads)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--config", action="append", default=[], metavar="NAME",
                    help="a configuration (repeat; default: current)")
    ap.add_argument("--against", action="append", default=[], metavar="SRC",
                    help="another tree's src/ directory, run with the same configurations")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--workloads", default="softmax,layernorm",
                    help="comma-separated: softmax, layernorm")
    ap.add_argument("--cells", default=",".join(CELLS),
                    help="comma-separated ROWSxCOLUMNS (default: %(default)s)")
    ap.add_argument("--registers", action="store_true",
                    help="registers and spills per kernel (ptxas via nvJitLink; no GPU)")
    ap.add_argument("--ncu", nargs="?", const="ncu", metavar="NCU",
                    help="profile each cell's kernels with Nsight Compute (the ncu program: "
                    "on the PATH unless given) instead of timing them")
    ap.add_argument("--list", action="store_true", help="name the configurations and exit")
    args = ap.parse_args()
    if args.list:
        for name, (what, _) in CONFIGS.items():
            print(f"{name}: {what}")
        return 0
    configs = args.config or ["current"]
    for name in configs:
        if name not in CONFIGS:
            ap.error(f"unknown --config {name!r}; known: {', '.join(CONFIGS)}")
    workloads = [w for w in args.workloads.split(",") if w]
    if not workloads or set(workloads) - {"softmax", "layernorm"}:
        ap.error(f"--workloads: softmax and/or layernorm (got {args.workloads!r})")
    cells = [c for c in args.cells.split(",") if c]
    if not cells or not all(re.fullmatch(r"[1-9]\d*x[1-9]\d*", c) for c in cells):
        ap.error(f"--cells: ROWSxCOLUMNS, comma-separated (got {args.cells!r})")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {args.rounds})")
    trees = [SRC] + [Path(s).resolve() for s in args.against]
    for tree in trees[1:]:
        if not (tree / "kernelpack" / "lowering" / "tuning.py").is_file():
            ap.error(f"--against {tree}: no kernelpack package (with its lowering) under it")
    label = {t: ("this tree" if t == SRC else str(t)) for t in trees}
    if args.registers:
        for tree in trees:
            for name in configs:
                got = run_child(tree, name, "registers", workloads, cells)
                for w, kernels in got.items():
                    shown = " ".join(f"{k}={r}" + (f" (spills {s} B)" if s else "")
                                     for k, (r, s) in kernels.items())
                    print(f"{label[tree]} | {name} | {w}: {shown}")
        return 0
    if args.ncu:
        if shutil.which(args.ncu) is None:
            ap.error(f"--ncu: no program {args.ncu!r} (Nsight Compute's ncu) found")
        print("| tree | config | cell | impl | kernel | "
              + " | ".join(NCU_METRICS.values()) + " |")
        print("| --- | --- | --- | --- | --- |" + " ---: |" * len(NCU_METRICS))
        for tree in trees:
            for name in configs:
                found = run_ncu(args.ncu, tree, name, workloads, cells)
                print("\n".join(ncu_rows(label[tree], name, found)), flush=True)
        return 0
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for tree in trees:
            for name in configs:
                got = run_child(tree, name, "time", workloads, cells)
                results.setdefault((label[tree], name), []).append(got)
                for cell, (kp_ms, tr_ms, err) in got.items():
                    print(f"round {r + 1} | {label[tree]} | {name} | {cell}: kernelpack "
                          f"{kp_ms:.4f} ms, Triton {tr_ms:.4f} ms, ratio {kp_ms / tr_ms:.3f}"
                          f" (rel err {err:.1e})", flush=True)
    print("\nkernelpack / Triton, one column per round\n")
    print("| tree | config | cell | " + " | ".join(f"round {i + 1}" for i in
                                                 range(args.rounds)) + " |")
    print("| --- | --- | --- |" + " ---: |" * args.rounds)
    for (tree_label, name), runs in results.items():
        for cell in runs[0]:
            ratios = " | ".join(f"{run[cell][0] / run[cell][1]:.3f}" for run in runs)
            print(f"| {tree_label} | {name} | {cell} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
