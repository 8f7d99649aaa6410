"""Review 66: mutation testing of the lowering's code generation (what review 65b did not run).

Commit mutated: 7c93dc1 (``git archive`` of it in /tmp/r66, pytest run there with PYTHONPATH on
the copy's src and ``-p no:cacheprovider``, a fresh KERNELPACK_CACHE_DIR per mutant, one mutant
at a time, restored after each; tests of this file checked on a second copy, failing on their
mutant and passing on the pristine tree).
Mutated: src/kernelpack/lowering/codegen.py (C: value/index/broadcast contexts, views, where,
pads, the general reduction loop and its compensation, shifts, the operand dtypes, the row
reciprocal, rounding of half results), memory.py (D: the 16-byte and element alignment checks,
the alignment a lane claims, complex loads and stores) and the casts of irutil.py (X:
``to_compute``, ``to_storage``, ``const_of``, ``_narrow_value``, ``_round_narrow``,
``round_result``, ``convert``, ``_zero_or_one``, ``_truncate_to``, ``_float_to_int``,
``_truth``). Review 65b's table was lost: this table is new (124 mutants, C01-C68 with gaps,
D01-D21, X01-X39; each named with its one-line description below where it matters).
Tests chosen by module, the nearest first, ``-x -q``, one process, 330 s: D and X01-X08 ran
review 65b's and 59's mutant files, review 10's casts, review 6/9's NumPy corners,
test_mathops, test_simt, review 28's semantics, pointwise groups, random fusions, review 10's
conj, review 59's bounds, test_compile, review 59's column splits, kernel buffers, columns,
rowsplit, full reductions, review 9's amplitudes, review 2's lowering; from X09 on (time) a
leaner list: X the casts/corners/math/simt/semantics/random fusions/review 59/compile files, C
the same plus pointwise groups and full reductions.

Review 66's totals (session 48, written as its batches ran; the last written): 124 mutants in
the table (C 64, D 21, X 39); 40 ran through the suite (C 10, D 21, X 9); 34 killed by the
suite, 6 suite survivors killed here, 0 suite survivors equivalent, 0 suite survivors not judged
(none); 11 more killed here without a suite run (X09, X10, X11, X12, X13, X14, X15, X17, C26,
C41, C42); 13 argued equivalent without a suite run (X: review 10's casts and this file passed
on them; C: reasoned, with the IR screen of 324 fusions below: C07, C14, C20, C21, C23, C31,
C55, C62, C65, X05, X16, X31, X34); 60 not run (C03, C04, C18, C19, C22, C24, C25, C27, C29,
C30, C32, C33, C34, C35, C36, C37, C38, C39, C40, C43, C44, C45, C46, C47, C48, C49, C50, C51,
C52, C53, C54, C56, C57, C58, C59, C60, C61, C63, C64, C66, C67, C68, X20, X21, X22, X23, X24,
X25, X26, X27, X28, X29, X30, X32, X33, X35, X36, X37, X38, X39: review 66b's, below).
Killed by the suite: C01, C02, C08, C09, C10, C12, C13, C15, C17, D01, D02, D03, D04, D05, D07,
D08, D09, D10, D11, D12, D13, D14, D15, D16, D17, D18, D19, D20, D21, X01, X04, X06, X07, X19.
Killed here (suite survivors): C05, D06, X02, X03, X08, X18.

Review 66b (totals written after each batch; final, all 60 ran): the 60 mutants review 66 did
not run, on a git archive of 1c6e83f in /tmp/r66c (the same runner, test lists, 330 s limit,
fresh cache per mutant, one process; tests of this file checked in a second copy, failing on
their mutant and passing on the pristine tree). 60 ran through the suite: 41 killed by it; of
its survivors, 14 killed here (C03, C18, C27, C38, C54, C59, X21, X22, X26, X29, X30, X32, X38,
X39), 5 equivalent (C04, C52, C53, C66, X33), 0 not judged (none). None left unrun.
Killed by the suite (66b): C19, C22, C24, C25, C29, C30, C32, C33, C34, C35, C36, C37, C39, C40,
C43, C44, C45, C46, C47, C48, C49, C50, C51, C56, C57, C58, C60, C61, C63, C64, C67, C68, X20,
X23, X24, X25, X27, X28, X35, X36, X37; of them C24 survived the lean list and is killed by the
wider one's test_review2_lowering.py::test_long_dependency_chains_compile; C40 survived the lean
list and is killed by the wider one's test_rowsplit.py::test_softmax.
Killed here (66b), by test: C03: ``test_complex64_row_sums_accumulate_in_float32``; C18:
``test_iotas_along_broadcast_axes_are_zero``; C27:
``test_register_rows_do_not_load_past_the_row_end``; C38:
``test_values_computed_under_a_pad_stay_inside_its_branch``; C54:
``test_shift_counts_up_to_the_width_are_guarded``; C59:
``test_float16_square_roots_are_rounded_before_their_consumers``; X21, X38, X39:
``test_stored_bools_are_bytes_0_and_1``; X22:
``test_reals_made_complex_have_a_positive_zero_imaginary_part``; X26:
``test_integers_to_bfloat16_round_once``; X29, X30:
``test_only_known_bits_convert_to_float_by_a_select``; X32:
``test_float_to_int_bounds_are_numpys``.
Review 66 and 66b together: 124 mutants; 100 ran through the suite, 75 killed by it; 31 killed
by this file (suite survivors or not run); 18 equivalent; none left unjudged. X25, X36 and C64,
killed by the suite, also fail the tests here that name them.
Equivalent (66b):
- C04: every constant index a context holds is the one shared ``ZERO`` (unravel, child_ctx,
  views and the row schedules' outer indices put no other constant there), so ``a is b`` decides
  before two constants are compared (the IR of review 66's 324 screened fusions did not change).
- C52: operands of one rank with different dtypes never reach the codegen: ``_promote`` refuses
  two integer (or two float) dtypes as a dtype mismatch and
  ``_weak_size``/``widen_for_comparison`` cast sizes and wide literals first; with equal dtypes
  ``operand_dtype`` returns before the test (the IR of the 324 screened fusions did not change).
- C53: ``_promote`` gives and/or/xor the higher-ranked operand dtype when the kinds differ and
  refuses equal kinds with different dtypes, so the result dtype is the one ``operand_dtype``'s
  rank test picks: the same conversion (the IR of the 324 screened fusions did not change).
- C66: the row cache is filled only by row and partial kernels (rows.py, kernels._partial) and
  ``stored`` only by pointwise kernels (kernels._pointwise), one Emitter per kernel: no node is
  in both, so which test comes first never matters (the IR of the 324 screened fusions did not
  change).
- X33: ``fcmp uge`` lets a NaN pass the lower bound, but the upper bound is still an ordered
  ``olt``, false for NaN, and the two are and-ed: a NaN still takes the minimum (34 of the 324
  screened fusions' IR changed, ``uge`` for ``oge``).

Equivalent (review 66; no test can fail on them):
- C07: buffer parameters without ``noalias``: LLVM and ptxas may assume less (no
  ``ld.global.nc``, less reordering); the same values, speed only (IR of all 324 screened
  fusions changed only so).
- C14: the leading index of an unravelled flat index is ``rest``, which is 0 whenever the
  leading dim is 1: the same index (3 of 324 fusions' IR changed, naming another value).
- C20: the value cache keyed without the linear index: a context's linear index, when known, is
  the flat index of its per-axis indices, so equal per-axis indices name the same element (48
  fusions' IR changed: fewer reloads).
- C21: lookups only in the innermost scope recompute values an outer scope already holds, the
  same values (14 fusions' IR changed: speed only).
- C23: the bottom-up pass one level deeper emits the same order as the recursion (its
  docstring), and no fusion of the corpus' IR changed.
- C31: a view's source computed at its per-axis indices instead of the flat index: the same
  element, with a div/mod more (speed only).
- C55: the split shift for an offset of 0 shifts by the base and then by the constant 0: the
  same value (4 workloads' IR changed).
- C62: ``.minnctapersm`` not emitted: a register-budget hint for ptxas, speed only.
- C65: a same-shape child context rebuilt without the flat index: inputs loaded at the ravelled
  per-axis indices, the same element (speed only).
- X05: llvmlite writes the unmasked negative constant of an unsigned type as ``i8 -1``, which
  LLVM reads as the same bits as the masked ``i8 255`` (an integer constant is its value modulo
  2^width).
- X16: only a NaN newly takes the odd path; or-ing 1 into a NaN's bits keeps it a NaN (exponent
  all ones, fraction nonzero), and every stored bfloat16 NaN becomes 0x7FC0 (``to_storage``).
- X31: a value equal to -2^(bits-1) sent to the out-of-range arm gets that arm's constant,
  -2^(bits-1): its own truncation.
- X34: 2^63 itself on the low arm: ``_truncate_to`` gives the out-of-range -2^63, whose bits are
  2^63 as uint64, the high arm's result.

Bugs: none found (review 66b: none either). Findings that are not bugs: the host cannot show
a bfloat16 NaN's stored bits
(its LLVM canonicalizes the rounding's NaN to 0x7FC0), nor a scalar parameter's declared width
(C's calling convention), nor a lost alignment claim: X03, C05 and C26 are killed by IR checks.
Not judged by review 66 (no suite run, IR screen of the 324-fusion corpus unchanged): C04 and
C66; review 66b argues both equivalent (above).

The table (id: what the mutant does; file by letter):
C01: acc_dtype: float32 sums/means/products accumulate in float32
C02: acc_dtype: float32 products accumulate in float32
C03: acc_dtype: complex64 sums accumulate in complex128 everywhere
C04: _same: equal constants compare different (row cache refuses them)
C05: scalar parameters declared in compute type (bool i1, float16 as float)
C07: buffer parameters lose noalias
C08: split_index: drops a nonzero offset (adds zero)
C09: split_index: records the sum itself as the base (offset applied twice)
C10: finish: buffers keeps the dropped parameters (launch args mismatch)
C12: unravel: quotient and remainder swapped
C13: unravel: divides by the wrong dims (shape[:-1])
C14: unravel: leading size-1 axis not forced to 0
C15: ravel: index and accumulated offset swapped
C17: child_ctx: broadcast aligned from the left
C18: child_ctx: a broadcast size-1 axis takes the outer index
C19: child_ctx: linear index kept after a broadcast
C20: _key: linear index not part of the cache key
C21: value: cache looked up only in the innermost scope
C22: value: result cached in the outermost scope
C23: value: bottom-up pass one level later
C24: _inputs_first: expands the wrong children
C25: operand: no conversion to the operation's dtype
C26: input: linear loads not marked contiguous
C27: input: row guard ignored (loads past the row end)
C29: iota: index of the last axis
C30: view: axis mapping inverted
C31: view: linear index dropped
C32: where: arms swapped
C33: complex where: imaginary arm takes x's real part
C34: where: condition converted to the result dtype
C35: pad: bound <= (reads one past the row)
C36: pad: bound is the padded size
C37: zero_unless: fills with 1
C38: zero_unless: no scope for the guarded values
C39: _reduce: row cache accepts a read sharing any outer index
C40: _reduce: stored reduction loaded with reversed index
C41: _reduce: complex64 mean accumulates in complex64
C42: _reduce: complex sums uncompensated
C43: _reduce: fallback loop skips the first term
C44: _reduce: reduced axes matched to the wrong unravelled indices
C45: _reduce: term converted from the result dtype, not the source's
C46: _reduce: sum and compensation slots swapped
C47: _reduce: NaN compensation counted as finite
C48: _reduce: mean divides by the whole source size
C49: _reduce: compensation added only where it is not finite
C50: libcall: uses_libdevice never set
C51: operand_dtype: complex() operands converted to complex
C52: operand_dtype: ties of rank take the second operand's dtype
C53: operand_dtype: bitwise ops convert to the result dtype
C54: shift: a count equal to the width taken as in range
C55: shift: split path also for offset 0
C56: shift: split shift drops the base shift
C57: div: row reciprocal divided instead of multiplied
C58: binary: float16/bfloat16 results not rounded per operation
C59: unary: float16/bfloat16 results not rounded
C60: unary: abs of complex takes its input converted to the real result dtype
C61: zero_unless: condition inverted
C62: launch_bounds: minctasm never emitted
C63: operand_dtype: compare converts to the lower-ranked dtype
C64: shift: in-range bound taken from the shifted value, not the count
C65: child_ctx: same shape also drops the linear index
C66: _reduce: stored takes priority over the row cache
C67: div: row reciprocal only for float64
C68: _reduce: fallback loop zeroes the kept axes
D01: aligned16: mask 7
D02: aligned16: addresses and-ed
D03: aligned16: only the first buffer checked
D04: aligned16: inverted
D05: element_aligned: checks only the part's alignment
D06: element_aligned: cache key without the buffer
D07: _align: broadcast (non-contiguous) accesses claim alignment
D08: _align: complex part offset is a whole element
D09: _align: group span ignored (the fixed bug)
D10: _align: lane offset in parts, not elements
D11: _align: buffer not recorded for the 16-byte check
D12: load complex: part index not doubled
D13: load complex: parts swapped
D14: load complex: imaginary part claims the real part's alignment
D15: store complex: v2 path and part path swapped between lanes and elements
D16: store complex v2: real slot gets the imaginary part
D17: store complex v2: claims twice the element's alignment
D18: store complex parts: imaginary over the real
D19: store complex: v2 where the buffer is NOT element-aligned
D20: store: no conversion to storage type
D21: store complex lane: imaginary part claims the real part's alignment
X01: to_compute bool: inverted
X02: to_storage bool: True stored as 0xFF
X03: to_storage bf16: NaN payload kept
X04: to_storage bf16: every number stored as NaN
X05: const_of: negative unsigned constant not masked
X06: const_of complex: imaginary part is the real part
X07: _narrow_value: one bit fewer
X08: _narrow_value: largest finite value becomes inf
X09: _narrow_value: truncates instead of rounding
X10: _narrow_value: bfloat16 subnormal literals flushed
X11: _round_narrow f16: float64 rounded through float32 (twice)
X12: _round_narrow: sign test inverted
X13: _round_narrow: away-from-zero test swapped
X14: _round_narrow: step away instead of toward zero
X15: _round_narrow: odd of the nearest, not of the truncation
X16: _round_narrow: NaN takes the odd path
X17: _round_narrow: float64 to bfloat16 rounded twice
X18: round_result: sqrt taken as exact
X19: round_result: or -> and
X20: convert complex->real: takes the imaginary part
X21: convert complex->bool: both parts must be nonzero
X22: convert real->complex: imaginary part -0.0
X23: convert bool->float: inverted
X24: convert bool->int: True is -1
X25: convert int->half: signedness swapped
X26: convert int->half: through float32 (double rounding)
X27: convert int widening: extension by the destination's signedness
X28: convert int->float: unsigned as signed
X29: _zero_or_one: any and-mask is a bit
X30: _zero_or_one: any zext is a bit
X31: _truncate_to: -2^(bits-1) itself out of range
X32: _truncate_to: 2^(bits-1) in range
X33: _truncate_to: NaN passes the lower bound
X34: _float_to_int uint64: 2^63 itself on the low path
X35: _float_to_int uint64: adds 2^63 instead of subtracting
X36: _float_to_int: 16-bit types through a 64-bit conversion
X37: _float_to_int: int32 through a 64-bit conversion (wraps)
X38: _truth float: NaN is False
X39: _truth int: negative values False
"""

from __future__ import annotations

import ctypes
import math
import re
from fractions import Fraction

import numpy as np
import pytest

import kernelpack as kp

from . import simt
from .simt import Kernels
from .test_review59_codegen_mutants import compiled
from .test_review65_mathops_mutants import _checked, _ir, _offset_copy, _same_bits

T = kp.Tensor
C64_N = T[kp.c64, "n"]
F32_N = T[kp.f32, "n"]
I32_N = T[kp.i32, "n"]
F64_N = T[kp.f64, "n"]
F16_N = T[kp.f16, "n"]
BF16_N = T[kp.bf16, "n"]


def _shift_by_name(k, shifts: dict):  # type: ignore[no-untyped-def]
    """A launcher for :meth:`Kernels.run` that moves the buffers named in ``shifts`` (inputs
    by parameter name, outputs by output name) that many bytes past a 64-byte boundary, the
    others onto one."""
    def launch(launch, buffers: dict, values: dict, plan) -> None:  # type: ignore[no-untyped-def]
        for name, arr in list(buffers.items()):
            buffers[name] = _offset_copy(arr, shifts.get(name, 0))
        k._launch(launch, buffers, values)
    return launch


# ---- complex stores: each buffer's own alignment check -----------------------------------------

@kp.fusion
def _two_complex_outputs(z: C64_N):
    return z * 2, z + 1j


@pytest.mark.parametrize("first,second", [(8, 4), (4, 8)], ids=str)
def test_each_complex_output_checks_its_own_alignment(first, second):
    """Kills D06 (the element-alignment check of a complex store cached per element size, not
    per buffer): two complex64 outputs of one kernel, one 8-byte aligned, one only 4 (views
    of float buffers); the mutant let the second store reuse the first one's check, and an
    ``st.v2`` claimed 8 bytes at an address 4 bytes past it (a misaligned-address fault on
    the GPU; here each access checks its address)."""
    k, bad = _checked(_two_complex_outputs)
    names = [t.name for t in k.summary.outputs]
    z = (np.arange(13) - 0.5j * np.arange(13)).astype(np.complex64)
    a, b = k.run((z,), _shift_by_name(k, {names[0]: first, names[1]: second, "z": 4}))
    np.testing.assert_array_equal(a, z * np.complex64(2))
    np.testing.assert_array_equal(b, z + np.complex64(1j))
    assert bad.value == 0, bad.value


# ---- bool storage ---------------------------------------------------------------------------

@kp.fusion
def _bools(x: F32_N, i: I32_N, z: C64_N):
    return x > 0, i.astype(kp.bool_), z.astype(kp.bool_), kp.where(x > 1, x < 3, i == 2)


def test_stored_bools_are_bytes_0_and_1():
    """Kills X02 (a ``True`` stored as ``sext`` of its bit, byte 0xFF): a bool element is
    one byte holding 0 or 1 for NumPy, PyTorch and DLPack consumers; NumPy's comparisons
    happen to read 0xFF as True, so the suite's value checks passed, but ``x.view(np.uint8)``
    (or a consumer that adds the bytes) sees 255. Also kills (review 66b) X21 (complex to bool
    true only where both parts are nonzero: ``1j`` gave False), X38 (a NaN's truth False:
    NumPy's ``bool(nan)`` is True) and X39 (negative integers' truth False)."""
    x = np.array([-1.0, 0.0, 0.5, 2.0, np.nan, 4.0], np.float32)
    i = np.array([0, 2, -1, 7, 0, 2], np.int32)
    z = np.array([0, 1j, 2, 0, complex(np.nan, 0), -0.0], np.complex64)
    got = compiled(_bools)(x, i, z)
    refs = (x > 0, i.astype(bool), z.astype(bool), np.where(x > 1, x < 3, i == 2))
    for k, (g, r) in enumerate(zip(got, refs)):
        assert g.dtype == np.bool_
        np.testing.assert_array_equal(g.view(np.uint8), r.view(np.uint8), err_msg=f"output {k}")


# ---- bfloat16 NaN bits ------------------------------------------------------------------------

@kp.fusion
def _bf16_nans(x: F32_N, y: F64_N):
    return x.astype(kp.bfloat16), y.astype(kp.bfloat16), (x * 0.0).astype(kp.bfloat16)


def test_bfloat16_nans_are_stored_as_the_one_quiet_nan():
    """Kills X03 (a bfloat16 NaN stored with the bits its rounding gave, without the select
    of 0x7FC0): every bfloat16 NaN is stored as 0x7FC0, PyTorch's and ml_dtypes' NaN. The
    host's LLVM happens to canonicalize a NaN's ``fptrunc`` to bfloat to 0x7FC0 itself, so
    only the IR shows the mutant; on the GPU ``cvt.rn.bf16.f32`` of a NaN gives the canonical
    0x7FFF of the PTX ISA, which a user's ``torch.isnan`` still reads as NaN but a bitwise
    comparison or a content hash does not. The values (NaNs of both signs and payloads, ties
    to even) are checked too."""
    ir_text = _ir(_bf16_nans)
    nan_selects = set(re.findall(r'(%"?[.\w]+"?) = select\s+i1 %\S+, i16 32704, i16', ir_text))
    stored = re.findall(r"store i16 (%\S+),", ir_text)
    assert stored and set(stored) <= nan_selects, (stored, nan_selects)
    bits = np.array([0xFFC00000, 0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0x3F808000, 0x3F818000,
                     0x7F800000, 0x00000001], np.uint32)
    x = bits.view(np.float32)
    y = np.array([-np.nan, np.nan, 1.0, -2.5, 1 + 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -30,
                  np.inf, -0.0])
    y[0] = -abs(y[0])
    a, b, c = compiled(_bf16_nans)(x, y)
    with np.errstate(invalid="ignore"):
        zero_nan = np.isnan(x * np.float32(0))
    assert (a[np.isnan(x)] == 0x7FC0).all() and (c[zero_nan] == 0x7FC0).all(), (a, c)
    assert (b[:2] == 0x7FC0).all(), b
    # the numbers: nearest even (0x3F80 for 1 + 2^-8, a tie; 0x3F81 just above it)
    assert a[4:].tolist() == [0x3F80, 0x3F82, 0x7F80, 0x0000], a
    assert b[2:].tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F81, 0x7F80, 0x8000], b


# ---- float16/bfloat16 literals ----------------------------------------------------------------

@kp.fusion
def _half_literals(h: F16_N, g: BF16_N):
    return (h + 65504.0, h - 65504.0, h + 0.3, h + 2.0 ** -24,
            g + 255 * 2.0 ** 120, g + 0.3, g + 2.0 ** -130, g - 2.0 ** -133)


def _bf16_bits(v: float) -> int:
    """The bfloat16 bits of ``v`` (exact in bfloat16: its float32 bits' top half)."""
    return int(np.array([v], np.float32).view(np.uint32)[0] >> 16)


def test_half_literals_round_once_to_the_half_type():
    """Kills X08 (a literal equal to the half type's largest finite value taken as past it:
    ``h + 65504.0`` gave inf), X09 (literals truncated instead of rounded: ``h + 0.3`` with
    ``h = 0`` gave float16's 0.2998 where NumPy's ``float16(0.3)`` is 0.30005) and X10
    (bfloat16 literals below its smallest normal flushed: ``g + 2**-130`` gave 0). NumPy's
    float16 for float16; for bfloat16 the value rounded once (as ml_dtypes does)."""
    h = np.zeros(3, np.float16)
    g = np.zeros(3, np.uint16)  # bfloat16 bits: +0
    got = compiled(_half_literals)(h, g)
    refs16 = [np.float16(65504.0), np.float16(-65504.0), np.float16(0.3), np.float16(2.0 ** -24)]
    for k, r in enumerate(refs16):
        assert got[k].dtype == np.float16 and (got[k] == r).all(), (k, got[k], r)
    # 0.3 in bfloat16: 0x3E9A (0.30078125, nearest); 255 * 2**120 is its largest finite value
    refs_bf = [_bf16_bits(255 * 2.0 ** 120), 0x3E9A, _bf16_bits(2.0 ** -130),
               0x8000 | _bf16_bits(2.0 ** -133)]
    for k, r in enumerate(refs_bf, start=4):
        assert (got[k] == r).all(), (k, [hex(v) for v in got[k]], hex(r))


# ---- float64 to float16/bfloat16: one rounding ---------------------------------------------

@kp.fusion
def _narrow_casts(y: F64_N):
    return y.astype(kp.bfloat16), y.astype(kp.f16)


def _bf16_of(v: float) -> int:
    """bfloat16 bits of float64 ``v`` rounded once to nearest even (normal values)."""
    e = math.frexp(abs(v))[1]
    q = Fraction(2) ** (e - 8)
    r = float(round(Fraction(abs(v)) / q) * q)  # Fraction's round: ties to even
    return _bf16_bits(r) | (0x8000 if v < 0 else 0)


def test_float64_to_half_types_rounds_once():
    """Kills X11 (float64 to float16 through float32: ``1 + 2**-11 + 2**-40`` rounded to the
    float32 tie ``1 + 2**-11`` and then to 1.0; NumPy's is 1.001), X17 (float64 to bfloat16
    through float32 with no rounding to odd: the same double rounding) and X12-X15 (the round
    to odd's sign test, direction, step and odd bit: values just above and below bfloat16 ties,
    of both signs, came out one unit off)."""
    ties = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 3 + 2.0 ** -6, 0.75 + 2.0 ** -10]
    vals = []
    for t in ties:
        for d in (2.0 ** -40, -2.0 ** -40):
            vals += [t + d * t, -(t + d * t)]
    vals += [1.0, -2.5, 1 + 2.0 ** -8, 1 + 2.0 ** -7, 1e-3, -1e30, 2.0 ** 100 * (1 + 2.0 ** -9)]
    y = np.array(vals)
    b = compiled(_narrow_casts)(y)[0]
    want = [_bf16_of(v) for v in vals]
    wrong = [(v, hex(g), hex(w)) for v, g, w in zip(vals, b.tolist(), want) if g != w]
    assert not wrong, wrong
    y16 = np.array([1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -11 + 2.0 ** -40),
                    1 + 3 * 2.0 ** -11 - 2.0 ** -40, 0.1, 65519.9])
    (_, h16) = compiled(_narrow_casts)(y16)
    np.testing.assert_array_equal(h16, y16.astype(np.float16))


# ---- the general reduction loop: complex sums ---------------------------------------------

C128_ABC = T[kp.c128, "a", "b", "c"]
C64_ABC = T[kp.c64, "a", "b", "c"]


@kp.fusion
def _complex_long_sum(z: C128_ABC):
    return z.sum(axis=(0, 2))


@kp.fusion
def _complex64_long_mean(w: C64_ABC):
    return w.mean(axis=(0, 2))


def test_long_complex_sums_in_one_thread_are_compensated_in_complex128():
    """Kills C42 (the fallback loop's complex sums without Neumaier's compensation: 10^5
    complex128 terms drifted ~1e-12 from the exact sum, NumPy's pairwise sum stays within
    1e-15 of it) and C41 (a complex64 mean accumulated in complex64 there: 10^6 terms drifted
    far past float32's rounding of the result). Axes (0, 2) of a 3-d input: one thread sums a
    whole output element (the general schedule)."""
    re_ = np.full((100, 2, 1000), 0.1)
    re_[::3, :, ::7] = 3.3
    im = np.full((100, 2, 1000), -0.7)
    im[1::4, :, ::3] = 1.1
    z = re_ + 1j * im
    (s,) = compiled(_complex_long_sum)(z)
    exact = np.array([complex(math.fsum(re_[:, j, :].ravel()), math.fsum(im[:, j, :].ravel()))
                      for j in range(2)])
    np.testing.assert_allclose(s.real, exact.real, rtol=1e-15, atol=0)
    np.testing.assert_allclose(s.imag, exact.imag, rtol=1e-15, atol=0)
    w = np.tile(z.astype(np.complex64), (10, 1, 1))  # 10^6 terms per output element
    (m,) = compiled(_complex64_long_mean)(w)
    wd = w.astype(np.complex128)
    ref = np.array([complex(math.fsum(wd[:, j, :].real.ravel()),
                            math.fsum(wd[:, j, :].imag.ravel())) for j in range(2)]) / 1e6
    np.testing.assert_allclose(m.real, ref.real, rtol=2e-7, atol=0)
    np.testing.assert_allclose(m.imag, ref.imag, rtol=2e-7, atol=0)


# ---- float16 results feed the next operation rounded ------------------------------------------

@kp.fusion
def _half_sqrt(h: F16_N):
    return kp.sqrt(h).astype(kp.f32), kp.sqrt(h) * 3.0


def test_float16_square_roots_are_rounded_before_their_consumers():
    """Kills X18 (``sqrt`` listed with the operations whose float16 result is exact, so not
    rounded): ``sqrt(h).astype(f32)`` gave float32's root (``sqrt(2)`` = 1.4142135) where
    NumPy's float16 ``sqrt`` is 1.414 (0x3DA8), and ``sqrt(h) * 3`` rounded once instead of
    twice. Also kills C59 (no unary float16/bfloat16 result rounded, review 66b)."""
    h = np.array([2, 3, 5, 7, 10, 0.1, 65504, 6e-8], np.float16)
    a, b = compiled(_half_sqrt)(h)
    np.testing.assert_array_equal(a, np.sqrt(h).astype(np.float32))
    np.testing.assert_array_equal(b, np.sqrt(h) * np.float16(3))


# ---- scalar parameters in the widths the runtime packs ----------------------------------------

@kp.fusion
def _narrow_scalars(x: F32_N, flag: kp.bool_, s: kp.f16, t: kp.bf16, u: kp.u8):
    return kp.where(flag, x * s.astype(kp.f32), x + t.astype(kp.f32)) + u.astype(kp.f32)


def test_scalar_parameters_are_declared_in_their_storage_types():
    """Kills C05 (scalar parameters declared in their compute types: a bool as ``i1``, a
    float16 as ``float``, a bfloat16 as ``float``): the runtime packs each scalar with its
    dtype's width (runtime/scalars.py: bool one byte, float16 two, bfloat16 its two-byte
    bits), so on the GPU a ``float`` parameter read four bytes of a two-byte argument (the
    emulator passes scalars through C's calling convention, where the mutant does not show)."""
    define = next(line for line in _ir(_narrow_scalars).splitlines()
                  if line.startswith("define "))
    params = re.findall(r'(\w+) %"(flag|s|t|u)"', define)
    assert params == [("i8", "flag"), ("half", "s"), ("i16", "t"), ("i8", "u")], define


# ---- pointwise loads claim their 16-byte groups -------------------------------------------------

@kp.fusion
def _saxpy(x: F32_N, y: F32_N, a: kp.f32):
    return a * x + y


def test_pointwise_loads_of_contiguous_inputs_claim_16_byte_groups():
    """Kills C26 (an input read at the flat index not marked contiguous): its loads claimed
    no alignment, so LLVM could not merge a group's four float32 loads into one ``ld.v4``
    (and the run-time 16-byte check no longer looked at the inputs). Values do not change:
    speed only, seen in the IR."""
    ir_text = _ir(_saxpy)
    claims = re.findall(r'load float, ptr %"\.\d+", align (\d+)', ir_text)
    assert "16" in claims, claims
    assert re.search(r'ptrtoint ptr %"x" to i64', ir_text) and \
        re.search(r'ptrtoint ptr %"y" to i64', ir_text)


# ---- review 66b: the mutants review 66 did not run ---------------------------------------------

U8_N = T[kp.u8, "n"]
U32_N = T[kp.u32, "n"]
I64_N = T[kp.i64, "n"]
I32_B33 = T[kp.i32, "b", 33]
F32_B4 = T[kp.f32, "b", 4]
F32_BN = T[kp.f32, "b", "n"]


@kp.fusion
def _real_to_complex(x: F32_N, i: I32_N):
    return x.astype(kp.c64), i.astype(kp.c128), x + 0j


def test_reals_made_complex_have_a_positive_zero_imaginary_part():
    """Kills X22 (a real converted to complex with the imaginary part -0.0): NumPy's
    ``astype(complex64)`` and ``x + 0j`` give +0.0, and the sign shows downstream
    (``np.angle`` of a negative real is pi for +0.0, -pi for -0.0; ``np.signbit``)."""
    x = np.array([-1.5, 0.0, -0.0, 2.0, np.inf, -np.inf], np.float32)
    i = np.array([-3, 0, 5, 7, -1, 2**31 - 1], np.int32)
    got = compiled(_real_to_complex)(x, i)
    refs = (x.astype(np.complex64), i.astype(np.complex128), x + np.complex64(0j))
    for k, (g, r) in enumerate(zip(got, refs)):
        _same_bits(g.real, r.real, f"output {k} real")
        _same_bits(g.imag, r.imag, f"output {k} imag")


@kp.fusion
def _ints_to_bf16(i: I32_N, u: U32_N, j: I64_N):
    return i.astype(kp.bfloat16), u.astype(kp.bfloat16), j.astype(kp.bfloat16)


def test_integers_to_bfloat16_round_once():
    """Kills X26 (an integer made float16/bfloat16 through float32, not float64: two
    roundings; ``2**24 + 2**16 + 1`` became the float32 tie ``2**24 + 2**16`` and then
    ``2**24``, where one rounding gives ``2**24 + 2**17``) and X25 (the signedness of that
    conversion swapped: -16842753 as int32 became a huge positive number)."""
    v = [2**24 + 2**16 + 1, 2**24 + 3 * 2**16 - 1, 2**25 + 2**17 + 2, 12345, 2**31 - 1]
    i = np.array(v + [-v[0]], np.int32)
    u = np.array(v + [2**32 - 2**8 - 1], np.uint32)
    j = np.array(v + [2**40 + 2**32 + 1], np.int64)
    for g, src in zip(compiled(_ints_to_bf16)(i, u, j), (i, u, j)):
        want = [_bf16_of(float(s)) for s in src.tolist()]
        assert g.tolist() == want, ([hex(x) for x in g.tolist()], [hex(x) for x in want])


@kp.fusion
def _bits_to_floats(i: I32_N, u: U8_N):
    return (i & 6).astype(kp.f32), (i & 1).astype(kp.f32), u.astype(kp.i32).astype(kp.f32)


def test_only_known_bits_convert_to_float_by_a_select():
    """Kills X29 (any ``x & constant`` taken as a 0-or-1 value: ``(i & 6).astype(f32)`` went
    through ``trunc`` to i1 and a select of 0.0/1.0, 6 gave 0.0) and X30 (any ``zext`` taken
    as one: uint8 200 widened to int32 gave 0.0). ``i & 1`` keeps the select (its values)."""
    i = np.array([0, 1, 2, 3, 6, 7, -1, -2], np.int32)
    u = np.array([0, 1, 2, 3, 200, 255, 128, 7], np.uint8)
    a, b, c = compiled(_bits_to_floats)(i, u)
    np.testing.assert_array_equal(a, (i & 6).astype(np.float32))
    np.testing.assert_array_equal(b, (i & 1).astype(np.float32))
    np.testing.assert_array_equal(c, u.astype(np.int32).astype(np.float32))


@kp.fusion
def _floats_to_ints(y: F64_N):
    return y.astype(kp.i32), y.astype(kp.i16), y.astype(kp.i64), y.astype(kp.u64)


def test_float_to_int_bounds_are_numpys():
    """Kills X36 (int16 converted through a 64-bit conversion: 3e9 fits int64, so it wrapped
    to 24064; NumPy's 32-bit conversion gives int32's minimum, whose low 16 bits are 0) and X32
    (2**31 taken as in int32's range, 2**63 in int64's: only the IR shows it, the host's x86
    ``cvttsd2si`` gives the minimum for both, but the GPU's ``cvt.rzi`` saturates 2**31 to
    2**31 - 1, where NumPy gives -2**31: every upper bound is a strict ``olt``)."""
    y = np.array([3e9, -3e9, 1e10, 2.0 ** 31, -2.0 ** 31, 70000.5, np.nan, 2.0 ** 63, -7.9,
                  2.0 ** 64, 2.0 ** 63 + 2.0 ** 11])
    got = compiled(_floats_to_ints)(y)
    with np.errstate(invalid="ignore"):
        refs = (y.astype(np.int32), y.astype(np.int16), y.astype(np.int64), y.astype(np.uint64))
    for k, (g, r) in enumerate(zip(got, refs)):
        _same_bits(g, r, f"output {k}")
    preds: dict[str, set] = {}
    for pred, lim in re.findall(r"fcmp (\w+) double %\S+, (0x[0-9a-f]+)", _ir(_floats_to_ints)):
        preds.setdefault(lim, set()).add(pred)
    assert preds["0x41e0000000000000"] == {"olt"}, preds  # 2**31
    assert preds["0x43e0000000000000"] == {"olt", "oge"}, preds  # 2**63 (and uint64's arm)


@kp.fusion
def _shifts_to_33(x: I32_B33):
    k = kp.arange(33).astype(kp.i32)
    return x << k[None, :], x >> k[None, :]


@kp.fusion
def _shifted_small(s: T[kp.i32, 8]):
    k = kp.arange(8).astype(kp.i32)
    return k << s, k >> s


def test_shift_counts_up_to_the_width_are_guarded():
    """Kills C54 (a count known to be at most the width, ``arange(33)`` for int32, taken as
    in range: the shift by 32 left unguarded, which x86 computes as a shift by 0, ``5 << 32``
    gave 5 where NumPy gives 0) and C64 (the in-range test made on the shifted value's bound,
    not the count's: ``arange(8) << 40`` unguarded)."""
    x = np.array([[5] * 33, [-8] * 33, [2**31 - 1] * 33], np.int32)
    k = np.arange(33, dtype=np.int32)[None, :]
    hi, lo = compiled(_shifts_to_33)(x)
    _same_bits(hi, x << k, "<<")
    _same_bits(lo, x >> k, ">>")
    s = np.array([0, 1, 31, 32, 33, 40, 63, 100], np.int32)
    hi, lo = compiled(_shifted_small)(s)
    r = np.arange(8, dtype=np.int32)
    _same_bits(hi, r << s, "arange << s")
    _same_bits(lo, r >> s, "arange >> s")


@kp.fusion
def _size_one_iotas(x: F32_B4, y: F32_N):
    return x + kp.iota((1, 4), 0, kp.f32), y + kp.arange(1, kp.f32)


def test_iotas_along_broadcast_axes_are_zero():
    """Kills C18 (a broadcast size-1 axis indexed with the output's index instead of 0):
    an ``iota`` along its size-1 axis is 0 wherever it is broadcast, the mutant gave the
    row number. (Loads do not show it: ``ravel`` skips size-1 dims.)"""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a, b = compiled(_size_one_iotas)(x, x[:, 1].copy())
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x[:, 1])


C64_BN = T[kp.c64, "b", "n"]


@kp.fusion
def _complex64_rows(w: C64_BN):
    return w.sum(axis=-1), w.mean(axis=-1)


def test_complex64_row_sums_accumulate_in_float32():
    """Kills C03 (complex64 sums accumulated in complex128 in every schedule): the row
    schedules keep complex64 in float32 (``acc_dtype``), as NumPy's pairwise complex64 sum
    does; float64 arithmetic runs at 1/64 of float32's rate on consumer GPUs and takes twice the
    registers. Values are no worse (speed only): seen in the IR, where no kernel of a
    complex64 row sum or mean has a ``double``."""
    kernels = re.split(r"\ndefine ", _ir(_complex64_rows))[1:]
    assert len(kernels) >= 4
    for body in kernels:
        assert "fadd float" in body and "double" not in body, body.split("(")[0]


# Every load is checked first: one in the GUARD bytes past a buffer's end counts (the values
# loaded there are masked out, so results cannot show it; on the GPU a read past an allocation
# can fault)
_LOAD = re.compile(r'^(\s*)(%\S+ = load [^,]+, ptr (%"[^"]+"|%[\w.]+).*)$', re.M)
_PAST = """
@kp_ends = global [16 x i64] zeroinitializer
@kp_nends = global i64 0
@kp_past = global i64 0
define void @kp_past_check(ptr %p) {
entry:
  %a = ptrtoint ptr %p to i64
  %n = load i64, ptr @kp_nends
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %next]
  %more = icmp ult i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %q = getelementptr [16 x i64], ptr @kp_ends, i64 0, i64 %i
  %end = load i64, ptr %q
  %d = sub i64 %a, %end
  %in = icmp ult i64 %d, 256
  %i1 = add i64 %i, 1
  br i1 %in, label %bad, label %next
next:
  br label %loop
bad:
  %o = atomicrmw add ptr @kp_past, i64 1 monotonic
  br label %done
done:
  ret void
}
"""


@kp.fusion
def _softmax_rows(x: F32_BN):
    e = kp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_register_rows_do_not_load_past_the_row_end():
    """Kills C27 (the register rows' guard ignored: the slots past a row's end loaded
    anyway, for the last row from past the buffer; the values are masked out of the sums and
    never stored, so only the addresses show): every load of the kernels is checked against
    the :data:`simt.GUARD` bytes that follow each buffer."""
    k = Kernels(_softmax_rows)
    assert simt.GUARD >= 256
    text = _LOAD.sub(lambda m: f"{m[1]}call void @kp_past_check(ptr {m[3]})\n{m[1]}{m[2]}",
                     k._ir) + _PAST
    k._native = simt._Jit(text, k._kernels, native=True)
    addr = k._native.engine.get_global_value_address
    ends = (ctypes.c_int64 * 16).from_address(addr("kp_ends"))
    nends = ctypes.c_int64.from_address(addr("kp_nends"))
    past = ctypes.c_int64.from_address(addr("kp_past"))
    ran = []

    def launch(launch, buffers: dict, values: dict, plan) -> None:  # type: ignore[no-untyped-def]
        arrays = [a for a in buffers.values() if isinstance(a, np.ndarray)]
        for j, a in enumerate(arrays):
            ends[j] = a.ctypes.data + a.nbytes
        nends.value = len(arrays)
        ran.append(launch.kernel)
        k._launch(launch, buffers, values)

    for n in (7, 37, 130):
        x = np.random.default_rng(n).standard_normal((3, n)).astype(np.float32)
        (out,) = k.run((x,), launch)
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)
    assert all("rowwarp" in name for name in ran), ran
    assert past.value == 0, past.value


@kp.fusion
def _two_pads(x: F32_N):
    return kp.pad(x, 16) + kp.pad(x * 2.0, 16)


def test_values_computed_under_a_pad_stay_inside_its_branch():
    """Kills C38 (``zero_unless`` without a scope of its own: ``x`` loaded under the first
    pad's ``if`` was cached for the whole kernel, and the second pad's ``x * 2`` used it in a
    block that branch does not dominate: LLVM refused the module, "Instruction does not
    dominate all uses!")."""
    x = np.arange(1, 6, dtype=np.float32)
    (got,) = compiled(_two_pads)(x)
    np.testing.assert_array_equal(got, np.pad(x, (0, 11)) * 3)
