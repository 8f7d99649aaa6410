"""torch's lazy views: ``x.conj()`` of a complex tensor (the conjugate bit) and
``x.conj().imag`` (the negative bit) share their source's memory, which holds the values
*before* the lazy operation. A kernel reads memory, so such a tensor must never reach a launch:
every path (the general one, the Python closure, the C fast path) sends it to the general
path, which refuses it with a LaunchError saying what to pass instead. Stand-in torch tensors
over host memory and the fake driver, as in test_fastpath_fake.py."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor as \
    KpTensor, Scalar, Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor, exchange, launch_path, torch  # noqa: E402,F401 - fixtures
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


def _copy8_impl(grid, block, shmem, v) -> None:
    x, z, n = v
    ctypes.memmove(z, x, 8 * n)


def copy_c64() -> Compiled:
    """z = x for complex64 (the kernel copies 8 bytes per element)."""
    s = KernelSummary("copy_c64", (KpTensor("x", kp.c64, ("n",)),
                                   KpTensor("z", kp.c64, ("n",), role="out"),
                                   Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("copy8", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("n32"))),)),))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-copy8", "fake", 13000)
    return Compiled(s, (Module("m", ("copy8",), (img,)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "copy8": ("QQI", _copy8_impl)}))


def _c64(torch, pairs: list, **kw) -> Tensor:
    return Tensor([v for p in pairs for v in p], torch.complex64, shape=(len(pairs),), **kw)


def _pairs(t: Tensor) -> list:
    n = t.shape[0]
    raw = struct.unpack(f"<{2 * n}f", t._buf.raw[:8 * n])
    return [raw[i:i + 2] for i in range(0, 2 * n, 2)]


def _launches(fake) -> int:
    return len([c for c in fake.calls if c[0] == "cuLaunchKernel"])


def test_complex_lazy_views_are_refused_on_every_call(fake, torch) -> None:
    prog = copy_c64()
    x = _c64(torch, [(1.0, 2.0), (3.0, 4.0)])
    for _ in range(3):  # the general path, then the fast path (built on the second call)
        assert _pairs(call_program(prog, x)) == [(1.0, 2.0), (3.0, 4.0)]
    launched = _launches(fake)
    conj = _c64(torch, [(1.0, 2.0), (3.0, 4.0)], conj=True)
    with pytest.raises(LaunchError, match=r"argument 'x' is a lazily conjugated view .*"
                                          r"pass x\.resolve_conj\(\)"):
        call_program(prog, conj)
    neg = _c64(torch, [(1.0, 2.0), (3.0, 4.0)], neg=True)
    with pytest.raises(LaunchError, match=r"'x' is a lazily negated view .*x\.resolve_neg\(\)"):
        call_program(prog, neg)
    out = _c64(torch, [(0.0, 0.0), (0.0, 0.0)], conj=True)
    with pytest.raises(LaunchError, match=r"argument 'z' is a lazily conjugated view"):
        call_program(prog, x, out=out)
    assert _launches(fake) == launched  # nothing reached the driver
    plain_out = _c64(torch, [(0.0, 0.0), (0.0, 0.0)])
    assert call_program(prog, x, out=plain_out) is plain_out
    assert _pairs(plain_out) == [(1.0, 2.0), (3.0, 4.0)]


def test_single_element_negative_views_are_refused(fake, torch) -> None:
    """A real tensor with the negative bit is the .imag of a conj() view: strided (the
    contiguity check sends it away) unless it holds one element, which is asked explicitly."""
    prog = axpby()
    one = lambda v, **kw: Tensor([v], torch.float32, **kw)  # noqa: E731
    for _ in range(3):
        z = call_program(prog, one(1.0), one(2.0), 3.0)
        assert z.values() == [5.0]
    with pytest.raises(LaunchError, match=r"argument 'y' is a lazily negated view"):
        call_program(prog, one(1.0), one(2.0, neg=True), 3.0)
    with pytest.raises(LaunchError, match=r"argument 'z' is a lazily negated view"):
        call_program(prog, one(1.0), one(2.0), 3.0, out=one(0.0, neg=True))
    strided_imag = Tensor([1.0, 2.0, 3.0], torch.float32, contiguous=False, neg=True)
    with pytest.raises(LaunchError, match=r"'x' is a lazily negated view"):
        call_program(prog, strided_imag, Tensor([1.0] * 3, torch.float32), 1.0)


def test_fast_path_asks_only_where_a_lazy_view_can_pass(fake, torch, launch_path) -> None:
    """Per call, is_conj()/is_neg() are asked of complex tensors and single-element real ones
    only (two method calls each): counted on a real program of three-element tensors."""
    asked = []

    class Counting(Tensor):
        def is_conj(self) -> bool:
            asked.append("conj")
            return False

        def is_neg(self) -> bool:
            asked.append("neg")
            return False

    torch.Tensor = Counting  # the fast path takes this exact type
    prog = axpby()
    args = (Counting([1.0] * 3, torch.float32), Counting([2.0] * 3, torch.float32), 1.0)
    for _ in range(3):
        call_program(prog, *args)
    asked.clear()
    z = Counting([0.0] * 3, torch.float32)
    call_program(prog, *args)
    call_program(prog, *args, out=z)
    assert asked == [] and z.values() == [3.0] * 3
    one = (Counting([1.0], torch.float32), Counting([2.0], torch.float32), 1.0)
    call_program(prog, *one)
    asked.clear()
    call_program(prog, *one)
    assert asked == ["conj", "neg", "conj", "neg"]  # x and y, each one element
