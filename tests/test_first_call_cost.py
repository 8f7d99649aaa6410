"""What the first-call savings must not change: an uncompressed image is hashed once but still
checked, the parameter block lives at the address handed to the driver, and the driver version
is asked once per driver module (a different driver is asked again)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.compiled import Compiled, Image, Module
from kernelpack.errors import IntegrityError
from kernelpack.summary import Arg, KernelSummary, Launch, Variant

sys.path.insert(0, str(Path(__file__).parent / "runtime"))
from fake_driver import FakeDriver, install  # noqa: E402


def _raw_pack(data: bytes) -> bytearray:
    """An artifact whose one image is stored uncompressed (random bytes do not compress)."""
    summary = KernelSummary("p", (kp.Tensor("x", kp.f32, ("n",)),),
                            (Variant((Launch("k", "m", (1,), (1,), (Arg.buffer("x"),)),)),))
    image = Image("cubin", "sm_90", data, "test", 13000)
    return bytearray(kp.save(Compiled(summary, (Module("m", ("k",), (image,)),))))


def test_uncompressed_image_is_hashed_once_and_still_checked(monkeypatch) -> None:
    data = os.urandom(512)
    info = kp.load(bytes(_raw_pack(data))).modules["m"].images[0]
    assert info.codec == "none" and info.digest == info.raw_digest
    calls = []
    real = hashlib.sha256
    monkeypatch.setattr("kernelpack._images.hashlib.sha256",
                        lambda b: calls.append(len(b)) or real(b))
    assert info.read() == data and calls == [512]
    assert info.read() == data and calls == [512]  # cached


@pytest.mark.parametrize("checked_first", [False, True])
def test_uncompressed_image_changed_under_the_reader_is_refused(checked_first: bool) -> None:
    """The bytes handed out are the bytes hashed: a buffer changed after load (a memory-mapped
    file rewritten; here a read-only view of a bytearray, which kp.load does not copy) fails
    with the message of the failing check."""
    data = os.urandom(512)
    buf = _raw_pack(data)
    info = kp.load(memoryview(buf).toreadonly()).modules["m"].images[0]
    if checked_first:
        info.check_stored()
    at = bytes(buf).index(data)
    buf[at + 100] ^= 0xFF
    want = "decompressed bytes do not match raw_digest" if checked_first else \
        "stored bytes do not match their digest"
    with pytest.raises(IntegrityError, match=want):
        info.read()


def test_parameter_block_is_written_where_the_driver_reads() -> None:
    from kernelpack.runtime.binding import LaunchSpec

    ls = LaunchSpec("m", "k", 0, [(0, 0), (1, 0), (1, 1)], ["Q", "f", "I"])
    ls.make_block()
    ls.layout.pack_into(ls.param_mem, 0, 0x1234, 2.5, 7)
    assert ctypes.addressof(ls.param_buf) == ctypes.addressof(
        ctypes.c_char.from_buffer(ls.param_mem))
    slots = (ctypes.c_void_p * 3).from_address(ls.params_addr)
    got = [struct.unpack(c, ctypes.string_at(a, struct.calcsize(c)))[0]
           for a, c in zip(slots, "QfI")]
    assert got == [0x1234, 2.5, 7]
    with pytest.raises(BufferError):  # exported: never resized (moved) under the driver
        ls.param_mem.append(0)


def test_driver_version_is_asked_once_per_driver(monkeypatch) -> None:
    from kernelpack.runtime import driver

    class Counting(FakeDriver):
        asked = 0

        def cuDriverGetVersion(self) -> tuple:
            Counting.asked += 1
            return super().cuDriverGetVersion()

    install(monkeypatch, Counting(version=12040))
    assert driver.driver_version() == 12040 and driver.driver_version() == 12040
    assert Counting.asked == 1
    install(monkeypatch, Counting(version=13000))  # another driver: asked again
    assert driver.driver_version() == 13000 and Counting.asked == 2
