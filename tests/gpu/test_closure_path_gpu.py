"""The torch fast path written in Python (the closure of runtime/fast_torch.py: Python 3.10,
no C extension, or ``KERNELPACK_NATIVE_LAUNCH=0``) on a real GPU, in a child process with the
C launcher switched off: correct results once warm, and a sparse input tensor
met on the warm path is the general path's LaunchError naming the parameter, as on the C path
(tests/gpu/test_review28_runtime_gpu.py), not torch's bare RuntimeError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kernelpack as kp
from .torch_checks import NO_GPU, on_gpu, targets

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys, warnings
import torch
import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime.launcher import bind

warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
pack = kp.load(sys.argv[1])
axpy = pack["axpy"]
x = torch.arange(6, dtype=torch.float32, device="cuda")
y = torch.ones(6, device="cuda")
for _ in range(3):  # the general path, then the warm one
    axpy(x, y, 2.0)
torch.cuda.synchronize()
report = {"fast": type(bind(axpy).call).__name__, "y": y.tolist()}
for name, args, kw in (("x", (x.to_sparse(), y, 1.0), {}), ("y", (x, y.to_sparse(), 1.0), {})):
    try:
        axpy(*args, **kw)
        report["sparse " + name] = "accepted"
    except LaunchError as exc:
        report["sparse " + name] = ("LaunchError" if repr(name) in str(exc)
                                    else f"LaunchError: {exc}")
    except Exception as exc:
        report["sparse " + name] = f"{type(exc).__name__}: {exc}"
torch.cuda.synchronize()
report["y_after"] = y.tolist()  # nothing launched by the refused calls
print(json.dumps(report))
'''


@on_gpu
def test_the_python_closure_hands_sparse_tensors_to_the_general_path(tmp_path) -> None:
    made = kp.external("axpy", "axpy", [kp.Tensor("x", kp.f32, ("n",)),
                                        kp.Tensor("y", kp.f32, ("n",), role="inout"),
                                        kp.Scalar("a", kp.f32)],
                       grid=kp.cdiv("n", 256), block=256, targets=targets(NO_GPU),
                       ptx=(ROOT / "examples" / "axpy.ptx").read_text(),
                       args=["x", "y", "a", (kp.sym("n"), kp.u32)])
    art = tmp_path / "axpy.kpack"
    kp.save([made], art)
    env = dict(os.environ, KERNELPACK_NATIVE_LAUNCH="0")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(art)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fast"] == "function", report  # the closure, not _launch.FastCall
    expected = [1.0 + 2 * 3 * i for i in range(6)]  # y = 2x + y, three times
    assert report["y"] == expected, report
    assert report["sparse x"] == report["sparse y"] == "LaunchError", report
    assert report["y_after"] == expected, report
