"""The runtime evaluates a summary through the program's planner, the one that ``plan()`` uses:
same object for a loaded program, the plan's numbers in the launches, the plan's errors, and
the parameter-block layout (the runtime's own part) that matches the C ABI."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError
from kernelpack.runtime import call_program
from kernelpack.runtime.binding import BoundSummary, fills_of
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent.parent))
import kp_samples  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_fastpath_fake import Tensor as FakeTensor, torch  # noqa: E402,F401  (a fixture)

n = kp.sym("n")
NOOP = lambda *a: None  # noqa: E731


def _launches(fake: FakeDriver) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _compiled(summary: KernelSummary, kernels: tuple[str, ...]) -> Compiled:
    return Compiled(summary, (Module("m", kernels, (Image("cubin", "sm_90", b"\x7fELF"),)),))


def test_a_loaded_program_shares_its_planner(monkeypatch) -> None:
    install(monkeypatch, FakeDriver(arch=(8, 0), kernels={"axpy": ("QQfI", NOOP)}))
    pack = kp.load(kp.save([kp_samples.axpy()]))
    prog = pack["axpy"]
    x, y = HostArray([1.0] * 5), HostArray([1.0] * 5)
    prog(x, y, 1.0)
    assert bind(prog).planner is prog.planner
    plan = prog.plan((5,), (5,), 1.0)
    assert prog.planner.plan_shapes([(5,), (5,)], [0.0]) is plan  # the call's cached plan


def test_computed_scalar_named_like_a_symbol_gets_its_value(monkeypatch, torch) -> None:
    """``Plan.symbols`` keeps the bound ``n``; the kernel gets the computed ``n`` (2n)."""
    fake = install(monkeypatch, FakeDriver(kernels={"k": ("Qi", NOOP)}))
    s = KernelSummary("clash", (Tensor("x", kp.f32, ("n",)), Scalar("n", kp.i32, value=n * 2)),
                      (Variant((Launch("k", "m", (1,), (1,), (Arg.buffer("x"),
                                                            Arg.scalar("n"))),)),))
    prog = _compiled(s, ("k",))
    call_program(prog, HostArray([1.0] * 3))                     # general path
    call_program(prog, FakeTensor([1.0] * 4, torch.float32))     # general path, binds torch
    call_program(prog, FakeTensor([1.0] * 5, torch.float32))     # fast path
    assert bind(prog).call != bind(prog).__call__
    assert [c[6][1] for c in _launches(fake)] == [6, 8, 10]


def test_dims_checked_by_expression_take_the_fast_path(monkeypatch, torch) -> None:
    fake = install(monkeypatch, FakeDriver(kernels={"k": ("QQq", NOOP)}))
    s = KernelSummary("twice", (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, (n * 2,))),
                      (Variant((Launch("k", "m", (kp.cdiv(n, 4),), (4,),
                                       (Arg.buffer("x"), Arg.buffer("y"),
                                        Arg.of(n * 2, kp.i64))),)),))
    prog = _compiled(s, ("k",))
    x, y = FakeTensor([1.0] * 5, torch.float32), FakeTensor([1.0] * 10, torch.float32)
    call_program(prog, x, y)
    from kernelpack.runtime import launcher

    general = launcher.run
    monkeypatch.setattr(launcher, "run", lambda *a: pytest.fail("took the general path"))
    call_program(prog, x, y)
    assert [(c[2], c[6][2]) for c in _launches(fake)] == [((2, 1, 1), 10)] * 2
    monkeypatch.setattr(launcher, "run", general)
    with pytest.raises(ConstraintError, match=r"y.shape\[0\] is 9, expected"):
        call_program(prog, x, FakeTensor([1.0] * 9, torch.float32))
    assert len(_launches(fake)) == 2


def test_loop_counter_arguments_per_copy_and_shared_fills(monkeypatch) -> None:
    """A value argument reading the loop counter differs per copy; one that does not is a
    fill slot, taken once from the plan (also when the first launch repeats zero times)."""
    fake = install(monkeypatch, FakeDriver(kernels={"a": ("qq", NOOP), "b": ("q", NOOP)}))
    i = kp.sym("i")
    s = KernelSummary("loops", (Tensor("x", kp.f32, ("n",)),),
                      (Variant((Launch("a", "m", (1,), (1,), (Arg.of(i * 10, kp.i64),
                                                              Arg.of(n + 1, kp.i64)),
                                       count=n - 2, loop="i"),
                                Launch("b", "m", (1,), (1,), (Arg.of(n + 1, kp.i64),)))),))
    prog = _compiled(s, ("a", "b"))
    bs = BoundSummary(s)
    assert [ls.args for ls in bs.variants[0].launches] == [[(2, 0), (1, 0)], [(1, 1)]]
    call_program(prog, HostArray([1.0] * 5))
    assert [(c[1], c[6]) for c in _launches(fake)] == \
        [("a", (0, 6)), ("a", (10, 6)), ("a", (20, 6)), ("b", (6,))]
    fake.calls.clear()
    call_program(prog, HostArray([1.0] * 2))
    assert [(c[1], c[6]) for c in _launches(fake)] == [("b", (3,))]
    plan = bind(prog).planner.plan_shapes([(2,)], [])
    assert fills_of(bs.variants[0], plan) == [0, 3]


@pytest.mark.parametrize("codes", ["Q", "QfI", "bQ", "?hq", "eIdB", "HbQi", ""])
def test_slot_offsets_follow_the_c_abi(codes: str) -> None:
    """Each slot's offset equals ``struct``'s native layout (what the kernel expects)."""
    from kernelpack.runtime.binding import LaunchSpec

    ls = LaunchSpec("m", "k", 0, [(1, j) for j in range(len(codes))], list(codes))
    want = [struct.calcsize("@" + codes[:j + 1]) - struct.calcsize(codes[j])
            for j in range(len(codes))]
    assert ls.offsets == want and ls.size == struct.calcsize("@" + codes)
    ls.make_block()
    if codes:
        addrs = (ctypes.c_void_p * len(codes)).from_address(ls.params_addr)
        base = ctypes.addressof(ls.param_buf)
        assert [a - base for a in addrs] == want


def test_variants_take_the_fast_path(monkeypatch, torch) -> None:
    """The planner picks the variant per shape; the fast path launches that variant's kernel
    with its own computed values (fill slots are numbered per variant)."""
    fake = install(monkeypatch, FakeDriver(kernels={"small": ("Qq", NOOP),
                                                    "big": ("Qqi", NOOP)}))
    small = Variant((Launch("small", "m", (1,), (n,), (Arg.buffer("x"), Arg.of(n, kp.i64))),),
                    predicate=n <= 4)
    big = Variant((Launch("big", "m", (kp.cdiv(n, 4),), (4,),
                          (Arg.buffer("x"), Arg.of(n * 3, kp.i64), Arg.of(n - 1, kp.i32))),))
    prog = _compiled(KernelSummary("two", (Tensor("x", kp.f32, ("n",)),), (small, big)),
                     ("small", "big"))
    x3, x9 = FakeTensor([1.0] * 3, torch.float32), FakeTensor([1.0] * 9, torch.float32)
    call_program(prog, x3)  # general path: binds device 0
    from kernelpack.runtime import launcher

    monkeypatch.setattr(launcher, "run", lambda *a: pytest.fail("took the general path"))
    for x in (x9, x3, x9):
        call_program(prog, x)
    assert [(c[1], c[2], c[3], c[6][1:]) for c in _launches(fake)] == [
        ("small", (1, 1, 1), (3, 1, 1), (3,)), ("big", (3, 1, 1), (4, 1, 1), (27, 8)),
        ("small", (1, 1, 1), (3, 1, 1), (3,)), ("big", (3, 1, 1), (4, 1, 1), (27, 8))]
