"""The CuPy adapter's stream object for a raw handle (runtime/arrays.py ``_cupy_stream``):
``Stream.from_external`` with a CUDA-stream-protocol object where CuPy has it (CuPy 14
deprecates ``ExternalStream`` and warns at every use), ``ExternalStream`` on older CuPy.
Stand-in cupy modules here; tests/runtime/test_gpu_fast_scratch.py runs the real one."""

from __future__ import annotations

import types

from kernelpack.runtime.arrays import _cupy_stream


def _cupy(with_from_external: bool) -> tuple[types.SimpleNamespace, list]:
    calls: list = []

    class Stream:
        null = "null stream"

    if with_from_external:
        Stream.from_external = classmethod(  # type: ignore[attr-defined]
            lambda cls, obj: calls.append(("from_external", obj.__cuda_stream__())) or "wrapped")
    cuda = types.SimpleNamespace(
        Stream=Stream,
        ExternalStream=lambda handle, device: calls.append(("ExternalStream", handle, device))
        or "external")
    return types.SimpleNamespace(cuda=cuda), calls


def test_from_external_is_used_where_cupy_has_it() -> None:
    cp, calls = _cupy(True)
    assert _cupy_stream(cp, 0x5000, 1) == "wrapped"
    assert calls == [("from_external", (0, 0x5000))]  # protocol version 0, the handle


def test_external_stream_on_a_cupy_without_from_external() -> None:
    cp, calls = _cupy(False)
    assert _cupy_stream(cp, 0x5000, 1) == "external"
    assert calls == [("ExternalStream", 0x5000, 1)]
    cp.cuda.Stream = None  # a stand-in without Stream at all: still ExternalStream
    assert _cupy_stream(cp, 0x77, 0) == "external"


def test_the_legacy_default_stream_is_cupys_null_stream() -> None:
    for with_from_external in (True, False):
        cp, calls = _cupy(with_from_external)
        assert _cupy_stream(cp, 0, 1) == "null stream"
        assert calls == []  # neither wrapper: Stream.null already is that stream
