"""Column reductions on a GPU (:mod:`kernelpack.lowering.columns`): sums, means, extrema,
a centring and a standard deviation over leading and middle axes, through compile → save →
load → launch on torch tensors, against NumPy in float64, at shapes on every side of the
variant predicates (general schedule, warp final, block final) up to 100000 x 64 and
1e6 x 16; float32 within 1e-5 relative, float64 within 1e-12. Two launches on one input give
the same bits (the partials' order is fixed by the launch shape, no atomics)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

T = kp.Tensor


def _stats(dt, name):  # type: ignore[no-untyped-def]
    @kp.fusion(name=name)
    def colstats(x: T[dt, "a", "b"]):
        m = x.mean(axis=0, keepdims=True)
        sd = kp.sqrt(((x - m) * (x - m)).mean(axis=0))
        return x.sum(axis=0), x.max(axis=0), x - m, sd

    return colstats


@kp.fusion
def middle(y: T[kp.f32, "p", "q", "r"]):
    return y.sum(axis=1), y.min(axis=(0, 1), keepdims=True)


@pytest.fixture(scope="module")
def pack():
    fs = [_stats(kp.f32, "colstats"), _stats(kp.f64, "colstats64"), middle]
    return kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"]) for f in fs]))


def _rel(got, ref) -> float:  # type: ignore[no-untyped-def]
    got = got.detach().cpu().numpy().astype(np.float64)
    assert got.shape == ref.shape
    if not ref.size:
        return 0.0
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300))


@pytest.mark.parametrize("shape", [(1, 5), (100, 64), (1000, 3), (20001, 2), (100000, 64),
                                   (1_000_000, 16), (4096, 4096), (3, 70000)])
@pytest.mark.parametrize("name, dtype, tol", [("colstats", np.float32, 1e-5),
                                              ("colstats64", np.float64, 1e-12)])
def test_column_statistics(pack, shape, name, dtype, tol):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    xd = x.astype(np.float64)
    s, mx, centred, sd = pack[name](torch.from_numpy(x).cuda())
    m = xd.mean(0, keepdims=True)
    assert _rel(s, xd.sum(0)) <= tol * 10  # a sum of mixed signs: relative to its largest
    assert _rel(mx, xd.max(0)) == 0
    assert _rel(centred, xd - m) <= tol
    assert _rel(sd, np.sqrt(((xd - m) ** 2).mean(0))) <= tol


def test_middle_axes_and_determinism(pack):
    rng = np.random.default_rng(9)
    y = rng.standard_normal((6, 50000, 40)).astype(np.float32)
    yt = torch.from_numpy(y).cuda()
    s, mn = pack["middle"](yt)
    assert _rel(s, y.astype(np.float64).sum(1)) <= 1e-5
    assert _rel(mn, y.min(axis=(0, 1), keepdims=True).astype(np.float64)) == 0
    again, _ = pack["middle"](yt)
    assert torch.equal(s, again)
    kernels = [l.kernel for l in pack["middle"].plan(y=(6, 50000, 40)).launches]
    assert kernels[0].endswith("colsplit"), kernels
