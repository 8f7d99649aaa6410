"""The one door to the CUDA driver: open it, initialize it, and check every result.

The driver is reached through :mod:`.libcuda` (ctypes over ``libcuda.so.1``, a few hundred
microseconds to open) rather than ``cuda.bindings.driver`` (17-45 ms to import, inside a
process's first launch); both answer in cuda.bindings' calling convention, so the rest of the
runtime does not care which it holds. ``KERNELPACK_DRIVER=cuda-bindings`` selects the bindings
(as does any platform but Linux).

Every ``CUresult`` goes through :func:`check`, which turns a failure into a named kernelpack
error (``DeviceError`` when there is no usable GPU or driver, ``CompatibilityError`` when the
driver refuses an image, ``LaunchError`` otherwise) chained with ``raise ... from`` to a
:class:`CudaResultError` carrying the raw code, so nothing is ever silently ignored and the
driver's own name for the failure is always in the message.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from .. import config
from ..errors import CompatibilityError, DeviceError, KernelPackError, LaunchError

__all__ = ["CudaResultError", "bindings", "check", "error_for", "init", "driver_version"]

# CUresult values that mean "no usable GPU or driver" and "the driver refuses this code".
_DEVICE_CODES = {
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER", 46: "CUDA_ERROR_DEVICES_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
    999: "CUDA_ERROR_UNKNOWN", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
}
_COMPAT_CODES = {
    200: "CUDA_ERROR_INVALID_IMAGE", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
}


class CudaResultError(Exception):
    """The raw failure: a CUresult code, its name and the driver's description. Always the
    ``__cause__`` of the kernelpack error raised for it."""

    def __init__(self, code: int, name: str, text: str) -> None:
        super().__init__(f"{name} ({code}): {text}")
        self.code = code
        self.name = name
        self.text = text

    def __reduce__(self) -> tuple[type, tuple[int, str, str], dict]:
        """Pickled with its three arguments (an exception's default is its message alone,
        which ``__init__`` cannot take: a worker's driver error failed to unpickle), and its
        attributes (``add_note``'s notes among them)."""
        return (type(self), (self.code, self.name, self.text), self.__dict__)


_lock = threading.Lock()
_driver: Any = None
_init_error: KernelPackError | None = None


def _fresh_lock_in_child() -> None:
    """A parent thread inside :func:`init` when the process forked holds ``_lock`` forever in
    the child: its first launch would hang instead of reaching device.py's fork check."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


def bindings() -> Any:
    """The driver API object, opened on first use: :class:`.libcuda.LibCuda`, or the
    ``cuda.bindings.driver`` module (see the module docstring). DeviceError if neither can be
    had: no driver library on this machine, or one older than CUDA 12.0."""
    global _driver
    drv = _driver
    if drv is None:
        drv = _driver = _open()
    return drv


def _open() -> Any:
    choice = config.driver_api()
    if choice == "cuda-bindings" or not sys.platform.startswith("linux"):
        try:
            from cuda.bindings import driver
        except ImportError as exc:
            raise DeviceError("launching needs the CUDA driver bindings: pip install "
                              "cuda-bindings (part of kernelpack's dependencies)") from exc
        return driver
    from .libcuda import open_driver

    try:
        return open_driver(config.per_thread_default_stream())
    except OSError as exc:
        raise DeviceError(_NO_DRIVER + f" ({exc})") from exc
    except LookupError as exc:
        raise DeviceError(str(exc)) from None


_NO_DRIVER = ("no CUDA driver found on this machine (libcuda.so could not be loaded): "
              "kernelpack can inspect and plan artifacts here, but launching needs an NVIDIA "
              "GPU and its driver")


def _describe(code: int) -> tuple[str, str]:
    drv = bindings()
    describe = getattr(drv, "describe", None)
    if describe is not None:  # LibCuda: the driver's own cuGetErrorName / cuGetErrorString
        try:
            return describe(code)
        except Exception:  # describing an error must never hide it
            return f"CUresult {code}", "no description"
    try:
        name = drv.CUresult(code).name
    except ValueError:
        name = f"CUresult {code}"
    try:
        err, text = drv.cuGetErrorString(drv.CUresult(code))
        text = text.decode() if isinstance(text, bytes) else str(text)
        if err:
            text = "no description"
    except Exception:  # describing an error must never hide it
        text = "no description"
    return name, text


def error_for(code: int, what: str) -> KernelPackError:
    """The kernelpack error for a failed CUresult ``code`` while doing ``what``; its
    ``__cause__`` is set to a :class:`CudaResultError`."""
    code = int(code)
    name, text = _describe(code)
    if name == f"CUresult {code}":  # a driver that cannot name it (a stub library): ours
        name = _DEVICE_CODES.get(code) or _COMPAT_CODES.get(code) or name
    cause = CudaResultError(code, name, text)
    message = f"{what} failed: {name}: {text}"
    if code in _DEVICE_CODES:
        exc: KernelPackError = DeviceError(message + " (is an NVIDIA GPU present and its driver "
                                           "loaded? see nvidia-smi)")
    elif code in _COMPAT_CODES:
        exc = CompatibilityError(message)
    else:
        exc = LaunchError(message)
    exc.__cause__ = cause
    return exc


def check(result: Any, what: str) -> Any:
    """Check a cuda.bindings return tuple ``(CUresult, *values)``.

    Returns None, the single value, or the tuple of values; raises the error from
    :func:`error_for` (chained to a :class:`CudaResultError`) on failure.
    """
    err = result[0]
    if err:
        exc = error_for(err, what)
        try:
            raise exc from exc.__cause__
        finally:
            # the frame would hold its own exception (exception -> traceback -> this frame):
            # a cycle keeping every frame it passes, and a failed call's outputs (device
            # memory), alive until the garbage collector runs
            del exc
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def allocate_ordered(drv: Any, nbytes: int, cs: Any, answers: list, what: str) -> int:
    """``cuMemAllocAsync(nbytes, cs)``'s pointer. The driver's whole answer is first stored in
    ``answers`` (list.extend over map: one C call, so no bytecode runs between the allocation's
    return and the store, and a KeyboardInterrupt cannot come between them and leak it), then
    checked: whoever owns ``answers`` frees each of them with :func:`free_ordered`, a failed
    one included (it frees nothing). Review 72a: the pointer was stored after ``check``."""
    answers.extend(map(drv.cuMemAllocAsync, (nbytes,), (cs,)))
    return int(check(answers[-1], what))


def free_ordered(drv: Any, cs: Any, answer: tuple) -> None:
    """Free an :func:`allocate_ordered` answer on stream ``cs`` (nothing for a failed one)."""
    if not answer[0]:
        drv.cuMemFreeAsync(answer[1], cs)


def init() -> Any:
    """Import the bindings and ``cuInit(0)`` once per process. Returns the driver module.

    Raises DeviceError with a plain explanation when there is no driver library or no GPU; a
    failure is remembered, so later calls fail the same way without retrying the driver.
    """
    global _init_error
    drv = _driver
    if drv is not None and _initialized.is_set():
        return drv
    with _lock:
        if _init_error is not None:
            # A fresh error each time: raising the remembered one again would append this
            # call's frames to its traceback, which would grow (and keep every failed caller's
            # arguments alive) for as long as the process keeps trying.
            again = type(_init_error)(*_init_error.args)
            try:
                raise again from _init_error.__cause__
            finally:
                del again
        if _initialized.is_set():
            return _driver
        try:
            drv = bindings()
            try:
                result = drv.cuInit(0)
            except (MemoryError, RecursionError):
                raise  # this process's trouble, not the driver's: the next call tries again
            except Exception as exc:  # the driver library itself is missing (no libcuda.so)
                raise DeviceError(_NO_DRIVER) from exc
            check(result, "cuInit (initializing the CUDA driver)")
        except KernelPackError as exc:
            _init_error = exc
            raise
        _initialized.set()
        return drv


_initialized = threading.Event()


_version: tuple[Any, int] | None = None  # (driver module, its version)


def driver_version() -> int:
    """``cuDriverGetVersion``: the CUDA version the driver supports (13000 = 13.0). Asked
    once per driver module (the loaded driver cannot change under a process): a process's
    first call needs it twice, for the device and for the launcher's entry point."""
    global _version
    drv = init()
    cached = _version
    if cached is not None and cached[0] is drv:
        return cached[1]
    version = int(check(drv.cuDriverGetVersion(), "cuDriverGetVersion"))
    _version = (drv, version)
    return version
