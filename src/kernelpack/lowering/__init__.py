"""The lowering: a traced fusion → kernels → LLVM IR → PTX → cubins, plus the derived summary.

Importing this package pulls in llvmlite (through :mod:`.pipeline`); ``import kernelpack``
never does: ``kp.compile`` imports it on first call.
"""

from __future__ import annotations

from .pipeline import STAGES, Build, Options, compile_fusion, run

__all__ = ["compile", "compile_fusion", "STAGES", "Build", "Options", "run"]

compile = compile_fusion  # noqa: A001 - the public name is kp.compile
