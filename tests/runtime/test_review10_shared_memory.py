"""Tenth review: launches that take more than 48 KiB of dynamic shared memory (an external
kernel declared with ``shared_mem=kp.sym("n") * 4``), against a fake driver that behaves as a
GPU does: such a launch fails (CUDA_ERROR_INVALID_VALUE) unless the function's
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES was raised first, and the attribute cannot be
raised beyond the device's opt-in limit.

kernelpack never raised it: every such launch failed on a GPU, though the same kernel launched
from CUDA C after ``cudaFuncSetAttribute`` runs."""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor, \
    Variant

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import CUresult, FakeDriver, install, install_framework  # noqa: E402

MAX_DYNAMIC = 8      # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
OPTIN = 97           # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
LIMIT = 232448       # an H100's opt-in limit (227 KiB)


class _Vector:
    """``__cuda_array_interface__`` of ``n`` float32 (the kernel here reads none of them)."""

    def __init__(self, n: int) -> None:
        self.buf = ctypes.create_string_buffer(16)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "version": 3,
                                         "data": (ctypes.addressof(self.buf), False)}


def staged() -> Compiled:
    """A kernel staging all of x in shared memory: ``4 * n`` bytes of it."""
    s = KernelSummary("staged", (Tensor("x", kp.f32, ("n",), role="inout"),),
                      (Variant((Launch("stage", "m", (1,), (256,), (Arg.buffer("x"),),
                                       shared_mem=kp.sym("n") * 4),)),))
    return Compiled(s, (Module("m", ("stage",), (Image("cubin", "sm_90", b"\x7fELF-stage"),)),))


class _GpuLikeFake(FakeDriver):
    """Refuses launches above 48 KiB of dynamic shared memory unless allowed, as a GPU does."""

    CUfunction_attribute = types.SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=MAX_DYNAMIC)
    CUdevice_attribute = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=OPTIN)

    def __init__(self) -> None:
        super().__init__(kernels={"stage": ("Q", lambda *a: None)})
        self.allowed: dict[int, int] = {}

    def cuDeviceGetAttribute(self, attr, dev):
        if attr == OPTIN:
            return CUresult(0), LIMIT
        return CUresult(0), self.arch[0] if attr == 75 else self.arch[1]

    def cuFuncSetAttribute(self, func, attr, value):
        self.calls.append(("cuFuncSetAttribute", int(func), int(attr), value))
        if attr != MAX_DYNAMIC or value > LIMIT:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.allowed[int(func)] = value
        return (CUresult(0),)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        if shmem > max(48 * 1024, self.allowed.get(int(f), 0)):
            self.calls.append(("refused launch", shmem))
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        return super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, _GpuLikeFake())


def _names(fake, since: int = 0) -> list:
    return [c[0] for c in fake.calls[since:] if c[0] in ("cuFuncSetAttribute", "cuLaunchKernel",
                                                         "refused launch")]


def test_more_than_48_kib_is_allowed_before_the_launch(fake) -> None:
    prog = staged()
    call_program(prog, _Vector(16384))  # 64 KiB
    assert _names(fake) == ["cuFuncSetAttribute", "cuLaunchKernel"]
    set_attr = next(c for c in fake.calls if c[0] == "cuFuncSetAttribute")
    assert set_attr[2:] == (MAX_DYNAMIC, 65536)
    before = len(fake.calls)
    call_program(prog, _Vector(16000))  # less than allowed already: nothing to raise
    call_program(prog, _Vector(16384))
    assert _names(fake, before) == ["cuLaunchKernel", "cuLaunchKernel"]
    call_program(prog, _Vector(40000))  # more: raised again
    assert _names(fake, before)[-2:] == ["cuFuncSetAttribute", "cuLaunchKernel"]


def test_up_to_48_kib_asks_nothing(fake) -> None:
    call_program(staged(), _Vector(12288))  # exactly 48 KiB
    assert _names(fake) == ["cuLaunchKernel"]


def test_beyond_the_devices_limit_names_it_and_launches_nothing(fake) -> None:
    with pytest.raises(LaunchError, match=r"staged: stage asks for 320000 bytes of dynamic "
                                          r"shared memory \(this device allows at most 232448 "
                                          r"bytes per block.*CUDA_ERROR_INVALID_VALUE"):
        call_program(staged(), _Vector(80000))
    assert "cuLaunchKernel" not in _names(fake) and "refused launch" not in _names(fake)


def test_through_a_loaded_pack(fake, tmp_path) -> None:
    kp.save([staged()], tmp_path / "s.kpack")
    prog = kp.load(tmp_path / "s.kpack")["staged"]
    for n in (16384, 16384, 30000):
        assert prog(_Vector(n)) is None
    assert "refused launch" not in _names(fake)
    assert _names(fake).count("cuLaunchKernel") == 3


def test_torch_fast_path_leaves_such_launches_to_the_general_path(fake, monkeypatch) -> None:
    """The fast paths launch without asking for the limit: an entry needing more than 48 KiB
    is not made, so every such call goes where the limit is raised (per device)."""
    from test_review10_mixed_arrays import TorchTensor, _torch_module

    from kernelpack.runtime import launcher

    torch = install_framework(monkeypatch, "torch", _torch_module(0))
    prog = staged()
    for n in (16384, 16384, 1024, 16384, 1024):
        call_program(prog, TorchTensor([0.0] * n, torch.float32))
    bp = launcher.bind(prog)
    assert bp.call != bp.__call__  # a fast path was built (it serves the 1024s)
    assert "refused launch" not in _names(fake)
    assert _names(fake).count("cuLaunchKernel") == 5
    assert bp._states[0].smem == {(0, 0): 65536}
