"""``TorchAdapter.empty`` for another stream than the current one: the array comes from that
stream's pool (inside ``with torch.cuda.stream(target)``), and torch's object for a raw handle
is made once per (handle, device) and remembered (session 42: an ``ExternalStream`` per call
was ~5 µs of a fast call with scratch and ``stream=``, ~20 µs of the general path's). With the stand-in torch."""

from __future__ import annotations

import sys
from pathlib import Path

from kernelpack.dtypes import float32, uint8
from kernelpack.runtime.arrays import STREAM_OBJECTS_KEPT, TorchAdapter

sys.path.insert(0, str(Path(__file__).parent))
from test_fastpath_fake import Tensor, torch  # noqa: E402,F401


def _counting_external_streams(torch, monkeypatch) -> list:
    made: list = []

    def external(handle, device=None):
        made.append((handle, device))
        return ("ext", handle, device)

    monkeypatch.setattr(torch.cuda, "ExternalStream", external)
    return made


def test_a_handles_stream_object_is_made_once_per_device(torch, monkeypatch) -> None:
    made = _counting_external_streams(torch, monkeypatch)
    adapter = TorchAdapter(torch)
    for _ in range(3):
        t, _ptr = adapter.empty((4,), float32, 0, 0x77)
        assert t.allocated_on == ("ext", 0x77, ("cuda", 0))
    t, _ptr = adapter.empty((2,), uint8, 1, 0x77)  # the same handle on another device
    assert t.allocated_on == ("ext", 0x77, ("cuda", 1))
    assert made == [(0x77, ("cuda", 0)), (0x77, ("cuda", 1))]


def test_the_current_stream_and_the_default_stream_need_no_external_stream(
        torch, monkeypatch) -> None:
    made = _counting_external_streams(torch, monkeypatch)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x33)
    adapter = TorchAdapter(torch)
    t, _ = adapter.empty((4,), float32, 0, 0x33)  # the current stream: its own pool
    assert t.allocated_on is None
    for handle in (0, 1, 0):  # the default stream under both names, while 0x33 is current
        t, _ = adapter.empty((4,), float32, 0, handle)
        assert t.allocated_on == ("default", ("cuda", 0))
    assert made == []


def test_stream_objects_kept_are_bounded(torch, monkeypatch) -> None:
    made = _counting_external_streams(torch, monkeypatch)
    adapter = TorchAdapter(torch)
    handles = range(0x1000, 0x1000 + STREAM_OBJECTS_KEPT + 5)
    for handle in handles:
        adapter.empty((1,), float32, 0, handle)
    assert len(made) == len(handles)
    assert len(adapter._stream_objects) <= STREAM_OBJECTS_KEPT
    t, _ = adapter.empty((1,), float32, 0, handles[-1])  # a recent one: still remembered
    assert t.allocated_on == ("ext", handles[-1], ("cuda", 0)) and len(made) == len(handles)


def test_the_fast_path_allocates_through_the_general_paths_adapter(torch, monkeypatch) -> None:
    """One TorchAdapter per process (arrays.torch_adapter): the torch fast path's scratch for
    ``stream=`` and the general path's allocations share its stream objects."""
    from kernelpack.runtime import arrays

    monkeypatch.setattr(arrays, "_adapters", {})
    shared = arrays.torch_adapter(torch)
    assert arrays.torch_adapter(torch) is shared
    assert arrays.adapter_for(torch.Tensor([1.0], torch.float32)) is shared
    monkeypatch.setattr(arrays, "_adapters", {})
    general = arrays.adapter_for(torch.Tensor([1.0], torch.float32))  # the general path first
    assert arrays.torch_adapter(torch) is general


def test_both_paths_make_a_streams_object_once(torch, monkeypatch) -> None:
    """A fast call with scratch and ``stream=`` (out=), one without out= (its output from
    that stream's pool too, the fast path's since session 43) and a general one (a new shape)
    on the same stream: one ExternalStream for all."""
    from fake_driver import FakeDriver, install
    from test_fast_scratch import KERNELS, _expected, _program

    from kernelpack.runtime import call_program

    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    made = _counting_external_streams(torch, monkeypatch)
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = Tensor(xs, torch.float32), Tensor([0.0] * 4, torch.float32)
    call_program(prog, x)
    call_program(prog, x)  # the fast path built
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    assert call_program(prog, x, stream=9).values() == _expected(xs)
    wide = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert call_program(prog, Tensor(wide, torch.float32), stream=9).values() == _expected(wide)
    assert made == [(9, ("cuda", 0))]
