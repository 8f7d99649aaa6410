"""Image selection rules with fake device and driver values (no GPU)."""

from __future__ import annotations

import pytest

from kernelpack.errors import CompatibilityError
from kernelpack.runtime.selection import explain, max_ptx_isa, select_image
from kernelpack.summary import Image
from kernelpack.targets import Arch


def img(kind: str, arch: str, cuda: int = 13000, isa: tuple[int, int] | None = None) -> Image:
    if kind == "ptx" and isa is None:
        isa = (8, 0)
    return Image(kind, arch, b"x", "t", cuda, isa)


def chosen(images, device: str, driver: int | None = 13000) -> str:
    sel = select_image(images, device, driver)
    return f"{sel.chosen.kind} {sel.chosen.target}"


FULL = [img("cubin", "sm_80"), img("cubin", "sm_86"), img("cubin", "sm_90"),
        img("cubin", "sm_90a"), img("cubin", "sm_100f"), img("ptx", "sm_80")]


@pytest.mark.parametrize("device, expected", [
    ("sm_80", "cubin sm_80"),
    ("sm_86", "cubin sm_86"),
    ("sm_89", "cubin sm_86"),          # same major, highest lower minor
    ("sm_90", "cubin sm_90a"),         # exact arch-specific first
    ("sm_100", "cubin sm_100f"),
    ("sm_103", "cubin sm_100f"),       # family cubin on a later minor
    ("sm_120", "ptx compute_80"),      # another major: only PTX
])
def test_ranking(device: str, expected: str) -> None:
    assert chosen(FULL, device) == expected


def test_arch_specific_only_on_the_exact_chip() -> None:
    images = [img("cubin", "sm_90a"), img("ptx", "sm_90", isa=(8, 0))]
    assert chosen(images, "sm_90") == "cubin sm_90a"
    with pytest.raises(CompatibilityError, match="arch-specific cubin runs only on exactly 9.0"):
        select_image([img("cubin", "sm_90a")], "sm_91", 13000)


def test_exact_plain_beats_lower_minor_and_ptx() -> None:
    images = [img("ptx", "sm_86"), img("cubin", "sm_80"), img("cubin", "sm_86")]
    assert chosen(images, "sm_86") == "cubin sm_86"


def test_cubin_of_a_newer_minor_or_other_major_is_rejected() -> None:
    with pytest.raises(CompatibilityError) as info:
        select_image([img("cubin", "sm_86"), img("cubin", "sm_90")], "sm_80", 13000)
    text = str(info.value)
    assert "sm_80" in text and "CUDA 13.0 (13000)" in text
    assert "cubin sm_86: cubin needs compute capability >= 8.6" in text
    assert "cubin sm_90: a cubin runs only on 9.x devices" in text


def test_toolkit_newer_major_than_driver_is_dropped() -> None:
    images = [img("cubin", "sm_90", cuda=13050), img("ptx", "sm_80", cuda=12080)]
    assert chosen(images, "sm_90", 12080) == "ptx compute_80"
    # minor-version compatibility: 13.5 cubins on a 13.0 driver are fine
    assert chosen(images, "sm_90", 13000) == "cubin sm_90"
    with pytest.raises(CompatibilityError, match="built by CUDA 13.5, newer major"):
        select_image(images[:1], "sm_90", 12080)


def test_ptx_from_a_newer_toolkit_is_gated_by_its_isa_alone() -> None:
    """kp.compile's PTX is LLVM's (ISA 8.x) but records the nvJitLink that made the cubins
    (13.x): a CUDA 12 driver with no matching cubin used to be refused it."""
    ptx = img("ptx", "sm_80", cuda=13050, isa=(8, 0))
    assert chosen([img("cubin", "sm_90", cuda=13050), ptx], "sm_100", 12080) == "ptx compute_80"
    with pytest.raises(CompatibilityError, match="PTX ISA 8.1 is newer than the driver"):
        select_image([img("ptx", "sm_80", cuda=13050, isa=(8, 1))], "sm_90", 12000)
    # an 11.x driver loads nothing: cuLibraryLoadData is CUDA 12.0's (review 28)
    with pytest.raises(CompatibilityError, match="CUDA 11.8 predates cuLibraryLoadData"):
        select_image([ptx], "sm_90", 11080)
    # without a recorded ISA the toolkit's major still decides
    with pytest.raises(CompatibilityError, match="built by CUDA 13.5, newer major"):
        select_image([Image("ptx", "sm_80", b"x", "t", 13050, None)], "sm_90", 12080)


def test_ptx_isa_gate() -> None:
    assert max_ptx_isa(13000) == (9, 0)
    assert max_ptx_isa(12040) == (8, 4)
    assert max_ptx_isa(12070) == (8, 6)   # 12.7: ISA 8.6 (cuda-bindings' own table)
    assert max_ptx_isa(13050) == (9, 5)   # review 28: 13.2..13.5 were capped at 9.1
    assert max_ptx_isa(99000) == (9, 5)   # unknown future driver: conservative
    assert max_ptx_isa(9000) is None
    newer = img("ptx", "sm_80", cuda=0, isa=(9, 1))
    with pytest.raises(CompatibilityError, match="PTX ISA 9.1 is newer than the driver accepts"):
        select_image([newer], "sm_90", 13000)
    assert chosen([newer], "sm_90", 13010) == "ptx compute_80"


def test_ptx_target_rules() -> None:
    assert chosen([img("ptx", "sm_70"), img("ptx", "sm_80")], "sm_90") == "ptx compute_80"
    with pytest.raises(CompatibilityError, match="newer than the device"):
        select_image([img("ptx", "sm_90")], "sm_86", 13000)
    with pytest.raises(CompatibilityError, match="family PTX"):
        select_image([img("ptx", "sm_100f")], "sm_120", 13000)
    with pytest.raises(CompatibilityError, match="arch-specific PTX"):
        select_image([img("ptx", "sm_90a")], "sm_100", 13000)


def test_host_images_never_chosen() -> None:
    with pytest.raises(CompatibilityError, match="host object code"):
        select_image([img("host", "sm_90")], "sm_90", 13000)


def test_reasons_cover_every_image() -> None:
    sel = select_image(FULL, Arch(8, 9), 13000)
    assert [r[0] for r in sel.reasons] == FULL
    reasons = dict((f"{i.kind} {i.target}", r) for i, r in sel.reasons)
    assert reasons["cubin sm_86"].startswith("chosen: compatible cubin")
    assert reasons["cubin sm_80"].startswith("usable")
    assert reasons["ptx compute_80"].startswith("usable")
    assert reasons["cubin sm_90"].startswith("rejected")


def test_explain_without_driver_and_on_failure() -> None:
    lines = explain(FULL, "sm_86")
    assert lines[0] == "device 8.6, driver not given"
    assert any(line.startswith(" * cubin sm_86: chosen") for line in lines)
    failing = explain([img("cubin", "sm_90")], "sm_75", 12040)
    assert "no image of module runs" in failing[0] and "cubin sm_90" in failing[-1]


def test_bad_device_argument() -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        select_image(FULL, "gfx90a", 13000)
    with pytest.raises(TypeError):
        select_image(FULL, 86, 13000)  # type: ignore[arg-type]
