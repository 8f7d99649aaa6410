"""Ninth review, the fast paths (torch and cupy; C ``FastCall`` and the closures; stand-in
frameworks over host memory): an ``out=`` that partially overlaps an input goes to the general
path, which refuses it; the very same array (in-place use) and separate arrays stay fast."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import bind

sys.path.insert(0, str(Path(__file__).parent))
from test_fastpath_fake import NDArray, Tensor, axpby, cupy, exchange, fake, \
    launch_path, torch  # noqa: E402,F401 - the fixtures


def _fast_calls(prog, launch_path) -> int | None:
    fast = getattr(bind(prog).call, "__self__", None)
    return fast.fast_calls if launch_path.startswith("C") else None


def _tensor_view(base: Tensor, offset: int, n: int) -> Tensor:
    """A torch.Tensor (the exact type, as the fast paths want) over ``n`` float32 of
    ``base``'s memory, ``offset`` bytes in: ``base[k:k + n]``."""
    t = Tensor([0.0] * n, base.dtype)
    t._buf = (ctypes.c_char * (4 * n)).from_address(ctypes.addressof(base._buf) + offset)
    t._base = base
    return t


def _array_view(base: NDArray, offset: int, n: int) -> NDArray:
    a = NDArray([0.0] * n)
    a._buf = (ctypes.c_char * (4 * n)).from_address(ctypes.addressof(base._buf) + offset)
    a._base, a.data.ptr = base, ctypes.addressof(a._buf)
    return a


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_fast_paths_send_partial_overlap_to_the_general_path(fake, launch_path, framework,
                                                             request) -> None:
    """It was launched on every fast path (the general path refused it)."""
    mod = request.getfixturevalue(framework)  # that framework alone: its own fast path
    make, view = ((lambda v: Tensor(v, mod.float32), _tensor_view) if framework == "torch"
                  else (NDArray, _array_view))
    prog = axpby()
    mem = make([float(i) for i in range(8)])
    x, y = view(mem, 0, 4), make([10.0] * 4)
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)  # the fast path is built and taken from here on
    fast = _fast_calls(prog, launch_path)
    launches = len([c for c in fake.calls if c[0] == "cuLaunchKernel"])
    for offset in (4, -4, 12):  # z over x[1:5], x[-1:3] (before x), x[3:7]
        base = 4 if offset < 0 else 0
        x = view(mem, base, 4)
        with pytest.raises(LaunchError, match=r"out 'z' partially overlaps argument 'x'"):
            call_program(prog, x, y, 1.0, out=view(mem, base + offset, 4))
    assert len([c for c in fake.calls if c[0] == "cuLaunchKernel"]) == launches
    x = view(mem, 0, 4)
    assert call_program(prog, x, y, 2.0, out=x) is x  # in place: the fast path
    assert x.values() == [10.0, 12.0, 14.0, 16.0]
    z = view(mem, 16, 4)  # right after x: no overlap
    assert call_program(prog, x, y, 1.0, out=z) is z and z.values() == [20.0, 22.0, 24.0, 26.0]
    if fast is not None:
        assert _fast_calls(prog, launch_path) == fast + 2
