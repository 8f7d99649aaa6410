"""Which memory a call's arrays may share, and which inputs a call reads from a copy.

A call's ``out=`` arrays and ``inout`` arguments are written by the program; its other tensor
arguments are only read. Three ways of sharing memory have no defined answer and raise
``LaunchError`` naming both arrays and their byte ranges:

- two written arrays that share any byte (``out=(z, z)``; an ``inout`` argument under an
  ``out=`` array or another ``inout`` one): both are stored to, and the stores race;
- a written array that partially overlaps a read-only input (``out=x[1:]`` for ``x``): the
  threads that store one race with the threads that still read the other (NumPy would read
  from a copy here; such a call is almost always a slip, which an error shows).

The very same memory (same start, same size) as a read-only input is in-place use, and it is
always allowed. Most programs read each element before they store over it, and then run in
place as they are. For the pairs where the result would depend on the order of the device's
stores and loads (:mod:`.in_place` says which and why: a later kernel reads the input after
an earlier one stored, a kernel that stores another array too, different element sizes), and
for an output the program zero-fills first (``zero_init``: the fill would erase the input),
the call reads that input from a copy made on the call's stream before anything else of it
is queued: the answer is the one separate arrays give, as NumPy defines in-place ufuncs. The
copy costs one device-to-device copy of the input and its memory for the call's duration.

The general path decides here; the fast paths compare the same ranges (:func:`conflicts`) and
hand any call with such a pair to it.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from ..errors import LaunchError

__all__ = ["overlaps", "partially_overlaps", "conflicts", "check_disjoint_outputs",
           "inputs_to_copy_for_outputs", "inputs_to_copy_for_written"]

#: An array's ``(device pointer, size in bytes, name)``.
Span = tuple[int, int, str]


def overlaps(p0: int, n0: int, p1: int, n1: int) -> bool:
    """Whether the non-empty byte ranges at ``p0`` (``n0`` bytes) and ``p1`` (``n1``) share
    memory."""
    return p1 < p0 + n0 and p0 < p1 + n1


def partially_overlaps(p0: int, n0: int, p1: int, n1: int) -> bool:
    """Whether the non-empty byte ranges at ``p0`` (``n0`` bytes) and ``p1`` (``n1``) share
    memory without being the very same range (in-place use)."""
    return overlaps(p0, n0, p1, n1) and (p0 != p1 or n0 != n1)


def conflicts(p0: int, n0: int, p1: int, n1: int, written: bool) -> bool:
    """Whether the fast paths must hand a call passing the non-empty byte ranges at ``p0`` and
    ``p1`` to the general path: any shared byte when ``written`` (the program writes both, or
    reads the second from a copy when it is the very same memory), else a partial overlap.
    (:func:`~.fastpath.out_overlaps_input`, :func:`~.fastpath.written_conflict`)."""
    return overlaps(p0, n0, p1, n1) if written else partially_overlaps(p0, n0, p1, n1)


def check_disjoint_outputs(program: str, spans: Sequence[Span]) -> None:
    """Refuse ``out=`` arrays whose memory overlaps (``out=(z, z)``): two outputs written
    into the same bytes race on the device and leave garbage in both."""
    spans = sorted(sp for sp in spans if sp[1])
    for (p0, n0, a), (p1, _, b) in zip(spans, spans[1:]):
        if p1 < p0 + n0:
            raise LaunchError(f"{program}: out {a!r} and out {b!r} overlap in memory; pass a "
                              f"separate array for each output")


def inputs_to_copy_for_outputs(program: str, outs: Sequence[Span], inputs: Sequence[Span],
                               zero_filled: Collection[str] = (),
                               written: Collection[str] = (),
                               refused: Mapping[tuple[str, str], str] = {}) -> set[str]:
    """The read-only inputs the call must read from a copy, given its ``out=`` arrays
    ``outs`` and its tensor arguments ``inputs``: those that are the very same memory as an
    output in ``zero_filled`` (``zero_init``) or of a pair in ``refused``
    (:meth:`~.binding.BoundSummary.in_place_refused`). LaunchError for an output that
    partially overlaps an argument, or shares any byte with one in ``written`` (role
    ``inout``: the program stores to both)."""
    copies: set[str] = set()
    for p0, n0, a in outs:
        if not n0:
            continue
        for p1, n1, b in inputs:
            if not n1 or not overlaps(p0, n0, p1, n1):
                continue
            if p0 != p1 or n0 != n1:  # shared, but not the very same range
                in_place = "" if b in written else (
                    f", or the very same array as {b!r} for in-place use")
                raise LaunchError(
                    f"{program}: out {a!r} partially overlaps argument {b!r} in memory "
                    f"(out {n0} bytes at {p0:#x}, {b!r} {n1} bytes at {p1:#x}); pass a "
                    f"separate array{in_place}")
            if b in written:
                raise LaunchError(
                    f"{program}: out {a!r} shares memory with argument {b!r} (out {n0} bytes "
                    f"at {p0:#x}, {b!r} {n1} bytes at {p1:#x}), and the program writes both "
                    f"({b!r} has role 'inout'); pass a separate array for {a!r}")
            if a in zero_filled or (a, b) in refused:
                copies.add(b)
    return copies


def inputs_to_copy_for_written(program: str, spans: Sequence[Span], written: Collection[str],
                               refused: Mapping[tuple[str, str], str] = {}) -> set[str]:
    """The read-only arguments the call must read from a copy, given every tensor argument's
    span (``spans``) and those the program writes (``written``: role ``inout``): each that is
    the very same memory as a written one of a pair in ``refused``. LaunchError for a written
    argument that partially overlaps another argument (``y`` the first three floats of a
    buffer and ``x`` its last three in ``y += a * x``: a thread's store to ``y[i + 1]``
    lands in the ``x[i]`` another thread still reads), or shares any byte with another
    written one."""
    copies: set[str] = set()
    for i, (p0, n0, a) in enumerate(spans):
        if not n0 or a not in written:
            continue
        for j, (p1, n1, b) in enumerate(spans):
            if j == i or not n1 or not overlaps(p0, n0, p1, n1):
                continue
            if b in written:
                raise LaunchError(
                    f"{program}: arguments {a!r} and {b!r} overlap in memory ({a!r} {n0} bytes "
                    f"at {p0:#x}, {b!r} {n1} bytes at {p1:#x}), and the program writes both "
                    f"(role 'inout'); pass a separate array for each")
            if p0 != p1 or n0 != n1:  # shared, but not the very same range
                raise LaunchError(
                    f"{program}: argument {a!r}, which the program writes (role 'inout'), "
                    f"partially overlaps argument {b!r} in memory ({a!r} {n0} bytes at "
                    f"{p0:#x}, {b!r} {n1} bytes at {p1:#x}); pass a separate array, or the "
                    f"very same array as {b!r} for in-place use")
            if (a, b) in refused:
                copies.add(b)
    return copies
