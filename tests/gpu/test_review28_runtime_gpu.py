"""Review 28: the GPU runtime as an inference server meets it, tested from the outside.

Beyond review 27 (tests/gpu/test_review27_api_gpu.py): layouts that torch or CuPy call
contiguous but are odd (stride-0 or transposed size-1 dims, empty slices), layouts that are
not (transposed squares, CuPy's negative and Fortran strides, broadcasts, sparse tensors) once
a program's fast path is warm, mixing torch with CuPy, ``requires_grad`` tensors and
``nn.Parameter``, CPU tensors that are empty, ``out=`` aliasing an input (pointwise, two
outputs, every softmax variant in place) or partially overlapping a broadcast input, ``out=``
views whose neighbours must stay untouched, streams observed by ordering (a stream kept busy by
``torch.cuda._sleep`` shows where a launch went and whether the host waited), raw stream
handles 1 and 2, outputs from the launch stream's pool, foreign arrays pending on a stream
(CAI v3 ``stream``, DLPack) and kernelpack buffers handed on to torch and CuPy, graph capture
(torch and CuPy) of a first call / an allocating call / a zero-initialised repeated launch,
sixteen threads on a freshly loaded pack, ``torch.cuda.empty_cache()`` and leaks, scalars at
the edges of their dtype (a ``kp.u64`` scalar over its whole range), tensors of a few hundred
MB and of more than 2^31 elements, and a launch whose grid's y dimension passes 65535.

Checks that could leave the CUDA context broken (misaligned vector accesses, 32-bit index
overflow, graph capture) run in child processes, concurrently, so one fault cannot hide the
others. Every GPU test is marked ``gpu`` and skips with a reason where torch sees no CUDA
device; the CPU test compiles, saves, loads and plans every program of this file.
"""
import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from .torch_checks import check as _check, cuda as _cuda, host as _host
from .torch_checks import poisoned as _poisoned, targets, untouched as _untouched
from .torch_checks import NO_GPU as _NO_GPU, on_gpu, torch
from kernelpack.errors import ConstraintError, KernelPackError, LaunchError


# --------------------------------------------------------------------------------------------
# programs


@kp.fusion
def r28_axpy(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"], a: kp.f32):
    return x * a + y


@kp.fusion
def r28_rowscale(x: kp.Tensor[kp.f32, "b", "n"], w: kp.Tensor[kp.f32, "n"]):
    return x * w


@kp.fusion
def r28_two(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
    return x * s, x + s


@kp.fusion
def r28_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@kp.fusion
def r28_colsum(x: kp.Tensor[kp.f32, "b", "n"]):
    return x.sum(axis=0)


@kp.fusion
def r28_rowsum(x: kp.Tensor[kp.f32, "b", "n"]):
    return x.sum(axis=1)


@kp.fusion
def r28_center(x: kp.Tensor[kp.f32, "b", "n"]):
    return x - x.mean(axis=0, keepdims=True)


@kp.fusion
def r28_mid(x: kp.Tensor[kp.f32, "a", "b", "c"]):
    return x.mean(axis=1)


@kp.fusion
def r28_hadd(x: kp.Tensor[kp.f16, "n"], s: kp.f16):
    return x + s


@kp.fusion
def r28_bfadd(x: kp.Tensor[kp.bf16, "n"], s: kp.bf16):
    return x + s


@kp.fusion
def r28_iadd(x: kp.Tensor[kp.i32, "n"], k: kp.i32):
    return x + k


@kp.fusion
def r28_lxor(x: kp.Tensor[kp.i64, "n"], k: kp.i64):
    return x ^ k


@kp.fusion
def r28_uxor(x: kp.Tensor[kp.u64, "n"], k: kp.u64):
    return x ^ k


@kp.fusion
def r28_dscale(x: kp.Tensor[kp.f64, "n"], s: kp.f64):
    return x * s


@kp.fusion
def r28_u8inc(x: kp.Tensor[kp.u8, "n"]):
    return x + 1


@kp.fusion
def r28_i8total(x: kp.Tensor[kp.i8, "n"]):
    return x.astype(kp.i64).sum()


FUSIONS = [r28_axpy, r28_rowscale, r28_two, r28_softmax, r28_colsum, r28_rowsum, r28_center,
           r28_mid, r28_hadd, r28_bfadd, r28_iadd, r28_lxor, r28_uxor, r28_dscale, r28_u8inc,
           r28_i8total]

# Two external kernels of one CUDA C module: a zero-initialised output and scratch written by
# a launch repeated three times with its loop counter (out = (1 + 4 + 9) x = 14 x when both
# start at zero), and a launch with one block per element along grid y.
EXT_CUDA = r"""
extern "C" __global__ void r28_accum(const float* x, float* out, float* ws, unsigned n,
                                     unsigned k) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { ws[i] += x[i]; out[i] += ws[i] * (float)(k + 1); }
}
extern "C" __global__ void r28_fill_y(float* x, unsigned n) {
    unsigned i = blockIdx.y;
    if (i < n && threadIdx.x == 0) x[i] = (float)i;
}
"""


def _externals() -> list:
    accum = kp.external(
        "r28_accum", "r28_accum",
        params=[kp.Tensor("x", kp.f32, ["n"]),
                kp.Tensor("out", kp.f32, ["n"], role="out", zero_init=True)],
        grid=kp.cdiv("n", 256), block=256, cuda=EXT_CUDA, targets=targets(_NO_GPU),
        module="r28_ext", scratch=[kp.Scratch("ws", kp.f32, ("n",), zero_init=True)],
        count=3, loop="k",
        args=["x", "out", "ws", (kp.sym("n"), kp.u32), (kp.sym("k"), kp.u32)])
    fill_y = kp.external(
        "r28_fill_y", "r28_fill_y",
        params=[kp.Tensor("x", kp.f32, ["n"], role="inout"),
                kp.Scalar("n32", kp.u32, value="n")],
        grid=(1, kp.sym("n"), 1), block=32, cuda=EXT_CUDA, targets=targets(_NO_GPU),
        module="r28_ext")
    return [accum, fill_y]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    compiled = [kp.compile(f, targets=targets(_NO_GPU)) for f in FUSIONS] + _externals()
    path = tmp_path_factory.mktemp("r28") / "r28.kpack"
    kp.save(compiled, path)
    return path


@pytest.fixture(scope="module")
def pack(artifact):
    return kp.load(artifact)


# --------------------------------------------------------------------------------------------
# helpers


def _softmax_ref(x: np.ndarray, s: float) -> np.ndarray:
    z = x.astype(np.float64) * np.float64(np.float32(s))
    if z.size == 0:
        return z
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# A stream kept busy for about a second (the H200 runs near 2 GHz): a launch queued behind it
# has not run when another stream is synchronized, which shows which stream a call used.
_SPIN_CYCLES = 2_000_000_000


def _spin(stream) -> None:
    with torch.cuda.stream(stream):
        torch.cuda._sleep(_SPIN_CYCLES)


# --------------------------------------------------------------------------------------------
# CPU: every program compiles for sm_90, saves, loads and plans


def test_every_program_compiles_saves_loads_and_plans(artifact) -> None:
    pack = kp.load(artifact)
    assert sorted(pack.programs) == sorted([f.name for f in FUSIONS] + ["r28_accum",
                                                                         "r28_fill_y"])
    plan = pack["r28_accum"].plan(x=(1000,))
    assert len(plan.launches) == 3
    assert plan.allocations["out"].zero_init and plan.allocations["ws"].zero_init
    assert pack["r28_fill_y"].plan(x=(65535,)).launches[0].grid == (1, 65535, 1)
    with pytest.raises(ConstraintError, match="65535"):
        pack["r28_fill_y"].plan(x=(65536,))
    # the shapes the GPU tests use take the variants they are meant to exercise
    assert any(a.kind == "scratch"
               for a in pack["r28_softmax"].plan(x=(3, 70000), s=1.0).allocations.values())
    assert any(a.kind == "scratch"
               for a in pack["r28_colsum"].plan(x=(1000, 3000)).allocations.values())
    assert pack["r28_colsum"].plan(x=(0, 7)).allocations["out"].shape == (7,)
    assert pack["r28_rowsum"].plan(x=(7, 0)).allocations["out"].shape == (7,)
    assert pack["r28_u8inc"].plan(x=((1 << 31) + 77,)).launches[0].grid[0] <= 65535


# --------------------------------------------------------------------------------------------
# layouts: what is accepted, what is refused (naming the parameter), after warm calls


@on_gpu
def test_warm_fast_path_still_refuses_layouts_torch_does_not_call_contiguous(pack) -> None:
    """Same shape and dtype as the warm calls, only the strides differ: the C fast path must
    look at strides on every call, not at the shape it cached."""
    rs, ax, sm = pack["r28_rowscale"], pack["r28_axpy"], pack["r28_softmax"]
    x = torch.randn(64, 64, device="cuda")
    w = torch.randn(64, device="cuda")
    v = torch.randn(4096, device="cuda")
    o = _poisoned((64, 64))
    for _ in range(4):  # bind, then the fast path
        rs(x, w, out=o)
        ax(v, v, 2.0)
        sm(x, 1.0, out=o)
    o.fill_(float("nan"))
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        rs(x.t(), w, out=o)  # a transposed square: same shape, strides (1, 64)
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        sm(x.t(), 1.0, out=o)
    with pytest.raises(LaunchError, match=r"'x'.*contiguous"):
        rs(torch.randn(64, device="cuda").expand(64, 64), w, out=o)  # stride (0, 1)
    with pytest.raises(LaunchError, match=r"'x'"):
        rs(x.as_strided((64, 64), (1, 1)), w, out=o)  # rows overlapping each other
    with pytest.raises(LaunchError, match=r"'y'.*contiguous"):
        ax(v, torch.randn(1, device="cuda").expand(4096), 2.0)
    with pytest.raises(LaunchError, match=r"'w'.*contiguous"):
        rs(x, torch.randn(128, device="cuda")[::2], out=o)
    with pytest.raises(LaunchError, match="contiguous"):
        rs(x, w, out=_poisoned((64, 64)).t())  # out= transposed
    assert _untouched(o)
    assert rs(x, w, out=o) is o
    _check(_host(o), _host(x).astype(np.float64) * _host(w), 1e-6, "after the refusals")


@on_gpu
def test_contiguous_layouts_with_odd_strides_are_accepted(pack) -> None:
    """torch calls these contiguous (a size-1 dim's stride and an empty tensor's strides
    address nothing): a stride-0 size-1 dim, a transposed (n, 1), an empty column slice."""
    rs, rowsum, sm = pack["r28_rowscale"], pack["r28_rowsum"], pack["r28_softmax"]
    w = torch.randn(300, device="cuda")
    for x in (torch.randn(300, device="cuda").expand(1, 300),   # strides (0, 1)
              torch.randn(300, 1, device="cuda").t(),           # strides (1, 1)
              torch.randn(1, 1, device="cuda").expand(1, 300).contiguous()):
        assert x.is_contiguous()
        _check(_host(rs(x, w)), _host(x).astype(np.float64) * _host(w), 1e-6,
               f"rowscale strides {x.stride()}")
        _check(_host(sm(x, 0.5)), _softmax_ref(_host(x), 0.5), 1e-5,
               f"softmax strides {x.stride()}")
    empty_cols = torch.randn(6, 10, device="cuda")[:, :0]  # (6, 0), strides (10, 1)
    assert empty_cols.is_contiguous()
    got = rowsum(empty_cols)
    assert tuple(got.shape) == (6,)
    np.testing.assert_array_equal(_host(got), np.zeros(6, np.float32))
    empty_t = torch.empty(0, 5, device="cuda").t()  # (5, 0), strides (1, 5)
    assert empty_t.is_contiguous()
    got = rowsum(empty_t)
    assert tuple(got.shape) == (5,)
    np.testing.assert_array_equal(_host(got), np.zeros(5, np.float32))


@on_gpu
def test_zero_size_inputs_of_every_kind(pack) -> None:
    ax, colsum, rowsum = pack["r28_axpy"], pack["r28_colsum"], pack["r28_rowsum"]
    e = torch.empty(0, device="cuda")
    got = ax(e, e, 2.0)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (0,)
    got = colsum(torch.empty(0, 7, device="cuda"))  # a sum over an empty axis: zeros
    np.testing.assert_array_equal(_host(got), np.zeros(7, np.float32))
    got = rowsum(torch.empty(7, 0, device="cuda"))
    np.testing.assert_array_equal(_host(got), np.zeros(7, np.float32))
    got = colsum(torch.empty(7, 0, device="cuda"))
    assert tuple(got.shape) == (0,)
    assert tuple(pack["r28_center"](torch.empty(0, 7, device="cuda")).shape) == (0, 7)
    assert tuple(pack["r28_mid"](torch.empty(2, 0, 3, device="cuda")).shape) == (2, 3)
    assert int(pack["r28_i8total"](torch.empty(0, dtype=torch.int8, device="cuda"))) == 0
    o = _poisoned((7,))
    assert colsum(torch.empty(0, 7, device="cuda"), out=o) is o
    np.testing.assert_array_equal(_host(o), np.zeros(7, np.float32))  # written, not left NaN
    oa = _poisoned((7,))
    assert pack["r28_accum"](torch.zeros(7, device="cuda"), out=oa) is oa
    np.testing.assert_array_equal(_host(oa), np.zeros(7, np.float32))


@on_gpu
def test_cpu_tensors_are_refused_even_when_empty(pack) -> None:
    ax = pack["r28_axpy"]
    g = torch.empty(0, device="cuda")
    with pytest.raises(LaunchError, match=r"'x'"):
        ax(torch.empty(0), g, 1.0)
    with pytest.raises(LaunchError, match=r"'y'"):
        ax(g, torch.empty(0), 1.0)
    with pytest.raises(LaunchError, match=r"'x'"):
        ax(np.empty(0, np.float32), g, 1.0)
    with pytest.raises(LaunchError, match=r"'x'"):
        pack["r28_colsum"](torch.empty(0, 4))
    with pytest.raises(LaunchError):
        ax(g, g, 1.0, out=torch.empty(0))  # an empty CPU out=


@on_gpu
def test_cupy_layouts_negative_fortran_broadcast_and_offsets(pack) -> None:
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    ax, rs = pack["r28_axpy"], pack["r28_rowscale"]
    xh = _rng(1).standard_normal(1001).astype(np.float32)
    x = cupy.asarray(xh)
    for _ in range(3):  # warm
        ax(x, x, 1.0)
    out = cupy.full(1001, cupy.nan, cupy.float32)
    with pytest.raises(LaunchError, match=r"'x'"):
        ax(x[::-1], x, 2.0, out=out)  # a negative stride
    with pytest.raises(LaunchError, match=r"'y'"):
        ax(x, x[::-1], 2.0, out=out)
    m = cupy.asarray(_rng(2).standard_normal((40, 40)).astype(np.float32))
    wv = cupy.asarray(_rng(3).standard_normal(40).astype(np.float32))
    om = cupy.full((40, 40), cupy.nan, cupy.float32)
    for _ in range(3):
        rs(m, wv, out=om)
    om.fill(cupy.nan)
    with pytest.raises(LaunchError, match=r"'x'"):
        rs(cupy.asfortranarray(m), wv, out=om)
    with pytest.raises(LaunchError, match=r"'x'"):
        rs(m[::-1], wv, out=om)  # rows reversed: stride -160 bytes
    with pytest.raises(LaunchError, match=r"'w'"):
        rs(m, cupy.broadcast_to(cupy.asarray(2.0, cupy.float32), (40,)), out=om)  # stride 0
    with pytest.raises(LaunchError):
        rs(m, wv, out=cupy.asfortranarray(om))
    with pytest.raises(LaunchError):
        ax(x, x, 2.0, out=out[::-1])
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isnan(om).all()) and bool(cupy.isnan(out).all())
    # an offset view (a contiguous slice 4 bytes in) and empty arrays compute right
    v = x[1:]
    got = ax(v, v, 0.5)
    assert isinstance(got, cupy.ndarray)
    _check(cupy.asnumpy(got), xh[1:].astype(np.float64) * 1.5, 1e-6, "cupy offset view")
    e = cupy.empty(0, cupy.float32)
    got = ax(e, e, 1.0)
    assert isinstance(got, cupy.ndarray) and got.shape == (0,)
    got = pack["r28_rowsum"](cupy.empty((5, 0), cupy.float32))
    np.testing.assert_array_equal(cupy.asnumpy(got), np.zeros(5, np.float32))


# --------------------------------------------------------------------------------------------
# mixed frameworks, autograd tensors, inference mode


@on_gpu
def test_torch_and_cupy_arrays_mixed_in_one_call(pack) -> None:
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    ax = pack["r28_axpy"]
    xh = _rng(4).standard_normal(5003).astype(np.float32)
    yh = _rng(5).standard_normal(5003).astype(np.float32)
    xt, yc = _cuda(xh), cupy.asarray(yh)
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    ref = xh.astype(np.float64) * 3.0 + yh
    for args in ((xt, yc), (cupy.asarray(xh), _cuda(yh))):
        got = ax(*args, 3.0)
        assert isinstance(got, (torch.Tensor, cupy.ndarray)), type(got)
        host = _host(got) if isinstance(got, torch.Tensor) else cupy.asnumpy(got)
        _check(host, ref, 1e-6, f"mixed {type(args[0]).__name__} first")
    oc = cupy.full(5003, cupy.nan, cupy.float32)
    cupy.cuda.Device().synchronize()
    assert ax(xt, _cuda(yh), 3.0, out=oc) is oc  # torch inputs, a CuPy out=
    cupy.cuda.Device().synchronize()
    _check(cupy.asnumpy(oc), ref, 1e-6, "torch in, cupy out=")
    s = cupy.cuda.Stream(non_blocking=True)
    got = ax(xt, yc, 3.0, stream=s)  # torch and cupy inputs on a CuPy stream
    s.synchronize()
    host = _host(got) if isinstance(got, torch.Tensor) else cupy.asnumpy(got)
    _check(host, ref, 1e-6, "mixed on a cupy stream")


@on_gpu
def test_requires_grad_tensors_and_parameters_are_accepted(pack) -> None:
    """A server passes a model's weights (nn.Parameter, requires_grad=True) and activations
    computed outside no_grad: torch tensors like any other (issue 4: torch in, torch out)."""
    rs, sm = pack["r28_rowscale"], pack["r28_softmax"]
    xh = _rng(6).standard_normal((8, 257)).astype(np.float32)
    wh = _rng(7).standard_normal(257).astype(np.float32)
    ref = xh.astype(np.float64) * wh
    x = _cuda(xh).requires_grad_()
    w = torch.nn.Parameter(_cuda(wh))
    problems = []
    for name, args in (("x requires grad", (x, _cuda(wh))),
                       ("w is an nn.Parameter", (_cuda(xh), w)),
                       ("both", (x, w)),
                       ("a non-leaf activation", (x * 1.0, w))):
        for _ in range(3):  # the general path, then the fast path
            try:
                got = rs(*args)
            except Exception as exc:  # noqa: BLE001 - collected: every case is reported
                problems.append(f"{name}: {type(exc).__name__}: {exc}")
                break
            if not isinstance(got, torch.Tensor):
                problems.append(f"{name}: returned {type(got).__name__}, not a torch.Tensor")
                break
            _check(_host(got), ref, 1e-6, name)
    try:
        got = sm(x, 1.0)
        _check(_host(got), _softmax_ref(xh, 1.0), 1e-5, "softmax of a requires_grad input")
    except (KernelPackError, RuntimeError, TypeError) as exc:
        problems.append(f"softmax: {type(exc).__name__}: {exc}")
    assert not problems, "\n".join(problems)


@on_gpu
def test_inference_mode_tensors(pack) -> None:
    rs, colsum = pack["r28_rowscale"], pack["r28_colsum"]
    with torch.inference_mode():
        x = torch.randn(100, 300, device="cuda")
        w = torch.randn(300, device="cuda")
        for _ in range(3):
            got = rs(x, w)
            s = colsum(x)
        assert isinstance(got, torch.Tensor)
        _check(_host(got), _host(x).astype(np.float64) * _host(w), 1e-6, "inference mode")
        _check(_host(s), _host(x).astype(np.float64).sum(0), 1e-5, "colsum inference mode")


# --------------------------------------------------------------------------------------------
# out= aliasing and overlap


@on_gpu
def test_out_aliasing_an_input_exactly_pointwise(pack) -> None:
    ax, two, rs = pack["r28_axpy"], pack["r28_two"], pack["r28_rowscale"]
    xh = _rng(8).standard_normal(70001).astype(np.float32)
    yh = _rng(9).standard_normal(70001).astype(np.float32)
    x64, y64 = xh.astype(np.float64), yh.astype(np.float64)
    x, y = _cuda(xh), _cuda(yh)
    assert ax(x, y, 2.0, out=y) is y  # y <- 2x + y
    _check(_host(y), x64 * 2.0 + y64, 1e-6, "out= y")
    y = _cuda(yh)
    assert ax(x, y, 2.0, out=x) is x  # x <- 2x + y
    _check(_host(x), x64 * 2.0 + y64, 1e-6, "out= x")
    # two outputs of one kernel: in place over x, x is read from a copy since session 39
    # (refused in sessions 37-38: the kernel may load x for one output after storing the
    # other; review 48 saw it in pointwise tails)
    for k in range(2):
        x, other = _cuda(xh), _poisoned((70001,))
        out = (x, other) if k == 0 else (other, x)
        got = two(x, 3.0, out=out)
        assert got[k] is x
        _check(_host(got[0]), x64 * 3.0, 1e-6, f"two in place over out[{k}]: out[0]")
        _check(_host(got[1]), x64 + 3.0, 1e-6, f"two in place over out[{k}]: out[1]")
    x, a, b = _cuda(xh), _poisoned((70001,)), _poisoned((70001,))
    got = two(x, 3.0, out=(a, b))
    assert got[0] is a and got[1] is b
    _check(_host(a), x64 * 3.0, 1e-6, "two: out[0]")
    _check(_host(b), x64 + 3.0, 1e-6, "two: out[1]")
    # rowscale with one row: out= the broadcast input itself (same start, same size)
    wh = _rng(10).standard_normal(513).astype(np.float32)
    xr = _cuda(_rng(11).standard_normal((1, 513)).astype(np.float32))
    w = _cuda(wh)
    ref = _host(xr).astype(np.float64) * wh
    assert rs(xr, w, out=w.view(1, 513)) is not None
    _check(_host(w).reshape(1, 513), ref, 1e-6, "rowscale out= w")


@on_gpu
def test_out_partially_overlapping_a_broadcast_input_is_refused(pack) -> None:
    """README: an out= array that partially overlaps an input raises LaunchError (a race):
    out (2, n) starting where the broadcast w (n,) starts overlaps it without being it."""
    rs = pack["r28_rowscale"]
    n = 1000
    buf = torch.randn(2 * n, device="cuda")
    w = buf[:n]
    x = torch.randn(2, n, device="cuda")
    torch.cuda.synchronize()
    before = _host(buf).copy()
    with pytest.raises(LaunchError):
        rs(x, w, out=buf.view(2, n))
    np.testing.assert_array_equal(_host(buf), before)
    with pytest.raises(LaunchError):
        rs(x, buf[n // 2:n // 2 + n], out=buf.view(2, n))  # w inside out


_INPLACE = [(5, 100), (64, 1000), (4, 20000), (3, 70000), (1, 1 << 20), (300, 3)]


@on_gpu
@pytest.mark.parametrize("shape", _INPLACE, ids=[f"{b}x{n}" for b, n in _INPLACE])
def test_softmax_in_place_every_variant(pack, shape) -> None:
    """README: exact in-place use is defined for programs that read each element before
    writing it; softmax reads its whole row (max, sum) before writing any of it."""
    xh = (_rng(sum(shape)).standard_normal(shape) * 2).astype(np.float32)
    x = _cuda(xh)
    assert pack["r28_softmax"](x, 1.5, out=x) is x
    _check(_host(x), _softmax_ref(xh, 1.5), 1e-5, f"in-place softmax {shape}")


@on_gpu
@pytest.mark.parametrize("shape", [(10, 5), (100000, 30), (1000, 3000)])
def test_center_in_place(pack, shape) -> None:
    xh = _rng(shape[0]).standard_normal(shape).astype(np.float32) + 3
    x = _cuda(xh)
    assert pack["r28_center"](x, out=x) is x
    ref = xh.astype(np.float64) - xh.astype(np.float64).mean(0, keepdims=True)
    _check(_host(x), ref, 1e-5, f"in-place center {shape}")


@on_gpu
def test_out_of_the_right_size_but_another_shape_is_refused(pack) -> None:
    rs, colsum = pack["r28_rowscale"], pack["r28_colsum"]
    x = torch.randn(1, 50, device="cuda")
    w = torch.randn(50, device="cuda")
    o = _poisoned((50,))
    with pytest.raises(LaunchError, match="shape"):
        rs(x, w, out=o)  # 50 elements, rank 1 for a (1, 50) output
    o2 = _poisoned((50, 1))
    with pytest.raises(LaunchError, match="shape"):
        rs(x, w, out=o2)
    o3 = _poisoned((1,))
    with pytest.raises(LaunchError, match="shape"):
        pack["r28_i8total"](torch.ones(3, dtype=torch.int8, device="cuda"),
                            out=o3.to(torch.int64))
    o4 = _poisoned((1, 7))
    with pytest.raises(LaunchError, match="shape"):
        colsum(torch.randn(3, 7, device="cuda"), out=o4)
    assert _untouched(o, o2, o4)


# --------------------------------------------------------------------------------------------
# shapes and variants changing on the warm path


@on_gpu
def test_shapes_variants_and_scalars_changing_call_to_call(pack) -> None:
    sm, ax = pack["r28_softmax"], pack["r28_axpy"]
    shapes = [(5, 100), (64, 1000), (5, 100), (3, 70000), (4, 20000), (64, 1000), (1, 1),
              (3, 70000), (0, 4), (5, 100)]
    for k, shape in enumerate(shapes * 2):
        xh = _rng(k).standard_normal(shape).astype(np.float32)
        s = 0.25 + 0.5 * (k % 5)
        ref = _softmax_ref(xh, s)
        if k % 2:
            y = _poisoned(shape)
            assert sm(_cuda(xh), s, out=y) is y
        else:
            y = sm(_cuda(xh), s)
        _check(_host(y), ref, 1e-5, f"call {k} softmax {shape} s={s}")
    for k, n in enumerate([1, 1000, 3, 1_000_003, 0, 1000, 65536 * 256 + 1, 7]):
        xh = _rng(100 + k).standard_normal(n).astype(np.float32)
        yh = _rng(200 + k).standard_normal(n).astype(np.float32)
        a = float(k) - 2.5
        got = ax(_cuda(xh), _cuda(yh), a)
        _check(_host(got), xh.astype(np.float64) * np.float32(a) + yh, 1e-6,
               f"call {k} axpy n={n} a={a}")


# --------------------------------------------------------------------------------------------
# streams, observed by ordering


@on_gpu
def test_the_current_stream_is_read_at_every_call(pack) -> None:
    """Bound and warm on stream s1; then s1 is kept busy and a call is made with s2 current:
    it must run on s2 (issue 4: the default is the caller framework's current stream), so
    s2's synchronize sees its result while s1 is still busy."""
    ax = pack["r28_axpy"]
    xh = _rng(12).standard_normal(100_003).astype(np.float32)
    yh = _rng(13).standard_normal(100_003).astype(np.float32)
    x, y, o = _cuda(xh), _cuda(yh), _poisoned((100_003,))
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        for _ in range(4):
            ax(x, y, 1.0, out=o)
            z = ax(x, y, 1.0)
    s1.synchronize()
    o.fill_(float("nan"))
    torch.cuda.synchronize()
    _spin(s1)
    with torch.cuda.stream(s2):
        ax(x, y, 3.0, out=o)
        z = ax(x, y, -1.0)
        s2.synchronize()
        got_o, got_z = o.cpu().numpy(), z.cpu().numpy()
    s1_busy = not s1.query()
    torch.cuda.synchronize()
    assert s1_busy, "inconclusive: s1 finished its spin before the check"
    _check(got_o, xh.astype(np.float64) * 3.0 + yh, 1e-6, "out= call with s2 current")
    _check(got_z, xh.astype(np.float64) * -1.0 + yh, 1e-6, "allocating call with s2 current")


@on_gpu
def test_stream_zero_is_the_legacy_default_stream_not_the_current_one(pack) -> None:
    """stream=0 (and torch.cuda.default_stream()) while a busy side stream is current: the
    launch goes to the default stream, which does not wait for torch's non-blocking side
    streams."""
    ax, sm = pack["r28_axpy"], pack["r28_softmax"]
    xh = _rng(14).standard_normal(4099).astype(np.float32)
    x = _cuda(xh)
    xs_h = _rng(15).standard_normal((3, 70000)).astype(np.float32)
    xs = _cuda(xs_h)
    o1, o2, o3 = _poisoned((4099,)), _poisoned((4099,)), _poisoned((3, 70000))
    ax(x, x, 1.0)
    sm(xs, 1.0)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        _spin(side)
        ax(x, x, 2.0, out=o1, stream=0)
        ax(x, x, 4.0, out=o2, stream=torch.cuda.default_stream())
        sm(xs, 0.5, out=o3, stream=0)  # split variant: scratch, the general path
        z = ax(x, x, 5.0, stream=0)
    # current stream: the default one again; these copies run on it
    got = [t.cpu().numpy() for t in (o1, o2, o3, z)]
    side_busy = not side.query()
    torch.cuda.synchronize()
    assert side_busy, "inconclusive: the side stream finished its spin before the check"
    x64 = xh.astype(np.float64)
    _check(got[0], x64 * 3.0, 1e-6, "stream=0 out=")
    _check(got[1], x64 * 5.0, 1e-6, "stream=default_stream() out=")
    _check(got[2], _softmax_ref(xs_h, 0.5), 1e-5, "stream=0 split softmax")
    _check(got[3], x64 * 6.0, 1e-6, "stream=0 allocating")


@on_gpu
def test_explicit_streams_while_the_current_stream_is_busy(pack) -> None:
    """stream= a torch stream or its raw handle while the current stream is busy: every kind of
    call (fast path, scratch, zero-initialised out= and scratch, repeated launches) runs on
    that stream alone, zeroing included."""
    ax, sm, acc, cs = (pack["r28_axpy"], pack["r28_softmax"], pack["r28_accum"],
                       pack["r28_colsum"])
    xh = _rng(16).standard_normal(50_001).astype(np.float32)
    xs_h = _rng(17).standard_normal((3, 70000)).astype(np.float32)
    xc_h = _rng(18).standard_normal((1000, 3000)).astype(np.float32)
    x, xs, xc = _cuda(xh), _cuda(xs_h), _cuda(xc_h)
    for _ in range(3):
        ax(x, x, 1.0), sm(xs, 1.0), acc(x), cs(xc)
    oa, oacc, osm = _poisoned((50_001,)), _poisoned((50_001,)), _poisoned((3, 70000))
    cur = torch.cuda.Stream()
    s2 = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(cur):
        _spin(cur)
        ax(x, x, 2.0, out=oa, stream=s2)
        acc(x, out=oacc, stream=s2.cuda_stream)  # zero_init out= and scratch, 3 launches
        sm(xs, 2.0, out=osm, stream=s2)
        r_sm = sm(xs, 1.0, stream=s2)
        r_acc = acc(x, stream=s2)
        r_cs = cs(xc, stream=s2.cuda_stream)
        s2.synchronize()
        with torch.cuda.stream(s2):
            got = [t.cpu().numpy() for t in (oa, oacc, osm, r_sm, r_acc, r_cs)]
    cur_busy = not cur.query()
    torch.cuda.synchronize()
    assert cur_busy, "inconclusive: the current stream finished its spin before the check"
    x64 = xh.astype(np.float64)
    _check(got[0], x64 * 3.0, 1e-6, "axpy stream=s2")
    _check(got[1], x64 * 14.0, 1e-6, "accum out= stream=s2 (zeroing on s2)")
    _check(got[2], _softmax_ref(xs_h, 2.0), 1e-5, "split softmax out= stream=s2")
    _check(got[3], _softmax_ref(xs_h, 1.0), 1e-5, "split softmax stream=s2")
    _check(got[4], x64 * 14.0, 1e-6, "accum stream=s2")
    _check(got[5], xc_h.astype(np.float64).sum(0), 1e-5, "colsum stream=s2 handle")


def _segment_stream(ptr: int):
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg["stream"]
    return None


@on_gpu
def test_outputs_for_a_stream_come_from_that_streams_pool(pack) -> None:
    """README: what a call allocates for stream= (outputs, scratch) comes from that stream's
    memory pool, as a tensor made inside ``with torch.cuda.stream(s)`` does."""
    ax, sm, acc = pack["r28_axpy"], pack["r28_softmax"], pack["r28_accum"]
    x = torch.randn(3 * 1024 * 1024 + 5, device="cuda")  # > 1 MB: a large-pool segment
    xs = torch.randn(3, 70000, device="cuda")
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        ref = torch.empty_like(x)
    where = {"torch.empty_like inside the stream": _segment_stream(ref.data_ptr())}
    assert where["torch.empty_like inside the stream"] == s.cuda_stream
    for _ in range(2):  # general path, then fast path
        outs = {"axpy": ax(x, x, 1.0, stream=s), "split softmax": sm(xs, 1.0, stream=s),
                "accum": acc(x, stream=s), "axpy handle": ax(x, x, 1.0, stream=s.cuda_stream)}
        for k, t in outs.items():
            where[k] = _segment_stream(t.data_ptr())
    s.synchronize()
    wrong = {k: v for k, v in where.items() if v != s.cuda_stream}
    assert not wrong, f"outputs not from stream {s.cuda_stream:#x}'s pool: {wrong}"


@on_gpu
@pytest.mark.parametrize("framework", ["torch", "cupy"])
@pytest.mark.parametrize("handle", [1, 2], ids=["CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD"])
def test_raw_legacy_and_per_thread_stream_handles(pack, handle, framework) -> None:
    """CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are raw handles the driver takes
    (README: stream= takes a raw handle). Either a call runs on them, allocating or not, or
    kernelpack refuses the handle itself with an error that names stream= - not an out=
    call that works beside an allocating one that fails inside torch's allocator."""
    ax = pack["r28_axpy"]
    xh = _rng(19).standard_normal(999).astype(np.float32)
    if framework == "torch":
        x, o = _cuda(xh), _poisoned((999,))
        to_host, sync = (lambda t: t.cpu().numpy()), torch.cuda.synchronize
    else:
        cupy = pytest.importorskip("cupy", reason="cupy is not installed")
        x, o = cupy.asarray(xh), cupy.full(999, cupy.nan, cupy.float32)
        to_host, sync = cupy.asnumpy, cupy.cuda.Device().synchronize
    sync()
    outcomes = {}
    for kind in ("out=", "allocating"):
        try:
            got = ax(x, x, 1.0, out=o, stream=handle) if kind == "out=" else \
                ax(x, x, 2.0, stream=handle)
            sync()
            outcomes[kind] = ("ran", to_host(got))
        except Exception as exc:  # noqa: BLE001 - classified below
            outcomes[kind] = ("refused", exc)
    kinds = {k: v[0] for k, v in outcomes.items()}
    for kind, (what, val) in outcomes.items():
        if what == "refused":
            assert isinstance(val, (KernelPackError, TypeError, ValueError)) and \
                "stream" in str(val), f"{kind} call with stream={handle}: " \
                                      f"{type(val).__name__}: {val}"
    assert len(set(kinds.values())) == 1, f"stream={handle}: {kinds}; " + "; ".join(
        f"{k}: {type(v[1]).__name__}: {v[1]}" for k, v in outcomes.items() if v[0] == "refused")
    if kinds["out="] == "ran":
        _check(outcomes["out="][1], xh.astype(np.float64) * 2, 1e-6, f"stream={handle} out=")
        _check(outcomes["allocating"][1], xh.astype(np.float64) * 3, 1e-6, f"stream={handle}")


@on_gpu
def test_cupy_current_stream_and_stream_objects(pack) -> None:
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    ax, acc = pack["r28_axpy"], pack["r28_accum"]
    xh = _rng(20).standard_normal(30_001).astype(np.float32)
    x = cupy.asarray(xh)
    o, oacc = (cupy.full(30_001, cupy.nan, cupy.float32) for _ in range(2))
    c1, c2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with c1:
        for _ in range(4):
            ax(x, x, 1.0, out=o)
            acc(x)
    c1.synchronize()
    o.fill(cupy.nan)
    cupy.cuda.Device().synchronize()
    _spin(torch.cuda.ExternalStream(c1.ptr))
    with c2:
        ax(x, x, 2.0, out=o)                # c2 is current
        acc(x, out=oacc)                    # zero_init on c2
        z = ax(x, x, 3.0, stream=c2)
        c2.synchronize()
        got = [cupy.asnumpy(t, stream=c2) for t in (o, oacc, z)]
    c1_busy = not c1.done
    cupy.cuda.Device().synchronize()
    assert c1_busy, "inconclusive: c1 finished its spin before the check"
    x64 = xh.astype(np.float64)
    _check(got[0], x64 * 3.0, 1e-6, "cupy: current stream c2, out=")
    _check(got[1], x64 * 14.0, 1e-6, "cupy: accum out= on c2")
    _check(got[2], x64 * 4.0, 1e-6, "cupy: stream=c2")


# --------------------------------------------------------------------------------------------
# threads right after kp.load


@on_gpu
def test_sixteen_threads_on_a_freshly_loaded_pack(artifact) -> None:
    """No call made yet: sixteen threads start at once on five programs (lazy loading, binding,
    the fast paths being built), one more runs pack.warmup() meanwhile; half the threads
    launch on a stream of their own."""
    p = kp.load(artifact)
    names = ["r28_axpy", "r28_softmax", "r28_colsum", "r28_two", "r28_accum"]
    n_threads = 16
    barrier = threading.Barrier(n_threads + 1, timeout=60)
    inputs = {}
    for i in range(n_threads):
        rng = _rng(300 + i)
        name = names[i % len(names)]
        if name == "r28_softmax":
            shape = (3, 70000) if i % 2 else (64, 1000)
        elif name == "r28_colsum":
            shape = (1000, 3000) if i % 2 else (17, 33)
        else:
            shape = (100_003 + i,)
        inputs[i] = (name, rng.standard_normal(shape).astype(np.float32), 0.5 + i)
    dev = {i: _cuda(h) for i, (_, h, _) in inputs.items()}
    torch.cuda.synchronize()
    results: dict = {}
    errors: list = []

    def work(i: int) -> None:
        name, _, s = inputs[i]
        prog = p[name]
        try:
            stream = torch.cuda.Stream() if i % 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                barrier.wait()
                outs = []
                for _ in range(6):
                    if name in ("r28_axpy",):
                        outs.append(prog(dev[i], dev[i], s))
                    elif name in ("r28_softmax", "r28_two"):
                        outs.append(prog(dev[i], s))
                    else:
                        outs.append(prog(dev[i]))
            stream.synchronize()
            results[i] = outs
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, name, repr(exc)))

    def warm() -> None:
        try:
            barrier.wait()
            p.warmup()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(("warmup", "", repr(exc)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    threads.append(threading.Thread(target=warm))
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors
    torch.cuda.synchronize()
    for i, (name, h, s) in inputs.items():
        h64 = h.astype(np.float64)
        s32 = np.float64(np.float32(s))
        for k, got in enumerate(results[i]):
            what = f"thread {i} {name} call {k}"
            if name == "r28_axpy":
                _check(_host(got), h64 * s32 + h64, 1e-6, what)
            elif name == "r28_softmax":
                _check(_host(got), _softmax_ref(h, s), 1e-5, what)
            elif name == "r28_colsum":
                _check(_host(got), h64.sum(0), 1e-5, what)
            elif name == "r28_two":
                _check(_host(got[0]), h64 * s32, 1e-6, what)
                _check(_host(got[1]), h64 + s32, 1e-6, what)
            else:
                _check(_host(got), h64 * 14.0, 1e-6, what)


# --------------------------------------------------------------------------------------------
# memory: empty_cache, leaks


@on_gpu
def test_calls_after_empty_cache_and_no_growth_over_many_calls(pack) -> None:
    ax, sm, acc, cs = (pack["r28_axpy"], pack["r28_softmax"], pack["r28_accum"],
                       pack["r28_colsum"])
    xh = _rng(21).standard_normal(1_000_003).astype(np.float32)
    xs_h = _rng(22).standard_normal((3, 70000)).astype(np.float32)
    xc_h = _rng(23).standard_normal((1000, 3000)).astype(np.float32)
    x, xs, xc = _cuda(xh), _cuda(xs_h), _cuda(xc_h)

    def check_all(what: str) -> None:
        _check(_host(ax(x, x, 2.0)), xh.astype(np.float64) * 3, 1e-6, f"{what}: axpy")
        _check(_host(sm(xs, 1.0)), _softmax_ref(xs_h, 1.0), 1e-5, f"{what}: softmax")
        _check(_host(acc(x)), xh.astype(np.float64) * 14, 1e-6, f"{what}: accum")
        _check(_host(cs(xc)), xc_h.astype(np.float64).sum(0), 1e-5, f"{what}: colsum")

    check_all("warm")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    check_all("after empty_cache")
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    for _ in range(60):
        r = (ax(x, x, 1.0), sm(xs, 1.0), acc(x), cs(xc))
        del r
    torch.cuda.synchronize()
    gc.collect()
    grown = torch.cuda.memory_allocated() - base
    assert grown < 16 << 20, f"torch memory grew by {grown} bytes over 60 rounds of calls"
    torch.cuda.empty_cache()
    check_all("after a second empty_cache")


class _CAI:
    """Only ``__cuda_array_interface__``: the general path, kernelpack buffers back."""

    def __init__(self, t) -> None:
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


@on_gpu
def test_kernelpack_buffers_are_freed_when_dropped(pack) -> None:
    ax = pack["r28_axpy"]
    x = torch.randn(16 << 20, device="cuda")  # 64 MiB per output
    torch.cuda.synchronize()
    first = ax(_CAI(x), _CAI(x), 1.0)
    _check(np.asarray(first)[:1000], _host(x)[:1000].astype(np.float64) * 2, 1e-6, "buffer")
    del first
    gc.collect()
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    for _ in range(40):
        r = ax(_CAI(x), _CAI(x), 1.0)
        del r
    gc.collect()
    torch.cuda.synchronize()
    lost = free0 - torch.cuda.mem_get_info()[0]
    assert lost < 512 << 20, f"{lost / 2**20:.0f} MiB of device memory not given back " \
                             f"after 40 dropped 64 MiB outputs"


# --------------------------------------------------------------------------------------------
# scalars at the edges of their dtype


def _nan_equal(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), f"{what}: NaN positions")
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(got[ok], ref[ok], f"{what}: values")


@on_gpu
def test_float_scalars_at_the_edges(pack) -> None:
    xs16 = np.array([0, 1, -1, 65504, -65504, 6e-8, np.inf, -np.inf, 0.5, 1000], np.float16)
    for name, npdt, tdt in (("r28_hadd", np.float16, torch.float16),
                            ("r28_bfadd", None, torch.bfloat16)):
        prog = pack[name]
        x = _cuda(xs16.astype(np.float32)).to(tdt)
        for s in (float("inf"), float("-inf"), float("nan"), 65504.0, 6e-8, 0.1, -0.0,
                  np.float16("nan"), np.float32("inf")):
            for _ in range(2):  # general path, then fast path
                got = prog(x, s)
                ref = x + torch.tensor(float(s), dtype=tdt, device="cuda")
                _nan_equal(_host(got.float()), _host(ref.float()), f"{name} s={s!r}")
    ax = pack["r28_axpy"]
    x = torch.tensor([1.0, -2.0, 0.0], device="cuda")
    for a in (float("nan"), float("inf"), 3.4028234663852886e38, 1e-45):
        got = _host(ax(x, x, a))
        ref = _host(x * torch.tensor(a, dtype=torch.float32, device="cuda") + x)
        _nan_equal(got, ref, f"axpy a={a!r}")
    xd = torch.tensor([1.0, 3.0, 1e308, -7.0], dtype=torch.float64, device="cuda")
    for s in (0.1, 1 / 3, 1e-310, float("inf")):
        got = _host(pack["r28_dscale"](xd, s))
        _nan_equal(got, _host(xd) * np.float64(s), f"dscale s={s!r} (no rounding to float32)")


@on_gpu
def test_integer_scalars_at_the_edges(pack) -> None:
    imin, imax = -(2 ** 31), 2 ** 31 - 1
    xi = torch.tensor([0, 1, -1, imax, imin], dtype=torch.int32, device="cuda")
    xih = _host(xi)
    for k in (imax, imin, np.int32(imax), np.int64(imin), -1):
        for _ in range(2):
            got = _host(pack["r28_iadd"](xi, k))
            with np.errstate(over="ignore"):
                ref = (xih.astype(np.int64) + int(k)).astype(np.int32)  # wraps as int32 does
            np.testing.assert_array_equal(got, ref, f"iadd k={k!r}")
    lmin, lmax = -(2 ** 63), 2 ** 63 - 1
    xl = torch.tensor([0, -1, lmax, lmin, 12345], dtype=torch.int64, device="cuda")
    for k in (lmax, lmin, np.int64(lmin), -1):
        got = _host(pack["r28_lxor"](xl, k))
        np.testing.assert_array_equal(got, _host(xl) ^ np.int64(k), f"lxor k={k!r}")
    with pytest.raises(ConstraintError, match="'k'"):
        pack["r28_lxor"](xl, 2 ** 63)
    with pytest.raises(ConstraintError, match="'k'"):
        pack["r28_iadd"](xi, imin - 1)


@on_gpu
def test_uint64_scalar_takes_its_whole_range(pack) -> None:
    """A fusion's kp.u64 scalar is a uint64 (a hash key, a seed): 2**63 .. 2**64-1 are
    values of that dtype, as NumPy's uint64 holds them. The kernel only XORs them in."""
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    xu = cupy.asarray(np.array([0, 1, 2 ** 64 - 1, 2 ** 63], np.uint64))
    with pytest.raises((ConstraintError, TypeError), match="'k'"):
        pack["r28_uxor"](xu, -1)
    with pytest.raises((ConstraintError, TypeError), match="'k'"):
        pack["r28_uxor"](xu, 2 ** 64)
    for k in (0, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, np.uint64(2 ** 64 - 1)):
        got = cupy.asnumpy(pack["r28_uxor"](xu, k))
        np.testing.assert_array_equal(got, cupy.asnumpy(xu) ^ np.uint64(k), f"uxor k={k!r}")


# --------------------------------------------------------------------------------------------
# large tensors and grid limits


@on_gpu
def test_a_few_hundred_megabytes(pack) -> None:
    ax, sm, cs, rs = (pack["r28_axpy"], pack["r28_softmax"], pack["r28_colsum"],
                      pack["r28_rowscale"])
    n = 100_000_007  # 400 MB per float32 array
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    got = ax(x, y, 0.5)
    ref = x * 0.5 + y
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= 1e-6, f"axpy of {n}: {err:.3e}"
    del ref
    del x, y, got
    xs = torch.randn(16384, 8192, device="cuda")  # 512 MB
    got = sm(xs, 1.0)
    ref = torch.softmax(xs.double(), dim=1)
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    assert err <= 1e-5, f"softmax (16384, 8192): {err:.3e}"
    got = cs(xs)
    ref = xs.double().sum(0)
    err = float((got.double() - ref).abs().max() / ref.abs().max())
    assert err <= 1e-5, f"colsum (16384, 8192): {err:.3e}"
    w = torch.randn(8192, device="cuda")
    assert torch.equal(rs(xs, w), xs * w)


@on_gpu
def test_grid_y_at_and_past_its_limit(pack) -> None:
    fy = pack["r28_fill_y"]
    x = _poisoned((65535,))
    fy(x)
    np.testing.assert_array_equal(_host(x), np.arange(65535, dtype=np.float32))
    big = _poisoned((65536,))
    with pytest.raises(ConstraintError, match="65535"):
        fy(big)
    assert _untouched(big)


# --------------------------------------------------------------------------------------------
# foreign arrays: the stream they are pending on, the buffers kernelpack hands back


class _CAI3:
    """``__cuda_array_interface__`` version 3 naming the stream its data is pending on (the
    spec: the consumer synchronizes on it before reading)."""

    def __init__(self, t, stream: int) -> None:
        self._t = t
        cai = dict(t.__cuda_array_interface__)
        cai["version"] = 3
        cai["stream"] = stream
        self.__cuda_array_interface__ = cai


class _DL:
    """Only DLPack (torch's ``__dlpack__`` makes the consumer's stream wait for torch's current
    stream when it is given one)."""

    def __init__(self, t) -> None:
        self._t = t

    def __dlpack__(self, stream=None, **kw):
        return self._t.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@on_gpu
@pytest.mark.parametrize("via", ["cuda_array_interface_v3", "dlpack"])
@pytest.mark.parametrize("launch", ["stream=s2", "default stream"])
def test_a_foreign_array_is_read_after_the_stream_it_is_pending_on(pack, via, launch) -> None:
    """x is written on a producer stream that is busy for a second; the call must not read x
    before that write (CAI v3: synchronize on its 'stream'; DLPack: pass the consumer's stream
    to __dlpack__ so the producer orders it)."""
    ax = pack["r28_axpy"]
    n = 100_003
    xh = _rng(40).standard_normal(n).astype(np.float32)
    src = _cuda(xh)
    x = _poisoned((n,))
    prod, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(prod):
        _spin(prod)
        x.copy_(src)  # pending on prod behind the spin
        arr = _CAI3(x, prod.cuda_stream) if via != "dlpack" else _DL(x)
        if launch == "stream=s2":
            r = ax(arr, arr, 1.0, stream=s2)
        else:
            r = ax(arr, arr, 1.0)
    t = torch.from_dlpack(r)
    torch.cuda.synchronize()
    _check(_host(t), xh.astype(np.float64) * 2, 1e-6, f"{via}, {launch}")


@on_gpu
@pytest.mark.parametrize("consumer", ["torch.from_dlpack", "cupy.asarray"])
def test_a_kernelpack_buffer_is_ready_for_whoever_imports_it(pack, consumer) -> None:
    """A call on a busy stream s2 returns a kernelpack buffer whose data is pending there;
    importing it (DLPack with the consumer's stream, or CAI's 'stream') must order the
    consumer's reads after the launch."""
    ax = pack["r28_axpy"]
    n = 100_003
    xh = _rng(41).standard_normal(n).astype(np.float32)
    x = _cuda(xh)
    s2 = torch.cuda.Stream()
    torch.cuda.synchronize()
    _spin(s2)
    buf = ax(_CAI3(x, 1), _CAI3(x, 1), 1.5, stream=s2)  # queued on s2 behind the spin
    if consumer == "torch.from_dlpack":
        got = torch.from_dlpack(buf).cpu().numpy()  # on torch's default stream
    else:
        cupy = pytest.importorskip("cupy", reason="cupy is not installed")
        got = cupy.asnumpy(cupy.asarray(buf))  # on CuPy's default stream
    torch.cuda.synchronize()
    _check(got, xh.astype(np.float64) * 2.5, 1e-6, f"{consumer} of a buffer pending on s2")


@on_gpu
def test_a_dlpack_import_keeps_the_buffer_alive(pack) -> None:
    """torch.from_dlpack of a kernelpack buffer that is then dropped: the torch tensor still
    owns the memory (the capsule's deleter), so later buffers do not reuse it."""
    ax = pack["r28_axpy"]
    n = 1 << 20
    xh = _rng(42).standard_normal(n).astype(np.float32)
    x = _cuda(xh)
    torch.cuda.synchronize()
    t = torch.from_dlpack(ax(_CAI3(x, 1), _CAI3(x, 1), 1.0))  # the buffer object is dropped
    gc.collect()
    others = [ax(_CAI3(x, 1), _CAI3(x, 1), -3.0) for _ in range(8)]  # same size, new values
    torch.cuda.synchronize()
    _check(_host(t), xh.astype(np.float64) * 2, 1e-6, "imported tensor after its buffer died")
    del others


@on_gpu
def test_a_kernelpack_buffer_as_out_and_as_input(pack) -> None:
    ax = pack["r28_axpy"]
    xh = _rng(43).standard_normal(5000).astype(np.float32)
    x = _cuda(xh)
    torch.cuda.synchronize()
    buf = ax(_CAI3(x, 1), _CAI3(x, 1), 1.0)
    got = ax(x, x, 3.0, out=buf)  # torch inputs, a kernelpack buffer as out=
    assert got is buf
    _check(np.asarray(buf), xh.astype(np.float64) * 4, 1e-6, "buffer as out=")
    again = ax(buf, x, 1.0)  # a buffer and a torch tensor
    host = _host(again) if isinstance(again, torch.Tensor) else np.asarray(again)
    _check(host, xh.astype(np.float64) * 5, 1e-6, "buffer in")


# --------------------------------------------------------------------------------------------
# calls do not block the host while the GPU is busy


@on_gpu
def test_calls_do_not_wait_for_the_gpu(pack) -> None:
    """A server thread's call queues work and returns: with the stream busy for about a second,
    no kind of call (fast path, allocating, scratch, zero-initialised, repeated launches,
    stream=, a foreign array, CuPy) may take the host that long."""
    import time

    ax, sm, acc, cs = (pack["r28_axpy"], pack["r28_softmax"], pack["r28_accum"],
                       pack["r28_colsum"])
    x = torch.randn(100_003, device="cuda")
    o, oacc = torch.empty_like(x), torch.empty_like(x)
    xs = torch.randn(3, 70000, device="cuda")
    xc = torch.randn(1000, 3000, device="cuda")
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    xcp = cupy.asarray(_rng(44).standard_normal(100_003).astype(np.float32))
    holder: dict = {}
    calls = {
        "fast out=": lambda: ax(x, x, 1.0, out=o),
        "allocating": lambda: ax(x, x, 1.0),
        "split softmax (scratch)": lambda: sm(xs, 1.0),
        "colsum (scratch)": lambda: cs(xc),
        "accum (zeroed, 3 launches)": lambda: acc(x),
        "accum out=": lambda: acc(x, out=oacc),
        "softmax stream=0": lambda: sm(xs, 1.0, stream=0),
        "foreign array": lambda: holder.setdefault("bufs", []).append(
            ax(_CAI3(x, 1), _CAI3(x, 1), 1.0)),
        "cupy": lambda: ax(xcp, xcp, 1.0),
        "cupy accum": lambda: acc(xcp),
    }
    for f in calls.values():  # bind everything first
        f()
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    slow = {}
    stream = torch.cuda.current_stream()  # the legacy default stream: CuPy's too
    for name, f in calls.items():
        if stream.query():
            _spin(stream)
        t0 = time.perf_counter()
        f()
        dt = time.perf_counter() - t0
        if dt > 0.25:
            slow[name] = round(dt, 3)
    torch.cuda.synchronize()
    assert not slow, f"calls that waited for the GPU (seconds): {slow}"


# --------------------------------------------------------------------------------------------
# what is not a CUDA array of the parameter's dtype


@on_gpu
def test_other_tensor_kinds_are_refused_naming_the_parameter(pack) -> None:
    ax, inc = pack["r28_axpy"], pack["r28_u8inc"]
    g = torch.randn(5, device="cuda")
    cases = {
        "meta tensor": lambda: ax(torch.empty(5, device="meta"), g, 1.0),
        "pinned host tensor": lambda: ax(torch.randn(5).pin_memory(), g, 1.0),
        "bool for uint8": lambda: inc(torch.ones(5, dtype=torch.bool, device="cuda")),
        ".real of complex (stride 2)": lambda: ax(
            torch.randn(5, dtype=torch.complex64, device="cuda").real, g, 1.0),
        "float8": lambda: ax(g.to(torch.float8_e4m3fn), g, 1.0),
    }
    wrong = {}
    for name, f in cases.items():
        try:
            f()
            wrong[name] = "accepted"
        except LaunchError as exc:
            if "'x'" not in str(exc):
                wrong[name] = f"LaunchError without 'x': {exc}"
        except Exception as exc:  # noqa: BLE001 - reported
            wrong[name] = f"{type(exc).__name__}: {exc}"
    assert not wrong, wrong


@on_gpu
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_a_sparse_tensor_is_a_launch_error_naming_the_parameter(pack, layout) -> None:
    """README: wrong dtype, rank, device or layout raise LaunchError naming the parameter;
    a sparse tensor has no strided storage to pass."""
    ax, rs = pack["r28_axpy"], pack["r28_rowscale"]
    g = torch.randn(6, device="cuda")
    m = torch.randn(6, 6, device="cuda")
    for _ in range(2):  # the general path, then the warm one
        ax(g, g, 1.0)
        rs(m, g)
    with pytest.raises(LaunchError, match=r"'x'"):
        if layout == "sparse_coo":
            ax(g.to_sparse(), g, 1.0)
        else:
            rs(m.to_sparse_csr(), g)


# --------------------------------------------------------------------------------------------
# child processes: misaligned views, more than 2^31 elements, graph capture

CHILD = r'''
import json, sys, traceback
import torch
import kernelpack as kp

pack = kp.load(sys.argv[1])
check = sys.argv[2]
dev = "cuda"


def rel(got, ref):
    """max |got - ref| / max |ref|, in float64, a few million elements at a time."""
    got, ref = got.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    step = 1 << 26
    for i in range(0, got.numel(), step):
        g, r = got[i:i + step].double(), ref[i:i + step].double()
        num = max(num, float((g - r).abs().max()))
        den = max(den, float(r.abs().max()))
    return num / max(den, 1e-300)


def guarded(n, dtype=torch.float32, before=1, after=3):
    buf = torch.full((before + n + after,), 7.0, device=dev).to(dtype)
    return buf, buf[before:before + n]


def guards_ok(buf, n, before=1, after=3):
    g = torch.cat([buf[:before], buf[before + n:]]).float()
    return bool((g == 7.0).all())


def align_colsum():
    out = []
    for b, n in [(1000, 3000), (100000, 4), (20000, 64), (3, 4096)]:
        x = torch.randn(b * n + 1, device=dev)[1:].view(b, n)
        got = pack["r28_colsum"](x)
        torch.cuda.synchronize()
        e = rel(got, x.double().sum(0))
        assert e <= 1e-5, f"colsum of a view 4 bytes in, {(b, n)}: {e:.3e}"
        buf, o = guarded(n)
        x2 = torch.randn(b, n, device=dev)
        pack["r28_colsum"](x2, out=o)
        torch.cuda.synchronize()
        e = rel(o, x2.double().sum(0))
        assert e <= 1e-5 and guards_ok(buf, n), f"colsum out= 4 bytes in {(b, n)}: {e:.3e}"
        out.append((b, n))
    return out


def align_center():
    for b, n in [(100000, 32), (1000, 3000), (10, 8)]:
        x = torch.randn(b * n + 1, device=dev)[1:].view(b, n)
        got = pack["r28_center"](x)
        torch.cuda.synchronize()
        e = rel(got, x.double() - x.double().mean(0, keepdim=True))
        assert e <= 1e-5, f"center of a view 4 bytes in {(b, n)}: {e:.3e}"
    return "ok"


def align_mid():
    for shape in [(3, 100000, 8), (2, 5000, 64)]:
        x = torch.randn(shape[0] * shape[1] * shape[2] + 1, device=dev)[1:].view(*shape)
        got = pack["r28_mid"](x)
        torch.cuda.synchronize()
        e = rel(got, x.double().mean(1))
        assert e <= 1e-5, f"mid mean of a view 4 bytes in {shape}: {e:.3e}"
    return "ok"


def align_rowsum():
    for b, n in [(4, 1_000_000), (3, 4096), (1000, 64)]:
        x = torch.randn(b * n + 1, device=dev)[1:].view(b, n)
        got = pack["r28_rowsum"](x)
        torch.cuda.synchronize()
        e = rel(got, x.double().sum(1))
        assert e <= 1e-5, f"rowsum of a view 4 bytes in {(b, n)}: {e:.3e}"
    return "ok"


def align_out():
    n = 100_000
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    for off in (1, 2, 3):
        buf, o = guarded(n, before=off)
        pack["r28_axpy"](x, y, 2.0, out=o)
        torch.cuda.synchronize()
        assert rel(o, x * 2 + y) <= 1e-6 and guards_ok(buf, n, before=off), f"axpy off {off}"
        b1, o1 = guarded(n, before=off)
        b2, o2 = guarded(n, before=off + 1)
        pack["r28_two"](x, 3.0, out=(o1, o2))
        torch.cuda.synchronize()
        assert rel(o1, x * 3) <= 1e-6 and guards_ok(b1, n, before=off), f"two[0] off {off}"
        assert rel(o2, x + 3) <= 1e-6 and guards_ok(b2, n, before=off + 1), f"two[1] {off}"
    for b, m in [(64, 1000), (3, 70000), (5, 100)]:
        xs = torch.randn(b, m, device=dev)
        buf, o = guarded(b * m)
        pack["r28_softmax"](xs, 1.0, out=o.view(b, m))
        torch.cuda.synchronize()
        assert rel(o.view(b, m), torch.softmax(xs.double(), 1)) <= 1e-5, f"softmax {b, m}"
        assert guards_ok(buf, b * m), f"softmax out= {b, m}: a neighbour was written"
    w = torch.randn(1025, device=dev)[1:]
    xr = torch.randn(7, 1024, device=dev)
    assert torch.equal(pack["r28_rowscale"](xr, w), xr * w), "rowscale w 4 bytes in"
    return "ok"


def align_half():
    n = 100_003
    x = torch.randn(n + 1, device=dev).half()[1:]
    got = pack["r28_hadd"](x, 0.5)
    ref = x + torch.tensor(0.5, dtype=torch.float16, device=dev)
    assert torch.equal(got, ref), "half x 2 bytes in"
    buf, o = guarded(n, torch.float16, before=3)
    pack["r28_hadd"](x, 0.5, out=o)
    torch.cuda.synchronize()
    assert torch.equal(o, ref) and guards_ok(buf, n, before=3), "half out= 6 bytes in"
    return "ok"


def align_u8():
    n = 1_000_001
    base = torch.randint(0, 256, (n + 16,), dtype=torch.uint8, device=dev)
    for off in range(1, 16, 3):
        x = base[off:off + n]
        assert torch.equal(pack["r28_u8inc"](x), x + 1), f"u8 input {off} bytes in"
        buf = torch.full((n + 32,), 7, dtype=torch.uint8, device=dev)
        o = buf[off:off + n]
        pack["r28_u8inc"](base[:n], out=o)
        torch.cuda.synchronize()
        assert torch.equal(o, base[:n] + 1), f"u8 out= {off} bytes in"
        assert bool((buf[:off] == 7).all()) and bool((buf[off + n:] == 7).all()), \
            f"u8 out= {off} bytes in: a neighbour was written"
    return "ok"


BIG = (1 << 31) + 77


def huge_u8():
    x = torch.randint(0, 256, (BIG,), dtype=torch.uint8, device=dev)
    got = pack["r28_u8inc"](x)
    torch.cuda.synchronize()
    step = 1 << 28
    for i in range(0, BIG, step):
        bad = (got[i:i + step] != x[i:i + step] + 1).nonzero()
        assert bad.numel() == 0, f"{bad.numel()} wrong elements, first at {i + int(bad[0])}"
    return BIG


def huge_i8():
    x = torch.randint(-128, 128, (BIG,), dtype=torch.int8, device=dev)
    got = int(pack["r28_i8total"](x))
    ref = int(x.sum(dtype=torch.int64))
    assert got == ref, f"sum of {BIG} int8: {got} != {ref}"
    return BIG


def huge_colsum():
    b, n = (1 << 21) + 3, 1024
    r = (torch.arange(b, device=dev) % 7).float()
    c = (torch.arange(n, device=dev) % 3).float()
    x = r[:, None] + c[None, :]
    got = pack["r28_colsum"](x)
    ref = r.double().sum() + b * c.double()
    e = rel(got, ref)
    assert e <= 1e-6, f"colsum of ({b}, {n}): {e:.3e}"
    return [b, n]


def huge_rowsum():
    b, n = 1024, (1 << 21) + 3
    r = (torch.arange(b, device=dev) % 7).float()
    c = (torch.arange(n, device=dev) % 3).float()
    x = r[:, None] + c[None, :]
    got = pack["r28_rowsum"](x)
    ref = n * r.double() + c.double().sum()
    e = rel(got, ref)
    assert e <= 1e-6, f"rowsum of ({b}, {n}): {e:.3e}"
    return [b, n]


def huge_softmax():
    b, n = 65537 + 2, 32768
    x = torch.randn(b, n, device=dev)
    got = pack["r28_softmax"](x, 1.0)
    e = 0.0
    for i in range(0, b, 4096):
        e = max(e, rel(got[i:i + 4096], torch.softmax(x[i:i + 4096].double(), 1)))
    assert e <= 1e-5, f"softmax of ({b}, {n}): {e:.3e}"
    return [b, n]


def huge_rowscale():
    b, n = (1 << 21) + 3, 1024
    x = torch.randn(b, n, device=dev)
    w = torch.randn(n, device=dev)
    got = pack["r28_rowscale"](x, w)
    step = 1 << 16
    for i in range(0, b, step):
        bad = (got[i:i + step] != x[i:i + step] * w).nonzero()
        assert bad.shape[0] == 0, \
            f"{bad.shape[0]} wrong elements in rows {i}.., first at {bad[0].tolist()}"
    return [b, n]


def graph_first_call():
    n = 4097
    x, y, o = torch.randn(n, device=dev), torch.randn(n, device=dev), torch.empty(n, device=dev)
    xs, ys = torch.randn(3, 70000, device=dev), torch.empty(3, 70000, device=dev)
    xa, oa = torch.randn(n, device=dev), torch.empty(n, device=dev)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # the very first calls of these programs in this process
        pack["r28_axpy"](x, y, 2.0, out=o)
        pack["r28_softmax"](xs, 1.0, out=ys)
        pack["r28_accum"](xa, out=oa)
    for trial in range(3):
        x.normal_(); y.normal_(); xs.normal_(); xa.normal_()
        for t in (o, ys, oa):
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel(o, x * 2 + y) <= 1e-6, f"replay {trial}: axpy"
        assert rel(ys, torch.softmax(xs.double(), 1)) <= 1e-5, f"replay {trial}: softmax"
        assert rel(oa, xa * 14) <= 1e-6, f"replay {trial}: accum (zeroing captured)"
    return "ok"


def graph_allocating():
    n = 4097
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    xs = torch.randn(3, 70000, device=dev)
    for _ in range(3):  # warm, outside the capture
        pack["r28_axpy"](x, y, 2.0); pack["r28_softmax"](xs, 1.0); pack["r28_accum"](x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # outputs (and scratch) from the graph's pool
        a = pack["r28_axpy"](x, y, 2.0)
        s = pack["r28_softmax"](xs, 1.0)
        c = pack["r28_accum"](x)
    for trial in range(3):
        x.normal_(); y.normal_(); xs.normal_()
        g.replay()
        torch.cuda.synchronize()
        assert rel(a, x * 2 + y) <= 1e-6, f"replay {trial}: axpy"
        assert rel(s, torch.softmax(xs.double(), 1)) <= 1e-5, f"replay {trial}: softmax"
        assert rel(c, x * 14) <= 1e-6, f"replay {trial}: accum"
    return "ok"


def graph_zero_init_warm():
    n = 10_001
    x, o = torch.randn(n, device=dev), torch.empty(n, device=dev)
    for _ in range(3):
        pack["r28_accum"](x, out=o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pack["r28_accum"](x, out=o)
    for trial in range(3):
        x.normal_()
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel(o, x * 14) <= 1e-6, f"replay {trial}: out= must be zeroed by the graph"
    return "ok"


def cupy_graph():
    import cupy
    n = 10_001
    s = cupy.cuda.Stream(non_blocking=True)
    x, y = cupy.random.standard_normal(n, dtype=cupy.float32), cupy.ones(n, cupy.float32)
    o, oa = cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32)
    cupy.cuda.Device().synchronize()
    with s:
        for _ in range(3):
            pack["r28_axpy"](x, y, 2.0, out=o)
            pack["r28_accum"](x, out=oa)
        s.synchronize()
        s.begin_capture()
        pack["r28_axpy"](x, y, 2.0, out=o)
        pack["r28_accum"](x, out=oa)
        g = s.end_capture()
    for trial in range(3):
        x[...] = cupy.random.standard_normal(n, dtype=cupy.float32)
        o.fill(cupy.nan)
        oa.fill(cupy.nan)
        cupy.cuda.Device().synchronize()
        g.launch(stream=s)
        s.synchronize()
        assert float(cupy.abs(o - (x * 2 + y)).max()) <= 1e-5, f"replay {trial}: axpy"
        assert float(cupy.abs(oa - x * 14).max()) <= 1e-4, f"replay {trial}: accum"
    return "ok"


try:
    detail = globals()[check]()
    torch.cuda.synchronize()
    print(json.dumps({"ok": True, "detail": detail}))
except BaseException as exc:
    print(json.dumps({"ok": False, "detail": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc()[-3000:]}))
'''

CHILD_CHECKS = ["align_colsum", "align_center", "align_mid", "align_rowsum", "align_out",
                "align_half", "align_u8", "huge_u8", "huge_i8", "huge_colsum", "huge_rowsum",
                "huge_softmax", "huge_rowscale", "graph_first_call", "graph_allocating",
                "graph_zero_init_warm", "cupy_graph"]


@pytest.fixture(scope="module")
def child_results(artifact) -> dict:
    """Every child check at once (each its own process and CUDA context), their JSON lines."""
    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = {c: subprocess.Popen([sys.executable, "-c", CHILD, str(artifact), c],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env) for c in CHILD_CHECKS}
    results = {}
    for c, p in procs.items():
        try:
            out, err = p.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results[c] = {"ok": False, "detail": "timed out after 200 s", "stderr": err[-2000:]}
            continue
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            results[c] = {"ok": False, "detail": f"exit code {p.returncode}",
                          "stderr": err[-3000:]}
        else:
            results[c] = json.loads(lines[-1])
            results[c]["stderr"] = err[-1500:]
    return results


@on_gpu
@pytest.mark.parametrize("check", CHILD_CHECKS)
def test_in_a_child_process(child_results, check) -> None:
    r = child_results[check]
    assert r["ok"], f"{check}: {r['detail']}\n{r.get('trace', '')}\n{r.get('stderr', '')}"
