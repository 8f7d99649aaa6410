"""Helpers the black-box GPU review tests share (reviews 27 and 28): whether there is a GPU
to test on (``NO_GPU``, ``on_gpu``), arrays to and from the device, a normwise comparison,
NaN-poisoned outputs that show whether a refused call wrote anything, and the architectures
to compile for on the GPU at hand. Importable without torch (``torch`` is then None, and
every ``on_gpu`` test skips with the reason)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

__all__ = ["torch", "NO_GPU", "on_gpu", "targets", "cuda", "host", "check", "poisoned",
           "untouched"]

if torch is None:
    NO_GPU = "torch is not installed (the GPU tests launch through torch tensors)"
elif not torch.cuda.is_available():
    NO_GPU = "no CUDA GPU visible to torch"
else:
    NO_GPU = ""


def on_gpu(fn: Any) -> Any:
    """Mark ``fn`` as a GPU test, skipped with a reason where there is none."""
    return pytest.mark.gpu(pytest.mark.skipif(bool(NO_GPU), reason=NO_GPU or "-")(fn))


def targets(no_gpu: str) -> list:
    """sm_90 (the brief's device); PTX too when the GPU is not a 9.0 (the tests still run)."""
    if no_gpu:
        return ["sm_90"]
    import torch

    if torch.cuda.get_device_capability() != (9, 0):  # pragma: no cover
        return ["sm_90", "ptx"]
    return ["sm_90"]


def cuda(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def host(t: Any) -> np.ndarray:
    import torch

    torch.cuda.synchronize()
    return t.detach().cpu().numpy()


def check(got: Any, ref: Any, tol: float, what: str) -> None:
    """Normwise relative error (in float64), shapes equal, no NaN where the reference has
    none."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if ref.size == 0:
        return
    assert not np.isnan(got).any(), f"{what}: NaN in the result"
    scale = max(float(np.max(np.abs(ref))), 1e-300)
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(ref) else np.float64
    err = float(np.max(np.abs(got.astype(wide) - ref.astype(wide)))) / scale
    assert err <= tol, f"{what}: normwise relative error {err:.3e} > {tol:g}"


def poisoned(shape: Any, dtype: Any = None) -> Any:
    import torch

    return torch.full(shape, float("nan"), dtype=dtype or torch.float32, device="cuda")


def untouched(*ts: Any) -> bool:
    import torch

    torch.cuda.synchronize()
    return all(bool(torch.isnan(t).all()) for t in ts)
