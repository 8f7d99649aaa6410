"""The PyTorch fast path on CPU: a stand-in ``torch`` module over host memory and the fake
driver. Checks that the fast path is taken, computes the same as the general path, and falls
back (with the general path's errors) whenever a call does not fit it."""

from __future__ import annotations

import contextlib
import ctypes
import struct
import sys
import types
from pathlib import Path

import pytest

from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install, install_framework  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


class FakeDtype:
    def __init__(self, name: str, fmt: str, itemsize: int = 4) -> None:
        self.name, self.fmt, self.itemsize = name, fmt, itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class Tensor:
    """torch.Tensor's attributes over host memory; ``conj``/``neg``: torch's lazy conjugate /
    negative bits (``x.conj()``, ``x.conj().imag``)."""

    def __init__(self, values: list, dtype: FakeDtype, shape: tuple | None = None,
                 contiguous: bool = True, device: int = 0, conj: bool = False,
                 neg: bool = False) -> None:
        self.dtype = dtype
        self.shape = tuple(shape if shape is not None else (len(values),))
        self._buf = ctypes.create_string_buffer(struct.pack(f"<{len(values)}{dtype.fmt}", *values),
                                                max(1, 4 * len(values)))
        self._contiguous = contiguous
        self._device = device
        self._conj, self._neg = conj, neg

    def is_conj(self) -> bool:
        return self._conj

    def is_neg(self) -> bool:
        return self._neg

    # torch's sparse/mkldnn layouts: no strides, no data pointer (torch raises RuntimeError)
    layout = "strided"

    def data_ptr(self) -> int:
        if self.layout != "strided":
            raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")
        return ctypes.addressof(self._buf)

    def get_device(self) -> int:
        return self._device

    def is_contiguous(self) -> bool:
        if self.layout != "strided":
            raise RuntimeError(f"is_contiguous is not implemented for {self.layout} tensors")
        return self._contiguous

    def record_stream(self, stream: object) -> None:
        self.recorded = stream

    def values(self) -> list:
        n = 1
        for d in self.shape:
            n *= d
        return list(struct.unpack(f"<{n}{self.dtype.fmt}", self._buf.raw[:4 * n]))


def _has_c_fast_path() -> bool:
    try:
        from kernelpack.runtime._launch import FastCall  # noqa: F401
    except ImportError:
        return False
    return True


def select_path(which: str, monkeypatch) -> str:
    """Make the torch fast path ``which``: "C" (``_launch.FastCall``, with the C launcher,
    reading the tensors' attributes), "C-dlpack" (the same through DLPack's C exchange API,
    which the ``torch`` fixture then gives the stand-in tensors) or "closure"
    (``KERNELPACK_NATIVE_LAUNCH=0``)."""
    if which.startswith("C") and not _has_c_fast_path():
        pytest.skip("the C extension kernelpack.runtime._launch is not built")
    if which == "closure":
        monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "0")
    return which


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    """Every test here runs on every torch fast path."""
    return select_path(request.param, monkeypatch)


@pytest.fixture(autouse=True)
def exchange(launch_path, monkeypatch):
    """The stand-in tensors' DLPack C exchange API on the "C-dlpack" path (else None)."""
    if launch_path != "C-dlpack":
        return None
    from dlpack_exchange import FakeExchange

    fx = FakeExchange()
    monkeypatch.setattr(Tensor, "__dlpack_c_exchange_api__", fx.capsule, raising=False)
    return fx


def make_torch(monkeypatch):
    """A stand-in torch installed for this test (float32, int32, complex64 and uint8 for
    scratch buffers); the ``torch`` fixture, and a plain function for a test that installs
    one per ``monkeypatch.context()``."""
    mod = types.ModuleType("torch")
    mod.float32, mod.int32 = FakeDtype("float32", "f"), FakeDtype("int32", "i")
    mod.complex64 = FakeDtype("complex64", "f", 8)  # values: interleaved float32 pairs
    mod.uint8 = FakeDtype("uint8", "B", 1)
    mod.Tensor = Tensor
    mod.current_stream = None  # what ``torch.cuda.stream(s)`` made current (None: default)

    def empty(*shape, dtype, device):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):  # empty((n, m)) or (n, m)
            shape = shape[0]
        t = Tensor(_values(dtype, _prod(shape)), dtype, tuple(shape))
        t.allocated_on = mod.current_stream  # the caching allocator's pool it came from
        return t

    @contextlib.contextmanager
    def stream(s):
        before, mod.current_stream = mod.current_stream, s
        try:
            yield
        finally:
            mod.current_stream = before

    mod.empty = empty
    mod.strided = "strided"  # the layout of a dense tensor (Tensor.layout)
    mod.empty_like = lambda t: Tensor(_values(t.dtype, _prod(t.shape)), t.dtype, t.shape,
                                      device=t._device)
    mod.device = lambda kind, index: (kind, index)
    mod._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)
    mod.cuda = types.SimpleNamespace(ExternalStream=lambda handle, device=None: ("ext", handle),
                                     default_stream=lambda device=None: ("default", device),
                                     stream=stream)
    return install_framework(monkeypatch, "torch", mod)


@pytest.fixture
def torch(monkeypatch):
    return make_torch(monkeypatch)


def _values(dtype: FakeDtype, count: int) -> list:
    """Zero values filling ``count`` elements of ``dtype`` (its format's items per element:
    two float32 values per complex64)."""
    return [0] * (count * dtype.itemsize // struct.calcsize(dtype.fmt))


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def test_fast_path_is_taken_and_correct(fake, torch, launch_path) -> None:
    prog = axpby()
    x, y = Tensor([1.0, 2.0, 3.0], torch.float32), Tensor([1.0, 1.0, 1.0], torch.float32)
    first = call_program(prog, x, y, 2.0)          # general path, binds device 0
    from kernelpack.runtime.launcher import bind
    bound = bind(prog)
    assert bound.call != bound.__call__             # the fast path is installed
    second = call_program(prog, x, y, 2.0)
    fast = getattr(bound.call, "__self__", None)
    assert (type(fast).__name__ == "FastCall") == (launch_path.startswith("C"))
    assert first.values() == second.values() == [3.0, 5.0, 7.0]
    assert isinstance(second, Tensor) and second.shape == (3,)
    z = Tensor([0.0] * 3, torch.float32)
    assert call_program(prog, x, y, -1.0, out=z) is z and z.values() == [0.0, -1.0, -2.0]
    class Stream:
        cuda_stream = 0x77

    assert call_program(prog, x, y, 1.0, out=z, stream=Stream()) is z   # fast path too
    assert z.values() == [2.0, 3.0, 4.0]
    launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 4 and all(c[2] == (1, 1, 1) for c in launches)
    assert launches[-1][5] == 0x77
    if launch_path.startswith("C"):
        assert fast.fast_calls == 3 and fast.entries == 1


def test_fast_path_falls_back_with_the_general_errors(fake, torch) -> None:
    prog = axpby()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([1.0, 1.0], torch.float32)
    call_program(prog, x, y, 1.0)
    with pytest.raises(LaunchError, match="'y' has dtype int32, expected float32"):
        call_program(prog, x, Tensor([1, 2], torch.int32), 1.0)
    with pytest.raises(LaunchError, match="'x' is not C-contiguous"):
        call_program(prog, Tensor([1.0, 2.0], torch.float32, contiguous=False), y, 1.0)
    with pytest.raises(ConstraintError, match="y"):
        call_program(prog, x, Tensor([1.0, 2.0, 3.0], torch.float32), 1.0)
    with pytest.raises(LaunchError, match="out 'z' has shape"):
        call_program(prog, x, y, 1.0, out=Tensor([0.0] * 5, torch.float32))
    with pytest.raises(LaunchError, match="device 1, earlier arguments on device 0"):
        call_program(prog, x, Tensor([1.0, 2.0], torch.float32, device=1), 1.0)
    # an int for a float scalar and an explicit stream take the general path and still work;
    # the output comes from that stream's pool (a block of the current stream's may still be
    # in use by work queued there)
    z = call_program(prog, x, y, 3, stream=5)
    assert z.values() == [4.0, 7.0] and z.allocated_on == ("ext", 5)
    assert torch.current_stream is None
    assert [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"][-1] == 5


# ---- cupy ----------------------------------------------------------------------------------
class _Mem:
    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id


class NDArray:
    _c_contiguous = True  # on the type, as CuPy's stored flag is: the C path reads it

    def __init__(self, values: list | tuple, dtype: object = "float32",
                 shape: tuple | None = None, contiguous: bool = True,
                 memptr: object = None) -> None:
        import numpy

        if isinstance(values, tuple):  # cupy.ndarray(shape, dtype): zeros here
            values, shape = [0] * _prod(values), values
        if memptr is not None:  # cupy.ndarray(shape, dtype, memptr=): over memory it is given
            self.dtype, self.shape, self.memptr = numpy.dtype(dtype), tuple(shape), memptr
            self.data = _Mem(memptr.ptr, 0)
            self.__dict__["_c_contiguous"] = contiguous
            return
        self.dtype = numpy.dtype(dtype)
        self.shape = tuple(shape if shape is not None else (len(values),))
        fmt = self.dtype.char
        self._fmt = fmt
        self._buf = ctypes.create_string_buffer(struct.pack(f"<{len(values)}{fmt}", *values),
                                                max(1, 4 * len(values)))
        self.data = _Mem(ctypes.addressof(self._buf), 0)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.__dict__["_c_contiguous"] = contiguous  # (a subclass may make it a property)

    def values(self) -> list:
        return list(struct.unpack(f"<{_prod(self.shape)}{self._fmt}",
                                  self._buf.raw[:4 * _prod(self.shape)]))


@pytest.fixture
def cupy(monkeypatch):
    return _install_cupy(monkeypatch)


def install_external_stream(cupy, monkeypatch) -> None:
    """Give the stand-in CuPy ``cupy.cuda.ExternalStream(handle, device)``: a context manager
    that makes a stream of that handle CuPy's current one while inside, as CuPy's streams do
    (the general path enters one for a raw ``stream=`` handle)."""
    @contextlib.contextmanager
    def external(handle: int, device: int | None = None):
        before, cupy.current.stream = cupy.current.stream, types.SimpleNamespace(ptr=handle)
        try:
            yield
        finally:
            cupy.current.stream = before

    monkeypatch.setattr(cupy.cuda, "ExternalStream", external, raising=False)


def _install_cupy(monkeypatch):
    mod = types.ModuleType("cupy")
    mod.ndarray = NDArray
    mod.empty = lambda shape, dtype: NDArray([0] * _prod(shape), str(dtype), tuple(shape))
    mod.empty_like = lambda a: NDArray([0] * _prod(a.shape), str(a.dtype), a.shape)
    mod.current = types.SimpleNamespace(device=0, stream=types.SimpleNamespace(ptr=0))
    @contextlib.contextmanager
    def device(index: int):  # cupy.cuda.Device(index) as a context manager
        before, mod.current.device = mod.current.device, index
        try:
            yield
        finally:
            mod.current.device = before

    class NullStream:  # cupy.cuda.Stream.null as a context manager: current while inside
        def __enter__(self):
            self.before, mod.current.stream = mod.current.stream, types.SimpleNamespace(ptr=0)
            return self

        def __exit__(self, *exc):
            mod.current.stream = self.before

    class UnownedMemory:  # cupy.cuda.UnownedMemory(ptr, size, owner): keeps owner alive
        def __init__(self, ptr: int, size: int, owner: object) -> None:
            self.ptr, self.size, self.owner = ptr, size, owner

    class MemoryPointer:  # cupy.cuda.MemoryPointer(memory, offset)
        def __init__(self, mem: UnownedMemory, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    mod.uint8 = "uint8"
    mod.cuda = types.SimpleNamespace(Stream=types.SimpleNamespace(null=NullStream()),
                                     get_current_stream=lambda device=None: mod.current.stream,
                                     runtime=types.SimpleNamespace(
                                         getDevice=lambda: mod.current.device),
                                     Device=device, UnownedMemory=UnownedMemory,
                                     MemoryPointer=MemoryPointer)
    return install_framework(monkeypatch, "cupy", mod)


def test_a_sparse_tensor_on_a_warm_fast_path_is_the_general_paths_launch_error(
        fake, torch, launch_path) -> None:
    """A tensor whose is_contiguous() / data_ptr() raise (torch's sparse and mkldnn layouts),
    as an input or as out=, is handed to the general path on every fast path (C and the
    closure alike), which names the parameter; nothing is launched."""
    prog = axpby()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([1.0, 1.0], torch.float32)
    for _ in range(2):  # the general path, then the warm one
        call_program(prog, x, y, 1.0)
    launched = len(fake.calls)
    sparse = Tensor([1.0, 2.0], torch.float32)
    sparse.layout = "sparse_coo"
    with pytest.raises(LaunchError, match="'x': a sparse_coo torch tensor"):
        call_program(prog, sparse, y, 1.0)
    with pytest.raises(LaunchError, match="'y': a sparse_coo torch tensor"):
        call_program(prog, x, sparse, 1.0)
    with pytest.raises(LaunchError, match="a sparse_coo torch tensor"):
        call_program(prog, x, y, 1.0, out=sparse)
    assert not [c for c in fake.calls[launched:] if c[0] == "cuLaunchKernel"]
    assert call_program(prog, x, y, 1.0).values() == [2.0, 3.0]  # and the fast path still works


def test_cupy_fast_path(fake, cupy, launch_path) -> None:
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    first = call_program(prog, x, y, 2.0)
    from kernelpack.runtime.launcher import bind
    bound = bind(prog)
    assert bound.call != bound.__call__
    second = call_program(prog, x, y, 2.0)  # builds the fast path, then takes it
    fast = getattr(bound.call, "__self__", None)
    assert (type(fast).__name__ == "FastCall") == (launch_path.startswith("C"))
    assert isinstance(second, NDArray) and first.values() == second.values() == [12.0, 24.0]
    z = NDArray([0.0, 0.0])
    assert call_program(prog, x, y, 1.0, out=z) is z and z.values() == [11.0, 22.0]
    cupy.current.stream = types.SimpleNamespace(ptr=0x55)  # CuPy's current stream is used
    assert call_program(prog, x, y, 1.0, out=z) is z
    assert [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"][-1] == 0x55
    if launch_path.startswith("C"):
        assert fast.fast_calls == 3 and fast.entries == 1
    with pytest.raises(LaunchError, match="'x' has dtype int32"):
        call_program(prog, NDArray([1, 2], "int32"), y, 1.0)
    with pytest.raises(LaunchError, match="'y' is not C-contiguous"):
        call_program(prog, x, NDArray([1.0, 2.0], contiguous=False), 1.0)
    with pytest.raises(LaunchError, match="out 'z' has shape"):
        call_program(prog, x, y, 1.0, out=NDArray([0.0] * 3))
    if launch_path.startswith("C"):
        assert fast.fast_calls == 3  # none of those was launched here


def test_cupy_arrays_off_the_current_device_take_the_general_path(fake, cupy,
                                                                 launch_path) -> None:
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    call_program(prog, x, y, 2.0)
    call_program(prog, x, y, 2.0)  # builds the fast path, then takes it
    from kernelpack.runtime.launcher import bind
    fast = getattr(bind(prog).call, "__self__", None)
    start = fast.fast_calls if launch_path.startswith("C") else 0
    cupy.current.device = 1  # CuPy would allocate and stream on device 1: not the arrays'
    try:
        assert call_program(prog, x, y, 2.0).values() == [12.0, 24.0]
    finally:
        cupy.current.device = 0
    if launch_path.startswith("C"):
        assert fast.fast_calls == start
        call_program(prog, x, y, 2.0)
        assert fast.fast_calls == start + 1


def test_framework_imported_after_binding_gets_a_fast_path(fake, torch, monkeypatch) -> None:
    from kernelpack.runtime.launcher import bind

    prog = axpby()
    call_program(prog, Tensor([1.0], torch.float32), Tensor([1.0], torch.float32), 1.0)
    assert bind(prog)._fast_for == {"torch"}
    cupy_mod = _install_cupy(monkeypatch)  # "cupy" is imported only now
    assert cupy_mod is sys.modules["cupy"]
    c = call_program(prog, NDArray([1.0]), NDArray([2.0]), 1.0)  # general path, then rebuild
    assert c.values() == [3.0] and bind(prog)._fast_for == {"torch", "cupy"}
    assert call_program(prog, NDArray([2.0]), NDArray([2.0]), 1.0).values() == [4.0]


def test_both_frameworks_dispatch(fake, torch, cupy, launch_path) -> None:
    prog = axpby()
    t = call_program(prog, Tensor([1.0], torch.float32), Tensor([1.0], torch.float32), 1.0)
    c = call_program(prog, NDArray([1.0]), NDArray([2.0]), 1.0)
    t2 = call_program(prog, Tensor([2.0], torch.float32), Tensor([1.0], torch.float32), 1.0)
    assert (t.values(), c.values(), t2.values()) == ([2.0], [3.0], [3.0])
    assert isinstance(c, NDArray) and isinstance(t2, Tensor)
    if launch_path.startswith("C"):  # torch's C path falls back to cupy's, which falls back to Python
        from kernelpack.runtime.launcher import bind

        torch_fast = bind(prog).call.__self__
        cupy_fast = torch_fast.hooks.slow.__self__
        assert (torch_fast.flavor, cupy_fast.flavor) == ("torch", "cupy")
        done = cupy_fast.fast_calls
        assert call_program(prog, NDArray([3.0]), NDArray([2.0]), 1.0).values() == [5.0]
        assert cupy_fast.fast_calls == done + 1


class _NoStorage(Tensor):
    """A torch Tensor subclass whose data pointer torch will not give: vmap's batched
    tensors ("Cannot access data pointer of Tensor that doesn't have storage")."""

    def data_ptr(self) -> int:
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")


class _FakeStorage(Tensor):
    """A FakeTensor (torch.compile / export tracing): device cuda, storage meta, pointer 0."""

    def data_ptr(self) -> int:
        return 0


def test_tensors_without_device_memory_are_refused_naming_the_parameter(
        fake, torch, launch_path) -> None:
    """Found on the H200 (review 30): a FakeTensor was launched on its NULL pointer (an illegal
    address that poisoned the process's context) and vmap's batched tensor escaped as torch's
    RuntimeError. Both are now the general path's LaunchError naming the parameter, on every
    fast path, as inputs and as out=; nothing is launched; an empty one is still fine."""
    prog = axpby()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([1.0, 1.0], torch.float32)
    for _ in range(2):
        call_program(prog, x, y, 1.0)
    launched = len(fake.calls)
    cases = ((_NoStorage, r"'{}': torch gives no data pointer for this _NoStorage"),
             (_FakeStorage, r"'{}': data pointer is NULL for a non-empty _FakeStorage of "
                            r"shape \(2,\)"))
    for cls, message in cases:
        bad = cls([1.0, 2.0], torch.float32)
        with pytest.raises(LaunchError, match=message.format("x")):
            call_program(prog, bad, y, 1.0)
        with pytest.raises(LaunchError, match=message.format("y")):
            call_program(prog, x, bad, 1.0)
        with pytest.raises(LaunchError, match=message.format("z")):
            call_program(prog, x, y, 1.0, out=bad)
    assert not [c for c in fake.calls[launched:] if c[0] == "cuLaunchKernel"]
    empty = _FakeStorage([], torch.float32, (0,))
    assert call_program(prog, empty, Tensor([], torch.float32, (0,)), 1.0).shape == (0,)
    assert call_program(prog, x, y, 1.0).values() == [2.0, 3.0]
