"""Small helpers over ``llvmlite.ir``: types per dtype, conversions, loops, NVPTX intrinsics.

Pure Python (``llvmlite.ir`` builds text, it never calls LLVM). A *value* here is an
``ir.Value``, or a ``(re, im)`` pair of them for complex dtypes, which are stored interleaved.
float16/bfloat16 are computed in float32 and converted at loads and stores, like CUDA's
``__half`` arithmetic on architectures without native half math.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Union

from llvmlite import ir

from ..dtypes import DType
from ..errors import CompileError

__all__ = ["I1", "I8", "I32", "I64", "F32", "F64", "Val", "compute_type", "storage_type",
           "component", "const_of", "convert", "to_compute", "to_storage", "Loops", "sreg",
           "int_expr_op", "round_result", "parts_of", "drop_unused_arguments"]

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
I16, F16, F32, F64 = ir.IntType(16), ir.HalfType(), ir.FloatType(), ir.DoubleType()
Val = Union[ir.Value, tuple]


def parts_of(v: Val) -> tuple[ir.Value, ...]:
    """A value's components: (re, im) of a complex one, else the value alone."""
    return v if isinstance(v, tuple) else (v,)


class _BFloatType(ir.Type):
    """LLVM's ``bfloat``, which ``llvmlite.ir`` lacks. Only converted to and from (``fptrunc``,
    ``fpext``, ``bitcast``), never a constant: the NVPTX backend turns a ``fptrunc`` to it
    into one ``cvt.rn.bf16.f32`` from sm_80 on (the integer rounding it replaces took ~8
    instructions per rounded result, and bfloat16 kernels round after every operation), and
    into that same integer rounding for sm_75."""

    def _to_string(self) -> str:
        return "bfloat"

    def __str__(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloatType)

    def __hash__(self) -> int:
        return hash(_BFloatType)


BF16 = _BFloatType()
_BF16_NAN = 0x7FC0  # the quiet NaN every bfloat16 NaN is stored as (PyTorch's and NumPy's)


def component(dt: DType) -> ir.Type:
    """The LLVM type one scalar (or one complex part) of ``dt`` is computed in."""
    if dt.kind == "b":
        return I1
    if dt.kind in "iu":
        return ir.IntType(8 * dt.itemsize)
    if dt.kind == "c":
        return F32 if dt.itemsize == 8 else F64
    return F64 if dt.itemsize == 8 else F32


compute_type = component


def storage_type(dt: DType) -> ir.Type:
    """The LLVM type one element (or one complex part) is stored as in memory."""
    if dt.kind == "b":
        return I8
    if dt.name == "float16":
        return F16
    if dt.name == "bfloat16":
        return I16  # loaded as bits and widened by a shift; rounded through BF16
    return component(dt)


def to_compute(b: ir.IRBuilder, v: ir.Value, dt: DType) -> ir.Value:
    """A loaded element (storage type) in its compute type."""
    if dt.kind == "b":
        return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
    if dt.name == "float16":
        return b.fpext(v, F32)
    if dt.name == "bfloat16":  # an fpext (not a shift) lets LLVM fold ops into bf16 ones
        return b.fpext(b.bitcast(v, BF16), F32)
    return v


def to_storage(b: ir.IRBuilder, v: ir.Value, dt: DType) -> ir.Value:
    """A computed element in its storage type (bfloat16: round to nearest even, NaN kept)."""
    if dt.kind == "b":
        return b.zext(v, I8)
    if dt.name == "float16":
        return b.fptrunc(v, F16)
    if dt.name == "bfloat16":
        rounded = b.bitcast(b.fptrunc(v, BF16), I16)
        return b.select(b.fcmp_unordered("uno", v, v), ir.Constant(I16, _BF16_NAN), rounded)
    return v


def const_of(dt: DType, value: object) -> Val:
    """A constant of ``dt`` (complex: ``value``'s real and imaginary parts; a real ``value``
    has imaginary part 0)."""
    t = component(dt)
    if dt.kind == "b":
        return ir.Constant(I1, int(bool(value)))
    if dt.kind in "iu":
        v = int(value)  # type: ignore[call-overload]
        bits = 8 * dt.itemsize
        return ir.Constant(t, v & ((1 << bits) - 1) if v < 0 and dt.kind == "u" else v)
    if dt.kind == "c":
        z = complex(value)  # type: ignore[call-overload]
        return (ir.Constant(t, z.real), ir.Constant(t, z.imag))
    if dt.name in _NARROW:
        return ir.Constant(t, _narrow_value(float(value), dt))  # type: ignore[arg-type]
    return ir.Constant(t, float(value))  # type: ignore[arg-type]


# float16/bfloat16: (significant bits, smallest subnormal, largest finite value)
_NARROW = {"float16": (11, 2.0 ** -24, 65504.0), "bfloat16": (8, 2.0 ** -133, 255 * 2.0 ** 120)}


def _narrow_value(x: float, dt: DType) -> float:
    """``x`` rounded once (to nearest even) to ``dt``'s precision, as a float: a literal such
    as ``x16 + 0.1`` is NumPy's ``float16(0.1)``, not the float32 0.1 that would otherwise
    survive in the float32 compute type."""
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return x
    bits, tiny, top = _NARROW[dt.name]
    quantum = max(2.0 ** (math.frexp(x)[1] - bits), tiny)
    r = round(x / quantum) * quantum  # exact scaling by powers of two; round() ties to even
    return math.copysign(math.inf, x) if abs(r) > top else r


def _round_narrow(b: ir.IRBuilder, v: ir.Value, dst: DType) -> ir.Value:
    """A float32 or float64 ``v`` rounded once to float16/bfloat16 and held as float32 (their
    compute type). An explicit cast must round here, not only at the store: ``(x.astype(f16) *
    2)`` uses the float16 value, and a float64 source rounded through float32 first would
    round twice (float16(1 + 2**-11 + 2**-40) is 1.001, not 1.0)."""
    if dst.name == "float16":
        return b.fpext(b.fptrunc(v, F16), F32)
    if isinstance(v.type, ir.DoubleType):  # to float32 rounding to odd: then RNE is exact
        r = b.fptrunc(v, F32)
        back = b.fpext(r, F64)
        rb = b.bitcast(r, I32)
        neg = b.fcmp_ordered("<", v, ir.Constant(F64, 0.0))
        away = b.select(neg, b.fcmp_ordered("<", back, v), b.fcmp_ordered(">", back, v))
        toward_zero = b.select(away, b.sub(rb, ir.Constant(I32, 1)), rb)
        odd = b.or_(toward_zero, ir.Constant(I32, 1))
        v = b.bitcast(b.select(b.fcmp_ordered("!=", back, v), odd, rb), F32)
    # a NaN comes back a NaN of another payload: no operation can tell, and the store writes
    # every NaN as _BF16_NAN
    return b.fpext(b.fptrunc(v, BF16), F32)


# operations whose float16/bfloat16 result is already a float16/bfloat16 value
_EXACT_NARROW = frozenset({"neg", "abs", "max", "min", "floor", "ceil", "real", "imag"})


def round_result(b: ir.IRBuilder, v: Val, op: str, dt: DType) -> Val:
    """The result ``v`` of arithmetic ``op`` with result dtype ``dt``, rounded to float16/
    bfloat16 when ``dt`` is one: they compute in float32, and an intermediate such as
    ``(h * h).astype(f32)`` or ``kp.exp(h) + 1`` must see the float16 value NumPy (and CUDA's
    ``__hmul``) gives, not float32's more precise one. Other dtypes pass through."""
    if dt.name not in _NARROW or op in _EXACT_NARROW:
        return v
    return _round_narrow(b, v, dt)  # type: ignore[arg-type]


def convert(b: ir.IRBuilder, v: Val, src: DType, dst: DType) -> Val:
    """NumPy ``astype`` semantics between compute representations."""
    if src == dst:
        return v
    if src.kind == "c":
        if dst.kind == "c":
            return (convert(b, v[0], src.real, dst.real), convert(b, v[1], src.real, dst.real))
        if dst.kind == "b":
            return b.or_(_truth(b, v[0], src.real), _truth(b, v[1], src.real))
        return convert(b, v[0], src.real, dst)
    if dst.kind == "c":
        re: ir.Value = convert(b, v, src, dst.real)  # of a real dtype: no (re, im) pair
        return (re, ir.Constant(re.type, 0.0))
    st, dt_ = component(src), component(dst)
    if dst.kind == "b":
        return _truth(b, v, src)
    if src.kind == "b":  # a float from a bool: `selp 1.0, 0.0`, no integer conversion
        return b.zext(v, dt_) if dst.kind in "iu" else b.select(
            v, ir.Constant(dt_, 1.0), ir.Constant(dt_, 0.0))
    if dst.name in _NARROW:  # computed in float32 but rounded to dst's precision
        if src.kind in "iu":  # through float64: exact for 32-bit ints, one rounding after
            v = b.sitofp(v, F64) if src.kind == "i" else b.uitofp(v, F64)
        return _round_narrow(b, v, dst)
    if src.kind in "iu" and dst.kind in "iu":
        if st.width == dt_.width:
            return v
        if st.width > dt_.width:
            return b.trunc(v, dt_)
        return b.sext(v, dt_) if src.kind == "i" else b.zext(v, dt_)
    if src.kind in "iu":
        if _zero_or_one(v):
            # a bit (`(i >> k) & 1`): through i1, a select of 0.0/1.0 (`selp`) instead of an
            # integer conversion (64-bit ones run at 16/clk/SM on sm_90; see notes/encoding-perf.md)
            return b.select(b.trunc(v, I1), ir.Constant(dt_, 1.0), ir.Constant(dt_, 0.0))
        return b.sitofp(v, dt_) if src.kind == "i" else b.uitofp(v, dt_)
    if dst.kind in "iu":
        return _float_to_int(b, v, dst, dt_)
    if st == dt_:
        return v
    return b.fpext(v, dt_) if isinstance(dt_, ir.DoubleType) else b.fptrunc(v, dt_)


def _truncate_to(b: ir.IRBuilder, v: ir.Value, bits: int) -> ir.Value:
    """``v`` truncated toward zero to a signed ``bits``-wide integer, and that type's minimum
    where it does not fit (NaN, infinities, out of range): x86's "integer indefinite", which
    NumPy's casts give. A bare ``fptosi`` is poison there in LLVM, and NVPTX's ``cvt.rzi``
    saturates (NaN to 0), so the device and NumPy disagreed."""
    t, lim = ir.IntType(bits), float(2 ** (bits - 1))
    fits = b.and_(b.fcmp_ordered(">=", v, ir.Constant(v.type, -lim)),
                  b.fcmp_ordered("<", v, ir.Constant(v.type, lim)))
    return b.select(fits, b.fptosi(v, t), ir.Constant(t, -(2 ** (bits - 1))))


def _float_to_int(b: ir.IRBuilder, v: ir.Value, dst: DType, t: ir.IntType) -> ir.Value:
    """NumPy's ``astype`` from a float to an integer dtype, as NumPy computes it on x86: the
    value truncated toward zero, wrapped modulo 2**width (``-2.7`` is 254 as uint8 and
    4294967294 as uint32, ``300.5`` is 44 as uint8, ``70000.0`` is 4464 as int16: NumPy's
    results without a warning). Through a 32-bit conversion for int8..int32, uint8 and uint16
    and a 64-bit one for uint32 and int64, each giving its minimum where the value does not
    fit (NaN and infinities: int32/int64's minimum, 0 in narrower types); uint64 converts
    values from 2**63 on with 2**63 taken off first, as C compilers do. Those warned cases
    follow x86 so the device gives the host's answer, not its own saturation."""
    if dst.name == "uint64":
        top = ir.Constant(v.type, float(2 ** 63))
        high = b.xor(_truncate_to(b, b.fsub(v, top), 64), ir.Constant(I64, -(2 ** 63)))
        return b.select(b.fcmp_ordered(">=", v, top), high, _truncate_to(b, v, 64))
    wide = 32 if t.width <= 16 or dst.name == "int32" else 64
    r = _truncate_to(b, v, wide)
    return r if t.width == wide else b.trunc(r, t)


def _zero_or_one(v: ir.Value) -> bool:
    """Whether the integer ``v`` is known to be 0 or 1: ``x & 1`` or a zero-extended i1."""
    if not isinstance(v, ir.Instruction) or not isinstance(v.type, ir.IntType):
        return False
    if v.opname == "zext":
        return v.operands[0].type == I1
    if v.opname == "and":
        return any(isinstance(o, ir.Constant) and o.constant == 1 for o in v.operands)
    return False


def _truth(b: ir.IRBuilder, v: ir.Value, src: DType) -> ir.Value:
    if src.kind == "b":
        return v
    if src.kind in "iu":
        return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
    return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))


_SREG = {"tid": "tid.x", "ctaid": "ctaid.x", "nctaid": "nctaid.x", "ntid": "ntid.x"}


def call_function(b: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """Call ``name`` (an LLVM intrinsic or a libdevice function) with ``args``, declaring it in
    the builder's module (``ret`` from the argument types) on its first use."""
    module = b.module
    fn = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args)


def drop_unused_arguments(fn: ir.Function, droppable: list[ir.Argument]
                          ) -> list[ir.Argument]:
    """Remove from ``fn`` (its body emitted) each argument of ``droppable`` that no instruction
    uses; the removed ones, in order. The kernels are emitted with every tensor the program
    has, because which ones a kernel reads is known only once its body is written; passing
    it only those lets the summary say what each kernel reads and stores (the runtime's
    in-place rule, runtime/in_place.py, reads that from the launches' buffer arguments). A
    use this scan missed would leave the IR naming an undefined value, which LLVM's parser
    refuses: it cannot go unnoticed."""
    used: set[int] = set()
    for block in fn.blocks:
        for instr in block.instructions:
            used.update(id(v) for v in instr.operands)
            used.update(id(v) for v, _ in getattr(instr, "incomings", ()))  # phi
            used.update(id(v) for v, _ in getattr(instr, "cases", ()))      # switch
    dropped = [a for a in droppable if id(a) not in used]
    if dropped:
        gone = {id(a) for a in dropped}
        fn.args = tuple(a for a in fn.args if id(a) not in gone)
        fn.ftype = ir.FunctionType(fn.ftype.return_type, [a.type for a in fn.args])
        fn.type = fn.ftype.as_pointer()  # metadata names the function by its typed pointer
    return dropped


def sreg(b: ir.IRBuilder, module: ir.Module, name: str) -> ir.Value:
    """A special register (``tid``, ``ctaid``, ``nctaid``, ``ntid``) zero-extended to i64."""
    return b.zext(call_function(b, f"llvm.nvvm.read.ptx.sreg.{_SREG[name]}", I32, []), I64)


class Loops:
    """Structured loops and branches over one builder. Counters live in allocas of the entry
    block (LLVM's SROA turns them into SSA), which keeps this code free of phi bookkeeping."""

    def __init__(self, b: ir.IRBuilder, entry: ir.IRBuilder) -> None:
        self.b = b
        self.entry = entry

    def alloca(self, t: ir.Type, name: str = "") -> ir.Value:
        return self.entry.alloca(t, name=name)

    @contextmanager
    def range(self, start: ir.Value, stop: ir.Value, step: ir.Value,
              name: str = "i") -> Iterator[ir.Value]:
        """``for (i = start; i < stop; i += step)`` over signed i64."""
        b = self.b
        slot = self.alloca(I64, name + ".slot")
        b.store(start, slot)
        head = b.append_basic_block(name + ".head")
        body = b.append_basic_block(name + ".body")
        done = b.append_basic_block(name + ".done")
        b.branch(head)
        b.position_at_end(head)
        i = b.load(slot, typ=I64)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        yield i
        b.store(b.add(b.load(slot, typ=I64), step), slot)
        b.branch(head)
        b.position_at_end(done)

    @contextmanager
    def when(self, cond: ir.Value, name: str = "if") -> Iterator[None]:
        """A one-armed branch."""
        with self.b.if_then(cond):
            yield


_ZERO64 = ir.Constant(I64, 0)


def _nonzero(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """A divisor that is never 0: ``select`` computes both of its arms, so a size division
    in the arm a zero divisor does not take (``kp.where(m > 0, n // m, 0)``) still ran, and a
    division by zero is undefined behaviour (the plan has refused every zero divisor the
    taken arms meet)."""
    return b.select(b.icmp_signed("==", d, _ZERO64), ir.Constant(I64, 1), d)


def int_expr_op(b: ir.IRBuilder, op: str, a: list[ir.Value]) -> ir.Value:
    """An Expr operator on i64 values (the evaluator's semantics for valid inputs): the dims
    and sizes a kernel computes from its i64 dim parameters."""
    if op == "add": return b.add(a[0], a[1])
    if op == "sub": return b.sub(a[0], a[1])
    if op == "mul": return b.mul(a[0], a[1])
    if op == "neg": return b.sub(_ZERO64, a[0])
    if op == "floordiv":
        d = _nonzero(b, a[1])
        q, r = b.sdiv(a[0], d), b.srem(a[0], d)
        fix = b.and_(b.icmp_signed("!=", r, _ZERO64),
                     b.icmp_signed("<", b.xor(r, d), _ZERO64))
        return b.sub(q, b.zext(fix, I64))
    if op == "ceildiv":
        return b.sub(_ZERO64, int_expr_op(b, "floordiv", [b.sub(_ZERO64, a[0]), a[1]]))
    if op == "mod":
        d = _nonzero(b, a[1])
        r = b.srem(a[0], d)
        fix = b.and_(b.icmp_signed("!=", r, _ZERO64),
                     b.icmp_signed("<", b.xor(r, d), _ZERO64))
        return b.select(fix, b.add(r, d), r)
    if op == "min": return b.select(b.icmp_signed("<=", a[0], a[1]), a[0], a[1])
    if op == "max": return b.select(b.icmp_signed(">=", a[0], a[1]), a[0], a[1])
    if op == "shl": return b.shl(a[0], a[1])
    if op == "shr": return b.ashr(a[0], a[1])
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        sign = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
        return b.zext(b.icmp_signed(sign, a[0], a[1]), I64)
    if op in ("and", "or"):
        both = (b.icmp_signed("!=", a[0], _ZERO64), b.icmp_signed("!=", a[1], _ZERO64))
        return b.zext(b.and_(*both) if op == "and" else b.or_(*both), I64)
    if op == "not": return b.zext(b.icmp_signed("==", a[0], _ZERO64), I64)
    if op == "select": return b.select(b.icmp_signed("!=", a[0], _ZERO64), a[1], a[2])
    raise CompileError(f"unsupported dim expression operator {op!r}")
