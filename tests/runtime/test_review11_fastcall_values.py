"""Eleventh review of the C fast path (``_launch.FastCall``): what the call reads from Python
that is not what it expects. An entry with more launches than the call's stack array holds is
refused; ``get_device()`` / ``data_ptr()`` answers that are not ints of their range (-2 was
the old error sentinel: a SystemError) take the general path, as the closure sends them there;
scalar subclasses are never converted here; nesting (a callback calling again) is bounded, so
that unbounded nesting raises RecursionError instead of overflowing the C stack. The stand-in
driver and the FastCall are test_review11_fastcall_reentry's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_review11_fastcall_reentry import (FUNC, Hooks, State, Tensor, driver,  # noqa: E402,F401
                                            fast_call)

__all__ = ["driver"]  # the fixture, imported for these tests


def test_an_entry_with_more_launches_than_the_limit_is_refused(driver) -> None:
    """launch_all copies each launch's function handle into a 64-slot array on its stack."""
    x = Tensor(2)
    fc = fast_call(Hooks(launches=64), {0: State()})
    fc.call((x, 1.0), None, None)
    assert len(driver.launches) == 64
    fc = fast_call(Hooks(launches=65), {0: State()})
    with pytest.raises(ValueError, match=r"answered 65 launches \(at most 64\)"):
        fc.call((x, 1.0), None, None)
    assert len(driver.launches) == 64 and fc.entries == 0


class Weird(Tensor):
    """get_device() and data_ptr() answer what ``answers`` says."""

    def __init__(self, n: int, answers: dict | None = None) -> None:
        super().__init__(n)
        self.answers = answers or {}

    def get_device(self) -> Any:
        return self.answers.get("device", 0)

    def data_ptr(self) -> Any:
        return self.answers.get("ptr", super().data_ptr())


class BigInt(int):
    def __index__(self) -> int:  # never asked: the int's own value is read
        raise AssertionError("__index__ called")


@pytest.mark.parametrize("answers", [
    {"device": -2},            # the old error sentinel: a SystemError (no exception set)
    {"device": 1 << 70},       # beyond a C long
    {"device": 0.0},           # not an int
    {"ptr": -1},               # negative
    {"ptr": 1 << 64},          # beyond 64 bits
    {"ptr": 12.0},             # not an int
    {"ptr": "0x10"},
])
def test_device_and_pointer_answers_that_do_not_fit_take_the_general_path(driver,
                                                                           answers) -> None:
    """Like the closure (whose struct packing refuses them), the general path answers and
    explains; the C path raised OverflowError/TypeError, or SystemError for -2."""
    hooks = Hooks()
    fc = fast_call(hooks, {0: State()}, tensor_type=Weird)
    assert fc.call((Weird(3, answers), 1.0), None, None) == "slow"
    assert fc.call((Weird(3), 1.0), Weird(3, answers), None) == "slow"  # as out=
    out = Weird(3)
    assert fc.call((Weird(3), 1.0), out, None) is out  # the same call with plain answers
    assert len(hooks.slow_calls) == 2 and len(driver.launches) == 1 and fc.fast_calls == 1


def test_int_subclasses_are_read_as_ints(driver) -> None:
    hooks = Hooks()
    fc = fast_call(hooks, {BigInt(0): State()}, tensor_type=Weird)
    x = Weird(3)
    x.answers = {"device": BigInt(0), "ptr": BigInt(x.data_ptr())}
    z = fc.call((x, 1.0), None, None)
    assert driver.launches == [(FUNC, 3, 0, (x.data_ptr(), z.data_ptr(), 1.0))]


def test_an_allocated_output_without_a_pointer_is_named(driver) -> None:
    fc = fast_call(Hooks(), {0: State()}, tensor_type=Weird,
                   empty_like=lambda t: Weird(t.n, {"ptr": -5}))
    with pytest.raises(TypeError, match=r"allocated output's data_ptr\(\) is not an int"):
        fc.call((Weird(3), 1.0), None, None)
    assert not driver.launches


class Recursing(Tensor):
    """data_ptr() calls the program again with this tensor (``call`` set by the test)."""

    call: Callable[[Any], Any] | None = None
    depth = 0

    def data_ptr(self) -> Any:
        Recursing.depth += 1
        try:
            if Recursing.call is not None:
                Recursing.call(self)
            return super().data_ptr()
        finally:
            Recursing.depth -= 1


def test_unbounded_nesting_raises_recursion_error_instead_of_overflowing_the_stack(
        driver) -> None:
    """hooks.entry calling again with another shape, without end: each nested FastCall call
    kept about 11 KB of C stack, and nesting up to Python's recursion limit overflowed the C
    stack (a segfault). Past 32 levels the general path takes the call (Python frames only),
    where the recursion limit applies."""
    hooks = Hooks()
    reached: list[int] = []

    def slow(args, out, stream):
        reached.append(args[0].n)
        return fc.call(args, out, stream)  # the general path calling again: unbounded

    hooks.slow = slow
    hooks.entry = lambda key: fc.call((Tensor(key[0][0] + 1), 1.0), None, None)
    fc = fast_call(hooks, {0: State()})
    with pytest.raises(RecursionError):
        fc.call((Tensor(1), 1.0), None, None)
    assert reached[0] == 33  # the 33rd nested call went to the general path
    assert not driver.launches and fc.entries == 0


def test_nesting_within_the_limit_stays_on_the_fast_path(driver) -> None:
    hooks = Hooks()
    fc = fast_call(hooks, {0: State()}, tensor_type=Recursing)
    left = [20]

    def again(t: Recursing) -> None:
        if left[0]:
            left[0] -= 1
            fc.call((t, 1.0), None, None)

    Recursing.call = again
    try:
        fc.call((Recursing(2), 1.0), None, None)
    finally:
        Recursing.call = None
    assert not hooks.slow_calls and fc.fast_calls == 21 == len(driver.launches)
