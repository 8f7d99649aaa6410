"""Review 62: a call's scratch straight from torch's caching allocator (3240736, 13a5f7b):
``arrays.TorchAdapter.scratch`` / ``_PoolBlock``, fast_torch's ``allocate_scratch``,
``execute._temporary`` and _fastcall.c's ``scratch_pointer``. On CPU: the stand-in torch of
test_fastpath_fake.py given the allocator's three entry points over host memory (``Pool``
here records every block taken and every hand-back, a second one included), the fake
driver, the three torch launch paths (C, C through DLPack's exchange API, the closure) and
the general path (``general`` counts its calls, review 60).

Copy reviewed: bf8936d (the mutants ran in a copy of it); this file passes at 8e016e4 too.

Bugs found, both fixed in session 43 by the owner-first form below (the two tests were strict
xfails until then). Both need a KeyboardInterrupt (a SIGINT) landing inside
``TorchAdapter.scratch``; :func:`_interrupt_sweep` raises one at each instruction boundary of
arrays.py's code in turn, a superset of CPython's own checks (every CALL's end, RESUME,
backward jumps):

- a block handed back twice (test_an_interrupt_anywhere_in_scratch_hands_every_block_back_
  once): ``except BaseException: delete(ptr)`` also runs when the interrupt comes once
  ``_PoolBlock(ptr, delete)`` exists (as that CALL ends; __init__'s last instructions), and
  the dropped owner's ``__del__``
  hands the block back again: ``raw_delete`` twice. With torch the second one raises
  "invalid device pointer" (swallowed by ``__del__``) or, if another thread was given the
  block meanwhile (``raw_delete`` releases the GIL), frees that thread's live block.
  Shortest reproduction: a ``_PoolBlock`` subclass whose ``__init__`` raises
  KeyboardInterrupt after ``super().__init__`` -> two ``raw_delete(ptr)``.
- a block leaked (the same test): a SIGINT that arrives while
  torch's C ``raw_alloc`` runs (GIL released: cudaMalloc, an OOM retry) is raised as its CALL
  ends, before ``ptr =`` stores the bare int, so nothing ever hands the block back (a
  ``torch.empty`` tensor dropped with the frame freed itself). ``ctypes`` shows the mechanism:
  ``r = libc_raise(SIGINT)`` leaves ``r`` unbound, ``l.extend(map(libc_raise, (SIGINT,)))``
  leaves ``l == [0]``.

The fix (checked against both and tests/runtime in a copy first, then applied to arrays.py):
the owner first, the block taken into it in one step of C, no try/except::

    block = _PoolBlock(delete)  # __slots__ ptr, held, _delete: 0, [], delete
    block.held.extend(map(alloc, (nbytes,), (0 if stream == 1 else stream,)))
    ptr = block.ptr = block.held[0]
    return block, ptr           # __del__: raw_delete(p) for p in held

(``__del__`` itself, being Python, can still be interrupted as it starts; an owner type in
C would close that window too.)

Mutants (32, one at a time in the copy, each C one rebuilt with gcc and the copy's
``_launch`` checked to load from it, the originals restored after each; "suite":
tests/runtime without this file; "here": this file):

arrays.py
- A01 no device check: suite (test_torch_pool_blocks' ..._another_device_keeps_torch_empty)
  and here (test_tensors_on_device_1_with_device_1_current).
- A02 no ``nbytes > 0``: suite only (test_the_legacy_default_streams_handle_...).
- A03 no 1 -> 0 handle mapping: suite and here (..._two_names_and_the_per_thread_stream,
  test_an_in_place_call_reads_its_copy_from_a_block).
- A04 ``__del__`` hands nothing back, A06 ``torch.empty`` always, A14 the owner given
  ``raw_alloc`` to hand back with, A12 ``Adapter.scratch`` on stream 0, A13 ``nbytes > 4``:
  suite and here.
- A05 ``__del__`` hands the block back twice: here only (every test's ``Pool.check``; the
  suite's Pool raises KeyError in ``__del__``, which Python only warns about).
- A07 no hand-back when the owner cannot be made, A08 ``except Exception``: here only
  (test_an_owner_that_cannot_be_made_hands_the_block_back).
- A09 handle 2 (CU_STREAM_PER_THREAD) mapped to 0 too: here only (..._per_thread_stream).
- A10 missing entry points not noticed: suite (99 tests).
- A11 torch's current device compared with 0: here only (test_tensors_on_device_1_...).

fast_torch.py
- F01 stream 0 for the current stream: here only (test_the_current_streams_block_is_taken_...:
  the stand-in's current raw stream was 0 in every suite test, so 0 and it agreed).
- F02 None for the current stream, F03 always the current stream, F05 back to ``empty()``:
  suite and here.
- F04 ``torch_adapter(torch)`` per call: equivalent (the same cached adapter).

execute.py (``_temporary``)
- E01 back to ``empty()``, E03 stream 0: suite and here.
- E02 ``keep.append`` dropped: suite by a crash (SIGSEGV in test_arrays_torch_stream's
  test_both_paths_make_a_streams_object_once: kernels writing freed memory), here without
  one (test_an_in_place_call_reads_its_copy_from_a_block: the copy handed back before the
  launches).
- E04 device 0: here only (test_tensors_on_device_1_...).

_fastcall.c (``scratch_pointer`` and its call)
- C01 ``output_pointer`` for everything, C08 the tensor-type test inverted, C09 the call site
  back to ``output_pointer``: suite and here.
- C02 the conversion's error ignored: suite only (test_torch_pool_blocks'
  test_a_scratch_owner_whose_pointer_is_not_one_is_an_error).
- C04 a torch tensor's ``data_ptr()`` by name too: suite only (test_fast_scratch's
  test_scratch_calls_leave_no_references[C-dlpack], which counts the exchange API's reads).
- C05 ``data_ptr()``'s result not released: here only (test_calls_leave_no_reference_...).
- C06 a raising ``data_ptr()`` not an error: here only (test_a_scratch_owner_whose_data_ptr_raises).
- C03 no ``self->cupy`` test: equivalent (CuPy's scratch is always a ``cupy.ndarray``, the
  type test's own, and ``output_pointer`` tests ``self->cupy`` first). C07
  ``PyErr_Occurred()`` alone: equivalent (``PyLong_AsUnsignedLongLong`` fails with -1 only).

Also: test_torch_pool_blocks.py imports no ``exchange`` fixture, so its "C-dlpack" runs are
the C path's; this file imports it. Values that do not fit their parameters are the
planner's ConstraintError before any block is taken (test_a_value_that_does_not_fit_...);
after the blocks only driver calls can fail (copy, zero-fill, launch: tested here).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import arrays, call_program
from kernelpack.runtime.arrays import TorchAdapter, _PoolBlock
from kernelpack.runtime.fastpath import SCRATCH_ALIGN
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scratch,
                                Tensor as TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from interrupt_at import run_interrupted  # noqa: E402
from test_fast_scratch import KERNELS, _expected, _launches, _program  # noqa: E402
from test_fast_scratch import allocations  # noqa: E402,F401
from test_torch_pool_blocks import install_pool  # noqa: E402
from test_fastpath_fake import Tensor as FakeTensor, select_path  # noqa: E402
from test_fastpath_fake import exchange, torch  # noqa: E402,F401 - fixtures (exchange: autouse)
from test_in_place_refused import _kernels as in_place_kernels, three_x  # noqa: E402
from test_review60_closure_mutants import general  # noqa: E402,F401

SPLIT = 2 * SCRATCH_ALIGN  # the fast paths' one block for _program's split variant (n >= 4)


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


class Pool:
    """torch's raw_alloc / raw_delete / getDevice over host memory. Every hand-back is
    recorded, a second one of a block too (``_PoolBlock.__del__`` would swallow an error
    raised here); blocks handed back stay allocated (``freed``) so that no address is reused
    within a test and a count of hand-backs per address means one block each."""

    def __init__(self) -> None:
        self.device = 0
        self.fake: FakeDriver | None = None
        self.live: dict[int, ctypes.Array] = {}
        self.freed: list[ctypes.Array] = []
        self.taken: list[tuple[int, int, int]] = []    # (nbytes, stream handle, ptr)
        self.deletes: list[tuple[int, int]] = []       # (ptr, driver calls made before)
        self._lock = threading.Lock()

    def raw_alloc(self, nbytes: int, stream: int) -> int:
        buf = ctypes.create_string_buffer(nbytes)
        ptr = ctypes.addressof(buf)
        with self._lock:
            self.live[ptr] = buf
            self.taken.append((nbytes, stream, ptr))
        return ptr

    def raw_delete(self, ptr: int) -> None:
        with self._lock:
            self.deletes.append((ptr, len(self.fake.calls) if self.fake else 0))
            buf = self.live.pop(ptr, None)
            if buf is not None:
                self.freed.append(buf)

    def get_device(self) -> int:
        return self.device

    def sizes(self, since: int = 0) -> list[tuple[int, int]]:
        """``(nbytes, stream handle)`` of the blocks taken from the ``since``-th on."""
        return [(n, s) for n, s, _ in self.taken[since:]]

    def check(self) -> None:
        """Every block taken handed back exactly once (after a collection: a failed call's
        traceback holds the frames that hold its blocks until it goes)."""
        gc.collect()
        assert Counter(p for p, _ in self.deletes) == Counter(p for _, _, p in self.taken)
        assert self.live == {}


@pytest.fixture
def pool(torch, monkeypatch) -> Pool:
    return install_pool(torch, monkeypatch, Pool())


class Current:
    """torch's current raw stream (0x33 at first: not 0, the stand-in's default), read anew
    on every call as torch's is, through ``_cuda_getCurrentRawStream`` and (C-dlpack) the
    exchange API's ``current_work_stream``, which agree in torch."""

    def __init__(self, exchange) -> None:
        self.exchange = exchange
        self.set(0x33)

    def set(self, raw: int) -> None:
        self.raw = raw
        if self.exchange is not None:
            self.exchange.stream = raw


@pytest.fixture
def current(torch, exchange, monkeypatch) -> Current:
    now = Current(exchange)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: now.raw)
    return now


def _warm(monkeypatch, torch, pool: Pool, general: list, n: int = 4) -> tuple:
    """The fake driver, :func:`_program`, two calls on ``n`` values (the general path binds
    the device, the second builds the fast path), the records cleared: ``(fake, prog, xs,
    x, out)``."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    pool.fake = fake
    prog = _program()
    xs = [float(i + 1) for i in range(n)]
    x, out = FakeTensor(xs, torch.float32), FakeTensor([0.0] * n, torch.float32)
    call_program(prog, x, out=out)
    call_program(prog, x, out=out)
    pool.check()
    pool.taken.clear()  # (each handed back once)
    pool.deletes.clear()
    fake.calls.clear()
    general.clear()
    return fake, prog, xs, x, out


# ---- which pool ---------------------------------------------------------------------------------

def test_the_current_streams_block_is_taken_on_the_current_stream(monkeypatch, torch, pool,
                                                                   current, general,
                                                                   allocations,
                                                                   launch_path) -> None:
    """Without ``stream=`` the fast paths take the block for torch's current raw stream, read
    on every call (0x33, then 0x44: handles other than 0, the stand-in's default), and launch
    there; the general path's buffers too. No torch.empty at all."""
    fake, prog, xs, x, out = _warm(monkeypatch, torch, pool, general)
    for raw in (0x33, 0x44):
        current.set(raw)
        fake.calls.clear()
        start = len(pool.taken)
        z = call_program(prog, x)
        assert z.values() == _expected(xs)
        assert pool.sizes(start) == [(SPLIT, raw)]
        assert {c[5] for c in _launches(fake)} == {raw}
        assert call_program(prog, x, out=out) is out and out.values() == _expected(xs)
        assert pool.sizes(start) == [(SPLIT, raw)] * 2
    assert general == []
    # the general path: each buffer apart, on the current stream
    start = len(pool.taken)
    y = FakeTensor([1.0, 2.0, 3.0, 4.0, 5.0], torch.float32)
    assert bind(prog)._call((y,), None, None).values() == _expected(y.values())
    assert sorted(pool.sizes(start)) == [(4, 0x44), (20, 0x44)] and len(general) == 1
    assert [a for a in allocations if a[1] == "uint8"] == []  # (the output: torch.empty)
    pool.check()


@pytest.mark.parametrize("handle, pool_key", [(1, 0), (2, 2), (0, 0), (9, 9)])
def test_the_default_streams_two_names_and_the_per_thread_stream(monkeypatch, torch, pool,
                                                                 current, general,
                                                                 launch_path, handle,
                                                                 pool_key) -> None:
    """``stream=1`` (CU_STREAM_LEGACY) is the default stream, whose pool torch keys by 0;
    ``stream=2`` (CU_STREAM_PER_THREAD) is not: its own key, as TorchAdapter.empty's
    ``ExternalStream(2)`` was before the change. The launches keep the handle given. On the
    fast paths and on the general path."""
    fake, prog, xs, x, out = _warm(monkeypatch, torch, pool, general)
    assert call_program(prog, x, out=out, stream=handle) is out
    assert out.values() == _expected(xs)
    assert pool.sizes() == [(SPLIT, pool_key)] and general == []
    assert {c[5] for c in _launches(fake)} == {handle}
    assert bind(prog)._call((x,), out, handle) is out and len(general) == 1
    assert out.values() == _expected(xs)
    assert sorted(pool.sizes(1)) == [(4, pool_key), (16, pool_key)]
    pool.check()


def test_tensors_on_device_1_with_device_1_current(monkeypatch, torch, pool, allocations,
                                                   general, launch_path) -> None:
    """The device check compares torch's current device with the tensors' (not with 0):
    device 1 current and tensors there take blocks; device 0 current, torch.empty on
    device 1."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS), devices=2))
    pool.fake = fake
    pool.device = 1
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(xs, torch.float32, device=1)
    out = FakeTensor([0.0] * 4, torch.float32, device=1)
    call_program(prog, x, out=out)
    assert sorted(pool.sizes()) == [(4, 0), (16, 0)] and allocations == []
    for stream in (None, 0x51):
        assert call_program(prog, x, out=out, stream=stream) is out
        assert out.values() == _expected(xs)
    assert pool.sizes(2) == [(SPLIT, 0), (SPLIT, 0x51)] and allocations == []
    assert len(general) == 1  # the first call
    pool.device = 0
    assert call_program(prog, x, out=out, stream=0x51) is out
    assert out.values() == _expected(xs)
    assert len(pool.taken) == 4 and allocations == [((SPLIT,), "uint8", ("ext", 0x51))]
    pool.check()


# ---- failures after a block is taken ------------------------------------------------------------

def test_a_failed_launch_hands_every_block_back_once(monkeypatch, torch, pool, current,
                                                     general, launch_path) -> None:
    """A launch the driver refuses: on the fast paths (one block) and the general path (one
    per buffer), every block taken goes back once, and calls work again afterwards."""
    fake, prog, xs, x, out = _warm(monkeypatch, torch, pool, general)
    fake.launch_error = 719  # CUDA_ERROR_LAUNCH_FAILED
    for stream in (None, 9):
        with pytest.raises(LaunchError):
            call_program(prog, x, out=out, stream=stream)
        with pytest.raises(LaunchError):
            bind(prog)._call((x,), out, stream)  # the general path
    assert sorted(pool.sizes()) == sorted([(SPLIT, 0x33), (SPLIT, 9), (4, 0x33), (16, 0x33),
                                           (4, 9), (16, 9)])
    pool.check()
    fake.launch_error = 0
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    pool.check()


def test_a_failed_copy_or_zero_fill_hands_every_block_back_once(monkeypatch, torch, pool,
                                                                current, general,
                                                                launch_path) -> None:
    """The general path's driver calls between its blocks and its launches (the copy of an
    input read from a copy, the zero-fill of a zeroed scratch buffer) failing: the error
    comes out and every block goes back once. (Values that do not fit their parameters are
    the planner's ConstraintError, before any block: see the next test.)"""
    fake = install(monkeypatch, FakeDriver(kernels={**KERNELS, **in_place_kernels()}))
    pool.fake = fake
    monkeypatch.setattr(fake, "cuMemcpyDtoDAsync", lambda *a: (1,))
    monkeypatch.setattr(fake, "cuMemsetD8Async", lambda *a: (1,))
    x = FakeTensor([1.0, 2.0, 3.0], torch.float32)
    for stream in (None, 9):
        with pytest.raises(LaunchError):
            call_program(three_x(), x, out=x, stream=stream)  # the copy of x
        with pytest.raises(LaunchError):
            call_program(_program(), x, stream=stream)  # n == 3: a zeroed accumulator
    assert sorted(pool.sizes()) == sorted([(12, 0x33), (4, 0x33), (12, 9), (4, 9)])
    assert _launches(fake) == [] and x.values() == [1.0, 2.0, 3.0]
    pool.check()


def _unfit_program() -> Compiled:
    """:func:`_program`'s split variant alone, its first launch's ``n`` an i32 of ``n *
    2**30``: beyond i32 for n >= 2."""
    n = kp.sym("n")

    def one(kernel: str, *names: str, count: object = None) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names],
                                                Arg.of(count if count is not None else n,
                                                       kp.i32)))

    split = Variant((one("double", "x", "s1", count=n * (1 << 30)), one("total", "s1", "s2"),
                     one("add", "s1", "s2", "z")),
                    (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))))
    s = KernelSummary("unfit", (TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("z", kp.f32, ("n",), role="out")), (split,))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-unfit", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS), (img,)),))


def test_a_value_that_does_not_fit_takes_no_block(monkeypatch, torch, pool, current, general,
                                                  launch_path) -> None:
    """A launch value beyond its parameter is the planner's ConstraintError, found before
    the call takes any block (on every path)."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    pool.fake = fake
    prog = _unfit_program()
    x, out = FakeTensor([1.0] * 4, torch.float32), FakeTensor([0.0] * 4, torch.float32)
    for stream in (None, 9, None):
        with pytest.raises(ConstraintError, match="does not fit int32"):
            call_program(prog, x, out=out, stream=stream)
    assert _launches(fake) == [] and pool.taken == []
    pool.check()


def test_a_wrong_out_takes_no_block(monkeypatch, torch, pool, current, general,
                                    launch_path) -> None:
    fake, prog, _, x, _ = _warm(monkeypatch, torch, pool, general)
    wrong = (FakeTensor([0.0] * 5, torch.float32), FakeTensor([0] * 4, torch.int32))
    for bad in wrong:
        for stream in (None, 9):
            with pytest.raises(LaunchError, match="out 'z' has"):
                call_program(prog, x, out=bad, stream=stream)
    assert pool.taken == [] and _launches(fake) == []
    pool.check()


def test_a_scratch_owner_whose_data_ptr_raises(monkeypatch, torch, pool, current, general,
                                               launch_path) -> None:
    """The owner's own error comes out (the C path reads data_ptr() by name), nothing is
    launched, and the block goes back once."""
    fake, prog, _, x, out = _warm(monkeypatch, torch, pool, general)

    def broken(self):
        raise RuntimeError("no pointer today")

    monkeypatch.setattr(_PoolBlock, "data_ptr", broken)
    for stream in (None, 9):
        with pytest.raises(RuntimeError, match="no pointer today"):
            call_program(prog, x, out=out, stream=stream)
    assert _launches(fake) == [] and pool.sizes() == [(SPLIT, 0x33), (SPLIT, 9)]
    pool.check()


@pytest.mark.parametrize("exc", [MemoryError, KeyboardInterrupt])
def test_an_owner_that_cannot_be_made_hands_the_block_back(monkeypatch, torch, pool, current,
                                                           general, launch_path, exc) -> None:
    """``_PoolBlock`` failing before it exists (MemoryError making the object, or a
    KeyboardInterrupt, a BaseException, at that point): the block goes back, once, and the
    error comes out, from the adapter and from a call."""
    _, prog, _, x, out = _warm(monkeypatch, torch, pool, general)

    class Unmade:
        def __new__(cls, *args):
            raise exc

    monkeypatch.setattr(arrays, "_PoolBlock", Unmade)
    with pytest.raises(exc):
        call_program(prog, x, out=out, stream=9)
    with pytest.raises(exc):
        arrays.torch_adapter(torch).scratch(64, 0, 5)
    # (a block taken first, as now, or none, the owner made first: either way none stays out)
    assert pool.sizes() in ([(SPLIT, 9), (64, 5)], [])
    pool.check()


def _interrupt_sweep(torch, pool: Pool) -> list[tuple[int, int, int]]:
    """``TorchAdapter.scratch(64, 0, 5)`` once per instruction boundary of arrays.py's code
    it runs (its frames and the owner's), a KeyboardInterrupt raised at that boundary: what
    a SIGINT arriving meanwhile does, as the eval loop raises it at its next check (CPython
    at every CALL's end, at RESUME and backward jumps; every boundary here, a superset).
    A signal that lands while torch's C raw_alloc runs (GIL released: cudaMalloc, an OOM
    retry) is raised as that CALL ends, before its result is stored. Per boundary ``(line,
    fewest, most hand-backs of a block taken)``, until a call runs through uninterrupted
    (:func:`interrupt_at.run_interrupted`)."""
    adapter = TorchAdapter(torch)
    seen: list[tuple[int, int, int]] = []
    k = 1
    while True:
        t0, d0 = len(pool.taken), len(pool.deletes)
        at, got = run_interrupted(lambda: adapter.scratch(64, 0, 5),
                                  {arrays.__file__: "arrays.py"}, k)
        del got
        gc.collect()
        if at is None:
            return seen
        taken = [p for _, _, p in pool.taken[t0:]]
        handed = Counter(p for p, _ in pool.deletes[d0:])
        assert set(handed) <= set(taken)
        counts = [handed[p] for p in taken]
        seen.append((at[1], min(counts, default=1), max(counts, default=1)))
        k += 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_anywhere_in_scratch_hands_every_block_back_once(torch, pool,
                                                                     launch_path) -> None:
    """Both bugs of the module docstring: no block handed back twice, none left behind."""
    if launch_path != "closure":
        pytest.skip("arrays.py alone")
    seen = _interrupt_sweep(torch, pool)
    assert len(seen) > 10  # (the sweep ran)
    assert [line for line, _, most in seen if most > 1] == []
    assert [line for line, fewest, _ in seen if fewest == 0] == []
    assert pool.live == {}


# ---- the general path's copies ------------------------------------------------------------------

def test_an_in_place_call_reads_its_copy_from_a_block(monkeypatch, torch, pool, current,
                                                      general, launch_path) -> None:
    """``out=x`` for ``o = 2x; o += x`` (runtime/in_place.py refuses the pair): the general
    path copies ``x`` into a block of the call's stream, queued before the launches, which
    read the copy, and hands the block back after them."""
    fake = install(monkeypatch, FakeDriver(kernels=in_place_kernels()))
    pool.fake = fake
    prog = three_x()
    x = FakeTensor([1.0, 2.0, 3.0], torch.float32)
    want = [1.0, 2.0, 3.0]
    for stream, key in ((None, 0x33), (9, 9), (1, 0)):
        fake.calls.clear()
        start = len(pool.taken)
        call_program(prog, x, out=x, stream=stream)
        want = [3 * v for v in want]
        assert x.values() == want
        (nbytes, got, block), = pool.taken[start:]
        assert (nbytes, got) == (12, key)
        names = [c[0] for c in fake.calls if c[0] in ("cuMemcpyDtoDAsync", "cuLaunchKernel")]
        assert names == ["cuMemcpyDtoDAsync", "cuLaunchKernel", "cuLaunchKernel"]
        copy = next(c for c in fake.calls if c[0] == "cuMemcpyDtoDAsync")
        assert copy[1:4] == (block, x.data_ptr(), 12)
        assert all(c[6][0] == block for c in _launches(fake))  # both read the copy
        assert pool.deletes[start:] == [(block, len(fake.calls))]  # after the last launch
    o = FakeTensor([0.0] * 3, torch.float32)
    call_program(prog, x, out=o)  # separate arrays: no copy, no block
    assert o.values() == [3 * v for v in want] and len(pool.taken) == 3
    pool.check()


# ---- references and threads ---------------------------------------------------------------------

def test_calls_leave_no_reference_to_a_block_or_its_pointer(monkeypatch, torch, pool, current,
                                                           general, launch_path) -> None:
    """Each call's block goes back as the call returns (no collection needed), and nothing
    keeps its pointer: the int raw_alloc returned is held by the pool's two records alone (a
    reference kept by the C path's data_ptr() read would show as one more)."""
    fake, prog, xs, x, out = _warm(monkeypatch, torch, pool, general)
    for k in range(30):
        stream = (None, 9)[k % 2]
        assert call_program(prog, x, out=out, stream=stream) is out
        assert len(pool.deletes) == len(pool.taken) == k + 1
    assert out.values() == _expected(xs) and general == []
    fake.calls.clear()
    gc.collect()
    counts = {sys.getrefcount(p) for _, _, p in pool.taken}
    # taken, deletes, and what getrefcount itself adds on this Python (the comprehension's p
    # and the argument before 3.14; from 3.14 a borrowed reference counts once): a twin held
    # alike, in a record of one list and as an item of another (no local name of its own)
    twin_taken, twin_deletes = [(None, None, object())], []
    twin_deletes.append(twin_taken[0][2])
    assert counts == {sys.getrefcount(p) for _, _, p in twin_taken}
    pool.check()


def test_threads_calling_at_once_each_get_their_own_blocks(monkeypatch, torch, pool, current,
                                                           general, launch_path) -> None:
    prog = _warm(monkeypatch, torch, pool, general)[1]
    start = threading.Barrier(4, timeout=60)

    def work(k: int) -> None:
        mine = [float(k * 10 + i) for i in range(4 + k)]  # k > 0: a new shape first
        t = FakeTensor(mine, torch.float32)
        o = FakeTensor([0.0] * len(mine), torch.float32)
        start.wait()
        for j in range(25):
            assert call_program(prog, t, out=o, stream=(None, 7 + k)[j % 2]) is o
            assert o.values() == _expected(mine)

    with ThreadPoolExecutor(4) as workers:  # (a worker's exception is raised by list())
        list(workers.map(work, range(4)))
    assert len(pool.taken) == 100
    pool.check()
