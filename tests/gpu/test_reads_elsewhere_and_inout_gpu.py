"""Session 36's two fixes on the device:

* row sums read at another row (``d[None, :]`` of ``d = rsqrt(a.sum(-1))``, the symmetric
  normalization of a matrix) are a workspace written by a row kernel and read by a pointwise
  one; before, every element summed two whole rows. Checked against NumPy in float64 for
  every row schedule's widths, and the launches are those two stages;
* an ``inout`` argument that partially overlaps another tensor argument is refused on every
  path (torch's C fast path included) before anything is launched, while in-place and separate
  arrays run and give the right values.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

from .torch_checks import NO_GPU as _NO_GPU, check, cuda, host, on_gpu, targets, torch

T = kp.Tensor


@kp.fusion
def sym_norm32(a: T[kp.f32, "n", "n"]):
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


@kp.fusion
def sym_norm64(a: T[kp.f64, "n", "n"]):
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


AXPY_CUDA = r"""
extern "C" __global__ void s36_axpy(const float* x, float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def pack():
    axpy = kp.external(
        "s36_axpy", "s36_axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, cuda=AXPY_CUDA, targets=targets(_NO_GPU),
        module="s36_ext")
    compiled = [kp.compile(f, targets=targets(_NO_GPU)) for f in (sym_norm32, sym_norm64)]
    return kp.load(kp.save(compiled + [axpy]))


@on_gpu
@pytest.mark.parametrize("n", [0, 1, 7, 32, 129, 1000, 4099])
@pytest.mark.parametrize("name, npdt, tol", [("sym_norm32", np.float32, 1e-5),
                                             ("sym_norm64", np.float64, 1e-12)])
def test_row_sums_read_at_other_rows(pack, n, name, npdt, tol):
    a = (np.random.default_rng(n).random((n, n)) + 0.5).astype(npdt)
    program = pack[name]
    plan = program.plan(a=(n, n))
    assert f"{name}_m0" in plan.allocations, plan
    assert plan.launches[-1].kernel == f"{name}_1_pointwise", plan
    got = host(program(cuda(a)))
    ad = a.astype(np.float64)
    d = 1 / np.sqrt(ad.sum(-1))
    check(got, ad * d[:, None] * d[None, :], tol, f"{name} n={n} variant {plan.variant}")


@on_gpu
def test_inout_partial_overlap_is_refused_and_in_place_runs(pack):
    axpy = pack["s36_axpy"]
    base = torch.arange(12, dtype=torch.float32, device="cuda")
    x, y = base[0:4], base[8:12]
    axpy(x, y, 1.0)
    axpy(x, y, 1.0)  # the fast path is warm from here on
    torch.cuda.synchronize()
    assert base[8:12].tolist() == [8.0, 11.0, 14.0, 17.0]
    for xs, ys in ((slice(0, 4), slice(1, 5)), (slice(1, 5), slice(0, 4)),
                   (slice(3, 7), slice(0, 4))):
        before = base.clone()
        with pytest.raises(LaunchError, match="partially overlaps argument 'x'"):
            axpy(base[xs], base[ys], 1.0)
        torch.cuda.synchronize()
        assert torch.equal(base, before)
    x = base[0:4]
    axpy(x, x, 2.0)  # in place: y = 2 y + y
    axpy(base[4:8], x, 1.0)  # adjacent
    torch.cuda.synchronize()
    assert base[0:4].tolist() == [4.0, 8.0, 12.0, 16.0]
