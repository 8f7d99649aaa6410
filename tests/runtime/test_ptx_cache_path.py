"""Where the runtime keeps cubins it compiled from an artifact's PTX, and what happens when
there is no cache directory at all (no home directory, no ``KERNELPACK_CACHE_DIR``: an
arbitrary container uid). ``ptx_cache_path`` raised a bare RuntimeError there, so loading a
PTX-only program failed instead of compiling it without keeping the result."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from kernelpack.runtime._ptx_load import ptx_cache_path


def _homeless(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOME", "XDG_CACHE_HOME", "KERNELPACK_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)


def test_no_cache_directory_means_no_path_not_an_error(monkeypatch) -> None:
    _homeless(monkeypatch)
    assert ptx_cache_path(b".version 8.0", "sm_90", "nvJitLink 13.0") is None


def test_the_path_is_under_the_cache_directory_and_keyed_by_every_input(monkeypatch,
                                                                      tmp_path: Path) -> None:
    _homeless(monkeypatch)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path))
    path = ptx_cache_path(b".version 8.0", "sm_90", "nvJitLink 13.0")
    assert path is not None and path.is_relative_to(tmp_path / "runtime-ptx")
    others = {ptx_cache_path(b".version 8.1", "sm_90", "nvJitLink 13.0"),
              ptx_cache_path(b".version 8.0", "sm_89", "nvJitLink 13.0"),
              ptx_cache_path(b".version 8.0", "sm_90", "nvJitLink 12.8")}
    assert path not in others and len(others) == 3
