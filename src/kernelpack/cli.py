"""The ``kernelpack`` command: build artifacts and look inside them without a GPU.

``build`` (:mod:`kernelpack.cli_build`), ``inspect``, ``verify``, ``extract``, ``eval``,
``diff``, ``keygen`` and ``sign``; ``cache`` when :mod:`kernelpack.cli_cache` is installed.
Every subcommand has ``--help``. Exit status: 0 on success (``diff``: identical), 1 on a bad
file, a failed check or compile, an I/O error or a difference (one line ``error: <message>``
on stderr), 2 on a usage error (argparse), 130 when interrupted (Ctrl-C), 143 when terminated
(SIGTERM). Output cut short because its reader left (``| head -1``) is not an error. Nothing
here touches a GPU.

This module is the command line itself: the parser, the types of its options, and
:func:`main`'s mapping of failures to exit statuses. What each subcommand does is
:mod:`kernelpack.cli_commands`.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import io
import os
import re
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from .cli_commands import EXTENSIONS  # noqa: F401 - kernelpack.cli.EXTENSIONS, as before
from .cli_commands import (DEFAULT_KEY_NAME, CLIError, UsageError, cmd_diff, cmd_eval,
                           cmd_extract, cmd_inspect, cmd_keygen, cmd_sign, cmd_verify,
                           parse_assignment, safe_filename)
from ._interrupts import deferred_interrupts
from .errors import KernelPackError

__all__ = ["main", "build_parser", "parse_assignment", "safe_filename", "EXIT_INTERRUPTED",
           "EXIT_TERMINATED"]

# 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
EXIT_INTERRUPTED = 130
# 128 + SIGTERM: `kill`, a timeout(1), a container stopping
EXIT_TERMINATED = 143

_EXIT_STATUS = """exit status: 0 success (diff: identical); 1 a bad file, a failed check or an I/O
error (diff: different); 2 a usage error (diff: also any error); 130 interrupted; 143
terminated (SIGTERM). Errors are one
line 'error: <message>' on stderr, never mixed into the JSON of --json on stdout."""


# ---- argument types -----------------------------------------------------------------------------
def _arch(text: str) -> str:
    """A device's compute capability as ``sm_XY``: an ``a``/``f`` suffix qualifies compile
    targets, not devices, so ``sm_100f`` is the device ``sm_100`` (as ``compute_103`` is
    ``sm_103``); it was echoed as the device, beside "loads cubin sm_100a"."""
    from .targets import parse_arch

    try:
        arch = parse_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"sm_{arch.major}{arch.minor}"


def _driver(text: str) -> int:
    """``12.4`` -> 12040, the ``cuDriverGetVersion`` encoding."""
    match = re.fullmatch(r"(\d{1,3})\.(\d)", text.strip())  # CUDA minors are 0..9
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"expected a CUDA version such as 12.4 (got {text!r})")
    return int(match.group(1)) * 1000 + int(match.group(2)) * 10


def path_arg(text: str) -> str:
    """A path option's value; refused when empty: ``-o "$OUT"`` with ``$OUT`` unset must not
    mean "here" (``Path("")`` is the working directory) nor "the default"."""
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return text


def name_arg(text: str) -> str:
    """A program, parameter or attribute name as typed. Under a locale that is not UTF-8
    (``LC_ALL=C`` with ``PYTHONUTF8=0``: cron, minimal containers) Python holds a command
    line's non-ASCII bytes as lone surrogates, while names in an artifact (and Python
    identifiers) are UTF-8: ``eval f.kpack prögram`` found no program ``pr\\udcc3\\udcb6gram``.
    Paths stay as given: the file system takes them back in its own encoding."""
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeError:  # not UTF-8 bytes, or not from a command line: as it is
        return text


def dir_arg(text: str) -> Path:
    """A directory option's value as a Path (:func:`path_arg`: never empty)."""
    return Path(path_arg(text))


# `extract` writes every image's raw bytes; a small hostile file can declare thousands of
# images of MAX_IMAGE_SIZE (1 GiB) each sharing one tiny zstd blob: refused above this total
EXTRACT_LIMIT = 4 << 30


def _size(text: str) -> int:
    """``4096``, ``512M``, ``4G`` (powers of 1024) -> bytes (:func:`config.parse_size`)."""
    from .config import parse_size

    size = parse_size(text, max_digits=15)
    if size is None:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 4096, 512M or 4G "
                                         f"(got {text!r})")
    return size


# ---- parser --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="kernelpack", description="Build, inspect, verify and sign kernelpack artifacts "
        "(no GPU needed).", epilog=_EXIT_STATUS)
    parser.add_argument("--version", action="version", version=f"kernelpack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=fn, usage_parser=p)
        return p

    p = add("inspect", cmd_inspect, "show programs, launches and images of an artifact (and "
                                    "which out=/inout arrays may not be an input's memory)")
    p.add_argument("file", help="a .kpack artifact")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--device", type=_arch, metavar="sm_XY",
                   help="explain which image each module would load on this GPU architecture")
    p.add_argument("--driver", type=_driver, metavar="X.Y",
                   help="with --device: also apply the rules of this CUDA driver version")

    p = add("verify", cmd_verify, "verify everything, every image included")
    p.add_argument("file", help="a .kpack artifact")
    p.add_argument("--trusted-key", action="append", metavar="PUB",
                   help="public key file (or hex); the artifact must be signed by one of them")

    p = add("extract", cmd_extract,
            "write every image, decompressed, as files for cuobjdump / nvdisasm")
    p.add_argument("file", help="a .kpack artifact")
    p.add_argument("-o", "--output", required=True, type=path_arg, metavar="DIR",
                   help="output directory")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--max-bytes", type=_size, default=EXTRACT_LIMIT, metavar="SIZE",
                   help="refuse to write more than this in total (default 4G; K/M/G/T "
                        "suffixes are powers of 1024)")

    p = add("eval", cmd_eval, "evaluate a program's plan for given shapes and scalars")
    p.add_argument("file", help="a .kpack artifact")
    p.add_argument("program", type=name_arg, help="program name (inspect lists them)")
    p.add_argument("values", nargs="*", default=[], metavar="NAME=VALUE",  # default: optional
                   type=name_arg,
                   help="tensor shapes (x=4096,1000) and scalars (s=3, a=0.5, flag=true)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    p = add("diff", cmd_diff, "compare two artifacts (exit 0 identical, 1 different, 2 on an error)")
    p.add_argument("a", help="the old artifact")
    p.add_argument("b", help="the new artifact")

    p = add("keygen", cmd_keygen, "create an ed25519 key pair for signing artifacts")
    p.add_argument("-o", "--output", default=DEFAULT_KEY_NAME, type=path_arg, metavar="NAME",
                   help=f"private key path (default {DEFAULT_KEY_NAME}, in the current "
                        f"directory); the public key goes to NAME.pub (so NAME itself may not "
                        f"end in .pub). An existing key is never overwritten")

    p = add("sign", cmd_sign, "re-save an artifact with an ed25519 signature")
    p.add_argument("file", help="a .kpack artifact")
    p.add_argument("--key", required=True, type=path_arg,
                   help="private key file written by keygen")
    p.add_argument("-o", "--output", type=path_arg, metavar="OUT",
                   help="output path (default: in place)")

    from . import cli_build

    cli_build.register(sub)
    if importlib.util.find_spec("kernelpack.cli_cache") is not None:
        from . import cli_cache  # type: ignore[attr-defined]

        cli_cache.register(sub)
    return parser


def _tolerant_output() -> None:
    """On a terminal that cannot encode every character (``PYTHONIOENCODING=ascii``), show a
    non-ASCII name from the artifact as ``\\xf1`` instead of failing half-way through the
    output with UnicodeEncodeError. UTF-8 streams are left as they are (:class:`_Stdout`
    escapes what even UTF-8 cannot write)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if (isinstance(stream, io.TextIOWrapper) and encoding != "utf8"
                and stream.errors == "strict"):
            stream.reconfigure(errors="backslashreplace")


class _OutputError(OSError):
    """A write to standard output failed (a full disk, a closed descriptor): reported as that,
    since the OSError of a failed write names no file and would read as one of the files the
    command works on."""


class _Stdout:
    """``sys.stdout`` while :func:`main` runs: a failed write raises :class:`_OutputError` (a
    closed pipe stays BrokenPipeError). A closed descriptor (``>&-``, where Python's
    ``sys.stdout`` is None and print() would drop the output without a word) fails the same
    way. A path that is not UTF-8 (``bad\\xffname.kpack``, held by Python as lone surrogates)
    is written escaped, as error messages show it: on a strict UTF-8 stdout (a UTF-8 locale
    other than C.UTF-8) ``verify`` of a good file with such a name failed with a codec error.
    Everything else is the stream's own."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        #: the first failed write: argparse's --help and --version swallow it (exit 0, nothing
        #: printed), so :func:`_main` raises it after them
        self.failed: _OutputError | None = None

    def write(self, text: str) -> int:
        try:
            return int(self._call("write", text))
        except UnicodeEncodeError:  # nothing was written: the text is encoded first
            encoding = getattr(self._stream, "encoding", None) or "utf-8"
            return int(self._call("write", text.encode(encoding, "backslashreplace")
                                  .decode(encoding)))

    def flush(self) -> None:
        if self._stream is not None:  # nothing was written to a closed descriptor: no failure
            self._call("flush")

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def _call(self, name: str, *args: Any) -> Any:
        if self._stream is None:
            self.failed = self.failed or _OutputError(errno.EBADF, "standard output is closed")
            raise self.failed
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = self.failed or _OutputError(exc.errno, exc.strerror or str(exc))
            raise self.failed from None

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def _discard_stdout() -> None:
    """Drop what is still buffered for standard output (for a reader that left, or a full
    disk): flushed into /dev/null through descriptor 1 for a moment, then descriptor 1 is put
    back. Otherwise it failed again at exit, as Python's "Exception ignored ...
    BrokenPipeError" and status 120. Pointing descriptor 1 at /dev/null for good (the recipe
    of the :mod:`signal` docs) made every later ``main()`` of the same process, a service's
    next call, report success for output that went nowhere."""
    stream = getattr(sys.stdout, "_stream", sys.stdout)  # the stream under _Stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a file (tests' capture)
        return
    with deferred_interrupts():  # descriptor 1 put back and nothing lost, whatever arrives
        _flush_into_devnull(stream, fd)


def _flush_into_devnull(stream: Any, fd: int) -> None:
    try:  # no descriptor to spare (EMFILE): the buffer stays, as without this clean-up
        saved = os.dup(fd)
    except OSError:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        os.close(saved)
        return
    try:
        os.dup2(devnull, fd)
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


class _Terminated(BaseException):
    """SIGTERM, raised where the command is (as Ctrl-C raises KeyboardInterrupt), so that what
    it was writing is cleaned up: the default action ends the process on the spot, leaving
    ``extract``'s or ``sign``'s temporary file beside its target."""


def _terminate(signum: int, frame: Any) -> None:
    raise _Terminated


def _catch_sigterm() -> Any:
    """Turn SIGTERM into :class:`_Terminated` while a command runs; the previous handler (to
    restore), or None where nothing was changed: a thread other than the main one cannot set
    handlers, and a handler the embedding program installed is its own."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None
        return signal.signal(signal.SIGTERM, _terminate)
    except (ValueError, OSError, AttributeError):  # no SIGTERM to catch on this platform
        return None


# main() swaps the process's sys.stdout (and a build, its sys.path and sys.modules): calls
# from several threads of one process run one at a time, or each left the next one's wrapper
# behind as sys.stdout (a chain that grew per call, and crashed).
_MAIN_LOCK = threading.RLock()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kernelpack`` console script; returns the exit status. Calls from
    several threads of one process run one at a time."""
    previous = None
    try:  # a Ctrl-C or SIGTERM anywhere, set-up and parsing included, is the same exit status
        with _MAIN_LOCK:
            stdout = sys.stdout
            try:
                _tolerant_output()
                sys.stdout = _Stdout(stdout)  # type: ignore[assignment]
                previous = _catch_sigterm()
                with warnings.catch_warnings():  # restores the application's hook after
                    warnings.showwarning = _show_warning
                    return _main(argv)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGTERM, previous)
                sys.stdout = stdout
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback; extract leaves no partial file
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated:  # SIGTERM: the same, with the status a shell gives a killed command
        print("error: terminated", file=sys.stderr)
        return EXIT_TERMINATED


def _show_warning(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, file: Any = None, line: str | None = None) -> None:
    """A warning as one ``warning:`` line on stderr, like the ``error:`` lines: Python's own
    format showed a kernelpack source line and path, which say nothing to a command's user
    (review 35)."""
    try:
        print(f"warning: {_one_line(str(message))}", file=sys.stderr if file is None else file)
    except OSError:  # stderr closed or full: a warning is not worth failing the command
        pass


def _one_line(message: str) -> str:
    """``message`` as one printable line (its lines joined by "; "), as the CLI prints its
    ``error:`` and ``warning:`` lines."""
    from .cli_facts import printable

    return printable("; ".join(line.strip() for line in message.splitlines() if line.strip()))


def _main(argv: Sequence[str] | None) -> int:
    """:func:`main` with ``sys.stdout`` guarded: every failure becomes one line on stderr and
    an exit status. Output is flushed here, not at interpreter exit, where a closed pipe or
    a full disk became "Exception ignored ... BrokenPipeError" and status 120."""
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit:  # --help and --version: flushed while a failure can be reported
            sys.stdout.flush()
            failed = getattr(sys.stdout, "failed", None)
            if failed is not None:  # argparse printed them and swallowed the failure
                raise failed from None
            raise
        if extra and args.command in ("eval", "build") and not any(
                e.startswith("-") for e in extra):
            # `eval FILE PROG --json x=4096`, `build src.py -o m.kpack gelu`: argparse ends a
            # `*` positional at the first option
            if args.command == "eval":
                args.values += [name_arg(e) for e in extra]
            else:
                args.names += [name_arg(e) for e in extra]
        elif extra:  # the command's own usage, with its options, not the top-level one
            chosen = getattr(args, "usage_parser", None) or parser
            chosen.error(f"unrecognized arguments: {' '.join(extra)}")
        status = int(args.func(args))
        sys.stdout.flush()
        return status
    except UsageError as exc:
        print(f"{parser.prog} {getattr(args, 'command', '')}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kernelpack inspect big.kpack | head`: the reader left, not an error
        _discard_stdout()
        # diff's answer is known before it prints: `diff a b | head -1` still says "different"
        return int(getattr(args, "answer", 0))
    except _OutputError as exc:  # `> /dev/full`, `>&-`: the output is lost, and that is an error
        _discard_stdout()
        print(f"error: cannot write to standard output: {exc.strerror}", file=sys.stderr)
        return 2 if getattr(args, "command", None) == "diff" else 1
    except (KernelPackError, CLIError, OSError, ValueError, Warning) as exc:
        # Warning: one turned into an exception (PYTHONWARNINGS=error) is an error line too
        message = str(exc)
        if isinstance(exc, OSError) and exc.filename is not None:
            message = f"{exc.filename}: {exc.strerror or exc}"
        print(f"error: {_one_line(message) or type(exc).__name__}", file=sys.stderr)
        # diff answers 1 for "different", so trouble is 2 there (as for diff(1) and cmp(1))
        return 2 if getattr(args, "command", None) == "diff" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
