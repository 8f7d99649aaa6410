"""Devices: compute capability, the primary context, and making it current.

kernelpack works in each device's *primary* context, the one PyTorch, CuPy and the CUDA
runtime share, so pointers and streams from those frameworks are valid in our launches. A
:class:`Device` is created once per ordinal per process (thread-safe) and never released: the
primary context lives as long as the process, like the frameworks' own.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

from ..errors import DeviceError
from ..targets import Arch
from . import driver as _drv

__all__ = ["Device", "get_device", "device_count", "current_device_ordinal", "check_ordinal",
           "WAS_CURRENT", "SET", "PUSHED"]

#: :meth:`Device.enter`'s answers (PUSHED is 2 in runtime/_fastcall.c too)
WAS_CURRENT, SET, PUSHED = 0, 1, 2


class Device:
    """One GPU: ``ordinal``, ``arch`` (compute capability), ``name`` (asked on first use), and
    its primary context.

    ``ctx`` is the ``CUcontext``; ``ctx_id`` its integer handle, compared on the hot path to
    skip ``cuCtxSetCurrent`` when the context is already current.
    """

    __slots__ = ("ordinal", "handle", "arch", "_name", "ctx", "ctx_id", "driver_version")

    def __init__(self, ordinal: int) -> None:
        drv = _drv.init()
        count = device_count()
        if not 0 <= ordinal < count:
            raise DeviceError(f"CUDA device {ordinal} does not exist (this machine has {count} "
                              f"device{'s' if count != 1 else ''})")
        check = _drv.check
        self.ordinal = ordinal
        self.handle = check(drv.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        attr = drv.CUdevice_attribute
        major = check(drv.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle),
            "reading the compute capability")
        minor = check(drv.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle),
            "reading the compute capability")
        self.arch = Arch(int(major), int(minor))
        self._name: str | None = None
        self.driver_version = _drv.driver_version()
        self.ctx = check(drv.cuDevicePrimaryCtxRetain(self.handle),
                         f"retaining the primary context of device {ordinal}")
        self.ctx_id = int(self.ctx)

    @property
    def name(self) -> str:
        """The device's name (``cuDeviceGetName``), asked on first use: only ``repr`` and
        messages show it, and the driver takes ~30 µs to answer (an H200 host), a tenth of
        everything else a process's first launch asks it about the device."""
        if self._name is None:
            raw = _drv.check(_drv.bindings().cuDeviceGetName(256, self.handle),
                             "cuDeviceGetName")
            self._name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        return self._name

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread (if it is not)."""
        drv = _drv.bindings()
        current = _drv.check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) != self.ctx_id:
            _drv.check(drv.cuCtxSetCurrent(self.ctx),
                       f"making device {self.ordinal}'s context current")

    def enter(self) -> int:
        """Make this device's primary context current for a launch (or an allocation) on
        the calling thread. :data:`WAS_CURRENT`: it was. :data:`SET`: no context was current;
        it is set and kept, as the CUDA runtime's first call does (the thread's next call then
        needs no driver call to confirm it). :data:`PUSHED`: another device's was (tensors on
        device 0 from a thread working on device 1): it is pushed over it, and the caller
        calls :meth:`leave` after launching, so that the thread does not end up on a device
        it did not choose (its next tensors would go there)."""
        drv = _drv.bindings()
        current = _drv.check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        current = 0 if current is None else int(current)
        if current == self.ctx_id:
            return WAS_CURRENT
        if current == 0:
            _drv.check(drv.cuCtxSetCurrent(self.ctx),
                       f"making device {self.ordinal}'s context current")
            return SET
        _drv.check(drv.cuCtxPushCurrent(self.ctx),
                   f"making device {self.ordinal}'s context current")
        return PUSHED

    def leave(self) -> None:
        """After :meth:`enter` answered PUSHED: the thread's previous context current again."""
        _drv.bindings().cuCtxPopCurrent()

    @contextmanager
    def pushed(self) -> Iterator[None]:
        """This device's primary context current for the ``with`` body, then the calling
        thread's previous one again (push/pop). For work off the launch path — loading a
        library, ``warmup`` — which must not switch the caller's current device behind its
        back (``torch.cuda.current_device()`` reads the current context)."""
        drv = _drv.bindings()
        _drv.check(drv.cuCtxPushCurrent(self.ctx),
                   f"making device {self.ordinal}'s context current")
        try:
            yield
        finally:
            drv.cuCtxPopCurrent()

    def __repr__(self) -> str:
        return f"<Device {self.ordinal}: {self.name} ({self.arch.sm})>"


_devices: dict[int, Device] = {}
_lock = threading.Lock()
_count: int | None = None
# Set in a child forked after this process initialized CUDA: the driver cannot be used there
# (CUDA is not fork-safe), and the parent's contexts and handles mean nothing in it.
_forked_after_init = False

FORK_MESSAGE = ("CUDA was initialized in the parent process before it forked; a forked child "
                "cannot use it (CUDA is not fork-safe). Start GPU workers with multiprocessing's "
                "'spawn' or 'forkserver' start method (multiprocessing.get_context('spawn')), "
                "or fork before the first launch")


def _after_fork_in_child() -> None:
    """Forget the parent's devices and its lock (held by a thread that does not exist here,
    it would hang the child's first launch); remember whether CUDA was live in the parent."""
    global _lock, _devices, _forked_after_init
    _lock = threading.Lock()
    if _devices or _drv._initialized.is_set():
        _forked_after_init = True
    _devices = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def device_count() -> int:
    """Number of CUDA devices; DeviceError (with a plain explanation) when there are none."""
    global _count
    if _count is None:
        drv = _drv.init()
        count = int(_drv.check(drv.cuDeviceGetCount(), "cuDeviceGetCount"))
        if count == 0:
            raise DeviceError("no CUDA device is visible to this process (check "
                              "CUDA_VISIBLE_DEVICES and nvidia-smi)")
        _count = count
    return _count


def check_ordinal(ordinal: int, where: str) -> None:
    """DeviceError when ``ordinal`` is not a device this process can see; ``where`` says who
    carried it, to start the message with ("argument 'x' (DLPack device_id 7)").
    Without it the call failed later, in :class:`Device`, with "CUDA device 7 does not exist"
    and no word of which argument said 7 (a DLPack producer's ``device_id``)."""
    if _forked_after_init:  # the parent's device count means nothing here
        raise DeviceError(FORK_MESSAGE)
    count = device_count()
    if not 0 <= ordinal < count:
        raise DeviceError(f"{where}: CUDA device {ordinal} does not exist (this machine "
                          f"has {count} device{'s' if count != 1 else ''})")


def get_device(ordinal: int) -> Device:
    """The :class:`Device` for ``ordinal``, created once per process. DeviceError in a child
    forked after the parent initialized CUDA (see :data:`FORK_MESSAGE`)."""
    if _forked_after_init:
        raise DeviceError(FORK_MESSAGE)
    dev = _devices.get(ordinal)
    if dev is None:
        with _lock:
            dev = _devices.get(ordinal)
            if dev is None:
                dev = _devices[ordinal] = Device(ordinal)
    return dev


def current_device_ordinal() -> int:
    """The device of the calling thread's current context, or 0 when none is current (the
    default for callers that pass no device arrays)."""
    if _forked_after_init:
        raise DeviceError(FORK_MESSAGE)
    drv = _drv.init()
    ctx = _drv.check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        return 0
    return int(_drv.check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))

