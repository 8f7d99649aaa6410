"""Thread rows: the terms of a row that one thread reduces alone, in unrolled groups.

A thread owns a row only when the row has at most ``THREAD_ROW_MAX`` (32) terms (the quantum
encodings: term k of amplitude b is ``x_k · ((b >> k) & 1)``). Left to LLVM, the loop over k
was unrolled 8x with a remainder *loop* of ~14 SASS instructions per term (n = 14 spends 6 of
its 14 terms there), and each unrolled term recomputed its shift count (``k = j + c``: a
``VIADD`` and a 64-bit funnel ``SHF`` per term). Here the terms come in groups of
:data:`UNROLL` — a loop over whole groups, then the at most ``UNROLL - 1`` remaining terms
straight-line, each behind a uniform branch — and the index of term ``u`` of a group starting
at ``j0`` is recorded as *split* (:meth:`Emitter.split_index`), so a shift by it is emitted
as ``(x >> j0) >> u``: the ``x >> j0`` is shared by the group and ``((x >> j0) >> u) & 1``
becomes one bit test with a constant mask per term (see notes/encoding-perf.md).
"""

from __future__ import annotations

from typing import Callable

from llvmlite import ir

from .codegen import ZERO, Emitter
from .irutil import I32, I64
from .schedule import acc_width

__all__ = ["UNROLL", "MIN_THREADS", "width", "thread_terms"]

UNROLL = 8  # terms per group (a power of two); 0: one plain loop over the terms
# Resident threads per SM ptxas keeps registers for (`.minnctapersm`; 0: no bound), by the
# kernel's widest reduction result in bytes (:func:`width`). H200, B = 128, kp/NVRTC at n = 14,
# 16, 18, 20: phase float64 1.09 1.09 0.85 0.83 unbounded (58 registers), 1.02 0.98 0.90 0.91
# at 2048 (32 registers, 24-byte spill); float32 best unbounded (notes/encoding-perf.md).
# The bound applies to every thread-row kernel; launches with one row per thread get their own
# bounded kernel instead (tuning.ONE_ROW_MIN_THREADS, a variant of the summary).
MIN_THREADS = {4: 0, 8: 0}


def width(em: Emitter, reduces: tuple[int, ...]) -> int:
    """4 or 8: the widest result of the kernel's reductions (complex: one part)."""
    return acc_width(em.graph, reduces)


def thread_terms(em: Emitter, length: ir.Value, term: Callable[[ir.Value], None]) -> None:
    """``term(j)`` for ``j`` in ``0 .. length-1`` in increasing order (sums keep NumPy's
    order): whole groups of :data:`UNROLL` in a loop, then the rest straight-line."""
    b = em.b
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    if not UNROLL:
        with em.loops.range(ZERO, length, c(1), "j") as j:
            term(j)
        return
    whole = b.and_(length, c(-UNROLL))  # the terms in whole groups
    with em.loops.range(ZERO, whole, c(UNROLL), "j") as j0:
        for u in range(UNROLL):
            term(em.split_index(j0, u))
    rest = b.trunc(b.and_(length, c(UNROLL - 1)), I32)  # < UNROLL: 32-bit compares
    # the rest: each term behind a uniform branch nested in the previous one's; the group's
    # base (`whole`) is shared by all of them
    done = b.append_basic_block("jt.done")
    for u in range(UNROLL - 1):
        j = em.split_index(whole, u)
        then = b.append_basic_block(f"jt{u}")
        b.cbranch(b.icmp_unsigned(">", rest, ir.Constant(I32, u)), then, done)
        b.position_at_end(then)
        term(j)
    b.branch(done)
    b.position_at_end(done)

