"""Running the ``kernelpack`` command in-process for the CLI tests."""

from __future__ import annotations

import pytest

from kernelpack.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """main's exit status, stdout and stderr; a usage error (argparse's exit 2, its message
    naming the option) counts as a status like any other."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err
