"""Eighth review: arrays from producers that are neither torch nor cupy, read through DLPack
on the general launch path (fake driver, host memory standing in for device memory).

The producer here builds its capsules with ctypes, as a C library would: a DLPack 1.0
``dltensor_versioned`` capsule when asked with ``max_version``, a legacy ``dltensor`` one
otherwise, with no capsule destructor, so a deleter that kernelpack does not call leaks."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_exchange import DLDataType, DLDevice, DLTensor  # noqa: E402
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_libcuda import needs_launch_extension, through_c  # noqa: E402,F401


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER)]


class _Versioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_valid = ctypes.pythonapi.PyCapsule_IsValid
_valid.restype = ctypes.c_int
_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Producer:
    """A float32 vector over host memory exported through DLPack only. ``versioned``: answer
    ``max_version`` with a 1.0 capsule (``legacy_only``: refuse that keyword, as producers
    older than DLPack 1.0 do). Records the capsules made, the streams asked for and how often
    each deleter ran."""

    def __init__(self, values: list[float], *, versioned: bool = True, legacy_only: bool = False,
                 readonly: bool = False, copied: bool = False, device_type: int = 2,
                 major: int = 1, device_id: int = 0,
                 strides: tuple[int, ...] | None = None, byte_offset: int = 0,
                 shape: tuple[int, ...] | None = None) -> None:
        self.buf = ctypes.create_string_buffer(struct.pack(f"<{len(values)}f", *values),
                                               max(4, 4 * len(values)))
        self.shape = shape if shape is not None else (len(values),)
        self.versioned, self.legacy_only, self.readonly = versioned, legacy_only, readonly
        self.copied = copied
        self.device_type, self.major, self.device_id = device_type, major, device_id
        self.strides, self.byte_offset = strides, byte_offset
        self.capsules: list[Any] = []
        self.streams: list[Any] = []
        self.deleted: list[int] = []
        self._keep: list[Any] = []
        self._deleter = _DELETER(self.deleted.append)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        if "max_version" in kw and self.legacy_only:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.streams.append(stream)
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*self.strides) if self.strides else None
        t = DLTensor(ctypes.addressof(self.buf), DLDevice(self.device_type, self.device_id), ndim,
                     DLDataType(2, 32, 1), ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                     ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None,
                     self.byte_offset)
        if self.versioned and kw.get("max_version") is not None:
            m: Any = _Versioned(_Version(self.major, 0), None, self._deleter,
                                (1 if self.readonly else 0) | (2 if self.copied else 0), t)
            name = b"dltensor_versioned"
        else:
            m, name = _Managed(t, None, self._deleter), b"dltensor"
        self._keep += [shape, strides, m]
        capsule = _new(ctypes.addressof(m), name, None)
        self.capsules.append(capsule)
        return capsule

    def values(self) -> list[float]:
        n = len(self.buf.raw) // 4
        return list(struct.unpack(f"<{n}f", self.buf.raw))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_versioned_capsule_is_read_consumed_and_deleted_once(fake) -> None:
    """A DLPack 1.0 producer's ``dltensor_versioned`` capsule was refused ("not a 'dltensor'
    capsule") since max_version was never asked for; now it is negotiated and read."""
    x, y = Producer([1.0, 2.0]), Producer([10.0, 20.0])
    z = HostArray([0.0, 0.0])
    call_program(axpby(), x, y, 2.0, out=z)
    assert z.values() == [12.0, 24.0]
    for p in (x, y):
        assert len(p.capsules) == 1 and _valid(p.capsules[0], b"used_dltensor_versioned")
        assert len(p.deleted) == 1  # exactly once, after the launch was queued


def test_legacy_capsule_is_renamed_and_its_deleter_called(fake) -> None:
    """A legacy capsule was left named 'dltensor' and its deleter never called (a producer
    without a capsule destructor leaked every export)."""
    x, y = Producer([1.0], versioned=False), Producer([3.0], legacy_only=True)
    z = HostArray([0.0])
    call_program(axpby(), x, y, 1.0, out=z, stream=5)
    assert z.values() == [4.0]
    for p in (x, y):
        assert _valid(p.capsules[0], b"used_dltensor") and len(p.deleted) == 1
    assert y.streams == [5]  # the pre-1.0 producer still got the stream after its TypeError


def test_deleter_runs_once_when_the_launch_is_refused(fake) -> None:
    x, y = Producer([1.0, 2.0]), Producer([1.0])
    with pytest.raises(ConstraintError, match=r"y.shape\[0\] is 1 but n = 2"):
        call_program(axpby(), x, y, 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x': DLPack capsule has version 2\.0"):
        call_program(axpby(), Producer([1.0], major=2), Producer([1.0]), 1.0)
    assert len(x.deleted) == 1 and len(y.deleted) == 1
    assert not _launches(fake)


def test_read_only_versioned_capsule_cannot_be_an_output(fake) -> None:
    x, y = Producer([1.0], readonly=True), Producer([1.0])
    z = call_program(axpby(), x, y, 1.0)   # read-only inputs are fine
    assert z.shape == (1,)
    out = Producer([0.0], readonly=True)
    with pytest.raises(LaunchError, match=r"out 'z' is read-only \(its DLPack capsule is "
                                          r"flagged read-only\)"):
        call_program(axpby(), x, y, 1.0, out=out)
    with pytest.raises(LaunchError, match=r"out 'z' is read-only \(its DLPack capsule is "
                                          r"flagged as a copy"):
        call_program(axpby(), x, y, 1.0, out=Producer([0.0], copied=True))
    assert out.values() == [0.0] and len(_launches(fake)) == 1
    assert len(out.deleted) >= 1 and all(len(p.deleted) == len(p.capsules) for p in (x, y, out))


def test_non_cuda_device_is_named(fake) -> None:
    """A ROCm (or Vulkan, ...) tensor was called "in host memory"."""
    with pytest.raises(LaunchError, match=r"argument 'y' lives on DLPack device type 10 "
                                          r"\(ROCm\), not on a CUDA device"):
        call_program(axpby(), Producer([1.0]), Producer([1.0], device_type=10), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x' is in host memory"):
        call_program(axpby(), Producer([1.0], device_type=1), Producer([1.0]), 1.0)
    for bad in (-1, -2):  # kernelpack's own "host" and "unknown" ordinals: not a device
        with pytest.raises(LaunchError, match=rf"argument 'x': DLPack device id {bad} is not "
                                              rf"a CUDA device ordinal"):
            call_program(axpby(), Producer([1.0], device_id=bad), Producer([1.0]), 1.0)
    assert not _launches(fake)


def test_byte_offset_and_strides(fake) -> None:
    x = Producer([0.0, 1.0, 2.0], byte_offset=4, shape=(2,), strides=(1,))
    y = Producer([5.0, 5.0])
    z = HostArray([0.0, 0.0])
    call_program(axpby(), x, y, 1.0, out=z)
    assert z.values() == [6.0, 7.0]
    with pytest.raises(LaunchError, match=r"argument 'x' is not C-contiguous"):
        call_program(axpby(), Producer([0.0, 1.0, 2.0, 3.0], shape=(2,), strides=(2,)), y, 1.0)


def test_a_used_capsule_is_refused_by_name(fake) -> None:
    """A producer that hands out one capsule twice: the second read must not reuse it."""
    p = Producer([1.0])
    capsule = p.__dlpack__(max_version=(1, 0))

    class Again:
        def __dlpack__(self, **kw: Any) -> Any:
            return capsule

    call_program(axpby(), Again(), Producer([1.0]), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x': __dlpack__ returned a used capsule"):
        call_program(axpby(), Again(), Producer([1.0]), 1.0)
    assert len(p.deleted) == 1


@needs_launch_extension
def test_buffer_written_on_the_null_stream_orders_other_consumers(through_c) -> None:
    """A DeviceBuffer written on stream 0 exported no stream (``None``: "no sync needed") in
    ``__cuda_array_interface__`` and ordered no consumer in ``__dlpack__``, though a
    non-blocking consumer stream does not wait for the legacy default stream."""
    z = call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0)
    assert z.stream == 0 and z.__cuda_array_interface__["stream"] == 1
    before = len(through_c.fake.calls)
    z.__dlpack__(stream=7)
    names = [c[0] for c in through_c.fake.calls[before:]]
    assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"]
    assert through_c.fake.calls[before + 2][1] == 7
    before = len(through_c.fake.calls)
    z.__dlpack__(stream=None)  # the consumer is on the legacy stream itself: nothing to do
    assert len(through_c.fake.calls) == before


def test_device_buffer_read_back_through_dlpack_frees_its_export(fake) -> None:
    """kernelpack consuming its own DeviceBuffer export (bfloat16 goes through DLPack) calls
    the export's deleter, so the buffer is not kept alive by a forgotten capsule."""
    import gc

    import kernelpack as kp
    from kernelpack.runtime import dlpack
    from kernelpack.runtime.buffer import DeviceBuffer

    buf = DeviceBuffer.empty((2,), kp.bf16, 0)
    before = len(dlpack._alive)
    for _ in range(3):  # exported as often as asked: one capsule, one consumer each time
        view = dlpack.take(buf, "x", 0)
        assert view.shape == (2,) and view.dtype is kp.bf16 and view.ptr == buf.ptr
        assert len(dlpack._alive) == before + 1
        del view
        gc.collect()
        assert len(dlpack._alive) == before


def test_read_only_versioned_capsule_cannot_be_inout(monkeypatch) -> None:
    """axpy writes its ``inout`` y: a DLPack 1.0 export flagged read-only was written."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from kp_samples import axpy
    from test_launch_fake import _axpy_impl as axpy_impl

    fake = install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", axpy_impl)}))
    y = Producer([10.0], readonly=True)
    with pytest.raises(LaunchError, match=r"argument 'y' is read-only .*role 'inout'"):
        call_program(axpy(), Producer([1.0]), y, 2.0)
    assert y.values() == [10.0] and not _launches(fake)
    y = Producer([10.0])
    call_program(axpy(), Producer([1.0]), y, 2.0)
    assert y.values() == [12.0]


def test_host_array_interface_with_a_stream_is_named_not_ordered(fake, monkeypatch) -> None:
    """A ``__cuda_array_interface__`` over host memory that names a ``stream`` was ordered
    first, on device -1 (the driver's "not device memory"), and failed there unnamed."""
    from fake_driver import CUresult

    monkeypatch.setattr(fake, "cuPointerGetAttribute", lambda attr, ptr: (CUresult(1), 0))
    x = HostArray([1.0])
    cai = dict(x.__cuda_array_interface__, stream=5)

    class Numbaish:
        __cuda_array_interface__ = cai

    with pytest.raises(LaunchError, match=r"argument 'x' is in host memory"):
        call_program(axpby(), Numbaish(), Producer([1.0]), 1.0)
    assert not _launches(fake)
