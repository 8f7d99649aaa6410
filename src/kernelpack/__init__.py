"""kernelpack: compile GPU kernels once, save them as a verified artifact, load and launch them
anywhere without recompiling.

This façade re-exports the public nouns and imports the load path (loader, runtime), so that
``kp.load`` and a first call import nothing. Importing it stays cheap: no llvmlite, no lowering,
no CUDA driver bindings, no array library, no GPU work. Compilation (``kp.compile``,
``kp.external`` with PTX) imports the toolchain on first use; the first launch opens the driver.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Mapping, Sequence

from .dtypes import (DType, bfloat16, bf16, bool_, c64, c128, complex64, complex128, f16, f32,
                     f64, float16, float32, float64, i8, i16, i32, i64, int8, int16, int32, int64,
                     u8, u16, u32, u64, uint8, uint16, uint32, uint64)
from .errors import (CacheError, CompatibilityError, CompileError, ConstraintError, DeviceError,
                     ExpressionError, FormatError, IntegrityError, KernelPackError, LaunchError,
                     RankError, SignatureError, TraceError)
from .expr import (Expr, cdiv, emax, emin, eq, ge, gt, land, le, lnot, lor, lt, ne, select, shl,
                   shr, sym)
from .compiled import Compiled, Image, Module
from .summary import Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor, Variant

# Imported eagerly on purpose: kernelpack/external.py imports only light modules (nvJitLink is
# imported inside the call), and a lazy wrapper named like its submodule would be replaced by
# the module object the first time anything imports ``kernelpack.external``.
from .external import external
from .planner import Plan
# The fusion DSL is pure Python (no llvmlite); kp.compile imports the lowering on first call.
from .fusion import (Fusion, abs, arange, ceil, complex, conj, cos, erf, exp, exp2, floor, fusion,
                     imag, iota, log, log2, max, maximum, mean, min, minimum, pad, pow, prod,
                     real, rsqrt, sigmoid, sin, sqrt, sum, tan, tanh, where)

# The load path, imported here rather than on the first ``kp.load`` / first call: a server's
# time from ``kp.load(path)`` to its first result (issue 4) is otherwise mostly the import of
# these ~25 small modules (about 12 ms on a GPU host, against ~1 ms of loading). None of them
# imports the driver bindings, llvmlite or an array library, and none touches a GPU.
from . import _plan_fast as _plan_fast, _zstd as _zstd, loader as _loader  # noqa: E402,F401
from .runtime import launcher as _launcher, libcuda as _libcuda  # noqa: E402,F401
from .loader import Pack  # noqa: E402

if TYPE_CHECKING:  # imported on first use (see __getattr__); type checkers see them here
    from .cache import Cache, CacheKey, make_key


def compile(f: Fusion, targets: Sequence[str] = ("sm_80", "sm_90", "ptx"), *,  # noqa: A001
            static: Mapping[str, int] | None = None, cache: Any = None,
            **options: object) -> Compiled:
    """Lower a ``@kp.fusion`` to PTX and cubins with a derived summary → :class:`Compiled`.

    Parameters
    ----------
    f: the ``@kp.fusion`` function.
    targets: ``"sm_XY"`` (also ``sm_90a``, ``sm_100f``) for a cubin each, ``"ptx"`` for a PTX
        image of the lowest architecture (drivers of newer GPUs compile it); ``"compute_XY"``
        asks for the PTX and lists XY among the architectures, so it also gives an ``sm_XY``
        cubin (``kp.external`` gives only the PTX). At least one architecture; the order does
        not matter.
    static: ``{"dim": size}`` makes those dims constants in the code (a call with another
        size is a ``ConstraintError``); everything else stays symbolic.
    cache: a :class:`Cache`: a hit returns the stored artifact (``.origin`` ``"disk"`` or
        ``"remote"``) without importing the lowering; a miss compiles and stores.
    opt: LLVM's optimization level, 0..3 (default 3).

    ``static``, ``opt`` and ``targets`` are part of the cache key. Compile errors raise
    ``CompileError`` with the LLVM/nvJitLink log, trace errors ``TraceError``. The lowering
    (llvmlite) is imported on the first compile, not at ``import kernelpack``."""
    from .compile_entry import compile as _compile
    return _compile(f, targets, static=static, cache=cache, **options)


def save(items: object, path_or_file: str | os.PathLike[str] | BinaryIO | None = None, *,
         sign_with: object = None) -> bytes:
    """Serialize programs into one artifact (see :func:`kernelpack.serializer.save`)."""
    from .serializer import save as _save
    return _save(items, path_or_file, sign_with=sign_with)


def load(path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview, *,
         trusted_keys: Iterable[object] | None = None) -> Pack:
    """Open and verify an artifact → ``Pack`` (see :func:`kernelpack.loader.load`)."""
    from .loader import load as _load
    return _load(path_or_bytes, trusted_keys=trusted_keys)


__version__ = "0.1.0"

_LAZY = {"Cache": "cache", "CacheKey": "cache", "make_key": "cache"}


def __getattr__(name: str) -> Any:
    """``kp.Cache`` / ``kp.CacheKey`` / ``kp.make_key``, imported on first use (PEP 562) so that
    ``import kernelpack`` does not pay for the cache modules."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernelpack' has no attribute {name!r}")

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
    "DeviceError", "RankError", "CacheError",
    # expressions
    "Expr", "sym", "cdiv", "emin", "emax", "shl", "shr", "select", "eq", "ne", "lt", "le", "gt",
    "ge", "land", "lor", "lnot",
    # summary model
    "Tensor", "Scalar", "Constraint", "Scratch", "Arg", "Launch", "Variant", "KernelSummary",
    "Image", "Module", "Compiled",
    # external kernels
    "external",
    # artifacts
    "save", "load", "Pack", "Plan",
    # compile-or-load cache
    "Cache", "CacheKey", "make_key",
    # fusion DSL and compilation
    "fusion", "Fusion", "compile", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos",
    "tan", "tanh", "erf", "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum",
    "min", "max", "sum", "prod", "mean", "arange", "iota", "complex", "real", "imag", "conj",
    "pad",
]
