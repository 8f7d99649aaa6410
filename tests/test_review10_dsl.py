"""Regressions (review 10): the DSL's errors name the op a user called.

``kp.exp(x, y)`` (a second argument, as NumPy's ``out``) was "TypeError: _math.<locals>.fn()
takes 1 positional argument but 2 were given": the elementwise functions are made by one
factory and Python's message named the factory's inner function, for every one of them.
"""

from __future__ import annotations

import pytest

import kernelpack as kp

T = kp.Tensor

_MATH = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
         "sigmoid", "floor", "ceil")


@pytest.mark.parametrize("name", _MATH)
def test_a_wrong_call_of_a_math_function_names_it(name):
    fn = getattr(kp, name)

    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return fn(x, x)

    with pytest.raises(TypeError, match=rf"^kp\.{name}\(\) takes 1 positional argument but 2 "
                                        rf"were given$"):
        f.trace()
    assert fn.__name__ == name  # unchanged: docs and reprs use the short name


def test_math_functions_still_trace():
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return tuple(getattr(kp, name)(x) for name in _MATH)

    graph = f.trace()
    assert len(graph.outputs) == len(_MATH)
