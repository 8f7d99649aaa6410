"""The CUDA driver functions the runtime calls, as their C ABI declares them: one table per
door of :mod:`.libcuda` (``SPECS``: each argument's exact ctypes type; ``KINDS``: what
``_drvcall.c``'s ``driver_call`` passes for it), the ABI version each is asked for, and the
enum members the runtime reads (cuda.bindings' names, so either driver object answers them).
Kept apart from the door itself so the signatures can be read, and tested against each other,
in one place.
"""

from __future__ import annotations

from ctypes import POINTER, c_char_p, c_int, c_size_t, c_ubyte, c_uint, c_uint64, c_void_p
from typing import Any

__all__ = ["MIN_DRIVER_VERSION", "SPECS", "NEWER", "KINDS", "GET_PROC_ADDRESS_ARGS",
           "GET_PROC_ADDRESS_KINDS", "OUTPUTS", "OUTPUT_TYPES", "POINTER_ATTRIBUTES_READ",
           "CUdevice_attribute", "CUfunction_attribute", "CUpointer_attribute", "CUevent_flags",
           "CUdriverProcAddress_flags"]

#: ``cuLibraryLoadData`` (context-independent loading) first shipped with CUDA 12.0 (R525)
MIN_DRIVER_VERSION = 12000

_P, _I, _U, _Z, _Q = c_void_p, c_int, c_uint, c_size_t, c_uint64
_PI, _PP, _PQ, _PS = POINTER(c_int), POINTER(c_void_p), POINTER(c_uint64), POINTER(c_char_p)

# name -> argument types; every function returns CUresult. Each is asked for at the ABI of
# MIN_DRIVER_VERSION, the oldest driver kernelpack supports (NEWER: the functions it has only
# from a later version), not at each function's first version: cuGetProcAddress answers the
# newest variant up to the version asked, and the per-thread-stream variants (_ptsz/_ptds) of
# the stream functions only exist from CUDA 7.0 on, so asking for 3.2's cuMemsetD8Async with the
# per-thread flag finds nothing. The signatures below are unchanged from 12.0 to 13.x.
SPECS: dict[str, tuple[Any, ...]] = {
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
    "cuMemcpyDtoDAsync": (_Q, _Q, _Z, _P),
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
NEWER = {"cuFuncLoad": 12040}

# name -> what each C argument is, for _drvcall.c's driver_call: v an integer value, r a
# readable buffer (bytes, or None for NULL), w a writable buffer, and outputs i (int),
# p (pointer or 64-bit value), s (const char *). The outputs come back after the CUresult in
# this order. Same arity as SPECS (tests hold the two tables to each other).
KINDS: dict[str, str] = {
    "cuInit": "v",
    "cuDriverGetVersion": "i",
    "cuDeviceGetCount": "i",
    "cuDeviceGet": "iv",
    "cuDeviceGetAttribute": "ivv",
    "cuDeviceGetName": "wvv",
    "cuDevicePrimaryCtxRetain": "pv",
    "cuCtxGetCurrent": "p",
    "cuCtxSetCurrent": "v",
    "cuCtxPushCurrent": "v",
    "cuCtxPopCurrent": "p",
    "cuCtxGetDevice": "i",
    "cuLibraryLoadData": "prvvvvvv",
    "cuLibraryGetKernel": "pvr",
    "cuLibraryUnload": "v",
    "cuKernelGetFunction": "pv",
    "cuFuncLoad": "v",
    "cuFuncSetAttribute": "vvv",
    "cuLaunchKernel": "vvvvvvvvvvv",
    "cuMemAlloc": "pv",
    "cuMemFree": "v",
    "cuMemAllocAsync": "pvv",
    "cuMemFreeAsync": "vv",
    "cuMemcpyDtoH": "wvv",
    "cuMemcpyDtoDAsync": "vvvv",
    "cuMemsetD8Async": "vvvv",
    "cuPointerGetAttribute": "ivv",
    "cuStreamSynchronize": "v",
    "cuStreamWaitEvent": "vvv",
    "cuEventCreate": "pv",
    "cuEventRecord": "vv",
    "cuEventDestroy": "v",
    "cuGetErrorName": "vs",
    "cuGetErrorString": "vs",
}
GET_PROC_ADDRESS_KINDS = "rpvvi"
OUTPUTS = "ips"
# an output the driver writes through a plain ``void*`` (cuPointerGetAttribute's): its type
OUTPUT_TYPES = {"i": c_int, "p": c_uint64, "s": c_char_p}

# CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
#                              cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
GET_PROC_ADDRESS_ARGS = (c_char_p, _PP, c_int, c_uint64, _PI)



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


# cuPointerGetAttribute writes a different type per attribute: the ones supported here (an
# int each, which KINDS says)
POINTER_ATTRIBUTES_READ = frozenset({CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL})
