"""Review 52: tests that kill mutants of image selection, targets and externals which survived
the existing suite.

A throw-away mutator (outside the repo) changed, one site at a time, ``runtime/selection.py``
(every site of ``max_ptx_isa``, ``image_label``, ``Selection``, ``_rank`` and ``select_image``),
``targets.py`` (every site), half the sites of ``toolchain/ptxas_guard.py``, the ``inspect
--device/--driver`` code (``cli._arch``/``_driver``, ``cli_commands.cmd_inspect``,
``cli_facts.selection_facts``),
and samples of ``external.py`` (the source branches of ``external``, ``_check_dict_targets``,
``_check_thread_limit``, ``_bind_args``, ``_check_args_fit``), ``external_images.py``
(``images_from_ptx``, ``images_from_cubins``, ``_check_cubin``) and ``code_scan.py`` (PTX
entries and parameters, ``cubin_arch``, the cubin parameter and thread-limit readers): flipped
comparisons and boolean operators, dropped operands, conditions forced true/false, dropped
raises and checks, constants off by one, ``max``/``min`` swaps, early ``return None``; plus 63
hand-written ones (preference order swapped or reversed, ``a``/``f`` confused, the device's
suffix kept, PTX gated on the toolkit always or never, PTX ISA table rows moved, the ISA
compared by major only, regexes loosened, a cubin's architecture compared by major only, the
``.param`` width table and cubin attribute decoding changed). 532 mutants: 451 killed by the
suite (3 of them only by tests outside the modules' own files, two by hanging), 46 by the
tests here, 35 equivalent. Every test here passes on the current code; no real bug was found:
every rule of issue 4 (newer-toolkit cubins dropped, exact ``a`` > exact > lower minor > PTX
within the driver's ISA, ``a`` exact only, ``f`` same major upward, CompatibilityError naming
every image) was already pinned by the suite. The gaps were in what feeds selection: a cubin's
ELF ABI 7 (CUDA 12) architecture byte, ``.reqntid``/``.maxntid`` and parameter sizes read from
a cubin, cubins from nvJitLink not re-checked, ``cubin=`` declared for another minor, the
``--driver`` encoding. No GPU; about half a second.

Survivors judged equivalent: ``MIN_DRIVER_VERSION`` 11999, ``// 999`` for ``// 1000`` (four
sites) and ``// 9`` for ``// 10`` on real driver versions (whose minor field is 0..90), a
missing ``cuda_version`` defaulting to 1, the ``cuda`` truthiness test (0 never gates), six
rank constants that keep the order (``a`` exact (4|3, 2|3, 0|1), exact (3, 0, x), plain (3, 1,
2), lower minor (2, m, 2), PTX (0, ...)), ``top is None`` (drivers before 12.0 are refused
first), ties won by the last image and an early ``break`` in ``max_ptx_isa`` (sorted table);
a three-digit major in ``_ARCH_RE`` (refused by ``Arch`` instead); ptxas_guard's ``if not
negated`` shortcut; the JSON indent of ``inspect --json``; the device suffix in
``selection_facts`` (``cli._arch`` drops it, ``_rank`` ignores it); the ``isinstance(cubin,
Mapping)`` test before ``_check_dict_targets`` (bytes have exactly one target); checking every
CUDA C image's parameters instead of the first; complex dtypes in ``_check_args_fit`` (complex
scalars are refused by ``kp.Scalar``); ``\\b`` in ``_PTX_TYPED_RE``; ``below`` in
``images_from_ptx`` comparing suffixes (nvJitLink refuses those targets too; not run); the
``close < 0`` bound; ``KPARAM_INFO`` in ``_PARAM_ATTRS`` and ``not sizes or not param_attrs``
(only a cubin with a parameter bank but no KPARAM_INFO tells them apart, and no toolchain
writes one); the last instead of the only ``.param`` type; the array suffix regex anchored.
Not mutated for lack of time: ``read_source``, ``ptx_from_llvm_ir``, ``images_from_cuda``,
``_check_constant_launch``/``_check_evaluable`` bodies, ``cubin_entries``, ``_nv_info`` and
``ptx_entry_max_threads``, and the unsampled sites of the three external modules.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import kernelpack as kp

from kernelpack.errors import CompatibilityError
from kernelpack.runtime.selection import select_image
from kernelpack.targets import Arch
from kernelpack.toolchain.ptxas_guard import FIXED_IN, guard_options, needs_guard

HAZARD = b"max.s32 \t%r5, %r4, %r3;\n\tneg.s32 \t%r3, %r2;\n"


# ==== runtime/selection.py ======================================================================

def test_duck_typed_image_without_a_toolkit_version() -> None:
    """Mutant: ``int(getattr(image, "cuda_version", 0) or 0)`` without ``or 0``. Images are
    duck-typed (the module docstring); one whose ``cuda_version`` is None (unknown toolkit)
    is not gated on the toolkit, as 0 is, instead of a TypeError."""
    duck = SimpleNamespace(kind="cubin", arch=Arch(8, 0), cuda_version=None, ptx_isa=None)
    assert select_image([duck], "sm_86", 12040).chosen is duck
    ptx = SimpleNamespace(kind="ptx", arch=Arch(8, 0), cuda_version=None, ptx_isa=None)
    assert select_image([ptx], "sm_90", 12040).chosen is ptx
    with pytest.raises(CompatibilityError, match="a cubin runs only on 8.x"):
        select_image([duck], "sm_90", 12040)


# ==== toolchain/ptxas_guard.py ==================================================================

def test_guard_applies_to_every_assembler_before_13_5() -> None:
    """Mutant: ``FIXED_IN = (13, 4)``. The releases between 13.0 and 13.5 were not tested, so
    they count as affected (the module docstring): 13.4 still gets -O0, 13.5 does not."""
    assert FIXED_IN == (13, 5)
    for minor in range(5):
        assert guard_options(HAZARD, (13, minor)) == ("-Xptxas=-O0",), minor
    assert guard_options(HAZARD, (13, 5)) == ()


def test_needs_guard_answers_a_bool() -> None:
    """Mutant: ``return False`` -> ``return None`` when the PTX holds no negation."""
    assert needs_guard(b"max.s32 %r5, %r4, %r3;") is False
    assert needs_guard(b"") is False
    assert needs_guard(HAZARD) is True


# ==== cli.py: inspect --driver ==================================================================

@pytest.mark.parametrize("text, version", [("12.4", 12040), ("13.5", 13050), ("12.0", 12000),
                                           ("1.0", 1000), (" 12.9 ", 12090)])
def test_driver_option_encodes_like_cuDriverGetVersion(text: str, version: int) -> None:
    """Mutants: ``major * 1000 - minor * 10``, ``minor // 10`` and the major-0 check made
    ``== 1``: ``--driver 12.4`` must be 12040, or the PTX ISA gate of ``inspect --device``
    judges another driver than the one asked about."""
    import argparse

    from kernelpack.cli import _driver

    assert _driver(text) == version
    for bad in ("0.5", "00.0", "12.45", "12"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a CUDA version"):
            _driver(bad)


# ==== external.py ===============================================================================

LIMITED_PTX = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 n)
.maxntid 128, 1, 1
{
  ret;
}
.visible .entry tiled(.param .u64 p) .maxntid 32, 4, 1
{
  ret;
}
.visible .entry required(.param .u64 p) .reqntid 16, 8
{
  ret;
}
.visible .entry big(.param .align 8 .b8 s[264])
{
  ret;
}
.visible .entry narrow(.param .u64 p, .param .u8 b, .param .u16 h, .param .f64 d)
{
  ret;
}
"""


def _limited(block: tuple, **kw: object) -> kp.Compiled:
    fields: dict = {"ptx": LIMITED_PTX, "targets": ["sm_80"], "args": ["x", (kp.sym("n"), "u32")]}
    fields.update(kw)
    return kp.external("k", "k", params=[kp.Tensor("x", kp.f32, ("n",))], grid=(kp.sym("n"),),
                       block=block, **fields)


@pytest.fixture(scope="module")
def limited_cubin() -> bytes:
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    from kernelpack.toolchain import nvjitlink

    (data,) = nvjitlink.ptx_to_cubins(LIMITED_PTX.encode(), [Arch(8, 0)])
    return data


def test_thread_limit_counts_all_three_block_dimensions() -> None:
    """Mutant: threads ``x * y // z``. A (4, 4, 16) block is 256 threads, above .maxntid 128
    (the mutant counted 1)."""
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    with pytest.raises(ValueError, match=r"block \(4, 4, 16\) is 256 threads"):
        _limited((4, 4, 16))
    assert _limited((4, 4, 8)).name == "k"  # 128: at the limit


def test_thread_limit_of_a_cubin_given_as_is(limited_cubin: bytes) -> None:
    """Mutants: ``_check_thread_limit`` skips code of kind ``cubin``; in
    ``cubin_entry_max_threads`` the attribute codes, format test, payload length, ``or ()``
    and the y index. A ``cubin=`` kernel whose ``.nv.info`` declares at most 128 threads is
    refused with a block of 256, as its PTX is."""
    with pytest.raises(ValueError, match=r"256 threads.*cubin for sm_80 \(at most 128"):
        _limited((256,), ptx=None, cubin={"sm_80": limited_cubin}, targets=None)
    assert _limited((128,), ptx=None, cubin={"sm_80": limited_cubin}, targets=None).name == "k"
    from kernelpack.code_scan import cubin_entry_max_threads

    assert cubin_entry_max_threads(limited_cubin, "k") == (".maxntid 128, 1, 1", 128)
    assert cubin_entry_max_threads(limited_cubin, "tiled") == (".maxntid 32, 4, 1", 128)
    assert cubin_entry_max_threads(limited_cubin, "required") == (".reqntid 16, 8, 1", 128)
    assert cubin_entry_max_threads(limited_cubin, "narrow") is None
    assert cubin_entry_max_threads(limited_cubin, "missing") is None


def test_thread_limit_of_cuda_c_compiled_to_ptx_only() -> None:
    """Mutant: ``_check_thread_limit`` skips images of kind ``ptx``. With ``cuda=`` and only a
    ``compute_XY`` target there is no cubin to read the limit from: the PTX image is read."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC missing")
    source = 'extern "C" __global__ void __launch_bounds__(64) k(float* x, unsigned n) {}'
    try:
        with pytest.raises(ValueError, match=r"128 threads.*at most 64"):
            _limited((128,), ptx=None, cuda=source, targets=["compute_80"])
    except kp.CompileError as exc:  # NVRTC present but unusable here
        pytest.skip(f"NVRTC: {exc}")
    assert _limited((64,), ptx=None, cuda=source, targets=["compute_80"]).name == "k"


def test_entry_must_be_a_non_empty_string() -> None:
    """Mutants: the ``not entry`` test dropped, and the raise dropped: an empty or missing
    entry is a TypeError naming ``entry``, before any compiler runs."""
    for entry in ("", None, 7):
        with pytest.raises(TypeError, match="entry must be the kernel's entry name"):
            kp.external("k", entry, params=[kp.Tensor("x", kp.f32, ("n",))],  # type: ignore
                        grid=(kp.sym("n"),), block=(128,), ptx=LIMITED_PTX, targets=["sm_80"])


@pytest.mark.parametrize("field", ["grid", "shared_mem", "count"])
def test_constant_but_unevaluable_launch_fields_are_refused(field: str) -> None:
    """Mutant: ``_check_evaluable`` not called. ``kp.cdiv(1, 0)`` reads no symbol but is not
    folded (folding keeps what would fail): every plan would be refused, so the declaration
    is, with a ValueError naming the field."""
    kw: dict = {field: kp.cdiv(1, 0)}
    block = (128,)
    with pytest.raises(ValueError, match=r"reads no symbol but cannot be evaluated"):
        if field == "grid":
            kp.external("k", "k", params=[kp.Tensor("x", kp.f32, ("n",))], grid=kw["grid"],
                        block=block, args=["x", (kp.sym("n"), "u32")], ptx=LIMITED_PTX,
                        targets=["sm_80"])
        else:
            _limited(block, **kw)


def test_width_warning_names_a_value_argument_as_such() -> None:
    """Mutant: every non-buffer argument described as ``scalar <name>``. A computed ``(expr,
    dtype)`` argument has no name: the warning calls it a value argument of its dtype."""
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    with pytest.warns(UserWarning, match=r"args\[1\]: value argument \(\w+\) is 8 byte\(s\), "
                                         r"but the PTX entry 'k' declares '\.param \.u32 n'"):
        _limited((128,), args=["x", (kp.sym("n"), "i64")])


# ==== external_images.py ========================================================================

def test_ptx_target_unknown_to_nvjitlink_is_named_before_assembling() -> None:
    """Mutant: ``images_from_ptx`` without ``nvjitlink.check_archs(cubin_archs)``. A target
    the toolchain cannot build (sm_99) is a CompileError naming it and ``targets``, not
    nvJitLink rejecting its own options."""
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    with pytest.raises(kp.CompileError, match=r"targets: .*cannot build for 'sm_99'"):
        _limited((128,), targets=["sm_80", "sm_99"])


def test_assembled_cubins_are_checked_like_given_ones(monkeypatch: pytest.MonkeyPatch,
                                                      limited_cubin: bytes) -> None:
    """Mutant: ``images_from_ptx`` without ``_check_cubin`` of what nvJitLink returned. An
    assembler that hands back a cubin for another architecture (here: sm_80's, asked for
    sm_90) must not become the sm_90 image, which selection would load on a 9.x device."""
    from kernelpack.toolchain import nvjitlink

    monkeypatch.setattr(nvjitlink, "ptx_to_cubins", lambda ptx, archs, name="": [limited_cubin])
    with pytest.raises(kp.CompileError, match="cubin declared as sm_90 was built for sm_80"):
        _limited((128,), targets=["sm_90"])


# ==== code_scan.py ==============================================================================

def test_cubin_parameter_sizes_and_count(limited_cubin: bytes) -> None:
    """Mutants: ``_EIATTR_KPARAM_INFO`` off by one (no size is read, so the cubin's parameters
    are "unknown" and nothing is checked) and the size mask ``0x3FFF`` made ``0x3FFE`` (a
    1-byte parameter read as 0) or ``0xFF`` (a 264-byte struct read as 8). A ``cubin=``
    kernel given one argument too few is refused: the driver would read a pointer past the
    argument array."""
    from kernelpack.code_scan import cubin_entry_params

    assert cubin_entry_params(limited_cubin, "k") == [("parameter 0 (8 bytes)", 8),
                                                      ("parameter 1 (4 bytes)", 4)]
    assert [size for _, size in cubin_entry_params(limited_cubin, "narrow")] == [8, 1, 2, 8]
    assert cubin_entry_params(limited_cubin, "big") == [("parameter 0 (264 bytes)", 264)]
    with pytest.raises(ValueError, match=r"1 kernel argument\(s\) for the kernel 'k' of the "
                                         r"cubin for sm_80, which declares 2"):
        _limited((128,), ptx=None, cubin={"sm_80": limited_cubin}, targets=None, args=["x"])


@pytest.mark.parametrize("ptx_type, size", [
    ("pred", 1), ("b8", 1), ("u8", 1), ("s8", 1), ("b16", 2), ("u16", 2), ("s16", 2),
    ("f16", 2), ("bf16", 2), ("b32", 4), ("u32", 4), ("s32", 4), ("f32", 4), ("b64", 8),
    ("u64", 8), ("s64", 8), ("f64", 8)])
def test_ptx_parameter_widths(ptx_type: str, size: int) -> None:
    """Mutants: a width of the ``.param`` type table off by one (a 16-bit scalar would be
    warned about as a width mismatch, or a wrong width accepted silently)."""
    from kernelpack.code_scan import ptx_entry_params

    ptx = f".visible .entry k(.param .{ptx_type} v, .param .align 4 .{ptx_type} a[3])\n{{"
    assert ptx_entry_params(ptx.encode(), "k") == [(f".param .{ptx_type} v", size),
                                                   (f".param .align 4 .{ptx_type} a[3]",
                                                    3 * size)]


@pytest.mark.parametrize("decl", [".parameter .u32 n", ".param .b128 q", ".param .u32 .f32 n"])
def test_ptx_parameters_not_understood_are_unknown(decl: str) -> None:
    """Mutants: the ``words[0] != "param"`` test dropped (``.parameter`` is no ``.param``) and
    ``len(types) != 1`` made False (no known type: an IndexError; two types: the first one
    taken). The reader answers None, and the caller checks nothing, rather than guess."""
    from kernelpack.code_scan import ptx_entry_params

    assert ptx_entry_params(f".entry k(.param .u64 p, {decl})\n{{".encode(), "k") is None


def _elf(abi: int, flags: int) -> bytes:
    head = bytearray(64)
    head[:4], head[4], head[5], head[8] = b"\x7fELF", 2, 1, abi
    head[18:20] = (190).to_bytes(2, "little")
    head[48:52] = flags.to_bytes(4, "little")
    return bytes(head)


def test_cubin_arch_by_elf_abi_version() -> None:
    """Mutants: the ABI boundaries of ``cubin_arch`` (``abi >= 8`` made ``>= 7``, ``== 7``
    made ``== 6`` or ``== 8``, ``flags & 0xFF`` replaced). CUDA 12 toolkits write ELF ABI 7
    with the SM in the flags' low byte, CUDA 13 ABI 8 with it in the second byte; a wrong
    reading lets a cubin declared sm_80 but built for sm_90 through ``cubin=``."""
    from kernelpack.code_scan import cubin_arch

    assert cubin_arch(_elf(7, 0x00500550)) == 0x50 == 80
    assert cubin_arch(_elf(8, 0x00005a07)) == 0x5a == 90
    assert cubin_arch(_elf(9, 0x00006400)) == 100
    assert cubin_arch(_elf(6, 0x00000050)) is None


# ==== targets.py and more of external.py ========================================================

def test_arch_digits_are_ascii_only() -> None:
    """Mutant: ``_ARCH_RE`` without ``re.ASCII``: ``\\d`` then matches Arabic-Indic digits,
    and ``"sm_\\u0669\\u0660"`` parsed as sm_90."""
    from kernelpack.targets import parse_arch

    for text in ("sm_\u0669\u0660", "compute_\u0668\u0660", "sm_9\u0660"):
        with pytest.raises(ValueError, match="not a GPU architecture"):
            parse_arch(text)


def test_matching_narrow_arguments_do_not_warn() -> None:
    """Mutants: 1-, 2- and 8-byte widths of the ``.param`` type table, end to end: arguments
    that match the entry exactly warn about nothing."""
    import warnings

    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    params = [kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("b", kp.u8), kp.Scalar("h", kp.i16),
              kp.Scalar("d", kp.f64)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = kp.external("narrow", "narrow", params, grid=(kp.sym("n"),), block=(128,),
                        ptx=LIMITED_PTX, targets=["sm_80"])
    assert c.name == "narrow"


def test_one_warning_per_mismatched_argument() -> None:
    """Mutant: the float-versus-integer ``elif`` made an ``if``: an ``f64`` scalar for a
    ``.u32`` is one mismatch (its width), warned about once."""
    import warnings

    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    params = [kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("s", kp.f64)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kp.external("k", "k", params, grid=(kp.sym("n"),), block=(128,), ptx=LIMITED_PTX,
                    targets=["sm_80"])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "args[1]: scalar 's' (float64) is 8 byte(s)" in messages[0]


def test_cubin_declared_for_another_minor_is_refused(limited_cubin: bytes) -> None:
    """Mutant: ``_check_cubin`` compares only the major (``built_for // 10 != arch.major``).
    An sm_80 cubin declared as sm_86 would be chosen on an 8.6 device over a compatible one
    and, declared as sm_89, on 8.9; the declaration is refused instead."""
    for target in ("sm_86", "sm_89"):
        with pytest.raises(kp.CompileError, match=f"cubin declared as {target} was built for "
                                                  "sm_80"):
            _limited((128,), ptx=None, cubin={target: limited_cubin}, targets=None)


def test_multi_line_block_comments_hide_entries_and_parameters() -> None:
    """Mutant: ``_PTX_COMMENT_RE`` without ``re.DOTALL``: a ``/* ... */`` comment spanning
    lines was kept, so a commented-out kernel counted as an entry and a commented-out
    parameter as a parameter (an argument count the kernel does not have)."""
    from kernelpack.code_scan import ptx_entries, ptx_entry_params

    ptx = (b"/* retired:\n.entry old(.param .u64 p)\n{ ret; }\n*/\n"
           b".entry k(.param .u64 p /* , .param .u32\n n */)\n{ ret; }\n")
    assert ptx_entries(ptx) == ["k"]
    assert ptx_entry_params(ptx, "k") == [(".param .u64 p", 8)]


def test_targets_naming_an_arch_the_cubin_dict_lacks_are_refused(limited_cubin: bytes) -> None:
    """Mutant: ``missing`` always empty in ``_check_dict_targets``. ``targets=`` asking for an
    sm_90 that ``cubin={...}`` does not hold would leave the artifact without it (a
    CompatibilityError on every 9.x device, much later): a ValueError now."""
    with pytest.raises(ValueError, match="asks for sm_90, which the dict has no cubin for"):
        _limited((128,), ptx=None, cubin={"sm_80": limited_cubin}, targets=["sm_80", "sm_90"])
