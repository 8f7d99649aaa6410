"""Regressions (review 10): complex conjugates and NumPy's ``np.real``/``np.imag`` functions.

``z.conj()``, ``z.conjugate()``, ``np.conj(z)`` and ``np.conjugate(z)`` of a traced tensor
were TraceErrors ("traced tensors have no attribute 'conj'", "np.conjugate is not supported on
traced tensors"), and so were the function forms ``np.real(z)``/``np.imag(z)`` of the
supported ``.real``/``.imag``; a NumPy program writing ``z * np.conj(z)`` did not trace. They
are now ``kp.conj`` (the imaginary part negated, so ``0j`` becomes ``-0j`` as in NumPy; a real
or bool tensor is returned unchanged) and the ``real``/``imag`` ops.

Numerics run through the SIMT emulator (:mod:`.simt`) and compare exactly with NumPy,
signs of zeros included.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels

T = kp.Tensor


def _same(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, NumPy {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, NumPy {ref.shape}"
    assert np.array_equal(got, ref, equal_nan=True), f"{what}: {got} != {ref}"
    if ref.dtype.kind == "c":
        assert np.array_equal(np.signbit(got.imag), np.signbit(ref.imag)), f"{what}: -0j"


@pytest.mark.parametrize("cdt", [(kp.c64, np.complex64, np.float32),
                                 (kp.c128, np.complex128, np.float64)],
                         ids=["complex64", "complex128"])
def test_conjugates_match_numpy(cdt):
    kc, nc, nf = cdt
    kf = kp.f32 if nf is np.float32 else kp.f64

    def body(m, z, x, b):
        return (m.conj(z), m.conjugate(z), z.conj(), z.conjugate(), m.real(z), m.imag(z),
                m.conj(x), x.conj(), m.real(x), m.imag(x), b.conj(), z * m.conj(z))

    @kp.fusion
    def conjugates(z: T[kc, "n"], x: T[kf, "n"], b: T[kp.bool_, "n"]):
        return body(np, z, x, b)

    z = np.array([1 + 2j, 3 - 4j, 0, complex(0, -0.0), complex(np.nan, np.inf),
                  complex(-np.inf, 2.5)], nc)
    x = np.array([1.5, -2, 0, -0.0, np.nan, 3], nf)
    b = np.array([True, False, True, True, False, False])
    with np.errstate(all="ignore"):
        refs = body(np, z, x, b)
    got = Kernels(conjugates)(z, x, b)
    assert len(got) == len(refs)
    for k, (g, r) in enumerate(zip(got, refs)):
        _same(g, np.asarray(r), f"output {k}")


def test_kp_conj_names_a_non_tensor_argument():
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x + kp.conj(2.0)

    with pytest.raises(kp.TraceError, match=r"conj: expects a traced tensor \(got 2\.0\)"):
        f.trace()
