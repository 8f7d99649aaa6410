"""The driver called from C (runtime/_drvcall.c: driver_call, driver_symbol) for
runtime/libcuda.py's C door: its argument kinds against the ctypes door's exact types
(runtime/cuda_abi.py's two tables), what it
refuses, and how open_driver reaches it. Both doors' marshalling of every function is
test_libcuda.py's (each test there runs through both)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from kernelpack.runtime import cuda_abi, libcuda

sys.path.insert(0, str(Path(__file__).parent))
from c_fake_driver import CFakeLibcuda  # noqa: E402
from fake_driver import FakeDriver  # noqa: E402

needs_driver_call = pytest.mark.skipif(
    libcuda._native_caller() is None,
    reason="the C extension's driver_call is not built here (no extension, or not x86-64/"
           "AArch64 Linux)")


def test_kinds_describe_the_same_arguments_as_the_ctypes_types() -> None:
    """driver_call's kinds and ctypes' argument types are two descriptions of one signature:
    same functions, same arity, outputs where ctypes has an output pointer (or the plain
    void* of cuPointerGetAttribute), buffers where it takes a char pointer."""
    assert cuda_abi.KINDS.keys() == cuda_abi.SPECS.keys()
    for name, kinds in cuda_abi.KINDS.items():
        types = cuda_abi.SPECS[name]
        assert len(kinds) == len(types), name
        for kind, ctype in zip(kinds, types):
            pointee = getattr(ctype, "_type_", None)
            if kind in "ips":
                assert isinstance(pointee, type) or ctype is ctypes.c_void_p, (name, kind)
                if isinstance(pointee, type):
                    size = ctypes.sizeof(pointee)
                    assert size == (4 if kind == "i" else 8), (name, kind, pointee)
            elif kind == "r":
                assert ctype is ctypes.c_char_p, name
            elif kind == "w":
                assert ctype is ctypes.c_void_p, name
            else:
                assert kind == "v" and not isinstance(pointee, type) or ctype is ctypes.c_void_p
    assert len(cuda_abi.GET_PROC_ADDRESS_KINDS) == len(cuda_abi.GET_PROC_ADDRESS_ARGS)


@needs_driver_call
def test_driver_call_refuses_what_it_cannot_pass() -> None:
    driver_call = libcuda._native_caller()
    c = CFakeLibcuda(FakeDriver())
    get = ctypes.cast(c.get_proc_address, ctypes.c_void_p).value
    with pytest.raises(ValueError, match="address is 0"):
        driver_call(0, "v", 1)
    with pytest.raises(ValueError, match="unknown argument kind"):
        driver_call(get, "vx", 1, 2)
    with pytest.raises(TypeError, match="take more than 1"):
        driver_call(get, "rpvvi", b"cuInit")
    with pytest.raises(TypeError, match=r"take 3 arguments \(got 4\)"):
        driver_call(get, "rpvvi", b"cuInit", 12000, 1, 5)
    with pytest.raises(ValueError, match="at most 11"):
        driver_call(get, "v" * 12, *range(12))
    with pytest.raises(TypeError):
        driver_call(get, "rpvvi", "cuInit", 12000, 1)  # a str is not a C string's buffer
    with pytest.raises(TypeError):
        driver_call(get, "rpvvi", b"cuInit", "12000", 1)
    err, address, status = driver_call(get, "rpvvi", b"cuInit", 12000, 1)
    assert err == 0 and address and status == 0
    assert driver_call(address, "v", 0) == (0,)
    err, device_get = driver_call(get, "rpvvi", b"cuDeviceGet", 12000, 1)[:2]
    # a negative int reaches an int parameter as itself (two's complement, low 32 bits), and
    # an int output comes back signed
    assert driver_call(device_get, "iv", -3) == (0, -3)
    assert not c.fake.callback_errors


@needs_driver_call
def test_open_driver_through_c_finds_cuGetProcAddress(monkeypatch) -> None:
    fake = FakeDriver()
    c = CFakeLibcuda(fake)
    asked = []

    def symbol(library: str, name: str) -> int:
        asked.append((library, name))
        return ctypes.cast(c.get_proc_address, ctypes.c_void_p).value

    monkeypatch.setattr(libcuda, "_symbol", symbol)
    monkeypatch.setattr(libcuda.ctypes, "CDLL", None)  # not used by this door
    drv = libcuda.open_driver(per_thread=True)
    assert asked == [("libcuda.so.1", "cuGetProcAddress_v2")] and drv.door == "C"
    assert drv.cuInit(0) == (0,) and c.lookups == [("cuInit", 12000, 2)]
    monkeypatch.setattr(libcuda, "_symbol", lambda library, name: 0)
    with pytest.raises(LookupError, match="predates CUDA 12.0"):
        libcuda.open_driver(per_thread=False)
