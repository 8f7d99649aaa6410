"""Cooperative reductions: warp shuffles, and shared memory across the warps of a block.

Every thread of the group must call these with group-uniform control flow (the row loops and
partial kernels guarantee it); every thread gets the group's result.
"""

from __future__ import annotations

from llvmlite import ir

from ..dtypes import DType
from .codegen import ZERO, Emitter
from .irutil import F32, F64, I32, I64, Val, call_function, parts_of
from .mathops import combine

__all__ = ["warp_reduce", "block_reduce"]

_FULL = ir.Constant(I32, 0xFFFFFFFF)


def _shfl(em: Emitter, v: ir.Value, offset: int) -> ir.Value:
    b = em.b
    call = lambda x: call_function(b, "llvm.nvvm.shfl.sync.bfly.i32", I32,  # noqa: E731
                                   [_FULL, x, ir.Constant(I32, offset), ir.Constant(I32, 31)])
    t = v.type
    if isinstance(t, ir.FloatType):
        return b.bitcast(call(b.bitcast(v, I32)), F32)
    if isinstance(t, ir.IntType) and t.width == 32:
        return call(v)
    if isinstance(t, ir.IntType) and t.width < 32:
        return b.trunc(call(b.zext(v, I32)), t)
    x = b.bitcast(v, I64) if isinstance(t, ir.DoubleType) else v
    lo = call(b.trunc(x, I32))
    hi = call(b.trunc(b.lshr(x, ir.Constant(I64, 32)), I32))
    joined = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
    return b.bitcast(joined, F64) if isinstance(t, ir.DoubleType) else joined


def warp_reduce(em: Emitter, kind: str, dt: DType, v: Val) -> Val:
    """Butterfly reduction: every lane ends with the warp's result."""
    for offset in (16, 8, 4, 2, 1):
        other = tuple(_shfl(em, p, offset) for p in v) if isinstance(v, tuple) \
            else _shfl(em, v, offset)
        v = combine(em, kind, dt, v, other)
    return v


def _barrier(em: Emitter) -> None:
    call_function(em.b, "llvm.nvvm.barrier0", ir.VoidType(), [])


def _smem(em: Emitter) -> ir.GlobalVariable:
    name = "kp_reduce_smem"
    gv = em.module.globals.get(name)
    if gv is None:
        gv = ir.GlobalVariable(em.module, ir.ArrayType(I64, 66), name, addrspace=3)
        gv.linkage = "internal"
        gv.align = 16
        gv.initializer = ir.Constant(ir.ArrayType(I64, 66), None)
    return gv


def block_reduce(em: Emitter, kind: str, dt: DType, v: Val, tid: ir.Value, threads: int) -> Val:
    """Warp reductions, one value per warp through shared memory, then every thread combines
    the warps' values itself (the same order everywhere: the same result in every thread).
    Two barriers: the first keeps this reduction's writes from overtaking the previous one's
    reads of the shared buffer, the second publishes the writes."""
    b = em.b
    smem = _smem(em)
    parts = parts_of(warp_reduce(em, kind, dt, v))
    warp = b.lshr(tid, ir.Constant(I64, 5))
    lane = b.and_(tid, ir.Constant(I64, 31))
    # llvmlite types globals with typed pointers, which refuse float stores: go through a
    # generic pointer (LLVM's InferAddressSpaces turns the accesses back into ld/st.shared)
    base = b.addrspacecast(smem, ir.PointerType())
    slot = lambda p, i: b.gep(base, [b.add(ir.Constant(I64, 33 * p), i)],  # noqa: E731
                              inbounds=True, source_etype=I64)
    _barrier(em)
    with b.if_then(b.icmp_unsigned("==", lane, ZERO)):
        for p, part in enumerate(parts):
            b.store(part, slot(p, warp))
    _barrier(em)
    total: Val | None = None
    for w in range(max(1, threads // 32)):
        got = tuple(b.load(slot(p, ir.Constant(I64, w)), typ=part.type)
                    for p, part in enumerate(parts))
        one = got if len(got) > 1 else got[0]
        total = one if total is None else combine(em, kind, dt, total, one)
    assert total is not None
    return total
