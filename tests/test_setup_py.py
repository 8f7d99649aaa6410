"""setup.py's choices, run with a stand-in ``setup()`` that records its arguments.

Why: on a free-threaded Python (3.13t, 3.14t) setuptools' bdist_wheel refuses
``py_limited_api`` outright ("Py_LIMITED_API is incompatible with Py_GIL_DISABLED on Python
3.14 and older"), so setup.py's unconditional option failed the whole install there, not only
the optional extension. This machine has no free-threaded interpreter: the build's view of one
is ``sysconfig.get_config_var("Py_GIL_DISABLED")``, which these tests set.
"""

from __future__ import annotations

import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import pytest

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


def run_setup_py(monkeypatch: pytest.MonkeyPatch, *, gil_disabled: bool,
                 version: tuple[int, int]) -> dict[str, Any]:
    recorded: dict[str, Any] = {}
    fake = types.ModuleType("setuptools")
    fake.Extension = lambda name, **kw: types.SimpleNamespace(name=name, **kw)  # type: ignore
    fake.setup = recorded.update  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "setuptools", fake)
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: (
        1 if gil_disabled else 0) if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(sys, "version_info", (*version, 0, "final", 0))
    exec(compile(SETUP_PY.read_text(), str(SETUP_PY), "exec"), {"__name__": "__main__"})
    return recorded


@pytest.mark.parametrize("version, limited", [((3, 11), "cp311"), ((3, 12), "cp312"),
                                              ((3, 14), "cp312"), ((3, 15), "cp312")])
def test_a_gil_build_gets_the_limited_api_extension(monkeypatch, version, limited) -> None:
    args = run_setup_py(monkeypatch, gil_disabled=False, version=version)
    (ext,) = args["ext_modules"]
    assert ext.name == "kernelpack.runtime._launch" and ext.optional and ext.py_limited_api
    assert args["options"] == {"bdist_wheel": {"py_limited_api": limited}}
    assert ("Py_LIMITED_API", f"0x03{int(limited[3:]):02X}0000") in ext.define_macros


@pytest.mark.parametrize("version", [(3, 13), (3, 14), (3, 15)])
def test_a_free_threaded_build_is_pure_python_with_no_limited_api_option(monkeypatch,
                                                                         version) -> None:
    args = run_setup_py(monkeypatch, gil_disabled=True, version=version)
    assert args["ext_modules"] == []
    assert args["options"] == {}  # bdist_wheel would refuse py_limited_api (before 3.15)


def test_python_310_is_pure_python(monkeypatch) -> None:
    args = run_setup_py(monkeypatch, gil_disabled=False, version=(3, 10))
    assert args["ext_modules"] == [] and args["options"] == {}
