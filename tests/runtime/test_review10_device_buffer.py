"""Tenth review of kernelpack's own output array, ``DeviceBuffer``:

- ``copy.copy``, ``copy.deepcopy`` and ``pickle`` copied its slots, making a second owner of
  the same device pointer: when the copy went, the memory was freed under the original (a use
  after free on the device), and freed again when the original went. They are refused now,
  with where a copy can be had.
- ``np.asarray(buf)`` made a 0-d object array holding the buffer (so ``assert_allclose(buf,
  expected)`` failed on a correct result); it now reads the values into host memory."""

from __future__ import annotations

import copy
import gc
import pickle
import struct
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

import kernelpack as kp
from kernelpack.runtime import call_program
from kernelpack.runtime.buffer import DeviceBuffer

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    fake = install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))
    fake.frees = []
    free = fake.cuMemFree

    def recording_free(ptr):
        fake.frees.append(int(ptr))
        return free(ptr)

    fake.cuMemFree = recording_free
    return fake


COPIES = {"copy.copy": copy.copy, "copy.deepcopy": copy.deepcopy,
          "pickle": lambda b: pickle.loads(pickle.dumps(b)),
          "deepcopy of a container": lambda b: copy.deepcopy({"result": [b]})}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_copies_are_refused_and_free_nothing(fake, how) -> None:
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 2.0)
    with pytest.raises(TypeError, match=r"^a DeviceBuffer cannot be (copied|pickled).*"
                                        r"copy_to_host\(\)$"):
        COPIES[how](z)
    gc.collect()
    assert fake.frees == [] and z.ptr in fake.memory
    assert struct.unpack("<2f", z.copy_to_host()) == (5.0, 8.0)
    ptr = z.ptr
    del z
    gc.collect()
    assert fake.frees == [ptr]  # freed once, by its one owner


def test_empty_buffer_is_refused_the_same_way(fake) -> None:
    z = DeviceBuffer.empty((0, 3), kp.f32, 0)
    with pytest.raises(TypeError, match=r"cannot be copied \(copy.copy\)"):
        copy.copy(z)


def test_numpy_reads_the_values(fake) -> None:
    z = call_program(axpby(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]), 2.0)
    host = np.asarray(z)
    assert host.dtype == np.float32 and host.shape == (2,) and host.tolist() == [5.0, 8.0]
    host[0] = 0.0  # a copy of its own: writable, and the buffer keeps its values
    assert np.asarray(z).tolist() == [5.0, 8.0]
    np.testing.assert_allclose(z, [5.0, 8.0])
    assert np.asarray(z, dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize("shape, dtype, expect", [((0, 3), kp.f32, np.float32),
                                                  ((), kp.f64, np.float64),
                                                  ((2, 2), kp.c64, np.complex64),
                                                  ((3,), kp.i8, np.int8)])
def test_numpy_keeps_shape_and_dtype(fake, shape, dtype, expect) -> None:
    host = np.asarray(DeviceBuffer.empty(shape, dtype, 0))
    assert host.shape == shape and host.dtype == expect


def test_numpy_refusals_name_why(fake) -> None:
    with pytest.raises(TypeError, match=r"DeviceBuffer of bfloat16: NumPy has no bfloat16 "
                                        r"dtype; read the raw bytes with buf.copy_to_host\(\)"):
        np.asarray(DeviceBuffer.empty((2,), kp.bf16, 0))
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":  # NumPy 1 does not pass copy=
        with pytest.raises(ValueError, match=r"always a copy \(got copy=False\)"):
            np.asarray(DeviceBuffer.empty((2,), kp.f32, 0), copy=False)
