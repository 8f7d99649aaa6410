"""Review 7: ``kernelpack verify FILE --trusted-key PUB`` reads every key before the artifact.

Was: the loader reads trusted keys only when the artifact is signed, so a mistyped or
unreadable key path on an unsigned file was reported as "artifact is unsigned", hiding the
mistake until the first signed artifact arrived.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_missing_or_malformed_trusted_key_is_named(tmp_path: Path, capsys) -> None:
    unsigned = tmp_path / "a.kpack"
    kp.save([kp_samples.axpy()], unsigned)
    code, out, err = run(capsys, "verify", unsigned, "--trusted-key", tmp_path / "typo.pub")
    assert (code, out) == (1, "")
    assert err == f"error: {tmp_path / 'typo.pub'}: no such public key file\n"
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key\n")
    code, out, err = run(capsys, "verify", unsigned, "--trusted-key", bad)
    assert (code, out) == (1, "") and err.startswith(f"error: {bad}: ") and "unsigned" not in err


def test_good_trusted_keys_behave_as_before(tmp_path: Path, capsys) -> None:
    unsigned = tmp_path / "a.kpack"
    kp.save([kp_samples.axpy()], unsigned)
    assert run(capsys, "keygen", "-o", tmp_path / "team")[0] == 0
    assert run(capsys, "keygen", "-o", tmp_path / "other")[0] == 0
    code, _, err = run(capsys, "verify", unsigned, "--trusted-key", tmp_path / "team.pub")
    assert code == 1 and "artifact is unsigned" in err
    signed = tmp_path / "s.kpack"
    assert run(capsys, "sign", unsigned, "--key", tmp_path / "team", "-o", signed)[0] == 0
    code, out, _ = run(capsys, "verify", signed, "--trusted-key", tmp_path / "other.pub",
                       "--trusted-key", tmp_path / "team.pub")
    assert code == 0 and "(trusted)" in out
    code, _, err = run(capsys, "verify", signed, "--trusted-key", tmp_path / "other.pub")
    assert code == 1 and "not trusted" in err
