"""DSL dtypes and their NumPy counterparts: the tables every part of the generator shares.

The reference computes in a *model* type per DSL dtype (floats in float64, complex in
complex128); inputs and outputs live in the *storage* type. Integer limits bound the value
intervals; the constant pools are what generated programs write as literals.
"""

from __future__ import annotations

import math

import numpy as np

import kernelpack as kp

INF = math.inf
B, I32, I64 = kp.bool_, kp.int32, kp.int64
F16, F32, F64, C64, C128 = kp.float16, kp.float32, kp.float64, kp.complex64, kp.complex128
BF16 = kp.bfloat16
HALVES = (F16, BF16)  # computed in float32, rounded after every operation (see .halves)
# the promotion order of dtype kinds (bool < integer < float < complex)
KIND_RANK = {"b": 0, "i": 1, "f": 2, "c": 3}
NP_MODEL = {"bool": np.bool_, "int32": np.int32, "int64": np.int64, "float16": np.float64,
            "bfloat16": np.float64, "float32": np.float64, "float64": np.float64,
            "complex64": np.complex128, "complex128": np.complex128}
# bfloat16: NumPy has none; buffers hold the bit patterns (see .halves)
NP_STORAGE = {"bool": np.bool_, "int32": np.int32, "int64": np.int64, "float16": np.float16,
              "bfloat16": np.uint16, "float32": np.float32, "float64": np.float64,
              "complex64": np.complex64, "complex128": np.complex128}
IMAX = {"int32": (1 << 31) - 1, "int64": (1 << 63) - 1}
# integer magnitudes that arithmetic may produce without giving up on the interval
ISAFE = {"int32": 1 << 30, "int64": 1 << 62}
# dyadic constants: exact in float32, so a float32 step (//, %, comparison) sees the value the
# float64 reference sees
DYADIC = (0.5, 0.75, 1.5, 2.0, 0.25, 3.0, 1.25, 4.0)
DECIMAL = (0.1, 0.3, 0.7, 1.1, 2.5, 0.2)
FLOAT_SCALARS = (0.5, -1.25, 2.0, 0.75, 3.0, -0.5)


def kp_name(dt: kp.DType) -> str:
    """The attribute of ``kp`` that names ``dt``."""
    return "bool_" if dt == B else dt.name
