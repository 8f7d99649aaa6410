"""An argument the program writes (role ``inout``) may not share memory with another tensor
argument, except as the very same array as a read-only one (in-place use): ``y += a * x`` with
``y`` over the first three floats of a buffer and ``x`` over its last three races on the device
(a thread's write of ``y[i + 1]`` lands in the ``x[i]`` another thread still reads). Two
written arguments may not share any memory. The general path raises ``LaunchError``; the torch
and CuPy fast paths (C ``FastCall`` and the closures) hand such a call to it, and stay fast
for separate and in-place arrays. Stand-in frameworks over host memory, the fake driver."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.fastpath import written_conflict, written_pairs
from kernelpack.runtime.launcher import bind
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar, Tensor as
                                TensorSpec, Variant)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from kp_samples import axpy, fake_image  # noqa: E402
from test_fastpath_fake import NDArray, Tensor, cupy, exchange, launch_path, \
    torch  # noqa: E402,F401 - the fixtures
from test_launch_fake import _axpy_impl, _f32  # noqa: E402
from test_review9_outputs_fast import _array_view, _tensor_view  # noqa: E402


def _bump_impl(grid, block, shmem, v) -> None:
    """``u += 1; w *= 2`` elementwise (both written)."""
    u, w, n = v
    us, ws = _f32(u, n), _f32(w, n)
    ctypes.memmove(u, struct.pack(f"<{n}f", *[p + 1 for p in us]), 4 * n)
    ctypes.memmove(w, struct.pack(f"<{n}f", *[q * 2 for q in ws]), 4 * n)


def bump() -> Compiled:
    summary = KernelSummary(
        "bump",
        (TensorSpec("u", kp.f32, ("n",), role="inout"),
         TensorSpec("w", kp.f32, ("n",), role="inout"), Scalar("n32", kp.u32, value="n")),
        (Variant((Launch("bump", "bump", (kp.cdiv("n", 256),), (256,),
                         (Arg.buffer("u"), Arg.buffer("w"), Arg.scalar("n32"))),)),))
    return Compiled(summary, (Module("bump", ("bump",), (fake_image("cubin", "sm_80"),
                                                         fake_image("cubin", "sm_90", seed=3))),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpy": ("QQfI", _axpy_impl),
                                                    "bump": ("QQI", _bump_impl)}))


def _launches(fake) -> int:
    return len([c for c in fake.calls if c[0] == "cuLaunchKernel"])


def _fast_calls(prog, launch_path) -> int | None:
    fast = getattr(bind(prog).call, "__self__", None)
    return fast.fast_calls if launch_path.startswith("C") else None


# ---- the general path (arrays through __cuda_array_interface__) -----------------------------

def _host_view(base: HostArray, offset: int, n: int) -> HostArray:
    a = HostArray([0.0] * n)
    a.buf = (ctypes.c_char * (4 * n)).from_buffer(base.buf, offset)
    return a


def _floats(a: HostArray, n: int) -> list:
    return list(struct.unpack(f"<{n}f", a.buf.raw[:4 * n]))


@pytest.mark.parametrize("x_at, y_at", [(4, 0), (0, 4), (0, 8)])
def test_a_partially_overlapping_inout_argument_is_refused(fake, x_at, y_at) -> None:
    base = HostArray([1.0, 2.0, 3.0, 4.0, 5.0])
    x, y = _host_view(base, x_at, 3), _host_view(base, y_at, 3)
    with pytest.raises(LaunchError, match=r"argument 'y', which the program writes \(role "
                       r"'inout'\), partially overlaps argument 'x'"):
        call_program(axpy(), x, y, 2.0)
    assert _launches(fake) == 0
    assert _floats(base, 5) == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_in_place_and_adjacent_inout_arguments_run(fake) -> None:
    base = HostArray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    x = _host_view(base, 0, 3)
    call_program(axpy(), x, x, 2.0)  # the very same array: y = 2 * y + y
    assert _floats(base, 6) == [3.0, 6.0, 9.0, 4.0, 5.0, 6.0]
    call_program(axpy(), _host_view(base, 12, 3), x, 1.0)  # right after it: no overlap
    assert _floats(base, 6) == [7.0, 11.0, 15.0, 4.0, 5.0, 6.0]
    empty = HostArray([])
    call_program(axpy(), empty, empty, 1.0)  # nothing to share
    assert _launches(fake) == 2


@pytest.mark.parametrize("u_at, w_at", [(0, 0), (0, 4)])
def test_two_written_arguments_may_not_share_memory(fake, u_at, w_at) -> None:
    base = HostArray([1.0, 2.0, 3.0, 4.0])
    u, w = _host_view(base, u_at, 3), _host_view(base, w_at, 3)
    with pytest.raises(LaunchError, match=r"arguments 'u' and 'w' overlap in memory .* the "
                       r"program writes both"):
        call_program(bump(), u, w)
    assert _launches(fake) == 0
    call_program(bump(), _host_view(base, 0, 2), _host_view(base, 8, 2))
    assert _floats(base, 4) == [2.0, 3.0, 6.0, 8.0]


# ---- the fast paths ------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_fast_paths_send_written_overlap_to_the_general_path(fake, launch_path, framework,
                                                             request) -> None:
    mod = request.getfixturevalue(framework)  # that framework alone: its own fast path
    make, view = ((lambda v: Tensor(v, mod.float32), _tensor_view) if framework == "torch"
                  else (NDArray, _array_view))
    prog = axpy()
    mem = make([float(i) for i in range(12)])
    x, y = view(mem, 0, 4), view(mem, 16, 4)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # the fast path is built and taken from here on
    fast = _fast_calls(prog, launch_path)
    launches = _launches(fake)
    for x_at, y_at in ((0, 4), (4, 0), (12, 0), (0, 12)):
        before = list(mem.values())
        with pytest.raises(LaunchError, match=r"'y', which the program writes .* partially "
                           r"overlaps argument 'x'"):
            call_program(prog, view(mem, x_at, 4), view(mem, y_at, 4), 1.0)
        assert mem.values() == before
    assert _launches(fake) == launches
    x = view(mem, 0, 4)
    call_program(prog, x, x, 2.0)  # in place: fast
    assert x.values() == [0.0, 3.0, 6.0, 9.0]
    y = view(mem, 16, 4)  # right after x
    call_program(prog, x, y, 1.0)
    assert y.values() == [4.0, 10.0, 16.0, 22.0]  # 4..7 plus x twice before, plus 3x
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 2

    prog = bump()
    u, w = view(mem, 0, 4), view(mem, 16, 4)
    call_program(prog, u, w)
    call_program(prog, u, w)
    fast = _fast_calls(prog, launch_path)
    launches = _launches(fake)
    for u_at, w_at in ((0, 0), (0, 12), (12, 0)):
        with pytest.raises(LaunchError, match="the program writes both"):
            call_program(prog, view(mem, u_at, 4), view(mem, w_at, 4))
    assert _launches(fake) == launches
    call_program(prog, u, w)
    assert u.values() == [3.0, 6.0, 9.0, 12.0]
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 1


# ---- the pairs the fast paths check ----------------------------------------------------------

def test_written_pairs_cover_each_written_argument_once() -> None:
    # slots 0, 1, 2; 4-byte elements; argument 1 written, then 0 and 1 written
    spans = [(0, 4), (1, 4), (2, 4)]
    key = ((3,), (3,), (0,))
    assert written_pairs(spans, [False, True, False], key) == ((1, 12, 0, 12, False),)
    assert written_pairs(spans, [True, True, False], key) == ((0, 12, 1, 12, True),)
    assert written_pairs(spans, [False, False, False], key) == ()
    assert written_pairs(spans, [False, False, True], key) == ()  # written but empty


@pytest.mark.parametrize("pa, pb, both, conflict", [
    (100, 100, False, False),  # the very same range: in place
    (100, 100, True, True),    # both written
    (100, 104, False, True),   # partial
    (100, 112, False, False),  # adjacent
    (112, 100, False, False),
    (108, 100, False, True),
])
def test_written_conflict(pa, pb, both, conflict) -> None:
    vals = [pa, pb]
    assert written_conflict(vals, ((0, 12, 1, 12, both),)) is conflict
