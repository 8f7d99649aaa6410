"""One exception hierarchy for everything kernelpack raises on bad input or failed work.

Every failure that comes from *data* (a file, a cache entry, a shape handed to ``plan``) or from
the toolchain and the driver is a :class:`KernelPackError` subclass, so a caller can catch one
type. Misuse of the API (a wrong argument type in Python code) stays ``TypeError``/``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "KernelPackError",
    "FormatError",
    "IntegrityError",
    "SignatureError",
    "CompatibilityError",
    "ConstraintError",
    "ExpressionError",
    "CompileError",
    "TraceError",
    "LaunchError",
    "DeviceError",
    "RankError",
    "CacheError",
]


class KernelPackError(Exception):
    """Root of every error kernelpack raises for bad data or failed work."""


class FormatError(KernelPackError):
    """The bytes are not a well-formed kernelpack artifact (bad identifier, offset, length, enum,
    string, limit exceeded, malformed expression program)."""


class IntegrityError(KernelPackError):
    """A digest or recorded size does not match the bytes it describes."""


class SignatureError(KernelPackError):
    """The artifact is unsigned, signed by an untrusted key, or its signature does not verify."""


class CompatibilityError(KernelPackError):
    """The artifact cannot run here: newer format major, or no image usable on this device."""


class ConstraintError(KernelPackError):
    """Actual shapes or scalars violate the summary (mismatched dims, failed predicate,
    overflow, division by zero, negative size)."""


class ExpressionError(ConstraintError):
    """Evaluating a symbolic expression failed (overflow, division by zero, unbound symbol).
    ``reason``: the evaluator's own words for it, where it says (``"division by zero in
    floordiv"``), for a caller that words the error its own way."""

    reason: str | None = None


class CompileError(KernelPackError):
    """Lowering, LLVM or nvJitLink failed; ``log`` holds the tool's own output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message + (f"\n--- log ---\n{log}" if log else ""))
        self.log = log


class TraceError(CompileError):
    """A fusion could not be traced: dtype mismatch, unbroadcastable shapes, unsupported op."""


class LaunchError(KernelPackError):
    """Loading a module or launching a kernel failed in the driver, or the arguments do not fit
    the summary (dtype, rank, device, strides)."""


class DeviceError(LaunchError):
    """No usable GPU, or the CUDA driver is missing."""


class RankError(ConstraintError, LaunchError):
    """A tensor's rank differs from its parameter's. To ``plan()`` that is a shape the summary
    does not fit (ConstraintError); to a call, an argument that does not fit (LaunchError, as
    for a wrong dtype or device): it is both, so either ``except`` catches it."""


class CacheError(KernelPackError):
    """A cache operation failed in a way the caller must see (bad configuration); cache
    *misses* and broken entries never raise this, they recompile."""
