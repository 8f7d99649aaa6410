"""lowering/mathops.py: libdevice routines in OUTLINED (float32's fmod) are one function per
module, called from every use, not a copy per use (a row fusion with a float32 ``%`` compiled in
twice the time of the same fusion with ``*``); values are checked in the emulator here and on a
GPU by tests/gpu/test_float_divmod.py."""

from __future__ import annotations

import re

import numpy as np

import kernelpack as kp
from kernelpack.lowering import mathops, pipeline

from .simt import Kernels, assert_close

T = kp.Tensor


@kp.fusion
def rowmod(x: T[kp.f32, "b", "n"], y: T[kp.f64, "b", "n"]):
    z = x % 1.5
    return z - z.max(axis=1, keepdims=True), y // 0.25 + y % 0.25


def test_fmod_is_one_function_of_the_module_whatever_the_uses() -> None:
    build = pipeline.run(pipeline.new_build(rowmod, ["sm_80", "ptx"], None, {}))
    ir_text = build.ir
    define = re.findall(r'define internal float @"kp_fmodf"\(.*\) noinline', ir_text)
    assert len(define) == 1
    # the wrapper's is the one call of libdevice's fmodf: no kernel calls it itself
    assert len(re.findall(r'call float @"__nv_fmodf"\(', ir_text)) == 1
    uses = re.findall(r'call float @"kp_fmodf"\(', ir_text)
    assert len(uses) > len(build.kernels)  # several kernels, several uses each
    ptx = build.ptx.decode()
    bodies = re.findall(r"\.func[^;{}]*\bkp_fmodf\b[^;{}]*\{", ptx)
    assert len(bodies) == 1, bodies  # one definition, beside its forward declaration
    assert "__nv_fmodf" not in ptx  # inlined into the wrapper, nowhere else
    # float64's is not outlined (called, it cost a pointwise x % y 9% on the H200): every
    # kernel calls libdevice's own, which is inlined there
    assert "kp_fmod(" not in ptx and '@"kp_fmod"' not in ir_text
    assert len(re.findall(r'call double @"__nv_fmod"\(', ir_text)) > 1


def test_outlined_remainders_are_numpys() -> None:
    x = np.array([[10.0, -7.5, 1.0, 0.0, 3.25, -0.0], [2.5, 100.0, -1e-3, 7.0, -3.0, 1.5]],
                 dtype=np.float32)
    y = x.astype(np.float64) * 3.7
    a, b = Kernels(rowmod)(x, y)
    z = x % np.float32(1.5)
    assert_close(a, z - z.max(axis=1, keepdims=True), 0, "x % 1.5 - rowmax")
    assert_close(b, y // 0.25 + y % 0.25, 0, "y // 0.25 + y % 0.25")


def test_what_is_outlined() -> None:
    assert mathops.OUTLINED == frozenset({"fmodf"})
