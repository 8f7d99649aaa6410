"""``meta/digests.json`` (kernelpack/cache/digest_memo.py): a cache key's once-per-process
digests taken from the memo only while every file they were computed from stats the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.cache import digest_memo, keys
from kernelpack.cache.digest_memo import DigestMemo, file_stamps

from .conftest import worker_env

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture(autouse=True)
def _memo_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """kp.Cache lends its memo to the keys module once per process: put it back after."""
    monkeypatch.setattr(keys, "_MEMO", keys._MEMO)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled: the race guard looks RACY_S back from a
    clock moved a minute ahead (a file's ctime cannot be set back)."""
    real = time.time_ns
    monkeypatch.setattr(digest_memo.time, "time_ns", lambda: real() + 60 * 10**9)


class Counter:
    def __init__(self, answer: str = DIGEST) -> None:
        self.calls = 0
        self.answer = answer

    def __call__(self) -> str:
        self.calls += 1
        return self.answer


def _memo(root: Path, untrusted: Any = None) -> DigestMemo:
    return DigestMemo(root / "meta" / "digests.json", lambda: untrusted)


def _files(tmp_path: Path, n: int = 3) -> list[tuple[str, Path]]:
    out = []
    for i in range(n):
        path = tmp_path / "src" / f"m{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x = %d\n" % i)
        out.append((path.name, path))
    return out


def test_a_second_memo_takes_the_digest_without_computing(tmp_path: Path, settled: None) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)
    first, again = Counter(), Counter(OTHER)
    assert _memo(root).digest("codegen", files, first) == DIGEST and first.calls == 1
    assert _memo(root).digest("codegen", files, again) == DIGEST and again.calls == 0
    recorded = json.loads((root / "meta" / "digests.json").read_bytes())
    assert recorded["version"] == 1
    assert recorded["digests"]["codegen"]["stamps"] == file_stamps(files)
    assert oct((root / "meta").stat().st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize("change", ["same size, mtime restored", "another size", "removed",
                                    "replaced (cp -p)", "a file more"])
def test_any_change_to_the_files_computes_again(tmp_path: Path, settled: None,
                                                change: str) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)
    _memo(root).digest("codegen", files, Counter())
    path = files[1][1]
    st = path.stat()
    if change == "same size, mtime restored":
        time.sleep(0.01)  # (a ctime tick on filesystems that keep nanoseconds)
        path.write_bytes(b"x = 7\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    elif change == "another size":
        path.write_bytes(b"x = 10\n")
    elif change == "removed":
        path.unlink()
    elif change == "replaced (cp -p)":
        twin = path.with_suffix(".new")
        twin.write_bytes(b"x = 8\n")
        os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(twin, path)
    else:
        extra = tmp_path / "src" / "m9.py"
        extra.write_bytes(b"y = 1\n")
        files = [*files, ("m9.py", extra)]
    again = Counter(OTHER)
    assert _memo(root).digest("codegen", files, again) == OTHER and again.calls == 1


def test_files_changed_just_before_hashing_are_not_remembered(tmp_path: Path) -> None:
    """git's "racy clean": a file as new as the clock's granularity is hashed every time."""
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)  # written now: within RACY_S of the hashing
    for _ in range(2):
        counter = Counter()
        assert _memo(root).digest("codegen", files, counter) == DIGEST and counter.calls == 1
    assert not (root / "meta" / "digests.json").exists()


def test_a_file_that_changes_while_hashed_is_not_remembered(tmp_path: Path,
                                                            settled: None) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)

    def compute() -> str:
        files[0][1].write_bytes(b"x = 99\n")
        return DIGEST

    _memo(root).digest("codegen", files, compute)
    assert not (root / "meta" / "digests.json").exists()


def test_an_untrusted_root_is_neither_read_nor_written(tmp_path: Path, settled: None) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)
    _memo(root).digest("codegen", files, Counter())  # a memo that would answer
    counter = Counter(OTHER)
    assert _memo(root, "meta is writable by every user").digest("codegen", files,
                                                                counter) == OTHER
    assert counter.calls == 1


def test_a_world_writable_meta_directory_is_untrusted(tmp_path: Path, settled: None) -> None:
    root = tmp_path / "cache"
    (root / "meta").mkdir(parents=True)
    files = _files(tmp_path)
    memo = kp.Cache(path=root).disk.digest_memo()
    memo.digest("codegen", files, Counter())
    assert memo.path.exists()
    os.chmod(root / "meta", 0o777)
    counter = Counter(OTHER)
    assert kp.Cache(path=root).disk.digest_memo().digest("codegen", files, counter) == OTHER
    assert counter.calls == 1


@pytest.mark.parametrize("content", [b"", b"not json", b"\xff\xfe", b"[]", b'{"version": 2}',
                                     b'{"version": 1, "digests": []}',
                                     b'{"version": 1, "digests": {"codegen": 5}}',
                                     b"[" * 100_000 + b"]" * 100_000,
                                     "bad digest", "fifo", "directory"])
def test_a_damaged_memo_is_ignored(tmp_path: Path, settled: None, content: Any) -> None:
    root = tmp_path / "cache"
    meta = root / "meta"
    meta.mkdir(parents=True)
    files = _files(tmp_path)
    path = meta / "digests.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content == "directory":
        path.mkdir()
    elif content == "bad digest":
        path.write_text(json.dumps({"version": 1, "digests": {"codegen": {
            "stamps": file_stamps(files), "digest": "sha256:not-hex"}}}))
    else:
        path.write_bytes(content)
    counter = Counter()
    assert _memo(root).digest("codegen", files, counter) == DIGEST and counter.calls == 1
    if content not in ("fifo", "directory"):  # rewritten whole
        assert _memo(root).digest("codegen", files, Counter(OTHER)) == DIGEST


def test_a_missing_root_is_not_created(tmp_path: Path, settled: None) -> None:
    files = _files(tmp_path)
    counter = Counter()
    assert _memo(tmp_path / "gone").digest("codegen", files, counter) == DIGEST
    assert not (tmp_path / "gone").exists()


def test_labels_are_capped(tmp_path: Path, settled: None) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)
    for i in range(digest_memo.MAX_LABELS + 3):
        _memo(root).digest(f"label {i}", files, Counter())
    kept = json.loads((root / "meta" / "digests.json").read_bytes())["digests"]
    assert list(kept) == [f"label {i}" for i in range(3, digest_memo.MAX_LABELS + 3)]


def test_cache_clear_removes_the_memo(tmp_path: Path, settled: None) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    _memo(root).digest("codegen", _files(tmp_path), Counter())
    kp.Cache(path=root).disk.clear()
    assert not (root / "meta" / "digests.json").exists()


def test_keys_take_the_codegen_and_libdevice_digests_from_the_first_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settled: None) -> None:
    """The first kp.Cache of a process lends its memo to the key's two digests; they equal
    what the files give, and a second computation reads no source file."""
    from kernelpack.toolchain import libdevice

    monkeypatch.setattr(keys, "_MEMO", None)
    monkeypatch.setattr(keys, "_CODEGEN", None)
    monkeypatch.setattr(keys, "_TOOLCHAIN", None)
    expected_codegen = keys.codegen_digest(refresh=True)
    expected_toolchain = keys.toolchain_identity(refresh=True)
    libdevice.digest.cache_clear()  # (a digest the process holds is used as it is)
    kp.Cache(path=tmp_path / "first")
    kp.Cache(path=tmp_path / "second")
    (tmp_path / "first").mkdir()
    monkeypatch.setattr(keys, "_CODEGEN", None)
    monkeypatch.setattr(keys, "_TOOLCHAIN", None)
    assert keys.codegen_digest() == expected_codegen
    assert keys.toolchain_identity() == expected_toolchain
    recorded = json.loads((tmp_path / "first" / "meta" / "digests.json").read_bytes())
    labels = sorted(label.split()[0] for label in recorded["digests"])
    if dict(expected_toolchain)["libdevice"].startswith("sha256:"):
        assert labels == ["codegen", "libdevice"]
    else:  # no libdevice on this machine: nothing to remember for it
        assert labels == ["codegen"]
    assert not (tmp_path / "second").exists()

    read: list[str] = []
    real_open = open

    def spying_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spying_open)
    monkeypatch.setattr(keys, "_CODEGEN", None)
    assert keys.codegen_digest() == expected_codegen
    assert not [p for p in read if p.endswith(".py")]


def test_a_fresh_process_makes_the_same_key_with_and_without_the_memo(tmp_path: Path) -> None:
    code = ("import sys, kernelpack as kp\n"
            "if sys.argv[1] == 'cache': kp.Cache(path=sys.argv[2])\n"
            "print(kp.make_key('fusion', b'src', {}, ['sm_90']).digest)\n")
    (tmp_path / "c").mkdir()
    runs = [subprocess.run([sys.executable, "-c", code, mode, str(tmp_path / "c")],
                           env=worker_env(), capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip()
            for mode in ("plain", "cache", "cache", "plain")]
    assert len(set(runs)) == 1 and len(runs[0]) == 64


def test_a_writer_killed_mid_write_leaves_a_temp_that_prune_removes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A memo writer killed mid-write leaves only ``meta/.digests.json.<pid>.<hex>.tmp``:
    ``cache stats`` counts it and ``cache prune`` removes it once old, as for entries."""
    from kernelpack.cli import main

    root = tmp_path / "cache"
    (root / "meta").mkdir(parents=True)
    fresh = root / "meta" / ".digests.json.124.abcd1234.tmp"
    fresh.write_bytes(b"{")
    temp = root / "meta" / ".digests.json.123.abcd1234.tmp"
    temp.write_bytes(b"{")
    old = time.time() - 2 * 3600
    os.utime(temp, (old, old))
    assert main(["cache", "stats", "--dir", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["temporary_files"] == 2
    assert kp.Cache(path=root).disk.prune_temps() == 1  # (a writer may still own the fresh one)
    assert not temp.exists() and fresh.exists()


def test_files_on_a_read_only_filesystem_are_never_remembered(
        tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only image changes only by another being mounted in its place, whose stamps can
    all match (review 68: two squashfs images with fixed times): no memo for its files."""
    root = tmp_path / "cache"
    root.mkdir()
    files = _files(tmp_path)
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path: Any) -> None:
            self.f_flag = real(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(digest_memo.os, "statvfs", ReadOnly)
    assert file_stamps(files) is None
    for answer in (DIGEST, OTHER):
        counter = Counter(answer)
        assert _memo(root).digest("codegen", files, counter) == answer and counter.calls == 1
    assert not (root / "meta" / "digests.json").exists()
