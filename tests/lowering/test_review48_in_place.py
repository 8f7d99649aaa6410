"""Review 48: does every in-place call the runtime allows give the right answer?

The runtime lets an ``out=`` array be the very same memory as a read-only input (same start,
same byte size) unless the output is ``zero_init`` (never, for a compiled fusion: the lowering
declares no such output) or the pair is in ``BoundSummary.in_place_refused`` (runtime/
in_place.py): such a call reads the input from a copy (runtime/aliasing.py; it raised
LaunchError until session 39). Here every pair the runtime's own check
(``aliasing.inputs_to_copy_for_outputs``, given those pairs) runs in place without a copy is
run on the SIMT emulator with the output's buffer *being* the input's array, and compared bit
for bit with a run on separate buffers.

The runner (:func:`run_plan`) is modelled on ``simt.Kernels.__call__``/``_launch``, with one
change: a block's threads run one at a time (a thread runs until it waits at ``bar.sync`` or a
warp shuffle, then the next ready one), in ascending order, and the blocks in ascending order;
or everything in descending order. A race between one thread's store and another's load (in
the same block or another block: a GPU runs blocks in any order) then shows deterministically
in one of the two orders, where the emulator's free-running OS threads would show it only now
and then. The kernels have no atomics and fixed reduction trees, so a separate-buffer run is
bit-identical in every order and to ``Kernels.__call__`` (checked below): any difference is the
aliasing's doing.

Findings, against 3d71a50's rule (only a later launch's read was refused, ``late_reads``):
the runtime allowed each call below and it gave a wrong result. Fixed in b53d011 (the rule of
runtime/in_place.py refuses both kinds); the tests below now check that the runtime refuses
each call (reads the input from a copy), and that forced through it is still wrong (so the
refusal is needed, and the case still shows what it was written for):

A. *Same bytes, different layout.* The runtime compares byte ranges only, so an output of
   another dtype or shape over the same bytes passes as "exact" in-place use, but its element
   ``k`` does not sit on the bytes of the input elements that computing it reads: a float32
   ``(2, m)`` output over a float64 ``(m,)`` input it broadcasts (a bias, a layernorm gain), a
   float64 column sum over the float32 ``(2, m)`` it sums, a float32 row padded to ``2m`` over
   a float64 ``(n, m)`` source. One thread's store lands in an element another thread (or a
   later block) still reads.
B. *Another output of the same launch re-reads the input.* ``late_reads`` looks at launch
   order only; within one launch the kernels store an output and then load the input again
   for another output: the loop row schedule writes each output in a loop of its own
   (``x * 2, x / x.sum(-1, keepdims=True)`` with ``out=(x, y)``: the second loop divides the
   doubled ``x``), reduce-only rows (thread, warp tiles, split) store one per-row output
   before reading a per-row input for the next, the general schedule stores outputs one after
   another with loads in between, and so do the pointwise kernels (heavy ones, a full
   reduction's last kernel, the kernel after a column-mean workspace) for the elements past
   the last whole 16-byte group, which they handle one at a time. Same dtype and shape: the
   common in-place call. (Every buffer parameter is declared ``noalias``, so such a call is
   outside LLVM's contract anyway; running the host IR through LLVM's O3 pipeline first, as
   the PTX path does, gave the same wrong results.)

Too strict, not tested: every kernel was passed every input tensor, read or not, so the rule
refused an output written by an earlier launch as *any* input of the program (``x * 2,
kp.arange(n + 1)``: two kernels, ``out=(x, r)`` refused though the second never reads ``x``).
Since session 38 a kernel takes only the buffers its code uses (tests/lowering/
test_kernel_buffers.py): over fusion_gen seeds 0..199 at emulator sizes (multi-output
programs included, both orders) the runtime allows 282 pairs (191 of them in programs of
several outputs) and refuses 315, where it allowed 163 (72) and refused 434; none of either
gave other bits than separate buffers. Still too strict: a row sum to float64 over float32
pairs (``x.astype(kp.f64).sum(-1)`` for ``x`` of shape ``(n, 2)``) is right in place but
refused for its element sizes. Of the pairs refused for
fusion_gen seeds 0..119 (emulator sizes, ascending order), 78 of 120 gave the separate-buffer
bits when forced through under ``late_reads``, 192 of 244 under b53d011's rule (an upper bound
on what a finer rule could allow: some are right only for these inputs).

Single-output fusions in every schedule (pointwise, broadcasting, thread/warp/block/loop/split
rows, tiles, columns, full reductions, reductions read at other rows, the general schedule,
short static rows, integer/bool/half/complex dtypes, ``kp.pad``) are right in place: the
passing sweep below keeps them so.

``inout`` is not covered: a fusion cannot declare an ``inout`` parameter (only
``kp.external`` can), so no compiled fusion has one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import tuning
from kernelpack.runtime import aliasing
from kernelpack.runtime.binding import BoundSummary

from .fusion_gen import generate
from .simt import _NP, Kernels, _state, run_block
from .split_consts import use_small_split

T = kp.Tensor
_STUCK_S = 60.0  # a thread waiting this long for its turn: the schedule deadlocked


# ---- a deterministic, serial schedule of one block's threads ---------------------------------

class _Serial:
    """One block's threads, one at a time in ``order``: the running thread hands over when it
    waits at a barrier (``bar.sync`` or a shuffle) or ends; a barrier releases its waiters,
    in ``order``, behind the threads already ready."""

    def __init__(self, order: list[int]) -> None:
        self.rank = {t: i for i, t in enumerate(order)}
        self.events = {t: threading.Event() for t in order}
        self.ready = deque(order)
        self.failed = False
        self.hand_over()

    def hand_over(self) -> None:
        if self.ready:
            self.events[self.ready.popleft()].set()

    def wait_turn(self, tid: int) -> None:
        event = self.events[tid]
        if not event.wait(_STUCK_S):
            self.fail()
            raise RuntimeError(f"serial schedule stuck: thread {tid} never got its turn")
        event.clear()
        if self.failed:
            raise RuntimeError("another thread of the block failed")

    def fail(self) -> None:
        self.failed = True
        for event in self.events.values():
            event.set()


class _Barrier:
    """``threading.Barrier``'s ``wait()`` for :class:`_Serial` (what simt's callbacks call)."""

    def __init__(self, sched: _Serial, parties: int) -> None:
        self.sched, self.parties, self.waiting = sched, parties, []

    def wait(self) -> None:
        tid, sched = _state.tid, self.sched
        self.waiting.append(tid)
        if len(self.waiting) == self.parties:
            sched.ready.extend(sorted(self.waiting, key=sched.rank.__getitem__))
            self.waiting = []
        sched.hand_over()
        sched.wait_turn(tid)


class _Warp:
    def __init__(self, sched: _Serial) -> None:
        self.values = [0] * 32
        self.barrier = _Barrier(sched, 32)


def _launch(k: Kernels, launch: Any, buffers: dict, values: dict, computed: dict,
            reverse: bool, schedule: type[_Serial] = _Serial) -> None:
    """One launch, each block's threads run by ``schedule`` (``_Serial``, or a subclass
    that hands over differently: review 59's eager schedule)."""
    fn, argv = k.c_call(launch, buffers, {**values, **computed})
    grid, block = launch.grid[0], launch.block[0]
    assert launch.grid[1:] == (1, 1) and launch.block[1:] == (1, 1), launch
    for ctaid in (range(grid - 1, -1, -1) if reverse else range(grid)):
        sched = schedule(list(range(block - 1, -1, -1) if reverse else range(block)))
        barrier = _Barrier(sched, block)
        warps = [_Warp(sched) for _ in range((block + 31) // 32)]
        errors: list[BaseException] = []

        def body(tid: int, ctaid: int = ctaid) -> None:
            _state.tid, _state.ctaid, _state.ntid, _state.nctaid = tid, ctaid, block, grid
            _state.block_barrier, _state.warp = barrier, warps[tid // 32]
            try:
                sched.wait_turn(tid)
                fn(*argv)
                sched.hand_over()
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                sched.fail()

        run_block(block, body, errors)


def run_plan(k: Kernels, inputs: list, alias: tuple[str, str] | None = None,
             reverse: bool = False, more: tuple[tuple[str, str], ...] = ()
             ) -> list[np.ndarray]:
    """Run the plan of ``inputs`` on copies of them, serially (see the module docstring);
    ``alias = (output, input)`` makes that output's buffer the input's memory, viewed as the
    output's dtype and shape (what ``out=`` passes: the runtime checks bytes only), and so
    does each pair of ``more``. The outputs come back as copies."""
    aliases = dict(([alias] if alias is not None else []) + list(more))
    plan = k.planner.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
    values = dict(zip((p.name for p in k.summary.inputs), inputs))
    buffers = {n: np.array(v, copy=True, order="C") for n, v in values.items()
               if isinstance(v, np.ndarray)}
    for alloc in plan.allocations.values():
        dtype = _NP[alloc.dtype.name]
        if alloc.name in aliases:
            src = buffers[aliases[alloc.name]]
            assert src.nbytes == alloc.nbytes, (alloc.name, src.nbytes, alloc.nbytes)
            arr = src.reshape(-1).view(np.uint8).view(dtype).reshape(alloc.shape)
            assert arr.ctypes.data == src.ctypes.data
        else:
            arr = np.empty(alloc.shape, dtype)
            arr.reshape(-1).view(np.uint8).fill(0xA5)  # garbage, not zeros
            if arr.dtype.kind in "fc":
                arr.fill(np.nan)
        buffers[alloc.name] = arr
    computed = dict(plan.computed)
    for launch in plan.launches:
        _launch(k, launch, buffers, values, computed, reverse)
    return [np.array(buffers[t.name], copy=True) for t in k.summary.outputs]


# ---- which aliasings the runtime allows ------------------------------------------------------

def allowed_pairs(k: Kernels, inputs: list) -> tuple[list[tuple[str, str]], int]:
    """The ``(output, input)`` pairs of this call whose byte sizes are equal and that the
    runtime's general path runs in place as they are
    (``aliasing.inputs_to_copy_for_outputs`` with the summary's refused pairs, zero_init
    outputs and no inout), and how many it reads from a copy instead (refused in place)."""
    plan = k.planner.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
    refused_by = BoundSummary(k.summary).in_place_refused(plan.variant)
    zero = {t.name for t in k.summary.outputs if t.zero_init}
    sizes = {p.name: v.nbytes for p, v in zip(k.summary.inputs, inputs)
             if isinstance(v, np.ndarray)}
    allowed, refused = [], 0
    for t in k.summary.outputs:
        nbytes = plan.allocations[t.name].nbytes
        for name, size in sizes.items():
            if not size or size != nbytes:
                continue
            if aliasing.inputs_to_copy_for_outputs("f", [(0x10000, nbytes, t.name)],
                                                   [(0x10000, size, name)], zero, (),
                                                   refused_by):
                refused += 1  # the call reads the input from a copy
            else:
                allowed.append((t.name, name))
    return allowed, refused


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def wrong_in_place(k: Kernels, inputs: list, pairs: list[tuple[str, str]] | None = None
                   ) -> Iterator[str]:
    """A line for each allowed pair (or each of ``pairs``) and order whose in-place outputs
    differ from the separate-buffer run's."""
    pairs = allowed_pairs(k, inputs)[0] if pairs is None else pairs
    for reverse in (False, True):
        ref = run_plan(k, inputs, reverse=reverse)
        for pair in pairs:
            got = run_plan(k, inputs, alias=pair, reverse=reverse)
            for t, g, r in zip(k.summary.outputs, got, ref):
                if not _same(g, r):
                    bad = np.flatnonzero(g.reshape(-1).view(np.uint8)
                                         != r.reshape(-1).view(np.uint8))
                    yield (f"out={pair[0]} as {pair[1]} ({'descending' if reverse else 'ascending'}"
                           f" order): {t.name} differs ({bad.size} bytes, first at byte "
                           f"{bad[0]})")


def _launches(k: Kernels, inputs: list) -> list[tuple[str, int, int]]:
    plan = k.planner.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
    return [(launch.kernel, launch.grid[0], launch.block[0]) for launch in plan.launches]


# ---- inputs and tuning patches -------------------------------------------------------------

def _rng() -> np.random.Generator:
    return np.random.default_rng(48)


def f32(*shape: int) -> np.ndarray:
    return _rng().standard_normal(shape).astype(np.float32)


def f64(*shape: int) -> np.ndarray:
    return np.random.default_rng(4848).standard_normal(shape)


def pos32(*shape: int) -> np.ndarray:
    return (_rng().random(shape) + 0.5).astype(np.float32)


def i32(*shape: int) -> np.ndarray:
    return _rng().integers(-50, 50, shape).astype(np.int32)


def _loop_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """No register-held row groups: written-back rows take the loop schedule (``rowblock``)
    at any length, as rows past 8192 float32 (4096 float64) elements do."""
    for name in ("REG_GROUPS", "REG_GROUPS_WIDE", "REG_GROUPS_LIGHT", "REG_GROUPS_LIGHT_WIDE"):
        monkeypatch.setattr(tuning, name, ())


_PATCHES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "": lambda mp: None, "loop": _loop_rows, "split": use_small_split}


def _compiled(f: Any, patch: str, monkeypatch: pytest.MonkeyPatch, static: dict | None = None
              ) -> Kernels:
    """``f`` for the emulator, with tuning ``patch`` in force while it compiles."""
    with monkeypatch.context() as mp:
        _PATCHES[patch](mp)
        return Kernels(f, static=static)


# ---- the fusions -----------------------------------------------------------------------------

@kp.fusion
def scale(x: T[kp.f32, "n", "m"]):
    return x * 2 + 1


@kp.fusion
def heavy(x: T[kp.f32, "n"]):
    return kp.exp(x) / (x + 3)


@kp.fusion
def outer(x: T[kp.f32, "n", 1], y: T[kp.f32, 1, "m"]):
    return x * y


@kp.fusion
def scale_columns(x: T[kp.f32, "n", "m"], y: T[kp.f32, 1, "m"]):
    return x * y


@kp.fusion
def pad_same(x: T[kp.f32, "n"], y: T[kp.f32, "m"]):
    return kp.pad(x, y.shape[0]) + y


@kp.fusion
def positive(x: T[kp.i8, "n", "m"]):
    return x > 0


@kp.fusion
def cast_same_size(x: T[kp.i32, "n"]):
    return (x * 3).astype(kp.f32)


@kp.fusion
def square_c64(x: T[kp.c64, "n"]):
    return x * x + 1


@kp.fusion
def softmax(x: T[kp.f32, "n", "m"]):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kp.fusion
def softmax_f16(x: T[kp.f16, "n", "m"]):
    y = x.astype(kp.f32)
    e = kp.exp(y - y.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(kp.f16)


@kp.fusion
def layernorm(x: T[kp.f32, "n", "m"]):
    c = x - x.mean(-1, keepdims=True)
    return c * kp.rsqrt((c * c).mean(-1, keepdims=True) + 1e-5)


@kp.fusion
def normalize(x: T[kp.f32, "n", "m"]):
    return x / x.sum(-1, keepdims=True)


@kp.fusion
def int_rows(x: T[kp.i32, "n", "m"]):
    return x - x.max(-1, keepdims=True)


@kp.fusion
def bool_rows(a: T[kp.bool_, "n", "m"], b: T[kp.bool_, "n", "m"]):
    return a | (b.sum(-1, keepdims=True) > 20)


@kp.fusion
def rowsum_plus(x: T[kp.f64, "n", "m"], w: T[kp.f64, "n"]):
    return x.sum(-1) * w + x.max(-1)


@kp.fusion
def phase_rows(x: T[kp.f64, "n", "m"], w: T[kp.f64, "n"]):
    return kp.sin(x.sum(-1)) * w


@kp.fusion
def masked_mean(x: T[kp.f32, "n", "m"], mask: T[kp.f32, "n", "m"], w: T[kp.f32, "n"]):
    return (x * mask).sum(-1) / (mask.sum(-1) + 1) + w


@kp.fusion
def long_rows(x: T[kp.f32, "n", "m"], y: T[kp.f32, "n", "p"]):
    return kp.pad(x / x.sum(-1, keepdims=True), y.shape[1]) + y


@kp.fusion
def centre_cols(x: T[kp.f32, "n", "m"]):
    return x - x.mean(0)


@kp.fusion
def colsum_plus(x: T[kp.f64, "n", "m"], w: T[kp.f64, "m"]):
    return x.sum(0) * w


@kp.fusion
def full_norm(x: T[kp.f32, "n"]):
    return x / x.sum()


@kp.fusion
def full_standardize(x: T[kp.f32, "n", "m"]):
    c = x - x.mean()
    return c * kp.rsqrt((c * c).mean())


@kp.fusion
def symnorm(a: T[kp.f32, "n", "n"]):
    d = kp.rsqrt(a.sum(-1))
    return a * d[:, None] * d[None, :]


@kp.fusion
def strided_centre(c: T[kp.f32, "p", "n", "q"]):
    return c - c.mean(axis=(0, 2), keepdims=True)


@kp.fusion
def short_row_beside_strided(a: T[kp.f32, "n", 3], c: T[kp.f32, "p", "n", "q"],
                             w: T[kp.f32, "n"]):
    return a.sum(-1) + c.sum(axis=(0, 2)) * w


@kp.fusion
def short_rows_elsewhere(a: T[kp.f32, "n", "m"], b: T[kp.f32, "m", "n"]):
    return b * a.sum(-1)[None, :] + a.max(-1)[None, :]


# (fusion, tuning patch, static dims, inputs, the launches' kernel names end with)
SWEEP: dict[str, tuple[Any, str, dict | None, Callable[[], list], tuple[str, ...]]] = {
    "pointwise": (scale, "", None, lambda: [f32(7, 33)], ("pointwise",)),
    "pointwise-heavy": (heavy, "", None, lambda: [f32(301)], ("pointwise",)),
    "broadcast": (scale_columns, "", None, lambda: [f32(5, 70), f32(1, 70)], ("pointwise",)),
    "pad": (pad_same, "", None, lambda: [f32(50), f32(50)], ("pointwise",)),
    "int8-to-bool": (positive, "", None, lambda: [_rng().integers(-3, 3, (5, 64)).astype(
        np.int8)], ("pointwise",)),
    "int32-to-float32": (cast_same_size, "", None, lambda: [i32(301)], ("pointwise",)),
    "complex64": (square_c64, "", None, lambda: [(f32(40) + 1j * f32(40)).astype(
        np.complex64)], ("pointwise",)),
    "softmax-warp": (softmax, "", None, lambda: [f32(3, 37)], ("rowwarp4",)),
    "softmax-block": (softmax, "", None, lambda: [f32(2, 300)], ("rowblock64x8",)),
    "softmax-loop": (softmax, "loop", None, lambda: [f32(2, 40)], ("rowblock",)),
    "softmax-split": (softmax, "split", None, lambda: [f32(2, 300)],
                      ("split_partial0", "split_combine0", "split_partial1", "split_combine1",
                       "split_pointwise")),
    "softmax-f16": (softmax_f16, "", None, lambda: [f32(3, 37).astype(np.float16)],
                    ("rowwarp8",)),
    "layernorm-warp": (layernorm, "", None, lambda: [f32(3, 37)], ("rowwarp4",)),
    "layernorm-loop": (layernorm, "loop", None, lambda: [f32(1, 40)], ("rowblock",)),
    "layernorm-split": (layernorm, "split", None, lambda: [f32(1, 200)],
                        ("split_partial0", "split_combine0", "split_partial1",
                         "split_combine1", "split_pointwise")),
    "normalize-warp": (normalize, "", None, lambda: [f32(9, 200)], ("rowwarp8",)),
    "normalize-split": (normalize, "split", None, lambda: [f32(2, 300)],
                        ("split_partial0", "split_combine0", "split_pointwise")),
    "int-rows-loop": (int_rows, "loop", None, lambda: [i32(2, 40)], ("rowblock",)),
    "bool-rows": (bool_rows, "", None, lambda: [_rng().random((5, 40)) > 0.5,
                                                _rng().random((5, 40)) > 0.3],
                  ("rowwarp16",)),
    "reduce-rows-thread": (rowsum_plus, "", None, lambda: [f64(40, 3), f64(40)],
                           ("rowthread",)),
    "reduce-rows-warp-tiles": (rowsum_plus, "", None, lambda: [f64(5, 40), f64(5)],
                               ("rowwarpt8",)),
    "reduce-rows-one-each": (phase_rows, "", None, lambda: [f64(40, 16), f64(40)],
                             ("rowthread1",)),
    "masked-mean-tiles": (masked_mean, "", None, lambda: [f32(4, 100), pos32(4, 100), f32(4)],
                          ("rowwarpt16",)),
    "padded-rows": (long_rows, "", None, lambda: [f32(3, 5), f32(3, 8)], ("rowwarp",)),
    "centre-columns-split": (centre_cols, "", None, lambda: [f32(300, 3)],
                             ("colsplit", "colsplit1", "colfinalthread", "pointwise")),
    "centre-columns-workspace": (centre_cols, "", None, lambda: [f32(9, 33)],
                                 ("pointwise", "pointwise")),
    "column-sums": (colsum_plus, "", None, lambda: [f64(40, 33), f64(33)],
                    ("pointwise", "pointwise")),
    "full-reduction": (full_norm, "", None, lambda: [f32(8200)],
                       ("partial0", "combine0", "pointwise")),
    "full-variance": (full_standardize, "", None, lambda: [f32(5, 37)],
                      ("partial0", "combine0", "partial1", "combine1", "pointwise")),
    "read-at-other-rows": (symnorm, "", None, lambda: [pos32(9, 9)],
                           ("rowthread", "pointwise")),
    "read-at-other-rows-static": (symnorm, "", {"n": 4}, lambda: [pos32(4, 4)],
                                  ("rowthread", "pointwise")),
    "general-strided": (strided_centre, "", None, lambda: [f32(3, 30, 2)],
                        ("pointwise", "pointwise")),
    "general-short-static-row": (short_row_beside_strided, "", None,
                                 lambda: [f32(30, 3), f32(2, 30, 1), f32(30)], ("pointwise",)),
    "short-static-rows-elsewhere": (short_rows_elsewhere, "", {"m": 3},
                                    lambda: [f32(30, 3), f32(3, 30)],
                                    ("rowthread", "pointwise")),
}


@pytest.mark.parametrize("name", list(SWEEP))
def test_allowed_in_place_calls_give_the_separate_buffers_result(name, monkeypatch):
    """One-output fusions in every schedule: each output/input pair of equal byte size that
    the runtime allows gives, in place, the bits of the separate-buffer run, whichever order
    threads and blocks run in."""
    f, patch, static, make, kernels = SWEEP[name]
    k = _compiled(f, patch, monkeypatch, static)
    inputs = make()
    launches = _launches(k, inputs)
    assert len(launches) == len(kernels) and all(
        kn.endswith("_" + want) for (kn, _, _), want in zip(launches, kernels)), launches
    pairs, _ = allowed_pairs(k, inputs)
    assert pairs, f"{name}: no in-place pair to check ({launches})"
    wrong = list(wrong_in_place(k, inputs, pairs))
    assert not wrong, f"{name} {launches}:\n" + "\n".join(wrong)


def test_an_output_over_an_input_it_broadcasts_reads_it_from_a_copy():
    """``x * y`` with ``x`` (n, 1) and ``y`` (1, m): at n = 1 the output is ``y``'s size, and
    in place it would be right, but only because n is 1 at run time; the kernel reads each
    element of ``y`` for a whole column of the output (``Launch.reads_elsewhere``, session
    40), so the call reads ``y`` from a copy. (Until then this was the sweep's broadcast
    case, allowed in place.)"""
    k = Kernels(outer)
    inputs = [f32(1, 1), f32(1, 70)]
    pairs, refused = allowed_pairs(k, inputs)
    assert (pairs, refused) == ([], 1)
    assert not list(wrong_in_place(k, inputs, [("out", "y")]))


# one-output random fusions whose sizes allow in-place use, cheap ones with row, column, strided
# and no reductions. Seeds 0..399 at their emulator sizes: under 3d71a50's rule 222 allowed a
# pair, 735 pairs in 474 calls, those of 9 seeds wrong (22, 43, 114, 145, 249, 301, 325, 334:
# finding B; 185: A); under b53d011's 135 seeds, 328 pairs in 283 calls, none wrong
RANDOM_SEEDS = [4, 14, 29, 56, 58, 93, 98, 158, 206, 221, 268, 290]


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_fusions_in_place(seed):
    case = generate(seed, "emulator")
    k = Kernels(case.fusion)
    checked = 0
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        pairs, _ = allowed_pairs(k, inputs)
        wrong = list(wrong_in_place(k, inputs, pairs))
        assert not wrong, f"{case.describe(sizes)}\n{_launches(k, inputs)}\n" + "\n".join(wrong)
        checked += len(pairs)
    assert checked, f"seed {seed}: no in-place pair at any size"


# ---- the runner itself -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["softmax-warp", "softmax-block", "centre-columns-split",
                                  "full-reduction", "softmax-split"])
def test_the_serial_runs_are_the_emulators_bits(name, monkeypatch):
    """Without aliasing the serial runner gives Kernels.__call__'s bits in both orders: the
    reductions' trees are fixed by the launch shape (no atomics), so a separate-buffer run is
    deterministic, and a difference in place is the aliasing's doing."""
    f, patch, static, make, _ = SWEEP[name]
    k = _compiled(f, patch, monkeypatch, static)
    inputs = make()
    ref = k(*inputs)
    for reverse in (False, True):
        got = run_plan(k, inputs, reverse=reverse)
        assert all(_same(g, r) for g, r in zip(got, ref)), (name, reverse)


@kp.fusion
def doubled_then_summed(x: T[kp.f32, "n", "m"]):
    return x * 2, x.sum(0)


def test_the_runner_sees_a_late_read_the_runtime_refuses():
    """The session's finding (b): x * 2, x.sum(0) with out=(x, s) is two kernels, the second
    summing the doubled x. The runtime refuses the pair; forced through, the runner shows the
    wrong sum, so a wrong in-place result cannot pass unseen."""
    k = Kernels(doubled_then_summed)
    inputs = [f32(5, 37)]
    assert [kn for kn, _, _ in _launches(k, inputs)] == ["doubled_then_summed_0_pointwise",
                                                          "doubled_then_summed_1_pointwise"]
    pairs, refused = allowed_pairs(k, inputs)
    assert ("out0", "x") not in pairs and refused == 1
    wrong = list(wrong_in_place(k, inputs, [("out0", "x")]))
    assert wrong and all("out1 differs" in w for w in wrong), wrong


# ---- findings --------------------------------------------------------------------------------

def _assert_refused_and_needed(k: Kernels, inputs: list, pair: tuple[str, str],
                               kernels: tuple[str, ...]) -> None:
    """The plan of ``inputs`` launches ``kernels`` (name endings), the runtime refuses the
    in-place call ``pair`` (reads the input from a copy), and forced through, the call gives
    another result than separate buffers."""
    launches = _launches(k, inputs)
    assert len(launches) == len(kernels) and all(
        kn.endswith("_" + want) for (kn, _, _), want in zip(launches, kernels)), launches
    wrong = list(wrong_in_place(k, inputs, [pair]))
    pairs, _ = allowed_pairs(k, inputs)
    assert pair not in pairs, (f"the runtime allows out={pair[0]} as {pair[1]} "
                               f"({launches}):\n" + "\n".join(wrong))
    assert wrong, (f"out={pair[0]} as {pair[1]} is right in place now ({launches}): the "
                   f"lowering keeps it right, so the refusal could be lifted (review 48)")


@kp.fusion
def bias_wide(x: T[kp.f32, "n", "m"], v: T[kp.f64, "m"]):
    return x + v.astype(kp.f32)


@kp.fusion
def layernorm_gain_wide(x: T[kp.f64, "n", "m"], g: T[kp.f64, "m"], b: T[kp.f32, "m"]):
    c = x - x.mean(-1, keepdims=True)
    y = c * kp.rsqrt((c * c).mean(-1, keepdims=True) + 1e-5)
    return (y * g).astype(kp.f32) + b


@kp.fusion
def colsum_wide(x: T[kp.f32, "n", "m"]):
    return x.astype(kp.f64).sum(0)


@kp.fusion
def padded_rows_narrow(x: T[kp.f64, "n", "m"]):
    return kp.pad((x / x.sum(-1, keepdims=True)).astype(kp.f32), 2 * x.shape[1])


@kp.fusion
def pad_narrow(x: T[kp.f64, "n"]):
    return kp.pad(x.astype(kp.f32), 2 * x.shape[0])


@kp.fusion
def strided_sum_wide(c: T[kp.f32, "p", "n", "q"]):
    return c.astype(kp.f64).sum(axis=(0, 2))


# (fusion, inputs, (output, input), the launches' kernel names end with): the same bytes,
# another layout
LAYOUT = {
    # a float32 (2, m) output over the float64 (m,) bias it broadcasts: row 0's stores
    # overwrite v[0 .. m/2), which row 1 reads
    "broadcast-bias": (bias_wide, lambda: [f32(2, 40), f64(40)], ("out", "v"),
                       ("pointwise",)),
    # the same in a row kernel (warp per row): a layernorm's float64 gain under its float32
    # (2, m) output
    "layernorm-gain": (layernorm_gain_wide, lambda: [f64(2, 40), f64(40) + 2, f32(40)],
                       ("out", "g"), ("rowwarp2",)),
    # a float64 column sum over the float32 (2, m) it sums (general schedule, one thread per
    # column): column j's store is x[0, 2j .. 2j + 1], which columns 2j and 2j + 1 read
    "column-sum-to-float64": (colsum_wide, lambda: [f32(2, 33)], ("out", "x"), ("pointwise",)),
    # the same over axes (0, 2)
    "strided-sum-to-float64": (strided_sum_wide, lambda: [f32(2, 30, 1)], ("out", "c"),
                               ("pointwise",)),
    # rows normalized, narrowed to float32 and padded to 2m (one warp per row): element k of
    # the output row is the first or second half of x[i, k // 2], read by another lane
    "padded-rows": (padded_rows_narrow, lambda: [pos32(3, 40).astype(np.float64)],
                    ("out", "x"), ("rowwarp",)),
    # kp.pad of a float32 cast to 2n: the zeros of the upper half land on x[n/2 ..], which
    # lower threads read (wrong when they run later: the descending order; a GPU runs blocks
    # in any order)
    "pad": (pad_narrow, lambda: [f64(301)], ("out", "x"), ("pointwise",)),
}


@pytest.mark.parametrize("name", list(LAYOUT))
def test_in_place_over_another_layout_is_refused(name):
    """Review 48 A: an out= array over the same bytes as an input of another element size
    (3d71a50 allowed it)."""
    f, make, pair, kernels = LAYOUT[name]
    _assert_refused_and_needed(Kernels(f), make(), pair, kernels)


def test_random_fusion_in_place_over_another_layout_is_refused():
    """Review 48 A, fusion_gen seed 185: its float32 (2, 3) output over its int64 (3,) input
    x0, broadcast along rows."""
    case = generate(185, "emulator")
    _assert_refused_and_needed(Kernels(case.fusion), case.inputs({"a": 2, "b": 3}),
                               ("out0", "x0"), ("pointwise",))


@kp.fusion
def doubled_and_normalized(x: T[kp.f32, "n", "m"]):
    return x * 2, x / x.sum(-1, keepdims=True)


@kp.fusion
def int_doubled_and_centred(x: T[kp.i32, "n", "m"]):
    return x * 3, x - x.max(-1, keepdims=True)


@kp.fusion
def two_row_sums(x: T[kp.f64, "n", "m"], w: T[kp.f64, "n"]):
    return x.sum(-1) * w, x.max(-1) + w


@kp.fusion
def split_row_sums(x: T[kp.f64, "n", "m"], w: T[kp.f64, "n"]):
    return x.sum(-1) * w, kp.log(kp.exp(x).sum(-1)) + w


@kp.fusion
def two_heavy(a: T[kp.f32, "n"], c: T[kp.f32, "n"]):
    return kp.exp(a) / (a + 3), kp.tanh(c) / (c + 3)


@kp.fusion
def doubled_beside_full(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y / y.sum()


@kp.fusion
def doubled_beside_centred(x: T[kp.f32, "n", "m"], y: T[kp.f32, "n", "m"]):
    return x * 2, y - y.mean(0)


@kp.fusion
def strided_twice(c: T[kp.f32, "p", "n", "q"]):
    return c.sum(axis=(0, 2)) * 2, c.max(axis=(0, 2)) + c.sum(axis=(0, 2))


# (fusion, tuning patch, inputs, (output, input), the launches' kernel names end with)
SAME_LAUNCH = {
    # the loop row schedule (rows past 8192 float32; patched to reach it at 40) writes each
    # output in a loop of its own: the second loop reads the doubled x
    "loop-rows": (doubled_and_normalized, "loop", lambda: [f32(2, 40)], ("out0", "x"),
                  ("rowblock",)),
    "loop-rows-int32": (int_doubled_and_centred, "loop", lambda: [i32(1, 40)], ("out0", "x"),
                        ("rowblock",)),
    # reduce-only rows, one thread per row: out0 = w's row stored before out1 reads w
    "thread-rows": (two_row_sums, "", lambda: [f64(40, 3), f64(40)], ("out0", "w"),
                    ("rowthread",)),
    # the same with a warp per row (tiles)
    "warp-rows": (two_row_sums, "", lambda: [f64(5, 40), f64(5)], ("out0", "w"),
                  ("rowwarpt8",)),
    # the split-rows schedule's last kernel (tuning patched small)
    "split-rows": (split_row_sums, "split", lambda: [f64(2, 300), f64(2)], ("out0", "w"),
                   ("split_partial0", "split_partial1", "split_rowblock")),
}

# Pointwise kernels storing two outputs: until session 40 they stored each output as soon as
# it was computed, element by element past the last whole 16-byte group, so the next
# output's loads could read the stored value (review 48 B; refused since). Since then every
# value of an element comes first, then the stores (kernels._store_outputs), the launch says
# so (Launch.stores_after_loads, format 1.1), and the runtime allows these in place.
LOADS_FIRST = {
    # heavy pointwise kernels (a transcendental and a division: 64 threads x 2 groups)
    "heavy-pointwise": (two_heavy, "", lambda: [f32(30), f32(30)], ("out0", "c"),
                        ("pointwise",)),
    # a full reduction's last kernel, which writes x * 2 too
    "full-reduction": (doubled_beside_full, "", lambda: [f32(37), f32(37)], ("out0", "y"),
                       ("partial0", "combine0", "pointwise")),
    # the kernel after a column-mean workspace, which writes x * 2 too
    "column-workspace": (doubled_beside_centred, "", lambda: [f32(9, 33), f32(9, 33)],
                         ("out0", "y"), ("pointwise", "pointwise")),
}


@pytest.mark.parametrize("name", list(SAME_LAUNCH))
def test_in_place_beside_another_output_of_the_launch_is_refused(name, monkeypatch):
    """Review 48 B: within one launch the kernel stores an output, then loads the input it
    aliases again for another output (3d71a50 refused later launches' reads only)."""
    f, patch, make, pair, kernels = SAME_LAUNCH[name]
    _assert_refused_and_needed(_compiled(f, patch, monkeypatch), make(), pair, kernels)


@pytest.mark.parametrize("name", list(LOADS_FIRST))
def test_in_place_beside_another_output_of_a_pointwise_launch_runs(name, monkeypatch):
    """The pointwise cases of review 48 B, right in place since session 40 (LOADS_FIRST)."""
    f, patch, make, pair, kernels = LOADS_FIRST[name]
    k = _compiled(f, patch, monkeypatch)
    inputs = make()
    launches = _launches(k, inputs)
    assert [kn.rsplit("_", 1)[-1] for kn, _, _ in launches] == [
        want.rsplit("_", 1)[-1] for want in kernels], launches
    last = k.summary.variants[k.planner.plan(*[v.shape for v in inputs]).variant].launches[-1]
    assert last.stores_after_loads and not last.reads_elsewhere, last
    pairs, _ = allowed_pairs(k, inputs)
    assert pair in pairs
    wrong = list(wrong_in_place(k, inputs, pairs))
    assert not wrong, "\n".join(wrong)


def test_the_general_schedule_beside_another_output_reads_a_copy():
    """Review 48 B's general-schedule case, ``c`` of shape (1, n, 1) summed over axes 0 and
    2: the kernel loads everything first since session 40, so in place would be right at
    these sizes, but its inline reductions read ``c`` along axes that are 1 only at run time
    (``Launch.reads_elsewhere``), so the call reads ``c`` from a copy: conservative."""
    k = Kernels(strided_twice)
    inputs = [f32(1, 30, 1)]
    (launch,) = k.summary.variants[0].launches
    assert launch.reads_elsewhere == ("c",) and launch.stores_after_loads
    pairs, refused = allowed_pairs(k, inputs)
    assert pairs == [] and refused >= 1
    assert not list(wrong_in_place(k, inputs, [("out0", "c")]))


@pytest.mark.parametrize("seed, sizes, pair, kernels", [
    (22, {"a": 5}, ("out0", "x1"), ("rowthread",)),
    (43, {"b": 17, "c": 13}, ("out0", "x0"), ("partial0", "rowblock", "rowthread"))])
def test_random_fusion_in_place_beside_another_output_is_refused(seed, sizes, pair, kernels):
    """Review 48 B, fusion_gen seeds 22 and 43: a thread-per-row kernel stores one (a, 1)
    output, then reads the input it aliases for the next one."""
    case = generate(seed, "emulator")
    _assert_refused_and_needed(Kernels(case.fusion), case.inputs(sizes), pair, kernels)
