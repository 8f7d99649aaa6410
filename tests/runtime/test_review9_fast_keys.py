"""Ninth review of the torch fast paths' launch entries (stand-in torch, fake driver): an
integer scalar that no expression reads must not key them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import bind
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar, \
    Tensor, Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor as TorchTensor  # noqa: E402
from test_fastpath_fake import exchange, launch_path, torch  # noqa: E402,F401


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"seeded": ("QQii", lambda *a: None)}))


def seeded(count_is_a_dim: bool = False) -> Compiled:
    """z = f(x, seed) with ``seed`` read by the kernel alone; ``m`` is a second int scalar,
    either read by no expression either, or named like x's dim (so it must equal it)."""
    dim = "m" if count_is_a_dim else "n"
    s = KernelSummary("seeded", (Tensor("x", kp.f32, (dim,)), Tensor("z", kp.f32, (dim,),
                                                                      role="out"),
                                 Scalar("seed", kp.i32), Scalar("m", kp.i32)),
                      (Variant((Launch("seeded", "mod", (kp.cdiv(dim, 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("seed"),
                                        Arg.scalar("m"))),)),))
    return Compiled(s, (Module("mod", ("seeded",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


def _seeds(fake) -> list:
    return [c[6][2:] for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_a_scalar_no_expression_reads_does_not_key_launch_entries(fake, torch,
                                                                  launch_path) -> None:
    """Each new seed missed the fast path's entry cache and the planner's, planned again and
    evicted older entries (the caches were cleared every 256 values): 3-4x a call's cost on
    the closure path."""
    prog = seeded()
    x, z = TorchTensor([1.0, 2.0], torch.float32), TorchTensor([0.0, 0.0], torch.float32)
    call_program(prog, x, 0, 0, out=z)  # general path: binds the device
    bp = bind(prog)
    for seed in range(300):
        assert call_program(prog, x, seed, -seed, out=z) is z
    assert _seeds(fake)[1:] == [(s, -s) for s in range(300)]  # each value reached its slot
    assert len(bp.planner._cache) == 1
    fast = getattr(bp.call, "__self__", None)
    if launch_path.startswith("C"):
        assert fast.entries == 1 and fast.fast_calls == 300


def test_a_scalar_named_like_a_dim_still_keys_and_is_checked(fake, torch) -> None:
    prog = seeded(count_is_a_dim=True)
    x, z = TorchTensor([1.0, 2.0], torch.float32), TorchTensor([0.0, 0.0], torch.float32)
    call_program(prog, x, 7, 2, out=z)
    call_program(prog, x, 8, 2, out=z)
    with pytest.raises(ConstraintError, match=r"scalar m is 3 but m = 2 from x\.shape\[0\]"):
        call_program(prog, x, 9, 3, out=z)
    assert _seeds(fake) == [(7, 2), (8, 2)]
