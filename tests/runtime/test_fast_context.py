"""The fast path's per-thread state on CPU (fake driver, stand-in torch): the current context
is asked for once per thread with one device and on every default-stream call with several; a
context lost between calls is noticed through the failed launch and set again; each thread
packs its own parameter blocks; a value that does not fit its parameter falls back to the
general path (and its error) before anything is launched."""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import CUresult, FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor as FakeTensor, exchange, launch_path, torch  # noqa: E402,F401  (fixtures)
from test_launch_fake import _axpby_impl, axpby  # noqa: E402

CTX0 = 0x100  # the fake driver's primary context of device 0


def _driver(monkeypatch, devices: int = 1) -> FakeDriver:
    fake = install(monkeypatch, FakeDriver(devices=devices,
                                           kernels={"axpby": ("QQQfI", _axpby_impl)}))
    fake.ctx_queries = 0
    real = fake.cuCtxGetCurrent

    def counting() -> tuple:
        fake.ctx_queries += 1
        return real()

    fake.cuCtxGetCurrent = counting
    return fake


def _launches(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _args(torch, n: int = 3) -> tuple:
    x = FakeTensor([float(i) for i in range(n)], torch.float32)
    y = FakeTensor([1.0] * n, torch.float32)
    return x, y


def test_one_device_asks_for_the_context_once_per_thread(monkeypatch, torch) -> None:
    fake = _driver(monkeypatch)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)  # general path: binds device 0
    before = fake.ctx_queries
    for k in range(5):
        assert call_program(prog, x, y, float(k)).values() == [k * v + 1.0 for v in range(3)]
    assert fake.ctx_queries - before == 1  # the first fast call of this thread only
    seen: list[int] = []

    def other() -> None:
        n0 = fake.ctx_queries
        call_program(prog, x, y, 2.0)
        call_program(prog, x, y, 2.0)
        seen.append(fake.ctx_queries - n0)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [1]  # a new thread asks again


def test_several_devices_ask_on_every_default_stream_call(monkeypatch, torch) -> None:
    fake = _driver(monkeypatch, devices=2)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    before = fake.ctx_queries
    for _ in range(4):
        call_program(prog, x, y, 1.0)
    assert fake.ctx_queries - before == 4
    fake.current = CTX0 + 1  # the caller switched this thread to device 1
    assert call_program(prog, x, y, 3.0).values() == [1.0, 4.0, 7.0]
    # device 0's context was pushed for the launch and popped: the thread stays on device 1
    # (review 11; it was left on device 0)
    assert fake.current == CTX0 + 1


def test_lost_context_is_set_again_and_the_launch_repeated(monkeypatch, torch) -> None:
    fake = _driver(monkeypatch)
    real_launch = fake.cuLaunchKernel

    refused: list[int] = []

    def launch(*args):  # like the driver: no current context, no launch
        if fake.current != CTX0:
            refused.append(fake.current)
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return real_launch(*args)

    fake.cuLaunchKernel = launch
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # this thread now remembers the context
    fake.current = 0               # e.g. the caller popped it
    n0 = len(_launches(fake))
    z = FakeTensor([0.0] * 3, torch.float32)
    assert call_program(prog, x, y, 2.0, out=z) is z and z.values() == [1.0, 3.0, 5.0]
    assert refused == [0]  # the remembered context was tried first, once
    assert fake.current == CTX0 and len(_launches(fake)) == n0 + 1


def test_launch_error_with_the_right_context_is_raised(monkeypatch, torch) -> None:
    fake = _driver(monkeypatch)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)
    fake.launch_error = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(LaunchError, match="launching axpby with grid .*CUDA_ERROR_INVALID_VALUE"):
        call_program(prog, x, y, 1.0)


def test_threads_pack_their_own_blocks(monkeypatch, torch, launch_path) -> None:
    fake = _driver(monkeypatch)
    real_launch = fake.cuLaunchKernel
    used: dict[int, set] = {}

    def launch(*args):  # record which parameter block each thread passed
        used.setdefault(threading.get_ident(), set()).add(args[9])
        return real_launch(*args)

    fake.cuLaunchKernel = launch
    prog = axpby()
    x, y = _args(torch, 64)
    call_program(prog, x, y, 1.0)  # general path (shared blocks, under the program's lock)
    used.clear()
    errors: list[BaseException] = []
    together = threading.Barrier(4)  # all alive at once: no thread id or block is reused

    def work(k: int) -> None:
        try:
            z = FakeTensor([0.0] * 64, torch.float32)
            together.wait()
            for _ in range(50):
                assert call_program(prog, x, y, float(k), out=z) is z
                assert z.values() == [k * v + 1.0 for v in range(64)]
            together.wait()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    blocks = [b for t in threads for b in used[t.ident]]
    if launch_path == "closure":
        assert len(blocks) == 4 and len(set(blocks)) == 4  # one block per thread, all distinct
    else:  # the C path packs each call's block on its own thread's stack
        assert not set(used[threads[0].ident]) & set(used[threads[1].ident])


def test_value_out_of_range_falls_back_before_launching(monkeypatch, torch) -> None:
    fake = _driver(monkeypatch)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    n0 = len(_launches(fake))
    big = (1 << 32) + 3  # n32 (a uint32 parameter) cannot hold this length
    x, y, z = (FakeTensor([0.0] * 3, torch.float32, shape=(big,)) for _ in range(3))
    with pytest.raises(ConstraintError, match="n32 = 4294967299 is outside its dtype range"):
        call_program(prog, x, y, 1.0, out=z)
    assert len(_launches(fake)) == n0


# ---- outputs not shaped like any input: allocated with torch.empty(*sizes, ...) ------------
def _rowsum_impl(grid, block, shmem, v) -> None:
    x, s, n = v
    m = grid[0]
    vals = struct.unpack(f"<{m * n}f", ctypes.string_at(x, 4 * m * n))
    ctypes.memmove(s, struct.pack(f"<{m}f", *[sum(vals[r * n:(r + 1) * n]) for r in range(m)]),
                   4 * m)


def _rowsum(out_shape: tuple) -> Compiled:
    s = KernelSummary("rowsum", (Tensor("x", kp.f32, ("m", "n")),
                                 Tensor("s", kp.f32, out_shape, role="out"),
                                 Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("rowsum", "m", ("m",), (1,),
                                       (Arg.buffer("x"), Arg.buffer("s"), Arg.scalar("n32"))),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-rowsum", "fake", 13000)
    return Compiled(s, (Module("m", ("rowsum",), (img,)),))


@pytest.mark.parametrize("out_shape", [("m",), ()], ids=["1-d", "0-d"])
def test_output_of_another_shape_is_allocated_with_sizes(monkeypatch, torch, out_shape) -> None:
    install(monkeypatch, FakeDriver(kernels={"rowsum": ("QQI", _rowsum_impl)}))
    made: list[tuple] = []

    def empty(*size, dtype, device):  # torch.empty's calling forms: sizes or one tuple
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple) else size
        made.append((size, device))
        return FakeTensor([0.0] * max(1, len(shape) and shape[0]), dtype, shape)

    monkeypatch.setattr(torch, "empty", empty)
    m = 1 if out_shape == () else 3
    prog = _rowsum(out_shape)
    x = FakeTensor([float(i) for i in range(2 * m)], torch.float32, shape=(m, 2))
    call_program(prog, x)   # general path
    from kernelpack.runtime import launcher

    general = launcher.run
    monkeypatch.setattr(launcher, "run", lambda *a: pytest.fail("took the general path"))
    made.clear()
    s = call_program(prog, x)  # fast path
    monkeypatch.setattr(launcher, "run", general)
    assert made == [(((),) if out_shape == () else (3,), ("cuda", 0))]
    assert s.shape == (out_shape and (3,)) and s.values()[:m] == [2 * r * 2 + 1.0 for r in range(m)]


# ---- cupy: contiguity from ndarray._c_contiguous where the array type has it ---------------
def test_cupy_reads_the_stored_contiguity_flag(monkeypatch) -> None:
    from test_fastpath_fake import NDArray, _install_cupy

    class Flagged(NDArray):
        @property
        def _c_contiguous(self) -> bool:
            return self.contig

    class Unread:  # the public flags, which the fast path must not read
        @property
        def c_contiguous(self) -> bool:
            raise AssertionError("flags read on the fast path")

    def make(values: list, contiguous: bool = True) -> Flagged:
        a = Flagged(values, contiguous=contiguous)
        a.contig = contiguous
        return a

    fake = _driver(monkeypatch)
    cupy = _install_cupy(monkeypatch)
    cupy.ndarray = Flagged
    cupy.empty_like = lambda a: make([0.0] * len(a.values()))
    prog = axpby()
    x, y, z = make([1.0, 2.0]), make([10.0, 20.0]), make([0.0, 0.0])
    call_program(prog, x, y, 1.0, out=z)  # general path (reads flags), binds device 0
    n0 = len(_launches(fake))
    x.flags = y.flags = z.flags = Unread()
    assert call_program(prog, x, y, 2.0, out=z) is z and z.values() == [12.0, 24.0]
    assert len(_launches(fake)) == n0 + 1
    with pytest.raises(LaunchError, match="'y' is not C-contiguous"):
        call_program(prog, make([1.0, 2.0]), make([1.0, 2.0], contiguous=False), 1.0)


def _launch_needs_the_primary_context(fake: FakeDriver, device: int = 0) -> list:
    """Make the fake's cuLaunchKernel refuse (CUDA_ERROR_INVALID_CONTEXT) while another
    context than ``device``'s primary one is current, as the driver does; returns the list of
    the contexts it refused under."""
    real_launch = fake.cuLaunchKernel
    refused: list[int] = []

    def launch(*args):
        if fake.current != CTX0 + device:
            refused.append(fake.current)
            return (CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return real_launch(*args)

    fake.cuLaunchKernel = launch
    return refused


def test_the_per_thread_default_stream_checks_the_context(monkeypatch, torch) -> None:
    """Stream handle 2 (CU_STREAM_PER_THREAD) is a default stream too: the launch goes to the
    thread's current context, so the device's is made current first (pushed over another
    device's, popped after). Kills review 60's F24 (``sh < 2``: handle 2 skipped the check,
    and the launch ran in device 1's context)."""
    fake = _driver(monkeypatch, devices=2)
    refused = _launch_needs_the_primary_context(fake)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # warm
    fake.current = CTX0 + 1  # this thread works on device 1
    z = FakeTensor([0.0] * 3, torch.float32)
    assert call_program(prog, x, y, 2.0, out=z, stream=2) is z
    assert z.values() == [1.0, 3.0, 5.0]
    assert refused == [] and _launches(fake)[-1][5] == 2
    assert fake.current == CTX0 + 1  # device 0's context was popped again


def test_a_failed_launch_on_a_context_just_confirmed_is_not_retried(monkeypatch,
                                                                    torch) -> None:
    """A launch that fails right after the call confirmed the context (several devices: it is
    asked on every default-stream call) raises its error; asking again would only repeat the
    question. Kills review 60's F35 (the retry also when the thread had not remembered the
    context)."""
    fake = _driver(monkeypatch, devices=2)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)
    fake.launch_error = CUresult.CUDA_ERROR_INVALID_VALUE
    before = fake.ctx_queries
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        call_program(prog, x, y, 1.0)
    assert fake.ctx_queries - before == 1


def test_a_relaunch_under_a_pushed_context_pops_it(monkeypatch, torch) -> None:
    """One device, whose context this thread remembers; the caller then makes a context of
    its own current (not the primary one). The launch fails, the context is checked, the
    primary one pushed over the caller's, the launch repeated, and the caller's context
    current again afterwards. Kills review 60's F36 (no pop: the thread was left in
    kernelpack's context)."""
    fake = _driver(monkeypatch)
    refused = _launch_needs_the_primary_context(fake)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # this thread now remembers the context
    mine = 0x999
    fake.current = mine
    z = FakeTensor([0.0] * 3, torch.float32)
    assert call_program(prog, x, y, 2.0, out=z) is z and z.values() == [1.0, 3.0, 5.0]
    assert refused == [mine]
    assert fake.current == mine


def test_a_relaunch_that_fails_again_raises(monkeypatch, torch) -> None:
    """The remembered context was lost and the launch failed; the context is set again and
    the launch repeated, and when that fails too the call raises (it must not return outputs
    that nothing wrote). Kills review 60's F83 (the second failure ignored)."""
    fake = _driver(monkeypatch)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # this thread now remembers the context
    fake.current = 0               # lost: the check sets it again, then the retry fails too
    fake.launch_error = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        call_program(prog, x, y, 2.0, out=FakeTensor([0.0] * 3, torch.float32))
    assert fake.current == CTX0


def test_stream_and_out_without_scratch_stay_on_the_fast_path(monkeypatch, torch,
                                                              launch_path) -> None:
    """A program without scratch buffers called with ``stream=`` and ``out=`` launches from
    the fast path (only scratch, which a fast call allocates for the current stream, sends
    such calls to the general path). Kills review 60's F79 (``scratch_layout`` answering
    ``(0, ())`` for no scratch: the closure then sent every such call to the general path)."""
    from kernelpack.runtime.launcher import BoundProgram

    fake = _driver(monkeypatch)
    prog = axpby()
    x, y = _args(torch)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)
    general: list = []
    original = BoundProgram._call

    def counting(self, args, out, stream):
        general.append(stream)
        return original(self, args, out, stream)

    monkeypatch.setattr(BoundProgram, "_call", counting)
    z = FakeTensor([0.0] * 3, torch.float32)
    assert call_program(prog, x, y, 2.0, out=z, stream=0x77) is z
    assert z.values() == [1.0, 3.0, 5.0] and _launches(fake)[-1][5] == 0x77
    assert general == []
