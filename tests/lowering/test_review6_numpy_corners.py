"""Regressions (review 6): NumPy's results in corners the generated code got wrong or the
tracer refused.

- ``kp.exp`` of a complex value with an infinite or NaN part: the product
  ``e^re · (cos im + i sin im)`` made NaNs of ``inf · 0`` (``exp(inf+0j)`` was ``inf+nanj``,
  ``exp(-inf+infj)`` ``nan+nanj``); NumPy (C99 Annex G) gives ``inf+0j`` and ``0j``.
- ``bool + bool`` and ``bool * bool`` were TraceErrors; NumPy gives the logical or / and (a
  bool), and ``bool // bool``, ``bool % bool``, ``bool ** bool`` compute in int8. ``bool ** 3``
  is int64 like ``bool + 3`` (``** 2`` is NumPy's int8 ``square``), not a logical and.

Numerics run through the SIMT emulator (:mod:`.simt`) and compare bit for bit with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels

T = kp.Tensor
INF, NAN = np.inf, np.nan


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal dtype, shape and values; NaNs in the same places (real and imaginary parts)."""
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    for part in ((got.real, ref.real), (got.imag, ref.imag)) if got.dtype.kind == "c" else \
            ((got, ref),):
        assert np.array_equal(part[0], part[1], equal_nan=got.dtype.kind in "fc"), \
            f"{what}: got {got}, NumPy {ref}"


@pytest.mark.parametrize("cdt", [kp.complex64, kp.complex128], ids=str)
def test_complex_exp_of_infinite_and_nan_parts_follows_numpy(cdt):
    z = np.array([complex(INF, 0), complex(INF, -0.0), complex(NAN, 0), complex(INF, INF),
                  complex(INF, NAN), complex(-INF, INF), complex(-INF, NAN), complex(-INF, 1),
                  complex(-INF, 0), complex(INF, 1), complex(1, INF), complex(NAN, 1),
                  complex(0.5, -2), complex(-3, 0), 0j], np.dtype(cdt.name))

    @kp.fusion
    def cexp(z: T[cdt, "n"]):
        return kp.exp(z)

    got = Kernels(cexp)(z)[0]
    with np.errstate(all="ignore"):
        ref = np.exp(z)
    finite = np.isfinite(ref)
    _same(got[~finite], ref[~finite], "exp of non-finite parts")
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6)
    # the sign of a zero imaginary part survives an infinite real part
    assert np.signbit(got[1].imag) and not np.signbit(got[0].imag)


def test_bool_sums_and_products_are_logical_like_numpy():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])

    @kp.fusion
    def logic(a: T[kp.bool_, "n"], b: T[kp.bool_, "n"]):
        return a + b, a * b, a + True, False * a, (a + b).sum(), (a * b).max()

    got = Kernels(logic)(a, b)
    refs = [a + b, a * b, a + True, False * a, (a + b).sum(), (a * b).max()]
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, np.asarray(r), f"output {k}")


def test_bool_floordiv_mod_and_powers_take_numpys_integer_types():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])

    @kp.fusion
    def arith(a: T[kp.bool_, "n"], b: T[kp.bool_, "n"]):
        return a // b, a % b, a ** b, a ** 0, a ** 2, a ** 3, a ** 2.5

    got = Kernels(arith)(a, b)
    with np.errstate(all="ignore"):
        refs = [a // b, a % b, a ** b, a ** 0, a ** 2, a ** 3, a ** 2.5]
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, np.asarray(r), f"output {k}")


@pytest.mark.parametrize("body", [lambda a: a - a, lambda a: a - True, lambda a: True - a],
                         ids=["bool-bool", "bool-True", "True-bool"])
def test_bool_subtraction_stays_refused_as_in_numpy(body):
    @kp.fusion
    def sub(a: T[kp.bool_, "n"]):
        return body(a)

    with pytest.raises(kp.TraceError, match=r"sub: arithmetic on bool tensors .*use \^"):
        sub.trace()


def test_arange_of_a_negative_symbolic_count_is_empty_like_numpy():
    """``kp.arange(x.shape[0] - 2)`` for a short ``x`` was a ConstraintError ("output ...
    is negative") at plan time; NumPy's ``arange`` of a negative count is empty. A count
    known not to be negative (a dim, ``1 << n``) keeps its shape, so it still broadcasts."""

    @kp.fusion
    def ranges(x: T[kp.f32, "n"], k: kp.i64):
        n = x.shape[0]
        return (kp.arange(n - 2), kp.arange(0, n - 2), kp.arange(k), kp.arange(n) * x,
                kp.arange(1 << n))

    g = ranges.trace()
    shapes = [g.nodes[nid].shape for _, nid in g.outputs]
    assert shapes[3] == (kp.sym("n"),) and shapes[4] == (kp.shl(1, "n"),)
    kernels = Kernels(ranges)
    for n, k in [(0, -3), (1, 0), (2, 4), (4, 1)]:
        x = np.ones(n, np.float32)
        refs = [np.arange(n - 2), np.arange(0, n - 2), np.arange(k),
                np.arange(n) * x, np.arange(1 << n)]
        for j, (got, ref) in enumerate(zip(kernels(x, k), refs)):
            assert got.shape == ref.shape and np.array_equal(got, ref), (n, k, j, got)


def test_numpy_ufuncs_on_bool_tensors_take_numpys_types():
    """``np.square(mask)`` is int8 in NumPy (it was a TraceError, then would have been the
    logical and of repeated bool multiplication); ``np.multiply``/``np.add`` of masks are the
    logical and/or, ``np.power(mask, 2)`` int64 (only the operator ``mask ** 2`` is int8)."""
    a = np.array([True, False, True])
    f = np.array([1.5, -3.0, 0.25], np.float32)

    @kp.fusion
    def ufuncs(a: T[kp.bool_, "n"], f: T[kp.f32, "n"]):
        return (np.square(a), np.square(f), np.multiply(a, a), np.add(a, True),
                np.power(a, 3), np.power(a, 2), a ** 2)

    got = Kernels(ufuncs)(a, f)
    refs = [np.square(a), np.square(f), np.multiply(a, a), np.add(a, True), np.power(a, 3),
            np.power(a, 2), a ** 2]
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, np.asarray(r), f"output {k}")
