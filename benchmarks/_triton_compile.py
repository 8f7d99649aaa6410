"""Triton's compile time for the gelu of ``benchmarks/compile.py``, measured two ways.

Issue 3's target compares kernelpack's compile of a pointwise fusion with "Triton's first compile
of the same kernel". A first compile in a fresh process also pays Triton's own process set-up
(its backend modules, the launcher it builds with the C compiler for a new signature), which
kernelpack's table rows do not pay (compile.py reports kernelpack's set-up on a line of its
own). So both are measured, each in fresh processes with an empty ``TRITON_CACHE_DIR``:

- ``first``: the first kernel a process compiles (what the issue names; one per process, so
  the median of several processes);
- ``later``: further kernels of the same math in the same process, each under a name of its own
  (Triton's cache key hashes the source, so each is a real compile with a cold cache entry),
  after the first: the like-for-like figure beside kernelpack's rows.

Every kernel's output is checked against torch's tanh-form gelu before its time counts.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TritonCompileTimes", "measure"]

_KERNEL = '''
@triton.jit
def gelu_{i}(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(out_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)
'''

_CHILD = '''
import json, os, sys, tempfile, time
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kp-triton-cache-")  # cold
import torch
if not torch.cuda.is_available():
    print(json.dumps({"why": "Triton needs a GPU to compile for"})); sys.exit()
sys.path.insert(0, sys.argv[1])
import kp_triton_gelus as kernels
count = int(sys.argv[2])
x = torch.randn(4096, device="cuda")
want = torch.nn.functional.gelu(x.double(), approximate="tanh")
out = torch.empty_like(x)
torch.cuda.synchronize()
times = []
for i in range(count):
    kernel = getattr(kernels, f"gelu_{i}")
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    kernel[(4,)](x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    err = ((out.double() - want).norm() / want.norm()).item()
    if not err <= 1e-5:
        print(json.dumps({"why": f"gelu_{i} is wrong (relative error {err})"})); sys.exit()
print(json.dumps({"times": times}))
'''


@dataclass(frozen=True)
class TritonCompileTimes:
    """Seconds: ``first`` per fresh process, ``later`` every further kernel of those processes;
    ``why`` says why nothing was measured (then both are empty)."""

    first: tuple[float, ...] = ()
    later: tuple[float, ...] = ()
    why: str = ""

    def first_median(self) -> float:
        return statistics.median(self.first)

    def later_median(self) -> float:
        return statistics.median(self.later)


def measure(processes: int = 3, later: int = 5) -> TritonCompileTimes:
    """Triton's gelu compiles in ``processes`` fresh processes, each compiling ``1 + later``
    distinct kernels; an empty result with ``why`` where Triton or a GPU is missing."""
    try:
        import torch  # noqa: F401  (only asked whether it is there)
        import triton  # noqa: F401
    except ImportError as exc:
        return TritonCompileTimes(why=f"{exc.name} is not importable here")
    count = 1 + later
    with tempfile.TemporaryDirectory(prefix="kp-triton-kernels-") as work:
        source = "import triton\nimport triton.language as tl\n" + "".join(
            textwrap.dedent(_KERNEL).format(i=i) for i in range(count))
        Path(work, "kp_triton_gelus.py").write_text(source)
        firsts: list[float] = []
        laters: list[float] = []
        for _ in range(processes):
            proc = subprocess.run([sys.executable, "-c", _CHILD, work, str(count)],
                                  capture_output=True, text=True, timeout=600,
                                  env=dict(os.environ))
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                return TritonCompileTimes(why=f"the Triton child failed: {tail}")
            result = json.loads(lines[-1])
            if "why" in result:
                return TritonCompileTimes(why=result["why"])
            firsts.append(result["times"][0])
            laters.extend(result["times"][1:])
    return TritonCompileTimes(tuple(firsts), tuple(laters))
