"""Scalar semantics of the DSL's operators in LLVM IR: NumPy's, for every dtype kind.

Floats follow IEEE with NaN propagation where NumPy propagates (``maximum``/``minimum``, max/min
reductions); integer ``//`` and ``%`` round toward negative infinity like Python; shifts by the
type width or more give 0 (or the sign for arithmetic right shifts) instead of LLVM poison.
Transcendentals call libdevice (``__nv_expf`` ...), whose accuracy matches CUDA's math library.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from llvmlite import ir

from ..dtypes import DType
from ..errors import CompileError
from .irutil import I1, Val, call_function, component, const_of

if TYPE_CHECKING:
    from .codegen import Emitter

__all__ = ["unary", "binary", "combine", "identity", "finalize", "libm", "sincos", "fabs",
           "neumaier_add", "outlined", "OUTLINED"]

_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


# libdevice routines called through one function per module instead of inlined at each use
# (libdevice's own names, less the __nv_ prefix). libdevice marks its functions always-inline;
# fmodf's exact reduction loop is large, and a kernel holds many uses (a pointwise kernel with
# a division or transcendental does eight elements per thread, a row fusion has a dozen
# kernels): inlined, a row fusion with a float32 `%` compiled in 2.3 s instead of 0.95 s, a
# pointwise x % y in 145 instead of 72 ms, and ran no faster (H200: 0.96-1.02x). float64's
# fmod stays inlined: called, a pointwise float64 x % y ran 9% slower (notes/compile-time.md).
OUTLINED = frozenset({"fmodf"})


def libm(em: "Emitter", name: str, dt: DType, *args: ir.Value) -> ir.Value:
    """Call libdevice's ``__nv_<name>[f]`` for float32/float64 (through :func:`outlined` for
    the routines in :data:`OUTLINED`)."""
    t = component(dt)
    suffix = "f" if isinstance(t, ir.FloatType) else ""
    if name + suffix in OUTLINED:
        em.uses_libdevice = True
        return em.b.call(outlined(em.b.module, f"__nv_{name}{suffix}", t, len(args)), list(args))
    return em.libcall(f"__nv_{name}{suffix}", t, args)


def outlined(module: ir.Module, lib: str, t: ir.Type, arity: int) -> ir.Function:
    """``kp_<lib>``: an internal, never-inlined function of ``module`` that returns
    ``lib(args)`` (a libdevice routine of ``arity`` arguments of type ``t``); made on first
    use, so the module holds one copy of the routine whatever the number of calls."""
    name = "kp_" + lib.removeprefix("__nv_")
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(t, [t] * arity), name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(call_function(b, lib, t, list(fn.args)))
    return fn  # type: ignore[no-any-return]


def sincos(em: "Emitter", dt: DType, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(sin x, cos x)`` from one libdevice ``sincos`` call (one argument reduction), shared by
    every ``sin``/``cos`` of the same value in scope: the encodings compute both per element."""
    key = ("sincos", id(x))
    for scope in reversed(em.scopes):
        if key in scope:
            return scope[key]
    t = component(dt)
    s_slot, c_slot = em.loops.alloca(t, "sin"), em.loops.alloca(t, "cos")
    suffix = "f" if isinstance(t, ir.FloatType) else ""
    em.libcall(f"__nv_sincos{suffix}", ir.VoidType(), [x, s_slot, c_slot])
    out = (em.b.load(s_slot, typ=t), em.b.load(c_slot, typ=t))
    em.scopes[-1][key] = out
    em.scopes[-1][("keep", id(x))] = x  # keeps id(x) from being reused while the entry lives
    return out


def unary(em: "Emitter", op: str, x: Val, dt: DType, out: DType) -> Val:
    b = em.b
    if dt.is_complex:
        if op == "neg":
            return (b.fneg(x[0]), b.fneg(x[1]))
        if op == "real":
            return x[0]
        if op == "imag":
            return x[1]
        if op == "abs":
            return _hypot(em, dt, x[0], x[1])
        if op == "exp":  # e^re · (cos im + i sin im), both from one sincos
            s, c = sincos(em, dt.real, x[1])
            if isinstance(x[0], ir.Constant) and x[0].constant == 0.0:
                return (c, s)  # exp of an imaginary value: no exp, no multiplies
            return _cexp_specials(em, x, _scaled_product(em, dt.real, x[0], c, s))
        raise CompileError(f"{op} of a complex tensor is not supported by the lowering")
    x = cast(ir.Value, x)  # of a real dtype: one value, not a (re, im) pair
    if dt.kind in "iub":
        if op == "neg":
            return b.sub(ir.Constant(x.type, 0), x)
        if op == "abs":
            if dt.kind == "u":
                return x
            return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)),
                            b.sub(ir.Constant(x.type, 0), x), x)
        if op == "invert":
            return b.xor(x, ir.Constant(x.type, -1 if dt.kind != "b" else 1))
        if op in ("real",):
            return x
        raise CompileError(f"{op} of an integer tensor reached codegen (dtype {dt})")
    if op == "neg":
        return b.fneg(x)
    if op == "abs":
        return libm(em, "fabs", dt, x)
    if op == "sigmoid":
        one = ir.Constant(x.type, 1.0)
        return b.fdiv(one, b.fadd(one, libm(em, "exp", dt, b.fneg(x))))
    if op in ("real",):
        return x
    if op in ("sin", "cos"):
        s, c = sincos(em, dt, x)
        return s if op == "sin" else c
    if op == "sqrt" and isinstance(x.type, ir.FloatType):
        # IEEE (sqrt.rn.f32), as NumPy and nvcc's default -prec-sqrt: libdevice's __nv_sqrtf
        # asks __nvvm_reflect("__CUDA_PREC_SQRT"), which LLVM folds to 0, and so emitted
        # sqrt.approx.f32 (1 ulp off for about a third of inputs, e.g. sqrt(5))
        return call_function(b, "llvm.sqrt.f32", x.type, [x])
    if op in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tan", "tanh", "erf",
              "floor", "ceil"):
        return libm(em, op, dt, x)
    raise CompileError(f"unsupported unary operator {op!r} for {dt}")


# exp(re) overflows past re = 709.78 (float64) / 88.72 (float32), but e^re·cos(im) can still
# be finite up to ~37 (float32: ~17) more when |cos(im)| is small. Past THRESHOLD the product
# is taken as (e^(re - S)·cos(im))·e^S, so a part that fits is not inf (C99's cexp scales too).
_CEXP_SCALE = {"float64": (700.0, 700.0), "float32": (80.0, 80.0)}  # (THRESHOLD, S)


def _scaled_product(em: "Emitter", dt: DType, re: ir.Value, c: ir.Value,
                    s: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(e^re·c, e^re·s)`` without overflowing early (see _CEXP_SCALE): one ``exp``, a
    compare, two selects and two more multiplies."""
    b = em.b
    t = re.type
    threshold, shift = _CEXP_SCALE[dt.name]
    big = b.fcmp_ordered(">", re, ir.Constant(t, threshold))
    mag = libm(em, "exp", dt, b.fsub(re, b.select(big, ir.Constant(t, shift),
                                                   ir.Constant(t, 0.0))))
    scale = b.select(big, ir.Constant(t, math.exp(shift)), ir.Constant(t, 1.0))
    return (b.fmul(b.fmul(mag, c), scale), b.fmul(b.fmul(mag, s), scale))


def _cexp_specials(em: "Emitter", x: Val, prod: tuple[ir.Value, ir.Value]) -> Val:
    """C99 Annex G's (and NumPy's) ``exp`` of an infinite or NaN part, where the product
    ``e^re · (cos im + i sin im)`` makes a NaN of ``inf · 0`` or ``0 · NaN``: a zero imaginary
    part stays itself (``exp(inf+0j)`` is ``inf+0j``, ``exp(nan+0j)`` is ``nan+0j``); with a
    non-finite imaginary part, ``re = +inf`` gives ``inf+nanj`` and ``re = -inf`` gives ``0j``."""
    b = em.b
    re, im = x
    t = re.type
    inf, zero = ir.Constant(t, float("inf")), ir.Constant(t, 0.0)
    im_nonfinite = b.fcmp_unordered("==", call_function(b, f"llvm.fabs.{_fname(t)}", t, [im]),
                                    inf)  # NaN or +-inf
    pos = b.and_(im_nonfinite, b.fcmp_ordered("==", re, inf))
    neg = b.and_(im_nonfinite, b.fcmp_ordered("==", re, ir.Constant(t, float("-inf"))))
    real = b.select(neg, zero, b.select(pos, re, prod[0]))
    imag = b.select(neg, zero, b.select(pos, b.fsub(im, im), prod[1]))
    return (real, b.select(b.fcmp_ordered("==", im, zero), im, imag))


def _fname(t: ir.Type) -> str:
    return "f32" if isinstance(t, ir.FloatType) else "f64"


def _hypot(em: "Emitter", dt: DType, re: ir.Value, im: ir.Value) -> ir.Value:
    """``|re + i·im|``. complex64 in float64 (exact squares, no overflow, one IEEE square
    root, then rounded to float32): libdevice's ``__nv_hypotf`` takes ``sqrt.approx.f32``
    (its ``__CUDA_PREC_SQRT`` reflects to 0, as for ``kp.sqrt``). An infinite part gives
    inf, even beside a NaN (C's and NumPy's hypot). complex128: :func:`_hypot64`."""
    if dt.real.itemsize == 8:
        return _hypot64(em, re, im)
    b = em.b
    f64 = ir.DoubleType()
    a, c = b.fpext(re, f64), b.fpext(im, f64)
    root = call_function(b, "llvm.sqrt.f64", f64, [b.fma(a, a, b.fmul(c, c))])
    inf = ir.Constant(f64, float("inf"))
    absa = call_function(b, "llvm.fabs.f64", f64, [a])
    absc = call_function(b, "llvm.fabs.f64", f64, [c])
    either = b.or_(b.fcmp_ordered("==", absa, inf), b.fcmp_ordered("==", absc, inf))
    return b.fptrunc(b.select(either, inf, root), re.type)


def _hypot64(em: "Emitter", re: ir.Value, im: ir.Value) -> ir.Value:
    """``|re + i·im|`` in float64: the larger part scaled by 2^-600 above 2^500 (2^600 below
    2^-500), where its square neither overflows nor underflows, the squares summed with one
    fma and an IEEE square root (``sqrt.rn``), scaled back exactly. libdevice's ``__nv_hypot``
    takes ``rsqrt.approx`` and a Newton step, whose last-ulp error turned |DBL_MAX + 1j|
    into inf (NumPy: DBL_MAX). With a correctly rounded square root, sqrt(fl(t²)) is t, so a
    part beside a negligible one comes back exactly. An infinite part gives inf, even beside
    a NaN; a NaN otherwise."""
    b = em.b
    f64 = re.type
    fabs = "llvm.fabs.f64"
    a = call_function(b, fabs, f64, [re])
    c = call_function(b, fabs, f64, [im])
    larger = b.fcmp_unordered("<", a, c)  # c is the larger (or a NaN is there: either way)
    t, s = b.select(larger, c, a), b.select(larger, a, c)

    def const(v: float) -> ir.Constant:
        return ir.Constant(f64, v)

    huge = b.fcmp_ordered(">", t, const(2.0 ** 500))
    tiny = b.fcmp_ordered("<", t, const(2.0 ** -500))
    down = b.select(huge, const(2.0 ** -600), b.select(tiny, const(2.0 ** 600), const(1.0)))
    up = b.select(huge, const(2.0 ** 600), b.select(tiny, const(2.0 ** -600), const(1.0)))
    ts, ss = b.fmul(t, down), b.fmul(s, down)
    root = call_function(b, "llvm.sqrt.f64", f64, [b.fma(ts, ts, b.fmul(ss, ss))])
    inf = const(float("inf"))
    either = b.or_(b.fcmp_ordered("==", a, inf), b.fcmp_ordered("==", c, inf))
    return b.select(either, inf, b.fmul(root, up))


def binary(em: "Emitter", op: str, x: Val, y: Val, dt: DType,
           count_in_range: bool = False) -> Val:
    """``x op y``. ``count_in_range``: a shift whose count is known to be in 0..width-1 (no
    guard for NumPy's result at counts >= width; see :meth:`Emitter.int_max`)."""
    b = em.b
    if op == "complex":
        return (x, y)
    if dt.is_complex:
        return _complex_binary(em, op, x, y, dt)
    if dt.kind in "iub":
        return _int_binary(b, op, x, y, dt, count_in_range)
    if op == "add": return b.fadd(x, y)
    if op == "sub": return b.fsub(x, y)
    if op == "mul": return b.fmul(x, y)
    if op == "div": return b.fdiv(x, y)
    if op == "pow": return libm(em, "pow", dt, x, y)
    if op in ("floordiv", "mod"):
        return _float_divmod(em, dt, x, y)[op == "mod"]
    if op in ("max", "min"):
        return _fminmax(b, op, x, y)
    if op in _FCMP:
        if op == "ne":
            return b.fcmp_unordered("!=", x, y)
        return b.fcmp_ordered(_FCMP[op], x, y)
    raise CompileError(f"unsupported operator {op!r} for {dt}")


def _fminmax(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """NaN-propagating max/min (NumPy's ``maximum``/``minimum``). float32 goes through LLVM's
    ``llvm.maximum``/``llvm.minimum``, which NVPTX emits as one ``max.NaN.f32`` on sm_80 and
    newer (and expands correctly for older targets) where the compare-and-select form costs
    four instructions: softmax's row max is one of those per element. float64 has no such
    instruction (LLVM's expansion also orders signed zeros, longer than this form)."""
    if isinstance(x.type, ir.FloatType):
        name = "llvm.maximum.f32" if op == "max" else "llvm.minimum.f32"
        return call_function(b, name, x.type, [x, y])
    better = b.fcmp_ordered(">" if op == "max" else "<", x, y)
    return b.select(b.or_(better, b.fcmp_unordered("uno", x, x)), x, y)


def fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    bits = "f32" if isinstance(x.type, ir.FloatType) else "f64"
    return call_function(b, f"llvm.fabs.{bits}", x.type, [x])


def neumaier_add(b: ir.IRBuilder, sum_slot: ir.Value, comp_slot: ir.Value,
                 v: ir.Value) -> None:
    """``sum += v`` with the rounding error kept in ``comp`` (Neumaier's variant of Kahan's
    summation: right when a term is larger than the running sum); the total is sum + comp."""
    total = b.load(sum_slot, typ=v.type)
    t = b.fadd(total, v)
    big = b.fcmp_ordered(">=", fabs(b, total), fabs(b, v))
    err = b.select(big, b.fadd(b.fsub(total, t), v), b.fadd(b.fsub(v, t), total))
    b.store(b.fadd(b.load(comp_slot, typ=v.type), err), comp_slot)
    b.store(t, sum_slot)


def _copysign(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    bits = "f32" if isinstance(x.type, ir.FloatType) else "f64"
    return call_function(b, f"llvm.copysign.{bits}", x.type, [x, y])


def _float_divmod(em: "Emitter", dt: DType, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(x // y, x % y)`` for floats, as NumPy (and Python) compute them (``npy_divmod``):
    the quotient is ``(x - fmod(x, y)) / y`` snapped to an integer, not ``floor(x / y)``, whose
    rounded division can reach the next integer (``1.0 // 0.1`` is 9, ``floor(1.0 / 0.1)``
    10); the remainder takes the divisor's sign (a zero one too); ``x // 0`` is ``x / 0``."""
    b = em.b
    t = x.type
    zero, one, half = ir.Constant(t, 0.0), ir.Constant(t, 1.0), ir.Constant(t, 0.5)
    # libdevice's fmod is exact; LLVM's frem becomes x - trunc(x / y) * y on the GPU, whose
    # rounded quotient gave 10.0 // 0.2 = 50 there (NumPy: 49; GPU fuzz seed 3446)
    mod = libm(em, "fmod", dt, x, y)
    div = b.fdiv(b.fsub(x, mod), y)
    nonzero = b.fcmp_unordered("!=", mod, zero)
    fix = b.and_(nonzero, b.icmp_unsigned("!=", b.fcmp_ordered("<", y, zero),
                                          b.fcmp_ordered("<", mod, zero)))
    mod = b.select(fix, b.fadd(mod, y), b.select(nonzero, mod, _copysign(b, zero, y)))
    div = b.select(fix, b.fsub(div, one), div)
    fl = libm(em, "floor", dt, div)
    fl = b.select(b.fcmp_ordered(">", b.fsub(div, fl), half), b.fadd(fl, one), fl)
    q = b.fdiv(x, y)
    floordiv = b.select(b.fcmp_unordered("!=", div, zero), fl, _copysign(b, zero, q))
    return b.select(b.fcmp_ordered("==", y, zero), q, floordiv), mod


def _int_binary(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dt: DType,
                count_in_range: bool = False) -> ir.Value:
    signed = dt.kind == "i"
    zero = ir.Constant(x.type, 0)
    if op == "add": return b.add(x, y)
    if op == "sub": return b.sub(x, y)
    if op == "mul": return b.mul(x, y)
    if op == "and": return b.and_(x, y)
    if op == "or": return b.or_(x, y)
    if op == "xor": return b.xor(x, y)
    if op in _FCMP:
        sign = _FCMP[op]
        return b.icmp_signed(sign, x, y) if signed else b.icmp_unsigned(sign, x, y)
    if op in ("max", "min"):
        cmp = (b.icmp_signed if signed else b.icmp_unsigned)(">" if op == "max" else "<", x, y)
        return b.select(cmp, x, y)
    if op in ("floordiv", "mod"):
        # A divisor of 0 (or -1 of the smallest integer) is undefined behaviour in LLVM IR (a
        # trap on x86) and reaches the division even where no caller passed one: lanes past a
        # row's end compute on guarded loads of 0 and drop the result. NumPy defines both:
        # x // 0 and x % 0 are 0, x // -1 is -x (wrapping), x % -1 is 0. A constant divisor
        # other than 0 and -1 needs no guard.
        one = ir.Constant(x.type, 1)
        const = isinstance(y, ir.Constant)
        by_zero = None if const and y.constant != 0 else b.icmp_unsigned("==", y, zero)
        if not signed:
            if by_zero is None:
                return b.udiv(x, y) if op == "floordiv" else b.urem(x, y)
            safe = b.select(by_zero, one, y)
            out = b.udiv(x, safe) if op == "floordiv" else b.urem(x, safe)
            return b.select(by_zero, zero, out)
        by_minus1 = None if const and y.constant != -1 else \
            b.icmp_signed("==", y, ir.Constant(x.type, -1))
        if by_zero is not None and by_minus1 is not None:
            y = b.select(b.or_(by_zero, by_minus1), one, y)  # x / 1: nothing undefined
        elif by_zero is not None or by_minus1 is not None:
            y = one  # a constant 0 or -1
        q, r = b.sdiv(x, y), b.srem(x, y)
        fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, y), zero))
        if op == "mod":  # the remainder by 1 is 0: what NumPy gives for 0 and -1
            return b.select(fix, b.add(r, y), r)
        q = b.sub(q, b.zext(fix, x.type))
        if by_minus1 is not None:
            q = b.select(by_minus1, b.sub(zero, x), q)
        if by_zero is not None:
            q = b.select(by_zero, zero, q)
        return q
    if op in ("shl", "shr") and count_in_range:  # LLVM's shift is defined: no 64-bit guard
        return b.shl(x, y) if op == "shl" else (b.ashr if signed else b.lshr)(x, y)
    if op in ("shl", "shr"):
        width = ir.Constant(x.type, x.type.width)
        too_far = b.icmp_unsigned(">=", y, width)  # also catches negative counts
        if op == "shl":
            return b.select(too_far, zero, b.shl(x, y))
        if signed:
            return b.ashr(x, b.select(too_far, ir.Constant(x.type, x.type.width - 1), y))
        return b.select(too_far, zero, b.lshr(x, y))
    if op == "pow":
        return _int_pow(b, x, y, signed)
    raise CompileError(f"unsupported operator {op!r} for {dt}")


def _int_pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value, signed: bool) -> ir.Value:
    """NumPy's integer ``x ** y`` (wrapping on overflow) by squaring, one step per bit of
    ``y``: a constant exponent folds to a few multiplies. NumPy rejects negative exponents
    (the tracer does for literals); a kernel cannot raise, so a negative tensor exponent gives
    the truncated real result: 1 for x == 1, +-1 for x == -1, 0 otherwise."""
    one = ir.Constant(x.type, 1)
    result, base = one, x
    for k in range(x.type.width - (1 if signed else 0)):
        bit = b.trunc(b.lshr(y, ir.Constant(y.type, k)), ir.IntType(1))
        result = b.select(bit, b.mul(result, base), result)
        base = b.mul(base, base)
    if not signed:
        return result
    minus_one = ir.Constant(x.type, -1)
    odd = b.trunc(y, ir.IntType(1))
    at_minus_one = b.select(odd, minus_one, one)
    small = b.select(b.icmp_signed("==", x, one), one,
                     b.select(b.icmp_signed("==", x, minus_one), at_minus_one,
                              ir.Constant(x.type, 0)))
    return b.select(b.icmp_signed("<", y, ir.Constant(y.type, 0)), small, result)


def _complex_binary(em: "Emitter", op: str, x: tuple, y: tuple, dt: DType) -> Val:
    b = em.b
    (a, c), (d, e) = x, y
    if op == "add": return (b.fadd(a, d), b.fadd(c, e))
    if op == "sub": return (b.fsub(a, d), b.fsub(c, e))
    if op == "mul": return (b.fsub(b.fmul(a, d), b.fmul(c, e)), b.fadd(b.fmul(a, e), b.fmul(c, d)))
    if op == "div":
        return _complex_div(em, dt, a, c, d, e)
    if op == "eq":
        return b.and_(b.fcmp_ordered("==", a, d), b.fcmp_ordered("==", c, e))
    if op == "ne":
        return b.or_(b.fcmp_unordered("!=", a, d), b.fcmp_unordered("!=", c, e))
    raise CompileError(f"operator {op!r} is not supported for {dt}")


# ---- reductions ---------------------------------------------------------------------------------
def identity(kind: str, dt: DType) -> Val:
    if kind in ("sum", "mean"):
        return const_of(dt, 0)
    if kind == "prod":
        return const_of(dt, 1)
    big = kind == "min"
    if dt.kind == "f":
        return ir.Constant(component(dt), float("inf") if big else float("-inf"))
    if dt.kind == "b":
        return ir.Constant(I1, 1 if big else 0)
    bits = 8 * dt.itemsize
    if dt.kind == "u":
        return ir.Constant(component(dt), (1 << bits) - 1 if big else 0)
    return ir.Constant(component(dt), (1 << (bits - 1)) - 1 if big else -(1 << (bits - 1)))


def combine(em: "Emitter", kind: str, dt: DType, acc: Val, v: Val) -> Val:
    """``acc <kind> v``. A float sum of a product just emitted (``acc + a·b``) is one fused
    multiply-add, as CUDA compiles it by default (one rounding instead of two; exact where the
    product is, e.g. the encodings' ``x_k · bit``): one instruction per term instead of two."""
    # (dt.kind "f": acc is one value, not a complex pair)
    if (kind in ("sum", "mean") and dt.kind == "f" and isinstance(v, ir.Instruction)
            and v.opname == "fmul" and v.type == acc.type):  # type: ignore[union-attr]
        return em.b.fma(v.operands[0], v.operands[1], acc)
    if kind in ("sum", "mean"):
        return binary(em, "add", acc, v, dt)
    if kind == "prod":
        return binary(em, "mul", acc, v, dt)
    if dt.kind == "b":
        return (em.b.and_ if kind == "min" else em.b.or_)(acc, v)
    return binary(em, kind, acc, v, dt)


def finalize(em: "Emitter", kind: str, dt: DType, acc: Val, count: ir.Value) -> Val:
    """``mean`` divides by the element count (0/0 gives NaN, as NumPy's mean of nothing)."""
    if kind != "mean":
        return acc
    t = component(dt)
    n = em.b.sitofp(count, t)
    if isinstance(acc, tuple):
        return (em.b.fdiv(acc[0], n), em.b.fdiv(acc[1], n))
    return em.b.fdiv(acc, n)


def _complex_div(em: "Emitter", dt: DType, a: ir.Value, c: ir.Value, d: ir.Value,
                 e: ir.Value) -> tuple:
    """``(a + ci) / (d + ei)`` by NumPy's algorithm (Smith's): scale by the larger part of the
    divisor. The textbook ``d*d + e*e`` denominator overflows for |divisor| past ~1e19 in
    complex64 (quotients came out 0 or NaN) and underflows below ~1e-19 (inf); a zero divisor
    divides each part by 0, as NumPy does."""
    b = em.b
    ad, ae = libm(em, "fabs", dt.real, d), libm(em, "fabs", dt.real, e)
    big = b.fcmp_ordered(">=", ad, ae)  # NaN parts: the second form, NaN out either way
    p, q = b.select(big, d, e), b.select(big, e, d)
    rat = b.fdiv(q, p)
    scl = b.fdiv(ir.Constant(p.type, 1.0), b.fadd(p, b.fmul(q, rat)))
    re = b.fmul(b.select(big, b.fadd(a, b.fmul(c, rat)), b.fadd(b.fmul(a, rat), c)), scl)
    im = b.fmul(b.select(big, b.fsub(c, b.fmul(a, rat)), b.fsub(b.fmul(c, rat), a)), scl)
    zero = b.fcmp_ordered("==", ad, ir.Constant(ad.type, 0.0))
    both = b.and_(zero, b.fcmp_ordered("==", ae, ir.Constant(ae.type, 0.0)))
    return (b.select(both, b.fdiv(a, ad), re), b.select(both, b.fdiv(c, ae), im))

