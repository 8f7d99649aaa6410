"""Regressions from a second adversarial review of the fusion front and the lowering: names
that crashed the Python process inside LLVM, deep graphs that exhausted Python's recursion
limit, programs with no outputs, generated names clashing with the user's, fusions calling
fusions, and ``kp.compile`` options.

Numerics run through the SIMT emulator (:mod:`.simt`) against NumPy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.graph import Graph
from kernelpack.lowering.schedule import per_row

from .simt import Kernels, assert_close

T = kp.Tensor


@pytest.mark.parametrize("name", ["my-kernel", "a b", "ünï", "1abc", "a.b", "x" * 961])
def test_fusion_names_must_be_ascii_identifiers(name):
    """The name becomes the kernels' PTX symbols: LLVM's NVPTX backend aborted the whole
    process ("LLVM ERROR: Symbol name with unsupported characters") for ``my-kernel``, a
    space or a non-ASCII letter; ``1abc`` and ``a.b`` failed later in ptxas. Now a
    ValueError at decoration, before anything is compiled."""
    with pytest.raises(ValueError, match=r"a fusion's name must be an ASCII identifier"):
        @kp.fusion(name=name)
        def f(x: T[kp.f32, "n"]):
            return x + 1


def test_function_names_are_checked_too():
    with pytest.raises(ValueError, match=r"got 'ünï'"):
        @kp.fusion
        def ünï(x: T[kp.f32, "n"]):
            return x + 1
    with pytest.raises(ValueError, match=r"got '<lambda>'"):
        kp.fusion(lambda: 1)

    @kp.fusion(name="x" * 960)  # the longest name that leaves room for kernel suffixes
    def long(x: T[kp.f32, "n"]):
        return x + 1

    assert kp.load(kp.save([kp.compile(long, targets=["sm_80"])])).programs == ["x" * 960]


def test_long_dependency_chains_compile():
    """A chain of ~250 dependent operations exhausted Python's recursion limit in the code
    generator (four frames per node): a RecursionError out of kp.compile."""
    @kp.fusion
    def chain(x: T[kp.f64, "m", "n"], y: T[kp.f64, "n"]):
        z = x
        for _ in range(300):
            z = z * 0.75 + y
        return z, z.sum(0)

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal(4)
    z = x
    for _ in range(300):
        z = z * 0.75 + y
    a, b = Kernels(chain)(x, y)
    assert_close(a, z, 1e-12, "chain")
    assert_close(b, z.sum(0), 1e-12, "sum")


def test_per_row_classification_is_iterative():
    """The row schedule's test of per-row values walked its graph recursively: a chain of
    1500 operations was a RecursionError."""
    g = Graph("deep")
    x = g.add("input", kp.float32, (kp.sym("n"),), attrs=("x",))
    r = g.add("reduce", kp.float32, (kp.Expr("const", (), 1),), (x.id,), attrs=("sum", (0,)))
    v = r
    for _ in range(1500):
        v = g.add("mul", kp.float32, v.node.shape, (v.id, r.id))
    w = g.add("add", kp.float32, x.node.shape, (v.id, x.id))
    uniform = per_row(g, [r.id])
    assert uniform(v.id) and not uniform(w.id) and not uniform(x.id)


def test_a_fusion_must_return_something():
    """``return {}`` compiled a program with no outputs and no launches."""
    @kp.fusion
    def empty(x: T[kp.f32, "n"]):
        return {}

    with pytest.raises(kp.TraceError, match=r"returns no outputs"):
        empty.trace()


def test_generated_names_step_aside_for_the_users():
    """A parameter named like a generated output name (``out0``) made ``return a, b`` a
    TraceError ("output 'out0' clashes with a parameter"), and an output named like a full
    reduction's workspace (``f_0_ws0``) one about a name the user never chose. (A parameter
    named ``out`` itself is refused since review 28: the loaded program's ``out=`` keyword
    would take it.)"""
    @kp.fusion
    def f(x: T[kp.f32, "n"], out0: T[kp.f32, "n"]):
        return x + out0, x - out0

    @kp.fusion
    def g(x: T[kp.f32, "n"]):
        s = x.sum()
        return {"g_0_ws0": s, "g_0_ws0_": s * 2}

    prog = kp.load(kp.save([kp.compile(f, targets=["sm_80"])]))["f"]
    assert [p.name for p in prog.summary.outputs] == ["out0_", "out1"]
    plan = kp.load(kp.save([kp.compile(g, targets=["sm_80"])]))["g"].plan(x=(5,))
    assert sorted(plan.allocations) == ["g_0_ws0", "g_0_ws0_", "g_0_ws0__"]
    assert plan.allocations["g_0_ws0__"].kind == "scratch"
    x = np.arange(5, dtype=np.float32)
    s, s2 = Kernels(g)(x)
    assert s == 10 and s2 == 20


def test_a_fusion_called_inside_another_is_inlined():
    """Calling one @kp.fusion from another's body raised "compile it with kp.compile(...)";
    it now traces inline (checking the annotated dtype and rank)."""
    @kp.fusion
    def gelu(x: T[kp.f32, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))

    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return gelu(x) * 2

    @kp.fusion
    def wrong(x: T[kp.f64, "n"]):
        return gelu(x)

    x = np.linspace(-3, 3, 7).astype(np.float32)
    xd = x.astype(np.float64)
    ref = (0.5 * xd * (1 + np.tanh(0.7978845608028654 * (xd + 0.044715 * xd ** 3)))) * 2
    assert_close(Kernels(f)(x)[0], ref, 1e-6, "gelu * 2")
    with pytest.raises(kp.TraceError, match=r"x is float64 of rank 1, annotated float32"):
        wrong.trace()
    with pytest.raises(TypeError, match=r"compile it with kp.compile"):
        gelu(x)


def test_compile_options_refuse_bools_and_oversized_static_dims():
    """``opt=True`` compiled at -O1 (a bool is an int); ``static={'n': 1 << 70}`` failed
    with Expr's "expression constant outside int64", naming no dim."""
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x + 1

    with pytest.raises(ValueError, match=r"opt must be an integer 0..3 \(got True\)"):
        kp.compile(f, targets=["sm_80"], opt=True)
    with pytest.raises(ValueError, match=r"static\['n'\] = 1180591620717411303424 does not "
                                         r"fit int64"):
        kp.compile(f, targets=["sm_80"], static={"n": 1 << 70})


def test_fusions_trace_in_several_threads_at_once():
    """The stack of graphs being traced was one list for the process: a thread's
    ``kp.arange`` joined another thread's graph ("a traced tensor from another fusion was
    used"), e.g. fusions compiled from a thread pool."""
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def make(k: int) -> kp.fusion:
        @kp.fusion(name=f"f{k}")
        def f(x: T[kp.f32, "n"]):
            barrier.wait(timeout=10)  # every thread inside its trace before any kp.arange
            a = kp.arange(x.shape[0]).astype(kp.f32)
            barrier.wait(timeout=10)
            return x + a
        return f

    def work(k: int) -> None:
        try:
            make(k).trace()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@kp.fusion
def _normalize(x: T[kp.f64, "n"], y: T[kp.f32, "m"]):
    d = x - x.mean()
    return x / x.sum(), y * x.max().astype(kp.f32), (d / (d * d).mean())[None]


def test_full_reduction_outputs_as_long_as_the_input_take_a_grid():
    """``x / x.sum()`` on a 1-D tensor wrote all n outputs from a single block of 512
    threads (one SM of the GPU). Outputs longer than one element are now written by a
    pointwise grid after a combine kernel stored the values they read; so are those of a
    reduction that needs another one first (the variance of ``d``:
    tests/lowering/test_full_reductions.py)."""
    k = Kernels(_normalize)
    grids = {ln.kernel: ln.grid[0] for ln in k.planner.plan((9000,), (5000,)).launches}
    for stage, n in ((0, 9000), (1, 5000), (2, 9000)):  # stage 2: its mean has its own pass
        assert grids[f"_normalize_{stage}_combine0"] == 1
        assert grids[f"_normalize_{stage}_pointwise"] * 256 * 4 >= n, grids
    big = {ln.kernel: ln.grid[0] for ln in k.planner.plan((1 << 30,), (1,)).launches}
    assert big["_normalize_0_pointwise"] >= (1 << 30) // (256 * 4), big
    assert big["_normalize_1_pointwise"] == 1
    rng = np.random.default_rng(3)
    for n, m in [(9000, 3), (2, 4100)]:
        x, y = rng.standard_normal(n) + 3, rng.standard_normal(m).astype(np.float32)
        a, b, c = k(x, y)
        assert_close(a, x / x.sum(), 1e-12, "x / sum")
        assert_close(b, y * np.float32(x.max()), 1e-7, "y * max")
        d = x - x.mean()
        assert_close(c, (d / (d * d).mean())[None], 1e-12, "d / var")
        assert a.shape == (n,) and b.shape == (m,) and c.shape == (1, n)


def test_float32_sqrt_is_ieee_and_float_powers_take_numpys_exact_forms():
    """libdevice's ``__nv_sqrtf`` asks ``__nvvm_reflect("__CUDA_PREC_SQRT")``, which LLVM
    folds to 0: float32 ``kp.sqrt`` compiled to ``sqrt.approx.f32`` (on an H200,
    ``sqrt(5)`` came out 2.2360678, NumPy's is 2.236068). nvcc's default and NumPy's result is
    the correctly rounded ``sqrt.rn.f32``. ``x ** 0.5`` and ``x ** -1`` went through powf
    (up to 2 ulp); NumPy computes them as sqrt and a reciprocal."""
    from kernelpack.lowering import pipeline

    @kp.fusion
    def roots(x: T[kp.f32, "n"], h: T[kp.f16, "n"]):
        return kp.sqrt(x), x ** 0.5, kp.sqrt(h), x ** -1, x ** 2.0, x ** 0.5 + x ** 3.5

    built = pipeline.run(pipeline.new_build(roots, ["sm_80"], None, {}), stop="ptx")
    ptx = built.ptx.decode()
    assert "sqrt.rn.f32" in ptx and "sqrt.approx" not in ptx
    g = roots.trace()
    ops = [g.nodes[nid].op for _, nid in g.outputs]
    assert ops[:5] == ["sqrt", "sqrt", "sqrt", "div", "mul"]
    x = np.array([5.0, 2.0, 0.0, -1.0, np.inf, 1e-30], np.float32)
    h = x.astype(np.float16)
    with np.errstate(all="ignore"):
        refs = (np.sqrt(x), x ** 0.5, np.sqrt(h), x ** -1, x ** 2.0)
        got = Kernels(roots)(x, h)
    for k, (a, r) in enumerate(zip(got, refs)):
        assert a.dtype == r.dtype and np.array_equal(a, r, equal_nan=True), (k, a, r)


def test_complex64_magnitude_takes_no_approximate_square_root():
    """``abs`` of complex64 called libdevice's ``__nv_hypotf``, which also asks
    ``__CUDA_PREC_SQRT`` (folded to 0: ``sqrt.approx.f32``). It is computed in float64 now:
    exact squares, one IEEE square root, one rounding; inf beside NaN stays inf."""
    from kernelpack.lowering import pipeline

    @kp.fusion
    def mag(z: T[kp.c64, "n"], w: T[kp.c128, "n"]):
        return abs(z), abs(w)

    built = pipeline.run(pipeline.new_build(mag, ["sm_80"], None, {}), stop="ptx")
    assert "sqrt.approx.f32" not in built.ptx.decode()
    z = np.array([3 + 4j, 1e30 + 1e30j, 1e-30 - 1e-30j, complex(np.inf, np.nan),
                  complex(np.nan, 1), -2.5j, 0j, 1.1 + 2.3j], np.complex64)
    a, b = Kernels(mag)(z, z.astype(np.complex128))
    assert a.dtype == np.float32
    assert np.array_equal(a, np.abs(z), equal_nan=True), (a, np.abs(z))
    assert np.allclose(b, np.abs(z.astype(np.complex128)), rtol=1e-15, atol=0, equal_nan=True)
