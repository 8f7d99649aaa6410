"""Review 31: a CuPy user's world, on a real GPU.

What a CuPy user does with ``pack[name](...)``: arrays of every dtype the DSL has, 0-d and
size-0 arrays, views (offsets, dtype views), ``out=`` of every layout, cupy's current and
explicit streams (non-blocking, ptds, null, ``ExternalStream``), cupy's allocators (pool,
plain cudaMalloc, ``MemoryAsyncPool``, managed memory), host memory passed by mistake, CUDA
graph capture on a cupy stream, DLPack of the outputs.

Ordering tests use a spin kernel (``clock64`` busy loop, wrapped with ``kp.external``) to keep
a stream busy for ~50 ms, so that work put on the wrong stream visibly runs too early.
Cases that could fault the CUDA context (misaligned pointers) run in a child process, one
fresh child after any case that leaves the context unusable.
"""

import contextlib
import gc
import json
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

N = 1 << 16
CYCLES = 100_000_000  # ~50 ms at the H200's clock: far longer than the host work it covers

_DTYPES = {
    "bool": (kp.bool_, np.bool_), "i8": (kp.i8, np.int8), "u8": (kp.u8, np.uint8),
    "u16": (kp.u16, np.uint16), "i32": (kp.i32, np.int32), "i64": (kp.i64, np.int64),
    "u64": (kp.u64, np.uint64), "f16": (kp.f16, np.float16), "f32": (kp.f32, np.float32),
    "f64": (kp.f64, np.float64), "c64": (kp.c64, np.complex64),
    "c128": (kp.c128, np.complex128),
}
_LIN = {"f16": kp.f16, "f32": kp.f32, "f64": kp.f64, "c64": kp.c64, "c128": kp.c128}


def _programs() -> list:
    """Every program this file calls, compiled for sm_90 (H200: exact cubin) and PTX."""
    tg = ["sm_90", "ptx"]
    out = []
    for name, (dt, _) in _DTYPES.items():
        def sel(cond: kp.Tensor[kp.bool_, "n"], a_in: kp.Tensor[dt, "n"],
                b_in: kp.Tensor[dt, "n"]):
            return kp.where(cond, a_in, b_in)
        out.append(kp.compile(kp.fusion(sel, name=f"sel_{name}"), targets=tg))
    for name, dt in _LIN.items():
        def lin(src: kp.Tensor[dt, "n"]):
            return src * 2.0 + 1.0
        out.append(kp.compile(kp.fusion(lin, name=f"lin_{name}"), targets=tg))

    @kp.fusion
    def lin_cap(src: kp.Tensor[kp.f32, "n"]):
        return src * 3.0 - 1.0

    @kp.fusion
    def lin2(src: kp.Tensor[kp.f32, "b", "n"]):
        return src * 2.0 + 1.0

    @kp.fusion
    def fsum(src: kp.Tensor[kp.f32, "n"]):
        return src.sum()

    @kp.fusion
    def colsum(src: kp.Tensor[kp.f32, "b", "n"]):
        return src.sum(axis=0)

    @kp.fusion
    def scal0(src: kp.Tensor[kp.f32], scale: kp.f32):
        return src * scale

    @kp.fusion
    def tobf16(src: kp.Tensor[kp.f32, "n"]):
        return src.astype(kp.bf16), src * 2.0

    @kp.fusion
    def two(src: kp.Tensor[kp.f32, "n"]):
        return src + 1.0, src * src

    for f in (lin_cap, lin2, fsum, colsum, scal0, tobf16, two):
        out.append(kp.compile(f, targets=tg))
    out.append(kp.external(
        "spin", "spin",
        params=[kp.Tensor("flag", kp.i64, [1], role="inout"), kp.Scalar("cycles", kp.i64)],
        grid=1, block=1,
        cuda=r"""
        extern "C" __global__ void spin(long long* flag, long long cycles) {
            long long t0 = clock64();
            while (clock64() - t0 < cycles) { }
            flag[0] += 1;
        }""",
        targets=tg,
    ))
    return out


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - any failure means no usable device
        pytest.skip(f"no usable CUDA device: {e}")
    if count == 0:
        pytest.skip("no CUDA device")
    return cupy


@pytest.fixture(scope="module")
def pack_path(cp, tmp_path_factory):
    path = tmp_path_factory.mktemp("r31") / "cupy_world.kpack"
    kp.save(_programs(), str(path))
    return str(path)


@pytest.fixture(scope="module")
def pack(pack_path):
    return kp.load(pack_path)


def _names(msg: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", msg) is not None


def _sync(cp) -> None:
    cp.cuda.Device().synchronize()


def _external(cp, ptr):
    """``cp.cuda.ExternalStream(ptr)`` (deprecated in cupy 14 for ``Stream.from_external``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(ptr)


# ---------------------------------------------------------------------------------------------
# dtypes, 0-d, size 0, what comes back


@pytest.mark.parametrize("name", [*_DTYPES, "longlong", "ulonglong"])
def test_every_dtype_goes_in_and_comes_back_as_cupy(cp, pack, name):
    """where(cond, a, b) moves every element unchanged: cupy in -> cupy out, same dtype,
    bit-exact values. ``np.longlong``/``np.ulonglong`` are int64/uint64 with another dtype
    object (type number 9/10, not 7/8): the same arrays to the user."""
    npdt = {"longlong": np.longlong, "ulonglong": np.ulonglong}.get(name) or _DTYPES[name][1]
    prog = pack["sel_" + {"longlong": "i64", "ulonglong": "u64"}.get(name, name)]
    rng = np.random.default_rng(31)
    n = 1001
    cond = rng.random(n) < 0.5
    if npdt == np.bool_:
        a, b = rng.random(n) < 0.5, rng.random(n) < 0.5
    elif np.issubdtype(npdt, np.integer):
        info = np.iinfo(npdt)
        a = rng.integers(info.min, info.max, n, dtype=npdt, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=npdt, endpoint=True)
        a[:2] = (info.min, info.max)
    elif np.issubdtype(npdt, np.complexfloating):
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(npdt)
        b = (rng.standard_normal(n) - 1j * rng.standard_normal(n)).astype(npdt)
    else:
        a = rng.standard_normal(n).astype(npdt)
        b = rng.standard_normal(n).astype(npdt)
    a, b = a.astype(npdt), b.astype(npdt)
    y = prog(cp.asarray(cond), cp.asarray(a), cp.asarray(b))
    assert isinstance(y, cp.ndarray), type(y)
    assert y.shape == (n,) and y.dtype == np.dtype(npdt)
    np.testing.assert_array_equal(cp.asnumpy(y), np.where(cond, a, b))


def test_bfloat16_output_for_cupy_inputs(cp, pack):
    """A bf16 output of a call on cupy inputs must come back in a form that keeps its dtype
    (a cupy bfloat16 array where NumPy has the dtype through ml_dtypes, else a kernelpack
    DeviceBuffer of bfloat16, as for any caller without a framework dtype) with the right
    bits, or be refused up front naming the output: never a cupy/NumPy exception, never a
    cupy array of another dtype passed off as the output."""
    x = np.linspace(-3, 3, 257, dtype=np.float32)
    try:
        r0, r1 = pack["tobf16"](cp.asarray(x))
    except kp.KernelPackError as e:
        assert _names(str(e), "out0") or "bfloat16" in str(e), str(e)
        return
    assert isinstance(r1, cp.ndarray) and r1.dtype == np.float32
    np.testing.assert_array_equal(cp.asnumpy(r1), x * 2)
    u = x.view(np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if isinstance(r0, cp.ndarray):
        # Lead: where NumPy knows bfloat16 (ml_dtypes registers it), cupy arrays of it exist,
        # and a cupy array of bfloat16 is the right output for cupy inputs
        assert r0.dtype.name == "bfloat16" and r0.dtype.itemsize == 2, r0.dtype
        got = cp.asnumpy(r0.view(cp.uint16))
    else:
        assert getattr(r0, "dtype", None) == kp.bf16, repr(r0)
        got = np.frombuffer(r0.copy_to_host(), np.uint16)
    np.testing.assert_array_equal(got, want)
    # a wrong-dtype cupy out for the bf16 output is named
    with pytest.raises(kp.LaunchError) as ei:
        pack["tobf16"](cp.asarray(x), out=(cp.empty(257, cp.uint16), cp.empty(257, cp.float32)))
    assert _names(str(ei.value), "out0"), str(ei.value)


@pytest.mark.parametrize("case", ["lin_empty", "lin_empty_out", "fsum_empty", "colsum_0_rows",
                                  "colsum_0_cols", "scal0", "scal0_out", "fsum_0d_out"])
def test_zero_d_and_size_zero_cupy_arrays(cp, pack, case):
    """Size-0 cupy arrays (whose data pointer is 0) are valid inputs and outputs; 0-d arrays
    are rank-0 tensors; results are cupy arrays of the planned shape."""
    f32 = cp.float32
    if case == "lin_empty":
        y = pack["lin_f32"](cp.empty(0, f32))
        assert isinstance(y, cp.ndarray) and y.shape == (0,) and y.dtype == f32
    elif case == "lin_empty_out":
        o = cp.empty(0, f32)
        pack["lin_f32"](cp.empty(0, f32), out=o)
    elif case == "fsum_empty":
        y = pack["fsum"](cp.empty(0, f32))
        assert isinstance(y, cp.ndarray) and y.shape == () and float(y) == 0.0
    elif case == "colsum_0_rows":
        y = pack["colsum"](cp.empty((0, 7), f32))
        assert isinstance(y, cp.ndarray) and y.shape == (7,)
        np.testing.assert_array_equal(cp.asnumpy(y), np.zeros(7, np.float32))
    elif case == "colsum_0_cols":
        y = pack["colsum"](cp.empty((5, 0), f32))
        assert isinstance(y, cp.ndarray) and y.shape == (0,)
    elif case == "scal0":
        y = pack["scal0"](cp.array(3.0, f32), 2.0)
        assert isinstance(y, cp.ndarray) and y.shape == () and float(y) == 6.0
    elif case == "scal0_out":
        o = cp.full((), -1.0, f32)
        r = pack["scal0"](cp.array(3.0, f32), 0.5, out=o)
        assert float(o) == 1.5, (float(o), r)
    elif case == "fsum_0d_out":
        o = cp.full((), -1.0, f32)
        pack["fsum"](cp.arange(100, dtype=f32), out=o)
        assert float(o) == 4950.0


def test_scalar_given_as_a_cupy_0d_array(cp, pack):
    """``cp.float32(2)`` is a NumPy scalar (documented to work). A 0-d *cupy array* for a
    scalar parameter must either be read as its value or be refused naming the parameter."""
    x = cp.array(3.0, cp.float32)
    np_scalar = pack["scal0"](x, cp.float32(2.0))
    assert float(np_scalar) == 6.0
    try:
        y = pack["scal0"](x, cp.array(2.0, cp.float32))
    except (kp.KernelPackError, TypeError) as e:
        assert _names(str(e), "scale"), str(e)
    else:
        assert float(y) == 6.0


def test_outputs_are_cupy_arrays_usable_at_once(cp, pack):
    """cupy in -> cupy out (one output: an array; two: a tuple in summary order), on the
    inputs' device, C-contiguous; a cupy op on the same (current) stream sees the values
    without a sync, and DLPack consumers (cupy, torch if present) read the same values."""
    x_np = np.linspace(-2, 2, N, dtype=np.float32)
    with cp.cuda.Device(0):
        x = cp.asarray(x_np)
        y = pack["lin_f32"](x)
        assert type(y) is cp.ndarray and y.dtype == np.float32 and y.shape == (N,)
        assert y.device.id == 0 and y.flags.c_contiguous
        z = y * 3.0
        np.testing.assert_allclose(cp.asnumpy(z), (x_np * 2 + 1) * 3, rtol=1e-6)
        r = pack["two"](x)
        assert isinstance(r, tuple) and len(r) == 2
        assert all(type(t) is cp.ndarray for t in r), [type(t) for t in r]
        np.testing.assert_array_equal(cp.asnumpy(r[0]), x_np + 1)
        np.testing.assert_array_equal(cp.asnumpy(r[1]), x_np * x_np)
        np.testing.assert_array_equal(cp.asnumpy(cp.from_dlpack(y)), cp.asnumpy(y))
    try:
        import torch
    except ImportError:
        return
    t = torch.from_dlpack(y)
    np.testing.assert_array_equal(t.cpu().numpy(), x_np * 2 + 1)


def test_cupy_ndarray_subclass_in_gives_cupy_out(cp, pack):
    """A subclass of ``cupy.ndarray`` is a cupy array: results come back as cupy arrays (not
    kernelpack DeviceBuffers), with the right values, and it is accepted as ``out=``."""
    class Sub(cp.ndarray):
        pass

    x = cp.arange(1000, dtype=cp.float32)
    try:
        xs = Sub(x.shape, x.dtype, x.data)
        os_ = Sub(x.shape, x.dtype, cp.empty_like(x).data)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"this cupy cannot subclass ndarray this way: {e}")
    y = pack["lin_f32"](xs)
    assert isinstance(y, cp.ndarray), f"got {type(y).__name__} for a cupy.ndarray subclass"
    np.testing.assert_array_equal(cp.asnumpy(y), np.arange(1000, dtype=np.float32) * 2 + 1)
    pack["lin_f32"](x, out=os_)
    np.testing.assert_array_equal(cp.asnumpy(os_), np.arange(1000, dtype=np.float32) * 2 + 1)


def test_in_place_out_is_the_input(cp, pack):
    """Exact in-place use (out= the very input) is documented for pointwise programs."""
    x0 = np.arange(N, dtype=np.float32)
    x = cp.asarray(x0)
    r = pack["lin_f32"](x, out=x)
    np.testing.assert_array_equal(cp.asnumpy(x), x0 * 2 + 1)
    a, b = cp.arange(10, dtype=cp.float32), cp.zeros(10, cp.float32)
    cond = cp.asarray(np.arange(10) % 2 == 0)
    pack["sel_f32"](cond, a, b, out=a)
    np.testing.assert_array_equal(cp.asnumpy(a), np.where(np.arange(10) % 2 == 0,
                                                          np.arange(10), 0))
    del r


# ---------------------------------------------------------------------------------------------
# input views, out= layouts and host memory


@pytest.mark.parametrize("kind", ["reshape", "dtype_view", "from_numpy", "zeros_like",
                                  "row_offset", "strided", "negative", "broadcast",
                                  "transposed", "fortran"])
def test_input_views_compute_right_or_are_refused_naming_src(cp, pack, kind):
    """Contiguous views (a reshape, an int32 view of float32 memory, a row slice) compute
    right; a non-contiguous one (step, negative stride, stride 0, transpose, Fortran order)
    either computes what the view holds or is a LaunchError naming ``src``."""
    n = 1024
    base_np = np.arange(4 * n, dtype=np.float32).reshape(4, n)
    base = cp.asarray(base_np)
    if kind == "dtype_view":
        cond = cp.asarray(np.arange(n) % 2 == 0)
        a = base[0].view(cp.int32)
        y = pack["sel_i32"](cond, a, cp.zeros(n, cp.int32))
        want = np.where(np.arange(n) % 2 == 0, base_np[0].view(np.int32), 0)
        np.testing.assert_array_equal(cp.asnumpy(y), want)
        return
    views = {
        "reshape": ("lin2", lambda: base.reshape(8, n // 2), lambda: base_np.reshape(8, n // 2)),
        "from_numpy": ("lin2", lambda: cp.asarray(base_np), lambda: base_np),
        "zeros_like": ("lin2", lambda: cp.zeros_like(base), lambda: np.zeros_like(base_np)),
        "row_offset": ("lin2", lambda: base[1:3], lambda: base_np[1:3]),
        "strided": ("lin_f32", lambda: base.reshape(-1)[::2], lambda: base_np.reshape(-1)[::2]),
        "negative": ("lin_f32", lambda: base[0][::-1], lambda: base_np[0][::-1]),
        "broadcast": ("lin2", lambda: cp.broadcast_to(base[0], (4, n)),
                      lambda: np.broadcast_to(base_np[0], (4, n))),
        "transposed": ("lin2", lambda: base.T, lambda: base_np.T),
        "fortran": ("lin2", lambda: cp.asfortranarray(base), lambda: base_np),
    }
    name, make, ref = views[kind]
    v = make()
    try:
        y = pack[name](v)
    except kp.LaunchError as e:
        assert kind in ("strided", "negative", "broadcast", "transposed", "fortran"), (
            f"a C-contiguous view was refused: {e}")
        assert _names(str(e), "src"), str(e)
        return
    assert isinstance(y, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(y), ref() * 2 + 1)


def _bad_out(cp, kind, n):
    """(out candidate, base array to watch, program name, args)."""
    f32 = cp.float32
    src1 = cp.ones(n, f32)
    src2 = cp.ones((4, n), f32)
    if kind == "strided":
        base = cp.full(2 * n, np.nan, f32)
        return base[::2], base, "lin_f32", (src1,)
    if kind == "negative":
        base = cp.full(n, np.nan, f32)
        return base[::-1], base, "lin_f32", (src1,)
    if kind == "broadcast":
        base = cp.full(1, np.nan, f32)
        return cp.broadcast_to(base, (n,)), base, "lin_f32", (src1,)
    if kind == "wrong_dtype":
        base = cp.full(n, np.nan, cp.float64)
        return base, base, "lin_f32", (src1,)
    if kind == "wrong_size":
        base = cp.full(n + 1, np.nan, f32)
        return base, base, "lin_f32", (src1,)
    if kind == "wrong_rank":
        base = cp.full((n, 1), np.nan, f32)
        return base, base, "lin_f32", (src1,)
    if kind == "fortran":
        base = cp.asfortranarray(cp.full((4, n), np.nan, f32))
        return base, base, "lin2", (src2,)
    if kind == "transposed":
        base = cp.full((n, 4), np.nan, f32)
        return base.T, base, "lin2", (src2,)
    if kind == "host_numpy":
        base = np.full(n, np.nan, np.float32)
        return base, base, "lin_f32", (src1,)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["strided", "negative", "broadcast", "wrong_dtype",
                                  "wrong_size", "wrong_rank", "fortran", "transposed",
                                  "host_numpy"])
def test_bad_out_arrays_are_refused_naming_out_and_write_nothing(cp, pack, kind):
    """An ``out=`` cupy array of the wrong layout, dtype, size or rank (or a NumPy array) is a
    KernelPackError naming ``out``, raised before anything is launched (its memory keeps the
    NaNs it held)."""
    n = 1000
    o, base, name, args = _bad_out(cp, kind, n)
    with pytest.raises(kp.KernelPackError) as ei:
        pack[name](*args, out=o)
    assert _names(str(ei.value), "out"), str(ei.value)
    _sync(cp)
    host = base if isinstance(base, np.ndarray) else cp.asnumpy(base)
    assert np.isnan(host).all(), "a refused out= array was written"


@pytest.mark.parametrize("where", ["input", "pinned_input", "out", "pinned_out"])
def test_host_memory_is_refused_naming_the_parameter(cp, pack, where):
    """A NumPy array passed by mistake (plain, or over cupy's pinned host memory, which the
    device could address but which is no device array) is a LaunchError naming the parameter;
    the other arguments are cupy arrays, so the cupy fast path meets it first."""
    n = 1000
    cond = cp.asarray(np.arange(n) % 3 == 0)
    a, b = cp.ones(n, cp.float32), cp.zeros(n, cp.float32)
    if where.startswith("pinned"):
        mem = cp.cuda.alloc_pinned_memory(n * 4)
        host = np.frombuffer(mem, np.float32, n)
        host[:] = 5.0
    else:
        host = np.full(n, 5.0, np.float32)
    if where.endswith("input"):
        with pytest.raises(kp.LaunchError) as ei:
            pack["sel_f32"](cond, host, b)
        assert _names(str(ei.value), "a_in"), str(ei.value)
    else:
        with pytest.raises(kp.LaunchError) as ei:
            pack["sel_f32"](cond, a, b, out=host)
        assert _names(str(ei.value), "out"), str(ei.value)
        assert (host == 5.0).all()


# ---------------------------------------------------------------------------------------------
# streams


def _stream(cp, kind):
    if kind == "non_blocking":
        return cp.cuda.Stream(non_blocking=True), None
    if kind == "blocking":
        return cp.cuda.Stream(), None
    if kind == "external":
        owner = cp.cuda.Stream(non_blocking=True)
        return _external(cp, owner.ptr), owner
    if kind == "ptds":
        return cp.cuda.Stream.ptds, None
    if kind == "null":
        return cp.cuda.Stream.null, None
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["non_blocking", "blocking", "external", "ptds", "null"])
def test_calls_inside_with_stream_run_between_cupy_ops_on_it(cp, pack, kind):
    """Inside ``with s:`` a call (no ``stream=``) launches on ``s``: it sees what a cupy op
    queued on ``s`` before it wrote (queued behind ~50 ms of spinning on ``s``), and a cupy op
    queued after it sees its result, with no sync in between. Launched on any other stream,
    it would read ``src`` before the fill (zeros: 1.0 + 1 instead of 7.0 + 1)."""
    s, _owner = _stream(cp, kind)
    x = cp.zeros(N, cp.float32)
    flag = cp.zeros(1, cp.int64)
    _sync(cp)
    with s:
        pack["spin"](flag, CYCLES, stream=s)
        x.fill(3.0)
        y = pack["lin_f32"](x)
        z = y + 1.0
        got = cp.asnumpy(z)
    np.testing.assert_array_equal(got, np.full(N, 8.0, np.float32))
    _sync(cp)
    assert int(flag[0]) == 1


@pytest.mark.parametrize("form", ["cupy_stream", "int_handle", "external_stream", "torch_stream"])
def test_explicit_stream_orders_the_call_on_that_stream(cp, pack, form):
    """``stream=`` accepts a cupy Stream, an int handle, a cupy ExternalStream and a torch
    stream; the call runs on it (after a fill queued behind ~50 ms of spinning there) while
    cupy's current stream is the legacy default."""
    if form == "torch_stream":
        torch = pytest.importorskip("torch")
        ts = torch.cuda.Stream()
        s = _external(cp, ts.cuda_stream)
        arg = ts
    else:
        s = cp.cuda.Stream(non_blocking=True)
        arg = {"cupy_stream": s, "int_handle": s.ptr,
               "external_stream": _external(cp, s.ptr)}[form]
    x = cp.zeros(N, cp.float32)
    flag = cp.zeros(1, cp.int64)
    _sync(cp)
    pack["spin"](flag, CYCLES, stream=s.ptr)
    with s:
        x.fill(3.0)
    y = pack["lin_f32"](x, stream=arg)
    with s:
        got = cp.asnumpy(y + 1.0)
    np.testing.assert_array_equal(got, np.full(N, 8.0, np.float32))


@pytest.mark.parametrize("pool,form", [("pool", "cupy_stream"), ("pool", "int_handle"),
                                       ("async", "cupy_stream"), ("async", "int_handle")])
def test_scratch_of_a_call_on_another_stream_is_not_reused_early(cp, pack, pool, form):
    """A call with scratch and ``stream=s2`` while cupy's current stream is ``s1``: the scratch
    must come from (and go back to) ``s2``'s side of cupy's allocator (README: what a call
    allocates for a stream comes from that stream's pool). If it went back to ``s1``'s, cupy
    hands the same memory to the next allocation on ``s1`` at once, which is then filled while
    the call's kernels, queued on ``s2`` behind ~50 ms of spinning, still have to write their
    partial sums there: the sentinel arrays would come back holding partials, not 7.0."""
    if pool == "async":
        try:
            alloc = cp.cuda.MemoryAsyncPool().malloc
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"no stream-ordered allocator here: {e}")
    else:
        alloc = cp.get_default_memory_pool().malloc
    n = 1 << 22
    plan = pack["fsum"].plan(src=(n,))
    ws = sorted({a.nbytes for a in plan.allocations.values() if a.kind == "scratch"})
    assert ws and ws[-1] >= 1024, plan
    total = sum(a.nbytes for a in plan.allocations.values() if a.kind == "scratch")
    x = cp.ones(n, cp.float32)
    flag = cp.zeros(1, cp.int64)
    s1 = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    _sync(cp)
    with cp.cuda.using_allocator(alloc):
        with s1:
            pack["spin"](flag, CYCLES, stream=s2)
            y = pack["fsum"](x, stream=s2 if form == "cupy_stream" else s2.ptr)
            gc.collect()
            sentinels = [cp.full(max(k // 8, 1), 7.0, cp.float64)
                         for k in (total, *ws, total, *ws)]
        _sync(cp)
        got = [cp.asnumpy(t) for t in sentinels]
        assert float(y) == float(n)
    for i, g in enumerate(got):
        assert (g == 7.0).all(), (
            f"sentinel {i} ({g.nbytes} bytes, allocated on the current stream right after the "
            f"call) was overwritten by the call's kernels on stream=: {np.unique(g)[:5]}")


# ---------------------------------------------------------------------------------------------
# allocators


@pytest.mark.parametrize("kind", ["plain_cudamalloc", "managed", "async_pool"])
def test_cupy_allocators(cp, pack, kind):
    """Under ``cp.cuda.using_allocator(...)`` (no pool, managed memory, MemoryAsyncPool)
    inputs from that allocator work, results (with scratch: fsum, colsum) are right, and the
    outputs come from the caller's allocator (outputs are allocated by the caller's framework):
    under ``malloc_managed`` they are managed memory."""
    if kind == "plain_cudamalloc":
        alloc = None
    elif kind == "managed":
        alloc = cp.cuda.malloc_managed
    else:
        try:
            alloc = cp.cuda.MemoryAsyncPool().malloc
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"no stream-ordered allocator here: {e}")
    x_np = np.linspace(-1, 1, 3 * 1024, dtype=np.float32)
    x2_np = x_np.reshape(96, 32)
    with cp.cuda.using_allocator(alloc):
        x = cp.asarray(x_np)
        y = pack["lin_f32"](x)
        s = pack["fsum"](x)
        c = pack["colsum"](cp.asarray(x2_np))
        _sync(cp)
        np.testing.assert_array_equal(cp.asnumpy(y), x_np * 2 + 1)
        np.testing.assert_allclose(float(s), x_np.astype(np.float64).sum(), atol=1e-3)
        np.testing.assert_allclose(cp.asnumpy(c), x2_np.astype(np.float64).sum(0), atol=1e-4)
        if kind == "managed":
            managed = getattr(cp.cuda.runtime, "memoryTypeManaged", 3)
            for arr in (x, y, s, c):
                attrs = cp.cuda.runtime.pointerGetAttributes(arr.data.ptr)
                mtype = getattr(attrs, "type", getattr(attrs, "memoryType", None))
                assert mtype == managed, (
                    f"array at {arr.data.ptr:#x} is memory type {mtype}, not managed: "
                    "not allocated through cupy's current allocator")


# ---------------------------------------------------------------------------------------------
# CUDA graphs on a cupy stream


def _capture(s, fn):
    """Capture ``fn()`` on ``s``; returns (graph, fn's result) or re-raises fn's error after
    ending the capture."""
    with s:
        s.begin_capture()
        try:
            res = fn()
        except BaseException:
            with contextlib.suppress(Exception):  # the call's error is the one to report
                s.end_capture()
            raise
        g = s.end_capture()
    return g, res


def _captured_on_a_new_stream(cp, fn):
    """``fn`` captured on a new non-blocking stream (after a device sync): (stream, graph),
    or None when kernelpack refuses the capture with its own error (which these tests
    accept)."""
    _sync(cp)
    s = cp.cuda.Stream(non_blocking=True)
    try:
        return s, _capture(s, fn)[0]
    except kp.KernelPackError:
        return None


def test_graph_capture_of_out_and_allocating_calls_follows_new_inputs(cp, pack):
    """Calls captured on a cupy stream (one with ``out=``, one allocating its output) replay
    with whatever the inputs hold at launch."""
    x = cp.arange(N, dtype=cp.float32)
    o = cp.empty(N, cp.float32)
    pack["lin_f32"](x, out=o)
    pack["lin_f32"](x)
    _sync(cp)
    s = cp.cuda.Stream(non_blocking=True)
    g, y = _capture(s, lambda: (pack["lin_f32"](x, out=o), pack["lin_f32"](x))[1])
    for v in (5.0, -1.5):
        with s:
            x.fill(v)
            g.launch(stream=s)
            s.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(o), np.full(N, v * 2 + 1, np.float32))
        np.testing.assert_array_equal(cp.asnumpy(y), np.full(N, v * 2 + 1, np.float32))


def test_graph_capture_of_a_first_call(cp, pack):
    """A program's very first call (its module not loaded yet) made inside a capture on a cupy
    stream: either it is captured and replays right, or a clear KernelPackError says why; it
    must not invalidate the user's capture so that ``end_capture`` fails with a CUDA error."""
    x = cp.arange(N, dtype=cp.float32)
    o = cp.empty(N, cp.float32)
    captured = _captured_on_a_new_stream(cp, lambda: pack["lin_cap"](x, out=o))
    if captured is None:
        return
    s, g = captured
    with s:
        x.fill(2.0)
        g.launch(stream=s)
        s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(o), np.full(N, 5.0, np.float32))


def test_graph_capture_with_scratch_does_not_write_freed_memory(cp, pack):
    """A captured call with scratch (fsum: partial sums in a workspace) keeps writing that
    workspace at every replay. If the workspace went back to cupy's pool when the captured
    call returned, cupy hands it to the next allocation on that stream and each replay
    overwrites that array. Expected: the graph's workspace stays reserved (the arrays allocated
    after the capture keep their 7.0) and the replayed sum is right, or the capture is refused
    with a KernelPackError."""
    n = 1 << 22
    plan = pack["fsum"].plan(src=(n,))
    ws = [a.nbytes for a in plan.allocations.values() if a.kind == "scratch"]
    x = cp.ones(n, cp.float32)
    o = cp.empty((), cp.float32)
    pack["fsum"](x, out=o)
    captured = _captured_on_a_new_stream(cp, lambda: pack["fsum"](x, out=o))
    if captured is None:
        return
    s, g = captured
    gc.collect()
    with s:
        sentinels = [cp.full(max(k // 8, 1), 7.0, cp.float64) for k in (*ws, *ws, sum(ws))]
        x.fill(2.0)
        g.launch(stream=s)
        s.synchronize()
    assert float(o) == 2.0 * n
    for i, t in enumerate(sentinels):
        h = cp.asnumpy(t)
        assert (h == 7.0).all(), (
            f"array {i} allocated after the capture was overwritten by a replay: "
            f"{np.unique(h)[:5]}")


# ---------------------------------------------------------------------------------------------
# views that could fault the context: run in child processes


_CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import cupy as cp
    import kernelpack as kp

    pack = kp.load(sys.argv[1])
    ids = sys.argv[2].split(",")
    n = 1003
    rng = np.random.default_rng(7)
    NP = {"f16": np.float16, "f32": np.float32, "f64": np.float64,
          "c64": np.complex64, "c128": np.complex128}

    def values(name, k):
        dt = NP[name]
        v = rng.uniform(-4, 4, k)
        if name.startswith("c"):
            v = v + 1j * rng.uniform(-4, 4, k)
        return v.astype(dt)

    def offset_case(name, ioff, ooff):
        dt = NP[name]
        host = values(name, n + 8)
        base = cp.asarray(host)
        x = base[ioff:ioff + n]
        obase = cp.full(n + 8, 7, dt)
        o = obase[ooff:ooff + n]
        prog = pack["lin_" + name]
        prog(x, out=o)
        y = prog(x)
        cp.cuda.Device().synchronize()
        xs = host[ioff:ioff + n]
        want = (xs * dt(2) + dt(1)).astype(np.complex128 if name.startswith("c") else np.float64)
        ob = cp.asnumpy(obase)
        got_o = ob[ooff:ooff + n].astype(want.dtype)
        got_y = cp.asnumpy(y).astype(want.dtype)
        outside = np.concatenate([ob[:ooff], ob[ooff + n:]])
        scale = np.maximum(np.abs(want), 1)
        return {"kind": "ok",
                "err_out": float(np.max(np.abs(got_o - want) / scale)),
                "err_alloc": float(np.max(np.abs(got_y - want) / scale)),
                "outside_intact": bool((outside == 7).all()),
                "y_type": type(y).__name__}

    def misaligned(dt_base, off, view_dt):
        itemsize = np.dtype(view_dt).itemsize
        step = itemsize // np.dtype(dt_base).itemsize
        b = cp.zeros(n * step + off + 64, dt_base)
        return b[off:off + n * step].view(view_dt)

    def mis_case(cid):
        good = {"c64": cp.zeros(n, cp.complex64), "f64": cp.zeros(n, cp.float64),
                "f16": cp.zeros(n, cp.float16), "c128": cp.zeros(n, cp.complex128)}
        try:
            if cid == "mis_c64_src":
                args = ("lin_c64", (misaligned(cp.int8, 2, cp.complex64),), None)
            elif cid == "mis_c64_out":
                args = ("lin_c64", (good["c64"],), misaligned(cp.int8, 2, cp.complex64))
            elif cid == "mis_f64_src":
                args = ("lin_f64", (misaligned(cp.float32, 1, cp.float64),), None)
            elif cid == "mis_f64_out":
                args = ("lin_f64", (good["f64"],), misaligned(cp.float32, 1, cp.float64))
            elif cid == "mis_f16_src":
                args = ("lin_f16", (misaligned(cp.int8, 1, cp.float16),), None)
            elif cid == "mis_c128_src":
                args = ("lin_c128", (misaligned(cp.int8, 4, cp.complex128),), None)
            elif cid == "mis_i64_a_in":
                cond = cp.zeros(n, cp.bool_)
                args = ("sel_i64", (cond, misaligned(cp.int32, 1, cp.int64),
                                    cp.zeros(n, cp.int64)), None)
            elif cid == "aligned_c64_view":
                args = ("lin_c64", (misaligned(cp.float32, 2, cp.complex64),), None)
            else:
                raise AssertionError(cid)
        except Exception as e:
            return {"kind": "setup_error", "msg": f"{type(e).__name__}: {e}"}
        name, a, out = args
        ptrs = [int(v.data.ptr) % 16 for v in (*a, out) if v is not None]
        if out is None:
            y = pack[name](*a)
        else:
            y = pack[name](*a, out=out)
        cp.cuda.Device().synchronize()
        res = {"kind": "ok", "ptr_mod16": ptrs}
        if cid == "aligned_c64_view":
            res["values_ok"] = bool((cp.asnumpy(y) == 1).all())
        return res

    for cid in ids:
        res = {"id": cid}
        try:
            if cid.startswith("off_"):
                _, name, i, o = cid.split("_")
                res.update(offset_case(name, int(i), int(o)))
            else:
                res.update(mis_case(cid))
        except Exception as e:
            res.update(kind="raised", type=type(e).__name__,
                       is_kp=isinstance(e, kp.KernelPackError),
                       is_launch=isinstance(e, kp.LaunchError), msg=str(e)[:3000])
        try:
            cp.cuda.Device().synchronize()
        except Exception as e:
            res["poisoned"] = f"{type(e).__name__}: {e}"
        print(json.dumps(res), flush=True)
        if "poisoned" in res:
            break
""")

_OFFSET_IDS = [f"off_{d}_{i}_{o}" for d in ("f16", "f32", "f64", "c64", "c128")
               for (i, o) in ((1, 0), (0, 3), (5, 2))]
_MIS_IDS = {  # case -> the parameter the refusal must name
    "mis_c64_src": "src", "mis_c64_out": "out", "mis_f64_src": "src", "mis_f64_out": "out",
    "mis_f16_src": "src", "mis_c128_src": "src", "mis_i64_a_in": "a_in",
}


@pytest.fixture(scope="module")
def child_results(pack_path):
    remaining = [*_OFFSET_IDS, "aligned_c64_view", *_MIS_IDS]
    results: dict = {}
    for _ in range(len(remaining) + 1):
        if not remaining:
            break
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, pack_path, ",".join(remaining)],
                                  check=False, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as e:
            for c in remaining:
                results[c] = {"id": c, "kind": "child_timeout", "msg": str(e)}
            break
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for r in got:
            results[r["id"]] = r
        remaining = [c for c in remaining if c not in results]
        if remaining and not got:
            # the child failed before its first case (import, load): the same for every case
            for c in remaining:
                results[c] = {"id": c, "kind": "child_failed", "rc": proc.returncode,
                              "msg": proc.stderr[-3000:]}
            break
        if remaining and "poisoned" not in got[-1]:
            # the child died without reporting: blame the case it was running
            results[remaining[0]] = {"id": remaining[0], "kind": "child_died",
                                     "rc": proc.returncode, "msg": proc.stderr[-3000:]}
            remaining = remaining[1:]
    return results


@pytest.mark.parametrize("cid", _OFFSET_IDS)
def test_offset_views_compute_right(child_results, cid):
    """``x[k:]`` views (element-aligned, not 16-byte aligned) as inputs and ``out=``: right
    values in every dtype (the vector path must fall back), nothing written outside the out
    window, and the context stays usable."""
    r = child_results[cid]
    assert r["kind"] == "ok", r
    assert "poisoned" not in r, r
    tol = {"f16": 1e-3, "f32": 1e-6, "f64": 1e-14, "c64": 1e-6, "c128": 1e-14}[cid.split("_")[1]]
    assert r["err_out"] <= tol and r["err_alloc"] <= tol, r
    assert r["outside_intact"], r
    assert r["y_type"] == "ndarray", r


def test_aligned_dtype_view_computes_right(child_results):
    """Control for the misaligned cases: a complex64 view of float32 memory at an 8-byte
    aligned offset is a valid input."""
    r = child_results["aligned_c64_view"]
    if r["kind"] == "setup_error":
        pytest.skip(r["msg"])
    assert r["kind"] == "ok" and r.get("values_ok"), r
    assert "poisoned" not in r, r


@pytest.mark.parametrize("cid", list(_MIS_IDS))
def test_dtype_views_misaligned_for_their_element_are_refused(child_results, cid):
    """``cp_f32[1:].view(cp.complex64)`` and the like: cupy makes a view whose pointer is not
    aligned to its element size (torch's ``view`` refuses this; cupy's does not). README:
    data pointers not aligned to their element size raise LaunchError naming the parameter
    (the device would fault). Expected: a LaunchError naming it, and a usable context.
    (Lead: a complex array aligned to its parts is valid, README; the complex cases here are
    misaligned for their parts too.)"""
    r = child_results[cid]
    if r["kind"] == "setup_error":
        pytest.skip(r["msg"])
    assert "poisoned" not in r, (
        f"the call faulted the CUDA context instead of being refused: {r}")
    assert r["kind"] == "raised" and r["is_launch"], r
    assert _names(r["msg"], _MIS_IDS[cid]), r["msg"]
