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


# ---- the kept cubins are read and written as the disk tier's entries are (review 37) ---------
AXPY_PTX = (Path(__file__).resolve().parents[2] / "examples" / "axpy.ptx").read_bytes()


class _Device:
    """What ``_ptx_code`` asks of a device: its arch and the driver's CUDA version."""

    class arch:  # noqa: N801
        major, minor = 9, 0

    driver_version = 13000


@pytest.fixture
def ptx_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``_ptx_code`` with the cache under tmp_path/cache; skipped without nvJitLink."""
    from kernelpack.runtime import _ptx_load

    nvjitlink = pytest.importorskip("kernelpack.toolchain.nvjitlink")
    try:
        major = nvjitlink.version()[0]
    except Exception as exc:  # noqa: BLE001 (the library is missing or unusable here)
        pytest.skip(f"nvJitLink is not available: {exc}")
    monkeypatch.setattr(_Device, "driver_version", major * 1000)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path / "cache"))
    return lambda: _ptx_load._ptx_code(AXPY_PTX, _Device())  # type: ignore[arg-type]


def _kept(tmp_path: Path) -> Path:
    from kernelpack.toolchain import nvjitlink

    path = ptx_cache_path(AXPY_PTX, "sm_90", nvjitlink.toolchain_id())
    assert path is not None and path.is_relative_to(tmp_path / "cache")
    return path


def test_assembled_once_then_read_back(ptx_code, tmp_path: Path) -> None:
    code, source, path = ptx_code()
    assert source == "ptx->cubin (nvJitLink)" and code[:4] == b"\x7fELF"
    assert path == _kept(tmp_path) and path.read_bytes() == code
    assert (path.parent.stat().st_mode & 0o777) == 0o700  # made private, as the disk tier's
    again, source, _ = ptx_code()
    assert (again, source) == (code, "ptx->cubin (cached)")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_a_fifo_under_the_name_does_not_block(ptx_code, tmp_path: Path) -> None:
    import os
    import threading

    path = _kept(tmp_path)
    path.parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(path)
    answers: list = []
    worker = threading.Thread(target=lambda: answers.append(ptx_code()), daemon=True)
    worker.start()
    worker.join(60)  # hung for ever reading the FIFO before
    assert answers, "the first load blocked on a FIFO planted under the kept cubin's name"
    code, source, _ = answers[0]
    assert source == "ptx->cubin (nvJitLink)" and code[:4] == b"\x7fELF"


def test_a_linked_shard_is_neither_read_nor_written(ptx_code, tmp_path: Path) -> None:
    path = _kept(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / path.name).write_bytes(b"\x7fELF planted")
    path.parent.parent.mkdir(parents=True, mode=0o700)
    path.parent.symlink_to(elsewhere)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        code, source, kept = ptx_code()
    assert source == "ptx->cubin (nvJitLink)" and code != b"\x7fELF planted"
    assert kept is None
    assert [p.name for p in elsewhere.iterdir()] == [path.name]  # nothing written through it
    assert (elsewhere / path.name).read_bytes() == b"\x7fELF planted"


def test_a_directory_writable_by_everyone_is_not_trusted(ptx_code, tmp_path: Path) -> None:
    path = _kept(tmp_path)
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o777)
    path.write_bytes(b"\x7fELF planted by anyone")
    with pytest.warns(RuntimeWarning, match="writable by every user"):
        code, source, kept = ptx_code()
    assert source == "ptx->cubin (nvJitLink)" and code[:4] == b"\x7fELF"
    assert code != b"\x7fELF planted by anyone" and kept is None
    assert path.read_bytes() == b"\x7fELF planted by anyone"  # and not replaced either


def test_a_temporary_name_planted_as_a_link_is_not_followed(ptx_code, tmp_path: Path) -> None:
    """The temporary's name was predictable (pid and thread id): a link planted there made
    the write land in the link's target."""
    import os
    import threading

    path = _kept(tmp_path)
    path.parent.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    old_name = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    old_name.symlink_to(victim)
    ptx_code()
    assert victim.read_bytes() == b"keep me"
    assert path.read_bytes()[:4] == b"\x7fELF"
