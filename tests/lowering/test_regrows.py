"""Register-held rows (:mod:`kernelpack.lowering.regrows`): which elements lie in the row.

Kernels with 4 or more 16-byte chunks per thread that are bounded for more resident threads
than the default (``KernelSpec.min_threads > MIN_THREADS_PER_SM``: softmax's groups from 2048
elements on) test a chunk's place as ``length - lane0 > offset`` (one value for all chunks)
instead of ``lane0 + offset < length`` (a 64-bit value per chunk, which LLVM hoists out of the
row loop). Both forms must give the same elements: the
emulator runs each group at full rows, at rows whose last chunks are empty, and at ragged rows
(the scalar body); and the 8192-element group must assemble without spills within the bound
that gives it three rows per SM (notes/row-perf.md, session 51).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline, regrows, tuning
from kernelpack.lowering.workloads import REFERENCES, make
from kernelpack.targets import parse_arch
from kernelpack.toolchain.nvjitlink import resource_usage

from .simt import Kernels, assert_close
from .test_compile import _entry

F32, F64 = make(kp.float32), make(kp.float64)
TOL = {kp.float32: 2e-6, kp.float64: 1e-13}


def _ptx(fusion: kp.fusion) -> str:
    return pipeline.run(pipeline.new_build(fusion, ["sm_90"], None, {}), stop="ptx").ptx.decode()


def _resources(ptx: str) -> dict[str, tuple[int, int]]:
    return resource_usage(ptx, parse_arch("sm_90"))


def test_the_8192_group_holds_three_rows_per_sm_without_spills():
    ptx = _ptx(F32["softmax"])
    name = "softmax_float32_0_rowblock256x32"
    head = _entry(ptx, name)[:600]
    assert ".maxntid 256" in head and ".minnctapersm 3" in head, head
    resources = _resources(ptx)
    regs, spill = resources[name]
    assert regs * 256 * 3 <= 65536 and spill == 0, (regs, spill)
    # nor do the other groups that take the remaining-length form
    for group in ("rowblock256x16", "rowblock128x16"):
        assert resources[f"softmax_float32_0_{group}"][1] == 0, resources


def test_only_kernels_bounded_for_more_rows_take_the_remaining_length_form():
    """The comparison each form leaves in the PTX: `setp` against the row length per chunk
    (layernorm's light rows, the default bound), or against constants (softmax's groups)."""
    lean = [t for t in tuning.REG_GROUPS if t[1] >= 4 and t[3] > tuning.MIN_THREADS_PER_SM]
    assert [(t[2], 4 * t[1]) for t in lean] == [(128, 16), (256, 16), (256, 32)]
    assert all(len(t) == 3 for t in tuning.REG_GROUPS_LIGHT)  # layernorm: the default bound
    ptx = _ptx(F32["softmax"])
    soft = _entry(ptx, "softmax_float32_0_rowblock256x32")
    short = _entry(ptx, "softmax_float32_0_rowblock128x8")  # 2 chunks: the first form
    norm = _entry(_ptx(F32["layernorm"]), "layernorm_float32_0_rowblock256x32")
    # the remaining length against the chunks' offsets: 0, 1024, ..., 7168 elements (x4: bytes
    # are not compared; offsets are elements)
    against_constants = re.findall(r"setp\.\w+\.s64\s+%p\d+, %rd\d+, (\d+);", soft)
    assert {int(c) for c in against_constants} >= {1024 * s for s in range(1, 8)}, soft[:3000]
    against_length = re.findall(r"setp\.\w+\.s64\s+%p\d+, %rd\d+, %rd\d+;", norm)
    assert len(against_length) >= 8, norm[:3000]
    assert len(re.findall(r"setp\.\w+\.s64\s+%p\d+, %rd\d+, %rd\d+;", short)) >= 2


# rows at a group's full capacity, with empty chunks at the end, and ragged (the scalar body):
# the warp groups (<= 128, <= 256), the blocks of 64/128 (<= 512, <= 1024), 128 x 16 (<= 2048),
# 256 x 16 (<= 4096) and 256 x 32 (<= 8192)
LENGTHS = [128, 100, 97, 256, 132, 512, 300, 1024, 520, 1021, 2048, 1028, 4096, 2052, 8192,
           4100, 8190]


@pytest.mark.parametrize("n", LENGTHS)
def test_softmax_rows_of_every_group_match_numpy(n):
    rows = 2 if n <= 2048 else 1
    x = np.random.default_rng(n).standard_normal((rows, n)).astype(np.float32) * 4
    ref = REFERENCES["softmax"](x.astype(np.float64))
    assert_close(Kernels(F32["softmax"])(x)[0], ref, TOL[kp.float32], f"softmax ({rows}, {n})")


@pytest.mark.parametrize("n", [512, 300, 1021, 2048, 1028, 4096, 2050])
def test_float64_softmax_rows_match_numpy(n):
    """The float64 groups (REG_GROUPS_WIDE) are bounded for 1024 resident threads: those of 4
    chunks per thread (513..4096 elements) take the remaining-length form too."""
    x = np.random.default_rng(n).standard_normal((2, n)) * 4
    ref = REFERENCES["softmax"](x)
    assert_close(Kernels(F64["softmax"])(x)[0], ref, TOL[kp.float64], f"softmax f64 (2, {n})")


def test_a_misaligned_view_takes_the_scalar_body_with_the_same_answer():
    base = np.random.default_rng(5).standard_normal(2 * 4099 + 1).astype(np.float32)
    x = base[1:].reshape(2, 4099)  # 4-byte aligned only, and ragged
    ref = REFERENCES["softmax"](x.astype(np.float64))
    assert_close(Kernels(F32["softmax"])(x)[0], ref, TOL[kp.float32], "misaligned (2, 4099)")


def test_min_threads_is_what_decides(monkeypatch):
    """With the bound raised past every group's, softmax's kernels take the first form again
    (and still compute the same rows): the switch is the kernel's bound, nothing else."""
    monkeypatch.setattr(regrows, "MIN_THREADS_PER_SM", 1 << 20)
    soft = _entry(_ptx(F32["softmax"]), "softmax_float32_0_rowblock256x32")
    assert len(re.findall(r"setp\.\w+\.s64\s+%p\d+, %rd\d+, %rd\d+;", soft)) >= 8
    x = np.random.default_rng(3).standard_normal((1, 6001)).astype(np.float32)
    assert_close(Kernels(F32["softmax"])(x)[0], REFERENCES["softmax"](x.astype(np.float64)),
                 TOL[kp.float32], "first form (1, 6001)")
