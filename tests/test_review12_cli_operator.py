"""Twelfth review of the ``kernelpack`` command: an operator's scripts and pipelines on bad
days (closed pipes, full disks, closed stdout, Ctrl-C, odd paths, malformed ``eval`` values).

In-process through ``main(argv)`` where a stream can be faked; subprocesses only where the
failure lives in the operating system (a pipe with no reader, ``/dev/full``, a signal, a file
size limit) or at interpreter exit. Fake images only: no GPU, no toolkit.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import serializer
from kernelpack.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, main
from kernelpack.summary import Arg, Compiled, Image, KernelSummary, Launch, Module, Tensor, Variant

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402

POSIX = pytest.mark.skipif(os.name != "posix", reason="pipes, signals and rlimits of POSIX")


def _many(count: int, image_size: int = 600) -> list[Compiled]:
    """``count`` one-launch programs, one module each: long ``inspect`` output."""
    out = []
    for i in range(count):
        summary = KernelSummary(f"p{i}", (Tensor("x", kp.f32, ("n",)),), (Variant((
            Launch("k", f"m{i}", (kp.cdiv("n", 128),), (128,), (Arg.buffer("x"),)),)),))
        data = b"\x7fELF" + kp_samples._noise(64) * (image_size // 64) + bytes([i % 256])
        out.append(Compiled(summary, (Module(f"m{i}", ("k",), (
            Image("cubin", "sm_80", data, "t", 12080),)),)))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("operator")
    out = {"small": d / "small.kpack", "other": d / "other.kpack", "many": d / "many.kpack",
           "big_image": d / "big_image.kpack"}
    serializer.save([kp_samples.axpy(), kp_samples.rich()], out["small"])
    serializer.save([kp_samples.tiny()], out["other"])
    serializer.save(_many(200), out["many"])  # inspect: ~400 KB of text, several pipe buffers
    serializer.save(_many(3, image_size=256 << 10), out["big_image"])
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _env() -> dict[str, str]:
    """The environment of a user's shell: stdout block-buffered (this harness may set
    PYTHONUNBUFFERED, which hid the failures that only happen at interpreter exit)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED",
                                                             "PYTHONIOENCODING")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(kp.__file__).parents[1]),
                                                      env.get("PYTHONPATH")]))
    return env


def _cli(*argv: object, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kernelpack", *map(str, argv)], env=_env(),
                          timeout=60, **kwargs)  # type: ignore[call-overload]


# ---- a reader that leaves: `| head -1` ----------------------------------------------------------
@POSIX
@pytest.mark.parametrize("argv, status", [
    (["inspect", "many"], 0), (["inspect", "many", "--json"], 0), (["inspect", "small"], 0),
    (["verify", "small"], 0), (["eval", "small", "axpy", "x=4", "y=4", "a=1"], 0),
    (["diff", "small", "other"], 1), (["--help"], 0),
])
def test_output_into_a_pipe_nobody_reads(files, argv, status) -> None:
    """Was: the rich tables (inspect, eval) exited 1 through rich's own handler; a short
    output (verify, --help, diff) failed at interpreter exit with "Exception ignored ...
    BrokenPipeError" and status 120. Now quiet, with the status the command had answered
    (diff: different)."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first byte: every write is EPIPE
    try:
        proc = _cli(*(files.get(a, a) for a in argv), stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (status, b"")


@POSIX
def test_head_in_a_shell_pipeline(files) -> None:
    kernelpack = f'"{sys.executable}" -m kernelpack'
    script = (f'set -eo pipefail; {kernelpack} inspect "{files["many"]}" | head -1; '
              f'{kernelpack} inspect "{files["many"]}" --json | head -c 10')
    proc = subprocess.run(["bash", "-c", script], env=_env(), capture_output=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout.startswith(b"format 1.0") and proc.stdout.endswith(b'{\n  "forma')


class _NoReader(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_extract_whose_reader_left_still_writes_every_file(files, capsys, tmp_path,
                                                           monkeypatch) -> None:
    """``extract F -o D | head -1``: was status 0 after the first file, the rest never written
    (a block-buffered stdout fails once its buffer fills, so many images in a real pipe)."""
    monkeypatch.setattr(sys, "stdout", _NoReader())
    code = main(["extract", str(files["small"]), "-o", str(tmp_path / "out")])
    assert (code, capsys.readouterr().err) == (0, "")
    assert len(list((tmp_path / "out").iterdir())) == 5


# ---- stdout that cannot be written: a full disk, a closed descriptor ---------------------------
class _FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("argv, status", [
    (["verify", "small"], 1), (["inspect", "small", "--json"], 1), (["inspect", "small"], 1),
    (["diff", "small", "other"], 2),
])
def test_a_full_stdout_is_named_as_such(files, capsys, monkeypatch, argv, status) -> None:
    """Was: ``error: [Errno 28] No space left on device``, which reads as if the artifact or
    an output file were at fault."""
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    code = main([str(files.get(a, a)) for a in argv])
    err = capsys.readouterr().err
    assert code == status
    assert err == "error: cannot write to standard output: No space left on device\n"


def test_a_closed_stdout_is_an_error(files, capsys, monkeypatch) -> None:
    """``kernelpack verify f >&-``: Python's sys.stdout is None, and print() dropped the
    report without a word, exit 0."""
    monkeypatch.setattr(sys, "stdout", None)
    code = main(["verify", str(files["small"])])
    assert (code, capsys.readouterr().err) == (
        1, "error: cannot write to standard output: standard output is closed\n")


@POSIX
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [["verify", "small"], ["inspect", "many"], ["--version"]])
def test_dev_full(files, argv) -> None:
    """Was: status 120 and Python's "Exception ignored in: <_io.TextIOWrapper ...>" at exit
    (block-buffered output only fails when flushed)."""
    with open("/dev/full", "w") as full:
        proc = _cli(*(files.get(a, a) for a in argv), stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr == b"error: cannot write to standard output: No space left on device\n"


# ---- Ctrl-C -------------------------------------------------------------------------------------
@POSIX
@pytest.mark.parametrize("sig, status, line", [
    (signal.SIGINT, EXIT_INTERRUPTED, b"error: interrupted\n"),
    (signal.SIGTERM, EXIT_TERMINATED, b"error: terminated\n"),  # session 15: kill, timeout(1)
], ids=["SIGINT", "SIGTERM"])
def test_sigint_exits_130_with_one_line(files, sig, status, line) -> None:
    """A real SIGINT while the command writes (blocked on a full pipe): was a traceback and
    death by signal; now ``error: interrupted`` and 130. SIGTERM the same way, with 143."""
    proc = subprocess.Popen([sys.executable, "-m", "kernelpack", "inspect", str(files["many"])],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.read(1)  # started, past its imports
        proc.send_signal(sig)  # it is blocked writing: the pipe's buffer is full
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (status, line)


def test_ctrl_c_in_extract_leaves_only_whole_files(files, capsys, tmp_path, monkeypatch) -> None:
    from kernelpack._images import ImageInfo

    reads = []
    real_read = ImageInfo.read

    def read(self: ImageInfo, keep: bool = True) -> bytes:
        if not keep:  # extract's own reads (read(keep=False) calls read() itself)
            reads.append(self)
        if len(reads) == 5:  # 3 checked first, then written: Ctrl-C before the second write
            raise KeyboardInterrupt
        return real_read(self, keep)

    monkeypatch.setattr(ImageInfo, "read", read)
    out = tmp_path / "out"
    try:
        code = main(["extract", str(files["big_image"]), "-o", str(out)])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): a traceback for the user")
    assert (code, capsys.readouterr().err) == (EXIT_INTERRUPTED, "error: interrupted\n")
    assert [p.name for p in out.iterdir()] == ["m0.sm_80.cubin"]  # no temporary left either
    assert (out / "m0.sm_80.cubin").stat().st_size == 4 + (256 << 10) + 1


def test_ctrl_c_in_cache_prune(capsys, tmp_path, monkeypatch) -> None:
    from kernelpack.cache.disk import DiskStore

    def evict(self: DiskStore, max_bytes: int) -> tuple[int, int]:
        raise KeyboardInterrupt

    monkeypatch.setattr(DiskStore, "evict", evict)
    try:
        code, _, err = run(capsys, "cache", "prune", "--dir", tmp_path, "--max-bytes", "1M")
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): a traceback for the user")
    assert (code, err) == (EXIT_INTERRUPTED, "error: interrupted\n")


@POSIX
def test_extract_that_fails_half_way_leaves_no_truncated_file(files, tmp_path) -> None:
    """A write that fails part-way (here a 64 KiB file size limit, as a full disk would):
    was a 64 KiB ``m0.sm_80.cubin`` under its final name, for cuobjdump to choke on."""
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death by signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    out = tmp_path / "out"
    proc = _cli("extract", files["big_image"], "-o", out, capture_output=True,
                preexec_fn=limit)
    assert proc.returncode == 1 and b"File too large" in proc.stderr, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"Traceback" not in proc.stderr
    assert list(out.iterdir()) == []


# ---- paths --------------------------------------------------------------------------------------
def test_dash_is_not_stdin_and_says_so(capsys, tmp_path, monkeypatch) -> None:
    """Was: ``error: -: no such file``, as if a file named '-' were missing."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "inspect", "-")
    assert code == 1 and "standard input is not supported" in err and err.count("\n") == 1


def test_odd_file_names(files, capsys, tmp_path, monkeypatch) -> None:
    """A name with spaces, and one that is not UTF-8, on a strict UTF-8 stdout (a UTF-8
    locale other than C.UTF-8): was ``error: 'utf-8' codec can't encode character '\\udcff'``
    and status 1 for a good artifact."""
    data = files["small"].read_bytes()
    spaced = tmp_path / "with space.kpack"
    spaced.write_bytes(data)
    odd = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"bad\xffname.kpack")))
    try:
        odd.write_bytes(data)
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses a name that is not UTF-8")
    assert run(capsys, "verify", spaced)[0] == 0
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(["verify", str(odd)])
    stdout.flush()
    text = stdout.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]
    assert code == 0, capsys.readouterr().err
    assert text.startswith("OK: ") and "bad\\udcffname.kpack" in text
    code = main(["extract", str(odd), "-o", str(odd) + ".d"])
    assert code == 0, capsys.readouterr().err


def test_unreadable_file(files, capsys, monkeypatch) -> None:
    """No read permission (monkeypatched: root reads anything): one line naming the file."""
    from kernelpack import loader

    def denied(path: str, flags: int) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(loader, "_open_nonblocking", denied)
    for argv, status in ((["inspect", files["small"]], 1), (["verify", files["small"]], 1),
                         (["diff", files["small"], files["small"]], 2)):
        code, out, err = run(capsys, *argv)
        assert (code, out, err) == (status, "", f"error: {files['small']}: Permission denied\n")


@pytest.mark.parametrize("where, message", [
    ("file", "exists and is not a directory"), ("file/sub", "Not a directory"),
])
def test_extract_into_a_bad_place(files, capsys, tmp_path, where, message) -> None:
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "extract", files["small"], "-o", tmp_path / where)
    assert code == 1 and message in err and err.count("\n") == 1


# ---- eval's values ------------------------------------------------------------------------------
def test_eval_without_values_is_a_usage_error_naming_only_what_is_missing(files, capsys) -> None:
    """Was: "the following arguments are required: program, NAME=VALUE", though a program
    without inputs needs no NAME=VALUE."""
    with pytest.raises(SystemExit) as info:
        main(["eval", str(files["small"])])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.rstrip().endswith("required: program")
    code, _, err = run(capsys, "eval", files["small"], "axpy")  # now the program names them
    assert code == 1 and "missing input(s) ['x', 'y']" in err


@pytest.mark.parametrize("values, message", [
    (["x=", "y="], "x has rank 0 (shape ()), expected rank 1"),
    (["x=-1", "y=-1"], "x.shape[0] is -1, a negative size"),
    (["x=1e3", "y=4"], "x: expected a shape of integers (got '1e3')"),
    (["x=4096,1000,7", "y=4"], "x has rank 3 (shape (4096, 1000, 7)), expected rank 1"),
    (["x=4", "y=4", "q=1"], "axpy has no input 'q' (inputs: x, y, a)"),
    (["x=4"], "missing input(s) ['y']"),
    (["x=4", "y=4", "a=abc"], "a: expected a number (got 'abc')"),
    (["x=4", "y=5"], "y.shape[0] is 5 but n = 4 from x.shape[0]"),
])
def test_eval_errors_name_the_parameter(files, capsys, values, message) -> None:
    code, out, err = run(capsys, "eval", files["small"], "axpy", *values)
    assert (code, out) == (1, "") and message in err and err.count("\n") == 1


def test_eval_trailing_comma_is_a_1d_shape(files, capsys) -> None:
    code, out, _ = run(capsys, "eval", files["small"], "axpy", "x=4096,", "y=4096", "--json")
    assert code == 0 and '"n": 4096' in out


# ---- what the exit statuses are, and that --help says so ----------------------------------------
def test_help_lists_the_exit_statuses(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert info.value.code == 0
    for fact in ("exit status: 0 success", "2 a usage error", "130 interrupted", "I/O error"):
        assert fact in out, fact
