"""The compiled-code data model and target lists refuse misuse when built, naming the field,
instead of failing later (at save, or with an AttributeError) or silently changing it."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack.compiled import Compiled, Image, Module
from kernelpack.targets import Arch, parse_target_list


def _image() -> Image:
    return Image("cubin", "sm_80", b"\x7fELF")


def _summary() -> kp.KernelSummary:
    return kp.KernelSummary("p", (), (kp.Variant((kp.Launch("k", "m", 1, 1, ()),)),))


@pytest.mark.parametrize("ptx", ["PTX", " ptx ", "Ptx"])
def test_ptx_target_is_spelled_as_freely_as_sm(ptx: str) -> None:
    assert parse_target_list(["SM_80", ptx]) == ([Arch(8, 0)], True)
    with pytest.raises(ValueError, match="targets name no architecture"):
        parse_target_list([ptx])


def test_image_arch_must_be_a_target() -> None:
    with pytest.raises(TypeError, match="image arch must be a target such as 'sm_90'"):
        Image("cubin", 80, b"")  # type: ignore[arg-type]
    assert Image("cubin", Arch(9, 0), b"").target == "sm_90"


def test_module_kernels_must_be_a_list_of_names() -> None:
    with pytest.raises(TypeError, match="kernels must be a list of entry names"):
        Module("m", "axpy", (_image(),))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kernel entry names must be str"):
        Module("m", [1], (_image(),))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="images must be kp.Image"):
        Module("m", ["k"], [b"\x7fELF"])  # type: ignore[list-item]
    assert Module("m", ["k", "k"], (_image(),)).kernels == ("k",)


def test_compiled_needs_a_summary_and_modules() -> None:
    with pytest.raises(TypeError, match="summary must be a kp.KernelSummary"):
        Compiled("p", ())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="modules must be kp.Module"):
        Compiled(_summary(), ("m",))  # type: ignore[arg-type]
    c = Compiled(_summary(), (Module("m", ["k"], (_image(),)),))
    assert kp.load(kp.save(c))["p"].summary == c.summary


def test_summary_lists_refuse_wrong_items_naming_the_field() -> None:
    """A str where a list belongs was iterated into letters; a wrong item failed later with
    an AttributeError from check()."""
    x = kp.Tensor("x", kp.f32, ("n",))
    launch = kp.Launch("k", "m", (1,), (1,), ())
    with pytest.raises(TypeError, match=r"launch 'k': args must be a list of kp.Arg"):
        kp.Launch("k", "m", (1,), (1,), "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"launch 'k': args\[1\] must be a kp.Arg \(got 'x'\)"):
        kp.Launch("k", "m", (1,), (1,), (kp.Arg.buffer("x"), "x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"variant launches\[0\] must be a kp.Launch"):
        kp.Variant(("k",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"variant scratch\[0\] must be a kp.Scratch"):
        kp.Variant((launch,), ("w",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"program 'p': params\[0\] must be a kp.Tensor or "
                                        r"kp.Scalar"):
        kp.KernelSummary("p", ("x",), (kp.Variant((launch,)),))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"program 'p': variants\[0\] must be a kp.Variant"):
        kp.KernelSummary("p", (x,), ("v",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"program 'p': constraints\[0\] must be a "
                                        r"kp.Constraint"):
        kp.KernelSummary("p", (x,), (kp.Variant((launch,)),), ("n > 0",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="constraint message must be a str"):
        kp.Constraint(kp.sym("n") > 0, 3)  # type: ignore[arg-type]
    ok = kp.KernelSummary("p", [x], [kp.Variant([launch])], [kp.Constraint(kp.sym("n") > 0)])
    assert ok.params == (x,) and ok.variants[0].launches == (launch,)
