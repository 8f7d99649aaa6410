"""A DLPack C exchange API (``__dlpack_c_exchange_api__``) for the stand-in torch tensors of
test_fastpath_fake.py, so CPU tests run the C fast path's exchange-API reads.

The table is what dlpack.h (1.2+) lays out: a header (version, previous API) and five function
pointers, of which kernelpack calls two: ``dltensor_from_py_object_no_sync`` (here a ctypes
callback describing a stand-in tensor: its pointer, device, dtype, shape and strides) and
``current_work_stream`` (answers ``stream``). It counts the calls of each.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint32, \
    c_uint64, c_void_p
from typing import Any

# DLPack codes per stand-in dtype name: (type code, bits)
DL = {"float32": (2, 32), "int32": (0, 32), "complex64": (5, 64), "float64": (2, 64),
      "uint8": (1, 8)}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


FROM_OBJECT = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(DLTensor))
WORK_STREAM = ctypes.CFUNCTYPE(c_int, c_int32, c_int32, POINTER(c_void_p))


class ExchangeAPI(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32), ("prev_api", c_void_p),
                ("managed_tensor_allocator", c_void_p),
                ("managed_tensor_from_py_object_no_sync", c_void_p),
                ("managed_tensor_to_py_object_no_sync", c_void_p),
                ("dltensor_from_py_object_no_sync", FROM_OBJECT),
                ("current_work_stream", WORK_STREAM)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]


_ALIVE: list[Any] = []  # every FakeExchange made (see FakeExchange.__init__)


class FakeExchange:
    """The table, its capsule (``capsule``) and what it was asked: ``described`` (objects),
    ``streams`` ((device type, device id)). ``stream``: what current_work_stream answers;
    ``refuse``: describe nothing (-1, as for a tensor DLPack cannot express)."""

    def __init__(self, version: tuple[int, int] = (1, 3)) -> None:
        # alive as long as the process: the capsule points at this table and its callbacks,
        # and a test that drops the fake while a fast path keeps the capsule would have the
        # fast path read and call freed memory (found under ASan, review 11)
        _ALIVE.append(self)
        self.described: list[Any] = []
        self.streams: list[tuple[int, int]] = []
        self.stream = 0
        self.refuse = False
        self._keep: list[Any] = []  # shape/stride arrays handed out (alive with the fake)
        self._from = FROM_OBJECT(self._describe)
        self._stream = WORK_STREAM(self._current_stream)
        self.table = ExchangeAPI(version[0], version[1], None, None, None, None, self._from,
                                 self._stream)
        self.capsule = _new_capsule(ctypes.addressof(self.table), b"dlpack_exchange_api", None)

    def _describe(self, obj_address: int, out: Any) -> int:
        t = ctypes.cast(obj_address, ctypes.py_object).value
        self.described.append(t)
        if self.refuse or getattr(t, "layout", "strided") != "strided":
            return -1  # torch's answer for a sparse/mkldnn tensor: no DLPack view of it
        code, bits = DL[t.dtype.name]
        ndim = len(t.shape)
        shape = (c_int64 * max(ndim, 1))(*t.shape)
        strides = None
        if not t.is_contiguous():  # a transposed layout: C-contiguity fails on it
            strides = (c_int64 * max(ndim, 1))(*([1] * ndim if ndim < 2 else
                                                  [1] + [t.shape[0]] * (ndim - 1)))
            if ndim == 1:
                strides[0] = 2
        self._keep += [shape, strides]
        out[0].data = t.data_ptr()
        device = t.get_device()
        out[0].device = DLDevice(2 if device >= 0 else 1, max(device, 0))
        out[0].ndim = ndim
        out[0].dtype = DLDataType(code, bits, 1)
        out[0].shape = ctypes.cast(shape, POINTER(c_int64))
        out[0].strides = None if strides is None else ctypes.cast(strides, POINTER(c_int64))
        out[0].byte_offset = 0
        return 0

    def _current_stream(self, device_type: int, device_id: int, out: Any) -> int:
        self.streams.append((device_type, device_id))
        out[0] = self.stream
        return 0
