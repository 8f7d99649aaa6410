"""kp.external(cuda=...) on a real GPU: CUDA C compiled with NVRTC, saved, loaded and launched
on torch tensors — an extern "C" kernel from its cubin, a C++ template through a name
expression (with -D options), and a PTX-only artifact."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).parent))
from runtime_kernels import gpu_count_or_skip  # noqa: E402

gpu_count_or_skip()

BLOCK = 256

SRC = r"""
#ifndef OFFSET
#define OFFSET 0
#endif
extern "C" __global__ void axpby_c(const float* x, const float* y, float* z, float a,
                                   unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = a * x[i] + y[i] + OFFSET;
}

template <typename T>
__global__ void axpby_t(const T* x, const T* y, T* z, T a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = a * x[i] + y[i] + T(OFFSET);
}
"""


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def device():
    """The device, after checking that this machine's NVRTC can build code it will load."""
    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.selection import format_cuda_version
    from kernelpack.toolchain import nvrtc

    try:
        cuda = nvrtc.cuda_version()
    except CompileError as exc:
        pytest.skip(f"NVRTC missing: {exc}")
    dev = get_device(0)
    if cuda // 1000 > dev.driver_version // 1000:
        pytest.skip(f"NVRTC {format_cuda_version(cuda)} is a newer major than the driver's "
                    f"CUDA {format_cuda_version(dev.driver_version)}")
    if dev.arch.major * 10 + dev.arch.minor not in nvrtc.supported_archs():
        pytest.skip(f"NVRTC {format_cuda_version(cuda)} cannot compile for {dev.arch.sm}")
    return dev


def _axpby(name: str, entry: str, targets: list[str], dtype=kp.f32,
           options: tuple[str, ...] = ()) -> kp.Compiled:
    return kp.external(name, entry,
                       [kp.Tensor("x", dtype, ("n",)), kp.Tensor("y", dtype, ("n",)),
                        kp.Tensor("z", dtype, ("n",), role="out"), kp.Scalar("a", dtype),
                        kp.Scalar("n32", kp.u32, value="n")],
                       grid=kp.cdiv("n", BLOCK), block=BLOCK, cuda=SRC, targets=targets,
                       nvrtc_options=options)


def test_extern_c_kernel_from_its_cubin(device, torch) -> None:
    from kernelpack.runtime.library import load_module

    c = _axpby("axpby_cu", "axpby_c", [device.arch.sm, "ptx"])
    pack = kp.load(kp.save([c]))
    selection, lib = load_module(pack.modules["axpby_cu"], device)
    assert selection.chosen.kind == "cubin" and selection.chosen.arch == device.arch
    assert lib.source == "cubin" and set(lib.kernels) == {"axpby_c"}
    for n in (1, 255, 256, 257, 100_000):
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        z = pack["axpby_cu"](x, y, 2.0)
        assert isinstance(z, torch.Tensor) and z.shape == (n,) and z.device == x.device
        torch.testing.assert_close(z, 2.0 * x + y)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_template_through_a_name_expression_with_options(device, torch, dtype: str) -> None:
    ctype, tdtype = {"f32": ("float", torch.float32), "f64": ("double", torch.float64)}[dtype]
    c = _axpby(f"axpby_{dtype}", f"axpby_t<{ctype}>", [device.arch.sm], dtype=getattr(kp, dtype),
               options=("-DOFFSET=1", "-std=c++17"))
    (kernel,) = c.modules[0].kernels
    assert kernel.startswith("_Z")  # the mangled name is what the artifact launches
    pack = kp.load(kp.save([c]))
    x = torch.randn(5000, device="cuda", dtype=tdtype)
    y = torch.randn(5000, device="cuda", dtype=tdtype)
    torch.testing.assert_close(pack[f"axpby_{dtype}"](x, y, -0.5), -0.5 * x + y + 1)


def test_ptx_only_artifact(device, torch, tmp_path, monkeypatch) -> None:
    """NVRTC's PTX (for the device's compute_XY) alone: compiled for the device at load."""
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path))
    c = _axpby("axpby_ptx", "axpby_c", [device.arch.compute])
    pack = kp.load(kp.save([c]))
    assert [i.kind for i in pack.modules["axpby_ptx"].images] == ["ptx"]
    x = torch.randn(777, device="cuda")
    torch.testing.assert_close(pack["axpby_ptx"](x, x, 3.0), 4.0 * x)
