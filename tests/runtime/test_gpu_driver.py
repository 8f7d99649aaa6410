"""The doors to the driver on a real GPU: kernelpack's own (runtime/libcuda.py, the default on
Linux: called from C through the extension's driver_call, or through ctypes without it) and
cuda.bindings (``KERNELPACK_DRIVER=cuda-bindings``), each in a fresh
process, with and without the C launch extension and with the per-thread default stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = pytest.mark.gpu

_COUNT = kernels.gpu_count_or_skip()

# A fresh process: torch tensors in, one program of two launches and one of one, results and
# what the process imported, which driver object and launcher it used.
CHILD = """
import json, os, sys
import torch
if os.environ.get("KP_TEST_DOOR") == "ctypes":  # this test's own switch: libcuda without C
    from kernelpack.runtime import libcuda
    libcuda._native_caller = lambda: None
torch.cuda.init()
x = torch.arange(4097, dtype=torch.float32, device="cuda")
y = torch.ones(4097, dtype=torch.float32, device="cuda")
import kernelpack as kp
pack = kp.load(sys.argv[1])
before = sorted(m for m in sys.modules if m.startswith("cuda.bindings.driver"))
z = pack["axpby"](x, y, 2.0)
w = pack["twostep"](x)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    v = pack["axpby"](x, y, 0.5)
stream.synchronize()
torch.cuda.synchronize()
from kernelpack.runtime import driver, native
print(json.dumps({
    "ok": [bool(torch.equal(z, 2 * x + y)), bool(torch.equal(w, x)),
           bool(torch.equal(v, 0.5 * x + y))],
    "driver": type(driver.bindings()).__name__, "native": native.launcher().native,
    "door": getattr(driver.bindings(), "door", None),
    "bindings_before": before,
    "bindings_after": "cuda.bindings.driver" in sys.modules}))
"""

_KNOBS = ("KERNELPACK_DRIVER", "KERNELPACK_NATIVE_LAUNCH",
          "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> str:
    import kernelpack as kp

    path = tmp_path_factory.mktemp("driver") / "doors.kpack"
    kp.save([kernels.axpby(), kernels.twostep()], path)
    return str(path)


def _child(artifact: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD, artifact], capture_output=True,
                         text=True, timeout=300, env=full)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _built() -> bool:
    try:
        from kernelpack.runtime import _launch  # noqa: F401
    except ImportError:
        return False
    return True


def test_ctypes_door_launches_without_importing_cuda_bindings(artifact: str) -> None:
    got = _child(artifact)
    assert got["ok"] == [True, True, True]
    assert got["driver"] == "LibCuda"
    if _built():  # launches through the C extension: cuda.bindings is never needed
        assert got["native"] and got["bindings_after"] is False
        # and the driver is called from C (_drvcall.c) where it is built for the machine
        assert got["door"] == ("C" if sys.platform.startswith("linux") and os.uname().machine
                               in ("x86_64", "aarch64") else "ctypes")


@pytest.mark.parametrize("env", [
    {"KERNELPACK_DRIVER": "cuda-bindings"},
    {"KERNELPACK_NATIVE_LAUNCH": "0"},
    {"KERNELPACK_DRIVER": "cuda-bindings", "KERNELPACK_NATIVE_LAUNCH": "0"},
    {"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"},
    {"KP_TEST_DOOR": "ctypes"},
], ids=["bindings", "ctypes-no-extension", "bindings-no-extension", "per-thread-stream",
        "libcuda-through-ctypes"])
def test_every_door_gives_the_same_results(artifact: str, env: dict) -> None:
    got = _child(artifact, **env)
    assert got["ok"] == [True, True, True]
    assert got["driver"] == ("module" if env.get("KERNELPACK_DRIVER") else "LibCuda")
    if env.get("KERNELPACK_NATIVE_LAUNCH") == "0":
        assert not got["native"] and got["bindings_after"]  # cuda.bindings' cuLaunchKernel
    if env.get("KP_TEST_DOOR"):
        assert got["door"] == "ctypes"


def test_real_driver_error_names() -> None:
    from kernelpack.errors import CompatibilityError
    from kernelpack.runtime import driver

    driver.init()
    exc = driver.error_for(200, "loading x")
    assert isinstance(exc, CompatibilityError)
    assert "CUDA_ERROR_INVALID_IMAGE" in str(exc) and str(exc).startswith("loading x failed: ")
    assert exc.__cause__.code == 200 and "no description" not in str(exc)


def test_a_bad_image_through_the_ctypes_door_is_a_compatibility_error() -> None:
    from kernelpack.errors import CompatibilityError
    from kernelpack.runtime import driver
    from kernelpack.runtime.library import _load_library

    driver.init()
    # with lazy loading the driver may take the bytes and refuse them at the first kernel
    with pytest.raises(CompatibilityError, match="(cuLibraryLoadData of|cuLibraryGetKernel\\("
                                                 "'k'\\) in) junk failed: "
                                                 "CUDA_ERROR_INVALID_(IMAGE|PTX)"):
        _load_library(b"\x7fELF this is not a cubin" + bytes(64), ("k",), "junk")
