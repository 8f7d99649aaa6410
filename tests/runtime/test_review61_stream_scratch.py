"""Review 61: calls with ``out=`` and ``stream=`` whose variant has scratch, on the fast paths
(C ``FastCall``, C through DLPack's exchange API, the torch/CuPy closures), and
``arrays.TorchAdapter``'s stream objects (7c35d2c, 61dd4d2), on CPU with the stand-in
torch/CuPy and the fake driver. The ``general`` fixture counts general-path calls (review 60),
so every test says which path a call took on the closures as ``fast_calls`` does on C.

Bug found (fixed in session 42, the test was a strict xfail before):
test_a_failed_unowned_memory_frees_the_scratch_once. fast_cupy._ordered_scratch freed the
driver's allocation itself when ``cupy.cuda.UnownedMemory`` raised, but the ``_FreedInOrder``
owner made for it died with the failed call and freed the same pointer again: two
``cuMemFreeAsync`` of one pointer (since 7c35d2c on every CuPy call with scratch and
``stream=``; before, during graph captures only). Now the owner alone frees it.

Mutants (55, one at a time in a copy of 90da508, the C ones rebuilt, the original extension
rebuilt after them; "suite": tests/runtime without this file; "here": this file):

_fastcall.c (22)
- C01 ``given ? 4 : 3`` -> 3; C03 the handle passed + 1; C05 ``a[3] = device_obj``; C07 no
  ``self->cupy`` in the default-stream test; C09 no ``stream != Py_None`` there; C13 ``sh <
  0``; C19 ``given`` always 1; C20 ``given`` always 0; C06 ``Py_CLEAR(result)`` dropped after
  a failed ``stream_of``: suite and here (test_a_torch_stream_object_and_its_handle_...,
  test_the_default_stream_while_another_is_current, test_scratch_is_freed_after_...,
  test_cupy_default_stream_handles, test_a_torch_stream_of_another_device_with_scratch).
- C02 ``given ? 4 : 3`` -> 4, C21 ``if (0 && (h = ...``, C22 ``goto done`` for ``goto
  slow``: a crash, suite and here.
- Survivors of the suite, killed here: C04 ``Py_XDECREF(h)`` dropped (the handle leaked per
  call), C15 C16 C18 a reference dropped in the CuPy default-stream branch (result, st,
  device_obj): test_no_references_are_left; C17 (the entry capsule's reference):
  test_a_default_stream_call_leaves_no_entry_behind; C08 no ``e->nscratch`` there (calls
  without scratch on stream 0 sent to the general path), C10 ``sh < 2``, C11 ``sh < 1``, C12
  ``sh <= 3``: test_cupy_default_stream_handles.
- C14 no ``result != NULL`` in that test: not killed, and not killable deterministically:
  result is NULL only when ``stream_of`` or ``check_out`` failed, with ``sh`` unset (or set
  to 2**64 - 1 by a failed conversion); the branch then reads an uninitialized ``sh``, and
  crashes only where the stack happens to hold a value below 3.

fast_torch.py (9)
- T01 always the current pool, T02 stream 0's, T04 never the handle, T07 one byte less, T08
  the old fallback to the general path re-added, T09 ``stream = None`` in allocate_scratch:
  suite and here.
- Survivors of the suite, killed here: T05 the stream object for the handle
  (test_a_torch_stream_object_and_its_handle_allocate_alike), T06 device 0's pool
  (test_a_stream_on_device_1_allocates_there).
- T03 the handle passed without ``stream=`` too: equivalent (TorchAdapter.empty allocates
  plainly for the current stream, and the handle passed is the current one).

fast_cupy.py (14)
- K01 never stream-ordered for ``stream=``, K02 ordered on the current stream, K08 never the
  handle, K09 the handle without ``stream=``, K13 the old fallback re-added: suite and here.
- Survivors of the suite, killed here: K10 the allocation error's message
  (test_a_failed_stream_ordered_allocation); K11 a captured call's scratch on stream 0, K12
  ``is_capturing(None)`` (no CPU test reached the capture path):
  test_a_captured_current_stream_takes_stream_ordered_scratch; K14 the stream object for the
  handle: test_cupy_default_stream_handles.
- K03 no ``scratch is not None`` (calls without scratch on a default stream sent to the
  general path), K04 ``sh < 2``, K05 ``sh < 1``, K06 ``sh <= 3``, K07 ``sh < 0``: here
  (test_cupy_default_stream_handles; the suite's run of these was not finished).

arrays.py (10)
- A01 STREAM_OBJECTS_KEPT = 1: test_two_streams_in_turn_are_each_made_once; A05 ``>`` for
  ``>=`` (65 kept): test_the_bound_holds_after_every_new_stream; A02 the cache keyed by
  handle alone, A03 nothing remembered, A04 handle 1 not the default stream, A06 never
  cleared, A07 stored under device 0, A08 the default stream of no device, A09
  ExternalStream without the device, A10 nothing stored: here (test_a_stream_on_device_1_...,
  test_the_default_stream_while_another_is_current, the two tests above; the suite's run of
  the arrays.py mutants was not finished).
"""

from __future__ import annotations

import gc
import sys
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.arrays import STREAM_OBJECTS_KEPT, TorchAdapter
from kernelpack.runtime.fastpath import SCRATCH_ALIGN
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scratch,
                                Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fast_scratch import KERNELS, _expected, _launches, _program  # noqa: E402
from test_fast_scratch import allocations  # noqa: E402,F401
from test_fastpath_fake import NDArray, Tensor as FakeTensor  # noqa: E402
from test_fastpath_fake import select_path  # noqa: E402
from test_fastpath_fake import cupy, exchange, torch  # noqa: E402,F401
from test_review22_scratch import KERNELS2, _two_output_program, cupy_made  # noqa: E402,F401
from test_review60_closure_mutants import general  # noqa: E402,F401


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


@pytest.fixture
def made(cupy_made) -> list:
    """cupy.empty recording ``(shape, dtype name, current stream)``, and ExternalStream
    (review 22's fixture)."""
    return cupy_made


class TorchStream:
    """A torch stream object: its raw handle and device."""

    def __init__(self, handle: int, device: int = 0) -> None:
        self.cuda_stream, self.device_index = handle, device


def _fast_calls(prog, launch_path: str) -> int | None:
    return bind(prog).call.__self__.fast_calls if launch_path.startswith("C") else None


def _driver_memory(fake) -> list:
    """The fake driver's allocations and frees: ``(call, size or pointer, stream)``."""
    return [c for c in fake.calls if c[0] in ("cuMemAllocAsync", "cuMemFreeAsync")]


def _warm(prog, *args, general: list | None = None) -> None:
    call_program(prog, *args)  # the general path binds the device
    call_program(prog, *args)  # the fast path is built
    if general is not None:
        general.clear()  # (the first call's)


def _forget(fake, *lists) -> None:
    """Drop what recorded references to the handles and arrays of earlier calls."""
    fake.calls.clear()
    fake.launch_contexts.clear()
    for seen in lists:
        if seen is not None:
            seen.clear()
    gc.collect()


# ---- torch ------------------------------------------------------------------------------------
def test_a_torch_stream_object_and_its_handle_allocate_alike(monkeypatch, torch, allocations,
                                                             general, launch_path) -> None:
    """stream= as torch's stream object or as its raw handle: the fast path, the scratch one
    buffer from that handle's pool (TorchAdapter makes torch's object for the handle, not the
    caller's), the launches there."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    _warm(prog, x, general=general)
    before = _fast_calls(prog, launch_path)
    for stream in (TorchStream(0x99), 0x99, TorchStream(0x99)):
        allocations.clear()
        fake.calls.clear()
        assert call_program(prog, x, out=out, stream=stream) is out
        assert out.values() == _expected(xs)
        assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 0x99))]
        assert {c[5] for c in _launches(fake)} == {0x99}
    assert general == []
    if before is not None:
        assert _fast_calls(prog, launch_path) == before + 3


def test_a_torch_stream_of_another_device_with_scratch(monkeypatch, torch, allocations,
                                                       general, launch_path) -> None:
    """A torch stream of device 1 for tensors on device 0: the general path's LaunchError,
    word for word, before anything is allocated or launched."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x, out = FakeTensor([1.0, 2.0, 3.0, 4.0], torch.float32), FakeTensor([0.0] * 4, torch.float32)
    _warm(prog, x, general=general)
    before = _fast_calls(prog, launch_path)
    allocations.clear()
    fake.calls.clear()
    with pytest.raises(LaunchError) as fast:
        call_program(prog, x, out=out, stream=TorchStream(0x99, device=1))
    with pytest.raises(LaunchError) as slow:
        bind(prog)._call((x,), out, TorchStream(0x99, device=1))
    assert str(fast.value) == str(slow.value)
    assert "stream= is a stream of device 1" in str(fast.value)
    assert allocations == [] and _launches(fake) == []
    assert _fast_calls(prog, launch_path) == before


def test_the_default_stream_while_another_is_current(monkeypatch, torch, allocations, general,
                                                     launch_path) -> None:
    """stream=0 and 1 (the legacy default stream's two names) while torch's current stream is
    another: the fast path, the scratch from the default stream's pool, the launches on the
    handle given; the current stream's own handle: a plain allocation."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x33)
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    _warm(prog, x, general=general)
    general.clear()
    for handle, pool in ((0, ("default", ("cuda", 0))), (1, ("default", ("cuda", 0))),
                         (0x33, None)):
        allocations.clear()
        fake.calls.clear()
        assert call_program(prog, x, out=out, stream=handle) is out
        assert out.values() == _expected(xs)
        want = ((2 * SCRATCH_ALIGN,), "uint8") + ((pool,) if pool else ())
        assert allocations == [want], handle
        assert {c[5] for c in _launches(fake)} == {handle}
    assert general == []


def test_a_stream_on_device_1_allocates_there(monkeypatch, torch, allocations, general,
                                              launch_path) -> None:
    """Tensors on device 1 with stream= a raw handle: the scratch from that handle's pool of
    device 1 (TorchAdapter's stream object is per handle and device)."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS), devices=2))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(xs, torch.float32, device=1)
    out = FakeTensor([0.0] * 4, torch.float32, device=1)
    pools: list = []

    def external(handle, device=None):
        pools.append((handle, device))
        return ("ext", handle, device)

    monkeypatch.setattr(torch.cuda, "ExternalStream", external)
    _warm(prog, x, general=general)
    allocations.clear()
    general.clear()
    for _ in range(2):
        assert call_program(prog, x, out=out, stream=0x51) is out
        assert out.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 0x51, ("cuda", 1)))] * 2
    assert pools == [(0x51, ("cuda", 1))] and general == []
    assert fake.calls  # (launched)


def test_an_allocation_that_raises_for_another_stream(monkeypatch, torch, allocations, general,
                                                      launch_path, exchange) -> None:
    """torch refusing the stream (ExternalStream raising): raised as torch raised it, nothing
    launched, torch's current stream as it was, no reference kept, nothing remembered for
    that handle (the next call makes its object and works)."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    _warm(prog, x, general=general)

    class Refused(RuntimeError):
        pass

    real = torch.cuda.ExternalStream

    def refuse(handle, device=None):
        raise Refused(f"invalid stream {handle}")

    monkeypatch.setattr(torch.cuda, "ExternalStream", refuse)
    with pytest.raises(Refused):
        call_program(prog, x, out=out, stream=0x97)
    _forget(fake, allocations, exchange.described if exchange else None, general)
    before = sys.getrefcount(out), sys.getrefcount(torch.uint8)
    for _ in range(20):
        with pytest.raises(Refused):
            call_program(prog, x, out=out, stream=0x97)
    assert _launches(fake) == [] and allocations == [] and torch.current_stream is None
    assert general == []  # raised by the fast path's own allocation, as the general path's
    _forget(fake, allocations, exchange.described if exchange else None)
    assert (sys.getrefcount(out), sys.getrefcount(torch.uint8)) == before
    monkeypatch.setattr(torch.cuda, "ExternalStream", real)
    assert call_program(prog, x, out=out, stream=0x97) is out and out.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 0x97))]


def test_a_scratch_allocation_that_calls_again_on_other_streams(monkeypatch, torch, allocations,
                                                                general, launch_path) -> None:
    """The allocation for stream= (inside torch.cuda.stream(target)) calls the program again
    on many other streams, more than TorchAdapter keeps (its objects are cleared meanwhile):
    every call is right, launched on its own stream, its scratch from that stream's pool."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs, ys = [1.0, 2.0, 3.0, 4.0], [3.0, 1.0, 4.0, 1.0, 5.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    y = FakeTensor(ys, torch.float32)
    _warm(prog, x, general=general)
    _warm(prog, y, general=general)
    inner = torch.empty
    armed = [True]
    inner_ok: list = []

    def empty(*shape, dtype, device):
        if armed[0] and torch.current_stream == ("ext", 0x61):
            armed[0] = False
            for h in range(0x1000, 0x1000 + STREAM_OBJECTS_KEPT + 3):
                o = FakeTensor([0.0] * 5, torch.float32)
                inner_ok.append(call_program(prog, y, out=o, stream=h) is o
                                and o.values() == _expected(ys))
            armed[0] = True
        return inner(*shape, dtype=dtype, device=device)

    monkeypatch.setattr(torch, "empty", empty)
    fake.calls.clear()
    general.clear()
    assert call_program(prog, x, out=out, stream=0x61) is out and out.values() == _expected(xs)
    assert inner_ok == [True] * (STREAM_OBJECTS_KEPT + 3)
    outer = [c for c in _launches(fake) if c[5] == 0x61]
    assert len(outer) == 3 and _launches(fake)[-3:] == outer
    assert general == [] and not fake.callback_errors


# ---- CuPy -------------------------------------------------------------------------------------
def test_cupy_default_stream_handles(monkeypatch, cupy, made, general, launch_path) -> None:
    """CuPy, out= and stream=, a variant with scratch: a default stream (0, 1, 2 = per-thread,
    cupy's null stream object) is the general path's, which allocates each buffer apart on
    it; any other handle (3, 7, a cupy stream object) the fast path's, one stream-ordered
    buffer freed on that stream after the launches. A variant without scratch is fast on
    every stream."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = NDArray(xs), NDArray([0.0] * 4)
    small, out2 = NDArray([1.0, 2.0]), NDArray([0.0, 0.0])
    _warm(prog, x, general=general)
    _warm(prog, small, general=general)
    null = types.SimpleNamespace(ptr=0, device_id=-1)
    for stream, handle in ((0, 0), (1, 1), (2, 2), (null, 0), (3, 3), (7, 7),
                           (types.SimpleNamespace(ptr=7, device_id=0), 7)):
        general.clear()
        made.clear()
        fake.calls.clear()
        before = _fast_calls(prog, launch_path)
        assert call_program(prog, x, out=out, stream=stream) is out
        assert out.values() == _expected(xs)
        memory = _driver_memory(fake)
        if handle < 3:
            assert general == [("scr", True, stream)], stream
            assert [c[1:] for c in memory if c[0] == "cuMemAllocAsync"] == [(16, handle),
                                                                            (4, handle)]
        else:
            assert general == [], stream
            alloc, free = memory
            double = _launches(fake)[0]
            assert alloc[1:] == (2 * SCRATCH_ALIGN, handle)
            assert free == ("cuMemFreeAsync", double[6][1], handle)
            assert fake.calls.index(free) > fake.calls.index(_launches(fake)[-1])
            if before is not None:
                assert _fast_calls(prog, launch_path) == before + 1
        assert made == [] and {c[5] for c in _launches(fake)} == {handle}
        # no scratch (n = 2, one launch): fast on every stream, nothing allocated
        general.clear()
        fake.calls.clear()
        assert call_program(prog, small, out=out2, stream=stream) is out2
        assert out2.values() == _expected([1.0, 2.0])
        assert general == [] and _driver_memory(fake) == [] and made == []


def test_a_cupy_stream_of_another_device_with_scratch(monkeypatch, cupy, made, general,
                                                      launch_path) -> None:
    """A cupy stream of device 1 for arrays on device 0, with scratch and out=: the general
    path's LaunchError, nothing allocated or launched."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x, out = NDArray([1.0, 2.0, 3.0, 4.0]), NDArray([0.0] * 4)
    _warm(prog, x, general=general)
    fake.calls.clear()
    made.clear()
    for ptr in (0, 9):
        with pytest.raises(LaunchError, match="stream= is a stream of device 1"):
            call_program(prog, x, out=out, stream=types.SimpleNamespace(ptr=ptr, device_id=1))
    assert fake.calls == [] and made == []


def test_scratch_is_freed_after_the_launches_on_its_stream(monkeypatch, cupy, made, general,
                                                           launch_path) -> None:
    """Calls on several streams in turn (and on the current one between them): each
    stream-ordered allocation, then that call's launches, then its free, all on that call's
    stream; nothing left allocated."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    x, out = NDArray(xs), NDArray([0.0] * 5)
    _warm(prog, x, general=general)
    gc.collect()
    made.clear()
    fake.calls.clear()
    fake.memory.clear()
    streams = (9, 11, None, 9, 0x1234, None, 11)  # None: CuPy's current stream, 0
    for s in streams:
        assert call_program(prog, x, out=out, stream=s) is out and out.values() == _expected(xs)
    assert general == []
    events = [c for c in fake.calls if c[0] in ("cuMemAllocAsync", "cuMemFreeAsync")
              or c[0] == "cuLaunchKernel" and c[5] != 0]
    ordered = [s for s in streams if s is not None]
    assert len(events) == 5 * len(ordered)
    for k, s in enumerate(ordered):
        alloc, *launches, free = events[5 * k:5 * k + 5]
        assert alloc[0] == "cuMemAllocAsync" and alloc[2] == s
        assert [c[0] for c in launches] == ["cuLaunchKernel"] * 3
        assert {c[5] for c in launches} == {s} and free[0] == "cuMemFreeAsync"
        assert free[1:] == (launches[0][6][1], s)
    assert made == [((2 * SCRATCH_ALIGN,), "uint8", 0)] * 2  # the current stream's: cupy.empty
    gc.collect()
    assert fake.memory == {}


def test_a_failed_stream_ordered_allocation(monkeypatch, cupy, made, general, launch_path,
                                            ) -> None:
    """The driver refusing the allocation (out of memory): a LaunchError as the general path
    raises for it, saying what was allocated; nothing launched, nothing freed."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x, out = NDArray([1.0, 2.0, 3.0, 4.0]), NDArray([0.0] * 4)
    _warm(prog, x, general=general)
    monkeypatch.setattr(fake, "cuMemAllocAsync", lambda n, s: (2, None))  # OUT_OF_MEMORY
    fake.calls.clear()
    with pytest.raises(LaunchError, match="scratch.*failed: CUresult 2") as fast:
        call_program(prog, x, out=out, stream=9)
    with pytest.raises(LaunchError, match="scratch.*failed: CUresult 2"):
        bind(prog)._call((x,), out, 9)
    assert str(fast.value).startswith("scr: allocating a call's scratch (stream-ordered)")
    assert fake.calls == []  # (the patched allocation records nothing)
    assert general == [("scr", True, 9)]  # the direct call only


def test_a_failed_unowned_memory_frees_the_scratch_once(monkeypatch, cupy, made, general,
                                                        launch_path) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x, out = NDArray([1.0, 2.0, 3.0, 4.0]), NDArray([0.0] * 4)
    _warm(prog, x, general=general)

    class Refused(Exception):
        pass

    def unowned(ptr, size, owner):
        raise Refused("cannot wrap the pointer")

    monkeypatch.setattr(cupy.cuda, "UnownedMemory", unowned)
    fake.calls.clear()
    with pytest.raises(Refused):
        call_program(prog, x, out=out, stream=9)
    gc.collect()
    alloc, *frees = _driver_memory(fake)
    assert alloc[0] == "cuMemAllocAsync" and _launches(fake) == []
    assert frees == [("cuMemFreeAsync", frees[0][1], 9)]  # once


def test_an_interrupt_as_the_owner_is_made_frees_nothing_twice(monkeypatch, cupy, made,
                                                               general, launch_path) -> None:
    """A KeyboardInterrupt as the memory's owner is made (review 62: the owner was made after
    the allocation, beside an ``except BaseException`` that freed it, so an interrupt once
    the owner existed freed the pointer twice): the owner is made first now, so nothing is
    allocated yet, and nothing is freed; a later call is right and frees its memory once."""
    from kernelpack.runtime import fast_cupy

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = NDArray(xs), NDArray([0.0] * 4)
    _warm(prog, x, general=general)
    real = fast_cupy._PoolBlock

    class Interrupted(real):
        __slots__ = ()

        def __init__(self, release) -> None:
            super().__init__(release)
            raise KeyboardInterrupt

    monkeypatch.setattr(fast_cupy, "_PoolBlock", Interrupted)
    fake.calls.clear()
    with pytest.raises(KeyboardInterrupt):
        call_program(prog, x, out=out, stream=9)
    gc.collect()
    assert _driver_memory(fake) == [] and _launches(fake) == []
    monkeypatch.setattr(fast_cupy, "_PoolBlock", real)
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    gc.collect()
    alloc, *frees = _driver_memory(fake)
    assert alloc[0] == "cuMemAllocAsync" and frees == [("cuMemFreeAsync", frees[0][1], 9)]


def test_a_scratch_allocation_that_calls_again(monkeypatch, cupy, made, general,
                                               launch_path) -> None:
    """The driver's allocation for stream= runs Python that calls the program again, on
    another stream and on the current one, then empties the entry cache: every call right,
    each free after its own call's launches on its own stream, nothing left allocated."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs, ys = [1.0, 2.0, 3.0, 4.0], [5.0, 1.0, 2.0, 3.0, 4.0]
    x, out = NDArray(xs), NDArray([0.0] * 4)
    y, outy = NDArray(ys), NDArray([0.0] * 5)
    _warm(prog, x, general=general)
    _warm(prog, y, general=general)
    real = fake.cuMemAllocAsync
    armed = [True]
    inner: list = []

    def allocate(n, s):
        if armed[0]:
            armed[0] = False
            inner.append(call_program(prog, y, out=outy, stream=11) is outy
                         and outy.values() == _expected(ys))
            inner.append(call_program(prog, x).values() == _expected(xs))
            if launch_path.startswith("C"):
                bind(prog).call.__self__.hooks.core.cache.clear()
            armed[0] = True
        return real(n, s)

    monkeypatch.setattr(fake, "cuMemAllocAsync", allocate)
    gc.collect()
    fake.memory.clear()
    for _ in range(3):
        inner.clear()
        fake.calls.clear()
        assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
        assert inner == [True, True]
        mine = [c for c in fake.calls if c[0] == "cuMemFreeAsync" or
                c[0] == "cuLaunchKernel" and c[5] == 9]
        assert [c[0] for c in mine[-4:]] == ["cuLaunchKernel"] * 3 + ["cuMemFreeAsync"]
        assert mine[-1][2] == 9
    assert general == [] and not fake.callback_errors
    gc.collect()
    assert fake.memory == {}


# ---- several outputs, empty scratch -----------------------------------------------------------
def test_two_outputs_with_stream(monkeypatch, torch, cupy, made, allocations, general,
                                 launch_path) -> None:
    """out=(z, w) with stream=: the fast path, one scratch buffer for that stream (torch's
    pool, CuPy's stream-ordered), right; CuPy's stream 0 the general path's."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS2)))
    prog = _two_output_program()
    xs = [1.0, 2.0, 3.0]
    x = FakeTensor(xs, torch.float32)
    _warm(prog, x, general=general)
    z, w = FakeTensor([0.0] * 3, torch.float32), FakeTensor([0.0], torch.float32)
    allocations.clear()
    fake.calls.clear()
    assert call_program(prog, x, out=(z, w), stream=5) == (z, w)
    assert z.values() == _expected(xs) and w.values() == [2 * sum(xs)]
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 5))]
    assert {c[5] for c in _launches(fake)} == {5} and general == []
    c = NDArray(xs)
    _warm(prog, c, general=general)
    made.clear()
    general.clear()
    for stream in (5, 0):
        zc, wc = NDArray([0.0] * 3), NDArray([0.0])
        fake.calls.clear()
        assert call_program(prog, c, out=(zc, wc), stream=stream) == (zc, wc)
        assert zc.values() == _expected(xs) and wc.values() == [2 * sum(xs)]
        sizes = [m[1] for m in _driver_memory(fake) if m[0] == "cuMemAllocAsync"]
        assert sizes == ([2 * SCRATCH_ALIGN] if stream else [12, 4])
    assert general == [("scr_two", True, 0)] and made == []


def _empty_scratch_program() -> Compiled:
    """z = 2x + 2 sum(x) in one launch whose only scratch buffer is empty."""
    n = kp.sym("n")
    e = TensorSpec("x", kp.f32, ("n",)), TensorSpec("z", kp.f32, ("n",), role="out")
    launch = Launch("direct_e", "m", (1,), (1,), (Arg.buffer("x"), Arg.buffer("e"),
                                                  Arg.buffer("z"), Arg.of(n, kp.i32)))
    s = KernelSummary("empty_scratch", e, (Variant((launch,),
                                                   (Scratch("e", kp.f32, (n - n,)),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-empty-scratch", "fake", 13000)
    return Compiled(s, (Module("m", ("direct_e",), (img,)),))


def _direct_e(grid, block, shmem, v) -> None:
    x, _e, z, n = v
    KERNELS["direct"][1](grid, block, shmem, (x, z, n))


def test_an_empty_scratch_with_stream(monkeypatch, torch, cupy, made, allocations, general,
                                      launch_path) -> None:
    """A variant whose only scratch buffer is empty, with stream=: nothing allocated (its
    pointer NULL), the fast path for torch and for CuPy's ordinary streams; CuPy's stream 0:
    the general path's on every path alike."""
    fake = install(monkeypatch, FakeDriver(kernels={"direct_e": ("QQQi", _direct_e)}))
    prog = _empty_scratch_program()
    xs = [1.0, 2.0, 3.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 3, torch.float32)
    c, outc = NDArray(xs), NDArray([0.0] * 3)
    _warm(prog, x, general=general)
    _warm(prog, c, general=general)
    allocations.clear()
    fake.calls.clear()
    general.clear()
    assert call_program(prog, x, out=out, stream=5) is out and out.values() == _expected(xs)
    assert call_program(prog, c, out=outc, stream=9) is outc and outc.values() == _expected(xs)
    assert allocations == [] and made == [] and _driver_memory(fake) == []
    assert [(c[5], c[6][1]) for c in _launches(fake)] == [(5, 0), (9, 0)]  # e: NULL
    assert general == []
    assert call_program(prog, c, out=outc, stream=0) is outc
    assert general == [("empty_scratch", True, 0)]


# ---- references -------------------------------------------------------------------------------
def test_no_references_are_left(monkeypatch, torch, cupy, made, allocations, general,
                                launch_path, exchange) -> None:
    """Calls with stream= (a stream object, small-int handles whose reference counts show a
    leak) on torch, and on CuPy both the fast path (handle 9) and the general path's default
    stream (the C type's branch back to it): no reference left on the out= arrays, the
    stream, the handles, the device state or the device number."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    c, outc = NDArray(xs), NDArray([0.0] * 4)
    s = TorchStream(0x99)

    def calls() -> None:
        call_program(prog, x, out=out, stream=s)
        call_program(prog, x, out=out, stream=0x98)
        call_program(prog, c, out=outc, stream=0x97)
        call_program(prog, c, out=outc, stream=0)

    for _ in range(3):
        calls()
    described = exchange.described if exchange is not None else None
    _forget(fake, allocations, made, general, described)
    st = bind(prog)._states[0]
    watched = (out, outc, s, 0x99, 0x98, 0x97, st, 0, torch.uint8)
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(50):
        calls()
    assert len(general) == 50  # stream 0 on CuPy
    _forget(fake, allocations, made, general, described)
    assert [sys.getrefcount(o) for o in watched] == before
    assert out.values() == _expected(xs) and outc.values() == _expected(xs)


def test_a_default_stream_call_leaves_no_entry_behind(monkeypatch, cupy, made, general,
                                                      launch_path) -> None:
    """CuPy calls with scratch on stream 0 over more keys than the C type's entry cache holds
    (each such call takes its key's entry, then goes to the general path): the entries the
    cache lets go are freed (a reference kept would keep each one's memory)."""
    if not launch_path.startswith("C"):
        pytest.skip("the C type's entry cache")
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    arrays = {n: (NDArray([1.0] * n), NDArray([0.0] * n)) for n in range(4, 4 + 600)}
    _warm(prog, *arrays[4][:1], general=general)

    def sweep() -> None:
        for x, out in arrays.values():
            call_program(prog, x, out=out, stream=0)
        fake.calls.clear()
        fake.launch_contexts.clear()
        fake.memory.clear()
        general.clear()
        gc.collect()

    sweep()
    blocks = sys.getallocatedblocks()
    sweep()
    sweep()
    assert sys.getallocatedblocks() - blocks < 600  # a leak: several blocks per key and sweep


# ---- arrays.TorchAdapter's stream objects -------------------------------------------------------
def _counting(torch, monkeypatch) -> list:
    made: list = []

    def external(handle, device=None):
        made.append(handle)
        return ("ext", handle, device)

    monkeypatch.setattr(torch.cuda, "ExternalStream", external)
    return made


def test_two_streams_in_turn_are_each_made_once(torch, monkeypatch, launch_path) -> None:
    if launch_path != "C":
        pytest.skip("arrays.py alone")
    made = _counting(torch, monkeypatch)
    adapter = TorchAdapter(torch)
    for _ in range(4):
        for handle in (0x71, 0x72):
            t, _ = adapter.empty((2,), kp.uint8, 0, handle)
            assert t.allocated_on == ("ext", handle, ("cuda", 0))
    assert made == [0x71, 0x72]


def test_the_bound_holds_after_every_new_stream(torch, monkeypatch, launch_path) -> None:
    if launch_path != "C":
        pytest.skip("arrays.py alone")
    made = _counting(torch, monkeypatch)
    adapter = TorchAdapter(torch)
    for k, handle in enumerate(range(0x2000, 0x2000 + 2 * STREAM_OBJECTS_KEPT + 1)):
        adapter.empty((1,), kp.float32, 0, handle)
        assert len(adapter._stream_objects) <= STREAM_OBJECTS_KEPT, k
        adapter.empty((1,), kp.float32, 0, handle)  # just made: remembered
        assert len(made) == k + 1


def test_a_captured_current_stream_takes_stream_ordered_scratch(monkeypatch, cupy, made, general,
                                                                launch_path) -> None:
    """Without stream=, while CuPy's current stream is being captured into a CUDA graph: the
    scratch is stream-ordered memory of the driver's on that stream (the code 7c35d2c renamed
    and shares with stream=), freed there after the launches; not CuPy's pool."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    monkeypatch.setattr(cupy.cuda.Stream, "is_capturing", lambda s: s.ptr == 0x55,
                        raising=False)
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x, out = NDArray(xs), NDArray([0.0] * 4)
    _warm(prog, x, general=general)
    cupy.current.stream = types.SimpleNamespace(ptr=0x55)
    made.clear()
    fake.calls.clear()
    assert call_program(prog, x, out=out) is out and out.values() == _expected(xs)
    alloc, free = _driver_memory(fake)
    assert alloc[1:] == (2 * SCRATCH_ALIGN, 0x55)
    assert free == ("cuMemFreeAsync", _launches(fake)[0][6][1], 0x55)
    assert {c[5] for c in _launches(fake)} == {0x55} and made == [] and general == []
