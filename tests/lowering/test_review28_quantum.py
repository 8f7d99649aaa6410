"""Review 28 (round 2): a quantum-data-pipeline engineer's encodings, written from the math.

Written from ``shared/references/qdp-workloads.md`` (Apache Mahout QDP's encoders: n qubits,
N = 2^n, bit k of basis index b is qubit k, a batch is row-major [B][N], MAX_QUBITS = 30),
README.md and issue 3 alone: amplitude (L2 normalised, zero padded to 2^n, real and complex
data), angle (product of cos/sin), basis (index -> one-hot, with the validation Mahout's
``validation.cu`` does), phase, and IQP / IQP-Z (the Walsh-Hadamard form, written without a
butterfly: the DSL has no data movement). Each is compiled, saved, loaded; the *loaded*
program's plan drives the SIMT emulator (``simt.Kernels``) and the result is compared with
NumPy in float64. Plans are checked at the published sizes (n = 20..30, B = 128..1024).

The last tests are bugs found on the way (they fail until fixed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kernelpack as kp

from .simt import Kernels, assert_close

T = kp.Tensor
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-13,  # issue 3: 1e-5 (f32)
       np.dtype(np.complex64): 1e-5, np.dtype(np.complex128): 1e-13}
REAL = [(kp.f32, np.float32, kp.c64, np.complex64), (kp.f64, np.float64, kp.c128, np.complex128)]
RIDS = ["f32", "f64"]


# ------------------------------------------------------------------------------- harness

def _program(fusion: kp.fusion, static: dict | None = None):
    """Compiled (cubin sm_80 + PTX), saved to bytes and loaded back: the program a fleet runs."""
    compiled = kp.compile(fusion, targets=["sm_80", "ptx"], static=static)
    return kp.load(kp.save([compiled]))[fusion.name]


def _runner(fusion: kp.fusion, static: dict | None = None):
    """(loaded program, emulator driven by the loaded program's planner)."""
    program = _program(fusion, static)
    kernels = Kernels(fusion, static=static)
    kernels.planner = program.planner
    return program, kernels


def _within_cuda_limits(plan) -> None:
    for la in plan.launches:
        (gx, gy, gz), (bx, by, bz) = la.grid, la.block
        assert 0 <= gx <= 2 ** 31 - 1 and 0 <= gy <= 65535 and 0 <= gz <= 65535, la
        assert 1 <= bx * by * bz <= 1024 and 0 <= la.shared_mem <= 48 * 1024, la
    for a in plan.allocations.values():
        assert a.nbytes == math.prod(a.shape) * a.dtype.itemsize, a


def _bits(n: int) -> np.ndarray:
    """(N, n): b_k = (b >> k) & 1 (little-endian, as the reference)."""
    return (np.arange(1 << n)[:, None] >> np.arange(n)[None, :]) & 1


def _amplitude_ref(v: np.ndarray, n: int) -> np.ndarray:
    v = v.astype(np.complex128)
    out = np.zeros((v.shape[0], 1 << n), np.complex128)
    with np.errstate(all="ignore"):
        out[:, : v.shape[1]] = v / np.sqrt((np.abs(v) ** 2).sum(-1, keepdims=True))
    return out


def _angle_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    bk = _bits(x.shape[1]).astype(bool)[None]
    with np.errstate(all="ignore"):
        return np.where(bk, np.sin(x)[:, None, :], np.cos(x)[:, None, :]).prod(-1)


def _phase_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    n = x.shape[1]
    with np.errstate(all="ignore"):
        return 2.0 ** (-n / 2) * np.exp(1j * (x @ _bits(n).T.astype(np.float64)))


def _iqp_ref(d: np.ndarray, n: int, zz: bool) -> np.ndarray:
    """ψ[z] = 2^-n Σ_x e^{iθ(x)} (-1)^{popcount(x & z)}; pairs (i<j) in lexicographic order."""
    xs = np.arange(1 << n)
    bits = _bits(n).astype(np.float64)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    hadamard = (-1.0) ** np.array([[bin(x & z).count("1") for x in xs] for z in xs])
    out = np.zeros((d.shape[0], 1 << n), np.complex128)
    for s in range(d.shape[0]):
        theta = bits @ d[s, :n]
        if zz:
            for p, (i, j) in enumerate(pairs):
                theta = theta + d[s, n + p] * bits[:, i] * bits[:, j]
        out[s] = hadamard @ np.exp(1j * theta) / (1 << n)
    return out


def _rand(shape, dt, seed=0, lo=-3.0, hi=3.0):
    return np.random.default_rng(seed + 31 * sum(shape)).uniform(lo, hi, shape).astype(dt)


def _check_state(got: np.ndarray, want: np.ndarray, dtype) -> None:
    """Value, dtype, shape; and every finite row is a unit vector (Σ|ψ|² = 1)."""
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert_close(got, want, TOL[np.dtype(dtype)], "state")
    if got.size:
        norms = (np.abs(got.astype(np.complex128)) ** 2).sum(-1)
        np.testing.assert_allclose(norms, 1.0, rtol=10 * TOL[np.dtype(dtype)])


# --------------------------------------------------------------------------- amplitude

# (B, L, n): one qubit, n = 0 (N = 1), L = N, L < N, L much shorter than N, empty batch
AMP_SHAPES = ((1, 1, 0), (2, 2, 1), (3, 5, 3), (2, 8, 3), (1, 3, 7), (0, 4, 2), (4, 37, 10))


@pytest.mark.parametrize("kdt,ndt,kc,nc", REAL, ids=RIDS)
def test_amplitude_encoding_real_and_complex_outputs(kdt, ndt, kc, nc):
    @kp.fusion
    def amp_c(v: T[kdt, "b", "l"], n: kp.i64):
        inv = kp.rsqrt((v * v).sum(axis=-1, keepdims=True))
        return kp.pad(v * inv, 1 << n, axis=-1).astype(kc)

    @kp.fusion
    def amp_r(v: T[kdt, "b", "l"], n: kp.i64):
        p = kp.pad(v, 1 << n)  # pad first: the norm over zeros is the same norm
        return p / kp.sqrt((p * p).sum(-1, keepdims=True))

    (pc, kc_), (pr, kr_) = _runner(amp_c), _runner(amp_r)
    for b, l, n in AMP_SHAPES:
        v = _rand((b, l), ndt)
        want = _amplitude_ref(v, n)
        _check_state(kc_(v, n)[0], want, nc)
        _check_state(kr_(v, n)[0], want.real, ndt)
        for p in (pc, pr):
            out = p.plan((b, l), n).allocations["out"]
            assert out.shape == (b, 1 << n)


@pytest.mark.parametrize("kc,nc", [(kp.c64, np.complex64), (kp.c128, np.complex128)],
                         ids=["c64", "c128"])
def test_amplitude_encoding_of_complex_data(kc, nc):
    @kp.fusion
    def amp_z(v: T[kc, "b", "l"], n: kp.i64):
        return kp.pad(v * kp.rsqrt((abs(v) ** 2).sum(-1, keepdims=True)), 1 << n)

    _, k = _runner(amp_z)
    rng = np.random.default_rng(3)
    for b, l, n in ((2, 3, 2), (3, 5, 4), (1, 1, 0)):
        v = (rng.standard_normal((b, l)) + 1j * rng.standard_normal((b, l))).astype(nc)
        _check_state(k(v, n)[0], _amplitude_ref(v, n), nc)


def test_amplitude_zero_and_nonfinite_rows():
    """The reference: Mahout's finalize stores 0 for a zero/non-finite norm and the batch
    path rejects such rows on the host. A kernel cannot raise, so ``v / ‖v‖`` of a zero row
    is NaN, as NumPy; the upstream behaviour is one ``where`` away, with a per-row flag as a
    second output for the host to check."""

    @kp.fusion
    def amp_plain(v: T[kp.f64, "b", "l"], n: kp.i64):
        return kp.pad(v * kp.rsqrt((v * v).sum(-1, keepdims=True)), 1 << n)

    @kp.fusion
    def amp_guarded(v: T[kp.f64, "b", "l"], n: kp.i64):
        s = (v * v).sum(-1)
        ok = (s > 0) & (s < math.inf)           # also False for NaN (NaN compares False)
        inv = kp.where(ok, kp.rsqrt(s), 0.0)
        return kp.pad(v * inv[:, None], 1 << n).astype(kp.c128), ok

    v = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0], [np.nan, 1.0, 0.0], [np.inf, 1.0, 0.0]])
    (plain,) = _runner(amp_plain)[1](v, 2)
    with np.errstate(all="ignore"):
        want = np.zeros((4, 4))
        want[:, :3] = v / np.sqrt((v * v).sum(-1, keepdims=True))
    assert_close(plain, want, 1e-13, "plain")
    assert np.isnan(plain[0, :3]).all() and (plain[0, 3] == 0)

    psi, ok = _runner(amp_guarded)[1](v, 2)
    assert ok.tolist() == [False, True, False, False]
    assert psi.dtype == np.complex128
    np.testing.assert_array_equal(psi[0], 0)
    np.testing.assert_allclose(psi[1], [1 / 3, 2 / 3, 2 / 3, 0], rtol=1e-15)


def test_amplitude_plans_and_shape_errors():
    @kp.fusion
    def amplitude(v: T[kp.f32, "b", "l"], n: kp.i64):
        return kp.pad(v * kp.rsqrt((v * v).sum(-1, keepdims=True)), 1 << n).astype(kp.c64)

    p = _program(amplitude)
    # published sizes: B·N·8 B (complex64), grids within CUDA's limits
    for b in (1, 128, 1024):
        for n in (20, 24, 30):
            for l in (1, 1000, 1 << n):
                plan = p.plan((b, l), n)
                _within_cuda_limits(plan)
                out = plan.allocations["out"]
                assert (out.shape, out.dtype, out.nbytes) == ((b, 1 << n), kp.c64,
                                                              b * (1 << n) * 8)
    assert p.plan((0, 5), 30).allocations["out"].nbytes == 0
    # an input longer than 2^n: named, with the sizes
    with pytest.raises(kp.ConstraintError, match=r"pad.*1 << n.*l=5, n=2"):
        p.plan((2, 5), 2)
    # states that cannot exist: bytes past int64, shifts past 63, negative qubit counts
    for n in (62, 63, 64, -1):
        with pytest.raises(kp.ConstraintError):
            p.plan((1, 1), n)
    with pytest.raises(kp.RankError, match=r"v has rank 1 .*expected rank 2"):
        p.plan((5,), 3)
    with pytest.raises(TypeError, match=r"missing input.*'n'"):
        p.plan((2, 5))
    with pytest.raises(TypeError, match=r"scalar n must be an integer"):
        p.plan((2, 5), 3.0)


# ------------------------------------------------------------------------------- angle

ANGLE_N = ((1, 0), (2, 1), (3, 2), (2, 5), (0, 3), (2, 9))


@pytest.mark.parametrize("kdt,ndt,kc,nc", REAL, ids=RIDS)
def test_angle_encoding(kdt, ndt, kc, nc):
    @kp.fusion
    def angle(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1
        return kp.where(bk == 1, kp.sin(x)[:, None, :], kp.cos(x)[:, None, :]).prod(-1)

    @kp.fusion
    def angle_c(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = ((kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1).astype(kdt)
        amp = (bk * kp.sin(x)[:, None, :] + (1 - bk) * kp.cos(x)[:, None, :]).prod(axis=2)
        return kp.complex(amp, 0.0)

    (pa, ka), (_, kc_) = _runner(angle), _runner(angle_c)
    for b, n in ANGLE_N:
        x = _rand((b, n), ndt, lo=0.0, hi=2 * math.pi)
        want = _angle_ref(x)
        _check_state(ka(x)[0], want, ndt)
        _check_state(kc_(x)[0], want.astype(np.complex128), nc)
    # non-finite angles give NaN amplitudes where NumPy does
    x = np.array([[np.nan, 0.5], [np.inf, 0.5], [0.25, 0.5]], ndt)
    assert_close(ka(x)[0], _angle_ref(x), TOL[np.dtype(ndt)], "non-finite angles")
    for b in (128, 1024):
        for n in (20, 30):
            plan = pa.plan((b, n))
            _within_cuda_limits(plan)
            assert plan.allocations["out"].nbytes == b * (1 << n) * np.dtype(ndt).itemsize


# ------------------------------------------------------------------------------- phase

@pytest.mark.parametrize("kdt,ndt,kc,nc", REAL, ids=RIDS)
def test_phase_encoding(kdt, ndt, kc, nc):
    @kp.fusion
    def phase(x: T[kdt, "b", "n"]):
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1
        phi = (x[:, None, :] * bk).sum(-1)
        return kp.exp(1j * phi) * 2.0 ** (-0.5 * n)

    @kp.fusion
    def phase_product(x: T[kdt, "b", "n"]):
        # the tensor-product form: ⊗_k (|0> + e^{i x_k}|1>)/√2
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1
        one = kp.complex(kp.cos(x) * 0.0 + 1.0, x * 0.0)
        return (kp.where(bk == 1, kp.exp(1j * x)[:, None, :], one[:, None, :])
                * 0.5 ** 0.5).prod(-1)

    (pp, k1), (_, k2) = _runner(phase), _runner(phase_product)
    for b, n in ANGLE_N:
        x = _rand((b, n), ndt, lo=0.0, hi=2 * math.pi)
        want = _phase_ref(x)
        _check_state(k1(x)[0], want, nc)
        _check_state(k2(x)[0], want, nc)
    # benchmark_phase.py's workload (n=14, B=128) and the published range
    for b, n in ((128, 14), (128, 20), (1024, 30), (1, 30)):
        plan = pp.plan((b, n))
        _within_cuda_limits(plan)
        out = plan.allocations["out"]
        assert (out.dtype, out.nbytes) == (kc, b * (1 << n) * np.dtype(nc).itemsize)


# ------------------------------------------------------------------------------- basis

def test_basis_encoding_u64_indices_and_validation():
    """Mahout stores indices as size_t and validates float indices (non-finite, negative,
    non-integer, out of range) into error bits: here a u64 one-hot and a float one-hot with a
    per-sample validity flag."""

    @kp.fusion
    def basis_u64(j: T[kp.u64, "b"], n: kp.i64):
        return (kp.arange(1 << n, dtype=kp.u64)[None, :] == j[:, None]).astype(kp.c64)

    @kp.fusion
    def basis_f(jf: T[kp.f64, "b"], n: kp.i64):
        big_n = 1 << n
        ok = (jf == kp.floor(jf)) & (jf >= 0) & (jf < big_n)
        j = kp.where(ok, jf, -1.0).astype(kp.i64)
        return (kp.arange(big_n)[None, :] == j[:, None]).astype(kp.c128), ok

    pu, ku = _runner(basis_u64)
    for j, n in (([0], 0), ([1, 0], 1), ([0, 3, 2, 7], 3), ([], 4), ([1023, 5], 10)):
        j = np.array(j, np.uint64)
        want = np.zeros((j.size, 1 << n), np.complex64)
        want[np.arange(j.size), j.astype(np.int64)] = 1
        (got,) = ku(j, n)
        assert got.dtype == np.complex64 and np.array_equal(got, want)
    for b, n in ((128, 20), (1024, 30)):
        plan = pu.plan((b,), n)
        _within_cuda_limits(plan)
        assert plan.allocations["out"].nbytes == b * (1 << n) * 8

    jf = np.array([0.0, 3.0, 2.5, -1.0, np.nan, np.inf, 4.0, 1e30])
    psi, ok = _runner(basis_f)[1](jf, 2)
    assert ok.tolist() == [True, True, False, False, False, False, False, False]
    want = np.zeros((8, 4), np.complex128)
    want[0, 0] = want[1, 3] = 1
    assert psi.dtype == np.complex128 and np.array_equal(psi, want)


# --------------------------------------------------------------------------------- IQP

def test_iqp_z_encoding():
    """iqp-z: θ(x) = Σ d_i x_i, ψ = 2^-n · WHT(e^{iθ}); the Hadamard sign as a product over
    bits (there is no popcount, and no butterfly without data movement: O(4^n))."""

    @kp.fusion
    def iqp_z(d: T[kp.f64, "b", "n"]):
        n = d.shape[1]
        xb = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1                 # (X, n)
        f = kp.exp(1j * (d[:, None, :] * xb).sum(-1))                          # (b, X)
        sign = (1 - 2 * (xb[None, :, :] & xb[:, None, :])).prod(-1)             # (Z, X)
        return (f[:, None, :] * sign).sum(-1) * 2.0 ** (-1.0 * n)

    p, k = _runner(iqp_z)
    for b, n in ((2, 0), (2, 1), (3, 3), (2, 5), (0, 2)):
        d = _rand((b, n), np.float64)
        _check_state(k(d)[0], _iqp_ref(d, n, zz=False), np.complex128)
    plan = p.plan((128, 10))
    _within_cuda_limits(plan)


def test_iqp_encoding_with_zz_pairs_from_one_flat_vector():
    """Full IQP: d of length n + n(n-1)/2 per sample, the pair (i, j) read from position
    n + p(i, j) in lexicographic order. Without slicing or gather, each weight is picked
    with a one-hot ``where`` + ``sum`` over the data axis (README's suggested workaround)."""

    @kp.fusion
    def iqp(d: T[kp.f64, "b", "m"], n: kp.i64):
        xb = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1                 # (X, n)
        i, j = kp.arange(n)[:, None], kp.arange(n)[None, :]
        m = kp.arange(d.shape[1])
        pidx = n + i * n - (i * (i + 1)) // 2 + (j - i - 1)                     # (n, n)
        onehot = (m == pidx[:, :, None]) & (i < j)[:, :, None]                  # (n, n, m)
        w = kp.where(onehot[None], d[:, None, None, :], 0.0).sum(-1)           # (b, n, n)
        lin = kp.where(kp.arange(n)[:, None] == m, d[:, None, :], 0.0).sum(-1)  # (b, n)
        theta = (lin[:, None, :] * xb).sum(-1) + (
            w[:, None] * (xb[:, :, None] * xb[:, None, :])).sum(axis=(2, 3))
        sign = (1 - 2 * (xb[None, :, :] & xb[:, None, :])).prod(-1)
        return (kp.exp(1j * theta)[:, None, :] * sign).sum(-1) * kp.exp2(-1.0 * n)

    p, k = _runner(iqp)
    for b, n in ((2, 0), (2, 1), (1, 2), (3, 3), (2, 4)):
        d = _rand((b, n + n * (n - 1) // 2), np.float64, seed=n)
        _check_state(k(d, n)[0], _iqp_ref(d, n, zz=True), np.complex128)
    _within_cuda_limits(p.plan((128, 55), 10))


# ------------------------------------------------------------------------- static sizes

def test_static_qubit_count_and_batch():
    """``static=`` on the qubit dim and on the batch: same values as the symbolic program,
    other sizes refused by name."""

    def angle_fn(x: T[kp.f32, "b", "n"]):
        n = x.shape[1]
        bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)) & 1
        return kp.where(bk == 1, kp.sin(x)[:, None, :], kp.cos(x)[:, None, :]).prod(-1)

    for st, b, n in (({"n": 4}, 3, 4), ({"n": 0}, 2, 0), ({"n": 1}, 2, 1), ({"b": 2}, 2, 5),
                     ({"b": 0}, 0, 3), ({"b": 3, "n": 6}, 3, 6)):
        f = kp.fusion(angle_fn, name="angle_static")
        p, k = _runner(f, static=st)
        x = _rand((b, n), np.float32, lo=0.0, hi=6.0)
        _check_state(k(x)[0], _angle_ref(x), np.float32)
        assert p.plan((b, n)).allocations["out"].shape == (b, 1 << n)
        dim = next(iter(st))
        bad = (b + 1, n) if dim == "b" else (b, n + 1)
        with pytest.raises(kp.ConstraintError, match=r"x\.shape\[\d\] is \d+, expected \d+"):
            p.plan(bad)
    f = kp.fusion(angle_fn, name="angle_static")
    plan = _program(f, static={"n": 30}).plan((1024, 30))
    _within_cuda_limits(plan)
    assert plan.allocations["out"].nbytes == 1024 * (1 << 30) * 4


def test_trace_errors_name_the_op_and_shapes():
    @kp.fusion
    def transposed_bits(x: T[kp.f32, "b", "n"]):
        n = x.shape[1]
        bits = (kp.arange(1 << n)[None, :] >> kp.arange(n)[:, None]) & 1   # (n, N): wrong
        return (x[:, None, :] * bits[None]).sum(-1)

    with pytest.raises(kp.TraceError, match=r"mul: shapes \(b, 1, n\) and \(1, n, 1 << n\)"):
        kp.compile(transposed_bits, targets=["sm_80"])

    @kp.fusion
    def basis_no_axis(j: T[kp.i64, "b"], n: kp.i64):
        return (j == kp.arange(1 << n)).astype(kp.c64)

    with pytest.raises(kp.TraceError, match=r"eq: shapes \(b,\) and \(1 << n,\)"):
        kp.compile(basis_no_axis, targets=["sm_80"])

    @kp.fusion
    def mixed(x: T[kp.f32, "b", "n"]):
        return kp.complex(x, x.astype(kp.f64))

    with pytest.raises(kp.TraceError, match=r"complex: dtype mismatch float32.*float64"):
        kp.compile(mixed, targets=["sm_80"])


# ------------------------------------------------------------------------------- bugs

def test_slicing_by_a_scalar_bound_says_slicing_is_unsupported():
    """An IQP user splits the flat data vector into its n linear and n(n-1)/2 pair weights:
    ``d[:, :n]``. ``d[:, 0:n]`` and ``d[:, :2]`` get the clear message (no data movement,
    pass each piece as an input, or pick with kp.where); ``d[:, :n]`` and ``d[:, n:]``, with
    n an int scalar parameter, get "cannot use None (NoneType) in a fusion", which names
    nothing the user wrote."""

    @kp.fusion
    def head(d: T[kp.f64, "b", "m"], n: kp.i64):
        return d[:, :n]

    @kp.fusion
    def tail(d: T[kp.f64, "b", "m"], n: kp.i64):
        return d[:, n:]

    for f in (head, tail):
        with pytest.raises(kp.TraceError) as info:
            kp.compile(f, targets=["sm_80"])
        msg = str(info.value)
        assert "NoneType" not in msg, msg
        assert "only ':', '...' and None" in msg and "slicing" in msg, msg


@pytest.mark.parametrize("n", [63, 64, 100])
def test_static_qubit_count_whose_state_cannot_exist_is_refused_at_compile(n):
    """``static={"n": 64}`` makes the output shape the constant ``1 << 64``: every plan of
    the artifact then fails ("shift count 64 outside 0..63"), yet ``kp.compile`` accepts it
    and ``kernelpack build`` ships it. Other constant impossibilities are refused where they
    are declared: ``static={"n": -1}`` (ValueError), a static pad below the length
    (TraceError), and README's rule for constant summary fields ("checked where it is
    declared, since every call would otherwise be refused"). The compile should refuse a
    constant size that cannot be evaluated (MAX_QUBITS is 30 upstream)."""

    @kp.fusion
    def basis(j: T[kp.i64, "b"], q: T[kp.f32, "n"]):
        return (kp.arange(1 << q.shape[0]) == j[:, None]).astype(kp.c64)

    with pytest.raises((kp.KernelPackError, ValueError)):
        kp.compile(basis, targets=["sm_80"], static={"n": n})
