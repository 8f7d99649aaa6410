"""Third review of the launch path's argument checks (fake driver, host memory): values a
caller may hand over that used to slip through or fail with the wrong exception."""

from __future__ import annotations

import ctypes
import decimal
import fractions
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


def _noop(*args) -> None:
    return None


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "ints": ("QQbQ", _noop),
                                                    "two": ("QQQI", _noop)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _x(n: int = 2) -> HostArray:
    return HostArray([1.0] * n)


def ints() -> Compiled:
    """z = x with an int8 and a uint64 scalar (both plain kernel parameters)."""
    s = KernelSummary("ints", (Tensor("x", kp.f32, ("n",)), Tensor("z", kp.f32, ("n",),
                                                                    role="out"),
                               Scalar("a", kp.i8), Scalar("b", kp.u64)),
                      (Variant((Launch("ints", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("a"),
                                        Arg.scalar("b"))),)),))
    return Compiled(s, (Module("m", ("ints",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


def two() -> Compiled:
    """Two outputs of the input's shape."""
    s = KernelSummary("two", (Tensor("x", kp.f32, ("n",)),
                              Tensor("p", kp.f32, ("n",), role="out"),
                              Tensor("q", kp.f32, ("n",), role="out"),
                              Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("two", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("p"), Arg.buffer("q"),
                                        Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("m", ("two",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


class _CAI:
    def __init__(self, **cai) -> None:
        self.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "version": 3, **cai}


@pytest.mark.parametrize("value", [10 ** 5000, -(10 ** 5000)], ids=["huge", "-huge"])
def test_an_int_too_long_to_print_is_a_constraint_error(fake, value) -> None:
    """str() of an int past 4300 digits raises ValueError: the message must not need it."""
    for kw in ({"a": value, "b": 0}, {"a": 0, "b": value}):
        with pytest.raises(ConstraintError, match=r"scalar '[ab]' = an int of 16610 bits"):
            call_program(ints(), _x(), **kw)
    assert not _launches(fake) and not fake.memory
    with pytest.raises(ConstraintError, match=r"scalar 'a' = 128 does not fit int8"):
        call_program(ints(), _x(), 128, 0)  # short ints keep their digits


@pytest.mark.parametrize("stream", [decimal.Decimal("1.5"), fractions.Fraction(1, 1)])
def test_stream_of_a_non_integral_number_is_refused(fake, stream) -> None:
    with pytest.raises(TypeError, match="stream= takes"):
        call_program(axpby(), _x(), _x(), 1.0, out=_x(), stream=stream)
    assert not _launches(fake)


def test_stream_of_numpy_float_or_bool_is_refused_not_truncated(fake) -> None:
    np = pytest.importorskip("numpy")
    for stream in (np.float32(1.0), np.float16(3.0), np.bool_(True)):
        with pytest.raises(TypeError, match="stream= takes"):
            call_program(axpby(), _x(), _x(), 1.0, out=_x(), stream=stream)
    assert not _launches(fake)
    call_program(axpby(), _x(), _x(), 1.0, out=_x(), stream=np.int64(7))  # an integer: fine
    assert _launches(fake)[-1][5] == 7


@pytest.mark.parametrize("ptr", [-8, 1 << 64, 1 << 70])
def test_array_interface_pointer_outside_the_address_space(fake, ptr) -> None:
    """Refused while reading the argument (naming it), not after allocating the outputs as
    "an argument of axpby does not fit its parameter"."""
    with pytest.raises(LaunchError, match=r"argument 'x': malformed __cuda_array_interface__ "
                                          r"\(data pointer .* is not an address\)"):
        call_program(axpby(), _CAI(data=(ptr, False)), _x(), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'z': malformed"):
        call_program(axpby(), _x(), _x(), 1.0, out=_CAI(data=(ptr, False)))
    assert not _launches(fake) and not fake.memory


def test_masked_array_interface_is_refused(fake) -> None:
    x = _x()
    masked = _CAI(data=(ctypes.addressof(x.buf), False), mask=_x())
    with pytest.raises(LaunchError, match=r"argument 'x': malformed .*masked arrays"):
        call_program(axpby(), masked, _x(), 1.0)
    assert not _launches(fake) and not fake.memory
    unmasked = _CAI(data=(ctypes.addressof(x.buf), False), mask=None)
    assert call_program(axpby(), unmasked, _x(), 1.0).shape == (2,)


def test_read_only_out_is_refused(fake) -> None:
    z = _x()
    read_only = _CAI(data=(ctypes.addressof(z.buf), True))
    with pytest.raises(LaunchError, match=r"out 'z' is read-only"):
        call_program(axpby(), _x(), _x(), 1.0, out=read_only)
    assert not _launches(fake) and z.values() == [1.0, 1.0]
    # a read-only *input* is only read: fine
    x = _x()
    assert call_program(axpby(), _CAI(data=(ctypes.addressof(x.buf), True)), _x(), 2.0,
                        out=z) is z
    assert z.values() == [3.0, 3.0]


def test_overlapping_outputs_are_refused(fake) -> None:
    z = HostArray([0.0] * 3)  # (2,)-shaped views into it below
    base = ctypes.addressof(z.buf)
    whole = _CAI(data=(base, False))
    with pytest.raises(LaunchError, match=r"out 'p' and out 'q' overlap in memory"):
        call_program(two(), _x(), out=(whole, whole))
    shifted = _CAI(data=(base + 4, False))  # z's elements 1..2: overlaps z[0..1] at element 1
    front = _CAI(data=(base, False))
    with pytest.raises(LaunchError, match=r"overlap in memory"):
        call_program(two(), _x(), out={"p": shifted, "q": front})
    assert not _launches(fake)
    p, q = _x(), _x()
    assert call_program(two(), _x(), out=(p, q)) == (p, q)
    empty = HostArray([], shape=(0,))
    assert call_program(two(), empty, out=(empty, empty)) == (empty, empty)  # no bytes: fine
    assert len(_launches(fake)) == 1


def copy_of(dtype: kp.DType) -> Compiled:
    s = KernelSummary("cp", (Tensor("x", dtype, ("n",)), Tensor("z", dtype, ("n",), role="out")),
                      (Variant((Launch("cp", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"))),)),))
    return Compiled(s, (Module("m", ("cp",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


def test_bfloat16_device_buffer_goes_back_in(monkeypatch) -> None:
    """A bfloat16 output (a DeviceBuffer, whose __cuda_array_interface__ can only say '<V2')
    is read through its DLPack export, as an input and as out=, instead of being refused as
    'dtype unsupported by kernelpack'."""
    from kernelpack.runtime.buffer import DeviceBuffer

    fake = install(monkeypatch, FakeDriver(kernels={"cp": ("QQ", _noop)}))
    x = DeviceBuffer.empty((3,), kp.bf16, 0)
    y = call_program(copy_of(kp.bf16), x)
    assert isinstance(y, DeviceBuffer) and y.dtype is kp.bf16 and y.shape == (3,)
    assert call_program(copy_of(kp.bf16), y, out=x) is x
    assert [c[6] for c in _launches(fake)] == [(x.ptr, y.ptr), (y.ptr, x.ptr)]
    with pytest.raises(LaunchError, match="argument 'x' has dtype bfloat16, expected float16"):
        call_program(copy_of(kp.f16), x)
    with pytest.raises(LaunchError, match="has dtype unsupported by kernelpack"):  # no DLPack
        call_program(copy_of(kp.bf16), HostArray([0, 0], fmt="H", typestr="<V2"))
