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


def test_kp_external_reads_its_sources_module_on_first_use() -> None:
    """The PTX/cubin scanners (external_images, code_scan) are for kp.external only: not
    imported by ``import kernelpack``; the names kernelpack.external re-exports still are."""
    scanners = ("kernelpack.external_images", "kernelpack.code_scan")
    assert [m for m in _modules_after("import kernelpack") if m in scanners] == []
    modules = _modules_after("from kernelpack.external import read_source, ptx_entries, "
                             "cubin_entries, cubin_arch\n"
                             "assert ptx_entries(b'.entry k()') == ['k']")
    assert all(m in modules for m in scanners)
    with pytest.raises(ImportError):
        exec("from kernelpack.external import no_such_name", {})


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


# What a server's first call runs through: imported by ``import kernelpack`` so that the time
# from ``kp.load(path)`` to the first result is loading, not importing (issue 4).
LOAD_PATH = ("kernelpack.loader", "kernelpack.verify", "kernelpack._decode", "kernelpack._images",
             "kernelpack._zstd", "kernelpack._plan_fast", "kernelpack.runtime.launcher",
             "kernelpack.runtime.library", "kernelpack.runtime.device",
             "kernelpack.runtime.driver", "kernelpack.runtime.execute",
             "kernelpack.runtime.arrays", "kernelpack.runtime.binding",
             "kernelpack.runtime.native", "kernelpack.runtime.libcuda")


def test_import_kernelpack_brings_the_load_path() -> None:
    modules = _modules_after("import kernelpack")
    assert [m for m in LOAD_PATH if m not in modules] == []
    assert _heavy(modules, ("cuda.bindings",)) == []


def test_load_and_plan_import_nothing_more() -> None:
    """kp.load, a program's summary, its plan and the image choice import no module."""
    code = (
        "import sys, kernelpack as kp\n"
        "from kernelpack.compiled import Compiled, Image, Module\n"
        "from kernelpack.summary import Arg, KernelSummary, Launch, Variant\n"
        "from kernelpack.runtime import select_image\n"
        "s = KernelSummary('t', (kp.Tensor('x', kp.f32, ('n',)),), (Variant((Launch('k', 'm', "
        "(kp.cdiv('n', 128),), (128,), (Arg.buffer('x'),)),)),))\n"
        "img = Image('cubin', 'sm_80', b'\\x7fELF' + bytes(4000), 'hand-made', 12000)\n"
        "data = kp.save([Compiled(s, (Module('m', ('k',), (img,)),))])\n"
        "before = set(sys.modules)\n"
        "pack = kp.load(data)\n"
        "plan = pack['t'].plan(x=(1000,))\n"
        "assert plan.launches[0].grid[0] == 8, plan\n"
        "mod = pack.modules['m']\n"
        "chosen = select_image(mod.images, 'sm_86', 12080).chosen\n"
        "assert chosen.codec == 'zstd' and chosen.read() == b'\\x7fELF' + bytes(4000)\n"
        "new = sorted(set(sys.modules) - before)\n"
        "import json\n"
        "print(json.dumps(new))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []
