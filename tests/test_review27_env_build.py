"""Review 27 (black box): the environment knobs README and ``kernelpack.config`` declare, and
``kernelpack build`` (empty, broken and mixed sources, targets, output, cache, signing,
interruption, progress).

Passing tests pin what works as README says. Each failing test is a bug found by this review:
its docstring gives the repro, what happens and what README / issue 5 promise instead.
In-process ``main()`` where that is faithful; a subprocess where the process matters (logging
and warnings as a shell user sees them, per-process caches, signals).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import config
from kernelpack.cli import EXIT_INTERRUPTED, EXIT_TERMINATED

sys.path.insert(0, str(Path(__file__).parent))
from kp_cli import run  # noqa: E402

pytest.importorskip("llvmlite", reason="the lowering (kernelpack[compile]) is not installed")
pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

SMALL = '''
import kernelpack as kp

@kp.fusion
def scale(x: kp.Tensor[kp.f32, "n"], a: kp.f32):
    return x * a

@kp.fusion
def shift(x: kp.Tensor[kp.f32, "n"]):
    return x + SHIFT

SHIFT = 1.0
'''

MATH = '''
import kernelpack as kp

@kp.fusion
def expo(x: kp.Tensor[kp.f32, "n"]):
    return kp.exp(x)
'''


# ---- helpers ------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No knob of the runner's environment leaks into these tests; sys.path is restored
    (``kernelpack build`` puts the source's directory first, as ``python FILE`` does)."""
    for knob in config.knobs():
        if knob.name.startswith("KERNELPACK_"):
            monkeypatch.delenv(knob.name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))


def write(directory: Path, text: str, stem: str) -> Path:
    path = directory / f"{stem}.py"
    path.write_text(textwrap.dedent(text))
    return path


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELPACK_")}
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"]
                                             if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def cli(*argv: object, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m kernelpack ARGV`` in a fresh process, as a shell user runs it."""
    return subprocess.run([sys.executable, "-m", "kernelpack", *map(str, argv)], cwd=cwd,
                          env=child_env(**extra), capture_output=True, text=True, timeout=120,
                          check=False)


def knob_value(monkeypatch: pytest.MonkeyPatch, name: str, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


# ==== (1) environment knobs ======================================================================
@pytest.mark.parametrize("value, expected", [
    (None, 10 << 30), ("", 10 << 30), ("1234", 1234), (" 77 ", 77), ("0", None),
    ("none", None), ("NONE", None), ("99999999999999999999", 99999999999999999999),
    ("12 MB", 12 << 20),  # the spellings `cache prune --max-bytes` takes
])
def test_cache_max_bytes_valid_values(monkeypatch, value, expected) -> None:
    knob_value(monkeypatch, "KERNELPACK_CACHE_MAX_BYTES", value)
    assert config.cache_max_bytes() == expected


@pytest.mark.parametrize("value", ["lots", "-1", "1e9", "0x10", "inf", "off", "12 XB"])
def test_cache_max_bytes_garbage_names_the_variable(monkeypatch, value) -> None:
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", value)
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_MAX_BYTES"):
        config.cache_max_bytes()
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_MAX_BYTES"):
        kp.Cache(Path("/nonexistent-review27") / "never-made", remote=False)


@pytest.mark.parametrize("value", ["0", "off", "none", "false", "localhost:6379",
                                   "file:///tmp/x", "redis://", "   "])
def test_remote_cache_garbage_names_the_variable(monkeypatch, tmp_path, value) -> None:
    monkeypatch.setenv("KERNELPACK_REMOTE_CACHE", value)
    with pytest.raises(ValueError, match=r"\$KERNELPACK_REMOTE_CACHE"):
        kp.Cache(tmp_path / "c")
    kp.Cache(tmp_path / "c", remote=False)  # an explicit remote=False does not read it


@pytest.mark.parametrize("value, expected", [
    (None, "auto"), ("", "auto"), ("auto", "auto"), ("AUTO", "auto"),
    ("cuda-bindings", "cuda-bindings"), (" CUDA-Bindings ", "cuda-bindings"),
])
def test_driver_knob_valid_values(monkeypatch, value, expected) -> None:
    knob_value(monkeypatch, "KERNELPACK_DRIVER", value)
    assert config.driver_api() == expected


@pytest.mark.parametrize("value", ["ctypes", "cuda_bindings", "0", "no", "libcuda"])
def test_driver_knob_garbage_names_the_variable_and_choices(monkeypatch, value) -> None:
    monkeypatch.setenv("KERNELPACK_DRIVER", value)
    with pytest.raises(ValueError, match=r"KERNELPACK_DRIVER must be one of auto, cuda-bindings"):
        config.driver_api()


def test_driver_garbage_is_a_named_error_at_the_first_launch_not_a_traceback(tmp_path) -> None:
    """Checked where the driver is opened (warmup here; no GPU is needed to see it)."""
    artifact = tmp_path / "axpy.kpack"
    kp.save([kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=(ROOT / "examples" / "axpy.ptx").read_text(),
        targets=["sm_80"])], artifact)
    code = ("import kernelpack as kp\n"
            f"p = kp.load({str(artifact)!r})\n"
            "try:\n    p.warmup()\n"
            "except ValueError as e:\n    print('VALUE', e)\n"
            "except kp.KernelPackError as e:\n    print('KP', type(e).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(KERNELPACK_DRIVER="ctypes"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("VALUE KERNELPACK_DRIVER must be one of"), proc.stdout


BOOL_KNOBS = [("KERNELPACK_NATIVE_LAUNCH", config.native_launch, True),
              ("KERNELPACK_TORCH_EXCHANGE_API", config.torch_exchange_api, True),
              ("KERNELPACK_CACHE_EXPLAIN", config.explain_cache_misses, False)]


@pytest.mark.parametrize("name, read, default", BOOL_KNOBS)
def test_boolean_knobs_documented_spellings(monkeypatch, name, read, default) -> None:
    """README: ``=0`` turns the extension's launches / the exchange API off; the config
    docstrings add false/no/off, in any case and with spaces."""
    knob_value(monkeypatch, name, None)
    assert read() is default
    monkeypatch.setenv(name, "")
    assert read() is default  # empty: unset
    for off in ("0", "false", "FALSE", "False", "no", "NO", "off", " Off "):
        monkeypatch.setenv(name, off)
        assert read() is False, off
    for on in ("1", "true", "TRUE", "yes", "on"):
        monkeypatch.setenv(name, on)
        assert read() is True, on


@pytest.mark.parametrize("name, read, default", BOOL_KNOBS)
@pytest.mark.parametrize("value", ["disable", "2"])
def test_boolean_knob_garbage_is_not_silently_taken(monkeypatch, name, read, default,
                                                    value) -> None:
    """Was a bug (review 27, fixed). ``KERNELPACK_NATIVE_LAUNCH=disable`` (or ``n``, ``2``, a typo
    ``fasle``) leaves the C
    launches ON, ``KERNELPACK_TORCH_EXCHANGE_API=disable`` the exchange API ON, and
    ``KERNELPACK_CACHE_EXPLAIN=2`` the explanations OFF, all silently: any unrecognized value
    means "the default". ``KERNELPACK_DRIVER`` refuses garbage with a ValueError naming the
    variable and its choices, and ``KERNELPACK_CACHE_MAX_BYTES`` too; an operator who sets a
    switch to turn something off must learn that it was not understood. Expected: a ValueError
    naming the variable, or at least a warning naming it."""
    monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            read()
        except ValueError as exc:
            assert name in str(exc)
            return
    assert any(name in str(w.message) for w in caught), (
        f"{name}={value!r} was silently taken as {read()!r}")


def test_no_declared_knob_claims_codegen_today() -> None:
    """Issue 5: knobs that affect codegen are declared and folded into keys. Today none is
    codegen=True (libdevice is keyed by its digest, not its path), so codegen_env() is empty.
    A knob added later with codegen=True shows up here (and in every key, tests/cache)."""
    assert [k.name for k in config.knobs() if k.codegen] == []
    assert config.codegen_env() == ()


def test_no_c_source_reads_the_environment() -> None:
    """The registry rule of issue 5 ("a test fails when code reads an undeclared knob") is
    enforced by tests/cache/test_config.py over ``*.py`` only. The C extension files are not
    scanned; today none of them calls getenv, and this keeps it so."""
    offenders = []
    for path in sorted((ROOT / "src" / "kernelpack").rglob("*.[ch]")):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//", 1)[0]
            if re.search(r"\b(secure_)?getenv\b|\benviron\b|Py_GETENV", code):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert not offenders, offenders


def _registry_scanner():
    spec = importlib.util.spec_from_file_location("_kp_review27_test_config",
                                                  ROOT / "tests" / "cache" / "test_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._env_reads


@pytest.mark.parametrize("source", [
    "import os\nx = os.environ.get('KERNELPACK_X')\n",
    "import os\nx = os.environ['KERNELPACK_X']\n",
    "import os\nx = os.getenv('KERNELPACK_X')\n",
    "from os import environ as E\nx = E.get('KERNELPACK_X')\n",
    "import os as o\nx = o.environ.get('KERNELPACK_X', '1')\n",
    "import os\nx = 'KERNELPACK_X' in os.environ\n",
])
def test_registry_scanner_catches_a_new_environment_read(tmp_path, source) -> None:
    """The reviewer's question: would a new ``os.environ.get("KERNELPACK_X")`` in src fail the
    registry test? Yes, in every ordinary spelling."""
    path = tmp_path / "new_module.py"
    path.write_text(source)
    assert _registry_scanner()(path), source


def test_registry_scanner_catches_os_getenvb(tmp_path) -> None:
    """Was a bug (review 27, fixed; in the guard, tests/cache/test_config.py).
    ``os.getenvb(b"KERNELPACK_X")`` reads
    the environment and is missed: the AST check lists environ/getenv/environb/putenv but not
    ``getenvb``, and the text regex ``\\bgetenv\\b`` does not match ``getenvb``. Issue 5: "a
    test fails when code reads an undeclared one". Expected: the scanner reports it."""
    path = tmp_path / "new_module.py"
    path.write_text("import os\nx = os.getenvb(b'KERNELPACK_X')\n")
    assert _registry_scanner()(path)


def test_readme_documents_every_user_facing_knob() -> None:
    """Was a bug (review 27, fixed; docs). README names KERNELPACK_CACHE_DIR, XDG_CACHE_HOME,
    KERNELPACK_DRIVER,
    KERNELPACK_NATIVE_LAUNCH and KERNELPACK_TORCH_EXCHANGE_API, but not
    KERNELPACK_CACHE_MAX_BYTES (the disk cap, 10 GiB by default, which evicts entries: the
    cache's error messages even tell users to set it), KERNELPACK_REMOTE_CACHE (a fleet-wide
    switch that puts a Redis tier under every ``kp.Cache()`` and under ``kernelpack build
    --cache``), KERNELPACK_CACHE_EXPLAIN (issue 5's "explain on a miss") nor
    KERNELPACK_LIBDEVICE (what the libdevice error tells users to set). Expected: every
    declared KERNELPACK_* knob is named in README."""
    declared = {k.name for k in config.knobs() if k.name.startswith("KERNELPACK_")}
    missing = sorted(n for n in declared if n not in README)
    assert not missing, f"declared knobs README never mentions: {missing}"


def test_cache_max_bytes_takes_the_suffixes_its_help_names(monkeypatch) -> None:
    """Was a bug (review 27, fixed; minor). ``kernelpack cache prune --help``: "--max-bytes SIZE ...
    (default:
    $KERNELPACK_CACHE_MAX_BYTES; K/M/G/T suffixes are powers of 1024 ...)", and
    ``--max-bytes 10G`` works; ``KERNELPACK_CACHE_MAX_BYTES=10G`` is a ValueError ("must be a
    byte count (got '10g')"). One quantity, two grammars. Expected: the variable takes the
    same sizes as the option."""
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "10G")
    assert config.cache_max_bytes() == 10 << 30


# ---- cache location knobs, seen through `kernelpack build --cache` ------------------------------
def _entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kpack")) if root.exists() else []


def test_build_cache_location_precedence(capsys, tmp_path, monkeypatch) -> None:
    """README: $KERNELPACK_CACHE_DIR, else $XDG_CACHE_HOME/kernelpack, else ~/.cache/kernelpack;
    --cache-dir beats them all; a relative XDG_CACHE_HOME is ignored (XDG spec)."""
    src = write(tmp_path, SMALL, "kp_r27_env_where")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    assert run(capsys, "build", src, "scale", "-o", "a.kpack", "--targets", "sm_80",
               "--cache", "-q")[0] == 0
    assert len(_entries(tmp_path / "home" / ".cache" / "kernelpack")) == 1
    assert not (tmp_path / "relative-xdg").exists()

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert run(capsys, "build", src, "scale", "-o", "b.kpack", "--targets", "sm_80",
               "--cache", "-q")[0] == 0
    assert len(_entries(tmp_path / "xdg" / "kernelpack")) == 1

    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path / "explicit"))
    code, _, err = run(capsys, "build", src, "scale", "-o", "c.kpack", "--targets", "sm_80",
                       "--cache")
    assert code == 0 and len(_entries(tmp_path / "explicit")) == 1
    code, _, err = run(capsys, "build", src, "scale", "-o", "d.kpack", "--targets", "sm_80",
                       "--cache")
    assert code == 0 and "[1/1] scale: from the disk cache in " in err

    code, _, err = run(capsys, "build", src, "scale", "-o", "e.kpack", "--targets", "sm_80",
                       "--cache-dir", tmp_path / "flag")
    assert code == 0 and len(_entries(tmp_path / "flag")) == 1
    assert len(_entries(tmp_path / "explicit")) == 1
    assert (tmp_path / "a.kpack").read_bytes() == (tmp_path / "e.kpack").read_bytes()


@pytest.mark.parametrize("name, value, words", [
    ("KERNELPACK_CACHE_MAX_BYTES", "lots", "KERNELPACK_CACHE_MAX_BYTES must be a byte count"),
    ("KERNELPACK_CACHE_MAX_BYTES", "-3", "KERNELPACK_CACHE_MAX_BYTES must be >= 0"),
    ("KERNELPACK_REMOTE_CACHE", "localhost:6379", "$KERNELPACK_REMOTE_CACHE: remote must be"),
    ("KERNELPACK_CACHE_DIR", "<file>", "$KERNELPACK_CACHE_DIR: path"),
])
def test_build_with_a_bad_cache_knob(capsys, tmp_path, monkeypatch, name, value, words) -> None:
    """With --cache: one line naming the variable, exit 1, nothing compiled or written. Without
    it the knob is not the build's business and the build succeeds."""
    src = write(tmp_path, SMALL + "\nopen(__file__ + '.imported', 'w').close()\n",
                f"kp_r27_badknob_{abs(hash((name, value)))}")
    if value == "<file>":
        value = str(src)
    monkeypatch.setenv(name, value)
    out = tmp_path / "o.kpack"
    out.write_bytes(b"previous")
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80", "--cache")
    assert (code, stdout) == (1, "")
    assert stderr.startswith("error: ") and words in stderr and len(stderr.splitlines()) == 1
    assert out.read_bytes() == b"previous"
    assert not Path(f"{src}.imported").exists()  # refused before the source was imported
    code, _, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80", "-q")
    assert code == 0 and stderr == "" and kp.load(out).programs == ["scale", "shift"]


def test_libdevice_knob_is_honoured_and_its_errors_name_the_path(tmp_path) -> None:
    """KERNELPACK_LIBDEVICE points the lowering at a libdevice file: a missing one or a file
    that is not bitcode fails the fusion that needs math, naming the path (a subprocess: the
    located file is cached per process)."""
    src = write(tmp_path, MATH, "kp_r27_math")
    garbage = tmp_path / "not-bitcode.bc"
    garbage.write_bytes(b"not bitcode at all")
    for path, words in ((tmp_path / "missing.bc", "libdevice.10.bc not found"),
                        (garbage, "cannot parse libdevice")):
        proc = cli("build", src, "-o", "o.kpack", "--targets", "sm_80", cwd=tmp_path,
                   KERNELPACK_LIBDEVICE=str(path))
        assert proc.returncode == 1, proc.stderr
        assert "[1/1] expo: FAILED: CompileError:" in proc.stderr and words in proc.stderr
        assert str(path) in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "o.kpack").exists()


def test_explain_knob_shows_why_a_build_missed(tmp_path) -> None:
    """Was a bug (review 27, fixed). ``KERNELPACK_CACHE_EXPLAIN=1 kernelpack build k.py -o o.kpack
    --cache-dir C``
    after a change to k.py prints nothing about the miss: the explanation goes to the
    ``kernelpack.cache`` logger at INFO, and the command configures no logging, so Python's
    last-resort handler (WARNING and up) drops it. The knob is declared as "1: log, for every
    cache miss, the key parts that differ" and issue 5 asks for "--explain on a miss"; `build
    --cache` is the one command that compiles through the cache, and there it is silently
    ignored (the same build in a script with logging.basicConfig(level=INFO) prints
    "cache miss: <key> differs from <key> in source: ..."). Expected: the explanation on
    stderr."""
    src = write(tmp_path, SMALL, "kp_r27_explain")
    args = ("build", src, "shift", "-o", "o.kpack", "--targets", "sm_80", "--cache-dir", "c")
    first = cli(*args, cwd=tmp_path, KERNELPACK_CACHE_EXPLAIN="1")
    assert first.returncode == 0, first.stderr
    # a different length too: the same size within the same second of mtime would let the
    # first run's __pycache__ stand for the edited source (a flake seen in session 28)
    src.write_text(src.read_text().replace("SHIFT = 1.0", "SHIFT = 2.25"))
    second = cli(*args, cwd=tmp_path, KERNELPACK_CACHE_EXPLAIN="1")
    assert second.returncode == 0 and "[1/1] shift: compiled in" in second.stderr
    assert "differs from" in second.stderr or "cache miss" in second.stderr, second.stderr


def test_a_cache_warning_is_printed_once(tmp_path) -> None:
    """Was a bug (review 27, fixed; noise). With ``KERNELPACK_CACHE_MAX_BYTES=10``, ``kernelpack
    build ... --cache-dir
    C`` prints every cache problem twice: once as a bare line (the ``kernelpack.cache``
    logger, through logging's last-resort handler) and once as a ``warnings`` CacheWarning
    with kernelpack's own source line under it (``.../cache/__init__.py:274: CacheWarning:
    disk cache write of ... failed ...`` + ``  self._put_disk(key, data)``). The same happens
    for an unusable cache directory (read, lock and write warnings, each doubled).
    Expected: each problem reported once."""
    src = write(tmp_path, SMALL, "kp_r27_twice")
    proc = cli("build", src, "scale", "-o", "o.kpack", "--targets", "sm_80", "--cache-dir", "c",
               cwd=tmp_path, KERNELPACK_CACHE_MAX_BYTES="10")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("exceed the cache's cap of 10 bytes") == 1, proc.stderr


# ==== (2) kernelpack build =======================================================================
@pytest.mark.parametrize("text, message", [
    ("import kernelpack as kp\ndef f(:\n    pass\n", "SyntaxError: invalid syntax ("),
    ("import kernelpack as kp\nimport kp_r27_no_such_module\n",
     "line 2): ModuleNotFoundError: No module named 'kp_r27_no_such_module'"),
    ("import kernelpack as kp\nfrom kernelpack import no_such_name\n",
     "line 2): ImportError: cannot import name 'no_such_name'"),
    ("import kernelpack as kp\nVALUE = 1 / 0\n",
     "line 2): ZeroDivisionError: division by zero"),
])
def test_sources_that_cannot_be_imported(capsys, tmp_path, text, message) -> None:
    src = write(tmp_path, text, f"kp_r27_bad_{abs(hash(text))}")
    out = tmp_path / "o.kpack"
    out.write_bytes(b"previous")
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80")
    assert (code, stdout) == (1, "")
    assert stderr.startswith(f"error: {src}: ") and message in stderr, stderr
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr
    assert out.read_bytes() == b"previous"


@pytest.mark.parametrize("text, message", [
    ("import kernelpack as kp\nhelper = kp.fusion\nN = 3\n",
     "defines no @kp.fusion function or kp.Compiled at module level"),
    (("import kernelpack as kp\n@kp.fusion\ndef _private(x: kp.Tensor[kp.f32, 'n']):\n"
      "    return x\n"), "names starting with '_' count only when named"),
])
def test_sources_with_nothing_to_build(capsys, tmp_path, text, message) -> None:
    src = write(tmp_path, text, f"kp_r27_empty_{abs(hash(text))}")
    out = tmp_path / "o.kpack"
    out.write_bytes(b"previous")
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80")
    assert (code, stdout) == (1, "")
    assert stderr.startswith(f"error: {src} ") and message in stderr, stderr
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr
    assert out.read_bytes() == b"previous"


def test_syntax_error_names_file_and_line(capsys, tmp_path) -> None:
    src = write(tmp_path, "import kernelpack as kp\n\nx = (\n", "kp_r27_syntax_line")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack")
    assert code == 1 and "kp_r27_syntax_line.py, line 3" in stderr, stderr


@pytest.mark.parametrize("stem", ["my-kernels", "json"])
def test_errors_about_the_source_name_the_file_not_a_private_module(capsys, tmp_path,
                                                                    stem) -> None:
    """Was a bug (review 27, fixed; minor). A source file whose stem is not an identifier
    (``my-kernels.py``) or is
    taken in sys.modules (``json.py``) is imported as ``_kernelpack_build_source_1``, and the
    errors about its contents name that: ``error: _kernelpack_build_source_1 defines no
    @kp.fusion function ...`` and ``error: _kernelpack_build_source_1 has no fusion or
    kp.Compiled named nope (has: scale)``. The user never wrote that name. Expected: the
    errors name the source as given (``my-kernels.py``)."""
    src = write(tmp_path, "import kernelpack as kp\nN = 1\n", stem)
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack")
    assert code == 1 and "defines no @kp.fusion" in stderr
    assert "_kernelpack_build_source" not in stderr and src.name in stderr, stderr
    src.write_text(SMALL)
    code, _, stderr = run(capsys, "build", src, "nope", "-o", tmp_path / "o.kpack")
    assert code == 2 and "has no fusion or kp.Compiled named nope" in stderr
    assert "_kernelpack_build_source" not in stderr and src.name in stderr, stderr


def _floor_division_by_zero() -> str:
    """This Python's message for ``1 // 0`` ("division by zero" from 3.14, "integer division
    or modulo by zero" before)."""
    try:
        1 // 0  # noqa: B018
    except ZeroDivisionError as exc:
        return str(exc)
    raise AssertionError("1 // 0 did not raise")


def test_a_fusion_that_fails_names_itself_and_the_file_and_others_still_build(capsys,
                                                                             tmp_path) -> None:
    src = write(tmp_path, SMALL + '''
@kp.fusion
def boom(x: kp.Tensor[kp.f32, "n"]):
    return x / (1 // 0)
''', "kp_r27_boom")
    out = tmp_path / "o.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80")
    lines = stderr.splitlines()
    assert code == 1 and stdout == "" and not out.exists()
    assert lines[0] == f"[1/3] boom: FAILED: ZeroDivisionError: {_floor_division_by_zero()}"
    assert lines[1].startswith("[2/3] scale: compiled in ")
    assert lines[2].startswith("[3/3] shift: compiled in ")
    assert lines[3] == f"error: {src}: 1 of 3 programs failed (boom); {out} was not written"


def test_two_programs_of_one_name_fusion_and_compiled(capsys, tmp_path) -> None:
    src = write(tmp_path, SMALL + '''
def _ident(x: kp.Tensor[kp.f32, "n"]):
    return x

other = kp.compile(kp.fusion(_ident, name="scale"), targets=["sm_80"])
''', "kp_r27_samename")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack", "--targets", "sm_80")
    assert code == 1
    assert "attributes 'other' and 'scale' both make a program named 'scale'" in stderr or \
        "attributes 'scale' and 'other' both make a program named 'scale'" in stderr, stderr


EXTERNAL = '''
import kernelpack as kp

PTX = open({ptx!r}).read()

def axpy(name, targets, module=None):
    return kp.external(
        name, "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=PTX, targets=targets, module=module)

ext = axpy("ext_axpy", ["sm_80", "ptx"])

@kp.fusion
def double(x: kp.Tensor[kp.f32, "b", "n"]):
    return x * 2.0

double_64 = kp.compile(kp.fusion(double.fn, name="double_64"), targets=["sm_90"],
                       static={{"n": 64}})
'''


def test_external_compiled_and_fusion_in_one_build(capsys, tmp_path) -> None:
    """kp.external and kp.compile(static=) objects are stored as they are (their own
    targets), fusions compiled for --targets; progress on stderr, 'wrote' on stdout."""
    src = write(tmp_path, EXTERNAL.format(ptx=str(ROOT / "examples" / "axpy.ptx")), "kp_r27_mix")
    out = tmp_path / "mix.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80")
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert lines[0].startswith("[1/3] double: compiled in ")
    assert lines[1] == "[2/3] double_64: taken as it is (kp.Compiled)"
    assert lines[2] == "[3/3] ext_axpy (ext): taken as it is (kp.Compiled)"
    assert stdout == f"wrote {out}: 3 programs, {out.stat().st_size} bytes\n"
    pack = kp.load(out)
    assert pack.programs == ["double", "double_64", "ext_axpy"]

    def targets(name: str) -> set[str]:
        return {i.target for m in pack.compiled(name).modules for i in m.images}

    assert targets("double") == {"sm_80"}
    assert targets("double_64") == {"sm_90"}
    assert "sm_80" in targets("ext_axpy") and len(targets("ext_axpy")) == 2
    assert pack["ext_axpy"].plan(x=(1000,), y=(1000,), a=0.5).launches[0].grid == (4, 1, 1)
    with pytest.raises(kp.ConstraintError):
        pack["double_64"].plan(x=(2, 65))

    code, stdout, stderr = run(capsys, "build", src, "ext", "double_64", "-o", out, "-q")
    assert code == 0 and stderr == "" and stdout.startswith(f"wrote {out}: 2 programs")


def test_a_save_failure_after_compiling_writes_nothing(capsys, tmp_path) -> None:
    """Two externals naming one module with different images: kp.save refuses; the earlier
    artifact stays, one error line."""
    src = write(tmp_path, EXTERNAL.format(ptx=str(ROOT / "examples" / "axpy.ptx")) + '''
one = axpy("one", ["sm_80"], module="shared")
two = axpy("two", ["sm_90"], module="shared")
''', "kp_r27_savefail")
    out = tmp_path / "o.kpack"
    out.write_bytes(b"previous")
    code, stdout, stderr = run(capsys, "build", src, "one", "two", "-o", out, "-q")
    assert (code, stdout) == (1, "")
    assert stderr == ("error: two different modules are named 'shared' (programs must agree "
                      "on a module's images)\n")
    assert out.read_bytes() == b"previous"
    assert {p.name for p in tmp_path.iterdir()} - {"__pycache__"} == {"o.kpack", src.name}


@pytest.mark.parametrize("targets", ["", " , ", "sm_80;sm_90", "sm_8", "bogus", "ptx",
                                     "sm_80,cubin"])
def test_bad_targets_are_usage_errors_before_importing(capsys, tmp_path, targets) -> None:
    src = write(tmp_path, SMALL + "\nopen(__file__ + '.imported', 'w').close()\n",
                f"kp_r27_targets_{abs(hash(targets))}")
    code, stdout, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack",
                               "--targets", targets)
    assert (code, stdout) == (2, "")
    assert f"--targets {targets!r}" in stderr, stderr
    assert not Path(f"{src}.imported").exists() and not (tmp_path / "o.kpack").exists()


@pytest.mark.parametrize("targets, expected", [
    ("SM_80", {"sm_80"}), ("sm_80,sm_80", {"sm_80"}), (" sm_90 , sm_80 ", {"sm_80", "sm_90"}),
    ("sm_80,,ptx", {"sm_80", "compute_80"}),
])
def test_target_lists_are_normalized(capsys, tmp_path, targets, expected) -> None:
    src = write(tmp_path, SMALL, f"kp_r27_norm_{abs(hash(targets))}")
    out = tmp_path / "o.kpack"
    code, _, stderr = run(capsys, "build", src, "scale", "-o", out, "--targets", targets, "-q")
    assert code == 0, stderr
    assert {i.target for m in kp.load(out).compiled("scale").modules for i in m.images} == expected


def test_output_replaces_an_existing_file_and_keeps_no_temporaries(capsys, tmp_path) -> None:
    src = write(tmp_path, SMALL, "kp_r27_replace")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "model.kpack"
    out.write_bytes(b"old artifact")
    code, _, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80", "-q")
    assert code == 0, stderr
    assert kp.load(out).programs == ["scale", "shift"]
    assert [p.name for p in outdir.iterdir()] == ["model.kpack"]


def test_output_into_a_missing_directory_fails_before_importing(capsys, tmp_path) -> None:
    src = write(tmp_path, SMALL + "\nopen(__file__ + '.imported', 'w').close()\n",
                "kp_r27_missingdir")
    out = tmp_path / "no" / "such" / "o.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out)
    assert (code, stdout) == (1, "")
    assert str(out) in stderr and "does not exist" in stderr
    assert not Path(f"{src}.imported").exists() and not (tmp_path / "no").exists()


def test_output_must_not_be_the_source_itself(capsys, tmp_path) -> None:
    """Was a bug (review 27, fixed; data loss). ``kernelpack build kernels.py -o kernels.py``
    compiles, then replaces
    the user's Python source with the binary artifact ("wrote kernels.py: 2 programs"); the
    source is gone. gcc refuses the same slip ("input file 'x.c' is the same as output
    file"), and `build` already checks -o before compiling (a directory, a missing or
    unwritable parent). Expected: an error naming the path, the source untouched."""
    src = write(tmp_path, SMALL, "kp_r27_self")
    before = src.read_bytes()
    code, _, stderr = run(capsys, "build", src, "-o", src, "--targets", "sm_80", "-q")
    assert src.read_bytes() == before, "the source file was overwritten by the artifact"
    assert code in (1, 2) and str(src) in stderr


def test_empty_output_names_the_option(capsys, tmp_path, monkeypatch) -> None:
    """Was a bug (review 27, fixed; minor). ``build k.py -o ""`` says ``error: : is a directory
    (give the artifact's
    file name)``: the empty name is reported as a directory and the option is not named
    (``--cache-dir ""`` gets ``argument --cache-dir: empty path``). Expected: the error names
    -o/--output or says the name is empty; nothing written."""
    monkeypatch.chdir(tmp_path)
    src = write(tmp_path, SMALL, "kp_r27_emptyout")
    code, stdout, stderr = run(capsys, "build", src, "-o", "")
    assert code != 0 and stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]
    assert any(w in stderr for w in ("-o", "--output", "empty")), stderr


@pytest.mark.parametrize("key, words", [
    ("missing.key", "missing.key: No such file or directory"),
    ("k.pub", "a public key file (.pub) cannot sign"),
    ("garbage.key", "expected a PEM or OpenSSH key or 64 hex digits"),
    ("empty.key", "expected a PEM or OpenSSH key or 64 hex digits"),
    ("keydir", "not a regular file"),
])
def test_a_bad_signing_key_fails_before_importing(capsys, tmp_path, key, words) -> None:
    assert run(capsys, "keygen", "-o", tmp_path / "k")[0] == 0
    (tmp_path / "garbage.key").write_text("garbage\n")
    (tmp_path / "empty.key").write_bytes(b"")
    (tmp_path / "keydir").mkdir()
    src = write(tmp_path, SMALL + "\nopen(__file__ + '.imported', 'w').close()\n",
                f"kp_r27_sign_{key.replace('.', '_')}")
    out = tmp_path / "s.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--sign-with", tmp_path / key)
    assert (code, stdout) == (1, "")
    assert stderr.startswith("error: ") and words in stderr and len(stderr.splitlines()) == 1
    assert not out.exists() and not Path(f"{src}.imported").exists()


def test_an_empty_signing_key_names_the_option(capsys, tmp_path) -> None:
    """Was a bug (review 27, fixed; minor; `sign --key ""` has the same, in test_review27_cli.py).
    ``build k.py -o
    o.kpack --sign-with ""`` fails with ``error: : No such file or directory``: neither the
    option nor the problem is named. Expected: the message names --sign-with or says the key
    path is empty."""
    src = write(tmp_path, SMALL, "kp_r27_emptykey")
    code, _, stderr = run(capsys, "build", src, "-o", tmp_path / "o.kpack", "--sign-with", "")
    assert code != 0 and not (tmp_path / "o.kpack").exists()
    assert any(w in stderr for w in ("--sign-with", "key", "empty")), stderr


def test_signed_build_from_the_cache_is_signed(capsys, tmp_path) -> None:
    """A disk-cache hit is signed like a fresh compile, and the bytes are the same."""
    assert run(capsys, "keygen", "-o", tmp_path / "team")[0] == 0
    src = write(tmp_path, SMALL, "kp_r27_signcache")
    outs = [tmp_path / "1.kpack", tmp_path / "2.kpack"]
    errs = []
    for out in outs:
        code, _, err = run(capsys, "build", src, "-o", out, "--targets", "sm_80",
                           "--cache-dir", tmp_path / "c", "--sign-with", tmp_path / "team")
        assert code == 0, err
        errs.append(err)
    assert all("from the disk cache" in line for line in errs[1].splitlines())
    assert outs[0].read_bytes() == outs[1].read_bytes()
    pack = kp.load(outs[1], trusted_keys=[tmp_path / "team.pub"])
    assert pack.signature.verified


def test_cache_hit_with_targets_in_another_order(capsys, tmp_path) -> None:
    src = write(tmp_path, SMALL, "kp_r27_order")
    base = ("build", src, "scale", "--cache-dir", tmp_path / "c")
    assert run(capsys, *base, "-o", tmp_path / "1.kpack", "--targets", "sm_80,sm_90")[0] == 0
    code, _, err = run(capsys, *base, "-o", tmp_path / "2.kpack", "--targets", "sm_90, SM_80")
    assert code == 0 and "from the disk cache" in err, err
    assert (tmp_path / "1.kpack").read_bytes() == (tmp_path / "2.kpack").read_bytes()
    code, _, err = run(capsys, *base, "-o", tmp_path / "3.kpack", "--targets", "sm_80")
    assert code == 0 and "scale: compiled in" in err  # another target set: another key


def test_quiet_hides_progress_but_not_failures_nor_the_result(capsys, tmp_path) -> None:
    src = write(tmp_path, SMALL, "kp_r27_quiet")
    out = tmp_path / "o.kpack"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80", "-q")
    assert (code, stderr) == (0, "")
    assert stdout == f"wrote {out}: 2 programs, {out.stat().st_size} bytes\n"
    code, stdout, stderr = run(capsys, "build", src, "-o", out, "--targets", "sm_80")
    assert [line.split(":")[0] for line in stderr.splitlines()] == ["[1/2] scale", "[2/2] shift"]


_INTERRUPT = '''
import os, signal, sys
from kernelpack import compile_entry, serializer
from kernelpack.cli import main
where, sig = sys.argv[1], getattr(signal, sys.argv[2])
real_compile, real_fsync = compile_entry.compile, os.fsync
calls = []
def compile(*a, **k):
    calls.append(1)
    if where == "compile" and len(calls) == 2:   # the second fusion, the first one done
        os.kill(os.getpid(), sig)
    return real_compile(*a, **k)
def fsync(fd):
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        path = ""
    # "save": the artifact's temporary file written, not renamed; "cache": a cache entry's
    if (where == "save" and "/out/" in path) or (where == "cache" and "/c/" in path):
        os.kill(os.getpid(), sig)
    real_fsync(fd)
compile_entry.compile = compile
os.fsync = fsync  # serializer and cache write through the os module
sys.exit(main(sys.argv[3:]))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals, /proc/self/fd")
@pytest.mark.parametrize("where", ["compile", "cache", "save"])
@pytest.mark.parametrize("sig, status, word", [("SIGTERM", EXIT_TERMINATED, "terminated"),
                                               ("SIGINT", EXIT_INTERRUPTED, "interrupted")])
def test_interrupted_build_leaves_the_previous_artifact(tmp_path, where, sig, status,
                                                        word) -> None:
    """README: 130 when interrupted, 143 when terminated, "leaving no partly written file";
    "a failed or interrupted build leaves the previous one in place". The cache directory
    holds no torn entry either."""
    src = write(tmp_path, SMALL, "kp_r27_sig")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "o.kpack"
    out.write_bytes(b"previous")
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT, where, sig, "build", str(src),
                           "-o", str(out), "--targets", "sm_80", "--cache-dir",
                           str(tmp_path / "c")],
                          env=child_env(), capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, check=False)
    assert proc.returncode == status, proc.stderr
    assert proc.stderr.endswith(f"error: {word}\n") and "Traceback" not in proc.stderr
    assert out.read_bytes() == b"previous"
    assert [p.name for p in outdir.iterdir()] == ["o.kpack"]
    leftovers = [p for p in (tmp_path / "c").rglob("*") if p.is_file()
                 and (p.name.endswith(".tmp") or p.name.startswith("."))] \
        if (tmp_path / "c").exists() else []
    assert not leftovers, leftovers
