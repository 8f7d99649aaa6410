"""Float ``//`` and ``%`` on the device give NumPy's answers where the rounded quotient lands
on the next integer (``10.0 // 0.2`` is 49, ``1.0 // 0.1`` is 9): LLVM's ``frem`` became
``x - trunc(x / y) * y`` on the GPU and gave 50 (GPU fuzz seed 3446). Now libdevice's fmod."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=str)
def test_float_floor_division_and_remainder_match_numpy(dt):
    @kp.fusion
    def fd(x: kp.Tensor[dt, "n"], y: kp.Tensor[dt, "n"]):
        return x // y, x % y

    npdt = np.float32 if dt == kp.float32 else np.float64
    rng = np.random.default_rng(1)
    x = np.concatenate([[10.0, 1.0, -7.5, 0.0, -0.0, 3.0, 1e30],
                        rng.standard_normal(5000) * 100]).astype(npdt)
    y = np.concatenate([[0.2, 0.1, 0.2, 3.0, 3.0, -0.7, 0.1],
                        rng.choice([0.1, 0.2, 0.3, -0.7, 1e-3], 5000)]).astype(npdt)
    program = kp.load(kp.save([kp.compile(fd, targets=["sm_80", "sm_90", "ptx"])]))["fd"]
    q, r = program(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda())
    np.testing.assert_array_equal(q.cpu().numpy(), x // y)
    np.testing.assert_array_equal(r.cpu().numpy(), x % y)
