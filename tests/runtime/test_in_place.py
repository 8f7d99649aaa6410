"""``in_place.refused_pairs`` looks at each (written, read) pair once per rule (session 38):
the launch-by-launch loop it replaces took ~24 s for a variant of 4096 launches of 128 outputs
and 128 inputs each, which a file may hold. Here the new function gives exactly the loop's
pairs and reasons (the loop is kept below as the reference) over random variants, and works
out the largest variant the limits allow."""

from __future__ import annotations

import random
from typing import Any, Iterable

import pytest

import kernelpack as kp
from kernelpack.expr import const
from kernelpack.runtime.in_place import refused_pairs
from kernelpack.summary import Arg, Launch


def _loop_reference(launches: Iterable[Any], written: dict[str, int], read: dict[str, int]
                    ) -> dict[tuple[str, str], str]:
    """The rule as session 37 wrote it, every launch's pairs with the first reason kept, and
    format 1.1's: ``stores_after_loads`` lifts the rule of a launch storing several arrays,
    and a launch storing ``w`` that lists ``r`` in ``reads_elsewhere`` refuses ``(w, r)``."""
    pairs: dict[tuple[str, str], str] = {}
    for w, wsize in written.items():
        for r, rsize in read.items():
            if r != w and wsize != rsize:
                pairs[(w, r)] = (f"{w!r} has {wsize}-byte elements and {r!r} {rsize}-byte "
                                 f"ones, so a store to one lands on elements of the other "
                                 f"that other threads still read")
    before: set[str] = set()
    for launch in launches:
        names = {a.name for a in launch.args if a.kind == "buffer"}
        wrote = {n for n in names if n in written}
        loads = [r for r in names if r in read]
        for w in before:
            for r in loads:
                if r != w:
                    pairs.setdefault((w, r), f"a later kernel of the program reads {r!r} "
                                             f"after an earlier one stored to {w!r}")
        repeated = launch.count is not None and not (
            launch.count.is_const and launch.count.value <= 1)
        if repeated or (len(wrote) > 1 and not launch.stores_after_loads):
            for w in wrote:
                for r in loads:
                    if r != w:
                        pairs.setdefault((w, r), (
                            f"the kernel that stores to {w!r} runs again and reads {r!r}"
                            if repeated else f"the kernel that stores to {w!r} stores "
                            f"to another array too and may read {r!r} after storing {w!r}"))
        for w in wrote:
            for r in launch.reads_elsewhere:
                if r in read and r != w:
                    pairs.setdefault((w, r), f"the kernel that stores to {w!r} reads {r!r} "
                                             f"at other elements than the ones it stores")
        before |= wrote
    return pairs


def _random_variant(rng: random.Random) -> tuple[list[Launch], dict[str, int], dict[str, int]]:
    outs = [f"o{i}" for i in range(rng.randint(0, 4))]
    ins = [f"i{i}" for i in range(rng.randint(0, 4))]
    inouts = [f"u{i}" for i in range(rng.randint(0, 2))]
    size = {n: rng.choice((2, 4, 4, 4, 8)) for n in outs + ins + inouts}
    written = {n: size[n] for n in outs + inouts}
    read = {n: size[n] for n in ins + inouts}
    names = outs + ins + inouts + ["ws"]  # a workspace: neither written nor read here
    launches = []
    for j in range(rng.randint(0, 7)):
        args = tuple(Arg.buffer(n) for n in names if rng.random() < 0.45)
        count = rng.choice((None, None, None, const(1), const(0), const(3), kp.sym("c")))
        launches.append(Launch(f"k{j}", "m", (1,), (32,), args, count=count))
    return launches, written, read


def test_the_pairs_and_reasons_are_the_launch_by_launch_loops() -> None:
    rng = random.Random(38)
    refused = 0
    for _ in range(3000):
        launches, written, read = _random_variant(rng)
        want = _loop_reference(launches, written, read)
        got = refused_pairs(launches, written, read)
        assert got == want, (launches, written, read)
        refused += len(got)
    assert refused > 3000  # the cases refuse something, by every rule


def _random_variant_1_1(rng: random.Random, sizes: tuple[int, ...]
                        ) -> tuple[list[Launch], dict[str, int], dict[str, int]]:
    """Outputs, inputs, inout arrays and a workspace in launches of random buffers; each
    launch lists a random part of its buffers (inputs, inouts, outputs, the workspace) in
    ``reads_elsewhere``, in a random order, and half of them say ``stores_after_loads``
    (review 57)."""
    outs = [f"o{i}" for i in range(rng.randint(0, 3))]
    ins = [f"i{i}" for i in range(rng.randint(0, 3))]
    inouts = [f"u{i}" for i in range(rng.randint(0, 2))]
    size = {n: rng.choice(sizes) for n in outs + ins + inouts}
    written = {n: size[n] for n in outs + inouts}
    read = {n: size[n] for n in ins + inouts}
    names = outs + ins + inouts + ["ws"]
    launches = []
    for j in range(rng.randint(1, 6)):
        args = [n for n in names if rng.random() < 0.5]
        elsewhere = [n for n in args if rng.random() < 0.5]
        rng.shuffle(elsewhere)
        count = rng.choice((None, None, None, None, const(1), const(3)))
        launches.append(Launch(f"k{j}", "m", (1,), (32,), tuple(Arg.buffer(n) for n in args),
                               count=count, reads_elsewhere=elsewhere,
                               stores_after_loads=rng.random() < 0.5))
    return launches, written, read


@pytest.mark.parametrize("sizes", [(4,), (2, 4, 4, 8)], ids=["one-size", "sizes"])
def test_the_fourth_rule_is_the_launch_by_launch_loops(sizes: tuple[int, ...]) -> None:
    """Format 1.1's fields over random variants whose launches list inputs, inout arrays,
    outputs and workspaces as read elsewhere, one element size everywhere (only the launch
    rules refuse) or several: the loop's pairs and reasons. Review 57: kills R2 and R4 (an
    inout array listed as read elsewhere by a launch storing it paired with itself), R3 (an
    output or a workspace listed: a pair with a name that is not an input), R6 (the rule's
    reason over an earlier rule's), R8 and R9 (only the first name listed or only the first
    array stored)."""
    rng = random.Random(57)
    seen = 0
    for _ in range(400):
        launches, written, read = _random_variant_1_1(rng, sizes)
        got = refused_pairs(launches, written, read)
        assert got == _loop_reference(launches, written, read), launches
        seen += sum("other elements" in why for why in got.values())
    assert seen > 10  # the fourth rule's own reason, first for many pairs


@pytest.mark.parametrize("repeated", [True, False])
def test_the_largest_variant_the_limits_allow(repeated: bool) -> None:
    """About 0.2 s on the 2-core box (the loop it replaced: ~24 s); speed is not asserted."""
    ins, outs = [f"i{k}" for k in range(128)], [f"o{k}" for k in range(128)]
    args = tuple(Arg.buffer(n) for n in ins + outs)
    launches = [Launch(f"k{j}", "m", (1,), (32,), args, count=kp.sym("c") if repeated else None)
                for j in range(4096)]
    pairs = refused_pairs(launches, dict.fromkeys(outs, 4), dict.fromkeys(ins, 4))
    assert len(pairs) == 128 * 128
    why = pairs[("o0", "i0")]
    assert why == ("the kernel that stores to 'o0' runs again and reads 'i0'" if repeated
                   else "the kernel that stores to 'o0' stores to another array too and may "
                        "read 'i0' after storing 'o0'")
