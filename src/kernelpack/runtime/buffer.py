"""``DeviceBuffer``: kernelpack's own device array, for callers without PyTorch or CuPy.

It owns memory from ``cuMemAlloc`` and exports it both ways frameworks consume foreign memory:
``__cuda_array_interface__`` (v3) and ``__dlpack__``/``__dlpack_device__``, so
``torch.from_dlpack(buf)``, ``cupy.asarray(buf)`` or ``numba.cuda.as_cuda_array(buf)`` view it
without a copy. ``cuMemFree`` synchronizes with outstanding work, so freeing while a kernel still
writes the buffer is safe; the memory is freed when the last reference (ours, or a consumer's
through DLPack) goes away.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from ..dtypes import DType
from . import driver as _drv
from .device import get_device

__all__ = ["DeviceBuffer", "typestr"]


def typestr(dtype: DType) -> str:
    """The ``__cuda_array_interface__`` typestr (``<f4``); bfloat16 has none in NumPy, so it is
    exported as raw 2-byte void ``<V2``."""
    if dtype.name == "bfloat16":
        return "<V2"
    kind = {"b": "b", "i": "i", "u": "u", "f": "f", "c": "c"}[dtype.kind]
    return ("|" if dtype.itemsize == 1 else "<") + kind + str(dtype.itemsize)


class DeviceBuffer:
    """A C-contiguous device array: ``ptr``, ``shape``, ``dtype``, ``device`` (ordinal),
    ``nbytes``. Create with :meth:`empty`; users normally get one as a program's output."""

    __slots__ = ("ptr", "shape", "dtype", "device", "nbytes", "stream", "_owned", "__weakref__")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: DType, device: int,
                 nbytes: int, owned: bool, stream: int = 0) -> None:
        self.ptr = ptr
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.nbytes = nbytes
        self.stream = stream
        self._owned = owned

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype: DType, device: int,
              stream: int = 0) -> "DeviceBuffer":
        """Allocate ``prod(shape) * itemsize`` bytes on ``device`` (uninitialized). ``stream``
        is where the producer writes it; ``__dlpack__`` orders consumers after it."""
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            return cls(0, shape, dtype, device, 0, owned=False, stream=stream)
        dev = get_device(device)
        dev.make_current()
        drv = _drv.bindings()
        ptr = _drv.check(drv.cuMemAlloc(nbytes),
                         f"cuMemAlloc({nbytes} bytes) on device {device}")
        return cls(int(ptr), shape, dtype, device, nbytes, owned=True, stream=stream)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3. ``stream`` is where the buffer was written: handle 0 (the NULL stream) is
        said as 1, the legacy default stream, since v3 forbids 0 and ``None`` would tell a
        consumer on a non-blocking stream that it need not wait."""
        return {"shape": self.shape, "typestr": typestr(self.dtype), "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": self.stream or 1}

    def __dlpack_device__(self) -> tuple[int, int]:
        from .dlpack import KDL_CUDA

        return (KDL_CUDA, self.device)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """A ``dltensor`` capsule. ``stream`` (the consumer's) is made to wait for the stream
        this buffer was written on, as the protocol asks; -1 opts out. ``None`` means the
        legacy default stream (the DLPack rule for CUDA): a consumer that passes no stream
        still reads on it, so it is ordered too."""
        from .dlpack import KDL_CUDA, export

        if copy:
            raise BufferError("DeviceBuffer.__dlpack__ cannot copy")
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device):
            raise BufferError(f"DeviceBuffer lives on CUDA device {self.device}, cannot export "
                              f"to {dl_device}")
        if stream != -1 and self.nbytes:
            # A buffer written on the NULL stream (0) orders a consumer on another stream too:
            # a non-blocking stream does not wait for the legacy default stream by itself.
            consumer = 0 if stream is None or stream in (1, 2) else int(stream)
            if consumer != (0 if self.stream in (1, 2) else self.stream):
                _order_after(self.device, self.stream, consumer)
        return export(self, self.ptr, self.shape, self.dtype, self.device)

    def copy_to_host(self) -> bytes:
        """The contents as bytes (synchronous; for tests and debugging)."""
        if self.nbytes == 0:
            return b""
        drv = _drv.bindings()
        out = bytearray(self.nbytes)
        with _on(self.device):
            _drv.check(drv.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
            _drv.check(drv.cuMemcpyDtoH(out, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return bytes(out)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """The contents as a new NumPy array in host memory (a synchronous copy, as
        :meth:`copy_to_host`), so ``np.asarray(buf)`` reads the values: without this NumPy made
        a 0-d object array holding the buffer. ``copy=False`` is a ValueError (NumPy's rule:
        device memory can only be read into a copy)."""
        import numpy

        if copy is False:
            raise ValueError("DeviceBuffer: a host array of device memory is always a copy "
                             "(got copy=False)")
        try:
            host = numpy.dtype(self.dtype.name)
        except TypeError:
            raise TypeError(f"DeviceBuffer of {self.dtype}: NumPy has no {self.dtype} dtype; "
                            f"read the raw bytes with buf.copy_to_host()") from None
        arr = numpy.frombuffer(bytearray(self.copy_to_host()), host).reshape(self.shape)
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __del__(self) -> None:
        if self._owned and self.ptr:
            self._owned = False
            try:
                drv = _drv.bindings()
                # Push/pop: freeing (at any moment the GC picks) must not change which context
                # is current on this thread.
                if not drv.cuCtxPushCurrent(get_device(self.device).ctx)[0]:
                    drv.cuMemFree(self.ptr)
                    drv.cuCtxPopCurrent()
            except Exception:  # interpreter shutdown: the driver frees everything anyway
                pass

    def __repr__(self) -> str:
        return (f"DeviceBuffer(shape={self.shape}, dtype={self.dtype}, device={self.device}, "
                f"ptr=0x{self.ptr:x})")

    # copy.copy, copy.deepcopy and pickle would otherwise copy the slots: a second owner of
    # the same pointer, which frees the memory when it goes while this one still uses it
    # (and frees it again later). Refused, with where a copy can be had instead.
    def _refuse_copy(self, how: str) -> TypeError:
        return TypeError(f"a DeviceBuffer cannot be {how}: it owns device memory of this "
                         f"process, which a second owner would free under it; copy it with "
                         f"torch.from_dlpack(buf).clone() or cupy.asarray(buf).copy(), or read "
                         f"it with buf.copy_to_host()")

    def __copy__(self) -> "DeviceBuffer":
        raise self._refuse_copy("copied (copy.copy)")

    def __deepcopy__(self, memo: dict) -> "DeviceBuffer":
        raise self._refuse_copy("copied (copy.deepcopy)")

    def __reduce__(self) -> Any:
        raise self._refuse_copy("pickled")


def _order_after(device: int, producer: int, consumer: int) -> None:
    """Make ``consumer`` wait for the work queued so far on ``producer`` (event + wait)."""
    drv = _drv.bindings()
    with _on(device):
        flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        event = _drv.check(drv.cuEventCreate(flags), "cuEventCreate")
        try:
            _drv.check(drv.cuEventRecord(event, producer), "cuEventRecord")
            _drv.check(drv.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent")
        finally:
            drv.cuEventDestroy(event)


@contextmanager
def _on(device: int) -> Iterator[None]:
    """Device ``device``'s primary context current for the body (events and the default
    streams belong to the current context), then the calling thread's own again: an export
    (``torch.from_dlpack(buf)``) or a copy must not switch the caller to another device
    (``torch.cuda.current_device()`` reads the current context). Costs one
    ``cuCtxGetCurrent`` when the device is current already, as making it current did."""
    dev = get_device(device)
    current = _drv.check(_drv.bindings().cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is not None and int(current) == dev.ctx_id:
        yield
    else:
        with dev.pushed():
            yield

