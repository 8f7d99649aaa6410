"""Regressions (review 12): kp's math functions on plain Python numbers.

``c = kp.sqrt(2.0 / math.pi)`` in a tanh-form GELU, written the way NumPy reads
(``np.sqrt(2 / np.pi)`` is a number), was ``TraceError: kp.sqrt: expects a traced tensor``.
Each elementwise math function now gives the float64 result of a Python ``int``/``float``,
computed on the host with NumPy's IEEE semantics (nan/inf where ``math`` raises), inside and
outside a fusion; the result is a plain Python float, so it stays a *weak* scalar in the DSL's
promotion (``x_f32 * kp.sqrt(2.0)`` is float32, as ``x_f32 * 1.4142135623730951`` is). Complex
numbers and ints beyond float64 are TraceErrors naming the op; dims keep their behaviour.
"""


import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.tracing import Value

T = kp.Tensor
INF, NAN = math.inf, math.nan

# The float64 reference of each op, as NumPy computes it (NumPy has no rsqrt, sigmoid or erf:
# rsqrt is 1 / np.sqrt, sigmoid the kernels' 1 / (1 + np.exp(-x)), erf below).
REF: dict[str, Callable[[np.float64], np.float64]] = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
    "rsqrt": lambda v: 1.0 / np.sqrt(v), "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "tanh": np.tanh, "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "floor": np.floor, "ceil": np.ceil,
}
OPS = [*REF, "erf"]

FLOATS = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 2.5, -2.5, 3.7, -3.7, 0.1, math.pi,
          2.0 / math.pi, 1e-300, 5e-324, -5e-324, 1e-8, 20.0, -20.0, 1e300, -1e300, 709.0,
          710.0, -745.5, 1000.0, -1000.0, 1023.5, 1024.0, -1075.0, 1e22, 1e16 + 0.5,
          4503599627370495.5, INF, -INF, NAN]
INTS = [0, 1, -1, 2, 3, 7, -5, 1000, -1000, 2 ** 53 + 1, 10 ** 20]


def _same(got: float, want: float, what: str) -> None:
    """Exact for nan, infinities and zeros (with their sign); within 4 ulp elsewhere (NumPy's
    SIMD loops and the C library may round transcendental functions differently)."""
    assert type(got) is float, f"{what}: {type(got).__name__} is not a Python float"
    if math.isnan(want) or math.isinf(want) or want == 0:
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)), \
            f"{what}: got {got!r}, NumPy {want!r}"
    else:
        assert abs(got - want) <= 4 * math.ulp(want), f"{what}: got {got!r}, NumPy {want!r}"


def _numpy(op: str, v: float) -> float:
    with np.errstate(all="ignore"):
        return float(REF[op](np.float64(v)))


@pytest.mark.parametrize("op", list(REF))
def test_math_of_a_float_matches_numpy_float64(op: str) -> None:
    fn = getattr(kp, op)
    for v in FLOATS:
        _same(fn(v), _numpy(op, v), f"kp.{op}({v!r})")


@pytest.mark.parametrize("op", [op for op in REF if op not in ("floor", "ceil")])
def test_math_of_an_int_is_the_float64_result(op: str) -> None:
    fn = getattr(kp, op)
    for v in INTS:
        _same(fn(v), _numpy(op, float(v)), f"kp.{op}({v!r})")


def test_the_special_values_of_the_brief() -> None:
    """The IEEE results where Python's ``math`` raises or would differ, one by one."""
    cases = [
        ("sqrt", -1.0, NAN), ("sqrt", -0.0, -0.0), ("sqrt", -INF, NAN), ("sqrt", INF, INF),
        ("log", 0.0, -INF), ("log", -0.0, -INF), ("log", -1.0, NAN), ("log", 0, -INF),
        ("log2", 0.0, -INF), ("log2", -1, NAN), ("log2", INF, INF), ("log2", 8, 3.0),
        ("exp", 1000.0, INF), ("exp", -1000.0, 0.0), ("exp", -INF, 0.0), ("exp", 710, INF),
        ("exp2", 1024.0, INF), ("exp2", -1075.0, 0.0), ("exp2", 10, 1024.0),
        ("exp2", -1074, 5e-324),
        ("rsqrt", 0.0, INF), ("rsqrt", -0.0, -INF), ("rsqrt", -1.0, NAN), ("rsqrt", INF, 0.0),
        ("rsqrt", 4, 0.5),
        ("sigmoid", 1000.0, 1.0), ("sigmoid", -1000.0, 0.0), ("sigmoid", INF, 1.0),
        ("sigmoid", -INF, 0.0), ("sigmoid", 0, 0.5),
        ("tanh", INF, 1.0), ("tanh", -INF, -1.0), ("erf", INF, 1.0), ("erf", -INF, -1.0),
        ("erf", 0.0, 0.0), ("erf", -0.0, -0.0),
        ("sin", INF, NAN), ("cos", -INF, NAN), ("tan", INF, NAN),
        ("floor", 3.5, 3.0), ("floor", -0.5, -1.0), ("floor", INF, INF), ("floor", NAN, NAN),
        ("ceil", -0.5, -0.0), ("ceil", 0.5, 1.0), ("ceil", -INF, -INF), ("ceil", NAN, NAN),
    ]
    for op, v, want in cases:
        _same(getattr(kp, op)(v), want, f"kp.{op}({v!r})")
    for op in OPS:  # nan in, nan out, for every op
        assert math.isnan(getattr(kp, op)(NAN)), op


def test_erf_against_known_values() -> None:
    """NumPy has no erf; these are the float64 values of erf (as scipy.special.erf gives)."""
    for v, want in [(0.5, 0.5204998778130465), (1.0, 0.8427007929497149),
                    (-2.0, -0.9953222650189527), (6.0, 1.0), (1e-10, 1.1283791670955126e-10),
                    (3, 0.9999779095030014)]:
        _same(kp.erf(v), want, f"kp.erf({v!r})")


def test_floor_and_ceil_keep_an_int_and_give_floats_of_floats() -> None:
    """NumPy 2 keeps an integer dtype through floor/ceil (``np.floor(3)`` is ``int64(3)``), and
    so does the traced op on an int tensor: an int stays the int (a weak int in a fusion). A
    float gives a float, its sign kept (``np.ceil(-0.5)`` is ``-0.0``)."""
    for op in ("floor", "ceil"):
        for v in INTS + [10 ** 400]:
            got = getattr(kp, op)(v)
            assert type(got) is int and got == v, (op, v)
            if abs(v) < 2 ** 63:
                assert got == getattr(np, op)(v)
        assert type(getattr(kp, op)(3.0)) is float


@pytest.mark.parametrize("op", OPS)
def test_no_exception_escapes_for_any_float(op: str) -> None:
    """A sweep of bit patterns (subnormals, huge values, every exponent): always a float."""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 2 ** 64, size=400, dtype=np.uint64)
    values = bits.view(np.float64).tolist() + [sys.float_info.max, -sys.float_info.max,
                                               sys.float_info.min, 88.72, -88.72]
    fn = getattr(kp, op)
    for v in values:
        got = fn(v)
        assert type(got) is float, (op, v)
        if op in REF:
            _same(got, _numpy(op, v), f"kp.{op}({v!r})")


@pytest.mark.parametrize("op", OPS)
def test_inside_a_fusion_the_same_float(op: str) -> None:
    seen: list[object] = []

    @kp.fusion
    def f(x: T[kp.f32, "n"]):  # type: ignore[no-untyped-def]
        seen.extend(getattr(kp, op)(v) for v in (0.75, -2.0, 3, INF, NAN, 0.0))
        return x

    f.trace()
    outside = [getattr(kp, op)(v) for v in (0.75, -2.0, 3, INF, NAN, 0.0)]
    assert [type(v) for v in seen] == [int if op in ("floor", "ceil") and v == 3 else float
                                       for v in (0.75, -2.0, 3, INF, NAN, 0.0)]
    assert [repr(v) for v in seen] == [repr(v) for v in outside]


@pytest.mark.parametrize("dt", [kp.float16, kp.float32, kp.float64], ids=str)
def test_the_result_is_a_weak_scalar(dt: kp.DType) -> None:
    """``x * kp.sqrt(2.0)`` keeps x's dtype, exactly as the literal does; and the constant the
    graph holds is the same float."""

    @kp.fusion
    def f(x: T[dt, "n"]):  # type: ignore[no-untyped-def]
        return (x * kp.sqrt(2.0), x * 1.4142135623730951, kp.exp(-1.0) + x,
                kp.maximum(x, kp.log(0.5)), x * kp.floor(2.5))

    g = f.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [dt] * 5


def test_int_tensor_times_a_host_float_is_as_with_the_literal() -> None:
    @kp.fusion
    def f(i: T[kp.i32, "n"]):  # type: ignore[no-untyped-def]
        return i * kp.sqrt(2.0), i * 1.4142135623730951, i + kp.floor(3)

    g = f.trace()
    got = [g.nodes[nid].dtype for _, nid in g.outputs]
    assert got[0] == got[1] and got[2] == kp.int32


def test_bool_complex_and_huge_ints_are_trace_errors() -> None:
    for op in OPS:
        fn = getattr(kp, op)
        with pytest.raises(kp.TraceError, match=rf"{op}: expects a traced tensor \(got True\)"):
            fn(True)
        with pytest.raises(kp.TraceError, match=rf"kp\.{op}: a Python complex number "
                           rf"\(\(1\+2j\)\).*kp\.complex\(re, im\)"):
            fn(1 + 2j)
        if op in ("floor", "ceil"):
            continue
        with pytest.raises(kp.TraceError, match=rf"kp\.{op}: an int too large for a float64 "
                           rf"\(got one of magnitude 1e399 or more, 1329 bits\)"):
            fn(10 ** 400)
        # past 4300 digits str() of an int raises ValueError: the message must not need it
        with pytest.raises(kp.TraceError, match=rf"kp\.{op}: .* 16610 bits"):
            fn(-10 ** 5000)


def test_dims_keep_their_behaviour() -> None:
    """``kp.sqrt(x.shape[0])`` is still a traced float64 inside a fusion (weak beside float32)
    and a TraceError outside one."""

    @kp.fusion
    def f(x: T[kp.f32, "n"]):  # type: ignore[no-untyped-def]
        s = kp.sqrt(x.shape[0])
        assert isinstance(s, Value) and s.dtype == kp.float64
        return x * s

    g = f.trace()
    assert [g.nodes[nid].dtype for _, nid in g.outputs] == [kp.float32]
    with pytest.raises(kp.TraceError, match=r"kp\.exp: expects a traced tensor \(got "):
        kp.exp(kp.sym("n"))


def test_abs_minimum_maximum_of_plain_floats() -> None:
    """``kp.abs(-2.5)`` was a TraceError and ``kp.maximum(1.5, 2)`` a bare TypeError from the
    size expressions; on plain numbers they are NumPy's abs/maximum/minimum (NaN-propagating,
    the second operand on a tie). Ints alone stay symbolic sizes, as before."""
    assert kp.abs(-2.5) == 2.5 and repr(kp.abs(-0.0)) == "0.0" and kp.abs(-INF) == INF
    assert math.isnan(kp.abs(NAN)) and kp.abs(-3) == 3
    for a, b in [(1.5, 2), (2, 1.5), (-0.0, 0.0), (0.0, -0.0), (INF, -INF), (NAN, 1.0),
                 (1, NAN), (-1e300, 5e-324)]:
        with np.errstate(all="ignore"):
            for kp_fn, np_fn in ((kp.maximum, np.maximum), (kp.minimum, np.minimum),
                                 (kp.max, np.maximum), (kp.min, np.minimum)):
                got = kp_fn(a, b)
                _same(got, float(np_fn(np.float64(a), np.float64(b))), f"{kp_fn}({a}, {b})")
    assert isinstance(kp.maximum(1, 2), kp.Expr)
    with pytest.raises(kp.TraceError, match=r"kp\.minimum: an int too large for a float64"):
        kp.minimum(0.5, 10 ** 400)


# ---- the GELU of the brief, end to end ---------------------------------------------------------

def _gelus(dt: kp.DType) -> tuple[kp.fusion, kp.fusion]:
    """The tanh-form GELU written with ``kp.sqrt(2.0 / math.pi)`` and with the literal; both
    named ``gelu`` so their kernels' names (and so their PTX) can be compared byte for byte."""

    def host_constant() -> kp.fusion:
        @kp.fusion
        def gelu(x: T[dt, "n"]):  # type: ignore[no-untyped-def]
            c = kp.sqrt(2.0 / math.pi)
            return 0.5 * x * (1 + kp.tanh(c * (x + 0.044715 * x ** 3)))
        return gelu

    def literal() -> kp.fusion:
        @kp.fusion
        def gelu(x: T[dt, "n"]):  # type: ignore[no-untyped-def]
            return 0.5 * x * (1 + kp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
        return gelu

    return host_constant(), literal()


def test_gelu_constant_is_numpys() -> None:
    assert kp.sqrt(2.0 / math.pi) == float(np.sqrt(2 / np.pi)) == 0.7978845608028654


@pytest.mark.parametrize("dt", [kp.float32, kp.float64], ids=str)
def test_gelu_with_a_host_constant_compiles_to_the_literals_ptx(dt: kp.DType) -> None:
    ours, theirs = _gelus(dt)
    a, b = (kp.compile(f, targets=["sm_80", "ptx"]) for f in (ours, theirs))
    images = [[(img.kind, str(img.arch), img.data) for m in c.modules for img in m.images]
              for c in (a, b)]
    assert images[0] and any(kind == "ptx" for kind, _, _ in images[0])
    assert images[0] == images[1]


def test_gelu_with_a_host_constant_runs_like_the_literal_on_the_emulator() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from lowering.simt import Kernels, assert_close
    finally:
        sys.path.pop(0)
    ours, theirs = _gelus(kp.float32)
    x = np.linspace(-6, 6, 97, dtype=np.float32)
    (got,), (lit,) = Kernels(ours)(x), Kernels(theirs)(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, lit)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert_close(got, ref.astype(np.float32), 2e-6, "gelu")
