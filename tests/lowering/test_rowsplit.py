"""Few, long rows split across blocks (:mod:`kernelpack.lowering.rowsplit`).

The split alternative comes first in a row stage, under ``length >= SPLIT_MIN_LENGTH and rows
<= SPLIT_MAX_ROWS``. The constants are patched small here (rows of >= 200 elements, at most 3
rows, chunks of 128 elements for blocks of 32 threads) so that the SIMT emulator runs the
split kernels at emulator-sized shapes; numerics are compared with NumPy in float64 at the
tolerances of the other row and full-reduction tests, and the plans show which kernels ran.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.lowering import pipeline, schedule, tuning

from .split_consts import kernel_names, use_small_split
from .simt import Kernels, assert_close

T = kp.Tensor


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    use_small_split(monkeypatch)


_names = kernel_names


@kp.fusion
def softmax(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kp.fusion
def softmax3(x: T[kp.f64, "a", "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kp.fusion
def layernorm(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], bias: T[kp.f32, "n"]):
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * kp.rsqrt(var + 1e-5) * w + bias


@kp.fusion
def logsumexp(x: T[kp.f32, "b", "n"]):
    m = x.max(axis=-1)
    return kp.log(kp.exp(x - m[:, None]).sum(axis=-1)) + m


@kp.fusion
def rowstats(x: T[kp.f32, "b", "n"]):
    return x.sum(-1), x.max(-1), x.min(-1), x.prod(-1)


@kp.fusion
def rowmean(x: T[kp.f32, "b", "n"]):
    return x.mean(-1, keepdims=True), x - x.mean(-1, keepdims=True)


@kp.fusion
def masked_mean(x: T[kp.f32, "b", "n"], m: T[kp.bool_, "b", "n"]):
    return (x * m).sum(-1) / m.sum(-1)


@kp.fusion
def introws(i: T[kp.i32, "a", "b", "n"], z: T[kp.c64, "a", "b", "n"]):
    return i.sum(-1), i.max(-1), z.sum(-1)


@kp.fusion
def rowvar(x: T[kp.f32, "b", "n", "m"]):
    mean = x.mean(axis=(1, 2))
    d = x - mean[:, None, None]
    var = (d * d).mean(axis=(1, 2))
    return mean, var, kp.sqrt(var)


def _ref_softmax(x: np.ndarray) -> np.ndarray:
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1000), (3, 517), (2, 200), (3, 256)])
def test_softmax(shape):
    k = Kernels(softmax)
    assert _names(k, shape) == ["softmax_0_split_partial0", "softmax_0_split_combine0",
                                "softmax_0_split_partial1", "softmax_0_split_combine1",
                                "softmax_0_split_pointwise"]
    x = (np.random.default_rng(shape[1]).standard_normal(shape) * 4).astype(np.float32)
    (got,) = k(x)
    assert_close(got, _ref_softmax(x), 1e-6, f"softmax {shape}")


def test_softmax_three_dims_float64():
    k = Kernels(softmax3)
    x = np.random.default_rng(1).standard_normal((1, 3, 333)) * 3
    assert _names(k, x.shape)[0] == "softmax3_0_split_partial0"
    (got,) = k(x)
    assert_close(got, _ref_softmax(x), 1e-12, "softmax (1, 3, 333) float64")


@pytest.mark.parametrize("shape", [(2, 700), (3, 203)])
def test_layernorm_broadcasts_weight_and_bias(shape):
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 2 + 50).astype(np.float32)
    w, bias = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    k = Kernels(layernorm)
    assert _names(k, shape, (shape[1],), (shape[1],))[-1] == "layernorm_0_split_pointwise"
    (got,) = k(x, w, bias)
    xd = x.astype(np.float64)
    d = xd - xd.mean(-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + bias
    assert_close(got, ref, 1e-5, f"layernorm {shape}")


def test_logsumexp_reduce_only():
    k = Kernels(logsumexp)
    assert _names(k, (3, 600)) == ["logsumexp_0_split_partial0", "logsumexp_0_split_combine0",
                                   "logsumexp_0_split_partial1", "logsumexp_0_split_rowblock"]
    x = (np.random.default_rng(2).standard_normal((3, 600)) * 5).astype(np.float32)
    (got,) = k(x)
    xd = x.astype(np.float64)
    m = xd.max(-1)
    assert_close(got, np.log(np.exp(xd - m[:, None]).sum(-1)) + m, 1e-6, "logsumexp")


@pytest.mark.parametrize("shape", [(3, 1000), (1, 257)])
def test_row_statistics(shape):
    rng = np.random.default_rng(shape[1])
    x = rng.uniform(0.999, 1.001, shape).astype(np.float32)
    x[0, 5] = np.nan  # max/min propagate NaN, as the row kernels do
    k = Kernels(rowstats)
    assert _names(k, shape) == ["rowstats_0_split_partial0", "rowstats_0_split_partial1",
                                "rowstats_0_split_partial2", "rowstats_0_split_partial3",
                                "rowstats_0_split_rowblock"]
    s, mx, mn, p = k(x)
    xd = x.astype(np.float64)
    assert_close(s, xd.sum(-1), 1e-6, "sum")
    assert_close(mx, xd.max(-1), 0, "max")
    assert_close(mn, xd.min(-1), 0, "min")
    assert_close(p, xd.prod(-1), 1e-6, "prod")
    assert np.isnan(mx[0]) and np.isnan(mn[0])


def test_mean_kept_and_rows_written_back_in_two_stages():
    k = Kernels(rowmean)
    assert _names(k, (2, 300)) == ["rowmean_0_split_partial0", "rowmean_0_split_rowblock",
                                   "rowmean_1_split_partial0", "rowmean_1_split_combine0",
                                   "rowmean_1_split_pointwise"]
    x = (np.random.default_rng(3).standard_normal((2, 301)) + 7).astype(np.float32)
    mean, centred = k(x)
    xd = x.astype(np.float64)
    assert_close(mean, xd.mean(-1, keepdims=True), 1e-6, "mean")
    assert_close(centred, xd - xd.mean(-1, keepdims=True), 1e-6, "centred")


def test_masked_mean():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 450)).astype(np.float32)
    m = rng.random((3, 450)) < 0.3
    k = Kernels(masked_mean)
    assert _names(k, x.shape, m.shape)[-1] == "masked_mean_0_split_rowblock"
    (got,) = k(x, m)
    assert_close(got, (x.astype(np.float64) * m).sum(-1) / m.sum(-1), 1e-6, "masked mean")


def test_integers_and_complex_with_two_outer_dims():
    rng = np.random.default_rng(5)
    i = rng.integers(-1000, 1000, (1, 3, 390), dtype=np.int32)
    z = (rng.standard_normal((1, 3, 390)) + 1j * rng.standard_normal((1, 3, 390))
         ).astype(np.complex64)
    k = Kernels(introws)
    assert _names(k, i.shape, z.shape)[0] == "introws_0_split_partial0"
    s, mx, zs = k(i, z)
    assert np.array_equal(s, i.sum(-1)) and s.dtype == np.int64  # NumPy promotes int32 sums
    assert np.array_equal(mx, i.max(-1))
    assert_close(zs, z.astype(np.complex128).sum(-1), 1e-5, "complex64 sum")


def test_variance_over_two_trailing_axes_reads_the_stored_mean():
    k = Kernels(rowvar)
    # the mean is read by the variance's partials and by the outputs: stored by combine0 and
    # loaded by the last kernel, which combines the variance's partials itself
    assert _names(k, (2, 15, 20)) == ["rowvar_0_split_partial0", "rowvar_0_split_combine0",
                                      "rowvar_0_split_partial1", "rowvar_0_split_rowblock"]
    x = (np.random.default_rng(8).standard_normal((2, 15, 20)) * 2 + 100).astype(np.float32)
    mean, var, std = k(x)
    xd = x.astype(np.float64)
    ref = ((xd - xd.mean((1, 2), keepdims=True)) ** 2).mean((1, 2))
    assert_close(mean, xd.mean((1, 2)), 1e-6, "mean")
    assert_close(var, ref, 1e-5, "var")
    assert_close(std, np.sqrt(ref), 1e-5, "std")


@pytest.mark.parametrize("offset", [0, 1])
def test_misaligned_input_takes_the_scalar_output_loop(offset):
    """An input 4 bytes past a 16-byte boundary: the pointwise kernel's 16-byte groups are
    checked at run time and the scalar loop writes every element instead."""
    x = (np.random.default_rng(9).standard_normal(2 * 1024 + 4) * 3).astype(np.float32)
    base = (-x.ctypes.data // 4) % 4  # first 16-byte aligned element
    view = x[base + offset:base + offset + 2 * 1024].reshape(2, 1024)
    assert (view.ctypes.data % 16 == 0) == (offset == 0)
    (got,) = Kernels(softmax)(view)
    assert_close(got, _ref_softmax(view), 1e-6, f"softmax, offset {offset}")


def test_predicate_boundaries_on_both_sides():
    k = Kernels(softmax)
    assert _names(k, (3, 200))[0] == "softmax_0_split_partial0"
    assert _names(k, (4, 200)) == ["softmax_0_rowwarp8"]  # 4 rows: too many to split
    assert _names(k, (3, 199)) == ["softmax_0_rowwarp8"]  # too short
    r = Kernels(rowstats)
    assert _names(r, (4, 5000)) == ["rowstats_0_rowblock256t16"]
    x = (np.random.default_rng(6).standard_normal((4, 200))).astype(np.float32)
    (got,) = k(x)
    assert_close(got, _ref_softmax(x), 1e-6, "softmax (4, 200), unsplit")


def test_empty_rows_and_no_rows():
    k = Kernels(softmax)
    # n = 0 is too short to split; no rows split (every grid empty)
    assert _names(k, (0, 300))[0] == "softmax_0_split_partial0"
    assert all(launch.grid[0] == 0 for launch in k.planner.plan((0, 300)).launches)
    (got,) = k(np.zeros((0, 300), np.float32))
    assert got.shape == (0, 300)
    (got,) = k(np.zeros((3, 0), np.float32))
    assert got.shape == (3, 0)


def test_disabled_split_gives_the_previous_schedules(monkeypatch):
    monkeypatch.setattr(tuning, "ROW_SPLIT", False)
    k = Kernels(softmax)
    assert _names(k, (1, 10 ** 6)) == ["softmax_0_rowblock"]
    assert len(k.summary.variants) == 8


def test_static_dims_inside_the_predicate_leave_one_alternative():
    k = Kernels(softmax, static={"b": 2, "n": 500})
    assert len(k.summary.variants) == 1
    assert k.summary.variants[0].predicate is None
    x = np.random.default_rng(7).standard_normal((2, 500)).astype(np.float32)
    (got,) = k(x)
    assert_close(got, _ref_softmax(x), 1e-6, "static softmax")


def test_workspaces_are_expressions_over_the_dims():
    plan = Kernels(softmax).planner.plan((3, 1000))
    grids = {launch.kernel: launch.grid[0] for launch in plan.launches}
    assert grids["softmax_0_split_partial0"] == 3 * 8  # cdiv(1000, 128) chunks per row
    assert grids["softmax_0_split_combine0"] == 3
    assert plan.allocations["softmax_0_split_ws0"].nbytes == 3 * 8 * 4  # float32 maxima
    assert plan.allocations["softmax_0_split_ws1"].nbytes == 3 * 8 * 8  # float64 partial sums
    assert plan.allocations["softmax_0_split_val0"].nbytes == 3 * 4  # the row's float32 max


def test_deterministic_bytes():
    a, b = (kp.save([kp.compile(softmax, targets=["sm_90"])]) for _ in range(2))
    assert a == b


def test_chunk_that_is_not_a_whole_number_of_strides_is_refused(monkeypatch):
    monkeypatch.setattr(tuning, "SPLIT_CHUNK", 100)
    with pytest.raises(CompileError, match="SPLIT_CHUNK must be a positive multiple"):
        pipeline.run(pipeline.new_build(softmax, ["sm_90"], None, {}), stop="schedule")


@kp.fusion
def two_softmaxes(x: T[kp.f32, "a", "n"], y: T[kp.f32, "b", "m"]):
    ex, ey = kp.exp(x - x.max(axis=1, keepdims=True)), kp.exp(y - y.max(axis=1, keepdims=True))
    return ex / ex.sum(axis=1, keepdims=True), ey / ey.sum(axis=1, keepdims=True)


def test_variant_limit_drops_the_splits_before_other_schedules(monkeypatch):
    """8 x 8 row schedules fill MAX_VARIANTS (64); with a split each (9 x 9) the splits go,
    not the 8192-wide register kernels: every other shape keeps its schedule."""
    def kernels() -> list[list[str]]:
        build = pipeline.run(pipeline.new_build(two_softmaxes, ["sm_90"], None, {}),
                             stop="schedule")
        return [[k.name for alt in chosen for k in alt.kernels]
                for _, chosen in schedule.variants(list(build.stages))]

    with_split = kernels()
    monkeypatch.setattr(tuning, "ROW_SPLIT", False)
    assert with_split == kernels() and len(with_split) == 64
    assert any("rowblock256x32" in " ".join(v) for v in with_split)
