"""``_smallfile.read_regular``: what key records and key files are read through."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kernelpack._smallfile import read_regular


def test_a_regular_file_is_read_up_to_one_byte_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    assert read_regular(path, 10) == b"abcdef"
    assert read_regular(path, 3) == b"abcd"  # the caller sees that it is longer than 3
    assert read_regular(str(path), 6) == b"abcdef"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    answer: list[object] = []
    reader = threading.Thread(target=lambda: answer.append(read_regular(fifo, 10)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and answer == [None]


def test_a_directory_or_device_is_not_a_regular_file(tmp_path: Path) -> None:
    assert read_regular(tmp_path, 10) is None
    assert read_regular("/dev/zero", 10) is None  # would never end if read to its end


def test_a_missing_file_raises_and_leaks_no_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nope", 10)
    read_regular(tmp_path, 10)  # refused after the open: its descriptor is closed too
    assert len(os.listdir("/proc/self/fd")) == before
