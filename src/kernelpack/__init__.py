"""kernelpack: compile GPU kernels once, save them as a verified artifact, load and launch them
anywhere without recompiling.

This façade re-exports the public nouns. Importing it is cheap: no llvmlite, no lowering, no
CUDA driver. Compilation (``kp.compile``, ``kp.external`` with PTX) imports the toolchain on
first use; launching imports :mod:`kernelpack.runtime` on first call.
"""

from __future__ import annotations

from .dtypes import (DType, bfloat16, bf16, bool_, c64, c128, complex64, complex128, f16, f32,
                     f64, float16, float32, float64, i8, i16, i32, i64, int8, int16, int32, int64,
                     u8, u16, u32, u64, uint8, uint16, uint32, uint64)
from .errors import (CacheError, CompatibilityError, CompileError, ConstraintError, DeviceError,
                     ExpressionError, FormatError, IntegrityError, KernelPackError, LaunchError,
                     SignatureError, TraceError)
from .expr import (Expr, cdiv, emax, emin, eq, ge, gt, land, le, lnot, lor, lt, ne, select, shl,
                   shr, sym)
from .summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module, Scalar,
                      Scratch, Tensor, Variant)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # dtypes
    "DType", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
    "c64", "c128",
    # errors
    "KernelPackError", "FormatError", "IntegrityError", "SignatureError", "CompatibilityError",
    "ConstraintError", "ExpressionError", "CompileError", "TraceError", "LaunchError",
    "DeviceError", "CacheError",
    # expressions
    "Expr", "sym", "cdiv", "emin", "emax", "shl", "shr", "select", "eq", "ne", "lt", "le", "gt",
    "ge", "land", "lor", "lnot",
    # summary model
    "Tensor", "Scalar", "Constraint", "Scratch", "Arg", "Launch", "Variant", "KernelSummary",
    "Image", "Module", "Compiled",
]
