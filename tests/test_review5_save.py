"""Review 5: ``kp.save`` to a path or a file object.

Were: a new artifact was always chmod 0644, ignoring the umask (world-readable under umask
077, where ``open(path, "wb")`` gives 0600); a text file object failed inside io with "string
argument expected, got 'bytes'"; a raw file object that wrote part of the bytes per call got
a truncated artifact and no error.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import kernelpack as kp

import kp_samples


@pytest.mark.parametrize("umask", [0o077, 0o002])
def test_new_file_mode_follows_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        kp.save([kp_samples.tiny()], tmp_path / "a.kpack")
        with open(tmp_path / "plain", "wb"):
            pass
    finally:
        os.umask(old)
    expected = os.stat(tmp_path / "plain").st_mode & 0o777
    assert expected == 0o666 & ~umask
    assert os.stat(tmp_path / "a.kpack").st_mode & 0o777 == expected
    # replacing keeps the existing file's mode, whatever the umask
    os.chmod(tmp_path / "a.kpack", 0o640)
    kp.save([kp_samples.axpy()], tmp_path / "a.kpack")
    assert os.stat(tmp_path / "a.kpack").st_mode & 0o777 == 0o640
    assert kp.load(tmp_path / "a.kpack").programs == ["axpy"]


def test_text_file_object_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"path_or_file is a text file; open it in binary mode"):
        kp.save([kp_samples.tiny()], io.StringIO())


class _Trickle(io.RawIOBase):
    """A raw file that takes at most 5 bytes per write, as raw (unbuffered) files may."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        chunk = bytes(b)[:5]
        self.data += chunk
        return len(chunk)


def test_raw_file_object_gets_every_byte() -> None:
    f = _Trickle()
    data = kp.save([kp_samples.axpy()], f)
    assert bytes(f.data) == data
    assert kp.load(bytes(f.data)).programs == ["axpy"]


def test_file_object_that_writes_nothing_is_an_error() -> None:
    class Stuck(_Trickle):
        def write(self, b) -> int:  # type: ignore[override]
            return 0

    with pytest.raises(OSError, match=r"wrote 0 of \d+ bytes"):
        kp.save([kp_samples.tiny()], Stuck())
