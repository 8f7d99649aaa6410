"""Shared by the row-split tests: split constants small enough for the SIMT emulator (rows of
>= 200 elements, at most 3 rows, 128-element chunks, 32-thread blocks), and which kernels a plan
launches."""

from __future__ import annotations

from typing import Any

from kernelpack.lowering import tuning

SMALL_SPLIT = {"SPLIT_MIN_LENGTH": 200, "SPLIT_MAX_ROWS": 3, "SPLIT_REDUCE_MIN_LENGTH": 200,
               "SPLIT_REDUCE_MAX_ROWS": 3, "SPLIT_CHUNK": 128, "SPLIT_BLOCK": 32,
               "SPLIT_COMBINE_BLOCK": 32}


def use_small_split(monkeypatch: Any) -> None:
    """Patch :data:`SMALL_SPLIT` into ``lowering.tuning`` for one test."""
    for name, value in SMALL_SPLIT.items():
        monkeypatch.setattr(tuning, name, value)


def kernel_names(k: Any, *shapes: tuple[int, ...]) -> list[str]:
    """The kernels ``k`` (a :class:`.simt.Kernels`) launches for the input ``shapes``."""
    return [launch.kernel for launch in k.planner.plan(*shapes).launches]


def softmax_ref(xd: Any) -> Any:
    """NumPy's softmax over the last axis of ``xd`` (float64 in, float64 out)."""
    import numpy as np

    e = np.exp(xd - xd.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
