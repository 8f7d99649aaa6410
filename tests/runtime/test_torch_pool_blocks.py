"""A call's scratch straight from torch's caching allocator (``TorchAdapter.scratch``): a
block of the call's stream's pool taken with ``_cuda_cudaCachingAllocator_raw_alloc(nbytes,
handle)`` instead of a ``torch.empty`` tensor (inside ``with torch.cuda.stream(...)`` for
``stream=``: 12-13 µs of a fast call's host time, session 43), handed back with
``raw_delete`` once the call's launches are queued. On CPU, with the stand-in torch given
those entry points and the fake driver, on the three torch launch paths (C, C through
DLPack, the closure) and the general path."""

from __future__ import annotations

import ctypes
import gc
import sys
from pathlib import Path

import pytest

from kernelpack.runtime import arrays, call_program
from kernelpack.runtime.arrays import TorchAdapter, _PoolBlock
from kernelpack.runtime.fastpath import SCRATCH_ALIGN

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fast_scratch import KERNELS, _expected, _launches, _program  # noqa: E402
from test_fast_scratch import four_after_a_first_call  # noqa: E402
from test_fast_scratch import allocations  # noqa: E402,F401
from test_fastpath_fake import Tensor as FakeTensor, select_path, torch  # noqa: E402,F401


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


class Pool:
    """The caching allocator's raw entry points over host memory: every block taken, every
    block handed back (with how many driver calls had been made by then), and which device
    torch has current."""

    def __init__(self, fake: FakeDriver | None = None) -> None:
        self.fake, self.device = fake, 0
        self.live: dict[int, ctypes.Array] = {}
        self.taken: list[tuple[int, int]] = []      # (nbytes, stream handle)
        self.deleted: list[tuple[int, int]] = []    # (ptr, driver calls made before)

    def raw_alloc(self, nbytes: int, stream: int) -> int:
        buf = ctypes.create_string_buffer(nbytes)
        ptr = ctypes.addressof(buf)
        self.live[ptr] = buf
        self.taken.append((nbytes, stream))
        return ptr

    def raw_delete(self, ptr: int) -> None:
        del self.live[ptr]  # a second delete of one block raises here
        self.deleted.append((ptr, len(self.fake.calls) if self.fake else 0))

    def get_device(self) -> int:
        return self.device


def install_pool(torch, monkeypatch, p):
    """The stand-in torch given ``p``'s allocator entry points (``raw_alloc``, ``raw_delete``,
    ``get_device``), and a fresh process adapter (the adapter reads them when it is made)."""
    monkeypatch.setattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", p.raw_alloc,
                        raising=False)
    monkeypatch.setattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", p.raw_delete,
                        raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", p.get_device, raising=False)
    monkeypatch.setattr(arrays, "_adapters", {})
    return p


@pytest.fixture
def pool(torch, monkeypatch) -> Pool:
    return install_pool(torch, monkeypatch, Pool())


def test_a_fast_call_with_stream_takes_one_block_of_that_streams_pool(
        monkeypatch, torch, allocations, pool, launch_path) -> None:
    # a first call (the general path) binds the device (current stream: torch.empty)
    fake, prog, xs, x, out = four_after_a_first_call(monkeypatch, torch, allocations)
    pool.fake = fake
    earlier = len(pool.deleted)  # the first call's buffers (the current stream's pool)
    for k in range(3):
        fake.calls.clear()
        pool.taken.clear()
        assert call_program(prog, x, out=out, stream=9) is out
        assert out.values() == _expected(xs)
        assert allocations == []  # no torch.empty, no stream made current
        assert pool.taken == [(2 * SCRATCH_ALIGN, 9)]
        double, total, add = _launches(fake)
        assert {c[5] for c in (double, total, add)} == {9}
        ptr, calls_before = pool.deleted[-1]
        assert double[6][1] == ptr and total[6][:2] == (ptr, ptr + SCRATCH_ALIGN)
        # handed back once, after the last launch was queued
        assert len(pool.deleted) == earlier + k + 1 and calls_before == len(fake.calls)
    assert pool.live == {}
    assert torch.current_stream is None


def test_the_current_stream_takes_a_block_too_and_another_device_keeps_torch_empty(
        monkeypatch, torch, allocations, pool, launch_path) -> None:
    fake, prog, xs, x, out = four_after_a_first_call(monkeypatch, torch, allocations)
    pool.taken.clear()
    current = torch._C._cuda_getCurrentRawStream(0)
    # no stream=, and the current stream's handle as stream=: a block of its pool
    assert call_program(prog, x).values() == _expected(xs)
    assert call_program(prog, x, out=out, stream=current) is out
    assert out.values() == _expected(xs)
    assert pool.taken == [(2 * SCRATCH_ALIGN, current)] * 2 and allocations == []
    # another device current in torch: the allocator would take that device's pool
    pool.taken.clear()
    pool.device = 1
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 9))] and pool.taken == []
    assert {c[5] for c in _launches(fake)} == {current, 9}
    assert pool.live == {}


def test_an_adapter_without_the_entry_points_uses_empty(torch, monkeypatch) -> None:
    """A torch without ``_cuda_cudaCachingAllocator_raw_alloc`` (the stand-in's own)."""
    adapter = TorchAdapter(torch)
    owner, ptr = adapter.scratch(64, 0, 9)
    assert owner.allocated_on == ("ext", 9) and ptr == owner.data_ptr()
    assert owner.shape == (64,) and owner.dtype.name == "uint8"


def test_the_legacy_default_streams_handle_is_the_default_streams_pool(torch, pool) -> None:
    """Handle 1 (CU_STREAM_LEGACY) is the default stream, whose pool torch keys by 0; an empty
    scratch needs no block (its pointer is null, as an empty tensor's)."""
    adapter = TorchAdapter(torch)
    torch._C._cuda_getCurrentRawStream = lambda device: 0x33
    owner, ptr = adapter.scratch(32, 0, 1)
    assert isinstance(owner, _PoolBlock) and owner.data_ptr() == ptr
    assert pool.taken == [(32, 0)]
    del owner
    gc.collect()
    assert pool.live == {} and [p for p, _ in pool.deleted] == [ptr]
    owner, ptr = adapter.scratch(0, 0, 5)
    assert not isinstance(owner, _PoolBlock) and pool.taken == [(32, 0)]


def test_the_general_path_takes_its_scratch_the_same_way(monkeypatch, torch, allocations,
                                                         pool, launch_path) -> None:
    """An input shape's first call goes through the general path (execute._temporary): its
    buffers for ``stream=`` come from the allocator too, each apart, handed back after the
    launches are queued."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    pool.fake = fake
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 5, torch.float32)
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    assert sorted(pool.taken) == [(4, 9), (20, 9)] and allocations == []
    launches = _launches(fake)
    assert {c[5] for c in launches} == {9}
    last = max(i for i, c in enumerate(fake.calls) if c[0] == "cuLaunchKernel")
    assert pool.live == {} and all(before > last for _, before in pool.deleted)


@pytest.mark.parametrize("bad", [-1, 2 ** 64, "0x10"])
def test_a_scratch_owner_whose_pointer_is_not_one_is_an_error(monkeypatch, torch, allocations,
                                                              pool, launch_path, bad) -> None:
    """The C path reads a non-tensor owner's ``data_ptr()`` by name; what it returns must be a
    pointer."""
    if launch_path == "closure":
        pytest.skip("the closure adds the offsets in Python: a value it cannot pack sends the "
                    "call to the general path")
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x, out = FakeTensor([1.0] * 4, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    call_program(prog, x)
    monkeypatch.setattr(_PoolBlock, "data_ptr", lambda self: bad)
    with pytest.raises(TypeError):
        call_program(prog, x, out=out, stream=9)
    gc.collect()
    assert pool.live == {}
