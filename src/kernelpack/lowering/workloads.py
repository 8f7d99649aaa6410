"""The issue's reference workloads as fusions, with NumPy float64 references.

Shared by the CPU tests (they compile and plan), the GPU tests (they run and compare) and the
benchmarks. Each entry of :data:`WORKLOADS` maps a name to ``(fusion, reference, shapes)``:
``reference(*numpy_inputs)`` returns the expected outputs in float64/complex128 and ``shapes``
lists keyword shapes to exercise (``{"x": (4, 7)}``); scalar parameters take fixed values from
:data:`SCALARS`.
"""

# no `from __future__ import annotations`: the fusions annotate with the closure variable dtype

import math
from typing import TYPE_CHECKING, Annotated, Any, Callable

from .. import dtypes as kd
import importlib

if TYPE_CHECKING:
    import kernelpack.fusion as F
else:
    F = importlib.import_module("kernelpack.fusion")  # kp.fusion (the decorator) shadows the name
from ..summary import Tensor

__all__ = ["WORKLOADS", "SCALARS", "axpy", "gelu", "softmax", "layernorm", "total", "masked_mean",
           "phase", "angle", "basis", "amplitude", "make"]

T = Tensor
fusion = F.fusion


def make(dtype: kd.DType) -> dict[str, F.Fusion]:
    """The workloads for one float dtype (float32 or float64)."""
    # Annotated (README, "Type checkers"): mypy sees a traced tensor as Any and a scalar as a
    # number, kp.fusion reads the kp.Tensor[...] or dtype in the metadata (the same fusions).
    # Tensor, not T: mypy reads T[...] in an alias's metadata as a generic alias's arguments
    Vec = Annotated[Any, Tensor[dtype, "n"]]
    Rows = Annotated[Any, Tensor[dtype, "b", "n"]]
    Num = Annotated[float, dtype]
    Int = Annotated[int, kd.int64]

    @fusion(name=f"axpy_{dtype.name}")
    def axpy(x: Vec, y: Vec, a: Num):
        return a * x + y

    @fusion(name=f"gelu_{dtype.name}")
    def gelu(x: Vec):
        return 0.5 * x * (1.0 + F.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))

    @fusion(name=f"softmax_{dtype.name}")
    def softmax(x: Rows):
        e = F.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @fusion(name=f"layernorm_{dtype.name}")
    def layernorm(x: Rows, w: Vec, bias: Vec, eps: Num):
        mu = x.mean(axis=-1, keepdims=True)
        d = x - mu
        var = (d * d).mean(axis=-1, keepdims=True)
        return d * F.rsqrt(var + eps) * w + bias

    @fusion(name=f"total_{dtype.name}")
    def total(x: Vec):
        return x.sum()

    @fusion(name=f"masked_mean_{dtype.name}")
    def masked_mean(x: Rows, mask: Annotated[Any, Tensor[kd.bool_, "b", "n"]]):
        s = F.where(mask, x, 0.0).sum(axis=-1)
        return s / mask.astype(dtype).sum(axis=-1)

    ctype = kd.complex64 if dtype == kd.float32 else kd.complex128

    @fusion(name=f"phase_{dtype.name}")
    def phase(x: Rows):
        n = x.shape[1]
        idx = F.arange(1 << n)
        bits = ((idx[:, None] >> F.arange(n)[None, :]) & 1).astype(dtype)      # (N, n)
        phi = (x[:, None, :] * bits[None, :, :]).sum(axis=-1)                 # (b, N)
        norm = F.exp2(-0.5 * n_as(x, dtype))
        return F.complex(F.cos(phi) * norm, F.sin(phi) * norm)

    @fusion(name=f"angle_{dtype.name}")
    def angle(x: Rows):
        n = x.shape[1]
        idx = F.arange(1 << n)
        bit = ((idx[:, None] >> F.arange(n)[None, :]) & 1) == 1                # (N, n)
        return F.where(bit[None], F.sin(x)[:, None, :], F.cos(x)[:, None, :]).prod(axis=-1)

    @fusion(name=f"basis_{dtype.name}")
    def basis(j: Annotated[Any, Tensor[kd.int64, "b"]], n: Int):
        hit = F.arange(1 << n)[None, :] == j[:, None]
        return hit.astype(ctype)

    @fusion(name=f"amplitude_{dtype.name}")
    def amplitude(v: Annotated[Any, Tensor[dtype, "b", "l"]], n: Int):
        inv = F.rsqrt((v * v).sum(axis=-1, keepdims=True))
        return F.pad(v * inv, 1 << n, axis=-1).astype(ctype)

    return {f.name.rsplit("_", 1)[0]: f for f in
            (axpy, gelu, softmax, layernorm, total, masked_mean, phase, angle, basis, amplitude)}


def n_as(x: F.Value, dtype: kd.DType) -> F.Value:
    """The dim ``x.shape[1]`` as a traced scalar of ``dtype``."""
    return F.trace_value(x.graph, x.shape[1]).astype(dtype)


SCALARS = {"a": 1.75, "eps": 1e-5}


def _refs() -> dict[str, Callable[..., Any]]:
    import numpy as np

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True)) if x.size else x
        return e / e.sum(axis=-1, keepdims=True) if x.size else x

    def layernorm(x, w, b, eps):
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    def masked_mean(x, m):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(m, x, 0).sum(-1) / m.sum(-1)

    def bits(n):
        idx = np.arange(1 << n)
        return (idx[:, None] >> np.arange(n)[None, :]) & 1

    def phase(x):
        n = x.shape[1]
        phi = x @ bits(n).T.astype(np.float64)
        return np.exp(1j * phi) * 2.0 ** (-n / 2)

    def angle(x):
        n = x.shape[1]
        bt = bits(n)[None].astype(bool)
        return np.where(bt, np.sin(x)[:, None, :], np.cos(x)[:, None, :]).prod(-1)

    def basis(j, n):
        out = np.zeros((j.shape[0], 1 << n), np.complex128)
        out[np.arange(j.shape[0]), j] = 1
        return out

    def amplitude(v, n):
        out = np.zeros((v.shape[0], 1 << n), np.complex128)
        out[:, :v.shape[1]] = v / np.linalg.norm(v, axis=-1, keepdims=True)
        return out

    return {"axpy": lambda x, y, a: a * x + y, "gelu": gelu, "softmax": softmax,
            "layernorm": layernorm, "total": lambda x: np.asarray(x.sum()),
            "masked_mean": masked_mean, "phase": phase, "angle": angle, "basis": basis,
            "amplitude": amplitude}


SHAPES: dict[str, list[dict[str, tuple[int, ...] | int]]] = {  # an int: a scalar's value
    "axpy": [{"x": (n,), "y": (n,)} for n in (0, 1, 7, 1000, 65537, 1 << 20)],
    "gelu": [{"x": (n,)} for n in (0, 1, 13, 4099, 1 << 20)],
    "softmax": [{"x": s} for s in ((1, 1), (3, 7), (64, 1000), (5, 3000), (2, 70001), (0, 5))],
    "layernorm": [{"x": (b, n), "w": (n,), "bias": (n,)}
                  for b, n in ((1, 1), (4, 37), (128, 1024), (3, 5000))],
    "total": [{"x": (n,)} for n in (0, 1, 4095, 4096, 4097, 1 << 20, 3_000_017)],
    "masked_mean": [{"x": s, "mask": s} for s in ((1, 1), (8, 33), (100, 257), (3, 9000),
                                                  (5, 4096), (3, 20001), (4, 16396))],
    "phase": [{"x": (b, n)} for b, n in ((1, 1), (3, 5), (16, 10), (128, 14))],
    "angle": [{"x": (b, n)} for b, n in ((1, 1), (3, 5), (16, 10), (128, 14))],
    "basis": [{"j": (b,), "n": n} for b, n in ((1, 1), (5, 4), (128, 14))],
    # and rows written much longer than reduced (lowering/longrows.py): one row over a grid,
    # per-row workspaces after a thread / tiled warp / tiled block reduction
    "amplitude": [{"v": (b, l), "n": n} for b, l, n in ((1, 1, 1), (4, 5, 3), (32, 1000, 10),
                                                         (2, 1 << 14, 14), (1, 1000, 20),
                                                         (1, 1 << 20, 20), (16, 20, 16),
                                                         (16, 1000, 16), (2, 3000, 17))],
}

WORKLOADS: dict[str, dict[str, F.Fusion]] = {}


def __getattr__(name: str) -> Any:
    if name in ("axpy", "gelu", "softmax", "layernorm", "total", "masked_mean", "phase", "angle",
                "basis", "amplitude"):
        return make(kd.float32)[name]
    if name == "REFERENCES":
        return _refs()
    raise AttributeError(name)
