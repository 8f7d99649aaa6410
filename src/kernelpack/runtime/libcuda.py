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

Two ways to make the call, over one description of the signatures (:mod:`.cuda_abi`): where
kernelpack's C extension is built (x86-64 and AArch64 Linux), ``_drvcall.c``'s ``driver_call``
calls the entry point's address directly, told by a string what each argument is; opening the
driver, cuInit and the device's questions then cost ~55 µs less of an H200 host's first launch
than through ctypes, whose function objects and call interfaces are made on first use.
Without the extension, ctypes calls them with each argument's exact C type. Results are the
same either way.

The calling convention is cuda.bindings': ``cuX(inputs...) -> (CUresult, *outputs)``, with
handles as plain ints (NULL is 0). Handle arguments go through ``int()``, so cuda.bindings'
handle objects (``CUstream``) are accepted too. That lets :mod:`.driver` hand either object to
the rest of the runtime.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import byref, c_char_p, c_int, c_void_p
from typing import Any, Callable

from .cuda_abi import (GET_PROC_ADDRESS_ARGS as _GET_PROC_ADDRESS_ARGS,
                       GET_PROC_ADDRESS_KINDS as _GET_PROC_ADDRESS_KINDS, KINDS as _KINDS,
                       MIN_DRIVER_VERSION, NEWER as _NEWER, OUTPUT_TYPES as _OUTPUT_TYPES,
                       OUTPUTS as _OUTPUTS, POINTER_ATTRIBUTES_READ as _POINTER_ATTRIBUTES_READ,
                       SPECS as _SPECS, CUdevice_attribute, CUdriverProcAddress_flags,
                       CUevent_flags, CUfunction_attribute, CUpointer_attribute)

__all__ = ["LibCuda", "open_driver", "MIN_DRIVER_VERSION"]

# Every entry point is one function-pointer type returning CUresult, with its argument types
# set on each pointer: a CFUNCTYPE per signature is a new ctypes class (~7 µs each, ten of
# them in a process's first launch); setting ``argtypes`` on an instance converts the same.
_ENTRY = ctypes.CFUNCTYPE(c_int)

_NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND
_INT_MAX = 2**31 - 1  # a C int parameter's largest value (cuDeviceGetName's length)


def _handle(value: Any) -> int:
    """A handle argument as an int: ints, None (NULL) and cuda.bindings' handle objects."""
    return 0 if value is None else int(value)


def _native_caller() -> Callable[..., tuple] | None:
    """``_drvcall.c``'s ``driver_call``, or None: no C extension, or an ABI it is not built
    for (then ctypes calls the driver)."""
    try:
        from ._launch import driver_call
    except ImportError:
        return None
    return driver_call  # type: ignore[no-any-return]


def _symbol(library: str, name: str) -> int:
    """The address of ``name`` in ``library`` (0: none), opened with dlopen from C; OSError
    when the library cannot be loaded."""
    from ._launch import driver_symbol

    return int(driver_symbol(library, name))


def _address_of(function: Any) -> int:
    """The C address of ``cuGetProcAddress_v2`` given as an int or a ctypes function (0 for
    anything else, e.g. a Python callable: only ctypes can call that)."""
    if isinstance(function, int):
        return function
    if isinstance(function, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        return ctypes.cast(function, c_void_p).value or 0
    return 0


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

    def __init__(self, get_proc_address: Any, per_thread: bool, *,
                 native: bool = True) -> None:
        """``get_proc_address``: the driver's ``cuGetProcAddress_v2``, as its address (an int)
        or a ctypes function; ``native=False`` calls everything through ctypes even where the
        C extension could (tests of that door)."""
        self._get = get_proc_address
        flags = CUdriverProcAddress_flags
        self._flags = (flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread
                       else flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM)
        self._entries: dict[str, int] = {}  # resolved addresses (both doors)
        self._fns: dict[str, Callable[..., int]] = {}  # the ctypes door's functions of them
        call = _native_caller() if native else None
        self._get_address = _address_of(get_proc_address) if call is not None else 0
        self._native = call if self._get_address else None
        if self._native is None and isinstance(get_proc_address, int):
            # ctypes needs a function object for it
            get = _ENTRY(get_proc_address)
            get.argtypes = _GET_PROC_ADDRESS_ARGS
            self._get = get

    @property
    def door(self) -> str:
        """How the driver is called: ``"C"`` (the extension's driver_call) or ``"ctypes"``."""
        return "C" if self._native is not None else "ctypes"

    def __repr__(self) -> str:
        return f"<LibCuda ({self.door}): {len(self._entries)} driver functions resolved>"

    # ---- resolving and calling ---------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> tuple:
        """``name(*args)`` in cuda.bindings' form: ``(CUresult, *outputs)``, the inputs being
        ``_KINDS[name]``'s v/r/w arguments in order."""
        native = self._native
        if native is None:
            return self._ctypes_call(name, args)
        address = self._entries.get(name)
        if address is None:
            address, err = self._resolve(name)
            if not address:
                return _failed(name, err)
        return native(address, _KINDS[name], *args)  # type: ignore[no-any-return]

    def _ctypes_call(self, name: str, args: tuple) -> tuple:
        """:meth:`_call` through ctypes: output variables of each pointer's own type."""
        fn = self._fn(name)
        inputs = iter(args)
        cargs: list[Any] = []
        outs: list[Any] = []
        held: list[Any] = []  # the writable buffers' exports, kept until the call returns
        for kind, ctype in zip(_KINDS[name], _SPECS[name]):
            if kind in _OUTPUTS:
                target = getattr(ctype, "_type_", None)
                if isinstance(target, type):  # POINTER(T): T's variable, by reference
                    out = target()
                    cargs.append(byref(out))
                else:  # a plain void*: the driver writes _OUTPUT_TYPES[kind] there
                    out = _OUTPUT_TYPES[kind]()
                    cargs.append(ctypes.addressof(out))
                outs.append(out)
            elif kind == "w":  # a writable buffer, by address: exported (so it cannot move)
                view = _writable(next(inputs))  # until the call returns, as driver_call does
                held.append(view)
                cargs.append(ctypes.addressof(view))
            else:
                cargs.append(next(inputs))
        err = fn(*cargs)
        return (err, *[_value(out) for out in outs])

    def _fn(self, name: str) -> Callable[..., int]:
        """The ctypes door's function for ``name`` (a callable answering the lookup's
        CUresult when the driver has none)."""
        fn = self._fns.get(name)
        if fn is None:
            address, err = self._resolve(name)
            if not address:
                return _missing(name, err)
            fn = _ENTRY(address)
            fn.argtypes = _SPECS[name]  # on the pointer, not a CFUNCTYPE per signature (_ENTRY)
            self._fns[name] = fn
        return fn

    def _resolve(self, name: str) -> tuple[int, int]:
        """Both doors' lookup of ``name`` at the CUDA version it is called at: ``(address,
        0)``, remembered in ``_entries``, or ``(0, CUresult)`` when the driver has none (not
        remembered: the next call asks again and fails the same way)."""
        address = self._entries.get(name)
        if address is None:
            address, err = self._address(name, _NEWER.get(name, MIN_DRIVER_VERSION))
            if not address:
                return 0, err or _NOT_FOUND
            self._entries[name] = address
        return address, 0

    def _address(self, symbol: str, version: int) -> tuple[int, int]:
        """The entry point's address (0: none) and the lookup's own CUresult: a stub
        library (the toolkit's ``stubs/libcuda.so``) answers CUDA_ERROR_STUB_LIBRARY here,
        which then names the failure instead of a plain "not found"."""
        err, address, status = self.cuGetProcAddress(symbol.encode(), version, self._flags)
        return (0, err) if err or status else (address, 0)

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: int) -> tuple[int, int, int]:
        """cuda.bindings' form: ``(CUresult, address, symbolStatus)``."""
        if self._native is not None:
            return self._native(self._get_address, _GET_PROC_ADDRESS_KINDS,  # type: ignore
                                bytes(symbol), int(version), int(flags))
        pfn = c_void_p()
        status = c_int()
        err = self._get(bytes(symbol), byref(pfn), int(version), int(flags), byref(status))
        return (err, int(pfn.value or 0), status.value)

    def describe(self, code: int) -> tuple[str, str]:
        """The driver's name and description of a CUresult (``CUresult <n>`` / "no
        description" when it has none)."""
        err, name = self._call("cuGetErrorName", int(code))
        label = f"CUresult {code}"
        if not err and name:
            label = name.decode(errors="replace")
        err, text = self._call("cuGetErrorString", int(code))
        detail = "no description"
        if not err and text:
            detail = text.decode(errors="replace")
        return label, detail

    # ---- init, devices, contexts -------------------------------------------------------------
    def cuInit(self, flags: int) -> tuple[int]:
        return self._call("cuInit", int(flags))  # type: ignore[return-value]

    def cuDriverGetVersion(self) -> tuple[int, int]:
        return self._call("cuDriverGetVersion")  # type: ignore[return-value]

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return self._call("cuDeviceGetCount")  # type: ignore[return-value]

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return self._call("cuDeviceGet", int(ordinal))  # type: ignore[return-value]

    def cuDeviceGetAttribute(self, attribute: int, device: int) -> tuple[int, int]:
        return self._call("cuDeviceGetAttribute", int(attribute),  # type: ignore[return-value]
                          int(device))

    def cuDeviceGetName(self, length: int, device: int) -> tuple[int, bytes]:
        """``(CUresult, name)``: ``length`` bytes, NUL-padded. ValueError for a length that
        is no C int (``len``) or no buffer size: below 0 or above 2**31-1."""
        # a bytearray written in place: create_string_buffer would make a ``c_char * length``
        # class (~30 µs the first time, inside a process's first launch)
        length = int(length)
        if not 0 <= length <= _INT_MAX:
            raise ValueError(f"LibCuda.cuDeviceGetName: length must be in 0..{_INT_MAX} "
                             f"(got {length})")
        buf = bytearray(max(length, 1))  # a byte to point at even when length is 0
        err = self._call("cuDeviceGetName", buf, length, int(device))[0]
        return (err, bytes(buf[:length]))

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, int]:
        return self._call("cuDevicePrimaryCtxRetain", int(device))  # type: ignore[return-value]

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return self._call("cuCtxGetCurrent")  # type: ignore[return-value]

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        return self._call("cuCtxSetCurrent", _handle(ctx))  # type: ignore[return-value]

    def cuCtxPushCurrent(self, ctx: Any) -> tuple[int]:
        return self._call("cuCtxPushCurrent", _handle(ctx))  # type: ignore[return-value]

    def cuCtxPopCurrent(self) -> tuple[int, int]:
        return self._call("cuCtxPopCurrent")  # type: ignore[return-value]

    def cuCtxGetDevice(self) -> tuple[int, int]:
        return self._call("cuCtxGetDevice")  # type: ignore[return-value]

    # ---- libraries and kernels ---------------------------------------------------------------
    def cuLibraryLoadData(self, code: bytes, jit_options: Any, jit_values: Any, n_jit: int,
                          library_options: Any, library_values: Any,
                          n_library: int) -> tuple[int, int]:
        """Load a cubin or NUL-terminated PTX; options are not supported (none are used)."""
        if jit_options or jit_values or n_jit or library_options or library_values or n_library:
            raise ValueError("LibCuda.cuLibraryLoadData takes no JIT or library options")
        return self._call("cuLibraryLoadData", bytes(code),  # type: ignore[return-value]
                          0, 0, 0, 0, 0, 0)

    def cuLibraryGetKernel(self, library: Any, name: bytes) -> tuple[int, int]:
        return self._call("cuLibraryGetKernel", _handle(library),  # type: ignore[return-value]
                          bytes(name))

    def cuLibraryUnload(self, library: Any) -> tuple[int]:
        return self._call("cuLibraryUnload", _handle(library))  # type: ignore[return-value]

    def cuKernelGetFunction(self, kernel: Any) -> tuple[int, int]:
        return self._call("cuKernelGetFunction", _handle(kernel))  # type: ignore[return-value]

    def cuFuncSetAttribute(self, function: Any, attribute: int, value: int) -> tuple[int]:
        return self._call("cuFuncSetAttribute", _handle(function),  # type: ignore[return-value]
                          int(attribute), int(value))

    def cuFuncLoad(self, function: Any) -> tuple[int]:
        return self._call("cuFuncLoad", _handle(function))  # type: ignore[return-value]

    def cuLaunchKernel(self, function: Any, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, shared_mem: int, stream: Any, kernel_params: Any,
                       extra: Any) -> tuple[int]:
        """``kernel_params``: the address of a prepacked ``void*`` array (an int), as the
        runtime passes it; ``extra`` must be 0/None."""
        return self._call("cuLaunchKernel", _handle(function),  # type: ignore[return-value]
                          int(gx), int(gy), int(gz), int(bx), int(by), int(bz),
                          int(shared_mem), _handle(stream), _handle(kernel_params),
                          _handle(extra))

    # ---- memory ------------------------------------------------------------------------------
    def cuMemAlloc(self, nbytes: int) -> tuple[int, int]:
        return self._call("cuMemAlloc", int(nbytes))  # type: ignore[return-value]

    def cuMemFree(self, ptr: Any) -> tuple[int]:
        return self._call("cuMemFree", _handle(ptr))  # type: ignore[return-value]

    def cuMemAllocAsync(self, nbytes: int, stream: Any) -> tuple[int, int]:
        return self._call("cuMemAllocAsync", int(nbytes),  # type: ignore[return-value]
                          _handle(stream))

    def cuMemFreeAsync(self, ptr: Any, stream: Any) -> tuple[int]:
        return self._call("cuMemFreeAsync", _handle(ptr),  # type: ignore[return-value]
                          _handle(stream))

    def cuMemcpyDtoH(self, dst: bytearray, src: Any, nbytes: int) -> tuple[int]:
        """Copy ``nbytes`` into a writable, contiguous host buffer of at least that many bytes
        (a bytearray), checked here (ValueError): the driver writes where it is told. A
        negative ``nbytes`` would reach it as SIZE_MAX."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"LibCuda.cuMemcpyDtoH: nbytes must be 0 or more (got {nbytes})")
        with memoryview(dst) as view:  # exported until the copy returns or raises
            if view.readonly or not view.contiguous or view.nbytes < nbytes:
                got = ("a read-only buffer" if view.readonly else
                       "a non-contiguous buffer" if not view.contiguous else
                       f"{view.nbytes} bytes")
                raise ValueError(f"cuMemcpyDtoH needs a writable buffer of {nbytes} bytes, "
                                 f"contiguous (got {got})")
            return self._call("cuMemcpyDtoH", dst,  # type: ignore[return-value]
                              _handle(src), nbytes)

    def cuMemcpyDtoDAsync(self, dst: Any, src: Any, nbytes: int, stream: Any) -> tuple[int]:
        """ValueError for a negative ``nbytes`` (it would reach the driver as SIZE_MAX)."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"LibCuda.cuMemcpyDtoDAsync: nbytes must be 0 or more "
                             f"(got {nbytes})")
        return self._call("cuMemcpyDtoDAsync", _handle(dst),  # type: ignore[return-value]
                          _handle(src), nbytes, _handle(stream))

    def cuMemsetD8Async(self, ptr: Any, value: int, count: int, stream: Any) -> tuple[int]:
        """ValueError for a ``value`` not in 0..255 (an ``unsigned char``: driver_call passes
        64 bits, so 0x1AB's high bits would reach the driver; cuda.bindings refuses it too)."""
        value = int(value)
        if not 0 <= value <= 0xFF:
            raise ValueError(f"LibCuda.cuMemsetD8Async: value must be a byte, 0..255 "
                             f"(got {value})")
        return self._call("cuMemsetD8Async", _handle(ptr),  # type: ignore[return-value]
                          value, int(count), _handle(stream))

    def cuPointerGetAttribute(self, attribute: int, ptr: Any) -> tuple[int, int]:
        if int(attribute) not in _POINTER_ATTRIBUTES_READ:
            raise ValueError(f"LibCuda.cuPointerGetAttribute does not read attribute "
                             f"{int(attribute)}")
        return self._call("cuPointerGetAttribute", int(attribute),  # type: ignore
                          _handle(ptr))

    # ---- streams and events ------------------------------------------------------------------
    def cuStreamSynchronize(self, stream: Any) -> tuple[int]:
        return self._call("cuStreamSynchronize", _handle(stream))  # type: ignore[return-value]

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple[int]:
        return self._call("cuStreamWaitEvent", _handle(stream),  # type: ignore[return-value]
                          _handle(event), int(flags))

    def cuEventCreate(self, flags: int) -> tuple[int, int]:
        return self._call("cuEventCreate", int(flags))  # type: ignore[return-value]

    def cuEventRecord(self, event: Any, stream: Any) -> tuple[int]:
        return self._call("cuEventRecord", _handle(event),  # type: ignore[return-value]
                          _handle(stream))

    def cuEventDestroy(self, event: Any) -> tuple[int]:
        return self._call("cuEventDestroy", _handle(event))  # type: ignore[return-value]


def _value(out: Any) -> Any:
    """An output variable's value as cuda.bindings gives it (a NULL pointer is 0)."""
    value = out.value
    return 0 if value is None and not isinstance(out, c_char_p) else value


def _writable(buffer: Any) -> Any:
    """A ctypes object at ``buffer``'s address, holding its export while it lives. c_char
    refuses an empty buffer (driver_call passes one: a copy of 0 bytes); ``c_char * 0`` takes
    it (an array type ctypes makes once and caches)."""
    try:
        return ctypes.c_char.from_buffer(buffer)
    except ValueError:
        return (ctypes.c_char * 0).from_buffer(buffer)


def _failed(name: str, code: int) -> tuple:
    """What a call of an entry point the driver did not give answers: the lookup's CUresult,
    and the outputs' zero values."""
    return (code, *[None if kind == "s" else 0 for kind in _KINDS[name] if kind in _OUTPUTS])


def _missing(name: str, code: int) -> Callable[..., int]:
    """What an entry point the driver did not give answers: the lookup's CUresult, or
    CUDA_ERROR_NOT_FOUND (checked and named like any failure; not cached, so nothing is
    remembered about it)."""
    def missing(*args: Any) -> int:
        return code

    missing.__name__ = name
    return missing


def open_driver(per_thread: bool,
                library: str | bytes | os.PathLike[Any] = "libcuda.so.1") -> LibCuda:
    """:class:`LibCuda` over the system's driver library (a name or path; bytes and path
    objects are taken as the file system spells them).

    Raises
    ------
    OSError
        The library cannot be loaded (no NVIDIA driver on this machine).
    LookupError
        The driver has no ``cuGetProcAddress_v2``: it predates CUDA 12.0, which kernelpack's
        context-independent loading needs.
    """
    # one spelling for both doors: ctypes.CDLL of Python 3.13.0 takes no bytes name (its
    # ".fwork" check compares them with a str)
    name = os.fsdecode(library)
    if _native_caller() is not None:
        address = _symbol(name, "cuGetProcAddress_v2")
        if not address:
            raise _too_old(name)
        return LibCuda(address, per_thread)
    lib = ctypes.CDLL(name)
    try:
        get = lib.cuGetProcAddress_v2
    except AttributeError:
        raise _too_old(name) from None
    # the library's own function object, typed in place as _ENTRY's pointers are: no ctypes
    # class made for it, no cast to its address
    get.restype, get.argtypes = c_int, _GET_PROC_ADDRESS_ARGS
    return LibCuda(get, per_thread)


def _too_old(library: str) -> LookupError:
    return LookupError(f"{library} has no cuGetProcAddress_v2: the NVIDIA driver predates "
                       f"CUDA 12.0 (R525), which kernelpack needs")
