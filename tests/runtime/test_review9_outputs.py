"""Ninth review of ``out=`` and scalars on the general launch path (fake driver, host memory):
an ``out=`` that decides the device is read with the call's stream and under its output's
name, an ``out=`` that partially overlaps an input is refused (the very same array is
in-place use, allowed), NumPy complex/timedelta/datetime scalars are refused for a float
parameter, and the fast path's parameter blocks make no ctypes array types."""

from __future__ import annotations

import ctypes
import gc
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.fastpath import ThreadState
from kernelpack.runtime.scalars import convert_scalar
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor, \
    Variant, Scalar

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_review3_arguments import two  # noqa: E402
from test_review8_dlpack_producers import Producer  # noqa: E402
from test_review9_arguments import _fill, filled  # noqa: E402


def _widen_impl(grid, block, shmem, v) -> None:
    x, z, n = v
    xs = struct.unpack(f"<{n}f", ctypes.string_at(x, 4 * n))
    ctypes.memmove(z, struct.pack(f"<{n}d", *xs), 8 * n)


def _two_impl(grid, block, shmem, v) -> None:
    x, p, q, n = v
    ctypes.memmove(p, ctypes.string_at(x, 4 * n), 4 * n)
    ctypes.memmove(q, ctypes.string_at(x, 4 * n), 4 * n)


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "fill": ("Qi", _fill),
                                                    "widen": ("QQI", _widen_impl),
                                                    "two": ("QQQI", _two_impl)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def widen() -> Compiled:
    """z (float64) = x (float32): an output twice the input's size in bytes."""
    s = KernelSummary("widen", (Tensor("x", kp.f32, ("n",)),
                                Tensor("z", kp.f64, ("n",), role="out"),
                                Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("widen", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("m", ("widen",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


class _View:
    """``__cuda_array_interface__`` over ``n`` elements of ``base``'s memory, ``offset`` bytes
    in (a view such as ``x[1:]`` of another array)."""

    def __init__(self, base: HostArray, offset: int, n: int, typestr: str = "<f4") -> None:
        self.base = base
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "version": 3,
                                         "data": (ctypes.addressof(base.buf) + offset, False)}


# ---- out= deciding the device: the call's stream, the output's name ---------------------------
def test_out_deciding_the_device_is_read_with_the_calls_stream(fake) -> None:
    """It was read for stream 0 (DLPack: 1) to find the device, then again for stream 5 as
    the output: two exports of one array in one call, [1, 5]."""
    z = Producer([0.0] * 4)
    assert call_program(filled(), 3, out=z, stream=5) is z
    assert z.streams == [5] and len(z.capsules) == 1 and len(z.deleted) == 1
    assert z.values() == list(struct.unpack("<4f", b"\x01" * 16))
    (launch,) = _launches(fake)
    assert 5 in launch[1:]  # queued on the caller's stream


@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: (a,), lambda a: {"z": a}],
                         ids=["array", "tuple", "dict"])
def test_out_deciding_the_device_is_named_as_its_output(fake, wrap) -> None:
    """A message named the parameter "out", which the program does not have."""
    buf = HostArray([0.0] * 6)
    with pytest.raises(LaunchError, match=r"^argument 'z': data pointer 0x[0-9a-f]+ is not a "
                                          r"multiple of 4"):
        call_program(filled(), 3, out=wrap(_View(buf, 2, 4)))
    assert not _launches(fake)


# ---- out= overlapping an input ------------------------------------------------------------------
def test_exact_in_place_out_is_allowed(fake) -> None:
    """out= the very same array as an input: a program that reads each element before
    writing it (axpby) is defined."""
    x, y = HostArray([1.0, 2.0, 3.0]), HostArray([10.0, 20.0, 30.0])
    assert call_program(axpby(), x, y, 2.0, out=x) is x
    assert x.values() == [12.0, 24.0, 36.0]
    same_y = _View(y, 0, 3)  # another object over exactly y's memory
    assert call_program(axpby(), x, y, 1.0, out=same_y) is same_y
    assert y.values() == [22.0, 44.0, 66.0]
    assert len(_launches(fake)) == 2


@pytest.mark.parametrize("offset", [4, -4, 8], ids=["out-after-x", "out-before-x", "out-2-in"])
def test_partial_overlap_with_an_input_is_refused(fake, offset) -> None:
    """Out shifted against an input by whole elements: it ran, and threads writing z[i]
    raced with threads still reading x[i+1] (a result that depends on scheduling)."""
    mem = HostArray([float(i) for i in range(12)])
    x, y = _View(mem, 16, 4), HostArray([0.0] * 4)
    before = mem.values()
    with pytest.raises(LaunchError, match=r"^axpby: out 'z' partially overlaps argument 'x' in "
                                          r"memory \(out 16 bytes at 0x[0-9a-f]+, 'x' 16 bytes "
                                          r"at 0x[0-9a-f]+\); pass a separate array, or the "
                                          r"very same array as 'x' for in-place use$"):
        call_program(axpby(), x, y, 2.0, out=_View(mem, 16 + offset, 4))
    assert not _launches(fake) and mem.values() == before


def test_same_start_but_another_size_is_refused(fake) -> None:
    """Same address, not the same array: float64 z over float32 x's bytes and beyond."""
    mem = HostArray([1.0, 2.0, 0.0, 0.0])
    x = _View(mem, 0, 2)
    with pytest.raises(LaunchError, match=r"out 'z' partially overlaps argument 'x'.*\(out 16 "
                                          r"bytes at (0x[0-9a-f]+), 'x' 8 bytes at \1\)"):
        call_program(widen(), x, out=_View(mem, 0, 2, "<f8"))
    assert not _launches(fake)


def test_adjacent_and_empty_arrays_do_not_overlap(fake) -> None:
    mem = HostArray([1.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    z = _View(mem, 8, 2, "<f8")  # starts where x ends
    assert call_program(widen(), _View(mem, 0, 2), out=z) is z
    assert struct.unpack("<2d", mem.buf.raw[8:24]) == (1.0, 2.0)
    empty = HostArray([], shape=(0,))
    assert call_program(axpby(), empty, empty, 1.0, out=empty) is empty  # no bytes
    assert len(_launches(fake)) == 1  # an empty grid launches nothing


def test_each_output_is_checked_against_each_input(fake) -> None:
    """The second output of two, through a dict, overlapping the one input."""
    mem = HostArray([1.0, 2.0, 3.0])
    x, p = _View(mem, 0, 2), HostArray([0.0, 0.0])
    with pytest.raises(LaunchError, match=r"^two: out 'q' partially overlaps argument 'x'"):
        call_program(two(), x, out={"p": p, "q": _View(mem, 4, 2)})
    with pytest.raises(LaunchError, match=r"^two: out 'q' partially overlaps argument 'x'"):
        call_program(two(), x, out=(p, _View(mem, 4, 2)))
    assert not _launches(fake) and p.values() == [0.0, 0.0]
    q = _View(mem, 0, 2)  # exactly x: in place, but its kernel stores p too (in_place.py),
    call_program(two(), x, out=(p, q))  # so x is read from a copy
    assert _launches(fake) and mem.values() == [1.0, 2.0, 3.0] and p.values() == [1.0, 2.0]
    assert [c[2:4] for c in fake.calls if c[0] == "cuMemcpyDtoDAsync"] == [
        (ctypes.addressof(mem.buf), 8)]


def test_dlpack_out_overlapping_an_input_is_refused(fake) -> None:
    """A DLPack producer's view (``byte_offset``) one element into the memory of an input."""
    z = Producer([0.0, 0.0, 0.0], byte_offset=4, shape=(2,))
    x = _View_of_producer(z)
    with pytest.raises(LaunchError, match=r"out 'z' partially overlaps argument 'x'"):
        call_program(axpby(), x, HostArray([1.0, 1.0]), 1.0, out=z)
    assert not _launches(fake)
    assert len(z.capsules) == 1 and len(z.deleted) == 1  # released after the refusal


class _View_of_producer:  # noqa: N801 - named for what it is
    """``__cuda_array_interface__`` over the first 2 float32 of a Producer's buffer."""

    def __init__(self, p: Producer) -> None:
        self.p = p
        self.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "version": 3,
                                         "data": (ctypes.addressof(p.buf), False)}


# ---- scalars that are no real number ------------------------------------------------------------
@pytest.mark.parametrize("value", [np.complex128(1 + 2j), np.complex64(3), np.array(1 + 2j),
                                   np.timedelta64(3), np.timedelta64(3, "s"),
                                   np.datetime64("2020-01-01")],
                         ids=["complex128", "complex64", "0d-complex", "timedelta",
                              "timedelta-s", "datetime"])
@pytest.mark.parametrize("dtype", [kp.f32, kp.f64, kp.f16, kp.bf16], ids=str)
def test_numpy_complex_and_time_scalars_are_refused_for_floats(value, dtype) -> None:
    """np.complex128(1+2j) became 1.0 (NumPy's ComplexWarning only), np.timedelta64(3) 3.0;
    a Python complex was a TypeError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning either: refused before float()
        with pytest.raises(TypeError, match=rf"^p: scalar 'a' is {dtype}; pass a number \(got "
                                            rf"{type(value).__name__}\)$"):
            convert_scalar(value, dtype, None, "a", "p")
    with pytest.raises(TypeError, match=rf"^p: scalar 'a' is {dtype}; pass a number \(got "
                                        rf"complex\)$"):
        convert_scalar(1 + 2j, dtype, None, "a", "p")  # the wording matched
    assert convert_scalar(np.float32(1.5), dtype, None, "a", "p") in (1.5, 0x3FC0)


def test_numpy_complex_scalar_is_refused_by_a_call(fake) -> None:
    with pytest.raises(TypeError, match=r"^axpby: scalar 'a' is float32; pass a number \(got "
                                        r"complex128\)$"):
        call_program(axpby(), HostArray([1.0]), HostArray([1.0]), np.complex128(1 + 2j))
    assert not _launches(fake)


# ---- the fast path's parameter blocks -----------------------------------------------------------
def _array_types(length: int) -> list:
    # type(o), not isinstance(o, type): gc lists weakref proxies too, and isinstance asks a
    # proxy's __class__, a ReferenceError once its referent is gone (the flake of notes/flaky)
    return [o for o in gc.get_objects() if issubclass(type(o), type)
            and issubclass(o, ctypes.Array) and getattr(o, "_length_", None) == length]


def test_thread_state_makes_no_ctypes_array_type() -> None:
    """ctypes.create_string_buffer(n) made a ``c_char * n`` type for each new block size
    (20-50 µs of a thread's first call), and ``c_void_p * k`` for each pointer count."""
    size, offsets = 77_773, [0, 8, 77_765]  # sizes no one else uses
    assert not _array_types(size)
    ts = ThreadState([(size, offsets), (3, []), (0, [])])
    assert not _array_types(size)
    # the kernelParams array points at each slot of the block the closure packs into
    block = ts.bufs[0]
    struct.pack_into("<QQQ", block, 0, 11, 0, 0)
    struct.pack_into("<Q", block, 8, 22)
    struct.pack_into("<Q", block, 77_765, 33)
    ptrs = struct.unpack("@3P", ctypes.string_at(ts.addrs[0], 3 * struct.calcsize("@P")))
    assert [struct.unpack("<Q", ctypes.string_at(p, 8))[0] for p in ptrs] == [11, 22, 33]
    assert ts.addrs[1] == 0 and ts.addrs[2] == 0  # no parameters: NULL kernelParams
    with pytest.raises(BufferError):  # exported: never moved under the driver
        block.extend(b"x")
