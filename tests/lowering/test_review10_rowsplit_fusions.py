"""Fusions the review of the row-split schedule (lowering/rowsplit.py) and of grouped pointwise
kernels tried on the SIMT emulator against NumPy float64, with the split constants patched
small as in test_rowsplit.py (rows of >= 200 elements, at most 3 rows, chunks of 128 for
blocks of 32 threads). Each case also checks that the kernels it meant to reach ran: several
outputs of different kinds in one stage, reductions of different sources and lengths,
keepdims mixes, broadcasting row inputs, int/bool/complex/float16 sources, reductions three
levels deep, NaN/inf rows, rows past the combine kernels' grid, the longrows path's split
sub-stage, misaligned float16 views and heavy pointwise kernels on a tiny grid. None of them
found a bug; the regression the review fixed is in test_review10_rowsplit.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import fullred, longrows, tuning

from .split_consts import kernel_names, softmax_ref, use_small_split
from .simt import Kernels, assert_close

T = kp.Tensor
RNG = np.random.default_rng


@pytest.fixture(autouse=True)
def small_split(monkeypatch):
    use_small_split(monkeypatch)


_names = kernel_names


_sm = softmax_ref


def _f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [x.astype(np.float64) if x.dtype.kind == "f" else x for x in xs]


@kp.fusion
def sum_and_softmax(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return x.sum(-1, keepdims=True), p, p + x.sum(-1, keepdims=True)


@kp.fusion
def two_sources(x: T[kp.f32, "b", "n"], y: T[kp.f32, "b", "n"]):
    return x.sum(-1) + y.max(-1), x - x.sum(-1, keepdims=True) * y.max(-1, keepdims=True)


@kp.fusion
def lengths(x: T[kp.f32, "b", "n"], y: T[kp.f32, "b", "m"]):
    return x.sum(-1) + y.max(-1), y.sum(-1), (x - y.mean(-1, keepdims=True)).sum(-1)


@kp.fusion
def bcast(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], s: T[kp.f32, "b", 1]):
    y = x * w + s
    return y - y.mean(-1, keepdims=True)


@kp.fusion
def three_deep(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    c = p - p.mean(-1, keepdims=True)
    return (c * c).mean(-1)


@kp.fusion
def three_deep_rows(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    c = p - p.mean(-1, keepdims=True)
    return c / kp.sqrt((c * c).mean(-1, keepdims=True) + 1e-12)


@kp.fusion
def keep_mix(x: T[kp.f32, "b", "n"], t: kp.f32):
    e = kp.exp((x - x.max(-1, keepdims=True)) / t)
    return (x.max(-1), x.mean(-1)[:, None] - x.max(-1, keepdims=True),
            e / e.sum(-1, keepdims=True) * t)


@kp.fusion
def small_ints(a: T[kp.i8, "b", "n"], u: T[kp.u64, "b", "n"], m: T[kp.bool_, "b", "n"]):
    return (a.sum(-1), a.max(-1), a.min(-1), u.max(-1), u.min(-1), u.sum(-1), m.sum(-1),
            m.max(-1), m.min(-1), a - a.min(-1, keepdims=True))


@kp.fusion
def int_means(i: T[kp.u8, "b", "n"], j: T[kp.i64, "b", "n"]):
    return i - i.mean(-1, keepdims=True), j.mean(-1), (j * j).prod(-1)


@kp.fusion
def complex_rows(z: T[kp.c128, "b", "n"], y: T[kp.c64, "b", "n"]):
    return z - z.mean(-1, keepdims=True), y / y.sum(-1, keepdims=True)


@kp.fusion
def f16_rows(x: T[kp.f16, "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return x.sum(-1), e / e.sum(axis=-1, keepdims=True)


@kp.fusion
def trailing2(x: T[kp.f32, "b", "n", "m"]):
    e = kp.exp(x - x.max(axis=(1, 2), keepdims=True))
    return e / e.sum(axis=(1, 2), keepdims=True)


@kp.fusion
def masked(x: T[kp.f32, "b", "n"], m: T[kp.bool_, "b", "n"]):
    return (x * m).sum(-1) / m.sum(-1)


@kp.fusion
def indices(x: T[kp.f32, "b", "n"]):
    i = kp.iota(x.shape, axis=1, dtype=kp.f32)
    w = kp.where(x == x.max(-1, keepdims=True), i, 1e9)
    return w.min(-1), kp.pad(x, x.shape[1] + 3).sum(-1)


@kp.fusion
def padded_softmax(x: T[kp.f32, "b", "l"], y: T[kp.f32, "b", "m"]):
    p = kp.pad(x, y.shape[1]) + y
    e = kp.exp(p - p.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@kp.fusion
def nested(x: T[kp.f32, "a", "b", "n"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).max(-1).sum(-1), x.sum(-1).max(-1, keepdims=True)


@kp.fusion
def log_softmax(x: T[kp.f64, "b", "n"]):
    m = x.max(-1)
    return x - (kp.log(kp.exp(x - m[:, None]).sum(-1)) + m)[:, None]


def _nested(x):  # type: ignore[no-untyped-def]
    return _sm(x).max(-1).sum(-1), x.sum(-1).max(-1, keepdims=True)


def _centred(x):  # type: ignore[no-untyped-def]
    return _sm(x) - _sm(x).mean(-1, keepdims=True)


def _ints(a, u, m):  # type: ignore[no-untyped-def]
    return (a.sum(-1), a.max(-1), a.min(-1), u.max(-1), u.min(-1), u.sum(-1), m.sum(-1),
            m.max(-1), m.min(-1), a - a.min(-1, keepdims=True))


def _rand(*shape: int, dtype: type = np.float32, seed: int = 0) -> np.ndarray:
    return (RNG(seed + sum(shape)).standard_normal(shape) * 3).astype(dtype)


def _bools(*shape: int) -> np.ndarray:
    m = RNG(sum(shape)).random(shape) < 0.4
    m[1] = False  # an all-false row: a masked mean of nan; any() False, all() False
    m[0, :] = True
    return m


# (fusion, inputs, reference (float64 inputs -> outputs), tolerance, kernels that must run)
CASES: dict[str, tuple] = {
    "sum and softmax, two stages and one": (
        sum_and_softmax, lambda: [_rand(2, 300)],
        lambda x: (x.sum(-1, keepdims=True), _sm(x), _sm(x) + x.sum(-1, keepdims=True)),
        1e-5, ("sum_and_softmax_0_split_rowblock", "sum_and_softmax_1_split_pointwise")),
    "reductions of two sources": (
        two_sources, lambda: [_rand(3, 400), _rand(3, 400, seed=1)],
        lambda x, y: (x.sum(-1) + y.max(-1),
                      x - x.sum(-1, keepdims=True) * y.max(-1, keepdims=True)),
        1e-5, ("two_sources_0_split_rowblock", "two_sources_1_split_pointwise")),
    "reductions of two lengths": (
        lengths, lambda: [_rand(3, 1000), _rand(3, 210) + 3],
        lambda x, y: (x.sum(-1) + y.max(-1), y.sum(-1),
                      (x - y.mean(-1, keepdims=True)).sum(-1)),
        1e-5, ("lengths_0_split_partial0", "lengths_0_split_rowblock")),
    "reductions of two lengths, one short": (
        lengths, lambda: [_rand(3, 1000), _rand(3, 5) + 3],
        lambda x, y: (x.sum(-1) + y.max(-1), y.sum(-1),
                      (x - y.mean(-1, keepdims=True)).sum(-1)),
        1e-5, ("lengths_0_split_rowblock",)),
    "broadcast weight and per-row shift": (
        bcast, lambda: [_rand(3, 333), _rand(333), _rand(3, 1)],
        lambda x, w, s: ((x * w + s) - (x * w + s).mean(-1, keepdims=True),),
        1e-5, ("bcast_0_split_pointwise",)),
    "one broadcast row": (
        bcast, lambda: [_rand(1, 333), _rand(333), _rand(1, 1)],
        lambda x, w, s: ((x * w + s) - (x * w + s).mean(-1, keepdims=True),),
        1e-5, ("bcast_0_split_pointwise",)),
    "variance of a centred softmax": (
        three_deep, lambda: [_rand(2, 500)], lambda x: ((_centred(x) ** 2).mean(-1),), 1e-4,
        ("three_deep_0_split_combine2", "three_deep_0_split_rowblock")),
    "centred softmax normalized": (
        three_deep_rows, lambda: [_rand(2, 500)],
        lambda x: (_centred(x) / np.sqrt((_centred(x) ** 2).mean(-1, keepdims=True) + 1e-12),),
        1e-4, ("three_deep_rows_0_split_combine3", "three_deep_rows_0_split_pointwise")),
    "keepdims mix with a scalar": (
        keep_mix, lambda: [_rand(3, 410), np.float32(0.7)],
        lambda x, t: (x.max(-1), x.mean(-1)[:, None] - x.max(-1, keepdims=True), _sm(x / t) * t),
        1e-5, ("keep_mix_0_split_rowblock", "keep_mix_2_split_pointwise")),
    "int8, uint64 and bool rows": (
        small_ints, lambda: [RNG(5).integers(-128, 128, (3, 333), dtype=np.int8),
                             RNG(6).integers(0, 2**64, (3, 333), dtype=np.uint64),
                             _bools(3, 333)],
        _ints, 0, ("small_ints_0_split_rowblock", "small_ints_1_split_pointwise")),
    "integer means and products": (
        int_means, lambda: [RNG(7).integers(0, 256, (2, 333), dtype=np.uint8),
                            RNG(8).integers(-3, 4, (2, 333), dtype=np.int64)],
        lambda i, j: (i - i.mean(-1, keepdims=True), j.mean(-1), (j * j).prod(-1)),
        1e-12, ("int_means_0_split_pointwise", "int_means_1_split_rowblock")),
    "complex rows, odd lengths": (
        complex_rows, lambda: [_rand(2, 261, dtype=np.complex128) * (1 + 2j),
                               _rand(2, 261, dtype=np.complex64, seed=1) * (1 - 1j) + 1],
        lambda z, y: (z - z.mean(-1, keepdims=True),
                      y.astype(np.complex128) / y.astype(np.complex128).sum(-1, keepdims=True)),
        1e-5, ("complex_rows_0_split_pointwise",)),
    "float16 rows, odd length": (
        f16_rows, lambda: [_rand(3, 203, dtype=np.float16)],
        lambda x: (x.sum(-1), _sm(x)), 3e-3,
        ("f16_rows_0_split_rowblock", "f16_rows_1_split_pointwise")),
    "rows over two trailing axes": (
        trailing2, lambda: [_rand(2, 15, 21)],
        lambda x: (_sm(x.reshape(2, -1)).reshape(2, 15, 21),), 1e-6,
        ("trailing2_0_split_pointwise",)),
    "masked mean with an all-false row": (
        masked, lambda: [_rand(3, 300), _bools(3, 300)],
        lambda x, m: ((x * m).sum(-1) / m.sum(-1),), 1e-5, ("masked_0_split_rowblock",)),
    "iota, where and pad in the sources": (
        indices, lambda: [_rand(2, 700)],
        lambda x: (x.argmax(-1).astype(np.float64), x.sum(-1)), 1e-5,
        ("indices_0_split_rowblock",)),
    "softmax of a padded row": (
        padded_softmax, lambda: [_rand(2, 300), _rand(2, 450)],
        lambda x, y: (_sm(np.pad(x, ((0, 0), (0, 150))) + y),), 1e-6,
        ("padded_softmax_0_split_pointwise",)),
    "reductions of reductions (materialized)": (
        nested, lambda: [_rand(1, 2, 400)], _nested, 1e-5, ("nested_0_split_rowblock",)),
    "log-softmax float64": (
        log_softmax, lambda: [_rand(3, 260, dtype=np.float64)],
        lambda x: (x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
                   - x.max(-1, keepdims=True),), 1e-12, ("log_softmax_0_split_pointwise",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fusions_against_numpy(case: str) -> None:
    fusion, make, reference, tol, kernels = CASES[case]
    inputs = make()
    k = Kernels(fusion)
    ran = _names(k, *(getattr(x, "shape", ()) for x in inputs))
    assert set(kernels) <= set(ran), ran
    with np.errstate(invalid="ignore", divide="ignore"):  # the all-false mask's 0 / 0
        refs = reference(*_f64(*inputs))
    got = k(*inputs)
    assert len(got) == len(refs)
    for i, (g, r) in enumerate(zip(got, refs)):
        r = np.asarray(r)
        if tol == 0:
            assert np.array_equal(g, r) and g.dtype == r.dtype, (i, g, r)
        else:
            assert np.array_equal(np.isnan(g), np.isnan(r)), (i, g, r)
            ok = ~np.isnan(r)
            assert_close(np.asarray(g)[ok], r[ok], tol, f"{case}: output {i}")


@kp.fusion
def softmax(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_nan_and_inf_rows() -> None:
    x = _rand(3, 300)
    x[0, 7], x[1, 250], x[2, :] = np.inf, np.nan, -np.inf
    (got,) = Kernels(softmax)(x)
    with np.errstate(invalid="ignore"):
        ref = _sm(x.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(ref).sum() == 900
    x[2] = _rand(300)
    (got,) = Kernels(softmax)(x)
    with np.errstate(invalid="ignore"):
        ref = _sm(x.astype(np.float64))
    assert_close(got[2], ref[2], 1e-6, "finite row beside NaN rows")


@pytest.mark.parametrize("gridmax", [1, 3])
@pytest.mark.parametrize("n", [200, 257, 1000])
def test_split_pointwise_on_a_tiny_grid(monkeypatch, gridmax: int, n: int) -> None:
    """The split's grouped pointwise kernel with fewer blocks than rounds (grid-stride)."""
    monkeypatch.setattr(tuning, "GRID_X_MAX", gridmax)
    x = _rand(3, n)
    k = Kernels(softmax)
    block, groups = tuning.HEAVY_POINTWISE
    assert k.planner.plan(x.shape).launches[-1].grid[0] == min(gridmax,
                                                               -(-3 * n // (block * groups * 4)))
    (got,) = k(x)
    assert_close(got, _sm(x.astype(np.float64)), 1e-6, f"softmax (3, {n})")


def test_rows_past_the_combine_grid(monkeypatch) -> None:
    monkeypatch.setattr(tuning, "SPLIT_MAX_ROWS", 10)
    monkeypatch.setattr(fullred, "GRID_CAP", 2)  # the combine's and the last kernel's grids
    x = _rand(5, 300)
    k = Kernels(softmax)
    assert [launch.grid[0] for launch in k.planner.plan(x.shape).launches][:2] == [15, 2]
    (got,) = k(x)
    assert_close(got, _sm(x.astype(np.float64)), 1e-6, "softmax (5, 300), 2 combine blocks")


@kp.fusion
def softmax16(x: T[kp.f16, "b", "n"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_misaligned_float16_views(offset: int) -> None:
    x = _rand(2 * 600 + 16, dtype=np.float16)
    base = (-x.ctypes.data // 2) % 8
    view = x[base + offset:base + offset + 2 * 600].reshape(2, 600)
    assert (view.ctypes.data % 16 == 0) == (offset == 0)
    (got,) = Kernels(softmax16)(view)
    assert_close(got, _sm(view.astype(np.float64)), 3e-3, f"offset {offset}")


@kp.fusion
def padded_norm(x: T[kp.f32, "b", "l"], y: T[kp.f32, "b", "m"]):
    v = x * kp.rsqrt((x * x).sum(-1, keepdims=True))
    return kp.pad(v, y.shape[1]) + y * x.max(-1, keepdims=True)


@pytest.mark.parametrize("shape, first", [((2, 300, 700), "padded_norm_0_s_split_partial0"),
                                          ((1, 300, 700), "padded_norm_0_one_partial0"),
                                          ((2, 30, 900), "padded_norm_0_s_rowthread")])
def test_longer_written_rows_split_their_reductions(monkeypatch, shape, first) -> None:
    """Written rows longer than the reduced ones (longrows.py): the reduce-only sub-stage
    takes the split too (OUT_PER_THREAD patched so the fused kernels give way)."""
    monkeypatch.setattr(longrows, "OUT_PER_THREAD", 1)
    b, l, m = shape
    x, y = _rand(b, l), _rand(b, m, seed=1)
    k = Kernels(padded_norm)
    assert _names(k, x.shape, y.shape)[0] == first
    (got,) = k(x, y)
    xd = x.astype(np.float64)
    v = xd / np.sqrt((xd * xd).sum(-1, keepdims=True))
    assert_close(got, np.pad(v, ((0, 0), (0, m - l))) + y * xd.max(-1, keepdims=True), 1e-5,
                 f"{shape}")


@kp.fusion
def heavy_mix(x: T[kp.f16, "b", "n"], w: T[kp.f32, "n"], s: T[kp.f64, "b", 1],
              i: T[kp.i32, "b", "n"]):
    y = kp.exp(x.astype(kp.f32) * w) / (i + 1.5).astype(kp.f32)
    return y, kp.tanh(y).astype(kp.f16), (i > 3) & (x < 0), y.astype(kp.f64) * s


@pytest.mark.parametrize("gridmax", [1, 3, 2**31 - 1])
@pytest.mark.parametrize("shape", [(3, 129), (2, 512), (1, 7)])
def test_grouped_pointwise_mixed_dtypes(monkeypatch, gridmax: int, shape) -> None:
    """Several output dtypes (vec from the widest, float64: 2 per group), broadcast inputs."""
    monkeypatch.setattr(tuning, "GRID_X_MAX", gridmax)
    x, w, s = _rand(*shape, dtype=np.float16), _rand(shape[1]), _rand(shape[0], 1, dtype=float)
    i = RNG(shape[1]).integers(0, 10, shape, dtype=np.int32)
    k = Kernels(heavy_mix)
    (launch,) = k.planner.plan(x.shape, w.shape, s.shape, i.shape).launches
    assert int(launch.block[0]) == tuning.HEAVY_POINTWISE[0]
    y, t, m, ys = k(x, w, s, i)
    ref = np.exp(x.astype(np.float64) * w) / (i + 1.5)
    assert_close(y, ref, 1e-6, "y")
    assert_close(t.astype(np.float64), np.tanh(ref), 2e-3, "tanh")
    assert np.array_equal(m, (i > 3) & (x < 0))
    assert_close(ys, y.astype(np.float64) * s, 1e-12, "y * s")
