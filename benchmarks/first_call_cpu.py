"""Python-side cost of ``kp.load(path)`` and a program's first call, on CPU (no GPU needed).

What ``benchmarks/load_gpu.py`` times on a GPU (a fresh process: ``kp.load(path)``, then
``pack["axpy_000"](x, y, a)``), with the driver replaced by the CPU tests' fake
(``tests/runtime/fake_driver.py``) so that what is left is kernelpack's own Python: importing
the runtime modules, verifying and opening the pack, decoding the summary, binding the
program, choosing, checking and decompressing the image, and the launch path of a first call.

Each child process sets up before the clock what the GPU benchmark's children have before
theirs: ``import kernelpack``, a driver (by default a ``cuda.bindings.driver``: the fake, as a
module, every ``cu*`` call timed; with ``--driver libcuda`` kernelpack's own ctypes door,
``runtime/libcuda.py``, which is what a Linux GPU host takes, over the C-level fake of
``tests/runtime/c_fake_driver.py``: ``ctypes.CDLL("libcuda.so.1")`` (the ctypes door) and
the C door's dlopen hand out the fake's ``cuGetProcAddress_v2``, the fake's ctypes function classes are dropped from ctypes' cache as
a GPU host's process has never made them, and every entry point's Python side is timed as
the driver's; ctypes' callback trampolines into the fake are not, so this door's "Python"
column includes up to a few µs per driver call that a real driver does not cost: about 30
calls in a first call), and the inputs (a stand-in ``torch`` whose tensors answer like torch's,
or with ``--arrays cai`` plain objects exporting ``__cuda_array_interface__``). Then it times

  load       ``pack = kp.load(path)``
  first      ``pack[name](x, y, a)``, split into the fake driver's own time (its ``cu*`` calls
             and the C launch entry) and the rest: kernelpack's Python

in two configurations, interleaved, each ``--reps`` fresh processes (medians):

  plain         whatever the load path still imports is imported inside the clock, as in a
                real first call;
  imports done  every module the plain run imported inside the clock is imported before it,
                so "plain - imports done" is the import cost of the load path.

Since ``import kernelpack`` imports the load path itself (loader and runtime modules, before
the clock here, as in load_gpu.py's children), the plain run normally imports no module inside
the clock, and the two configurations are then the same program run twice: their difference
is noise, which the output says (with the count of modules imported inside the clock). The
pair stays as a check that nothing moves back inside the clock.

The artifact is the GPU benchmark's: axpy (y = a*x + y, f32) from ``examples/axpy.ptx`` as
``kp.external`` with cubins for sm_80 and sm_90 (compiled with nvJitLink, which needs no
GPU; zstd-compressed in the file, as the serializer stores them), the fake device an sm_90.
Without nvJitLink the images are stand-in bytes of the same sizes (noted in the output).
kernelpack's bytecode is compiled once before timing (as an installed package's is), since
this machine may set PYTHONDONTWRITEBYTECODE.

    python benchmarks/first_call_cpu.py [--reps N] [--programs 1,100] [--arrays torch|cai]
        [--driver bindings|libcuda] [--stdlib MODS] [--against OLD_SRC] [--importtime]
        [--profile] [--stamps] [--json FILE]

``--against OLD_SRC`` also times the package under another source directory (a copy of
``src/`` before a change), interleaved, for a before/after on a noisy machine;
``--importtime`` adds a ``python -X importtime`` table of the modules imported inside the
clock; ``--profile`` a cProfile of load + first call (imports done) by cumulative time;
``--stamps`` the same load + first call with timers around its steps (``_stamps.py``).
"""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = ROOT / "src"
FAKES = ROOT / "tests" / "runtime"
A = 2.0
N = 1 << 20
BLOCK = 256

# Untimed set-up of every child: the fake driver as ``cuda.bindings.driver`` (every cu* call
# timed into SPENT), the stand-in torch and the inputs, ``import kernelpack``.
PRELUDE = r'''
import json, sys, time, types
sys.path.insert(0, FAKES)
import fake_driver as fd

SPENT = [0.0, 0]  # seconds inside the fake driver, calls


class TimedFake(fd.FakeDriver):
    def _c_launch(self, *args):  # the C entry point kernelpack's extension calls
        t = time.perf_counter()
        try:
            return super()._c_launch(*args)
        finally:
            SPENT[0] += time.perf_counter() - t
            SPENT[1] += 1


fake = TimedFake(arch=(9, 0), version=13000, kernels={"axpy": ("QQfI", lambda *a: None)})


class DriverModule(types.ModuleType):
    """``cuda.bindings.driver``: the fake's attributes, each cu* function timed."""

    def __getattr__(self, name):
        value = getattr(fake, name)
        if name.startswith("cu") and callable(value) and not isinstance(value, type):
            def timed(*args, _f=value):
                t = time.perf_counter()
                try:
                    return _f(*args)
                finally:
                    SPENT[0] += time.perf_counter() - t
                    SPENT[1] += 1
            value = timed
        setattr(self, name, value)
        return value


if DRIVER == "bindings":
    cuda = types.ModuleType("cuda")
    cuda.__path__ = []
    bindings = types.ModuleType("cuda.bindings")
    bindings.__path__ = []
    driver = DriverModule("cuda.bindings.driver")
    cuda.bindings, bindings.driver = bindings, driver
    sys.modules.update({"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.driver": driver})
else:  # the GPU's door: kernelpack's ctypes driver (runtime/libcuda.py) over a C-level fake
    import ctypes
    functypes = dict(ctypes._c_functype_cache)
    import c_fake_driver

    class TimedCFake(c_fake_driver.CFakeLibcuda):
        def _guard(self, fn):  # every entry point's Python side timed (not ctypes' trampoline)
            guarded = super()._guard(fn)

            def timed(*args):
                t = time.perf_counter()
                try:
                    return guarded(*args)
                finally:
                    SPENT[0] += time.perf_counter() - t
                    SPENT[1] += 1
            return timed

        def _get_proc_address(self, *args):  # the fake's lookup (cuGetProcAddress_v2) too
            t = time.perf_counter()
            try:
                return super()._get_proc_address(*args)
            finally:
                SPENT[0] += time.perf_counter() - t
                SPENT[1] += 1

    cfake = TimedCFake(fake)
    # ctypes caches CFUNCTYPE classes by signature: forget the ones the fake's entry points
    # made, which a GPU host's process has not (they stay alive with the fake)
    ctypes._c_functype_cache.clear()
    ctypes._c_functype_cache.update(functypes)
    real_cdll = ctypes.CDLL

    def CDLL(name, *args, **kwargs):  # "libcuda.so.1": the fake's cuGetProcAddress_v2
        if name == "libcuda.so.1":
            return types.SimpleNamespace(cuGetProcAddress_v2=cfake.get_proc_address)
        return real_cdll(name, *args, **kwargs)
    ctypes.CDLL = CDLL
    # the C door (runtime/_drvcall.c) opens libcuda with dlopen: the fake's address instead
    import kernelpack.runtime.libcuda as _libcuda
    _libcuda._symbol = lambda library, name: ctypes.cast(cfake.get_proc_address,
                                                         ctypes.c_void_p).value


if ARRAYS == "torch":
    import ctypes

    class Dtype:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return "torch." + self.name

    class Tensor:
        """Methods are bound builtins, as cheap to call as torch's own."""
        __slots__ = ("dtype", "shape", "data_ptr", "get_device", "is_contiguous", "is_conj",
                     "is_neg")

        def __init__(self, n, dtype, ptr):
            self.dtype, self.shape = dtype, (n,)
            self.data_ptr = ptr.__index__
            self.get_device = (0).__index__
            self.is_contiguous = True.__bool__
            self.is_conj = self.is_neg = False.__bool__  # torch's lazy-view bits

    torch = types.ModuleType("torch")
    torch.float32 = Dtype("float32")
    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=(0).__mul__)
    sys.modules["torch"] = torch
    x, y = Tensor(N, torch.float32, 0x10000000), Tensor(N, torch.float32, 0x20000000)
else:
    class CudaArray:
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {"shape": (N,), "typestr": "<f4",
                                             "data": (ptr, False), "strides": None,
                                             "version": 3}

    x, y = CudaArray(0x10000000), CudaArray(0x20000000)

import importlib
for mod in STDLIB:  # what the caller's framework has imported already
    importlib.import_module(mod)
import kernelpack as kp
for mod in PRELOAD:  # the 'imports done' configuration
    importlib.import_module(mod)
'''

TIMED = r'''
before = set(sys.modules)
sys.stderr.write("@@clock@@\n")
sys.stderr.flush()
t0 = time.perf_counter()
pack = kp.load(PATH)
t1 = time.perf_counter()
spent0 = SPENT[0]
result = pack[NAME](x, y, A)
t2 = time.perf_counter()
assert result is None and fake.calls, "the fake driver saw no launch"
launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
assert len(launches) == 1 and launches[0][6][2:] == (A, N), launches
print(json.dumps({"load_us": (t1 - t0) * 1e6, "first_us": (t2 - t1) * 1e6,
                  "total_us": (t2 - t0) * 1e6,
                  "driver_us": (SPENT[0] - spent0) * 1e6, "driver_calls": SPENT[1],
                  "new_modules": sorted(set(sys.modules) - before),
                  "stamps": globals().get("STAMPED", {})}))
'''

PROFILED = r'''
import cProfile, pstats, io
prof = cProfile.Profile()
prof.enable()
pack = kp.load(PATH)
pack[NAME](x, y, A)
prof.disable()
# in µs: pstats' own table rounds to milliseconds, which hides a first call's parts
rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][3])[:60]
print(f"{'calls':>7} {'own µs':>9} {'cum µs':>9}  function")
for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
    print(f"{nc:>7} {tt * 1e6:>9.1f} {ct * 1e6:>9.1f}  {file.split('/src/')[-1]}:{line}({fn})")
'''


def child_code(path: Path, name: str, arrays: str, preload: list[str], body: str,
               stdlib: tuple[str, ...] = (), driver: str = "bindings") -> str:
    """The child's source: set-up (see PRELUDE; ``stdlib`` and ``preload`` are imported before
    the clock), then ``body``."""
    head = (f"FAKES = {str(FAKES)!r}\nARRAYS = {arrays!r}\nN, A = {N}, {A}\n"
            f"DRIVER = {driver!r}\n"
            f"PATH, NAME = {str(path)!r}, {name!r}\nPRELOAD = {preload!r}\n"
            f"STDLIB = {list(stdlib)!r}\n")
    return head + PRELUDE + body


def _summary(i: int) -> Any:
    """What ``kp.external("axpy_NNN", "axpy", ..., args=["x", "y", "a", (n, u32)])`` makes,
    as in benchmarks/load_gpu.py."""
    import kernelpack as kp
    from kernelpack.summary import Arg, KernelSummary, Launch, Variant

    return KernelSummary(
        f"axpy_{i:03d}",
        (kp.Tensor("x", kp.f32, ("n",)), kp.Tensor("y", kp.f32, ("n",), role="inout"),
         kp.Scalar("a", kp.f32)),
        (Variant((Launch("axpy", f"m{i:03d}", (kp.cdiv("n", BLOCK),), (BLOCK,),
                         (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"),
                          Arg.of(kp.sym("n"), kp.u32))),)),))


def build_artifacts(workdir: Path, counts: list[int]) -> tuple[dict[int, Path], str]:
    """Artifacts of ``counts`` axpy programs, each its own module with the same two cubins
    (as the GPU benchmark's), and how the images were made."""
    import kernelpack as kp
    from kernelpack.summary import Compiled, Image, Module

    try:
        made = kp.external("axpy_000", "axpy",
                           [kp.Tensor("x", kp.f32, ("n",)),
                            kp.Tensor("y", kp.f32, ("n",), role="inout"),
                            kp.Scalar("a", kp.f32)],
                           grid=kp.cdiv("n", BLOCK), block=BLOCK,
                           ptx=(ROOT / "examples" / "axpy.ptx").read_text(),
                           targets=["sm_80", "sm_90"], module="m000",
                           args=["x", "y", "a", (kp.sym("n"), kp.u32)])
        assert made.summary == _summary(0), "the hand-made summary drifted from kp.external's"
        images = made.modules[0].images
        how = "cubins sm_80 + sm_90 from nvJitLink"
    except kp.CompileError as exc:  # no nvJitLink here: stand-in bytes of a cubin's size
        images = tuple(Image("cubin", arch, b"\x7fELF" + bytes((i * 7 + i // 13) % 251
                                                               for i in range(3600)),
                             "stand-in", 13000) for arch in ("sm_80", "sm_90"))
        how = f"stand-in cubin bytes (nvJitLink unavailable: {exc})"
    programs = [Compiled(_summary(i), (Module(f"m{i:03d}", ("axpy",), images),))
                for i in range(max(counts))]
    paths = {}
    for count in counts:
        paths[count] = workdir / f"axpy{count}.kpack"
        kp.save(programs[:count], str(paths[count]))
    return paths, how


def run_child(code: str, env: dict[str, str], flags: tuple[str, ...] = ()) -> tuple[str, str]:
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"child exited {proc.returncode}:\n{tail}")
    return proc.stdout, proc.stderr


def result_of(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])


def import_table(stderr: str, top: int = 25) -> list[str]:
    """The ``-X importtime`` lines after the clock started, largest cumulative first."""
    rows = []
    for line in stderr.split("@@clock@@", 1)[-1].splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cum, name = line.split(":", 1)[1].split("|")
        rows.append((int(cum), int(own), name.strip()))
    out = [f"`-X importtime` (one run; the flag adds overhead): {len(rows)} modules imported "
           f"inside the clock, {sum(r[1] for r in rows) / 1e3:.1f} ms self time in all", "",
           "| cumulative µs | self µs | module |", "|---:|---:|---|"]
    out += [f"| {cum} | {own} | `{name}` |" for cum, own, name in sorted(rows, reverse=True)[:top]]
    return out


# What ``import torch`` has imported before a real first call (the GPU benchmark imports torch
# before its clock): the standard-library modules kernelpack's load path would otherwise pull in.
TORCH_STDLIB = ("ctypes", "hashlib", "math", "platform", "threading")


def label(count: int) -> str:
    return f"{count} program{'s' if count > 1 else ''}"


def summarize(runs: dict[str, list[dict]], notes: dict[str, list[str]]) -> list[str]:
    """The markdown table of the medians, and the import cost per artifact and tree."""
    def med(rows: list[dict], f: Any) -> float:
        return statistics.median(f(r) for r in rows)

    out = ["| configuration | kp.load µs | first call µs | of which fake driver µs | "
           "first call Python µs | load + first call µs |", "|---|---:|---:|---:|---:|---:|"]
    for key, rows in runs.items():
        out.append(f"| {key} | {med(rows, lambda r: r['load_us']):.0f} | "
                   f"{med(rows, lambda r: r['first_us']):.0f} | "
                   f"{med(rows, lambda r: r['driver_us']):.0f} | "
                   f"{med(rows, lambda r: r['first_us'] - r['driver_us']):.0f} | "
                   f"{med(rows, lambda r: r['load_us'] + r['first_us']):.0f} |")
    out.append("")
    for key, mods in notes.items():
        total = [med(runs[f"{key}, {k}"], lambda r: r["load_us"] + r["first_us"])
                 for k in ("plain", "imports done")]
        if not mods:
            out.append(f"{key}: the plain run imported no module inside the clock (`import "
                       f"kernelpack`, before it, imports the load path), so 'plain' and "
                       f"'imports done' are the same configuration: their difference, "
                       f"{total[0] - total[1]:.0f} µs, is noise")
            continue
        out.append(f"{key}: imports inside the clock ≈ {total[0] - total[1]:.0f} µs (plain − "
                   f"imports done), {len(mods)} modules: {', '.join(mods)}")
    return out


def main() -> int:
    sys.path.insert(0, str(HERE))
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--reps", type=int, default=25,
                    help="fresh processes per configuration (default 25)")
    ap.add_argument("--programs", default="1",
                    help="comma-separated program counts of the artifacts (default 1; the "
                         "GPU benchmark also uses 100)")
    ap.add_argument("--driver", choices=("bindings", "libcuda"), default="bindings",
                    help="the driver door: a fake cuda.bindings.driver module (default), or "
                         "kernelpack's ctypes door (runtime/libcuda.py, what a GPU host uses) "
                         "over the C-level fake of tests/runtime/c_fake_driver.py")
    ap.add_argument("--arrays", choices=("torch", "cai"), default="torch",
                    help="inputs: stand-in torch tensors (default) or "
                         "__cuda_array_interface__ objects")
    ap.add_argument("--stdlib", default=",".join(TORCH_STDLIB),
                    help="standard-library modules imported before the clock, as a real "
                         "torch process has them (default %(default)s; '' for none)")
    ap.add_argument("--against", action="append", default=[], metavar="SRC",
                    help="also time the kernelpack package under this source directory (e.g. "
                         "an older copy of src/), interleaved with this tree's; repeatable")
    ap.add_argument("--importtime", action="store_true",
                    help="also show -X importtime of the modules imported inside the clock")
    ap.add_argument("--profile", action="store_true",
                    help="also show a cProfile of load + first call (imports done)")
    ap.add_argument("--stamps", action="store_true",
                    help="also time the load path's steps (benchmarks/_stamps.py: timers "
                         "around its main functions, imports done), --reps processes")
    ap.add_argument("--json", help="write the raw runs here")
    args = ap.parse_args()
    counts = sorted({int(c) for c in args.programs.split(",") if c})
    stdlib = tuple(m for m in args.stdlib.split(",") if m)
    sys.path.insert(0, str(SRC))
    trees = {"": SRC, **{f"{src}: ": Path(src).resolve() for src in args.against}}
    envs = {}
    for tag, src in trees.items():
        compileall.compile_dir(str(src / "kernelpack"), quiet=1)  # as an install would
        env = envs[tag] = dict(os.environ)
        env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
        env.pop("PYTHONPYCACHEPREFIX", None)  # read the bytecode compileall just wrote
        # the fake stands in for cuda.bindings.driver: the runtime must take that door (by
        # default it opens libcuda.so.1 through ctypes, which a CPU machine lacks)
        env["KERNELPACK_DRIVER"] = "cuda-bindings" if args.driver == "bindings" else "auto"
    workdir = Path(tempfile.mkdtemp(prefix="kp-first-call-"))
    paths, how = build_artifacts(workdir, counts)
    started = time.perf_counter()
    configs: dict[str, tuple[str, dict[str, str]]] = {}
    notes: dict[str, list[str]] = {}
    names = {c: "axpy_000" if c == 1 else f"axpy_{c // 2:03d}" for c in counts}
    for count in counts:
        for tag, env in envs.items():
            key = f"{tag}{label(count)}"
            plain = child_code(paths[count], names[count], args.arrays, [], TIMED, stdlib,
                               args.driver)
            notes[key] = [m for m in result_of(run_child(plain, env)[0])["new_modules"]
                          if not m.startswith("__")]
            configs[f"{key}, plain"] = (plain, env)
            configs[f"{key}, imports done"] = (child_code(
                paths[count], names[count], args.arrays, notes[key], TIMED, stdlib,
                args.driver), env)
    runs: dict[str, list[dict]] = {k: [] for k in configs}
    for _ in range(args.reps):  # interleaved, so that a busy moment hits every row
        for key, (code, env) in configs.items():
            runs[key].append(result_of(run_child(code, env)[0]))
    print(f"artifacts: {how}; arrays: {args.arrays}; driver: {args.driver}; "
          f"imported before the clock: kernelpack"
          f"{', ' + ', '.join(stdlib) if stdlib else ''}; {args.reps} fresh processes per row "
          f"(medians), {time.perf_counter() - started:.0f} s; python {sys.version.split()[0]}")
    print()
    print("\n".join(summarize(runs, notes)))
    first = counts[0]
    if args.importtime:
        code = child_code(paths[first], names[first], args.arrays, [], TIMED, stdlib,
                          args.driver)
        print()
        print("\n".join(import_table(run_child(code, envs[""], ("-X", "importtime"))[1])))
    if args.profile:
        code = child_code(paths[first], names[first], args.arrays, notes[label(first)],
                          PROFILED, stdlib, args.driver)
        print()
        print(run_child(code, envs[""])[0])
    if args.stamps:
        import _stamps

        code = child_code(paths[first], names[first], args.arrays, notes[label(first)],
                          _stamps.install_code() + TIMED, stdlib, args.driver)
        stamped = [result_of(run_child(code, envs[""])[0]) for _ in range(args.reps)]
        print(f"\nWhere {label(first)}'s load + first call goes (imports done; timers around "
              f"the steps, medians of {args.reps} processes; the fake driver's time is in the "
              f"steps that call it):\n")
        print("\n".join(_stamps.table(stamped, "total_us", "kp.load + first call")))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "modules": notes, "how": how,
                                               "stdlib": stdlib, "driver": args.driver}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
