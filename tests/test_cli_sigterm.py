"""SIGTERM in the ``kernelpack`` command (`kill`, timeout(1), a container stopping): one line
and status 143 (tested with SIGINT's in test_review12_cli_operator.py), and what it was
writing cleaned up, as for Ctrl-C. The default action ended the
process on the spot: no message, and ``extract``'s temporary file left beside its target."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from kernelpack.cli import EXIT_TERMINATED, main

sys.path.insert(0, str(Path(__file__).parent))
from test_review12_cli_operator import POSIX, _env, files  # noqa: E402,F401 - fixture


@POSIX
def test_sigterm_in_extract_leaves_only_whole_files(files, tmp_path) -> None:  # noqa: F811
    """SIGTERM arrives while the second image is being made durable: the first file stays
    whole, the second's temporary is removed, nothing else is written. (In a child: on a
    regression the signal's default action would end the test run itself.)"""
    out = tmp_path / "out"
    code = ("import os, signal, sys\n"
            "from kernelpack import serializer\n"
            "from kernelpack.cli import main\n"
            "syncs, real = [], os.fsync\n"
            "def fsync(fd):\n"
            "    syncs.append(fd)\n"
            "    if len(syncs) == 2:  # the second image's file, written, not yet renamed\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "    real(fd)\n"
            "serializer.os.fsync = fsync\n"
            "status = main(sys.argv[1:])\n"
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back\n"
            "sys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", code, "extract", str(files["big_image"]),
                           "-o", str(out)], env=_env(), capture_output=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (EXIT_TERMINATED, b"error: terminated\n")
    assert [p.name for p in out.iterdir()] == ["m0.sm_80.cubin"]  # no temporary left either
    assert (out / "m0.sm_80.cubin").stat().st_size == 4 + (256 << 10) + 1


def test_a_handler_of_the_embedding_program_is_left_alone(files, capsys) -> None:  # noqa: F811
    """main() called by a program that handles SIGTERM itself, or from another thread (which
    cannot set handlers): nothing is changed."""
    def mine(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["verify", str(files["small"])]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
    codes = []
    worker = threading.Thread(target=lambda: codes.append(main(["verify", str(files["small"])])))
    worker.start()
    worker.join(60)
    assert codes == [0] and signal.getsignal(signal.SIGTERM) is previous
    capsys.readouterr()
