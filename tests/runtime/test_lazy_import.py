"""The runtime imports the CUDA bindings only when something is launched."""

from __future__ import annotations

import json
import subprocess
import sys


def test_runtime_modules_do_not_import_the_bindings() -> None:
    code = ("import sys, json\n"
            "import kernelpack\n"
            "from kernelpack.runtime import call_program, warmup, explain, select_image\n"
            "import kernelpack.runtime.launcher, kernelpack.runtime.fastpath\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('cuda', 'torch', "
            "'cupy', 'numpy')))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []
