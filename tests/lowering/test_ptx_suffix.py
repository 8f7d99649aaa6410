"""One PTX serves every cubin of a compile and its "ptx" image: with ``sm_90a`` among targets
that span architectures it used to be emitted for ``sm_90a``, and nvJitLink refused to make
an ``sm_100`` cubin of it ("cannot be compiled to future architecture")."""

from __future__ import annotations

import kernelpack as kp

T = kp.Tensor


@kp.fusion
def axpy2(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return 2.0 * x + y


def test_arch_specific_lowest_target_among_others() -> None:
    c = kp.compile(axpy2, targets=["sm_90a", "sm_100", "ptx"])
    images = [(i.kind, i.target) for i in c.modules[0].images]
    assert images == [("cubin", "sm_90a"), ("cubin", "sm_100"), ("ptx", "compute_90")]


def test_a_single_arch_specific_target_keeps_its_suffix() -> None:
    c = kp.compile(axpy2, targets=["sm_90a", "ptx"])
    assert [(i.kind, i.target) for i in c.modules[0].images] == [("cubin", "sm_90a"),
                                                                ("ptx", "compute_90a")]
