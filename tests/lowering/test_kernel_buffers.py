"""Each kernel takes only the buffers its code uses (``irutil.drop_unused_arguments``).

Before session 38 every kernel took every input tensor of its program, used or not, so the
summary could not say which inputs a kernel reads, and the runtime's in-place rule
(runtime/in_place.py) refused an output stored by an earlier kernel over *any* input of the
program (``x * 2, y.sum()`` with ``out=(x, s)``: the sum's kernels were given ``x``). Here:
the IR's parameters and the summary's launch arguments agree, kernel by kernel; an unused
input is dropped and a used one never is; and the in-place calls the finer rule now allows
give the separate-buffer bits on the emulator, thread by thread in both orders (review 48's
runner).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

import kernelpack as kp
from kernelpack.errors import ConstraintError
from kernelpack.lowering import pipeline
from kernelpack.lowering.irutil import I64, drop_unused_arguments
from kernelpack.lowering.kernels import signature
from kernelpack.runtime.binding import BoundSummary

from .fusion_gen import generate
from .simt import Kernels
from .test_review48_in_place import allowed_pairs, wrong_in_place

T = kp.Tensor


def _build(f, static=None) -> pipeline.Build:
    return pipeline.run(pipeline.new_build(f, ["sm_80"], static, {}), stop="llvm_ir")


def _buffer_args(summary: kp.KernelSummary) -> dict[str, list[str]]:
    """Each launched kernel's buffer arguments, by kernel name (one entry per kernel)."""
    out: dict[str, list[str]] = {}
    for variant in summary.variants:
        for launch in variant.launches:
            names = [a.name for a in launch.args if a.kind == "buffer"]
            assert out.setdefault(launch.kernel, names) == names, launch.kernel
    return out


_DEFINE = re.compile(r'^define ptx_kernel void @"([^"]+)"\((.*)\)', re.M)


def _ir_buffers(text: str) -> dict[str, list[str]]:
    """Each kernel's pointer parameters' names, from the module's text."""
    return {name: re.findall(r'ptr noalias %"([^"]+)"', params)
            for name, params in _DEFINE.findall(text)}


def _agree(b: pipeline.Build) -> dict[str, list[str]]:
    summary = pipeline.summarize(b).summary
    launched, emitted = _buffer_args(summary), _ir_buffers(b.ir)
    assert set(launched) <= set(emitted)
    for kernel, names in launched.items():
        assert emitted[kernel] == names, kernel
    return launched


# ---- the IR helper -----------------------------------------------------------------------------

def _function_with_uses() -> tuple[ir.Module, ir.Function]:
    """A kernel of four pointers: %a loaded, %b reaching a phi, %c unused, %d stored to."""
    module = ir.Module("m")
    module.triple = "nvptx64-nvidia-cuda"
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 4 + [I64]), "k")
    for arg, name in zip(fn.args, "abcdn"):
        arg.name = name
    a, b_, c, d, n = fn.args
    entry, other, join = (fn.append_basic_block(x) for x in ("entry", "other", "join"))
    bld = ir.IRBuilder(entry)
    cond = bld.icmp_signed(">", n, ir.Constant(I64, 0))
    bld.cbranch(cond, join, other)
    bld.position_at_end(other)
    bld.branch(join)
    bld.position_at_end(join)
    ptr = bld.phi(ir.PointerType())
    ptr.add_incoming(a, entry)
    ptr.add_incoming(b_, other)
    value = bld.load(ptr, typ=I64)
    bld.store(value, d)
    bld.ret_void()
    module.add_named_metadata("nvvm.annotations", [fn, ir.MetaDataString(module, "kernel"),
                                                   ir.Constant(ir.IntType(32), 1)])
    return module, fn


def test_drop_unused_arguments_keeps_every_use_and_the_module_parses():
    module, fn = _function_with_uses()
    a, b_, c, d, n = fn.args
    assert drop_unused_arguments(fn, [a, b_, c, d]) == [c]
    assert [x.name for x in fn.args] == ["a", "b", "d", "n"]
    assert len(fn.ftype.args) == 4
    text = str(module)
    assert 'define void @"k"(ptr %"a", ptr %"b", ptr %"d", i64 %"n")' in text
    assert "void (ptr, ptr, ptr, i64)* @\"k\"" in text  # the metadata's function type too
    llvm.parse_assembly(text).verify()


def test_drop_unused_arguments_drops_only_what_it_is_given():
    module, fn = _function_with_uses()
    a, b_, c, d, n = fn.args
    assert drop_unused_arguments(fn, [a, d]) == []
    assert len(fn.args) == 5
    assert drop_unused_arguments(fn, [c, n]) == [c]  # n is used by the compare
    llvm.parse_assembly(str(module)).verify()


# ---- the lowering ------------------------------------------------------------------------------

@kp.fusion
def kb_double_and_other_sum(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y.sum()


@kp.fusion
def kb_double_and_range(x: T[kp.f32, "n"]):
    return x * 2, kp.arange(x.shape[0] + 1)


@kp.fusion
def kb_unread(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x + 1


@kp.fusion
def kb_softmax_and_scale(x: T[kp.f32, "n", "m"], w: T[kp.f32, "m"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), w * 3


def test_each_kernel_takes_only_what_it_reads_or_stores():
    launched = _agree(_build(kb_double_and_other_sum))
    by_kind = {k.rsplit("_", 1)[-1]: v for k, v in launched.items()}
    assert by_kind["pointwise"] == ["out0", "x"]
    partials = [v for k, v in launched.items() if "partial" in k]
    assert partials and all("x" not in v and "y" in v for v in partials)
    finals = [v for k, v in launched.items() if "out1" in v]
    assert finals and all("x" not in v and "y" not in v for v in finals)


def test_an_input_no_kernel_reads_is_in_no_launch_but_still_checked():
    summary = pipeline.summarize(_build(kb_unread)).summary
    assert _buffer_args(summary) and all("y" not in v for v in _buffer_args(summary).values())
    k = Kernels(kb_unread)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(k(x, np.zeros(5, np.float32))[0], x + 1)
    with pytest.raises(ConstraintError):
        k.planner.plan((5,), (6,))  # y's shape still binds n


@pytest.mark.parametrize("f", [kb_double_and_other_sum, kb_double_and_range, kb_unread,
                               kb_softmax_and_scale])
def test_the_ir_and_the_summary_agree(f):
    _agree(_build(f))


@pytest.mark.parametrize("seed", [3, 17, 40, 77, 105, 150])
def test_the_ir_and_the_summary_agree_for_random_fusions(seed):
    _agree(_build(generate(seed, "emulator").fusion))


# ---- what the runtime now allows in place -----------------------------------------------------

@pytest.mark.parametrize("f, inputs, pair", [
    (kb_double_and_other_sum, lambda: [np.linspace(-1, 1, 70, dtype=np.float32),
                                       np.linspace(0, 3, 70, dtype=np.float32)], ("out0", "x")),
    (kb_double_and_range, lambda: [np.linspace(-1, 1, 9000, dtype=np.float32)], ("out0", "x")),
    (kb_softmax_and_scale, lambda: [np.linspace(-4, 4, 3 * 300, dtype=np.float32)
                                    .reshape(3, 300), np.ones(300, np.float32)], ("out0", "x")),
    (kb_softmax_and_scale, lambda: [np.linspace(-4, 4, 3 * 300, dtype=np.float32)
                                    .reshape(3, 300), np.ones(300, np.float32)], ("out1", "w")),
])
def test_in_place_beside_kernels_that_never_read_the_input_is_allowed_and_right(f, inputs, pair):
    k = Kernels(f)
    args = inputs()
    plan = k.planner.plan(*[a.shape for a in args])
    assert len(plan.launches) >= 2, plan.launches
    assert pair not in BoundSummary(k.summary).in_place_refused(plan.variant)
    pairs, _ = allowed_pairs(k, args)
    assert pair in pairs
    assert not list(wrong_in_place(k, args, [pair]))


def test_in_place_where_another_kernel_reads_the_input_is_still_refused():
    @kp.fusion
    def kb_double_and_sum(x: T[kp.f32, "n"]):
        return x * 2, x.sum()

    k = Kernels(kb_double_and_sum)
    plan = k.planner.plan((9000,))
    assert ("out0", "x") in BoundSummary(k.summary).in_place_refused(plan.variant)


def _padded_sums(count: int) -> kp.fusion:
    """``count`` row sums of ``x`` padded by ``m + i``, each added back to ``x``: the last
    kernel reads every sum's workspace, so its signature has ``2 * count + 5`` parameters,
    one of which (an input its body never reads) is dropped when it is emitted."""

    @kp.fusion
    def padded_sums(x: T[kp.float32, "b", "n"], m: kp.i64):
        acc = x
        for i in range(count):
            acc = acc + kp.pad(x, m + i, axis=-1).sum(axis=-1, keepdims=True)
        return acc

    return padded_sums


def test_a_kernel_past_the_argument_limit_is_refused_before_the_module_is_emitted():
    """``llvm_ir`` refuses a launch past ``MAX_ARGS`` (512) before it emits ~500 kernels
    (and before LLVM and nvJitLink spend minutes on them): 255 sums need 514 arguments as
    emitted. The count is the emitted kernel's, not its signature's."""
    b = pipeline.run(pipeline.new_build(_padded_sums(255), ["sm_80"], None, {}),
                     stop="schedule")
    with pytest.raises(kp.TraceError, match=r"padded_sums.*514 arguments exceed 512"):
        pipeline.run(b, start="llvm_ir", stop="llvm_ir")


def test_a_signature_past_the_limit_whose_kernel_drops_a_buffer_is_not_refused():
    """254 sums: the widest signature has 513 parameters but its kernel keeps 512, which the
    format takes; the early check emits that kernel alone to count what it keeps."""
    b = pipeline.run(pipeline.new_build(_padded_sums(254), ["sm_80"], None, {}),
                     stop="schedule")
    pipeline._check_arguments(b)  # no error
    widths = [sum(map(len, signature(b.graph, spec, dict(b.scratch))))
              + len(pipeline.symbols_of(b.graph))
              for st in b.stages for alt in st.alternatives for spec in alt.kernels]
    assert max(widths) == 513
