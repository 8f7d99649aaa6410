"""kernelpack.config: the knob registry, and the rule that nothing else reads the environment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import config

SRC = Path(__file__).resolve().parents[2] / "src" / "kernelpack"
_ENV_TEXT = re.compile(r"\bos\.environb?\b|\bgetenvb?\b|\benvironb?\.get\b|\bputenv\b")


def _env_reads(path: Path) -> list[tuple[int, str]]:
    """Every place a module touches the process environment, by AST and by text (so aliases
    such as ``from os import environ`` are caught too)."""
    text = path.read_text()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb",
                                                             "getenvb", "putenv"):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in ("environ", "getenv", "environb", "getenvb"):
                    found.append((node.lineno, f"from os import {alias.name}"))
    for lineno, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if _ENV_TEXT.search(code) and not any(n == lineno for n, _ in found):
            found.append((lineno, code.strip()))
    return found


def test_only_config_reads_the_environment() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "config.py" or "_generated" in path.parts:
            continue
        offenders += [f"{path.relative_to(SRC)}:{n}: {what}" for n, what in _env_reads(path)]
    assert not offenders, ("environment read outside kernelpack/config.py; declare a knob there "
                           "and use config.get():\n" + "\n".join(offenders))


def test_config_reads_only_declared_names() -> None:
    """Every literal name config.get() is called with anywhere in src is declared."""
    declared = {k.name for k in config.knobs()}
    used: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                owner = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
                if name == "get" and (owner.endswith("config") or path.name == "config.py") \
                        and node.args and isinstance(node.args[0], ast.Constant) \
                        and isinstance(node.args[0].value, str):
                    used.add(node.args[0].value)
    assert used, "the scan found no config.get() calls at all: the scanner is broken"
    assert used <= declared, f"undeclared knobs read: {sorted(used - declared)}"


def test_the_scanner_catches_reads(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nx = os.environ.get('A')\nfrom os import getenv\ny = getenv('B')\n")
    assert len(_env_reads(bad)) >= 3


def test_undeclared_knob_is_an_error() -> None:
    with pytest.raises(KeyError, match="not declared"):
        config.get("KERNELPACK_NO_SUCH_KNOB")


def test_redeclaring_differently_is_an_error() -> None:
    with pytest.raises(ValueError, match="already declared"):
        config.declare("KERNELPACK_CACHE_DIR", "/x", codegen=True, doc="other")


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KERNELPACK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.cache_dir() == tmp_path / "xdg" / "kernelpack"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, per the XDG spec
    assert config.cache_dir() == Path.home() / ".cache" / "kernelpack"
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path / "explicit"))
    assert config.cache_dir() == tmp_path / "explicit"
    # "$(cat file)"'s newline, a stray space: a cache under "explicit\n" or under the working
    # directory was what these gave; now an error naming the variable and the value
    for bad in (f"{tmp_path}/explicit\n", f" {tmp_path}/explicit"):
        monkeypatch.setenv("KERNELPACK_CACHE_DIR", bad)
        with pytest.raises(ValueError, match=r"KERNELPACK_CACHE_DIR has leading or trailing "
                                             r"whitespace \(got '.*explicit"):
            config.cache_dir()
        with pytest.raises(ValueError, match="KERNELPACK_CACHE_DIR"):
            kp.Cache()


def test_max_bytes_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "1234")
    assert config.cache_max_bytes() == 1234
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "none")
    assert config.cache_max_bytes() is None
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_MAX_BYTES"):
        config.cache_max_bytes()


def test_codegen_env_lists_codegen_knobs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(config._REGISTRY, "KERNELPACK_TEST_CODEGEN",
                        config.Knob("KERNELPACK_TEST_CODEGEN", None, True, "test"))
    assert ("KERNELPACK_TEST_CODEGEN", "<unset>") in config.codegen_env()
    monkeypatch.setenv("KERNELPACK_TEST_CODEGEN", "3")
    assert ("KERNELPACK_TEST_CODEGEN", "3") in config.codegen_env()
    assert all(name != "KERNELPACK_CACHE_DIR" for name, _ in config.codegen_env())


def test_explain_knob(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kernelpack.cache import Cache

    monkeypatch.setenv("KERNELPACK_CACHE_EXPLAIN", "1")
    assert Cache(tmp_path, remote=False).explain_misses
    monkeypatch.setenv("KERNELPACK_CACHE_EXPLAIN", "0")
    assert not Cache(tmp_path, remote=False).explain_misses
    assert Cache(tmp_path, remote=False, explain_misses=True).explain_misses
