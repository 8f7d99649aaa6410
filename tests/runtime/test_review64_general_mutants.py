"""Review 64a: tests that kill mutants of the general call path which survived the suite.

A throw-away mutator (outside the repo, on a copy of the whole tree at 1e691f3 with the built
``_launch`` extension copied in, pytest run there with PYTHONPATH at the copy's ``src/``, one
mutant at a time, restored after each) changed the CPU-reachable parts of the general path:
launcher.py, execute.py, binding.py, arrays.py, aliasing.py, scalars.py, dlpack.py and
buffer.py (the fast paths, selection.py, the C code and in_place.py were reviewed before and
left out). 300 mutants ran: 240 written by hand against the rules users meet (L* launcher,
E* execute, B* binding, A* aliasing, S* scalars, D* dlpack, F* buffer, R* arrays: dtype,
device, contiguity and read-only checks and their messages, ``out=`` checks, scalar ranges
and conversions, bfloat16 rounding, aliasing between ``out=``/``inout`` and inputs,
``__cuda_array_interface__`` and DLPack parsing (strides, byte offsets, read-only and copy
flags, versions, device types, lanes), DLPack export and deleters, DeviceBuffer ownership,
allocation and freeing contexts, slot widths and alignment, computed scalars and value
arguments shared by launches, zero-fills, scratch, stream handles and orderings), and 60
generated ones sampled (seed 64) from 1036 sites (G*: flipped comparisons, and/or swapped,
negated conditions, dropped raises, int constants off by one, swapped call arguments).

Each mutant first ran the files whose tests execute its lines (a line tracer over the CPU
runtime tier: every non-GPU file of tests/runtime plus test_review47_mutants,
test_first_call_cost, test_review9_first_call_cold, test_cli_in_place and test_import), then
its survivors ran the files a tracer cannot follow (subprocesses, forks, their own trace
functions: test_review10_dlpack_export, test_lazy_import, test_libcuda,
test_review11_multidevice_threads, test_review43_runtime_read, test_review58_fastcall_mutants,
test_review62_pool_blocks, test_review7_processes_threads, test_review9_first_call_cold,
test_import); the survivors judged equivalent also ran the slow files that reach their lines
(test_review29_server, test_review44/46_changes, test_review30_longrun, lowering/
test_kernel_buffers, lowering/test_review48_in_place). 214 were killed by the suite (164 hand,
50 generated; D12 and G57 by a crash of the test process; L30, D26, G12 and G31 only by the
second set of files). 63 are killed here (58 hand, 5 generated; each test names its
mutants): the gaps were error paths no test reached (malformed interfaces and capsules,
ndim/negative dims/lanes/versions, a failing ``__dlpack_device__``, the oldest producers),
the exports of DeviceBuffer (bool, 2-D strides, device id, typestr, copy/dl_device refusals,
empty buffers, contexts of allocation, copy and free), calls whose device or stream comes from
``out=`` alone, slot widths of 1- and 2-byte scalars and the alignment of the pointer array,
bfloat16 ties and NaNs, and a computed scalar passed by two launches.

Equivalent survivors (23). Hand-written: L13 (the read-only check also for torch/CuPy
inputs: ``readonly_why`` reads held DLPack views, which only generic reads make, and
``__cuda_array_interface__``'s ``data[1]``, which torch and CuPy always export False); L15
(the planner given the caller's scalar objects instead of the converted ints: ``plan_shapes``
indexes integer scalars itself, so every value ``convert_scalar`` accepts (an int, a NumPy
integer or bool, an ``__index__`` object) plans the same, its cache key equal to the int's or
a miss); L28 (a ``_bound`` entry matched by id alone) and L29 (the weakref callback removing
whatever entry its id holds): the callback runs while the program is freed, before its id
can be reused, and where weak references are refused the entry keeps the program alive; L35
(``written`` without ``is_tensor``): scalar InputSpecs are made with ``written=False``; E21
(the range check by ``pack`` before anything is queued dropped): every value reaching a slot
is checked before (caller scalars by ``convert_scalar``, computed scalars and value arguments
by the planner: a computed int32 of 2**32 is its ConstraintError, pointers below 2**64 by the
readers), so that check is defence in depth nothing reaches; E23 (a new parameter block per
launch): the same bytes in new memory (the fast paths make blocks of their own); B09 (a
non-NULL ``kernelParams`` for a kernel without parameters): the driver reads one entry per
parameter, none; B13 (``nvals`` from the variant with the fewest fills): the fills are stored
by a slice assignment, which grows the list as needed; B14 (a computed scalar's fill slot
made again at each use): the copies hold the same value and every argument reads the first;
S17 (a float subclass such as ``np.float64`` kept as it is instead of ``float()``) and S20
(an int subclass such as bool or IntEnum kept as it is): the same number, range-checked and
packed alike; D18 (a held DLPack view reused whatever stream it was read for): within a call
one object is read with two streams only when a generic DLPack input is also ``out=`` beside a
torch input, and that call orders the legacy stream before torch's itself (``foreign``);
D31 (``acc *= dim`` in exported strides): differs only for arrays with a 0 dim, whose strides
address no element; D32 (a view's deleter called without its managed address): every view
``read_capsule`` makes has the capsule's nonzero address; F13 and its generated twin G56
(``DeviceBuffer.__del__`` freeing an unowned buffer): the only unowned DeviceBuffer is an
empty one, of pointer 0; F20 (``buffer._on`` always pushes): pushing the context already
current and popping it leaves it current; F22 (``count *= d + 0``): a no-op written by
mistake. Generated: G30 (``check_disjoint_outputs`` for one ``out=`` array: one span overlaps
nothing), G33 (a new view's ``stream`` 1: ``read_array`` sets it before the view has facts, and
a view without facts is never reused), G45 (``max(ndim, 1)`` as ``max(1, ndim)``), G53
(``_f32.pack`` tried for every finite float32 value: one that does not round to inf packs).

No real bug found. No GPU; the file runs in about a second.
"""

from __future__ import annotations

import ctypes
import gc
import math
import struct
import sys
import types
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import arrays, buffer, call_program, dlpack
from kernelpack.runtime.arrays import GENERIC, stream_device, stream_handle
from kernelpack.runtime.buffer import DeviceBuffer, typestr
from kernelpack.runtime.launcher import bind
from kernelpack.runtime.scalars import convert_scalar
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_exchange import DLDataType, DLDevice, DLTensor  # noqa: E402
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_fastpath_fake import NDArray, _install_cupy, make_torch  # noqa: E402
from test_fastpath_fake import Tensor as TorchTensor  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_review8_dlpack_producers import (_DELETER, _Managed, _new, _Version,  # noqa: E402
                                           _Versioned)


# ---- programs and arrays ------------------------------------------------------------------
def _program(name: str, params: tuple, launches: tuple) -> Compiled:
    """A program over fake machine code (one module "m" holding every launch's entry)."""
    entries = tuple(dict.fromkeys(launch.kernel for launch in launches))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-" + name.encode(), "fake", 13000)
    return Compiled(KernelSummary(name, params, (Variant(launches),)),
                    (Module("m", entries, (img,)),))


def fill_k() -> Compiled:
    """Only a scalar in, an output of ``k`` floats out: nothing but ``out=`` says a device."""
    return _program("fill_k", (Scalar("k", kp.i32), Tensor("z", kp.f32, ("k",), role="out")),
                    (Launch("fill", "m", (kp.cdiv("k", 128),), (128,),
                            (Arg.buffer("z"), Arg.scalar("k"))),))


def two_dims() -> Compiled:
    """``x`` of ``n`` and ``y`` of ``m`` floats (``y`` may be empty), ``z`` like ``x``."""
    return _program("two_dims", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("m",)),
                                 Tensor("z", kp.f32, ("n",), role="out")),
                    (Launch("three", "m", (kp.cdiv("n", 128),), (128,),
                            (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("z"))),))


def inout_sizes() -> Compiled:
    """``y`` (``inout``, ``m`` floats) written from ``x`` (``n`` floats)."""
    return _program("inout_sizes", (Tensor("x", kp.f32, ("n",)),
                                    Tensor("y", kp.f32, ("m",), role="inout")),
                    (Launch("rw", "m", (1,), (1,), (Arg.buffer("x"), Arg.buffer("y"))),))


def shared_computed() -> Compiled:
    """Two launches passing the computed scalar ``c = 2k``; the first passes a value
    argument ``k + 1`` after it (its fill slot comes after ``c``'s)."""
    c = Scalar("c", kp.i32, value=kp.sym("k") * 2)
    return _program("shared_computed",
                    (Scalar("k", kp.i32), Tensor("z", kp.f32, ("k",), role="out"), c),
                    (Launch("ka", "m", (1,), (1,), (Arg.buffer("z"), Arg.scalar("c"),
                                                    Arg.of(kp.sym("k") + 1, kp.i32))),
                     Launch("kb", "m", (1,), (1,), (Arg.buffer("z"), Arg.scalar("c")))))


def widths() -> Compiled:
    """Scalars of 2, 2 and 1 bytes, one of them bfloat16 (its bits go in the slot)."""
    return _program("widths", (Scalar("u", kp.u16), Scalar("b", kp.bf16), Scalar("s", kp.i8)),
                    (Launch("widths", "m", (1,), (1,),
                            (Arg.scalar("u"), Arg.scalar("b"), Arg.scalar("s"))),))


def _nothing(grid, block, shmem, values) -> None:
    pass


KERNELS = {"axpby": ("QQQfI", _axpby_impl), "fill": ("Qi", _nothing),
           "three": ("QQQ", _nothing), "rw": ("QQ", _nothing), "ka": ("Qii", _nothing),
           "kb": ("Qi", _nothing), "widths": ("HHb", _nothing)}


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    return install(monkeypatch, FakeDriver(kernels=KERNELS))


@pytest.fixture
def fake2(monkeypatch) -> FakeDriver:
    """Two devices; the fake remembers which device's context allocated each pointer."""
    return install(monkeypatch, FakeDriver(kernels=KERNELS, devices=2, track_pointers=True))


class Cai:
    """An object exporting the ``__cuda_array_interface__`` dict it is given."""

    def __init__(self, **cai: Any) -> None:
        cai.setdefault("version", 3)
        self.__cuda_array_interface__ = cai


def _launches(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


@pytest.fixture
def orders(monkeypatch) -> list:
    """The ``(device, producer, consumer)`` of every stream ordering the call asks for."""
    made: list = []
    monkeypatch.setattr(buffer, "_order_after", lambda *a: made.append(a))
    return made


# ---- launcher.py --------------------------------------------------------------------------
def test_a_generic_input_before_a_torch_one_still_orders_the_torch_stream(
        fake, monkeypatch, orders) -> None:
    """Kills L05: the generic inputs of a call, read before torch's current stream is known,
    are ordered before it (legacy stream -> torch stream) even when a torch tensor comes
    after them."""
    torch = make_torch(monkeypatch)
    torch._C._cuda_getCurrentRawStream = lambda device: 0x5000
    x, y = HostArray([1.0, 2.0]), TorchTensor([3.0, 4.0], torch.float32)
    z = bind(axpby())((x, y, 2.0))
    assert isinstance(z, TorchTensor) and z.values() == [5.0, 8.0]
    assert orders == [(0, 0, 0x5000)]
    assert [c[5] for c in _launches(fake)] == [0x5000]


def test_an_equal_but_not_identical_dtype_is_accepted(fake, monkeypatch) -> None:
    """Kills L07: dtypes are compared with ``is`` and then ``==`` (a NumPy dtype carrying
    metadata equals float32 without being NumPy's float32 object)."""
    _install_cupy(monkeypatch)
    x, y = NDArray([1.0, 2.0]), NDArray([3.0, 4.0])
    x.dtype = np.dtype(np.float32, metadata={"unit": "m"})
    assert x.dtype == np.dtype(np.float32) and x.dtype is not np.dtype(np.float32)
    z = bind(axpby())((x, y, 2.0))
    assert z.values() == [5.0, 8.0]


def test_an_empty_input_of_unknown_device_is_no_device_mismatch(fake) -> None:
    """Kills L09 and G43: a size-0 array with a NULL pointer says no device (-2); after an argument
    on device 0 it is not "on device -2"."""
    x, z = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    empty = Cai(shape=(0,), typestr="<f4", data=(0, False))
    assert bind(two_dims())((x, empty), out=z) is z
    assert len(_launches(fake)) == 1


def test_only_scalars_and_out_on_another_device_launch_there(fake2) -> None:
    """Kills L16 and G47: with no tensor input, ``out=`` says the device (1), not the current
    one."""
    z = HostArray([0.0, 0.0])
    fake2.pointer_devices[ctypes.addressof(z.buf)] = 1
    assert bind(fill_k())((2,), out=z) is z
    assert fake2.launch_contexts[-1][:2] == ("fill", 0x101)


def test_only_scalars_and_a_torch_out_launch_on_torchs_stream(fake, monkeypatch) -> None:
    """Kills L18: with no tensor input, ``out=``'s framework decides the stream (torch's
    current one), as a torch input would."""
    torch = make_torch(monkeypatch)
    torch._C._cuda_getCurrentRawStream = lambda device: 0x7000
    z = TorchTensor([0.0, 0.0], torch.float32)
    assert bind(fill_k())((2,), out=z) is z
    assert [c[5] for c in _launches(fake)] == [0x7000]


def test_only_scalars_and_an_empty_out_of_unknown_device(fake) -> None:
    """Kills L27: an empty ``out=`` with a NULL pointer (device unknown) leaves the call on
    the current device."""
    z = Cai(shape=(0,), typestr="<f4", data=(0, False))
    assert bind(fill_k())((0,), out=z) is z
    assert not _launches(fake)


def test_an_explicit_stream_leaves_the_callers_context_current(fake2) -> None:
    """Kills E04: a generic call on an explicit stream allocates its DeviceBuffer output with
    the inputs' device current (pushed), and the thread's own context (device 1) is current
    again afterwards."""
    fake2.current = 0x101
    z = bind(axpby())((HostArray([1.0]), HostArray([2.0]), 1.0), None, 77)
    assert fake2.pointer_devices[z.ptr] == 0 and z.device == 0
    assert fake2.current == 0x101


def test_the_parameter_pointer_array_is_pointer_aligned(fake) -> None:
    """Kills B08: the ``void*`` array after the slots (``Qi``: 12 bytes) starts at a multiple
    of the pointer size, as ``kernelParams`` must."""
    bp = bind(fill_k())
    bp((3,), out=HostArray([0.0, 0.0, 0.0]))
    ls = bp.bound.variants[0].launches[0]
    base = ctypes.addressof(ls.param_buf)
    assert ls.size == 12 and ls.params_addr >= base + ls.size
    assert ls.params_addr % struct.calcsize("P") == 0 and (ls.params_addr - base) % 8 == 0


def test_a_computed_scalar_passed_by_two_launches(fake) -> None:
    """Kills B15: a computed scalar passed again (by the second launch) reads its own fill
    slot, not the last one made (the first launch's value argument)."""
    z = bind(shared_computed())((5,))
    launches = _launches(fake)
    assert [c[1] for c in launches] == ["ka", "kb"]
    assert launches[0][6] == (z.ptr, 10, 6) and launches[1][6] == (z.ptr, 10)


def test_an_inout_argument_with_the_same_start_but_another_size(fake) -> None:
    """Kills A19: an ``inout`` argument of 3 floats starting where a read one of 2 starts
    overlaps it partially (same start, other size): refused, not taken as in-place use."""
    mem = HostArray([1.0, 2.0, 3.0])
    addr = ctypes.addressof(mem.buf)
    x = Cai(shape=(2,), typestr="<f4", data=(addr, False))
    y = Cai(shape=(3,), typestr="<f4", data=(addr, False))
    with pytest.raises(LaunchError, match=r"argument 'y', which the program writes \(role "
                                          r"'inout'\), partially overlaps argument 'x'"):
        bind(inout_sizes())((x, y))
    assert not _launches(fake)


def test_slot_widths_of_two_and_one_byte_scalars(fake) -> None:
    """Kills B04 (uint16 packed signed), B05 (bfloat16's bits packed signed) and B06 (int8
    packed unsigned): each value at the top or bottom of its range reaches the kernel."""
    bind(widths())((65535, -1.0, -128))
    assert _launches(fake)[0][6] == (65535, 0xBF80, -128)


# ---- scalars.py ---------------------------------------------------------------------------
def test_bfloat16_rounds_a_tie_to_even() -> None:
    """Kills S01: 1 + 2**-8 lies halfway between bfloat16's 1.0 (0x3F80) and 1 + 2**-7
    (0x3F81): to even, 0x3F80; 1 + 3 * 2**-8 goes up to the even 0x3F82."""
    assert convert_scalar(1.0 + 2 ** -8, kp.bf16, None, "s", "p") == 0x3F80
    assert convert_scalar(1.0 + 3 * 2 ** -8, kp.bf16, None, "s", "p") == 0x3F82
    assert convert_scalar(1.0 + 2 ** -8 + 2 ** -20, kp.bf16, None, "s", "p") == 0x3F81


def test_bfloat16_of_any_nan_is_the_quiet_nan() -> None:
    """Kills S02: a NaN whose float32 mantissa is all ones would carry into the sign bit
    (0x8000, -0.0) through the rounding add; every NaN is 0x7FC0."""
    full = struct.unpack("<d", struct.pack("<Q", 0x7FFFFFFFFFFFFFFF))[0]
    assert math.isnan(full)
    for nan in (full, -full, float("nan"), -float("nan")):
        assert convert_scalar(nan, kp.bf16, None, "s", "p") == 0x7FC0


def test_a_huge_integer_is_named_by_its_bit_length() -> None:
    """Kills S03: an int past 256 bits is shown by its size, not its digits."""
    with pytest.raises(ConstraintError, match=r"scalar 'k' = an int of 301 bits does not fit "
                                              r"int32"):
        convert_scalar(2 ** 300, kp.i32, (-2 ** 31, 2 ** 31 - 1), "k", "p")


def test_a_non_integer_number_for_an_integer_scalar_is_shown() -> None:
    """Kills S09: a number with ``__float__`` and no ``__index__`` (Fraction) for an integer
    parameter is refused showing its value, as a float is."""
    with pytest.raises(TypeError, match=r"scalar 'k' is int32; pass an integer \(got Fraction "
                                        r"Fraction\(3, 2\)\)"):
        convert_scalar(Fraction(3, 2), kp.i32, (-2 ** 31, 2 ** 31 - 1), "k", "p")


def test_a_non_number_for_an_integer_scalar_is_named() -> None:
    """Kills S21: an object with neither ``__index__`` nor ``__float__`` gets the message
    that names the parameter, not operator.index's own."""
    with pytest.raises(TypeError, match=r"scalar 'k' is int32; pass an integer \(got object\)"):
        convert_scalar(object(), kp.i32, (-2 ** 31, 2 ** 31 - 1), "k", "p")


# ---- arrays.py: __cuda_array_interface__ and streams --------------------------------------
def _read(**cai: Any) -> tuple:
    return GENERIC.read(Cai(**cai), "x", 0)


def test_a_one_byte_big_endian_typestr_is_its_dtype(fake) -> None:
    """Kills R02: byte order means nothing for one byte: '>u1' is uint8 ('>u2' is refused)."""
    buf = HostArray([1.0])
    addr = ctypes.addressof(buf.buf)
    assert _read(shape=(4,), typestr=">u1", data=(addr, False))[2] is kp.u8
    assert _read(shape=(2,), typestr=">u2", data=(addr, False))[2] is None


def test_contiguity_ignores_strides_of_size_one_and_empty_arrays(fake) -> None:
    """Kills R03, R04, R05: a size-1 dim's stride is anything (as PyTorch's), an empty array is
    contiguous whatever its strides, and a size-1 dim between two others does not change the
    stride expected of the outer one."""
    addr = ctypes.addressof(HostArray([0.0] * 6).buf)
    assert _read(shape=(1, 3), typestr="<f4", data=(addr, False), strides=(999, 4))[4]
    assert _read(shape=(0, 3), typestr="<f4", data=(addr, False), strides=(4, 8))[4]
    assert _read(shape=(2, 1, 3), typestr="<f4", data=(addr, False), strides=(12, 999, 4))[4]
    assert not _read(shape=(2, 3), typestr="<f4", data=(addr, False), strides=(16, 4))[4]


def test_a_data_entry_of_three_items_is_malformed(fake) -> None:
    """Kills R08: ``data`` is a (pointer, read-only) pair."""
    addr = ctypes.addressof(HostArray([0.0]).buf)
    with pytest.raises(LaunchError, match=r"argument 'x': malformed __cuda_array_interface__ "
                                          r"\('data' must be a tuple of 2"):
        _read(shape=(1,), typestr="<f4", data=(addr, False, 0))


@pytest.mark.parametrize("cai, message", [
    ([1], r"it must be a dict \(got list\)"),
    ({"shape": 5, "typestr": "<f4", "data": (8, False)}, r"'shape' must be a tuple \(got 5\)"),
    ({"shape": (1,), "typestr": 4, "data": (8, False)},
     r"'typestr' must be a string such as '<f4' \(got 4\)")], ids=["list", "shape", "typestr"])
def test_a_malformed_array_interface_is_named(fake, cai, message) -> None:
    """Kills R44, R43, R45: what is wrong with the interface is said, not what it broke."""
    obj = types.SimpleNamespace(__cuda_array_interface__=cai)
    with pytest.raises(LaunchError, match=r"argument 'x': malformed __cuda_array_interface__ "
                                          r"\(" + message):
        GENERIC.read(obj, "x", 0)


def test_a_producer_on_the_default_stream_needs_no_event_for_a_default_consumer(
        fake, orders) -> None:
    """Kills R13: handles 1 (legacy) and 2 (per-thread) are the default stream on both sides:
    a producer on 1 read for a call on 2 (or on 1) asks for no ordering; on stream 9 it does."""
    addr = ctypes.addressof(HostArray([0.0]).buf)
    for consumer in (1, 2):
        GENERIC.read(Cai(shape=(1,), typestr="<f4", data=(addr, False), stream=1), "x", consumer)
    assert orders == []
    GENERIC.read(Cai(shape=(1,), typestr="<f4", data=(addr, False), stream=1), "x", 9)
    assert orders == [(0, 0, 9)]


def test_stream_handles_from_protocol_objects() -> None:
    """Kills R28, R29, R36: ``__cuda_stream__`` gives (version, handle); a ``handle``
    attribute is read as torch's ``cuda_stream`` is; a bool handle is refused."""
    class Proto:
        def __cuda_stream__(self) -> tuple:
            return (0, 0x1234)

    class BoolProto:
        def __cuda_stream__(self) -> tuple:
            return (0, True)

    assert stream_handle(Proto()) == 0x1234
    assert stream_handle(types.SimpleNamespace(handle=0x77)) == 0x77
    with pytest.raises(TypeError, match=r"__cuda_stream__ of BoolProto gave handle True, "
                                        r"expected an int"):
        stream_handle(BoolProto())


def test_the_device_a_stream_object_names() -> None:
    """Kills R41 and G40: a stream's ``device_index``/``device_id`` names a device when it is
    an int that is not a bool and not negative (CuPy's -1): device 0 included."""
    assert stream_device(types.SimpleNamespace(device_index=True)) is None
    assert stream_device(types.SimpleNamespace(device_id=-1)) is None
    assert stream_device(types.SimpleNamespace(device_id=1)) == 1
    assert stream_device(types.SimpleNamespace(device_index=0)) == 0
    arrays.check_stream_device("p", types.SimpleNamespace(device_index=True), 0)
    with pytest.raises(LaunchError, match=r"p: stream= is a stream of device 0, the arguments "
                                          r"are on device 1"):
        arrays.check_stream_device("p", types.SimpleNamespace(device_index=0), 1)


def test_the_array_interface_is_read_before_dlpack(fake) -> None:
    """Kills R42: an object with both ``__cuda_array_interface__`` and ``__dlpack__`` is read
    through the interface (its ``__dlpack__`` is not called), bfloat16 apart."""
    class Both(Cai):
        def __dlpack__(self, **kw: Any) -> Any:
            raise AssertionError("__dlpack__ called")

    x, y, z = HostArray([1.0]), HostArray([2.0]), HostArray([0.0])
    both = Both(shape=(1,), typestr="<f4", data=(ctypes.addressof(x.buf), False))
    call_program(axpby(), both, y, 3.0, out=z)
    assert z.values() == [5.0]


# ---- dlpack.py: capsules of a producer ----------------------------------------------------

class Producer:
    """Float32 host memory exported through DLPack only, every field of the capsule chosen:
    ``dtype`` (code, bits, lanes), ``shape``, ``device_type`` (of the capsule; the
    ``__dlpack_device__`` answer is ``dlpack_device``, None: no such method), ``major``
    (a versioned capsule when given). Records the streams asked for and the deleter's runs."""

    def __init__(self, values: list[float], *, dtype: tuple = (2, 32, 1),
                 shape: tuple | None = None, device_type: int = 2,
                 dlpack_device: Any = "same", major: int | None = 1) -> None:
        self.buf = ctypes.create_string_buffer(struct.pack(f"<{len(values)}f", *values),
                                               max(4, 4 * len(values)))
        self.dtype, self.device_type, self.major = dtype, device_type, major
        self.shape = shape if shape is not None else (len(values),)
        if dlpack_device is not None:
            where = (device_type, 0) if dlpack_device == "same" else dlpack_device
            self.__dlpack_device__ = lambda: where
        self.streams: list = []
        self.deleted: list = []
        self._keep: list = []
        self._deleter = _DELETER(self.deleted.append)

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        self.streams.append(stream)
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        t = DLTensor(ctypes.addressof(self.buf), DLDevice(self.device_type, 0), ndim,
                     DLDataType(*self.dtype), ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                     None, 0)
        if self.major is not None and kw.get("max_version") is not None:
            m: Any = _Versioned(_Version(self.major, 0), None, self._deleter, 0, t)
            name = b"dltensor_versioned"
        else:
            m, name = _Managed(t, None, self._deleter), b"dltensor"
        self._keep += [shape, m]
        return _new(ctypes.addressof(m), name, None)

    def values(self) -> list[float]:
        return list(struct.unpack(f"<{len(self.buf.raw) // 4}f", self.buf.raw))


@pytest.mark.parametrize("dtype", [(2, 32, 4), (4, 32, 1), (6, 16, 1)],
                         ids=["float32x4", "bfloat-code-32-bits", "bool-16-bits"])
def test_dlpack_types_kernelpack_has_no_dtype_for_are_refused(fake, dtype) -> None:
    """Kills D01, D14 (four lanes of float32 read as float32), D02 (type code bfloat with 32
    bits read as bfloat16) and D03 (bool of 16 bits read as bool)."""
    with pytest.raises(LaunchError, match=r"argument 'x' has dtype unsupported by kernelpack"):
        call_program(axpby(), Producer([1.0, 2.0], dtype=dtype), HostArray([1.0, 1.0]), 1.0)
    assert dlpack.kp_dtype(*dtype) is None


def test_a_versioned_capsule_of_major_version_0_is_refused(fake) -> None:
    """Kills D05: the versioned struct is read for major version 1 only."""
    p = Producer([1.0], major=0)
    with pytest.raises(LaunchError, match=r"argument 'x': DLPack capsule has version 0\.0, "
                                          r"expected major version 1"):
        call_program(axpby(), p, HostArray([1.0]), 1.0)


@pytest.mark.parametrize("shape, message", [((1,) * 65, r"has ndim 65"),
                                            ((2, -1), r"has a negative dim in shape \(2, -1\)")])
def test_dlpack_shapes_that_describe_no_array_are_refused(fake, shape, message) -> None:
    """Kills D08 (ndim past 64) and D10 (a negative dim)."""
    p = Producer([1.0, 2.0], shape=shape)
    with pytest.raises(LaunchError, match=rf"argument 'x': DLPack tensor {message}"):
        call_program(axpby(), p, HostArray([1.0]), 1.0)
    gc.collect()
    assert len(p.deleted) == 1  # consumed: its deleter ran once


def test_a_dlpack_producer_gets_the_legacy_stream_for_stream_0(fake) -> None:
    """Kills D16: 0 is no DLPack stream: a call on the NULL stream asks for 1 (legacy)."""
    p = Producer([1.0])
    call_program(axpby(), p, HostArray([1.0]), 1.0, out=HostArray([0.0]))
    assert p.streams == [1]


def test_cuda_managed_memory_is_launched_on(fake) -> None:
    """Kills D19: DLPack device type 13 (CUDA managed) is device memory."""
    x, y, z = Producer([1.0, 2.0], device_type=13), HostArray([1.0, 1.0]), HostArray([0.0, 0.0])
    call_program(axpby(), x, y, 2.0, out=z)
    assert z.values() == [3.0, 5.0]


@pytest.mark.parametrize("device_type, message", [
    (4, r"argument 'x' lives on DLPack device type 4 \(OpenCL\), not on a CUDA device"),
    (1, r"argument 'x' is in host memory")])
def test_a_capsule_off_cuda_is_refused_without_dlpack_device(fake, device_type,
                                                              message) -> None:
    """Kills D29 (the capsule's device type unchecked without ``__dlpack_device__``), G09
    (``device_refusal``'s arguments swapped there) and G37 (OpenCL's device type 4 made 5 in
    the table of names)."""
    p = Producer([1.0], device_type=device_type, dlpack_device=None)
    with pytest.raises(LaunchError, match=message):
        call_program(axpby(), p, HostArray([1.0]), 1.0)
    assert not _launches(fake)


def test_a_producer_older_than_the_stream_keyword(fake) -> None:
    """Kills D33: a ``__dlpack__`` taking no keyword at all is asked a third time, bare."""
    class Old(Producer):
        def __dlpack__(self) -> Any:  # type: ignore[override]
            return super().__dlpack__()

    x, z = Old([1.0, 2.0]), HostArray([0.0, 0.0])
    call_program(axpby(), x, HostArray([1.0, 1.0]), 2.0, out=z)
    assert z.values() == [3.0, 5.0] and x.streams == [None] and len(x.deleted) == 1


def test_a_failing_dlpack_device_is_named(fake) -> None:
    """Kills D34: ``__dlpack_device__`` raising anything is a LaunchError naming the
    argument."""
    def broken() -> tuple:
        raise RuntimeError("no device here")

    p = Producer([1.0], dlpack_device=None)
    p.__dlpack_device__ = broken
    with pytest.raises(LaunchError, match=r"argument 'x': __dlpack_device__\(\) failed "
                                          r"\(RuntimeError: no device here\)"):
        call_program(axpby(), p, HostArray([1.0]), 1.0)


def test_a_views_deleter_runs_once(fake) -> None:
    """Kills D27: ``release`` then the view's collection call the producer's deleter once."""
    p = Producer([1.0])
    view = dlpack.read_capsule(p.__dlpack__(max_version=(1, 0)), "x")
    view.release()
    assert len(p.deleted) == 1
    del view
    gc.collect()
    assert len(p.deleted) == 1


# ---- buffer.py and dlpack.py: DeviceBuffer's exports --------------------------------------
def test_device_buffer_exports_bool_2d_strides_and_its_device(fake2) -> None:
    """Kills D04 (bool exported with uint's type code), D24 (strides reversed) and D30 (a
    device 1 buffer exported as device 0)."""
    flags = DeviceBuffer.empty((2, 3), kp.bool_, 1)
    view = dlpack.read_capsule(flags.__dlpack__(), "b")
    assert view.dtype is kp.bool_ and view.shape == (2, 3) and view.strides == (3, 1)
    assert view.device_id == 1 and flags.__dlpack_device__() == (2, 1)


def test_an_unconsumed_export_releases_the_buffer(fake) -> None:
    """Kills D26: a capsule dropped without a consumer drops its reference to the buffer."""
    buf = DeviceBuffer.empty((2,), kp.f32, 0)
    before = len(dlpack._alive)
    capsule = buf.__dlpack__()
    assert len(dlpack._alive) == before + 1
    ptr = buf.ptr
    del capsule, buf
    gc.collect()
    assert len(dlpack._alive) == before and ptr not in fake.memory


def test_typestr_of_one_byte_types_has_no_byte_order() -> None:
    """Kills F01: NumPy's typestr of a one-byte type says '|' (not applicable)."""
    assert (typestr(kp.u8), typestr(kp.bool_), typestr(kp.i8)) == ("|u1", "|b1", "|i1")
    assert typestr(kp.f32) == "<f4"


def test_an_empty_device_buffer_allocates_nothing(fake) -> None:
    """Kills F03 and F21: the driver refuses 0-byte allocations; an empty buffer has pointer 0,
    and its bytes are read without the driver."""
    def refuse(*args: Any) -> tuple:
        raise AssertionError("driver called")

    fake.cuMemAlloc = fake.cuMemcpyDtoH = fake.cuStreamSynchronize = refuse
    buf = DeviceBuffer.empty((0, 3), kp.f32, 0)
    assert buf.ptr == 0 and buf.nbytes == 0 and buf.copy_to_host() == b""


def test_a_buffer_is_allocated_and_freed_in_its_own_devices_context(fake2) -> None:
    """Kills F04 (allocated in whatever context is current) and F23 (freed in device 0's)."""
    freed: list = []
    free = fake2.cuMemFree
    fake2.cuMemFree = lambda ptr: (freed.append((int(ptr), fake2.current)), free(ptr))[1]
    fake2.current = 0x100
    buf = DeviceBuffer.empty((4,), kp.f32, 1)
    ptr = buf.ptr
    assert fake2.pointer_devices[ptr] == 1
    del buf
    gc.collect()
    assert freed == [(ptr, 0x101)]


def test_a_host_copy_is_made_in_the_buffers_context(fake2) -> None:
    """Kills F24: copy_to_host of a device 1 buffer, with device 0's context current, copies
    with device 1's context current (pushed), and device 0's is current again afterwards."""
    buf = DeviceBuffer.empty((1,), kp.f32, 1)
    seen: list = []
    copy = fake2.cuMemcpyDtoH
    fake2.cuMemcpyDtoH = lambda *a: (seen.append(fake2.current), copy(*a))[1]
    fake2.current = 0x100
    assert len(buf.copy_to_host()) == 4
    assert seen == [0x101] and fake2.current == 0x100


def test_dlpack_export_refuses_a_copy_and_another_device(fake) -> None:
    """Kills F07 and F08: DeviceBuffer cannot copy, and lives on (CUDA, its ordinal)."""
    buf = DeviceBuffer.empty((2,), kp.f32, 0)
    with pytest.raises(BufferError, match="cannot copy"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"lives on CUDA device 0, cannot export to \(1, 0\)"):
        buf.__dlpack__(dl_device=(1, 0))
    assert dlpack.read_capsule(buf.__dlpack__(dl_device=(2, 0)), "b").ptr == buf.ptr


def test_a_host_copy_takes_the_asked_dtype(fake) -> None:
    """Kills F16: ``np.asarray(buf, dtype=...)`` converts."""
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([0.5, 0.5]), 1.0)
    host = np.asarray(z, dtype=np.float64)
    assert host.dtype == np.float64 and host.tolist() == [1.5, 2.5]
    assert z.__array__(np.float64).dtype == np.float64  # (NumPy casts what it is given too)


def test_copy_to_host_waits_for_the_buffers_stream(fake) -> None:
    """Kills F17: an output written on stream 77 is read after synchronizing stream 77."""
    synced: list = []
    fake.cuStreamSynchronize = lambda s: (synced.append(int(s)), (fake.CUresult(0),))[1]
    z = call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0, stream=77)
    assert z.stream == 77 and struct.unpack("<f", z.copy_to_host()) == (2.0,)
    assert synced == [77]
