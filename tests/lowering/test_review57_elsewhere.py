"""Review 57: is ``Launch.reads_elsewhere`` (format 1.1, ce6d73e) sound, and do the tests see
it break? An adversarial search on the SIMT emulator (review 48's serial runner), then mutation
testing of lowering/elsewhere.py, the fourth rule of runtime/in_place.py,
``Launch._check_reads_elsewhere`` and the serializer's minor version.

**Soundness: no wrong in-place call found.** Every pair ``allowed_pairs`` allowed was run in
place (``wrong_in_place``, both thread orders) against separate buffers:

- fusion_gen seeds 0..599 (default mode, emulator sizes, at ce6d73e): 1592 calls, 800
  pairs allowed, 755 refused, 0 wrong; elsewhere mode seeds 0..109 (at fde7911's
  ``stores_after_loads``): 388 calls, 405 allowed, 247 refused, 0 wrong; default mode again
  at fde7911, seeds 0..60: 156 calls, 112 allowed (73 at ce6d73e), 58 refused, 0 wrong;
- ~50 hand-written fusions at 1-4 sizes each (196 pairs allowed, 41 refused, 0 wrong):
  rows over several axes (register-held and loop rows, the split patch), literal-1 and
  symbolically-1 dims, kp.pad on the last, a middle and the outer axis (padded twice to
  swapped extents: the plan's constraints make the sizes equal, so the layouts match),
  kp.where with an ``(n, 1)`` condition, reductions over a middle axis with and without
  keepdims, ``x @ z`` and ``a.T @ b`` shapes, per-row outputs (thread, warp tiles, split,
  plain warps), iota, a full reduction beside row ones, scalar and ``(1,)`` outputs, static
  dims, column sums (split and workspace), outputs of two shapes in either order, long rows
  (fused, ``OUT_PER_THREAD`` patched to 1 for the one-row and workspace paths), pad inside
  a reduction, complex64 and float16 rows, int32 to float32; and (fde7911) several outputs
  of one pointwise kernel over their own inputs: an Adam-like step, swapped outputs, heavy
  kernels with tails, broadcasts, two full reductions, column means, pads, float32 beside
  float64, two products in one kernel.

Why it holds: views only insert or drop axes (no transpose, slice or reshape), so an input's
labels follow the output's order; the outer prefix matching in labels *and* extents puts each
of its elements in the unit's range, and same-size pairs (the element-size rule) then make
the rest's extents multiply to the row's at run time; different symbols never broadcast and
kp.pad only grows an axis (a plan constraint). Extents are compared symbolically, so the
analysis is conservative where they agree only at run time (``pad(x, y.shape[1])`` at equal
lengths, ``(n, m)`` over ``(n, 1)`` at ``m = 1``).

**Mutants** (68; one at a time in a copy of the tree, the relevant tests of the brief run
from it; E/L/B/U/R1/R2 at ce6d73e, the rest at fde7911, where the in-copy
tests/test_review34_versions.py skips its old-release checks: no git repository):

- elsewhere.py ``reads_elsewhere`` E1-E13: only pointwise kernels analysed, ``()`` for the
  rest, the unit's outer axes for rows or pointwise kernels changed (all output axes, one
  fewer for either kind), literal 1s kept in the unit's axes or its row, ``any`` → ``all``
  over an input's ways of being read, the last output's shape, the ``not wanted`` shortcut
  dropped, every input wanted, only the first outer axis;
- ``input_labels`` L1-L15: the cut empty, without partials, without values, every
  reduction cut, one label for every output axis, ``seen`` by node alone, a view's
  dropped axes labelled, a view's mapping read the wrong way, reduced axes unlabelled or
  labelled as output axes or not per reduction, nothing cut, only an op's first operand,
  an input given the output's shape, only the first output walked;
- ``_broadcast`` B1-B2 (literal 1s labelled, operands aligned from the left); ``_in_unit``
  U1-U8 (labels or extents alone compared, index-0 reads allowed in the row, the row's
  length not checked, fewer axes than the unit's accepted, literal 1s kept, reduced labels
  refused in the row, extent 0 taken as 1);
- in_place.py R1-R11 (no rule, ``seen`` without the read name or with every written one,
  names that are not inputs paired, no dedup, no ``seen`` update, the reason overwriting an
  earlier rule's, without ``and wrote``, only the first name, only the first array stored,
  only launches storing one array);
- launches.py C1-C10 (the empty-tuple fast path for any falsy value, no check, strings,
  scalars' names, any argument's name, duplicates, the tuple never stored, the ``str``
  check dropped, names sorted, bytes);
- serializer.py S1-S8 and S3n (minor always 1 / 0, ``all`` launches, only
  ``stores_after_loads`` counted, resign and save writing this writer's minor, only the
  first variant or program, resign accepting a minor one past this writer's).

Killed by the suite (39): E1 E2 E4 E7 E8 E12 E13, L1 L3-L6 L8-L10 L12-L14, U1 U3 U4 U7,
R1 R8 R10 (tests/lowering/test_elsewhere.py), E5 and U6 (only review 48's random seed 158),
R9 and R11 (review 48's general-schedule test, fde7911), C2 C4-C6 (test_review28_format's
1.1 test), C9, S1 S2 S3n S5 S7 (golden and test_elsewhere's save test). Killed here (20):
E9, L2, L15, B1, B2, U2, U5, R2-R4, R6, C1, C3, C7, C8, C10, S3 (ce6d73e's form), S4, S6,
S8 (S4 and S8 in a copy where test_review34's old-release checks skip). Equivalent
survivors (9): E3 (``len(spec.shape)`` is a pointwise kernel's output rank), E6 (1s multiply
to 1), E10 (one kernel's outputs share a shape), E11 (the shortcut only saves work), L7 (a
view drops only axes of extent 1, which ``_in_unit`` filters), L11 (reduced labels are never
compared with one another), U8 (an extent-0 axis: nothing is stored), R5 (``setdefault``
keeps the first reason anyway), R7 (a launch storing nothing pairs nothing).

The suite's survivors that made the analysis less conservative: E9 (a pointwise kernel's
unit taken as an output row: ``x @ z`` as one general-schedule kernel allowed over ``x``
and wrong: the first test below); U2 and U5 (an index-0 read along a row, or an input
broadcast along the last axes, not listed: right in place only because equal sizes force
the broadcast extents to 1 at run time, so the tests pin the field); B1, B2, L2, L15 (fields
saying less than the kernel reads: runtime-equivalent today, the second rule or equal sizes
covering them). R9 and R11 matter since fde7911: a pointwise kernel storing two arrays
(``stores_after_loads``) is no longer refused by the second rule, so the fourth alone
refuses ``x @ z, z @ x`` over either input (the second test).

Pre-existing at ce6d73e, fixed by fde7911: tests/runtime/test_in_place_refused.py::
test_a_compiled_fusion_knows_its_late_reads failed (its column-sum kernel now lists ``x``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.runtime.in_place import refused_pairs
from kernelpack.serializer import format_minor
from kernelpack.summary import Arg, Launch

from .simt import Kernels
from .test_review48_in_place import _launches, allowed_pairs, wrong_in_place

T = kp.Tensor


def _f32(*shape: int) -> np.ndarray:
    return np.random.default_rng(57).standard_normal(shape).astype(np.float32)


# ---- a contraction in the general (pointwise) schedule --------------------------------------

@kp.fusion
def matmul(x: T[kp.f32, "n", "n"], z: T[kp.f32, "n", "n"]):
    return (x[:, :, None] * z[None, :, :]).sum(1)


def test_a_matrix_product_in_one_pointwise_kernel_reads_both_inputs_elsewhere() -> None:
    """``x @ z`` as one general-schedule kernel (one thread per output element summing a row
    of ``x`` times a column of ``z``): thread ``(i, j)`` reads row ``i`` of ``x``, which the
    threads ``(i, j')`` store over. Both inputs are listed and read from a copy; forced
    through in place the call is wrong. Kills E9 (a pointwise kernel's unit taken as a row of
    the output: ``x`` read at (i, k), k over a reduced axis as long as a row, passed)."""
    k = Kernels(matmul)
    inputs = [_f32(5, 5), _f32(5, 5) + 1]
    assert [kn for kn, _, _ in _launches(k, inputs)] == ["matmul_0_pointwise"]
    (launch,) = k.summary.variants[k.planner.plan((5, 5), (5, 5)).variant].launches
    assert launch.reads_elsewhere == ("x", "z")
    assert allowed_pairs(k, inputs) == ([], 2)
    assert list(wrong_in_place(k, inputs, [("out", "x")]))




@kp.fusion
def two_products(x: T[kp.f32, "n", "n"], z: T[kp.f32, "n", "n"]):
    return (x[:, :, None] * z[None, :, :]).sum(1), (z[:, :, None] * x[None, :, :]).sum(1)


def test_two_products_in_one_kernel_are_refused_over_either_input() -> None:
    """``x @ z`` and ``z @ x`` as one pointwise kernel storing both: every output over
    every input is read from a copy, and forced through, in place is wrong. Since the
    lowering marks its pointwise kernels ``stores_after_loads`` (a kernel storing several
    outputs no longer refused by the second rule alone), only the fourth rule refuses these:
    kills R9 (the rule pairing only the first array the launch stores) and R11 (the rule
    only for launches storing one array)."""
    k = Kernels(two_products)
    inputs = [_f32(5, 5), _f32(5, 5) - 1]
    assert [kn for kn, _, _ in _launches(k, inputs)] == ["two_products_0_pointwise"]
    assert allowed_pairs(k, inputs) == ([], 4)
    wrong = list(wrong_in_place(k, inputs, [("out1", "z")]))
    assert any("out1 differs" in w for w in wrong), wrong


@kp.fusion
def doubled_and_gram(x: T[kp.f32, "n", "n"]):
    return x * 2, (x[:, None, :] * x[None, :, :]).sum(-1)


def test_every_output_of_a_kernel_is_walked() -> None:
    """Two outputs of one shape share a kernel: ``x * 2`` reads ``x`` where it stores, the
    contraction beside it across rows, so the kernel lists ``x``. (The runtime refuses both
    pairs by its second rule anyway: two outputs in one launch; the field still says what
    the kernel reads.) Kills L15 (only the first output walked)."""
    summary = kp.compile(doubled_and_gram, targets=["sm_90"]).summary
    names = {ln.kernel.removeprefix("doubled_and_gram_0_"): ln.reads_elsewhere
             for v in summary.variants for ln in v.launches}
    assert names == {"split_partial0": ("x",), "split_rowblock": (), "rowthread": ("x",),
                     "rowwarpt16": ("x",), "rowblock256t16": ("x",)}



@kp.fusion
def row_plus_vector(x: T[kp.f32, 1, "n"], y: T[kp.f32, "n"]):
    return x * 2 + y


@kp.fusion
def padded_to_one(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return kp.pad(x, 1) + y


def _names(f: Any) -> set[tuple[str, ...]]:
    summary = kp.compile(f, targets=["sm_90"]).summary
    return {ln.reads_elsewhere for v in summary.variants for ln in v.launches}


def test_operands_of_lower_rank_align_from_the_right() -> None:
    """``y`` of shape ``(n,)`` under a ``(1, n)`` output is read at the output's axis 1,
    where it is stored: nothing listed, and out over ``y`` (or ``x``) runs in place, right.
    Kills B2 (operands aligned from the left: ``y`` taken as read along axis 0, listed)."""
    assert _names(row_plus_vector) == {()}
    k = Kernels(row_plus_vector)
    inputs = [_f32(1, 37), _f32(37) + 1]
    assert allowed_pairs(k, inputs) == ([("out", "x"), ("out", "y")], 0)
    assert not list(wrong_in_place(k, inputs))


def test_an_input_under_a_pad_to_one_element_is_read_at_index_zero() -> None:
    """``kp.pad(x, 1)`` broadcast along the output: ``x`` (one element at most, the plan's
    constraint) is read at index 0 for every output element, as a broadcast one is: listed.
    Kills B1 (a literal 1 of an operand's shape labelled as the output's axis instead of
    index 0: ``x`` then looked read where it is stored)."""
    assert _names(padded_to_one) == {("x",)}


@kp.fusion
def rows_beside_padded_to_one(x: T[kp.f32, "b", "m"], z: T[kp.f32, "b", "m"]):
    return kp.pad(x, 1, axis=1) * 2 + z - z.max(-1, keepdims=True)


def test_an_input_read_at_index_zero_along_a_row_is_listed() -> None:
    """The same in a row kernel: ``x`` (``m`` at most 1) read at index 0 of its row for
    every element of the output's row; ``z`` read in its row. Kills U2 (a row's axis read
    at index 0 accepted as long as the extents multiply to the row's length)."""
    summary = kp.compile(rows_beside_padded_to_one, targets=["sm_90"]).summary
    names = {ln.kernel.removeprefix("rows_beside_padded_to_one_0_"): ln.reads_elsewhere
             for v in summary.variants for ln in v.launches}
    assert any(k.startswith("row") for k in names), names
    assert all(v == ("x",) for k, v in names.items()
               if "partial" not in k and "combine" not in k), names



@kp.fusion
def scale_rows(x: T[kp.f32, "n", "m"], v: T[kp.f32, "n", 1]):
    return x * v


def test_an_input_broadcast_along_the_last_axes_is_listed() -> None:
    """``v`` of shape ``(n, 1)`` under a ``(n, m)`` output: element ``i`` is read for the
    whole row ``i``, stored by ``m`` threads. Listed (only ``m = 1`` would make the sizes
    equal, where it is right, but that is known at run time only). Kills U5 (an input whose
    axes are the first of the unit's outer ones, fewer of them, accepted)."""
    assert _names(scale_rows) == {("v",)}


# ---- the runtime's fourth rule --------------------------------------------------------------
# (against the launch-by-launch reference over random variants: tests/runtime/test_in_place.py's
# test_the_fourth_rule_is_the_launch_by_launch_loops, written here and moved there, which kills
# R2-R4, R6, R8 and R9)

def test_an_inout_array_read_elsewhere_is_not_refused_over_itself() -> None:
    """``u`` (inout) stored and listed as read elsewhere by one launch beside output ``o``
    and input ``i``: ``o`` may not run over ``u`` or ``i``, ``u`` may not run over ``i``;
    ``(u, u)`` is no pair (the very same argument). R2, R4."""
    launch = Launch("k", "m", (1,), (32,), (Arg.buffer("o"), Arg.buffer("u"), Arg.buffer("i")),
                    reads_elsewhere=("u", "i"))
    got = refused_pairs([launch], {"o": 4, "u": 4}, {"u": 4, "i": 4})
    # (two arrays stored: the second rule pairs both with every input first)
    assert set(got) == {("o", "u"), ("o", "i"), ("u", "i")}
    one = Launch("k", "m", (1,), (32,), (Arg.buffer("u"), Arg.buffer("i")),
                 reads_elsewhere=("u", "i"))
    got = refused_pairs([one], {"u": 4}, {"u": 4, "i": 4})
    assert got == {("u", "i"): "the kernel that stores to 'u' reads 'i' at other elements "
                                "than the ones it stores"}


# ---- Launch.reads_elsewhere as a Launch checks it -------------------------------------------

def _launch(reads_elsewhere: Any) -> Launch:
    return Launch("k", "m", (1,), (32,), (Arg.buffer("x"), Arg.buffer("out"), Arg.scalar("a")),
                  reads_elsewhere=reads_elsewhere)


@pytest.mark.parametrize("given, kept", [
    ([], ()), (["x"], ("x",)), (("out", "x"), ("out", "x")), (iter(["x", "out"]), ("out", "x")),
    ((n for n in ["x"]), ("x",)), ({"x", "out"}, ("out", "x"))])
def test_names_become_a_sorted_tuple(given: Any, kept: tuple[str, ...]) -> None:
    """Any iterable of buffer names is kept as a tuple, sorted (the encoder writes it as
    kept, the summary compares and hashes it; a set's order followed PYTHONHASHSEED until
    review 72a). Kills C1 (an empty list left a list) and C7 (the names never stored as a
    tuple: a list, or a spent generator); C9 (the names sorted) is the rule since then."""
    launch = _launch(given)
    assert launch.reads_elsewhere == kept and type(launch.reads_elsewhere) is tuple
    hash(launch)


@pytest.mark.parametrize("given, error, words", [
    ("x", TypeError, "must be a sequence"), (b"x", TypeError, "must be a sequence"),
    (None, TypeError, "must be a sequence"), (["a"], ValueError, "'a' is not a buffer"),
    ([b"x"], ValueError, "is not a buffer"), ([["x"]], ValueError, "is not a buffer"),
    (["x", "out", "x"], ValueError, "twice")])
def test_anything_but_distinct_buffer_names_is_refused(given: Any, error: type,
                                                       words: str) -> None:
    """A string (even one naming a buffer: ``"x"`` is not ``("x",)``), bytes, None, a
    scalar argument's name, a non-string name (one a set cannot hold too) or a name given
    twice. Kills C2 (nothing checked), C3 and C10 (a string or bytes taken as its
    characters), C4 and C5 (a scalar argument's name taken), C6 (duplicates), C8 (a list as
    a name: a TypeError from the set lookup, not the message)."""
    with pytest.raises(error, match=words):
        _launch(given)


# ---- the file's minor version -----------------------------------------------------------------

def _compiled(*variants: tuple[tuple[str, ...], ...]) -> Any:
    """A stand-in for a Compiled: variants of launches, each given by its reads_elsewhere."""
    return SimpleNamespace(summary=SimpleNamespace(variants=[
        SimpleNamespace(launches=[SimpleNamespace(reads_elsewhere=names, stores_after_loads=False)
                                  for names in v])
        for v in variants]))


def test_the_minor_version_looks_at_every_program_variant_and_launch() -> None:
    """1 as soon as any launch of any variant of any program lists a name, else 0. Kills S3
    (every launch had to), S6 (only the first variant looked at) and S7 (only the first
    program)."""
    plain = _compiled(((), ()), ((),))
    assert format_minor([plain]) == 0 and format_minor([]) == 0
    assert format_minor([_compiled(((), ("x",)))]) == 1
    assert format_minor([_compiled(((),), ((), ("x",)))]) == 1
    assert format_minor([plain, _compiled(((("y",)),))]) == 1
    assert format_minor(iter([plain, _compiled(((("y",)),))])) == 1


def _with_minor(data: bytes, minor: int) -> bytes:
    """``data`` (a saved file) with its Pack's format_minor set to ``minor``."""
    from kernelpack._fbread import Table
    from kernelpack.limits import FILE_IDENTIFIER
    from kernelpack.serializer import assemble
    from kernelpack.verify import verify_buffer

    fpack = Table(data, verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER), "Pack")
    blobs = [bytes(blob.view("data")) for blob in fpack.get("blobs")]
    return assemble(bytes(fpack.view("body")), blobs, None, minor)


def test_resigning_keeps_the_files_version_and_refuses_a_newer_one() -> None:
    """A 1.0 file (the golden one) re-signed stays 1.0, a 1.1 file 1.1, and a file of
    a newer minor than this writer's is not re-signed (its fields would be dropped and the
    file relabelled); saved again, the 1.0 file is its own bytes. Kills S4 (re-signing wrote
    this writer's minor), S5 (``save`` writing this writer's minor whatever it holds) and S8
    (a minor one past this writer's accepted)."""
    from kernelpack.limits import FORMAT_MINOR
    from kernelpack.serializer import resign
    from kernelpack.signing import generate_private_key
    from kernelpack.verify import read_format_version

    key = generate_private_key()
    old = (Path(__file__).parents[1] / "golden" / "format-1.0.kpack").read_bytes()
    new = kp.save(kp.compile(matmul, targets=["sm_90"]))
    assert read_format_version(old) == (1, 0) and read_format_version(new) == (1, 1)
    assert read_format_version(resign(kp.load(old), key)) == (1, 0)
    assert kp.save(kp.load(old)) == old  # saved again: the same 1.0 bytes
    assert read_format_version(resign(kp.load(new), key)) == (1, 1)
    newer = kp.load(_with_minor(old, FORMAT_MINOR + 1))
    with pytest.raises(kp.CompatibilityError, match="newer than this kernelpack writes"):
        resign(newer, key)
