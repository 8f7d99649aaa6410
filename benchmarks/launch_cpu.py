"""Host-side cost of kernelpack's torch fast path, on CPU (no GPU, no torch needed).

A stand-in ``torch`` whose tensor methods are C-level callables (like torch's own) and a
driver whose ``cuLaunchKernel`` / ``cuCtxGetCurrent`` do nothing, so the times are the Python
work kernelpack adds around the driver call. The "floor" row is the bare driver call with a
prepacked parameter block, as in ``benchmarks/launch.py``; the other rows minus the floor are
kernelpack's own overhead.

Usage: ``python benchmarks/launch_cpu.py [--number 20000] [--repeat 40] [--compare FILE]``;
``--compare`` loads another version of ``runtime/fastpath.py`` (e.g. from ``git show``) and
times its fast path in the same process, interleaved, for a like-for-like comparison on a
shared machine. Each row is the best of ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import timeit
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--compare", help="another fastpath.py to time alongside")
    opts = ap.parse_args()

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
    bp = bind(prog)
    bp.call((x, y, 2.0), z, None)   # binds device 0 through the real fake driver
    bp.call((x, y, 2.0), z, None)
    assert bp.call != bp.__call__, "the fast path was not installed"

    ok = (0,)
    ctx = fake_driver.CUcontext(fake.current)
    fake.cuLaunchKernel = lambda *a: ok          # from now on the driver does nothing
    fake.cuCtxGetCurrent = lambda: (0, ctx)
    bp._refresh_fast_path()                      # rebind the closures to the no-op driver

    stream = fake_driver.CUstream(0)
    func = fake_driver.CUfunction(1)
    launch = fake.cuLaunchKernel
    rows = {
        "floor: cuLaunchKernel (no-op) with prepacked params":
            lambda: launch(func, 4, 1, 1, 256, 1, 1, 0, stream, 1234, 0),
        "bound.call out= (runtime entry)": lambda: bp.call((x, y, 2.0), z, None),
        "bound.call allocating": lambda: bp.call((x, y, 2.0), None, None),
        "Program-like entry out= (*args, out=, stream=)":
            lambda: _entry(bp, x, y, 2.0, out=z),
    }
    if opts.compare:
        other = _load_other(opts.compare).make_fast_path(bp, bp.__call__)[0]
        rows["--compare: call out="] = lambda: other((x, y, 2.0), z, None)
        rows["--compare: call allocating"] = lambda: other((x, y, 2.0), None, None)
    results = {name: float("inf") for name in rows}
    for _ in range(opts.repeat):  # interleaved rounds: load changes hit every row alike
        for name, fn in rows.items():
            us = timeit.timeit(fn, number=opts.number) / opts.number * 1e6
            results[name] = min(results[name], us)
    floor = next(iter(results.values()))
    print(f"Python {sys.version.split()[0]}, {opts.number} calls, best of {opts.repeat}:")
    for name, us in results.items():
        print(f"  {name:55s} {us:6.3f} us  (+{us - floor:.3f})")
    # threads: the fast path from several threads at once still computes the right values
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(2000):
                bp.call((x, y, 2.0), z, None)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
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
