"""Sixth review of the launch path's argument contract (fake drivers, host memory): values an
outside caller hands over through the public API that plan() and a call must treat alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import ConstraintError, LaunchError
from kernelpack.runtime import call_program
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_libcuda import needs_launch_extension, through_c  # noqa: E402,F401


def _noop(*args) -> None:
    return None


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "flag": ("QQ?i", _noop)}))


def _launches(fake) -> list:
    return [c for c in fake.calls if c[0] == "cuLaunchKernel"]


def flagged() -> Compiled:
    """z = x with a bool flag and an int32 count (both read by no expression here, but
    integer scalars are symbols plan() takes)."""
    s = KernelSummary("flagged", (Tensor("x", kp.f32, ("n",)),
                                  Tensor("z", kp.f32, ("n",), role="out"),
                                  Scalar("f", kp.bool_), Scalar("k", kp.i32)),
                      (Variant((Launch("flag", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"), Arg.buffer("z"), Arg.scalar("f"),
                                        Arg.scalar("k"))),)),))
    return Compiled(s, (Module("m", ("flag",), (Image("cubin", "sm_90", b"\x7fELF"),)),))


def test_numpy_bool_scalars_launch_as_plan_takes_them(fake) -> None:
    """``np.bool_`` (a NumPy comparison's result) has no ``__index__``: plan() takes it as
    0/1, but a call refused it as "scalar 'f' is bool; pass an integer (got bool np.True_)"."""
    np = pytest.importorskip("numpy")
    prog = kp.load(kp.save([flagged()], None))["flagged"]
    x = HostArray([1.0, 2.0])
    assert prog.plan(x=(2,), f=np.True_, k=np.False_).symbols["f"] == 1
    for f, k, want in ((np.True_, np.False_, (1, 0)), (np.False_, np.True_, (0, 1)),
                       (True, 3, (1, 3))):
        call_program(prog, x, f, k)
        assert _launches(fake)[-1][6][2:] == want
    with pytest.raises(ConstraintError, match=r"scalar 'f' = 2 does not fit bool"):
        call_program(prog, x, 2, 0)  # the range check still holds
    with pytest.raises(TypeError, match=r"scalar 'k' is int32; pass an integer"):
        call_program(prog, x, True, np.float64(1.0))  # and floats are still refused


def test_too_few_positional_inputs_name_the_missing_ones(fake) -> None:
    x, y = HostArray([1.0]), HostArray([1.0])
    with pytest.raises(TypeError, match=r"axpby takes 3 inputs \['x', 'y', 'a'\] \(got 2\); "
                                        r"missing input\(s\) \['a'\]"):
        call_program(axpby(), x, y)
    with pytest.raises(TypeError, match=r"\(got 4\)$"):  # too many: nothing is missing
        call_program(axpby(), x, y, 1.0, 2.0)
    assert not _launches(fake)


@needs_launch_extension
def test_dlpack_export_without_a_stream_orders_the_legacy_default_stream(through_c) -> None:
    """DLPack: ``stream=None`` means the consumer reads on the legacy default stream, so a
    buffer written on stream 5 must make it wait, as ``stream=1`` does."""
    z = call_program(axpby(), HostArray([1.0]), HostArray([1.0]), 1.0, stream=5)
    for stream in ({}, {"stream": None}, {"stream": 1}):
        before = len(through_c.fake.calls)
        z.__dlpack__(**stream)
        names = [c[0] for c in through_c.fake.calls[before:]]
        assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                         "cuEventDestroy"], stream
        assert through_c.fake.calls[before + 1][2] == 5      # recorded on the producer
        assert through_c.fake.calls[before + 2][1] == 0      # waited on by the NULL stream
    before = len(through_c.fake.calls)
    z.__dlpack__(stream=-1)  # -1: the consumer opts out of synchronization
    assert len(through_c.fake.calls) == before


class _RaisingInterface:
    """A producer whose ``__cuda_array_interface__`` property raises (torch does for a
    tensor that requires grad)."""

    @property
    def __cuda_array_interface__(self) -> dict:
        raise RuntimeError("cannot export a tensor that requires grad")


def test_array_interface_that_raises_names_the_argument(fake) -> None:
    """The producer's own exception escaped unnamed (RuntimeError), where a failing
    ``__dlpack__`` is a LaunchError naming the argument."""
    x = HostArray([1.0])
    with pytest.raises(LaunchError, match=r"argument 'x': __cuda_array_interface__ failed "
                                          r"\(RuntimeError: cannot export"):
        call_program(axpby(), _RaisingInterface(), x, 1.0)
    with pytest.raises(LaunchError, match=r"argument 'z': __cuda_array_interface__ failed"):
        call_program(axpby(), x, x, 1.0, out=_RaisingInterface())
    assert not _launches(fake) and not fake.memory


class _CAI:
    def __init__(self, **cai) -> None:
        self.__cuda_array_interface__ = {"typestr": "<f4", "version": 3, **cai}


def test_array_interface_bool_dims_are_refused_as_plan_refuses_them(fake) -> None:
    """``shape=(True,)`` launched as a 1-element array, where ``plan(x=(True,))`` is a
    TypeError (a bool is never a dim)."""
    x = HostArray([1.0])
    import ctypes

    ptr = ctypes.addressof(x.buf)
    for cai, field in (({"shape": (True,)}, r"shape\[0\]"),
                       ({"shape": (1,), "strides": (True,)}, r"strides\[0\]")):
        with pytest.raises(LaunchError, match=rf"argument 'x': malformed "
                                              rf"__cuda_array_interface__ \({field} is bool"):
            call_program(axpby(), _CAI(data=(ptr, False), **cai), x, 1.0)
    assert not _launches(fake)
    with pytest.raises(TypeError, match=r"x.shape\[0\] must be an integer \(got True\)"):
        kp.load(kp.save([axpby()], None))["axpby"].plan(x=(True,), y=(1,))
    assert call_program(axpby(), _CAI(data=(ptr, False), shape=(1,)), x, 1.0).shape == (1,)


def test_out_dict_with_keys_of_mixed_types_names_them(fake) -> None:
    """``sorted()`` of the unknown keys raised "'<' not supported between NoneType and int"
    instead of naming them."""
    x = HostArray([1.0])
    with pytest.raises(TypeError, match=r"axpby: out= names unknown outputs \[1, None\] "
                                        r"\(outputs: \['z'\]\)"):
        call_program(axpby(), x, x, 1.0, out={"z": HostArray([0.0]), 1: x, None: x})
    with pytest.raises(TypeError, match=r"unknown outputs \['w'\]"):
        call_program(axpby(), x, x, 1.0, out={"w": x})
    assert not _launches(fake)
