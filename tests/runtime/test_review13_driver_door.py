"""Review 13 of the driver doors (runtime/libcuda.py over _drvcall.c's driver_call, or ctypes):
what a buffer argument may be and how long it stays exported, the ranges a method checks
before handing a length or a byte to the driver, and open_driver's library argument. Each test
runs through both doors where both exist."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from ctypes import c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path
from typing import Any

import pytest

from kernelpack.runtime import libcuda
from kernelpack.runtime.libcuda import LibCuda

sys.path.insert(0, str(Path(__file__).parent))
from c_fake_driver import CFakeLibcuda  # noqa: E402
from fake_driver import FakeDriver  # noqa: E402

HAVE_C = libcuda._native_caller() is not None
needs_driver_call = pytest.mark.skipif(not HAVE_C, reason="the C extension's driver_call is "
                                       "not built here")
DOORS = [pytest.param(True, id="C", marks=needs_driver_call), pytest.param(False, id="ctypes")]


class _Int:
    """A value that converts with int() only (like cuda.bindings' handle objects)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


def _make(native: bool) -> tuple[LibCuda, CFakeLibcuda]:
    c = CFakeLibcuda(FakeDriver())
    drv = LibCuda(c.get_proc_address, False, native=native)
    assert drv.door == ("C" if native else "ctypes")
    return drv, c


def _replace(c: CFakeLibcuda, name: str, types: tuple, fn: Any) -> None:
    """Give the fake's ``name`` another body (before its first lookup)."""
    c.entries[name] = ctypes.CFUNCTYPE(c_int, *types)(c._guard(fn))


# ---- driver_call's 'r': a NUL-terminated C string or image, so bytes (or None) only -------------
@needs_driver_call
def test_read_arguments_are_bytes_or_none() -> None:
    driver_call = libcuda._native_caller()
    seen: list[Any] = []

    def probe(pointer: int | None) -> int:
        seen.append(None if not pointer else ctypes.string_at(pointer))
        return 0

    entry = ctypes.CFUNCTYPE(c_int, c_void_p)(probe)
    address = ctypes.cast(entry, c_void_p).value
    assert driver_call(address, "r", b"axpy") == (0,)
    assert driver_call(address, "r", None) == (0,)
    assert seen == [b"axpy", None]
    # a buffer that is not bytes has no NUL after its end: the driver would read past it
    # (this one would be looked up as "axpyZZ"); refused, as ctypes' c_char_p refuses it
    for not_bytes in (memoryview(b"axpyZZ")[:4], bytearray(b"axpy"), 5):
        with pytest.raises(TypeError, match="bytes"):
            driver_call(address, "r", not_bytes)
    assert seen == [b"axpy", None]


# ---- 'w' buffers: exported for the whole call, empty ones accepted ------------------------------
@pytest.mark.parametrize("native", DOORS)
def test_a_writable_buffer_stays_exported_while_the_driver_writes(native: bool) -> None:
    """The driver writes at the buffer's address during the call: resizing it meanwhile (a
    callback, another thread) must fail, or the write lands in freed memory. ctypes' door took
    the address from a c_char that released the export at once (heap-use-after-free under ASan
    with a 4 KiB buffer)."""
    drv, c = _make(native)
    attempts: list[str] = []
    dst = bytearray(4096)

    def copy(address: int, src: int, n: int) -> int:
        try:
            dst.extend(b"z" * 65536)
            attempts.append("resized")
        except BufferError:
            attempts.append("refused")
        return c._copy(address, src, n)

    _replace(c, "cuMemcpyDtoH", (c_void_p, c_uint64, c_size_t), copy)
    err, ptr = drv.cuMemAlloc(4096)
    ctypes.memmove(ptr, b"kernelpack" * 409 + b"012345", 4096)
    assert drv._call("cuMemcpyDtoH", dst, ptr, 4096) == (0,)
    assert attempts == ["refused"] and bytes(dst) == b"kernelpack" * 409 + b"012345"
    assert not c.fake.callback_errors


@pytest.mark.parametrize("native", DOORS)
def test_an_empty_host_buffer_copies_nothing_in_both_doors(native: bool) -> None:
    drv, c = _make(native)
    err, ptr = drv.cuMemAlloc(8)
    assert drv.cuMemcpyDtoH(bytearray(), ptr, 0) == (0,)
    assert drv.cuMemcpyDtoH(bytearray(8), ptr, 0) == (0,)
    assert not c.fake.callback_errors


# ---- lengths and bytes checked before the driver sees them --------------------------------------
@pytest.mark.parametrize("native", DOORS)
def test_memcpy_dtoh_refuses_a_size_the_buffer_does_not_have(native: bool) -> None:
    drv, c = _make(native)
    err, ptr = drv.cuMemAlloc(16)
    ctypes.memmove(ptr, bytes(range(16)), 16)
    # -1 passed the old size check and reached the driver as SIZE_MAX bytes into 8
    for nbytes in (-1, -(2 ** 63)):
        with pytest.raises(ValueError, match=rf"nbytes must be 0 or more \(got {nbytes}\)"):
            drv.cuMemcpyDtoH(bytearray(8), ptr, nbytes)
    with pytest.raises(ValueError, match=r"writable buffer of 9 bytes.*\(got 8 bytes\)"):
        drv.cuMemcpyDtoH(bytearray(8), ptr, 9)
    # a strided view: the doors raised BufferError (C) and TypeError (ctypes)
    with pytest.raises(ValueError, match="contiguous"):
        drv.cuMemcpyDtoH(memoryview(bytearray(16))[::2], ptr, 8)
    with pytest.raises(ValueError, match="writable"):
        drv.cuMemcpyDtoH(b"\0" * 8, ptr, 8)
    # a size that converts with int(), like the handles: compared after converting
    dst = bytearray(8)
    assert drv.cuMemcpyDtoH(dst, _Int(ptr), _Int(8)) == (0,) and dst == bytes(range(8))
    assert not c.fake.callback_errors


@pytest.mark.parametrize("native", DOORS)
def test_device_name_length_must_fit_the_buffer_and_an_int(native: bool) -> None:
    """A negative length gave the driver a 1-byte buffer and the length -1; one past INT_MAX
    allocated that many bytes, then reached the driver's ``int len`` as a negative number."""
    drv, c = _make(native)
    asked: list[int] = []

    def name(buf: int, length: int, device: int) -> int:
        asked.append(length)
        return 0

    _replace(c, "cuDeviceGetName", (c_void_p, c_int, c_int), name)
    for length in (-1, -256, 2 ** 31, 2 ** 64):
        with pytest.raises(ValueError, match=rf"length .*got {length}"):
            drv.cuDeviceGetName(length, 0)
    assert asked == []
    assert drv.cuDeviceGetName(_Int(3), 0) == (0, b"\0\0\0") and asked == [3]


@pytest.mark.parametrize("native", DOORS)
def test_memset_byte_value_is_a_byte(native: bool) -> None:
    """cuMemsetD8Async's value is an ``unsigned char``: the C door passes every argument as 64
    bits, so 0x1AB would reach the driver with its high bits set (ctypes cut it to 0xAB)."""
    drv, c = _make(native)
    err, ptr = drv.cuMemAlloc(4)
    for value in (256, 0x1AB, -1):
        with pytest.raises(ValueError, match=rf"value .*0\.\.255.*got {value}"):
            drv.cuMemsetD8Async(ptr, value, 4, 0)
    assert drv.cuMemsetD8Async(ptr, 255, 4, 0) == (0,)
    assert ctypes.string_at(ptr, 4) == b"\xff" * 4
    assert drv.cuMemsetD8Async(ptr, _Int(7), 2, None) == (0,)
    assert ctypes.string_at(ptr, 4) == b"\x07\x07\xff\xff"
    assert not c.fake.callback_errors


# ---- open_driver's library: what ctypes.CDLL takes, through either door --------------------------
@pytest.mark.parametrize("native", DOORS)
def test_open_driver_takes_a_path_or_bytes(native: bool, monkeypatch) -> None:
    libc = ctypes.util.find_library("c")
    if libc is None or not sys.platform.startswith("linux"):
        pytest.skip("no libc to stand in for a library without the CUDA driver API")
    if not native:
        monkeypatch.setattr(libcuda, "_native_caller", lambda: None)
    for library in (Path(libc), libc.encode()):
        with pytest.raises(LookupError, match="no cuGetProcAddress_v2"):
            libcuda.open_driver(False, library)
    with pytest.raises(OSError):
        libcuda.open_driver(False, Path("libkernelpack-no-such-library.so.1"))
    with pytest.raises(ValueError):
        libcuda.open_driver(False, "libc.so.6\0x")
