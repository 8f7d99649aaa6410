"""Ninth review of the launch path's argument handling (fake driver, host memory): which
argument carried a device that does not exist, reading an ``out=`` producer once, and data
pointers a kernel could not load from."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import DeviceError, LaunchError
from kernelpack.runtime import call_program, warmup
from kernelpack.runtime.arrays import GENERIC
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar, \
    Tensor, Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_review8_dlpack_producers import Producer  # noqa: E402


def _fill(grid, block, shmem, values) -> None:
    ctypes.memmove(values[0], b"\x01" * 16, 16)


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "fill": ("Qi", _fill)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def filled() -> Compiled:
    """z (4 float32) from an int scalar alone: no input tensor says where to run."""
    s = KernelSummary("filled", (Scalar("k", kp.i32), Tensor("z", kp.f32, (4,), role="out")),
                      (Variant((Launch("fill", "m", (1,), (1,), (Arg.buffer("z"),
                                                                 Arg.scalar("k"))),)),))
    return Compiled(s, (Module("m", ("fill",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


# ---- a device that does not exist: say which argument named it --------------------------------
def test_dlpack_device_that_does_not_exist_names_the_argument(fake) -> None:
    """It was "CUDA device 7 does not exist (this machine has 1 device)", naming nothing."""
    with pytest.raises(DeviceError, match=r"^argument 'x' \(DLPack device_id 7\): CUDA device 7 "
                                          r"does not exist \(this machine has 1 device\)"):
        call_program(axpby(), Producer([1.0], device_id=7), Producer([1.0], device_id=7), 1.0)
    with pytest.raises(DeviceError, match=r"^argument 'z' \(DLPack device_id 7\)"):
        call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0,
                     out=Producer([0.0], device_id=7))
    assert not _launches(fake)


def test_warmup_names_devices_for_a_device_that_does_not_exist(fake) -> None:
    with pytest.raises(DeviceError, match=r"^warmup\(devices=\.\.\.\): CUDA device 7 does not "
                                          r"exist"):
        warmup([axpby()], devices=[0, 7])
    assert not [c for c in fake.calls if c[0] == "cuLibraryLoadData"]


# ---- one read per producer per call -----------------------------------------------------------
def test_out_deciding_the_device_is_exported_once(fake) -> None:
    """With no input tensor, ``out=`` decides the device and is then checked as the output:
    its ``__dlpack__`` was called twice, two capsules for one call."""
    z = Producer([0.0] * 4)
    assert call_program(filled(), 3, out=z) is z
    assert len(z.capsules) == 1 and len(z.deleted) == 1
    assert z.values() == list(struct_floats(b"\x01" * 16))
    assert len(_launches(fake)) == 1


def test_one_producer_passed_twice_is_exported_once(fake) -> None:
    xy, z = Producer([1.0, 2.0]), HostArray([0.0, 0.0])
    call_program(axpby(), xy, xy, 2.0, out=z)
    assert z.values() == [3.0, 6.0]
    assert len(xy.capsules) == 1 and len(xy.deleted) == 1


def test_a_read_is_not_reused_by_the_next_call(fake) -> None:
    x = Producer([1.0])
    for _ in range(2):
        call_program(axpby(), x, HostArray([1.0]), 1.0)
    assert len(x.capsules) == 2 and len(x.deleted) == 2


def struct_floats(raw: bytes) -> tuple:
    import struct

    return struct.unpack(f"<{len(raw) // 4}f", raw)


# ---- data pointers a kernel cannot load from --------------------------------------------------
class _Interface:
    """``__cuda_array_interface__`` over a host buffer, at ``offset`` bytes into it."""

    def __init__(self, offset: int, typestr: str = "<f4", shape: tuple = (2,)) -> None:
        self.buf = ctypes.create_string_buffer(64)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "version": 3,
                                         "data": (ctypes.addressof(self.buf) + offset, False)}


def test_misaligned_pointers_are_refused_before_any_launch(fake) -> None:
    """A float32 at an odd address faults on the device (misaligned address), which ends the
    CUDA context for the whole process; it was launched."""
    y = HostArray([1.0, 1.0])
    with pytest.raises(LaunchError, match=r"argument 'x': data pointer 0x[0-9a-f]+ is not a "
                                          r"multiple of 4, the alignment of its float32"):
        call_program(axpby(), _Interface(2), y, 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x': data pointer .* multiple of 4"):
        call_program(axpby(), Producer([0.0, 1.0, 2.0], byte_offset=1, shape=(2,)), y, 1.0)
    with pytest.raises(LaunchError, match=r"argument 'z': data pointer .* multiple of 4"):
        call_program(axpby(), y, y, 1.0, out=_Interface(6))
    assert not _launches(fake)
    call_program(axpby(), _Interface(4), y, 1.0, out=_Interface(8))  # aligned: launched
    assert len(_launches(fake)) == 1


def test_alignment_is_that_of_the_elements(fake) -> None:
    """complex64 needs its parts' 4 bytes (they are loaded one by one), bool none; an empty
    array's pointer is never loaded from."""
    assert GENERIC.read(_Interface(4, "<c8"), "c", 0)[2] is kp.complex64
    with pytest.raises(LaunchError, match=r"multiple of 4, the alignment of its complex64"):
        GENERIC.read(_Interface(2, "<c8"), "c", 0)
    with pytest.raises(LaunchError, match=r"multiple of 8, the alignment of its float64"):
        GENERIC.read(_Interface(4, "<f8"), "d", 0)
    assert GENERIC.read(_Interface(3, "|b1"), "b", 0)[2] is kp.bool_
    assert GENERIC.read(_Interface(3, "<f8", shape=(0, 2)), "e", 0)[1] == (0, 2)
