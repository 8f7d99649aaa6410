"""``kp.compile(..., opt=N)``: every LLVM optimization level gives working kernels on the
GPU (until session 10 the level never reached LLVM: every level built the -O3 code, so
levels 0-2 had never run). float64 workloads against NumPy at a few shapes each."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

from kernelpack.lowering.workloads import make  # noqa: E402

T = kp.Tensor


@kp.fusion
def colmean(x: T[kp.f64, "a", "b"]):
    return x.mean(axis=0), x - x.mean(axis=0, keepdims=True)


@pytest.mark.parametrize("opt", [0, 1, 2])
def test_every_level_runs_right(opt):
    major, minor = torch.cuda.get_device_capability()
    w = make(kp.f64)
    fusions = [w["softmax"], w["total"], w["gelu"], colmean]
    pack = kp.load(kp.save([kp.compile(f, targets=[f"sm_{major}{minor}"], opt=opt)
                            for f in fusions]))
    rng = np.random.default_rng(opt)
    for shape in ((3, 7), (64, 1000), (2, 70001)):
        x = rng.standard_normal(shape)
        got = pack["softmax_float64"](torch.from_numpy(x).cuda()).cpu().numpy()
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-12, atol=1e-300)
    for n in (1, 4097, 3_000_017):
        x = rng.standard_normal(n)
        got = pack["total_float64"](torch.from_numpy(x).cuda()).cpu().numpy()
        assert abs(float(got) - x.sum()) <= 1e-12 * np.abs(x).sum()
        g = pack["gelu_float64"](torch.from_numpy(x).cuda()).cpu().numpy()
        ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-15)
    for shape in ((5, 3), (3000, 7), (100000, 64)):
        x = rng.standard_normal(shape)
        m, c = pack["colmean"](torch.from_numpy(x).cuda())
        np.testing.assert_allclose(m.cpu().numpy(), x.mean(0), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(c.cpu().numpy(), x - x.mean(0, keepdims=True), rtol=1e-12,
                                   atol=1e-14)
