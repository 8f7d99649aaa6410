"""Seeded random fusions (:mod:`.fusion_gen`) against NumPy, through the SIMT emulator.

Programs nobody wrote by hand: pointwise chains of mixed dtypes, broadcasting, casts,
where/comparisons, integer bit ops and floor division, reductions over any axes and their
consumers, several outputs, scalars, arange/iota — each run at a few sizes (0, 1, primes, literal
dims) and compared with a float64 NumPy reference (1e-5 normwise where float32 rounding is
involved, 1e-12 otherwise, integers exactly). A failure prints the seed, the generated source
and the shapes; ``python -m tests.lowering.fusion_gen SEED`` prints the case again.

The seeds are a fixed list (chosen for emulator cost: each emulated GPU thread of a kernel
with barriers or shuffles is an OS thread); the GPU suite (tests/gpu/test_random_fusions.py)
runs more of them at larger sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .fusion_gen import compare, generate
from .simt import Kernels

# Seeds whose programs cover the schedules (pointwise with and without 16-byte groups, thread/
# warp/register/tiled rows, two-launch full reductions, the general fallback) at modest cost.
SEEDS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 17, 22, 25, 26, 27, 28, 29, 30, 31, 35,
         38, 39, 40, 42, 43, 45, 47, 48, 49, 50, 51, 52, 53, 54, 56, 58, 59, 60, 64, 65, 67, 69,
         70, 71, 72, 73, 74, 76, 79, 80, 82, 83, 84, 86, 87, 88, 90, 92, 93, 94, 95, 96, 97, 98,
         100, 101, 103, 104, 105, 106, 107, 108, 114, 115, 118, 120, 128, 130, 133, 134, 137,
         138, 139]
# the half mode (float16/bfloat16 arithmetic rounded after every operation, as kernelpack
# defines it: fusion_gen/halves.py), a seed space of its own; the GPU suite runs more
HALF_SEEDS = [0, 1, 2, 3, 5, 8, 10, 11, 12, 14, 15, 17, 18, 20, 23, 24, 25, 27, 28, 29, 30,
              31, 34, 35, 40, 42, 43, 46, 47, 48, 49, 50, 51, 52, 53, 54, 57]
# compile for every target, save, load, plan: a few seeds (nvJitLink takes ~50 ms-1 s each)
PLAN_SEEDS = [0, 3, 8, 14, 22, 25]


def _failure(case, sizes, lines) -> str:
    return f"{case.describe(sizes)}\n" + "\n".join(lines)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_fusion_matches_numpy(seed):
    _run_and_check(generate(seed))


@pytest.mark.parametrize("seed", HALF_SEEDS)
def test_random_half_fusion_matches_numpy(seed):
    _run_and_check(generate(seed, halves=True))


def test_half_mode_computes_in_both_half_types():
    # the half mode is worth its seeds only if most programs hold half arithmetic: of seeds
    # 0..59, 45 hold some, 28 bfloat16 and 33 float16 (the default mode: 7 float16, as storage
    # only, and no bfloat16)
    sources = [generate(seed, halves=True).source for seed in range(60)]
    assert sum("float16" in s for s in sources) >= 40
    assert sum("kp.bfloat16" in s for s in sources) >= 20
    assert sum("kp.float16" in s for s in sources) >= 20


def _run_and_check(case) -> None:
    kernels = Kernels(case.fusion)
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        got = kernels(*inputs)
        failures, _ = case.check(inputs, got)
        assert not failures, _failure(case, sizes, failures)


@pytest.mark.parametrize("seed", PLAN_SEEDS)
def test_random_fusion_compiles_saves_loads_and_plans(seed):
    case = generate(seed)
    compiled = kp.compile(case.fusion, targets=["sm_80", "sm_90", "ptx"])
    for module in compiled.modules:
        assert [i.target for i in module.images] == ["sm_80", "sm_90", "compute_80"]
    pack = kp.load(kp.save([compiled]))
    program = pack[case.name]
    summary = program.summary
    assert [p.name for p in summary.inputs] == [p.name for p in case.params]
    assert [t.dtype for t in summary.outputs] == case.out_dtypes, case.describe()
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        plan = program.plan(*[v.shape if isinstance(v, np.ndarray) else v for v in inputs])
        expected = case.expected(inputs)
        got = [plan.allocations[t.name].shape for t in summary.outputs]
        assert got == [r.shape for r in expected], _failure(case, sizes, [f"planned {got}"])
        for t, r in zip(summary.outputs, expected):
            alloc = plan.allocations[t.name]
            assert alloc.nbytes == r.size * t.dtype.itemsize, _failure(case, sizes, [t.name])


def test_generation_is_deterministic():
    for seed, halves in ((0, False), (7, False), (123, False), (5, True), (57, True)):
        a, b = generate(seed, halves=halves), generate(seed, halves=halves)
        assert a.source == b.source and a.ref_source == b.ref_source and a.sizes == b.sizes
        for sizes in a.sizes:
            for x, y in zip(a.inputs(sizes), b.inputs(sizes)):
                assert np.array_equal(x, y, equal_nan=True)


def test_ill_conditioned_outputs_are_rare():
    """Outputs skipped as ill-conditioned (the reference itself is rounding noise there) must
    stay the exception, or the suite would be checking little."""
    total = skipped = 0
    for seed in range(60):
        case = generate(seed)
        for sizes in case.sizes[:1]:
            inputs = case.inputs(sizes)
            refs = case.expected(inputs)
            # the reference against itself: only the conditioning test can skip anything
            _, skip = case.check(inputs, [r.astype(np.asarray(r).dtype) for r in
                                          _as_outputs(case, refs)])
            total += len(refs)
            skipped += len(skip)
    assert skipped <= 0.1 * total, (skipped, total)


def _as_outputs(case, refs):
    from .fusion_gen.dtypes import NP_STORAGE

    return [np.asarray(r).astype(NP_STORAGE[dt.name]) for r, dt in zip(refs, case.out_dtypes)]


def test_complex_means_are_modelled_part_by_part():
    """GPU fuzz seed 24998 (notes/gpu-fuzz.md): a complex64 mean over rows whose imaginary parts
    hold a NaN. The kernel divides each part of the sum by the count (exact: a finite real part
    stays finite); NumPy's ``mean`` divides by the count as a complex number and so reports a
    NaN real part too. The reference models the kernel's rule, here at the size that failed."""
    case = generate(24998, "gpu")
    kernels = Kernels(case.fusion)
    sizes = {"b": 5}
    inputs = case.inputs(sizes)
    got = kernels(*inputs)
    mean = np.asarray(got[1])
    assert np.isfinite(mean.real[:2]).all() and np.isnan(mean.imag[:2]).all(), mean
    failures, _ = case.check(inputs, got)
    assert not failures, _failure(case, sizes, failures)


def test_an_all_zero_reference_is_compared_absolutely():
    z = np.zeros(3)
    residue = np.array([0.0, 1e-13, 0.0])
    assert compare(residue, z, kp.float64, 1e-12) is not None  # no bound given: exact
    assert compare(residue, z, kp.float64, 1e-12, zero_scale=1e-11) is None
    assert "absolute error" in compare(np.array([0.0, 1.0, 0.0]), z, kp.float64, 1e-12,
                                       zero_scale=1e-11)
    assert "NaN" in compare(np.array([0.0, np.nan, 0.0]), z, kp.float64, 1e-12, zero_scale=1.0)
    # a nonzero reference keeps the normwise relative error, whatever the bound
    assert compare(np.array([1.0, 1.1]), np.array([1.0, 1.0]), kp.float64, 1e-12,
                   zero_scale=1.0) is not None


@pytest.mark.parametrize("seed, halves, sizes", [(28755, False, {"a": 13, "b": 129}),
                                                 (7655, True, {"a": 7, "b": 100, "c": 5})])
def test_a_cancellation_to_zero_is_compared_against_the_outputs_bound(seed, halves, sizes):
    # GPU fuzz seeds (session 19) whose output is exactly 0 in the reference (a row of one
    # constant centred on its mean; a sum of centred values) and a rounding residue in the
    # kernel (2.4e-7 float32, 1.1e-16 float64): a relative error has no scale there, and these
    # failed as 1e+293 and 1e+284
    case = generate(seed, "gpu", halves=halves)
    inputs = case.inputs(sizes)
    got = Kernels(case.fusion)(*inputs)
    residues = [i for i, (g, r) in enumerate(zip(got, case.expected(inputs)))
                if case.out_dtypes[i].kind == "f" and not np.any(r) and np.any(g)]
    assert residues, "the kernel's residue is gone: pick another case"
    failures, _ = case.check(inputs, got)
    assert not failures, _failure(case, sizes, failures)


def test_math_on_integers_is_long_double_in_the_long_double_reference():
    """Emulator, half mode, seed 1978: ``where(tanh(x1) * h + tanh(x1) // 3 == h, 1.0, ...)``
    with the int32 ``x1 = 19``. NumPy's float64 tanh(19) is 1.0, the correctly rounded value
    (the host's libm, and the kernel's) 1 - 2^-53, so the equality held only in the reference.
    The long double reference, which says when an output turns on a function's last ulp, took
    tanh of ``x1.astype(np.float64)`` too and agreed with it; it converts integers to its own
    float64 model (long double) now, so that output is skipped as ill-conditioned."""
    case = generate(1978, halves=True)
    sizes = {"a": 13, "b": 1, "c": 70}
    inputs = case.inputs(sizes)
    assert 19 in inputs[1]
    ref, ld = case.expected(inputs)[0], case.expected(inputs, "ld")[0]
    assert not np.array_equal(ref, ld.astype(np.float64))  # the last ulp decides
    failures, skipped = case.check(inputs, Kernels(case.fusion)(*inputs))
    assert not failures and skipped == [0], _failure(case, sizes, failures)


def test_an_output_that_the_order_of_a_sum_decides_is_skipped():
    """Emulator, half mode, seed 3139: a row of 17 equal values, centred on its float64 mean
    and scaled by rsqrt(variance + 1e-9) (~3e4), is the imaginary part of a complex128 output.
    NumPy's pairwise mean is exactly the value (0 after centring); the kernel's order of
    additions is not (-7e-12), past the 1e-12 tolerance, while the worst-case bounds ("r+",
    "r-") moved it by 5.7e-11, below what they must move. Mode "seq" adds the terms in order,
    as a kernel may, moves it too, and the output is skipped as ill-conditioned."""
    case = generate(3139, halves=True)
    sizes = {"a": 1, "b": 37, "c": 17}
    inputs = case.inputs(sizes)
    ref, seq = case.expected(inputs)[0], case.expected(inputs, "seq")[0]
    assert not np.any(ref.imag[30]) and np.all(seq.imag[30])  # the equal row
    failures, skipped = case.check(inputs, Kernels(case.fusion)(*inputs))
    assert not failures and skipped == [0], _failure(case, sizes, failures)
