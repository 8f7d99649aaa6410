"""The NumPy reference's runtime: the namespace its generated source runs in, and its inputs.

The reference is generated as source alongside the fusion, line for line; the helpers here
(``_model``, ``_red``, ``_erf``, ``_sigmoid``) follow the DSL's typing rules and reduction
semantics (empty ``max``/``min`` give the identity, float32 sums accumulate in float64).

In the half mode, float16/bfloat16 values are float32 arrays of exactly representable values:
NumPy computes each operation on them in float32, as the kernel does, and ``_model(v,
"float16")`` rounds the result to the half type (:func:`.halves.round_half`), as the kernel does
after every operation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernelpack.lowering.tuning import THREAD_ROW_MAX

from .dtypes import NP_MODEL
from .halves import HALF_NAMES, from_storage, round_half
from .values import Param


# The reference runs in three precisions: "64" is the reference (floats in float64); "32" keeps
# float32/complex64 values in their own precision (sums accumulate in float64, as the lowering
# does) and "ld" computes floats in long double. How far "32" (for outputs with float32 rounding
# in them) or "ld" (for the others) is from "64" says how well-conditioned an output is: where
# even a correct evaluation in the kernel's precision could not meet the tolerance (a mean of
# values centred on their mean is 0 plus rounding noise), the comparison means nothing and the
# output is skipped (and counted).
#
# In "32", a float32 sum or mean also accumulates as the kernel may: each run of
# ``THREAD_ROW_MAX`` (32) consecutive terms in float32, the runs' partials in float64, and a
# product of at most 32 terms in float32. A row of at most 32 terms that one thread owns
# accumulates in float32 (lowering/rows.py ``_acc``), and a warp or block row's thread sums its
# register chunk (<= 32 terms) in float32 first (``_part``); a "32" that accumulated everything
# in float64 called outputs well-conditioned that those roundings move past their tolerance
# (GPU fuzz, elsewhere mode, seed 1965: 31-term row sums of float32, summed again and passed to
# ``sin`` at ~50, 1.2e-5 off the float64 reference where the old "32" was 2.0e-6 off).
#
# "r" is "64" with every real floating sum and mean rounded once from its exact value
# (math.fsum): a comparison or a floor that an exact tie decides (an element equal to a sum of
# other elements, a sum that is an integer before rounding) turns on the order of the
# additions, which the kernel's and NumPy's pairwise order need not share. Where "r" differs
# from "64", any output (bools and integers too) hangs on such a tie and is skipped as
# ill-conditioned (GPU fuzz, elsewhere mode, seed 358: the kernel's row sum was the exact -3.0
# where NumPy's was -2.999999999999986, and an element -3.0 compared equal to it).
#
# "r+" and "r-" are "r" with each sum moved up (down) by the most any order of additions can
# err, (count - 1) u / (1 - (count - 1) u) times the sum of the magnitudes (u = 2^-53; a mean
# is that sum divided by the count), then rounded once. An output that moves under either hangs
# on how its sums round even without an exact tie: a sum that cancels to about 1e-17 (one
# decimal's values in a row summing to nearly 0) has its sign decided by the order of
# additions, and a comparison of 0.0 with it (session 38, elsewhere seeds 826, 904, 943) or a
# floor of it follows that sign. "r0" is "r" with every sum whose bound reaches 0 made exactly
# 0.0, which some order of additions gives (0.1 + 0.2 - 0.3 is not 0 in that order, but is
# in another): an equality with 0 (seed 943) then holds.
MODES = {
    "64": NP_MODEL,
    "r": NP_MODEL,
    "r+": NP_MODEL,
    "r-": NP_MODEL,
    "r0": NP_MODEL,
    "seq": NP_MODEL,
    "32": dict(NP_MODEL, float16=np.float32, float32=np.float32, complex64=np.complex64),
    "ld": dict(NP_MODEL, float16=np.longdouble, float32=np.longdouble, float64=np.longdouble,
               complex64=np.clongdouble, complex128=np.clongdouble),
}
# The half mode's precisions: "64", "32" and "ld" as above for the other dtypes, with float16/
# bfloat16 modelled exactly (float32 arrays, rounded after every operation); "x" computes the
# half values unrounded, in float64. How far "x" is from "64" says how much an output hangs on
# the half roundings: where the kernel may round differently (libdevice's exp an ulp from
# NumPy's; Case.tolerance), an output that moves by more than a quarter of its tolerance
# without them is skipped as ill-conditioned, as above.
_HALF32 = {"float16": np.float32, "bfloat16": np.float32}
HALF_MODES = {
    "64": dict(MODES["64"], **_HALF32),
    "32": dict(MODES["32"], **_HALF32),
    "ld": dict(MODES["ld"], **_HALF32),
    "x": dict(MODES["64"], float16=np.float64, bfloat16=np.float64),
    "r": dict(MODES["64"], **_HALF32),
    "r+": dict(MODES["64"], **_HALF32),
    "r-": dict(MODES["64"], **_HALF32),
    "r0": dict(MODES["64"], **_HALF32),
    "seq": dict(MODES["64"], **_HALF32),
}
SUM_MODES = ("r", "r+", "r-", "r0")  # the modes whose floating sums are rounded from exact ones
# "seq" is "64" with every real floating sum (and mean) added one term after another, in
# order: an order of additions a kernel may take (a thread's own row), against NumPy's pairwise
# one. An output that moves under it hangs on that order as it would in the kernel (emulator,
# half mode, seed 3139: a row of 17 equal values whose float64 mean is not exactly that value
# in the kernel, centred and scaled by rsqrt(variance + 1e-9), ~3e4: an imaginary part of
# -7e-12 where NumPy's exact mean gave 0, while "r+"/"r-" moved it by 5.7e-11, below their
# NUDGE_MOVES).
ORDER_MODES = ("seq",)
_UNROUNDED = {"x"}
# rows of an exact sum made Python lists at a time (bounds the lists' memory)
_EXACT_CHUNK = 1 << 16


def modes_of(halves: bool) -> dict[str, dict]:
    """The precision modes (name: the model type of each DSL dtype) of a case."""
    return HALF_MODES if halves else MODES


def ref_namespace(mode: str, halves: bool = False) -> dict:
    """The globals the reference source is exec'd in, for the precision ``mode`` (of the half
    mode's set with ``halves``)."""
    types = modes_of(halves)[mode]
    rounds = halves and mode not in _UNROUNDED
    exact_sums = mode in SUM_MODES
    nudge = {"r+": 1.0, "r-": -1.0}.get(mode, 0.0)
    zeroes = mode == "r0"
    sequential = mode in ORDER_MODES
    runs32 = mode == "32"

    def _model(v: Any, name: str) -> np.ndarray:
        """``v`` as the reference's array of the DSL dtype ``name``."""
        if rounds and name in HALF_NAMES:
            return round_half(v, name)
        v = np.asarray(v)
        target = types[name]
        if v.dtype == target:
            return v
        if v.dtype.kind == "c" and np.dtype(target).kind == "b":
            return v != 0  # NumPy's astype(bool): either part nonzero (GPU fuzz seed 14979)
        if v.dtype.kind == "c" and np.dtype(target).kind != "c":
            v = v.real
        return v.astype(target)

    def _red(kind: str, v: np.ndarray, axis: Any, keepdims: bool, name: str) -> np.ndarray:
        v = np.asarray(v)
        if kind in ("max", "min"):
            if v.dtype.kind == "f":
                ident = -np.inf if kind == "max" else np.inf
            elif v.dtype.kind == "b":
                ident = kind == "min"
            else:
                info = np.iinfo(v.dtype)
                ident = info.min if kind == "max" else info.max
            fn = np.max if kind == "max" else np.min
            r = fn(v, axis=axis, keepdims=keepdims, initial=ident)
        elif v.dtype.kind in "bi" and kind != "mean":
            fn = np.sum if kind == "sum" else np.prod
            r = fn(v, axis=axis, keepdims=keepdims, dtype=np.int64)
        else:
            # floats: the lowering accumulates float32 in float64 (complex64 in complex64)
            acc = {np.dtype(np.float32): np.float64, np.dtype(np.float16): np.float64}
            if v.dtype.kind in "bi":
                acc_t = types["float64"]
            else:
                acc_t = acc.get(v.dtype, v.dtype)
            w = v.astype(acc_t)
            if runs32 and v.dtype == np.float32:
                r = _float32_runs(v, axis, keepdims, kind)
            elif kind == "mean" and w.dtype.kind == "c":
                r = _complex_mean(w, axis, keepdims)
            elif exact_sums and kind != "prod" and w.dtype.kind == "f":
                r = _exact_sum(w, axis, keepdims, kind == "mean")
            elif sequential and kind != "prod" and w.dtype.kind == "f":
                r = _sequential_sum(w, axis, keepdims, kind == "mean")
            else:
                fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean}[kind]
                r = fn(w, axis=axis, keepdims=keepdims)
        return _model(r, name)

    def _complex_mean(w: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
        """The kernel's complex mean: the sum with each part divided by the count (C99 Annex G's
        complex / real). NumPy's ``mean`` divides by the count as a complex number, whose
        ``part * 0`` terms turn a NaN or infinite imaginary part into a NaN real part too
        (fuzz seeds 5908, 13955, 24998: notes/gpu-fuzz.md); the kernel's value is the exact
        one, so the reference models it."""
        total = np.sum(w, axis=axis, keepdims=keepdims)
        count = w.size // total.size if total.size else 0  # elements per reduced value
        with np.errstate(invalid="ignore", divide="ignore"):
            return _complex(total.real / count, total.imag / count).astype(w.dtype)

    def _float32_runs(v: np.ndarray, axis: Any, keepdims: bool, kind: str) -> np.ndarray:
        """Mode "32"'s float32 ``kind`` (sum, mean, prod) of ``v`` over ``axis``: sums over
        runs of ``THREAD_ROW_MAX`` terms in float32, the runs in float64; a product of at most
        that many terms in float32, a longer one in float64 (see the comment above MODES)."""
        rows, count, axes = _rows(v, axis)
        if kind == "prod":
            acc = np.float32 if count <= THREAD_ROW_MAX else np.float64
            out = np.prod(rows.astype(acc), axis=1)
        else:
            out = np.zeros(rows.shape[0])
            for start in range(0, count, THREAD_ROW_MAX):
                run = rows[:, start:start + THREAD_ROW_MAX].sum(axis=1, dtype=np.float32)
                out += run.astype(np.float64)
            if kind == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):
                    out = out / count if count else np.full(out.shape, np.nan)
        return _unrows(out, v.shape, axes, keepdims)

    def _exact_sum(w: np.ndarray, axis: Any, keepdims: bool, mean: bool) -> np.ndarray:
        """The sum (or mean) of ``w`` over ``axis``, each rounded once from its exact value
        (mode "r"), or from it moved by the error bound of any order of additions (modes
        "r+", "r-"), or 0 where that bound reaches it (mode "r0"); non-finite values give
        NumPy's own answer.

        Rows of one term (a reduction over a size-1 axis) or none are answered for all rows
        at once, and rows holding an infinity or a NaN in one np.sum; only the other rows
        take fsum, a chunk of them made Python lists at a time. A Python loop over every
        row, each converted and tested on its own, was most of the 25 s that GPU fuzz seeds
        such as 49893 (1.5 million rows of one term, in each of the four modes) timed out on
        (notes/gpu-fuzz.md)."""
        flat, count, axes = _rows(w, axis)
        n_out = flat.shape[0]
        sums = np.empty(n_out, w.dtype)
        k = (count - 1) * 2.0 ** -53
        gamma = k / (1 - k) if k < 0.5 else math.inf

        def rounded(terms: list) -> float:
            """One row of finite ``terms`` (a list this may extend)."""
            bound = gamma * math.fsum(map(abs, terms)) if count > 1 else 0.0
            if nudge:
                terms.append(nudge * bound)
            total = math.fsum(terms)
            return 0.0 if zeroes and abs(total) <= bound else total

        if count <= 1:
            # The exact sum of one term is the term (np.sum's answer for a non-finite one
            # too) and the bound is 0, so only a zero's result (its sign through fsum, and
            # "r0") is rounded's to say; a row of no terms is a zero here.
            col = flat[:, 0] if count else np.zeros(n_out, w.dtype)
            sums[:] = col
            zero = col == 0
            for negative in (False, True):
                at = zero & (np.signbit(col) == negative)
                if at.any():
                    sums[at] = rounded([-0.0 if negative else 0.0][:count])
        else:
            finite = np.isfinite(flat).all(axis=1)
            if not finite.all():  # each such row's own np.sum (a C-contiguous copy's rows)
                sums[~finite] = np.sum(flat[~finite], axis=1)
            kept = np.flatnonzero(finite)
            for start in range(0, len(kept), _EXACT_CHUNK):  # a chunk's rows as lists at once
                rows = kept[start:start + _EXACT_CHUNK]
                sums[rows] = [rounded(terms) for terms in flat[rows].tolist()]
        return _unrows(_mean_if(mean, sums, count), w.shape, axes, keepdims)

    def _sequential_sum(w: np.ndarray, axis: Any, keepdims: bool, mean: bool) -> np.ndarray:
        """The sum (or mean) of ``w`` over ``axis``, its terms added one after another in
        order (mode "seq"; ``cumsum`` adds in order, where ``sum`` is pairwise)."""
        flat, count, axes = _rows(w, axis)
        sums = (np.cumsum(flat, axis=1)[:, -1] if count
                else np.zeros(flat.shape[0], w.dtype))
        return _unrows(_mean_if(mean, sums, count), w.shape, axes, keepdims)

    def _mean_if(mean: bool, sums: np.ndarray, count: int) -> np.ndarray:
        """``sums`` (one per row of ``count`` terms), divided by the count for a mean: NaN
        for rows of no terms."""
        if not mean:
            return sums
        with np.errstate(invalid="ignore", divide="ignore"):
            return (sums / sums.dtype.type(count) if count
                    else np.full(sums.shape, np.nan, sums.dtype))

    def _erf(x: Any) -> np.ndarray:
        x = np.asarray(x)
        return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype if x.dtype.kind == "f"
                                                                    else np.float64)

    def _sigmoid(x: Any) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    def _complex(re: Any, im: Any) -> np.ndarray:
        """``kp.complex(re, im)``: the parts as given. ``re + 1j * im`` is NaN where ``im`` is
        infinite (``1j * inf`` has the real part ``0 * inf``): a row max over an empty row
        is -inf, and the reference then expected NaN where the kernel rightly gave inf."""
        re, im = np.broadcast_arrays(np.asarray(re), np.asarray(im))
        out = np.empty(re.shape, np.result_type(re.dtype, im.dtype, np.complex64))
        out.real, out.imag = re, im
        return out

    return {"np": np, "_model": _model, "_red": _red, "_erf": _erf, "_sigmoid": _sigmoid,
            "_complex": _complex, "_types": types}


def _rows(w: np.ndarray, axis: Any) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """``w`` as a 2-D array with one row per output of a reduction over ``axis`` (None: all),
    the reduced elements along each row; with the row length and the reduced axes."""
    axes = tuple(range(w.ndim)) if axis is None else tuple(
        a % w.ndim for a in (axis if isinstance(axis, tuple) else (axis,)))
    kept = [a for a in range(w.ndim) if a not in axes]
    moved = np.moveaxis(w, axes, tuple(range(w.ndim - len(axes), w.ndim)))
    count = math.prod(w.shape[a] for a in axes)
    return moved.reshape(math.prod(w.shape[a] for a in kept), count), count, axes


def _unrows(values: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...],
            keepdims: bool) -> np.ndarray:
    """One value per row of :func:`_rows` back in the reduction's output shape."""
    if keepdims:
        return values.reshape(tuple(1 if a in axes else n for a, n in enumerate(shape)))
    return values.reshape(tuple(n for a, n in enumerate(shape) if a not in axes))


def model_inputs(params: list[Param], inputs: list, mode: str = "64",
                 halves: bool = False) -> list:
    """The inputs as the reference takes them: arrays (and scalars) in the reference's types
    (bfloat16 bits as their values)."""
    types = modes_of(halves)[mode]
    out = []
    for p, v in zip(params, inputs):
        if p.kind == "scalar":
            out.append(np.asarray(v, types[p.dt.name])[()])
        else:
            out.append(from_storage(v, p.dt.name).astype(types[p.dt.name]))
    return out
