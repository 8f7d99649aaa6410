"""A fake ``libcuda`` at the C level, for CPU tests of :mod:`kernelpack.runtime.libcuda`.

:class:`CFakeLibcuda` hands out a ``cuGetProcAddress_v2`` (a ctypes callback) whose entry
points are C callbacks that translate the driver's C calling convention (output pointers,
``const char*`` names, NULL handles) into calls of a :class:`fake_driver.FakeDriver`, so the
same fake that stands in for cuda.bindings also stands behind kernelpack's ctypes door: what
``LibCuda`` marshals is checked against what a driver would see, without a GPU. It records
every lookup (symbol, requested CUDA version, flags).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_ubyte, c_uint, c_uint64, c_void_p
from typing import Any

from fake_driver import CUresult, FakeDriver

_P, _I, _U, _Z, _Q = c_void_p, c_int, c_uint, c_size_t, c_uint64
_PI, _PP, _PQ, _PS = POINTER(c_int), POINTER(c_void_p), POINTER(c_uint64), POINTER(c_char_p)

GET_PROC_ADDRESS = ctypes.CFUNCTYPE(c_int, c_char_p, _PP, c_int, c_uint64, _PI)


def _h(value: Any) -> int:
    return 0 if value is None else int(value)


class CFakeLibcuda:
    """C entry points over ``fake``; ``get_proc_address`` is what ``LibCuda`` takes."""

    def __init__(self, fake: FakeDriver, missing: tuple[str, ...] = (),
                 lookup_error: int = 0) -> None:
        """``missing``: symbols the lookup does not find; ``lookup_error``: a CUresult every
        lookup answers (34, CUDA_ERROR_STUB_LIBRARY: the toolkit's stub libcuda)."""
        self.fake = fake
        self.missing = set(missing)
        self.lookup_error = lookup_error
        self.lookups: list[tuple[str, int, int]] = []
        self.strings: list[Any] = []  # C strings handed out stay alive with the fake
        f = fake
        table = {
            "cuInit": ((_U,), lambda flags: f.cuInit(flags)[0]),
            "cuDriverGetVersion": ((_PI,), lambda out: self._put(out, f.cuDriverGetVersion())),
            "cuDeviceGetCount": ((_PI,), lambda out: self._put(out, f.cuDeviceGetCount())),
            "cuDeviceGet": ((_PI, _I), lambda out, n: self._put(out, f.cuDeviceGet(n))),
            "cuDeviceGetAttribute": ((_PI, _I, _I), lambda out, a, d: self._put(
                out, f.cuDeviceGetAttribute(a, d))),
            "cuDeviceGetName": ((_P, _I, _I), self._name),
            "cuDevicePrimaryCtxRetain": ((_PP, _I), lambda out, d: self._put(
                out, f.cuDevicePrimaryCtxRetain(d))),
            "cuCtxGetCurrent": ((_PP,), lambda out: self._put(out, f.cuCtxGetCurrent())),
            "cuCtxSetCurrent": ((_P,), lambda c: f.cuCtxSetCurrent(_h(c))[0]),
            "cuCtxPushCurrent": ((_P,), lambda c: f.cuCtxPushCurrent(_h(c))[0]),
            "cuCtxPopCurrent": ((_PP,), lambda out: self._put(out, f.cuCtxPopCurrent())),
            "cuCtxGetDevice": ((_PI,), lambda out: self._put(out, f.cuCtxGetDevice())),
            "cuLibraryLoadData": ((_PP, c_char_p, _P, _P, _U, _P, _P, _U),
                                  lambda out, code, *rest: self._put(
                                      out, f.cuLibraryLoadData(code))),
            "cuLibraryGetKernel": ((_PP, _P, c_char_p), lambda out, lib, name: self._put(
                out, f.cuLibraryGetKernel(_h(lib), name))),
            "cuLibraryUnload": ((_P,), lambda lib: f.cuLibraryUnload(_h(lib))[0]),
            "cuKernelGetFunction": ((_PP, _P), lambda out, k: self._put(
                out, f.cuKernelGetFunction(_h(k)))),
            "cuFuncLoad": ((_P,), lambda fn: f.cuFuncLoad(_h(fn))[0]),
            "cuLaunchKernel": ((_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P),
                               lambda fn, gx, gy, gz, bx, by, bz, sm, s, p, e: f.cuLaunchKernel(
                                   _h(fn), gx, gy, gz, bx, by, bz, sm, _h(s), _h(p), _h(e))[0]),
            "cuMemAlloc": ((_PQ, _Z), lambda out, n: self._put(out, f.cuMemAlloc(n))),
            "cuMemFree": ((_Q,), lambda p: f.cuMemFree(p)[0]),
            "cuMemAllocAsync": ((_PQ, _Z, _P), lambda out, n, s: self._put(
                out, f.cuMemAllocAsync(n, _h(s)))),
            "cuMemFreeAsync": ((_Q, _P), lambda p, s: f.cuMemFreeAsync(p, _h(s))[0]),
            "cuMemcpyDtoH": ((_P, _Q, _Z), self._copy),
            "cuMemcpyDtoDAsync": ((_Q, _Q, _Z, _P), lambda d, s, n, st: f.cuMemcpyDtoDAsync(
                d, s, n, _h(st))[0]),
            "cuMemsetD8Async": ((_Q, c_ubyte, _Z, _P), lambda p, v, n, s: f.cuMemsetD8Async(
                p, v, n, _h(s))[0]),
            "cuPointerGetAttribute": ((_P, _I, _Q), self._pointer_attribute),
            "cuStreamSynchronize": ((_P,), lambda s: f.cuStreamSynchronize(_h(s))[0]),
            "cuStreamWaitEvent": ((_P, _P, _U), lambda s, e, fl: self._record(
                "cuStreamWaitEvent", _h(s), _h(e), fl)),
            "cuEventCreate": ((_PP, _U), self._event_create),
            "cuEventRecord": ((_P, _P), lambda e, s: self._record("cuEventRecord", _h(e),
                                                                  _h(s))),
            "cuEventDestroy": ((_P,), lambda e: self._record("cuEventDestroy", _h(e))),
            "cuFuncSetAttribute": ((_P, _I, _I), lambda fn, a, v: f.cuFuncSetAttribute(
                _h(fn), a, v)[0]),
            "cuGetErrorName": ((_I, _PS), self._error_name),
            "cuGetErrorString": ((_I, _PS), self._error_string),
        }
        self.entries = {name: ctypes.CFUNCTYPE(c_int, *types)(self._guard(fn))
                        for name, (types, fn) in table.items()}
        self.get_proc_address = GET_PROC_ADDRESS(self._get_proc_address)

    # ---- plumbing -----------------------------------------------------------------------------
    def _guard(self, fn: Any) -> Any:
        """An exception cannot cross into C: keep it for the test and answer INVALID_VALUE."""
        def entry(*args: Any) -> int:
            try:
                return int(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - reported through callback_errors
                self.fake.callback_errors.append(exc)
                return int(CUresult.CUDA_ERROR_INVALID_VALUE)
        return entry

    @staticmethod
    def _put(out: Any, result: tuple) -> int:
        err = int(result[0])
        if not err:
            out[0] = _h(result[1])
        return err

    def _get_proc_address(self, symbol: bytes, pfn: Any, version: int, flags: int,
                          status: Any) -> int:
        name = symbol.decode()
        self.lookups.append((name, version, flags))
        if self.lookup_error:
            pfn[0] = None
            status[0] = 0
            return self.lookup_error
        entry = None if name in self.missing else self.entries.get(name)
        if entry is None:
            pfn[0] = None
            status[0] = 1  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            return int(CUresult.CUDA_ERROR_NOT_FOUND)
        pfn[0] = ctypes.cast(entry, c_void_p).value
        status[0] = 0
        return 0

    def _record(self, *call: Any) -> int:
        self.fake.calls.append(call)
        return 0

    # ---- entries with more than an output pointer ---------------------------------------------
    def _name(self, buf: int, length: int, device: int) -> int:
        err, raw = self.fake.cuDeviceGetName(length, device)
        ctypes.memmove(buf, raw, min(len(raw), length))
        return int(err)

    def _copy(self, dst: int, src: int, n: int) -> int:
        host = bytearray(n)
        err = int(self.fake.cuMemcpyDtoH(host, src, n)[0])
        ctypes.memmove(dst, bytes(host), n)
        return err

    def _pointer_attribute(self, data: int, attribute: int, ptr: int) -> int:
        err, value = self.fake.cuPointerGetAttribute(attribute, ptr)
        ctypes.c_int.from_address(data).value = int(value)
        return int(err)

    def _event_create(self, out: Any, flags: int) -> int:
        self.fake.calls.append(("cuEventCreate", flags))
        out[0] = 0xE0E0
        return 0

    def _c_string(self, out: Any, text: str) -> int:
        s = ctypes.create_string_buffer(text.encode())
        self.strings.append(s)
        ctypes.cast(out, POINTER(c_void_p))[0] = ctypes.addressof(s)
        return 0

    def _error_name(self, code: int, out: Any) -> int:
        try:
            name = CUresult(code).name
        except ValueError:
            return int(CUresult.CUDA_ERROR_INVALID_VALUE)
        return self._c_string(out, name)

    def _error_string(self, code: int, out: Any) -> int:
        err, text = self.fake.cuGetErrorString(code)
        return self._c_string(out, text.decode())
