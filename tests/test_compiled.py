"""Compiled code: images, modules and kp.Compiled validate themselves, naming the culprit."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack import compiled, summary
from kernelpack.compiled import Compiled, Image, Module
from kernelpack.summary import Arg, KernelSummary, Launch, Tensor, Variant
from kernelpack.targets import Arch


def _summary() -> KernelSummary:
    launch = Launch(kernel="k", module="m", grid=kp.cdiv("n", 256), block=256,
                    args=(Arg.buffer("x"), Arg.buffer("y")))
    return KernelSummary("prog", (Tensor("x", kp.f32, ["n"]),
                                  Tensor("y", kp.f32, ["n"], role="out")), (Variant((launch,)),))


def test_the_summary_module_still_names_the_compiled_classes() -> None:
    for name in ("Image", "Module", "Compiled", "IMAGE_KINDS"):
        assert getattr(summary, name) is getattr(compiled, name)
    assert kp.Image is Image and kp.Module is Module and kp.Compiled is Compiled
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        summary.Nope  # noqa: B018


def test_image_targets_and_validation() -> None:
    assert Image("cubin", "sm_90", b"\x7fELF").target == "sm_90"
    assert Image("ptx", Arch(8, 0), b".version 8.0").target == "compute_80"
    assert Image("host", "sm_90", b"o").target == "host-sm_90"
    with pytest.raises(ValueError, match="image kind must be one of"):
        Image("fatbin", "sm_90", b"")
    with pytest.raises(TypeError, match="image data must be bytes"):
        Image("cubin", "sm_90", "text")  # type: ignore[arg-type]
    assert "ELF" not in repr(Image("cubin", "sm_90", b"\x7fELF"))  # data stays out of reprs


def test_module_sorts_images_and_rejects_duplicates() -> None:
    images = (Image("ptx", "sm_80", b"p"), Image("cubin", "sm_90", b"b"),
              Image("cubin", "sm_80", b"a"))
    mod = Module("m", ("k", "j", "k"), images)
    assert mod.kernels == ("j", "k")
    assert [i.target for i in mod.images] == ["sm_80", "sm_90", "compute_80"]
    with pytest.raises(ValueError, match="two images for one target"):
        Module("m", ("k",), (Image("cubin", "sm_90", b"a"), Image("cubin", "sm_90", b"b")))
    with pytest.raises(ValueError, match="has no image"):
        Module("m", ("k",), ())
    with pytest.raises(ValueError, match="module name"):
        Module("m-1", ("k",), images)


def test_compiled_checks_modules_and_kernels() -> None:
    mod = Module("m", ("k",), (Image("cubin", "sm_90", b"a"),))
    compiled = Compiled(_summary(), (mod,))
    assert compiled.name == "prog" and compiled.origin == "compiled"
    with pytest.raises(ValueError, match="names module 'm', which is not included"):
        Compiled(_summary(), (Module("other", ("k",), mod.images),))
    with pytest.raises(ValueError, match=r"module 'm' has no kernel 'k' \(has \['j'\]\)"):
        Compiled(_summary(), (Module("m", ("j",), mod.images),))


def test_origin_is_one_of_the_four_kinds_of_provenance() -> None:
    """A misspelt origin read as a provenance nothing sets (reviews 70, 71: accepted)."""
    import dataclasses

    mod = Module("m", ("k",), (Image("cubin", "sm_90", b"a"),))
    for origin in compiled.ORIGINS:
        made = Compiled(_summary(), (mod,), origin=origin)
        assert made.origin == origin and made == Compiled(_summary(), (mod,))
    with pytest.raises(ValueError, match=r"program 'prog': origin must be one of 'compiled', "
                                         r"'disk', 'remote', 'external' \(got 'cache'\)"):
        Compiled(_summary(), (mod,), origin="cache")
    with pytest.raises(TypeError, match=r"origin must be a str, .* \(got NoneType\)"):
        dataclasses.replace(Compiled(_summary(), (mod,)), origin=None)  # type: ignore[arg-type]
    pack = kp.load(kp.save([Compiled(_summary(), (mod,))]))
    assert pack.compiled("prog").origin == "disk"
    with pytest.raises(ValueError, match=r"\(got 'Disk'\)"):
        pack.compiled("prog", origin="Disk")
