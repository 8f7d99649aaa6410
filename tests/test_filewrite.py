"""kernelpack.filewrite: the artifact writers behind kp.save and the CLI (more through kp.save in
test_review5_save.py and test_review10_save_targets.py)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest

from kernelpack import filewrite
from kernelpack.filewrite import write_atomic, write_file_object


class _Trickle(io.RawIOBase):
    """A raw file that takes at most ``step`` bytes per write (0: none)."""

    def __init__(self, step: int) -> None:
        self.step, self.got = step, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        chunk = bytes(data[:self.step])
        self.got += chunk
        return len(chunk)


def test_a_raw_file_is_written_until_done() -> None:
    f = _Trickle(3)
    write_file_object(f, b"0123456789")
    assert bytes(f.got) == b"0123456789"


def test_a_file_that_takes_nothing_is_an_error_not_a_hang() -> None:
    with pytest.raises(OSError, match="wrote 0 of 4 bytes") as info:
        write_file_object(_Trickle(0), b"abcd")
    assert info.value.errno == errno.EIO


def test_a_text_file_names_the_parameter() -> None:
    with pytest.raises(TypeError, match="path_or_file is a text file"):
        write_file_object(io.StringIO(), b"x")


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "model.kpack"
    target.write_bytes(b"old")

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))

    monkeypatch.setattr(filewrite.os, "replace", refuse)
    with pytest.raises(OSError) as info:
        write_atomic(target, b"new")
    assert info.value.filename == str(target)  # the path asked for, not the temporary name
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.kpack"]


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "private.kpack"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o600
