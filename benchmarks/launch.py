"""Host overhead per launch of a small kernel, kernelpack against its peers, in one run.

Each method launches ``z = a*x + y`` (n = 1024 float32) 1000 times back to back, then
synchronizes; the time per launch is the median over many repetitions, with the methods
interleaved so that clock drift hits all of them alike. Every method's result is checked
against torch before anything is timed.

Methods: raw ``cuLaunchKernel`` with a prepacked parameter block (the floor, through
cuda.bindings), the same driver entry point called through kernelpack's C extension
(``runtime/_launch.c``: the driver's own cost plus one C call, the lowest floor a Python caller
can reach) and through ctypes (releasing / holding the GIL: slower than cuda.bindings' Cython
wrapper), kernelpack with
``out=``, kernelpack allocating its output (torch in, torch out), the same two calls made on
the runtime's entry (``program._kp_bound.call``, i.e. without ``Program.__call__``), the
``out=`` call asking the driver for the current context on every call (what the fast path
does with several GPUs), kernelpack with cupy arrays (out= and allocating), CuPy ``RawModule`` kernel (the same
cubin), a Triton kernel, and the torch op ``torch.add(y, x, alpha=a)``. The CuPy and Triton
kernels write a preallocated output; each also has an "allocating" row that makes its output
first (``cupy.empty_like`` / ``torch.empty_like``), the like-for-like peer of kernelpack
allocating. It also prints the
cost of the pieces of a call (torch attribute reads, allocation forms, a lock, ...).

kernelpack launches through its C extension unless ``KERNELPACK_NATIVE_LAUNCH=0`` (then through
cuda.bindings, as before the extension existed); the table's header says which, so running the
script once each way compares the two.

The target line states kernelpack ``out=`` against both floors: cuda.bindings'
``cuLaunchKernel`` (the issue's "raw cuLaunchKernel with prepacked params") and the same
driver entry called through kernelpack's C extension (the lower one). Every method's result
is checked before timing (the value it returns where it allocates, the preallocated output
otherwise).

Usage: ``python benchmarks/launch.py [--reps 25] [--launches 1000] [--results FILE]
[--compare FASTPATH_PY]``; prints a table and ratios and adds a markdown entry (device,
driver, date) at the top of this script's own section of ``--results`` (default
``benchmarks/RESULTS.md``; the section between ``<!-- benchmarks/launch.py: begin -->`` and
``<!-- benchmarks/launch.py: end -->``, made from the older unmarked section on first use).
``--compare`` times another version of ``runtime/fastpath.py`` in the same run (rows "before:
..."), e.g. ``git show REV:src/kernelpack/runtime/fastpath.py > /tmp/before.py``.
"""

from __future__ import annotations

import ctypes
import datetime
import struct
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from _gpu_timing import per_call_us  # noqa: E402

N = 1024
A = 2.0


def build(torch):  # type: ignore[no-untyped-def]
    import runtime_kernels as kernels

    pack = kernels.make_pack([kernels.axpby(targets=("sm_80", "sm_90", "ptx"))])
    return pack["axpby"], pack


def raw_launcher(pack, x, y, z):  # type: ignore[no-untyped-def]
    """The floor: our own library handle, a prepacked slot block, one driver call per launch."""
    from cuda.bindings import driver as drv

    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.library import image_bytes
    from kernelpack.runtime.selection import select_image

    dev = get_device(x.device.index or 0)
    image = select_image(pack.modules["axpby"].images, dev.arch, dev.driver_version).chosen
    err, lib = drv.cuLibraryLoadData(image_bytes(image), None, None, 0, None, None, 0)
    assert not err, err
    err, kernel = drv.cuLibraryGetKernel(lib, b"axpby")
    assert not err, err
    func = drv.CUfunction(int(kernel))
    fmt = struct.Struct("@QQQfI")
    block = ctypes.create_string_buffer(fmt.size)
    fmt.pack_into(block, 0, x.data_ptr(), y.data_ptr(), z.data_ptr(), A, N)
    base = ctypes.addressof(block)
    offsets = (0, 8, 16, 24, 28)
    params = (ctypes.c_void_p * 5)(*[base + o for o in offsets])
    addr = ctypes.addressof(params)
    stream = drv.CUstream(0)
    grid = (N + 255) // 256
    launch = drv.cuLaunchKernel

    def run() -> None:
        launch(func, grid, 1, 1, 256, 1, 1, 0, stream, addr, 0)

    run.keep = (block, params, lib)  # type: ignore[attr-defined]
    run.parts = (func, grid, stream, addr)  # type: ignore[attr-defined]
    return run


def ctypes_launchers(floor):  # type: ignore[no-untyped-def]
    """The same prepacked launch called through ctypes on the driver's ``cuLaunchKernel``
    entry point (``cuGetProcAddress``), releasing the GIL (``CFUNCTYPE``) and holding it
    (``PYFUNCTYPE``): is there a cheaper door to the driver than cuda.bindings? (On an H200
    host, 2026-11-22: no, ctypes costs ~2 µs more per launch.)"""
    from cuda.bindings import driver as drv

    func, grid, _, addr = floor.parts
    err, address, status = drv.cuGetProcAddress(b"cuLaunchKernel", 4000, 0)[:3]
    assert not err and int(address) and not int(status), (err, status)
    c = ctypes
    argtypes = (c.c_void_p, c.c_uint, c.c_uint, c.c_uint, c.c_uint, c.c_uint, c.c_uint,
                c.c_uint, c.c_void_p, c.c_void_p, c.c_void_p)
    f = int(func)
    out = {}
    for label, proto in (("releasing the GIL", c.CFUNCTYPE), ("holding the GIL", c.PYFUNCTYPE)):
        launch = proto(c.c_int, *argtypes)(int(address))

        def run(launch=launch) -> None:  # type: ignore[no-untyped-def]
            launch(f, grid, 1, 1, 256, 1, 1, 0, 0, addr, 0)

        out[f"raw cuLaunchKernel via ctypes, {label}"] = run
    return out


def c_extension_launcher(floor):  # type: ignore[no-untyped-def]
    """The prepacked launch through kernelpack's C extension (``runtime/_launch.c``), bound to
    the driver's entry point by the runtime; None when the extension is not built."""
    from kernelpack.runtime.native import launcher

    if not launcher().native:
        return None
    from kernelpack.runtime import _launch

    func, grid, _, addr = floor.parts
    f, launch = int(func), _launch.launch

    def run() -> None:
        launch(f, grid, 1, 1, 256, 1, 1, 0, 0, addr, 0)

    return run


def cupy_launcher(pack, x, y):  # type: ignore[no-untyped-def]
    import cupy as cp

    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.library import image_bytes
    from kernelpack.runtime.selection import select_image

    dev = get_device(0)
    image = select_image(pack.modules["axpby"].images, dev.arch, dev.driver_version).chosen
    path = Path(tempfile.mkdtemp()) / "axpby.cubin"
    path.write_bytes(image_bytes(image))
    kern = cp.RawModule(path=str(path)).get_function("axpby")
    xc, yc = cp.asarray(x), cp.asarray(y)
    zc = cp.empty_like(xc)
    a, n = cp.float32(A), cp.uint32(N)
    grid = ((N + 255) // 256,)

    def run() -> None:
        kern(grid, (256,), (xc, yc, zc, a, n))

    def run_allocating():  # type: ignore[no-untyped-def]
        out = cp.empty_like(xc)
        kern(grid, (256,), (xc, yc, out, a, n))
        return out

    return run, run_allocating, zc, xc, yc


def triton_launcher(x, y, z):  # type: ignore[no-untyped-def]
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def axpby_kernel(x_ptr, y_ptr, z_ptr, a, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(z_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                 mask=mask)

    grid = ((N + 255) // 256,)

    def run() -> None:
        axpby_kernel[grid](x, y, z, A, N, BLOCK=256)

    def run_allocating():  # type: ignore[no-untyped-def]
        out = torch.empty_like(x)
        axpby_kernel[grid](x, y, out, A, N, BLOCK=256)
        return out

    return run, run_allocating


def breakdown(torch, x, floor) -> list[str]:  # type: ignore[no-untyped-def]
    """Costs of the pieces of a call (µs, median of 5 timings of 20,000 calls), to see where
    host time goes."""
    import threading
    import timeit

    from cuda.bindings import driver as drv

    raw = torch._C._cuda_getCurrentRawStream
    dev = torch.device("cuda", x.get_device())
    f32, T, shape = torch.float32, torch.Tensor, x.shape
    local = threading.local()
    local.ts = 1
    lock = threading.Lock()
    block = ctypes.create_string_buffer(32)
    fmt = struct.Struct("@QQQfI")
    func, grid, stream, addr = floor.parts
    launch = drv.cuLaunchKernel

    def locked() -> None:
        with lock:
            pass

    pieces = {
        "cuCtxGetCurrent": lambda: drv.cuCtxGetCurrent(),
        "x.data_ptr()": x.data_ptr, "x.shape": lambda: x.shape, "x.dtype": lambda: x.dtype,
        "x.__class__ is T": lambda: x.__class__ is T,
        "x.get_device()": x.get_device, "x.is_contiguous()": x.is_contiguous,
        "torch raw current stream": lambda: raw(0),
        "threading.local read": lambda: local.ts, "lock acquire+release": locked,
        "Struct.pack_into 5 values": lambda: fmt.pack_into(block, 0, 1, 2, 3, 2.0, 4),
        "empty lambda (timing floor)": lambda: None,
        "cuLaunchKernel(CUfunction, CUstream obj)":
            lambda: launch(func, grid, 1, 1, 256, 1, 1, 0, stream, addr, 0),
        "cuLaunchKernel(CUfunction, int stream)":
            lambda: launch(func, grid, 1, 1, 256, 1, 1, 0, 0, addr, 0),
        "torch.empty(n, dtype, device=x.device)": lambda: torch.empty(N, dtype=f32, device=x.device),
        "torch.empty((n,), dtype, int device)": lambda: torch.empty((N,), dtype=f32, device=0),
        "torch.empty(shape, dtype, cached device)": lambda: torch.empty(shape, dtype=f32, device=dev),
        "x.new_empty(shape)": lambda: x.new_empty(shape),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "torch.empty(n, dtype, cached device)": lambda: torch.empty(N, dtype=f32, device=dev),
        "torch.empty(*shape, dtype, cached device)": lambda: torch.empty(*shape, dtype=f32,
                                                                         device=dev),
        "torch._C._cuda_getDevice()": torch._C._cuda_getDevice,
    }
    import statistics

    out = []
    for name, fn in pieces.items():
        n = 20000
        us = statistics.median(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
        out.append(f"{name}: {us:.3f} us")
    return out


def _load_fastpath(path: str):  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernelpack.runtime._fastpath_compare", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--reps", type=int, default=25,
                    help="samples per method, the methods interleaved; the median sample is "
                         "reported (default 25)")
    ap.add_argument("--launches", type=int, default=1000,
                    help="back-to-back launches per sample, then a sync (default 1000)")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "RESULTS.md"),
                    help="the markdown file whose launch.py section gets the entry (default "
                         "benchmarks/RESULTS.md)")
    ap.add_argument("--compare", help="another version of runtime/fastpath.py (e.g. from git "
                    "show): its fast path is timed in the same run as 'before' rows")
    opts = ap.parse_args()

    import torch

    x = torch.randn(N, device="cuda")
    y = torch.randn(N, device="cuda")
    z = torch.empty_like(x)
    want = A * x + y
    prog, pack = build(torch)

    fns: dict[str, Callable[[], None]] = {}
    notes: list[str] = []
    fns["raw cuLaunchKernel (floor)"] = raw_launcher(pack, x, y, z)
    c_floor = c_extension_launcher(fns["raw cuLaunchKernel (floor)"])
    if c_floor is not None:
        fns["raw cuLaunchKernel via kernelpack's C extension"] = c_floor
    fns.update(ctypes_launchers(fns["raw cuLaunchKernel (floor)"]))
    fns["kernelpack out="] = lambda: prog(x, y, A, out=z)
    fns["kernelpack allocating"] = lambda: prog(x, y, A)
    prog(x, y, A, out=z)  # the first call binds (general path); the second builds the fast path
    prog(x, y, A, out=z)
    direct = prog._kp_bound.call  # what Program.__call__ reaches, minus its own frames
    args = (x, y, A)
    fns["kernelpack out= (runtime entry only)"] = lambda: direct(args, z, None)
    fns["kernelpack allocating (runtime entry only)"] = lambda: direct(args, None, None)
    from kernelpack.runtime import fastpath
    trust, fastpath._trust_thread_context = fastpath._trust_thread_context, lambda: False
    try:  # the same fast path, asking the driver for the current context on every call
        asking = fastpath.make_fast_path(prog._kp_bound, prog._kp_bound.__call__)[0]
    finally:
        fastpath._trust_thread_context = trust
    fns["kernelpack out= (runtime entry, cuCtxGetCurrent each call)"] = \
        lambda: asking(args, z, None)
    from kernelpack.runtime import fast_torch
    native_call, fast_torch.native_torch_call = fast_torch.native_torch_call, \
        lambda *a: None
    try:  # the Python closure that the C fast path replaces (same launcher)
        closure = fastpath.make_fast_path(prog._kp_bound, prog._kp_bound.__call__)[0]
    finally:
        fast_torch.native_torch_call = native_call
    if closure is not direct:
        fns["kernelpack out= (runtime entry, Python closure)"] = lambda: closure(args, z, None)
        fns["kernelpack allocating (runtime entry, Python closure)"] = \
            lambda: closure(args, None, None)
    if opts.compare:
        before = _load_fastpath(opts.compare).make_fast_path(prog._kp_bound,
                                                             prog._kp_bound.__call__)[0]
        fns["before: kernelpack out= (runtime entry only)"] = lambda: before(args, z, None)
        fns["before: kernelpack allocating (runtime entry only)"] = \
            lambda: before(args, None, None)
    try:
        run_cp, run_cp_alloc, zc, xc, yc = cupy_launcher(pack, x, y)
        fns["cupy RawModule kernel"] = run_cp
        fns["cupy RawModule kernel, allocating (cupy.empty_like)"] = run_cp_alloc
        fns["kernelpack out= (cupy arrays)"] = lambda: prog(xc, yc, A, out=zc)
        fns["kernelpack allocating (cupy arrays)"] = lambda: prog(xc, yc, A)
    except Exception as exc:  # report, do not hide: the peer is missing on this machine
        notes.append(f"cupy unavailable: {type(exc).__name__}: {exc}")
        zc = None
    try:
        fns["triton kernel"], fns["triton kernel, allocating (torch.empty_like)"] = \
            triton_launcher(x, y, z)
        fns["triton kernel"]()
    except Exception as exc:
        fns.pop("triton kernel", None)
        fns.pop("triton kernel, allocating (torch.empty_like)", None)
        notes.append(f"triton unavailable: {type(exc).__name__}: {exc}")
    fns["torch.add(y, x, alpha=a)"] = lambda: torch.add(y, x, alpha=A)

    # correctness first
    for name, fn in fns.items():
        z.zero_()
        if zc is not None:
            zc.fill(0)
        torch.cuda.synchronize()
        res = fn()
        torch.cuda.synchronize()
        if name in ("kernelpack allocating (cupy arrays)",
                    "cupy RawModule kernel, allocating (cupy.empty_like)"):
            got = torch.as_tensor(res, device="cuda")
        elif name == "triton kernel, allocating (torch.empty_like)":
            got = res
        elif "cupy" in name:
            got = torch.as_tensor(zc, device="cuda")
        elif "kernelpack allocating" in name:
            got = res
        elif name.startswith("torch"):
            got = res  # torch.add's own result
        else:
            got = z
        torch.cuda.synchronize()
        torch.testing.assert_close(got, want, msg=lambda m, n=name: f"{n}: {m}")

    result = per_call_us(fns, torch.cuda.synchronize, opts.launches, opts.reps)
    print("pieces:", "; ".join(breakdown(torch, x, fns["raw cuLaunchKernel (floor)"])))
    floor = result["raw cuLaunchKernel (floor)"]
    dev = torch.cuda.get_device_name(0)
    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.selection import format_cuda_version
    driver = format_cuda_version(get_device(0).driver_version)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    from kernelpack.runtime.native import launcher
    how = launcher()
    fast_kind = ("C (runtime/_fastcall.c)" if type(getattr(direct, "__self__", None)).__name__
                 == "FastCall" else "Python closure (runtime/fast_torch.py)")
    lines = [f"### launch overhead — {dev}, driver CUDA {driver}, {date}", "",
             f"n={N} float32 axpby, {opts.launches} back-to-back launches then sync, median of "
             f"{opts.reps}; Python {sys.version.split()[0]}, torch {torch.__version__}; "
             f"kernelpack launches through "
             f"{'its C extension' if how.native else 'cuda.bindings (' + how.reason + ')'}; "
             f"torch fast path: {fast_kind}", "",
             "| method | µs / launch | × floor |", "|---|---:|---:|"]
    for name, us in result.items():
        lines.append(f"| {name} | {us:.2f} | {us / floor:.2f} |")
    kp_out, kp_alloc = result["kernelpack out="], result["kernelpack allocating"]
    torch_op = result["torch.add(y, x, alpha=a)"]
    c_name = "raw cuLaunchKernel via kernelpack's C extension"
    target = (f"- kernelpack out= / floor (target <= 1.3): **{kp_out / floor:.2f}** against "
              f"cuda.bindings' cuLaunchKernel ({floor:.2f} µs; "
              f"{'met' if kp_out / floor <= 1.3 else 'not met'})")
    if c_name in result:
        c_floor = result[c_name]
        target += (f", **{kp_out / c_floor:.2f}** against the same driver entry called through "
                   f"kernelpack's C extension ({c_floor:.2f} µs: the driver's own cost plus "
                   f"one C call; {'met' if kp_out / c_floor <= 1.3 else 'not met'})")
    else:
        target += "; the C extension's raw call not measured (extension not in use)"
    lines += ["", target,
              f"- kernelpack allocating / torch op = {kp_alloc / torch_op:.2f} (target <= 1.0)"]
    for peer, alloc in (("cupy RawModule kernel", "cupy.empty_like"),
                        ("triton kernel", "torch.empty_like")):
        if peer in result:
            lines.append(f"- kernelpack out= / {peer} = {kp_out / result[peer]:.2f}, allocating / "
                         f"{peer} = {kp_alloc / result[peer]:.2f} (target < 1)")
        both = f"{peer}, allocating ({alloc})"
        if both in result:
            lines.append(f"- like for like, both allocating their output: kernelpack allocating / "
                         f"{both} = {kp_alloc / result[both]:.2f}")
    cupy_out, cupy_raw = result.get("kernelpack out= (cupy arrays)"), \
        result.get("cupy RawModule kernel")
    if cupy_out and cupy_raw:
        lines.append(f"- with cupy arrays: kernelpack out= / cupy RawModule kernel = "
                     f"{cupy_out / cupy_raw:.2f}, allocating / cupy RawModule kernel = "
                     f"{result['kernelpack allocating (cupy arrays)'] / cupy_raw:.2f}")
    lines += [f"- note: {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print(text)
    try:
        write_entry(Path(opts.results), text)
    except OSError as exc:
        print(f"could not write to {opts.results}: {exc}")
    return 0


BEGIN, END = "<!-- benchmarks/launch.py: begin -->", "<!-- benchmarks/launch.py: end -->"
LEGACY = "<!-- benchmarks/launch.py (appends one table per run) -->"
HEADING = "## Launch overhead (GPU, `benchmarks/launch.py`)"


def _adopt_section(text: str) -> str:
    """``text`` with this script's section between BEGIN and END: the older unmarked section
    (from the LEGACY marker or HEADING to the next ``<!--`` or ``## `` line) wrapped, or a new
    empty one at the end. Entries appended under other scripts' headings by older runs stay
    where they are."""
    lines = text.split("\n")
    marks = [i for i, ln in enumerate(lines) if ln.strip() == LEGACY]
    heads = [i for i, ln in enumerate(lines) if ln.strip() == HEADING]
    if not heads:
        return text.rstrip("\n") + f"\n\n{BEGIN}\n{HEADING}\n{END}\n"
    head = heads[0]
    start = marks[0] if marks and marks[0] < head else head
    stop = next((k for k in range(head + 1, len(lines))
                 if lines[k].startswith("<!--") or lines[k].startswith("## ")), len(lines))
    section = lines[head:stop]
    while section and not section[-1].strip():
        section.pop()
    rest = lines[stop:]
    return "\n".join(lines[:start] + [BEGIN] + section + [END] + ([""] if rest else [])
                     + rest)


def write_entry(path: Path, entry: str) -> None:
    """Put ``entry`` (a ``### launch overhead ...`` block) at the top of this script's section
    of ``path``, under its heading: never after other scripts' sections."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if BEGIN not in text or END not in text:
        text = _adopt_section(text)
    before, rest = text.split(BEGIN, 1)
    body, after = rest.split(END, 1)
    if HEADING in body:
        head, _, runs = body.partition(HEADING)
        body = head + HEADING + "\n\n" + entry.rstrip("\n") + "\n\n" + runs.lstrip("\n")
    else:
        body = "\n" + HEADING + "\n\n" + entry.rstrip("\n") + "\n\n" + body.lstrip("\n")
    path.write_text(before + BEGIN + body.rstrip("\n") + "\n" + END + after, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
