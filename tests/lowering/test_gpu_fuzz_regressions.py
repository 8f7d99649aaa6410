"""Numerics the GPU fuzz (tools/gpu_fuzz.py, notes/gpu-fuzz.md) found off on the device.

- Seed 3446: float ``//`` and ``%`` took their remainder from LLVM's ``frem``, which the NVPTX
  backend expands to ``x - trunc(x / y) * y``: with the quotient rounded, ``10.0 // 0.2`` was
  50 on the GPU (NumPy and Python: 49). The remainder is now libdevice's exact ``fmod``. The
  host emulator's ``frem`` is exact, so the IR is checked here and the values on a GPU in
  tests/gpu/test_float_divmod.py.
- Seed 3349: the general schedule sums a long axis on one thread, in order; 1e5 float64 terms
  drifted past 1e-12 of NumPy's pairwise sum. That loop now carries Neumaier's compensation.
"""

from __future__ import annotations

import math

import numpy as np

import kernelpack as kp
from kernelpack.lowering import pipeline

from .simt import Kernels, assert_close

T = kp.Tensor


def test_float_floor_division_takes_an_exact_remainder():
    @kp.fusion
    def fd(x: T[kp.f64, "n"], y: T[kp.f32, "n"]):
        return x // 0.2, x % 0.2, y // y

    ir_text = pipeline.run(pipeline.new_build(fd, ["sm_80"], None, {}), stop="llvm_ir").ir
    assert " frem " not in ir_text
    assert '@"__nv_fmod"(' in ir_text and '@"__nv_fmodf"(' in ir_text
    x = np.array([10.0, 1.0, -7.5, 0.0, -0.0, 3.0])
    a, b, c = Kernels(fd)(x, x.astype(np.float32) + np.float32(1))
    assert_close(a, x // 0.2, 0, "x // 0.2")
    assert_close(b, x % 0.2, 0, "x % 0.2")


def test_a_long_sum_on_the_general_schedule_is_compensated():
    """Axes (0, 2) are neither a row nor a column block (lowering/columns.py): the general
    schedule's one thread per output sums each whole column in order."""
    @kp.fusion
    def cs(x: T[kp.f64, "a", 2, 1]):
        return x.sum(axis=(0, 2)), x.mean(axis=(0, 2))

    rng = np.random.default_rng(7)
    x = rng.standard_normal((20001, 2, 1)) * 1e3 + 1e6
    x[:3000, 0, 0] = np.tile([1e16, 1.0, -1e16], 1000)  # an in-order sum loses every 1.0
    x[5, 1, 0] = np.inf  # an infinite term: the compensation becomes NaN, the sum stays inf
    k = Kernels(cs)
    assert [l.kernel for l in k.summary.variants[0].launches] == ["cs_0_pointwise"]
    s, m = k(x)
    exact = math.fsum(x[:, 0, 0])
    assert abs(s[0] - exact) <= 1e-15 * abs(exact)
    assert abs(m[0] - exact / 20001) <= 1e-15 * abs(exact / 20001)
    assert s[1] == np.inf and m[1] == np.inf


def test_a_long_column_sum_split_across_threads_stays_accurate():
    """The split schedule (20001 rows, 2 columns: 1251 threads per column, 16 terms each,
    then a block combining the partials) sums plainly: within an ulp or two on ordinary data;
    on the cancelling 1e16s no worse than NumPy's own pairwise float64 sum (59.3 against
    959.5 here), though not the exact sum of the compensated one-thread loop above."""
    @kp.fusion
    def cs(x: T[kp.f64, "a", 2]):
        return x.sum(axis=0), x.mean(axis=0)

    rng = np.random.default_rng(7)
    x = rng.standard_normal((20001, 2)) * 1e3 + 1e6
    k = Kernels(cs)
    s, m = k(x)
    for col in range(2):
        exact = math.fsum(x[:, col])
        assert abs(s[col] - exact) <= 4e-16 * abs(exact)
        assert abs(m[col] - exact / 20001) <= 4e-16 * abs(exact / 20001)
    x[:3000, 0] = np.tile([1e16, 1.0, -1e16], 1000)
    x[5, 1] = np.inf
    s, m = k(x)
    exact = math.fsum(x[:, 0])
    assert abs(s[0] - exact) <= abs(x[:, 0].sum() - exact)
    assert s[1] == np.inf and m[1] == np.inf
