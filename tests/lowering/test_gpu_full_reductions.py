"""Chained full reductions on a GPU (:mod:`kernelpack.lowering.fullred`): variance, std, a
third level (kurtosis), ``x - mean`` over its norm, independent chains in one fusion and a 2-D
tensor reduced over every axis, through compile → save → load → launch, against NumPy in
float64 (float32 within 1e-5 relative, float64 within 1e-12), from empty to ten million
elements; and two launches on the same input give the same bits (no atomics)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .full_reduction_fusions import moments, two, unit, unit64, var2d, var_std

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

@pytest.fixture(scope="module")
def pack():
    return kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])
                            for f in (var_std, moments, unit, unit64, two, var2d)]))


def _cuda(a: np.ndarray):  # type: ignore[no-untyped-def]
    return torch.from_numpy(a).cuda()


def _rel(got, ref) -> float:  # type: ignore[no-untyped-def]
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    if not ref.size:
        return 0.0
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    keep = ~np.isnan(ref)
    if not keep.any():
        return 0.0
    return float(np.max(np.abs(got[keep] - ref[keep])) / max(np.max(np.abs(ref[keep])), 1e-300))


def _var(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(((x - x.mean()) ** 2).mean() if x.size else np.nan)


@pytest.mark.parametrize("n", [0, 1, 7, 16383, 16384, 16385, 1_000_003, 10_000_019])
def test_variance_and_std(pack, n):
    x = (np.random.default_rng(n).standard_normal(n) * 2 + 100).astype(np.float32)
    v, s = (t.cpu().numpy() for t in pack["var_std"](_cuda(x)))
    ref = _var(x.astype(np.float64))
    assert _rel(v, ref) < 1e-5 and _rel(s, np.sqrt(ref)) < 1e-5


@pytest.mark.parametrize("n", [2, 16411, 3_000_017])
def test_three_levels_float64(pack, n):
    x = np.random.default_rng(n).standard_normal(n) * 3 + 1
    v, s, k = (t.cpu().numpy() for t in pack["moments"](_cuda(x)))
    ref = _var(x)
    z = (x - x.mean()) / np.sqrt(ref)
    assert _rel(v, ref) < 1e-12 and _rel(s, np.sqrt(ref)) < 1e-12
    assert _rel(k, (z ** 4).mean()) < 1e-12


@pytest.mark.parametrize("name, dt, tol", [("unit", np.float32, 1e-5),
                                           ("unit64", np.float64, 1e-12)])
@pytest.mark.parametrize("n", [0, 1, 9001, 10_000_019])
def test_centred_and_normalised(pack, name, dt, tol, n):
    x = (np.random.default_rng(n).standard_normal(n) + 5).astype(dt)
    got = pack[name](_cuda(x)).cpu().numpy()
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        y = xd - (xd.mean() if n else 0.0)
        ref = y / np.sqrt((y * y).sum())
    assert got.dtype == dt and _rel(got, ref) < tol


@pytest.mark.parametrize("n, m", [(16385, 3), (0, 5), (5_000_011, 70_001)])
def test_independent_chains(pack, n, m):
    rng = np.random.default_rng(n + m)
    x = rng.standard_normal(n).astype(np.float32) + 3
    y = rng.standard_normal(m).astype(np.float32) - 1
    a, b = (t.cpu().numpy() for t in pack["two"](_cuda(x), _cuda(y)))
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    assert _rel(a, _var(xd)) < 1e-5
    assert _rel(b, ((yd - yd.mean()) ** 2).sum() + xd.sum() * yd.max()) < 1e-5


@pytest.mark.parametrize("shape", [(3, 5479), (1000, 10007)])
def test_two_dimensional(pack, shape):
    x = (np.random.default_rng(shape[1]).standard_normal(shape) + 2).astype(np.float32)
    v, u = (t.cpu().numpy() for t in pack["var2d"](_cuda(x)))
    d = x.astype(np.float64) - x.astype(np.float64).mean()
    assert _rel(v, _var(x.astype(np.float64))) < 1e-5
    assert _rel(u, d / np.sqrt((d * d).sum())) < 1e-5


def test_same_bits_every_launch(pack):
    x = _cuda((np.random.default_rng(9).standard_normal(20_000_003) + 7).astype(np.float32))
    first = [t.cpu().numpy() for t in pack["var_std"](x)] + [pack["unit"](x).cpu().numpy()]
    for _ in range(3):
        again = [t.cpu().numpy() for t in pack["var_std"](x)] + [pack["unit"](x).cpu().numpy()]
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
