"""Review 4 of kp.external's argument check: ``cuda=`` sources are checked like ``ptx=`` ones
(per cubin and per PTX image NVRTC made), PTX ``.param`` lists are read by directive (not by
word), a float meeting an integer ``.param`` (or the reverse) warns while every correct
declaration stays silent, and a cubin kernel without parameters is known to have none."""

from __future__ import annotations

import warnings

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.external_images import cubin_entry_params, ptx_entry_params

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

HDR = ".version 8.0\n.target sm_80\n.address_size 64\n"
X = kp.Tensor("x", kp.f32, ["n"], role="inout")


def _silent(entry: str, params: list, ptx: str, **kw: object) -> kp.Compiled:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return kp.external("p", entry, params, 1, 32, ptx=HDR + ptx, targets=["sm_80"], **kw)


def test_directives_written_together_are_read() -> None:
    ptx = ".visible .entry k(.param.u64 x, .param.u32 n) { ret; }"
    assert ptx_entry_params(ptx.encode(), "k") == [(".param.u64 x", 8), (".param.u32 n", 4)]
    with pytest.raises(ValueError, match=r"1 kernel argument\(s\) for the PTX entry 'k', which "
                                         r"declares 2"):
        kp.external("p", "k", [X], 1, 32, ptx=HDR + ptx, targets=["sm_80"])


def test_a_parameter_name_is_not_a_type() -> None:
    ptx = ".visible .entry k(.param .u64 xf32, .param .align 8 .b8 s_u32[8]) { ret; }"
    assert [size for _, size in ptx_entry_params(ptx.encode(), "k")] == [8, 8]
    with pytest.raises(ValueError, match="declares 2"):
        kp.external("p", "k", [X], 1, 32, ptx=HDR + ptx, targets=["sm_80"])


@pytest.mark.parametrize("decl, dtype", [
    (".param .s32 n", kp.u32), (".param .u32 n", kp.i32), (".param .b32 n", kp.f32),
    (".param .b32 n", kp.i32), (".param .u8 n", kp.bool_), (".param .f64 n", kp.f64),
    (".param .align 2 .b8 n[2]", kp.f16), (".param .align 8 .b8 n[8]", kp.u64),
    (".param .b16 n", kp.bf16), (".param .s64 n", kp.i64)])
def test_correct_declarations_are_silent(decl: str, dtype: kp.DType) -> None:
    ptx = f".visible .entry k(.param .u64 .ptr .global .align 16 x, {decl}) {{ ret; }}"
    _silent("k", [X, kp.Scalar("n", dtype)], ptx)


@pytest.mark.parametrize("decl, dtype, said", [
    (".param .u32 n", kp.f32, "is a float, but the PTX entry 'k' declares '.param .u32 n'"),
    (".param .f32 n", kp.i32, "is an integer, but the PTX entry 'k' declares '.param .f32 n'"),
    (".param .s64 n", kp.f64, "is a float"), (".param .f64 n", kp.u64, "is an integer")])
def test_a_float_for_an_integer_parameter_warns(decl: str, dtype: kp.DType, said: str) -> None:
    ptx = f".visible .entry k(.param .u64 x, {decl}) {{ ret; }}"
    with pytest.warns(UserWarning, match=r"args\[1\]: scalar 'n' .*" + said):
        kp.external("p", "k", [X, kp.Scalar("n", dtype)], 1, 32, ptx=HDR + ptx,
                    targets=["sm_80"])


def test_a_buffer_for_a_float_parameter_warns() -> None:
    with pytest.warns(UserWarning, match=r"args\[0\]: buffer 'x'.*is an integer"):
        kp.external("p", "k", [X], 1, 32, ptx=HDR + ".entry k(.param .f64 x) { ret; }",
                    targets=["sm_80"])


def test_a_cubin_kernel_without_parameters_takes_no_arguments() -> None:
    c = _silent("k", [], ".visible .entry k { ret; }")
    data = c.modules[0].images[0].data
    assert cubin_entry_params(data, "k") == []
    assert kp.external("p", "k", [], 1, 32, cubin={"sm_80": data}).modules[0].kernels == ("k",)
    with pytest.raises(ValueError, match=r"1 kernel argument\(s\) for the kernel 'k' of the "
                                         r"cubin for sm_80, which declares 0"):
        kp.external("p", "k", [X], 1, 32, cubin={"sm_80": data})


def _nvrtc() -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings' NVRTC module missing")
    from kernelpack.toolchain import nvrtc

    try:
        nvrtc.toolchain_id()
    except CompileError as exc:
        pytest.skip(f"NVRTC missing (kernelpack[compile]): {exc}")


SRC = r"""
extern "C" __global__ void scale(float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
namespace ops { __global__ void twice(float* x, unsigned n) { x[n] *= 2.0f; } }
"""
A, N = kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")


@pytest.mark.parametrize("targets, image", [(["sm_80"], "cubin for sm_80"),
                                            (["compute_80"], "ptx for compute_80")])
def test_cuda_arguments_are_counted(targets: list, image: str) -> None:
    _nvrtc()
    with pytest.raises(ValueError, match=rf"2 kernel argument\(s\) for the kernel 'scale' of "
                                         rf"the {image}, which declares 3"):
        kp.external("p", "scale", [X, A], 1, 32, cuda=SRC, targets=targets)
    with pytest.raises(ValueError, match=r"3 kernel argument\(s\) for the kernel "
                                         r"'_ZN3ops5twiceEPfj' .*declares 2"):
        kp.external("p", "ops::twice", [X, A, N], 1, 32, cuda=SRC, targets=targets)


def test_cuda_widths_warn_and_correct_declarations_are_silent() -> None:
    _nvrtc()
    with pytest.warns(UserWarning, match=r"args\[1\]: scalar 'a' \(float64\) is 8 byte\(s\), "
                                         r"but the kernel 'scale' of the cubin for sm_80"):
        kp.external("p", "scale", [X, kp.Scalar("a", kp.f64), N], 1, 32, cuda=SRC,
                    targets=["sm_80"])
    with warnings.catch_warnings(record=True) as seen:  # once, not once per image
        warnings.simplefilter("always")
        kp.external("p", "scale", [X, kp.Scalar("a", kp.i32), N], 1, 32, cuda=SRC,
                    targets=["sm_80", "sm_90", "ptx"])
    assert [str(w.message) for w in seen] == [
        "kp.external: args[1]: scalar 'a' (int32) is an integer, but the kernel 'scale' of the "
        "ptx for compute_80 declares '.param .f32 scale_param_1': a launch passes the kernel "
        "its bits as a float"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = kp.external("p", "scale", [X, A, N], 1, 32, cuda=SRC, targets=["sm_80", "ptx"])
        kp.external("p", "ops::twice", [X, N], 1, 32, cuda=SRC, targets=["sm_80", "ptx"])
    assert [i.target for i in c.modules[0].images] == ["sm_80", "compute_80"]
