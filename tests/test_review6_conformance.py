"""Review 6: DESIGN.md / FORMAT.md conformance of the public model, kp.save and the loader.

Each test failed before its fix:

* ``kp.Module`` given generators kept no kernels / reported "no image" (the checks consumed
  the generator before it was stored);
* ``kp.save([pack["name"]])`` (a loaded program) was a TypeError although ``pack.compiled``
  gives the same thing;
* ``ptx_isa`` on a cubin was written although the schema keeps it for PTX images only, and the
  loader reported it instead of ignoring it (FORMAT.md §7);
* ``parse_arch`` accepted non-ASCII digits (``sm_٩٠`` parsed as sm_90).
"""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack.targets import parse_arch


def _summary(name: str = "p") -> kp.KernelSummary:
    n = kp.sym("n")
    launch = kp.Launch("k", "m", (kp.cdiv(n, 128), 1, 1), (128, 1, 1),
                       [kp.Arg("buffer", "x"), kp.Arg("value", value=n, dtype=kp.i32)])
    return kp.KernelSummary(name, params=[kp.Tensor("x", kp.f32, ["n"])],
                            variants=[kp.Variant([launch])])


def _module(images: object = None) -> kp.Module:
    if images is None:
        images = [kp.Image("cubin", "sm_90", b"\x7fELF" + bytes(60))]
    return kp.Module("m", ["k"], images)  # type: ignore[arg-type]


def test_module_keeps_kernels_and_images_given_as_generators() -> None:
    images = [kp.Image("cubin", "sm_90", b"a"), kp.Image("ptx", "sm_80", b"b", ptx_isa=(8, 0))]
    module = kp.Module("m", (k for k in ["k2", "k"]), (i for i in images))
    assert module.kernels == ("k", "k2")
    assert [i.target for i in module.images] == ["sm_90", "compute_80"]
    compiled = kp.Compiled(_summary(), [kp.Module("m", iter(["k"]), iter(images))])
    assert kp.load(kp.save([compiled])).modules["m"].kernels == ("k",)


@pytest.mark.parametrize("kernels, images, field", [
    (None, [], "kernels"),
    (["k"], kp.Image("cubin", "sm_90", b"a"), "images"),
    (["k"], b"cubin bytes", "images"),
])
def test_module_refuses_non_list_fields_naming_them(kernels: object, images: object,
                                                     field: str) -> None:
    with pytest.raises(TypeError, match=f"module 'm': {field} must be a list"):
        kp.Module("m", kernels, images)  # type: ignore[arg-type]


def test_save_takes_loaded_programs() -> None:
    other = kp.Compiled(_summary("q"), [_module()])
    pack = kp.load(kp.save([kp.Compiled(_summary(), [_module()]), other]))
    one = kp.save([pack["p"]])
    assert one == kp.save([pack.compiled("p")])
    assert kp.load(one).programs == ["p"]
    assert kp.save(pack["q"]) == kp.save([other])
    assert kp.save([pack["p"], pack["q"]]) == kp.save(pack)
    with pytest.raises(TypeError, match="got int"):
        kp.save([pack["p"], 3])


def test_save_refuses_ptx_isa_on_a_cubin() -> None:
    image = kp.Image("cubin", "sm_90", b"\x7fELF", ptx_isa=(8, 0))
    with pytest.raises(ValueError, match=r"image sm_90: ptx_isa applies to PTX images only"):
        kp.save([kp.Compiled(_summary(), [_module([image])])])


def test_loader_ignores_ptx_isa_on_a_cubin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written by another writer may carry ptx_isa on a cubin: FORMAT.md §7 says a
    reader ignores it there (the runtime never reads it for cubins)."""
    from kernelpack import serializer

    image = kp.Image("cubin", "sm_90", b"\x7fELF", ptx_isa=(8, 0))
    compiled = kp.Compiled(_summary(), [_module([image])])
    monkeypatch.setattr(serializer, "_check_image", lambda module, image: None)
    data = kp.save([compiled])
    pack = kp.load(data)
    (info,) = pack.modules["m"].images
    assert info.kind == "cubin" and info.ptx_isa is None
    assert pack.compiled("p").modules[0].images[0].ptx_isa is None
    pack.verify()


@pytest.mark.parametrize("text", ["sm_\u0669\u0660", "compute_\u0668\u0660", "sm_\uff19\uff10"])
def test_parse_arch_takes_ascii_digits_only(text: str) -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        parse_arch(text)
    with pytest.raises(ValueError, match="not a GPU architecture"):
        kp.Image("cubin", text, b"")


def test_parse_arch_still_takes_documented_spellings() -> None:
    assert [str(parse_arch(t)) for t in ("sm_90", "SM_90a", " sm_100f ", "compute_80")] == [
        "sm_90", "sm_90a", "sm_100f", "sm_80"]


def test_pack_programs_and_modules_cannot_be_changed_through_the_views() -> None:
    """``pack.programs`` / ``pack.modules`` were the pack's own list and dict: appending a name
    broke ``kp.save(pack)``, popping a module made its program fail with a FormatError saying
    the file does not contain it."""
    pack = kp.load(kp.save([kp.Compiled(_summary(), [_module()])]))
    names = pack.programs
    names.append("zz")
    assert pack.programs == ["p"] and len(pack) == 1 and list(pack) == ["p"]
    with pytest.raises(TypeError):
        del pack.modules["m"]  # type: ignore[attr-defined]
    assert list(pack.modules) == ["m"] and pack.modules["m"].kernels == ("k",)
    assert pack["p"].plan(x=(300,)).launches[0].grid == (3, 1, 1)
    assert kp.load(kp.save(pack)).programs == ["p"]
