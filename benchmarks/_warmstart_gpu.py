"""GPU part of ``benchmarks/warmstart.py --gpu``: 50 kernels loaded *and run once* in a fresh
process, kernelpack (cold / warm disk) against Triton (cold / warm ``TRITON_CACHE_DIR``).

Every scenario is a fresh ``python`` subprocess that first (untimed, the same everywhere)
imports torch, calls ``torch.cuda.init()`` and allocates the inputs of the 50 kernels on the
GPU (this creates the CUDA context). The clock then runs from there to "all 50 kernels have run
once" (a final ``torch.cuda.synchronize()``):

- kernelpack: ``import kernelpack``, build the 50 ``@kp.fusion`` objects, and for each
  ``kp.compile(f, static=..., cache=kp.Cache(disk, remote=False))`` (a compile when cold, a
  verified disk hit when warm) followed by ``kernelpack.runtime.call_program(compiled, *args)``
  (first launch: module load, binding, output allocation);
- Triton: ``import triton`` and the module that defines the six ``@triton.jit`` kernels, then
  one launch of each of the 50 specializations (kind x dtype x static size, the same 50 as
  kernelpack's, in the same order): a compile when ``TRITON_CACHE_DIR`` is empty, a cache load
  when it was warmed by an earlier process.

After the clock stops, every output is checked against a float64 torch reference. Cold rows
are one run each; warm rows (kernelpack warm disk, Triton warm, the driver floor) are the
median of ``--repeat`` runs (default 5) of each figure, the fastest run's clock beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["SYMBOLIC_N", "ROWS", "TOL", "specs", "make_inputs", "reference", "check",
           "triton_source", "run_scenarios", "stamped_runs", "stamped_section", "gpu_report"]

HERE = Path(__file__).resolve().parent
SYMBOLIC_N = {1: 10_000, 2: 1000}  # n when the fusion's n is symbolic (by rank)
ROWS = 64                          # b of the rank-2 fusions
SCALAR = {"softmax": 0.5, "axpby": 1.75, "gelu": 0.7071067811865476, "rownorm": 1e-5,
          "relu_sum": 0.1, "tanh_mul": 0.5}
TOL = {"f64": 1e-10, "f32": 1e-4, "f16": 1e-2}  # max |out - ref| / max |ref|
TARGETS = ["sm_80", "sm_90", "ptx"]


def specs(n: int) -> list[tuple[str, str, int | None, int, int]]:
    """``(kind, dtype, static n or None, rank, tensor inputs)`` in ``fusion_jobs(n)``'s order."""
    import itertools

    from _warmstart_fusions import DTYPES, FUSIONS, SHAPES

    out = [(kind, d, size, rank, ntens) for (kind, _, rank, ntens), d, size
           in itertools.product(FUSIONS, DTYPES, SHAPES)]
    return out[:n]


def make_inputs(spec: tuple, torch: Any, gen: Any, device: str = "cuda") -> list[Any]:
    """The inputs of one kernel: ``ntens`` tensors (on ``device``) then the scalar ``s``."""
    kind, dname, size, rank, ntens = spec
    n = size if size is not None else SYMBOLIC_N[rank]
    shape = (ROWS, n) if rank == 2 else (n,)
    dt = {"f16": torch.float16, "f32": torch.float32, "f64": torch.float64}[dname]
    tensors = [torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dt)
               for _ in range(ntens)]
    return tensors + [SCALAR[kind]]


def reference(kind: str, args: list[Any], torch: Any) -> Any:
    """The fusion's math in float64 torch (the scalar as the kernel's dtype rounds it)."""
    x = args[0].double()
    s = torch.tensor(args[-1], dtype=args[0].dtype).double().item()
    if kind == "softmax":
        return torch.softmax(x * s, dim=1)
    if kind == "axpby":
        return s * x + args[1].double()
    if kind == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x * s))
    if kind == "rownorm":
        d = x - x.mean(dim=1, keepdim=True)
        return d / torch.sqrt((d * d).mean(dim=1, keepdim=True) + s)
    if kind == "relu_sum":
        return torch.where(x > 0, x, x * s).sum(dim=1)
    if kind == "tanh_mul":
        return torch.tanh(x * s) * args[1].double()
    raise ValueError(f"unknown kind {kind!r}")


def check(spec: tuple, args: list[Any], out: Any, torch: Any) -> float:
    """Scaled max error of ``out`` (inf when its shape or dtype is wrong, or NaNs appear)."""
    ref = reference(spec[0], args, torch)
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != args[0].dtype:
        return float("inf")
    err = (out.double() - ref).abs().max().item()
    return err / (ref.abs().max().item() or 1.0) if err == err else float("inf")


# ---- Triton: the same six fusions --------------------------------------------------------------
_TRITON_HEAD = '''"""Triton kernels for benchmarks/warmstart.py --gpu (generated)."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
'''

# {sfx}: _s32 / _s64, {sty}: the scalar's Triton type. N > 0: the static n (a constexpr, like
# kernelpack's static=); N == 0: n is a runtime argument. UP: compute in float32 (f16 inputs).
_TRITON_KERNELS = '''

@triton.jit
def softmax{sfx}(x_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
                 BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.arange(0, BLOCK)
    m = offs < size
    base = tl.program_id(0) * size
    x = tl.load(x_ptr + base + offs, mask=m, other=0.0)
    if UP:
        x = x.to(tl.float32)
    z = tl.where(m, x * s, -float("inf"))
    e = tl.exp(z - tl.max(z, axis=0))
    tl.store(o_ptr + base + offs, (e / tl.sum(e, axis=0)).to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def rownorm{sfx}(x_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
                 BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.arange(0, BLOCK)
    m = offs < size
    base = tl.program_id(0) * size
    x = tl.load(x_ptr + base + offs, mask=m, other=0.0)
    if UP:
        x = x.to(tl.float32)
    d = tl.where(m, x - tl.sum(x, axis=0) / size, 0.0)
    y = d / tl.sqrt(tl.sum(d * d, axis=0) / size + s)
    tl.store(o_ptr + base + offs, y.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def relu_sum{sfx}(x_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
                  BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * size + offs, mask=offs < size, other=0.0)
    if UP:
        x = x.to(tl.float32)
    v = tl.where(x > 0, x, x * s)
    tl.store(o_ptr + row, tl.sum(v, axis=0).to(o_ptr.dtype.element_ty))


@triton.jit
def axpby{sfx}(x_ptr, y_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
               BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < size
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    if UP:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    tl.store(o_ptr + offs, (s * x + y).to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def gelu{sfx}(x_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
              BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < size
    x = tl.load(x_ptr + offs, mask=m)
    if UP:
        x = x.to(tl.float32)
    tl.store(o_ptr + offs, (0.5 * x * (1.0 + tl.erf(x * s))).to(o_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def tanh_mul{sfx}(x_ptr, y_ptr, o_ptr, s: "{sty}", n, N: tl.constexpr, UP: tl.constexpr,
                  BLOCK: tl.constexpr):
    if N > 0:
        size = N
    else:
        size = n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < size
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    if UP:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    tl.store(o_ptr + offs, (libdevice.tanh(x * s) * y).to(o_ptr.dtype.element_ty), mask=m)
'''

_TRITON_LAUNCH = '''

ROW_KINDS = ("softmax", "rownorm", "relu_sum")


def launch(kind, dname, size, args):
    """One launch of the (kind, dtype, static size) specialization; returns its output."""
    x = args[0]
    fn = globals()[kind + ("_s64" if dname == "f64" else "_s32")]
    n = x.shape[-1]
    consts = dict(N=size or 0, UP=dname == "f16")
    if kind in ROW_KINDS:
        out = torch.empty(x.shape[:1] if kind == "relu_sum" else x.shape, dtype=x.dtype,
                          device=x.device)
        fn[(x.shape[0],)](x, out, args[-1], n, BLOCK=triton.next_power_of_2(n), **consts)
    else:
        out = torch.empty_like(x)
        fn[(triton.cdiv(n, 1024),)](*args[:-1], out, args[-1], n, BLOCK=1024, **consts)
    return out
'''


def triton_source() -> str:
    """The Triton module: each kernel twice (float32 and float64 scalar ``s``) + ``launch``."""
    body = "".join(_TRITON_KERNELS.format(sfx=sfx, sty=sty)
                   for sfx, sty in (("_s32", "fp32"), ("_s64", "fp64")))
    return _TRITON_HEAD + body + _TRITON_LAUNCH


# ---- one scenario: a fresh process ---------------------------------------------------------------
CHILD = r'''
import json, sys, time
t_start = time.perf_counter()
cfg = json.loads(sys.argv[1])
import torch
torch.cuda.init()
sys.path.insert(0, cfg["here"])
import _warmstart_gpu as g
specs = g.specs(cfg["kernels"])
gen = torch.Generator(device="cuda").manual_seed(0)
inputs = [g.make_inputs(sp, torch, gen) for sp in specs]
torch.cuda.synchronize()
t0 = time.perf_counter()  # ---- the clock: from here to all kernels run once
outs, origins, load_s, libload_s = [], {}, 0.0, [0.0]
if cfg["mode"] == "kp":
    import kernelpack as kp
    from kernelpack.runtime import call_program
    from _warmstart_fusions import fusion_jobs
    import kernelpack.runtime.launcher as _launcher
    _load_module = _launcher.load_module
    def _timed_load_module(*a, **k):  # how much of a first launch is loading the library
        t = time.perf_counter()
        try:
            return _load_module(*a, **k)
        finally:
            libload_s[0] += time.perf_counter() - t
    _launcher.load_module = _timed_load_module
    exec(cfg.get("stamps", ""))  # --stamps: timers around the steps (a run of its own)
    t_imp = time.perf_counter()
    cache = kp.Cache(cfg["disk"], remote=False)
    for (f, static), args in zip(fusion_jobs(cfg["kernels"]), inputs):
        t = time.perf_counter()
        try:  # one failing kernel is reported, not fatal to the other 49 figures
            c = kp.compile(f, targets=g.TARGETS, static=static, cache=cache)
            load_s += time.perf_counter() - t
            origins[c.origin] = origins.get(c.origin, 0) + 1
            outs.append(call_program(c, *args))
        except Exception as exc:
            outs.append(f"{type(exc).__name__}: {exc}"[:300])
elif cfg["mode"] == "floor":
    from cuda.bindings import driver as drv
    jobs = json.load(open(cfg["floor_jobs"]))
    t_imp = time.perf_counter()
    for path, name in jobs:  # the driver's share: load each kernel's image, make it resident
        with open(path, "rb") as fh:
            image = fh.read()
        err, lib = drv.cuLibraryLoadData(image, None, None, 0, None, None, 0)
        assert int(err) == 0, err
        err, kern = drv.cuLibraryGetKernel(lib, name.encode())
        assert int(err) == 0, err
        err, func = drv.cuKernelGetFunction(kern)
        assert int(err) == 0, err
        err, = drv.cuFuncLoad(func)
        assert int(err) == 0, err
        outs.append(lib)
else:
    import triton
    sys.path.insert(0, cfg["triton_dir"])
    import kp_ws_triton as tk
    t_imp = time.perf_counter()
    for (kind, dname, size, _, _), args in zip(specs, inputs):
        try:
            outs.append(tk.launch(kind, dname, size, args))
        except Exception as exc:
            outs.append(f"{type(exc).__name__}: {exc}"[:300])
torch.cuda.synchronize()
t1 = time.perf_counter()  # ---- the clock stops; the checks are untimed
max_err, bad = {}, []
for sp, args, out in zip(specs, inputs, outs if cfg["mode"] != "floor" else ()):
    if isinstance(out, str):  # it raised
        bad.append(f"{sp[0]}_{sp[1]} n={sp[2]}: {out}")
        continue
    err = g.check(sp, args, out, torch)
    max_err[sp[1]] = max(max_err.get(sp[1], 0.0), err)
    if not err <= g.TOL[sp[1]]:
        bad.append(f"{sp[0]}_{sp[1]} n={sp[2]}: {err:.2e}")
try:  # untimed: versions for the report
    import triton as _t
    triton_version = _t.__version__
except ImportError:
    triton_version = None
print(json.dumps({"pre_s": t0 - t_start, "import_s": t_imp - t0, "load_s": load_s,
                  "stamps": globals().get("STAMPED", {}), "work_us": (t1 - t_imp) * 1e6,
                  "libload_s": libload_s[0],
                  "work_s": t1 - t0, "origins": origins, "max_err": max_err, "bad": bad,
                  "n": len(outs) if cfg["mode"] != "floor" else 0,
                  "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "triton": triton_version,
                  "python": sys.version.split()[0]}))
'''


def _child(cfg: dict, env: dict[str, str], timeout: float) -> dict:
    """Run one scenario; its JSON line plus the process wall time, or ``{"error": ...}``."""
    start = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-1500:]}"}
    out = json.loads(lines[-1])
    out["wall_s"] = wall
    return out


def run_scenarios(n: int, repeat: int, tmp: Path, env: dict[str, str],
                  log: Callable[[str], None] = print, timeout: float = 300.0) -> dict:
    """kernelpack cold, warm disk; Triton cold, warm; the driver floor (warm rows: the median
    of ``repeat`` runs per figure, :func:`warmstart.median_run`; cold: one run)."""
    from warmstart import median_run

    triton_dir = tmp / "triton-src"
    triton_dir.mkdir()
    (triton_dir / "kp_ws_triton.py").write_text(triton_source())
    import compileall  # the Triton side's module gets its bytecode too (see warmstart._gpu_main)

    compileall.compile_dir(str(triton_dir), quiet=1)
    kp_cfg = {"mode": "kp", "kernels": n, "here": str(HERE), "disk": str(tmp / "kp-disk")}
    tr_cfg = {"mode": "triton", "kernels": n, "here": str(HERE), "triton_dir": str(triton_dir)}
    kp_env = dict(env, TRITON_CACHE_DIR=str(tmp / "triton-unused"))
    tr_env = dict(env, TRITON_CACHE_DIR=str(tmp / "triton-cache"))
    runs: dict[str, dict] = {}

    def one(name: str, cfg: dict, e: dict[str, str]) -> dict:
        r = _child(cfg, e, timeout)
        log(f"  {name}: " + (r["error"][-600:] if "error" in r else
                             f"{1000 * r['work_s']:.1f} ms, {r.get('origins') or ''} "
                             f"bad={len(r['bad'])} {r['bad'][:10]}"))
        return r

    runs["kernelpack cold"] = dict(one("kernelpack cold", kp_cfg, kp_env), runs=1)
    runs["Triton cold"] = dict(one("Triton cold", tr_cfg, tr_env), runs=1)
    try:
        fl_cfg: dict | None = {"mode": "floor", "kernels": n, "here": str(HERE),
                               "floor_jobs": str(_export_images(n, tmp, kp_cfg["disk"], env,
                                                                timeout))}
    except Exception as exc:  # reported; the other scenarios still run
        log(f"  driver floor: not measured: {exc}")
        fl_cfg = None
    warm: dict[str, list[dict]] = {"kernelpack warm disk": [], "Triton warm": [],
                                   "driver floor": []}
    for _ in range(repeat):  # interleaved, so that drift hits both alike
        warm["kernelpack warm disk"].append(one("kernelpack warm disk", kp_cfg, kp_env))
        warm["Triton warm"].append(one("Triton warm", tr_cfg, tr_env))
        if fl_cfg is not None:
            warm["driver floor"].append(one("driver floor", fl_cfg, kp_env))
    if fl_cfg is None:
        del warm["driver floor"]
    for name, rs in warm.items():
        runs[name] = median_run(rs)
    return {k: runs[k] for k in ("kernelpack cold", "kernelpack warm disk", "Triton cold",
                                 "Triton warm", "driver floor") if k in runs}


EXPORT = r'''
import json, sys
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["here"])
import kernelpack as kp
import _warmstart_gpu as g
from _warmstart_fusions import fusion_jobs
from kernelpack.runtime.device import get_device
from kernelpack.runtime.library import image_bytes
from kernelpack.runtime.selection import select_image
dev = get_device(0)
cache = kp.Cache(cfg["disk"], remote=False)
jobs = []
for i, (f, static) in enumerate(fusion_jobs(cfg["kernels"])):
    c = kp.compile(f, targets=g.TARGETS, static=static, cache=cache)
    launch = c.summary.variants[0].launches[0]
    module = next(m for m in c.modules if m.name == launch.module)
    image = select_image(module.images, dev.arch, dev.driver_version).chosen
    path = f"{cfg['out']}/{i:03d}.bin"
    with open(path, "wb") as fh:
        fh.write(image_bytes(image))
    jobs.append((path, launch.kernel))
json.dump(jobs, open(f"{cfg['out']}/jobs.json", "w"))
'''


def _export_images(n: int, tmp: Path, disk: str, env: dict[str, str], timeout: float) -> Path:
    """For the driver floor: the image the runtime picks for this GPU of each kernel's first
    launch, written to files (from the warm cache, in a separate untimed process)."""
    out = tmp / "floor-images"
    out.mkdir()
    cfg = {"kernels": n, "here": str(HERE), "disk": disk, "out": str(out)}
    r = subprocess.run([sys.executable, "-c", EXPORT, json.dumps(cfg)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"exporting the images failed: {r.stderr.strip()[-1500:]}")
    return out / "jobs.json"


def stamped_runs(n: int, repeat: int, tmp: Path, env: dict[str, str],
                 log: Callable[[str], None] = print, timeout: float = 300.0) -> list[dict]:
    """``--stamps``: ``repeat`` more warm kernelpack runs (after :func:`run_scenarios`, whose
    disk cache they read) with timers around the steps of a warm start
    (``_stamps.WARM_STAMPS``, summed over the kernels); untimed rows of their own."""
    import _stamps

    cfg = {"mode": "kp", "kernels": n, "here": str(HERE), "disk": str(tmp / "kp-disk"),
           "stamps": _stamps.install_code(_stamps.WARM_STAMPS)}
    kp_env = dict(env, TRITON_CACHE_DIR=str(tmp / "triton-unused"))
    runs = []
    for _ in range(repeat):
        r = _child(cfg, kp_env, timeout)
        if "error" in r or r["bad"] or r.get("origins") != {"disk": n}:
            log(f"  stamped run failed or missed the cache: {str(r)[-600:]}")
            continue
        log(f"  stamped warm disk: {1000 * r['work_s']:.1f} ms")
        runs.append(r)
    return runs


def stamped_section(runs: list[dict]) -> str:
    """Part (c) of the entry: where a warm start's time goes, from :func:`stamped_runs`."""
    import _stamps

    if not runs:
        return ""
    rows = _stamps.table(runs, "work_us", "from `import kernelpack` done to all run (stamped)",
                         _stamps.WARM_STAMPS, unit="ms", scale=1e-3,
                         rest_label="the rest (fusion objects, Python between the steps, "
                                    "the final sync)")
    return "\n".join(
        ["", f"(c) Where a warm start goes (`--stamps`: {len(runs)} more warm-disk runs with "
         f"timers around the steps, benchmarks/_stamps.py WARM_STAMPS; each step summed over "
         f"the kernels, medians over the runs; the clock starts after `import kernelpack`):",
         ""] + rows) + "\n"


def _ms(r: dict, key: str) -> str:
    return f"{1000 * r[key]:.1f}" if key in r else "—"


def gpu_report(runs: dict, n: int, repeat: int, stamp: str) -> str:
    """The markdown entry (a ``### GPU ...`` run for RESULTS.md's warmstart section)."""
    meta = next((r for r in runs.values() if "device" in r), {})
    cold = {"kernelpack": runs["kernelpack cold"], "Triton": runs["Triton cold"]}
    lines = [f"### GPU: {meta.get('device', 'unknown device')}, {stamp}", "",
             f"`benchmarks/warmstart.py --gpu`: {n} kernels (6 fusions x f32/f64/f16 x n "
             f"symbolic/1024/4096, in that order), each loaded **and run once** in a fresh "
             f"process on CUDA tensors (rows: b={ROWS}; symbolic n: {SYMBOLIC_N[2]} for rows, "
             f"{SYMBOLIC_N[1]} for vectors). Python {meta.get('python', '?')}, torch "
             f"{meta.get('torch', '?')}, Triton {meta.get('triton', '?')}; kernelpack targets "
             f"{'/'.join(TARGETS)}. Clock: from after `import torch; torch.cuda.init()` and "
             f"the inputs' allocation (done alike in every scenario; 'setup' column) to all "
             f"{n} outputs computed (`torch.cuda.synchronize()`); it includes `import "
             f"kernelpack` / `import triton`. Cold rows: one run; warm rows: median of "
             f"{repeat} runs per column (medians need not add up), their fastest clock in "
             f"'min'. Every output "
             f"checked against float64 torch after the clock (max |err| / max |ref|; "
             f"tolerance f64 {TOL['f64']:g}, f32 {TOL['f32']:g}, f16 {TOL['f16']:g}).", "",
             "| scenario | runs | to all run (ms) | min (ms) | import (ms) | kp.compile: "
             "compile / cache load (ms) | first launches + rest (ms) | setup, untimed (ms) | "
             "process wall (ms) | cold / this | outputs ok | max err f32 / f64 / f16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, r in runs.items():
        if "error" in r:
            last = r["error"].strip().splitlines()[-1][:200].replace("|", "/")
            lines.append(f"| {name} | 0 | failed: `{last}` | | | | | | | | | |")
            continue
        c = cold.get(name.split()[0], {})
        ratio = f"{c['work_s'] / r['work_s']:.1f}x" if "work_s" in c else "—"
        rest = r["work_s"] - r["import_s"] - r["load_s"]
        load = (_ms(r, "load_s") if name.startswith("kernelpack") else "—"
                if name == "driver floor" else "(in launches)")
        errs = " / ".join(f"{r['max_err'][d]:.1e}" if d in r["max_err"] else "—"
                          for d in ("f32", "f64", "f16"))
        shown = "; ".join(b[:120] for b in r["bad"][:4]).replace("|", "/")
        ok = (f"{r['n'] - len(r['bad'])}/{r['n']}" + (f" ({shown})" if r["bad"] else "")
              if r["n"] else "(loads only)")
        runs_cell = f"{r.get('runs', 1)}" + (f" ({r['failed']} failed)" if r.get("failed")
                                            else "")
        fastest = _ms(r, "min_work_s") if "min_work_s" in r else _ms(r, "work_s")
        origins = f" {r['origins']}" if r.get("origins") else ""
        lines.append(f"| {name}{origins} | {runs_cell} | {_ms(r, 'work_s')} | {fastest} | "
                     f"{_ms(r, 'import_s')} | {load} "
                     f"| {1000 * rest:.1f} | {_ms(r, 'pre_s')} | {_ms(r, 'wall_s')} | {ratio} "
                     f"| {ok} | {errs} |")
    lines.append("")
    kc, kw, tw = runs["kernelpack cold"], runs["kernelpack warm disk"], runs["Triton warm"]
    if "work_s" in kc and "work_s" in kw:
        x = kc["work_s"] / kw["work_s"]
        lines.append(f"- kernelpack cold / warm disk: **{x:.0f}x** (target >= 100x: "
                     f"{'yes' if x >= 100 else 'no'})")
    if "libload_s" in kw:
        lines.append(f"- of kernelpack warm disk's first launches, "
                     f"{1000 * kw['libload_s']:.1f} ms are `load_module` (image selection, "
                     f"`cuLibraryLoadData`, `cuLibraryGetKernel` of every kernel)")
    if "work_s" in tw and "work_s" in kw:
        x = tw["work_s"] / kw["work_s"]
        lines.append(f"- Triton warm / kernelpack warm disk: **{x:.1f}x** (target >= 20x: "
                     f"{'yes' if x >= 20 else 'no'})")
    fl = runs.get("driver floor", {})
    if "work_s" in fl and "work_s" in kw and "work_s" in tw:
        lines.append(f"- driver floor (per kernel: read the image the runtime picks, "
                     f"`cuLibraryLoadData` + `cuLibraryGetKernel` + `cuKernelGetFunction` + "
                     f"`cuFuncLoad`; no Python package imported in the clock, no launch): "
                     f"{1000 * fl['work_s']:.1f} ms; kernelpack warm disk / floor = "
                     f"{kw['work_s'] / fl['work_s']:.1f}x; Triton warm / floor = "
                     f"{tw['work_s'] / fl['work_s']:.1f}x (so 20x below Triton warm is "
                     f"{1000 * tw['work_s'] / 20:.1f} ms, "
                     f"{'above' if tw['work_s'] / 20 > fl['work_s'] else 'below'} the floor)")
    lines.append("- warm Redis: not measured on the GPU host (no redis-server there, no "
                 "network); see the CPU-side runs below for the Redis tier.")
    return "\n".join(lines) + "\n"
