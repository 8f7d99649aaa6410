"""DLPack's C exchange API of the real torch on a GPU: it describes every dtype kernelpack
has the way fast_native.dl_dtype names it (else the fast path would silently hand every call
of that dtype to the general path), its current stream is torch's, and the C fast path takes
calls through it."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

import kernelpack as kp

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402
from dlpack_exchange import DLTensor, ExchangeAPI  # noqa: E402

pytestmark = pytest.mark.gpu

_COUNT = kernels.gpu_count_or_skip()


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
    return torch


def _api(torch) -> ExchangeAPI:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ExchangeAPI.from_address(get(torch.Tensor.__dlpack_c_exchange_api__,
                                        b"dlpack_exchange_api"))


def test_every_dtype_is_described_as_dl_dtype_says(torch) -> None:
    from kernelpack.runtime.fast_native import dl_dtype

    api = _api(torch)
    assert (api.major, api.minor) >= (1, 2)
    for name in ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
                 "float32", "float64", "complex64", "complex128"):
        t = torch.zeros(3, 2, dtype=getattr(torch, name), device="cuda")
        out = DLTensor()
        assert api.dltensor_from_py_object_no_sync(id(t), ctypes.byref(out)) == 0, name
        got = (out.dtype.code, out.dtype.bits)
        assert got == dl_dtype(kp.dtypes.as_dtype(name)), (name, got)
        assert out.data == t.data_ptr() and out.ndim == 2 and out.shape[0] == 3
        assert (out.device.device_type, out.device.device_id) == (2, t.get_device())


def test_current_stream_is_torchs(torch) -> None:
    api = _api(torch)
    s = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), s):
        with torch.cuda.stream(stream):
            got = ctypes.c_void_p()
            assert api.current_work_stream(2, 0, ctypes.byref(got)) == 0
            assert (got.value or 0) == torch.cuda.current_stream().cuda_stream


def test_fast_calls_go_through_it(torch) -> None:
    @kp.fusion
    def masked_scale(x: kp.Tensor[kp.f32, "n"], m: kp.Tensor[kp.bool_, "n"], a: kp.f32):
        return kp.where(m, x * a, x)

    prog = kp.load(kp.save([kp.compile(masked_scale, targets=["sm_80", "sm_90"])]))[
        "masked_scale"]
    x = torch.randn(4097, device="cuda")
    m = torch.rand(4097, device="cuda") > 0.5
    for n in (4097, 4097, 100, 4097, 100):
        got = prog(x[:n], m[:n], 3.0)
        torch.testing.assert_close(got, torch.where(m[:n], x[:n] * 3.0, x[:n]))
    fast = getattr(prog._kp_bound.call, "__self__", None)
    if type(fast).__name__ == "FastCall":  # the extension is built
        assert fast.fast_calls == 4 and fast.entries == 2
