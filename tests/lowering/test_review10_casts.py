"""Regressions (review 10): float to integer casts take NumPy's values.

``x.astype(kp.u8)`` of a float was a bare LLVM ``fptoui`` (``fptosi`` for signed types):
poison wherever the truncated value does not fit the destination, which a negative float and
any unsigned type always hit. NumPy defines those casts without a warning by wrapping
(``-2.7`` is 254 as uint8 and 4294967294 as uint32, ``300.5`` is 44 as uint8, ``70000.0``
4464 as int16); the host emulator gave 4294967295 for ``-2.7`` as uint32, and the GPU's
``cvt.rzi`` saturates (0 for any negative value, NaN to 0 where NumPy gives int32's minimum).
The cast now truncates through a 32-bit (int8..int32, uint8, uint16) or 64-bit (uint32,
int64) conversion that gives its minimum where the value does not fit, and wraps, which is
NumPy's own (scalar loop) result for every value; uint64 takes 2**63 off large values first.

Numerics run through the SIMT emulator (:mod:`.simt`). NumPy's references are taken one
element at a time: for NaN, infinities and values past int64, NumPy's vectorized loop and its
scalar one disagree (``np.full(8, -3e9).astype(np.uint32)`` is 2**31, ``np.full(3, -3e9)``
1294967296), and the scalar loop is the one that follows C's conversions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline

from .simt import Kernels

T = kp.Tensor

_VALUES = [np.nan, np.inf, -np.inf, 3e9, -3e9, 1e19, -1e19, 2e19, 1e30, 70000.0, -2.7, 2.0 ** 63,
           1.8e19, -100.5, 300.5, 200.0, -128.9, 127.9, 65535.9, -0.0, 4e9, 60000.0, -60000.0,
           2.0 ** 31, -(2.0 ** 31), 2.0 ** 31 - 0.5, 0.999, -0.999]
_TARGETS = ((kp.i8, np.int8), (kp.u8, np.uint8), (kp.i16, np.int16), (kp.u16, np.uint16),
            (kp.i32, np.int32), (kp.u32, np.uint32), (kp.i64, np.int64), (kp.u64, np.uint64))


def _numpy_one_by_one(values: np.ndarray, to: type) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)  # complex64: the real part
        return np.array([values[i:i + 1].astype(to)[0] for i in range(values.size)], to)


@pytest.mark.parametrize("src", [(kp.f64, np.float64), (kp.f32, np.float32),
                                 (kp.f16, np.float16), (kp.c64, np.complex64)],
                         ids=lambda s: s[1].__name__)
def test_float_to_integer_casts_match_numpy(src):
    kdt, ndt = src

    @kp.fusion
    def casts(x: T[kdt, "n"]):
        return tuple(x.astype(k) for k, _ in _TARGETS)

    with np.errstate(all="ignore"):
        x = np.array(_VALUES, ndt)
    for got, (_, to) in zip(Kernels(casts)(x), _TARGETS):
        ref = _numpy_one_by_one(x, to)
        assert got.dtype == ref.dtype
        wrong = [(v, int(g), int(r)) for v, g, r in zip(_VALUES, got, ref) if g != r]
        assert not wrong, f"{ndt.__name__} -> {to.__name__}: (value, kernel, NumPy) {wrong}"


def test_negative_floats_wrap_into_unsigned_types_like_numpy():
    """The common case, spelled out: NumPy gives these without any warning."""

    @kp.fusion
    def casts(x: T[kp.f32, "n"]):
        return x.astype(kp.u8), x.astype(kp.u16), x.astype(kp.u32), x.astype(kp.u64)

    x = np.array([-2.7, -1.0, -255.5, 300.5, 3.9], np.float32)
    got = Kernels(casts)(x)
    assert got[0].tolist() == [254, 255, 1, 44, 3]
    assert got[1].tolist() == [65534, 65535, 65281, 300, 3]
    assert got[2].tolist() == [2 ** 32 - 2, 2 ** 32 - 1, 2 ** 32 - 255, 300, 3]
    assert got[3].tolist() == [2 ** 64 - 2, 2 ** 64 - 1, 2 ** 64 - 255, 300, 3]


def test_casts_leave_no_bare_unsigned_conversion_and_compile():
    """The device code has no ``fptoui`` (NVPTX's saturating ``cvt.rzi.u*``) left, and
    nvJitLink accepts the guarded conversions."""

    @kp.fusion
    def casts(x: T[kp.f64, "n"]):
        return x.astype(kp.u8), x.astype(kp.u32), x.astype(kp.u64), x.astype(kp.i32)

    ir_text = pipeline.run(pipeline.new_build(casts, ["sm_80"], None, {}), stop="llvm_ir").ir
    assert " fptoui " not in ir_text and " fptosi " in ir_text
    compiled = kp.compile(casts, targets=["sm_80", "ptx"])
    assert [img.kind for img in compiled.modules[0].images] == ["cubin", "ptx"]
