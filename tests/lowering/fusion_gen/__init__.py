"""A seeded generator of random ``@kp.fusion`` programs with NumPy references.

Differential testing the way an independent checker would: programs nobody wrote by hand.
:func:`generate` (seed) gives a :class:`Case`: the fusion (Python source generated as text and
exec'd, so annotations are real ``kp.Tensor[...]`` objects), the NumPy reference (generated
alongside it, line for line), an input builder and a few size assignments for the symbolic dims
(edge sizes 0 and 1, primes, non-multiples of 4/8, literal fixed dims).

The modules: :mod:`.dtypes` (dtype tables), :mod:`.values` (values, parameters, intervals),
:mod:`.reference` (the reference's namespace and inputs), :mod:`.inputs` (drawing inputs),
:mod:`.comparison` (comparing outputs), :mod:`.case` (:class:`Case`); the generator is
:class:`.builder.Builder` (state, emitting) with mixins for :mod:`.shapes` (axes, sizes,
broadcasting, arange/iota), :mod:`.params`, :mod:`.arith`, :mod:`.integers`, :mod:`.unary`
(functions, casts), :mod:`.where`, :mod:`.complexes` and :mod:`.rows` (reductions, row
patterns), combined in :mod:`.generator`. ``python -m tests.lowering.fusion_gen SEED ...``
prints cases (:mod:`.__main__`).

What a case can hold: pointwise chains over bool/int32/int64/float32/float64 (and complex64/
complex128, float16 inputs), broadcasting between ranks 1-3 (literal-1 dims, ``[:, None]``
views), comparisons and ``kp.where``, casts, math functions, integer bitwise ops, shifts,
floor division and modulo with negative operands, reductions (sum prod max min mean) over any
axes with and without keepdims and their pointwise consumers (softmax/layernorm-like rows over
any axis), full reductions, several outputs of different shapes, scalar parameters, dims used
as values, ``kp.arange``/``kp.iota``.

How the comparison stays meaningful. Every value carries an interval (so ``log``/``sqrt`` get
positive arguments, divisors stay away from 0, ``exp`` cannot overflow, integer divisions never
see ``INT_MIN // -1``) and a flag ``r32``: whether float32 rounding went into it. Discontinuous
operations (comparisons, floor/ceil, ``//``, ``%``, float → int casts) only take values without
float32 rounding, because the reference computes in float64 and a rounded float32 value may sit
on the other side of a step. Outputs with float32 rounding in them are compared at 1e-5
(normwise), the others at 1e-12; integers and bools exactly. The reference follows the DSL's
typing rules (int32 arithmetic wraps at 32 bits, as in NumPy; ``sum`` of int32 is int64 ...),
with floats in float64 and complex in complex128.

The half mode (``generate(seed, halves=True)``, a seed space of its own) also computes in
float16 and bfloat16, which kernelpack evaluates in float32 and rounds to the half type after
every operation (:mod:`.halves`). Its reference rounds (``_model``) wherever the kernel rounds,
so most half outputs compare exactly; where the kernel and NumPy may round an intermediate
differently (libdevice against NumPy's float32 functions, a row's reciprocal, float32 partial
sums), the value carries a ``fuzz`` of one unit roundoff of the coarsest half type involved,
which later steps keep away from and which widens that output's tolerance
(``Case.tolerance``). bfloat16 arrays are held as their uint16 bit patterns (NumPy has no
bfloat16); :mod:`.torch_io` moves them to and from torch on a GPU.

The elsewhere mode (``generate(seed, elsewhere=True)``, a seed space of its own, with or
without ``halves``) reads reductions at other rows of square tensors and puts row reductions
beside general ones (:mod:`.elsewhere`), with the default mode's ops, references and
tolerances.

An output whose reference is exactly 0 everywhere (a cancellation: a row of one constant
centred on its mean, a sum of centred values) has no scale for a relative error; the kernel
leaves a rounding residue there, which is compared absolutely against the output's tolerance
times its interval's magnitude bound (:mod:`.comparison`).

Empty ``max``/``min`` reductions (an axis of size 0) give the reduction's identity (-inf, the
smallest integer, ...): NumPy raises there, the DSL defines a value; the reference follows the
DSL.
"""

from __future__ import annotations

from . import torch_io
from .case import Case
from .comparison import compare
from .dtypes import INF
from .generator import generate
from .reference import model_inputs

__all__ = ["Case", "generate", "compare", "model_inputs", "INF", "torch_io"]
