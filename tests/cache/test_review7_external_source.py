"""``Cache.external`` reads its sources by ``kp.external``'s own rules
(``external_images.read_source``): its own copy took a one-line ``'#include "k.cuh"'`` source
for a file path and raised a bare FileNotFoundError, and a missing file was a
FileNotFoundError where ``kp.external`` gives a ValueError naming the argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelpack.cache import Cache
from kernelpack.cache.external_key import source_bytes

from .conftest import axpy_params


def test_source_bytes_follow_kp_external() -> None:
    assert source_bytes('#include "k.cuh"', "cuda") == b'#include "k.cuh"'
    assert source_bytes(b"\xef\xbb\xbf.version 8.0\n\0", "ptx") == b".version 8.0\n"
    with pytest.raises(ValueError, match="cuda: cannot read file"):
        source_bytes("missing.cu", "cuda")


def test_cache_external_with_a_missing_file_names_the_argument(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", remote=False)
    with pytest.raises(ValueError, match="ptx: cannot read file"):
        cache.external("axpy", "axpy", axpy_params(), grid=1, block=256,
                       ptx=str(tmp_path / "missing.ptx"), targets=["sm_80"])
