"""Review 31: special floating-point values through every math op, on the GPU.

On the CPU earlier reviews checked the math through an emulator that calls the host's libm;
on the GPU the same ops go through libdevice and PTX instructions (approximate ``ex2``,
``rsqrt``, ``rcp``, ``div``; flush-to-zero variants; ``min``/``max``; saturating float to
integer conversions), whose behaviour on special values can differ. Each test here feeds a
vector of special inputs (±0, ±inf, NaN, the smallest and largest subnormal, the smallest
normal, the largest finite, 1 ± eps, huge arguments to sin/cos/tan, arguments at the
overflow and underflow edges of exp/exp2, ordinary values) through one dtype's ops and
compares element by element with a NumPy reference:

* NaN where the reference is NaN, the same infinity where it is infinite;
* a zero of the reference's sign where the reference is zero (IEEE 754 defines the sign of
  every zero these ops produce; the one place NumPy itself does not, ``maximum``/``minimum``
  of two zeros of different signs, is not checked);
* otherwise at most ``tol`` units in the last place of the dtype, where the unit at a
  subnormal reference is the subnormal spacing: a subnormal result flushed to zero (or a
  subnormal input flushed before use) is many such units away and fails. kernelpack does
  not document flushing subnormals anywhere, so none is allowed.

References: float64 inputs go through NumPy in float64. float32, float16 and bfloat16
inputs are widened exactly to float64, NumPy computes in float64 and the result is rounded
once to the dtype (round to nearest even); for +, -, *, /, sqrt that is the correctly
rounded result IEEE 754 asks for, and for the transcendental functions it is within half a
unit of the true value. The README says float16 and bfloat16 compute in float32 and round
to their own dtype after every op, which is within one unit of that reference.
NumPy's floor division and remainder are computed by NumPy in the dtype itself (bfloat16:
in float32 on the exact bfloat16 values, rounded once), since their special cases are
NumPy's own definitions.

Tolerances (units in the last place of the dtype): exact ops (abs, unary minus, floor,
ceil, sqrt, x ** 2, x ** -1, x ** 0.5, + - * /, //, %, min, max, comparisons, where): 0.
float16/bfloat16 math: 1 (a float32 result within a few float32 units, rounded once more). float32/float64 math:
the maximum error the CUDA Math API documents for the libdevice function (expf 2, exp2f 2,
logf 1, log2f 1, rsqrtf 2, sinf/cosf 2, tanf 4, tanhf 2, erff 2, powf 4; double exp/log 1,
sin/cos/tan 2, tanh 2, erf 2, pow 2, rsqrt 1) plus 1 for the reference's own rounding;
sigmoid, built from exp, an add and a reciprocal, 4.

Every test needs torch and a CUDA device; the programs are compiled once per module for the
device's own architecture, saved to bytes and loaded back, as a deployment would.
"""

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu


# --------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class Spec:
    name: str           # torch / kernelpack name
    kp: object          # kernelpack dtype
    bits: int           # significand precision p (with the hidden bit)
    emin: int           # exponent of the smallest normal
    emax: int           # exponent of the largest finite

    @property
    def min_sub(self) -> float:
        return math.ldexp(1.0, self.emin - self.bits + 1)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def max_sub(self) -> float:
        return self.min_normal - self.min_sub

    @property
    def max_finite(self) -> float:
        return math.ldexp(2.0 - math.ldexp(1.0, 1 - self.bits), self.emax)

    @property
    def eps(self) -> float:
        return math.ldexp(1.0, 1 - self.bits)


SPECS = {
    "float16": Spec("float16", kp.float16, 11, -14, 15),
    "bfloat16": Spec("bfloat16", kp.bfloat16, 8, -126, 127),
    "float32": Spec("float32", kp.float32, 24, -126, 127),
    "float64": Spec("float64", kp.float64, 53, -1022, 1023),
}
FLOATS = list(SPECS)


def _to_bf16(v: np.ndarray) -> np.ndarray:
    """float64 values rounded once to bfloat16 (round to nearest even; no double rounding
    through float32), returned as float64."""
    out = np.array(v, dtype=np.float64)
    for i, x in enumerate(out.flat):
        if not math.isfinite(x) or x == 0:
            continue
        e = math.frexp(abs(x))[1] - 1                     # floor(log2 |x|)
        q = math.ldexp(1.0, max(e, -126) - 7)             # the bfloat16 spacing there
        r = math.copysign(round(x / q) * q, x)            # exact scaling; round half even
        out.flat[i] = r if abs(r) <= SPECS["bfloat16"].max_finite else math.copysign(math.inf, x)
    return out


def rnd(values, spec: Spec) -> np.ndarray:
    """float64 values rounded once to the dtype (returned as float64)."""
    v = np.asarray(values, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec.name == "float64":
            return v.copy()
        if spec.name == "float32":
            return v.astype(np.float32).astype(np.float64)
        if spec.name == "float16":
            return v.astype(np.float16).astype(np.float64)
        return _to_bf16(v)


def ulp(ref: np.ndarray, spec: Spec) -> np.ndarray:
    """The spacing of the dtype at |ref| (the subnormal spacing below the smallest normal)."""
    a = np.abs(np.asarray(ref, dtype=np.float64))
    a = np.where(np.isfinite(a), a, 0.0)
    _, e = np.frexp(a)                         # a = m * 2**e, m in [0.5, 1)
    e = np.maximum(e - 1, spec.emin)
    e = np.where(a == 0, spec.emin, e)
    return np.ldexp(1.0, e - spec.bits + 1)


def describe(v: float) -> str:
    return f"{float(v)!r} ({float(v).hex()})"


def mismatches(what: str, inputs: list, got, ref, spec: Spec, tol: float,
               zero_sign=None) -> list:
    """Element-by-element comparison; one line per failing element."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    units = ulp(ref, spec)
    bad = []
    for i in range(ref.size):
        r, g = ref.flat[i], got.flat[i]
        if math.isnan(r):
            ok = math.isnan(g)
        elif math.isinf(r):
            ok = g == r
        elif not math.isfinite(g):
            ok = False
        else:
            ok = abs(g - r) <= tol * units.flat[i]
            check_sign = True if zero_sign is None else bool(zero_sign[i])
            if ok and r == 0 and g == 0 and check_sign:
                ok = math.copysign(1.0, g) == math.copysign(1.0, r)
        if not ok:
            args = ", ".join(describe(float(a[i])) for a in inputs)
            err = ("" if not (math.isfinite(r) and math.isfinite(g))
                   else f", {abs(g - r) / units.flat[i]:.3g} ulp")
            bad.append(f"{what}[{spec.name}]({args}) = {describe(float(g))}, "
                       f"expected {describe(float(r))} (tol {tol} ulp{err})")
    return bad


def _np(f, *args):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*args)


# --------------------------------------------------------------------------- the device


class F:
    """A float input: float64 values that the dtype holds exactly."""

    def __init__(self, spec: Spec, values):
        self.spec = spec
        self.values = np.asarray(values, dtype=np.float64)
        exact = rnd(self.values, spec)
        same = (exact == self.values) | (np.isnan(exact) & np.isnan(self.values))
        assert same.all(), f"test bug: {spec.name} input not exact: {self.values[~same]}"


class Gpu:
    """Compiles each fusion once for this device, saves and loads it, launches it."""

    def __init__(self, torch):
        self.torch = torch
        major, minor = torch.cuda.get_device_capability()
        self.target = f"sm_{major}{minor}"
        self.programs = {}

    def program(self, fusion):
        if fusion.name not in self.programs:
            c = kp.compile(fusion, targets=[self.target])
            self.programs[fusion.name] = kp.load(kp.save([c], None))[fusion.name]
        return self.programs[fusion.name]

    def to_device(self, a):
        torch = self.torch
        if isinstance(a, F):
            t = torch.tensor(a.values, dtype=torch.float64).to(getattr(torch, a.spec.name))
            back = t.double().numpy()
            same = (back == a.values) | (np.isnan(back) & np.isnan(a.values))
            same &= (np.signbit(back) == np.signbit(a.values)) | np.isnan(a.values)  # NaN: any sign
            assert same.all(), f"test bug: torch changed {a.spec.name} inputs {a.values[~same]}"
            return t.cuda()
        a = np.ascontiguousarray(a)
        if a.dtype.kind == "u" and a.itemsize > 1:
            # torch's uint16/32/64 are shell dtypes: cross NumPy as the signed twin, view back
            signed = np.dtype(f"i{a.itemsize}")
            return torch.from_numpy(a.view(signed)).view(getattr(torch, a.dtype.name)).cuda()
        return torch.from_numpy(a).cuda()

    def to_host(self, t) -> np.ndarray:
        torch = self.torch
        t = t.cpu()
        if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            return t.double().numpy()
        for bits in (16, 32, 64):
            if t.dtype == getattr(torch, f"uint{bits}", None):
                return t.view(getattr(torch, f"int{bits}")).numpy().view(f"u{bits // 8}")
        return t.numpy()

    def run(self, fusion, *inputs) -> list:
        out = self.program(fusion)(*[self.to_device(a) for a in inputs])
        if not isinstance(out, tuple):
            out = (out,)
        self.torch.cuda.synchronize()
        return [self.to_host(o) for o in out]


@pytest.fixture(scope="module")
def gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
    return Gpu(torch)


_cache: dict = {}


def cached(key, make):
    """One launch per (test kind, dtype) for the whole module, shared by its parametrized tests."""
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


# --------------------------------------------------------------------------- unary math


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    return np.array([math.erf(v) if not math.isnan(v) else math.nan for v in x])


# name -> (kernelpack op, float64 reference)
UNARY = {
    "abs": (kp.abs, np.abs),
    "neg": (lambda x: -x, np.negative),
    "floor": (kp.floor, np.floor),
    "ceil": (kp.ceil, np.ceil),
    "sqrt": (kp.sqrt, np.sqrt),
    "rsqrt": (kp.rsqrt, lambda x: 1.0 / np.sqrt(x)),
    "exp": (kp.exp, np.exp),
    "exp2": (kp.exp2, np.exp2),
    "log": (kp.log, np.log),
    "log2": (kp.log2, np.log2),
    "sin": (kp.sin, np.sin),
    "cos": (kp.cos, np.cos),
    "tan": (kp.tan, np.tan),
    "tanh": (kp.tanh, np.tanh),
    "erf": (kp.erf, _erf),
    "sigmoid": (kp.sigmoid, _sigmoid),
    # ``x ** literal``: NumPy's ``x ** 2`` is square, ``x ** -1`` reciprocal, ``x ** 0.5``
    # sqrt (so (-0.0) ** 0.5 is -0.0 and (-inf) ** 0.5 NaN), the rest np.power
    "pow_2": (lambda x: x ** 2, lambda x: x ** 2),
    "pow_m1": (lambda x: x ** -1, lambda x: x ** -1),
    "pow_half": (lambda x: x ** 0.5, lambda x: x ** 0.5),
    "pow_3": (lambda x: x ** 3, lambda x: x ** 3),
    "pow_m2": (lambda x: x ** -2, lambda x: x ** -2),
    "pow_m_half": (lambda x: x ** -0.5, lambda x: x ** -0.5),
    "pow_1_5": (lambda x: x ** 1.5, lambda x: x ** 1.5),
    "pow_quarter": (lambda x: x ** 0.25, lambda x: x ** 0.25),
}
EXACT_UNARY = {"abs", "neg", "floor", "ceil", "sqrt", "pow_2", "pow_m1", "pow_half"}
POW_LITERAL = {"pow_3", "pow_m2", "pow_m_half", "pow_1_5", "pow_quarter"}
# CUDA Math API maximum ulp error of the libdevice function, + 1 for the reference.
TOL32 = {"exp": 3, "exp2": 3, "log": 2, "log2": 2, "rsqrt": 3, "sin": 3, "cos": 3,
         "tan": 5, "tanh": 3, "erf": 3, "sigmoid": 4}
TOL64 = {"exp": 2, "exp2": 2, "log": 2, "log2": 2, "rsqrt": 2, "sin": 3, "cos": 3,
         "tan": 3, "tanh": 3, "erf": 3, "sigmoid": 4}


def unary_tol(op: str, spec: Spec) -> float:
    if op in EXACT_UNARY:
        return 0
    if spec.name in ("float16", "bfloat16"):
        return 1
    if op in POW_LITERAL:
        return 5 if spec.name == "float32" else 3          # powf 4, pow 2, + 1
    return (TOL32 if spec.name == "float32" else TOL64)[op]


def unary_inputs(spec: Spec) -> np.ndarray:
    s = spec
    common = [0.0, -0.0, math.inf, -math.inf, math.nan,
              s.min_sub, -s.min_sub, s.max_sub, -s.max_sub, s.min_normal / 3, -s.min_normal / 3,
              s.min_normal, -s.min_normal, s.max_finite, -s.max_finite,
              1.0, -1.0, 1.0 + s.eps, 1.0 - s.eps / 2, -(1.0 + s.eps), 0.5, -0.5, 1.5, -1.5,
              2.5, -2.5, 0.1, -0.1, 3.0, 10.0, -10.0, math.pi, math.pi / 2, -math.pi / 2,
              1e4, -1e4]
    if s.name == "float16":
        extra = [11.0, 11.08, 11.1, -12.0, -15.0, -16.0, -17.0,         # exp: overflow, subnormals
                 15.9, 16.0, -14.5, -20.0, -24.0,                     # exp2
                 3e4, -3e4, 65504.0, 1e-3, -1e-3, 1e-7]
    elif s.name in ("float32", "bfloat16"):
        extra = [88.5, 88.7, 88.75, 89.0, -87.3, -88.7, -90.0, -95.0, -100.0, -103.0,
                 127.5, 128.0, -126.5, -130.0, -133.0, -140.0, -149.0,
                 1e6, -1e6, 1e30, -1e30, 1e38, 1e-30, -1e-30, 1e-40, -1e-40]
    else:
        extra = [709.7, 709.78, 709.8, -708.3, -708.5, -720.0, -740.0, -745.0,
                 1023.9, 1024.0, -1022.5, -1030.0, -1060.0, -1074.0,
                 1e6, -1e6, 1e15, -1e15, 1e22, 1e300, -1e300, 1e-300, -1e-300, 1e-310]
    # (no input within a few ulps of ln(max finite): there a correct result may be the
    # largest finite or infinity, whichever side of the edge a 2-ulp error falls)
    return rnd(common + extra, s)


def unary_fusion(spec: Spec):
    dt = spec.kp

    def sv_unary(x: kp.Tensor[dt, "n"]):
        return tuple(op(x) for op, _ in UNARY.values())

    return kp.fusion(name=f"sv_unary_{spec.name}")(sv_unary)


def unary_results(gpu, spec: Spec) -> dict:
    def make():
        x = unary_inputs(spec)
        outs = gpu.run(unary_fusion(spec), F(spec, x))
        return x, dict(zip(UNARY, outs))
    return cached(("unary", spec.name), make)


def unary_reference(op: str, x: np.ndarray, spec: Spec):
    """The reference, and which inputs are left out (with the reason)."""
    ref = rnd(_np(UNARY[op][1], x), spec)
    keep = np.ones(x.shape, bool)
    if op == "sigmoid":
        # 1/(1+exp(-x)) overflows exp(-x) in the dtype before the result underflows to a
        # (subnormal) nonzero value; NumPy has no sigmoid and torch gives 0 there, so the
        # tail below -ln(max finite) is not held against kernelpack.
        keep &= ~(x < -math.log(spec.max_finite))
    return ref, keep


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_math_of_special_values_matches_numpy(gpu, op, dtype):
    """Every unary op the issue lists, on ±0, ±inf, NaN, subnormals, huge and edge arguments.

    Expected (per element): NumPy's float64 result rounded to the dtype; NaN/inf/zero sign
    exactly; within ``unary_tol`` ulps otherwise (a flushed subnormal fails).
    """
    spec = SPECS[dtype]
    x, outs = unary_results(gpu, spec)
    ref, keep = unary_reference(op, x, spec)
    bad = mismatches(op, [x[keep]], outs[op][keep], ref[keep], spec, unary_tol(op, spec))
    assert not bad, f"{len(bad)} of {keep.sum()} wrong:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- binary math


def _where_lt(a, b):
    return np.where(a < b, a, b)


# name -> (kernelpack op, where the reference is computed ("f64": NumPy in float64, rounded
# once to the dtype; "dtype": NumPy in the dtype itself), the NumPy function)
BINARY = {
    "add": (lambda a, b: a + b, "f64", np.add),
    "sub": (lambda a, b: a - b, "f64", np.subtract),
    "mul": (lambda a, b: a * b, "f64", np.multiply),
    "div": (lambda a, b: a / b, "f64", np.divide),
    "floordiv": (lambda a, b: a // b, "dtype", np.floor_divide),
    "mod": (lambda a, b: a % b, "dtype", np.remainder),
    "pow_operator": (lambda a, b: a ** b, "f64", np.power),
    "kp_pow": (kp.pow, "f64", np.power),
    "maximum": (kp.maximum, "f64", np.maximum),
    "minimum": (kp.minimum, "f64", np.minimum),
    "where_lt": (lambda a, b: kp.where(a < b, a, b), "f64", _where_lt),
    "where_float_cond": (lambda a, b: kp.where(a, b, 2.0), "f64",
                         lambda a, b: np.where(a, b, 2.0)),
}
COMPARE = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
}


def binary_tol(op: str, spec: Spec) -> float:
    if op in ("pow_operator", "kp_pow"):
        return {"float16": 1, "bfloat16": 1, "float32": 5, "float64": 3}[spec.name]
    return 0


def binary_inputs(spec: Spec):
    s = spec
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, s.min_sub, s.max_sub, -s.max_sub,
            s.min_normal, 1.0, -1.0, 2.5, -3.0, 0.5, s.max_finite, -s.max_finite]
    vals = list(rnd(vals, s))
    a = [p for p in vals for _ in vals]
    b = [q for _ in vals for q in vals]
    # pairs with subnormal results (0.5 ** k, 2 ** -k, min_normal * 0.25, min_normal / 8)
    k = {"float16": 20, "bfloat16": 130, "float32": 140, "float64": 1070}[s.name]
    extra = [(0.5, float(k)), (2.0, -float(k)), (0.75, float(2 * k) / 3),
             (s.min_normal, 0.25), (s.min_normal * 3, 1 / 8),
             # % and //: subnormal divisors, divisors above 2**(emax-1), huge quotients
             (s.max_sub, s.min_sub), (s.max_sub, s.min_sub * 3), (s.min_normal, s.min_sub),
             (s.min_sub * 7, s.min_sub * 2), (-s.min_sub * 7, s.min_sub * 2),
             (s.max_finite, s.max_finite / 3), (s.max_finite, math.ldexp(1.5, s.emax - 1)),
             (-s.max_finite, math.ldexp(1.5, s.emax - 1)), (1.0, s.min_sub),
             (7.0, s.min_sub), (-7.5, 2.0), (7.5, -2.0), (-0.5, 1.0), (0.5, -1.0)]
    for p, q in extra:
        a.append(p)
        b.append(q)
    return rnd(a, s), rnd(b, s)


def binary_fusion(spec: Spec):
    dt = spec.kp

    def sv_binary(a: kp.Tensor[dt, "n"], b: kp.Tensor[dt, "n"]):
        return (tuple(op(a, b) for op, _, _ in BINARY.values())
                + tuple(op(a, b) for op, _ in COMPARE.values()))

    return kp.fusion(name=f"sv_binary_{spec.name}")(sv_binary)


def binary_results(gpu, spec: Spec) -> tuple:
    def make():
        a, b = binary_inputs(spec)
        outs = gpu.run(binary_fusion(spec), F(spec, a), F(spec, b))
        return a, b, dict(zip(list(BINARY) + list(COMPARE), outs))
    return cached(("binary", spec.name), make)


def binary_reference(op: str, a, b, spec: Spec):
    _, how, f = BINARY[op]
    if how == "f64":
        return rnd(_np(f, a, b), spec)
    if spec.name == "bfloat16":         # NumPy has no bfloat16: float32, rounded once
        return rnd(_np(f, a.astype(np.float32), b.astype(np.float32)).astype(np.float64), spec)
    npdt = getattr(np, spec.name)
    return _np(f, a.astype(npdt), b.astype(npdt)).astype(np.float64)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_math_of_special_value_pairs_matches_numpy(gpu, op, dtype):
    """+ - * / // % ** pow maximum minimum where over every pair of special values.

    Expected: + - * / exactly IEEE 754 (the float64 result rounded once); // and % NumPy's
    own results in the dtype; ** and pow NumPy's float64 np.power (C99 special cases:
    pow(x, ±0) = 1 even for NaN, pow(1, y) = 1, pow(-1, ±inf) = 1, pow(-0, -1) = -inf)
    rounded, within ``binary_tol``; maximum/minimum NaN-propagating (zero sign not checked
    for two zeros, NumPy's own sign differs between its dtypes); where with a float
    condition takes NaN and subnormals as true, as NumPy does.
    """
    spec = SPECS[dtype]
    a, b, outs = binary_results(gpu, spec)
    ref = binary_reference(op, a, b, spec)
    zero_sign = None
    if op in ("maximum", "minimum"):
        zero_sign = ~((a == 0) & (b == 0))
    bad = mismatches(op, [a, b], outs[op], ref, spec, binary_tol(op, spec), zero_sign)
    assert not bad, f"{len(bad)} of {a.size} wrong:\n" + "\n".join(bad)


@pytest.mark.parametrize("dtype", FLOATS)
def test_comparisons_of_special_value_pairs_match_numpy(gpu, dtype):
    """< <= == != > >= over every pair: NaN compares unequal to everything (!= true),
    -0 == +0, subnormals are not zero (IEEE 754, NumPy)."""
    spec = SPECS[dtype]
    a, b, outs = binary_results(gpu, spec)
    bad = []
    for op, (_, f) in COMPARE.items():
        ref = _np(f, a, b)
        got = outs[op].astype(bool)
        for i in np.flatnonzero(got != ref):
            bad.append(f"{op}[{dtype}]({describe(a[i])}, {describe(b[i])}) = {got[i]}, "
                       f"expected {ref[i]}")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- reductions


def reduction_rows(spec: Spec) -> np.ndarray:
    """Rows of 8: NaN and infinities in different lanes, subnormals, negative zeros."""
    s = spec
    inf, nan = math.inf, math.nan
    rows = [
        [1, 2, nan, 3, 4, 5, 6, 7],
        [1, 2, 3, 4, 5, 6, 7, nan],
        [inf, 1, 2, 3, 4, 5, 6, 7],
        [1, 2, 3, 4, 5, 6, 7, -inf],
        [inf, -inf, 1, 1, 1, 1, 1, 1],
        [0, inf, 1, 1, 1, 1, 1, 1],
        [-inf] * 8,
        [s.min_sub] * 8,
        [s.max_sub] * 8,
        [s.max_sub, 2, 2, 2, 1, 1, 1, 1],
        [s.max_sub, -1, -2, -3, -4, -5, -6, -7],
        [-s.max_sub, 1, 2, 3, 4, 5, 6, 7],
        [-0.0] * 8,
        [nan] * 8,
    ]
    return rnd(np.array(rows, dtype=np.float64), spec)


REDUCTIONS = ("sum", "prod", "max", "min", "mean")
# max/min select an element: exact. Sums, products and means of these rows round along the
# way in an order NumPy's float64 reference does not share (k * max_sub is not exact for
# odd k): 2 ulp. A flushed subnormal is 2**22 ulp or more away and still fails.
REDUCTION_TOL = {"sum": 2, "prod": 2, "max": 0, "min": 0, "mean": 2}


def reduction_reference(x: np.ndarray, axis, spec: Spec) -> dict:
    f = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean}
    return {k: rnd(_np(f[k], x, axis), spec) for k in REDUCTIONS}


def row_fusion(spec: Spec):
    dt = spec.kp

    def sv_rows(x: kp.Tensor[dt, "r", "n"]):
        return (x.sum(axis=1), x.prod(axis=1), x.max(axis=1), x.min(axis=1), x.mean(axis=1))

    return kp.fusion(name=f"sv_rows_{spec.name}")(sv_rows)


def column_fusion(spec: Spec):
    dt = spec.kp

    def sv_columns(x: kp.Tensor[dt, "n", "c"]):
        return (x.sum(axis=0), x.prod(axis=0), x.max(axis=0), x.min(axis=0), x.mean(axis=0))

    return kp.fusion(name=f"sv_columns_{spec.name}")(sv_columns)


def full_fusion(spec: Spec):
    dt = spec.kp

    def sv_full(x: kp.Tensor[dt, "n"]):
        return (x.sum(), x.prod(), x.max(), x.min(), x.mean())

    return kp.fusion(name=f"sv_full_{spec.name}")(sv_full)


def _check_reduction(kind: str, x, axis, outs, spec: Spec) -> list:
    ref = reduction_reference(x, axis, spec)
    bad = []
    for k, got in zip(REDUCTIONS, outs):
        got = np.asarray(got, dtype=np.float64).reshape(np.shape(ref[k]))
        r = np.atleast_1d(ref[k])
        g = np.atleast_1d(got)
        # the sign of a sum of negative zeros (NumPy: -0.0, from its first element) is
        # not held against a reduction that starts from +0.0
        zero_sign = None if k not in ("sum", "mean") else np.zeros(r.shape, bool)
        bad += mismatches(f"{kind}.{k}", [], g, r, spec, REDUCTION_TOL[k], zero_sign)
    return bad


@pytest.mark.parametrize("dtype", FLOATS)
def test_row_reductions_over_nan_inf_and_subnormals(gpu, dtype):
    """sum/prod/max/min/mean over each row (row kernels), rows of 8 and of 1000.

    Expected: NumPy in float64, rounded (every row's results are exact): NaN anywhere gives
    NaN for all five (max/min propagate NaN like np.max); inf - inf sums to NaN; 0 * inf is
    NaN; subnormal terms add up exactly (8 * max_sub is a normal number: a flushing
    accumulator gives 0) and a subnormal maximum/minimum is kept.
    """
    spec = SPECS[dtype]
    x = reduction_rows(spec)
    outs = gpu.run(row_fusion(spec), F(spec, x))
    bad = _check_reduction("rows", x, 1, outs, spec)
    # long rows: block-per-row schedules, the special value in one lane among many
    long = np.ones((4, 1000))
    long[0, 777] = math.nan
    long[1, 3], long[1, 999] = math.inf, -math.inf
    long[2, :] = spec.max_sub
    long[3, :] = -1.0
    long[3, 500] = spec.min_sub
    long = rnd(long, spec)
    long_outs = gpu.run(row_fusion(spec), F(spec, long))
    ref = reduction_reference(long, 1, spec)
    for k, got in zip(REDUCTIONS, long_outs):
        # 1000 * max_sub is not exact in the dtype: a sum in any order is within a few
        # ulps of it (a flushing accumulator gives 0, millions of ulps away); the rest is exact
        tol = 8 if k in ("sum", "mean") else 0
        bad += mismatches(f"long_rows.{k}", [], got, ref[k], spec, tol)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("dtype", FLOATS)
def test_column_and_full_reductions_over_nan_inf_and_subnormals(gpu, dtype):
    """The same rows as columns (x.T reduced over axis 0: the split column schedules) and
    each row alone as a 1-D tensor (full reductions: a grid of partials and a combine).
    Expected as in the row test."""
    spec = SPECS[dtype]
    x = reduction_rows(spec)
    xt = np.ascontiguousarray(x.T)
    bad = _check_reduction("columns", xt, 0, gpu.run(column_fusion(spec), F(spec, xt)), spec)
    for i, row in enumerate(x):
        outs = gpu.run(full_fusion(spec), F(spec, row))
        bad += [f"row {i}: {line}" for line in
                _check_reduction("full", row, None, outs, spec)]
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- casts

INTS = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def cast_inputs(spec: Spec) -> np.ndarray:
    s = spec
    v = [0.0, -0.0, s.min_sub, -s.min_sub, s.max_sub, s.min_normal, 0.5, -0.5, 0.9990234375,
         1.0, -1.0, 1.5, -1.5, 2.75, -2.75, 127.5, 128.0, 255.75, 256.0, -129.0, 300.5,
         -300.5, 30000.0, 65504.0, -65504.0, math.nan, math.inf, -math.inf]
    if s.name != "float16":
        v += [1e10, -1e10, 2.0 ** 31, -2.0 ** 31, 2.0 ** 32, 2.0 ** 62, -2.0 ** 62,
              2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e30, -1e30, s.max_finite, -s.max_finite]
    return rnd(v, s)


def cast_fusion(spec: Spec):
    dt = spec.kp
    targets = [getattr(kp, "bool_" if n == "bool" else n) for n in INTS]

    def sv_casts(x: kp.Tensor[dt, "n"]):
        return tuple(x.astype(t) for t in targets)

    return kp.fusion(name=f"sv_casts_{spec.name}")(sv_casts)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_to_integer_and_bool_casts_of_special_values(gpu, dtype):
    """astype of ±0, subnormals, fractions, wrapping values, NaN and ±inf.

    Expected: bool is ``x != 0`` (NaN and subnormals are True, -0.0 False); integers as
    NumPy on x86 (the README: truncate toward zero and wrap; NaN, infinities and values out
    of range give the minimum of a 32- or 64-bit conversion, then wrapped), compared with
    NumPy's own ``astype`` in the source dtype (bfloat16: in float32 on the same values).
    uint32 is only compared on (-2**31, 2**32): outside it NumPy itself has no single rule
    (NaN gives 2**31 from float32/float64 but 0 from float16; 1e10 gives 0 where a 64-bit
    conversion would wrap to 1410065408, depending on its SIMD dispatch).
    """
    spec = SPECS[dtype]
    x = cast_inputs(spec)
    outs = cached(("casts", dtype), lambda: gpu.run(cast_fusion(spec), F(spec, x)))
    src = x.astype(np.float32 if dtype == "bfloat16" else getattr(np, dtype))
    bad = []
    for name, got in zip(INTS, outs):
        ref = _np(src.astype, np.bool_ if name == "bool" else getattr(np, name))
        for i in range(x.size):
            if name == "uint32" and not -2.0 ** 31 < x[i] < 2.0 ** 32:
                continue
            if got[i] != ref[i]:
                bad.append(f"{describe(x[i])} .astype({name}) = {got[i]!r}, expected {ref[i]!r}")
    assert not bad, f"{dtype} source:\n" + "\n".join(bad)


def float_cast_inputs(src: Spec) -> np.ndarray:
    """Special values of ``src`` and, where ``src`` holds them, the rounding edges of every
    narrower dtype: its largest finite, the midpoint to the next power of two (a tie that
    rounds to infinity), the smallest subnormal, half of it (a tie that rounds to zero)
    and 1.5 times that half (rounds up to the smallest subnormal)."""
    v = [0.0, -0.0, math.inf, -math.inf, math.nan, src.min_sub, -src.min_sub, src.max_sub,
         -src.max_sub, src.min_normal, src.max_finite, -src.max_finite, 1.0, -1.0,
         1.0 + src.eps, 1.0 - src.eps / 2, 0.1, -0.1, 1e4]
    for dst in SPECS.values():
        half_ulp_top = math.ldexp(1.0, dst.emax - dst.bits)
        v += [dst.max_finite, -dst.max_finite, dst.max_finite + half_ulp_top / 2,
              dst.max_finite + half_ulp_top, -(dst.max_finite + half_ulp_top),
              dst.min_sub, -dst.min_sub, dst.min_sub / 2, -dst.min_sub / 2,
              dst.min_sub * 0.75, dst.min_sub * 1.5, dst.max_sub, dst.min_normal,
              dst.min_normal - dst.min_sub / 2]
    # double-rounding traps (float64 only): just above a bfloat16 / float16 tie, where
    # rounding through float32 first lands on the tie and then rounds the wrong way
    v += [1 + 2.0 ** -8 + 2.0 ** -40, -(1 + 2.0 ** -8 + 2.0 ** -40),
          2.0 ** -134 * (1 + 2.0 ** -40), 2.0 ** -25 * (1 + 2.0 ** -40)]
    v = np.array(v, dtype=np.float64)
    keep = [i for i in range(v.size)
            if math.isnan(v[i]) or (rnd(v[i:i + 1], src)[0] == v[i])]
    return v[keep]


def float_cast_fusion(spec: Spec):
    dt = spec.kp
    targets = [s.kp for s in SPECS.values()]

    def sv_float_casts(x: kp.Tensor[dt, "n"]):
        return tuple(x.astype(t) for t in targets)

    return kp.fusion(name=f"sv_float_casts_{spec.name}")(sv_float_casts)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_to_float_casts_of_special_values(gpu, dtype):
    """astype between the float dtypes of NaN, ±inf, ±0, subnormals and each narrower
    dtype's overflow and underflow edges.

    Expected: IEEE 754 conversion, rounded once to nearest even (NumPy's astype for
    float16/float32; bfloat16 by the same rule): a value at or past the midpoint above the
    largest finite becomes infinity, half the smallest subnormal becomes a zero of its sign,
    subnormals of the target are kept, widening is exact, -0.0 stays -0.0.
    """
    spec = SPECS[dtype]
    x = float_cast_inputs(spec)
    outs = gpu.run(float_cast_fusion(spec), F(spec, x))
    bad = []
    for dst, got in zip(SPECS.values(), outs):
        bad += mismatches(f"astype({dst.name})", [x], got, rnd(x, dst), dst, 0)
    assert not bad, f"{dtype} source:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- integers

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint32", "uint64")


def int_pairs(name: str):
    info = np.iinfo(getattr(np, name))
    lo, hi = int(info.min), int(info.max)
    if lo < 0:
        pairs = [(lo, -1), (lo, 1), (hi, -1), (7, 0), (-7, 0), (0, 0), (lo, 0), (hi, 0),
                 (-7, 2), (7, -2), (-7, -2), (lo, hi), (hi, lo), (-1, lo), (lo, lo), (lo, 2),
                 (lo + 1, -1), (5, 7), (-5, 7)]
    else:
        pairs = [(hi, 0), (0, 0), (7, 0), (7, 2), (hi, hi), (hi, 1), (5, 7), (hi, 2),
                 (hi - 1, hi)]
    a = np.array([p for p, _ in pairs], dtype=getattr(np, name))
    b = np.array([q for _, q in pairs], dtype=getattr(np, name))
    return a, b


def int_fusion(name: str):
    dt = getattr(kp, name)

    def sv_intdiv(a: kp.Tensor[dt, "n"], b: kp.Tensor[dt, "n"]):
        return a // b, a % b

    return kp.fusion(name=f"sv_intdiv_{name}")(sv_intdiv)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_floor_division_and_modulo_by_zero_and_of_int_min(gpu, dtype):
    """Expected: NumPy's results (with its warnings off): x // 0 == 0 and x % 0 == 0,
    INT_MIN // -1 == INT_MIN (wraps) and INT_MIN % -1 == 0, floor semantics for signs."""
    a, b = int_pairs(dtype)
    got_q, got_r = gpu.run(int_fusion(dtype), a, b)
    ref_q, ref_r = _np(np.floor_divide, a, b), _np(np.remainder, a, b)
    bad = [f"{a[i]} // {b[i]} = {got_q[i]}, expected {ref_q[i]}"
           for i in np.flatnonzero(got_q != ref_q)]
    bad += [f"{a[i]} % {b[i]} = {got_r[i]}, expected {ref_r[i]}"
            for i in np.flatnonzero(got_r != ref_r)]
    assert not bad, f"{dtype}:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- complex


def complex_fusion(name: str):
    dt = getattr(kp, name)

    def sv_cabs(z: kp.Tensor[dt, "n"]):
        return abs(z)

    return kp.fusion(name=f"sv_cabs_{name}")(sv_cabs)


@pytest.mark.parametrize("dtype", ("complex64", "complex128"))
def test_complex_magnitude_of_special_values(gpu, dtype):
    """abs(z) as np.abs (C99 hypot): inf if either part is infinite, even beside NaN; no
    overflow or underflow of the squares (|2e38 + 2e38j| is finite in complex64, |1e-30 +
    1e-30j| is 1.4e-30, not 0); subnormal parts kept, |3 + 4j| * min_sub is 5 * min_sub.
    Tolerance: the CUDA Math API's hypotf 3 ulp and hypot 2 ulp (NumPy's is within 1)."""
    spec = SPECS["float32" if dtype == "complex64" else "float64"]
    big, small = (2e38, 1e-30) if dtype == "complex64" else (1e308, 1e-300)
    inf, nan = math.inf, math.nan
    parts = [(inf, nan), (nan, inf), (-inf, nan), (nan, -inf), (-inf, 0.0), (0.0, -inf),
             (nan, 0.0), (0.0, nan), (0.0, -0.0), (-0.0, -0.0), (3.0, 4.0), (-3.0, -4.0),
             (big, big), (-big, big), (spec.max_finite, spec.max_finite), (small, small),
             (small, -small), (spec.min_sub, 0.0), (spec.max_sub, spec.max_sub),
             (spec.min_sub * 3, spec.min_sub * 4), (spec.max_finite, 1.0), (1.0, spec.min_sub)]
    re = rnd([p for p, _ in parts], spec)
    im = rnd([q for _, q in parts], spec)
    z = (re + 1j * im).astype(getattr(np, dtype))
    z.real, z.imag = re, im                       # keep NaN/inf parts as given
    (got,) = gpu.run(complex_fusion(dtype), z)
    ref = _np(np.abs, z).astype(np.float64)
    tol = 3 if dtype == "complex64" else 2
    bad = mismatches("abs", [re, im], got, ref, spec, tol)
    assert not bad, "\n".join(bad)
