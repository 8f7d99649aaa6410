"""Review 8 (flakiness/cleanup): a test run leaves nothing behind outside pytest's tmp_path.
``test_small_load_path_imports`` saved its artifact under ``tempfile.mkdtemp()`` in the child
it runs and never removed it: one more directory under $TMPDIR per CI run."""

from __future__ import annotations

from pathlib import Path

import pytest

import test_first_call_paths


def test_small_load_path_imports_leaves_nothing_in_tmpdir(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    spare, work = tmp_path / "tmpdir", tmp_path / "work"
    spare.mkdir()
    work.mkdir()
    monkeypatch.setenv("TMPDIR", str(spare))  # the child's tempfile would write here
    test_first_call_paths.test_small_load_path_imports(work)
    assert list(spare.iterdir()) == []
    assert [p.name for p in work.iterdir()] == ["a.kpack"]
