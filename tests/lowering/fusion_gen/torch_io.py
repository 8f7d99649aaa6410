"""A case's values to and from torch on a GPU (tests/gpu/test_random_fusions.py and
tools/gpu_fuzz.py), bfloat16 included.

A case holds bfloat16 arrays as their uint16 bit patterns (NumPy has no bfloat16; see
:mod:`.halves`): they travel to the GPU as uint16 and are viewed there as ``torch.bfloat16``,
and bfloat16 results come back as uint16 bits, which :func:`.comparison.compare` reads as
bfloat16. torch is passed in, so that importing this package never imports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .values import Param

__all__ = ["torch_dtype", "to_device", "poisoned", "to_host", "run_and_check"]

# the generator's dtypes: torch names each as kernelpack does
_NAMES = frozenset({"bool", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                    "complex64", "complex128"})


def torch_dtype(torch: Any, name: str) -> Any:
    """torch's dtype for the kernelpack dtype ``name`` (the generator's dtypes only)."""
    if name not in _NAMES:
        raise KeyError(name)
    return getattr(torch, name)


def to_device(torch: Any, inputs: list, params: list[Param]) -> list:
    """``Case.inputs(...)`` as the kernel's arguments: arrays as CUDA tensors of the
    parameter's dtype, scalars unchanged."""
    out = []
    for value, param in zip(inputs, params):
        if not isinstance(value, np.ndarray):
            out.append(value)
            continue
        # np.array(order="C"), not np.ascontiguousarray: that one makes a 0-d array 1-d
        t = torch.from_numpy(np.array(value, order="C")).cuda()
        if param.dt.name == "bfloat16":
            t = t.view(torch.bfloat16)
        out.append(t)
    return out


def poisoned(torch: Any, shape: tuple, dt: Any) -> Any:
    """An output buffer whose every element is wrong until the kernel writes it: NaN for
    floats, -123456789 for integers, True for bools."""
    out = torch.empty(shape, dtype=torch_dtype(torch, dt.name), device="cuda")
    out.fill_(float("nan") if dt.kind in "fc" else (-123456789 if dt.kind == "i" else True))
    return out


def to_host(torch: Any, results: Any) -> list[np.ndarray]:
    """A program's result (one tensor or a tuple) as NumPy arrays, bfloat16 as uint16 bits."""
    if not isinstance(results, tuple):
        results = (results,)
    return [(r.view(torch.uint16) if r.dtype == torch.bfloat16 else r).cpu().numpy()
            for r in results]


def run_and_check(torch: Any, case: Any, program: Any,
                  max_lines: int | None = None) -> str | None:
    """Run ``case`` at each of its sizes through the loaded ``program``, into poisoned
    ``out=`` buffers and allocating, and check both: None when every output matches, else
    what differs at the first failing size (at most ``max_lines`` failure lines)."""
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        args = to_device(torch, inputs, case.params)
        plan = program.plan(*args)
        outs = [poisoned(torch, plan.allocations[t.name].shape, t.dtype)
                for t in program.summary.outputs]
        program(*args, out=outs[0] if len(outs) == 1 else tuple(outs))
        allocated = program(*args)
        torch.cuda.synchronize()
        for what, got in (("out=", to_host(torch, tuple(outs))),
                          ("allocated", to_host(torch, allocated))):
            failures, _ = case.check(inputs, got)
            if failures:
                return (f"{what} (variant {plan.variant})\n{case.describe(sizes)}\n"
                        + "\n".join(failures[:max_lines]))
    return None
