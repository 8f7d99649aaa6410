"""DLPack in pure Python (ctypes): read a producer's capsule, and export our own buffers.

Consumer side: :func:`read_capsule` takes the ``dltensor`` capsule a ``__dlpack__`` call
returned and reads the pointer, device, dtype, shape and strides; the capsule (and so the
producer's memory) stays alive as long as the returned object is referenced.

Producer side: :func:`export` builds a ``DLManagedTensor`` for a
:class:`~kernelpack.runtime.buffer.DeviceBuffer` whose deleter drops the reference that keeps
the buffer alive, so a consumer (``torch.from_dlpack``) can hold the memory after kernelpack
forgot it. Only the legacy (unversioned) ``dltensor`` capsule is produced and read: every
framework that speaks the versioned one still accepts it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..dtypes import DType, as_dtype
from ..errors import LaunchError

__all__ = ["KDL_CUDA", "DLTensorView", "read_capsule", "export", "dl_dtype", "kp_dtype"]

KDL_CUDA = 2
KDL_CUDA_MANAGED = 13
_CODE_KIND = {0: "i", 1: "u", 2: "f", 4: "bf", 5: "c", 6: "b"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# The same two functions taking a raw PyObject*: the capsule destructor runs while the capsule
# is being freed, when making a Python reference to it would resurrect (and double-free) it.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))


def kp_dtype(code: int, bits: int, lanes: int) -> DType | None:
    """The kernelpack dtype of a DLPack dtype, or None when there is none."""
    kind = _CODE_KIND.get(code)
    if kind is None or lanes != 1:
        return None
    if kind == "bf":
        return as_dtype("bfloat16") if bits == 16 else None
    if kind == "b":
        return as_dtype("bool") if bits == 8 else None
    name = {"i": "int", "u": "uint", "f": "float", "c": "complex"}[kind] + str(bits)
    try:
        return as_dtype(name)
    except TypeError:
        return None


def dl_dtype(dtype: DType) -> tuple[int, int, int]:
    """(code, bits, lanes) of a kernelpack dtype."""
    code = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}[dtype.kind]
    if dtype.name == "bfloat16":
        code = 4
    return code, dtype.itemsize * 8, 1


class DLTensorView:
    """What a DLPack capsule describes; holds the capsule so the memory stays valid."""

    __slots__ = ("capsule", "ptr", "device_type", "device_id", "dtype", "shape", "strides")

    def __init__(self, capsule: Any, ptr: int, device_type: int, device_id: int,
                 dtype: DType | None, shape: tuple[int, ...], strides: tuple[int, ...] | None):
        self.capsule = capsule
        self.ptr = ptr
        self.device_type = device_type
        self.device_id = device_id
        self.dtype = dtype
        self.shape = shape
        self.strides = strides


def read_capsule(capsule: Any, what: str) -> DLTensorView:
    """Parse a ``dltensor`` capsule; LaunchError naming argument ``what`` when it is not one
    (or describes no valid memory)."""
    who = f"argument {what!r}"
    if not _api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise LaunchError(f"{who}: __dlpack__ returned {type(capsule).__name__}, not a "
                          f"'dltensor' capsule")
    addr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = _DLManagedTensor.from_address(addr)
    t = managed.dl_tensor
    ndim = int(t.ndim)
    if not 0 <= ndim <= 64:
        raise LaunchError(f"{who}: DLPack tensor has ndim {ndim}")
    if ndim and not t.shape:
        raise LaunchError(f"{who}: DLPack tensor of ndim {ndim} has a NULL shape")
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else None
    # A hostile or broken producer's offset would otherwise surface only at packing, as an
    # unnamed "does not fit its parameter".
    ptr = (t.data or 0) + int(t.byte_offset)
    if ptr >= 1 << 64:
        raise LaunchError(f"{who}: DLPack data pointer {t.data or 0:#x} + byte_offset "
                          f"{int(t.byte_offset):#x} is not an address")
    dtype = kp_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    return DLTensorView(capsule, ptr, int(t.device.device_type), int(t.device.device_id), dtype,
                        shape, strides)


# ---- producer --------------------------------------------------------------------------------
_alive: dict[int, tuple[Any, ...]] = {}   # manager ctx id -> (owner, struct, shape, strides)
_alive_lock = threading.Lock()
_next_id = [1]


@_Deleter
def _deleter(addr: int) -> None:  # called by the consumer (or our capsule destructor)
    managed = _DLManagedTensor.from_address(addr)
    with _alive_lock:
        _alive.pop(int(managed.manager_ctx or 0), None)


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _capsule_destructor(capsule_addr: int) -> None:
    # A capsule never consumed (still named "dltensor") owns its tensor: release it. A consumed
    # one was renamed "used_dltensor" and its consumer calls the deleter itself.
    try:
        if _raw_is_valid(capsule_addr, b"dltensor"):
            _deleter(_raw_get_pointer(capsule_addr, b"dltensor"))
    except TypeError:  # interpreter shutdown: this module's globals are already gone
        pass


def export(owner: Any, ptr: int, shape: tuple[int, ...], dtype: DType, device_id: int) -> Any:
    """A ``dltensor`` capsule for a C-contiguous CUDA buffer; ``owner`` is kept alive until the
    consumer calls the deleter (or the capsule is dropped unconsumed)."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides: list[int] = []
    acc = 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*reversed(strides))
    managed = _DLManagedTensor()
    code, bits, lanes = dl_dtype(dtype)
    managed.dl_tensor.data = ptr or None
    managed.dl_tensor.device = _DLDevice(KDL_CUDA, device_id)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = _DLDataType(code, bits, lanes)
    managed.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _deleter
    with _alive_lock:
        ident = _next_id[0]
        _next_id[0] += 1
        managed.manager_ctx = ident
        _alive[ident] = (owner, managed, shape_arr, strides_arr)
    destructor = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
    return _api.PyCapsule_New(ctypes.addressof(managed), b"dltensor", destructor)
