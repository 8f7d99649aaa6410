"""DLPack in pure Python (ctypes): read a producer's capsule, and export our own buffers.

Consumer side: :func:`take` asks an object for its capsule (DLPack 1.0 first, then the legacy
call) and :func:`read_capsule` reads the pointer, device, dtype, shape, strides and read-only
flag of a ``dltensor`` or ``dltensor_versioned`` capsule. Reading consumes the capsule (renamed
``used_...``) and the producer's deleter runs once, when the returned view goes: the memory
stays valid as long as the view is referenced.

Producer side: :func:`export` builds a ``DLManagedTensor`` for a
:class:`~kernelpack.runtime.buffer.DeviceBuffer` whose deleter drops the reference that keeps
the buffer alive, so a consumer (``torch.from_dlpack``) can hold the memory after kernelpack
forgot it. Only the legacy (unversioned) ``dltensor`` capsule is produced: every framework
that speaks the versioned one still accepts it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..dtypes import DType, as_dtype
from ..errors import LaunchError

__all__ = ["KDL_CUDA", "DLTensorView", "read_capsule", "take", "read_array", "device_refusal",
           "export", "dl_dtype", "kp_dtype"]

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


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_FLAG_READ_ONLY, _FLAG_IS_COPIED = 1, 2
# Called with the GIL held (PYFUNCTYPE): a producer's C deleter may touch Python objects
# (NumPy's takes the GIL itself, which is reentrant); a ctypes callback works either way.
_CallDeleter = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLTensorView:
    """What a DLPack capsule describes. Reading consumes the capsule as the protocol asks
    (renamed ``used_dltensor[_versioned]``, so it cannot be consumed twice), so the producer's
    deleter is ours to call: exactly once, when the view is released or collected."""

    __slots__ = ("capsule", "ptr", "device_type", "device_id", "dtype", "shape", "strides",
                 "readonly", "source", "stream", "facts", "_managed", "_deleter")

    def __init__(self, capsule: Any, ptr: int, device_type: int, device_id: int,
                 dtype: DType | None, shape: tuple[int, ...], strides: tuple[int, ...] | None,
                 readonly: str = "", managed: int = 0, deleter: int = 0) -> None:
        self.capsule = capsule
        self.ptr = ptr
        self.device_type = device_type
        self.device_id = device_id
        self.dtype = dtype
        self.shape = shape
        self.strides = strides
        self.readonly = readonly  # why the memory must not be written ("" when it may be)
        self.source: Any = None  # the object whose __dlpack__ made the capsule
        self.stream = 0          # the consumer stream it was asked for (read_array)
        self.facts: tuple | None = None  # what read_array returned for it
        self._managed = managed
        self._deleter = deleter

    def release(self) -> None:
        """Call the producer's deleter (once): its memory may be freed from now on."""
        managed, deleter = self._managed, self._deleter
        self._managed = self._deleter = 0
        if managed and deleter:
            _CallDeleter(deleter)(managed)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to free
            pass


def read_capsule(capsule: Any, what: str) -> DLTensorView:
    """Parse and consume a ``dltensor`` or ``dltensor_versioned`` capsule; LaunchError naming
    argument ``what`` when it is not one (or describes no valid memory)."""
    who = f"argument {what!r}"
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        name, used = b"dltensor_versioned", b"used_dltensor_versioned"
        addr = _api.PyCapsule_GetPointer(capsule, name)
        vm = _DLManagedTensorVersioned.from_address(addr)
        if vm.version.major != 1:  # another ABI: the struct cannot be read safely
            raise LaunchError(f"{who}: DLPack capsule has version {vm.version.major}."
                              f"{vm.version.minor}, expected major version 1")
        t, deleter, readonly = vm.dl_tensor, vm.deleter, _unwritable(int(vm.flags))
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        name, used = b"dltensor", b"used_dltensor"
        addr = _api.PyCapsule_GetPointer(capsule, name)
        managed = _DLManagedTensor.from_address(addr)
        t, readonly = managed.dl_tensor, ""
        deleter = ctypes.cast(managed.deleter, ctypes.c_void_p).value
    else:
        shown = "a used capsule" if _capsule_used(capsule) else type(capsule).__name__
        raise LaunchError(f"{who}: __dlpack__ returned {shown}, not a 'dltensor' or "
                          f"'dltensor_versioned' capsule")
    # Consumed from here on: whatever is refused below, the deleter runs with the view.
    _api.PyCapsule_SetName(capsule, used)
    view = DLTensorView(capsule, 0, int(t.device.device_type), int(t.device.device_id), None,
                        (), None, readonly, addr, deleter or 0)
    ndim = int(t.ndim)
    if not 0 <= ndim <= 64:
        raise LaunchError(f"{who}: DLPack tensor has ndim {ndim}")
    if ndim and not t.shape:
        raise LaunchError(f"{who}: DLPack tensor of ndim {ndim} has a NULL shape")
    view.shape = tuple(int(t.shape[i]) for i in range(ndim))
    if any(d < 0 for d in view.shape):
        raise LaunchError(f"{who}: DLPack tensor has a negative dim in shape {view.shape}")
    view.strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else None
    # A hostile or broken producer's offset would otherwise surface only at packing, as an
    # unnamed "does not fit its parameter".
    ptr = (t.data or 0) + int(t.byte_offset)
    if ptr >= 1 << 64:
        raise LaunchError(f"{who}: DLPack data pointer {t.data or 0:#x} + byte_offset "
                          f"{int(t.byte_offset):#x} is not an address")
    view.ptr = ptr
    view.dtype = kp_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    return view


_DEVICE_NAMES = {1: "CPU", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                 9: "VPI", 10: "ROCm", 11: "ROCm host", 12: "ExtDev", 14: "oneAPI",
                 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
_HOST = (1, 3, 11)  # memory in host RAM: launch says "move it to a CUDA device"


def device_refusal(device_type: int, what: str) -> str | None:
    """Why memory of DLPack device type ``device_type`` cannot be launched on, or None for
    CUDA memory and host memory (refused by the caller as "in host memory")."""
    if device_type in (KDL_CUDA, KDL_CUDA_MANAGED) or device_type in _HOST:
        return None
    kind = _DEVICE_NAMES.get(device_type, "unknown")
    return (f"argument {what!r} lives on DLPack device type {device_type} ({kind}), not on a "
            f"CUDA device")


def take(obj: Any, what: str, stream: int) -> DLTensorView:
    """The capsule of ``obj.__dlpack__``, read and consumed. DLPack 1.0 is asked for first
    (``max_version=(1, 0)``, so a read-only export says so); a producer older than that
    refuses the keyword with a TypeError and is asked again without it, still with the
    stream (dropping it would lose the ordering), then with no argument at all."""
    stream_arg = stream if stream else 1  # 0 is not a valid DLPack stream: 1 is the legacy one
    try:
        try:
            capsule = obj.__dlpack__(stream=stream_arg, max_version=(1, 0))
        except TypeError:
            try:
                capsule = obj.__dlpack__(stream=stream_arg)
            except TypeError:
                capsule = obj.__dlpack__()
    except Exception as exc:  # noqa: BLE001 - BufferError, RuntimeError, ... of the producer
        raise LaunchError(f"argument {what!r}: __dlpack__() failed "
                          f"({type(exc).__name__}: {exc})") from exc
    view = read_capsule(capsule, what)
    view.source = obj
    return view


def read_array(obj: Any, what: str, stream: int) -> tuple:
    """The array facts (:mod:`.arrays`) of an object read through ``__dlpack__``; the view is
    held (:func:`~.arrays.hold`) until the call has queued its work."""
    from .arrays import _check_data, _contiguous, held_views, hold
    from .device import check_ordinal

    # Read once per call: the same object met again in this call (``out=`` whose device
    # decided the call's, then checked as the output; one array passed twice) reuses the
    # held view, for the same consumer stream, instead of exporting a second capsule.
    for held in held_views():
        if held.source is obj and held.stream == stream and held.facts is not None:
            return held.facts
    # Ask where the array lives first: a host producer (NumPy) refuses a CUDA ``stream=``
    # with its own exception type, and its memory must be refused anyway.
    where = getattr(obj, "__dlpack_device__", None)
    if where is not None:
        try:
            device_type = int(where()[0])
        except Exception as exc:  # noqa: BLE001 - a broken producer: name the argument
            raise LaunchError(f"argument {what!r}: __dlpack_device__() failed "
                              f"({type(exc).__name__}: {exc})") from exc
        if device_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
            why = device_refusal(device_type, what)
            if why:
                raise LaunchError(why)
            return 0, (), None, -1, True
    view = take(obj, what, stream)  # consumed: the deleter runs when ``view`` goes
    if view.device_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
        why = device_refusal(view.device_type, what)
        if why:
            raise LaunchError(why)
        return view.ptr, view.shape, view.dtype, -1, True
    if view.device_id < 0:  # -1/-2 would read as kernelpack's "host" / "unknown device"
        raise LaunchError(f"argument {what!r}: DLPack device id {view.device_id} is not a "
                          f"CUDA device ordinal")
    check_ordinal(view.device_id, f"argument {what!r} (DLPack device_id {view.device_id})")
    _check_data(view.ptr, view.shape, what, view.dtype)
    itemsize = view.dtype.itemsize if view.dtype else 1
    strides = tuple(s * itemsize for s in view.strides) if view.strides is not None else None
    view.stream = stream
    view.facts = (view.ptr, view.shape, view.dtype, view.device_id,
                  _contiguous(view.shape, strides, itemsize))
    hold(view)  # the memory must stay the producer's until the launch is queued
    return view.facts


def _unwritable(flags: int) -> str:
    """Why a versioned capsule's memory must not be written ("" when it may be)."""
    if flags & _FLAG_READ_ONLY:
        return "its DLPack capsule is flagged read-only"
    if flags & _FLAG_IS_COPIED:
        return "its DLPack capsule is flagged as a copy, which would take the writes and drop them"
    return ""


def _capsule_used(capsule: Any) -> bool:
    """Whether ``capsule`` is one a consumer already took (a second read of one capsule)."""
    return any(_api.PyCapsule_IsValid(capsule, n)
               for n in (b"used_dltensor", b"used_dltensor_versioned"))


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
        try:
            valid = _raw_is_valid(capsule_addr, b"dltensor")
        except Exception:  # noqa: BLE001 - ctypes.ArgumentError (seen on CPython 3.11)
            # Called with an exception pending: a consumer that failed drops the capsule
            # unconsumed (NumPy's from_dlpack of device memory: "Unsupported device"), and
            # ctypes refuses to convert an argument while an error is set, which took the
            # release with it and leaked the buffer. That error is gone now (ctypes turned it
            # into this one), so the release can go ahead; anything else fails again here.
            # Keeping the consumer's exception needs a destructor written in C, which saves
            # and restores it.
            valid = _raw_is_valid(capsule_addr, b"dltensor")
        if valid:
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
