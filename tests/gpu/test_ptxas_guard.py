"""Signed integer min/max of negated values on the device (GPU fuzz seed 6703): CUDA 13.0's
ptxas at -O3 used one negated operand of an unrolled min/max group un-negated, so
``(-x).max()`` over 1031 int32 values returned an element of ``x``. kernelpack assembles such
modules at ptxas -O1 when nvJitLink is older than 13.5 (toolchain/ptxas_guard.py)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

T = kp.Tensor


def _program(f: kp.fusion):
    major, minor = torch.cuda.get_device_capability()
    return kp.load(kp.save([kp.compile(f, targets=[f"sm_{major}{minor}"])]))[f.name]


@pytest.mark.parametrize("dt, npdt", [(kp.int32, np.int32), (kp.int16, np.int16)], ids=str)
def test_reductions_of_negated_integers(dt, npdt) -> None:
    @kp.fusion(name=f"negmax_{dt.name}")
    def negmax(x: T[dt, "n"]):
        return (-x).max(axis=0), (-kp.abs(x)).max(axis=0), (-x).min(axis=0)

    program = _program(negmax)
    rng = np.random.default_rng(6703)
    info = np.iinfo(npdt)
    for n in (1031, 4099, 20000, 100003):
        x = rng.integers(info.min // 2, info.max // 2, n).astype(npdt)
        got = [int(v.item()) for v in program(torch.from_numpy(x).cuda())]
        assert got == [int((-x).max()), int((-np.abs(x)).max()), int((-x).min())], n


def test_elementwise_max_of_negated_integers() -> None:
    @kp.fusion
    def max3(x: T[kp.int32, "n"], y: T[kp.int32, "n"], z: T[kp.int32, "n"]):
        return kp.maximum(kp.maximum(-x, -y), -z), kp.minimum(kp.minimum(-x, y), -z)

    program = _program(max3)
    rng = np.random.default_rng(1)
    for n in (1031, 4099, 100003):
        x, y, z = (rng.integers(-2**30, 2**30, n).astype(np.int32) for _ in range(3))
        hi, lo = program(*(torch.from_numpy(v).cuda() for v in (x, y, z)))
        np.testing.assert_array_equal(hi.cpu().numpy(), np.maximum(np.maximum(-x, -y), -z))
        np.testing.assert_array_equal(lo.cpu().numpy(), np.minimum(np.minimum(-x, y), -z))
