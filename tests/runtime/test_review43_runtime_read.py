"""Review 43: a reading of the runtime's C fast path (``_fastcall.c``, ``_fastcall_spec.c``,
``_callbase.c``, ``_launch.c``, ``_drvcall.c``), its Python feeders (``fast_native``,
``fastpath``, ``fast_torch``, ``fast_cupy``, ``binding``, ``execute``, ``launcher``, ...) and
the loader's C readers (``_fbread.c``, ``_zstd.c``), looking for overflow, keys that let two
different calls share an entry, checks made on a first call and skipped on a warm one,
reference leaks and crashes on error paths.

What this file pins down, on CPU (the fake driver, stand-in torch tensors over host memory,
the stand-in DLPack exchange API):

- random call sequences (shapes including 0-d and empty ones, keyed and unkeyed scalars,
  values out of range, out= fresh / aliased / partially overlapping / lazily negated / on
  another device, dtype and contiguity mismatches, two outputs, scratch, complex lazy views,
  stream=) give on every fast path (the closure, C, C through the exchange API) the general
  path's answer and the very same launches and parameters;
- the exchange API's remembered last key never serves a call of other shapes or symbols, and
  an unkeyed scalar is written at every call;
- warm calls (fast, handed to the general path, refused) keep no references and no memory;
- the C FlatBuffers reader never crashes on damaged artifacts; the built-in zstd decoder reads
  what zstandard writes, byte for byte.

Two bugs, both in the general path's aliasing rules (execute._run): out= the very same array
as an input was "in-place use" even when the output is zero_init, whose zero fill erased the
input before the kernel read it (silent zeros; fixed: a LaunchError); and an inout argument
partially overlapping another input was launched (the race that out= refuses; fixed a session
later in every path: execute.check_written_arguments, fastpath.written_pairs, and
tests/runtime/test_inout_overlap.py).
"""

from __future__ import annotations

import ctypes
import gc
import random
import re
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import pytest

import kernelpack as kp
from kernelpack.errors import KernelPackError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Scratch, Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor as T, _prod, make_torch  # noqa: E402

_launch = pytest.importorskip("kernelpack.runtime._launch",
                              reason="the C extension kernelpack.runtime._launch is not built")

PATHS = ("closure", "C", "C-dlpack")


def _noop(*args: Any) -> None:
    return None


def _setup(path: str, monkeypatch, kernels: dict) -> tuple[Any, FakeDriver, Any]:
    """(stand-in torch, fake driver, the stand-in exchange API or None) for ``path``:
    "general" (the fast path never built), "closure", "C" or "C-dlpack"."""
    if path == "closure":
        monkeypatch.setenv("KERNELPACK_NATIVE_LAUNCH", "0")
    torch = make_torch(monkeypatch)
    fx = None
    if path == "C-dlpack":
        from dlpack_exchange import FakeExchange

        fx = FakeExchange()
        monkeypatch.setattr(T, "__dlpack_c_exchange_api__", fx.capsule, raising=False)
    fake = install(monkeypatch, FakeDriver(kernels=kernels))
    return torch, fake, fx


def _fast(prog: Any) -> Any:
    return getattr(bind(prog).call, "__self__", None)


# ---- a program of one output: keyed and unkeyed scalars, a variant predicate ---------------
P_KERNELS = {"kk": ("QQQifqI", _noop)}


def _p_program() -> Compiled:
    """z[n, m] from x[n, m] and y[m]; k (int32) is read by a grid and a predicate (keys
    entries), s (float32) and seed (int64, read by no expression) are only passed."""
    n, m, k = kp.sym("n"), kp.sym("m"), kp.sym("k")
    args = (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("z"), Arg.scalar("k"),
            Arg.scalar("s"), Arg.scalar("seed"), Arg.scalar("nm"))
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n", "m")), Tensor("y", kp.f32, ("m",)),
                            Tensor("z", kp.f32, ("n", "m"), role="out"),
                            Scalar("k", kp.i32), Scalar("s", kp.f32), Scalar("seed", kp.i64),
                            Scalar("nm", kp.u32, value=n * m)),
                      (Variant((Launch("kk", "m", (kp.cdiv(n * m, 4) + k,), (4,), args),),
                               predicate=k < 3),
                       Variant((Launch("kk", "m", (1,), (1,), args),))))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-p", "fake", 13000)
    return Compiled(s, (Module("m", ("kk",), (img,)),))


def _p_calls(rng: random.Random, count: int) -> list[Callable]:
    """Calls of _p_program, mostly valid (so that warm calls take the fast paths), with every
    kind of argument the fast paths must hand to the general path mixed in."""
    calls = []
    for _ in range(count):
        n, m = rng.choice([(2, 3), (2, 3), (1, 1), (0, 2), (3, 0), (1, 2)])
        k = rng.choice([0, 1, 1, 2, 3, 5, -1, 1 << 31, True])
        s = rng.choice([0.5, 0.5, -2.0, 3, 1e39, 3.4028235e38, float("inf")])
        seed = rng.choice([0, 7, -5, 7, (1 << 63) - 1, 1 << 63])
        outk = rng.choice(["none"] * 4 + ["fresh", "fresh", "wrongshape", "alias_x", "partial",
                                          "noncontig", "dev1", "neg"])
        ymode = rng.choice(["ok"] * 5 + ["int", "dev1", "noncontig", "wrongm"])

        def call(objs: dict, torch: Any, n=n, m=m, k=k, s=s, seed=seed, outk=outk,
                 ymode=ymode) -> tuple:
            x = objs.setdefault(("x", n, m), T([float(i) for i in range(n * m)], torch.float32,
                                               (n, m)))
            ym = m + 1 if ymode == "wrongm" else m
            y = objs.setdefault(("y", ym, ymode), T(
                ([1] if ymode == "int" else [1.0]) * ym,
                torch.int32 if ymode == "int" else torch.float32, (ym,),
                contiguous=not (ymode == "noncontig" and ym > 1),
                device=1 if ymode == "dev1" else 0))
            kw: dict = {}
            if outk == "fresh":
                kw["out"] = objs.setdefault(("o", n, m), T([0.0] * (n * m), torch.float32,
                                                           (n, m)))
            elif outk == "wrongshape":
                kw["out"] = T([0.0] * (n * m + 1), torch.float32, (n * m + 1,))
            elif outk == "alias_x":
                kw["out"] = x  # the very same memory: in-place use, allowed
            elif outk == "partial":  # 4 bytes into x: a partial overlap when non-empty
                o = T([0.0] * (n * m), torch.float32, (n, m))
                if n * m > 1:
                    o._buf = (ctypes.c_char * (4 * (n * m - 1))).from_buffer(x._buf, 4)
                kw["out"] = o
            elif outk == "noncontig":  # (torch: a tensor of <= 1 element is contiguous)
                kw["out"] = T([0.0] * (n * m), torch.float32, (n, m),
                              contiguous=not (n > 1 and m > 1))
            elif outk == "dev1":
                kw["out"] = T([0.0] * (n * m), torch.float32, (n, m), device=1)
            elif outk == "neg":  # torch makes a contiguous real negative view of 1 element only
                kw["out"] = T([0.0] * (n * m), torch.float32, (n, m), neg=n * m == 1)
            objs["keep"] = (x, y, kw.get("out"))
            return (x, y, k, s, seed), kw

        call.desc = (n, m, k, s, seed, outk, ymode)  # type: ignore[attr-defined]
        calls.append(call)
    return calls


# ---- two outputs, scratch, complex inputs and outputs, stream= ------------------------------
Q_KERNELS = {"k1": ("QQQQifqI", _noop), "k2": ("QQi", _noop)}


def _q_program() -> Compiled:
    n, m, k = kp.sym("n"), kp.sym("m"), kp.sym("k")
    args1 = (Arg.buffer("x"), Arg.buffer("c"), Arg.buffer("z"), Arg.buffer("w"),
             Arg.scalar("k"), Arg.scalar("s"), Arg.scalar("seed"), Arg.scalar("nm"))
    s = KernelSummary("q", (Tensor("x", kp.f32, ("n", "m")), Tensor("c", kp.c64, ("m",)),
                            Tensor("z", kp.f32, ("n", "m"), role="out"),
                            Tensor("w", kp.c64, ("m",), role="out"),
                            Scalar("k", kp.i32), Scalar("s", kp.f32), Scalar("seed", kp.i64),
                            Scalar("nm", kp.u32, value=n * m)),
                      (Variant((Launch("k1", "m", (kp.cdiv(n * m, 4) + k,), (4,), args1),
                                Launch("k2", "m", (m + 1,), (1,),
                                       (Arg.buffer("z"), Arg.buffer("t"),
                                        Arg.of(m * 3, kp.i32)))),
                               scratch=(Scratch("t", kp.f32, (m + 1,)),), predicate=k < 3),
                       Variant((Launch("k1", "m", (1,), (1,), args1),))))
    img = Image("cubin", "sm_90", b"\x7fELF-fake-q", "fake", 13000)
    return Compiled(s, (Module("m", ("k1", "k2"), (img,)),))


class _Stream:
    def __init__(self, handle: int, device: int | None = None) -> None:
        self.cuda_stream = handle
        if device is not None:
            self.device_index = device


def _q_calls(rng: random.Random, count: int) -> list[Callable]:
    calls = []
    for _ in range(count):
        n, m = rng.choice([(2, 2), (2, 2), (1, 1), (0, 1), (1, 0)])
        k = rng.choice([0, 2, 2, 3, 5])
        s = rng.choice([0.5] * 6 + [3, 1e39])
        seed = rng.choice([0, 7, -3, 7, 1 << 63])
        outk = rng.choice(["none"] * 6 + ["tuple", "dict", "single", "list", "alias_in",
                                          "conj_w", "swap"])
        ck = rng.choice(["ok"] * 6 + ["conj", "neg"])
        st = rng.choice([None] * 6 + [0, 5, "S0", "S1", "Sx"])

        def call(objs: dict, torch: Any, n=n, m=m, k=k, s=s, seed=seed, outk=outk, ck=ck,
                 st=st) -> tuple:
            x = objs.setdefault(("x", n, m), T([float(i) for i in range(n * m)], torch.float32,
                                               (n, m)))
            c = objs.setdefault(("c", m, ck), T([1.0] * (2 * m), torch.complex64, (m,),
                                                conj=ck == "conj", neg=ck == "neg"))
            z = objs.setdefault(("z", n, m), T([0.0] * (n * m), torch.float32, (n, m)))
            w = objs.setdefault(("w", m, outk), T([0.0] * (2 * m), torch.complex64, (m,),
                                                  conj=outk == "conj_w"))
            kw: dict = {}
            kw["out"] = {"tuple": (z, w), "dict": {"w": w, "z": z}, "single": z,
                         "list": [z, w], "alias_in": (x, c), "conj_w": (z, w),
                         "swap": (w, z)}.get(outk)
            if kw["out"] is None:
                del kw["out"]
            if st is not None:
                kw["stream"] = {"S0": _Stream(9, 0), "S1": _Stream(9, 1),
                                "Sx": _Stream(11)}.get(st, st)
            objs["keep"] = (x, c, z, w)
            return (x, c, k, s, seed), kw

        call.desc = (n, m, k, s, seed, outk, ck, st)  # type: ignore[attr-defined]
        calls.append(call)
    return calls


def _replay(path: str, make: Callable[[], Compiled], kernels: dict,
            calls: list[Callable]) -> tuple[list, int]:
    """Each call's answer on ``path``: ("ok", what came back) or (error type, message with
    addresses masked), and its launches (kernel, grid, block, stream, parameters; pointers
    named by the tensor they are, floats by repr); with the fast calls made."""
    mp = pytest.MonkeyPatch()
    try:
        torch, fake, _ = _setup(path, mp, kernels)
        prog = make()
        objs: dict = {}
        answers = []
        for call in calls:
            if path == "general":
                bp = bind(prog)
                bp.call = bp.__call__  # the fast path is never built
            args, kw = call(objs, torch)
            start = len(fake.calls)
            try:
                r = call_program(prog, *args, **kw)
                outs = r if isinstance(r, tuple) else (r,)
                given = kw.get("out")
                given = list(given.values()) if isinstance(given, dict) else \
                    list(given) if isinstance(given, (tuple, list)) else [given]
                answer: tuple = ("ok", tuple((type(o).__name__, tuple(o.shape),
                                              any(o is g for g in given)) for o in outs))
            except Exception as exc:  # noqa: BLE001 - compared between the paths
                answer = (type(exc).__name__, re.sub(r"0x[0-9a-f]+", "ADDR", str(exc)))
            names = {}
            for key, o in objs.items():
                for t in (o if isinstance(o, tuple) else (o,)):
                    if isinstance(t, T):
                        names.setdefault(t.data_ptr(), str(key))
            for t in kw.get("out", {}).values() if isinstance(kw.get("out"), dict) else \
                    kw.get("out") if isinstance(kw.get("out"), (tuple, list)) else \
                    [kw.get("out")]:
                if isinstance(t, T):
                    names.setdefault(t.data_ptr(), "out")

            def label(v: Any, code: str) -> Any:
                if isinstance(v, float):
                    return repr(v)
                if code == "Q":  # a pointer parameter (int64s are "q"): any address, since
                    # a non-PIE interpreter's heap (Debian's python3.14) lies below 4 GiB
                    return names.get(v, "made")  # an output or scratch made by the call
                return v

            launches = [(c[1], c[2], c[3], c[5],
                         tuple(label(v, code) for v, code in zip(c[6], kernels[c[1]][0])))
                        for c in fake.calls[start:] if c[0] == "cuLaunchKernel"]
            answers.append((answer, launches))
        fast = _fast(prog)
        return answers, getattr(fast, "fast_calls", 0) or 0
    finally:
        mp.undo()


def _compare(make: Callable[[], Compiled], kernels: dict, calls: list[Callable]) -> dict:
    """Every fast path's answers against the general path's; the fast calls per C path."""
    general, _ = _replay("general", make, kernels, calls)
    fast_calls = {}
    for path in PATHS:
        got, fast_calls[path] = _replay(path, make, kernels, calls)
        for i, (want, have) in enumerate(zip(general, got)):
            assert have == want, (path, i, calls[i].desc)  # type: ignore[attr-defined]
    return fast_calls


def test_random_calls_of_one_output_agree_with_the_general_path() -> None:
    """Keys (shapes, keyed k), unkeyed scalars (seed changes at every call: written, not
    cached in the entry's template), values the fast paths cannot take, out= of every kind:
    the same answers and the same launches, parameter for parameter."""
    total = {p: 0 for p in PATHS}
    for seed in range(24):
        calls = _p_calls(random.Random(4300 + seed), 14)
        for path, n in _compare(_p_program, P_KERNELS, calls).items():
            total[path] += n
    assert total["C"] > 40 and total["C-dlpack"] > 40  # the C paths did take calls


def test_random_calls_with_two_outputs_scratch_and_complex_views_agree() -> None:
    total = {p: 0 for p in PATHS}
    for seed in range(24):
        calls = _q_calls(random.Random(4400 + seed), 12)
        for path, n in _compare(_q_program, Q_KERNELS, calls).items():
            total[path] += n
    assert total["C"] > 20 and total["C-dlpack"] > 20


@pytest.mark.parametrize("path", ["C", "C-dlpack"])
def test_the_remembered_key_never_serves_other_shapes_or_symbols(monkeypatch, path) -> None:
    """The exchange API's path keeps the last call's key words and entry: calls that
    alternate shapes and the keyed k, with a new unkeyed seed each time, each launch their
    own grid, pointers and seed."""
    torch, fake, _ = _setup(path, monkeypatch, P_KERNELS)
    prog = _p_program()
    xs = {shape: T([1.0] * _prod(shape), torch.float32, shape) for shape in ((2, 3), (3, 2),
                                                                            (1, 6), (6, 1))}
    ys = {m: T([1.0] * m, torch.float32, (m,)) for m in (1, 2, 3, 6)}
    call_program(prog, xs[(2, 3)], ys[3], 0, 0.5, 0)  # binds
    sequence = [((2, 3), 0), ((2, 3), 1), ((3, 2), 1), ((2, 3), 1), ((1, 6), 2), ((6, 1), 2),
                ((6, 1), 0), ((1, 6), 0), ((2, 3), 0), ((2, 3), 0)]
    for i, (shape, k) in enumerate(sequence):
        x, y = xs[shape], ys[shape[1]]
        z = call_program(prog, x, y, k, 0.5, 1000 + i)
        last = [c for c in fake.calls if c[0] == "cuLaunchKernel"][-1]
        assert z.shape == shape
        assert last[2] == (-(-6 // 4) + k, 1, 1)
        assert last[6] == (x.data_ptr(), y.data_ptr(), z.data_ptr(), k, 0.5, 1000 + i, 6)
    fast = _fast(prog)
    assert fast.fast_calls == len(sequence)
    assert fast.entries == len(set(sequence))


@pytest.mark.parametrize("path", PATHS)
def test_zero_dim_and_empty_tensors_take_the_fast_paths_correctly(monkeypatch, path) -> None:
    """A 0-d tensor (shape ()) and empty ones: the output's shape, and no launch for an
    empty grid, on a warm fast path as on the first call."""
    def impl(grid, block, shmem, v) -> None:
        x, z = v
        ctypes.memmove(z, x, 4)

    s = KernelSummary("zd", (Tensor("x", kp.f32, ("n",) * 0), Tensor("v", kp.f32, ("n",)),
                             Tensor("z", kp.f32, (), role="out")),
                      (Variant((Launch("copy", "m", (kp.emin(kp.sym("n"), 1),), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"))),)),))
    prog = Compiled(s, (Module("m", ("copy",), (Image("cubin", "sm_90", b"\x7fELF-zd"),)),))
    torch, fake, _ = _setup(path, monkeypatch, {"copy": ("QQ", impl)})
    x = T([2.5], torch.float32, ())
    for _ in range(3):
        z = call_program(prog, x, T([1.0, 1.0], torch.float32, (2,)))
        assert z.shape == () and z.values() == [2.5]
        empty = call_program(prog, x, T([], torch.float32, (0,)))
        assert empty.shape == ()
    launches = [c for c in fake.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 3  # none for n = 0 (grid 0)
    if path != "closure":
        assert _fast(prog).fast_calls == 5  # all but the first call


@pytest.mark.parametrize("path", PATHS)
def test_warm_calls_keep_no_references_and_no_memory(monkeypatch, path) -> None:
    """Fast calls (allocating, out=, in place), calls handed to the general path (a float
    beyond float32, a dtype mismatch, a wrong out= shape) and refused calls (a negative grid)
    over and over: the arguments' and dtypes' reference counts stay put, and memory does not
    grow with the number of calls (the fake driver's own records are emptied)."""
    torch, fake, fx = _setup(path, monkeypatch, P_KERNELS)
    prog = _p_program()
    x, y = T([1.0] * 6, torch.float32, (2, 3)), T([1.0] * 3, torch.float32, (3,))
    z, bad = T([0.0] * 6, torch.float32, (2, 3)), T([0.0] * 7, torch.float32, (7,))
    yi = T([1] * 3, torch.int32, (3,))

    def calls(count: int) -> None:
        for i in range(count):
            call_program(prog, x, y, i % 3, 0.5, i)
            call_program(prog, x, y, 1, 0.5, i, out=z)
            call_program(prog, x, y, 1, 0.5, i, out=x)
            for args, kw in (((x, y, 1, 1e39, 1), {}), ((x, yi, 1, 0.5, 1), {}),
                             ((x, y, 1, 0.5, 1), {"out": bad}), ((x, y, -7, 0.5, 1), {})):
                with pytest.raises(KernelPackError):
                    call_program(prog, *args, **kw)
            fake.calls.clear()
            fake.launch_contexts.clear()
            if fx is not None:
                fx.described.clear()
                fx._keep.clear()
                fx.streams.clear()

    calls(30)
    gc.collect()
    watched = [x, y, z, bad, yi, torch.float32, torch.int32, prog]
    before = [sys.getrefcount(o) for o in watched]
    tracemalloc.start()
    try:
        calls(20)
        gc.collect()
        first = tracemalloc.take_snapshot()
        calls(400)
        gc.collect()
        second = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(o) for o in watched] == before
    grown = sum(d.size_diff for d in second.compare_to(first, "filename"))
    assert grown < 64 * 1024, second.compare_to(first, "lineno")[:5]
    if path != "closure":
        assert _fast(prog).fast_calls == 3 * 450 - 1  # all but the first call


# ---- the loader's C readers -------------------------------------------------------------------
_FB_FUZZ = textwrap.dedent("""
    import random, sys, tempfile, os
    sys.path.insert(0, {tests!r})
    import kernelpack as kp
    from kernelpack import loader, _decode
    from kernelpack.runtime._launch import fb_tree, module_index
    from kp_samples import rich
    specs = [loader._MODULE, loader._PROGRAM_NAMES, _decode._HEAD, _decode._VARIANT,
             _decode._LAUNCH_TREE]
    path = tempfile.mktemp(suffix=".kpack")
    kp.save([rich()], path)
    base = open(path, "rb").read()
    os.unlink(path)
    rng = random.Random(43)
    for _ in range(1500):
        b = bytearray(base)
        for _ in range(rng.randrange(1, 24)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.2:
            b = b[:rng.randrange(len(b))]
        b = bytes(b)
        for spec in specs:
            try:
                fb_tree(b, rng.randrange(len(b) + 8), spec)
            except (ValueError, UnicodeDecodeError):
                pass
        try:
            module_index(b, rng.randrange(len(b) + 8), rng.randrange(5), loader._MODULE,
                         loader._INDEX_LIMITS + (3,))
        except (ValueError, UnicodeDecodeError):
            pass
    print("survived")
""")


def test_the_c_flatbuffers_reader_survives_damaged_artifacts() -> None:
    """fb_tree / module_index read only verified buffers, but promise bounds checks on any
    buffer: damaged artifacts read at random positions with kp.load's and the decoder's specs
    raise ValueError / UnicodeDecodeError, never crash (run in a child: a segfault fails)."""
    tests = str(Path(__file__).parent.parent)
    proc = subprocess.run([sys.executable, "-c", _FB_FUZZ.format(tests=tests)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "survived" in proc.stdout, proc.stderr[-2000:]


def test_the_builtin_zstd_decoder_reads_what_zstandard_writes() -> None:
    """_zstd_inflate.c against the zstandard package on frames of every level, with and
    without a checksum and a declared size, long-distance matching and small windows; the
    output is never allowed past raw_size."""
    zstandard = pytest.importorskip("zstandard")
    rng = random.Random(4343)
    for i in range(120):
        size = rng.choice([0, 1, 100, 4096, 70_000, 140_000])
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(size)
        elif kind == 1:
            data = bytes([rng.randrange(3)]) * size
        elif kind == 2:
            base = rng.randbytes(rng.randrange(1, 2000))
            parts, have = [], 0
            while have < size:
                s = rng.randrange(len(base))
                part = base[s:s + rng.randrange(1, 400)] if rng.random() < 0.7 else \
                    rng.randbytes(rng.randrange(1, 40))
                parts.append(part)
                have += len(part)
            data = b"".join(parts)[:size]
        else:
            data = bytes((j * 7 + j // 100) % 251 for j in range(size))
        level = rng.choice([-5, 1, 3, 9, 19, 22])
        params = zstandard.ZstdCompressionParameters.from_level(
            level, write_checksum=rng.random() < 0.5, write_content_size=rng.random() < 0.8,
            **({"enable_ldm": True, "window_log": rng.choice([10, 17, 20])}
               if rng.random() < 0.3 else {}))
        frame = zstandard.ZstdCompressor(compression_params=params).compress(data)
        assert _launch.zstd_builtin_decompress(frame, len(data)) == data, (i, level)
        if data:
            with pytest.raises(ValueError):
                _launch.zstd_builtin_decompress(frame, len(data) - 1)


# ---- in-place use of a zero-filled output ------------------------------------------------------
def _accumulate(grid, block, shmem, v) -> None:
    """z[i] += x[i] (a kernel that reads each element of both before writing it)."""
    x, z, n = v
    xs = struct.unpack(f"<{n}f", ctypes.string_at(x, 4 * n))
    zs = struct.unpack(f"<{n}f", ctypes.string_at(z, 4 * n))
    ctypes.memmove(z, struct.pack(f"<{n}f", *[a + b for a, b in zip(xs, zs)]), 4 * n)


def _accumulate_program() -> Compiled:
    """z = x through a zero_init output the kernel accumulates into."""
    s = KernelSummary("acc", (Tensor("x", kp.f32, ("n",)),
                              Tensor("z", kp.f32, ("n",), role="out", zero_init=True)),
                      (Variant((Launch("acc", "m", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        Arg.of(kp.sym("n"), kp.u32))),)),))
    return Compiled(s, (Module("m", ("acc",), (Image("cubin", "sm_90", b"\x7fELF-acc"),)),))


def test_a_zero_init_output_accumulates_as_documented(monkeypatch) -> None:
    """The premise of the next test: out= of a zero_init output is zero-filled first, and
    the kernel accumulates x into it."""
    from fake_driver import HostArray

    install(monkeypatch, FakeDriver(kernels={"acc": ("QQI", _accumulate)}))
    prog = _accumulate_program()
    x, out = HostArray([1.0, 2.0, 3.0]), HostArray([9.0, 9.0, 9.0])
    assert call_program(prog, x, out=out) is out
    assert struct.unpack("<3f", out.buf.raw[:12]) == (1.0, 2.0, 3.0)
    assert struct.unpack("<3f", x.buf.raw[:12]) == (1.0, 2.0, 3.0)


def test_in_place_use_of_a_zero_init_output_reads_a_copy(monkeypatch) -> None:
    """README: exact in-place use is allowed. With a zero_init output kernelpack itself writes
    every element (the zero fill) before the program reads any, and it knows so from the
    summary: the call reads the input from a copy made before the fill (it raised LaunchError
    until session 39), so ``z = x`` in place leaves ``x`` as it was, not zeros."""
    from fake_driver import HostArray

    fake = install(monkeypatch, FakeDriver(kernels={"acc": ("QQI", _accumulate)}))
    prog = _accumulate_program()
    x = HostArray([1.0, 2.0, 3.0])
    call_program(prog, x, out=x)
    assert struct.unpack("<3f", x.buf.raw[:12]) == (1.0, 2.0, 3.0)
    order = [c[0] for c in fake.calls if c[0] in ("cuMemcpyDtoDAsync", "cuMemsetD8Async",
                                                  "cuLaunchKernel")]
    assert order == ["cuMemcpyDtoDAsync", "cuMemsetD8Async", "cuLaunchKernel"]


def test_an_inout_argument_partially_overlapping_an_input_is_refused(monkeypatch) -> None:
    """y += a * x with y (inout) the first three floats of a buffer and x the last three:
    each thread's write of y[i+1] races with another's read of x[i]. README: an out= array
    that partially overlaps an input raises LaunchError (a race on the device); an inout
    array is written the same way."""
    from kernelpack.errors import LaunchError
    from fake_driver import HostArray
    from test_launch_fake import _axpy_impl

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from kp_samples import axpy

    fake = install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl)}))
    base = HostArray([1.0, 2.0, 3.0, 4.0])
    x, y = HostArray([0.0] * 3), HostArray([0.0] * 3)
    x.buf = (ctypes.c_char * 12).from_buffer(base.buf, 4)
    y.buf = (ctypes.c_char * 12).from_buffer(base.buf, 0)
    with pytest.raises(LaunchError, match="overlap"):
        call_program(axpy(), x, y, 2.0)
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]
