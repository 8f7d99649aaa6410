"""The second review's lowering changes on a GPU: a full reduction's outputs spread over blocks
(``x / x.sum()``), long dependency chains, NumPy-typed small-integer math and correctly rounded
float32 square roots (``sqrt.approx.f32`` before), through compile → save → load → launch
against NumPy (torch tensors in and out)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

T = kp.Tensor


@kp.fusion
def spread(x: T[kp.f32, "n"], y: T[kp.f64, "m"]):
    d = y - y.mean()
    return x / x.sum(), x - x.max(), d * kp.rsqrt((d * d).mean())


@kp.fusion
def chain(x: T[kp.f64, "b", "n"]):
    z = x
    for _ in range(300):
        z = z * 0.75 + 0.25
    return z - z.max(-1, keepdims=True)


@kp.fusion
def small(b: T[kp.bool_, "n"], s: T[kp.i16, "n"], i: T[kp.i32, "n"]):
    return kp.exp(b), kp.sqrt(s), i + i.shape[0], kp.arange(1, i.shape[0], 2)


@kp.fusion
def roots(x: T[kp.f32, "n"], z: T[kp.c64, "n"]):
    return kp.sqrt(x), x ** 0.5, abs(z), x ** -1


@pytest.fixture(scope="module")
def pack():
    return kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])
                            for f in (spread, chain, small, roots)]))


def _rel(got, ref) -> float:
    got = np.asarray(got, np.float64)
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)) if ref.size else 0.0


@pytest.mark.parametrize("n, m", [(1, 1), (4097, 3), (10_000_003, 5_000_001), (0, 2)])
def test_spread_full_reductions(pack, n, m):
    rng = np.random.default_rng(n)
    x = rng.random(n, dtype=np.float32) + 0.5
    y = rng.standard_normal(m)
    a, b, c = pack["spread"](torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda())
    xd = x.astype(np.float64)
    assert _rel(a.cpu().numpy(), xd / xd.sum()) < 1e-6
    if n:
        assert _rel(b.cpu().numpy(), xd - xd.max()) < 1e-6
    d = y - y.mean()
    with np.errstate(all="ignore"):
        ref = d / np.sqrt((d * d).mean())
    if m > 1:
        assert _rel(c.cpu().numpy(), ref) < 1e-12


def test_long_chain(pack):
    x = np.random.default_rng(0).standard_normal((64, 1000))
    z = x
    for _ in range(300):
        z = z * 0.75 + 0.25
    got = pack["chain"](torch.from_numpy(x).cuda()).cpu().numpy()
    assert np.max(np.abs(got - (z - z.max(-1, keepdims=True)))) < 1e-12


def test_small_integer_math(pack):
    b = np.array([True, False, True] * 50)
    s = np.arange(150, dtype=np.int16)
    i = np.arange(150, dtype=np.int32) - 75
    e, r, w, a = pack["small"](*(torch.from_numpy(v).cuda() for v in (b, s, i)))
    assert e.dtype == torch.float16 and np.array_equal(e.cpu().numpy(), np.exp(b))
    assert r.dtype == torch.float32 and np.array_equal(r.cpu().numpy(), np.sqrt(s))
    assert w.dtype == torch.int32 and np.array_equal(w.cpu().numpy(), i + 150)
    assert np.array_equal(a.cpu().numpy(), np.arange(1, 150, 2))


def test_float32_square_roots_are_correctly_rounded(pack):
    rng = np.random.default_rng(5)
    x = (rng.random(1 << 20) * 1e4).astype(np.float32)
    z = (rng.standard_normal(1 << 20) + 1j * rng.standard_normal(1 << 20)).astype(np.complex64)
    got = pack["roots"](torch.from_numpy(x).cuda(), torch.from_numpy(z).cuda())
    a, b, c, d = (t.cpu().numpy() for t in got)
    assert np.array_equal(a, np.sqrt(x)) and np.array_equal(b, x ** 0.5)
    assert np.array_equal(d, x ** -1)
    ref = np.abs(z.astype(np.complex128))
    assert np.max(np.abs(c - ref) / ref) < 2 ** -24 * 1.01  # within half an ulp (+ a hair)
