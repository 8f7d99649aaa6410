"""Review 8 (flakiness): tests must not depend on the runner's process environment. A CI job
may run under umask 002 (group-writable: many containers, GitLab runners) or 077; a test
that expected a new artifact to be exactly 0644 failed there on a correct product."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import test_serializer


@pytest.mark.parametrize("umask", [0o002, 0o077, 0o022])
def test_file_mode_test_passes_under_any_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        test_serializer.test_overwriting_keeps_the_file_mode(tmp_path)
        assert os.umask(umask) == umask  # the test put the runner's umask back
    finally:
        os.umask(old)
