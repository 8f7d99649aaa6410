"""Drawing a parameter's input array from its distribution (``Param.dist``).

The distributions match the intervals the generator assumed for the parameter (``add_input``):
"pos" floats stay positive, "nonzero" integers are never 0 or -1, "grid"/"decimal" floats sit on
the steps of ``//`` and ``%`` ...
"""

from __future__ import annotations

import numpy as np

from .dtypes import F32, F64, I32, NP_STORAGE
from .halves import to_storage
from .values import Param


def draw(rng: np.random.Generator, p: Param, shape: tuple[int, ...], nan: bool) -> np.ndarray:
    dt, dist = p.dt, p.dist
    st = NP_STORAGE[dt.name]
    if dist.startswith("h"):
        return _draw_half(rng, p, shape, nan)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "i":
        if dist == "nonzero":  # no -1: x // -1 of the smallest integer is undefined
            mag = rng.integers(1, 10, size=shape)
            mag = np.where((mag == 1) & (rng.random(shape) < 0.5), 2, mag)
            sign = np.where(rng.random(shape) < 0.5, -1, 1)
            v = np.where(mag == 1, 1, sign * mag)
        elif dist == "count":
            v = rng.integers(0, 40 if dt == I32 else 70, size=shape)
        elif dist == "wide":
            m = 1 << (30 if dt == I32 else 40)
            v = rng.integers(-m, m, size=shape)
        else:
            v = rng.integers(-20, 21, size=shape)
        return v.astype(st)
    if dt.kind == "c":
        re = rng.uniform(-1.5, 1.5, size=shape)
        im = rng.uniform(-1.5, 1.5, size=shape)
        return (re + 1j * im).astype(st)
    if dist == "pos":
        v = rng.uniform(0.5, 2.5, size=shape)
    elif dist == "grid":
        v = rng.integers(-16, 17, size=shape) / 4.0
    elif dist == "decimal":  # values like 0.3: steps of // and % that decimal constants hit
        v = rng.integers(-30, 31, size=shape) / 10.0
    else:
        v = rng.uniform(-2.0, 2.0, size=shape)
    v = np.array(v, dtype=st)  # an array even for rank 0
    if nan and dt in (F32, F64) and v.size:
        v[rng.random(shape) < 0.1] = np.nan
    return v


def _draw_half(rng: np.random.Generator, p: Param, shape: tuple[int, ...],
               nan: bool) -> np.ndarray:
    """A half-mode float16/bfloat16 input (dists "h..."): float64 draws rounded once to the
    half type, in its storage (bfloat16: bits); NaN in one element of ten where the case
    has NaNs."""
    dist = p.dist
    if dist == "hpos":
        v = rng.uniform(0.5, 2.5, size=shape)
    elif dist == "hgrid":
        v = rng.integers(-16, 17, size=shape) / 4.0
    elif dist == "hwide":
        v = rng.uniform(-200.0, 200.0, size=shape)
    else:
        v = rng.uniform(-2.0, 2.0, size=shape)
    v = np.array(v, dtype=np.float64)
    if nan and v.size:
        v[rng.random(shape) < 0.1] = np.nan
    return to_storage(v, p.dt.name)
