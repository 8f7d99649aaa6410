"""Build script for kernelpack's one optional C extension (everything else is pyproject.toml).

``kernelpack.runtime._launch`` forwards a launch to the driver's ``cuLaunchKernel`` with plain
integers (see ``src/kernelpack/runtime/_launch.c`` for why). It is optional: without a C
compiler the build skips it and the runtime launches through cuda.bindings instead. It uses the
limited C API, so one build serves every Python from 3.10 on, and it links against nothing
(the driver's entry point is handed to it at run time).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kernelpack.runtime._launch",
            sources=["src/kernelpack/runtime/_launch.c", "src/kernelpack/runtime/_fastcall.c"],
            depends=["src/kernelpack/runtime/_launch.h"],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            py_limited_api=True,
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
