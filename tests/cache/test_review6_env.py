"""Review 6: environment edges of the default cache directory.

With no ``$HOME`` and no passwd entry (an arbitrary container uid), ``Path.home()`` is a
literal ``~``: ``kp.Cache()`` used to open a cache under ``./~/.cache/kernelpack`` of whatever
the working directory was. Now it is a ValueError naming ``KERNELPACK_CACHE_DIR``; explicit
settings keep working.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelpack import config
from kernelpack.cache import Cache
from kernelpack.cli import main


@pytest.fixture()
def homeless(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No HOME, no passwd entry, no cache variables; the working directory is ``tmp_path``."""
    import pwd

    def no_entry(uid: int) -> object:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("HOME", "XDG_CACHE_HOME", "KERNELPACK_CACHE_DIR", "KERNELPACK_REMOTE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cache_without_a_home_is_a_named_error(homeless: Path) -> None:
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_DIR"):
        Cache()
    assert not (homeless / "~").exists()


def test_cli_without_a_home_is_an_error_not_a_folder_named_tilde(
        homeless: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "ls"]) == 1
    assert "KERNELPACK_CACHE_DIR" in capsys.readouterr().err
    assert not (homeless / "~").exists()


def test_explicit_settings_still_work_without_a_home(homeless: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(homeless / "xdg"))
    assert Cache(remote=False).disk.root == homeless / "xdg" / "kernelpack"
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", "relative-cache")  # explicit: made absolute
    assert Cache(remote=False).disk.root == homeless / "relative-cache"
    assert Cache(homeless / "p", remote=False).disk.root == homeless / "p"


def test_home_set_still_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("XDG_CACHE_HOME", "KERNELPACK_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.default_cache_dir() == tmp_path / ".cache" / "kernelpack"
    assert os.path.isabs(config.default_cache_dir())


def test_bad_environment_values_name_their_variable(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """A fleet sets these in the environment; the error must say which variable is wrong."""
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    monkeypatch.delenv("KERNELPACK_REMOTE_CACHE", raising=False)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(afile))
    with pytest.raises(ValueError, match=r"^\$KERNELPACK_CACHE_DIR: .*not a directory"):
        Cache(remote=False)
    with pytest.raises(ValueError, match=r"^path .*not a directory"):  # passed: no variable
        Cache(afile, remote=False)
    monkeypatch.setenv("KERNELPACK_REMOTE_CACHE", "localhost:6379")
    with pytest.raises(ValueError, match=r"^\$KERNELPACK_REMOTE_CACHE: remote must be"):
        Cache(tmp_path / "c")
    with pytest.raises(ValueError, match=r"^remote must be"):  # passed: no variable
        Cache(tmp_path / "c", remote="localhost:6379")


def test_empty_path_is_refused_not_the_working_directory(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path must name a directory"):
        Cache("", remote=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", "")  # empty variable: unset, the default
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Cache(remote=False).disk.root == tmp_path / "xdg" / "kernelpack"
