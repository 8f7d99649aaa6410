"""In-place use that a later kernel would undo, on the device: ``x * 2, x.sum(0)`` compiles to
a pointwise kernel and then a column sum, so ``out=(x, s)`` made the second kernel sum the
doubled ``x`` (before session 37: ``s`` twice the column sums, no error). It is refused with
``LaunchError`` before anything is launched, ``x`` untouched; separate outputs give the right
values, and in-place use of programs that read their input before storing (a softmax in every
schedule, a centring) still runs: tests/gpu/test_review28_runtime_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

from .torch_checks import NO_GPU as _NO_GPU, check, cuda, host, on_gpu, targets, torch

T = kp.Tensor


@kp.fusion
def s37_double_and_colsum(x: T[kp.f32, "n", "m"]):
    return x * 2, x.sum(0)


@kp.fusion
def s37_rowsum_and_double(x: T[kp.f32, "n", "m"]):
    return x.sum(1), x * 2


@kp.fusion
def s38_double_and_other_sum(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y.sum()


@pytest.fixture(scope="module")
def pack():
    fusions = (s37_double_and_colsum, s37_rowsum_and_double, s38_double_and_other_sum)
    return kp.load(kp.save([kp.compile(f, targets=targets(_NO_GPU)) for f in fusions]))


@on_gpu
@pytest.mark.parametrize("n, m", [(3, 5), (1000, 300), (64, 100000)])
def test_in_place_undone_by_a_later_kernel_is_refused(pack, n, m):
    prog = pack["s37_double_and_colsum"]
    xh = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    x, s = cuda(xh), torch.full((m,), float("nan"), device="cuda")
    with pytest.raises(LaunchError, match="is the very same memory as argument 'x'"):
        prog(x, out=(x, s))
    with pytest.raises(LaunchError, match="is the very same memory as argument 'x'"):
        prog(x, out={"out0": x, "out1": s})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(host(x), xh)
    assert bool(torch.isnan(s).all())
    o = torch.empty_like(x)
    prog(x, out=(o, s))
    check(host(o), 2 * xh.astype(np.float64), 1e-6, f"x * 2 ({n}, {m})")
    check(host(s), xh.astype(np.float64).sum(0), 1e-5, f"x.sum(0) ({n}, {m})")


@on_gpu
@pytest.mark.parametrize("n, m", [(300, 70), (4, 200000)])
def test_in_place_stored_by_the_last_kernel_runs(pack, n, m):
    """The row sum's kernel runs first and stores only the sums; the pointwise kernel that
    stores ``x * 2`` runs last, reading each element before storing it: in place is fine."""
    prog = pack["s37_rowsum_and_double"]
    plan = prog.plan(x=(n, m))
    assert plan.launches[-1].kernel == "s37_rowsum_and_double_1_pointwise", plan
    xh = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    x, s = cuda(xh), torch.empty(n, device="cuda")
    assert prog(x, out=(s, x))[1] is x
    check(host(x), 2 * xh.astype(np.float64), 1e-6, f"x * 2 in place ({n}, {m})")
    check(host(s), xh.astype(np.float64).sum(1), 1e-5, f"x.sum(1) ({n}, {m})")


@on_gpu
@pytest.mark.parametrize("n", [5, 70000, 3000001])
def test_in_place_beside_kernels_that_never_read_the_input_runs(pack, n):
    """Session 38: each kernel takes only the arrays its code uses, so the sum's kernels are
    not given ``x`` and ``out=(x, s)`` is in-place use of the pointwise kernel alone (refused
    before, when every kernel took every input). Called three times: the first call plans on
    the general path, the later ones take the fast path."""
    prog = pack["s38_double_and_other_sum"]
    assert all("x" not in [a.name for a in launch.args if a.kind == "buffer"]
               for launch in prog.summary.variants[0].launches if "out1" in
               [a.name for a in launch.args])
    rng = np.random.default_rng(n)
    xh = rng.standard_normal(n).astype(np.float32)
    yh = rng.standard_normal(n).astype(np.float32)
    x, y, s = cuda(xh), cuda(yh), torch.empty((), device="cuda")
    want = xh.astype(np.float64)
    for call in range(3):
        got = prog(x, y, out=(x, s))
        assert got[0] is x and got[1] is s
        want = 2 * want
        check(host(x), want, 1e-6, f"x * 2 in place, call {call} (n={n})")
        check(host(s), np.array(yh.astype(np.float64).sum()), 1e-5, f"y.sum() (n={n})")
