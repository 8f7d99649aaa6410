"""``import kernelpack`` stays light: a process that only loads artifacts must not pay for the
compiler (llvmlite, the lowering), array libraries or the CUDA driver bindings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

HEAVY = ("llvmlite", "numpy", "torch", "cupy", "cuda.bindings", "kernelpack.lowering")


def _modules_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\nimport json\n"
             "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    return json.loads(out.splitlines()[-1])


def _heavy(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


def test_import_kernelpack_is_light() -> None:
    modules = _modules_after("import kernelpack")
    assert "kernelpack" in modules
    assert _heavy(modules, HEAVY) == []


def test_public_names_resolve_without_heavy_imports() -> None:
    modules = _modules_after("import kernelpack as kp\n"
                             "[getattr(kp, n) for n in kp.__all__ if n not in ('compile', 'fusion')]")
    assert _heavy(modules, HEAVY) == []


@pytest.mark.parametrize("module", ["kernelpack.loader", "kernelpack.cli"])
def test_loader_and_cli_do_not_pull_the_compiler(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not part of this checkout yet")
    modules = _modules_after(f"import {module}")
    assert _heavy(modules, ("llvmlite", "numpy", "torch", "cupy", "kernelpack.lowering")) == []
