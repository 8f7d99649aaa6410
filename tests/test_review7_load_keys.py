"""``kp.load(..., trusted_keys=...)`` reads the keys before the file: a mistyped key path was
reported as "artifact is unsigned" for an unsigned file (and only surfaced when the first
signed one arrived); now it is the key's own error, naming the path."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import SignatureError

from kp_samples import axpy


def test_a_missing_key_file_is_named_before_the_artifact_is_read(tmp_path: Path) -> None:
    data = kp.save([axpy()])
    with pytest.raises(ValueError, match="typo.pub: no such public key file"):
        kp.load(data, trusted_keys=[str(tmp_path / "typo.pub")])
    with pytest.raises(SignatureError, match="artifact is unsigned"):
        kp.load(data, trusted_keys=[bytes(range(1, 33))])  # a well-formed key: the file decides


def test_cache_prune_takes_sizes_with_suffixes(tmp_path: Path) -> None:
    """``cache prune --max-bytes 1G`` was a usage error (int only) while ``extract
    --max-bytes`` took K/M/G/T."""
    from kernelpack.cli import main

    assert main(["cache", "prune", "--dir", str(tmp_path), "--max-bytes", "1G"]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["cache", "prune", "--dir", str(tmp_path), "--max-bytes", "-5"])
    assert exc.value.code == 2
