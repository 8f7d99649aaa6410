"""runtime/aliasing.py: which memory a call's arrays may share, and which inputs it reads from
a copy. The calls themselves (the copy queued before the fills and launches, the answers of
separate arrays) are in tests/runtime/test_in_place_refused.py and, on a device,
tests/gpu/test_in_place_refused_gpu.py."""

from __future__ import annotations

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime.aliasing import (check_disjoint_outputs, conflicts,
                                         inputs_to_copy_for_outputs,
                                         inputs_to_copy_for_written, overlaps,
                                         partially_overlaps)

REFUSED = {("o", "x"): "a later kernel of the program reads 'x' after an earlier one stored"}


def test_byte_ranges() -> None:
    assert overlaps(100, 8, 104, 8) and overlaps(104, 8, 100, 8)
    assert not overlaps(100, 8, 108, 8) and not overlaps(108, 8, 100, 8)  # touching
    assert partially_overlaps(100, 8, 104, 8) and not partially_overlaps(100, 8, 100, 8)
    assert partially_overlaps(100, 8, 100, 4)  # same start, other size
    assert conflicts(100, 8, 100, 8, True) and not conflicts(100, 8, 100, 8, False)
    assert conflicts(100, 8, 104, 8, False) and not conflicts(100, 8, 200, 8, True)


def test_outputs_may_not_overlap_each_other() -> None:
    check_disjoint_outputs("f", [(100, 8, "a"), (108, 8, "b"), (50, 0, "c")])
    check_disjoint_outputs("f", [(100, 8, "a"), (104, 0, "b")])  # an empty one shares nothing
    with pytest.raises(LaunchError, match="out 'a' and out 'b' overlap in memory"):
        check_disjoint_outputs("f", [(108, 8, "b"), (100, 9, "a")])


@pytest.mark.parametrize("zero_filled, refused, copied", [
    ((), {}, set()),            # in place as it is
    (("o",), {}, {"x"}),        # the zero fill would erase x first
    ((), REFUSED, {"x"}),       # the order of stores and loads would decide
])
def test_the_very_same_memory_is_in_place_use(zero_filled, refused, copied) -> None:
    assert inputs_to_copy_for_outputs("f", [(100, 8, "o")], [(100, 8, "x"), (200, 8, "w")],
                                      zero_filled, (), refused) == copied


def test_only_the_pairs_in_place_need_a_copy() -> None:
    # refused over x, but o is over w: nothing to copy; x over its own memory elsewhere
    assert inputs_to_copy_for_outputs("f", [(200, 8, "o")], [(100, 8, "x"), (200, 8, "w")],
                                      (), (), REFUSED) == set()
    # empty arrays share nothing, whatever their pointers
    assert inputs_to_copy_for_outputs("f", [(100, 0, "o")], [(100, 8, "x")], ("o",), (),
                                      REFUSED) == set()
    assert inputs_to_copy_for_outputs("f", [(100, 8, "o")], [(100, 0, "x")], ("o",), (),
                                      REFUSED) == set()


def test_a_partial_overlap_is_refused_naming_both_ranges() -> None:
    with pytest.raises(LaunchError, match=r"^f: out 'o' partially overlaps argument 'x' in "
                       r"memory \(out 8 bytes at 0x68, 'x' 8 bytes at 0x64\); pass a separate "
                       r"array, or the very same array as 'x' for in-place use$"):
        inputs_to_copy_for_outputs("f", [(104, 8, "o")], [(100, 8, "x")], ("o",), (), REFUSED)


def test_an_output_over_a_written_argument_is_refused() -> None:
    with pytest.raises(LaunchError, match=r"out 'o' shares memory with argument 'y' .* the "
                       r"program writes both \('y' has role 'inout'\)"):
        inputs_to_copy_for_outputs("f", [(100, 8, "o")], [(100, 8, "y")], (), ("y",))
    with pytest.raises(LaunchError, match=r"out 'o' partially overlaps argument 'y' .*; pass "
                       r"a separate array$"):  # no in-place advice: y is written
        inputs_to_copy_for_outputs("f", [(104, 8, "o")], [(100, 8, "y")], (), ("y",))


def test_written_arguments() -> None:
    spans = [(100, 8, "x"), (100, 8, "y"), (300, 8, "w")]
    assert inputs_to_copy_for_written("f", spans, {"y"}) == set()  # in place as it is
    assert inputs_to_copy_for_written("f", spans, {"y"}, {("y", "x"): "why"}) == {"x"}
    assert inputs_to_copy_for_written("f", spans, {"y"}, {("y", "w"): "why"}) == set()
    with pytest.raises(LaunchError, match=r"arguments 'x' and 'y' overlap in memory .* the "
                       r"program writes both"):
        inputs_to_copy_for_written("f", spans, {"x", "y"})
    with pytest.raises(LaunchError, match=r"argument 'y', which the program writes \(role "
                       r"'inout'\), partially overlaps argument 'x' .*; pass a separate array, "
                       r"or the very same array as 'x' for in-place use$"):
        inputs_to_copy_for_written("f", [(100, 8, "x"), (104, 8, "y")], {"y"})
    # a read-only argument is never the one whose overlaps are looked at
    assert inputs_to_copy_for_written("f", [(100, 8, "x"), (104, 8, "w")], {"y"}) == set()
