"""Regression (review 9): row kernels whose written rows are much longer than the reduced ones.

``amplitude`` reduces rows of ``l`` elements and writes rows of ``2^n`` (``kp.pad``). The
schedule picked its group by ``l`` alone: ``(b, l, n) = (1, 1000, 20)`` ran one warp writing
2^20 complex amplitudes, ``(128, 1000, 20)`` 4096 threads writing 134 M, ``(1, 2^20, 20)`` one
block of 512 threads reading and writing 2^20. Now a fused row kernel is kept only while its
group writes at most ``longrows.OUT_PER_THREAD`` elements per thread; longer rows reduce into a
per-row workspace and a pointwise kernel writes the output on a full grid, and a single row
takes the full-reduction kernels (partials over a grid, a grid of blocks writing)
(:mod:`kernelpack.lowering.longrows`).
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline
from kernelpack.lowering.tuning import CHUNK
from kernelpack.lowering.workloads import REFERENCES, make
from kernelpack.planner import Planner

from .simt import Kernels, assert_close

T = kp.Tensor
TOL = {kp.float32: 2e-6, kp.float64: 1e-13}
F32, F64 = make(kp.float32), make(kp.float64)


def _planner(f: kp.fusion) -> Planner:
    build = pipeline.run(pipeline.new_build(f, ["sm_80"], None, {}), stop="schedule")
    return Planner(pipeline.summarize(build).summary)


def _writer(plan) -> tuple[str, int]:
    """(kernel, threads launched) of the last launch: the one writing the output."""
    last = plan.launches[-1]
    return last.kernel, last.grid[0] * last.block[0]


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("b,l,n", [(1, 1000, 20), (128, 1000, 20), (1, 1 << 20, 20),
                                   (4, 3000, 18)])
def test_long_outputs_get_a_full_grid(dt, b, l, n):
    """Every output of >= 2^17 elements written by >= 2^17 threads (an H200 holds ~270 k
    resident threads); before: 32 (one warp), 4096 and 512."""
    plan = _planner((F32 if dt == kp.float32 else F64)["amplitude"]).plan((b, l), n)
    kernel, threads = _writer(plan)
    assert threads >= min(b << n, 1 << 17), (kernel, threads)
    if b == 1:  # one row: its reduction spread over a grid as well
        first = plan.launches[0]
        assert "partial" in first.kernel and first.grid[0] == -(-l // CHUNK), first.kernel


@pytest.mark.parametrize("b,l,n,kernel", [(128, 1024, 10, "rowwarp"), (4096, 256, 8, "rowwarp"),
                                          (2, 1 << 14, 14, "rowblock"), (64, 5000, 13, "rowblock"),
                                          (1, 1, 1, "rowwarp")])
def test_benchmark_shapes_keep_the_fused_kernel(b, l, n, kernel):
    """n = ceil(log2 l) (output shorter than twice the input) up to l = 16384: one launch of
    the fused row kernel, as before."""
    plan = _planner(F32["amplitude"]).plan((b, l), n)
    assert [la.kernel for la in plan.launches] == [f"amplitude_float32_0_{kernel}"]


def _reference(v: np.ndarray, n: int) -> np.ndarray:
    with np.errstate(all="ignore"):  # l = 0: 0/0 in the (empty) normalized part
        return REFERENCES["amplitude"](v.astype(np.float64), n)


# (b, l, n, kernels run) with OUT_PER_THREAD = 1: a warp writes <= 32, a block <= 512
SMALL = [(3, 5, 3, ("rowwarp",)), (2, 20, 8, ("rowblock",)),
         (3, 5, 10, ("s_rowthread", "pointwise")), (2, 40, 10, ("s_rowwarpt", "pointwise")),
         (2, 2100, 12, ("s_rowblock256t", "pointwise")), (3, 8, 3, ("rowwarp",)),
         (1, 7, 10, ("one_partial0", "one_combine0", "one_pointwise")),
         (1, 20000, 15, ("one_partial0", "one_combine0", "one_pointwise")),  # 3 partials
         (3, 0, 10, ("s_rowthread", "pointwise")),
         (1, 0, 10, ("one_partial0", "one_combine0", "one_pointwise")),
         (2, 0, 4, ("rowwarp",)), (0, 5, 10, ("s_rowthread", "pointwise"))]


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=["f32", "f64"])
def test_amplitude_numerics_on_every_path(dt, monkeypatch):
    """Each alternative (fused warp/block, workspace + pointwise after a thread/warp/block
    reduction, one row over a grid) against NumPy; 2^n == l, 2^n >> l, l = 0 and b = 0."""
    from kernelpack.lowering import longrows

    monkeypatch.setattr(longrows, "OUT_PER_THREAD", 1)
    k = Kernels((F32 if dt == kp.float32 else F64)["amplitude"])
    for b, l, n, kernels in SMALL:
        v = np.random.default_rng(b * 1000 + l).standard_normal((b, l)).astype(dt.name)
        ran = [la.kernel.split("_0_", 1)[1] for la in k.planner.plan((b, l), n).launches]
        assert len(ran) == len(kernels) and all(r.startswith(e) for r, e in zip(ran, kernels)), \
            (b, l, n, ran)
        assert_close(k(v, n)[0], _reference(v, n), TOL[dt], f"{dt.name} {(b, l, n)}")


@kp.fusion
def scaled(x: T[kp.f32, "b", "l"], y: T[kp.f32, "b", "m"]):
    """Outputs of another row length than the reduced one, without a pad (16-byte groups in
    the pointwise kernel) and reductions read with and without keepdims."""
    return (x * x).sum(-1, keepdims=True) * y + x.max(-1)[:, None]


def test_unpadded_long_rows(monkeypatch):
    from kernelpack.lowering import longrows

    monkeypatch.setattr(longrows, "OUT_PER_THREAD", 1)
    k = Kernels(scaled)
    rng = np.random.default_rng(5)
    for b, l, m in ((3, 7, 5), (2, 9, 100), (3, 40, 1000), (1, 3, 600)):
        x = rng.standard_normal((b, l)).astype(np.float32)
        y = rng.standard_normal((b, m)).astype(np.float32)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        ref = (x64 * x64).sum(-1, keepdims=True) * y64 + x64.max(-1)[:, None]
        assert_close(k(x, y)[0], ref, 2e-6, f"scaled {(b, l, m)}")
