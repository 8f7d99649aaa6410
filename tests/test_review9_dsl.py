"""Regressions (review 9): the DSL's typing against NumPy at trace time.

- ``x.astype("float")`` was float32 (kernelpack's shared name table reads ``"float"`` as
  torch's float32); NumPy's ``np.dtype("float")`` is float64. NumPy's dtype strings ``"f8"``,
  ``"i4"``, ``"c16"``, ``"<i8"`` were TraceErrors ("not a kernelpack dtype"). The bare ``"i8"``
  and ``"u8"`` stay kernelpack's short names (``kp.i8`` is int8); with a byte order they are
  NumPy's (``"<i8"`` is int64).
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

T = kp.Tensor

NUMPY_STRINGS = ["float", "int", "complex", "single", "double", "half", "f2", "f4", "f8",
                 "c8", "c16", "i1", "i2", "i4", "u1", "u2", "u4", "b1", "?", "<i8", "=u8",
                 "|b1", "<f4", "<c8"]


def _dtypes(f: kp.fusion) -> list[str]:
    g = f.trace()
    return [g.nodes[nid].dtype.name for _, nid in g.outputs]


@pytest.mark.parametrize("code", NUMPY_STRINGS)
def test_numpy_dtype_strings_cast_as_numpy_reads_them(code):
    real = np.dtype(code).kind in "iuf"  # kp.arange makes integers and floats

    @kp.fusion
    def cast(x: T[kp.f32, "n"]):
        return x.astype(code), x.sum(dtype=code), \
            kp.arange(x.shape[0], dtype=code) if real else x.astype(code)

    want = np.dtype(code).name
    assert _dtypes(cast) == [want, np.sum(np.ones(2, np.float32), dtype=code).dtype.name, want]


def test_kernelpack_short_names_keep_their_meaning():
    @kp.fusion
    def cast(x: T[kp.f32, "n"]):
        return x.astype("i8"), x.astype("u8"), x.astype("f16"), x.astype("bf16"), \
            x.astype("float32")

    assert _dtypes(cast) == ["int8", "uint8", "float16", "bfloat16", "float32"]


def test_unknown_dtype_strings_stay_trace_errors():
    @kp.fusion
    def cast(x: T[kp.f32, "n"]):
        return x.astype(">f8")  # big-endian: no kernel reads it

    with pytest.raises(kp.TraceError, match=r"astype of float32\[n\]: not a kernelpack dtype "
                                            r"\(got '>f8'\)"):
        cast.trace()


def test_astype_takes_numpys_copy_keyword():
    """``x.astype(np.float64, copy=False)`` (common in NumPy code) was a raw TypeError
    ("unexpected keyword argument 'copy'"); a fusion never aliases, so ``copy`` is accepted
    and means nothing. A casting rule other than NumPy's default is refused by name."""

    @kp.fusion
    def cast(x: T[kp.f32, "n"]):
        return x.astype(np.float64, copy=False), x.astype(kp.i32, copy=True), \
            x.astype("f8", order="C", casting="unsafe")

    assert _dtypes(cast) == ["float64", "int32", "float64"]

    @kp.fusion
    def strict(x: T[kp.f32, "n"]):
        return x.astype(np.float64, casting="same_kind")

    with pytest.raises(kp.TraceError, match=r"astype of float32\[n\]: .*casting='same_kind'"):
        strict.trace()


def test_np_arange_of_a_size_says_to_use_kp_arange():
    """``np.arange(x.shape[1])`` failed with "the truth of a traced tensor is unknown ...; use
    kp.where", naming neither the size nor kp.arange (NumPy divides the size by the step, a
    traced value inside a fusion, and asks whether the count is positive)."""

    @kp.fusion
    def ramp(x: T[kp.f32, "a", "b"]):
        return np.arange(x.shape[1]) * x

    with pytest.raises(kp.TraceError, match=r"the truth of bool\[\] computed from sizes is "
                                            r"unknown .*use kp\.arange for np\.arange"):
        ramp.trace()

    @kp.fusion
    def branch(x: T[kp.f32, "a", "b"]):
        return x if x.sum() > 0 else -x  # a tensor's truth: the message stays kp.where's

    with pytest.raises(kp.TraceError, match=r"the truth of a traced tensor is unknown while "
                                            r"tracing; use kp\.where"):
        branch.trace()


def test_scalar_parameters_take_numpy_types_as_tensors_do():
    """``s: np.float32`` was "needs an annotation ... (got <class 'numpy.float32'>)" while
    ``kp.Tensor[np.float32, "n"]`` was accepted; the NumPy-annotated fusion is the same
    program as the kp-annotated one (same canonical bytes, so the same cache key)."""

    @kp.fusion(name="scaled")
    def with_numpy(x: T[np.float32, "n"], s: np.float32, k: np.int64, on: np.bool_,
                   d: np.dtype("float32")):
        return kp.where(on, x * s + k, x * d)

    @kp.fusion(name="scaled")
    def with_kp(x: T[kp.f32, "n"], s: kp.f32, k: kp.i64, on: kp.bool_, d: kp.f32):
        return kp.where(on, x * s + k, x * d)

    assert with_numpy.trace().params == with_kp.trace().params
    assert with_numpy.canonical_bytes() == with_kp.canonical_bytes()
    with pytest.raises(kp.TraceError, match=r"parameter 's' needs an annotation .*"
                                            r"\(got <class 'float'>\)"):
        @kp.fusion
        def weak(x: T[kp.f32, "n"], s: float):  # a Python float is weak in NumPy: refused
            return x * s
