"""The ptxas workaround's decisions (toolchain/ptxas_guard.py) and that every assembly path
applies it; the device test is tests/gpu/test_ptxas_guard.py."""

from __future__ import annotations

import pytest

from kernelpack.cache import keys
from kernelpack.toolchain import nvjitlink, ptxas_guard
from kernelpack.toolchain.ptxas_guard import FIXED_IN, GUARD_ID, guard_options, needs_guard

HAZARD = b"max.s32 \t%r5, %r4, %r3;\n\tneg.s32 \t%r3, %r2;\n"


def test_needs_both_a_signed_min_max_and_a_negation() -> None:
    assert needs_guard(HAZARD) and needs_guard(HAZARD.decode())
    assert needs_guard(b"min.s16 %rs1, %rs2, %rs3;\nneg.s16 %rs2, %rs4;")
    assert not needs_guard(b"max.s32 %r5, %r4, %r3;")  # no negation
    assert not needs_guard(b"neg.s32 %r3, %r2;\nmax.f32 %f1, %f2, %f3;")  # float max
    assert not needs_guard(b"neg.s64 %rd3, %rd2;\nmax.s64 %rd1, %rd2, %rd3;")  # 64-bit
    assert not needs_guard(b"neg.s32 %r3, %r2;\nmax.u32 %r1, %r2, %r3;")  # unsigned
    # a min of other values beside an unrelated negation (the float64 encodings' PTX)
    assert not needs_guard(b"min.s32 %r28, %r9, 18;\nneg.s32 %r11, %r5;")
    # through copies and conversions, in any order (a loop's registers)
    assert needs_guard(b"max.s32 %r7, %r7, %r6;\ncvt.s32.s16 %r6, %rs2;\n"
                       b"mov.u16 %rs2, %rs1;\nneg.s16 %rs1, %rs0;")


def test_options_only_for_affected_assemblers() -> None:
    assert guard_options(HAZARD, (13, 0)) == ("-Xptxas=-O0",)
    assert guard_options(HAZARD, (12, 9)) == ("-Xptxas=-O0",)
    assert guard_options(HAZARD, FIXED_IN) == ()
    assert guard_options(HAZARD, (14, 0)) == ()
    assert guard_options(b"max.s32 %r1, %r2, %r3;", (13, 0)) == ()


class _FakeLinker:
    """Records the options nvJitLink is created with."""

    class InputType:
        PTX = 1

    def __init__(self) -> None:
        self.options: list[list[str]] = []

    def create(self, n: int, opts: list[str]) -> int:
        self.options.append(list(opts))
        return 1

    def add_data(self, *args: object) -> None:
        pass

    def complete(self, handle: int) -> None:
        pass

    def get_linked_cubin_size(self, handle: int) -> int:
        return 4

    def get_linked_cubin(self, handle: int, buf: bytearray) -> None:
        buf[:] = b"\x7fELF"

    def destroy(self, handle: int) -> None:
        pass


@pytest.mark.parametrize("assembler, expected", [((13, 0), True), ((13, 5), False)])
def test_ptx_to_cubin_adds_the_option(monkeypatch: pytest.MonkeyPatch, assembler, expected) -> None:
    linker = _FakeLinker()
    monkeypatch.setattr(nvjitlink, "_module", lambda: linker)
    monkeypatch.setattr(nvjitlink, "version", lambda: assembler)
    from kernelpack.targets import parse_arch

    arch = parse_arch("sm_90")
    assert nvjitlink.ptx_to_cubin(HAZARD, arch) == b"\x7fELF"
    assert nvjitlink.ptx_to_cubin(b"max.f32 %f1, %f2, %f3;", arch) == b"\x7fELF"
    assert ("-Xptxas=-O0" in linker.options[0]) is expected
    assert "-Xptxas=-O0" not in linker.options[1]
    assert linker.options[0][:2] == ["-arch=sm_90", "-O3"]


def test_cache_keys_and_runtime_ptx_cache_name_the_guard() -> None:
    key = keys.make_key("fusion", b"src", {}, ["sm_90"])
    assert ("ptxas-guard", GUARD_ID) in key.parts
    assert list(keys.KEY_LABELS).index("ptxas-guard") < list(keys.KEY_LABELS).index("env")


def test_runtime_ptx_cache_path_changes_with_the_guard(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path) -> None:
    from kernelpack.runtime import _ptx_load

    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path))
    before = _ptx_load.ptx_cache_path(HAZARD, "sm_90", "nvJitLink 13.0")
    monkeypatch.setattr(ptxas_guard, "GUARD_ID", GUARD_ID + "-next")
    assert _ptx_load.ptx_cache_path(HAZARD, "sm_90", "nvJitLink 13.0") != before
