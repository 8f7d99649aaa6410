"""torch's lazy views on a real GPU: a ``conj()`` of a complex tensor and the ``.imag`` of
one share their source's memory, which holds the values before the lazy operation. Every path
refuses them (LaunchError naming the argument and what to pass) and nothing is launched; the
resolved tensors give the right results. (CPU twin: test_lazy_views.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = pytest.mark.gpu

_COUNT = kernels.gpu_count_or_skip()


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def twice():
    @kp.fusion
    def twice_c64(x: kp.Tensor[kp.c64, "n"]):
        return x * 2

    return kp.load(kp.save([kp.compile(twice_c64, targets=["sm_80", "sm_90", "ptx"])]))[
        "twice_c64"]


def test_conjugate_views_are_refused(torch, twice) -> None:
    x = torch.randn(1000, dtype=torch.complex64, device="cuda")
    for _ in range(3):  # the general path, then the fast path
        torch.testing.assert_close(twice(x), 2 * x)
    fast = getattr(twice._kp_bound.call, "__self__", None)
    done = getattr(fast, "fast_calls", None)
    with pytest.raises(LaunchError, match=r"argument 'x' is a lazily conjugated view.*"
                                          r"x\.resolve_conj\(\)"):
        twice(x.conj())
    torch.testing.assert_close(twice(x.conj().resolve_conj()), 2 * x.conj())
    out = torch.empty_like(x)
    with pytest.raises(LaunchError, match=r"lazily conjugated view"):
        twice(x, out=out.conj())
    assert twice(x, out=out) is out
    torch.testing.assert_close(out, 2 * x)
    if done is not None:  # the C fast path took the plain calls only
        assert fast.fast_calls == done + 2


def test_negative_views_are_refused(torch) -> None:
    pack = kernels.make_pack([kernels.axpby()])
    c = torch.randn(5, dtype=torch.complex64, device="cuda")
    one = torch.ones(1, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(pack["axpby"](one, one, 2.0), 3 * one)
    imag1 = c[:1].conj().imag  # one element: contiguous, with the negative bit
    assert imag1.is_neg() and imag1.is_contiguous()
    with pytest.raises(LaunchError, match=r"argument 'x' is a lazily negated view"):
        pack["axpby"](imag1, one, 2.0)
    with pytest.raises(LaunchError, match=r"argument 'y' is a lazily negated view"):
        pack["axpby"](torch.ones(5, device="cuda"), c.conj().imag, 2.0)
    torch.testing.assert_close(pack["axpby"](imag1.resolve_neg(), one, 2.0),
                               2 * (-c[:1].imag) + 1)
