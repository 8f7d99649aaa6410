"""Global memory access of the emitted kernels: loads, stores, alignment checks.

A mixin of :class:`kernelpack.lowering.codegen.Emitter` (it uses the emitter's builders,
buffers and vectorization state): element loads and stores in storage types (complex values
interleaved, one ``st.global.v2`` per complex element where the buffer allows), the
alignment a vectorized lane may claim, and the uniform run-time alignment checks that pick
16-byte bodies.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llvmlite import ir

from ..dtypes import DType
from .irutil import I32, I64, Val, storage_type, to_compute, to_storage

__all__ = ["Memory"]

ZERO = ir.Constant(I64, 0)


class Memory:
    """Loads, stores and alignment checks (mixed into the emitter)."""

    if TYPE_CHECKING:
        b: ir.IRBuilder
        entry: ir.IRBuilder
        buffers: dict[str, tuple[ir.Value, DType]]
        vec_lane: int | None
        vec_lanes: int
        touched: set[str]
        aligned: dict[tuple, ir.Value]

    def aligned16(self) -> ir.Value:
        """i1 (in the entry block): every buffer accessed in 16-byte groups is 16-byte
        aligned. Call after emitting the vectorized body."""
        e = self.entry
        bits: ir.Value = ir.Constant(I64, 0)
        for name in sorted(self.touched):
            bits = e.or_(bits, e.ptrtoint(self.buffers[name][0], I64))
        return e.icmp_unsigned("==", e.and_(bits, ir.Constant(I64, 15)), ir.Constant(I64, 0))

    def element_aligned(self, buf: str, dt: DType) -> ir.Value:
        """i1 (computed once, in the entry block): buffer ``buf`` is aligned to ``dt``'s
        whole size (complex: both parts in one vector access)."""
        key = ("aligned", buf, dt.itemsize)
        hit = self.aligned.get(key)
        if hit is None:
            e = self.entry
            low = e.and_(e.ptrtoint(self.buffers[buf][0], I64), ir.Constant(I64, dt.itemsize - 1))
            hit = self.aligned[key] = e.icmp_unsigned("==", low, ZERO)
        return hit

    def _align(self, buf: str, dt: DType, part: int, contiguous: bool) -> int | None:
        """Alignment of an access in a vectorized lane (LLVM's load/store vectorizer then emits
        ld/st.v2/.v4); None elsewhere. A group holds ``vec_lanes`` elements, 16 bytes of the
        widest dtype, so a narrower buffer's group spans fewer bytes and starts only at a
        multiple of that span (float32 beside complex64: 8 bytes): the claim is ``gcd(16,
        span, byte offset in the group)``. A larger one is undefined behaviour in LLVM IR."""
        if self.vec_lane is None or not contiguous:
            return None
        self.touched.add(buf)
        comp = dt.itemsize // 2 if dt.is_complex else dt.itemsize
        span = self.vec_lanes * dt.itemsize
        return math.gcd(16, span, self.vec_lane * dt.itemsize + part * comp)

    def load(self, buf: str, dt: DType, offset: ir.Value, contiguous: bool = False) -> Val:
        ptr, _ = self.buffers[buf]
        st = storage_type(dt)
        b = self.b
        if dt.is_complex:
            base = b.mul(offset, ir.Constant(I64, 2))
            re = b.load(b.gep(ptr, [base], inbounds=True, source_etype=st), typ=st,
                        align=self._align(buf, dt, 0, contiguous))
            im = b.load(b.gep(ptr, [b.add(base, ir.Constant(I64, 1))], inbounds=True,
                              source_etype=st), typ=st, align=self._align(buf, dt, 1, contiguous))
            return (re, im)
        return to_compute(b, b.load(b.gep(ptr, [offset], inbounds=True, source_etype=st),
                                    typ=st, align=self._align(buf, dt, 0, contiguous)), dt)

    def store(self, buf: str, dt: DType, offset: ir.Value, v: Val,
              contiguous: bool = False) -> None:
        ptr, _ = self.buffers[buf]
        st = storage_type(dt)
        b = self.b
        if dt.is_complex:
            base = b.mul(offset, ir.Constant(I64, 2))
            if self.vec_lane is None:
                # one st.global.v2 per element where the buffer is aligned to the element's
                # size (a uniform branch; views of float buffers may be only 4/8-aligned)
                vt = ir.VectorType(st, 2)
                pair = b.insert_element(b.insert_element(ir.Constant(vt, None), v[0],
                                                         ir.Constant(I32, 0)),
                                        v[1], ir.Constant(I32, 1))
                with b.if_else(self.element_aligned(buf, dt)) as (whole, parts):
                    with whole:
                        b.store(pair, b.gep(ptr, [offset], inbounds=True, source_etype=vt),
                                align=dt.itemsize)
                    with parts:
                        b.store(v[0], b.gep(ptr, [base], inbounds=True, source_etype=st))
                        b.store(v[1], b.gep(ptr, [b.add(base, ir.Constant(I64, 1))],
                                            inbounds=True, source_etype=st))
                return
            b.store(v[0], b.gep(ptr, [base], inbounds=True, source_etype=st),
                    align=self._align(buf, dt, 0, contiguous))
            b.store(v[1], b.gep(ptr, [b.add(base, ir.Constant(I64, 1))], inbounds=True,
                                source_etype=st), align=self._align(buf, dt, 1, contiguous))
            return
        b.store(to_storage(b, v, dt), b.gep(ptr, [offset], inbounds=True, source_etype=st),
                align=self._align(buf, dt, 0, contiguous))
