"""Review 30 (black box, GPU): what a PyTorch user hands to ``pack[name](...)``.

Module parameters and buffers, tensors that require grad, inference tensors, calls under
``no_grad`` / ``inference_mode`` / ``autocast``, tensor subclasses, host (pinned, frombuffer)
tensors mixed with CUDA ones, views of every kind (strided, transposed, expanded, channels_last,
views of non-contiguous tensors, lazy conj/neg views given as ``out=``), ``torch.compile``
around a call, CUDA graph capture of allocating calls, side streams, and tensors that have no
device memory at all (meta, FakeTensor, vmap's batched tensors).

The rule every test checks (README, "Running on a GPU"): a call either gives the numbers torch
itself computes in float64, or raises a ``KernelPackError`` (``LaunchError`` for a wrong dtype,
rank, device or layout) whose message names the parameter. Cases that could fault the device
(null or misaligned pointers) run in a child process, so that a sticky CUDA error cannot take
the rest of this file down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

pytestmark = pytest.mark.gpu

NAN = float("nan")
TOL = 1e-5


# ----------------------------------------------------------------------------- the programs

@kp.fusion
def affine(xin: kp.Tensor[kp.f32, "b", "n"], wgt: kp.Tensor[kp.f32, "n"],
           bvec: kp.Tensor[kp.f32, "n"]):
    return xin * wgt + bvec


@kp.fusion
def layernorm(xin: kp.Tensor[kp.f32, "b", "n"], wgt: kp.Tensor[kp.f32, "n"],
              bvec: kp.Tensor[kp.f32, "n"]):
    m = xin.mean(axis=1, keepdims=True)
    d = xin - m
    v = (d * d).mean(axis=1, keepdims=True)
    return d * kp.rsqrt(v + 1e-5) * wgt + bvec


@kp.fusion
def scale4(img: kp.Tensor[kp.f32, "a", "c", "h", "w"], gain: kp.f32):
    return img * gain + 1.0


@kp.fusion
def cscale(zc: kp.Tensor[kp.c64, "n"], gain: kp.f32):
    return zc * gain


@kp.fusion
def fullsum(vals: kp.Tensor[kp.f32, "n"]):
    return vals.sum()


_COLSUM_CU = r"""
extern "C" __global__ void colsum(const float* mat, float* sums, unsigned b, unsigned n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (unsigned long long)b * n) atomicAdd(&sums[i % n], mat[i]);
}
"""


def _targets() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    return [f"sm_{major}{minor}", "ptx"]


@pytest.fixture(scope="module")
def pack_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    targets = _targets()
    programs = [kp.compile(f, targets=targets)
                for f in (affine, layernorm, scale4, cscale, fullsum)]
    programs.append(kp.external(
        "colsum", "colsum",
        params=[kp.Tensor("mat", kp.f32, ["b", "n"]),
                kp.Tensor("sums", kp.f32, ["n"], role="out", zero_init=True),
                kp.Scalar("b32", kp.u32, value="b"), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv(kp.sym("b") * kp.sym("n"), 256), block=256,
        cuda=_COLSUM_CU, targets=targets))
    path = tmp_path_factory.mktemp("r30") / "torch_world.kpack"
    kp.save(programs, path)
    return path


@pytest.fixture(scope="module")
def pack(pack_path: Path) -> Any:
    return kp.load(pack_path)


# ----------------------------------------------------------------------------- helpers

def R(*shape: int, dtype: Any = None, device: str = "cuda") -> Any:
    return torch.randn(*shape, dtype=dtype or torch.float32, device=device)


def ref_affine(x: Any, w: Any, b: Any) -> Any:
    with torch.no_grad():
        return x.double() * w.double() + b.double()


def ref_layernorm(x: Any, w: Any, b: Any) -> Any:
    with torch.no_grad():
        return torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), w.double(),
                                              b.double(), eps=1e-5)


def close(got: Any, ref: Any, tol: float = TOL) -> None:
    torch.cuda.synchronize()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    torch.testing.assert_close(got.detach().resolve_conj().resolve_neg().to(ref.dtype),
                               ref.to(got.device), rtol=tol, atol=tol)


def names(msg: str, param: str) -> bool:
    """Whether an error message names ``param`` as a word (our names are distinctive)."""
    return param in msg


def right_or_refused(call: Callable[[], Any], expect: Callable[[Any], None], param: str,
                     what: str) -> tuple[str, Any]:
    """Run ``call``: either ``expect(result)`` holds (-> ("ran", None)), or a LaunchError names
    ``param`` (-> ("refused", the error))."""
    try:
        got = call()
    except kp.KernelPackError as exc:
        assert isinstance(exc, kp.LaunchError), \
            f"{what}: a {type(exc).__name__} where README promises a LaunchError: {exc}"
        assert names(str(exc), param), f"{what}: the error does not name {param!r}: {exc}"
        return "refused", exc
    expect(got)
    return "ran", None


# ----------------------------------------------------------------------------- nn.Module world

class _KpLayerNorm(torch.nn.Module):
    """What a user writes: weight a Parameter, bias a registered buffer, forward calls the pack."""

    def __init__(self, prog: Any, n: int) -> None:
        super().__init__()
        self.prog = prog
        self.weight = torch.nn.Parameter(torch.randn(n) * 0.5 + 1.0)
        self.register_buffer("bias", torch.randn(n) * 0.1)

    def forward(self, x: Any) -> Any:
        return self.prog(x, self.weight, self.bias)


def test_module_parameters_and_buffers_feed_a_layernorm(pack: Any) -> None:
    """Expect: right numbers in every grad mode; the output is a plain float32 CUDA tensor with
    no autograd history (kernelpack does not differentiate, so requires_grad must be False and
    grad_fn None rather than a made-up node), whatever requires grad among the inputs."""
    torch.manual_seed(0)
    mod = _KpLayerNorm(pack["layernorm"], 96).to(torch.device("cuda", 0))
    assert isinstance(mod.weight, torch.nn.Parameter) and mod.weight.requires_grad
    x = R(7, 96)
    ref = ref_layernorm(x, mod.weight, mod.bias)
    for mode in ("grad", "no_grad", "inference_mode", "x_requires_grad"):
        xx = x.clone().requires_grad_() if mode == "x_requires_grad" else x
        if mode == "no_grad":
            with torch.no_grad():
                y = mod(xx)
        elif mode == "inference_mode":
            with torch.inference_mode():
                y = mod(xx)
        else:
            y = mod(xx)
        close(y, ref)
        assert type(y) is torch.Tensor, (mode, type(y))
        assert y.dtype == torch.float32 and y.device == x.device and y.is_contiguous(), mode
        assert not y.requires_grad and y.grad_fn is None, (mode, y.requires_grad, y.grad_fn)
    if hasattr(torch.nn, "Buffer"):
        buf = torch.nn.Buffer(torch.randn(96, device="cuda"))
        y = pack["layernorm"](x, mod.weight, buf)
        close(y, ref_layernorm(x, mod.weight, buf))


def test_inference_tensors_as_out_outside_inference_mode(pack: Any) -> None:
    """Buffers preallocated under inference_mode and filled later outside it. A plain out=
    (affine) is written by the kernel alone: expect right numbers. An out= with zero_init
    (colsum) must be zero-filled first; if that is done with a torch in-place op, torch raises
    its own RuntimeError ("Inplace update to inference tensor outside InferenceMode"), which
    is neither a KernelPackError nor names the output. Expect right sums twice in a row
    (zeroed each call, not accumulated), or a KernelPackError naming ``sums``."""
    torch.manual_seed(1)
    with torch.inference_mode():
        sums = torch.full((6,), NAN, device="cuda")
        out = torch.full((4, 6), NAN, device="cuda")
    assert sums.is_inference()
    m = R(5, 6)
    for _ in range(2):
        try:
            pack["colsum"](m, out=sums)
        except kp.KernelPackError as exc:
            assert names(str(exc), "sums"), str(exc)
            break
        close(sums, m.double().sum(0))
    w, b = R(6), R(6)
    pack["affine"](m[:4], w, b, out=out)
    close(out, ref_affine(m[:4], w, b))
    with torch.inference_mode():          # an allocating zero_init call inside the mode
        s1 = pack["colsum"](m)
        s2 = pack["colsum"](m)
    close(s1, m.double().sum(0))
    close(s2, m.double().sum(0))


def test_autocast_does_not_change_dtypes(pack: Any) -> None:
    """Under autocast(float16) an f32 program must still get and give float32 (right numbers);
    a float16 tensor that autocast made (a matmul's result) is a LaunchError naming the
    parameter with both dtypes, never a silent cast."""
    torch.manual_seed(2)
    x, w, b = R(8, 64), R(64), R(64)
    with torch.autocast("cuda", dtype=torch.float16):
        y = pack["layernorm"](x, w, b)
        z = pack["affine"](x, w, b)
        h = x @ R(64, 64)
        assert h.dtype == torch.float16
        with pytest.raises(kp.LaunchError) as info:
            pack["affine"](h, w, b)
    assert y.dtype == torch.float32 and z.dtype == torch.float32
    close(y, ref_layernorm(x, w, b))
    close(z, ref_affine(x, w, b))
    msg = str(info.value)
    assert names(msg, "xin"), msg
    assert ("float32" in msg or "f32" in msg) and ("float16" in msg or "f16" in msg), msg


class _Sub(torch.Tensor):
    """A trivial tensor subclass, as made by ``as_subclass``."""


def test_tensor_subclass_inputs_and_out(pack: Any) -> None:
    """A subclass is a torch tensor: right numbers in (general and warm fast path) and through
    out= of the subclass; a returned output is a torch tensor."""
    torch.manual_seed(3)
    x, w, b = R(5, 40), R(40), R(40)
    xs, ws, bs = (t.as_subclass(_Sub) for t in (x, w, b))
    prog = pack["layernorm"]
    ref = ref_layernorm(x, w, b)
    y1 = prog(xin=xs, wgt=ws, bvec=bs)
    y2 = prog(xs, ws, bs)
    y3 = prog(xs, ws, bs)
    for y in (y1, y2, y3):
        assert isinstance(y, torch.Tensor)
        close(y.as_subclass(torch.Tensor), ref)
    out = torch.full((5, 40), NAN, device="cuda").as_subclass(_Sub)
    prog(xs, ws, bs, out=out)
    close(out.as_subclass(torch.Tensor), ref)


# ----------------------------------------------------------------------------- host tensors

_KEEP: list[Any] = []   # the bytearrays behind torch.frombuffer tensors, kept alive


def _host(kind: str, n: int) -> Any:
    data = torch.randn(n)
    if kind == "pinned":
        return data.pin_memory()
    if kind == "frombuffer":
        raw = bytearray(data.numpy().tobytes())
        _KEEP.append(raw)
        return torch.frombuffer(raw, dtype=torch.float32)
    return data


@pytest.mark.parametrize("where,kind", [("bvec", "pinned"), ("bvec", "frombuffer"),
                                        ("xin", "cpu"), ("wgt", "pinned"), ("out", "pinned")],
                         ids=["bvec-pinned", "bvec-frombuffer", "xin-cpu", "wgt-pinned",
                              "out-pinned"])
def test_host_tensors_mixed_with_cuda_ones_name_the_parameter(pack: Any, where: str,
                                                              kind: str) -> None:
    """A host tensor beside CUDA ones (pinned memory is device-addressable, but it is a CPU
    tensor to torch, and torch refuses it in a CUDA op): LaunchError naming the parameter that
    is on the host and saying device/cpu, on the general (keyword) and the warm fast path."""
    torch.manual_seed(4)
    prog = pack["affine"]
    args = {"xin": R(3, 8), "wgt": R(8), "bvec": R(8)}
    prog(*args.values())                                   # bind: next calls are warm
    out = None
    if where == "out":
        out = _host(kind, 24).view(3, 8)
    elif where == "xin":
        args["xin"] = _host(kind, 24).view(3, 8)
    else:
        args[where] = _host(kind, 8)
    for path, call in (("keywords", lambda: prog(**args, out=out)),
                       ("positional", lambda: prog(*args.values(), out=out))):
        with pytest.raises(kp.KernelPackError) as info:
            call()
        msg = str(info.value)
        assert isinstance(info.value, (kp.LaunchError, kp.DeviceError)), (path, msg)
        assert names(msg, where), (path, msg)
        assert "cpu" in msg.lower() or "device" in msg.lower() or "host" in msg.lower(), \
            (path, msg)
        if where != "out":   # the culprit, not an innocent CUDA parameter, is named
            others = [p for p in ("xin", "wgt", "bvec") if p != where]
            assert not all(names(msg, o) for o in others), (path, msg)


# ----------------------------------------------------------------------------- input views

def _view_case(case: str) -> tuple[str, dict[str, Any], str, bool]:
    """(program, inputs, the parameter holding the view, whether that view is C-contiguous)."""
    if case == "rows_step2":
        return "affine", {"xin": R(6, 5)[::2], "wgt": R(5), "bvec": R(5)}, "xin", False
    if case == "transposed":
        return "affine", {"xin": R(5, 3).t(), "wgt": R(5), "bvec": R(5)}, "xin", False
    if case == "column_slice":
        return "affine", {"xin": R(3, 8)[:, :5], "wgt": R(5), "bvec": R(5)}, "xin", False
    if case == "w_expanded_stride0":
        return "affine", {"xin": R(3, 5), "wgt": R(1).expand(5), "bvec": R(5)}, "wgt", False
    if case == "x_expanded_rows":
        return "affine", {"xin": R(5).expand(3, 5), "wgt": R(5), "bvec": R(5)}, "xin", False
    if case == "bias_step2":
        return "affine", {"xin": R(3, 5), "wgt": R(5), "bvec": R(10)[::2]}, "bvec", False
    if case == "view_of_strided_4d":
        img = R(4, 6, 5)[::2].view(2, 2, 3, 5)
        assert not img.is_contiguous()
        return "scale4", {"img": img, "gain": 0.75}, "img", False
    if case == "channels_last":
        img = R(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        assert not img.is_contiguous()
        return "scale4", {"img": img, "gain": 0.75}, "img", False
    if case == "channels_last_one_channel":
        img = R(2, 1, 4, 5).contiguous(memory_format=torch.channels_last)
        assert img.is_contiguous()
        return "scale4", {"img": img, "gain": 0.75}, "img", True
    if case == "unsqueezed_row":
        return "affine", {"xin": R(5).unsqueeze(0), "wgt": R(5), "bvec": R(5)}, "xin", True
    if case == "middle_index":
        return "affine", {"xin": R(3, 1, 5)[:, 0], "wgt": R(5), "bvec": R(5)}, "xin", True
    if case == "offset_16_bytes":
        return "affine", {"xin": R(19)[4:].view(3, 5), "wgt": R(9)[4:],
                          "bvec": R(13)[8:]}, "xin", True
    raise AssertionError(case)


def _expected(prog: str, inputs: dict[str, Any]) -> Any:
    if prog == "affine":
        return ref_affine(inputs["xin"], inputs["wgt"], inputs["bvec"])
    return inputs["img"].double() * inputs["gain"] + 1.0


VIEW_CASES = ["rows_step2", "transposed", "column_slice", "w_expanded_stride0",
              "x_expanded_rows", "bias_step2", "view_of_strided_4d", "channels_last",
              "channels_last_one_channel", "unsqueezed_row", "middle_index", "offset_16_bytes"]


@pytest.mark.parametrize("case", VIEW_CASES, ids=VIEW_CASES)
def test_input_views_compute_right_or_are_refused_naming_the_parameter(pack: Any,
                                                                       case: str) -> None:
    """Expect: a contiguous view (whatever its storage offset or the strides of its size-1
    dims) computes right; a non-contiguous one either computes right (read through its
    strides) or is a LaunchError naming the parameter and saying why (layout/strides);
    never the numbers of the memory read as if it were contiguous. Both the keyword (general)
    path and the warm positional (fast) path."""
    torch.manual_seed(5)
    prog_name, inputs, param, contiguous = _view_case(case)
    prog = pack[prog_name]
    good = {k: (v.contiguous() if hasattr(v, "contiguous") else v) for k, v in inputs.items()}
    prog(*good.values())                                   # warm: the next positional call
    ref = _expected(prog_name, inputs)                     # goes through the fast path
    outcomes = []
    for path, call in (("keywords", lambda: prog(**inputs)),
                       ("positional", lambda: prog(*inputs.values()))):
        outcome, exc = right_or_refused(call, lambda y: close(y, ref), param, f"{case}/{path}")
        outcomes.append(outcome)
        if outcome == "refused":
            low = str(exc).lower()
            assert any(w in low for w in ("contig", "stride", "layout", "dense", "broadcast",
                                          "overlap")), \
                f"{case}/{path}: the refusal does not say what is wrong: {exc}"
    if contiguous:
        assert outcomes == ["ran", "ran"], f"{case}: a contiguous view was refused"
    assert outcomes[0] == outcomes[1], f"{case}: the general and fast paths disagree {outcomes}"


# ----------------------------------------------------------------------------- out= views

def _out_case(case: str) -> tuple[str, tuple[Any, ...], Any, Any, Callable[[], Any]]:
    """(program, inputs, out view, the float64 expectation, the poisoned storage's view)."""
    if case == "transposed":
        x, w, b = R(3, 5), R(5), R(5)
        base = torch.full((5, 3), NAN, device="cuda")
        return "affine", (x, w, b), base.t(), ref_affine(x, w, b), lambda: base
    if case == "expanded_stride0":
        x, w, b = R(3, 5), R(5), R(5)
        base = torch.full((5,), NAN, device="cuda")
        return "affine", (x, w, b), base.expand(3, 5), ref_affine(x, w, b), lambda: base
    if case == "channels_last":
        img = R(2, 3, 4, 5)
        out = torch.full((2, 3, 4, 5), NAN, device="cuda").contiguous(
            memory_format=torch.channels_last)
        return "scale4", (img, 0.5), out, img.double() * 0.5 + 1.0, lambda: out
    if case == "conj_view_complex":
        z = R(7, dtype=torch.complex64)
        base = torch.full((7,), complex(NAN, NAN), dtype=torch.complex64, device="cuda")
        out = base.conj()
        assert out.is_conj()
        return "cscale", (z, 2.0), out, z.to(torch.complex128) * 2.0, \
            lambda: torch.view_as_real(base)
    if case == "neg_view_scalar":
        v = R(100)
        base = torch.full((), complex(NAN, NAN), dtype=torch.complex64, device="cuda")
        out = base.conj().imag
        assert out.is_neg() and out.shape == ()
        return "fullsum", (v,), out, v.double().sum(), lambda: torch.view_as_real(base)
    if case == "neg_view_one_element":
        x, w, b = R(1, 1), R(1), R(1)
        base = torch.full((1, 1), complex(NAN, NAN), dtype=torch.complex64, device="cuda")
        out = base.conj().imag
        assert out.is_neg() and out.shape == (1, 1)
        return "affine", (x, w, b), out, ref_affine(x, w, b), lambda: torch.view_as_real(base)
    raise AssertionError(case)


OUT_CASES = ["transposed", "expanded_stride0", "channels_last", "conj_view_complex",
             "neg_view_scalar", "neg_view_one_element"]


@pytest.mark.parametrize("case", OUT_CASES, ids=OUT_CASES)
def test_out_views_are_written_as_torch_reads_them_or_refused(pack: Any, case: str) -> None:
    """Expect: after ``prog(..., out=view)`` the view, read by torch (conj/neg bits resolved),
    holds the right numbers; or a LaunchError names the output ``out`` and nothing was
    written (its storage still all NaN). Writing raw values under a lazy conj/neg view, or
    contiguous values under strides, gives numbers torch reads wrong: that is the bug this
    looks for. Both paths (keywords after the first call, then positional)."""
    for path in ("keywords", "positional"):
        _check_out_case(pack, case, path)


def _check_out_case(pack: Any, case: str, path: str) -> None:
    torch.manual_seed(6)                                   # a fresh, NaN-poisoned out each
    prog_name, inputs, out, ref, storage = _out_case(case)
    prog = pack[prog_name]
    prog(*inputs)                                          # bind first
    kwargs = {p.name: v for p, v in zip(prog.summary.inputs, inputs)}

    def call() -> Any:
        return prog(**kwargs, out=out) if path == "keywords" else prog(*inputs, out=out)

    outcome, _ = right_or_refused(call, lambda _y: close(out, ref), "out", f"{case}/{path}")
    if outcome == "refused":
        torch.cuda.synchronize()
        assert torch.isnan(storage()).all(), f"{case}/{path}: refused, yet wrote to out"


def test_out_starting_where_a_smaller_input_starts_is_refused(pack: Any) -> None:
    """README: an out= array that partially overlaps an input is a LaunchError; only the very
    same array (same start, *same size*) is in-place use. Here out (3, 5) starts where the
    weight (5,) starts: the kernel would overwrite weights other rows still read. Expect a
    LaunchError naming out (or the weight) on both paths, and the storage untouched."""
    torch.manual_seed(7)
    prog = pack["affine"]
    x, b = R(3, 5), R(5)
    buf = torch.randn(15, device="cuda")
    keep = buf.clone()
    w = buf[:5]
    out = buf.view(3, 5)
    prog(x, R(5), b)                                       # bind first
    for path, call in (("keywords", lambda: prog(xin=x, wgt=w, bvec=b, out=out)),
                       ("positional", lambda: prog(x, w, b, out=out))):
        with pytest.raises(kp.LaunchError) as info:
            call()
        msg = str(info.value)
        assert names(msg, "out") or names(msg, "wgt"), (path, msg)
        torch.cuda.synchronize()
        assert torch.equal(buf, keep), f"{path}: refused, yet wrote"


# ----------------------------------------------------------------------------- torch.compile

def test_torch_compile_around_a_call(pack: Any) -> None:
    """A function calling the pack, wrapped in torch.compile (a graph break is fine): results
    follow the inputs' values and shapes over several calls, with and without out=. The
    aot_eager backend keeps this fast while still running the surrounding ops as compiled
    graphs whose outputs are handed to kernelpack."""
    torch.manual_seed(8)
    prog = pack["layernorm"]

    def f(x: Any, w: Any, b: Any) -> Any:
        y = prog(x * 1.0 + 0.0, w, b)
        return y * 2.0 + 1.0

    def g(x: Any, w: Any, b: Any) -> Any:
        out = torch.empty_like(x)
        prog(x + 0.0, w, b, out=out)
        return out - 1.0

    cf = torch.compile(f, backend="aot_eager")
    cg = torch.compile(g, backend="aot_eager")
    try:
        for shape in ((4, 32), (4, 32), (3, 300), (4, 32)):
            x, w, b = R(*shape), R(shape[1]), R(shape[1])
            ref = ref_layernorm(x, w, b)
            close(cf(x, w, b), ref * 2.0 + 1.0)
            close(cg(x, w, b), ref - 1.0)
    finally:
        torch._dynamo.reset()


# ----------------------------------------------------------------------------- CUDA graphs

def test_graph_capture_of_allocating_calls_follows_new_inputs(pack: Any) -> None:
    """The PyTorch idiom ``static_out = model(static_in)`` inside ``torch.cuda.graph``: calls
    without out= allocate from the graph's private pool (torch allows allocation during
    capture), a program with scratch included (the layer norm's split variant, (2, 65536)),
    and a zero_init output (colsum, atomics). Warmed up on a side stream first, as torch's docs
    ask. Expect: capture succeeds, and each replay after copying new values into the static
    inputs gives the new results; colsum is zeroed on every replay (not accumulated)."""
    torch.manual_seed(9)
    sx, sw, sb = R(6, 40), R(40), R(40)
    lx, lw, lb = R(2, 65536), R(65536), R(65536)
    cm = R(8, 33)
    assert pack["layernorm"].plan(xin=lx.shape, wgt=lw.shape, bvec=lb.shape).variant == 0

    def body() -> tuple[Any, Any, Any]:
        return (pack["affine"](sx, sw, sb), pack["layernorm"](lx, lw, lb), pack["colsum"](cm))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1, y2, y3 = body()
    for _ in range(3):
        sx.copy_(R(6, 40))
        lx.copy_(R(2, 65536))
        cm.copy_(R(8, 33))
        graph.replay()
        close(y1, ref_affine(sx, sw, sb))
        close(y2, ref_layernorm(lx, lw, lb), tol=1e-4)
        close(y3, cm.double().sum(0))


def test_graph_capture_with_out_rezeroes_a_zero_init_output(pack: Any) -> None:
    """README: out= is graph-capture safe; a zero_init output is zero-filled first at every
    call, so the zeroing must be a node of the graph. Expect: replaying twice on the same
    input gives the column sums, not twice them; new input values give new sums."""
    torch.manual_seed(10)
    prog = pack["colsum"]
    m = R(5, 70)
    sums = torch.empty(70, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        prog(m, out=sums)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prog(m, out=sums)
    for i in range(3):
        if i == 2:
            m.copy_(R(5, 70))
        graph.replay()
        close(sums, m.double().sum(0))


# ----------------------------------------------------------------------------- streams

def test_side_stream_context_orders_calls_between_torch_ops(pack: Any) -> None:
    """``with torch.cuda.stream(s)``: a call runs on s, after the torch ops queued on s before
    it (here held back by a sleep kernel, so a launch on any other stream would read the old
    values) and before the torch ops queued after it; no host sync needed. One program of one
    launch, one with scratch (split layer norm), one with a zero_init output."""
    torch.manual_seed(11)
    x, w, b = torch.zeros(4, 64, device="cuda"), R(64), R(64)
    lx, lw, lb = torch.zeros(2, 65536, device="cuda"), R(65536), R(65536)
    m = torch.zeros(6, 10, device="cuda")
    nx, nlx, nm = R(4, 64), R(2, 65536), R(6, 10)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)                       # tens of ms on an H200
        x.copy_(nx)
        lx.copy_(nlx)
        m.copy_(nm)
        z1 = pack["affine"](x, w, b) * 2.0
        z2 = pack["layernorm"](lx, lw, lb) * 2.0
        z3 = pack["colsum"](m) * 2.0
    s.synchronize()
    close(z1, ref_affine(nx, w, b) * 2.0)
    close(z2, ref_layernorm(nlx, lw, lb) * 2.0, tol=1e-4)
    close(z3, nm.double().sum(0) * 2.0)


def test_explicit_device_objects_and_set_device(pack: Any) -> None:
    """torch.device("cuda:0") tensors, calls inside ``torch.cuda.device(0)`` after
    ``set_device(0)``: outputs on that same device, right numbers."""
    torch.manual_seed(12)
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    with torch.cuda.device(dev):
        x = torch.randn(3, 20, device=dev)
        w = torch.randn(20, device=torch.device("cuda", 0))
        b = torch.randn(20, device="cuda:0")
        y = pack["affine"](x, w, b)
    assert y.device == dev
    close(y, ref_affine(x, w, b))


# ----------------------------------------------------------------------------- scalars

@pytest.mark.parametrize("kind", ["cpu_0d", "cuda_0d", "cpu_1elem"],
                         ids=["cpu_0d", "cuda_0d", "cpu_1elem"])
def test_torch_tensors_given_for_a_scalar_parameter(pack: Any, kind: str) -> None:
    """torch users pass ``torch.tensor(0.5)`` where a number goes (torch ops accept 0-d
    tensors as scalars). Expect: the right numbers (the tensor's value used), or a clear
    TypeError/KernelPackError naming the scalar ``gain``; never a wrong value (a pointer or
    garbage read as the float) and never an AttributeError/IndexError."""
    torch.manual_seed(13)
    img = R(2, 3, 4, 5)
    gain = {"cpu_0d": torch.tensor(0.5), "cuda_0d": torch.tensor(0.5, device="cuda"),
            "cpu_1elem": torch.tensor([0.5])}[kind]
    prog = pack["scale4"]
    prog(img, 0.25)                                        # bind first
    ref = img.double() * 0.5 + 1.0
    for path, call in (("keywords", lambda: prog(img=img, gain=gain)),
                       ("positional", lambda: prog(img, gain))):
        try:
            y = call()
        except (TypeError, kp.KernelPackError) as exc:
            assert names(str(exc), "gain"), f"{kind}/{path}: {type(exc).__name__}: {exc}"
            continue
        close(y, ref)


# ----------------------------------------------------------------------------- child processes

_CHILD = textwrap.dedent(r"""
    import json, sys, traceback
    import torch, kernelpack as kp
    pack = kp.load(sys.argv[1]); case = sys.argv[2]
    res = {"case": case}
    def R(*s): return torch.randn(*s, device="cuda")
    def ref_ln(x, w, b):
        return torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), w.double(),
                                              b.double(), eps=1e-5)
    def attempt(fn, param):
        try:
            y = fn()
            torch.cuda.synchronize()
            return {"outcome": "ran", "value": y}
        except Exception as exc:
            return {"outcome": "raised", "type": type(exc).__name__,
                    "kp": isinstance(exc, (kp.KernelPackError, TypeError)),
                    "named": param in str(exc), "msg": str(exc)[:400]}
    torch.manual_seed(0)
    w5, b5 = R(5), R(5)
    pack["affine"](R(3, 5), w5, b5)          # bind: the fast path is warm
    if case == "meta":
        r = attempt(lambda: pack["affine"](torch.empty(3, 5, device="meta"), w5, b5), "xin")
        r.pop("value", None); res["r"] = r
    elif case == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            fx = torch.empty(3, 5, device="cuda")
        r = attempt(lambda: pack["affine"](fx, w5, b5), "xin")
        r.pop("value", None); res["r"] = r
    elif case == "vmap":
        X = R(4, 3, 5)
        r = attempt(lambda: torch.vmap(lambda x: pack["affine"](x, w5, b5))(X), "xin")
        if r["outcome"] == "ran":
            ref = X.double() * w5.double() + b5.double()
            y = r.pop("value")
            r["right"] = (tuple(y.shape) == tuple(ref.shape)
                          and bool(torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)))
        res["r"] = r
    elif case == "misaligned":
        bad = []
        for n, b in ((100, 3), (200, 3), (500, 3), (1000, 3), (2000, 3), (4000, 3),
                     (8000, 3), (9000, 3), (65536, 2)):
            for off in (1, 2, 3):
                x = torch.randn(b * n + 4, device="cuda")[off:off + b * n].view(b, n)
                w = torch.randn(n + 4, device="cuda")[off + 1:off + 1 + n]
                bb = torch.randn(n + 4, device="cuda")[4 - off:4 - off + n]
                for call in ("kw", "pos"):
                    try:
                        y = (pack["layernorm"](xin=x, wgt=w, bvec=bb) if call == "kw"
                             else pack["layernorm"](x, w, bb))
                        torch.cuda.synchronize()
                        err = float((y.double() - ref_ln(x, w, bb)).abs().max())
                        if not err < 1e-4:
                            bad.append([n, b, off, call, "maxerr %g" % err])
                    except Exception as exc:
                        bad.append([n, b, off, call, type(exc).__name__ + ": " + str(exc)[:200]])
        xa = torch.randn(3 * 37 + 1, device="cuda")[1:].view(3, 37)
        wa = torch.randn(38, device="cuda")[1:]; ba = torch.randn(39, device="cuda")[2:]
        ya = pack["affine"](xa, wa, ba); torch.cuda.synchronize()
        if not torch.allclose(ya.double(), xa.double() * wa.double() + ba.double(),
                              rtol=1e-5, atol=1e-5):
            bad.append(["affine", 37, 1, "pos", "wrong"])
        res["bad"] = bad
    try:                                     # the context is still healthy afterwards
        x = R(3, 5); y = pack["affine"](x, w5, b5); torch.cuda.synchronize()
        ok = torch.allclose(y.double(), x.double() * w5.double() + b5.double(),
                            rtol=1e-5, atol=1e-5)
        res["after"] = "ok" if ok else "wrong"
    except Exception as exc:
        res["after"] = type(exc).__name__ + ": " + str(exc)[:300]
    print("RESULT " + json.dumps(res, default=str))
""")


def _run_child(pack_path: Path, case: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(pack_path), case],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, (f"child {case} died (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                   f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("case", ["meta", "fake", "vmap"], ids=["meta", "fake", "vmap"])
def test_tensors_without_device_memory_are_refused_naming_the_parameter(pack_path: Path,
                                                                        case: str) -> None:
    """A meta tensor (model init on "meta"), a FakeTensor (what torch.compile/export trace
    with) and vmap's batched tensor have no CUDA memory of their own to launch on. Expect a
    KernelPackError (a LaunchError: wrong device/kind) or TypeError naming ``xin``; for vmap a
    right batched result is acceptable too. Never a null pointer launched (an illegal-address
    fault that poisons the process: checked by a normal call afterwards), never a result of
    the wrong shape."""
    res = _run_child(pack_path, case)
    r = res["r"]
    if case == "vmap" and r["outcome"] == "ran":
        assert r["right"], f"vmap ran but gave wrong numbers or shape: {res}"
    else:
        assert r["outcome"] == "raised", f"{case}: a call on a tensor without memory ran: {res}"
        assert r["kp"], f"{case}: not a KernelPackError/TypeError: {res}"
        assert r["named"], f"{case}: the error does not name 'xin': {res}"
    assert res["after"] == "ok", f"{case}: the process's CUDA context is broken after: {res}"


def test_misaligned_weights_and_inputs_in_every_layernorm_variant(pack_path: Path) -> None:
    """Contiguous views at 4/8/12-byte offsets, a different misalignment for x, the weight and
    the bias, at row lengths that pick every layer norm variant (warp rows, block rows, the
    block loop, the split of long rows) and the pointwise affine: vector loads may only be used
    where every operand they load is aligned. Expect right numbers (errors below 1e-4) and a
    healthy context afterwards. Run in a child: a misaligned vector load faults the device."""
    res = _run_child(pack_path, "misaligned")
    assert res["bad"] == [], res["bad"]
    assert res["after"] == "ok", res
