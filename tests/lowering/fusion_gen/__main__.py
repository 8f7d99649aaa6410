"""``python -m tests.lowering.fusion_gen [SEED ...]``: print the cases of the seeds (0 1 2 when
none are given) at emulator scale: the fusion source, the first size set and its shapes, and
the NumPy reference."""

from __future__ import annotations

import sys
import textwrap

from .generator import generate

for s in map(int, sys.argv[1:] or ["0", "1", "2"]):
    c = generate(s)
    print(textwrap.indent(c.describe(c.sizes[0]), "  "))
    print(textwrap.indent(c.ref_source, "  "))
