"""Review 47: tests that kill mutants which survived the existing suite.

A throw-away mutator (outside the repo) changed ``lowering/materialize.py``,
``runtime/execute.py``, ``runtime/fastpath.py`` and ``_plan_fast.py`` one site at a time
(comparisons, boolean operators, dropped conditions, constants, swapped arguments) and ran the
tests that exercise each module. Every test here passes on the current code and fails on at
least one mutant that survived (named in its docstring). No GPU: the runtime tests run against
the fake driver over host memory (``tests/runtime/fake_driver.py``) with the stand-in torch of
``tests/runtime/test_fastpath_fake.py``; the lowering tests call ``materialize`` on traced
graphs, and one runs its kernels on the SIMT emulator (``tests/lowering/simt.py``). About 2 s.
Survivors judged equivalent (no test can tell them apart) are listed in the review's report:
``allow_shared`` at exactly 48 KiB (its own guard returns first), ``written_conflict`` with
its ranges swapped (``conflicts`` is symmetric), unpadded fills (a per-call value list), and
three ``workspace_stages`` keys or depths that carry no information.
"""

from __future__ import annotations

import ctypes
import re
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernelpack as kp
from kernelpack._plan_ref import ReferencePlanner
from kernelpack.errors import LaunchError
from kernelpack.limits import MAX_EXPR_DEPTH
from kernelpack.planner import Planner
from kernelpack.runtime import call_program
from kernelpack.runtime import launcher as _launcher
from kernelpack.runtime.fastpath import WRITTEN_SPAN, out_overlap, out_overlaps_input
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar,
                                Tensor as TensorSpec, Variant)

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "runtime"))

from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from kp_samples import fake_image  # noqa: E402
from test_fastpath_fake import Tensor, torch  # noqa: E402,F401 - the fixture
from test_review46_changes import path  # noqa: E402,F401 - the fixture: every fast path

n, m, k = kp.sym("n"), kp.sym("m"), kp.sym("k")


# ==== runtime: programs, kernels and helpers ====================================================

def _f32(addr: int, count: int) -> list:
    return list(struct.unpack(f"<{count}f", ctypes.string_at(addr, 4 * count)))


def _mix_impl(grid, block, shmem, v) -> None:
    """z = x (the other arguments are only there to be passed)."""
    x, _, _, z, count = v
    ctypes.memmove(z, ctypes.string_at(x, 4 * count), 4 * count)


def _pair_impl(grid, block, shmem, v) -> None:
    """p = x, q = e."""
    x, e, p, q, nx, ne = v
    ctypes.memmove(p, ctypes.string_at(x, 4 * nx), 4 * nx)
    ctypes.memmove(q, ctypes.string_at(e, 4 * ne), 4 * ne)


def _bump_impl(grid, block, shmem, v) -> None:
    """x += 1."""
    x, count = v
    ctypes.memmove(x, struct.pack(f"<{count}f", *[a + 1 for a in _f32(x, count)]), 4 * count)


def _acc_impl(grid, block, shmem, v) -> None:
    """z += x (a program that relies on its zero_init output)."""
    x, z, count = v
    out = [a + b for a, b in zip(_f32(x, count), _f32(z, count))]
    ctypes.memmove(z, struct.pack(f"<{count}f", *out), 4 * count)


def _toint_impl(grid, block, shmem, v) -> None:
    """z (int32) = x (float32), truncated."""
    x, z, count = v
    ctypes.memmove(z, struct.pack(f"<{count}i", *[int(a) for a in _f32(x, count)]), 4 * count)


def _copy_impl(grid, block, shmem, v) -> None:
    """z = x."""
    x, z, count = v
    ctypes.memmove(z, ctypes.string_at(x, 4 * count), 4 * count)


KERNELS = {"mix": ("QQQQI", _mix_impl), "pair": ("QQQQII", _pair_impl),
           "bump": ("QI", _bump_impl), "acc": ("QQI", _acc_impl),
           "toint": ("QQI", _toint_impl), "copy": ("QQI", _copy_impl)}


def _compiled(summary: KernelSummary, kernel: str, seed: int) -> Compiled:
    return Compiled(summary, (Module(kernel, (kernel,), (fake_image("cubin", "sm_90",
                                                                    seed=seed),)),))


def mix(zero: bool = False) -> Compiled:
    """x (n,) and e (k,) read, w (m,) written (inout), z (n,) an output: each of a size of its
    own, so that any one of them can be empty while the others are not."""
    s = KernelSummary("mix", (TensorSpec("x", kp.f32, ("n",)), TensorSpec("e", kp.f32, ("k",)),
                              TensorSpec("w", kp.f32, ("m",), role="inout"),
                              TensorSpec("z", kp.f32, ("n",), role="out", zero_init=zero)),
                      (Variant((Launch("mix", "mix", (kp.cdiv(n, 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("e"), Arg.buffer("w"),
                                        Arg.buffer("z"), Arg.of(n, kp.u32))),)),))
    return _compiled(s, "mix", 7)


def pair() -> Compiled:
    """Two outputs of sizes of their own: p (n,) = x, q (k,) = e."""
    s = KernelSummary("pair", (TensorSpec("x", kp.f32, ("n",)), TensorSpec("e", kp.f32, ("k",)),
                               TensorSpec("p", kp.f32, ("n",), role="out"),
                               TensorSpec("q", kp.f32, ("k",), role="out")),
                      (Variant((Launch("pair", "pair", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("e"), Arg.buffer("p"),
                                        Arg.buffer("q"), Arg.of(n, kp.u32),
                                        Arg.of(k, kp.u32))),)),))
    return _compiled(s, "pair", 9)


def bump(grid: tuple = (kp.cdiv(n, 256),), shared_mem: Any = 0) -> Compiled:
    """x += 1 (inout), on the grid and with the dynamic shared memory given."""
    s = KernelSummary("bump", (TensorSpec("x", kp.f32, ("n",), role="inout"),),
                      (Variant((Launch("bump", "bump", grid, (1,),
                                       (Arg.buffer("x"), Arg.of(n, kp.u32)), shared_mem),)),))
    return _compiled(s, "bump", 11)


def acc() -> Compiled:
    """z = x through a zero_init output that the kernel accumulates into."""
    s = KernelSummary("acc", (TensorSpec("x", kp.f32, ("n",)),
                              TensorSpec("z", kp.f32, ("n",), role="out", zero_init=True)),
                      (Variant((Launch("acc", "acc", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        Arg.of(n, kp.u32))),)),))
    return _compiled(s, "acc", 13)


def toint() -> Compiled:
    """z (int32) from x (float32): an output of an input's shape but not of its dtype."""
    s = KernelSummary("toint", (TensorSpec("x", kp.f32, ("n",)),
                                TensorSpec("z", kp.i32, ("n",), role="out")),
                      (Variant((Launch("toint", "toint", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        Arg.of(n, kp.u32))),)),))
    return _compiled(s, "toint", 15)


def twostep() -> Compiled:
    """y += 1 (inout), then z = x in a launch of its own that neither reads y nor stores
    anything else: no in-place pair of ``in_place.py`` names (z, y), so only y's role
    keeps ``out=y`` out."""
    s = KernelSummary("twostep", (TensorSpec("x", kp.f32, ("n",)),
                                  TensorSpec("y", kp.f32, ("n",), role="inout"),
                                  TensorSpec("z", kp.f32, ("n",), role="out")),
                      (Variant((Launch("bump", "twostep", (1,), (1,),
                                       (Arg.buffer("y"), Arg.of(n, kp.u32))),
                                Launch("copy", "twostep", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("z"),
                                        Arg.of(n, kp.u32))))),))
    return Compiled(s, (Module("twostep", ("bump", "copy"),
                               (fake_image("cubin", "sm_90", seed=17),)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels=KERNELS))


@pytest.fixture
def general(monkeypatch) -> list:
    """The calls that reached the general path (launcher's ``run``), one entry each: a fast
    path that takes a call never gets there."""
    calls: list = []
    real = _launcher.run

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(args[0].name)
        return real(*args, **kw)

    monkeypatch.setattr(_launcher, "run", counted)
    return calls


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def _named(fake, name: str) -> list:
    return [c for c in fake.calls if c[0] == name]


class _View:
    """``__cuda_array_interface__`` over ``count`` float32 of ``base``'s memory, ``offset``
    bytes in (an empty view keeps its pointer: a ``x[1:1]``)."""

    def __init__(self, base: HostArray, offset: int, count: int, strides: Any = None) -> None:
        self.base = base
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": "<f4", "version": 3,
                                         "strides": strides,
                                         "data": (ctypes.addressof(base.buf) + offset, False)}


def _floats(base: HostArray, count: int) -> list:
    return list(struct.unpack(f"<{count}f", base.buf.raw[:4 * count]))


# ==== runtime/execute.py: empty arrays share no memory ==========================================

def _empty_case(case: str, mem: HostArray) -> tuple[tuple, dict, Compiled]:
    """The arguments (x, e, w), the keywords (out=) and the program of one case: an empty
    array whose pointer lies strictly inside a non-empty one (mem: 8 floats)."""
    one = HostArray([5.0])
    two = HostArray([1.0, 2.0])
    if case == "empty out inside a written argument":
        return (HostArray([]), one, _View(mem, 0, 4)), {"out": _View(mem, 4, 0)}, mix()
    if case == "empty input inside out":
        return (two, _View(mem, 4, 0), one), {"out": _View(mem, 0, 2)}, mix()
    if case == "empty written argument inside out":
        return (two, one, _View(mem, 4, 0)), {"out": _View(mem, 0, 2)}, mix()
    if case == "empty written argument inside an input":
        return (_View(mem, 0, 2), one, _View(mem, 4, 0)), {}, mix()
    if case == "empty input inside a written argument":
        return (two, _View(mem, 4, 0), _View(mem, 0, 4)), {}, mix()
    assert case == "empty input inside a zero-filled out"
    return (two, _View(mem, 4, 0), one), {"out": _View(mem, 0, 2)}, mix(zero=True)


@pytest.mark.parametrize("case", [
    "empty out inside a written argument",      # execute: `if not n0: continue` dropped
    "empty input inside out",                   # `n1 and` dropped from the partial test
    "empty written argument inside out",        # `n1 and` dropped from the inout test
    "empty written argument inside an input",   # check_written: `not n0 or` dropped
    "empty input inside a written argument",    # check_written: `or not n1` dropped
    "empty input inside a zero-filled out",     # `n1 and` dropped from the zero_init test
])
def test_an_empty_array_inside_another_shares_no_memory_on_the_general_path(fake, case) -> None:
    """Mutants (execute.py): each ``if not n0`` / ``n1 and`` guard of ``_check_aliasing``
    and ``check_written_arguments`` dropped. An empty array has no bytes, so its pointer
    lying strictly inside another array's is no overlap (``overlaps`` alone says it is: the
    guards are what keep it out). Each such call was refused as a partial overlap, or as
    sharing memory with a written argument; the fast paths already let them through
    (review 46), the general path is pinned here."""
    mem = HostArray([float(i) for i in range(8)])
    args, kw, prog = _empty_case(case, mem)
    result = call_program(prog, *args, **kw)
    if "out" in kw:
        assert result is kw["out"]
    x = args[0]
    count = x.__cuda_array_interface__["shape"][0]
    if "out" in kw and count:  # z = x, into the first two floats of mem
        assert _floats(mem, 8) == [1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    else:
        assert _floats(mem, 8) == [float(i) for i in range(8)]
    assert len(_launches(fake)) == (1 if count else 0)


def test_two_outputs_side_by_side_or_one_empty_inside_the_other_are_accepted(fake) -> None:
    """Mutants (execute._check_disjoint): ``p1 <= p0 + n0`` (two ``out=`` arrays that touch
    without sharing a byte were refused), and the empty spans kept (an empty ``q`` whose
    pointer lies inside ``p`` was refused). Two outputs that do share a byte still are."""
    mem = HostArray([0.0] * 4)
    p, q = _View(mem, 0, 2), _View(mem, 8, 2)  # q starts where p ends
    assert call_program(pair(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]),
                        out=(p, q)) == (p, q)
    assert _floats(mem, 4) == [1.0, 2.0, 3.0, 4.0]
    inside = _View(mem, 4, 0)  # empty, inside p
    assert call_program(pair(), HostArray([5.0, 6.0]), HostArray([]), out=(p, inside)) == \
        (p, inside)
    assert _floats(mem, 4) == [5.0, 6.0, 3.0, 4.0]
    with pytest.raises(LaunchError, match="out 'p' and out 'q' overlap in memory"):
        call_program(pair(), HostArray([1.0, 2.0]), HostArray([3.0, 4.0]),
                     out=(p, _View(mem, 4, 2)))
    assert len(_launches(fake)) == 2


# ==== runtime/execute.py: out= checks ============================================================

def test_a_strided_out_is_refused(fake) -> None:
    """Mutant: the ``if not contiguous`` check of ``out=`` dropped: every float32 of a
    stride-8 view was written as if packed (over the elements between), with no error. The
    fast paths hand a strided ``out=`` to the general path, so this check is the one that
    refuses it; it had no test."""
    mem = HostArray([0.0] * 4)
    with pytest.raises(LaunchError, match=r"^mix: out 'z' is not C-contiguous$"):
        call_program(mix(), HostArray([1.0, 2.0]), HostArray([1.0]), HostArray([1.0]),
                     out=_View(mem, 0, 2, strides=(8,)))
    assert _floats(mem, 4) == [0.0] * 4 and not _launches(fake)


def test_more_out_arrays_than_outputs_is_a_type_error(fake) -> None:
    """Mutant: ``len(items) < len(names)`` for ``!=`` (two arrays for the one output were
    taken, the second silently ignored)."""
    x = HostArray([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^mix: out= has 2 arrays, the program has 1 outputs"):
        call_program(mix(), x, HostArray([1.0]), HostArray([1.0]),
                     out=(HostArray([0.0, 0.0]), HostArray([0.0, 0.0])))
    assert not _launches(fake)


class _Null:
    """An empty array whose ``__cuda_array_interface__`` data pointer is null (CuPy and
    Numba give size-0 arrays one): it lives on no device."""

    __cuda_array_interface__ = {"shape": (0,), "typestr": "<f4", "version": 3,
                                "data": (0, False)}


def test_an_empty_out_with_a_null_pointer_is_on_any_device(fake) -> None:
    """Mutant: the ``dev != -2`` exception of the out= device check dropped (an empty
    ``out=`` with a null pointer, whose device is unknown (-2), was refused as "on device
    -2, the inputs on device 0")."""
    z = _Null()
    assert call_program(mix(), HostArray([]), HostArray([1.0]), HostArray([1.0]), out=z) is z
    p = HostArray([0.0])
    assert call_program(pair(), HostArray([3.0]), HostArray([]), out=(p, z)) == (p, z)
    assert p.values() == [3.0] and len(_launches(fake)) == 1


def test_an_empty_zero_init_output_is_not_zero_filled(fake) -> None:
    """Mutant: ``_queue``'s ``if nbytes`` dropped (a memset of 0 bytes was queued for an
    empty zero_init output, whose pointer may be null)."""
    call_program(acc(), HostArray([]))
    assert not _named(fake, "cuMemsetD8Async")
    z = call_program(acc(), HostArray([1.0, 2.0]))
    assert [c[2] for c in _named(fake, "cuMemsetD8Async")] == [8]
    assert list(struct.unpack("<2f", z.copy_to_host())) == [1.0, 2.0]


# ==== both paths: empty z grids, exactly 48 KiB of shared memory ================================

def test_a_grid_empty_in_z_launches_nothing(fake, path, torch, general) -> None:
    """Mutants: ``execute._queue`` skipping a launch only when its x or y grid is 0, and
    ``FastCore.plan`` likewise (``if gx and gy``): a grid (1, 1, 0) was launched, which a
    GPU refuses (CUDA_ERROR_INVALID_VALUE). The pointwise programs' grids are 1-D, so only a
    z (or y) extent that is 0 catches it."""
    prog = bump(grid=(1, 1, n))
    host = HostArray([])
    call_program(prog, host)
    assert not _launches(fake)
    empty = Tensor([], torch.float32)
    for _ in range(3):  # the general path, then the warm fast path
        call_program(prog, empty)
    assert not _launches(fake)
    assert general == ["bump"]  # the HostArray call (it bound the device): torch's were fast
    x = Tensor([1.0, 2.0], torch.float32)
    call_program(prog, x)
    assert x.values() == [2.0, 3.0] and _launches(fake)[0][2] == (1, 1, 2)


def test_exactly_48_kib_of_shared_memory_needs_no_opt_in(fake, path, torch, general) -> None:
    """Mutants: ``pl.shared_mem >= DEFAULT_SHARED_MEM`` in ``execute._queue`` (the function's
    attribute raised for a launch that any kernel may make) and in ``FastCore.plan`` (such a
    call sent to the general path every time). 48 KiB is the limit without opt-in, not
    above it."""
    prog = bump(shared_mem=48 * 1024)
    call_program(prog, HostArray([1.0]))
    x = Tensor([1.0, 2.0], torch.float32)
    for _ in range(3):
        call_program(prog, x)
    assert x.values() == [4.0, 5.0]
    assert not _named(fake, "cuFuncSetAttribute") and not _named(fake, "cuKernelGetFunction")
    assert [c[4] for c in _launches(fake)] == [48 * 1024] * 4
    assert general == ["bump"]  # the HostArray call (it bound the device): torch's were fast


# ==== runtime/fastpath.py =======================================================================

def test_an_output_of_another_dtype_is_not_allocated_like_an_input(fake, path, torch,
                                                                    general) -> None:
    """Mutant: ``FastCore.plan``'s "allocate like input i" ignoring the dtype (an int32
    output of a float32 input's shape was made by ``empty_like(x)``: a float32 tensor
    holding the kernel's int32 bits)."""
    prog, x = toint(), Tensor([1.5, 2.5, -3.5], torch.float32)
    for _ in range(3):
        z = call_program(prog, x)
        assert z.dtype is torch.int32 and z.shape == (3,)
        assert z.values() == [1, 2, -3]
    assert len(general) == 1


def test_a_zero_init_output_is_zero_filled_on_every_call(fake, path, torch, general) -> None:
    """Mutant: ``fits`` ignoring zero_init outputs: the fast paths took the program and
    never zero-filled its output, so an ``out=`` that held values accumulated onto them (and
    a fresh output held whatever the allocator left)."""
    x = Tensor([1.0, 2.0, 3.0], torch.float32)
    z, prog = Tensor([9.0, 9.0, 9.0], torch.float32), acc()
    for _ in range(3):
        assert call_program(prog, x, out=z) is z
        assert z.values() == [1.0, 2.0, 3.0]
    assert len(general) == 3  # the fast paths do not take a zero_init output
    assert len(_named(fake, "cuMemsetD8Async")) == 3


def test_out_the_very_same_array_as_an_inout_argument_is_refused_on_the_fast_paths(
        fake, path, torch, general) -> None:
    """Mutant: ``FastCore.plan`` flagging an input for ``out=`` only when ``in_place.py``
    refuses the pair, not for its role inout (``w or`` dropped). Here the launch that stores
    ``z`` reads nothing the other one stores, so no refused pair covers ``(z, y)``: with
    ``out=y`` the fast paths launched both kernels (the copy overwrote ``y += 1``), where the
    general path refuses it because the program writes both."""
    prog = twostep()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([5.0, 6.0], torch.float32)
    z = Tensor([0.0, 0.0], torch.float32)
    for _ in range(2):  # the general path (it binds the device), then a fast one
        assert call_program(prog, x, y, out=z) is z
    assert general == ["twostep"] and y.values() == [7.0, 8.0] and z.values() == [1.0, 2.0]
    launches = len(_launches(fake))
    with pytest.raises(LaunchError, match=r"^twostep: out 'z' shares memory with argument "
                                          r"'y' .* the program writes both"):
        call_program(prog, x, y, out=y)
    assert y.values() == [7.0, 8.0] and len(_launches(fake)) == launches
    assert general == ["twostep"] * 2  # handed over, and refused there


def test_out_overlap_of_an_empty_out_or_with_empty_inputs() -> None:
    """Mutants: ``out_overlap``'s ``if not out_nbytes: return 0, ()`` dropped and its
    ``if nbytes`` filter dropped. Its docstring: ``(0, ())`` when ``out=`` is empty, and
    spans of the non-empty inputs only (an empty one was checked against ``out=`` and
    could send a call to the general path for nothing)."""
    spans = [(0, 4), (1, 4), (2, 8)]
    assert out_overlap(spans, ((3,), (3,), (2,)), 0) == (0, ())
    assert out_overlap(spans, ((3,), (3,), (2,)), 0, [True, True, True]) == (0, ())
    assert out_overlap(spans, ((3,), (0,), (2, 0)), 12) == (12, ((0, 12),))
    assert out_overlap(spans, ((3,), (0,), (2,)), 12, [False, True, True]) == \
        (12, ((0, 12), (2, 16 | WRITTEN_SPAN)))


@pytest.mark.parametrize("out_at, conflict", [
    (212, False),  # right after the written input
    (188, False),  # right before it
    (200, True),   # the very same start: the program writes both
    (208, True),
    (196, True),
])
def test_out_overlaps_input_strips_the_written_flag_from_the_size(out_at, conflict) -> None:
    """Mutant: ``out_overlaps_input`` comparing against ``value`` itself rather than
    ``value & ~WRITTEN_SPAN``: the flag made a written input 2^63 bytes long, so an ``out=``
    anywhere after it "overlapped" it and every such call went to the general path."""
    vals = [100, 200]
    overlap = (12, ((1, 12 | WRITTEN_SPAN),))
    assert out_overlaps_input(vals, out_at, overlap) is conflict
    assert out_overlaps_input(vals, out_at, (12, ((1, 12),))) is (out_at in (196, 208))


# ==== _plan_fast.py =============================================================================

def _outcome(fn: Any) -> Any:
    try:
        return ("plan", fn())
    except Exception as exc:  # noqa: BLE001 - the exact type and message are compared
        return (type(exc).__name__, str(exc))


def _program(params: list, grid: tuple = (1,), block: tuple = (1,), shared_mem: Any = 0,
             args: tuple = (), variants: tuple | None = None) -> KernelSummary:
    launch = Launch("k", "mod", grid, block, args, shared_mem)
    return KernelSummary("p", tuple(params), variants or (Variant((launch,)),))


X = TensorSpec("x", kp.f32, ("n",))


def _static_cases() -> list:
    """(id, summary, shapes, scalars, expected: "plan" or a regex of the reference's error)."""
    c = kp.expr.const
    return [
        ("block z 64", _program([X], block=(1, 1, 64)), [(4,)], [], "plan"),
        ("block z 65", _program([X], block=(1, 1, 65)), [(4,)], [], r"block \(1, 1, 65\)"),
        ("block 1024 threads", _program([X], block=(512, 2)), [(4,)], [], "plan"),
        ("block 1025 threads", _program([X], block=(1025,)), [(4,)], [], r"block \(1025"),
        ("smem 2^32-1", _program([X], shared_mem=(1 << 32) - 1), [(4,)], [], "plan"),
        ("smem 2^32", _program([X], shared_mem=1 << 32), [(4,)], [], "shared_mem = 4294967296"),
        ("grid x 2^31-1", _program([X], grid=((1 << 31) - 1,)), [(4,)], [], "plan"),
        ("grid x 2^31", _program([X], grid=(1 << 31,)), [(4,)], [], r"grid \(2147483648, 1, 1\)"),
        ("grid z 65535", _program([X], grid=(1, 1, 65535)), [(4,)], [], "plan"),
        ("grid z 65536", _program([X], grid=(1, 1, 65536)), [(4,)], [], r"grid \(1, 1, 65536\)"),
        ("output of INT64_MAX bytes",
         _program([X, TensorSpec("z", kp.u8, ((1 << 63) - 1,), role="out")]), [(4,)], [],
         "plan"),
        ("output of 2^64 bytes",
         _program([X, TensorSpec("z", kp.f32, (1 << 62,), role="out")]), [(4,)], [],
         "more than int64 can hold"),
        ("value argument 255 as uint8", _program([X], args=(Arg.of(c(255), kp.u8),)), [(4,)],
         [], "plan"),
        ("value argument 256 as uint8", _program([X], args=(Arg.of(c(256), kp.u8),)), [(4,)],
         [], "value argument = 256 does not fit uint8"),
    ]


def _dynamic_cases() -> list:
    k_u32 = [TensorSpec("x", kp.f32, ("n",)), Scalar("k", kp.u32)]
    return [
        ("dim INT64_MAX", _program([X]), [((1 << 63) - 1,)], [], "plan"),
        ("dim 2^63", _program([X]), [(1 << 63,)], [], "outside int64"),
        ("dim -1", _program([X]), [(-1,)], [], "a negative size"),
        # read only by a value argument (a negative grid would be refused anyway)
        ("uint32 symbol 3", _program(k_u32, args=(Arg.of(k, kp.i64),)), [(5,)], [3], "plan"),
        ("uint32 symbol -1", _program(k_u32, args=(Arg.of(k, kp.i64),)), [(5,)], [-1],
         r"scalar k = -1 is outside its dtype range 0\.\.4294967295"),
        ("grid z n - 5 at n = 3", _program([X], grid=(1, 1, n - 5)), [(3,)], [],
         r"grid \(1, 1, -2\) outside the limits"),
        ("grid z n - 5 at n = 9", _program([X], grid=(1, 1, n - 5)), [(9,)], [], "plan"),
        ("a scalar too many", _program([X, Scalar("a", kp.f32)]), [(4,)], [1.0, 2.0],
         r"expected 1 shapes and 1 scalars \(got 1 and 2\)"),
        ("an expression dim", _program([X, TensorSpec("y", kp.f32, (2 * n,))], grid=(n,)),
         [(4,), (8,)], [], "plan"),
        ("an expression dim that does not match",
         _program([X, TensorSpec("y", kp.f32, (2 * n,))], grid=(n,)), [(4,), (9,)], [],
         r"y.shape\[0\]"),
        # a computed scalar named like a dim: the dim's value stays the symbol's
        ("computed scalar named like a dim",
         _program([X, Scalar("n", kp.i64, value=2 * n)], grid=(n,)), [(3,)], [], "plan"),
    ]


@pytest.mark.parametrize("case", _static_cases() + _dynamic_cases(), ids=lambda c: c[0])
def test_the_fast_planner_agrees_with_the_reference_at_the_limits(case) -> None:
    """Mutants (_plan_fast.py): each limit of ``_block_ok`` / ``_grid_ok`` moved by one
    (block z <= 1024, threads < 1024, shared_mem <= 2^32, grid x <= 2^31, no z maximum),
    the static allocation's and value argument's range checks dropped, a dim's
    ``d > INT64_MAX`` or ``d < 0`` check dropped, a scalar's lower bound dropped, the
    dynamic grid's ``gz < 0`` dropped, the scalar count unchecked, the deferred (expression)
    dims not written, and ``symbols.setdefault`` turned into an assignment. The
    hypothesis comparison in test_planner_fast.py draws none of these values. Each case:
    the planner's answer is the reference planner's, and the fast path gives it itself
    exactly when it is a plan (errors are the reference's to word)."""
    _, summary, shapes, scalars, expected = case
    planner = Planner(summary, cache_size=0)
    reference = _outcome(lambda: ReferencePlanner(summary).plan_shapes(shapes, scalars))
    if expected == "plan":
        assert reference[0] == "plan"
    else:
        assert reference[0] != "plan" and re.search(expected, reference[1]), reference
    assert _outcome(lambda: planner.plan_shapes(shapes, scalars)) == reference
    assert planner._fast is not None
    fast = planner._fast(shapes, scalars)
    if expected == "plan":
        assert fast == reference[1]
    else:
        assert fast is None


def _deep(depth: int) -> kp.expr.Expr:
    """An expression of ``n`` nested exactly ``depth`` deep."""
    e = n
    while e._depth < depth:
        e = e * n if (depth - e._depth) % 2 else kp.cdiv(e, n)
    assert e._depth == depth
    return e


def test_an_expression_nested_past_the_limit_gets_no_fast_plan() -> None:
    """Mutant: ``_depth > MAX_EXPR_DEPTH + 1`` in ``compile_fast``: an expression one level
    deeper than the format allows got plans from the fast path, where the reference planner
    (which must encode it) raises ValueError. At the limit itself both plan it."""
    def summary(depth: int) -> KernelSummary:
        return _program([X], args=(Arg.of(_deep(depth), kp.i64),))

    at = Planner(summary(MAX_EXPR_DEPTH), cache_size=0)
    assert at._fast is not None
    assert at._fast([(1,)], []).launches[0].args == (("value", 1, kp.i64),)
    past = Planner(summary(MAX_EXPR_DEPTH + 1), cache_size=0)
    assert past._fast is None
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_EXPR_DEPTH}"):
        past.plan_shapes([(1,)], [])


def test_a_variant_body_recomputes_what_only_a_later_predicate_computed() -> None:
    """Mutant: a variant body compiled against every predicate's registers (``set(done)``
    for ``set(dones[vi])``): the output shape ``3 * n`` is computed by variant 1's
    predicate only, which a call that chose variant 0 never runs, so variant 0's allocation
    read an unset register (a TypeError out of the planner)."""
    v0 = Variant((Launch("k", "m", (1,), (1,), ()),), predicate=n < 10)
    v1 = Variant((Launch("k", "m", (2,), (1,), ()),), predicate=3 * n > 5)
    s = KernelSummary("p", (X, TensorSpec("o", kp.f32, (3 * n,), role="out")), (v0, v1))
    reference = ReferencePlanner(s)
    for size in (2, 20, 4):
        planner = Planner(s, cache_size=0)
        plan = planner._fast([(size,)], [])
        assert plan == reference.plan_shapes([(size,)], [])
        assert plan.allocations["o"].shape == (3 * size,)


def test_a_numpy_1_bool_scalar_is_left_to_the_reference() -> None:
    """Mutant: the fast path's ``numpy_bool(v)`` hand-over dropped. NumPy before 2.3 (every
    NumPy of Python 3.10) gives ``np.bool_`` a deprecated ``__index__``: the fast path then
    called it (a DeprecationWarning per call) where the reference takes the flag as 0/1
    without asking. A stand-in of that type (NumPy 2.3+ has no ``__index__`` at all, so the
    installed NumPy cannot show it)."""
    def index(self: Any) -> int:
        warnings.warn("In future, it will be an error for 'np.bool' scalars to be "
                      "interpreted as an index", DeprecationWarning, stacklevel=2)
        return 1

    numpy_bool = type("bool_", (), {"__module__": "numpy", "__index__": index,
                                    "__bool__": lambda self: True})
    s = _program([X, Scalar("k", kp.i32)], grid=(k,))
    planner = Planner(s, cache_size=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert planner._fast([(4,)], [numpy_bool()]) is None
        plan = planner.plan_shapes([(4,)], [numpy_bool()])
    assert plan.launches[0].grid == (1, 1, 1) and plan.symbols["k"] == 1


# ==== lowering/materialize.py ===================================================================

def _materialize() -> Any:
    pytest.importorskip("llvmlite")
    from kernelpack.lowering import materialize

    return materialize


class _CountingNodes(list):
    """A graph's node list that counts the look-ups by id (``graph.nodes[i]``) and fails
    past ``budget`` of them (instead of running for hours)."""

    lookups = 0
    budget = 0

    def __getitem__(self, i: Any) -> Any:
        self.lookups += 1
        assert self.lookups <= self.budget, f"more than {self.budget} node look-ups"
        return super().__getitem__(i)


def test_materialize_visits_each_reader_once() -> None:
    """Mutant: ``_reaches`` without its ``seen`` set. A column sum read by a chain of
    ``y = y * y + y`` (each value read three times) was walked once per path, 3^levels of
    them: 12 levels took 2 s, 30 never finished. Now each reader is looked at once: a few
    look-ups per node (here about 3; bounded at 20)."""
    materialize = _materialize()

    def chain(x: kp.Tensor[kp.f32, "a", "b"]):
        y = x.sum(axis=0)
        for _ in range(30):
            y = y * y + y
        return y

    graph = kp.fusion(chain).trace({})
    graph.nodes = nodes = _CountingNodes(graph.nodes)
    nodes.budget = 20 * len(nodes)
    _, names = materialize.materialize(graph, [[nid for _, nid in graph.outputs]])
    assert names == ("chain_m0",)  # the column sum, below the (general) stage given


def test_a_workspace_is_not_named_like_a_parameter() -> None:
    """Mutant: ``materialize_nodes`` taking only the outputs' names (not the parameters')
    as used: the column mean's workspace was named ``cm_m0``, the name of an input."""
    materialize = _materialize()

    @kp.fusion
    def cm(x: kp.Tensor[kp.f64, "a", "b"], cm_m0: kp.Tensor[kp.f64, "b"]):
        return x - x.mean(axis=0, keepdims=True) + cm_m0

    graph = cm.trace({})
    rewritten, names = materialize.materialize(graph, [[nid for _, nid in graph.outputs]])
    assert names == ("cm_m1",)
    assert [name for name, _ in rewritten.outputs] == ["cm_m1", "out"]
    assert [p[0] for p in rewritten.params] == ["x", "cm_m0"]


@kp.fusion
def crossed(x: kp.Tensor[kp.f64, "a", "b"], y: kp.Tensor[kp.f64, "c", "b"]):
    m1 = x.max(axis=0, keepdims=True)
    s1 = (x - m1).sum(axis=0, keepdims=True)     # reads m1
    m2 = y.mean(axis=0, keepdims=True)           # made after s1, read by s2 only
    s2 = (x * m2).sum(axis=0, keepdims=True)     # one source shape and axis with s1
    return x - s1, x + s2


def test_workspace_stages_put_every_workspace_before_its_readers() -> None:
    """Mutant: ``workspace_stages`` returning its list in the graph's order instead of by
    depth. ``s1`` and ``s2`` (column sums of one source shape at depth 1) share a stage,
    which the schedule places where the first of them comes; ``m2`` (depth 0) was made after
    ``s1``, so its stage came after the shared one, which read ``m2``'s workspace before
    anything wrote it (NaN on the emulator). The docstring's guarantee: a stage never reads
    a workspace that a later stage writes."""
    materialize = _materialize()
    from kernelpack.lowering import pipeline
    from lowering.simt import Kernels, assert_close  # (tests/ is on sys.path, as in review 46)

    build = pipeline.run(pipeline.new_build(crossed, ["sm_80"], None, {}), stop="llvm_ir")
    graph, names = build.graph, set(build.workspaces)
    assert len(names) == 4
    stages: dict[tuple, list[tuple[str, int]]] = {}
    for key, name, nid in materialize.workspace_stages(graph, build.workspaces):
        stages.setdefault(key, []).append((name, nid))  # as schedule.plan groups them
    assert [len(members) for members in stages.values()] == [1, 1, 2]
    written: set[str] = set()
    for members in stages.values():
        for name, nid in members:
            reads = {graph.nodes[r].attrs[0] for r in graph.reachable([nid])
                     if graph.nodes[r].op == "input" and graph.nodes[r].attrs[0] in names}
            assert reads <= written, (name, reads - written)
        written |= {name for name, _ in members}
    rng = np.random.default_rng(47)
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    got_1, got_2 = Kernels(crossed)(x, y)
    assert_close(got_1, x - (x - x.max(0, keepdims=True)).sum(0, keepdims=True), 1e-13, "x - s1")
    assert_close(got_2, x + (x * y.mean(0, keepdims=True)).sum(0, keepdims=True), 1e-13,
                 "x + s2")
