"""Review 4: an ``inout`` tensor is written by the kernels, so a read-only array (its
``__cuda_array_interface__`` says ``data[1] = True``) cannot be one; before, only ``out=``
arrays were checked and axpy wrote into the read-only ``y``."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program

sys.path.insert(0, str(Path(__file__).parent.parent))
from kp_samples import axpy  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpy_impl  # noqa: E402


class _CAI:
    """A bare ``__cuda_array_interface__`` over a host array's memory (the fake's device)."""

    def __init__(self, arr: HostArray, readonly: bool) -> None:
        self.__cuda_array_interface__ = {"shape": (len(arr.values()),), "typestr": "<f4",
                                         "data": (ctypes.addressof(arr.buf), readonly),
                                         "strides": None, "version": 3}


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl)}))


def test_read_only_inout_tensor_is_refused_before_launch(fake) -> None:
    x, y = HostArray([1.0, 2.0]), HostArray([10.0, 20.0])
    with pytest.raises(LaunchError, match=r"argument 'y' is read-only .*role 'inout'"):
        call_program(axpy(), _CAI(x, False), _CAI(y, True), 2.0)
    assert y.values() == [10.0, 20.0]
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def test_read_only_pure_input_and_writable_inout_still_launch(fake) -> None:
    x, y = HostArray([1.0, 2.0]), HostArray([10.0, 20.0])
    assert call_program(axpy(), _CAI(x, True), _CAI(y, False), 2.0) is None
    assert y.values() == [12.0, 24.0]
