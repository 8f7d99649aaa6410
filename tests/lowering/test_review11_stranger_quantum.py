"""Review 11 (A): the quantum state encodings written from their formulas, checked end to end.

Written from ``shared/references/qdp-workloads.md`` and issue 3 (n qubits, N = 2^n, bit k of
index b is qubit k: ``b_k = (b >> k) & 1``), not from the repository's workloads: each encoding
in two natural forms, compiled for sm_80 + sm_90 + PTX, saved, loaded, planned from the artifact
and run on the SIMT emulator against NumPy in float64 (see
:mod:`.test_review11_stranger_workloads` for the harness). Sizes include n = 0 (N = 1), an
empty batch and L < N, L = N for the amplitude pad.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .test_review11_stranger_workloads import FLOATS, IDS, check, planned_at_scale, rand

T = kp.Tensor


def _bits(n: int) -> np.ndarray:
    """(N, n): bit k of each index b."""
    b = np.arange(1 << n)
    return (b[:, None] >> np.arange(n)[None, :]) & 1


def _phase(x):
    n = x.shape[1]
    return 2.0 ** (-n / 2) * np.exp(1j * (x @ _bits(n).T.astype(np.float64)))


def _angle(x):
    bk = _bits(x.shape[1]).astype(bool)[None]
    return np.where(bk, np.sin(x)[:, None, :], np.cos(x)[:, None, :]).prod(axis=-1)


def _basis(j, n):
    out = np.zeros((j.shape[0], 1 << n), np.complex128)
    out[np.arange(j.shape[0]), j] = 1
    return out


def _amplitude(v, n):
    out = np.zeros((v.shape[0], 1 << n), np.complex128)
    out[:, : v.shape[1]] = v / np.sqrt((v * v).sum(-1, keepdims=True))
    return out


# (B, n): one qubit, n = 0 (N = 1, an empty product and sum), an empty batch, odd sizes
BN = ((1, 1), (2, 3), (3, 5), (1, 0), (0, 3), (1, 6))


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_phase_encoding(kdt, ndt):
    @kp.fusion
    def phase_exp(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)[None, :]) & 1  # (N, n) int64
        phi = (x[:, None, :] * bk[None]).sum(axis=2)  # int with float: the float's dtype
        return kp.exp(1j * phi) * 2.0 ** (-0.5 * n)

    @kp.fusion
    def phase_sincos(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        big_n = 1 << n
        bk = ((kp.arange(big_n)[:, None] >> kp.arange(n)) & 1).astype(x.dtype)
        phi = (x[:, None, :] * bk).sum(-1)
        s = 1 / kp.sqrt(big_n)
        return kp.complex(kp.cos(phi) * s, kp.sin(phi) * s)

    cases = [(rand(s, ndt) * 2,) for s in BN]
    for f in (phase_exp, phase_sincos):
        program = check(f, cases, _phase)
        plan = program.plan((128, 14))
        out = plan.allocations["out"]
        assert out.shape == (128, 1 << 14), out
        assert out.dtype == (kp.c64 if kdt == kp.f32 else kp.c128)
        planned_at_scale(program, *[((b, n),) for b, n in ((1, 30), (128, 20), (10 ** 6, 4))])


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_angle_encoding(kdt, ndt):
    @kp.fusion
    def angle_where(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1
        return kp.where(bk == 1, kp.sin(x)[:, None, :], kp.cos(x)[:, None, :]).prod(axis=-1)

    @kp.fusion
    def angle_blend(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = ((kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1).astype(kdt)
        s, c = kp.sin(x)[:, None, :], kp.cos(x)[:, None, :]
        return kp.prod(bk * s + (1 - bk) * c, axis=2)

    cases = [(rand(s, ndt) * 2,) for s in BN]
    for f in (angle_where, angle_blend):
        program = check(f, cases, _angle)
        assert program.plan((3, 20)).allocations["out"].shape == (3, 1 << 20)


@pytest.mark.parametrize("cdt,ncdt", [(kp.c64, np.complex64), (kp.c128, np.complex128)],
                         ids=["c64", "c128"])
def test_basis_encoding(cdt, ncdt):
    @kp.fusion
    def basis_i64(j: T[kp.i64, "b"], n: kp.i64):
        return (kp.arange(1 << n)[None, :] == j[:, None]).astype(cdt)

    @kp.fusion
    def basis_i32(j: T[kp.i32, "b"], n: kp.i32):
        hit = kp.arange(1 << n, dtype=kp.i32) == j[:, None]
        return kp.where(hit, 1.0, 0.0).astype(cdt)

    cases = [(np.array(j, np.int64), n) for j, n in
             (([0], 0), ([1, 0, 3], 2), ([5, 7], 3), ([], 3), ([6, 0, 31, 17], 5))]
    check(basis_i64, cases, _basis, dtype=np.dtype(ncdt))
    p32 = check(basis_i32, [(j.astype(np.int32), n) for j, n in cases], _basis,
                dtype=np.dtype(ncdt))
    plan = p32.plan((128,), 14)
    assert plan.allocations["out"].shape == (128, 1 << 14)
    assert plan.allocations["out"].nbytes == 128 * (1 << 14) * np.dtype(ncdt).itemsize


# (B, L, n): L < N, L = N, L = 1 with n = 0, an empty batch, L much shorter than N
BLN = ((1, 1, 0), (2, 3, 2), (3, 5, 3), (2, 4, 2), (0, 3, 3), (1, 5, 6))


@pytest.mark.parametrize("kdt,ndt", FLOATS, ids=IDS)
def test_amplitude_encoding(kdt, ndt):
    ctype = kp.c64 if kdt == kp.f32 else kp.c128

    @kp.fusion
    def amp_pad(v: T[kdt, "b", "l"], n: kp.i64):
        norm = kp.sqrt((v * v).sum(axis=-1, keepdims=True))
        return kp.pad(v / norm, 1 << n, axis=-1).astype(ctype)

    @kp.fusion
    def amp_masked(v: T[kdt, "b", "l"], n: kp.i64):
        big_n = 1 << n
        inv = 1 / kp.sqrt(kp.sum(v ** 2, axis=1))
        padded = kp.pad(v, big_n, axis=1) * inv[:, None]
        return kp.complex(kp.where(kp.arange(big_n) < v.shape[1], padded, 0), 0)

    cases = [(rand((b, l), ndt), n) for b, l, n in BLN]
    for f in (amp_pad, amp_masked):
        program = check(f, cases, _amplitude)
        plan = program.plan((4, 1000), 10)
        assert plan.allocations["out"].shape == (4, 1024)
        assert plan.allocations["out"].dtype == ctype
        planned_at_scale(program, *[((b, l), n) for b, l, n in ((1, 1 << 30, 30), (128, 1000, 20),
                                                                (10 ** 6, 3, 2), (2, 1, 30))])


def test_two_to_the_n_is_a_size_like_one_shifted_by_n():
    """The reference writes N = 2^n; a stranger writes ``2 ** n`` (``n ** 2`` and ``2 * n``
    already are sizes). It is ``1 << n`` exactly, which the summary's expressions hold."""

    @kp.fusion
    def basis_pow(j: T[kp.i64, "b"], n: kp.i64):
        return (kp.arange(2 ** n)[None, :] == j[:, None]).astype(kp.c64)

    @kp.fusion
    def amp_pow(v: T[kp.f32, "b", "l"], q: T[kp.f32, "n"]):
        return kp.pad(v * kp.rsqrt((v * v).sum(-1, keepdims=True)), 2 ** q.shape[0])

    cases = [(np.array(j, np.int64), n) for j, n in (([1, 0, 3], 2), ([0], 0))]
    check(basis_pow, cases, _basis, dtype=np.dtype(np.complex64))
    program = check(amp_pow, [(rand((2, 3)), rand((2,)))], lambda v, q: _amplitude(v, 2).real)
    assert program.plan((4, 1000), (10,)).allocations["out"].shape == (4, 1024)


def test_powers_of_two_as_sizes_plan_like_shifts():
    """``4 ** n`` is ``1 << 2n``, ``1 ** n`` is 1; any other base names the operands and the
    form that works (review 11: ``2 ** n`` was refused)."""

    @kp.fusion
    def four_pow(j: T[kp.i64, "b"], n: kp.i64):
        return kp.arange(4 ** n)[None, :] == j[:, None]

    program = kp.load(kp.save([kp.compile(four_pow, targets=["sm_80"])]))["four_pow"]
    assert program.plan((3,), 5).allocations["out"].shape == (3, 1024)
    with pytest.raises(kp.KernelPackError):
        program.plan((3,), -1)  # a negative exponent fails like 1 << -1

    @kp.fusion
    def three_pow(j: T[kp.i64, "b"], n: kp.i64):
        return kp.arange(3 ** n)[None, :] == j[:, None]

    with pytest.raises(kp.TraceError, match=r"\*\* .*power-of-two base.*1 << n"):
        kp.compile(three_pow, targets=["sm_80"])
