"""Eleventh review of the C fast path (``_launch.FastCall``): every error path leaves the
reference counts it found (a callback raising at each point of a call, a failed launch), and
threads calling one FastCall while another evicts its entries launch each call's own values
(the GIL is released around the driver call, where the stand-in driver runs Python)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_review11_fastcall_reentry import (F32, Hooks, State, Tensor, _launch,  # noqa: E402
                                            driver, fast_call)

__all__ = ["driver"]  # the fixture, imported for these tests


class Raising(Tensor):
    """A tensor whose ``fail`` attribute or method raises (set per instance)."""

    def __init__(self, n: int, fail: str = "") -> None:
        super().__init__(n)
        self.fail = fail

    def _check(self, name: str) -> None:
        if self.fail == name:
            raise KeyError(name)

    @property
    def shape(self) -> tuple:
        self._check("shape")
        return (self.n,)

    def data_ptr(self) -> Any:
        self._check("data_ptr")
        return super().data_ptr()

    def get_device(self) -> Any:
        self._check("get_device")
        return 0

    def is_contiguous(self) -> bool:
        self._check("is_contiguous")
        return True


class FailingHooks(Hooks):
    fail = ""

    def entry(self, key: tuple) -> tuple:
        if self.fail == "entry":
            raise KeyError("entry")
        return super().entry(key)

    def stream_handle(self, stream, device) -> int:
        if self.fail == "stream_handle":
            raise KeyError("stream_handle")
        return super().stream_handle(stream, device)

    def context_was_lost(self, st) -> bool:
        if self.fail == "context_was_lost":
            raise KeyError("context_was_lost")
        return super().context_was_lost(st)


@pytest.mark.parametrize("fail", ["shape", "data_ptr", "get_device", "is_contiguous",
                                  "out shape", "out data_ptr", "empty_like", "entry",
                                  "stream_handle", "context_was_lost", "launch"])
def test_every_error_path_leaves_the_references_it_found(driver, fail) -> None:
    hooks = FailingHooks()
    state, armed = State(), []
    states = {0: state}

    def empty_like(t: Any) -> Raising:
        if armed and fail == "empty_like":
            raise KeyError("empty_like")
        return Raising(t.n)

    fc = fast_call(hooks, states, tensor_type=Raising, empty_like=empty_like)
    x, out, a, stream = Raising(3), Raising(3), 1.25, int("70001")  # not a cached small int
    fc.call((x, a), None, None)  # the entry exists (an entry that raises is asked per call)
    armed.append(True)
    if fail.startswith("out "):
        out.fail = fail[4:]
    elif fail == "launch":
        driver.error = 700
    elif fail in ("entry", "stream_handle", "context_was_lost"):
        hooks.fail = fail
        fc = fast_call(hooks, states, tensor_type=Raising, empty_like=empty_like)
    elif fail != "empty_like":
        x.fail = fail
    watched = (x, out, a, stream, state, states, hooks, F32, fc)
    done = fc.fast_calls

    # An array whose data_ptr() or is_contiguous() raises is handed to the general path,
    # which meets the error again and names the argument (review 28: a sparse torch tensor
    # gave torch's bare "Cannot access data pointer" from here).
    handed_over = fail in ("data_ptr", "is_contiguous", "out data_ptr")

    def call() -> None:
        if fail == "context_was_lost":
            _launch.forget_contexts()  # asked again on the next default-stream launch
        args = ((x, a), out if fail.startswith("out ") or fail == "stream_handle" else None,
                stream if fail == "stream_handle" else None)
        if handed_over:
            assert fc.call(*args) == "slow"
            assert hooks.slow_calls == [(x, a)]
            hooks.slow_calls.clear()  # (it holds the arguments: the counts below would grow)
            return
        with pytest.raises((KeyError, RuntimeError), match=fail.split()[-1] + "|launch failed"):
            fc.call(*args)

    for _ in range(20):
        call()
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(500):
        call()
    assert [sys.getrefcount(o) for o in watched] == before
    assert fc.fast_calls == done  # none completed
    assert not hooks.slow_calls


def test_threads_launch_their_own_values_while_entries_are_evicted(driver) -> None:
    hooks = Hooks()
    fc = fast_call(hooks, {0: State()})
    errors: list = []
    results: dict[int, list] = {}

    def worker(k: int) -> None:
        try:
            x, a = Tensor(k + 1), float(k)
            got = results[k] = []
            for i in range(150):
                got.append((x.data_ptr(), fc.call((x, a), None, None).data_ptr(), a))
                if k == 0:  # keeps evicting the others' entries
                    for n in range(50 + 40 * i, 90 + 40 * i):
                        fc.call((Tensor(n), -1.0), None, None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors
    launched = {launch[3] for launch in driver.launches}
    for k, got in results.items():
        assert len(got) == 150 and all(values in launched for values in got)
    assert fc.fast_calls == len(driver.launches) == 3 * 150 + 150 * 40
