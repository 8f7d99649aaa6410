"""kernelpack.dtypes' integer checks: a bool, Python's or NumPy's, is never a size, an axis, a
step or a device, whatever NumPy's version.

NumPy before 2.3 (every NumPy that supports Python 3.10) gives ``np.bool_`` a deprecated
``__index__``; a check written as "refuse ``bool``, then ``operator.index``" took ``np.True_`` as
1 there and refused it on a newer NumPy. ``OldNumpyBool`` is such a bool as kernelpack sees it
(the class name and module NumPy's, an ``__index__``), so these tests hold under any NumPy.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import _plan_types
from kernelpack.dtypes import is_numpy_bool, strict_index
from kernelpack.expr import as_expr
from kernelpack.planner import Planner
from kernelpack.runtime import arrays

import kp_samples


class OldNumpyBool:
    """``numpy.bool_`` of NumPy before 2.3, as far as kernelpack can tell."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __index__(self) -> int:
        return int(self.value)

    def __bool__(self) -> bool:
        return self.value

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        return f"np.{self.value}_"


OldNumpyBool.__name__ = OldNumpyBool.__qualname__ = "bool_"
OldNumpyBool.__module__ = "numpy"
OLD_TRUE = OldNumpyBool(True)


def test_the_stand_in_is_what_kernelpack_calls_a_numpy_bool() -> None:
    assert is_numpy_bool(OLD_TRUE) and operator.index(OLD_TRUE) == 1
    assert not is_numpy_bool(True) and not is_numpy_bool(1)


@pytest.mark.parametrize("value", [True, False, OLD_TRUE, OldNumpyBool(False)])
def test_strict_index_refuses_every_bool(value: Any) -> None:
    with pytest.raises(TypeError, match="not a bool"):
        strict_index(value)


def test_strict_index_takes_ints_and_integer_scalars() -> None:
    class Index:
        def __index__(self) -> int:
            return 7

    assert strict_index(3) == 3 and strict_index(-(1 << 70)) == -(1 << 70)
    assert strict_index(Index()) == 7
    with pytest.raises(TypeError):
        strict_index(2.0)


def test_a_numpy_bool_is_no_dim_of_a_plan() -> None:
    planner = Planner(kp_samples.axpy_summary())
    for bad in (True, OLD_TRUE):
        with pytest.raises(TypeError, match=r"x\.shape\[0\] must be an integer"):
            planner.plan(x=(bad,), y=(1,), a=1.0)
        with pytest.raises(TypeError, match="must be an integer"):
            _plan_types.dim(bad, "n")
    # the fast plan hands it over rather than taking it as 1: the same refusal
    assert planner.plan(x=(1,), y=(1,), a=1.0).launches[0].grid == (1, 1, 1)
    with pytest.raises(TypeError, match=r"x\.shape\[0\] must be an integer \(got np\.True_\)"):
        planner.plan(x=(OLD_TRUE,), y=(1,), a=1.0)


def test_a_numpy_bool_is_an_integer_scalar_0_or_1_without_a_warning() -> None:
    planner = Planner(kp_samples.axpy_summary())
    summary = kp.KernelSummary(
        "flag", (kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("k", kp.i32)),
        (kp.Variant((kp.Launch("f", "m", ("k",), (32,),
                                (kp.Arg.buffer("x"), kp.Arg.scalar("k"))),)),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy < 2.3 warns when its __index__ is used
        plan = Planner(summary).plan(x=(4,), k=OLD_TRUE)
        assert plan.launches[0].grid == (1, 1, 1) and plan.symbols["k"] == 1
        assert Planner(summary).plan(x=(4,), k=OldNumpyBool(False)).symbols["k"] == 0
    assert planner.plan(x=(4,), y=(4,), a=OLD_TRUE).launches  # a float scalar takes it too


def test_a_numpy_bool_is_no_dim_of_a_tensor_or_an_expression() -> None:
    with pytest.raises(TypeError, match="expected an int, a symbol name or an expression"):
        as_expr(OLD_TRUE)
    with pytest.raises(TypeError, match=r"shape\[1\]: expected an int"):
        kp.Tensor("x", kp.f32, ("n", OLD_TRUE))
    assert as_expr(3) == kp.Expr("const", (), 3)


@pytest.mark.parametrize("body, words", [
    (lambda x: x + kp.arange(OLD_TRUE).astype(kp.f32).sum(), "a size must be an integer"),
    (lambda x: x + kp.arange(0, 8, OLD_TRUE).astype(kp.f32).sum(), "step must be a nonzero int"),
    (lambda x: x + kp.iota(("n",), OLD_TRUE).astype(kp.f32), "axis must be an int"),
    (lambda x: x.sum(axis=OLD_TRUE), "must be an int or a tuple of ints"),
])
def test_a_numpy_bool_is_no_size_axis_or_step_in_a_fusion(body: Any, words: str) -> None:
    def f(x: kp.Tensor[kp.f32, "n"]):
        return body(x)

    with pytest.raises(kp.TraceError, match=words):
        kp.fusion(f).trace()


def test_a_numpy_bool_is_no_static_dim() -> None:
    @kp.fusion
    def double(x: kp.Tensor[kp.f32, "n"]):
        return x * 2

    with pytest.raises(TypeError, match=r"static\['n'\] must be an int"):
        double.trace(static={"n": OLD_TRUE})
    assert double.static_dims({"n": 4}) == {"n": 4}


def test_a_numpy_bool_is_no_dim_of_a_cuda_array_interface() -> None:
    cai = {"shape": (OLD_TRUE,), "typestr": "<f4", "data": (1 << 20, False), "version": 3,
           "strides": None}
    with pytest.raises(kp.LaunchError, match=r"shape\[0\] is bool_ np\.True_, not an integer"):
        arrays._read_cai(cai, "x", 0)


def test_a_numpy_bool_is_no_device_ordinal() -> None:
    from kernelpack.runtime import _device_list

    for bad in (True, OLD_TRUE):
        with pytest.raises(TypeError, match="expected an int device ordinal"):
            _device_list([bad])
    assert _device_list([0, 1]) == [0, 1]
