"""Which inputs a call may not read in place: the limits of in-place use.

An ``out=`` array (or an ``inout`` argument) that is the very same memory as a read-only input
(same start, same size) is in-place use. It is right when each thread reads the input elements
it needs before it stores over them, and no other thread or later kernel reads them after.
What a kernel does inside is not in the summary; which arrays it takes is (a launch's buffer
arguments: a compiled fusion's kernels take only those their code loads or stores, since
session 38), and so, since format 1.1, is which inputs each kernel reads at elements other
than the ones it stores (``Launch.reads_elsewhere``, filled by the lowering). Four cases make
the right answer depend on the order of the device's stores and loads:

- **a later launch reads the input** after an earlier one stored to the written array (or the
  same launch repeats). ``x * 2, x.sum(0)`` compiles to a pointwise kernel, then a column
  sum; with ``out=(x, s)`` the sum read the doubled ``x``;
- **the launch that stores it stores another output or inout array too**, and reads the
  input, unless the launch says it loads everything before storing anything
  (``Launch.stores_after_loads``, format 1.1: the lowering's pointwise kernels). Inside
  such a kernel one output's store can come before the loads of another output's values:
  the loop row schedule writes each output in a loop of its own, and
  ``x * 2, x / x.sum(-1, keepdims=True)`` with ``out=(x, y)`` divided the doubled ``x``;
- **the launch that stores it reads the input elsewhere**: ``x @ x.T`` as one kernel
  (``(x[:, None, :] * x[None, :, :]).sum(-1)``) reads row ``j`` of ``x`` for ``out[i, j]``,
  which the threads of row ``j`` store over (review 54). A file older than format 1.1 does
  not say, and such a pair there stays allowed: rebuild it;
- **the element sizes differ.** The bytes are the same but element ``k`` of one is not on
  element ``k`` of the other: a float32 ``(2, m)`` output over the float64 ``(m,)`` bias it
  broadcasts has row 0's stores land on ``v[m/2:]``, which row 1 still reads. (With equal
  sizes, equal bytes means an equal count of elements, which broadcasting then maps one to
  one.)

Found by review 48 (tests/lowering/test_review48_in_place.py), which runs every in-place call
the runtime allows on the SIMT emulator, thread by thread in both orders, against separate
buffers. A call passing such a pair as the very same memory reads the input from a copy
(:mod:`.aliasing`; until session 39 it raised ``LaunchError``); the fast paths check the
pairs like written arguments (:func:`~.fastpath.out_overlap`,
:func:`~.fastpath.written_pairs`) and hand such a call to the general path.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..summary import KernelSummary, Tensor

__all__ = ["refused_pairs", "refused_in_variant"]


def refused_in_variant(summary: KernelSummary, variant: int) -> dict[tuple[str, str], str]:
    """:func:`refused_pairs` of variant ``variant`` (an index) of a ``KernelSummary``: its
    outputs and ``inout`` tensors against its tensor inputs. What the runtime refuses
    (``BoundSummary.in_place_refused``) and what ``kernelpack inspect`` lists."""
    tensors = [p for p in summary.params if isinstance(p, Tensor)]
    return refused_pairs(summary.variants[variant].launches,
                         {t.name: t.dtype.itemsize for t in tensors if t.role != "in"},
                         {t.name: t.dtype.itemsize for t in tensors if t.role != "out"})


def refused_pairs(launches: Iterable[Any], written: dict[str, int], read: dict[str, int]
                  ) -> dict[tuple[str, str], str]:
    """``{(written name, read name): why}`` for one variant (``launches``: the summary's, in
    order) of the pairs in-place use may not have (see the module docstring). ``written``:
    the outputs and ``inout`` tensors, ``read``: the tensor inputs, each name with its
    element size in bytes. ``why`` finishes a sentence about the pair."""
    pairs: dict[tuple[str, str], str] = {}
    for w, wsize in written.items():
        for r, rsize in read.items():
            if r != w and wsize != rsize:
                pairs[(w, r)] = (f"{w!r} has {wsize}-byte elements and {r!r} {rsize}-byte "
                                 f"ones, so a store to one lands on elements of the other "
                                 f"that other threads still read")
    # Each pair is looked at once per rule, however many launches repeat it: a file may hold
    # 4096 launches of 128 outputs and 128 inputs each, which looping over every launch's
    # pairs took ~24 s to work out. A pair's reason is still that of the first launch where a
    # rule holds, the later-read rule first (what a launch-by-launch loop would give).
    stored: list[str] = []  # stored to by an earlier launch, in order of first store
    stored_set: set[str] = set()
    covered: dict[str, int] = {}  # read name -> how many of ``stored`` its pairs have seen
    again: dict[str, set[str]] = {}  # written name -> reads the 2nd rule paired with it
    done: set[tuple] = set()  # (repeated, wrote, loads) of the launches the 2nd rule saw
    elsewhere: dict[str, set[str]] = {}  # read name -> itself and the written names paired
    for launch in launches:
        names = {a.name for a in launch.args if a.kind == "buffer"}
        wrote = sorted(n for n in names if n in written)
        loads = frozenset(r for r in names if r in read)
        for r in loads:
            first = covered.get(r, 0)
            for w in stored[first:]:
                if r != w:
                    pairs.setdefault((w, r), f"a later kernel of the program reads {r!r} "
                                             f"after an earlier one stored to {w!r}")
            covered[r] = len(stored)
        repeated = launch.count is not None and not (
            launch.count.is_const and launch.count.value <= 1)
        key = (repeated, tuple(wrote), loads)
        # (a kernel loading all it reads before storing anything stores safely over each
        # input: Launch.stores_after_loads; a repeat still reads what the last run stored)
        several = len(wrote) > 1 and not launch.stores_after_loads
        if (repeated or several) and key not in done:
            done.add(key)
            for w in wrote:
                seen = again.setdefault(w, set())
                for r in loads - seen:
                    if r != w:
                        pairs.setdefault((w, r), (
                            f"the kernel that stores to {w!r} runs again and reads {r!r}"
                            if repeated else f"the kernel that stores to {w!r} stores "
                            f"to another array too and may read {r!r} after storing {w!r}"))
                seen |= loads
        if launch.reads_elsewhere and wrote:
            for r in launch.reads_elsewhere:
                seen = elsewhere.setdefault(r, {r})
                if r in read:
                    for w in [w for w in wrote if w not in seen]:  # each pair once
                        pairs.setdefault((w, r), f"the kernel that stores to {w!r} reads "
                                                 f"{r!r} at other elements than the ones it "
                                                 f"stores")
                    seen.update(wrote)
        for w in wrote:
            if w not in stored_set:
                stored_set.add(w)
                stored.append(w)
    return pairs
