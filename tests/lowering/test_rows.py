"""Row kernels (:mod:`kernelpack.lowering.rows`): which rows a launch's groups own.

The schedule sizes a row kernel's grid with its own block (``KernelSpec.block``: one row per
thread or per warp of it), so the kernel must count rows per block the same way. A register
row table (``tuning.REG_GROUPS*``) may give a warp group another block than the default 256
threads, as ``benchmarks/row_configs.py`` configurations do; the kernel once counted 8 rows per
block whatever its size, so a warp group in blocks of 128 threads left half the rows unwritten.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import tuning
from kernelpack.lowering.workloads import REFERENCES, make

from .simt import Kernels, assert_close

F32 = make(kp.float32)


@pytest.mark.parametrize("threads", [64, 128, 512])
def test_a_warp_group_in_blocks_of_any_size_writes_every_row(monkeypatch, threads):
    monkeypatch.setattr(tuning, "REG_GROUPS_LIGHT",
                        (("warp", 1, threads),) + tuning.REG_GROUPS_LIGHT[1:])
    rows, n = 2 * threads // 32 + 3, 100  # two full blocks and a partial one, one chunk each
    rng = np.random.default_rng(threads)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    kernels = Kernels(F32["layernorm"])
    assert "layernorm_float32_0_rowwarp4" in kernels.functions
    got = kernels(x, w, b, np.float32(1e-5))[0]
    ref = REFERENCES["layernorm"](x.astype(np.float64), w.astype(np.float64),
                                  b.astype(np.float64), 1e-5)
    assert_close(got, ref, 2e-6, f"layernorm ({rows}, {n}), warp rows in blocks of {threads}")
