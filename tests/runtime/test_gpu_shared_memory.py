"""More than 48 KiB of dynamic shared memory on a real GPU (review 10): the driver refuses such a
launch unless the function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES was raised first
(execute.allow_shared); past the device's opt-in limit the call is a LaunchError naming the
kernel, and nothing runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).parent))
from runtime_kernels import gpu_count_or_skip  # noqa: E402

gpu_count_or_skip()

from test_gpu_cuda_c import device, torch  # noqa: E402,F401  (fixtures)

SRC = r"""
extern "C" __global__ void reverse_smem(const float* x, float* z, unsigned m) {
    extern __shared__ float buf[];
    for (unsigned i = threadIdx.x; i < m; i += blockDim.x) buf[i] = 2.0f * x[i];
    __syncthreads();
    for (unsigned i = threadIdx.x; i < m; i += blockDim.x) z[i] = buf[m - 1 - i];
}
"""


def _program(device):
    c = kp.external("reverse_smem", "reverse_smem",
                    [kp.Tensor("x", kp.f32, ("m",)), kp.Tensor("z", kp.f32, ("m",), role="out"),
                     kp.Scalar("m32", kp.u32, value="m")],
                    grid=1, block=256, shared_mem=kp.sym("m") * 4, cuda=SRC,
                    targets=[device.arch.sm])
    return kp.load(kp.save([c]))["reverse_smem"]


def test_launches_above_48_kib_of_dynamic_shared_memory(device, torch) -> None:
    program = _program(device)
    for m in (1000, 12288, 20000, 40000):  # 4 KB, 48 KiB exactly, 80 KB, 160 KB
        x = torch.randn(m, device="cuda")
        z = program(x)
        torch.testing.assert_close(z, torch.flip(2.0 * x, (0,)))
        out = torch.empty_like(x)
        program(x, out=out)  # the fast path leaves such shapes to the general one
        torch.testing.assert_close(out, z)


def test_beyond_the_opt_in_limit_is_a_launch_error(device, torch) -> None:
    program = _program(device)
    x = torch.randn(1 << 20, device="cuda")  # 4 MiB: more than any GPU's shared memory
    with pytest.raises(LaunchError, match="reverse_smem.*shared memory"):
        program(x)
    torch.testing.assert_close(program(x[:100]), torch.flip(2.0 * x[:100], (0,)))
