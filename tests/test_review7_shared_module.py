"""Two ``kp.external`` programs built from one CUDA C source with two kernels, both naming
module ``"ops"``: each module lists only its own entry, so ``kp.save`` refused them as "two
different modules". Same images, other entries: one module holding both entries now, stored
once, whatever the order of the programs."""

from __future__ import annotations

import pytest

import kernelpack as kp

TWO = ('extern "C" __global__ void ka(float* x, unsigned n) { if (threadIdx.x < n) x[0] = 1; }\n'
       'extern "C" __global__ void kb(float* x, unsigned n) { if (threadIdx.x < n) x[0] = 2; }\n')


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"], role="inout"), kp.Scalar("n32", kp.u32, value="n")]


def _prog(name: str, kernel: str) -> kp.Compiled:
    return kp.external(name, kernel, _params(), kp.cdiv("n", 128), 128, cuda=TWO,
                       module="ops", targets=["sm_80"])


def test_two_programs_of_one_source_share_its_module() -> None:
    pa, pb = _prog("pa", "ka"), _prog("pb", "kb")
    data = kp.save([pa, pb])
    pack = kp.load(data)
    assert list(pack.modules) == ["ops"] and pack.modules["ops"].kernels == ("ka", "kb")
    assert pack.programs == ["pa", "pb"]
    assert kp.save([pb, pa]) == data  # the order of the programs does not matter
    for name in ("pa", "pb"):
        pack[name].modules  # every launch finds its kernel in the module


def test_other_images_under_one_name_are_still_refused() -> None:
    other = kp.external("pc", "ka", _params(), kp.cdiv("n", 128), 128,
                        cuda=TWO.replace("= 1", "= 3"), module="ops", targets=["sm_80"])
    with pytest.raises(ValueError, match="two different modules are named 'ops'"):
        kp.save([_prog("pa", "ka"), other])
