"""Two GPUs (skipped otherwise): what issue 4 asks of multi-GPU use beyond the axpby checks of
test_gpu.py and test_review11_multidevice_gpu.py — the inputs' device decides where a program
runs and where its outputs and scratch live, for torch, CuPy and any
``__cuda_array_interface__`` array; a program with no tensor argument runs on the current
device; ``warmup`` loads one library for both devices; ``out=`` on the other device is refused;
a CUDA graph captured on device 1 replays there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(kernels.gpu_count_or_skip() < 2, reason="needs two GPUs")]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def fused():
    """Compiled fusions with scratch (a two-launch full sum), a row kernel and no tensor input."""
    pytest.importorskip("llvmlite", reason="compiling fusions needs llvmlite")

    @kp.fusion
    def total(x: kp.Tensor[kp.f32, "n"]):
        return x.sum()

    @kp.fusion
    def softmax(x: kp.Tensor[kp.f32, "b", "n"]):
        e = kp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    @kp.fusion
    def ramp(x: kp.Tensor[kp.f32, "n"], a: kp.f32):
        # the size comes from a tensor, but the values only from the index and a scalar
        return kp.arange(x.shape[0]).astype(kp.f32) * a

    return kernels.make_pack([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])
                              for f in (total, softmax, ramp)])


class _Interface:
    """A bare ``__cuda_array_interface__`` view of a torch tensor (no framework adapter)."""

    def __init__(self, t) -> None:  # type: ignore[no-untyped-def]
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def test_fusions_with_scratch_run_on_the_inputs_device(torch, fused) -> None:
    for dev in ("cuda:1", "cuda:0", "cuda:1"):
        x = torch.randn(1 << 20, device=dev)
        s = fused["total"](x)
        assert s.device == x.device
        torch.testing.assert_close(s.double(), x.double().sum(), rtol=1e-5, atol=1e-3)
        m = torch.randn(300, 1000, device=dev)
        y = fused["softmax"](m)
        assert y.device == m.device
        torch.testing.assert_close(y, torch.softmax(m, dim=1))


def test_each_device_gets_its_own_loaded_functions(torch, fused) -> None:
    from kernelpack.runtime import library

    fused.warmup(devices=[0, 1])
    for name in ("total", "softmax", "ramp"):
        loaded = [lib for lib in library.loaded_libraries()
                  if any(k.startswith(name) for k in lib.kernels)]
        assert loaded, name
        assert any({0, 1} <= lib.loaded_on for lib in loaded), (name, loaded)


def test_cupy_arrays_on_device_1(fused) -> None:
    cupy = pytest.importorskip("cupy")
    with cupy.cuda.Device(1):
        x = cupy.random.standard_normal((64, 513), dtype=cupy.float32)
        y = fused["softmax"](x)
        assert isinstance(y, cupy.ndarray) and y.device.id == 1
        e = cupy.exp(x - x.max(axis=1, keepdims=True))
        cupy.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_a_generic_array_on_device_1_gets_a_kernelpack_buffer_there(torch, fused) -> None:
    x = torch.randn(777, device="cuda:1")
    out = fused["ramp"](_Interface(x), 0.5)
    assert not isinstance(out, torch.Tensor)
    assert out.device == 1
    got = torch.as_tensor(out, device="cuda:1")
    torch.testing.assert_close(got, torch.arange(777, device="cuda:1", dtype=torch.float32) * 0.5)


def test_out_on_the_other_device_is_refused(torch, fused) -> None:
    x = torch.randn(1000, device="cuda:0")
    with pytest.raises(LaunchError, match="device"):
        fused["ramp"](x, 1.0, out=torch.empty(1000, device="cuda:1"))
    pack = kernels.make_pack([kernels.axpby()])
    with pytest.raises(LaunchError, match="device"):
        pack["axpby"](x, x, 1.0, out=torch.empty(1000, device="cuda:1"))


def test_graph_capture_on_device_1(torch) -> None:
    pack = kernels.make_pack([kernels.axpby()])
    prog = pack["axpby"]
    x = torch.randn(4096, device="cuda:1")
    y = torch.randn(4096, device="cuda:1")
    z = torch.empty_like(x)
    with torch.cuda.device(1):
        prog(x, y, 2.0, out=z)  # bind and load outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        # a capture stream of device 1: torch.cuda.graph's default one is made once per process,
        # on the device current at its first use (device 0 after the other tests), and a capture
        # there records nothing of device 1's work ("The CUDA Graph is empty")
        with torch.cuda.graph(g, stream=torch.cuda.Stream(device=1)):
            prog(x, y, 3.0, out=z)
        z.zero_()
        g.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(z, 3 * x + y)
