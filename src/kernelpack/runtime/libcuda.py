"""The CUDA driver API through ctypes: the calls the runtime makes, without cuda.bindings.

Importing ``cuda.bindings.driver`` costs 17-45 ms (a Cython module with thousands of types),
paid inside a process's first launch; that alone is most of a warm start's budget
(``benchmarks/warmstart.py``). The runtime needs about thirty driver functions, all but the
launch itself called once per process, device or library, so this module reaches them with
ctypes (already imported by every process that has torch, and by the runtime's parameter
blocks) and the launch goes through kernelpack's C extension as before.

Every function is found with the driver's own ``cuGetProcAddress``, asking for the ABI this
module was written against (``_SPECS``: CUDA 12.0's, so a later driver that adds a ``_v3``
still hands back the variant these argument types describe) and for the
default-stream flavour cuda.bindings would use (legacy, or per-thread when its switch
``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is set), so both doors reach the same entry
points. Functions are resolved on first use.

The calling convention is cuda.bindings': ``cuX(inputs...) -> (CUresult, *outputs)``, with
handles as plain ints (NULL is 0). Handle arguments go through ``int()``, so cuda.bindings'
handle objects (``CUstream``) are accepted too. That lets :mod:`.driver` hand either object to
the rest of the runtime.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_ubyte, c_uint, c_uint64, c_void_p
from typing import Any, Callable

__all__ = ["LibCuda", "open_driver", "MIN_DRIVER_VERSION"]

#: ``cuLibraryLoadData`` (context-independent loading) first shipped with CUDA 12.0 (R525)
MIN_DRIVER_VERSION = 12000

_P, _I, _U, _Z, _Q = c_void_p, c_int, c_uint, c_size_t, c_uint64
_PI, _PP, _PQ, _PS = POINTER(c_int), POINTER(c_void_p), POINTER(c_uint64), POINTER(c_char_p)

# name -> argument types; every function returns CUresult. Each is asked for at the ABI of
# MIN_DRIVER_VERSION, the oldest driver kernelpack supports (_NEWER: the functions it has only
# from a later version), not at each function's first version: cuGetProcAddress answers the
# newest variant up to the version asked, and the per-thread-stream variants (_ptsz/_ptds) of
# the stream functions only exist from CUDA 7.0 on, so asking for 3.2's cuMemsetD8Async with the
# per-thread flag finds nothing. The signatures below are unchanged from 12.0 to 13.x.
_SPECS: dict[str, tuple[Any, ...]] = {
    "cuInit": (_U,),
    "cuDriverGetVersion": (_PI,),
    "cuDeviceGetCount": (_PI,),
    "cuDeviceGet": (_PI, _I),
    "cuDeviceGetAttribute": (_PI, _I, _I),
    "cuDeviceGetName": (_P, _I, _I),
    "cuDevicePrimaryCtxRetain": (_PP, _I),
    "cuCtxGetCurrent": (_PP,),
    "cuCtxSetCurrent": (_P,),
    "cuCtxPushCurrent": (_P,),
    "cuCtxPopCurrent": (_PP,),
    "cuCtxGetDevice": (_PI,),
    "cuLibraryLoadData": (_PP, c_char_p, _P, _P, _U, _P, _P, _U),
    "cuLibraryGetKernel": (_PP, _P, c_char_p),
    "cuLibraryUnload": (_P,),
    "cuKernelGetFunction": (_PP, _P),
    "cuFuncLoad": (_P,),
    "cuFuncSetAttribute": (_P, _I, _I),
    "cuLaunchKernel": (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P),
    "cuMemAlloc": (_PQ, _Z),
    "cuMemFree": (_Q,),
    "cuMemAllocAsync": (_PQ, _Z, _P),
    "cuMemFreeAsync": (_Q, _P),
    "cuMemcpyDtoH": (_P, _Q, _Z),
    "cuMemsetD8Async": (_Q, c_ubyte, _Z, _P),
    "cuPointerGetAttribute": (_P, _I, _Q),
    "cuStreamSynchronize": (_P,),
    "cuStreamWaitEvent": (_P, _P, _U),
    "cuEventCreate": (_PP, _U),
    "cuEventRecord": (_P, _P),
    "cuEventDestroy": (_P,),
    "cuGetErrorName": (_I, _PS),
    "cuGetErrorString": (_I, _PS),
}
_NEWER = {"cuFuncLoad": 12040}

# CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
#                              cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
_GET_PROC_ADDRESS_ARGS = (c_char_p, _PP, c_int, c_uint64, _PI)

# Every entry point is one function-pointer type returning CUresult, with its argument types
# set on each pointer: a CFUNCTYPE per signature is a new ctypes class (~7 µs each, ten of
# them in a process's first launch); setting ``argtypes`` on an instance converts the same.
_ENTRY = ctypes.CFUNCTYPE(c_int)

_NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND


class CUdevice_attribute:  # the members the runtime reads (cuda.bindings' names)
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class CUfunction_attribute:
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUpointer_attribute:
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class CUevent_flags:
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class CUdriverProcAddress_flags:
    CU_GET_PROC_ADDRESS_DEFAULT = 0
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2


# cuPointerGetAttribute writes a different type per attribute: the ones supported here
_POINTER_ATTRIBUTE_TYPES = {CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int}


def _handle(value: Any) -> int:
    """A handle argument as an int: ints, None (NULL) and cuda.bindings' handle objects."""
    return 0 if value is None else int(value)


class LibCuda:
    """The driver functions the runtime calls, over one ``cuGetProcAddress``.

    ``get_proc_address`` is the driver's ``cuGetProcAddress_v2`` (a ctypes function taking
    ``_GET_PROC_ADDRESS_ARGS``; tests hand in a Python one); ``per_thread`` picks the per-thread
    default-stream flavour of the stream functions.
    """

    CUdevice_attribute = CUdevice_attribute
    CUpointer_attribute = CUpointer_attribute
    CUevent_flags = CUevent_flags
    CUfunction_attribute = CUfunction_attribute
    CUdriverProcAddress_flags = CUdriverProcAddress_flags

    def __init__(self, get_proc_address: Callable[..., int], per_thread: bool) -> None:
        self._get = get_proc_address
        flags = CUdriverProcAddress_flags
        self._flags = (flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread
                       else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM)
        self._fns: dict[str, Callable[..., int]] = {}

    def __repr__(self) -> str:
        return f"<LibCuda: {len(self._fns)} driver functions resolved>"

    # ---- resolving ---------------------------------------------------------------------------
    def _fn(self, name: str) -> Callable[..., int]:
        fn = self._fns.get(name)
        if fn is None:
            argtypes = _SPECS[name]
            address, err = self._address(name, _NEWER.get(name, MIN_DRIVER_VERSION))
            if not address:
                return _missing(name, err or _NOT_FOUND)
            fn = _ENTRY(address)
            fn.argtypes = argtypes  # on the pointer, not a CFUNCTYPE per signature (see _ENTRY)
            self._fns[name] = fn
        return fn

    def _address(self, symbol: str, version: int) -> tuple[int, int]:
        """The entry point's address (0: none) and the lookup's own CUresult: a stub
        library (the toolkit's ``stubs/libcuda.so``) answers CUDA_ERROR_STUB_LIBRARY here,
        which then names the failure instead of a plain "not found"."""
        err, address, status = self.cuGetProcAddress(symbol.encode(), version, self._flags)
        return (0, err) if err or status else (address, 0)

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: int) -> tuple[int, int, int]:
        """cuda.bindings' form: ``(CUresult, address, symbolStatus)``."""
        pfn = c_void_p()
        status = c_int()
        err = self._get(bytes(symbol), byref(pfn), int(version), int(flags), byref(status))
        return (err, int(pfn.value or 0), status.value)

    def describe(self, code: int) -> tuple[str, str]:
        """The driver's name and description of a CUresult (``CUresult <n>`` / "no
        description" when it has none)."""
        name, text = c_char_p(), c_char_p()
        err = self._fn("cuGetErrorName")(code, byref(name))
        label = f"CUresult {code}"
        if not err and name.value:
            label = name.value.decode(errors="replace")
        err = self._fn("cuGetErrorString")(code, byref(text))
        detail = "no description"
        if not err and text.value:
            detail = text.value.decode(errors="replace")
        return label, detail

    # ---- init, devices, contexts -------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple[int]:
        return (self._fn("cuInit")(flags),)

    def cuDriverGetVersion(self) -> tuple[int, int]:
        out = c_int()
        return (self._fn("cuDriverGetVersion")(byref(out)), out.value)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        out = c_int()
        return (self._fn("cuDeviceGetCount")(byref(out)), out.value)

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        out = c_int()
        return (self._fn("cuDeviceGet")(byref(out), int(ordinal)), out.value)

    def cuDeviceGetAttribute(self, attribute: int, device: int) -> tuple[int, int]:
        out = c_int()
        return (self._fn("cuDeviceGetAttribute")(byref(out), int(attribute), int(device)),
                out.value)

    def cuDeviceGetName(self, length: int, device: int) -> tuple[int, bytes]:
        # a bytearray's address through c_char.from_buffer: create_string_buffer would make a
        # ``c_char * length`` class (~30 µs the first time, inside a process's first launch)
        length = int(length)
        buf = bytearray(max(length, 1))  # (from_buffer refuses an empty one)
        view = ctypes.c_char.from_buffer(buf)  # exports buf: it cannot move during the call
        err = self._fn("cuDeviceGetName")(ctypes.addressof(view), length, int(device))
        return (err, bytes(buf[:length]))

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuDevicePrimaryCtxRetain")(byref(out), int(device)), out.value or 0)

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuCtxGetCurrent")(byref(out)), out.value or 0)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        return (self._fn("cuCtxSetCurrent")(_handle(ctx)),)

    def cuCtxPushCurrent(self, ctx: Any) -> tuple[int]:
        return (self._fn("cuCtxPushCurrent")(_handle(ctx)),)

    def cuCtxPopCurrent(self) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuCtxPopCurrent")(byref(out)), out.value or 0)

    def cuCtxGetDevice(self) -> tuple[int, int]:
        out = c_int()
        return (self._fn("cuCtxGetDevice")(byref(out)), out.value)

    # ---- libraries and kernels ---------------------------------------------------------------
    def cuLibraryLoadData(self, code: bytes, jit_options: Any, jit_values: Any, n_jit: int,
                          library_options: Any, library_values: Any,
                          n_library: int) -> tuple[int, int]:
        """Load a cubin or NUL-terminated PTX; options are not supported (none are used)."""
        if jit_options or jit_values or n_jit or library_options or library_values or n_library:
            raise ValueError("LibCuda.cuLibraryLoadData takes no JIT or library options")
        out = c_void_p()
        err = self._fn("cuLibraryLoadData")(byref(out), bytes(code), None, None, 0, None, None,
                                            0)
        return (err, out.value or 0)

    def cuLibraryGetKernel(self, library: Any, name: bytes) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuLibraryGetKernel")(byref(out), _handle(library), bytes(name)),
                out.value or 0)

    def cuLibraryUnload(self, library: Any) -> tuple[int]:
        return (self._fn("cuLibraryUnload")(_handle(library)),)

    def cuKernelGetFunction(self, kernel: Any) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuKernelGetFunction")(byref(out), _handle(kernel)), out.value or 0)

    def cuFuncSetAttribute(self, function: Any, attribute: int, value: int) -> tuple[int]:
        return (self._fn("cuFuncSetAttribute")(_handle(function), int(attribute), int(value)),)

    def cuFuncLoad(self, function: Any) -> tuple[int]:
        return (self._fn("cuFuncLoad")(_handle(function)),)

    def cuLaunchKernel(self, function: Any, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, shared_mem: int, stream: Any, kernel_params: Any,
                       extra: Any) -> tuple[int]:
        """``kernel_params``: the address of a prepacked ``void*`` array (an int), as the
        runtime passes it; ``extra`` must be 0/None."""
        return (self._fn("cuLaunchKernel")(_handle(function), gx, gy, gz, bx, by, bz,
                                           shared_mem, _handle(stream), _handle(kernel_params),
                                           _handle(extra)),)

    # ---- memory ------------------------------------------------------------------------------
    def cuMemAlloc(self, nbytes: int) -> tuple[int, int]:
        out = c_uint64()
        return (self._fn("cuMemAlloc")(byref(out), int(nbytes)), out.value)

    def cuMemFree(self, ptr: Any) -> tuple[int]:
        return (self._fn("cuMemFree")(_handle(ptr)),)

    def cuMemAllocAsync(self, nbytes: int, stream: Any) -> tuple[int, int]:
        out = c_uint64()
        return (self._fn("cuMemAllocAsync")(byref(out), int(nbytes), _handle(stream)),
                out.value)

    def cuMemFreeAsync(self, ptr: Any, stream: Any) -> tuple[int]:
        return (self._fn("cuMemFreeAsync")(_handle(ptr), _handle(stream)),)

    def cuMemcpyDtoH(self, dst: bytearray, src: Any, nbytes: int) -> tuple[int]:
        """Copy into a writable host buffer (a bytearray of at least ``nbytes``)."""
        view = memoryview(dst)
        if view.readonly or view.nbytes < nbytes:
            raise ValueError(f"cuMemcpyDtoH needs a writable buffer of {nbytes} bytes")
        host = ctypes.c_char.from_buffer(dst)
        return (self._fn("cuMemcpyDtoH")(ctypes.addressof(host), _handle(src), int(nbytes)),)

    def cuMemsetD8Async(self, ptr: Any, value: int, count: int, stream: Any) -> tuple[int]:
        return (self._fn("cuMemsetD8Async")(_handle(ptr), int(value), int(count),
                                            _handle(stream)),)

    def cuPointerGetAttribute(self, attribute: int, ptr: Any) -> tuple[int, int]:
        kind = _POINTER_ATTRIBUTE_TYPES.get(int(attribute))
        if kind is None:
            raise ValueError(f"LibCuda.cuPointerGetAttribute does not read attribute "
                             f"{int(attribute)}")
        out = kind()
        err = self._fn("cuPointerGetAttribute")(ctypes.addressof(out), int(attribute),
                                                _handle(ptr))
        return (err, out.value)

    # ---- streams and events ------------------------------------------------------------------
    def cuStreamSynchronize(self, stream: Any) -> tuple[int]:
        return (self._fn("cuStreamSynchronize")(_handle(stream)),)

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple[int]:
        return (self._fn("cuStreamWaitEvent")(_handle(stream), _handle(event), int(flags)),)

    def cuEventCreate(self, flags: int) -> tuple[int, int]:
        out = c_void_p()
        return (self._fn("cuEventCreate")(byref(out), int(flags)), out.value or 0)

    def cuEventRecord(self, event: Any, stream: Any) -> tuple[int]:
        return (self._fn("cuEventRecord")(_handle(event), _handle(stream)),)

    def cuEventDestroy(self, event: Any) -> tuple[int]:
        return (self._fn("cuEventDestroy")(_handle(event)),)


def _missing(name: str, code: int) -> Callable[..., int]:
    """What an entry point the driver did not give answers: the lookup's CUresult, or
    CUDA_ERROR_NOT_FOUND (checked and named like any failure; not cached, so nothing is
    remembered about it)."""
    def missing(*args: Any) -> int:
        return code

    missing.__name__ = name
    return missing


def open_driver(per_thread: bool, library: str = "libcuda.so.1") -> LibCuda:
    """:class:`LibCuda` over the system's driver library.

    Raises
    ------
    OSError
        The library cannot be loaded (no NVIDIA driver on this machine).
    LookupError
        The driver has no ``cuGetProcAddress_v2``: it predates CUDA 12.0, which kernelpack's
        context-independent loading needs.
    """
    lib = ctypes.CDLL(library)
    try:
        get = lib.cuGetProcAddress_v2
    except AttributeError:
        raise LookupError(f"{library} has no cuGetProcAddress_v2: the NVIDIA driver predates "
                          f"CUDA 12.0 (R525), which kernelpack needs") from None
    # the library's own function object, typed in place as _ENTRY's pointers are: no ctypes
    # class made for it, no cast to its address
    get.restype, get.argtypes = c_int, _GET_PROC_ADDRESS_ARGS
    return LibCuda(get, per_thread)
