"""A generated case: the fusion, its NumPy reference, its size sets, and how to check it."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import kernelpack as kp

from .comparison import compare
from .dtypes import C64, F32, NP_STORAGE
from .inputs import draw
from .reference import model_inputs
from .values import Param


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
            args = model_inputs(self.params, inputs, mode)
            return [np.asarray(r) for r in self.reference[mode](*args)]

    def tolerance(self, i: int) -> float:
        dt = self.out_dtypes[i]
        if dt.kind in "bi":
            return 0.0
        return 1e-5 if self.out_r32[i] or dt in (F32, C64) else 1e-12

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
            if tol and r.size:
                mode = "32" if tol > 1e-9 else "ld"
                if mode not in other:
                    other[mode] = self.expected(inputs, mode)
                alt = other[mode][i].astype(np.complex128 if r.dtype.kind == "c" else np.float64)
                if compare(alt.astype(NP_STORAGE[self.out_dtypes[i].name]), r,
                           self.out_dtypes[i], tol / 4) is not None:
                    skipped.append(i)
                    continue
            msg = compare(g, r, self.out_dtypes[i], tol)
            if msg:
                failures.append(f"output {i} ({self.out_dtypes[i]}): {msg}")
        return failures, skipped

    def describe(self, sizes: dict[str, int] | None = None) -> str:
        text = f"seed {self.seed}\n{self.source}"
        if sizes is not None:
            text += f"sizes {sizes} shapes {self.shapes(sizes)}\n"
        return text
