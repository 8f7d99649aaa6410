"""Warm start: a fresh process needs 50 distinct kernels; how long until all are loaded?

Scenarios, each a fresh ``python`` subprocess (CPU side; no GPU is touched):

- cold:        empty disk cache, empty Redis: every kernel is compiled (and put through);
- warm disk:   the same disk cache again;
- warm Redis:  an empty disk cache, Redis filled by the cold run (signed entries);
- Triton warm: not measured in this mode (Triton compiles only for a GPU): see --gpu.

The clock of each child runs from before ``import kernelpack`` (after the interpreter started
and read its arguments) to all kernels loaded and verified: it includes ``import kernelpack``,
``import kernelpack.cache`` and ``kp.Cache(...)``, as the GPU mode's clock does. Cold is one
run; each warm row is the median of ``--repeat`` runs (default 5), its fastest run beside it.
After the clock, each child reports a digest of every result (``kp.save`` of it: summary and
image bytes), and every warm run must match the cold run's digests, kernel by kernel, and come
wholly from its tier (origins), before anything is reported.

``--gpu`` (on a GPU host; see ``_warmstart_gpu.py``): each kernel is also *run once* on CUDA
tensors, first launch included, and checked against torch: kernelpack cold vs warm disk, and
Triton kernels for the same math, cold and with a warm TRITON_CACHE_DIR. (No Redis row: the GPU
hosts have no redis-server.) It prints a markdown entry and writes it to $OUT/warmstart.md when
$OUT is set; ``--add-results FILE`` adds such an entry to RESULTS.md. ``--stamps`` adds part (c):
REPEAT more warm-disk runs with timers around the steps (``_stamps.WARM_STAMPS``), to show where
a warm start's time goes.

Workload: the lowering's ``kp.compile`` of ``@kp.fusion`` functions over several shapes and
dtypes when ``kp.compile`` works here, else ``kp.external`` PTX variants (the output says
which). Prints the times and ratios and adds a table (machine, date, load) to its section of
benchmarks/RESULTS.md, keeping the last five runs.

    python benchmarks/warmstart.py [--kernels 50] [--repeat 5] [--workload auto] [--no-results]
    python benchmarks/warmstart.py --gpu [--kernels 50] [--repeat 5] [--stamps]
    python benchmarks/warmstart.py --add-results warmstart.md
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

PTX_TEMPLATE = """\
.version 8.0
.target sm_80
.address_size 64
.visible .entry k{i}(.param .u64 x, .param .u64 y, .param .f32 a, .param .u32 n)
{{
  .reg .pred p; .reg .b32 r<6>; .reg .b64 rd<8>; .reg .f32 f<4>;
  ld.param.u64 rd1, [x]; ld.param.u64 rd2, [y]; ld.param.f32 f1, [a]; ld.param.u32 r1, [n];
  mul.f32 f1, f1, 0F{scale:08X};
  mov.u32 r2, %ctaid.x; mov.u32 r3, %ntid.x; mov.u32 r4, %tid.x; mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1; @p bra DONE;
  cvta.to.global.u64 rd3, rd1; cvta.to.global.u64 rd4, rd2; mul.wide.u32 rd5, r5, 4;
  add.s64 rd6, rd3, rd5; add.s64 rd7, rd4, rd5; ld.global.f32 f2, [rd6]; ld.global.f32 f3, [rd7];
  fma.rn.f32 f3, f1, f2, f3; st.global.f32 [rd7], f3;
DONE: ret;
}}
"""

# ---- workloads: benchmarks/_warmstart_fusions.py ---------------------------------------------
from _warmstart_fusions import DTYPES, FUSIONS, SHAPES, fusion_jobs  # noqa: E402,F401


CHILD = r'''
import hashlib, json, os, sys, time
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()  # ---- the clock: from before `import kernelpack` to all loaded
import kernelpack as kp
t_import = time.perf_counter() - t0
import kernelpack.cache as kpc
decode_s = [0.0]
_decode = kpc.Cache._decode
def timed_decode(*a):  # how much of a warm start is kp.load + Pack.compiled (verification)
    t = time.perf_counter()
    try:
        return _decode(*a)
    finally:
        decode_s[0] += time.perf_counter() - t
kpc.Cache._decode = staticmethod(timed_decode)
cache = kp.Cache(cfg["disk"], remote=cfg["remote"] or False, sign_with=cfg["key"],
                 trusted_keys=[cfg["pub"]])
origins, results = {}, []
t1 = time.perf_counter()
if cfg["workload"] == "fusion":
    sys.path.insert(0, cfg["here"])
    from _warmstart_fusions import fusion_jobs
    for f, static in fusion_jobs(cfg["kernels"]):
        c = kp.compile(f, targets=["sm_80", "sm_90", "ptx"], static=static, cache=cache)
        origins[c.origin] = origins.get(c.origin, 0) + 1
        results.append(c)
else:
    params = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
              kp.Scalar("a", kp.f32), kp.Scalar("n", kp.u32)]
    for i, ptx in enumerate(cfg["ptx"]):
        c = cache.external(f"k{i}", f"k{i}", params, grid=kp.cdiv("n", 256), block=256,
                           ptx=ptx, targets=["sm_80", "sm_90", "ptx"])
        origins[c.origin] = origins.get(c.origin, 0) + 1
        results.append(c)
t2 = time.perf_counter()  # ---- the clock stops; the digests are untimed
digests = [hashlib.sha256(kp.save([c])).hexdigest() for c in results]
print(json.dumps({"import_s": t_import, "setup_s": t1 - t0 - t_import, "work_s": t2 - t0,
                  "loop_s": t2 - t1, "origins": origins, "decode_s": decode_s[0],
                  "digests": digests, "stats": cache.stats()}))
'''


def _ptx_variants(n: int) -> list[str]:
    out = []
    for i in range(n):
        scale = struct.unpack(">I", struct.pack(">f", 1.0 + i / 64))[0]
        out.append(PTX_TEMPLATE.format(i=i, scale=scale))
    return out


def _fusion_works() -> bool:
    """True when kp.compile of a fusion workload succeeds in a subprocess."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import kernelpack as kp\n"
            "from _warmstart_fusions import fusion_jobs\n"
            "f, static = next(iter(fusion_jobs(1)))\n"
            "kp.compile(f, targets=['sm_80'], static=static)\n") % str(HERE)
    try:
        r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                           timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in ("KERNELPACK_CACHE_DIR", "KERNELPACK_REMOTE_CACHE"):
        env.pop(name, None)
    # "cold" is empty caches: nvJitLink 13.0 would otherwise answer a PTX it assembled in an
    # earlier run from the CUDA compute cache (~/.nv/ComputeCache). No other scenario uses it.
    env["CUDA_CACHE_DISABLE"] = "1"
    return env


def _child(cfg: dict) -> dict:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], env=_env(),
                       capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"child failed:\n{r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    return out


class _Redis:
    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _triton_warm(n: int, workdir: Path) -> str:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "not measured here (triton is not importable; see the GPU runs, --gpu)"
    return "not measured here (Triton needs a GPU to run; see the GPU runs, --gpu)"


def _compile_bytecode() -> None:
    """An installed package has its bytecode compiled at install time, but a source tree run
    with PYTHONDONTWRITEBYTECODE (the GPU image sets it) recompiles every module in every
    fresh process, inside the clock (the 02:27 run: import kernelpack 57 ms instead of 15).
    Compile once here, as an install would: kernelpack and these benchmark modules."""
    import compileall

    compileall.compile_dir(str(SRC / "kernelpack"), quiet=1)
    compileall.compile_dir(str(HERE), quiet=1, maxlevels=0)


def _gpu_main(n: int, repeat: int, stamps: bool = False) -> None:
    """``--gpu``: run the GPU scenarios (see ``_warmstart_gpu``), print the markdown entry and
    write it to ``$OUT/warmstart.md`` when ``$OUT`` is set. RESULTS.md is left alone (the GPU
    host's copy of it does not come back; use --add-results here)."""
    sys.path.insert(0, str(HERE))
    import _warmstart_gpu as g

    _compile_bytecode()
    tmp = Path(tempfile.mkdtemp(prefix="kp-warmstart-gpu-"))
    try:
        print(f"warmstart --gpu: {n} kernels, median of {repeat} warm runs", flush=True)
        runs = g.run_scenarios(n, repeat, tmp, _env(),
                               log=lambda m: print(m, flush=True))
        stamped = (g.stamped_runs(n, repeat, tmp, _env(), log=lambda m: print(m, flush=True))
                   if stamps and "error" not in runs["kernelpack warm disk"] else [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    entry = g.gpu_report(runs, n, repeat, stamp) + g.stamped_section(stamped)
    print(entry)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "warmstart.md").write_text(entry)
    if any("error" in r for r in runs.values()):
        raise SystemExit(1)


def median_run(runs: list[dict], key: str = "work_s") -> dict:
    """One row for several runs of a scenario: each number the median over the runs that did
    not fail (dicts of numbers per key), ``bad`` the union, ``max_err`` the largest per
    dtype, the rest from the first run; plus ``runs`` (how many), ``failed`` (how many did),
    ``min_<key>`` (the fastest run's clock) and ``all_<key>`` (every clock, in run order).
    All runs failed: the last run (with its ``error``)."""
    import statistics

    ok = [r for r in runs if "error" not in r]
    if not ok:
        return dict(runs[-1], runs=0, failed=len(runs))
    out: dict = {}
    for name, value in ok[0].items():
        if isinstance(value, bool) or name in ("bad", "max_err"):
            out[name] = value
        elif isinstance(value, (int, float)):
            out[name] = statistics.median(r[name] for r in ok)
        elif isinstance(value, dict) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            keys = {k for r in ok for k in r.get(name, {})}
            out[name] = {k: statistics.median(r.get(name, {}).get(k, 0) for r in ok)
                         for k in sorted(keys)}
        else:
            out[name] = value
    if "origins" in ok[0]:  # the same in every run of a scenario, else each run's shown
        distinct = [o for i, o in enumerate(r["origins"] for r in ok)
                    if o not in [r["origins"] for r in ok][:i]]
        out["origins"] = distinct[0] if len(distinct) == 1 else f"varied: {distinct}"
    if "bad" in ok[0]:
        out["bad"] = sorted({b for r in ok for b in r["bad"]})
    if "max_err" in ok[0]:
        out["max_err"] = {d: max(r["max_err"].get(d, 0.0) for r in ok)
                          for d in sorted({d for r in ok for d in r["max_err"]})}
    out.update({"runs": len(ok), "failed": len(runs) - len(ok),
                f"min_{key}": min(r[key] for r in ok), f"all_{key}": [r[key] for r in ok]})
    return out


def _check_runs(cold: dict, warm: dict[str, list[dict]], n: int) -> None:
    """SystemExit unless the cold run compiled all ``n`` kernels and every warm run loaded
    each of them from its own tier, with the same summary and image bytes as the cold run
    (the children's digests of ``kp.save`` of each result)."""
    if sum(cold["origins"].values()) != n or len(cold["digests"]) != n or \
            not set(cold["origins"]) <= {"compiled", "external"}:
        raise SystemExit(f"warmstart.py: the cold run did not compile {n} kernels: origins "
                         f"{cold['origins']}, {len(cold['digests'])} digests")
    tier = {"warm disk": "disk", "warm Redis": "remote"}
    for name, runs in warm.items():
        for i, r in enumerate(runs):
            if r["origins"] != {tier[name]: n}:
                raise SystemExit(f"warmstart.py: {name} run {i + 1}: origins {r['origins']}, "
                                 f"expected {{{tier[name]!r}: {n}}}")
            wrong = [k for k, (a, b) in enumerate(zip(cold["digests"], r["digests"])) if a != b]
            if wrong or len(r["digests"]) != n:
                raise SystemExit(f"warmstart.py: {name} run {i + 1}: kernels {wrong[:10]} "
                                 f"differ from the cold run's (kp.save digests; "
                                 f"{len(r['digests'])} results)")


def main() -> None:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--kernels", type=int, default=50,
                    help="distinct kernels the fresh process needs (default 50; at most 54 "
                         "fusion jobs)")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--repeat", type=int, default=5,
                    help="warm runs per scenario: the median is reported, the fastest beside "
                         "it (default 5; cold is one run)")
    ap.add_argument("--workload", choices=("auto", "fusion", "external"), default="auto",
                    help="fusion: kp.compile of @kp.fusion functions; external: kp.external "
                         "PTX variants; auto: fusion when kp.compile works here (default)")
    ap.add_argument("--gpu", action="store_true",
                    help="run each kernel once on the GPU; kernelpack vs Triton (no Redis)")
    ap.add_argument("--stamps", action="store_true",
                    help="with --gpu: also REPEAT warm runs with timers around the steps "
                         "(benchmarks/_stamps.py), part (c) of the entry")
    ap.add_argument("--add-results", metavar="FILE",
                    help="add a --gpu entry (its warmstart.md) to RESULTS.md and exit")
    opts = ap.parse_args()
    if opts.repeat < 1:
        ap.error(f"--repeat must be at least 1 (got {opts.repeat})")
    if opts.add_results:
        _write_section(Path(opts.add_results).read_text())
        return
    if opts.gpu:
        _gpu_main(opts.kernels, opts.repeat, opts.stamps)
        return
    sys.path.insert(0, str(SRC))
    from kernelpack.signing import write_keypair

    _compile_bytecode()  # the clock includes `import kernelpack`: as an installed package

    workload = opts.workload
    if workload == "auto":
        workload = "fusion" if _fusion_works() else "external"
    tmp = Path(tempfile.mkdtemp(prefix="kp-warmstart-"))
    redis = _Redis(tmp) if shutil.which("redis-server") else None
    try:
        private, public = write_keypair(tmp / "fleet.key")
        base = {"remote": redis.url if redis else None, "key": private,
                "pub": Path(public).read_text().strip(), "workload": workload,
                "kernels": opts.kernels, "here": str(HERE),
                "ptx": _ptx_variants(opts.kernels) if workload == "external" else []}
        cold = _child({**base, "disk": str(tmp / "disk-a")})
        warm: dict[str, list[dict]] = {"warm disk": []}
        if redis:
            warm["warm Redis"] = []
        for k in range(opts.repeat):  # interleaved, so that a busy moment hits both alike
            warm["warm disk"].append(_child({**base, "disk": str(tmp / "disk-a")}))
            if redis:  # a fresh, empty disk cache each time: everything comes from Redis
                warm["warm Redis"].append(_child({**base, "disk": str(tmp / f"disk-b{k}")}))
        triton = _triton_warm(opts.kernels, tmp)
    finally:
        if redis:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    n = (min(opts.kernels, len(FUSIONS) * len(DTYPES) * len(SHAPES)) if workload == "fusion"
         else opts.kernels)
    _check_runs(cold, warm, n)
    runs = {"cold": dict(cold, runs=1, failed=0, min_work_s=cold["work_s"])}
    runs.update({name: median_run(rs) for name, rs in warm.items()})
    _report(runs, workload, n, triton, not opts.no_results, opts.repeat)


CLOCK = ("clock = from before `import kernelpack` to all kernels loaded and verified, in a fresh "
         "process (it includes `import kernelpack`, `import kernelpack.cache` and "
         "`kp.Cache(...)`; not the interpreter's start-up, which 'process wall' adds)")


def _report(runs: dict, workload: str, n: int, triton: str, write: bool, repeat: int) -> None:
    cold = runs["cold"]["work_s"]
    what = ("kp.compile of @kp.fusion workloads" if workload == "fusion"
            else "kp.external PTX variants (sm_80 + sm_90 cubins + PTX each)")
    lines = [f"workload: {n} kernels, {what}",
             f"{'scenario':<11} {'runs':>4} {'clock (ms)':>11} {'min (ms)':>9} "
             f"{'import (ms)':>11} {'load+verify':>12} {'process (ms)':>13} {'cold/this':>10}"
             f"  origins"]
    for name, r in runs.items():
        lines.append(f"{name:<11} {r['runs']:>4} {1000 * r['work_s']:>11.1f} "
                     f"{1000 * r['min_work_s']:>9.1f} {1000 * r['import_s']:>11.1f} "
                     f"{1000 * r['decode_s']:>10.1f}ms {1000 * r['wall_s']:>13.1f} "
                     f"{cold / r['work_s']:>9.0f}x  {r['origins']}")
    if "warm Redis" not in runs:
        lines.append("warm Redis: not measured (no redis-server binary)")
    lines.append(f"Triton warm: {triton}")
    lines.append(f"{CLOCK}; cold: one run; warm rows: median of {repeat} runs (min: the "
                 f"fastest); every warm run's results equal the cold run's (kp.save digests, "
                 f"kernel by kernel) and come wholly from its tier")
    print("\n".join(lines))
    if not write:
        return
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
               f"{platform.python_version()}, load average {load} (a shared machine: cold "
               f"times, and so the ratios, move with the load)")
    table = [f"### {stamp}", "", f"{machine}. Workload: {lines[0].split(': ', 1)[1]}.", "",
             "| scenario | runs | clock, median (ms) | min (ms) | of which `import kernelpack` "
             "(ms) | of which kp.load + verify (ms) | process wall (ms) | cold / this |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        table.append(f"| {name} | {r['runs']} | {1000 * r['work_s']:.1f} | "
                     f"{1000 * r['min_work_s']:.1f} | {1000 * r['import_s']:.1f} | "
                     f"{1000 * r['decode_s']:.1f} | {1000 * r['wall_s']:.1f} | "
                     f"{cold / r['work_s']:.0f}x |")
    if "warm Redis" not in runs:
        table.append("\nwarm Redis: not measured (no redis-server binary)")
    table += ["", f"Triton warm: {triton}. {CLOCK[0].upper() + CLOCK[1:]}. Cold: one run; warm "
              f"rows: median of {repeat} runs, the fastest beside it. Every warm run's results "
              f"were checked equal to the cold run's (a digest of `kp.save` of each, kernel by "
              f"kernel) and all came from its tier, before this table was made. (Older "
              f"entries, with a 'work' column, started their clock after `import kernelpack` "
              f"and `kp.Cache(...)` and kept the fastest warm run.)", ""]
    _write_section("\n".join(table))


def _write_section(entry: str, keep: int = 5, keep_gpu: int = 3) -> None:
    """Add ``entry`` at the top of its kind in this script's section of RESULTS.md (other
    scripts own other sections): the newest ``keep_gpu`` GPU runs (``### GPU...``, from
    --add-results) come first, then the newest ``keep`` CPU runs."""
    begin, end = "<!-- benchmarks/warmstart.py: begin -->", "<!-- benchmarks/warmstart.py: end -->"
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    head = "## Warm start: 50 kernels in a fresh process (`benchmarks/warmstart.py`)\n\n"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        body, after = rest.split(end, 1)
        runs = ["### " + r for r in ("\n" + body).split("\n### ")[1:]]
    else:
        before, after, runs = text.rstrip("\n") + "\n\n", "\n", []
    runs = [entry] + runs
    gpu = [r for r in runs if r.startswith("### GPU")][:keep_gpu]
    cpu = [r for r in runs if not r.startswith("### GPU")][:keep]
    body = "\n".join(r.rstrip("\n") + "\n" for r in gpu + cpu)
    path.write_text(before + begin + "\n" + head + body + end + after)


if __name__ == "__main__":
    main()
