"""Programs with scratch on the fast paths, on a real GPU (CPU twin: test_fast_scratch.py).

A column standard deviation (scratch on every shape) and a row softmax (scratch only in the
split variant of long rows) take the fast path after their first call, with torch and with
CuPy: results right call after call, many calls queued without a sync (each call's scratch is
handed out again only in stream order), ``out=``, ``stream=`` (the fast path too since
session 42, its scratch for that stream), and a CUDA graph captured with ``out=``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

import kernelpack as kp

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = pytest.mark.gpu

_COUNT = kernels.gpu_count_or_skip()
T = kp.Tensor


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def pack():
    @kp.fusion
    def colstd(x: T[kp.f32, "a", "b"]):
        c = x - x.mean(axis=0, keepdims=True)
        return kp.sqrt((c * c).mean(axis=0))

    @kp.fusion
    def softmax(x: T[kp.f32, "n", "d"]):
        e = kp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])
                            for f in (colstd, softmax)]))


def _ref(name: str, x):
    xd = x.double()
    if name == "colstd":
        return xd.std(0, unbiased=False).float()
    return xd.softmax(1).float()


def _fast_calls(prog) -> int | None:
    fast = getattr(prog._kp_bound.call, "__self__", None)
    return getattr(fast, "fast_calls", None)


@pytest.mark.parametrize("name, shape", [("colstd", (1000, 64)), ("colstd", (64, 4096)),
                                         ("softmax", (4, 65536)), ("softmax", (32, 512))])
def test_calls_with_scratch_take_the_fast_path(pack, torch, name, shape) -> None:
    prog = pack[name]
    plan = prog.plan(shape)
    has_scratch = bool(prog.summary.variants[plan.variant].scratch)
    assert has_scratch == (shape != (32, 512))
    xs = [torch.randn(shape, device="cuda") for _ in range(40)]
    prog(xs[0])
    prog(xs[0])  # builds the fast path
    before = _fast_calls(prog)
    assert prog._kp_bound.call != prog._kp_bound.__call__
    outs = [prog(x) for x in xs]  # queued back to back, no sync between
    torch.cuda.synchronize()
    for x, z in zip(xs, outs):
        torch.testing.assert_close(z, _ref(name, x), rtol=1e-5, atol=1e-6)
    if before is not None:  # the C fast path took every one of them
        assert _fast_calls(prog) == before + len(xs)
    out = torch.empty_like(outs[0])
    assert prog(xs[1], out=out) is out
    torch.testing.assert_close(out, _ref(name, xs[1]), rtol=1e-5, atol=1e-6)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the current stream: the fast path launches there
        z = prog(xs[2])
    side.synchronize()
    torch.testing.assert_close(z, _ref(name, xs[2]), rtol=1e-5, atol=1e-6)
    # stream= with out=: the fast path too (session 42), its scratch from that stream's pool;
    # calls queued back to back there, no sync between
    other = torch.cuda.Stream()
    torch.cuda.synchronize()
    before = _fast_calls(prog)
    outs2 = [torch.empty_like(out) for _ in xs]
    for x, o in zip(xs, outs2):
        assert prog(x, out=o, stream=other) is o
    other.synchronize()
    for x, o in zip(xs, outs2):
        torch.testing.assert_close(o, _ref(name, x), rtol=1e-5, atol=1e-6)
    if before is not None:
        assert _fast_calls(prog) == before + len(xs)
    # stream= without out=: the fast path too (session 43), each output from that stream's
    # pool (made current around the allocation, and the caller's current stream set back)
    torch.cuda.synchronize()
    before = _fast_calls(prog)
    current = torch.cuda.current_stream()
    outs3 = [prog(x, stream=other) for x in xs]
    assert torch.cuda.current_stream() == current
    other.synchronize()
    for x, o in zip(xs, outs3):
        torch.testing.assert_close(o, _ref(name, x), rtol=1e-5, atol=1e-6)
    if before is not None:
        assert _fast_calls(prog) == before + len(xs)


def test_stream_scratch_is_a_block_of_torchs_allocator(pack, torch, monkeypatch) -> None:
    """The scratch (fast path: one block a call; general path, a new shape's first call: one
    per buffer) comes straight from torch's caching allocator for the call's stream, ``stream=``
    or the current one (arrays.TorchAdapter.scratch), and goes back once the launches are queued:
    results right with the calls queued back to back, every block handed back, and torch's
    count of allocated memory back where it was."""
    from kernelpack.runtime.arrays import torch_adapter

    adapter = torch_adapter(torch)
    assert adapter._blocks is not None, "this torch lacks the caching allocator's entry points"
    assert adapter._switch is not None, "this torch lacks the current-stream C calls"
    alloc, delete, get_device = adapter._blocks
    taken: list = []
    freed: list = []

    def counting_alloc(nbytes: int, stream: int) -> int:
        ptr = alloc(nbytes, stream)
        taken.append((ptr, stream))
        return ptr

    def counting_delete(ptr: int) -> None:
        freed.append(ptr)
        delete(ptr)

    monkeypatch.setattr(adapter, "_blocks", (counting_alloc, counting_delete, get_device))
    prog = pack["softmax"]
    other = torch.cuda.Stream()
    xs = [torch.randn(4, 65536, device="cuda") for _ in range(20)]
    outs = [torch.empty_like(x) for x in xs]
    prog(xs[0], out=outs[0], stream=other)
    prog(xs[0], out=outs[0], stream=other)  # the fast path is built
    wide = torch.randn(8, 100000, device="cuda")  # a new shape, later: the general path
    z = torch.empty_like(wide)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    taken.clear()
    freed.clear()
    for x, o in zip(xs, outs):
        assert prog(x, out=o, stream=other) is o
    assert prog(wide, out=z, stream=other) is z
    other.synchronize()
    for x, o in zip(xs + [wide], outs + [z]):
        torch.testing.assert_close(o, _ref("softmax", x), rtol=1e-5, atol=1e-6)
    assert len(taken) >= len(xs) + 1
    assert {s for _, s in taken} == {other.cuda_stream}
    assert sorted(freed) == sorted(p for p, _ in taken)
    assert torch.cuda.memory_allocated() == before
    # on the current stream too (no stream=): a block of its pool, handed back
    taken.clear()
    freed.clear()
    for x, o in zip(xs, outs):
        assert prog(x, out=o) is o
    torch.cuda.synchronize()
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, _ref("softmax", x), rtol=1e-5, atol=1e-6)
    assert len(taken) == len(xs)
    assert {s for _, s in taken} == {torch.cuda.current_stream().cuda_stream}
    assert sorted(freed) == sorted(p for p, _ in taken)
    assert torch.cuda.memory_allocated() == before


def test_graph_capture_with_scratch(pack, torch) -> None:
    prog = pack["colstd"]
    x = torch.randn(2000, 256, device="cuda")
    z = torch.empty(256, device="cuda")
    prog(x, out=z)
    prog(x, out=z)  # bound, loaded and the fast path built outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        prog(x, out=z)
    x.copy_(torch.randn(2000, 256, device="cuda") * 3 + 1)
    z.zero_()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, _ref("colstd", x), rtol=1e-5, atol=1e-6)


def test_cupy_calls_with_scratch(pack) -> None:
    cupy = pytest.importorskip("cupy")
    prog = pack["colstd"]
    xs = [cupy.random.standard_normal((3000, 100), dtype=cupy.float32) for _ in range(20)]
    prog(xs[0])
    prog(xs[0])
    outs = [prog(x) for x in xs]
    cupy.cuda.Device().synchronize()
    for x, z in zip(xs, outs):
        assert isinstance(z, cupy.ndarray)
        cupy.testing.assert_allclose(z, x.astype(cupy.float64).std(0), rtol=1e-5, atol=1e-6)


def test_default_stream_handle_while_another_is_current(pack, torch) -> None:
    """``stream=0`` inside ``with torch.cuda.stream(side)``: the general path allocates the
    output and scratch from the default stream's pool and launches there."""
    prog = pack["colstd"]
    x = torch.randn(3000, 100, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        z = prog(x, stream=0)
    torch.cuda.default_stream().synchronize()
    torch.testing.assert_close(z, _ref("colstd", x), rtol=1e-5, atol=1e-6)


def _cupy_fast_calls(prog) -> int | None:
    """The CuPy FastCall's count of calls it launched itself (behind torch's where both are
    imported: fastpath.make_fast_path), or None on a closure path."""
    call = prog._kp_bound.call
    while type(fc := getattr(call, "__self__", None)).__name__ == "FastCall":
        if fc.flavor == "cupy":
            return fc.fast_calls
        call = fc.hooks.slow
    return None


def test_cupy_stream_handles_with_scratch(pack) -> None:
    """CuPy arrays with ``stream=``: another stream takes the fast path (session 42), its
    scratch the driver's stream-ordered memory on that stream, many calls queued there back to
    back; the default stream while another is current is the general path's, which allocates
    on that stream and launches there; neither with CuPy's deprecation warning (CuPy 14
    deprecates ExternalStream for Stream.from_external)."""
    cupy = pytest.importorskip("cupy")
    warnings.filterwarnings("error", ".*ExternalStream", DeprecationWarning)  # restored by pytest
    prog = pack["colstd"]
    xs = [cupy.random.standard_normal((3000, 100), dtype=cupy.float32) for _ in range(20)]
    refs = [x.astype(cupy.float64).std(0) for x in xs]
    x, ref = xs[0], refs[0]
    other, side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    out = cupy.empty(100, dtype=cupy.float32)
    prog(x)
    prog(x)  # the fast path built
    cupy.cuda.Device().synchronize()
    before = _cupy_fast_calls(prog)
    outs = [cupy.empty(100, dtype=cupy.float32) for _ in xs]
    for a, o in zip(xs, outs):
        assert prog(a, out=o, stream=other) is o
    other.synchronize()
    for o, r in zip(outs, refs):
        cupy.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
    if before is not None:
        assert _cupy_fast_calls(prog) == before + len(xs)
    assert prog(x, out=out, stream=other) is out
    other.synchronize()
    cupy.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    with side:
        z = prog(x, stream=0)
    cupy.cuda.Stream.null.synchronize()
    cupy.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, shape", [("colstd", (3000, 100)), ("softmax", (64, 512))])
def test_cupy_stream_without_out(pack, name, shape) -> None:
    """CuPy arrays with ``stream=`` another stream and no ``out=`` take the fast path since
    session 44: each output from that stream's arena of CuPy's pool (made while it is
    current, then CuPy's current stream put back), the scratch (colstd) stream-ordered on it,
    many calls queued there back to back, results right after one sync of that stream."""
    cupy = pytest.importorskip("cupy")
    prog = pack[name]
    xs = [cupy.random.standard_normal(shape, dtype=cupy.float32) for _ in range(20)]
    if name == "colstd":
        refs = [x.astype(cupy.float64).std(0) for x in xs]
    else:
        refs = []
        for x in xs:
            e = cupy.exp(x.astype(cupy.float64) - x.max(1, keepdims=True))
            refs.append(e / e.sum(1, keepdims=True))
    other = cupy.cuda.Stream(non_blocking=True)
    prog(xs[0])
    prog(xs[0])  # the fast path built
    cupy.cuda.Device().synchronize()
    current = cupy.cuda.get_current_stream()
    before = _cupy_fast_calls(prog)
    zs = [prog(x, stream=other) for x in xs]
    assert cupy.cuda.get_current_stream() == current
    other.synchronize()
    for z, r in zip(zs, refs):
        assert z.shape == r.shape and z.dtype == cupy.float32
        cupy.testing.assert_allclose(z, r, rtol=1e-5, atol=1e-6)
    if before is not None:
        assert _cupy_fast_calls(prog) == before + len(xs)

