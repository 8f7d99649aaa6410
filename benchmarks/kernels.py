"""Kernel quality: kernelpack's lowering against PyTorch eager, Triton and NVRTC-compiled CUDA C,
all measured in the same run on the same inputs.

Each workload is written below as a ``@kp.fusion``, compiled for this GPU, saved into one
artifact, loaded back with ``kp.load`` and launched through the runtime (``out=`` buffers).
Every implementation is first checked against a float64 torch reference (normwise relative
error <= 1e-5 for float32, 1e-12 for float64; the output is poisoned with NaN first), then
timed (CUDA events, median, L2 flushed between calls, inputs rotated when they would fit in
L2). Bandwidth counts each input read once and each output written once, and is given as a
fraction of the device-to-device copy bandwidth measured at the start of the run.

    python benchmarks/kernels.py [--quick] [--only softmax,phase] [--md FILE] [--no-write]

A workload that kernelpack cannot express or compile right now shows
``not available: <reason>`` in its cells; nothing is estimated. Ratios are time ratios
t_kernelpack / t_peer (below 1: kernelpack is faster). Appends the tables to
benchmarks/RESULTS.md under a heading with the device, driver and date, and writes the same
section to ``--md`` (default ``$OUT/kernels.md`` when ``$OUT`` is set).
"""

# No `from __future__ import annotations`: the fusions annotate with the closure variable
# `dtype`, which kp.fusion evaluates when it reads the annotations.

import argparse
import math
import os
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import kernelpack as kp  # noqa: E402

import _gpu_timing as gt  # noqa: E402

POINTWISE = {"axpy", "gelu"}
STANDARD = ("axpy", "gelu", "softmax", "layernorm", "total", "masked_mean")
ENCODINGS = ("phase", "angle")
TOL = {"float32": 1e-5, "float64": 1e-12}
A, EPS, B_ENC = 1.75, 1e-5, 128


# ---- the fusions ----
def standard_fusions(dtype: kp.DType) -> dict[str, Any]:
    """axpy, gelu (tanh form), softmax (last axis), layernorm (weight, bias), full sum, masked
    mean — the issue's workloads, as fusions over symbolic shapes."""

    @kp.fusion(name=f"axpy_{dtype.name}")
    def axpy(x: kp.Tensor[dtype, "n"], y: kp.Tensor[dtype, "n"], a: dtype):
        return a * x + y

    @kp.fusion(name=f"gelu_{dtype.name}")
    def gelu(x: kp.Tensor[dtype, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

    @kp.fusion(name=f"softmax_{dtype.name}")
    def softmax(x: kp.Tensor[dtype, "b", "n"]):
        e = kp.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @kp.fusion(name=f"layernorm_{dtype.name}")
    def layernorm(x: kp.Tensor[dtype, "b", "n"], w: kp.Tensor[dtype, "n"],
                  bias: kp.Tensor[dtype, "n"], eps: dtype):
        mu = x.mean(axis=-1, keepdims=True)
        d = x - mu
        var = (d * d).mean(axis=-1, keepdims=True)
        return d * kp.rsqrt(var + eps) * w + bias

    @kp.fusion(name=f"total_{dtype.name}")
    def total(x: kp.Tensor[dtype, "n"]):
        return x.sum()

    @kp.fusion(name=f"masked_mean_{dtype.name}")
    def masked_mean(x: kp.Tensor[dtype, "b", "n"], mask: kp.Tensor[kp.bool_, "b", "n"]):
        return kp.where(mask, x, 0.0).sum(axis=-1) / mask.astype(dtype).sum(axis=-1)

    return {"axpy": axpy, "gelu": gelu, "softmax": softmax, "layernorm": layernorm,
            "total": total, "masked_mean": masked_mean}


def encoding_fusions(dtype: kp.DType) -> dict[str, Any]:
    """Quantum state encodings; bit k of amplitude index b is qubit k. ``norm`` = 2^(-n/2) is
    passed by the caller, as Mahout's QDP kernels (and the CUDA C peer below) take it."""

    @kp.fusion(name=f"phase_{dtype.name}")
    def phase(x: kp.Tensor[dtype, "b", "n"], norm: dtype):
        n = x.shape[1]
        bits = ((kp.arange(1 << n)[:, None] >> kp.arange(n)[None, :]) & 1).astype(dtype)
        phi = (x[:, None, :] * bits[None, :, :]).sum(axis=-1)          # (b, 2^n)
        return kp.complex(kp.cos(phi) * norm, kp.sin(phi) * norm)

    @kp.fusion(name=f"angle_{dtype.name}")
    def angle(x: kp.Tensor[dtype, "b", "n"]):
        n = x.shape[1]
        bit = ((kp.arange(1 << n)[:, None] >> kp.arange(n)[None, :]) & 1) == 1
        return kp.where(bit[None], kp.sin(x)[:, None, :], kp.cos(x)[:, None, :]).prod(axis=-1)

    return {"phase": phase, "angle": angle}


def build_pack(names: set[str], arch: str, workdir: Path) -> tuple[Any, dict[str, str]]:
    """Compile every wanted fusion for ``arch``, save them into one artifact, load it back.
    Returns (pack or None, {program name: reason it is not available})."""
    fusions = dict((f"{k}_float32", f) for k, f in standard_fusions(kp.float32).items()
                   if k in names)
    for dt in (kp.float32, kp.float64):
        fusions.update((f"{k}_{dt.name}", f) for k, f in encoding_fusions(dt).items()
                       if k in names)
    compiled, missing = [], {}
    for name, f in fusions.items():
        t0 = time.perf_counter()
        try:
            compiled.append(kp.compile(f, targets=[arch]))
            print(f"compiled {name} for {arch} in {(time.perf_counter() - t0) * 1e3:.0f} ms")
        except Exception as exc:  # per workload: report, never stop the run
            missing[name] = f"kp.compile: {_reason(exc)}"
            print(f"compile {name}: {missing[name]}")
    if not compiled:
        return None, missing
    path = workdir / "kernels.kpack"
    try:
        kp.save(compiled, str(path))
        pack = kp.load(str(path))
    except Exception as exc:
        reason = f"kp.save/kp.load: {_reason(exc)}"
        return None, {**missing, **{c.name: reason for c in compiled}}
    print(f"artifact {path.stat().st_size:,} bytes, programs {pack.programs}")
    return pack, missing


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).replace("|", "/")  # it may land in a markdown cell
    return f"{type(exc).__name__}: {text[:160]}"


# ---- cases ----
@dataclass
class Case:
    """One workload at one size: fresh inputs, the float64 reference, and the callables."""

    workload: str
    dtype: str
    label: str
    nbytes: int
    make: Callable[[], dict]                   # fresh random inputs (torch, on the GPU)
    kp_args: Callable[[dict], tuple]
    out_like: Callable[[dict], Any]            # an empty output for out=
    ref: Callable[[dict], Any]                 # float64 / complex128 result


def standard_cases(workload: str, quick: bool) -> list[Case]:
    import torch

    dev = "cuda"
    f32 = torch.float32

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=dev, dtype=f32)

    def case(label: str, nbytes: int, make: Callable[[], dict], kp_args: Callable,
             out_like: Callable, ref: Callable) -> Case:
        return Case(workload, "float32", label, nbytes, make, kp_args, out_like, ref)

    if workload in ("axpy", "gelu", "total"):
        sizes = {"axpy": [1 << 25, 1 << 27], "gelu": [1 << 26, 1 << 28],
                 "total": [1 << 26, 1 << 28]}[workload]
        sizes = sizes[:1] if quick else sizes
        out = []
        for n in sizes:
            if workload == "axpy":
                out.append(case(f"n={n:,}", 12 * n, lambda n=n: {"x": randn(n), "y": randn(n)},
                                lambda d: (d["x"], d["y"], A), lambda d: torch.empty_like(d["x"]),
                                lambda d: A * d["x"].double() + d["y"].double()))
            elif workload == "gelu":
                out.append(case(f"n={n:,}", 8 * n, lambda n=n: {"x": randn(n)},
                                lambda d: (d["x"],), lambda d: torch.empty_like(d["x"]),
                                lambda d: _gelu64(d["x"].double())))
            else:  # uniform [0, 1): a well-conditioned sum (randn's would cancel)
                out.append(case(f"n={n:,}", 4 * n + 4,
                                lambda n=n: {"x": torch.rand(n, device=dev, dtype=f32)},
                                lambda d: (d["x"],),
                                lambda d: torch.empty((), device=dev, dtype=f32),
                                lambda d: d["x"].double().sum()))
        return out
    shapes = {"softmax": [(65536, 1024), (8192, 8192)],
              "layernorm": [(65536, 1024), (8192, 8192)],
              "masked_mean": [(16384, 4096), (4096, 16384)]}[workload]
    return [row_case(workload, b, n) for b, n in (shapes[:1] if quick else shapes)]


def row_case(workload: str, b: int, n: int) -> Case:
    """softmax, layernorm or masked_mean over float32 rows: ``b`` rows of ``n`` elements (also
    ``benchmarks/row_configs.py``'s cells)."""
    import torch

    dev, f32 = "cuda", torch.float32

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=dev, dtype=f32)

    label = f"{b}x{n}"
    if workload == "softmax":
        return Case(workload, "float32", label, 8 * b * n, lambda: {"x": randn(b, n)},
                    lambda d: (d["x"],), lambda d: torch.empty_like(d["x"]),
                    lambda d: torch.softmax(d["x"].double(), -1))
    if workload == "layernorm":
        return Case(workload, "float32", label, 8 * b * n + 8 * n,
                    lambda: {"x": randn(b, n), "w": randn(n), "bias": randn(n)},
                    lambda d: (d["x"], d["w"], d["bias"], EPS),
                    lambda d: torch.empty_like(d["x"]),
                    lambda d: _layernorm64(d["x"].double(), d["w"].double(), d["bias"].double()))
    if workload == "masked_mean":
        return Case(workload, "float32", label, 5 * b * n + 4 * b,
                    lambda: {"x": randn(b, n), "mask": torch.rand(b, n, device=dev) < 0.6},
                    lambda d: (d["x"], d["mask"]),
                    lambda d: torch.empty(d["x"].shape[0], device=dev, dtype=f32),
                    lambda d: torch.where(d["mask"], d["x"].double(), 0.0).sum(-1)
                    / d["mask"].double().sum(-1))
    raise KeyError(f"row_case: {workload!r} is not a row workload "
                   "(softmax, layernorm, masked_mean)")


def _gelu64(x: Any) -> Any:
    import torch

    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _layernorm64(x: Any, w: Any, b: Any) -> Any:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / (var + EPS).sqrt() * w + b


def encoding_cases(workload: str, dtype: str, quick: bool) -> list[Case]:
    import torch

    tdt = getattr(torch, dtype)
    cdt = torch.complex64 if dtype == "float32" else torch.complex128
    qubits = (14, 16, 18, 20) if quick else tuple(range(14, 21))
    out = []
    for n in qubits:
        norm = 2.0 ** (-n / 2)
        amps = B_ENC << n
        isz = tdt.itemsize

        def make(n: int = n) -> dict:  # angles in [-pi, pi)
            return {"x": (torch.rand(B_ENC, n, device="cuda", dtype=tdt) * 2 - 1) * math.pi}

        if workload == "phase":
            out.append(Case("phase", dtype, f"n={n}", B_ENC * n * isz + amps * 2 * isz, make,
                            lambda d, norm=norm: (d["x"], norm),
                            lambda d, n=n: torch.empty(B_ENC, 1 << n, device="cuda", dtype=cdt),
                            lambda d, n=n, norm=norm: _phase64(d["x"].double(), n, norm)))
        else:
            out.append(Case("angle", dtype, f"n={n}", B_ENC * n * isz + amps * isz, make,
                            lambda d: (d["x"],),
                            lambda d, n=n: torch.empty(B_ENC, 1 << n, device="cuda", dtype=tdt),
                            lambda d, n=n: _angle64(d["x"].double(), n)))
    return out


def _bits(n: int, dtype: Any) -> Any:
    import torch

    idx = torch.arange(1 << n, device="cuda")
    return ((idx[:, None] >> torch.arange(n, device="cuda")[None, :]) & 1).to(dtype)


def _phase64(x: Any, n: int, norm: float) -> Any:
    import torch

    phi = x @ _bits(n, torch.float64).T
    return torch.complex(torch.cos(phi) * norm, torch.sin(phi) * norm)


def _angle64(x: Any, n: int) -> Any:
    import torch

    bits = _bits(n, torch.bool)
    s, c = torch.sin(x), torch.cos(x)
    out = torch.ones(x.shape[0], 1 << n, device="cuda", dtype=torch.float64)
    for k in range(n):
        out *= torch.where(bits[None, :, k], s[:, k:k + 1], c[:, k:k + 1])
    return out


# ---- peers: Triton kernels written for the same math ----
try:
    import triton
    import triton.language as tl
    TRITON_ERR = ""
except Exception as _exc:  # the script still runs: Triton cells say why they are empty
    triton = None
    TRITON_ERR = _reason(_exc)

_libdevice: Any = None
if triton is not None:
    for _mod in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            import importlib

            _libdevice = importlib.import_module(_mod)
            break
        except Exception:
            continue

    @triton.jit
    def _t_axpy(x_ptr, y_ptr, z_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        y = tl.load(y_ptr + offs, mask=m)
        tl.store(z_ptr + offs, a * x + y, mask=m)

    if _libdevice is not None:
        @triton.jit
        def _t_gelu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            x = tl.load(x_ptr + offs, mask=m)
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            tl.store(y_ptr + offs, 0.5 * x * (1.0 + _libdevice.tanh(u)), mask=m)
    else:
        @triton.jit
        def _t_gelu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            x = tl.load(x_ptr + offs, mask=m)
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            tl.store(y_ptr + offs, 0.5 * x * (2.0 * tl.sigmoid(2.0 * u)), mask=m)

    @triton.jit
    def _t_softmax(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=m)

    @triton.jit
    def _t_layernorm(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=m, other=0.0)
        mean = tl.sum(x, axis=0) / n_cols
        d = tl.where(m, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + offs, mask=m)
        b = tl.load(b_ptr + offs, mask=m)
        tl.store(y_ptr + row * n_cols + offs, d * rstd * w + b, mask=m)

    @triton.jit
    def _t_sum_partial(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in tl.static_range(ITERS):
            offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(part_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit
    def _t_sum_final(part_ptr, out_ptr, m, BLOCK: tl.constexpr):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, m, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(part_ptr + offs, mask=offs < m, other=0.0)
        tl.store(out_ptr, tl.sum(acc, axis=0))

    @triton.jit
    def _t_masked_mean(x_ptr, m_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        cnt = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            inb = offs < n_cols
            x = tl.load(x_ptr + row * n_cols + offs, mask=inb, other=0.0)
            keep = tl.load(m_ptr + row * n_cols + offs, mask=inb, other=0) != 0
            acc += tl.where(keep, x, 0.0)
            cnt += keep.to(tl.float32)
        tl.store(out_ptr + row, tl.sum(acc, axis=0) / tl.sum(cnt, axis=0))


def _row_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 4096 else 16


def triton_build(workload: str, d: dict) -> tuple[Callable[[], Any], Any]:
    """Launch closure and output buffer of the Triton kernel for ``workload`` on inputs ``d``."""
    import torch

    if triton is None:
        raise RuntimeError(f"triton import failed: {TRITON_ERR}")
    x = d["x"]
    if workload in ("axpy", "gelu"):
        n, block = x.numel(), 4096
        grid = (triton.cdiv(n, block),)
        z = torch.empty_like(x)
        if workload == "axpy":
            y = d["y"]
            return (lambda: _t_axpy[grid](x, y, z, A, n, BLOCK=block, num_warps=8)), z
        return (lambda: _t_gelu[grid](x, z, n, BLOCK=block, num_warps=8)), z
    if workload in ("softmax", "layernorm"):
        rows, cols = x.shape
        block = triton.next_power_of_2(cols)
        nw, z = _row_warps(block), torch.empty_like(x)
        if workload == "softmax":
            return (lambda: _t_softmax[(rows,)](x, z, cols, BLOCK=block, num_warps=nw)), z
        w, b = d["w"], d["bias"]
        return (lambda: _t_layernorm[(rows,)](x, w, b, z, cols, EPS, BLOCK=block,
                                              num_warps=nw)), z
    if workload == "total":
        n, block, iters = x.numel(), 4096, 8
        parts = torch.empty(triton.cdiv(n, block * iters), device=x.device, dtype=torch.float32)
        z = torch.empty((), device=x.device, dtype=torch.float32)
        m = parts.numel()

        def run() -> None:
            _t_sum_partial[(m,)](x, parts, n, BLOCK=block, ITERS=iters, num_warps=8)
            _t_sum_final[(1,)](parts, z, m, BLOCK=1024, num_warps=4)
        return run, z
    if workload == "masked_mean":
        rows, cols = x.shape
        mask = d["mask"].view(torch.uint8)
        block = min(4096, triton.next_power_of_2(cols))
        z = torch.empty(rows, device=x.device, dtype=torch.float32)
        return (lambda: _t_masked_mean[(rows,)](x, mask, z, cols, BLOCK=block, num_warps=8)), z
    raise KeyError(workload)


# ---- peers: PyTorch eager ----
EAGER_DOC = {"axpy": "torch.add(y, x, alpha=a)", "gelu": "F.gelu(x, approximate='tanh')",
             "softmax": "torch.softmax(x, -1)", "layernorm": "F.layer_norm(x, ..., w, b, eps)",
             "total": "x.sum()", "masked_mean": "where(mask, x, 0).sum(-1) / mask.sum(-1)",
             "phase": "x @ bits.T, complex(cos·norm, sin·norm) (bits precomputed)",
             "angle": "loop over k: out *= where(bit_k, sin x_k, cos x_k) (bits precomputed)"}


def eager_build(workload: str, d: dict) -> tuple[Callable[[], Any], None]:
    """The same math as torch ops (the library's fused op where one exists)."""
    import torch
    import torch.nn.functional as F

    x = d["x"]
    if workload == "axpy":
        y = d["y"]
        return (lambda: torch.add(y, x, alpha=A)), None
    if workload == "gelu":
        return (lambda: F.gelu(x, approximate="tanh")), None
    if workload == "softmax":
        return (lambda: torch.softmax(x, -1)), None
    if workload == "layernorm":
        w, b = d["w"], d["bias"]
        return (lambda: F.layer_norm(x, (x.shape[-1],), w, b, EPS)), None
    if workload == "total":
        return (lambda: x.sum()), None
    if workload == "masked_mean":
        mask = d["mask"]
        return (lambda: torch.where(mask, x, 0.0).sum(-1) / mask.sum(-1)), None
    n = x.shape[1]
    if workload == "phase":
        bits_t = _bits(n, x.dtype).T.contiguous()
        norm = 2.0 ** (-n / 2)

        def phase() -> Any:
            phi = x @ bits_t
            return torch.complex(torch.cos(phi) * norm, torch.sin(phi) * norm)
        return phase, None
    bits = _bits(n, torch.bool)

    def angle() -> Any:
        s, c = torch.sin(x), torch.cos(x)
        out = torch.where(bits[None, :, 0], s[:, :1], c[:, :1])
        for k in range(1, n):
            out *= torch.where(bits[None, :, k], s[:, k:k + 1], c[:, k:k + 1])
        return out
    return angle, None


# ---- peers: CUDA C through NVRTC (cupy.RawKernel) ----
NVRTC_SRC = string.Template(r"""
extern "C" __global__ void phase_$T(const $T* __restrict__ x, ${T}2* __restrict__ out, int n,
                                    long long total, $T norm) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  long long idx = i & ((1LL << n) - 1);
  const $T* xb = x + (i >> n) * n;
  $T phi = 0;
  for (int k = 0; k < n; ++k) phi += xb[k] * ($T)((idx >> k) & 1);
  $T s, c;
  $SINCOS(phi, &s, &c);
  out[i] = make_${T}2(c * norm, s * norm);
}

extern "C" __global__ void angle_$T(const $T* __restrict__ x, $T* __restrict__ out, int n,
                                    long long total) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  long long idx = i & ((1LL << n) - 1);
  const $T* xb = x + (i >> n) * n;
  $T p = 1;
  for (int k = 0; k < n; ++k) {
    $T s, c;
    $SINCOS(xb[k], &s, &c);
    p *= ((idx >> k) & 1) ? s : c;
  }
  out[i] = p;
}
""")
_NVRTC_KERNELS: dict[tuple[str, str], Any] = {}


def nvrtc_source(dtype: str) -> str:
    """The CUDA C for ``float32`` or ``float64``: one thread per amplitude, a loop over k,
    ``sincos`` (no fast-math)."""
    t = "float" if dtype == "float32" else "double"
    return NVRTC_SRC.substitute(T=t, SINCOS="sincosf" if t == "float" else "sincos")


def nvrtc_build(workload: str, dtype: str, d: dict) -> tuple[Callable[[], Any], Any]:
    import cupy
    import numpy as np
    import torch

    key = (workload, dtype)
    if key not in _NVRTC_KERNELS:
        t = "float" if dtype == "float32" else "double"
        kern = cupy.RawKernel(nvrtc_source(dtype), f"{workload}_{t}")
        kern.compile()
        _NVRTC_KERNELS[key] = kern
    kern = _NVRTC_KERNELS[key]
    x = d["x"]
    b, n = x.shape
    total = b << n
    scalar = np.float32 if dtype == "float32" else np.float64
    if workload == "phase":
        out = torch.empty(b, 1 << n, device=x.device,
                          dtype=torch.complex64 if dtype == "float32" else torch.complex128)
        args = (cupy.asarray(x), cupy.asarray(torch.view_as_real(out)), np.int32(n),
                np.int64(total), scalar(2.0 ** (-n / 2)))
    else:
        out = torch.empty(b, 1 << n, device=x.device, dtype=x.dtype)
        args = (cupy.asarray(x), cupy.asarray(out), np.int32(n), np.int64(total))
    grid = ((total + 255) // 256,)
    return (lambda: kern(grid, (256,), args)), out


# ---- running and reporting ----
@dataclass
class Meas:
    """One implementation on one case: a median time, or why there is none."""

    ms: float | None = None
    err: float | None = None
    note: str = ""


Builder = Callable[[dict], tuple[Callable[[], Any], Any]]


def run_case(case: Case, impls: dict[str, Builder | str], timing: dict) -> dict[str, Meas]:
    """Check every implementation on fresh inputs against the float64 reference, then time the
    correct ones (rotating input/output sets when one set would sit in L2)."""
    import torch

    d0 = case.make()
    ref = case.ref(d0)
    sets = [d0] + [case.make() for _ in range(gt.rotation_count(case.nbytes) - 1)]
    torch.cuda.synchronize()
    tol = TOL[case.dtype]
    results: dict[str, Meas] = {}
    for name, build in impls.items():
        if isinstance(build, str):
            results[name] = Meas(note=build)
            continue
        try:
            fn, out = build(d0)
            if out is not None:
                out.fill_(math.nan)  # poison: an element the kernel skips fails the check
            got = fn()
            torch.cuda.synchronize()
            err = gt.rel_err(out if out is not None else got, ref)
            del got
            if not err <= tol:
                results[name] = Meas(err=err, note=f"wrong: rel err {err:.2e} > {tol:g}")
                continue
            fns = [fn] + [build(s)[0] for s in sets[1:]]
            results[name] = Meas(gt.median_ms(fns, **timing), err)
        except Exception as exc:  # per implementation: report and go on
            results[name] = Meas(note=f"not available: {_reason(exc)}")
    del sets, d0, ref
    torch.cuda.empty_cache()
    return results


def kp_builder(pack: Any, program: str, case: Case) -> Builder:
    prog = pack[program]

    def build(d: dict) -> tuple[Callable[[], Any], Any]:
        out, args = case.out_like(d), case.kp_args(d)
        return (lambda: prog(*args, out=out)), out
    return build


def _cell(m: Meas, nbytes: int, copy_bw: float) -> str:
    if m.ms is None:
        return m.note
    return f"{m.ms:.3f} ms ({nbytes / (m.ms * 1e-3) / copy_bw:.0%})"


def _ratio(a: Meas, b: Meas) -> str:
    return f"{a.ms / b.ms:.2f}" if a.ms and b.ms else "–"


def _err(m: Meas) -> str:
    if m.err is None:
        return "–"
    return "0 (bit-identical)" if m.err == 0 else f"{m.err:.1e}"


def _targets(case: Case, r: dict[str, Meas], copy_bw: float) -> str:
    kpm = r["kernelpack"]
    if kpm.ms is None:
        return "–"
    need = 0.9 if case.workload in POINTWISE else 0.8
    frac = case.nbytes / (kpm.ms * 1e-3) / copy_bw
    out = [f"bw≥{need:.0%}: {'yes' if frac >= need else 'no'}"]
    for peer in ("eager", "Triton"):
        if r[peer].ms:
            out.append(f"≤{peer}: {'yes' if kpm.ms <= r[peer].ms else 'no'}")
    return ", ".join(out)


def run_workloads(names: set[str], quick: bool, copy_bw: float, timing: dict, arch: str,
                  sink: Path | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """Compile, check and time the workloads in ``names`` in this process → table rows.
    With ``sink``, the rows so far are rewritten there (JSON) after every case, so a parent
    that has to kill this process for time still gets them."""
    import json

    workdir = Path(tempfile.mkdtemp(prefix="kp-bench-"))
    pack, missing = build_pack(names, arch, workdir)
    std_rows: list[list[str]] = []
    enc_rows: list[list[str]] = []
    for workload in [w for w in STANDARD + ENCODINGS if w in names]:
        dtypes = ("float32",) if workload in STANDARD else ("float32", "float64")
        for dtype in dtypes:
            program = f"{workload}_{dtype}"
            try:
                cases = (standard_cases(workload, quick) if workload in STANDARD
                         else encoding_cases(workload, dtype, quick))
            except Exception as exc:
                print(f"{program}: cannot build cases: {_reason(exc)}")
                continue
            for case in cases:
                impls: dict[str, Builder | str] = {}
                if program in missing or pack is None:
                    impls["kernelpack"] = "not available: " + missing.get(program, "no artifact")
                else:
                    impls["kernelpack"] = kp_builder(pack, program, case)
                if workload in STANDARD:
                    impls["eager"] = lambda d, w=workload: eager_build(w, d)
                    impls["Triton"] = lambda d, w=workload: triton_build(w, d)
                else:
                    impls["NVRTC"] = lambda d, w=workload, t=dtype: nvrtc_build(w, t, d)
                    impls["eager"] = lambda d, w=workload: eager_build(w, d)
                t0 = time.perf_counter()
                try:
                    r = run_case(case, impls, timing)
                except Exception as exc:
                    r = {k: Meas(note=f"not available: {_reason(exc)}") for k in impls}
                mib = f"{case.nbytes / 2**20:.0f}"
                if workload in STANDARD:
                    row = [workload, case.label, mib,
                           *(_cell(r[k], case.nbytes, copy_bw)
                             for k in ("kernelpack", "eager", "Triton")),
                           _ratio(r["kernelpack"], r["eager"]),
                           _ratio(r["kernelpack"], r["Triton"]),
                           _err(r["kernelpack"]), _targets(case, r, copy_bw)]
                    std_rows.append(row)
                else:
                    row = [workload, dtype, case.label, mib,
                           *(_cell(r[k], case.nbytes, copy_bw)
                             for k in ("kernelpack", "NVRTC", "eager")),
                           _ratio(r["kernelpack"], r["NVRTC"]),
                           _ratio(r["kernelpack"], r["eager"]), _err(r["kernelpack"])]
                    enc_rows.append(row)
                print(" | ".join(row), f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
                if sink is not None:
                    sink.write_text(json.dumps({"std": std_rows, "enc": enc_rows}))
    return std_rows, enc_rows


def run_isolated(names: set[str], args: argparse.Namespace, copy_bw: float,
                 started: float) -> tuple[list[list[str]], list[list[str]]]:
    """One child process per workload, so that a kernel that faults (a sticky CUDA error
    poisons the whole context) or hangs costs that workload's rows only. With ``--budget``,
    children get only the time left, and workloads that would start too late are listed as
    not run."""
    import json
    import subprocess

    std_rows: list[list[str]] = []
    enc_rows: list[list[str]] = []

    def fail(workload: str, reason: str) -> None:
        if workload in STANDARD:
            std_rows.append([workload, "–", "–", reason, "–", "–", "–", "–", "–", "–"])
        else:
            enc_rows.append([workload, "–", "–", "–", reason, "–", "–", "–", "–", "–"])

    for workload in [w for w in STANDARD + ENCODINGS if w in names]:
        limit = args.child_timeout or (90.0 if args.quick else 240.0)
        if args.budget:
            left = args.budget - (time.perf_counter() - started)
            if left < 20:
                fail(workload, f"not run: the --budget of {args.budget:.0f} s was spent")
                continue
            limit = min(limit, left)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--only", workload,
               "--child-json", path, "--copy-bw", repr(copy_bw), "--no-write"]
        cmd += ["--quick"] if args.quick else []
        t0 = time.perf_counter()
        try:
            try:
                proc = subprocess.run(cmd, timeout=limit)
                status = f"child exited with status {proc.returncode}" if proc.returncode else ""
            except subprocess.TimeoutExpired:
                status = f"child stopped after {limit:.0f} s"
            data = json.loads(Path(path).read_text() or "null") or {"std": [], "enc": []}
            std_rows += data["std"]
            enc_rows += data["enc"]
            if status:
                fail(workload, f"not available: {status}" + (" (rows above are complete)"
                                                            if data["std"] or data["enc"]
                                                            else ""))
        except Exception as exc:  # unreadable rows: say so in the table, go on
            fail(workload, f"not available: {_reason(exc)}")
        finally:
            os.unlink(path)
        print(f"[{workload}: {time.perf_counter() - t0:.1f} s]", flush=True)
    return std_rows, enc_rows


def main() -> int:
    from _cli import parser_for

    parser = parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--only", default="", help="comma-separated workloads "
                        f"({', '.join(STANDARD + ENCODINGS)})")
    parser.add_argument("--md", default=None, help="also write the section to this file "
                        "(default: $OUT/kernels.md when $OUT is set)")
    parser.add_argument("--no-write", action="store_true", help="do not append to RESULTS.md")
    parser.add_argument("--in-process", action="store_true",
                        help="run every workload in this process (default: one child each)")
    parser.add_argument("--child-timeout", type=float, default=None,
                        help="seconds one workload's child may take (default 90 quick, 240)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; workloads that would start later are "
                        "reported as not run")
    parser.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--copy-bw", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    started = time.perf_counter()
    names = set(STANDARD + ENCODINGS)
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = wanted - names
        if unknown:
            parser.error(f"--only: unknown workload(s) {sorted(unknown)} (known: "
                         f"{', '.join(STANDARD + ENCODINGS)})")
        names = wanted
    try:
        import torch
    except ImportError as exc:
        print(f"benchmarks/kernels.py needs torch and a CUDA GPU: {exc}")
        return 1
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU; torch sees none")
        return 1
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the eager phase peer's matmul: true float32
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm_{major}{minor}"
    timing = ({"warmup_ms": 10.0, "rep_ms": 40.0} if args.quick
              else {"warmup_ms": 25.0, "rep_ms": 150.0})
    if args.child_json:
        import json

        std_rows, enc_rows = run_workloads(names, args.quick, args.copy_bw, timing, arch,
                                           sink=Path(args.child_json))
        Path(args.child_json).write_text(json.dumps({"std": std_rows, "enc": enc_rows}))
        return 0
    info = gt.device_info()
    print(f"device {info['device']}, driver {info['driver']}, torch {info['torch']}, "
          f"triton {getattr(triton, '__version__', 'missing: ' + TRITON_ERR)}")
    copy_bw = gt.copy_bandwidth(1 << 30, **timing)
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write, 1 GiB buffers)",
          flush=True)
    if args.in_process:
        std_rows, enc_rows = run_workloads(names, args.quick, copy_bw, timing, arch)
    else:
        std_rows, enc_rows = run_isolated(names, args, copy_bw, started)

    body = [f"`python benchmarks/kernels.py{' --quick' if args.quick else ''}"
            f"{' --only ' + args.only if args.only else ''}`; torch {info['torch']}, "
            f"Triton {getattr(triton, '__version__', 'missing')}; kernelpack compiled for "
            f"{arch}. Device-to-device copy bandwidth in this run: **{copy_bw / 1e9:.0f} GB/s** "
            "(read + write). Cells: median time (CUDA events, L2 flushed between calls) and, in "
            "parentheses, bytes read + written once / time as a fraction of that copy "
            "bandwidth. Ratios are t_kernelpack / t_peer (below 1: kernelpack faster). "
            "Errors: ‖out − ref‖₂/‖ref‖₂ against float64 torch.", ""]
    if std_rows:
        body += gt.markdown_table(["workload", "shape", "MiB moved", "kernelpack", "torch eager",
                                   "Triton", "kp/eager", "kp/Triton", "kp rel err", "targets"],
                                  std_rows, "llrrrrrrrl")
        body += ["", "Eager peers: " + "; ".join(f"{k}: `{EAGER_DOC[k]}`" for k in STANDARD
                                                  if k in names) + ".", ""]
    if enc_rows:
        body += [f"Quantum encodings, B = {B_ENC}; peers: CUDA C compiled with NVRTC "
                 "(cupy.RawKernel; one thread per amplitude, loop over k, sincos) and torch "
                 "eager (" + "; ".join(f"{k}: `{EAGER_DOC[k]}`" for k in ENCODINGS
                                       if k in names) + ").", ""]
        body += gt.markdown_table(["encoding", "dtype", "n", "MiB moved", "kernelpack",
                                   "NVRTC CUDA C", "torch eager", "kp/NVRTC", "kp/eager",
                                   "kp rel err"], enc_rows, "lllrrrrrrr")
    md_out = args.md or (str(Path(os.environ["OUT"]) / "kernels.md") if os.environ.get("OUT")
                         else None)
    section = gt.append_results(f"GPU kernels (`benchmarks/kernels.py`"
                                f"{' --quick' if args.quick else ''})", body,
                                results=None if args.no_write else gt.RESULTS, md_out=md_out)
    print("\n" + section)
    print(f"[kernels.py: {time.perf_counter() - started:.0f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
