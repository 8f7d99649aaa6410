"""Regression (review 9): a fusion written like NumPy code compares ``x.dtype`` with NumPy's
dtypes; kernelpack's DType compared unequal to every one of them, so ``if x.dtype ==
np.float32:`` silently took the other branch."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import kernelpack as kp


@pytest.mark.parametrize("dtype, numpy_type", [
    (kp.f32, np.float32), (kp.f64, np.float64), (kp.f16, np.float16), (kp.i64, np.int64),
    (kp.u8, np.uint8), (kp.bool_, np.bool_), (kp.c64, np.complex64), (kp.c128, np.complex128),
])
def test_equal_to_numpy_spelling(dtype: kp.DType, numpy_type: type) -> None:
    assert dtype == numpy_type and numpy_type == dtype
    assert dtype == np.dtype(numpy_type) and np.dtype(numpy_type) == dtype
    assert not (dtype != numpy_type)


def test_unequal_where_numpy_differs() -> None:
    assert kp.f32 != np.float64 and kp.f32 != np.dtype("float64")
    assert kp.bf16 != np.float16
    assert kp.f32 != np.dtype(">f4")  # big-endian: not kernelpack's float32 layout
    assert kp.f32 != "float32"  # strings are not compared ("float" is ambiguous)
    assert kp.f32 != 32 and kp.f32 != object()


def test_hash_and_pickle_unchanged() -> None:
    copy = pickle.loads(pickle.dumps(kp.f32))
    assert copy == kp.f32 and hash(copy) == hash(kp.f32)
    assert {kp.f32: "a"}[copy] == "a"
    assert len({kp.f32, kp.f64, copy}) == 2


def test_fusion_branches_on_numpy_dtype() -> None:
    @kp.fusion
    def scale(x: kp.Tensor[kp.f32, "n"]):
        if x.dtype == np.float32:
            return x * 2.0
        return x * 3.0

    @kp.fusion
    def scale_ref(x: kp.Tensor[kp.f32, "n"]):
        return x * 2.0

    assert scale.canonical_bytes() == scale_ref.canonical_bytes().replace(b"scale_ref", b"scale")


def test_calling_a_dtype_says_what_to_write_instead() -> None:
    """``kp.f32(1e-5)`` reads like ``np.float32(1e-5)`` (review 11): the error names the
    number and astype, not "'DType' object is not callable" (NumPy scalars are weak in a
    fusion since review 28, so it no longer offers np.float32 as a typed constant)."""
    with pytest.raises(TypeError, match=r"kp\.float32 is a dtype.*1e-05 takes the dtype.*astype"):
        kp.f32(1e-5)
