"""Ninth review: calls with size-0 tensors return empty outputs of the right shape and launch
nothing, also where a launch's block or arguments are expressions that are out of the launch
limits at size 0 (fake driver, host memory)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.runtime import call_program
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor, Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402

n, m = kp.sym("n"), kp.sym("m")


def _noop(*args) -> None:
    return None


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"rows": ("QQI", _noop)}))


def rows() -> Compiled:
    """y[b, n] from x[b, n]: a block of min(n, 256) threads per row and n - 1 as a uint32
    argument (a kp.external user's way to avoid idle threads on short rows)."""
    s = KernelSummary("rows", (Tensor("x", kp.f32, ("b", "n")),
                               Tensor("y", kp.f32, ("b", "n"), role="out")),
                      (Variant((Launch("rows", "m", (kp.select(n > 0, kp.sym("b"), 0),),
                                       (kp.emin(n, 256),),
                                       (Arg.buffer("x"), Arg.buffer("y"),
                                        Arg.of(n - 1, kp.u32))),)),))
    return Compiled(s, (Module("m", ("rows",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


@pytest.mark.parametrize("shape", [(3, 0), (0, 0)])
def test_size_zero_rows_give_an_empty_output_and_no_launch(fake, shape) -> None:
    """A ConstraintError "block (0, 1, 1) outside the limits" before, for a launch that is
    never issued."""
    x = HostArray([], shape=shape)
    y = call_program(rows(), x)
    assert y.shape == shape and y.nbytes == 0
    out = HostArray([], shape=shape)
    assert call_program(rows(), x, out=out) is out
    assert not _launches(fake)
    call_program(rows(), HostArray([1.0] * 6, shape=(3, 2)))
    assert [c[2:5] for c in _launches(fake)] == [((3, 1, 1), (2, 1, 1), 0)]
    assert _launches(fake)[0][6][2] == 1  # n - 1
