"""The runtime on a real GPU: selection, lazy loading, torch/cupy in and out, out=, streams,
graph capture, PTX compiled through the cache, DLPack/CAI export, two devices, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelpack.errors import ConstraintError, LaunchError

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = pytest.mark.gpu


_COUNT = kernels.gpu_count_or_skip()


@pytest.fixture(scope="module")
def pack():
    return kernels.make_pack([kernels.axpby(), kernels.twostep()])


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


def test_real_device_selection_and_mvc_load(pack) -> None:
    """nvJitLink cubins (toolkit 13.5) load under this driver (minor-version compatibility)."""
    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.library import load_module
    from kernelpack.runtime.selection import format_cuda_version

    dev = get_device(0)
    selection, lib = load_module(pack.modules["axpby"], dev)
    print(f"\n{dev!r} driver CUDA {format_cuda_version(dev.driver_version)}: "
          f"{selection.lines()} -> {lib.source}")
    assert selection.chosen.kind == "cubin"
    assert selection.chosen.arch.major == dev.arch.major
    assert set(lib.kernels) == {"axpby"}


def test_lazy_loading_and_warmup(torch) -> None:
    from kernelpack.runtime import library, warmup

    def mine() -> list:
        return [lib for lib in library.loaded_libraries() if "axpby_lazy" in lib.kernels]

    p = kernels.make_pack([kernels.axpby(name="lazy", entry="axpby_lazy")])
    prog = p["lazy"]
    _ = prog.summary, prog.plan((10,), (10,), 1.0)
    assert mine() == []  # loading and planning load nothing on the GPU
    warmup(p, devices=[0])
    (lib,) = mine()
    assert lib.loaded_on == {0} and lib.source == "cubin"
    x = torch.randn(10, device="cuda")
    torch.testing.assert_close(prog(x, x, 1.0), 2 * x)
    assert len(mine()) == 1  # the call reused the warmed library


def test_torch_in_torch_out(pack, torch) -> None:
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = torch.ones(1000, dtype=torch.float32, device="cuda")
    z = pack["axpby"](x, y, 2.0)
    assert isinstance(z, torch.Tensor) and z.device == x.device and z.shape == (1000,)
    torch.testing.assert_close(z, 2.0 * x + y)
    bound = pack["axpby"]._kp_bound
    assert bound.call != bound.__call__  # the torch fast path is in use
    for n in (1, 255, 256, 257, 100_000):  # shape cache: each size planned once, all correct
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(pack["axpby"](x, x, 1.0), 2 * x)
    fast = getattr(bound.call, "__self__", None)
    if type(fast).__name__ == "FastCall":  # the C fast path (the extension is built)
        done = fast.fast_calls
        out = torch.empty(1000, device="cuda")
        assert pack["axpby"](x[:1000], y, 3.0, out=out) is out
        torch.testing.assert_close(out, 3.0 * x[:1000] + y)
        assert fast.fast_calls == done + 1


def test_threads_share_a_program(pack, torch) -> None:
    """Concurrent callers: slots are not mixed up, and threads with no current context work."""
    import threading

    x = torch.randn(5000, device="cuda")
    y = torch.randn(5000, device="cuda")
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            out = [pack["axpby"](x, y, float(k)) for _ in range(50)]
            torch.cuda.synchronize()
            results[k] = out[-1]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, z in results.items():
        torch.testing.assert_close(z, float(k) * x + y)


def test_torch_out_and_stream(pack, torch) -> None:
    x = torch.randn(4097, device="cuda")
    y = torch.randn(4097, device="cuda")
    z = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    assert pack["axpby"](x, y, -1.5, out=z, stream=s) is z
    s.synchronize()
    torch.testing.assert_close(z, -1.5 * x + y)
    with torch.cuda.stream(s):  # default: the framework's current stream
        z2 = pack["axpby"](x, y, 3.0)
    s.synchronize()
    torch.testing.assert_close(z2, 3.0 * x + y)
    z3 = pack["axpby"](x, y, 0.5, stream=s.cuda_stream)  # raw handle
    s.synchronize()
    torch.testing.assert_close(z3, 0.5 * x + y)


def test_scratch_and_zero_init(pack, torch) -> None:
    x = torch.randn(3000, device="cuda")
    out = torch.full_like(x, 123.0)  # out= with zero_init is zeroed first
    for result in (pack["twostep"](x), pack["twostep"](x, out=out)):
        torch.cuda.synchronize()
        torch.testing.assert_close(result, x)


def test_size_zero(pack, torch) -> None:
    e = torch.empty(0, device="cuda")
    z = pack["axpby"](e, e, 1.0)
    assert z.shape == (0,)


def test_cuda_graph_capture_with_out(pack, torch) -> None:
    x = torch.randn(1024, device="cuda")
    y = torch.randn(1024, device="cuda")
    z = torch.empty_like(x)
    prog = pack["axpby"]
    prog(x, y, 2.0, out=z)  # bind + load outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        prog(x, y, 2.0, out=z)
    x.copy_(torch.arange(1024, device="cuda", dtype=torch.float32))
    z.zero_()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, 2.0 * x + y)


def _fast_call(call, flavor: str):
    """The C ``FastCall`` taking ``flavor`` arrays in the chain of fast paths starting at
    ``call`` (torch's falls back to cupy's), or None."""
    while call is not None:
        fast = getattr(call, "__self__", None)
        if type(fast).__name__ != "FastCall":
            return None
        if fast.flavor == flavor:
            return fast
        call = fast.hooks.slow
    return None


def test_cupy_in_cupy_out(pack, cupy) -> None:
    x = cupy.arange(513, dtype=cupy.float32)
    y = cupy.full(513, 2.0, dtype=cupy.float32)
    z = pack["axpby"](x, y, 3.0)
    assert isinstance(z, cupy.ndarray) and z.dtype == cupy.float32
    cupy.testing.assert_allclose(z, 3.0 * x + y)
    assert "cupy" in pack["axpby"]._kp_bound._fast_for  # fast path rebuilt for cupy
    cupy.testing.assert_allclose(pack["axpby"](x, y, 3.0), 3.0 * x + y)
    fast = _fast_call(pack["axpby"]._kp_bound.call, "cupy")
    if fast is not None:  # the C fast path (the extension is built) takes cupy arrays
        done = fast.fast_calls
        out = cupy.empty_like(x)
        assert pack["axpby"](x, y, 5.0, out=out) is out
        cupy.testing.assert_allclose(out, 5.0 * x + y)
        cupy.testing.assert_allclose(pack["axpby"](x, y, 6.0), 6.0 * x + y)
        assert fast.fast_calls == done + 2
    s = cupy.cuda.Stream(non_blocking=True)
    out = cupy.empty_like(x)
    pack["axpby"](x, y, 1.0, out=out, stream=s)
    s.synchronize()
    cupy.testing.assert_allclose(out, x + y)
    with s:
        z2 = pack["axpby"](x, y, 4.0)
    s.synchronize()
    cupy.testing.assert_allclose(z2, 4.0 * x + y)


def test_generic_arrays_and_device_buffer_export(pack, torch) -> None:
    from kernelpack.runtime.buffer import DeviceBuffer

    x = torch.arange(300, dtype=torch.float32, device="cuda")
    y = torch.ones(300, dtype=torch.float32, device="cuda")

    class CAI:  # not a torch tensor: goes through __cuda_array_interface__
        def __init__(self, t):
            self.t = t
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    class DL:  # only DLPack
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    torch.cuda.synchronize()
    for wrap in (CAI, DL):
        z = pack["axpby"](wrap(x), wrap(y), 2.0)
        assert isinstance(z, DeviceBuffer)
        torch.cuda.synchronize()
        torch.testing.assert_close(torch.from_dlpack(z), 2.0 * x + y)
        torch.testing.assert_close(torch.as_tensor(z, device="cuda"), 2.0 * x + y)


def test_ptx_only_artifact_compiles_through_the_cache(torch, tmp_path, monkeypatch) -> None:
    from kernelpack.runtime.device import get_device
    from kernelpack.runtime.library import load_module

    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path))
    p = kernels.make_pack([kernels.axpby(targets=("compute_80",), name="ptxonly")])
    images = p.modules["ptxonly"].images
    assert [i.kind for i in images] == ["ptx"]
    selection, lib = load_module(p.modules["ptxonly"], get_device(0))
    assert lib.source == "ptx->cubin (nvJitLink)"
    assert list(tmp_path.glob("runtime-ptx/*/*.cubin"))
    x = torch.randn(77, device="cuda")
    torch.testing.assert_close(p["ptxonly"](x, x, 1.0), 2 * x)


def test_argument_errors(pack, torch) -> None:
    x = torch.randn(16, device="cuda")
    with pytest.raises(LaunchError, match="host memory"):
        pack["axpby"](x.cpu(), x.cpu(), 1.0)
    with pytest.raises(LaunchError, match="'y' has dtype float64, expected float32"):
        pack["axpby"](x, x.double(), 1.0)
    with pytest.raises(LaunchError, match="'x' is not C-contiguous"):
        pack["axpby"](torch.randn(32, device="cuda")[::2], x, 1.0)
    with pytest.raises(ConstraintError):
        pack["axpby"](x, torch.randn(17, device="cuda"), 1.0)
    with pytest.raises(LaunchError, match="out 'z' has shape"):
        pack["axpby"](x, x, 1.0, out=torch.empty(3, device="cuda"))


@pytest.mark.skipif(_COUNT < 2, reason="needs two GPUs")
def test_two_devices(pack, torch) -> None:
    from kernelpack.runtime import library

    for dev in ("cuda:0", "cuda:1"):
        x = torch.randn(1000, device=dev)
        z = pack["axpby"](x, x, 1.0)
        assert z.device == x.device
        torch.cuda.synchronize(x.device)
        torch.testing.assert_close(z, 2 * x)
    for _ in range(3):  # warm calls alternate devices on the fast path
        for dev in ("cuda:0", "cuda:1"):
            x = torch.randn(1000, device=dev)
            out = torch.empty_like(x)
            assert pack["axpby"](x, x, 2.0, out=out) is out
            z = pack["axpby"](x, x, 0.5)
            assert z.device == x.device
            torch.cuda.synchronize(x.device)
            torch.testing.assert_close(out, 3 * x)
            torch.testing.assert_close(z, 1.5 * x)
    with pytest.raises(LaunchError, match="device"):
        pack["axpby"](torch.randn(4, device="cuda:0"), torch.randn(4, device="cuda:1"), 1.0)
    assert library.loaded_libraries()
