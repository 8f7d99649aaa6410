"""Architecture targets: strict parsing, ordering, target lists."""

from __future__ import annotations

import pytest

from kernelpack.targets import Arch, parse_arch, parse_target_list


@pytest.mark.parametrize("text, arch", [
    ("sm_80", Arch(8, 0)),
    ("sm_86", Arch(8, 6)),
    ("sm_90a", Arch(9, 0, "a")),
    ("sm_100f", Arch(10, 0, "f")),
    ("sm_120", Arch(12, 0)),
    ("compute_80", Arch(8, 0)),
    ("  SM_90A ", Arch(9, 0, "a")),  # case and surrounding blanks are forgiven
])
def test_parse_arch(text: str, arch: Arch) -> None:
    assert parse_arch(text) == arch


@pytest.mark.parametrize("text", ["sm90", "sm_9", "sm_900x", "sm_1000", "compute_80b", "gfx90a", "",
                                  "ptx", "sm_8 0"])
def test_parse_arch_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        parse_arch(text)


def test_parse_arch_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="got 90"):
        parse_arch(90)  # type: ignore[arg-type]


def test_arch_names() -> None:
    a = Arch(9, 0, "a")
    assert (a.sm, a.compute, str(a)) == ("sm_90a", "compute_90a", "sm_90a")


@pytest.mark.parametrize("args", [(0, 0, ""), (100, 0, ""), (9, 10, ""), (9, 0, "x")])
def test_arch_validates_fields(args: tuple[int, int, str]) -> None:
    with pytest.raises(ValueError, match="bad architecture"):
        Arch(*args)


def test_arch_ordering_is_by_capability() -> None:
    assert sorted([Arch(9, 0), Arch(8, 6), Arch(8, 0), Arch(12, 0)]) == [
        Arch(8, 0), Arch(8, 6), Arch(9, 0), Arch(12, 0)]


def test_target_list_sorts_dedups_and_detects_ptx() -> None:
    assert parse_target_list(["sm_90", "sm_80", "sm_90"]) == ([Arch(8, 0), Arch(9, 0)], False)
    assert parse_target_list(("sm_80", "ptx")) == ([Arch(8, 0)], True)
    archs, ptx = parse_target_list(["compute_80"])
    assert archs == [Arch(8, 0)] and ptx


def test_target_list_rejects() -> None:
    with pytest.raises(TypeError, match="must be a list"):
        parse_target_list("sm_80")  # type: ignore[arg-type]
    for bad in (None, 90):  # was Python's "'NoneType' object is not iterable"
        with pytest.raises(TypeError, match=rf"must be a list .*\(got {bad}\)"):
            parse_target_list(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name no architecture"):
        parse_target_list(["ptx"])
    with pytest.raises(ValueError, match="sm_8"):
        parse_target_list(["sm_8"])
