"""Tenth review: kernelpack's own ``DeviceBuffer`` exported through DLPack to a consumer that
fails and drops the capsule unconsumed with its exception still set (NumPy's ``from_dlpack``
of device memory: "Unsupported device in DLTensor").

The capsule destructor (a ctypes callback) then ran with that exception pending; ctypes refused
to convert its first argument (``ArgumentError``), so the export was never released: the
buffer and its device memory stayed alive for the rest of the process."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest

from kernelpack.runtime import call_program, dlpack

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402

np = pytest.importorskip("numpy")


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _dropped_by_a_failing_consumer(z) -> None:
    # NumPy refuses CUDA memory after taking the capsule; whether its error arrives intact
    # (RuntimeError) or as NumPy's "returned NULL without setting an exception" (SystemError,
    # while the destructor is a Python callback) is the destructor's other half: see the module
    # docstring. Either way the export must be released.
    with pytest.raises((RuntimeError, SystemError)):
        np.from_dlpack(z)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_export_dropped_with_an_exception_set_is_released(fake) -> None:
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 1.0)
    ptr, before = z.ptr, len(dlpack._alive)
    _dropped_by_a_failing_consumer(z)
    assert len(dlpack._alive) == before
    ref = weakref.ref(z)
    del z
    gc.collect()
    assert ref() is None and ptr not in fake.memory  # freed: nothing kept it alive


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_exports_after_a_failed_one_still_work(fake) -> None:
    """The release path leaves no error behind: the next export and read are normal."""
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 1.0)
    for _ in range(3):
        _dropped_by_a_failing_consumer(z)
    before = len(dlpack._alive)
    view = dlpack.take(z, "x", 0)
    assert view.ptr == z.ptr and view.shape == (2,) and len(dlpack._alive) == before + 1
    del view
    gc.collect()
    assert len(dlpack._alive) == before
    w = call_program(axpby(), z, z, 2.0)  # and the buffer is still a good input
    assert list(np.frombuffer(w.copy_to_host(), np.float32)) == [12.0, 18.0]
