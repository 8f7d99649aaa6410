"""The C fast path reading torch tensors through DLPack's C exchange API
(``torch.Tensor.__dlpack_c_exchange_api__``, runtime/fast_native.exchange_api): one C call of
the framework's per tensor, the current stream from it too, and the last call's key
remembered in C. Stand-in tensors over host memory with a ctypes exchange API
(dlpack_exchange.py), the fake driver. Every test of test_fastpath_fake.py also runs on this
path ("C-dlpack"); these check what is particular to it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError
from kernelpack.runtime import call_program
from kernelpack.runtime.launcher import bind

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_exchange import FakeExchange  # noqa: E402
from fake_driver import FakeDriver, install  # noqa: E402
from test_fastpath_fake import Tensor, select_path, torch  # noqa: E402,F401 - a fixture
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    select_path("C", monkeypatch)
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


def _with_api(monkeypatch, fx: FakeExchange) -> FakeExchange:
    monkeypatch.setattr(Tensor, "__dlpack_c_exchange_api__", fx.capsule, raising=False)
    return fx


def _fast(prog):
    return getattr(bind(prog).call, "__self__", None)


def _f32(torch, values, **kw) -> Tensor:
    return Tensor(list(values), torch.float32, **kw)


def test_tensors_and_the_stream_come_from_the_exchange_api(fake, torch, monkeypatch) -> None:
    fx = _with_api(monkeypatch, FakeExchange())
    fx.stream = 0x55
    prog = axpby()
    x, y = _f32(torch, [1.0, 2.0, 3.0]), _f32(torch, [1.0, 1.0, 1.0])
    assert call_program(prog, x, y, 2.0).values() == [3.0, 5.0, 7.0]  # general path, binds
    fx.described.clear()
    z = call_program(prog, x, y, 2.0)
    assert z.values() == [3.0, 5.0, 7.0] and _fast(prog).fast_calls == 1
    assert fx.described[:2] == [x, y] and fx.described[2] is z  # the output's pointer too
    assert fx.streams == [(2, 0)]
    assert [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"][-1] == 0x55
    out = _f32(torch, [0.0] * 3)
    fx.described.clear()

    class Stream:
        cuda_stream = 0x66

    assert call_program(prog, x, y, 1.0, out=out, stream=Stream()) is out
    assert out.values() == [2.0, 3.0, 4.0] and fx.described == [x, y, out]
    assert fx.streams == [(2, 0)]  # stream= named the stream: torch was not asked
    assert [c[5] for c in fake.calls if c[0] == "cuLaunchKernel"][-1] == 0x66


def test_what_the_api_refuses_takes_the_general_path(fake, torch, monkeypatch) -> None:
    fx = _with_api(monkeypatch, FakeExchange())
    prog = axpby()
    x, y = _f32(torch, [1.0, 2.0]), _f32(torch, [1.0, 1.0])
    call_program(prog, x, y, 1.0)
    call_program(prog, x, y, 1.0)
    done = _fast(prog).fast_calls
    fx.refuse = True
    assert call_program(prog, x, y, 3.0).values() == [4.0, 7.0]  # the general path's result
    assert _fast(prog).fast_calls == done
    fx.refuse = False
    with pytest.raises(LaunchError, match="'x' is not C-contiguous"):  # strides, read in C
        call_program(prog, _f32(torch, [1.0, 2.0], contiguous=False), y, 1.0)
    with pytest.raises(LaunchError, match="'y' has dtype int32, expected float32"):
        call_program(prog, x, Tensor([1, 2], torch.int32), 1.0)
    assert _fast(prog).fast_calls == done


@pytest.mark.parametrize("version", [(1, 1), (2, 0), (0, 9)])
def test_an_api_of_another_version_is_not_used(fake, torch, monkeypatch, version) -> None:
    fx = _with_api(monkeypatch, FakeExchange(version))
    prog = axpby()
    x, y = _f32(torch, [1.0]), _f32(torch, [2.0])
    for _ in range(3):
        assert call_program(prog, x, y, 1.0).values() == [3.0]
    assert _fast(prog).fast_calls == 2 and fx.described == []  # the attribute reads


def test_the_knob_turns_the_api_off(fake, torch, monkeypatch) -> None:
    monkeypatch.setenv("KERNELPACK_TORCH_EXCHANGE_API", "0")
    fx = _with_api(monkeypatch, FakeExchange())
    prog = axpby()
    for _ in range(3):
        call_program(prog, _f32(torch, [1.0]), _f32(torch, [2.0]), 1.0)
    assert _fast(prog).fast_calls == 2 and fx.described == []


def test_the_last_key_is_remembered_and_shapes_alternate_correctly(fake, torch,
                                                                   monkeypatch) -> None:
    """A call with the last call's shapes takes its entry without building a Python key; a
    different shape builds it and looks it up (or asks the planner once)."""
    _with_api(monkeypatch, FakeExchange())
    prog = axpby()
    args = {n: (_f32(torch, range(n)), _f32(torch, [1.0] * n)) for n in (3, 5)}
    call_program(prog, *args[3], 1.0)
    call_program(prog, *args[3], 1.0)
    for n in (3, 5, 5, 3, 5, 3, 3):
        z = call_program(prog, *args[n], 2.0)
        assert z.values() == [2.0 * v + 1.0 for v in range(n)]
    fast = _fast(prog)
    assert fast.entries == 2 and fast.fast_calls == 8
