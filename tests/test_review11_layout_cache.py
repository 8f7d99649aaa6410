"""The verifier's vtable-layout cache keeps only the bytes a layout depends on (review 11).

A vtable may claim up to 64 KiB; keyed by all of it, a hostile file of thousands of tables,
each with its own overlapping 64 KiB vtable window, left ~250 MiB in the cache for the life
of the process (every file the C walker rejects is walked again in Python)."""

from __future__ import annotations

import struct

import pytest

from kernelpack import verify
from kernelpack.errors import FormatError


def _hostile_body(tables: int, vt_size: int = 0xFFF0) -> bytes:
    """A Body whose ``programs`` are ``tables`` empty Program tables, each with its own vtable
    (claiming ``vt_size`` bytes, overlapping the next ones); the last table is invalid."""
    buf = bytearray(struct.pack("<I", 0))
    body_vt = len(buf)
    buf += struct.pack("<HHHHH", 10, 8, 0, 4, 0) + bytes(2)
    body = len(buf)
    buf += struct.pack("<iI", body - body_vt, 0)
    struct.pack_into("<I", buf, 0, body)
    vec = len(buf)
    struct.pack_into("<I", buf, body + 4, vec - (body + 4))
    buf += struct.pack("<I", tables) + bytes(4 * tables)
    positions = []
    for i in range(tables):
        positions.append(len(buf))
        buf += bytes(4)
        struct.pack_into("<I", buf, vec + 4 + 4 * i, positions[i] - (vec + 4 + 4 * i))
    region = len(buf)
    for i in range(tables):
        vt = region + 20 * i
        struct.pack_into("<i", buf, positions[i], positions[i] - vt)
        buf += struct.pack("<HH7HH", vt_size, 4, *([0] * 7), i)  # junk past the plan's slots
    buf += bytes(vt_size)
    struct.pack_into("<H", buf, region + 20 * (tables - 1) + 2, 2)  # table size 2: invalid
    return bytes(buf)


def test_layout_cache_keys_hold_only_the_slots_a_layout_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "_LAYOUTS", {})
    data = _hostile_body(300)
    with pytest.raises(FormatError, match=r"programs\[299\]: table at \d+ has size 2"):
        verify.verify_buffer(data, "Body", identifier=None, _use_c=False)
    held = sum(len(key[1]) for key in verify._LAYOUTS)
    assert held <= 64 * len(verify._LAYOUTS) and held < 4096, held


def test_vtables_that_differ_only_past_the_plan_share_a_layout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "_LAYOUTS", {})
    data = _hostile_body(50)
    with pytest.raises(FormatError):
        verify.verify_buffer(data, "Body", identifier=None, _use_c=False)
    # 49 valid Program vtables that differ only in their junk slot, the invalid one, the Body's
    assert len(verify._LAYOUTS) <= 3
