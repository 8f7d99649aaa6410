"""Cooperative reductions: warp shuffles, and shared memory across the warps of a block.

Every thread of the group must call these with group-uniform control flow (the row loops and
partial kernels guarantee it); every thread gets the group's result.
"""

from __future__ import annotations

from llvmlite import ir

from ..dtypes import DType
from .codegen import ZERO, Emitter
from .irutil import F32, F64, I32, I64, Val
from .mathops import combine, identity

__all__ = ["warp_reduce", "block_reduce"]

_FULL = ir.Constant(I32, 0xFFFFFFFF)


def _shfl(em: Emitter, v: ir.Value, offset: int) -> ir.Value:
    b = em.b
    name = "llvm.nvvm.shfl.sync.bfly.i32"
    fn = em.module.globals.get(name) or ir.Function(
        em.module, ir.FunctionType(I32, [I32, I32, I32, I32]), name)
    call = lambda x: b.call(fn, [_FULL, x, ir.Constant(I32, offset), ir.Constant(I32, 31)])  # noqa: E731
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
    name = "llvm.nvvm.barrier0"
    fn = em.module.globals.get(name) or ir.Function(em.module, ir.FunctionType(ir.VoidType(), []),
                                                    name)
    em.b.call(fn, [])


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
    """Warp reductions, one value per warp through shared memory, a last warp reduction; every
    thread gets the result. Starts with a barrier so back-to-back reductions can share the
    buffer."""
    b = em.b
    smem = _smem(em)
    parts = warp_reduce(em, kind, dt, v)
    parts = parts if isinstance(parts, tuple) else (parts,)
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
    nwarps = ir.Constant(I64, threads // 32)
    first = b.icmp_unsigned("<", tid, nwarps)
    clamped = b.select(first, tid, ZERO)
    ident = identity(kind, dt)
    ident = ident if isinstance(ident, tuple) else (ident,)
    loaded = tuple(b.select(first, b.load(slot(p, clamped), typ=part.type), ident[p])
                   for p, part in enumerate(parts))
    total = warp_reduce(em, kind, dt, loaded if len(loaded) > 1 else loaded[0])
    total = total if isinstance(total, tuple) else (total,)
    with b.if_then(b.icmp_unsigned("==", tid, ZERO)):
        for p, part in enumerate(total):
            b.store(part, slot(p, ir.Constant(I64, 32)))
    _barrier(em)
    out = tuple(b.load(slot(p, ir.Constant(I64, 32)), typ=part.type) for p, part in enumerate(total))
    return out if len(out) > 1 else out[0]

