"""A generated case: the fusion, its NumPy reference, its size sets, and how to check it."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import kernelpack as kp

from .comparison import compare
from .dtypes import C64, F32, HALVES, NP_STORAGE
from .halves import to_storage
from .inputs import draw
from .reference import ORDER_MODES, SUM_MODES, model_inputs
from .values import Param

# A fuzzy output's tolerance in units of the coarsest half type's unit roundoff u (2^-11
# float16, 2^-8 bfloat16) among the roundings the kernel may take differently: one such
# rounding moves a value by one ulp (at most 2u relative), and each later operation may round
# that difference once more (another ulp); 16u covers one such step followed by about six
# operations at condition ~1. Worse conditioned outputs are skipped (Case.check).
HALF_TOL_UNITS = 16

# How far (normwise, relative) a float output must move when its sums are moved by their error
# bound (modes "r+", "r-", "r0") for Case._tie_decides to call it decided by their rounding.
NUDGE_MOVES = 1e-9


@dataclass
class Case:
    """One generated program: ``fusion``, ``reference(*model_inputs)`` and its inputs."""

    seed: int
    name: str
    source: str
    ref_source: str
    fusion: Any
    reference: dict[str, Callable[..., list]]  # by precision mode
    params: list[Param]
    sizes: list[dict[str, int]]
    out_dtypes: list[kp.DType]
    out_r32: list[bool]
    nan: bool = False
    out_fuzz: list[float] = field(default_factory=list)  # Val.fuzz of each output
    halves: bool = False  # generated in the half mode (the reference's modes: HALF_MODES)
    # each output's magnitude bound (max |lo|, |hi| of its interval; inf: none): scales the
    # absolute error allowed against an all-zero reference (.comparison)
    out_bound: list[float] = field(default_factory=list)

    def shapes(self, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        return {p.name: tuple(sizes[d] if isinstance(d, str) else d for d in p.dims)
                for p in self.params if p.kind == "tensor"}

    def inputs(self, sizes: dict[str, int], rng: np.random.Generator | None = None) -> list:
        """The inputs in parameter order: NumPy arrays in their storage dtype, Python scalars."""
        rng = rng if rng is not None else np.random.default_rng(self.seed + 12345)
        shapes = self.shapes(sizes)
        out = []
        for p in self.params:
            if p.kind == "scalar":
                out.append(p.value)
            else:
                out.append(np.array(draw(rng, p, shapes[p.name], self.nan),
                                   dtype=NP_STORAGE[p.dt.name]))
        return out

    def expected(self, inputs: list, mode: str = "64") -> list[np.ndarray]:
        """The reference outputs (``mode``: see :data:`.reference.MODES`)."""
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = model_inputs(self.params, inputs, mode, self.halves)
            return [np.asarray(r) for r in self.reference[mode](*args)]

    def tolerance(self, i: int) -> float:
        """Output ``i``'s normwise tolerance: 0 (exact) for integers and bools, and for half
        outputs the reference models exactly (every rounding the kernel's own); 1e-5 with
        float32 rounding in it, 1e-12 without; ``HALF_TOL_UNITS`` units of roundoff of the
        half roundings the kernel may take differently (``Val.fuzz``)."""
        dt = self.out_dtypes[i]
        if dt.kind in "bi":
            return 0.0
        fuzz = self.out_fuzz[i] if self.out_fuzz else 0.0
        if dt in HALVES and not fuzz:
            return 0.0
        base = 1e-5 if self.out_r32[i] or dt in (F32, C64) else 1e-12
        return max(base, HALF_TOL_UNITS * fuzz)

    def conditioning_modes(self, i: int) -> tuple[str, ...]:
        """The precision modes (.reference) whose distance from the reference says whether
        output ``i`` is well-conditioned enough to compare at its tolerance. An output with
        float32 rounding in it is also checked in long double: where even float64 leaves it
        rounding noise, float32 does too, though "32" may share the reference's noise (GPU
        fuzz, elsewhere mode, seed 2248: complex128 means that cancel exactly, ~1e-32 in both
        "64" and "32", 8e-39 in "ld", ~7e-32 in the kernel)."""
        if self.out_fuzz and self.out_fuzz[i]:
            return ("x",)  # the half roundings left out
        return ("32", "ld") if self.tolerance(i) > 1e-9 else ("ld",)

    def zero_scale(self, i: int) -> float:
        """The absolute error output ``i`` may have where its reference is all zeros: the
        tolerance times the output's magnitude bound (at least 1), 0 (exact) without a finite
        bound."""
        bound = self.out_bound[i] if self.out_bound else math.inf
        return self.tolerance(i) * max(bound, 1.0) if math.isfinite(bound) else 0.0

    def check(self, inputs: list, got: list) -> tuple[list[str], list[int]]:
        """Compare the kernel's outputs ``got`` with the reference: (failures, indices of
        outputs skipped as ill-conditioned)."""
        refs = self.expected(inputs)
        if len(got) != len(refs):
            return [f"{len(got)} outputs, expected {len(refs)}"], []
        failures, skipped = [], []
        other: dict[str, list] = {}
        for i, (g, r) in enumerate(zip(got, refs)):
            tol = self.tolerance(i)
            if r.size and (self._tie_decides(inputs, i, r, tol, other)
                           or self._last_ulp_decides(inputs, i, r, other)):
                skipped.append(i)
                continue
            if tol and r.size and self._ill_conditioned(inputs, i, r, tol, other):
                skipped.append(i)
                continue
            msg = compare(g, r, self.out_dtypes[i], tol, self.zero_scale(i))
            if msg:
                failures.append(f"output {i} ({self.out_dtypes[i]}): {msg}")
        return failures, skipped

    def _ill_conditioned(self, inputs: list, i: int, ref: np.ndarray, tol: float,
                         other: dict[str, list]) -> bool:
        """Whether float output ``i`` moves by more than a quarter of its tolerance in one of
        its :meth:`conditioning_modes`: a correct evaluation in the kernel's precision may then
        miss the reference by the whole tolerance."""
        return any(self.moves(inputs, i, ref, mode, tol / 4, other)
                   for mode in self.conditioning_modes(i))

    def moves(self, inputs: list, i: int, ref: np.ndarray, mode: str, limit: float,
              other: dict[str, list]) -> bool:
        """Whether output ``i`` of precision mode ``mode`` misses ``ref`` past ``limit`` (as
        :func:`.comparison.compare` measures it); ``other`` keeps each mode's outputs, so
        that every check of a case evaluates a mode once."""
        if mode not in other:
            other[mode] = self.expected(inputs, mode)
        alt = other[mode][i]
        if ref.dtype.kind in "fc":
            alt = alt.astype(np.complex128 if ref.dtype.kind == "c" else np.float64)
        return compare(to_storage(alt, self.out_dtypes[i].name), ref, self.out_dtypes[i],
                       limit) is not None

    def _tie_decides(self, inputs: list, i: int, ref: np.ndarray, tol: float,
                     other: dict[str, list]) -> bool:
        """Whether output ``i`` moves (by more than a quarter of its tolerance; at all for
        bools and integers) when every floating sum is rounded once from its exact value, or
        from that value moved by the most any order of additions errs, or made 0 where that
        reaches it (modes "r", "r+", "r-", "r0": :data:`.reference.MODES`): an exact tie,
        or a sum that cancels to rounding noise, then decides it, and the kernel's order of
        additions may decide it the other way. Under the moved sums a float output counts as
        moved only past :data:`NUDGE_MOVES` (a choice or a floor that flips moves it by far
        more): the bound is what the worst order of additions could err, and a float64
        output that merely follows it smoothly would otherwise be skipped for an error no
        kernel makes (58 of 1186 outputs of elsewhere seeds 600..699 at GPU sizes, against
        19 now and 6 for "r" alone). Mode "seq" (sums added in order, an order a kernel
        may take) moves an output as "r" does, past a quarter of its tolerance
        (:data:`.reference.ORDER_MODES`)."""
        return any(self.moves(inputs, i, ref, mode,
                              tol / 4 if mode == "r" or mode in ORDER_MODES or not tol
                              else max(tol / 4, NUDGE_MOVES), other)
                   for mode in SUM_MODES + ORDER_MODES)

    def _last_ulp_decides(self, inputs: list, i: int, ref: np.ndarray,
                          other: dict[str, list]) -> bool:
        """Whether bool or integer output ``i`` changes when the floats are computed in long
        double (mode "ld"): a comparison or a cast to an integer then falls on a boundary that
        the last ulp of a function decides, and NumPy's float64 function need not round as the
        kernel's does. GPU fuzz, elsewhere mode, seed 1374: ``(tanh(s) + x).astype(int64)``
        with ``s = -18.25`` and ``x = -2.0``; NumPy's tanh is -0.9999999999999998, one ulp
        above the correctly rounded -0.9999999999999997 that the kernel (and long double)
        gave, so NumPy's sum rounded to -3.0 and the kernel's to -2.9999999999999996, which
        truncates to -2. (Float outputs have the "ld"/"32" conditioning check of
        :meth:`check`; bools and integers, compared exactly, had none.)"""
        if ref.dtype.kind not in "biu":
            return False
        if "ld" not in other:
            other["ld"] = self.expected(inputs, "ld")
        return not np.array_equal(other["ld"][i], ref)

    def describe(self, sizes: dict[str, int] | None = None) -> str:
        text = f"seed {self.seed}\n{self.source}"
        if sizes is not None:
            text += f"sizes {sizes} shapes {self.shapes(sizes)}\n"
        return text
