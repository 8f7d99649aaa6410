"""Build script for kernelpack's one optional C extension (everything else is pyproject.toml).

``kernelpack.runtime._launch`` forwards launches to the driver's ``cuLaunchKernel`` with plain
integers (``_launch.c``), runs the PyTorch fast path and ``Program.__call__`` in C
(``_fastcall.c``), and holds the artifact verifier's C walk (``../_verify.c``, asked through
``kernelpack/_verify_native.py``), the summary reader's bulk read (``../_fbread.c``, asked by
``kernelpack/_fbread.py``) and the load path's zstd reader (``../_zstd.c``, asked through
``kernelpack/_zstd.py``: kernelpack's own decoder, ``../_zstd_inflate.c``, which spares a first
load the ~170 µs dlopen of the system's libzstd, and that libzstd opened with dlopen as the
second choice) and the descriptor a large pack's images are read from (``../_fdowner.c``:
closed by no Python code); see those files for why. It is optional: without a C compiler the build skips
it, the runtime launches through its Python driver door (ctypes over ``libcuda.so.1``, or
cuda.bindings) and the verifier walks in Python, with the same results. It uses the limited C
API (plus two functions CPython exports from 3.11 on, declared in ``_fastcall.c``), so one
build serves every later Python (built on 3.12 or later, it needs 3.12: that limited API lets
``Program`` calls skip tp_call); on 3.10 and on a free-threaded Python (3.13t, 3.14t) it is
not built. It links against nothing but libdl (the driver's entry point is handed to it at run
time; libzstd, now a second choice, is opened on first use of it).
"""

import sys
import sysconfig

from setuptools import Extension, setup

RUNTIME = "src/kernelpack/runtime/"

# The limited API of the building Python: 3.12's adds vectorcall for CallBase (_fastcall.c).
LIMITED = (3, 12) if sys.version_info >= (3, 12) else (3, 11)

# A free-threaded build (3.13t, 3.14t: no GIL) gets no extension: the limited API does not
# exist there before 3.15, and setuptools' bdist_wheel refuses py_limited_api outright on it,
# so this script's options failed the whole install, not only the optional build; and the C
# code relies on the GIL (module state, the fast paths' caches). The Python paths run instead,
# with the same results.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

extensions = [
    Extension(
        "kernelpack.runtime._launch",
        # _verify.c: the verifier's C walker, a second module of this library (see its top)
        sources=[RUNTIME + f for f in ("_launch.c", "_fastcall.c", "_fastcall_spec.c",
                                         "_callbase.c", "_drvcall.c", "../_verify.c",
                                         "../_fbread.c", "../_zstd.c", "../_zstd_inflate.c",
                                         "../_fdowner.c")],
        depends=[RUNTIME + "_launch.h", RUNTIME + "_fastcall.h", "src/kernelpack/_zstd_inflate.h"],
        define_macros=[("Py_LIMITED_API", f"0x03{LIMITED[1]:02X}0000")],
        # dlopen (libzstd, ../_zstd.c; libcuda, _drvcall.c): in libc from glibc 2.34, in
        # libdl before
        libraries=["dl"] if sys.platform.startswith("linux") else [],
        py_limited_api=True,
        optional=True,
    )
] if sys.version_info >= (3, 11) and not FREE_THREADED else []

setup(
    ext_modules=extensions,
    options={"bdist_wheel": {"py_limited_api": f"cp3{LIMITED[1]}"}} if extensions else {},
)
