"""Outputs for ``stream=`` on the torch fast paths (session 43), and how ``TorchAdapter``
makes another stream current around an allocation.

A call with ``stream=`` and no ``out=`` used to go to the general path on every call, because
the fast paths allocated outputs on the current stream's pool. Now they allocate each output
from that stream's pool through ``TorchAdapter.tensor_on`` (C: ``hooks.allocate(shape, dtype,
device, handle)``) and launch from the fast path. ``tensor_on`` makes the stream current with
torch's two C calls (``_cuda_getCurrentStream``, ``_cuda_setStream``) where torch has them and
its current device is the call's, else with ``with torch.cuda.stream(...)``. On CPU with the
stand-in torch and the fake driver, on the three torch launch paths."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime import arrays, call_program
from kernelpack.runtime.arrays import TorchAdapter

sys.path.insert(0, str(Path(__file__).parent))
from test_fastpath_fake import Tensor, axpby, fake, select_path, torch  # noqa: E402,F401
from test_review60_closure_mutants import general  # noqa: E402,F401


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


class Streams:
    """torch's current-stream C calls over the stand-in: ``set`` makes ``(stream_id,
    device_index, device_type)`` current (the stand-in's ``torch.current_stream``, which its
    ``torch.empty`` records as the pool it allocated from); every set is recorded."""

    def __init__(self, torch, device: int = 0) -> None:
        self.torch, self.device, self.sets = torch, device, []

    def get(self, device: int) -> tuple:
        cur = self.torch.current_stream
        return cur if isinstance(cur, tuple) and len(cur) == 3 else (0, device, 1)

    def set(self, stream_id: int, device_index: int, device_type: int) -> None:
        self.sets.append((stream_id, device_index, device_type))
        self.torch.current_stream = (None if (stream_id, device_type) == (0, 1)
                                     else (stream_id, device_index, device_type))

    def get_device(self) -> int:
        return self.device


@pytest.fixture
def streams(torch, monkeypatch) -> Streams:
    """The stand-in torch with the current-stream C calls and stream objects that carry
    torch's ids (the handle as ``stream_id``, device type 1), and a fresh process adapter."""
    s = Streams(torch)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentStream", s.get, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_setStream", s.set, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", s.get_device, raising=False)

    def external(handle, device=None):
        return types.SimpleNamespace(stream_id=handle, device_index=device[1], device_type=1)

    monkeypatch.setattr(torch.cuda, "ExternalStream", external)
    monkeypatch.setattr(arrays, "_adapters", {})
    return s


def test_tensor_on_makes_the_stream_current_around_the_allocation(torch, streams) -> None:
    adapter = TorchAdapter(torch)
    t = adapter.tensor_on((3,), torch.float32, 0, 0x77)
    assert t.allocated_on == (0x77, 0, 1) and t.shape == (3,)
    assert streams.sets == [(0x77, 0, 1), (0, 0, 1)] and torch.current_stream is None
    # the current stream: no switch at all
    streams.sets.clear()
    t = adapter.tensor_on((3,), torch.float32, 0, 0)
    assert t.allocated_on is None and streams.sets == []


def test_tensor_on_restores_the_stream_when_allocation_fails(torch, streams,
                                                             monkeypatch) -> None:
    adapter = TorchAdapter(torch)
    torch.current_stream = (0x33, 0, 1)  # inside the caller's own torch.cuda.stream(s)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x33)

    def out_of_memory(*shape, dtype, device):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(torch, "empty", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        adapter.tensor_on((3,), torch.float32, 0, 0x77)
    assert streams.sets == [(0x77, 0, 1), (0x33, 0, 1)] and torch.current_stream == (0x33, 0, 1)


def test_another_current_device_keeps_the_context_manager(torch, streams) -> None:
    """``_cuda_setStream`` would also make the stream's device current: where torch's current
    device is another one, ``with torch.cuda.stream(...)`` (which restores both) does it."""
    adapter = TorchAdapter(torch)
    streams.device = 1
    t = adapter.tensor_on((2,), torch.float32, 0, 0x77)
    assert streams.sets == [] and t.allocated_on.stream_id == 0x77


def test_stream_without_out_takes_the_fast_path(fake, torch, streams, general,
                                                launch_path) -> None:
    prog = axpby()
    x, y = Tensor([1.0, 2.0, 3.0], torch.float32), Tensor([1.0, 1.0, 1.0], torch.float32)
    call_program(prog, x, y, 2.0)  # the general path binds device 0
    call_program(prog, x, y, 2.0)  # the fast path is built
    general.clear()
    fake.calls.clear()
    for k in range(3):
        z = call_program(prog, x, y, float(k), stream=0x77)
        assert z.values() == [a * k + b for a, b in zip([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])]
        assert z.allocated_on == (0x77, 0, 1) and z.shape == (3,)
    assert general == []
    launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 3 and {c[5] for c in launches} == {0x77}
    assert torch.current_stream is None
    if launch_path.startswith("C"):
        from kernelpack.runtime.launcher import bind

        assert bind(prog).call.__self__.fast_calls == 4


def test_a_stream_of_another_device_is_still_refused(fake, torch, streams, general) -> None:
    prog = axpby()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([1.0, 1.0], torch.float32)
    call_program(prog, x, y, 2.0)
    call_program(prog, x, y, 2.0)
    general.clear()

    class OtherDevice:
        cuda_stream, device_index = 0x99, 1

    with pytest.raises(LaunchError, match="stream of device 1, the arguments are on device 0"):
        call_program(prog, x, y, 2.0, stream=OtherDevice())
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel" and c[5] == 0x99]
