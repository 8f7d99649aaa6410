"""Second adversarial review of the ``kernelpack`` command (no GPU, fake images)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from kernelpack import serializer
from kernelpack.cli import main
from kernelpack.signing import sign_digest

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sign_refuses_a_file_changed_after_signing(tmp_path, capsys) -> None:
    """Was: ``sign`` checked structure and images but not the signature the file carried, so
    it put a fresh signature over a file that ``verify`` refuses (changed after signing)."""
    body, blobs = serializer.encode(serializer._collect([kp_samples.axpy()]))
    old_key = bytes(range(32))
    bad = tmp_path / "bad.kpack"
    bad.write_bytes(serializer.assemble(body, blobs,
                                        sign_digest(old_key, hashlib.sha256(b"x").digest())))
    before = bad.read_bytes()
    assert run(capsys, "keygen", "-o", tmp_path / "key")[0] == 0
    code, out, err = run(capsys, "sign", bad, "--key", tmp_path / "key", "-o", tmp_path / "o")
    assert (code, out) == (1, "") and err.startswith(f"error: {bad}: signature by key ")
    assert "does not verify" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists() and bad.read_bytes() == before
    # an intact signature by another key is replaced, as before
    good = tmp_path / "good.kpack"
    good.write_bytes(serializer.assemble(body, blobs,
                                         sign_digest(old_key, hashlib.sha256(body).digest())))
    code, out, _ = run(capsys, "sign", good, "--key", tmp_path / "key")
    assert code == 0 and out.startswith(f"signed {good} -> {good} (key id ")
    code, out, _ = run(capsys, "verify", good, "--trusted-key", tmp_path / "key.pub")
    assert code == 0 and "(trusted)" in out


def test_key_files_must_be_regular_files(tmp_path, capsys) -> None:
    """Was: a FIFO named by --key or --trusted-key blocked for a writer; now one error line."""
    import os

    from kernelpack.signing import load_private_key, load_public_key

    fifo = tmp_path / "team.pub"
    os.mkfifo(fifo)
    # the directory first: where this check is missing it fails at once, before the FIFO blocks
    for path in (tmp_path, fifo):
        with pytest.raises(ValueError, match=r"not a regular file \(a key file is expected\)"):
            load_public_key(str(path))
    with pytest.raises(ValueError, match="not a regular file"):
        load_private_key(tmp_path)
    artifact = tmp_path / "a.kpack"
    serializer.save([kp_samples.axpy()], artifact, sign_with=bytes(range(32)))
    code, out, err = run(capsys, "verify", artifact, "--trusted-key", fifo)
    assert (code, out) == (1, "") and err == f"error: {fifo}: not a regular file (a key file " \
                                             f"is expected)\n"
