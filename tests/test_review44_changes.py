"""Review 44: attacks on session 35's changes (``git diff 8dbaf37 HEAD -- src README.md``).

1. ``lowering/size_checks.py``: the sizes a kernel computes (a dim used as a value, an
   intermediate shape) become constraints the plan evaluates;
2. ``codegen._reduce``: the general schedule's complex64 sums and means accumulate in
   complex128, compensated per part;
3. ``Fusion.__init__``: a renamed or re-wrapped fusion keeps its name and unwraps ``fn``;
4. ``kp.complex`` of two plain numbers is a host Python complex;
5. ``execute._check_aliasing``: ``out=`` a zero_init output sharing memory with an input.

Checked on the CPU: summaries and plans (``Planner``, a saved and loaded program), the SIMT
emulator (tests/lowering/simt.py) against NumPy, the fake driver (tests/runtime/fake_driver.py).
Ten bugs were found here, each a test below that failed before its fix (session 35); the
other tests pin what held. The bugs: the refusal names the synthetic ``select(e == 0, 1, 1)``, not the size check;
``static=`` making a dim value ``1 << 64`` compiles (every call then fails); 1030 distinct
computed sizes exceed MAX_CONSTRAINTS (a regression: "too many constraints"); the general
schedule's reduced element count (a product of dims) is never checked (a * 2^62 wraps: silent
zeros); a size under a lazily evaluated select branch counts as evaluated (unchecked), and
as proof of a shift count <= 63 (a dropped guard: x >> 64 gives x); a division guarded by
``kp.where`` on sizes divides by zero in the kernel (both branches computed; SIGFPE on the
emulator); a renamed module-level fusion cannot be pickled; a function attribute named like
a Fusion method shadows it; ``kp.exp(1j)``'s error recommends ``kp.complex(re, im)``, which
is now that same Python complex.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp

pytest.importorskip("llvmlite")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from lowering import simt  # noqa: E402  (tests/lowering/simt.py: the CPU emulator)
from kernelpack.lowering import pipeline  # noqa: E402
from kernelpack.planner import Planner  # noqa: E402

T = kp.Tensor


def _summary(f, static=None):
    """The summary the lowering derives (through LLVM IR), without PTX or cubins."""
    build = pipeline.run(pipeline.new_build(f, ["sm_80"], static, {}), stop="llvm_ir")
    return pipeline.summarize(build).summary


def _size_constraints(summary) -> list:
    return [c for c in summary.constraints if c.message.startswith("size ")]


def _no_core() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a child that crashes leaves no core


def _run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a child (its cwd a scratch directory; ``tests`` on its path)."""
    prelude = f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=tempfile.gettempdir(), preexec_fn=_no_core,
                          env={**os.environ, **(env or {})})


# ==== 1. sizes the kernels compute ==============================================================

@kp.fusion
def dim_quotient(x: T[kp.i64, "n"], y: T[kp.f32, "m"]):
    return x + x.shape[0] // y.shape[0]


@kp.fusion
def dim_minus_one(x: T[kp.f32, "n"]):
    return x * (x.shape[0] - 1)


@kp.fusion
def arange_forms(x: T[kp.f32, "n"]):
    n = x.shape[0]
    rev = kp.arange(n - 1, -1, -1).astype(kp.f32)        # n-1, ..., 0
    tail = kp.arange(1, n + 1).astype(kp.f32)             # 1, ..., n
    odd = kp.arange(2 * n - 1, 0, -2).astype(kp.f32).sum()  # a summed-away computed length
    return rev, tail, odd + x


def test_zero_divisor_is_a_constraint_error_naming_the_size():
    planner = Planner(_summary(dim_quotient))
    assert planner.plan(x=(4,), y=(2,)).variant == 0
    with pytest.raises(kp.ConstraintError) as info:
        planner.plan(x=(4,), y=(0,))
    assert isinstance(info.value, kp.ExpressionError)
    text = str(info.value)
    assert "division by zero" in text and "//" in text, text


def test_a_loaded_program_plans_the_computed_size_too(tmp_path):
    """Through kp.save / kp.load (the loader's planner, its fast path first): the same
    refusal, and the ordinary call plans."""
    kp.save([kp.compile(dim_quotient, targets=["sm_80"])], tmp_path / "q.kpack")
    prog = kp.load(tmp_path / "q.kpack")["dim_quotient"]
    for _ in range(2):  # the second call goes through the plan cache / fast planner
        assert prog.plan(x=(4,), y=(2,)).variant == 0
        with pytest.raises(kp.ExpressionError, match="division by zero"):
            prog.plan(x=(4,), y=(0,))

def test_the_error_names_the_size_check_not_a_synthetic_select():
    """The user wrote ``x.shape[0] // y.shape[0]``, no constraint and no select; the
    refusal should say which size could not be computed (the constraint's own message,
    "size n // m must be computable ..."), not "cannot evaluate select(n // m == 0, 1, 1)
    (constraint)", the encoding size_checks uses to make the plan evaluate it."""
    planner = Planner(_summary(dim_quotient))
    with pytest.raises(kp.ConstraintError) as info:
        planner.plan(x=(4,), y=(0,))
    text = str(info.value)
    assert "m=0" in text or "m = 0" in text, text
    assert "select(" not in text and "must be computable" in text, text

def test_a_size_that_cannot_fail_for_valid_shapes_plans_at_zero():
    """``n - 1`` (a dim used as a value) for an empty x: -1, no error, no refusal."""
    summary = _summary(dim_minus_one)
    assert Planner(summary).plan(x=(0,)).allocations["out"].shape == (0,)
    x = np.arange(5, dtype=np.float32)
    (got,) = simt.Kernels(dim_minus_one)(x)
    np.testing.assert_array_equal(got, x * np.float32(4))


@pytest.mark.parametrize("n", [0, 1, 6])
def test_arange_forms_with_computed_bounds_run_for_every_length(n):
    x = np.arange(n, dtype=np.float32) + 0.5
    got = simt.Kernels(arange_forms)(x)
    rev = np.arange(n - 1, -1, -1, dtype=np.float64)
    tail = np.arange(1, n + 1, dtype=np.float64)
    odd = np.arange(2 * n - 1, 0, -2, dtype=np.float64).sum()
    np.testing.assert_array_equal(got[0], rev.astype(np.float32))
    np.testing.assert_array_equal(got[1], tail.astype(np.float32))
    np.testing.assert_array_equal(got[2], (odd + x).astype(np.float32))



@kp.fusion
def quotient_twice(x: T[kp.i64, "n"], y: T[kp.f32, "m"]):
    q = x.shape[0] // y.shape[0]
    return x * q + q + kp.arange(q).sum()  # a dim value (twice) and a summed-away length


def test_one_constraint_per_computed_size():
    """The same size as a dim value twice and as an intermediate length: one constraint,
    and a call that can compute it plans (n // m = 0 included)."""
    summary = _summary(quotient_twice)
    assert [str(c.predicate) for c in _size_constraints(summary)] == \
        ["select(n // m == 0, 1, 1)"]
    x = np.arange(3, dtype=np.int64)
    (got,) = simt.Kernels(quotient_twice)(x, np.zeros(5, np.float32))
    np.testing.assert_array_equal(got, x * 0)

@kp.fusion
def static_quotient(x: T[kp.i64, "n"], y: T[kp.f32, "m"]):
    return x + x.shape[0] // y.shape[0]


def test_static_dims_fold_computed_sizes():
    """static= makes the divisor a constant: ``n // 4`` needs no constraint to be safe
    beyond what its evaluation checks, and the plan of a matching call works."""
    summary = _summary(static_quotient, {"m": 4})
    assert Planner(summary).plan(x=(9,), y=(4,)).variant == 0
    x = np.arange(9, dtype=np.int64)
    (got,) = simt.Kernels(static_quotient, {"m": 4})(x, np.zeros(4, np.float32))
    np.testing.assert_array_equal(got, x + 2)


@kp.fusion
def dim_power(x: T[kp.f32, "n"]):
    return x * (1 << x.shape[0])


def test_a_computed_size_no_call_can_have_is_a_trace_error():
    """static n = 64 makes the dim value ``1 << 64``, which reads no symbol and cannot be
    evaluated: every plan would fail, so the compile refuses it (README: a size that reads
    no symbol but cannot exist is a TraceError)."""
    with pytest.raises(kp.TraceError) as info:
        _summary(dim_power, {"n": 64})
    assert "1 << 64" in str(info.value), str(info.value)

@kp.fusion
def power_encoding(x: T[kp.f32, "b", "n"], k: kp.i64):
    # quantum style: 2^k amplitudes, a dim used as a value (1 << k) and a summed-away length
    norm = (kp.arange(1 << k).astype(kp.f32) * 0 + 1).sum()
    return x * (1 << k) / norm


@pytest.mark.parametrize("k", [0, 1, 5])
def test_power_of_two_sizes_run(k):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = simt.Kernels(power_encoding)(x, k)
    np.testing.assert_array_equal(got, x * np.float32(1 << k) / np.float32(1 << k))


@pytest.mark.parametrize("k", [-1, 63, 64])
def test_power_of_two_sizes_past_int64_are_refused(k):
    planner = Planner(_summary(power_encoding))
    with pytest.raises(kp.ConstraintError):
        planner.plan(x=(2, 3), k=k)


def test_quantum_workloads_plan_without_new_refusals():
    """The encodings of lowering/workloads.py (``1 << n`` sizes, kp.pad) plan for the
    sizes they are used at, n = 0 included."""
    from kernelpack.lowering.workloads import make

    w = make(kp.float32)
    for name, args in [("phase", [{"x": (2, n)} for n in (0, 1, 10)]),
                       ("angle", [{"x": (2, n)} for n in (0, 1, 10)]),
                       ("basis", [{"j": (3,), "n": n} for n in (0, 1, 20)]),
                       ("amplitude", [{"v": (2, 5), "n": n} for n in (3, 10, 20)])]:
        planner = Planner(_summary(w[name]))
        for kw in args:
            assert planner.plan(**kw).launches, (name, kw)


def test_computed_size_constraints_are_deterministic_across_processes():
    """The constraints (and their order) and the saved artifact's bytes do not depend on the
    hash seed."""
    code = """
        import kernelpack as kp
        from kernelpack.lowering import pipeline
        T = kp.Tensor

        @kp.fusion
        def many(x: T[kp.i64, "n"], y: T[kp.f32, "m"], k: kp.i64):
            a = x + x.shape[0] // y.shape[0] + (1 << k) * (x.shape[0] % y.shape[0])
            b = kp.arange(2 * y.shape[0] - 1, 0, -2).astype(kp.i64).sum()
            t = kp.arange(1 << k).astype(kp.f32)[None, :, None] * y[:, None, None]
            return a + b, t.sum(axis=(0, 2))

        build = pipeline.run(pipeline.new_build(many, ["sm_80"], None, {}), stop="llvm_ir")
        s = pipeline.summarize(build).summary
        print(repr(s.constraints))
        import hashlib, os, tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "many.kpack")
            kp.save([kp.compile(many, targets=["sm_80"])], path)
            print(hashlib.sha256(open(path, "rb").read()).hexdigest())
    """
    outs = []
    for seed in ("1", "2"):
        r = _run_python(code, {"PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1]
    assert "must be computable" in outs[0]



@kp.fusion
def offsets(x: T[kp.i64, "n"]):
    acc = x
    for i in range(1030):  # an unrolled loop over offsets of a dim
        acc = acc ^ (x.shape[0] + i)
    return acc


def test_many_computed_sizes_do_not_exceed_the_constraint_limit():
    """Each distinct fallible size becomes its own constraint: 1030 offsets ``n + i`` (which
    compiled before this session, with no constraint) are now "program 'offsets': too many
    constraints" (MAX_CONSTRAINTS 1024), a TraceError about constraints the user never
    wrote."""
    summary = _summary(offsets)
    assert Planner(summary).plan(x=(3,)).variant == 0

# ---- missed cases --------------------------------------------------------------------------

@kp.fusion
def reduced_product(x: T[kp.f32, "a"], y: T[kp.f32, "m"], k: kp.i64):
    # axes (0, 2): the general schedule, one thread per output looping over a * 2^k terms
    t = x[:, None, None] * kp.arange(1 << k).astype(kp.f32)[None, None, :] + y[None, :, None]
    return t.sum(axis=(0, 2))


def test_reduced_element_count_past_int64_is_refused():
    """Each reduced dim (a, 1 << k) is checked, but the general schedule's loop bound is
    their product, computed in the kernel alone: for a = 4, k = 62 it is 2^64, which wraps
    to 0 in int64, and the kernel sums nothing (a silent 0 for every output)."""
    planner = Planner(_summary(reduced_product))
    assert planner.plan(x=(1,), y=(3,), k=62).launches  # 2^62 terms: computable
    with pytest.raises(kp.ConstraintError):
        planner.plan(x=(4,), y=(3,), k=62)


@kp.fusion
def selected_size(x: T[kp.f32, "n"], s: T[kp.f32, "k"]):
    k = s.shape[0]
    return x * (1 << k), kp.arange(kp.where(k < 63, 1 << k, 1))


def test_a_size_only_under_an_untaken_select_branch_is_still_checked():
    """``1 << k`` is computed by the kernel (``x * (1 << k)``); the second output's length
    ``select(k < 63, 1 << k, 1)`` holds it too, but only in a branch the plan evaluates
    lazily. For k = 64 the plan takes the other branch and never computes ``1 << k``."""
    planner = Planner(_summary(selected_size))
    with pytest.raises(kp.ConstraintError):
        planner.plan(x=(3,), s=(64,))


@kp.fusion
def guarded_shift(x: T[kp.i64, "b"], s: T[kp.f32, "k"]):
    k = s.shape[0]
    scale = kp.where(k < 63, 1 << k, 0)  # a size guarded the NumPy way: a lazy select
    return (x[:, None] >> kp.arange(k)[None, :]) + scale


def test_a_shift_count_seen_only_under_a_select_keeps_its_guard():
    """bounds.shift_count_syms takes the dim k for a shift count (k <= 63 "wherever a kernel
    runs", since the plan would refuse ``1 << k``) because ``1 << k`` appears in a dim value,
    and drops the guard of ``x >> kp.arange(k)``; but it sits in a select branch that the plan
    (and the new size constraint) evaluate lazily, so k = 66 plans, and x >> 64, x >> 65 run
    unguarded (LLVM poison; x86 shifts by the count mod 64) where NumPy gives 0 or -1."""
    x = np.array([5, -7, 1 << 40], np.int64)
    (got,) = simt.Kernels(guarded_shift)(x, np.zeros(66, np.float32))
    j = np.arange(66)
    want = np.where(j[None, :] < 64, x[:, None] >> np.minimum(j, 63)[None, :],
                    np.where(x[:, None] < 0, -1, 0))
    np.testing.assert_array_equal(got, want)

def test_a_division_guarded_by_kp_where_on_sizes_runs_for_a_zero_divisor():
    """``kp.where(m > 0, n // m, 0)`` on sizes is a lazy ``select``: the plan (and the new
    size constraint) accept m = 0, and NumPy-style code guards a division this way. The
    kernel computes both branches (irutil.int_expr_op's select of an sdiv by 0): on the SIMT
    emulator (x86) the process dies of SIGFPE; on the GPU it is LLVM undefined behaviour.
    Run in a child process."""
    code = """
        import numpy as np
        import kernelpack as kp
        from lowering import simt
        T = kp.Tensor

        @kp.fusion
        def guarded(x: T[kp.i64, "n"], y: T[kp.f32, "m"]):
            return x + kp.where(y.shape[0] > 0, x.shape[0] // y.shape[0], 0)

        k = simt.Kernels(guarded)
        x = np.arange(4, dtype=np.int64)
        assert (k(x, np.ones(2, np.float32))[0] == x + 2).all()
        print("zero:", k(x, np.ones(0, np.float32))[0].tolist(), flush=True)
    """
    r = _run_python(code)
    assert r.returncode == 0 and "zero: [0, 1, 2, 3]" in r.stdout, (r.returncode,
                                                                    r.stderr[-1500:])


# ==== 2. complex sums on the general schedule =================================================

@kp.fusion
def complex_stats(z: T[kp.c64, "a", "b", "c"]):
    return z.sum(axis=(0, 2)), z.mean(axis=(0, 2)), z.prod(axis=(0, 2))


@kp.fusion
def complex128_stats(z: T[kp.c128, "a", "b", "c"]):
    return z.sum(axis=(0, 2)), z.mean(axis=(0, 2))


_KERNELS: dict = {}


def _kernels(f):
    if f not in _KERNELS:
        _KERNELS[f] = simt.Kernels(f)
    return _KERNELS[f]


def test_complex64_sum_and_mean_take_the_general_schedule_and_are_accurate():
    rng = np.random.default_rng(44)
    z = (rng.standard_normal((200, 3, 150)) + 1j * rng.standard_normal((200, 3, 150)) + 0.1
         ).astype(np.complex64)
    k = _kernels(complex_stats)
    plan = k.planner.plan(z.shape)
    assert [ln.kernel for ln in plan.launches if all(ln.grid)] == \
        ["complex_stats_0_pointwise"]
    got = k(z)
    assert [g.dtype for g in got] == [np.complex64] * 3
    zd = z.astype(np.complex128)
    # the exact sum, rounded once to complex64: at most half an ulp of each part
    for g, r in ((got[0], zd.sum(axis=(0, 2))), (got[1], zd.mean(axis=(0, 2)))):
        np.testing.assert_array_equal(g, r.astype(np.complex64))


_INF, _NAN = np.inf, np.nan


@pytest.mark.parametrize("name,terms", [
    ("inf real part", [1 + 1j, complex(_INF, 1), 2 + 0j, 1 + 1j]),
    ("inf minus inf", [complex(_INF, 1), complex(-_INF, 2), 0j, 1j]),
    ("nan real part", [complex(_NAN, 1), 1 + 1j, 0j, 1j]),
    ("inf imag part", [complex(1, -_INF), 1 + 1j, 3j, 2]),
    ("huge cancelling", [3e38 + 3e38j, 3e38 + 3e38j, -3e38 - 3e38j, 1 + 1j]),
    ("huge overflowing", [3e38 + 1j, 3e38 + 1j, 3e38 + 1j, 1 + 1j]),
    ("cancelling 1e30", [1e30 + 1j, 1 + 1e30j, -1e30 + 1j, 1 - 1e30j]),
])
def test_complex64_special_values_match_numpy(name, terms):
    """Per part: the exact sum rounded once to complex64 (math.fsum; NumPy's float64 sum
    where a part holds inf or NaN), and the mean that sum divided by the count per part.
    3e38 + 3e38 overflows complex64, so NumPy's complex64 sum of the huge cancelling terms
    is inf, while the complex128 accumulator gives the exact 3e38; and the four 1e30 terms
    are 0 in NumPy's complex64 sum, 2+2j exactly. (NumPy's complex mean divides by a complex
    count, so an inf part makes the other part NaN there; kernelpack divides each part.)"""
    z = np.array(terms, np.complex64).reshape(2, 1, 2)
    got = _kernels(complex_stats)(z)
    zd = z.astype(np.complex128).ravel()

    def exact(part):
        return math.fsum(part) if np.isfinite(part).all() else float(np.sum(part))

    with np.errstate(all="ignore"):
        re, im = exact(zd.real), exact(zd.imag)
        want_sum = np.array([complex(re, im)]).astype(np.complex64)
        want_mean = np.array([complex(re / 4, im / 4)]).astype(np.complex64)
    for i, (g, w) in enumerate(((got[0], want_sum), (got[1], want_mean))):
        np.testing.assert_array_equal(g.real, w.real, err_msg=f"{name} output {i} real")
        np.testing.assert_array_equal(g.imag, w.imag, err_msg=f"{name} output {i} imag")


@pytest.mark.parametrize("shape", [(0, 2, 3), (2, 2, 0)])
def test_complex64_sums_over_nothing(shape):
    z = np.zeros(shape, np.complex64)
    got = _kernels(complex_stats)(z)
    np.testing.assert_array_equal(got[0], np.zeros(2, np.complex64))
    assert np.isnan(got[1].real).all() and np.isnan(got[1].imag).all()
    np.testing.assert_array_equal(got[2], np.ones(2, np.complex64))


def test_complex128_sums_are_compensated_too():
    """1e16 + 1 + -1e16 per part: a plain running complex128 sum gives 0, NumPy's pairwise
    one too for these four terms, the compensated one the exact 1."""
    terms = [1e16 + 1e16j, 1 + 1j, -1e16 - 1e16j, 0j]
    z = np.array(terms, np.complex128).reshape(2, 1, 2)
    got = _kernels(complex128_stats)(z)
    np.testing.assert_array_equal(got[0], np.array([1 + 1j]))
    np.testing.assert_array_equal(got[1], np.array([0.25 + 0.25j]))


# ==== 3. renamed and re-wrapped fusions ========================================================

@kp.fusion
def base_scale(x: T[kp.f32, "n"]):
    return x * 2.0


renamed_scale = kp.fusion(name="renamed_scale")(base_scale)
rewrapped_scale = kp.fusion(renamed_scale)


@kp.fusion
def other_math(x: T[kp.f32, "n"]):
    return x * 3.0


same_name_other_math = kp.fusion(name="base_scale")(other_math.fn)


def test_renamed_and_rewrapped_fusions_keep_their_names():
    assert base_scale.name == "base_scale"
    assert renamed_scale.name == "renamed_scale" and rewrapped_scale.name == "renamed_scale"
    assert renamed_scale.fn is base_scale.fn and rewrapped_scale.fn is base_scale.fn
    assert renamed_scale.trace().name == "renamed_scale"
    assert kp.fusion(name="third")(rewrapped_scale).name == "third"
    assert base_scale.name == "base_scale"  # the original is untouched


def test_function_attributes_named_name_and_fn_do_not_leak():
    def labelled(x: T[kp.f32, "n"]):
        return x - 1.0

    labelled.name = "bad name!"  # a registry's label: not a PTX identifier
    labelled.fn = "not the function"
    f = kp.fusion(labelled)
    assert f.name == "labelled" and f.fn is labelled
    assert kp.fusion(name="labelled2")(f).fn is labelled
    assert f.trace().name == "labelled"

def test_cache_keys_follow_name_and_math():
    """canonical_bytes (the cache key's source): the renamed fusion differs from the original
    by its name only; the same name over other math differs; re-wrapping changes nothing."""
    a, r, w = (f.canonical_bytes() for f in (base_scale, renamed_scale, rewrapped_scale))
    assert a != r and r == w
    assert a.replace(b"base_scale", b"renamed_scale") == r
    assert same_name_other_math.canonical_bytes() != a
    assert base_scale.canonical_bytes(static={"n": 4}) != a


def test_renamed_fusion_inlines_and_computes_the_same():
    @kp.fusion
    def outer(x: T[kp.f32, "n"]):
        return renamed_scale(x) + rewrapped_scale(x)

    x = np.arange(4, dtype=np.float32)
    (got,) = simt.Kernels(outer)(x)
    np.testing.assert_array_equal(got, x * 4)


def test_a_module_level_fusion_pickles_by_reference():
    assert pickle.loads(pickle.dumps(base_scale)) is base_scale


def test_a_renamed_module_level_fusion_pickles_by_reference():
    """Fusion.__reduce__ pickles by ``__qualname__`` so that
    ``ProcessPoolExecutor().map(kp.compile, fusions)`` works; update_wrapper copies the
    original's ``__qualname__`` (``base_scale``) onto the renamed fusion, so pickle finds
    another object under that name (PicklingError "not the same object")."""
    assert pickle.loads(pickle.dumps(renamed_scale)) is renamed_scale


def _with_trace_attribute(x: T[kp.f32, "n"]):
    return x + 1.0


_with_trace_attribute.trace = "registry: traced"  # a function's own attribute


def test_a_function_attribute_does_not_replace_a_fusion_method():
    """update_wrapper copies the function's ``__dict__`` over the Fusion's: the fix protects
    ``name`` and ``fn``, but an attribute named like a method (``trace``, ``static_dims``,
    ``canonical_bytes``) still shadows it, and kp.compile then fails with
    "'str' object is not callable"."""
    f = kp.fusion(_with_trace_attribute)
    assert callable(f.trace)
    assert f.trace().name == "_with_trace_attribute"


# ==== 4. kp.complex of plain numbers ==========================================================

def test_complex_of_plain_numbers_is_a_host_complex():
    assert kp.complex(1, 2) == 1 + 2j and type(kp.complex(1, 2)) is complex
    c = kp.complex(np.float64(0.5), -0.0)
    assert type(c) is complex and c.real == 0.5 and str(c.imag) == "-0.0"
    with pytest.raises(kp.TraceError, match="too large"):
        kp.complex(10 ** 400, 0)


@pytest.mark.parametrize("args", [(True, 0.0), (1j, 0.0), ("1", 0.0)])
def test_complex_of_other_plain_values_is_refused(args):
    with pytest.raises(kp.TraceError):
        kp.complex(*args)


@kp.fusion
def weak_complex(x: T[kp.f32, "n"], z: T[kp.c64, "n"], d: T[kp.f64, "n"],
                 i: T[kp.i32, "n"]):
    c = kp.complex(0.5, -2.0)
    return x * c, z + c, d * c, i * c


def test_a_host_complex_is_weak_beside_tensors():
    """NumPy 2's weak Python complex: complex64 beside float32 and complex64 tensors,
    complex128 beside float64 and int32 ones."""
    k = simt.Kernels(weak_complex)
    assert [o.dtype for o in k.summary.outputs] == [kp.c64, kp.c64, kp.c128, kp.c128]
    x = np.arange(3, dtype=np.float32) - 1
    z = (x + 1j * x[::-1]).astype(np.complex64)
    got = k(x, z, x.astype(np.float64), x.astype(np.int32))
    c = complex(0.5, -2.0)
    want = (x * c, z + c, x.astype(np.float64) * c, x.astype(np.int32) * c)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_kp_exp_of_a_host_complex_does_not_send_the_user_in_a_circle():
    """kp.exp of a Python complex says "make a traced tensor with kp.complex(re, im) inside a
    @kp.fusion"; since this session kp.complex(re, im) of plain numbers *is* a Python complex
    (the ops.complex docstring: "kp.exp(1j)'s error points here"), so following the advice
    inside a fusion gives the very same error. Either kp.exp computes it on the host (cmath,
    as the other math functions of plain numbers) or the message names what works."""
    @kp.fusion
    def rotate(x: T[kp.f32, "n"]):
        return x * kp.exp(kp.complex(0.0, 0.5))

    try:
        rotate.trace()
    except kp.TraceError as exc:
        # what works: a parameter, or kp.complex of traced float tensors (not of numbers)
        assert "parameter" in str(exc) and "traced float tensors" in str(exc), str(exc)

def test_an_op_without_a_traced_operand_inside_a_fusion_says_so():
    @kp.fusion
    def no_operand(x: T[kp.f32, "n"]):
        return x + kp.complex(x.shape[0], 0.0)

    with pytest.raises(kp.TraceError) as info:
        no_operand.trace()
    text = str(info.value)
    assert "call them inside" not in text and "traced tensor" in text, text


# ==== 5. out= a zero_init output sharing memory with an input =================================

def _floats(p: int, n: int) -> list:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(p, 4 * n))) if n else []


def _acc2(grid, block, shmem, v) -> None:
    """z[i] += x[i] (z zero-filled first), w[i] = 2 * x[i]: reads each element first."""
    x, z, w, n = v
    xs, zs = _floats(x, n), _floats(z, n)
    if n:
        ctypes.memmove(z, struct.pack(f"<{n}f", *[a + b for a, b in zip(xs, zs)]), 4 * n)
        ctypes.memmove(w, struct.pack(f"<{n}f", *[2 * a for a in xs]), 4 * n)


def _acc2_program():
    from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module,
                                    Tensor, Variant)

    s = KernelSummary("acc2", (Tensor("x", kp.f32, ("n",)),
                               Tensor("z", kp.f32, ("n",), role="out", zero_init=True),
                               Tensor("w", kp.f32, ("n",), role="out")),
                      (Variant((Launch("acc2", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.buffer("w"),
                                        Arg.of(kp.sym("n"), kp.u32))),)),))
    return Compiled(s, (Module("m", ("acc2",), (Image("cubin", "sm_90", b"\x7fELF-acc2"),)),))


@pytest.fixture
def fake(monkeypatch):
    from fake_driver import FakeDriver, install

    return install(monkeypatch, FakeDriver(kernels={"acc2": ("QQQI", _acc2)}))


def test_zero_init_output_into_separate_arrays(fake):
    from fake_driver import HostArray
    from kernelpack.runtime import call_program

    prog = _acc2_program()
    x, z, w = HostArray([1.0, 2.0]), HostArray([9.0, 9.0]), HostArray([7.0, 7.0])
    assert call_program(prog, x, out=(z, w)) == (z, w)
    assert (x.values(), z.values(), w.values()) == ([1, 2], [1, 2], [2, 4])
    z2, w2 = HostArray([5.0, 5.0]), HostArray([5.0, 5.0])
    got = call_program(prog, x, out={"w": w2, "z": z2})
    assert got == (z2, w2) and (z2.values(), w2.values()) == ([1, 2], [2, 4])


def test_in_place_normal_output_beside_a_zero_init_one_reads_a_copy(fake):
    """w = 2 * x in place over x ran here in place until session 37; its kernel stores the
    zero-filled z as well, and a kernel storing two arrays may load x again after storing w
    (runtime/in_place.py, review 48): refused in place in sessions 37-38 (LaunchError); since
    session 39 x is read from a copy, and the call gives what separate arrays give."""
    from fake_driver import HostArray
    from kernelpack.runtime import call_program

    prog = _acc2_program()
    x, z = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    call_program(prog, x, out=(z, x))
    assert z.values() == [1, 2] and x.values() == [2, 4]
    assert len([c for c in fake.calls if c[0] == "cuMemcpyDtoDAsync"]) == 1
    x, w = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    call_program(prog, x, out=(z, w))
    assert z.values() == [1, 2] and w.values() == [2, 4]


def test_empty_arrays_are_not_refused(fake):
    from fake_driver import HostArray
    from kernelpack.runtime import call_program

    prog = _acc2_program()
    x = HostArray([])
    call_program(prog, x, out=(x, HostArray([])))  # nothing is shared: no bytes


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_zero_init_output_aliasing_the_input_reads_a_copy(fake, form):
    """The zero_init z in place over x: the fill would erase x before the kernel reads it
    (LaunchError until session 39); x is now copied before the fill, by either form of
    out=."""
    from fake_driver import HostArray
    from kernelpack.runtime import call_program

    prog = _acc2_program()
    x, w = HostArray([1.0, 2.0]), HostArray([0.0, 0.0])
    out = (x, w) if form == "tuple" else {"z": x, "w": w}
    call_program(prog, x, out=out)
    assert x.values() == [1, 2] and w.values() == [2, 4]
    order = [c[0] for c in fake.calls if c[0] in ("cuMemcpyDtoDAsync", "cuMemsetD8Async",
                                                  "cuLaunchKernel")]
    assert order == ["cuMemcpyDtoDAsync", "cuMemsetD8Async", "cuLaunchKernel"]
