"""Journey review 5 (error experience): found by an outside user's end-to-end script.

``kp.Cache(sign_with="missing")`` says ``ValueError: sign_with: cannot read key file ...``, but
``kp.save(..., sign_with="missing")`` lets the raw ``FileNotFoundError`` of
``kernelpack.signing._read_key_file`` escape, naming neither the parameter nor the key's role.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp


def test_save_with_a_missing_signing_key_names_sign_with(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_key"
    with pytest.raises((ValueError, kp.KernelPackError), match="sign_with"):
        kp.save([], tmp_path / "out.kpack", sign_with=str(missing))
    assert not (tmp_path / "out.kpack").exists()


def test_cache_with_a_missing_signing_key_names_sign_with(tmp_path: Path) -> None:
    """The behaviour kp.save should match (passes today)."""
    with pytest.raises(ValueError, match="sign_with"):
        kp.Cache(tmp_path / "c", remote=False, sign_with=str(tmp_path / "no_such_key"))
