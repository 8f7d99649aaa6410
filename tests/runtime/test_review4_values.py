"""Review 4 of the launch path's argument reading (fake driver, host memory): array shapes
and strides that are not integers, DLPack capsules that describe no address, and float
scalars at the edge of their parameter's range (NumPy's round-to-nearest casting)."""

from __future__ import annotations

import ctypes
import decimal
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.dlpack import (KDL_CUDA, _DLDataType, _DLDevice, _DLManagedTensor,
                                       _api)
from kernelpack.runtime.scalars import convert_scalar

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _x(n: int = 2) -> HostArray:
    return HostArray([1.0] * n)


class _CAI:
    def __init__(self, x: HostArray, **cai) -> None:
        self.keep = x
        self.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "version": 3,
                                         "data": (ctypes.addressof(x.buf), False), **cai}


# ---- __cuda_array_interface__: shapes and strides by __index__ ------------------------------
@pytest.mark.parametrize("field, cai, shown", [
    ("shape", {"shape": (2.5,)}, r"shape\[0\] is float 2\.5"),
    ("shape", {"shape": (2.0,)}, r"shape\[0\] is float 2\.0"),
    ("strides", {"strides": (4.0,)}, r"strides\[0\] is float 4\.0"),
    ("data", {"data": (None, False), "shape": (0.5,)}, r"shape\[0\] is float 0\.5"),
])
def test_array_interface_non_integer_entries_are_refused(fake, field, cai, shown) -> None:
    x = _x()
    with pytest.raises(LaunchError, match=r"argument 'x': malformed __cuda_array_interface__ "
                                          r"\(" + shown + ", not an integer\\)"):
        call_program(axpby(), _CAI(x, **cai), _x(), 1.0)
    assert not _launches(fake) and not fake.memory


def test_array_interface_float_pointer_and_stream_are_refused(fake) -> None:
    x = _x()
    with pytest.raises(LaunchError, match=r"argument 'x': .*data pointer is float"):
        call_program(axpby(), _CAI(x, data=(float(ctypes.addressof(x.buf)), False)), _x(), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'x': .*stream is float"):
        call_program(axpby(), _CAI(x, stream=7.0), _x(), 1.0)
    assert not _launches(fake)


def test_array_interface_integer_likes_still_work(fake) -> None:
    np = pytest.importorskip("numpy")
    x = _x()
    cai = _CAI(x, shape=(np.int64(2),), strides=(np.int32(4),))
    z = call_program(axpby(), cai, _x(), 2.0)
    assert z.shape == (2,) and list(struct.unpack("<2f", z.copy_to_host())) == [3.0, 3.0]


# ---- DLPack capsules that describe no address -----------------------------------------------
class _Capsule:
    """A producer whose ``__dlpack__`` returns a hand-made (possibly hostile) capsule."""

    def __init__(self, data: int, byte_offset: int, null_shape: bool = False) -> None:
        self.shape = (ctypes.c_int64 * 1)(2)
        self.managed = _DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = data or None
        t.device = _DLDevice(KDL_CUDA, 0)
        t.ndim = 1
        t.dtype = _DLDataType(2, 32, 1)
        if not null_shape:
            t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, 0)

    def __dlpack__(self, stream=None):  # noqa: ANN001
        return _api.PyCapsule_New(ctypes.addressof(self.managed), b"dltensor", None)


@pytest.mark.parametrize("data, offset", [((1 << 64) - 16, 32), (1 << 63, 1 << 63),
                                          (0x1000, (1 << 64) - 1)])
def test_dlpack_pointer_plus_offset_past_the_address_space(fake, data, offset) -> None:
    with pytest.raises(LaunchError, match=r"argument 'x': DLPack data pointer .* \+ "
                                          r"byte_offset .* is not an address"):
        call_program(axpby(), _Capsule(data, offset), _x(), 1.0)
    with pytest.raises(LaunchError, match=r"argument 'z': DLPack data pointer"):
        call_program(axpby(), _x(), _x(), 1.0, out=_Capsule(data, offset))
    assert not _launches(fake)


def test_dlpack_null_shape_is_a_launch_error(fake) -> None:
    with pytest.raises(LaunchError, match=r"argument 'x': DLPack tensor of ndim 1 has a NULL "
                                          r"shape"):
        call_program(axpby(), _Capsule(0x1000, 0, null_shape=True), _x(), 1.0)
    assert not _launches(fake)


def test_dlpack_offset_within_the_address_space_is_kept(fake) -> None:
    from kernelpack.runtime.dlpack import read_capsule

    producer = _Capsule(0x1000, 0x20)  # owns the struct the capsule points at
    view = read_capsule(producer.__dlpack__(), "x")
    assert view.ptr == 0x1020 and view.shape == (2,) and view.dtype is kp.f32


# ---- float scalars: NumPy's casting ------------------------------------------------------------
def _conv(value, dtype):  # noqa: ANN001, ANN202
    return convert_scalar(value, dtype, None, "a", "prog")


@pytest.mark.parametrize("dtype", [kp.f64, kp.f32, kp.f16])
def test_longdouble_beyond_float64_is_refused_not_inf(dtype) -> None:
    np = pytest.importorskip("numpy")
    for value in (np.longdouble("1e400"), np.longdouble("-1e400"), decimal.Decimal("1e400")):
        with pytest.raises(ConstraintError, match=rf"prog: scalar 'a' = -?1[eE]\+?400 "
                                                  rf"\((longdouble|Decimal)\) overflows {dtype}"):
            _conv(value, dtype)
    # A real infinity stays one, and a longdouble in range converts.
    assert _conv(np.longdouble("inf"), kp.f64) == float("inf")
    assert _conv(decimal.Decimal("-Infinity"), kp.f64) == float("-inf")
    assert _conv(np.longdouble("1.5"), dtype) == 1.5


@pytest.mark.parametrize("dtype, npname, below, at", [
    (kp.f16, "float16", 65519.0, 65520.0),
    (kp.f32, "float32", 3.4028235677973362e38, 3.4028235677973366e38),
])
def test_narrow_floats_round_to_nearest_like_numpy(dtype, npname, below, at) -> None:
    np = pytest.importorskip("numpy")
    finfo_max = float(np.finfo(npname).max)
    for sign in (1.0, -1.0):
        assert float(np.dtype(npname).type(sign * below)) == sign * finfo_max  # NumPy: finite
        assert _conv(sign * below, dtype) == sign * below  # packed by struct: rounds down
        with pytest.raises(ConstraintError, match=rf"scalar 'a' = .* overflows {dtype}"):
            _conv(sign * at, dtype)                   # NumPy: inf (with a warning)
    code = {"float16": "<e", "float32": "<f"}[npname]
    assert struct.unpack(code, struct.pack(code, below))[0] == finfo_max


def test_bfloat16_rounds_to_nearest_at_the_top() -> None:
    assert _conv(3.3961e38, kp.bf16) == 0x7F7F            # rounds down to the largest finite
    assert _conv(-3.3961e38, kp.bf16) == 0xFF7F
    for v in (3.3962e38, 3.4028235e38, 1e39):
        with pytest.raises(ConstraintError, match="overflows bfloat16"):
            _conv(v, kp.bf16)
    assert _conv(float("inf"), kp.bf16) == 0x7F80


def test_float32_scalar_just_above_max_launches(fake) -> None:
    """3.4028235e38 (the usual spelling of FLT_MAX) rounds to FLT_MAX: the C fast path's
    ``(float)x`` accepts it, so the general path must too."""
    z = call_program(axpby(), _x(), HostArray([0.0, 0.0]), 3.4028235e38)
    assert struct.unpack("<2f", z.copy_to_host())[0] == struct.unpack(
        "<f", struct.pack("<f", 3.4028235e38))[0]
    np = pytest.importorskip("numpy")
    with pytest.raises(ConstraintError, match=r"scalar .* overflows float32"):
        call_program(axpby(), _x(), _x(), np.longdouble("1e400"))
    assert len(_launches(fake)) == 1
