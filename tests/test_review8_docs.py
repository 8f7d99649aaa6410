"""README.md and docs/FORMAT.md against the behaviour they describe, for today's changes.

Each check reads a number or rule the docs state and compares it with the code that decides
it, so a constant retuned or a rule changed without the docs following fails here (the README
said "about 2^18 threads" after the split target became 2^19, and FORMAT.md said a PTX image
without an ISA escapes every driver check while the runtime gates it by its toolkit's major).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import kernelpack as kp
from kernelpack import config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FORMAT = (ROOT / "docs" / "FORMAT.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    """The text with line breaks and runs of spaces as single spaces (claims wrap lines)."""
    return re.sub(r"\s+", " ", text)


def test_column_schedule_numbers_match_the_lowering():
    """"up to 16384, about 2^19 threads in all, at least 16 reduced elements each"."""
    columns = pytest.importorskip("kernelpack.lowering.columns")
    text = _flat(README)
    m = re.search(r"many threads \(up to (\d+), about 2\^(\d+) threads in all, at least (\d+) "
                  r"reduced elements each", text)
    assert m, "the README's column-schedule sentence is gone or reworded"
    assert int(m.group(1)) == columns.SPLIT_MAX
    assert 1 << int(m.group(2)) == columns.TARGET_THREADS
    assert int(m.group(3)) == columns.ROWS_MIN


def _image(kind: str, arch: str, cuda: int, isa: tuple[int, int] | None) -> SimpleNamespace:
    from kernelpack.targets import parse_arch

    return SimpleNamespace(kind=kind, arch=parse_arch(arch), cuda_version=cuda, ptx_isa=isa,
                           raw_size=1)


def test_ptx_gating_is_as_format_md_says():
    """PTX with an ISA: the ISA alone decides (a CUDA 13 PTX of ISA 8.0 under a 12.4 driver
    loads); PTX without one: its toolkit's major is checked, as for a cubin."""
    from kernelpack.runtime.selection import select_image

    text = _flat(FORMAT)
    assert "no driver-version check applies" not in text
    assert "gates a PTX image by its ISA alone" in text
    assert "only its `cuda_version`'s major is checked against the driver" in text

    with_isa = _image("ptx", "compute_80", 13050, (8, 0))
    assert select_image([with_isa], "sm_90", 12040).chosen is with_isa
    without = _image("ptx", "compute_80", 13050, None)
    sel = select_image([without, _image("ptx", "compute_80", 12000, None)], "sm_90", 12040)
    assert sel.chosen is not without and sel.chosen is not None
    cubin = _image("cubin", "sm_90", 13050, None)
    with pytest.raises(kp.CompatibilityError):
        select_image([cubin], "sm_90", 12040).chosen  # noqa: B018 - raising is the check


def test_cache_directory_order_and_no_home(monkeypatch, tmp_path):
    """The README's order ($KERNELPACK_CACHE_DIR, $XDG_CACHE_HOME/kernelpack,
    ~/.cache/kernelpack) and its ValueError naming KERNELPACK_CACHE_DIR without a home."""
    text = _flat(README)
    assert ("`$KERNELPACK_CACHE_DIR`, else `$XDG_CACHE_HOME/kernelpack`, else "
            "`~/.cache/kernelpack`") in text
    assert "`kp.Cache()` is a `ValueError` naming `KERNELPACK_CACHE_DIR`" in text

    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert config.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("KERNELPACK_CACHE_DIR")
    assert config.cache_dir() == tmp_path / "x" / "kernelpack"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert config.cache_dir() == tmp_path / "h" / ".cache" / "kernelpack"
    monkeypatch.setenv("HOME", "relative")
    with pytest.raises(ValueError, match="KERNELPACK_CACHE_DIR"):
        kp.Cache()


def test_stated_defaults_match_the_signatures():
    """`opt=0..3` default 3 (kp.compile) and `timeout_s=` default 1 s (kp.Cache)."""
    from kernelpack.compile_entry import Options

    text = _flat(README)
    assert "`opt=0..3` is LLVM's optimization level (default 3)" in text
    assert Options().opt == 3
    assert "`timeout_s=`, default 1 s" in text
    assert inspect.signature(kp.Cache).parameters["timeout_s"].default == 1.0
