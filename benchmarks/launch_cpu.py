"""Host-side cost of kernelpack's torch fast path, on CPU (no GPU, no torch needed).

A stand-in ``torch`` whose tensor methods are C-level callables (like torch's own) and the CPU
tests' fake driver (``tests/runtime/fake_driver.py``). The first calls run through the fake as
it is (the kernel's Python implementation computes z = a*x + y, which is checked); then the
driver is made to do nothing, so the times are the work kernelpack adds around the driver call:
with the C extension (the usual case), ``_launch`` is bound to a C function that does nothing
and returns 0 (libm's ``fegetround``, as ``benchmarks/fastcall_cpu.py`` does), so no call goes
through the fake's ctypes callback into Python (which also recorded every call in a list);
without it, the fake's ``cuLaunchKernel`` is a Python no-op. The "floor" row is the same
launcher called with a prepacked parameter block, as in ``benchmarks/launch.py``; the other
rows minus the floor are kernelpack's own overhead. The output says which fast path ran (C
``FastCall`` or the Python closure) and which launcher; after the timing, the driver is made
real again and the fast path is called from several threads at once, its results checked.

Usage: ``python benchmarks/launch_cpu.py [--number 20000] [--repeat 40] [--compare FILE]``;
``--compare`` loads another version of ``runtime/fastpath.py`` (e.g. from ``git show``) and
times its fast path in the same process, interleaved, for a like-for-like comparison on a
shared machine. Each row is the median of ``--repeat`` rounds of ``--number`` calls, the
fastest round beside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import struct
import sys
import threading
import timeit
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
A = 2.0


class Dtype:
    def __init__(self, name: str) -> None:
        self.name = name


class Tensor:
    """Methods are bound builtins: calling one costs about what a torch method call does."""

    __slots__ = ("dtype", "shape", "data_ptr", "get_device", "is_contiguous", "is_conj",
                 "is_neg", "_buf")

    def __init__(self, n: int, dtype: Dtype, device: int = 0) -> None:
        self._buf = ctypes.create_string_buffer(4 * max(n, 1))
        self.dtype = dtype
        self.shape = (n,)
        self.data_ptr = ctypes.addressof(self._buf).__index__
        self.get_device = device.__index__
        self.is_contiguous = True.__bool__
        self.is_conj = self.is_neg = False.__bool__  # torch's lazy-view bits

    def fill(self, values: list[float]) -> None:
        struct.pack_into(f"<{len(values)}f", self._buf, 0, *values)

    def values(self) -> list[float]:
        return list(struct.unpack_from(f"<{self.shape[0]}f", self._buf, 0))


def fake_torch() -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.float32 = Dtype("float32")
    mod.Tensor = Tensor
    mod.empty = lambda shape, dtype, device: Tensor(shape[0], dtype, device[1])
    mod.empty_like = lambda t: Tensor(t.shape[0], t.dtype, t.get_device())
    mod.device = lambda kind, index: (kind, index)
    mod._C = types.SimpleNamespace(_cuda_getCurrentRawStream=(0).__mul__)
    mod.cuda = types.SimpleNamespace(ExternalStream=lambda handle, device=None: handle)
    return mod


def _noop_entry() -> int:
    """The address of a C function that reads no argument and returns 0 (CUDA_SUCCESS):
    libm's ``fegetround`` under the default rounding mode."""
    name = ctypes.util.find_library("m") or "libm.so.6"
    return ctypes.cast(ctypes.CDLL(name).fegetround, ctypes.c_void_p).value or 0


def _fast_kind(bp) -> str:  # type: ignore[no-untyped-def]
    if bp.call == bp.__call__:
        return "none (the general path)"
    if type(getattr(bp.call, "__self__", None)).__name__ == "FastCall":
        return "C (runtime/_fastcall.c FastCall)"
    return "Python closure (runtime/fast_torch.py)"


def _expect(z: Tensor, x: Tensor, y: Tensor, what: str) -> None:
    """z == A*x + y in float32 (the fake's kernel computes in Python, packs as float32)."""
    want = list(struct.unpack(f"<{x.shape[0]}f", struct.pack(
        f"<{x.shape[0]}f", *[A * p + q for p, q in zip(x.values(), y.values())])))
    if z.values() != want:
        raise SystemExit(f"launch_cpu.py: {what}: z differs from a*x + y")


def _set_driver(fake, bp, noop: bool) -> object:  # type: ignore[no-untyped-def]
    """Make the fake's launches do nothing (``noop``) or run again, and rebuild the launcher
    and the fast path on it; returns the launcher."""
    import fake_driver

    from kernelpack.runtime import native

    if noop:
        ok = (0,)
        ctx = fake_driver.CUcontext(fake.current)
        fake.cuLaunchKernel = lambda *a: ok          # the Python door: a no-op
        fake.cuCtxGetCurrent = lambda: (0, ctx)
    else:
        vars(fake).pop("cuLaunchKernel", None)
        vars(fake).pop("cuCtxGetCurrent", None)
    native._chosen = None                            # choose again: the fake's attributes now
    how = native.launcher()                          # (binds the fake's C entry when native)
    if how.native and noop:
        from kernelpack.runtime import _launch

        _launch.bind(_noop_entry())                  # the C door: a C no-op, no callback
    bp._refresh_fast_path()
    return how


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--number", type=int, default=20_000,
                    help="calls per round (default 20000)")
    ap.add_argument("--repeat", type=int, default=40,
                    help="rounds per row, interleaved across rows; the median round is "
                         "reported, the fastest beside it (default 40, at least 5)")
    ap.add_argument("--compare", help="another fastpath.py to time alongside")
    opts = ap.parse_args()
    if opts.repeat < 5:
        ap.error(f"--repeat must be at least 5 (got {opts.repeat})")

    sys.modules["torch"] = torch = fake_torch()
    import fake_driver
    from test_launch_fake import _axpby_impl, axpby

    from kernelpack.runtime import device, driver, execute, library
    from kernelpack.runtime.launcher import bind

    fake = fake_driver.FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)})
    driver._driver = fake
    driver._initialized.clear()
    device._devices.clear()
    device._count = None
    library._libraries.clear()
    execute._drv_mod = None
    prog = axpby()
    n = 1024
    x, y, z = (Tensor(n, torch.float32) for _ in range(3))
    x.fill([i * 0.25 - 3.0 for i in range(n)])
    y.fill([(i % 17) * 0.5 for i in range(n)])
    bp = bind(prog)
    bp.call((x, y, A), z, None)     # binds device 0 through the fake (the general path)
    _expect(z, x, y, "first call")
    z.fill([0.0] * n)
    bp.call((x, y, A), z, None)     # builds the fast path
    assert bp.call != bp.__call__, "the fast path was not installed"
    z.fill([0.0] * n)
    assert bp.call((x, y, A), z, None) is z
    _expect(z, x, y, "the fast path")
    made = bp.call((x, y, A), None, None)
    _expect(made, x, y, "the fast path, allocating")
    kind = _fast_kind(bp)
    assert not fake.callback_errors, fake.callback_errors

    how = _set_driver(fake, bp, noop=True)
    assert _fast_kind(bp) == kind, (kind, _fast_kind(bp))
    fake.calls.clear()
    door = ("kernelpack's C extension, bound to a no-op C function (libm fegetround)"
            if how.native else f"the fake's Python cuLaunchKernel, a no-op lambda ({how.reason})")
    params = (ctypes.c_void_p * 5)()                  # a prepacked block (not read by a no-op)
    func, stream, launch = how.function(1), how.stream(0), how.launch
    addr = ctypes.addressof(params)
    rows = {
        "floor: the launcher (no-op) with prepacked params":
            lambda: launch(func, 8, 1, 1, 128, 1, 1, 0, stream, addr, 0),
        "bound.call out= (runtime entry)": lambda: bp.call((x, y, A), z, None),
        "bound.call allocating": lambda: bp.call((x, y, A), None, None),
        "Program-like entry out= (*args, out=, stream=)":
            lambda: _entry(bp, x, y, A, out=z),
    }
    if opts.compare:
        other = _load_other(opts.compare).make_fast_path(bp, bp.__call__)[0]
        rows["--compare: call out="] = lambda: other((x, y, A), z, None)
        rows["--compare: call allocating"] = lambda: other((x, y, A), None, None)
    for fn in rows.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(opts.repeat):  # interleaved rounds: load changes hit every row alike
        for name, fn in rows.items():
            samples[name].append(timeit.timeit(fn, number=opts.number) / opts.number * 1e6)
    if fake.calls or fake.callback_errors:
        raise SystemExit(f"launch_cpu.py: {len(fake.calls)} calls reached the fake driver "
                         f"while timing (expected none): {fake.calls[:3]}")
    results = {k: (statistics.median(v), min(v)) for k, v in samples.items()}
    floor = next(iter(results.values()))[0]
    print(f"Python {sys.version.split()[0]}, {opts.number} calls per round, median of "
          f"{opts.repeat} rounds (min: the fastest round); fast path: {kind}; launches "
          f"through {door}")
    print(f"  {'':55s} {'median':>8} {'min':>8}  median - floor")
    for name, (med, low) in results.items():
        print(f"  {name:55s} {med:6.3f}us {low:6.3f}us  (+{med - floor:.3f})")

    # threads: the fast path from several threads at once still computes the right values
    _set_driver(fake, bp, noop=False)
    errors: list[BaseException] = []
    outs = [Tensor(n, torch.float32) for _ in range(4)]

    def work(out: Tensor) -> None:
        try:
            for _ in range(200):
                bp.call((x, y, A), out, None)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not fake.callback_errors, (errors, fake.callback_errors)
    for i, out in enumerate(outs):
        _expect(out, x, y, f"thread {i}")
    launches = sum(1 for c in fake.calls if c[0] == "cuLaunchKernel")
    assert launches == 800, launches
    print(f"4 threads x 200 calls through the fast path on the fake driver: {launches} "
          f"launches, every result equal to a*x + y")
    return 0


def _load_other(path: str) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernelpack.runtime._fastpath_other", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(bp, *args, out=None, stream=None, **kwargs):  # type: ignore[no-untyped-def]
    """What ``Program.__call__`` does when bound (loader.py)."""
    if not kwargs:
        return bp.call(args, out, stream)
    raise AssertionError


if __name__ == "__main__":
    raise SystemExit(main())
