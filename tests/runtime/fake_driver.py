"""A fake ``cuda.bindings.driver`` for CPU tests of the launch path.

"Device memory" is host memory (``cuMemAlloc`` returns the address of a ctypes buffer), and
``cuLaunchKernel`` reads the parameter block through the ``kernelParams`` address exactly as
the driver would, then runs a Python implementation of the kernel registered by name. So a
test checks the real slot layout, the pointers, the scalars and the launch dimensions without
a GPU.
"""

from __future__ import annotations

import ctypes
import enum
import struct
import threading
from typing import Any, Callable


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_NOT_FOUND = 500


class _Handle:
    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


class CUfunction(_Handle):
    pass


class CUstream(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class CUpointer_attribute(enum.IntEnum):
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class CUdriverProcAddress_flags(enum.IntEnum):
    CU_GET_PROC_ADDRESS_DEFAULT = 0
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2


# The C signature of cuLaunchKernel, for the entry point the fake hands out (see ``native``)
_LAUNCH_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


# A kernel implementation: (grid, block, shared_mem, raw parameter bytes at each slot address)
KernelImpl = Callable[[tuple, tuple, int, list], None]


class FakeDriver:
    """Records every call; kernels are Python functions over the parameter pointers."""

    CUresult = CUresult
    CUfunction = CUfunction
    CUstream = CUstream
    CUdevice_attribute = CUdevice_attribute
    CUpointer_attribute = CUpointer_attribute
    CUdriverProcAddress_flags = CUdriverProcAddress_flags

    def __init__(self, arch: tuple[int, int] = (9, 0), version: int = 13000, devices: int = 1,
                 kernels: dict[str, tuple[str, KernelImpl]] | None = None,
                 native: bool = True, archs: dict[int, tuple[int, int]] | None = None,
                 thread_contexts: bool = False, track_pointers: bool = False,
                 distinct_kernels: bool = False) -> None:
        """``native``: hand out a C entry point for ``cuLaunchKernel`` (a ctypes callback into
        :meth:`cuLaunchKernel`), so kernelpack's C extension launches through it exactly as
        it would through the driver's; False: ``cuGetProcAddress`` finds nothing and
        kernelpack launches through :meth:`cuLaunchKernel` as cuda.bindings'.

        Several devices (multi-GPU tests): ``archs`` gives a device its own compute capability
        (others have ``arch``); ``thread_contexts`` makes the current context (and the push/pop
        stack) per thread, as the driver's is, a new thread starting with none;
        ``track_pointers`` makes ``cuMemAlloc`` remember the device of the current context,
        which ``cuPointerGetAttribute`` then answers (with ``pointer_devices``, which tests
        may fill for their own arrays); ``distinct_kernels`` gives each library's kernels their
        own handles (``kernel_handles``: handle -> (library, entry)), else a kernel's handle
        depends on its name only. ``launch_contexts`` records per launch ``(entry, current
        context, stream, function handle)`` and ``load_contexts`` the current context of each
        ``cuLibraryLoadData``."""
        self.distinct_kernels = distinct_kernels
        self.kernel_handles: dict[int, tuple[int, str]] = {}
        self.thread_contexts = thread_contexts
        self._tls = threading.local()
        self._current = 0
        self._stack: list[int] = []
        self.archs = dict(archs or {})
        self.track_pointers = track_pointers
        self.pointer_devices: dict[int, int] = {}
        self.launch_contexts: list[tuple[str, int, int, int]] = []
        self.load_contexts: list[int] = []
        self.arch = arch
        self.version = version
        self.devices = devices
        self.kernels = kernels or {}   # entry -> (param struct format, impl)
        self.calls: list[tuple] = []
        self.current = 0
        self.memory: dict[int, Any] = {}
        self.libraries: dict[int, bytes] = {}
        self.launch_error = 0
        self.load_error = 0
        self._next = 1000
        self.native = native
        self.callback_errors: list[BaseException] = []
        self._entry = _LAUNCH_C(self._c_launch)  # kept alive as long as the fake

    @property
    def current(self) -> int:
        """The current context: the calling thread's with ``thread_contexts``, else one."""
        if self.thread_contexts:
            return getattr(self._tls, "current", 0)
        return self._current

    @current.setter
    def current(self, ctx: int) -> None:
        if self.thread_contexts:
            self._tls.current = ctx
        else:
            self._current = ctx

    @property
    def stack(self) -> list[int]:
        """The context stack of ``cuCtxPushCurrent`` (per thread with ``thread_contexts``)."""
        if self.thread_contexts:
            if not hasattr(self._tls, "stack"):
                self._tls.stack = []
            return self._tls.stack
        return self._stack

    @stack.setter
    def stack(self, value: list[int]) -> None:
        if self.thread_contexts:
            self._tls.stack = value
        else:
            self._stack = value

    def _id(self) -> int:
        self._next += 1
        return self._next

    # ---- init / devices ------------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple:
        return (CUresult(0),) if self.devices else (CUresult.CUDA_ERROR_NO_DEVICE,)

    def cuDriverGetVersion(self) -> tuple:
        return CUresult(0), self.version

    def cuDeviceGetCount(self) -> tuple:
        return CUresult(0), self.devices

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return CUresult(0), ordinal

    def cuDeviceGetAttribute(self, attr: Any, dev: int) -> tuple:
        major = attr == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        arch = self.archs.get(int(dev), self.arch)
        return CUresult(0), arch[0] if major else arch[1]

    def cuDeviceGetName(self, n: int, dev: int) -> tuple:
        return CUresult(0), b"Fake GPU\0"

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        return CUresult(0), CUcontext(0x100 + dev)

    def cuCtxGetCurrent(self) -> tuple:
        return CUresult(0), CUcontext(self.current)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        self.calls.append(("cuCtxSetCurrent", int(ctx)))
        self.current = int(ctx)
        return (CUresult(0),)

    def cuCtxPushCurrent(self, ctx: Any) -> tuple:
        self.stack = getattr(self, "stack", []) + [self.current]
        self.current = int(ctx)
        return (CUresult(0),)

    def cuCtxPopCurrent(self) -> tuple:
        previous = self.current
        self.current = self.stack.pop()
        return CUresult(0), CUcontext(previous)

    def cuCtxGetDevice(self) -> tuple:
        return CUresult(0), self.current - 0x100

    def cuGetErrorString(self, code: Any) -> tuple:
        return CUresult(0), f"fake description of {CUresult(code).name}".encode()

    # ---- libraries -----------------------------------------------------------------------
    def cuLibraryLoadData(self, code: bytes, *rest: Any) -> tuple:
        self.calls.append(("cuLibraryLoadData", bytes(code)))
        self.load_contexts.append(self.current)
        if self.load_error:
            return (self.load_error, None)
        handle = self._id()
        self.libraries[handle] = bytes(code)
        return CUresult(0), handle

    def cuLibraryGetKernel(self, lib: int, name: bytes) -> tuple:
        entry = name.decode()
        if entry not in self.kernels:
            return CUresult.CUDA_ERROR_NOT_FOUND, None
        if self.distinct_kernels:
            handle = self._id()
            self.kernel_handles[handle] = (int(lib), entry)
            return CUresult(0), _Handle(handle)
        return CUresult(0), _Handle(hash(entry) & 0xFFFFFF)

    def cuLibraryUnload(self, lib: int) -> tuple:
        self.calls.append(("cuLibraryUnload", lib))
        self.libraries.pop(lib, None)
        return (CUresult(0),)

    def cuKernelGetFunction(self, kernel: Any) -> tuple:
        return CUresult(0), CUfunction(int(kernel))

    def cuFuncLoad(self, func: Any) -> tuple:
        self.calls.append(("cuFuncLoad", int(func)))
        return (CUresult(0),)

    # ---- memory --------------------------------------------------------------------------
    def cuFuncSetAttribute(self, func: Any, attr: Any, value: int) -> tuple:
        self.calls.append(("cuFuncSetAttribute", int(func), int(attr), value))
        return (CUresult(0),)

    def cuMemAlloc(self, nbytes: int) -> tuple:
        buf = ctypes.create_string_buffer(nbytes)
        addr = ctypes.addressof(buf)
        self.memory[addr] = buf
        if self.track_pointers:
            self.pointer_devices[addr] = self.current - 0x100
        return CUresult(0), addr

    def cuMemAllocAsync(self, nbytes: int, stream: Any) -> tuple:
        self.calls.append(("cuMemAllocAsync", nbytes, int(stream)))
        return self.cuMemAlloc(nbytes)

    def cuMemFreeAsync(self, ptr: int, stream: Any) -> tuple:
        self.calls.append(("cuMemFreeAsync", int(ptr), int(stream)))
        return self.cuMemFree(ptr)

    def cuMemFree(self, ptr: int) -> tuple:
        self.memory.pop(int(ptr), None)
        if self.track_pointers:
            self.pointer_devices.pop(int(ptr), None)
        return (CUresult(0),)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, stream: Any) -> tuple:
        self.calls.append(("cuMemcpyDtoDAsync", int(dst), int(src), n, int(stream)))
        ctypes.memmove(int(dst), int(src), n)
        return (CUresult(0),)

    def cuMemsetD8Async(self, ptr: int, value: int, n: int, stream: Any) -> tuple:
        self.calls.append(("cuMemsetD8Async", int(ptr), n))
        ctypes.memset(int(ptr), value, n)
        return (CUresult(0),)

    def cuPointerGetAttribute(self, attr: Any, ptr: int) -> tuple:
        return CUresult(0), self.pointer_devices.get(int(ptr), 0)

    def cuStreamSynchronize(self, stream: Any) -> tuple:
        return (CUresult(0),)

    def cuMemcpyDtoH(self, dst: bytearray, src: int, n: int) -> tuple:
        dst[:n] = ctypes.string_at(int(src), n)
        return (CUresult(0),)

    # ---- entry points ----------------------------------------------------------------------
    def cuGetProcAddress(self, symbol: bytes, version: int, flags: Any) -> tuple:
        self.calls.append(("cuGetProcAddress", bytes(symbol), version, int(flags)))
        if not self.native or symbol != b"cuLaunchKernel":
            return CUresult(0), 0, 1  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        return CUresult(0), ctypes.cast(self._entry, ctypes.c_void_p).value, 0

    def _c_launch(self, f: int | None, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                  shmem: int, stream: int | None, params: int | None, extra: int | None) -> int:
        """The C entry point: what the driver's cuLaunchKernel would receive (NULL arrives
        as None). An exception cannot cross back into C, so it is kept and reported as
        CUDA_ERROR_INVALID_VALUE."""
        try:
            self.calls.append(("c entry", f or 0, stream or 0, extra or 0))
            return int(self.cuLaunchKernel(f or 0, gx, gy, gz, bx, by, bz, shmem, stream or 0,
                                           params or 0, extra or 0)[0])
        except BaseException as exc:  # noqa: BLE001 - reported through callback_errors
            self.callback_errors.append(exc)
            return int(CUresult.CUDA_ERROR_INVALID_VALUE)

    # ---- launch --------------------------------------------------------------------------
    def cuLaunchKernel(self, f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shmem: int, stream: Any, params: int, extra: int) -> tuple:
        for v in (gx, gy, gz, bx, by, bz, shmem):
            if not 0 <= v < (1 << 32):
                raise OverflowError(f"value {v} out of range for unsigned int")
        if self.launch_error:
            return (self.launch_error,)
        known = self.kernel_handles.get(int(f))
        entry = known[1] if known else next(k for k in self.kernels
                                            if hash(k) & 0xFFFFFF == int(f))
        fmt, impl = self.kernels[entry]
        codes = fmt
        values = []
        addrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        for i, code in enumerate(codes):
            size = struct.calcsize(code)
            values.append(struct.unpack(code, ctypes.string_at(addrs[i], size))[0])
        self.calls.append(("cuLaunchKernel", entry, (gx, gy, gz), (bx, by, bz), shmem,
                           int(stream), tuple(values)))
        self.launch_contexts.append((entry, self.current, int(stream), int(f)))
        impl((gx, gy, gz), (bx, by, bz), shmem, values)
        return (CUresult(0),)



def install_framework(monkeypatch: Any, name: str, module: Any) -> Any:
    """Put a stand-in ``torch``/``cupy`` module in ``sys.modules`` for the test, and forget
    the runtime's adapters of earlier stand-ins (they are cached per array type)."""
    import sys

    from kernelpack.runtime import arrays, launcher

    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(arrays, "_adapters", {})
    monkeypatch.setattr(launcher, "_adapters_by_type", {})
    return module

def install(monkeypatch: Any, fake: FakeDriver) -> FakeDriver:
    """Make kernelpack.runtime use ``fake`` (and forget devices/libraries of earlier tests)."""
    from kernelpack.runtime import device, driver, execute, library, native

    monkeypatch.setattr(driver, "_driver", fake)
    monkeypatch.setattr(driver, "_init_error", None)
    driver._initialized.clear()
    monkeypatch.setattr(device, "_devices", {})
    monkeypatch.setattr(device, "_count", None)
    monkeypatch.setattr(library, "_libraries", {})
    monkeypatch.setattr(library, "_selections", {})
    monkeypatch.setattr(execute, "_drv_mod", None)
    monkeypatch.setattr(execute, "_streams", {})
    monkeypatch.setattr(native, "_chosen", None)
    try:  # threads remember the context they confirmed (C fast path): forget the last test's
        from kernelpack.runtime import _launch
    except ImportError:
        pass
    else:
        _launch.forget_contexts()
    return fake


class HostArray:
    """A minimal array exporting ``__cuda_array_interface__`` over host memory (the fake
    driver's "device" memory)."""

    def __init__(self, values: list, fmt: str = "f", shape: tuple | None = None,
                 typestr: str = "<f4") -> None:
        self.fmt = fmt
        self.n = len(values)
        self.buf = ctypes.create_string_buffer(struct.pack(f"<{self.n}{fmt}", *values),
                                               max(1, struct.calcsize(fmt) * self.n))
        self.shape = shape if shape is not None else (self.n,)
        self.typestr = typestr
        self.strides = None

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.typestr,
                "data": (ctypes.addressof(self.buf), False), "strides": self.strides,
                "version": 3}

    def values(self) -> list:
        return list(struct.unpack(f"<{self.n}{self.fmt}", self.buf.raw[:struct.calcsize(self.fmt) * self.n]))
