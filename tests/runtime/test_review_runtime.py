"""Adversarial calls through the public launch path (fake driver, host memory): every bad
argument is refused with a named error before anything is allocated or launched."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program, warmup
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    noop = lambda *a: None  # noqa: E731
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "fill": ("QI", noop)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _x(n: int = 2) -> HostArray:
    return HostArray([1.0] * n)


class _CAI:
    """A bare ``__cuda_array_interface__`` dict, as a producer may hand it out."""

    def __init__(self, **cai) -> None:
        self.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "version": 3, **cai}


def fill() -> Compiled:
    """z[i] = ... for i < n: no tensor input, so only out= (or the current device) says where."""
    s = KernelSummary("fill", (Scalar("n", kp.u32), Tensor("z", kp.f32, ("n",), role="out")),
                      (Variant((Launch("fill", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("z"), Arg.scalar("n"))),)),))
    return Compiled(s, (Module("m", ("fill",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


@pytest.mark.parametrize("value", ["2.0", "nan", b"1", bytearray(b"1")])
def test_text_is_not_a_float_scalar(fake, value) -> None:
    with pytest.raises(TypeError, match="scalar 'a' is float32; pass a number"):
        call_program(axpby(), _x(), _x(), value)
    assert not _launches(fake) and not fake.memory


def test_int_beyond_any_float_is_a_constraint_error(fake) -> None:
    with pytest.raises(ConstraintError, match="scalar 'a' = .* overflows float32"):
        call_program(axpby(), _x(), _x(), 10 ** 400)
    assert not _launches(fake)


@pytest.mark.parametrize("stream", [1.5, True, "0"])
def test_stream_of_the_wrong_type_is_refused_not_truncated(fake, stream) -> None:
    with pytest.raises(TypeError, match="stream= takes"):
        call_program(axpby(), _x(), _x(), 1.0, stream=stream)
    assert not _launches(fake) and not fake.memory


def test_stream_handle_out_of_range(fake) -> None:
    class Negative:
        cuda_stream = -3

    class Garbage:
        def __cuda_stream__(self):
            return "no"

    for stream in (-1, 1 << 64, Negative()):
        with pytest.raises(ValueError, match=r"stream=: a stream handle must be >= 0"):
            call_program(axpby(), _x(), _x(), 1.0, out=_x(), stream=stream)
    with pytest.raises(TypeError, match="__cuda_stream__ of Garbage"):
        call_program(axpby(), _x(), _x(), 1.0, stream=Garbage())
    assert not _launches(fake) and not fake.memory


def test_null_data_pointer_is_refused(fake) -> None:
    """A NULL pointer for a non-empty array would fault on the device: refused, for inputs
    and for out=; an empty array may have one."""
    null = _CAI(data=(0, False))
    with pytest.raises(LaunchError, match="argument 'x': data pointer is NULL"):
        call_program(axpby(), null, _x(), 1.0)
    with pytest.raises(LaunchError, match="argument 'z': data pointer is NULL"):
        call_program(axpby(), _x(), _x(), 1.0, out=null)
    assert not _launches(fake)
    empty = _CAI(data=(0, False), shape=(0,))
    assert call_program(axpby(), empty, empty, 1.0).shape == (0,)


def test_malformed_array_interface_is_a_launch_error(fake) -> None:
    ptr = ctypes.addressof(_x().buf)
    for cai, why in ((_CAI(data=(ptr, False), stream="abc"), "invalid literal"),
                     (_CAI(data=(ptr, False), strides=(4, 4, 4)), "3 strides for shape"),
                     (_CAI(), "'data'")):
        with pytest.raises(LaunchError, match=f"argument 'x': malformed __cuda_array_interface__ "
                                              f"\\(.*{why}"):
            call_program(axpby(), cai, _x(), 1.0)
    with pytest.raises(LaunchError, match="'y' has dtype unsupported by kernelpack, expected "
                                          "float32"):
        call_program(axpby(), _x(), HostArray([1.0, 2.0], typestr=">f4"), 1.0)  # big-endian
    assert not _launches(fake)


def test_host_dlpack_array_is_named_not_a_producer_exception(fake) -> None:
    class HostDLPack:  # NumPy's answers: a CPU device, and no stream= allowed
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            raise RuntimeError("NumPy only supports stream=None.")

    class Broken:
        def __dlpack__(self, stream=None):
            raise BufferError("cannot export")

    with pytest.raises(LaunchError, match="argument 'y' is in host memory"):
        call_program(axpby(), _x(), HostDLPack(), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x': __dlpack__\(\) failed "
                                          r"\(BufferError: cannot export\)"):
        call_program(axpby(), Broken(), _x(), 1.0)
    assert not _launches(fake)


def test_empty_out_without_a_device_from_the_inputs(fake) -> None:
    """No input says which device: out=() / {} is a count error, not IndexError/StopIteration."""
    with pytest.raises(TypeError, match=r"out= has 0 arrays, the program has 1 outputs \['z'\]"):
        call_program(fill(), 4, out=())
    with pytest.raises(TypeError, match=r"out= lacks output\(s\) \['z'\]"):
        call_program(fill(), 4, out={})
    empty = _CAI(data=(0, False), shape=(0,))
    with pytest.raises(TypeError, match="out= has 0 arrays"):
        call_program(axpby(), empty, empty, 1.0, out=())
    z = HostArray([0.0] * 4)
    assert call_program(fill(), 4, out=z) is z
    assert len(_launches(fake)) == 1


def test_out_in_host_memory_says_so(monkeypatch) -> None:
    class HostPointers(FakeDriver):
        """Inputs on device 0; the out= array's pointer is not device memory."""
        host: set = set()

        def cuPointerGetAttribute(self, attr, ptr):
            return (1, 0) if ptr in self.host else (0, 0)

    fake = install(monkeypatch, HostPointers(kernels={"axpby": ("QQQfI", _axpby_impl)}))
    z = _x()
    fake.host = {ctypes.addressof(z.buf)}
    with pytest.raises(LaunchError, match="out 'z' is in host memory"):
        call_program(axpby(), _x(), _x(), 1.0, out=z)
    assert not _launches(fake)


@pytest.mark.parametrize("devices, message", [
    ([1.5], "devices= holds 1.5"), ([True], "devices= holds True"), (["0"], "devices= holds '0'"),
    (0, "devices= takes a list"), ("01", "devices= takes a list")])
def test_warmup_device_list_is_checked(fake, devices, message) -> None:
    with pytest.raises(TypeError, match=message):
        warmup([axpby()], devices=devices)
    assert not [c for c in fake.calls if c[0] == "cuLibraryLoadData"]


def test_warmup_refuses_non_programs_and_checks_every_device_first(fake) -> None:
    with pytest.raises(TypeError, match="warmup: 5 is not a program"):
        warmup([5])
    with pytest.raises(TypeError, match="warmup takes a Pack"):
        warmup(5)
    with pytest.raises(kp.errors.DeviceError, match="CUDA device 3 does not exist"):
        warmup([axpby()], devices=[0, 3])
    assert not [c for c in fake.calls if c[0] == "cuLibraryLoadData"]
