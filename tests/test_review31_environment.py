"""Thirty-first review: kernelpack in a hostile environment (containers, CI runners, cron).

Path kinds (long names, ``os.PathLike`` of bytes, symlinks, FIFOs, a deleted working
directory), process limits (``RLIMIT_NOFILE``, ``RLIMIT_FSIZE``), the umask, the locale and
stdout that cannot be written. Each limit, umask or locale is set in a subprocess; fake images
only (no GPU, no toolkit). Black-box: written from the README, ``--help`` and docstrings.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main
from kernelpack.summary import Compiled, Image, Module

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples

POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX paths, rlimits and FIFOs")
PY = sys.executable
SRC = str(Path(kp.__file__).parents[1])


def _env(**extra: str) -> dict[str, str]:
    """A user's shell: no PYTHONUNBUFFERED / PYTHONIOENCODING from this harness."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONUTF8")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _py(code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-c", code], env=_env(), capture_output=True, text=True, check=False,
                          timeout=60, **kwargs)  # type: ignore[call-overload]


def _cli(argv: list[object], env: dict[str, str] | None = None,
         **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    args = [a if isinstance(a, bytes) else str(a) for a in argv]
    kwargs.setdefault("timeout", 60)
    return subprocess.run([PY, "-m", "kernelpack", *args], env=env or _env(), check=False,
                          capture_output=True, **kwargs)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    out = {"small": d / "small.kpack", "key": d / "team", "big": d / "big.kpack",
           "uni": d / "uni.kpack"}
    kp.save([kp_samples.axpy()], out["small"])
    kp.save([kp_samples.axpy("pr\u00f6gram", "m\u00f6dul")], out["uni"])
    # over 1 MiB: kp.load memory-maps it and the pack holds two descriptors while it lives
    big = Compiled(kp_samples.tiny().summary, (Module("m", ("k",), (
        Image("cubin", "sm_80", kp_samples._noise(1_200_000), "t", 12080),)),))
    kp.save([big], out["big"])
    assert main(["keygen", "-o", str(out["key"])]) == 0
    return out


# ---- names: the longest legal file name ------------------------------------------------------
@POSIX
@pytest.mark.parametrize("length", [240, 250, 255])
def test_save_to_a_name_of_up_to_255_bytes(tmp_path: Path, length: int) -> None:
    """NAME_MAX is 255 bytes, but kp.save's temporary (``.<name>.xxxxxxxx.tmp``) is 14 bytes
    longer than the name: a name of 242..255 bytes was ``OSError: [Errno 36] File name too
    long`` naming the file asked for, although that name is legal."""
    target = tmp_path / ("n" * (length - 6) + ".kpack")
    assert len(os.fsencode(target.name)) == length
    kp.save([kp_samples.axpy()], target)
    assert kp.load(target).programs == ["axpy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


@POSIX
def test_sign_to_a_name_of_255_bytes(files, tmp_path: Path, capsys) -> None:
    """``kernelpack sign a.kpack --key K -o <255-byte name>``: was exit 1, 'File name too
    long' (the same temporary name)."""
    target = tmp_path / ("s" * 249 + ".kpack")
    code = main(["sign", str(files["small"]), "--key", str(files["key"]), "-o", str(target)])
    assert (code, capsys.readouterr().err) == (0, "")
    assert kp.load(target, trusted_keys=[str(files["key"]) + ".pub"]).programs == ["axpy"]


def test_path_kinds_that_work(files, tmp_path: Path) -> None:
    """Regression: str, Path, a str os.PathLike, non-UTF-8 (surrogate-escaped) names, spaces,
    newlines and a leading dash all round-trip through save and load."""
    class Named:
        def __init__(self, p: str) -> None:
            self.p = p

        def __fspath__(self) -> str:
            return self.p

    names = ["plain.kpack", "a b\nc.kpack", "-dash.kpack", "\u00fcn\u00ef \u65e5.kpack",
             os.fsdecode(b"\xff\xfe.kpack")]
    for i, name in enumerate(names):
        for kind in (str, Path, Named):
            target = kind(str(tmp_path / f"{i}{name}"))
            kp.save([kp_samples.axpy()], target)
            assert kp.load(target).programs == ["axpy"]


class _BytesPath:
    """An ``os.PathLike[bytes]``: what ``os.fsencode`` users and some path libraries hand on."""

    def __init__(self, path: bytes) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return self.path


@POSIX
@pytest.mark.parametrize("api", ["save path_or_file", "Cache path", "load trusted_keys",
                                 "save sign_with"])
def test_a_bytes_pathlike_works_or_is_refused_by_name(files, tmp_path: Path, api: str) -> None:
    """kp.load takes an os.PathLike returning bytes; the other path parameters failed deep
    inside with messages that name neither the parameter nor what it takes:
    ``TypeError: Can't mix bytes and non-bytes in path components.`` (save),
    ``trusted_keys: endswith first arg must be bytes or a tuple of bytes, not str``."""
    key, pub = os.fsencode(files["key"]), os.fsencode(str(files["key"]) + ".pub")
    signed = tmp_path / "signed.kpack"
    kp.save([kp_samples.axpy()], signed, sign_with=files["key"])
    calls = {
        "save path_or_file": ("path_or_file", lambda: kp.save(
            [kp_samples.axpy()], _BytesPath(os.fsencode(tmp_path / "b.kpack")))),
        "Cache path": ("path", lambda: kp.Cache(_BytesPath(os.fsencode(tmp_path / "c")),
                                                remote=False)),
        "load trusted_keys": ("trusted_keys", lambda: kp.load(
            signed, trusted_keys=[_BytesPath(pub)])),
        "save sign_with": ("sign_with", lambda: kp.save([kp_samples.axpy()],
                                                        sign_with=_BytesPath(key))),
    }
    param, call = calls[api]
    try:
        call()
    except (TypeError, ValueError) as exc:  # refusing is fine, if the message says what/why
        assert param in str(exc) and "PathLike" in str(exc), str(exc)


# ---- symlinks and special files ------------------------------------------------------------------
@POSIX
def test_save_to_a_symlink_loop_does_not_replace_the_link(tmp_path: Path) -> None:
    """kp.save follows a symbolic link (its docstring). A link that cannot be followed (a
    loop, ELOOP for open()) was silently replaced by a regular file, losing the link."""
    link = tmp_path / "model.kpack"
    os.symlink("model.kpack", link)
    try:
        kp.save([kp_samples.axpy()], link)
    except OSError as exc:
        assert str(link) in str(exc)
    assert os.path.islink(link), "the symbolic link was replaced by a regular file"


@POSIX
@pytest.mark.parametrize("what", ["inspect a symlink loop", "build a FIFO"])
def test_cli_does_not_call_an_existing_path_missing(tmp_path: Path, what: str) -> None:
    """``kernelpack inspect LOOP`` said ``no such file`` (kp.load says 'Too many levels of
    symbolic links'); ``kernelpack build FIFO -o x`` said ``no such file`` of a FIFO that is
    there (inspect says 'not a regular file')."""
    if what.endswith("loop"):
        path = tmp_path / "loop.kpack"
        os.symlink("loop.kpack", path)
        argv = ["inspect", str(path)]
    else:
        path = tmp_path / "kernels.py"
        os.mkfifo(path)
        argv = ["build", str(path), "-o", str(tmp_path / "out.kpack")]
    proc = _cli(argv, timeout=20)  # a subprocess: reading a FIFO must not block the suite
    err = proc.stderr.decode()
    assert proc.returncode == 1 and str(path) in err, err
    assert "no such file" not in err.lower(), err


@POSIX
def test_special_files_are_refused_without_blocking(files, tmp_path: Path) -> None:
    """Regression: a FIFO with no writer and /dev/zero are refused at once, as artifacts and
    as key files, in the API and the CLI (no hang, no endless read)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for special in (str(fifo), "/dev/zero"):
        with pytest.raises(kp.FormatError, match="not a regular file"):
            kp.load(special)
        with pytest.raises(ValueError, match="trusted_keys.*not a regular file"):
            kp.load(files["small"], trusted_keys=[special])
    proc = _cli(["verify", files["small"], "--trusted-key", fifo])
    assert proc.returncode == 1
    assert proc.stderr == f"error: {fifo}: not a regular file (a key file is expected)\n".encode()


# ---- process limits ------------------------------------------------------------------------------
@POSIX
def test_packs_dropped_in_a_loop_give_back_their_descriptors(files) -> None:
    """A pack over 1 MiB holds two descriptors 'while it lives'. ``pack[name]`` and
    ``pack.verify()`` left reference cycles, so a dropped pack lived until the cyclic
    collector ran: a reload loop under ``ulimit -n 32`` died with EMFILE after ~60 loads."""
    code = f"""
import resource, kernelpack as kp
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
for i in range(150):
    pack = kp.load({str(files["big"])!r})
    pack.verify()
    pack["t"].plan(x=(5,))
    del pack
print("ok")
"""
    proc = _py(code)
    assert (proc.returncode, proc.stdout, proc.stderr[-300:]) == (0, "ok\n", "")


@POSIX
def test_out_of_descriptors_names_the_file(files) -> None:
    """With every descriptor in use (packs kept on purpose) kp.load raised a bare
    ``OSError: [Errno 24] Too many open files`` (an ``os.dup``), naming no file; the CLI
    printed ``error: [Errno 24] Too many open files``."""
    code = f"""
import resource, kernelpack as kp
resource.setrlimit(resource.RLIMIT_NOFILE, (24, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
keep = []
try:
    for i in range(40):
        keep.append(kp.load({str(files["big"])!r}))
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    proc = _py(code)
    assert "Too many open files" in proc.stdout, proc.stdout + proc.stderr
    assert str(files["big"]) in proc.stdout, proc.stdout


def _fsize(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return set_limit


@POSIX
def test_a_save_over_the_file_size_limit_keeps_the_old_file(tmp_path: Path) -> None:
    """Regression: RLIMIT_FSIZE below the artifact's size: EFBIG naming the file, the old
    artifact intact, no temporary left; a cache put warns and leaves no entry."""
    old = tmp_path / "model.kpack"
    kp.save([kp_samples.tiny()], old)
    before = old.read_bytes()
    code = f"""
import resource, sys, warnings
sys.path.insert(0, {str(Path(__file__).parent)!r})
import kp_samples, kernelpack as kp
resource.setrlimit(resource.RLIMIT_FSIZE, (1500, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    kp.save([kp_samples.axpy()], {str(old)!r})
except OSError as exc:
    print("save", exc.errno, exc.filename)
cache = kp.Cache({str(tmp_path / "cache")!r}, remote=False)
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    cache.put("ab" * 32, kp.save([kp_samples.axpy()]))
print("put", [str(w.message)[:60] for w in got], cache.get("ab" * 32))
"""
    proc = _py(code)
    assert proc.stdout.splitlines()[0] == f"save {errno.EFBIG} {old}", proc.stdout + proc.stderr
    assert "disk cache write of abababababababab failed" in proc.stdout
    assert proc.stdout.rstrip().endswith("None")
    assert old.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["model.kpack"]
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


@POSIX
def test_keygen_over_the_file_size_limit_names_the_file(tmp_path: Path) -> None:
    """``ulimit -f`` tiny: was ``error: [Errno 27] File too large`` without saying which
    file (the private key? the .pub?). Nothing is left behind (right already)."""
    key = tmp_path / "team"
    proc = _cli(["keygen", "-o", key], preexec_fn=_fsize(20))
    assert proc.returncode == 1
    assert str(key).encode() in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


# ---- the umask: a cache directory others can write runs their code -------------------------------
@POSIX
@pytest.mark.parametrize("umask", [0o002, 0o000], ids=["umask002", "umask000"])
def test_cache_directories_are_never_group_or_world_writable(tmp_path: Path, umask: int) -> None:
    """README: whoever can write the cache directory can run code in the processes that use
    it; 'keep it writable by its user only (the default ~/.cache/kernelpack is)'. Under
    umask 002 (GitLab runners, many containers) or 000 kernelpack created the default cache
    root, entries/ and locks/ as 0775 / 0777: any local user (or group member) could plant
    an unsigned entry, which is taken as this machine's own compile. (Files were 0644.)
    The XDG base directory spec asks for 0700 on directories it creates."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import kp_samples, kernelpack as kp
os.umask({umask})
cache = kp.Cache(remote=False)
cache.fetch_or_compile("ab" * 32, lambda: kp_samples.axpy(), name="axpy")
print(cache)
"""
    env = _env(HOME=str(home))
    for var in ("KERNELPACK_CACHE_DIR", "XDG_CACHE_HOME", "KERNELPACK_REMOTE_CACHE"):
        env.pop(var, None)
    proc = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    root = home / ".cache" / "kernelpack"
    assert str(root) in proc.stdout
    created = [home / ".cache", root, *root.rglob("*")]
    writable = {str(p.relative_to(home)): oct(stat.S_IMODE(p.stat().st_mode)) for p in created
                if p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)}
    assert writable == {}


# ---- a deleted working directory -----------------------------------------------------------------
@POSIX
def test_relative_paths_in_a_deleted_working_directory_are_named(tmp_path: Path,
                                                                monkeypatch, capsys) -> None:
    """A cron job whose directory was removed under it: ``kp.save(p, "model.kpack")``,
    ``kp.Cache("cache")`` and ``kernelpack cache stats --dir cache`` each failed with a bare
    ``[Errno 2] No such file or directory`` (os.getcwd inside abspath), naming no path and
    not saying that the working directory is gone."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(OSError) as saved:
        kp.save([kp_samples.axpy()], "model.kpack")
    assert "model.kpack" in str(saved.value)
    with pytest.raises((OSError, ValueError)) as cached:
        kp.Cache("cache", remote=False)
    assert "cache" in str(cached.value)
    code, err = main(["cache", "stats", "--dir", "cache"]), capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "cache" in err.split(":", 1)[1], err


# ---- stdout that cannot be written --------------------------------------------------------------
@POSIX
@pytest.mark.parametrize("argv, how", [
    (["--version"], "closed"), (["--help"], "closed"), (["inspect", "--help"], "closed"),
    (["--version"], "full-unbuffered"), (["--help"], "full-unbuffered"),
], ids=["version-closed", "help-closed", "inspect-help-closed", "version-full-unbuffered",
        "help-full-unbuffered"])
def test_help_and_version_into_an_unwritable_stdout(argv: list[str], how: str) -> None:
    """README: exit 1 for an I/O error, 'stdout that cannot be written, as > /dev/full,
    included'; ``verify f >&-`` says so. ``--help`` and ``--version`` exited 0 having
    printed nothing when stdout was closed, and also into /dev/full under
    PYTHONUNBUFFERED=1 (set in most Python container images): argparse swallows the
    OSError."""
    if how == "closed":
        proc = subprocess.run(["bash", "-c", '"$0" -m kernelpack "$@" >&-', PY, *argv],
                              env=_env(), capture_output=True, timeout=60, check=False)
    else:
        with open("/dev/full", "w") as full:
            proc = subprocess.run([PY, "-m", "kernelpack", *argv], stdout=full,
                                  stderr=subprocess.PIPE, env=_env(PYTHONUNBUFFERED="1"),
                                  timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(b"error: cannot write to standard output"), proc.stderr


# ---- locale: the C locale without UTF-8 mode -----------------------------------------------------
@POSIX
def test_eval_of_a_non_ascii_program_in_the_c_locale(files) -> None:
    """``LC_ALL=C PYTHONUTF8=0 kernelpack eval uni.kpack prögram ...``: argv arrives
    surrogate-escaped ('pr\\udcc3\\udcb6gram'), and eval said ``no program
    'pr\\udcc3\\udcb6gram' ... (programs: pr\\xf6gram)`` for the program that is there
    (inspect lists it). The names in an artifact are UTF-8, and so are the bytes typed."""
    env = _env(LC_ALL="C", PYTHONUTF8="0")
    proc = _cli(["eval", files["uni"], "pr\u00f6gram".encode(), "x=10", "y=10", "a=1",
                 "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["program"] == "pr\u00f6gram"


@POSIX
def test_json_parses_in_every_locale(files) -> None:
    """Regression: ``--json`` is valid JSON holding the real names under LANG=C,
    PYTHONIOENCODING=ascii and the C locale without UTF-8 mode."""
    for extra in ({"LANG": "C", "LC_ALL": "POSIX"}, {"PYTHONIOENCODING": "ascii"},
                  {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}):
        proc = _cli(["inspect", "--json", files["uni"]], env=_env(**extra))
        assert proc.returncode == 0 and proc.stderr == b"", (extra, proc.stderr)
        assert "pr\u00f6gram" in json.dumps(json.loads(proc.stdout), ensure_ascii=False)


# ---- names with control characters in the reports ---------------------------------------------
@POSIX
def test_verify_prints_one_line_whatever_the_file_is_called(files, tmp_path: Path) -> None:
    """Errors escape a path (``error: ...missing\\udcff: no such file``) but the success
    lines of verify, sign, build, keygen and extract printed it raw: a name holding a newline
    and an escape sequence split ``verify``'s one-line report in two, the second line
    reading as the file's own ``OK:``, and sent the escape to the terminal."""
    name = tmp_path / "x.kpack\nOK: other.kpack: 1 program(s)\x1b[2J"
    name.write_bytes(files["small"].read_bytes())
    proc = _cli(["verify", name])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(b"\n") == 1 and b"\x1b" not in proc.stdout, proc.stdout


# ---- toolchain files (added by the lead) ---------------------------------------------------------
@POSIX
def test_libdevice_override_that_is_no_regular_file_says_so(tmp_path: Path,
                                                             monkeypatch) -> None:
    """``KERNELPACK_LIBDEVICE`` naming a FIFO (or a directory) said "libdevice.10.bc not
    found ... Searched: <it>", of a file that is there: now it says what is wrong with it."""
    from kernelpack.toolchain import libdevice

    fifo = tmp_path / "libdevice.fifo"
    os.mkfifo(fifo)
    for target in (fifo, tmp_path):
        monkeypatch.setenv("KERNELPACK_LIBDEVICE", str(target))
        libdevice.find.cache_clear()
        try:
            with pytest.raises(kp.CompileError, match="is not a regular file") as err:
                libdevice.find()
            assert str(target) in str(err.value)
        finally:
            libdevice.find.cache_clear()


@POSIX
def test_a_cache_directory_that_is_a_symlink_loop_is_refused(tmp_path: Path, capsys) -> None:
    """``kernelpack cache ls/stats --dir LOOP`` answered "0 entries" with exit 0 (a loop
    "does not exist"), and ``kp.Cache(LOOP)`` was accepted, each later write warning: both
    now say what is wrong with the path."""
    loop = tmp_path / "loop"
    os.symlink("loop", loop)
    with pytest.raises(ValueError, match="symbolic links") as err:
        kp.Cache(loop, remote=False)
    assert str(loop) in str(err.value)
    for command in ("ls", "stats"):
        code = main(["cache", command, "--dir", str(loop)])
        err_text = capsys.readouterr().err
        assert code == 1 and str(loop) in err_text and "symbolic links" in err_text, err_text


def test_a_save_that_cannot_make_its_temporary_says_so() -> None:
    """``kp.save(p, "/proc/version")`` said "No such file or directory: '/proc/version'" of
    a file that is there: the temporary beside it could not be created, and now it says so."""
    if not os.path.exists("/proc/version"):
        pytest.skip("no /proc/version here")
    with pytest.raises(OSError) as err:
        kp.save([kp_samples.axpy()], "/proc/version")
    assert "/proc/version" in str(err.value) and "temporary file in /proc" in str(err.value)
