"""The launch entry point (``runtime/native.py``) and the C extension behind it, on CPU.

The fake driver hands out a real C entry point for ``cuLaunchKernel`` (a ctypes callback), so
these tests run kernelpack's C extension end to end: what it forwards to the "driver", what it
refuses before calling it, and when the runtime falls back to cuda.bindings' launch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program, native

sys.path.insert(0, str(Path(__file__).parent.parent))
from kp_samples import axpy  # noqa: E402

from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpy_impl  # noqa: E402

_launch = pytest.importorskip("kernelpack.runtime._launch",
                              reason="the C extension was not built (no C compiler?)")

KERNELS = {"axpy": ("QQfI", _axpy_impl)}


def _run_axpy(fake: FakeDriver) -> None:
    x, y = HostArray([1.0, 2.0, 3.0]), HostArray([10.0, 20.0, 30.0])
    call_program(axpy(), x, y, 2.0)
    assert y.values() == [12.0, 24.0, 36.0]
    assert not fake.callback_errors


def test_launches_go_through_the_c_extension(monkeypatch) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    _run_axpy(fake)
    chosen = native.launcher()
    assert chosen.native and chosen.reason == "C extension"
    entry = [c for c in fake.calls if c[0] == "c entry"]
    launch = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(entry) == len(launch) == 1
    # the function handle arrives as the kernel's handle, the legacy default stream as NULL
    assert entry[0][1] == hash("axpy") & 0xFFFFFF and entry[0][2:] == (0, 0)
    assert launch[0][2:5] == ((1, 1, 1), (256, 1, 1), 0) and launch[0][6][2:] == (2.0, 3)


def test_asks_for_the_legacy_stream_flavour_by_default(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    native.launcher()
    asked = [c for c in fake.calls if c[0] == "cuGetProcAddress"]
    assert asked == [("cuGetProcAddress", b"cuLaunchKernel", 13000, 1)]


def test_follows_cuda_bindings_per_thread_default_stream_switch(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    native.launcher()
    assert [c[3] for c in fake.calls if c[0] == "cuGetProcAddress"] == [2]


def test_falls_back_when_the_driver_gives_no_entry_point(monkeypatch) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS, native=False))
    _run_axpy(fake)
    chosen = native.launcher()
    assert not chosen.native and "no cuLaunchKernel entry point" in chosen.reason
    assert not [c for c in fake.calls if c[0] == "c entry"]
    assert len([c for c in fake.calls if c[0] == "cuLaunchKernel"]) == 1


def test_environment_turns_the_extension_off(monkeypatch) -> None:
    monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "0")
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    _run_axpy(fake)
    chosen = native.launcher()
    assert not chosen.native and "KERNELPACK_NATIVE_LAUNCH" in chosen.reason
    assert not [c for c in fake.calls if c[0] in ("c entry", "cuGetProcAddress")]


def test_falls_back_when_the_extension_is_missing(monkeypatch) -> None:
    import kernelpack.runtime

    monkeypatch.setitem(sys.modules, "kernelpack.runtime._launch", None)  # import fails
    monkeypatch.delattr(kernelpack.runtime, "_launch", raising=False)
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    _run_axpy(fake)
    assert "not built" in native.launcher().reason


def test_driver_failure_from_the_c_path_is_a_named_launch_error(monkeypatch) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    fake.launch_error = 1
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        call_program(axpy(), HostArray([1.0]), HostArray([2.0]), 2.0)
    assert [c for c in fake.calls if c[0] == "c entry"]


@pytest.mark.parametrize("args, error, message", [
    ((1, 1, 1, 1, 1, 1, 1, 0, 0, 0), TypeError, "takes 11 arguments"),
    ((1, 2 ** 32, 1, 1, 1, 1, 1, 0, 0, 0, 0), OverflowError, "grid x"),
    ((1, 1, 1, 1, -1, 1, 1, 0, 0, 0, 0), OverflowError, "block x"),
    ((1, 1, 1, 1, 1, 1, 1, 2 ** 40, 0, 0, 0), OverflowError, "shared_mem"),
    ((1, 1, 1, 1, 1, 1, 1, 0, -5, 0, 0), OverflowError, "stream"),
    ((1, 1, 1, 1, 1, 1, 1, 0, 0, 2 ** 64, 0), OverflowError, "kernel_params"),
    ((1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 8), ValueError, "extra must be 0"),
    ((0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0), ValueError, "function handle"),
    (("f", 1, 1, 1, 1, 1, 1, 0, 0, 0, 0), OverflowError, "function"),
    ((1, 1.5, 1, 1, 1, 1, 1, 0, 0, 0, 0), OverflowError, "grid x"),
])
def test_c_launch_refuses_bad_arguments_before_calling_the_driver(monkeypatch, args, error,
                                                                  message) -> None:
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    assert native.launcher().native  # binds the extension to the fake's entry point
    with pytest.raises(error, match=message):
        _launch.launch(*args)
    assert not [c for c in fake.calls if c[0] == "c entry"]


def test_c_launch_answers_like_cuda_bindings(monkeypatch) -> None:
    """A 1-tuple holding the CUresult as an int (callers unpack ``err, = launch(...)``)."""
    fake = install(monkeypatch, FakeDriver(kernels=KERNELS))
    fake.launch_error = 700
    native.launcher()
    assert _launch.launch(7, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0) == (700,)
    assert fake.calls[-1] == ("c entry", 7, 0, 0)


def test_bind_refuses_a_null_entry_point() -> None:
    with pytest.raises(ValueError, match="must not be 0"):
        _launch.bind(0)
    with pytest.raises(OverflowError):
        _launch.bind(-1)
