"""A workaround for a ptxas miscompilation of signed integer min/max with negated operands.

Found by the GPU fuzz (seed 6703, session 11) and reduced on an H200: with CUDA 13.0's ptxas
(nvJitLink 13.0, and the 580 driver's JIT) at its default -O3, ``(-x).max()``,
``(-abs(x)).max()`` and ``kp.maximum(kp.maximum(-x, -y), -z)`` over int32 (and int16)
give wrong values: in an unrolled group of such min/max operations, one negated operand is
used un-negated (a 1031-element ``(-x).max()`` returned ``x[i]`` for an element of its
third unrolled group). The PTX that LLVM emits is right: the same PTX assembled by nvJitLink
13.5, or by 13.0 with ``-Xptxas=-O1``, computes the right values; int64, unsigned and float
min/max are not affected.

kernelpack therefore assembles a PTX module that holds both a signed 16/32-bit ``min``/``max``
and a signed 16/32-bit ``neg`` at ptxas -O1 when the assembler is older than the first
release seen right (13.5; the releases between were not available to test, so they count as
affected). Such modules are rare (integer reductions of negated values); kernels without the
pair, every float kernel among them, keep -O3. :data:`GUARD_ID` enters cache keys and the
runtime's PTX cache path, so cubins assembled before this workaround are not reused.
"""

from __future__ import annotations

import re

__all__ = ["FIXED_IN", "GUARD_ID", "needs_guard", "guard_options"]

FIXED_IN = (13, 5)  # the first ptxas seen to assemble the pattern right
GUARD_ID = "imnmx-neg-O1"

_MINMAX = re.compile(rb"\b(?:min|max)\.s(?:16|32)\b")
_NEG = re.compile(rb"\bneg\.s(?:16|32)\b")


def needs_guard(ptx: bytes | str) -> bool:
    """Whether ``ptx`` holds the instructions the miscompilation needs: a signed 16/32-bit
    min or max, and a signed 16/32-bit negation (ptxas folds the second into the first)."""
    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    return bool(_MINMAX.search(data)) and bool(_NEG.search(data))


def guard_options(ptx: bytes | str, assembler: tuple[int, int]) -> tuple[str, ...]:
    """Extra nvJitLink options for assembling ``ptx`` with an assembler of version
    ``assembler`` (major, minor): ``("-Xptxas=-O1",)`` where the miscompilation can strike,
    else none."""
    if tuple(assembler) < FIXED_IN and needs_guard(ptx):
        return ("-Xptxas=-O1",)
    return ()
