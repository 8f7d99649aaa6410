"""Regressions (review 13): ``kp.where`` and ``kp.pow`` on plain Python numbers.

``kp.exp(1.0)`` and ``kp.maximum(1.0, 2)`` computed on the host (review 12), but
``kp.where(True, 1.0, 2.0)`` raised ``TypeError: expected an int, a symbol name or an expression
(got 1.0)`` (the integer select on sizes), and ``kp.pow(2.0, 3.0)`` ``TraceError: kp operations
need at least one traced tensor``. Now, with NumPy as the reference (``np.where`` and
``np.power`` of Python scalars):

- ``kp.where(cond, a, b)`` with a plain condition and int/float branches, one a float, is
  ``float(a) if cond else float(b)`` (NumPy's truth: NaN is true, -0.0 false); int and dim
  branches keep the symbolic select (an Expr), and a float beside a symbolic condition or size is
  a TraceError saying what to write (a traced tensor operand, or a float computed from a
  selected size), inside a fusion and out.
- ``kp.pow(a, b)`` of two plain numbers: int ** non-negative int is the exact int (NumPy's
  int64), a negative int exponent NumPy's error, a result or operand outside int64 an error
  (NumPy wraps the result silently; the DSL refuses ints beyond int64 everywhere); with a float,
  NumPy's float64 (inf, -inf, nan where Python's ``**`` raises or gives a complex).

Bools are not plain numbers (the rule of :mod:`kernelpack._host_math`); traced tensors and the
integer select on sizes are unchanged.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.expr import Expr, sym

sys.path.insert(0, str(Path(__file__).parent))
# exact for nan, infinities and signed zeros, within 4 ulp elsewhere (NumPy's power loops round
# some results differently from C's correctly rounded pow: np.power(0.1, -3.0) is
# 999.9999999999998)
from test_review12_scalar_math import _same  # noqa: E402

T = kp.Tensor
INF, NAN = math.inf, math.nan


def _out_dtypes(f: kp.fusion) -> list[str]:
    g = f.trace()
    return [g.nodes[nid].dtype.name for _, nid in g.outputs]


# ---- kp.where ---------------------------------------------------------------------------------
CONDS = [True, False, 1, 0, -3, 0.0, -0.0, 0.5, NAN, INF, -INF, 5e-324, 1 > 0, 2 < 1,
         np.True_, np.False_, np.float64(0.0), np.float32(NAN), np.int64(0), np.int32(7)]
FLOAT_BRANCHES = [(1.0, 2.0), (1, 2.0), (1.0, 2), (-0.0, 0.0), (0, -0.0), (NAN, 1), (INF, -INF),
                  (2 ** 53 + 1, 0.5), (-(2 ** 63), 1e300), (np.float64(1.5), 2), (5e-324, NAN)]


@pytest.mark.parametrize("a, b", FLOAT_BRANCHES)
def test_where_of_plain_numbers_with_a_float_is_np_where_as_a_python_float(a, b) -> None:
    for cond in CONDS:
        _same(kp.where(cond, a, b), float(np.where(cond, a, b)),
              f"kp.where({cond!r}, {a!r}, {b!r})")


def test_the_cases_of_the_brief() -> None:
    assert kp.where(True, 1.0, 2.0) == 1.0
    assert kp.where(1 > 0, 1.0, 2.0) == 1.0
    assert kp.where(1 < 0, 1.0, 2) == 2.0
    assert kp.where(NAN, 1.0, 2.0) == 1.0 == float(np.where(NAN, 1.0, 2.0))  # NaN is true
    assert kp.where(-0.0, 1.0, 2.0) == 2.0
    got = kp.where(False, 1.0, 3)
    assert type(got) is float and got == 3.0  # the int branch as NumPy's float64


def test_where_of_int_branches_keeps_the_symbolic_select() -> None:
    """Today's Exprs, unchanged; a float or NumPy condition now selects as NumPy's truth
    (``kp.where(0.5, 1, 2)`` was the TypeError on 0.5)."""
    assert kp.where(True, 1, 2) == Expr("const", (), 1)
    assert kp.where(0, 4, 8) == Expr("const", (), 8)
    n = sym("n")
    got = kp.where(n > 3, 4, 8)
    assert isinstance(got, Expr) and got.op == "select"
    assert kp.where(n > 3, n, 8).op == "select"
    for cond in (0.5, 0.0, NAN, np.True_, np.False_, np.float32(0.0)):
        want = int(np.where(cond, 1, 2))
        assert kp.where(cond, 1, 2) == Expr("const", (), want), cond


def test_where_of_sizes_in_a_fusion_is_still_a_size() -> None:
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        k = kp.where(x.shape[0] > 3, 4, 8)
        assert isinstance(k, Expr) and k.op == "select"
        return x * k, kp.where(x > 0, x, 0.0), kp.where(x.shape[0] > 3, x, 2.0)

    assert _out_dtypes(f) == ["float32"] * 3


def test_a_host_where_is_a_weak_scalar_in_a_fusion() -> None:
    """A Python float, like the literal it replaces: ``x_f32 * kp.where(c, 0.5, 2.0)`` stays
    float32 (a strong float64 would be a dtype mismatch)."""
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x * kp.where(True, 0.5, 2.0), x + kp.where(np.float64(1.0) > 2, 1, 0.25)

    assert _out_dtypes(f) == ["float32", "float32"]


def test_a_symbolic_condition_with_float_branches_says_what_to_write() -> None:
    """A traced 0-d where would be a strong float64 (``x_f32 * it`` a dtype mismatch) where the
    host's is a weak Python float; the TraceError names the forms that work, which trace."""
    @kp.fusion
    def bad(x: T[kp.f32, "n"]):
        return x * kp.where(x.shape[0] > 3, 1.0, 2.0)

    with pytest.raises(kp.TraceError, match=r"kp\.where: a symbolic condition or size selects "
                                            r"only between ints and dims .*got cond=.*n > 3.*"
                                            r"a=1\.0, b=2\.0.*kp\.where\(cond, x, 2\.0\).*"
                                            r"kp\.where\(x\.shape\[0\] > 3, 2, 4\) \* 0\.5"):
        bad.trace()

    @kp.fusion
    def good(x: T[kp.f32, "n"]):
        return x * (kp.where(x.shape[0] > 3, 2, 4) * 0.5), kp.where(x.shape[0] > 3, x, 2.0)

    assert _out_dtypes(good) == ["float32", "float32"]
    with pytest.raises(kp.TraceError, match="symbolic condition or size"):
        kp.where(sym("n") > 3, 1, 2.0)  # outside a fusion too
    with pytest.raises(kp.TraceError, match="symbolic condition or size"):
        kp.where(True, sym("n"), 2.0)  # a size beside a float
    with pytest.raises(kp.TraceError, match=r"symbolic .*a=1\.0, b=<an int of 16610 bits>"):
        kp.where(sym("n") > 3, 1.0, 10 ** 5000)  # no str() of the int (refused past 4300 digits)


@pytest.mark.parametrize("a, b", [(True, 2.0), (1.5, False), (np.float32(1.5), 2), (1j, 2.0),
                                  (None, 1)])
def test_other_branches_are_trace_errors_not_bare_type_errors(a, b) -> None:
    with pytest.raises(kp.TraceError, match=r"kp\.where: without a traced tensor .*\(not bools\)"):
        kp.where(True, a, b)


def test_where_with_an_int_beyond_float64_names_kp_where() -> None:
    with pytest.raises(OverflowError):
        np.where(True, 1.0, 10 ** 400)
    with pytest.raises(kp.TraceError, match=r"kp\.where: an int too large for a float64"):
        kp.where(True, 1.0, 10 ** 400)


# ---- kp.pow -----------------------------------------------------------------------------------
INT_BASES = [0, 1, -1, 2, -2, 3, -3, 7, 10, -10, 255, 2 ** 31, -(2 ** 31), 2 ** 62, 2 ** 63 - 1,
             -(2 ** 63)]
INT_EXPONENTS = [0, 1, 2, 3, 5, 10, 18, 19, 31, 32, 40, 62, 63, 64, 100, 2 ** 62, 2 ** 63 - 1]


def test_int_to_a_nonnegative_int_is_np_power_exactly_or_refused_beyond_int64() -> None:
    """The exact int where NumPy's int64 is exact; where the true power leaves int64 (NumPy
    wraps silently: ``np.power(2, 63)`` is ``-2**63``), a TraceError naming kp.pow."""
    for a, b in itertools.product(INT_BASES, INT_EXPONENTS):
        fits = abs(a) <= 1 or (b < 64 and -(2 ** 63) <= a ** b < 2 ** 63)
        if fits:
            got = kp.pow(a, b)
            assert type(got) is int and got == int(np.power(a, b)), (a, b)
        else:
            with pytest.raises(kp.TraceError, match=r"kp\.pow: .* is outside int64"):
                kp.pow(a, b)
    assert kp.pow(2, 3) == 8 == np.power(2, 3) and type(kp.pow(2, 3)) is int
    assert kp.pow(-2, 63) == -(2 ** 63) == np.power(-2, 63)
    assert kp.pow(0, 0) == 1 and kp.pow(-1, 2 ** 63 - 1) == -1 == np.power(-1, 2 ** 63 - 1)
    with pytest.raises(kp.TraceError, match=r"kp\.pow: 2 \*\* 63 is outside int64"):
        kp.pow(2, 63)


@pytest.mark.parametrize("a, b", [(2, -1), (1, -1), (-1, -1), (0, -1), (10, -(2 ** 63))])
def test_int_to_a_negative_int_is_numpys_error(a, b) -> None:
    with pytest.raises(ValueError, match="Integers to negative integer powers are not allowed"):
        np.power(a, b)
    with pytest.raises(kp.TraceError, match=rf"kp\.pow: integers to negative integer powers are "
                                            rf"not allowed, as in NumPy \(got {a} \*\* {b}\)"):
        kp.pow(a, b)


@pytest.mark.parametrize("a, b", [(2 ** 63, 1), (1, 2 ** 63), (-(2 ** 63) - 1, 0),
                                  (10 ** 5000, 2)], ids=["2**63", "exp 2**63", "-2**63-1",
                                                         "10**5000"])
def test_int_operands_beyond_int64_are_refused_as_numpy_refuses_them(a, b) -> None:
    with pytest.raises(OverflowError):
        np.power(a, b)
    with pytest.raises(kp.TraceError, match=r"kp\.pow: int operands must fit int64"):
        kp.pow(a, b)


FLOATS = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 1 / 3, -8.0, 10.0, -10.0, 0.1,
          1.5, -1.5, 400.0, 401.0, -401.0, 1023.0, 1024.0, -1074.0, -1075.0, 1e300, -1e300,
          5e-324, 2.0 ** 53, -(2.0 ** 53 + 1), INF, -INF, NAN]
INTS = [0, 1, -1, 2, -2, 3, -3, 10, 401, -401, 64, 2 ** 62, -(2 ** 63)]


# NumPy 2.3 made np.power(x, 0.5) np.sqrt(x) (-0.0 stays -0.0, -inf is nan), as kp.pow and the
# traced ``x ** 0.5`` are; an older NumPy (every NumPy of Python 3.10) answers C's pow() there
# (0.0, inf), so the reference for that exponent is np.sqrt itself.
with np.errstate(invalid="ignore"):
    NUMPY_HALF_POWER_IS_SQRT = math.copysign(1.0, float(np.power(-0.0, 0.5))) < 0


def _np_power(a: float, b: float) -> float:
    """float64 np.power as NumPy 2.3 and later compute it (see above)."""
    if b == 0.5 and not NUMPY_HALF_POWER_IS_SQRT and not isinstance(b, int):
        return float(np.sqrt(np.float64(a)))
    return float(np.power(a, b))


def test_pow_with_a_float_is_np_power_float64() -> None:
    pairs = itertools.chain(itertools.product(FLOATS, FLOATS), itertools.product(FLOATS, INTS),
                            itertools.product(INTS, FLOATS))
    with np.errstate(all="ignore"):
        for a, b in pairs:
            _same(kp.pow(a, b), _np_power(a, b), f"kp.pow({a!r}, {b!r})")


@pytest.mark.parametrize("a, b, want", [
    (0.0, -1, INF), (-0.0, -1, -INF), (-0.0, -2, INF), (-0.0, -1.5, INF), (0.0, -INF, INF),
    (-8.0, 1 / 3, NAN), (10.0, 400, INF), (-10.0, 401, -INF), (-10.0, 400, INF),
    (10.0, -400, 0.0), (-10.0, -401, -0.0), (1.0, NAN, 1.0), (NAN, 0, 1.0), (NAN, -0.0, 1.0),
    (-1.0, INF, 1.0), (-1.0, -INF, 1.0), (-INF, 3, -INF), (-INF, -3, -0.0), (-INF, 0.5, NAN),
    (-0.0, 0.5, -0.0), (-4.0, 0.5, NAN), (2, 0.5, math.sqrt(2.0)), (2.0, 3.0, 8.0),
    (2 ** 63, 2.0, 2.0 ** 126), (-2.0, 1025, -INF), (2.0, -1075, 0.0),
])
def test_the_special_values_of_the_brief(a, b, want) -> None:
    """IEEE results where Python's ``**`` raises (ZeroDivisionError, OverflowError) or gives a
    complex, and :func:`math.pow` raises; np.power's ``** 0.5`` is ``sqrt`` (-0.0 stays -0.0,
    -inf is nan), as the traced ``x ** 0.5``."""
    with np.errstate(all="ignore"):
        numpy = _np_power(a, b)
    _same(numpy, want, f"np.power({a!r}, {b!r})")  # the table itself is NumPy's
    _same(kp.pow(a, b), want, f"kp.pow({a!r}, {b!r})")


def test_pow_with_an_int_beyond_float64_names_kp_pow() -> None:
    with pytest.raises(OverflowError):
        np.power(10 ** 400, 0.5)
    with pytest.raises(kp.TraceError, match=r"kp\.pow: an int too large for a float64"):
        kp.pow(10 ** 400, 0.5)


def test_a_host_pow_is_a_weak_scalar_in_a_fusion_and_traced_pow_is_unchanged() -> None:
    @kp.fusion
    def f(x: T[kp.f32, "n"], i: T[kp.i32, "n"]):
        return x * kp.pow(2.0, 0.5), i * kp.pow(2, 3), kp.pow(x, 2.0), kp.pow(i, 2), x ** 3

    assert _out_dtypes(f) == ["float32", "int32", "float32", "int32", "float32"]


def test_bools_are_not_plain_numbers() -> None:
    """As kp.exp(True): a bool is refused on the host, not read as 1 (the rule of
    kernelpack._host_math); a traced bool tensor still takes np.power's int64."""
    for a, b in [(True, 2), (2.0, True), (True, False)]:
        with pytest.raises(kp.TraceError):
            kp.pow(a, b)


def test_pow_of_a_dim_in_a_fusion_is_the_operator() -> None:
    """``kp.pow(x.shape[0], 2)`` said "kp operations need at least one traced tensor" where
    ``x.shape[0] ** 2`` traces (a dim in a fusion is a traced int64 value): both are one graph."""
    @kp.fusion
    def with_pow(x: T[kp.f32, "n"]):
        return x * kp.pow(x.shape[0], 2), x * kp.pow(2, x.shape[0] % 3)

    @kp.fusion
    def with_operator(x: T[kp.f32, "n"]):
        return x * x.shape[0] ** 2, x * 2 ** (x.shape[0] % 3)

    def nodes(f: kp.fusion) -> list[tuple]:
        g = f.trace()
        return [(n.op, n.dtype.name, n.shape, n.inputs, n.attrs) for n in g.nodes]

    assert nodes(with_pow) == nodes(with_operator)
    assert _out_dtypes(with_pow) == ["float32", "float32"]
    with pytest.raises(kp.TraceError, match="at least one traced tensor"):
        kp.pow(kp.sym("n"), 2)  # outside a fusion a dim is no value to raise
