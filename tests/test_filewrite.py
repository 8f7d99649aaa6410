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


def test_a_write_removes_temporaries_of_killed_writers_only(tmp_path) -> None:
    """Temporaries named as write_atomic names them and not locked (their writer is gone) are
    removed by the next write of that name; a live writer's (locked), another name's, a
    symlink and a directory are left alone."""
    import fcntl

    target = tmp_path / "model.kpack"
    orphan = tmp_path / ".model.kpack.abcd1234.tmp"
    live = tmp_path / ".model.kpack.live5678.tmp"
    other = tmp_path / ".other.kpack.abcd1234.tmp"
    odd = tmp_path / ".model.kpack.abcd1234.tmp.bak"
    link = tmp_path / ".model.kpack.link0000.tmp"
    folder = tmp_path / ".model.kpack.dir00000.tmp"
    for p in (orphan, live, other, odd):
        p.write_bytes(b"partial")
    link.symlink_to(other)
    folder.mkdir()
    holder = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a writer still at work
        write_atomic(target, b"new")
        assert target.read_bytes() == b"new"
        assert not orphan.exists()
        assert live.exists() and other.exists() and odd.exists() and folder.is_dir()
        assert link.is_symlink()
    finally:
        os.close(holder)
    write_atomic(target, b"newer")  # the writer is gone now
    assert not live.exists() and target.read_bytes() == b"newer"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_ctrl_c_before_the_file_object_owns_the_temporary_closes_it(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Review 30: a KeyboardInterrupt between the locked temporary's creation and the file
    object taking its descriptor left the descriptor open, holding the temporary's lock, so
    no later save of the name could sweep it. Now it is closed and the temporary removed;
    the old file stays whole and the next write works."""
    import types

    target = tmp_path / "a.kpack"
    target.write_bytes(b"old")

    def fdopen(fd: int, mode: str):
        raise KeyboardInterrupt

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os)
                                       if not k.startswith("__")})
    fake_os.fdopen = fdopen
    monkeypatch.setattr(filewrite, "os", fake_os)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, b"new")
    monkeypatch.setattr(filewrite, "os", os)
    links = {os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
             if os.path.islink(f"/proc/self/fd/{n}")}
    assert not [p for p in links if ".a.kpack." in p]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kpack"]
    assert target.read_bytes() == b"old"
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
