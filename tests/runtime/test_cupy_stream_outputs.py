"""CuPy calls with ``stream=`` and no ``out=`` (session 44): the outputs come from that
stream's arena of CuPy's memory pool, made while the stream is current, on the fast paths (C
and the closure) and the general path alike (``CupyAdapter.array_on``).

The stand-in CuPy of test_fastpath_fake.py gets streams as real CuPy has them: objects with
``ptr`` and ``use()`` (what ``array_on`` switches with), ``ExternalStream(handle, device)``
making one, and ``get_current_stream()`` answering the current one. Each allocation records
the stream current while it was made. No GPU: the fake driver runs the kernels on host
memory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import NDArray, cupy, select_path  # noqa: E402,F401
from test_launch_fake import _axpby_impl, axpby  # noqa: E402

from kernelpack.runtime import call_program  # noqa: E402
from kernelpack.runtime.arrays import cupy_adapter  # noqa: E402
from kernelpack.runtime.launcher import BoundProgram, bind  # noqa: E402


class Stream:
    """A CuPy stream: ``ptr``; ``use()`` makes it current (on CuPy's current device)."""

    def __init__(self, mod: Any, ptr: int) -> None:
        self.mod, self.ptr = mod, ptr

    def use(self) -> Stream:
        self.mod.current.stream = self
        return self


@pytest.fixture(params=["C", "closure"])
def launch_path(request, monkeypatch) -> str:
    return select_path(request.param, monkeypatch)


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


@pytest.fixture
def streams(cupy, monkeypatch) -> dict:
    """The stand-in CuPy with stream objects; ``made``: the stream current at each
    allocation (its ptr); ``external``: the handles ExternalStream was asked for."""
    rec: dict = {"made": [], "external": []}
    null = Stream(cupy, 0)
    cupy.current.stream = null

    def external(handle: int, device: int | None = None) -> Stream:
        rec["external"].append((handle, device))
        return Stream(cupy, handle)

    monkeypatch.setattr(cupy.cuda, "ExternalStream", external, raising=False)
    monkeypatch.setattr(cupy.cuda, "Stream", type("S", (), {"null": null}))
    monkeypatch.setattr(cupy.cuda, "get_current_stream",
                        lambda device=None: cupy.current.stream)
    empty, empty_like = cupy.empty, cupy.empty_like

    def recorded_empty(shape: tuple, dtype: Any) -> NDArray:
        rec["made"].append(cupy.current.stream.ptr)
        if rec.get("fail"):
            raise MemoryError("out of memory allocating 8 bytes")
        return empty(shape, dtype)

    monkeypatch.setattr(cupy, "empty", recorded_empty)
    monkeypatch.setattr(cupy, "empty_like", lambda a: rec["made"].append(
        cupy.current.stream.ptr) or empty_like(a))
    rec["null"] = null
    return rec


@pytest.fixture
def general(monkeypatch) -> list:
    """The general path's calls (a call the fast path launched itself adds nothing)."""
    calls: list = []
    original = BoundProgram._call

    def counting(self: Any, args: Any, out: Any, stream: Any) -> Any:
        calls.append(stream)
        return original(self, args, out, stream)

    monkeypatch.setattr(BoundProgram, "_call", counting)
    return calls


def _launch_streams(fake: FakeDriver) -> list:
    return [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"]


def _warm(prog: Any, *args: Any) -> None:
    for _ in range(2):  # the general path binds; the second call builds the fast path
        call_program(prog, *args)


def test_outputs_for_a_stream_come_from_its_arena_on_the_fast_path(
        fake, cupy, streams, general, launch_path) -> None:
    """The output is made while stream= is current, the kernel launched there, CuPy's
    current stream put back, and no call reaches the general path; CuPy's object for the
    handle is made once and remembered."""
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    _warm(prog, x, y, 2.0)
    before, streams["made"][:] = len(general), []
    for _ in range(3):
        z = call_program(prog, x, y, 2.0, stream=0x70)
        assert isinstance(z, NDArray) and z.values() == [12.0, 24.0]
    assert streams["made"] == [0x70] * 3 and _launch_streams(fake)[-3:] == [0x70] * 3
    assert cupy.current.stream is streams["null"] and len(general) == before
    assert streams["external"] == [(0x70, 0)] * 3
    fast = getattr(bind(prog).call, "__self__", None)
    if launch_path == "C":
        assert fast.fast_calls == 4  # the second warm-up call and these three


def test_a_cupy_stream_object_and_the_current_stream(fake, cupy, streams, general,
                                                     launch_path) -> None:
    """stream= a CuPy stream object: its handle's arena. stream= the current stream: no
    switch at all. Handle 0: CuPy's own null stream object, not an external one."""
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    _warm(prog, x, y, 1.0)
    before, streams["made"][:] = len(general), []
    side = Stream(cupy, 0x71)
    assert call_program(prog, x, y, 1.0, stream=side).values() == [11.0, 22.0]
    current = Stream(cupy, 0x72).use()
    assert call_program(prog, x, y, 1.0, stream=0x72).values() == [11.0, 22.0]
    assert cupy.current.stream is current  # (the same stream: nothing switched)
    assert call_program(prog, x, y, 1.0, stream=0).values() == [11.0, 22.0]
    assert streams["made"] == [0x71, 0x72, 0]
    assert streams["external"] == [(0x71, 0)] and cupy.current.stream is current
    assert _launch_streams(fake)[-3:] == [0x71, 0x72, 0] and len(general) == before


def test_a_failed_allocation_puts_the_current_stream_back(fake, cupy, streams,
                                                         launch_path) -> None:
    """An allocation that raises (CuPy's OutOfMemoryError) propagates and leaves CuPy's
    current stream as it was; nothing is launched."""
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    _warm(prog, x, y, 1.0)
    launched = len(_launch_streams(fake))
    streams["fail"] = True
    with pytest.raises(MemoryError, match="out of memory"):
        call_program(prog, x, y, 1.0, stream=0x73)
    assert cupy.current.stream is streams["null"] and len(_launch_streams(fake)) == launched


def test_the_general_path_allocates_the_same_way(fake, cupy, streams) -> None:
    """CupyAdapter.empty (the general path's outputs) goes through array_on: a first call
    with stream= (the general path's) makes its output on that stream."""
    prog = axpby()
    x, y = NDArray([1.0, 2.0]), NDArray([10.0, 20.0])
    z = call_program(prog, x, y, 1.0, stream=0x74)
    assert z.values() == [11.0, 22.0] and streams["made"] == [0x74]
    assert cupy.current.stream is streams["null"] and _launch_streams(fake) == [0x74]


def test_array_on_another_device_enters_it(cupy, streams, monkeypatch) -> None:
    """Off CuPy's current device, array_on enters that device and the stream as context
    managers (use() would set the stream of the current device); a CuPy whose streams lack
    use() takes the same way on the current device."""
    entered: list = []

    class Scoped(Stream):
        def __enter__(self) -> Scoped:
            entered.append(self.ptr)
            self.before, self.mod.current.stream = self.mod.current.stream, self
            return self

        def __exit__(self, *exc: Any) -> None:
            self.mod.current.stream = self.before

    monkeypatch.setattr(cupy.cuda, "ExternalStream", lambda h, d=None: Scoped(cupy, h))
    adapter = cupy_adapter(cupy)
    a = adapter.array_on((2,), "float32", 1, 0x75)
    assert isinstance(a, NDArray) and streams["made"] == [0x75] and entered == [0x75]
    assert cupy.current.device == 0 and cupy.current.stream is streams["null"]
    monkeypatch.setattr(Stream, "use", property(lambda s: None))  # no use(): context managers
    adapter.array_on((2,), "float32", 0, 0x76)
    assert streams["made"] == [0x75, 0x76] and entered == [0x75, 0x76]
