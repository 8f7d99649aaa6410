"""Tenth review: ordering a consumer after a kernelpack buffer's stream (``__dlpack__`` with a
consumer stream, ``__cuda_array_interface__`` inputs with a producer stream) made the buffer's
device current on the calling thread and left it so: ``torch.from_dlpack(buf)`` of a buffer on
device 1 switched a thread working on device 0 (``torch.cuda.current_device()`` reads the
current context) to device 1, where its next tensors would then go."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.runtime import call_program
from kernelpack.runtime.buffer import DeviceBuffer
from kernelpack.runtime.device import get_device

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import HostArray, install  # noqa: E402
from test_launch_fake import axpby  # noqa: E402
from test_libcuda import _make, needs_launch_extension  # noqa: E402

CTX0, CTX1 = 0x100, 0x101  # the fake's primary contexts of devices 0 and 1


@pytest.fixture
def two_devices(monkeypatch):
    drv, c = _make(devices=2)
    install(monkeypatch, drv)
    yield c.fake
    assert not c.fake.callback_errors, c.fake.callback_errors


def _waits(fake, since: int) -> list:
    return [c for c in fake.calls[since:] if c[0] == "cuStreamWaitEvent"]


def test_dlpack_export_ordering_leaves_the_current_device_alone(two_devices) -> None:
    fake = two_devices
    buf = DeviceBuffer.empty((4,), kp.f32, 1, stream=5)  # written on stream 5 of device 1
    get_device(0).make_current()
    assert fake.current == CTX0
    before = len(fake.calls)
    capsule = buf.__dlpack__(stream=7)  # a consumer on stream 7: 7 waits for 5
    assert [w[1] for w in _waits(fake, before)] == [7]
    assert fake.current == CTX0  # the thread still works on device 0
    del capsule


@needs_launch_extension
def test_array_interface_ordering_leaves_the_current_device_alone(two_devices) -> None:
    """An input on device 1 whose interface names a producer stream, launched on an explicit
    stream into ``out=``: the event is made on device 1, the thread keeps device 0 current
    (a launch on an explicit stream needs no current context; an allocated output still makes
    its device current, as a launch on a default stream does)."""
    fake = two_devices

    class OnDevice1(HostArray):
        @property
        def __cuda_array_interface__(self) -> dict:
            return {**super().__cuda_array_interface__, "stream": 9}

    fake.cuPointerGetAttribute = lambda attr, ptr: (0, 1)  # every pointer is on device 1
    get_device(0).make_current()
    before = len(fake.calls)
    z = HostArray([0.0])
    assert call_program(axpby(), OnDevice1([1.0]), HostArray([2.0]), 1.0, stream=11,
                        out=z) is z
    assert z.values() == [3.0] and [w[1] for w in _waits(fake, before)] == [11]
    assert fake.current == CTX0


def test_copy_to_host_leaves_the_current_device_alone(two_devices) -> None:
    fake = two_devices
    buf = DeviceBuffer.empty((2,), kp.f32, 1)
    ctypes.memmove(buf.ptr, b"\x00\x00\x80\x3f" * 2, 8)  # 1.0, 1.0
    get_device(0).make_current()
    assert buf.copy_to_host() == b"\x00\x00\x80\x3f" * 2
    assert fake.current == CTX0
