"""kp.external checks the kernel arguments against the PTX entry's ``.param`` list: the driver
reads one argument pointer per declared parameter, so a shorter list is read out of bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.external_images import ptx_entry_params

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


def test_param_list_is_read_from_the_ptx() -> None:
    assert ptx_entry_params(PTX.encode(), "axpy") == [
        (".param .u64 x", 8), (".param .u64 y", 8), (".param .f32 a", 4), (".param .u32 n", 4)]
    assert ptx_entry_params(b".visible .entry k\n{ ret; }", "k") == []
    assert ptx_entry_params(b".visible .entry k()\n{ ret; }", "k") == []
    nvrtc = (b".visible .entry _Z1kPf(\n\t.param .u64 .ptr .align 1 _Z1kPf_param_0,\n"
             b"\t.param .align 8 .b8 _Z1kPf_param_1[16]\n)\n{ ret; }")
    assert [size for _, size in ptx_entry_params(nvrtc, "_Z1kPf")] == [8, 16]
    # the entry asked for, not a prefix of another one nor a commented-out one
    two = b"// .entry k(.param .u32 a)\n.entry kk(.param .u32 a)\n.entry k(.param .u64 b)\n"
    assert ptx_entry_params(two, "k") == [(".param .u64 b", 8)]
    assert ptx_entry_params(two, "missing") is None


def test_too_few_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"args: 3 kernel argument\(s\) for the PTX entry "
                                         r"'axpy', which declares 4 parameter\(s\)"):
        kp.external("p", "axpy", _params(), kp.cdiv("n", 256), 256, ptx=PTX,
                    targets=["sm_80"], args=["x", "y", "a"])


def test_too_many_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="5 kernel argument.*declares 4"):
        kp.external("p", "axpy", _params(), kp.cdiv("n", 256), 256, ptx=PTX,
                    targets=["sm_80"], args=["x", "y", "a", "n32", ("n", kp.i64)])


def test_default_arguments_must_match_too() -> None:
    params = [*_params(), kp.Scalar("extra", kp.i32)]
    with pytest.raises(ValueError, match="5 kernel argument"):
        kp.external("p", "axpy", params, 1, 32, ptx=PTX, targets=["sm_80"])


def test_a_width_mismatch_warns_and_a_match_is_silent(recwarn: pytest.WarningsRecorder) -> None:
    kp.external("p", "axpy", _params(), kp.cdiv("n", 256), 256, ptx=PTX, targets=["sm_80"])
    assert not [w for w in recwarn if "PTX entry" in str(w.message)]
    params = [*_params()[:2], kp.Scalar("a", kp.f64), _params()[3]]
    with pytest.warns(UserWarning, match=r"args\[2\]: scalar 'a' \(float64\) is 8 byte\(s\), "
                                         r"but the PTX entry 'axpy' declares '.param .f32 a'"):
        kp.external("p", "axpy", params, kp.cdiv("n", 256), 256, ptx=PTX, targets=["sm_80"])


@pytest.mark.parametrize("kind", ["ptx", "llvm_ir", "cuda"])
@pytest.mark.parametrize("source", ["", "  "])
def test_empty_source_text_is_named_not_read_as_the_current_directory(kind: str,
                                                                      source: str) -> None:
    with pytest.raises(ValueError, match=f"{kind} is empty"):
        kp.external("p", "axpy", _params(), 1, 32, targets=["sm_80"], **{kind: source})


def _axpy_cubin() -> bytes:
    c = kp.external("p", "axpy", _params(), 1, 32, ptx=PTX, targets=["sm_90"])
    return c.modules[0].images[0].data


def test_cubin_parameter_info_is_read() -> None:
    from kernelpack.external_images import cubin_entry_params

    data = _axpy_cubin()
    assert [size for _, size in cubin_entry_params(data, "axpy")] == [8, 8, 4, 4]
    assert cubin_entry_params(data, "axp") is None  # no such kernel: nothing to check
    assert cubin_entry_params(data[:300], "axpy") is None


def test_cubin_arguments_are_checked_like_ptx_ones() -> None:
    data = _axpy_cubin()
    with pytest.raises(ValueError, match=r"args: 2 kernel argument\(s\) for the kernel 'axpy' "
                                         r"of the cubin for sm_90, which declares 4"):
        kp.external("p", "axpy", _params(), 1, 32, cubin=data, targets=["sm_90"],
                    args=["x", "y"])
    params = [*_params()[:2], kp.Scalar("a", kp.f16), _params()[3]]
    with pytest.warns(UserWarning, match=r"args\[2\]: scalar 'a' \(float16\) is 2 byte\(s\)"):
        kp.external("p", "axpy", params, 1, 32, cubin={"sm_90": data})
    ok = kp.external("p", "axpy", _params(), 1, 32, cubin=data, targets=["sm_90"])
    assert ok.modules[0].images[0].data == data
