"""Review 59 (part 1 of 3): mutation testing of the lowering's code generator, with the
harness the three parts share.

Mutants (177, one at a time on a copy of 6d0523a; ids as in the review's report, which has
the table): K kernels.py, G groups.py, B bounds.py, R rows.py, X regrows.py, T tiles.py, H
threadrows.py, F fullred.py, C columns.py, I irutil.py, M mathops.identity, S rowsplit.py,
L longrows.py. The existing suite killed most of them. These three files kill the ones it
left, each checked failing on its mutant and passing on the pristine tree:

- G11 (a block reduction's first ``bar.sync`` dropped: the next reduction's writes overtake
  another warp's reads): the eager schedule below
  (``test_block_reductions_hold_their_barriers_when_a_warp_runs_ahead``).
- G07 (the shuffle's clamp 31 made 0, which the emulator ignores): the IR check
  ``test_warp_shuffles_name_every_lane_and_clamp_at_31``.
- R03, R04 (a thread row's or a block row's grid stride wrong: rows skipped only past one
  grid's worth): ``test_row_grid_stride_loops_cover_every_row`` (``GRID_CAP`` patched to 1).
- R27 (every group's float32 sums accumulated in float32):
  ``test_long_float32_rows_accumulate_in_float64``.
- R10 (float32 partials of a float32 product): ``test_register_row_products_accumulate_in_float64``.
- X06 (past-the-row elements of a register row masked with 0, not the max/min identity):
  ``test_register_rows_mask_with_the_identity``; X08 (the same for a complex product):
  ``test_complex_register_products_mask_past_the_row_with_one``.
- X12 (the reciprocal fast path where 1/y overflows):
  ``test_a_row_divisor_whose_reciprocal_overflows_divides_exactly``.
- X19, X22 (a ``(1,)`` input loaded as a 16-byte chunk; a chunk's lanes strided by the
  group): ``test_register_rows_load_only_row_shaped_inputs_in_16_bytes``.
- In part 2: R13, R17 (the row combine of partials reading one round too many, or a round's
  partials ``k`` apart instead of ``k·size``), C15 (a 16-byte group's lanes unravelled as the
  group's first), F04 (a row split's per-row workspace of one entry: stored outside it,
  seen only between guard bytes), G15 (complex block reductions' parts overlapping in
  shared memory with 32 warps), S03 (a split chunk of whole blocks but not whole unrolled
  strides accepted).
- In part 3: B01, B07, B09 (shift guards dropped: an iota's bound one short, a negative
  constant or a negation taken as a bound), I04-I08, I10-I12 (dim arithmetic of negative
  values: modulo, ceiling division, ``min``/``max``, ``>>``, ``<=``; a zero divisor in a
  ``where`` arm not taken).

The other tests here also kill mutants the suite already killed (K08, G12, R08, R09, X07, M01
among them), between guard bytes.

Equivalent (no test can fail on them): K07, K16, K18 (a chunk or round that ends exactly at
the end takes the one-by-one path: same terms), K13 (extra preloads at a value-cache key the
math never reads: dead loads), G06 (sext/zext truncated back), G09, G14, G18, X14 (the same
value stored by another lane, or shared-memory slots still disjoint), G16, G17 (commutative
combines), B02-B06 (over-estimated bounds: more guards), R02 (a shorter grid stride visits
rows twice with the same values), R07 (``> 4`` vs ``>= 4`` at float32), R12, C06
(``lane <= count`` gives 0 terms either way), R14, H05, C19 (summation order only), R26
(``__launch_bounds__``), X09, X20 (values past the row masked out anyway), X10, T02, T03,
H07, C12, C13, C14, C18, F05-F07, S01, S02, L03, L04 (schedule, order, redundant work or
speed only); reasons in the report.
Not killed: X11, X13 (the one-reciprocal-per-row path where 1/y is subnormal: up to
~4 ulp in float32 for |y| > 2^126) and X21 (16-byte alignment claimed for narrower vectors:
device only, the host ignores alignment).

The emulator (:mod:`.simt`) hides two kinds of fault that a GPU does not: a store past the end
of a buffer lands in the host heap, unseen (this review's harness put every buffer between
guard bytes and checked them after each launch; since session 42 the emulator's own
``Kernels.__call__`` does), and its free-running threads keep the warps
of a block in near lockstep, so a missing ``bar.sync`` goes unnoticed (:func:`eager_run` lets
a released warp run ahead as far as the barriers allow). Shapes are chosen to reach each
schedule's tails: sizes that end inside a 16-byte group, a round, a tile or a chunk, and rows
shorter and longer than each group's thresholds.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline, tuning

from .simt import Kernels, assert_close
from .test_review48_in_place import _launch, _Serial

__all__ = ["compiled", "eager_run", "launched", "rng_for"]

T = kp.Tensor

# ---- harness: a schedule that lets a released warp run ahead --------------------------------


class _Eager(_Serial):
    """One block's threads one at a time, the lowest-ranked *ready* thread always next: a warp
    released from a shuffle runs on before the other warps have caught up, as far as a
    ``bar.sync`` lets it. The emulator's free-running OS threads (and review 48's FIFO
    schedule, where released threads queue behind the rest) keep the warps in near lockstep,
    so a missing barrier between one block reduction's reads of shared memory and the next
    one's writes went unseen there; here it shows deterministically."""

    def hand_over(self) -> None:
        if self.ready:
            t = min(self.ready, key=self.rank.__getitem__)
            self.ready.remove(t)
            self.events[t].set()


def eager_run(k: Kernels, *inputs: object, reverse: bool = False) -> list[np.ndarray]:
    """``k(*inputs)`` (guard bytes included) with each block's threads run by :class:`_Eager`
    (ascending thread ids first, or descending with ``reverse``, blocks in that order too)."""
    return k.run(inputs, lambda launch, buffers, values, plan:
                 _launch(k, launch, buffers, values, dict(plan.computed), reverse, _Eager))


_COMPILED: dict[int, Kernels] = {}


def compiled(f: kp.fusion) -> Kernels:
    """``f`` compiled for the emulator once per module (a compile and JIT is most of a small
    test's time; the kernels hold no state between calls)."""
    if id(f) not in _COMPILED:
        _COMPILED[id(f)] = Kernels(f)
    return _COMPILED[id(f)]


def launched(k: Kernels, *shapes: tuple) -> list[str]:
    """The kernels ``k``'s plan launches for these input shapes (which schedule ran)."""
    return [launch.kernel for launch in k.planner.plan(*shapes).launches]


def rng_for(seed: int) -> np.random.Generator:
    """A generator of its own for each parametrized case (the inputs are fixed)."""
    return np.random.default_rng(5900 + seed)


# ---- block reductions: barriers, shuffles --------------------------------------------------


@kp.fusion
def layernorm(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"]):
    mean = x.mean(axis=-1, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=-1, keepdims=True)
    return d * kp.rsqrt(var + 1e-5) * w


def _layernorm_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    xd = x.astype(np.float64)
    d = xd - xd.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w


@pytest.mark.parametrize("n", [257, 3000])
@pytest.mark.parametrize("reverse", [False, True])
def test_block_reductions_hold_their_barriers_when_a_warp_runs_ahead(n, reverse):
    """Two block reductions in a row (the mean, then the variance) share one shared-memory
    buffer: the first barrier keeps the variance's per-warp writes from overtaking another
    warp's reads of the mean's, the second publishes them before anyone reads. Under the
    eager schedule a warp runs from one reduction into the next as far as a barrier lets it."""
    k = compiled(layernorm)
    assert "rowblock" in launched(k, (2, n), (n,))[0]
    rng = rng_for(n)
    x = (rng.standard_normal((2, n)) * 3 + 5).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    (got,) = eager_run(k, x, w, reverse=reverse)
    assert_close(got, _layernorm_ref(x, w), 1e-5, f"layernorm {n}")


def test_warp_shuffles_name_every_lane_and_clamp_at_31():
    """``shfl.sync.bfly`` with the full member mask and the clamp 31: the emulator ignores
    both operands (it pairs lanes ``l`` and ``l ^ offset`` whatever they say), so only the IR
    can show them. On the GPU a clamp below 31 leaves lanes whose partner lies above it
    reading their own value (a warp sum of 32 ones would give 1 in those lanes), and a mask
    missing a lane is undefined behaviour."""
    build = pipeline.run(pipeline.new_build(layernorm, ["sm_80"], None, {}), stop="llvm_ir")
    calls = re.findall(r'call i32 @"llvm\.nvvm\.shfl\.sync\.bfly\.i32"\(i32 (-?\d+), i32 [^,]+, '
                       r'i32 (\d+), i32 (\d+)\)', build.ir)
    assert calls
    assert {int(mask) & 0xFFFFFFFF for mask, _, _ in calls} == {0xFFFFFFFF}
    assert {int(clamp) for _, _, clamp in calls} == {31}
    assert {int(off) for _, off, _ in calls} == {16, 8, 4, 2, 1}


# ---- every kernel family between guard bytes, at tail-heavy sizes ---------------------------


@kp.fusion
def heavy(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return kp.exp(x) * y + x / (y * y + 1.0)


@kp.fusion
def axpy(x: T[kp.f64, "n"], y: T[kp.f64, "n"]):
    return 2.0 * x + y


@pytest.mark.parametrize("n", [1, 7, 509, 515, 1029, 1536 + 9])
def test_pointwise_groups_and_tails_stay_inside_their_buffers(n):
    """Heavy pointwise kernels (several 16-byte groups per thread, rounds of 128 groups, a
    partial last round) and light ones (one group, then a scalar tail): sizes that end inside a
    round, a group, or right after one. Every element right, nothing stored past the end."""
    rng = rng_for(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    k = compiled(heavy)
    assert k.summary.variants[0].launches[0].block[0] == tuning.HEAVY_POINTWISE[0]
    (got,) = k(x, y)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    assert_close(got, np.exp(xd) * yd + xd / (yd * yd + 1.0), 2e-6, f"heavy {n}")
    xa, ya = rng.standard_normal(n), rng.standard_normal(n)
    (got,) = compiled(axpy)(xa, ya)
    np.testing.assert_array_equal(got, 2.0 * xa + ya)


@kp.fusion
def row_stats(x: T[kp.f32, "b", "n"]):
    return x.max(-1), x.sum(-1), x.min(-1)


@kp.fusion
def int_row_stats(i: T[kp.i32, "b", "n"], u: T[kp.u16, "b", "n"]):
    return i.max(-1), i.min(-1), u.min(-1), u.max(-1)


# lengths: thread rows (<= 32: whole groups of 8 and every rest), warp tiles with and
# without 16-byte chunks (multiples of 4 or not, shorter and longer than a tile of 512),
# block tiles (> 2048)


_ROW_LENGTHS = [1, 7, 8, 15, 31, 33, 132, 130, 516, 1001, 2052, 2049, 4100]


@pytest.mark.parametrize("n", _ROW_LENGTHS)
def test_reduce_only_rows_of_negative_values(n):
    """Maxima of negative rows and minima of positive ones (an identity of 0 in place of
    -inf/+inf, or a masked-out element counted as 0, shows), sums; three rows, so a row's
    neighbours are there to be read by an index off by a row."""
    rng = rng_for(n)
    x = -(np.abs(rng.standard_normal((3, n))) + 0.5).astype(np.float32)
    mx, sm, mn = compiled(row_stats)(x)
    np.testing.assert_array_equal(mx, x.max(-1))
    np.testing.assert_array_equal(mn, x.min(-1))
    assert_close(sm, x.astype(np.float64).sum(-1), 1e-6, f"sum {n}")
    mx, sm, mn = compiled(row_stats)(-x)
    np.testing.assert_array_equal(mn, (-x).min(-1))


@pytest.mark.parametrize("n", [7, 31, 33, 1001, 2049])
def test_integer_row_extrema(n):
    """Integer maxima and minima: the identities are the type's extremes (int32 rows below
    -1000, uint16 rows above 60000)."""
    rng = rng_for(n)
    i = rng.integers(-2**31, -1000, (3, n), dtype=np.int32)
    u = rng.integers(60000, 2**16, (3, n), dtype=np.uint16)
    got = compiled(int_row_stats)(i, u)
    for g, r in zip(got, (i.max(-1), (-i).min(-1) * 0 + i.min(-1), u.min(-1), u.max(-1))):
        np.testing.assert_array_equal(g, r)


# lengths for the register rows: warps of 4..32 chunks, blocks of 64/128/256 threads, rows
# that are whole 16-byte chunks (vector) and not (scalars), chunks ending just past the row


_HELD = [5, 33, 132, 130, 260, 257, 1000, 1001, 1540, 1537, 3000, 3001]


@pytest.mark.parametrize("n", _HELD)
def test_register_rows_between_guards(n):
    """Layernorm with a weight (row-like and weight-like 16-byte loads, two levels) on three
    rows: the chunks past a row's end are neither loaded into its statistics nor stored."""
    rng = rng_for(n)
    x = (rng.standard_normal((3, n)) * 3 + 5).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    (got,) = compiled(layernorm)(x, w)
    assert_close(got, _layernorm_ref(x, w), 1e-5, f"layernorm {n}")


# ---- accumulator dtypes ---------------------------------------------------------------------


@kp.fusion
def row_sum64(x: T[kp.f64, "b", "n"]):
    return x.sum(-1)


@kp.fusion
def row_sum32(x: T[kp.f32, "b", "n"]):
    return x.sum(-1)


@kp.fusion
def centred64(x: T[kp.f64, "b", "n"]):
    return x - x.mean(-1, keepdims=True)


@pytest.mark.parametrize("n", [20, 1000])
def test_float64_rows_accumulate_in_float64(n):
    """A float64 row of 1e8 plus small steps: any float32 stage (a thread row's accumulator,
    a register row's pairwise partial) loses the steps entirely."""
    x = 1e8 + np.arange(2 * n, dtype=np.float64).reshape(2, n) * 1e-3
    (got,) = compiled(row_sum64)(x)
    assert_close(got, x.sum(-1), 1e-14, f"float64 row sum {n}")
    (got,) = compiled(centred64)(x)
    assert_close(got, x - x.mean(-1, keepdims=True), 1e-7, f"float64 centred {n}")


def test_long_float32_rows_accumulate_in_float64():
    """A warp-tiled float32 row (2048: four tiles of 512 per warp) where lane 0 meets 1e8,
    then 1.0, then -1e8, one per tile: each tile's float32 partial is exact, and a float64
    accumulator across the tiles keeps the 1.0 that a float32 one rounds away (1e8 + 1)."""
    x = np.zeros((2, 2048), np.float32)
    x[:, 0], x[:, 512], x[:, 1024] = 1e8, 1.0, -1e8
    k = compiled(row_sum32)
    assert launched(k, x.shape) == ["row_sum32_0_rowwarpt16"]
    (got,) = k(x)
    np.testing.assert_array_equal(got, [1.0, 1.0])


@kp.fusion
def off_extremes(x: T[kp.f32, "b", "n"]):
    return x - x.max(-1, keepdims=True), x - x.min(-1, keepdims=True)


@pytest.mark.parametrize("n", [5, 130, 257, 1001, 1537])
def test_register_rows_mask_with_the_identity(n):
    """``x - max(x)`` of negative rows and ``x - min(x)`` of positive ones, held in registers
    (rows written back): the elements of a lane's chunks past the row's end must enter the
    maximum as -inf and the minimum as +inf. (Softmax cannot show a 0 there: it is
    shift-invariant.)"""
    rng = rng_for(n)
    x = -(np.abs(rng.standard_normal((3, n))) + 1.0).astype(np.float32)
    for sign in (1, -1):
        lo, hi = compiled(off_extremes)(sign * x)
        np.testing.assert_array_equal(lo, sign * x - (sign * x).max(-1, keepdims=True))
        np.testing.assert_array_equal(hi, sign * x - (sign * x).min(-1, keepdims=True))


@kp.fusion
def scaled_rows(x: T[kp.f32, "b", "n"], s: T[kp.f32, 1], w: T[kp.f32, 1, "n"]):
    y = x * s * w + kp.arange(x.shape[1]).astype(kp.f32)[None, :] * 0.25
    return y - y.max(-1, keepdims=True)


@pytest.mark.parametrize("n", [132, 1000])
def test_register_rows_load_only_row_shaped_inputs_in_16_bytes(n):
    """Register rows load in 16-byte chunks the inputs laid out like the row or like its
    inner dims (a weight ``(1, n)``); a one-element input ``(1,)`` broadcast along the row is
    not one of them (a chunk of it would read past its end and give the row four different
    scales). An iota along the row is computed per element, at each element's own index
    within its chunk."""
    rng = rng_for(n)
    x = rng.standard_normal((3, n)).astype(np.float32)
    s = np.array([1.5], np.float32)
    w = rng.standard_normal((1, n)).astype(np.float32)
    (got,) = compiled(scaled_rows)(x, s, w)
    y = x * s * w + np.arange(n, dtype=np.float32) * np.float32(0.25)
    np.testing.assert_array_equal(got, y - y.max(-1, keepdims=True))


@pytest.mark.parametrize("rows, n", [(260, 5), (20, 130), (3, 2049), (3, 1537)])
def test_row_grid_stride_loops_cover_every_row(rows, n, monkeypatch):
    """Row kernels on a grid capped at one block (``GRID_CAP`` patched): each group's
    grid-stride loop over rows (a thread: 256 rows a pass, a warp: 8, a block: 1) must reach
    every row exactly at its own index, for reduce-only rows and rows held in registers."""
    monkeypatch.setattr(tuning, "GRID_CAP", 1)
    x = -(np.abs(rng_for(rows * n).standard_normal((rows, n))) + 0.5).astype(np.float32)
    k = Kernels(row_stats)
    assert all(launch.grid[0] == 1 for launch in k.planner.plan(x.shape).launches)
    mx, sm, mn = k(x)
    np.testing.assert_array_equal(mx, x.max(-1))
    np.testing.assert_array_equal(mn, x.min(-1))
    assert_close(sm, x.astype(np.float64).sum(-1), 1e-6, f"sum {rows}x{n}")
    if rows > 100:
        return  # (the register rows' loop over rows: the cases of 20 and 3 rows)
    w = rng_for(n).standard_normal(n).astype(np.float32)
    k = Kernels(layernorm)
    (got,) = k(x, w)
    assert_close(got, _layernorm_ref(x, w), 1e-5, f"layernorm {rows}x{n}")


@kp.fusion
def over_prod(x: T[kp.f32, "b", "n"]):
    return x / x.prod(-1, keepdims=True)


def test_register_row_products_accumulate_in_float64():
    """A float32 product held in registers pairs neighbours first: ``(1e30·1e30)·(1e-30·1e-30)``
    overflows float32 to inf·0 = NaN, where the float64 accumulator gives 1 (NumPy's float64
    product of the row)."""
    x = np.array([[1e30, 1e30, 1e-30, 1e-30] * 2, [2.0, 1e30, 1e30, 1e-30] + [1e-30, 1, 1, 1]],
                 np.float32)
    k = compiled(over_prod)
    assert "rowwarp" in launched(k, x.shape)[0]
    (got,) = k(x)
    xd = x.astype(np.float64)
    assert_close(got, xd / xd.prod(-1, keepdims=True), 1e-6, "row products")


@kp.fusion
def normalised(x: T[kp.f32, "b", "n"]):
    return x / x.sum(-1, keepdims=True)


def test_a_row_divisor_whose_reciprocal_overflows_divides_exactly():
    """``x / x.sum(-1)`` in registers multiplies by one reciprocal per row only where that
    reciprocal is a normal float32: a row of subnormals (sum 4e-40) has 1/sum = inf, and
    ``x · inf`` would give inf where the division gives 0.25."""
    x = np.full((2, 4), 1e-40, np.float32)
    x[1] = [1e-40, 2e-40, 3e-40, 4e-40]
    (got,) = compiled(normalised)(x)
    xd = x.astype(np.float64)
    assert_close(got, xd / xd.sum(-1, keepdims=True), 1e-6, "subnormal rows")


@kp.fusion
def over_complex_prod(z: T[kp.c64, "b", "n"]):
    return z / z.prod(-1, keepdims=True)


@pytest.mark.parametrize("n", [3, 5])
def test_complex_register_products_mask_past_the_row_with_one(n):
    """A complex product held in registers: the elements of a lane's chunk past the row's end
    must enter it as 1, not as the 0 a guarded load gives (a sum would not notice)."""
    rng = rng_for(n)
    z = (rng.standard_normal((2, n)) + 1j * rng.standard_normal((2, n))).astype(np.complex64)
    (got,) = compiled(over_complex_prod)(z)
    zd = z.astype(np.complex128)
    assert_close(got, zd / zd.prod(-1, keepdims=True), 1e-5, "complex products")
