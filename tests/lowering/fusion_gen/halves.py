"""float16/bfloat16 as kernelpack defines them, in NumPy: rounding, storage, constants.

kernelpack computes every float16/bfloat16 operation in float32 and rounds the result to the
half type (round to nearest even) after every operation; a float64 or integer source rounds
once, straight to the half type (``lowering/irutil.py``: ``_round_narrow``, ``convert``).
The reference of the half mode holds half values as float32 arrays of exactly representable
values and rounds with :func:`round_half` wherever the kernel rounds.

float16: NumPy's own conversions round to nearest even, from float32 and (directly, not
through float32) from float64. bfloat16: NumPy has none, so :func:`bf16_round_bits` rounds
float32 bit patterns with integer operations (add 0x7FFF plus the kept part's lowest bit,
drop the low 16 bits: ties go to even, a carry out of the significand bumps the exponent, and
so reaches the infinity where round to nearest even says so), NaN as the quiet 0x7FC0 the
kernels store. A float64 source first goes to float32 rounding *to odd* (the inexact
result's last bit set), after which one round to nearest even at 8 bits is exact: the
kernel's own route (``_round_narrow``).

Storage: float16 arrays as float16; bfloat16 arrays as their uint16 bit patterns (what the
SIMT emulator and kernelpack's NumPy-facing paths take; the GPU tool views them as
``torch.bfloat16``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import NP_STORAGE

__all__ = ["HALF_NAMES", "UNIT", "SAFE", "round_half", "bf16_round_bits", "bf16_bits",
           "bf16_value", "to_storage", "from_storage", "half_const"]

HALF_NAMES = ("float16", "bfloat16")
# unit roundoff (half an ulp relative to the value, at most): 2^-11 and 2^-8
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# magnitudes a half value's interval may reach: float16's largest finite value is 65504 (and
# everything from 65520 rounds to infinity), with room for one rounding above a bound
SAFE = {"float16": 6.0e4, "bfloat16": 1.0e30}
_BF16_NAN = 0x7FC0


def _as_float(v: Any) -> np.ndarray:
    """``v`` as a float32 or float64 array: bools and integers through float64 (exact up to
    2^53, rounding to nearest even beyond, as the kernel's ``sitofp`` to double), long
    double through float64."""
    v = np.asarray(v)
    if v.dtype.kind == "c":
        v = v.real
    if v.dtype in (np.float32, np.float64):
        return v
    return v.astype(np.float64)


def _f32_round_to_odd(v: np.ndarray) -> np.ndarray:
    """float64 ``v`` in float32, rounded to odd: an inexact result is the float32 value
    towards zero with its last bit set (so a later rounding to fewer bits sees which side of
    a tie the exact value was on). NaN stays NaN, infinities stay infinite; a finite value
    past float32's range gives the largest float32 (odd), which bfloat16 rounds to infinity."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = v.astype(np.float32)
        back = r.astype(np.float64)
        inexact = (back != v) & ~np.isnan(v)
        away = np.where(v < 0, back < v, back > v)
    bits = np.atleast_1d(r).view(np.uint32).reshape(r.shape)
    toward = np.where(away, bits - np.uint32(1), bits)
    odd = toward | np.uint32(1)
    out = np.where(inexact, odd, bits).astype(np.uint32)
    return np.atleast_1d(out).view(np.float32).reshape(r.shape)


def bf16_round_bits(f32: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) of float32 values, rounded to nearest even; every
    NaN becomes 0x7FC0."""
    f32 = np.array(f32, dtype=np.float32, order="C")  # (ascontiguousarray makes 0-d 1-d)
    bits = np.atleast_1d(f32).view(np.uint32).reshape(f32.shape).astype(np.uint64)
    lsb = (bits >> np.uint64(16)) & np.uint64(1)
    top = ((bits + np.uint64(0x7FFF) + lsb) >> np.uint64(16)).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(_BF16_NAN), top).astype(np.uint16)


def bf16_value(bits: Any) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they hold."""
    b = np.array(bits, dtype=np.uint16, order="C")
    wide = b.astype(np.uint32) << np.uint32(16)
    return np.atleast_1d(wide).view(np.float32).reshape(b.shape)


def bf16_bits(v: Any) -> np.ndarray:
    """Any real values (float32, float64, integers, bools) rounded once to bfloat16: bits."""
    f = _as_float(v)
    if f.dtype == np.float64:
        f = _f32_round_to_odd(f)
    return bf16_round_bits(f)


def round_half(v: Any, name: str) -> np.ndarray:
    """``v`` rounded once to the half type ``name``, held as float32 (its compute type)."""
    f = _as_float(v)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "float16":
            return f.astype(np.float16).astype(np.float32)
    return bf16_value(bf16_bits(f))


def to_storage(v: Any, name: str) -> np.ndarray:
    """Values as a kernel's buffer of dtype ``name`` holds them (bfloat16: bits)."""
    if name == "bfloat16":
        return bf16_bits(v)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v).astype(NP_STORAGE[name])


def from_storage(v: Any, name: str) -> np.ndarray:
    """A buffer of dtype ``name`` as values NumPy computes with (bfloat16 bits: float32)."""
    if name == "bfloat16":
        v = np.asarray(v)
        return bf16_value(v) if v.dtype == np.uint16 else v.astype(np.float32)
    return np.asarray(v)


def half_const(c: float, name: str) -> float:
    """The Python float a literal ``c`` becomes in a half-typed expression (kernelpack rounds
    weak constants to the tensor's dtype: ``x16 + 0.1`` adds float16(0.1))."""
    return float(round_half(np.float64(c), name))
