"""``kernelpack cache ls|stats|prune|clear|explain``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelpack.cache import Cache
from kernelpack.cli import main

from .conftest import from_cubin
from .worker import key_for


@pytest.fixture()
def filled(tmp_path: Path, axpy_cubin: bytes) -> Path:
    cache = Cache(tmp_path, remote=False)
    for i in range(3):
        cache.fetch_or_compile(key_for(i), lambda i=i: from_cubin(f"k{i}", axpy_cubin))
    return tmp_path


def test_ls_lists_entries(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "ls", "--dir", str(filled), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["program"] for r in rows) == ["k0", "k1", "k2"]
    assert {r["kind"] for r in rows} == {"external"}
    assert main(["cache", "ls", "--dir", str(filled)]) == 0
    assert "3 entries" in capsys.readouterr().out


def test_ls_shows_invalid_entries(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Cache(filled, remote=False).disk.path(key_for(0)).write_bytes(b"junk")
    assert main(["cache", "ls", "--dir", str(filled), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sum(r["program"].startswith("<invalid") for r in rows) == 1


def test_stats(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "stats", "--dir", str(filled), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["entries"] == 3 and facts["bytes"] > 0 and facts["key_records"] == 3


def test_explain_by_prefix(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = key_for(1)
    assert main(["cache", "explain", key.digest[:12], "--dir", str(filled)]) == 0
    out = capsys.readouterr().out
    assert key.digest in out and key.part("source") in out and "on disk: yes" in out
    assert main(["cache", "explain", "--json", key.digest, "--dir", str(filled)]) == 0
    assert json.loads(capsys.readouterr().out)["parts"]["targets"] == "sm_80"


def test_explain_errors(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "explain", "zz", "--dir", str(filled)]) == 1
    assert "64 hex digits" in capsys.readouterr().err
    assert main(["cache", "explain", "0" * 64, "--dir", str(filled)]) == 1
    assert "no record" in capsys.readouterr().out


def test_prune_and_clear(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = Cache(filled, remote=False).disk
    stale = store.path(key_for(0)).parent / ".stale.1.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    size = store.entries()[0].size
    cap = int(size / 0.9) + 2  # eviction goes down to 90% of the cap: room for one entry
    assert main(["cache", "prune", "--dir", str(filled), "--max-bytes", str(cap)]) == 0
    out = capsys.readouterr().out
    assert "removed 2 entries" in out and "1 temporary or lock files" in out
    assert len(store.entries()) == 1 and not stale.exists()
    assert main(["cache", "clear", "--dir", str(filled)]) == 0
    assert store.entries() == [] and "removed 1 entries" in capsys.readouterr().out


def test_explain_of_an_unknown_key_says_so_on_stderr(filled: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "explain", "0" * 64, "--dir", str(filled)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no record of key 0000") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["prune", "--max-bytes", "-1"], ["prune", "--temp-age", "-5"],
                                  ["prune", "--temp-age", "nan"], ["prune", "--max-bytes", "x"]])
def test_negative_caps_and_ages_are_usage_errors(filled: Path, argv: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # a negative cap would evict every entry, a negative age delete files being written now
    with pytest.raises(SystemExit) as info:
        main(["cache", *argv, "--dir", str(filled)])
    assert info.value.code == 2
    assert len(Cache(filled, remote=False).disk.entries()) == 3


@pytest.mark.parametrize("action", ["ls", "stats", "prune", "clear"])
def test_a_file_as_the_cache_root_is_an_error(tmp_path: Path, action: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "not_a_dir"
    afile.write_bytes(b"data")
    assert main(["cache", action, "--dir", str(afile)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {afile}: not a directory") and afile.read_bytes() == b"data"
