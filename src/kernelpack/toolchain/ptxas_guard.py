"""A workaround for a ptxas miscompilation of signed integer min/max with negated operands.

Found by the GPU fuzz (seed 6703, session 11) and reduced on an H200: with CUDA 13.0's ptxas
(nvJitLink 13.0, and the 580 driver's JIT) at its default -O3, ``(-x).max()``,
``(-abs(x)).max()`` and ``kp.maximum(kp.maximum(-x, -y), -z)`` over int32 (and int16)
give wrong values: in an unrolled group of such min/max operations, one negated operand is
used un-negated (a 1031-element ``(-x).max()`` returned ``x[i]`` for an element of its
third unrolled group). The PTX that LLVM emits is right (the SIMT emulator runs it right):
the same PTX assembled by nvJitLink 13.5, or by 13.0 with ``-Xptxas=-O0``, computes the right
values; ``-Xptxas=-O1`` fixed the reductions but not the elementwise form. int64, unsigned
and float min/max are not affected.

kernelpack therefore assembles a PTX module in which a signed 16/32-bit ``min``/``max`` reads
a negated value (see :func:`needs_guard`) at ptxas -O0 when the assembler is older than the
first release seen right (13.5; the releases between were not available to test, so they
count as affected). Such modules are rare (1 of 200 random fuzz programs; none of the
benchmark workloads); every other module keeps -O3. :data:`GUARD_ID` enters cache keys and
the runtime's PTX cache path, so cubins assembled before this workaround are not reused.
"""

from __future__ import annotations

import re

__all__ = ["FIXED_IN", "GUARD_ID", "needs_guard", "guard_options"]

FIXED_IN = (13, 5)  # the first ptxas seen to assemble the pattern right
GUARD_ID = "imnmx-neg-O0"

_NEG = re.compile(rb"\bneg\.s(?:16|32)\s+(%\w+)")
_COPY = re.compile(rb"\b(?:mov|cvt)\.[\w.]+\s+(%\w+),\s*(%\w+)\s*;")
_MINMAX = re.compile(rb"\b(?:min|max)\.s(?:16|32)\s+%\w+,\s*([^;]+);")


def needs_guard(ptx: bytes | str) -> bool:
    """Whether ``ptx`` holds the pattern the miscompilation needs: a signed 16/32-bit min or
    max that reads the result of a signed 16/32-bit negation, directly or through register
    copies and conversions. A min or max of other values (``min(i, 18)`` beside an unrelated
    ``neg``, as the float64 encodings have) is left alone. Register names are not told apart
    per kernel of the module: a name shared by two kernels can only raise a false alarm,
    which costs speed, never a miss."""
    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    negated = set(_NEG.findall(data))
    if not negated:
        return False
    copies = _COPY.findall(data)
    grew = True
    while grew:  # registers holding a negated value, through copies in any order (loops)
        grew = False
        for dst, src in copies:
            if src in negated and dst not in negated:
                negated.add(dst)
                grew = True
    return any(op.strip() in negated
               for operands in _MINMAX.findall(data) for op in operands.split(b","))


def guard_options(ptx: bytes | str, assembler: tuple[int, int]) -> tuple[str, ...]:
    """Extra nvJitLink options for assembling ``ptx`` with an assembler of version
    ``assembler`` (major, minor): ``("-Xptxas=-O0",)`` where the miscompilation can strike,
    else none (-O1 was not enough: an elementwise ``maximum(maximum(-x, -y), -z)`` stayed
    wrong)."""
    if tuple(assembler) < FIXED_IN and needs_guard(ptx):
        return ("-Xptxas=-O0",)
    return ()
