"""kernelpack's ctypes door to the driver (runtime/libcuda.py), against a fake libcuda at the
C level (c_fake_driver.py): the marshalling of every function, the ABI versions and stream
flavour it asks ``cuGetProcAddress`` for, and whole launches through it; plus how
runtime/driver.py chooses between it and cuda.bindings."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import config
from kernelpack.errors import DeviceError, LaunchError
from kernelpack.runtime import call_program, driver, libcuda, warmup
from kernelpack.runtime.libcuda import LibCuda

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))
from kp_samples import axpy  # noqa: E402

from c_fake_driver import CFakeLibcuda  # noqa: E402
from fake_driver import CUresult, FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, _axpy_impl, axpby  # noqa: E402


class _Stream:
    """A handle object like cuda.bindings' ``CUstream``: converts with int()."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


@pytest.fixture(autouse=True, params=["C", "ctypes"])
def door(request, monkeypatch) -> str:
    """Every test runs through both ways of calling the driver: the C extension's
    driver_call, and ctypes (what an install without the extension uses)."""
    if request.param == "ctypes":
        monkeypatch.setattr(libcuda, "_native_caller", lambda: None)
    elif libcuda._native_caller() is None:
        pytest.skip("the C extension's driver_call is not built here")
    return request.param


def _make(per_thread: bool = False, **kw) -> tuple[LibCuda, CFakeLibcuda]:
    fake = FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl), "axpby": ("QQQfI", _axpby_impl)},
                      **kw)
    c = CFakeLibcuda(fake)
    return LibCuda(c.get_proc_address, per_thread), c


@pytest.fixture
def through_c(monkeypatch) -> CFakeLibcuda:
    """The runtime's driver is a LibCuda over the C-level fake."""
    drv, c = _make()
    install(monkeypatch, drv)
    yield c
    assert not c.fake.callback_errors, c.fake.callback_errors


# Whole launches through the ctypes door need the C extension: without it (Python 3.10, no C
# compiler) the launcher is cuda.bindings', which opens the real libcuda, absent on CPU hosts.
needs_launch_extension = pytest.mark.skipif(
    importlib.util.find_spec("kernelpack.runtime._launch") is None,
    reason="the C extension kernelpack.runtime._launch is not built")


# ---- marshalling ---------------------------------------------------------------------------------
def test_each_function_answers_in_cuda_bindings_convention(door) -> None:
    drv, c = _make(arch=(8, 6))
    assert drv.door == door and door in repr(drv)
    attr = drv.CUdevice_attribute
    assert drv.cuInit(0) == (0,)
    assert drv.cuDriverGetVersion() == (0, 13000)
    assert drv.cuDeviceGetCount() == (0, 1)
    assert drv.cuDeviceGet(0) == (0, 0)
    assert drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) == (0, 8)
    assert drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0) == (0, 6)
    err, name = drv.cuDeviceGetName(256, 0)
    assert err == 0 and len(name) == 256 and name.split(b"\0")[0] == b"Fake GPU"
    assert drv.cuDevicePrimaryCtxRetain(0) == (0, 0x100)
    assert drv.cuCtxGetCurrent() == (0, 0)   # no context: NULL is 0, as int(CUcontext(0))
    assert drv.cuCtxPushCurrent(0x100) == (0,)
    assert drv.cuCtxGetCurrent() == (0, 0x100) and drv.cuCtxGetDevice() == (0, 0)
    assert drv.cuCtxPopCurrent() == (0, 0x100) and drv.cuCtxGetCurrent() == (0, 0)
    assert drv.cuCtxSetCurrent(_Stream(0x100)) == (0,) and c.fake.current == 0x100
    err, lib = drv.cuLibraryLoadData(b"\x7fELF-code", None, None, 0, None, None, 0)
    assert err == 0 and c.fake.libraries[lib] == b"\x7fELF-code"
    err, kernel = drv.cuLibraryGetKernel(lib, b"axpy")
    assert err == 0 and kernel == hash("axpy") & 0xFFFFFF
    assert drv.cuLibraryGetKernel(lib, b"nope")[0] == CUresult.CUDA_ERROR_NOT_FOUND
    assert drv.cuKernelGetFunction(kernel) == (0, kernel)
    assert drv.cuFuncLoad(kernel) == (0,) and ("cuFuncLoad", kernel) in c.fake.calls
    assert drv.cuLibraryUnload(lib) == (0,) and lib not in c.fake.libraries


def test_memory_streams_and_events() -> None:
    drv, c = _make()
    err, ptr = drv.cuMemAlloc(8)
    assert err == 0 and ptr in c.fake.memory
    ctypes.memmove(ptr, b"abcdefgh", 8)
    host = bytearray(8)
    assert drv.cuMemcpyDtoH(host, ptr, 8) == (0,) and host == b"abcdefgh"
    err, other = drv.cuMemAlloc(8)
    assert drv.cuMemcpyDtoDAsync(other, ptr, 6, _Stream(9)) == (0,)
    assert ctypes.string_at(other, 6) == b"abcdef"
    assert ("cuMemcpyDtoDAsync", other, ptr, 6, 9) in c.fake.calls
    with pytest.raises(ValueError, match="nbytes must be 0 or more"):
        drv.cuMemcpyDtoDAsync(other, ptr, -1, None)
    assert drv.cuMemsetD8Async(ptr, 0, 4, _Stream(7)) == (0,)
    assert ctypes.string_at(ptr, 8) == b"\0\0\0\0efgh"
    assert drv.cuPointerGetAttribute(
        drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == (0, 0)
    assert drv.cuMemFree(ptr) == (0,) and ptr not in c.fake.memory
    err, ptr = drv.cuMemAllocAsync(16, 5)
    assert err == 0 and ("cuMemAllocAsync", 16, 5) in c.fake.calls
    assert drv.cuMemFreeAsync(ptr, None) == (0,) and ("cuMemFreeAsync", ptr, 0) in c.fake.calls
    assert drv.cuStreamSynchronize(None) == (0,)
    err, event = drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    assert (err, event) == (0, 0xE0E0) and ("cuEventCreate", 2) in c.fake.calls
    assert drv.cuEventRecord(event, 3) == (0,) and drv.cuStreamWaitEvent(4, event, 0) == (0,)
    assert drv.cuEventDestroy(event) == (0,)
    assert [call[0] for call in c.fake.calls[-3:]] == ["cuEventRecord", "cuStreamWaitEvent",
                                                       "cuEventDestroy"]
    with pytest.raises(ValueError, match="writable buffer of 8 bytes"):
        drv.cuMemcpyDtoH(bytearray(4), ptr, 8)
    with pytest.raises(ValueError, match="does not read attribute 1"):
        drv.cuPointerGetAttribute(1, ptr)
    with pytest.raises(ValueError, match="no JIT or library options"):
        drv.cuLibraryLoadData(b"x", [1], [2], 1, None, None, 0)


@pytest.mark.parametrize("per_thread, flags", [(False, 1), (True, 2)])
def test_asks_for_the_abi_it_was_written_against(per_thread: bool, flags: int) -> None:
    drv, c = _make(per_thread=per_thread)
    drv.cuInit(0)
    drv.cuMemAlloc(4)
    drv.cuFuncLoad(1)
    drv.cuLibraryLoadData(b"x", None, None, 0, None, None, 0)
    assert c.lookups == [("cuInit", 12000, flags), ("cuMemAlloc", 12000, flags),
                         ("cuFuncLoad", 12040, flags), ("cuLibraryLoadData", 12000, flags)]
    drv.cuMemAlloc(4)
    assert len(c.lookups) == 4  # resolved once
    assert drv.cuGetProcAddress(b"cuLaunchKernel", 13000, 2)[0::2] == (0, 0)
    assert c.lookups[-1] == ("cuLaunchKernel", 13000, 2)


def test_each_door_resolves_a_name_once_and_a_missing_one_every_time(door) -> None:
    fake = FakeDriver()
    c = CFakeLibcuda(fake, missing=("cuFuncLoad",))
    drv = LibCuda(c.get_proc_address, False)
    assert "0 driver functions resolved" in repr(drv)
    drv.cuInit(0), drv.cuInit(0), drv.cuDriverGetVersion()
    assert [name for name, *_ in c.lookups] == ["cuInit", "cuDriverGetVersion"]
    assert f"<LibCuda ({door}): 2 driver functions resolved>" == repr(drv)
    for _ in range(2):  # a failed lookup is not remembered: asked again, failing the same way
        assert drv.cuFuncLoad(1) == (CUresult.CUDA_ERROR_NOT_FOUND,)
    assert [name for name, *_ in c.lookups].count("cuFuncLoad") == 2
    c.missing.discard("cuFuncLoad")  # a driver that has it after all (not a real one's habit)
    assert drv.cuFuncLoad(1) == (0,) and "3 driver functions resolved" in repr(drv)


def test_a_missing_entry_point_is_a_named_driver_error(monkeypatch) -> None:
    fake = FakeDriver()
    c = CFakeLibcuda(fake, missing=("cuFuncLoad",))
    drv = LibCuda(c.get_proc_address, False)
    assert drv.cuFuncLoad(1) == (CUresult.CUDA_ERROR_NOT_FOUND,)
    # a missing function with outputs answers their zero values, as a failed call does
    c.missing.add("cuMemAlloc")
    assert drv.cuMemAlloc(8) == (CUresult.CUDA_ERROR_NOT_FOUND, 0)
    install(monkeypatch, drv)
    with pytest.raises(LaunchError, match="cuFuncLoad failed: CUDA_ERROR_NOT_FOUND") as info:
        driver.check(drv.cuFuncLoad(1), "cuFuncLoad")
    assert isinstance(info.value.__cause__, driver.CudaResultError)
    assert info.value.__cause__.code == CUresult.CUDA_ERROR_NOT_FOUND


def test_a_stub_library_is_a_device_error_naming_it(monkeypatch) -> None:
    """The CUDA toolkit's stubs/libcuda.so answers CUDA_ERROR_STUB_LIBRARY (34) to
    everything, cuGetProcAddress included: a plain DeviceError, not 'not found'."""
    drv = LibCuda(CFakeLibcuda(FakeDriver(), lookup_error=34).get_proc_address, False)
    install(monkeypatch, drv)
    with pytest.raises(DeviceError, match="cuInit .* failed: CUDA_ERROR_STUB_LIBRARY") as info:
        driver.init()
    assert info.value.__cause__.code == 34


def test_describe_uses_the_drivers_names() -> None:
    drv, _ = _make()
    assert drv.describe(200) == ("CUDA_ERROR_INVALID_IMAGE",
                                 "fake description of CUDA_ERROR_INVALID_IMAGE")
    assert drv.describe(12345) == ("CUresult 12345", "no description")


# ---- whole calls through the ctypes door -------------------------------------------------------
@needs_launch_extension
def test_launch_through_libcuda_and_the_c_extension(through_c) -> None:
    from kernelpack.runtime.native import launcher

    x, y = HostArray([1.0, 2.0, 3.0]), HostArray([10.0, 20.0, 30.0])
    assert call_program(axpy(), x, y, 2.0) is None
    assert y.values() == [12.0, 24.0, 36.0]
    launch = [c for c in through_c.fake.calls if c[0] == "cuLaunchKernel"][-1]
    assert launch[2:5] == ((1, 1, 1), (256, 1, 1), 0) and launch[6][2:] == (2.0, 3)
    if config.native_launch():  # the C extension called the entry LibCuda's lookup gave it
        assert launcher().native
        assert ("cuLaunchKernel", 4000, 1) not in through_c.lookups
        assert any(name == "cuLaunchKernel" for name, _, _ in through_c.lookups)


def test_fallback_launcher_prefers_cuda_bindings(monkeypatch) -> None:
    from kernelpack.runtime import native

    drv, _ = _make()
    install(monkeypatch, drv)
    monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "0")
    bindings = pytest.importorskip("cuda.bindings.driver")
    chosen = native.launcher()
    assert not chosen.native and chosen.launch is bindings.cuLaunchKernel
    assert chosen.function is bindings.CUfunction and chosen.stream is bindings.CUstream
    monkeypatch.setattr(native, "_chosen", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)  # import fails
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    chosen = native.launcher()
    assert chosen.launch == drv.cuLaunchKernel and chosen.function is int


@needs_launch_extension
def test_allocating_out_and_copy_back_through_libcuda(through_c) -> None:
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 0.5)
    assert list(struct.unpack("<2f", z.copy_to_host())) == [3.5, 5.0]
    ptr, through_c.fake.current = z.ptr, 0x999
    assert ptr in through_c.fake.memory
    del z
    assert ptr not in through_c.fake.memory  # freed under push/pop: the context stays
    assert through_c.fake.current == 0x999
    out = HostArray([0.0, 0.0])
    assert call_program(axpby(), HostArray([1.0, 1.0]), HostArray([2.0, 2.0]), 1.0,
                        out=out, stream=_Stream(9)) is out
    assert out.values() == [3.0, 3.0]
    assert [c[5] for c in through_c.fake.calls if c[0] == "cuLaunchKernel"][-1] == 9


@needs_launch_extension
def test_dlpack_export_orders_the_consumer_stream(through_c) -> None:
    z = call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0, stream=5)
    z.__dlpack__(stream=6)
    names = [c[0] for c in through_c.fake.calls]
    assert names[-4:] == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                          "cuEventDestroy"]
    assert through_c.fake.calls[-3][1:] == (0xE0E0, 5)
    assert through_c.fake.calls[-2][1:] == (6, 0xE0E0, 0)


def test_failed_library_is_unloaded_and_warmup_loads_functions(through_c) -> None:
    prog = kp.load(kp.save([axpy()], None))["axpy"]
    warmup(prog)
    assert any(c[0] == "cuFuncLoad" for c in through_c.fake.calls)
    through_c.fake.load_error = 0
    through_c.fake.kernels.pop("axpby")
    with pytest.raises(LaunchError, match="cuLibraryGetKernel\\('axpby'\\)"):
        call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0)
    unloaded = [c for c in through_c.fake.calls if c[0] == "cuLibraryUnload"]
    assert len(unloaded) == 1 and unloaded[0][1] not in through_c.fake.libraries


def test_driver_errors_through_libcuda_are_named(through_c) -> None:
    through_c.fake.load_error = int(CUresult.CUDA_ERROR_INVALID_IMAGE)
    with pytest.raises(kp.errors.CompatibilityError, match="CUDA_ERROR_INVALID_IMAGE: fake "
                       "description of CUDA_ERROR_INVALID_IMAGE"):
        call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0)


# ---- choosing the door ---------------------------------------------------------------------------
def test_driver_knob_values(monkeypatch) -> None:
    monkeypatch.delenv("KERNELPACK_DRIVER", raising=False)
    assert config.driver_api() == "auto"
    monkeypatch.setenv("KERNELPACK_DRIVER", " CUDA-Bindings ")
    assert config.driver_api() == "cuda-bindings"
    monkeypatch.setenv("KERNELPACK_DRIVER", "ctypes")
    with pytest.raises(ValueError, match="KERNELPACK_DRIVER must be one of auto, cuda-bindings "
                       "\\(got 'ctypes'\\)"):
        config.driver_api()


def test_choice_of_door(monkeypatch) -> None:
    monkeypatch.setattr(driver, "_driver", None)
    monkeypatch.setenv("KERNELPACK_DRIVER", "cuda-bindings")
    pytest.importorskip("cuda.bindings.driver")
    from cuda.bindings import driver as cuda_bindings_driver

    assert driver.bindings() is cuda_bindings_driver
    monkeypatch.setattr(driver, "_driver", None)
    monkeypatch.setenv("KERNELPACK_DRIVER", "auto")
    opened = []
    fake = LibCuda(CFakeLibcuda(FakeDriver()).get_proc_address, False)
    monkeypatch.setattr(libcuda, "open_driver", lambda per_thread: opened.append(per_thread)
                        or fake)
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    if sys.platform.startswith("linux"):
        assert driver.bindings() is fake and opened == [True]


def test_no_driver_library_is_a_plain_device_error(monkeypatch) -> None:
    monkeypatch.setattr(driver, "_driver", None)
    monkeypatch.setenv("KERNELPACK_DRIVER", "auto")

    def no_library(per_thread: bool, library: str = "libcuda.so.1") -> LibCuda:
        raise OSError("libcuda.so.1: cannot open shared object file")

    def too_old(per_thread: bool, library: str = "libcuda.so.1") -> LibCuda:
        raise LookupError("libcuda.so.1 has no cuGetProcAddress_v2: the NVIDIA driver predates "
                          "CUDA 12.0 (R525), which kernelpack needs")

    if not sys.platform.startswith("linux"):
        pytest.skip("the ctypes door is used on Linux only")
    monkeypatch.setattr(libcuda, "open_driver", no_library)
    with pytest.raises(DeviceError, match="no CUDA driver found .*cannot open shared object"):
        driver.bindings()
    monkeypatch.setattr(libcuda, "open_driver", too_old)
    with pytest.raises(DeviceError, match="predates CUDA 12.0"):
        driver.bindings()


def test_open_driver_on_a_library_without_cuda() -> None:
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc to stand in for a library without the CUDA driver API")
    with pytest.raises(LookupError, match="no cuGetProcAddress_v2"):
        libcuda.open_driver(False, libc)
    with pytest.raises(OSError):
        libcuda.open_driver(False, "libkernelpack-no-such-library.so.1")


@needs_launch_extension
def test_first_launch_imports_no_cuda_bindings() -> None:
    """The point of the ctypes door: a process that loads and launches never imports
    cuda.bindings (here on the C-level fake, with the C extension when it is built)."""
    here = Path(__file__).parent
    code = f"""
import json, sys
sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]
from c_fake_driver import CFakeLibcuda
from fake_driver import FakeDriver, HostArray
from test_launch_fake import _axpby_impl, axpby
from kernelpack.runtime import call_program, driver, libcuda
fake = FakeDriver(kernels={{"axpby": ("QQQfI", _axpby_impl)}})
c = CFakeLibcuda(fake)
libcuda.open_driver = lambda per_thread: libcuda.LibCuda(c.get_proc_address, per_thread)
z = call_program(axpby(), HostArray([1.0]), HostArray([2.0]), 3.0)
print(json.dumps([z.copy_to_host().hex(), sorted(m for m in sys.modules if m.startswith("cuda"))]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "KERNELPACK_DRIVER": "auto"})
    assert out.returncode == 0, out.stderr
    value, cuda_modules = json.loads(out.stdout.splitlines()[-1])
    assert bytes.fromhex(value) == struct.pack("<f", 5.0)
    if sys.platform.startswith("linux"):
        assert cuda_modules == []

