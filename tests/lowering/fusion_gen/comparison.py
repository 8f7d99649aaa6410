"""Comparing a kernel's output with the reference: exact for integers and bools, normwise
relative error for floats and complex (NaN and infinity positions must match exactly; a
tolerance of 0 asks for the same values, as for half outputs the reference models exactly).
bfloat16 outputs come as bit patterns (uint16), as kernels store them.

A reference whose finite elements are all exactly 0 has no scale for a relative error: it is
almost always a cancellation (a row of one constant centred on its mean, a sum of centred
values), which the kernel computes as a rounding residue of operands whose size the reference
does not show. There the caller may give ``zero_scale``, an absolute bound (the tolerance times
the generator's bound on the output's magnitude); without it any nonzero value fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import kernelpack as kp

from .dtypes import NP_STORAGE
from .halves import from_storage


def compare(got: Any, ref: np.ndarray, dt: kp.DType, tol: float,
            zero_scale: float = 0.0) -> str | None:
    """None when ``got`` (the kernel's output) matches ``ref``; else what differs.
    ``zero_scale``: the absolute error allowed when every finite element of ``ref`` is 0."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    want = NP_STORAGE[dt.name]
    if got.dtype != want:
        return f"dtype {got.dtype}, expected {np.dtype(want)}"
    if got.shape != ref.shape:
        return f"shape {got.shape}, expected {ref.shape}"
    got = from_storage(got, dt.name)
    if ref.size == 0:
        return None
    if dt.kind in "bi":
        if not np.array_equal(got, ref.astype(got.dtype)):
            bad = np.argwhere(got != ref.astype(got.dtype))
            i = tuple(bad[0])
            return f"{len(bad)} elements differ, first at {i}: got {got[i]!r}, expected {ref[i]!r}"
        return None
    parts = [(got.real, ref.real), (got.imag, ref.imag)] if dt.kind == "c" else [(got, ref)]
    scale = 0.0
    errs = []
    for g, r in parts:
        g = g.astype(np.float64)
        nan_r, nan_g = np.isnan(r), np.isnan(g)
        if not np.array_equal(nan_r, nan_g):
            i = tuple(np.argwhere(nan_r != nan_g)[0])
            return f"NaN positions differ, first at {i}: got {g[i]!r}, expected {r[i]!r}"
        inf_r = np.isinf(r)
        if not np.array_equal(np.isinf(g), inf_r) or not np.array_equal(g[inf_r], r[inf_r]):
            i = tuple(np.argwhere((np.isinf(g) != inf_r) | (inf_r & (g != r)))[0])
            return f"infinities differ, first at {i}: got {g[i]!r}, expected {r[i]!r}"
        fin = np.isfinite(r)
        if fin.any():
            scale = max(scale, float(np.max(np.abs(r[fin]))))
            errs.append((np.abs(g - r), fin))
    worst = 0.0
    where = None
    for e, fin in errs:
        e = np.where(fin, e, 0.0)
        k = int(np.argmax(e))
        if e.flat[k] > worst:
            worst, where = float(e.flat[k]), np.unravel_index(k, e.shape)
    if scale == 0.0 and zero_scale > 0.0:  # a cancellation: see the module docstring
        if worst > zero_scale:
            return (f"absolute error {worst:.3e} > {zero_scale:.1e} against an all-zero "
                    f"reference (worst at {where}: got {got[where]!r})")
        return None
    scale = max(scale, 1e-300)
    if worst / scale > tol:
        return (f"normwise relative error {worst / scale:.3e} > {tol:.0e} (worst at {where}: "
                f"got {got[where]!r}, expected {ref[where]!r})")
    return None
