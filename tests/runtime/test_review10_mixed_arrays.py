"""Tenth review: one call mixing framework tensors (a stand-in ``torch`` over host memory) with
arrays read through ``__cuda_array_interface__`` / ``__dlpack__`` (a kernelpack
``DeviceBuffer``, a foreign producer), on the general launch path against the fake driver.

- A torch tensor after a generic array was checked against the generic adapter's dtypes:
  ``LaunchError: argument 'w' has dtype float32, expected float32``.
- Generic inputs are read before the framework's current stream is known, so their producers
  are ordered before the legacy default stream; the launch then went to torch's current stream
  (non-blocking in torch), which waited for nothing: a race with the kernel that wrote them.
"""

from __future__ import annotations

import struct
import sys
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.runtime import call_program
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor, \
    Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install, install_framework  # noqa: E402
from test_fastpath_fake import FakeDtype  # noqa: E402
from test_fastpath_fake import Tensor as TorchTensor  # noqa: E402
from test_launch_fake import _axpby_impl, _f32, axpby  # noqa: E402
from test_libcuda import needs_launch_extension, through_c  # noqa: E402,F401

TORCH_STREAM = 0x5000  # the stand-in torch's current stream (a non-blocking one in torch)


def _prod(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _torch_module(current_stream: int) -> types.ModuleType:
    mod = types.ModuleType("torch")
    mod.float32 = FakeDtype("float32", "f")
    mod.Tensor = TorchTensor
    mod.empty = lambda shape, dtype, device: TorchTensor([0.0] * _prod(shape), dtype,
                                                         tuple(shape))
    mod.empty_like = lambda t: TorchTensor([0.0] * _prod(t.shape), t.dtype, t.shape)
    mod.device = lambda kind, index: (kind, index)
    mod._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: current_stream)
    mod.cuda = types.SimpleNamespace(ExternalStream=lambda handle, device=None: ("ext", handle))
    return mod


@pytest.fixture
def torch(monkeypatch, request):
    return install_framework(monkeypatch, "torch", _torch_module(getattr(request, "param", 0)))


def _sum3(grid, block, shmem, values) -> None:
    x, y, w, o, n = values
    total = [a + b + c for a, b, c in zip(_f32(x, n), _f32(y, n), _f32(w, n))]
    import ctypes

    ctypes.memmove(o, struct.pack(f"<{n}f", *total), 4 * n)


def sum3() -> Compiled:
    """o = x + y + w: three tensor inputs, so a generic one can sit between two torch ones."""
    s = KernelSummary("sum3", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",)),
                               Tensor("w", kp.f32, ("n",)),
                               Tensor("o", kp.f32, ("n",), role="out"),
                               kp.Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("sum3", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("w"),
                                        Arg.buffer("o"), Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("m", ("sum3",), (Image("cubin", "sm_90", b"\x7fELF-sum3"),)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"sum3": ("QQQQI", _sum3),
                                                    "axpby": ("QQQfI", _axpby_impl)}))


@pytest.mark.parametrize("order", ["tgt", "gtt", "ttg", "gtg", "tgg"])
def test_torch_tensors_around_generic_arrays_are_checked_as_torch(fake, torch, order) -> None:
    """Each argument's dtype is compared with its own framework's dtype token."""
    make = {"t": lambda v: TorchTensor([v, v], torch.float32),
            "g": lambda v: HostArray([v, v])}
    args = [make[kind](float(i + 1)) for i, kind in enumerate(order)]
    for _ in range(2):  # the first call binds; the second goes through the bound program
        o = call_program(sum3(), *args)
        assert isinstance(o, TorchTensor) and o.values() == [6.0, 6.0]


def test_a_wrong_dtype_after_a_generic_array_is_still_named(fake, torch) -> None:
    x, y = TorchTensor([1.0], torch.float32), HostArray([1.0])
    w = TorchTensor([1], FakeDtype("int32", "i"))
    with pytest.raises(kp.LaunchError, match=r"argument 'w' has dtype int32, expected float32"):
        call_program(sum3(), x, y, w)


@needs_launch_extension
@pytest.mark.parametrize("torch", [TORCH_STREAM], indirect=True)
def test_generic_inputs_order_the_frameworks_current_stream(through_c, torch) -> None:
    """A DeviceBuffer written on the NULL stream, passed beside a torch tensor: the launch on
    torch's current stream must wait for the NULL stream first."""
    calls = through_c.fake.calls
    y = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 1.0)
    assert y.stream == 0
    x = TorchTensor([10.0, 20.0], torch.float32)
    before = len(calls)
    z = call_program(axpby(), x, y, 2.0)
    assert isinstance(z, TorchTensor) and z.values() == [24.0, 46.0]
    names = [c[0] for c in calls[before:]]
    assert "cuStreamWaitEvent" in names and "cuLaunchKernel" in names
    wait, launch = names.index("cuStreamWaitEvent"), names.index("cuLaunchKernel")
    assert wait < launch
    assert calls[before + wait][1] == TORCH_STREAM        # torch's stream waits ...
    record = calls[before + names.index("cuEventRecord")]
    assert record[2] == 0                                 # ... for the NULL stream
    assert calls[before + launch][5] == TORCH_STREAM      # and the kernel runs on it


@needs_launch_extension
@pytest.mark.parametrize("torch", [TORCH_STREAM], indirect=True)
def test_no_extra_wait_without_a_generic_input_or_with_stream(through_c, torch) -> None:
    """Only calls that read a generic array with a provisional stream pay for the event."""
    calls = through_c.fake.calls
    x, y = TorchTensor([1.0], torch.float32), TorchTensor([2.0], torch.float32)
    before = len(calls)
    call_program(axpby(), x, y, 1.0)
    assert "cuStreamWaitEvent" not in [c[0] for c in calls[before:]]
    before = len(calls)
    call_program(axpby(), x, HostArray([2.0]), 1.0, stream=TORCH_STREAM)  # read on its stream
    assert "cuStreamWaitEvent" not in [c[0] for c in calls[before:]]
