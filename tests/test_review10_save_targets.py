"""Review 10: ``kp.save(items, path)`` and ``kernelpack sign -o PATH`` write to the file a path
names, as ``open(path, "wb")`` would.

Each test failed before the fix: the crash-safe write renamed a temporary file over ``path``
itself, so a symbolic link became a regular file (the release it pointed to kept the old
artifact), and a FIFO or device was replaced by a regular file: ``kernelpack sign a.kpack
--key k -o /dev/stdout`` run as root turned the system's ``/dev/stdout`` into a regular file
(``/dev/null`` likewise for ``kp.save(x, "/dev/null")``). Links are now followed and
non-regular files written to directly; ``sign`` reports on stderr when its output is stdout.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main
from kp_samples import axpy, tiny

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX links and FIFOs")


def test_save_through_a_symlink_replaces_the_file_it_names(tmp_path: Path) -> None:
    release = tmp_path / "releases" / "v3.kpack"
    release.parent.mkdir()
    release.write_bytes(kp.save([tiny()]))
    link = tmp_path / "model.kpack"
    link.symlink_to(release)
    data = kp.save([axpy()], link)
    assert link.is_symlink() and os.readlink(link) == str(release)
    assert release.read_bytes() == data
    assert kp.load(link).programs == ["axpy"]
    assert os.listdir(release.parent) == ["v3.kpack"]  # no temporary file left behind


def test_save_through_a_dangling_symlink_creates_the_file_it_names(tmp_path: Path) -> None:
    link = tmp_path / "model.kpack"
    link.symlink_to("new.kpack")
    data = kp.save([tiny()], link)
    assert link.is_symlink() and (tmp_path / "new.kpack").read_bytes() == data


def test_save_to_a_fifo_writes_into_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that opening it to write is instant
    try:
        data = kp.save([tiny()], fifo)  # a small artifact fits in the pipe's buffer
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert os.read(reader, 1 << 20) == data
    finally:
        os.close(reader)


def _signed_fixture(tmp_path: Path) -> tuple[Path, Path]:
    artifact = tmp_path / "a.kpack"
    kp.save([tiny()], artifact)
    assert main(["keygen", "-o", str(tmp_path / "key")]) == 0
    return artifact, tmp_path / "key"


def test_sign_to_a_fifo_writes_the_signed_artifact_into_it(tmp_path: Path, capsys) -> None:
    artifact, key = _signed_fixture(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert main(["sign", str(artifact), "--key", str(key), "-o", str(fifo)]) == 0
        signed = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert kp.load(signed, trusted_keys=[f"{key}.pub"]).signature.verified


def test_sign_to_stdout_puts_only_the_artifact_on_stdout(tmp_path: Path) -> None:
    artifact, key = _signed_fixture(tmp_path)
    # /proc/self/fd/1 is what /dev/stdout links to (the test never names /dev/stdout itself:
    # the old code would have replaced it for the whole machine)
    if not os.path.exists("/proc/self/fd/1"):
        pytest.skip("no /proc/self/fd")
    result = subprocess.run(
        [sys.executable, "-m", "kernelpack.cli", "sign", str(artifact), "--key", str(key),
         "-o", "/proc/self/fd/1"], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert kp.load(result.stdout, trusted_keys=[f"{key}.pub"]).signature.verified
    assert b"signed" in result.stderr and b"key id" in result.stderr
