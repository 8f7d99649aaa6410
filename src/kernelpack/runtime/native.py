"""Which ``cuLaunchKernel`` the runtime calls: kernelpack's C extension, or cuda.bindings'.

A launch through cuda.bindings costs about twice the driver's own host time (it converts
``CUfunction``/``CUstream`` objects and builds a ``CUresult`` enum per call). The optional C
extension :mod:`kernelpack.runtime._launch` forwards plain integers to the driver's entry
point instead. It links against nothing: this module asks the driver for the entry point with
``cuGetProcAddress`` (through :mod:`.driver`), so both paths reach the same ``libcuda`` with
the same default-stream flavour (legacy, or per-thread when cuda.bindings' own switch
``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is set).

Both launchers are called the same way, ``launch(function, gx, gy, gz, bx, by, bz, shared_mem,
stream, kernel_params, 0) -> (CUresult,)``; they differ only in what ``function`` and
``stream`` are (ints for the extension, cuda.bindings objects otherwise), which is why callers
convert handles with :attr:`Launcher.function` / :attr:`Launcher.stream` once and keep the
result. The extension is used unless it was not built (no C compiler at install time), the
driver has no such entry point, or ``KERNELPACK_NATIVE_LAUNCH=0``; :attr:`Launcher.reason`
says which.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .. import config
from . import driver as _drv

__all__ = ["Launcher", "launcher"]


class Launcher:
    """One way to launch: ``launch`` and the converters of raw handles it needs."""

    __slots__ = ("launch", "function", "stream", "native", "reason")

    def __init__(self, launch: Callable[..., tuple], function: Callable[[int], Any],
                 stream: Callable[[int], Any], native: bool, reason: str) -> None:
        self.launch = launch
        self.function = function
        self.stream = stream
        self.native = native
        #: why this launcher was chosen ("C extension" or why not)
        self.reason = reason

    def __repr__(self) -> str:
        return f"Launcher(native={self.native}, reason={self.reason!r})"


_lock = threading.Lock()
_chosen: Launcher | None = None


def launcher() -> Launcher:
    """The process's launcher, chosen on first use (after the driver is initialized)."""
    chosen = _chosen
    if chosen is None:
        with _lock:
            chosen = _chosen or _choose()
    return chosen


def _choose() -> Launcher:
    global _chosen
    drv = _drv.init()
    if not config.native_launch():
        reason = "KERNELPACK_NATIVE_LAUNCH turns the C extension off"
    else:
        try:
            from . import _launch
        except ImportError:
            reason = "the C extension kernelpack.runtime._launch is not built"
        else:
            address = _entry_point(drv)
            if address:
                _launch.bind(address)
                _chosen = Launcher(_launch.launch, int, int, True, "C extension")
                return _chosen
            reason = "the driver has no cuLaunchKernel entry point to give"
    fallback = _chosen = _fallback(drv)
    fallback.reason = reason
    return fallback


def _fallback(drv: Any) -> Launcher:
    """The launcher without the C extension: the driver object's own ``cuLaunchKernel``, except
    that a launch through kernelpack's ctypes door (:mod:`.libcuda`) costs about 1.2 µs more
    than through cuda.bindings, so those are imported for the launch when they can be (the same
    libcuda, the same default-stream flavour: both follow cuda.bindings' switch)."""
    from .libcuda import LibCuda

    if isinstance(drv, LibCuda):
        try:
            from cuda.bindings import driver as bindings
        except ImportError:
            return Launcher(drv.cuLaunchKernel, int, int, False, "")
        return Launcher(bindings.cuLaunchKernel, bindings.CUfunction, bindings.CUstream, False,
                        "")
    return Launcher(drv.cuLaunchKernel, drv.CUfunction, drv.CUstream, False, "")


def _entry_point(drv: Any) -> int:
    """The address of the driver's ``cuLaunchKernel`` in cuda.bindings' stream flavour (0 when
    the driver does not give one)."""
    flags = (drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
             if config.per_thread_default_stream()
             else drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM)
    answer = drv.cuGetProcAddress(b"cuLaunchKernel", _drv.driver_version(), flags)
    if answer[0]:
        return 0
    return int(answer[1] or 0)
