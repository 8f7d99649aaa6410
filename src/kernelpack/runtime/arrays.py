"""Arrays in, arrays out: PyTorch and CuPy fast paths, a generic fallback, and output allocation.

Reading an argument gives a tuple ``(ptr, shape, dtype token, device ordinal (-1: host memory,
-2: unknown), contiguous)`` without DLPack round trips for ``torch.Tensor`` and ``cupy.ndarray``
(their own attributes), and through ``__cuda_array_interface__`` or ``__dlpack__`` for anything
else. Frameworks are never imported by kernelpack: an adapter exists only when the caller's
module is already in ``sys.modules``.

Outputs (and scratch buffers) are allocated by the caller's framework — torch in, torch out;
cupy in, cupy out — so they are stream-ordered by that framework's caching allocator; callers
with neither get a :class:`~kernelpack.runtime.buffer.DeviceBuffer`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, TypeVar

from ..dtypes import DType, as_dtype, strict_index, uint8
from ..errors import DeviceError, LaunchError

__all__ = ["Adapter", "TorchAdapter", "CupyAdapter", "GenericAdapter", "torch_adapter",
           "cupy_adapter", "adapter_for", "stream_handle", "stream_device",
           "check_stream_device", "GENERIC", "hold", "held_views", "release_held",
           "readonly_why"]

STREAM_OBJECTS_KEPT = 64  # torch stream objects remembered per adapter (TorchAdapter.empty)

ArrayFacts = tuple  # (ptr, shape, dtype token, device ordinal (-1: host), contiguous)


class Adapter:
    """How one framework's arrays are read, allocated and which stream is current."""

    name = "generic"
    #: a call's scratch is stream-ordered memory of the driver's (``cuMemAllocAsync``), not
    #: the framework's: true unless the framework's allocator is safe in a CUDA graph capture
    #: (torch's is: a captured graph gets a private pool; CuPy's pool handed a captured call's
    #: scratch to the next array while every replay still wrote it)
    driver_scratch = True

    def read(self, obj: Any, what: str, stream: int) -> ArrayFacts:  # pragma: no cover
        raise NotImplementedError

    def dtype_token(self, dtype: DType) -> Any:
        """What :meth:`read` returns as dtype for a kernelpack dtype (compared with ``is``/==)."""
        return dtype

    def dtype_name(self, token: Any) -> str:
        if token is None:  # a typestr / DLPack type kernelpack has no dtype for
            return "unsupported by kernelpack"
        return str(token).removeprefix("torch.")

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int) -> tuple[Any, int]:
        """Allocate a C-contiguous array; returns (array, device pointer). (The buffer module
        is imported here, on the first such allocation: torch/cupy callers never need it.)"""
        from .buffer import DeviceBuffer

        buf = DeviceBuffer.empty(shape, dtype, device, stream)
        return buf, buf.ptr

    def scratch(self, nbytes: int, device: int, stream: int) -> tuple[Any, int]:
        """``nbytes`` of device memory for one call's work on ``stream`` (a scratch buffer, a
        copy of an input): ``(owner, pointer)``, alive as long as the owner."""
        return self.empty((nbytes,), uint8, device, stream)

    def current_stream(self, device: int) -> int:
        return 0


class GenericAdapter(Adapter):
    """``__cuda_array_interface__`` (v2/v3) first, then ``__dlpack__``."""

    name = "generic"

    def read(self, obj: Any, what: str, stream: int) -> ArrayFacts:
        try:  # a property that raises (torch: a tensor requiring grad) names the argument too
            cai = getattr(obj, "__cuda_array_interface__", None)
        except Exception as exc:  # noqa: BLE001 - whatever the producer raises
            raise LaunchError(f"argument {what!r}: __cuda_array_interface__ failed "
                              f"({type(exc).__name__}: {exc})") from exc
        if cai is not None:
            # bfloat16 has no typestr (DeviceBuffer exports it as raw '<V2'); DLPack names it
            if (isinstance(cai, dict) and str(cai.get("typestr", ""))[1:2] == "V"
                    and hasattr(obj, "__dlpack__")):
                return _read_dlpack(obj, what, stream)
            return _read_cai(cai, what, stream)
        if hasattr(obj, "__dlpack__"):
            return _read_dlpack(obj, what, stream)
        raise LaunchError(f"argument {what!r}: expected a CUDA array (torch.Tensor, "
                          f"cupy.ndarray, or an object with __cuda_array_interface__ or "
                          f"__dlpack__), got {type(obj).__name__}")


GENERIC = GenericAdapter()


def _typestr_dtype(typestr: str) -> DType | None:
    order, kind, size = typestr[:1], typestr[1:2], typestr[2:]
    names = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
    if kind not in names or not size.isdigit():
        return None
    if order == ">" and int(size) > 1:
        return None  # big-endian: the device reads little-endian values, this would be garbage
    try:
        return as_dtype("bool" if kind == "b" else names[kind] + str(int(size) * 8))
    except TypeError:
        return None


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    """C-contiguity, ignoring the strides of size-1 dims (as PyTorch does) and anything of a
    size-0 array."""
    if strides is None:
        return True
    if 0 in shape:
        return True
    expect = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def _pointer_device(ptr: int) -> int:
    """The device ordinal owning ``ptr`` (-1 when it is not device memory). DeviceError in
    a child forked after the parent initialized CUDA: the driver answers nothing there, and
    every pointer read as host memory ("move it to a CUDA device first")."""
    from . import device as _dev, driver as _drv

    if _dev._forked_after_init:
        raise DeviceError(_dev.FORK_MESSAGE)
    drv = _drv.init()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, value = drv.cuPointerGetAttribute(attr, ptr)
    return int(value) if not err else -1


def _integer(value: Any, field: str) -> int:
    """``value`` by ``__index__`` (as NumPy reads shapes): ``int()`` would make 2.5 a 2. A
    bool is refused, as ``plan()`` refuses it for a dim and ``stream=`` for a handle."""
    try:
        return strict_index(value)
    except TypeError:
        why = "an invalid literal" if isinstance(value, str) else "not an integer"
        raise TypeError(f"{field} is {type(value).__name__} {value!r}, {why}") from None


def _sequence(cai: dict, field: str, length: int | None = None) -> tuple:
    """``cai[field]`` as a tuple (a list or tuple, of ``length`` items when given); a
    ValueError naming the field otherwise ("'NoneType' object is not iterable" named none)."""
    if field not in cai:
        raise ValueError(f"no {field!r} entry")
    value = cai[field]
    if not isinstance(value, (tuple, list)) or length is not None and len(value) != length:
        want = f"a tuple of {length}" if length is not None else "a tuple"
        raise ValueError(f"{field!r} must be {want} (got {value!r:.60})")
    return tuple(value)


def _read_cai(cai: dict, what: str, stream: int) -> ArrayFacts:
    try:
        if not isinstance(cai, dict):
            raise TypeError(f"it must be a dict (got {type(cai).__name__})")
        shape = tuple(_integer(d, f"shape[{i}]") for i, d in enumerate(_sequence(cai, "shape")))
        ptr = _integer(_sequence(cai, "data", 2)[0] or 0, "data pointer")
        if not 0 <= ptr < (1 << 64):
            raise ValueError(f"data pointer {ptr:#x} is not an address")
        if cai.get("mask") is not None:  # masked values would be read as if valid
            raise ValueError("masked arrays (a 'mask' that is not None) are not supported")
        if not isinstance(cai.get("typestr"), str):
            raise ValueError(f"'typestr' must be a string such as '<f4' (got "
                             f"{cai.get('typestr', 'nothing')!r:.40})")
        dtype = _typestr_dtype(cai["typestr"])
        strides = cai.get("strides")
        if strides is not None:
            strides = tuple(_integer(s, f"strides[{i}]")
                            for i, s in enumerate(_sequence(cai, "strides")))
            if len(strides) != len(shape):
                raise ValueError(f"{len(strides)} strides for shape {shape}")
        producer = cai.get("stream")
        producer = None if producer is None else _integer(producer, "stream")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise LaunchError(f"argument {what!r}: malformed __cuda_array_interface__ ({exc})") from None
    _check_data(ptr, shape, what, dtype)
    contiguous = _contiguous(shape, strides, dtype.itemsize if dtype else 1)
    device = _pointer_device(ptr) if ptr else -2
    # Host memory (-1) is refused by the caller, naming the argument: no event for it.
    if producer is not None and device >= 0:
        consumer = 0 if stream in (1, 2) else stream
        producer = 0 if producer in (1, 2) else producer
        if producer != consumer:
            from .buffer import _order_after
            _order_after(device, producer, consumer)
    return ptr, shape, dtype, device, contiguous


def readonly_why(obj: Any) -> str | None:
    """Why ``obj`` cannot be written (for a message), or None: ``__cuda_array_interface__``'s
    ``data[1]``, or the flags of the DLPack 1.0 capsule read for this call (read-only, or a
    copy the producer made, which would take the writes and drop them)."""
    for view in getattr(_held, "views", None) or ():
        if getattr(view, "source", None) is obj and view.readonly:
            return view.readonly
    try:
        if obj.__cuda_array_interface__["data"][1]:
            return "its __cuda_array_interface__ says data[1] = True"
    except Exception:  # noqa: BLE001 - no interface, or a malformed one read() already refused
        pass
    return None


def _check_data(ptr: int, shape: tuple[int, ...], what: str, dtype: Any,
                kind: str = "array") -> None:
    """A NULL data pointer is valid only for an empty array, and a pointer must be aligned to
    its elements (a complex one to its parts; torch and cupy see to both, a generic producer's
    pointer or DLPack ``byte_offset`` can be anything): otherwise the kernel faults on the
    device, which poisons the CUDA context for the whole process. Refused, naming the argument
    (and ``kind``, what it is: a torch FakeTensor says cuda over meta storage, pointer 0).
    ``dtype``: a kernelpack or NumPy dtype (both have ``itemsize`` and ``kind``), or None."""
    for d in shape:
        if d == 0:
            return
    if not ptr:
        raise LaunchError(f"argument {what!r}: data pointer is NULL for a non-empty {kind} of "
                          f"shape {shape}")
    if dtype is not None:
        align = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
        if ptr & (align - 1):
            raise LaunchError(f"argument {what!r}: data pointer {ptr:#x} is not a multiple of "
                              f"{align}, the alignment of its {dtype} elements (a kernel "
                              f"would fault on the misaligned address)")


def _read_dlpack(obj: Any, what: str, stream: int) -> ArrayFacts:
    from .dlpack import read_array  # only for producers that are neither torch nor cupy

    return read_array(obj, what, stream)


_held = threading.local()


def hold(obj: Any) -> None:
    """Keep ``obj`` (a DLPack capsule view) alive until :func:`release_held` on this thread."""
    views = getattr(_held, "views", None)
    if views is None:
        views = _held.views = []
    views.append(obj)


def held_views() -> list:
    """What :func:`hold` keeps on this thread now (read this call: see dlpack.read_array)."""
    return getattr(_held, "views", None) or []


def release_held() -> None:
    """Drop what :func:`hold` kept (called when a general-path call has queued its work)."""
    views = getattr(_held, "views", None)
    if views:
        views.clear()


class TorchAdapter(Adapter):
    """``torch.Tensor``: ``data_ptr()``, ``shape``, ``dtype``, ``get_device()``."""

    name = "torch"
    driver_scratch = False  # torch's caching allocator orders it and knows graph captures

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._devices: dict[int, Any] = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream: Callable[[int], int] | None = raw
        self._stream_objects: dict[tuple[int, int], Any] = {}  # (handle, device): _stream_object
        self._strided = getattr(torch, "strided", None)
        # the caching allocator's own entry points (scratch): a block for a raw stream handle
        # of the current device, without making that stream current (none: empty())
        blocks = (getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None),
                  getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None),
                  getattr(torch._C, "_cuda_getDevice", None))
        self._blocks: tuple | None = blocks if None not in blocks else None
        # torch.cuda.stream(s)'s own steps, for a tensor allocated for another stream
        switch = (getattr(torch._C, "_cuda_getCurrentStream", None),
                  getattr(torch._C, "_cuda_setStream", None), blocks[2])
        self._switch: tuple | None = switch if None not in switch else None

    def read(self, t: Any, what: str, stream: int) -> ArrayFacts:
        strided = self._strided  # (test doubles of torch may have no layouts at all)
        if strided is not None and getattr(t, "layout", strided) is not strided:
            # sparse, mkldnn: no one block of memory (data_ptr() raised torch's own error)
            raise LaunchError(f"argument {what!r}: a {t.layout} torch tensor; kernels read "
                              f"dense memory: pass {what}.to_dense()")
        if t.is_conj() or t.is_neg():
            raise LaunchError(_lazy_view_message(t, what))
        try:
            ptr = t.data_ptr()
        except RuntimeError as exc:  # vmap's batched tensors, functional wrappers: no storage
            raise LaunchError(f"argument {what!r}: torch gives no data pointer for this "
                              f"{type(t).__name__} ({exc}); a kernel needs a tensor with device "
                              f"memory of its own") from exc
        shape = t.shape
        if not ptr:  # torch sees to pointers, but a FakeTensor (torch.compile / export
            # tracing) says cuda over meta storage: launching on NULL would poison the context
            _check_data(ptr, tuple(shape), what, None, type(t).__name__)
        return ptr, shape, t.dtype, t.get_device(), t.is_contiguous()

    def dtype_token(self, dtype: DType) -> Any:
        return getattr(self.torch, dtype.name, None)

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int) -> tuple[Any, int]:
        """An output or scratch array for work on ``stream``. For another stream than the
        device's current one it is allocated from that stream's pool, as a tensor made inside
        ``with torch.cuda.stream(s)`` is (CuPy's adapter does the same): a block of the
        current stream's pool may still be in use by work queued on that stream, which the
        caching allocator orders before the next allocation *on that stream* only, so kernels
        on another stream would race it (``record_stream``, used before, protects the block's
        next user, not its previous one). Like any tensor made for a stream, an output used on
        another one afterwards needs the caller's ``record_stream``."""
        t = self.tensor_on(shape, self.dtype_token(dtype), device, stream)
        return t, t.data_ptr()

    def tensor_on(self, shape: tuple[int, ...], token: Any, device: int, stream: int) -> Any:
        """``torch.empty(shape, dtype=token)`` on ``device`` from ``stream``'s pool (see
        :meth:`empty`). For another stream than the current one, that stream is made current
        around the allocation as ``with torch.cuda.stream(target)`` does, by the two C calls
        that context manager ends in (torch's current stream of ``device``, read, set, and set
        back), without its Python steps, which cost a call ~10 µs; where torch's current
        device is another one (setting the stream would change it) or those calls are
        missing, the context manager itself."""
        torch = self.torch
        dev = self._devices.get(device)
        if dev is None:
            dev = self._devices[device] = torch.device("cuda", device)
        if stream == self.current_stream(device):
            return torch.empty(shape, dtype=token, device=dev)
        target = self._stream_objects.get((stream, device))
        if target is None:
            target = self._stream_object(stream, device, dev)
        switch = self._switch
        if switch is not None and switch[2]() == device:
            before = switch[0](device)
            switch[1](target.stream_id, target.device_index, target.device_type)
            try:
                return torch.empty(shape, dtype=token, device=dev)
            finally:
                switch[1](*before)
        with torch.cuda.stream(target):
            return torch.empty(shape, dtype=token, device=dev)

    def scratch(self, nbytes: int, device: int, stream: int) -> tuple[Any, int]:
        """``nbytes`` of device memory for one call's work on ``stream``: ``(owner, pointer)``;
        the memory goes back to the pool when the owner goes, after the call's launches are
        queued. A block of that stream's pool taken straight from torch's caching allocator
        (a :class:`_PoolBlock`): the pool that :meth:`empty` allocates from, without a tensor
        and, for another stream than the current one, without ``with
        torch.cuda.stream(target)``, which cost a call with scratch and ``stream=`` 12-13 µs of
        host time on the fast path and ~60 µs on the general path (H200, session 43,
        ``benchmarks/calls.py --stream``). The allocator takes the current device's pool, so
        another device (or a torch without these entry points) keeps :meth:`empty`. A
        captured stream gets its graph's private pool either way: the allocator asks the
        stream it is given whether it is being captured."""
        blocks = self._blocks
        if blocks is not None and nbytes > 0 and blocks[2]() == device:
            block = _PoolBlock(blocks[1])
            # taken into its owner in one C call (list.extend over map: no Python code runs
            # between raw_alloc's return and the store), so a KeyboardInterrupt raised as the
            # call returns finds it owned, and the owner alone hands it back (review 62: a bare
            # int leaked, and an except clause beside the owner handed it back twice)
            block.held.extend(map(blocks[0], (nbytes,), (0 if stream == 1 else stream,)))
            ptr = block.ptr = block.held[0]  # stream 1: the legacy default stream, torch's 0
            return block, ptr
        return super().scratch(nbytes, device, stream)

    def _stream_object(self, stream: int, device: int, dev: Any) -> Any:
        """torch's stream object for the raw handle ``stream`` of ``device``, remembered:
        ``ExternalStream`` only wraps the handle (a stream made later at the same address
        is the same handle to it), and making one per call cost ~5 µs of a fast call with
        scratch (38 -> 33 µs) and ~20 µs of the general path's (H200 host,
        ``benchmarks/calls.py --stream``, session 42). Handle 0 is the default stream (another one
        may be current), and so is 1, CU_STREAM_LEGACY, the driver's name for it: torch's own
        object for it, as ExternalStream wants a stream it did not make (ExternalStream(1) is
        torch's "invalid StreamId1")."""
        torch = self.torch
        target = (torch.cuda.default_stream(dev) if stream in (0, 1)
                  else torch.cuda.ExternalStream(stream, device=dev))
        if len(self._stream_objects) >= STREAM_OBJECTS_KEPT:
            self._stream_objects.clear()  # a program cycling through many streams
        self._stream_objects[stream, device] = target
        return target

    def current_stream(self, device: int) -> int:
        if self._raw_stream is not None:
            return self._raw_stream(device)
        return int(self.torch.cuda.current_stream(device).cuda_stream)


class _PoolBlock:
    """A block of a stream-ordered pool, handed back by ``release(ptr)`` when this owner goes:
    torch's caching allocator (:meth:`TorchAdapter.scratch`) or the driver's
    ``cuMemAllocAsync`` for CuPy (``fast_cupy._ordered_scratch``). Made before the block is
    taken, so that it alone hands it back, once. ``data_ptr()`` as a tensor's, for the fast
    paths that read the scratch's pointer that way."""

    __slots__ = ("ptr", "held", "_delete")

    def __init__(self, release: Callable[[int], Any]) -> None:
        self.ptr, self._delete = 0, release
        # the block, once taken: what __del__ hands back (a pointer, or for CuPy the driver's
        # answer, driver.allocate_ordered)
        self.held: list[Any] = []

    def data_ptr(self) -> int:
        return self.ptr

    def __del__(self) -> None:
        for ptr in self.held:
            self._delete(ptr)


def _lazy_view_message(t: Any, what: str) -> str:
    """Why a torch lazy view cannot be launched on: its memory does not hold its values (the
    conjugate bit of ``x.conj()``, the negative bit of ``x.conj().imag``), and a kernel reads
    memory. Refused rather than resolved behind the caller's back: resolving copies, and a
    copy of an output would be written in vain."""
    if t.is_conj():
        kind, how = "a lazily conjugated view (x.conj(): is_conj() is True)", "resolve_conj()"
    else:
        kind, how = ("a lazily negated view (such as x.conj().imag: is_neg() is True)",
                     "resolve_neg()")
    return (f"argument {what!r} is {kind}: its memory holds the values before the lazy "
            f"operation, which is what a kernel would read; pass {what}.{how} (a copy with "
            f"the values in memory)")


class CupyAdapter(Adapter):
    """``cupy.ndarray``: ``data.ptr``, ``shape``, ``dtype``, ``data.device_id``."""

    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self._np_dtypes: dict[str, Any] = {}

    def read(self, a: Any, what: str, stream: int) -> ArrayFacts:
        data = a.data
        ptr, dtype = data.ptr, a.dtype
        if ptr & (dtype.itemsize - 1):  # a view can be misaligned: `x[1:].view(float64)`
            _check_data(ptr, a.shape, what, dtype)  # refused unless empty or a complex's parts
        return ptr, a.shape, dtype, data.device_id, a.flags.c_contiguous

    def dtype_token(self, dtype: DType) -> Any:
        import numpy

        try:
            return numpy.dtype(dtype.name)
        except TypeError:
            return None  # bfloat16: NumPy has none, so no cupy array can match it

    def dtype_name(self, token: Any) -> str:
        return str(token)

    def empty(self, shape: tuple[int, ...], dtype: DType, device: int, stream: int) -> tuple[Any, int]:
        token = self.dtype_token(dtype)
        if token is None:
            raise LaunchError(f"cupy has no {dtype} arrays; pass out= buffers for this output")
        a = self.array_on(shape, token, device, stream)
        return a, a.data.ptr

    def array_on(self, shape: tuple[int, ...], token: Any, device: int, stream: int) -> Any:
        """``cupy.empty(shape, dtype=token)`` on ``device``, from the memory pool's arena of
        stream ``stream`` (a raw handle): the pool orders a block on the stream that is
        current when it is taken, and a block of the current stream's arena may still be in
        use by work queued there, which kernels on another stream would race. On CuPy's
        current device the stream is made current around the allocation by ``use()`` and put
        back, which replaces entering ``cupy.cuda.Device`` and the stream as context managers;
        on another device (or a CuPy whose streams lack ``use``), both are entered.

        CuPy's object for the handle is made per call, not remembered as torch's are
        (:meth:`TorchAdapter._stream_object`): with CuPy 14.2 and its stream-ordered
        allocator (``MemoryAsyncPool``), an object remembered from a stream that was then
        destroyed, used again for a new stream at the same address, crashed the process
        (session 44, tests/gpu/test_review31_cupy_world_gpu.py)."""
        cp = self.cupy
        on_device = cp.cuda.runtime.getDevice() == device
        if on_device and stream == self.current_stream(device):
            return cp.empty(shape, dtype=token)
        if on_device:
            target = _cupy_stream(cp, stream, device)
            before = cp.cuda.get_current_stream()
            use = getattr(target, "use", None)
            if use is not None and hasattr(before, "use"):
                try:  # (use() inside: an interrupt before it leaves the stream as it was)
                    use()
                    return cp.empty(shape, dtype=token)
                finally:
                    before.use()
        # Another device, or another stream than cupy's current one (the default stream, 0,
        # included): allocate there, so the memory pool orders the block on the stream that
        # will use it.
        with contextlib.ExitStack() as scope:
            scope.enter_context(cp.cuda.Device(device))
            scope.enter_context(_cupy_stream(cp, stream, device))
            return cp.empty(shape, dtype=token)

    def current_stream(self, device: int) -> int:
        return int(self.cupy.cuda.get_current_stream(device).ptr)


class _StreamHandle:
    """A raw stream handle as the CUDA stream protocol's object (``__cuda_stream__``), what
    CuPy 14's ``Stream.from_external`` takes."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def _cupy_stream(cp: Any, handle: int, device: int) -> Any:
    """CuPy's object for a raw stream handle of ``device``: ``Stream.null`` for the legacy
    default stream (0), else ``Stream.from_external`` where CuPy has it (14 deprecates
    ``ExternalStream``, with a warning at every use), else ``ExternalStream``. The caller has
    made ``device`` current (from_external records no device)."""
    if handle == 0:
        return cp.cuda.Stream.null
    from_external = getattr(getattr(cp.cuda, "Stream", None), "from_external", None)
    if from_external is None:
        return cp.cuda.ExternalStream(handle, device)
    return from_external(_StreamHandle(handle))


_adapters: dict[type, Adapter] = {}


def adapter_for(obj: Any) -> Adapter:
    """The adapter for ``obj``'s type (cached per type): torch, cupy or generic."""
    cls = type(obj)
    found = _adapters.get(cls)
    if found is not None:
        return found
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    if torch is not None and isinstance(obj, torch.Tensor):
        found = torch_adapter(torch)
    elif cupy is not None and isinstance(obj, cupy.ndarray):
        found = cupy_adapter(cupy)
    else:
        found = GENERIC
    _adapters[cls] = found
    return found


def torch_adapter(torch: Any) -> TorchAdapter:
    """The process's one :class:`TorchAdapter` (:func:`adapter_for`'s for torch tensors),
    made on first use: the torch fast path allocates through it too, so both paths share its
    devices and its stream objects."""
    return _the_adapter(TorchAdapter, torch.Tensor, torch)


def cupy_adapter(cupy: Any) -> CupyAdapter:
    """The process's one :class:`CupyAdapter` (:func:`adapter_for`'s for cupy arrays), made on
    first use: the CuPy fast path allocates ``stream=``'s outputs through it too
    (:meth:`CupyAdapter.array_on`)."""
    return _the_adapter(CupyAdapter, cupy.ndarray, cupy)


_A = TypeVar("_A", TorchAdapter, CupyAdapter)


def _the_adapter(kind: type[_A], array_type: type, module: Any) -> _A:
    """The adapter of ``kind`` remembered for ``array_type``, or any of that kind already
    made (one per process), or a new one over ``module``."""
    found = _adapters.get(array_type)
    if not isinstance(found, kind):
        found = next((a for a in _adapters.values() if isinstance(a, kind)), None) \
            or kind(module)
        _adapters[array_type] = found
    return found


def stream_device(stream: Any) -> int | None:
    """The device a framework's stream object says it belongs to (torch ``device_index``,
    CuPy ``device_id``); None for a raw handle, which does not say (asking the driver would
    cost every call a driver round trip)."""
    if isinstance(stream, int):
        return None
    for attr in ("device_index", "device_id"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            # cupy's null, per-thread and external streams say -1: no device of their own
            return value if value >= 0 else None
    return None


def check_stream_device(name: str, stream: Any, device: int) -> None:
    """LaunchError when ``stream`` is a torch/CuPy stream of another device than the
    arguments' ``device``: the kernel would run there, on this device's memory. A raw handle
    does not say its device: the caller's to get right."""
    on = stream_device(stream)
    if on is not None and device >= 0 and on != device:
        raise LaunchError(f"{name}: stream= is a stream of device {on}, the arguments are on "
                          f"device {device}; pass a stream of device {device}")


def stream_handle(stream: Any) -> int:
    """A raw ``CUstream`` handle from ``stream=``: an int, a torch stream (``cuda_stream``), a
    cupy stream (``ptr``), or anything with ``__cuda_stream__`` (the CUDA stream protocol).

    The handle is checked here, before anything is allocated or launched: a float or a bool
    is refused rather than truncated (``1.5`` or ``True`` would silently become the legacy
    default stream, handle 1), and a handle outside ``0 .. 2**64-1`` is a ValueError naming
    ``stream=`` instead of an OverflowError from the launcher."""
    if stream is None:
        raise TypeError("stream_handle needs a stream (got None)")
    if isinstance(stream, int) and not isinstance(stream, bool):
        return _checked_handle(stream, stream)
    if isinstance(stream, (bool, float, complex, str, bytes, bytearray)):
        raise TypeError(f"stream= takes a torch/cupy stream, a CUstream or an int handle "
                        f"(got {type(stream).__name__} {stream!r})")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        try:
            value = proto() if callable(proto) else proto
            handle = value[1]
        except Exception as exc:  # noqa: BLE001 - a broken protocol object: say which
            raise TypeError(f"stream=: __cuda_stream__ of {type(stream).__name__} did not give "
                            f"a (version, handle) pair ({exc})") from None
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise TypeError(f"stream=: __cuda_stream__ of {type(stream).__name__} gave handle "
                            f"{handle!r}, expected an int")
        return _checked_handle(handle, stream)
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return _checked_handle(value, stream)
    if (not hasattr(stream, "__index__") and hasattr(stream, "__float__")) \
            or getattr(getattr(stream, "dtype", None), "kind", None) in ("b", "f", "c"):
        # a NumPy float/bool scalar (np.bool_ has __index__ before NumPy 2.3), Decimal,
        # Fraction: int() would truncate it to a handle
        raise TypeError(f"stream= takes a torch/cupy stream, a CUstream or an int handle "
                        f"(got {type(stream).__name__} {stream!r})")
    try:
        handle = int(stream)  # cuda.bindings CUstream and similar handle objects
    except (TypeError, ValueError):
        raise TypeError(f"stream= takes a torch/cupy stream, a CUstream or an int handle "
                        f"(got {type(stream).__name__})") from None
    return _checked_handle(handle, stream)


def _checked_handle(handle: int, stream: Any) -> int:
    """``handle`` if it can be a ``CUstream`` (0 .. 2**64-1), else ValueError naming stream=."""
    if not 0 <= handle < (1 << 64):
        what = "" if stream is handle else f" from {type(stream).__name__}"
        raise ValueError(f"stream=: a stream handle must be >= 0 and < 2**64 "
                         f"(got {handle}{what})")
    return handle
