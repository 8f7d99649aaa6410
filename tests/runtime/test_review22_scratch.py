"""Review 22: scratch on the fast paths (C FastCall, C through DLPack's exchange API, the
torch and CuPy closures), on CPU with the stand-in frameworks and the fake driver.

Two tests were written failing, each for a bug its docstring explains, and pass since the
fixes: test_outputs_and_scratch_for_the_default_stream_come_from_its_pool
(arrays.TorchAdapter.empty: ``stream=0`` took the current stream's pool) and
test_a_float_beyond_float32_with_scratch (closure only, older than the scratch change:
native-mode struct packs an out-of-range float32 as inf; fastpath.split_scalars now marks the
float32 slots). The others are regression tests of what was checked and found right."""

from __future__ import annotations

import gc
import sys
import threading
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.expr import eq, ge
from kernelpack.runtime import call_program
from kernelpack.runtime.fastpath import SCRATCH_ALIGN, fits
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scratch,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import (NDArray, Tensor as FakeTensor, _prod,  # noqa: E402
                                install_external_stream)
from test_fastpath_fake import cupy, exchange, select_path, torch  # noqa: E402,F401
from test_fast_scratch import (KERNELS, _expected, _floats, _launches, _program,  # noqa: E402
                               _put, allocations)  # noqa: F401


@pytest.fixture(autouse=True, params=["C", "C-dlpack", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


def _fast(prog):
    return getattr(bind(prog).call, "__self__", None)


def _fast_calls(prog, launch_path):
    return _fast(prog).fast_calls if launch_path.startswith("C") else None


def _forget_described(exchange) -> None:
    """The stand-in exchange API keeps every tensor it described: forgotten before counting
    references."""
    if exchange is not None:
        exchange.described.clear()


def _scratch_allocs(allocations):
    return [a for a in allocations if a[1] == "uint8"]


# ---- hooks.scratch re-entering, raising, answering oddly ------------------------------------
def _hook_scratch(torch, monkeypatch, action):
    """Make torch.empty of uint8 (the fast paths' scratch; the general path's too) run
    ``action(inner_empty, shape, dtype, device)`` while ``armed[0]`` is set."""
    inner = torch.empty
    armed = [False]

    def empty(shape, dtype, device):
        if armed[0] and dtype is torch.uint8:
            return action(inner, shape, dtype, device)
        return inner(shape, dtype, device)

    monkeypatch.setattr(torch, "empty", empty)
    return armed


def test_a_scratch_allocation_that_calls_the_program_again(monkeypatch, torch, allocations,
                                                           launch_path) -> None:
    """The scratch hook runs Python (the caching allocator may run finalizers): a call of the
    same program from there, with the same and another key, each with scratch, must leave
    both calls' results right (the outer call's values, entry and outputs held meanwhile)."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs, ys = [1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    x, y = FakeTensor(xs, torch.float32), FakeTensor(ys, torch.float32)
    inner_results = []

    def reenter(inner, shape, dtype, device):
        armed[0] = False  # one level
        inner_results.append(call_program(prog, y))
        inner_results.append(call_program(prog, x))
        if launch_path.startswith("C"):  # drop the entries the outer call may hold
            _fast(prog).hooks.core.cache.clear()
        armed[0] = True
        return inner(shape, dtype, device)

    armed = _hook_scratch(torch, monkeypatch, reenter)
    call_program(prog, x)
    call_program(prog, y)
    armed[0] = True
    for _ in range(3):
        inner_results.clear()
        z = call_program(prog, x)
        assert z.values() == _expected(xs)
        assert [r.values() for r in inner_results] == [_expected(ys), _expected(xs)]
    armed[0] = False
    assert not fake.callback_errors


def test_a_scratch_allocation_that_raises(monkeypatch, torch, allocations, launch_path,
                                          exchange) -> None:
    """An allocation failure (out of memory) is raised as the framework raised it, nothing is
    launched, and the call's output is not leaked; the next call works."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(xs, torch.float32)
    out = FakeTensor([0.0] * 4, torch.float32)

    class OOM(RuntimeError):
        pass

    def fail(inner, shape, dtype, device):
        raise OOM("CUDA out of memory")

    armed = _hook_scratch(torch, monkeypatch, fail)
    call_program(prog, x)
    call_program(prog, x)
    fake.calls.clear()
    armed[0] = True
    with pytest.raises(OOM, match="out of memory"):
        call_program(prog, x)
    _forget_described(exchange)
    gc.collect()
    before = sys.getrefcount(torch.float32), sys.getrefcount(out)
    for _ in range(20):
        with pytest.raises(OOM, match="out of memory"):
            call_program(prog, x)
        with pytest.raises(OOM, match="out of memory"):
            call_program(prog, x, out=out)
    _forget_described(exchange)
    gc.collect()
    after = sys.getrefcount(torch.float32), sys.getrefcount(out)
    assert after == before
    assert _launches(fake) == []
    armed[0] = False
    assert call_program(prog, x).values() == _expected(xs)


def test_a_scratch_allocation_that_is_not_a_tensor(monkeypatch, torch, allocations,
                                                   launch_path, exchange) -> None:
    """A broken allocator's answer is an error (not a crash, not a launch with a bad
    pointer), and leaks nothing."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    x = FakeTensor([1.0, 2.0, 3.0, 4.0], torch.float32)
    armed = _hook_scratch(torch, monkeypatch, lambda *a: object())
    call_program(prog, x)
    call_program(prog, x)
    fake.calls.clear()
    armed[0] = True
    with pytest.raises((TypeError, AttributeError)):
        call_program(prog, x)
    _forget_described(exchange)
    gc.collect()
    before = sys.getrefcount(torch.float32)
    for _ in range(10):
        with pytest.raises((TypeError, AttributeError)):
            call_program(prog, x)
    _forget_described(exchange)
    gc.collect()
    after = sys.getrefcount(torch.float32)
    assert after == before
    assert _launches(fake) == []


# ---- many keys: the caches' eviction with general-path keys among them ------------------------
def _program_2d(zero_init_split: bool = False, split_count: bool = False) -> Compiled:
    """``_program`` over x: f32[m, n] (z = 2x + 2 sum(x) over all m * n values): n == 3 with a
    zeroed accumulator (general path), n >= 4 three launches through two scratch buffers
    (fast path), else one launch. So the keys (m, n) of one n share a variant."""
    m, n = kp.sym("m"), kp.sym("n")
    count = Arg.of(m * n, kp.i32)

    def one(kernel: str, *names: str) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], count))

    zeroed = Variant((one("accumulate", "x", "acc"), one("add_acc", "x", "acc", "z")),
                     (Scratch("acc", kp.f32, (1,), zero_init=True),), eq(n, 3))
    split = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                     one("add", "s1", "s2", "z")),
                    (Scratch("s1", kp.f32, (m * n,), zero_init=zero_init_split),
                     Scratch("s2", kp.f32, (1,))), ge(n, 4))
    direct = Variant((one("direct", "x", "z"),))
    s = KernelSummary("scr2", (Tensor("x", kp.f32, ("m", "n")),
                               Tensor("z", kp.f32, ("m", "n"), role="out")),
                      (zeroed, split, direct))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-scratch-2d", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS), (img,)),))


def _mat(torch, m: int, n: int, seed: int = 0) -> tuple:
    xs = [float((seed + 3 * k) % 7) for k in range(m * n)]
    return FakeTensor(xs, torch.float32, (m, n)), xs


def test_eviction_with_general_keys_mixed_in(monkeypatch, torch, allocations,
                                             launch_path) -> None:
    """More distinct keys than the caches hold (256 each: FastCall's entries, FastCore's
    plans), half of them the general path's (a zeroed accumulator): every call computes the
    right values, the general path's keys zero their accumulator every time, the others take
    the fast path with one scratch allocation, and the caches stay bounded."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program_2d()
    x, xs = _mat(torch, 1, 4)
    call_program(prog, x)  # binds device 0
    call_program(prog, x)  # the fast path is built
    fast0 = _fast_calls(prog, launch_path)
    nfast = 0
    for rnd in range(2):
        for m in range(1, 181):
            for n in (3, 4):
                x, xs = _mat(torch, m, n, seed=m + rnd)
                allocations.clear()
                fake.calls.clear()
                z = call_program(prog, x)
                assert z.values() == _expected(xs), (m, n)
                scratch = _scratch_allocs(allocations)
                memsets = [c for c in fake.calls if c[0] == "cuMemsetD8Async"]
                if n == 3:  # the general path's: its accumulator, zeroed
                    assert scratch == [((4,), "uint8")] and len(memsets) == 1
                else:
                    total = -(-4 * m * n // SCRATCH_ALIGN) * SCRATCH_ALIGN + SCRATCH_ALIGN
                    assert scratch == [((total,), "uint8")] and memsets == []
                    nfast += 1
    core = None
    if launch_path.startswith("C"):
        fast = _fast(prog)
        assert fast.fast_calls == fast0 + nfast
        assert 0 < fast.entries <= 256
        core = fast.hooks.core
    if core is not None:
        assert 0 < len(core.cache) <= 256


def test_general_keys_are_remembered_not_replanned(monkeypatch, torch, allocations,
                                                   launch_path) -> None:
    """A key whose variant zeroes its scratch is planned once by the fast path (remembered
    as the general path's), however many times it is called."""
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program_2d()
    x, xs = _mat(torch, 2, 3)
    call_program(prog, x)
    planned = []
    from kernelpack.runtime import fastpath

    real = fastpath.FastCore._plan

    def counting(self, key):
        planned.append(key)
        return real(self, key)

    monkeypatch.setattr(fastpath.FastCore, "_plan", counting)
    for _ in range(5):
        assert call_program(prog, x).values() == _expected(xs)
    assert planned == [((2, 3),)]


def test_threads_calling_with_scratch(monkeypatch, torch, allocations, launch_path) -> None:
    """Threads calling at once (the fake kernels run with the GIL taken back, so threads
    switch between a call's allocation and its launches): each call's scratch and output
    are its own, and every result is right."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program_2d()
    x, _ = _mat(torch, 1, 4)
    call_program(prog, x)
    call_program(prog, x)
    errors: list = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(t: int) -> None:
        try:
            for i in range(60):
                m, n = 1 + (t + i) % 5, (2, 3, 4, 5)[(t * 7 + i) % 4]
                x, xs = _mat(torch, m, n, seed=t + i)
                if i % 3 == 0:
                    out = FakeTensor([0.0] * (m * n), torch.float32, (m, n))
                    assert call_program(prog, x, out=out) is out
                    z = out
                else:
                    z = call_program(prog, x)
                assert z.values() == _expected(xs), (t, i, m, n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == [] and fake.callback_errors == []


# ---- several outputs, out= ------------------------------------------------------------------
def _two(grid, block, shmem, v) -> None:
    s1, s2, z, w, n = v
    t = _floats(s2, 1)[0]
    _put(z, [a + t for a in _floats(s1, n)])
    _put(w, [t])


KERNELS2 = dict(KERNELS, two=("QQQQi", _two))


def _two_output_program() -> Compiled:
    """(z, w) = (2x + 2 sum(x), 2 sum(x)): n >= 2 through two scratch buffers, w shaped like
    no input (hooks.allocate); else one launch writing both from a zeroed scratch."""
    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)

    def one(kernel: str, *names: str) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], n32))

    split = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                     one("two", "s1", "s2", "z", "w")),
                    (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))), ge(n, 2))
    zeroed = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                      one("two", "s1", "s2", "z", "w")),
                     (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,), zero_init=True)))
    s = KernelSummary("scr_two", (Tensor("x", kp.f32, ("n",)),
                                  Tensor("z", kp.f32, ("n",), role="out"),
                                  Tensor("w", kp.f32, (1,), role="out")), (split, zeroed))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-scratch-two", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS2), (img,)),))


def test_two_outputs_with_scratch(monkeypatch, torch, allocations, launch_path) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS2)))
    prog = _two_output_program()
    xs = [1.0, 2.0, 3.0]
    x = FakeTensor(xs, torch.float32)
    call_program(prog, x)
    allocations.clear()
    fake.calls.clear()
    z, w = call_program(prog, x)
    assert z.values() == _expected(xs) and w.values() == [2 * sum(xs)]
    # w by torch.empty (shaped like no input), the scratch as one buffer
    assert allocations == [((1,), "float32"), ((2 * SCRATCH_ALIGN,), "uint8")]
    double, total, two = _launches(fake)
    base = double[6][1]
    assert two[6] == (base, base + SCRATCH_ALIGN, z.data_ptr(), w.data_ptr(), 3)
    if launch_path.startswith("C"):
        assert _fast(prog).fast_calls == 1
    # out=(z, w): the general path's (one out= only on the fast paths), and right
    z2, w2 = FakeTensor([0.0] * 3, torch.float32), FakeTensor([0.0], torch.float32)
    assert call_program(prog, x, out=(z2, w2)) == (z2, w2)
    assert z2.values() == _expected(xs) and w2.values() == [2 * sum(xs)]
    # n == 1: the zeroed variant, the general path's
    one = FakeTensor([5.0], torch.float32)
    fake.calls.clear()
    z, w = call_program(prog, one)
    assert z.values() == [20.0] and w.values() == [10.0]
    assert any(c[0] == "cuMemsetD8Async" for c in fake.calls)


def test_out_partially_overlapping_an_input_with_scratch(monkeypatch, torch, allocations,
                                                         launch_path) -> None:
    """out= over part of x is the general path's LaunchError, before any scratch is
    allocated or anything launched; the very same array (in place) and a separate one stay
    fast."""
    from test_review9_outputs_fast import _tensor_view

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    mem = FakeTensor([float(i) for i in range(16)], torch.float32)
    x = _tensor_view(mem, 0, 5)
    call_program(prog, x)
    call_program(prog, x)
    fast = _fast_calls(prog, launch_path)
    allocations.clear()
    fake.calls.clear()
    for offset in (4, 16, -4):
        base = 8 if offset < 0 else 0
        x = _tensor_view(mem, base, 5)
        with pytest.raises(LaunchError, match=r"out 'z' partially overlaps argument 'x'"):
            call_program(prog, x, out=_tensor_view(mem, base + offset, 5))
    assert allocations == [] and _launches(fake) == []
    x = _tensor_view(mem, 0, 5)
    xs = x.values()
    assert call_program(prog, x, out=x) is x and x.values() == _expected(xs)
    z = _tensor_view(mem, 20, 5)
    xs = x.values()
    assert call_program(prog, x, out=z) is z and z.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8")] * 2
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 2


def test_scratch_with_stream_is_the_fast_paths_and_errors_the_general_paths(monkeypatch, torch,
                                                                              allocations,
                                                                              launch_path) -> None:
    """out= with stream= and a variant with scratch: the fast path, its scratch one buffer
    from that stream's pool (the general path's until session 42); the errors are the general
    path's, before anything is allocated or launched: another device's out=, a partial
    overlap."""
    from test_review9_outputs_fast import _tensor_view

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(xs, torch.float32)
    call_program(prog, x)
    call_program(prog, x)
    fast = _fast_calls(prog, launch_path)
    out = FakeTensor([0.0] * 4, torch.float32)
    allocations.clear()
    fake.calls.clear()
    for _ in range(3):
        assert call_program(prog, x, out=out, stream=7) is out and out.values() == _expected(xs)
    assert allocations == [((2 * SCRATCH_ALIGN,), "uint8", ("ext", 7))] * 3
    assert {c[5] for c in _launches(fake)} == {7}
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 3
        fast += 3
    mem = FakeTensor([float(i) for i in range(12)], torch.float32)
    allocations.clear()
    fake.calls.clear()
    with pytest.raises(LaunchError, match="partially overlaps"):
        call_program(prog, _tensor_view(mem, 0, 4), out=_tensor_view(mem, 4, 4), stream=7)
    with pytest.raises(LaunchError, match="out 'z' is on device 1"):
        call_program(prog, x, out=FakeTensor([0.0] * 4, torch.float32, device=1), stream=7)
    assert allocations == [] and _launches(fake) == []
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast


# ---- variants sharing scratch slots; empty scratch buffers ----------------------------------
def _direct_e(grid, block, shmem, v) -> None:
    x, e, z, n = v
    KERNELS["direct"][1](grid, block, shmem, (x, z, n))


KERNELS3 = dict(KERNELS, direct_e=("QQQi", _direct_e))


def _shared_slots_program() -> Compiled:
    """Three variants whose scratch shares value slots in different roles: n >= 8 (s1: n
    floats, s2: 1), 4 <= n < 8 (an empty buffer first, then t2: 1 float, t1: n floats: slot
    2 is empty, 3 is the total, 4 the doubled values), 2 <= n < 4 (only an empty buffer: no
    allocation at all), else one launch without scratch."""
    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)

    def one(kernel: str, *names: str) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], n32))

    big = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                   one("add", "s1", "s2", "z")),
                  (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))), ge(n, 8))
    mid = Variant((one("double", "x", "t1"), one("total", "t1", "t2"),
                   one("add", "t1", "t2", "z")),
                  (Scratch("e", kp.f32, (n - n,)), Scratch("t2", kp.f32, (1,)),
                   Scratch("t1", kp.f32, ("n",))), ge(n, 4))
    empty = Variant((one("direct_e", "x", "e", "z"),), (Scratch("e", kp.f32, (n - n,)),),
                    ge(n, 2))
    plain = Variant((one("direct", "x", "z"),))
    s = KernelSummary("shared", (Tensor("x", kp.f32, ("n",)),
                                 Tensor("z", kp.f32, ("n",), role="out")),
                      (big, mid, empty, plain))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-shared", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS3), (img,)),))


def test_variants_sharing_scratch_slots(monkeypatch, torch, allocations, launch_path) -> None:
    """Calls switching between variants whose scratch buffers share value slots get each
    variant's own layout every time (no slot keeps another variant's pointer), empty buffers
    included."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS3)))
    prog = _shared_slots_program()
    assert fits(bind(prog).bound)
    sizes = (9, 5, 3, 1, 12, 4, 2, 8)
    tensors = {n: FakeTensor([float(k % 5) for k in range(n)], torch.float32) for n in sizes}
    for n in sizes:
        call_program(prog, tensors[n])
    before = _fast_calls(prog, launch_path)
    for _ in range(2):
        for n in sizes:
            x = tensors[n]
            allocations.clear()
            fake.calls.clear()
            z = call_program(prog, x)
            assert z.values() == _expected(x.values()), n
            launches = _launches(fake)
            scratch = _scratch_allocs(allocations)
            if n >= 8:
                total = -(-4 * n // SCRATCH_ALIGN) * SCRATCH_ALIGN + SCRATCH_ALIGN
                assert scratch == [((total,), "uint8")]
                double, total_, add = launches
                base = double[6][1]
                assert total_[6][:2] == (base, base + -(-4 * n // SCRATCH_ALIGN) * SCRATCH_ALIGN)
            elif n >= 4:
                # e (empty) at 0, t2 at 0, t1 at 256
                total = SCRATCH_ALIGN + -(-4 * n // SCRATCH_ALIGN) * SCRATCH_ALIGN
                assert scratch == [((total,), "uint8")]
                double, total_, add = launches
                t1 = double[6][1]
                assert total_[6][:2] == (t1, t1 - SCRATCH_ALIGN)
            elif n >= 2:
                # the only buffer is empty: nothing worth allocating (the C path allocates
                # nothing; the closure an empty array)
                assert scratch in ([], [((0,), "uint8")])
                if launch_path.startswith("C"):
                    assert scratch == [] and launches[0][6][1] == 0
            else:
                assert scratch == []
    if launch_path.startswith("C"):
        assert _fast(prog).fast_calls == before + 2 * len(sizes)


# ---- variants the fast paths never take -------------------------------------------------------
def _step(grid, block, shmem, v) -> None:
    x, z, i, n = v
    xs = _floats(x, n)
    if i == 0:
        _put(z, [2 * a for a in xs])
    else:
        _put(z, [a + 2 * sum(xs) for a in _floats(z, n)])


KERNELS4 = dict(KERNELS, step=("QQii", _step))


def _looped_program(only_general: bool = False) -> Compiled:
    """n == 2: one kernel launched twice (count, its loop index an argument); n == 3: a
    zeroed accumulator; n >= 4 the scratch split; else one launch. ``only_general``: the
    first two alone."""
    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)

    def one(kernel: str, *names: str) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], n32))

    looped = Variant((Launch("step", "m", (1,), (1,), (Arg.buffer("x"), Arg.buffer("z"),
                                                       Arg.of(kp.sym("i"), kp.i32), n32),
                             count=2, loop="i"),),
                     (Scratch("unused", kp.f32, ("n",)),), eq(n, 2))
    zeroed = Variant((one("accumulate", "x", "acc"), one("add_acc", "x", "acc", "z")),
                     (Scratch("acc", kp.f32, (1,), zero_init=True),),
                     None if only_general else eq(n, 3))
    split = Variant((one("double", "x", "s1"), one("total", "s1", "s2"),
                     one("add", "s1", "s2", "z")),
                    (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))), ge(n, 4))
    direct = Variant((one("direct", "x", "z"),))
    variants = (looped, zeroed) if only_general else (looped, zeroed, split, direct)
    s = KernelSummary("looped", (Tensor("x", kp.f32, ("n",)),
                                 Tensor("z", kp.f32, ("n",), role="out")), variants)
    img = Image("cubin", "sm_90", b"\x7fELF-fake-looped", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS4), (img,)),))


def test_repeated_launches_and_zeroed_scratch_per_key(monkeypatch, torch, allocations,
                                                      launch_path) -> None:
    """A program whose variants include a repeated launch and a zeroed scratch still gets a
    fast path (C where the extension is: the general variants' launches are never written
    by it); their keys go to the general path every time, right, the others stay fast."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS4)))
    prog = _looped_program()
    assert fits(bind(prog).bound)
    xs = {n: [float(k + 1) for k in range(n)] for n in (1, 2, 3, 4, 6)}
    for n in xs:
        call_program(prog, FakeTensor(xs[n], torch.float32))
    fast = _fast(prog)
    assert (type(fast).__name__ == "FastCall") == launch_path.startswith("C")
    before = _fast_calls(prog, launch_path)
    for _ in range(3):
        for n in xs:
            fake.calls.clear()
            allocations.clear()
            assert call_program(prog, FakeTensor(xs[n], torch.float32)).values() == \
                _expected(xs[n]), n
            launches = [c[1] for c in _launches(fake)]
            if n == 2:
                assert launches == ["step", "step"]
                assert _scratch_allocs(allocations) == [((8,), "uint8")]  # the general path's
            elif n == 3:
                assert any(c[0] == "cuMemsetD8Async" for c in fake.calls)
    if before is not None:
        assert _fast_calls(prog, launch_path) == before + 3 * 3


def test_a_program_whose_every_variant_is_general_has_no_fast_path(monkeypatch, torch,
                                                                  allocations,
                                                                  launch_path) -> None:
    install(monkeypatch, FakeDriver(kernels=dict(KERNELS4)))
    prog = _looped_program(only_general=True)
    bp = bind(prog)
    assert not fits(bp.bound)
    for n in (2, 3, 2):
        xs = [float(k + 1) for k in range(n)]
        assert call_program(prog, FakeTensor(xs, torch.float32)).values() == _expected(xs)
    assert bp.call == bp.__call__


# ---- CuPy -------------------------------------------------------------------------------------
@pytest.fixture
def cupy_made(cupy, monkeypatch) -> list:
    """cupy.empty recording ``(shape, dtype name, current stream pointer)``, and
    ``cupy.cuda.ExternalStream`` (made current as a context manager, as CuPy's streams)."""
    import numpy

    install_external_stream(cupy, monkeypatch)

    made: list = []

    def empty(shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        name = numpy.dtype(dtype).name
        made.append((shape, name, cupy.current.stream.ptr))
        return NDArray([0] * _prod(shape), name, shape)

    monkeypatch.setattr(cupy, "empty", empty)
    return made


def test_cupy_scratch_calls(monkeypatch, cupy, cupy_made, launch_path) -> None:
    """CuPy: the fast path with scratch (allocated and launched on CuPy's current stream),
    out= too, and stream= (its scratch stream-ordered memory of the driver's on that stream);
    a zeroed accumulator takes the general path; a call re-entering from the scratch
    allocation is right."""
    import types

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    x = NDArray(xs)
    call_program(prog, x)
    call_program(prog, x)
    fast = _fast_calls(prog, launch_path)
    cupy.current.stream = types.SimpleNamespace(ptr=0x55)
    cupy_made.clear()
    fake.calls.clear()
    assert call_program(prog, x).values() == _expected(xs)
    out = NDArray([0.0] * 5)
    assert call_program(prog, x, out=out) is out and out.values() == _expected(xs)
    assert cupy_made == [((2 * SCRATCH_ALIGN,), "uint8", 0x55)] * 2
    assert {c[5] for c in _launches(fake)} == {0x55}
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 2
    # stream=: the fast path (one buffer for both) in stream-ordered memory of the driver's,
    # as the general path's (review 31: CuPy's pool orders a block on its current stream
    # only and is not capture-aware; the driver's is recorded in a graph); until session 42
    # the general path's
    cupy_made.clear()
    fake.calls.clear()
    assert call_program(prog, x, out=out, stream=9) is out and out.values() == _expected(xs)
    assert cupy_made == []
    allocs = [c for c in fake.calls if c[0] == "cuMemAllocAsync"]
    assert [(c[1], c[2]) for c in allocs] == [(2 * SCRATCH_ALIGN, 9)]
    double, total, add = _launches(fake)
    base = double[6][1]  # the first buffer's pointer, the allocation's own
    assert total[6][:2] == (base, base + SCRATCH_ALIGN)
    frees = [c for c in fake.calls if c[0] == "cuMemFreeAsync"]
    assert frees == [("cuMemFreeAsync", base, 9)]  # freed on that stream, after the launches
    assert fake.calls.index(frees[0]) > fake.calls.index(add)
    assert {c[5] for c in (double, total, add)} == {9}
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 3
        fast += 1
    # stream=0 (a default stream): the general path, which makes the context current for the
    # driver's allocation on it (each buffer apart)
    fake.calls.clear()
    before = _fast_calls(prog, launch_path)
    assert call_program(prog, x, out=out, stream=0) is out and out.values() == _expected(xs)
    allocs = [c for c in fake.calls if c[0] == "cuMemAllocAsync"]
    assert [(c[1], c[2]) for c in allocs] == [(20, 0), (4, 0)]
    assert _fast_calls(prog, launch_path) == before
    # n == 3: the zeroed accumulator, the general path's, every time
    x3 = NDArray([1.0, 2.0, 3.0])
    for _ in range(2):
        fake.calls.clear()
        assert call_program(prog, x3).values() == _expected([1.0, 2.0, 3.0])
        assert any(c[0] == "cuMemsetD8Async" for c in fake.calls)
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 2
    # re-entry from the scratch allocation
    ys = [2.0, 7.0, 1.0, 8.0]
    y = NDArray(ys)
    call_program(prog, y)
    inner = cupy.empty
    inner_results: list = []

    def reenter(shape, dtype):
        monkeypatch.setattr(cupy, "empty", inner)
        inner_results.append(call_program(prog, y).values())
        inner_results.append(call_program(prog, x).values())
        monkeypatch.setattr(cupy, "empty", reenter)
        return inner(shape, dtype)

    monkeypatch.setattr(cupy, "empty", reenter)
    assert call_program(prog, x).values() == _expected(xs)
    monkeypatch.setattr(cupy, "empty", inner)
    assert inner_results in ([_expected(ys), _expected(xs)], [])
    assert not fake.callback_errors


def test_a_scratch_allocation_that_empties_the_caches(monkeypatch, torch, allocations,
                                                      launch_path) -> None:
    """The scratch hook calls the program with more distinct keys than the caches hold (both
    are cleared, the outer call's entry with them, general-path keys among them): the outer
    call still launches its own entry, right."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    prog = _program_2d()
    x, xs = _mat(torch, 2, 5)
    inner_ok: list = []

    def flood(inner, shape, dtype, device):
        armed[0] = False
        for m in range(1, 140):
            for n in (3, 4):
                y, ys = _mat(torch, m, n, seed=m)
                inner_ok.append(call_program(prog, y).values() == _expected(ys))
        armed[0] = True
        return inner(shape, dtype, device)

    armed = _hook_scratch(torch, monkeypatch, flood)
    call_program(prog, x)
    call_program(prog, x)
    armed[0] = True
    for _ in range(2):
        inner_ok.clear()
        fake.calls.clear()
        assert call_program(prog, x).values() == _expected(xs)
        assert len(inner_ok) == 278 and all(inner_ok)
    armed[0] = False
    if launch_path.startswith("C"):
        assert _fast(prog).entries <= 256
    assert not fake.callback_errors


# ---- arrays.TorchAdapter.empty: stream= and the pools ------------------------------------------
def test_outputs_and_scratch_for_the_default_stream_come_from_its_pool(monkeypatch, torch,
                                                                       allocations,
                                                                       launch_path) -> None:
    """``stream=0`` (the legacy default stream) while another stream is current
    (inside ``with torch.cuda.stream(s)``) allocated the output and the scratch from the
    current stream's pool, then launched on stream 0: arrays.TorchAdapter.empty tested
    ``if stream and stream != current``, and handle 0 is falsy, the very race the change set
    out to remove (torch's own streams are created
    non-blocking, so stream 0 does not wait for work queued on s that still uses a block s
    freed). Any other handle (5 below) is allocated from its own pool."""
    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    current = {"raw": 0}  # torch's current raw stream, read anew on every call as torch's is
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: current["raw"])
    prog = _program()
    xs = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(xs, torch.float32)
    call_program(prog, x)
    # the caller is inside ``with torch.cuda.stream(s)``: s (handle 0x33) is current
    monkeypatch.setattr(torch, "current_stream", "s")
    current["raw"] = 0x33
    for handle in (5, 0):
        allocations.clear()
        fake.calls.clear()
        z = call_program(prog, x, stream=handle)
        assert z.values() == _expected(xs)
        assert {c[5] for c in _launches(fake)} == {handle}
        out = FakeTensor([0.0] * 4, torch.float32)
        assert call_program(prog, x, out=out, stream=handle) is out
        assert out.values() == _expected(xs)
        # the fast path's output and one scratch buffer (stream= without out=: the fast path
        # since session 43), then its one scratch buffer (out=), none from s's pool
        pools = [a[2] if len(a) > 2 else None for a in allocations]
        assert [a[:2] for a in allocations] == [((4,), "float32")] + [
            ((2 * SCRATCH_ALIGN,), "uint8")] * 2
        assert "s" not in pools, (handle, allocations)


# ---- a scalar that does not fit its parameter ---------------------------------------------------
def _scale(grid, block, shmem, v) -> None:
    x, s1, a, n = v
    _put(s1, [a * p for p in _floats(x, n)])


KERNELS5 = dict(KERNELS, scale=("QQfi", _scale))


def _scaled_program() -> Compiled:
    """z = a x + sum(a x) through two scratch buffers, ``a`` a float32 scalar."""
    from kernelpack.summary import Scalar

    n = kp.sym("n")
    n32 = Arg.of(n, kp.i32)

    def one(kernel: str, *names: str, extra: tuple = ()) -> Launch:
        return Launch(kernel, "m", (1,), (1,), (*[Arg.buffer(a) for a in names], *extra, n32))

    split = Variant((one("scale", "x", "s1", extra=(Arg.scalar("a"),)),
                     one("total", "s1", "s2"), one("add", "s1", "s2", "z")),
                    (Scratch("s1", kp.f32, ("n",)), Scratch("s2", kp.f32, (1,))))
    s = KernelSummary("scaled", (Tensor("x", kp.f32, ("n",)),
                                 Tensor("z", kp.f32, ("n",), role="out"), Scalar("a", kp.f32)),
                      (split,))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-scaled", "fake", 13000)
    return Compiled(s, (Module("m", tuple(KERNELS5), (img,)),))


def test_a_float_beyond_float32_with_scratch(monkeypatch, torch, allocations,
                                             launch_path) -> None:
    """Failed on the closure (KERNELPACK_NATIVE_LAUNCH=0; older than the scratch change, any
    program with a float32 scalar): a float beyond float32's range is the general path's
    ConstraintError ("overflows float32"), which the C path gets by sending the call there
    (_fastcall.c read_arguments: as_f32 and isinf((float)x)). The closures count on struct
    to refuse it when packing (FastCore.fire: "struct range-checks every value"), but the
    parameter blocks are native-mode structs ("@...f"), and native 'f' packs 1e39 as inf
    without an error: the closure launches with a = inf and returns infinities."""
    from kernelpack.errors import ConstraintError

    fake = install(monkeypatch, FakeDriver(kernels=dict(KERNELS5)))
    prog = _scaled_program()
    xs = [1.0, 2.0, 3.0]
    x = FakeTensor(xs, torch.float32)
    ax = [0.5 * p for p in xs]
    assert call_program(prog, x, 0.5).values() == [p + sum(ax) for p in ax]
    assert call_program(prog, x, 0.5).values() == [p + sum(ax) for p in ax]
    fast = _fast_calls(prog, launch_path)
    allocations.clear()
    fake.calls.clear()
    with pytest.raises(ConstraintError, match="scalar 'a' = 1e\\+39 overflows float32"):
        call_program(prog, x, 1e39)
    assert _launches(fake) == []
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast
        assert allocations == []  # sent to the general path before allocating anything


# ---- the C type's side ------------------------------------------------------------------------
@pytest.mark.parametrize("scratch, error", [
    ((256, (("2", 0),)), TypeError),            # a slot that is not an int
    ((256, ((2, "0"),)), TypeError),            # an offset that is not an int
    ((256, ((2, -1),)), OverflowError),         # a negative offset
    ((1 << 64, ((2, 0),)), OverflowError),      # a size beyond uint64
    ((256, [(2, 0)]), TypeError),               # the pairs not a tuple
    ((256, ((2, 0), (2, 256), None)), TypeError),
])
def test_more_malformed_scratch_answers(monkeypatch, torch, allocations, launch_path, scratch,
                                        error) -> None:
    if not launch_path.startswith("C"):
        pytest.skip("the C type's parsing")
    from test_fast_scratch import _fast_call

    install(monkeypatch, FakeDriver(kernels=dict(KERNELS)))
    answer = (((1,),), (0,), (), (), False, (0, ()), scratch)
    fast = _fast_call(torch, answer)
    for _ in range(2):  # nothing is remembered for a malformed answer
        with pytest.raises(error):
            fast.call((FakeTensor([1.0], torch.float32),), None, None)
    assert fast.entries == 0

