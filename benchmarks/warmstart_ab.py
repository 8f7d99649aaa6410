"""The warm start's CPU side, one source tree against another: a before/after on a noisy host.

``benchmarks/warmstart.py`` measures a warm start whole (with the GPU's first launches, against
Triton) on whatever host it is given; a lease whose runs move by tens of ms (session 50's H200:
warm runs in two modes, ~75 and ~115 ms) hides a change of a few ms. This script times only
what such a change moves, in fresh processes, interleaved between trees so that a busy moment
hits every tree alike:

  clock    from before ``import kernelpack`` (after the interpreter started) to ``--kernels``
           ``kp.compile(f, targets=..., static=..., cache=kp.Cache(DIR))`` disk hits done:
           the import, ``import kernelpack.cache``, the keys (trace, canonical bytes, digest),
           reading, verifying and decoding each entry; no GPU, no launch.

Each tree gets a cache directory of its own, filled first by one cold run of that tree (its
keys are its own: trees whose codegen sources differ key differently), and every timed run must
come wholly from the disk (``origin == "disk"``), or the script stops. The fusions are
warmstart.py's (``benchmarks/_warmstart_fusions.py``). Each tree's bytecode is compiled before
timing (``compileall``), as an installed package's is.

    python benchmarks/warmstart_ab.py --against OLD_SRC [--against ...] [--runs N]
        [--kernels N] [--json FILE]

OLD_SRC is a ``src/`` directory of another tree, e.g. ``git archive REV src | tar -x -C
/tmp/old`` then ``/tmp/old/src``. A tree without the C extension (``kernelpack/runtime/
_launch*.so``: the loader's C reader and verifier) is slower for that alone: the script says
which trees have it; copy the built file into the other tree when its C sources are the same.
Nothing is written to RESULTS.md: the output is a before/after for a change's notes.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TARGETS = ["sm_80", "sm_90", "ptx"]

CHILD = r'''
import sys, time
t0 = time.perf_counter()
import kernelpack as kp
import kernelpack.cache
sys.path.insert(0, sys.argv[2])
from _warmstart_fusions import fusion_jobs
cache = kp.Cache(path=sys.argv[1])
origins = {}
for f, static in fusion_jobs(int(sys.argv[3])):
    c = kp.compile(f, targets=%r, static=static, cache=cache)
    origins[c.origin] = origins.get(c.origin, 0) + 1
ms = 1e3 * (time.perf_counter() - t0)
import importlib.util, json
native = importlib.util.find_spec("kernelpack.runtime._launch") is not None
print(json.dumps({"ms": ms, "origins": origins, "native": native, "file": kp.__file__}))
''' % (TARGETS,)


def run_child(src: Path, cache: Path, kernels: int) -> dict:
    """One fresh process of ``src``'s kernelpack over ``cache``; its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("PYTHONPYCACHEPREFIX", None)  # read the bytecode compileall wrote
    out = subprocess.run([sys.executable, "-c", CHILD, str(cache), str(HERE), str(kernels)],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"a child of {src} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["file"]).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"a child meant for {src} imported {result['file']}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--against", action="append", default=[], metavar="SRC", required=True,
                    help="another tree's src/ directory, timed interleaved with this one's; "
                         "repeatable")
    ap.add_argument("--runs", type=int, default=15,
                    help="fresh processes per tree (default 15; medians and minimums)")
    ap.add_argument("--kernels", type=int, default=50,
                    help="cache hits per process (default 50, warmstart.py's)")
    ap.add_argument("--json", help="also write every run here")
    args = ap.parse_args()
    if args.runs < 1 or args.kernels < 1:
        ap.error("--runs and --kernels must be at least 1")
    trees = {"this tree": SRC, **{src: Path(src).resolve() for src in args.against}}
    for name, src in trees.items():
        if not (src / "kernelpack" / "__init__.py").is_file():
            ap.error(f"--against {name}: no kernelpack package under it (give a src/ directory)")
        compileall.compile_dir(str(src / "kernelpack"), quiet=1)
    work = Path(tempfile.mkdtemp(prefix="kp-warmstart-ab-"))
    caches = {name: work / f"cache{i}" for i, name in enumerate(trees)}
    for name, src in trees.items():
        started = time.perf_counter()
        cold = run_child(src, caches[name], args.kernels)
        print(f"{name}: cold run {time.perf_counter() - started:.1f} s {cold['origins']}, "
              f"C extension {'yes' if cold['native'] else 'NO'}", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.runs):
        for name, src in trees.items():
            r = run_child(src, caches[name], args.kernels)
            if r["origins"] != {"disk": args.kernels}:
                raise SystemExit(f"{name}: run {i} was not all disk hits: {r['origins']}")
            runs[name].append(r)
        print(f"run {i + 1}/{args.runs}: " + ", ".join(
            f"{runs[n][-1]['ms']:.1f}" for n in trees), flush=True)
    base = statistics.median(r["ms"] for r in runs["this tree"])
    print(f"\n{args.kernels} disk hits after import kernelpack, fresh processes, {args.runs} per "
          f"tree, interleaved; python {sys.version.split()[0]}\n")
    print("| tree | median ms | min ms | median - this tree's ms |")
    print("|---|---:|---:|---:|")
    for name in trees:
        times = [r["ms"] for r in runs[name]]
        med = statistics.median(times)
        print(f"| {name} | {med:.2f} | {min(times):.2f} | {med - base:+.2f} |")
    if len({r["native"] for rs in runs.values() for r in rs}) > 1:
        print("\nnote: the trees differ in the C extension (see the cold runs above)")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
