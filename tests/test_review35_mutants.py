"""Review 35: tests that kill mutants which survived the existing suite.

A throw-away mutator (outside the repo) flipped comparisons, constants, boolean operators,
conditions and statements one at a time in ``runtime/selection.py``, ``expr.py``,
``expr_eval.py``, ``cache/keys.py`` and ``targets.py`` and ran the tests that exercise each
module. Every test here passes on the current code and fails on at least one surviving mutant
(named in its docstring), except ``test_max_ptx_isa_of_cuda_10_0_is_6_3``, which fails now:
the mutant analysis found a wrong row in the PTX ISA table. No GPU; one short subprocess (a
zip import); the whole file runs in about a second.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack import expr as E
from kernelpack.cache.keys import (
    CacheKey,
    canonical_options,
    codegen_digest,
    toolchain_identity,
)
from kernelpack.errors import CompatibilityError, ExpressionError
from kernelpack.expr_eval import apply_op
from kernelpack.runtime import Selection, explain, max_ptx_isa, select_image
from kernelpack.targets import Arch, parse_arch, parse_target_list, portable_lowest


# ---- runtime/selection.py ----------------------------------------------------------------------
def _img(kind: str, target: str, cuda: int = 12040, isa: tuple[int, int] | None = None,
         ) -> kp.Image:
    if kind == "ptx" and isa is None:
        isa = (8, 0)
    return kp.Image(kind, parse_arch(target), b"x", "t", cuda, isa)


class _Duck:
    """select_image takes any object with kind, arch, cuda_version and ptx_isa."""

    def __init__(self, kind: str, target: str, cuda: int = 12040,
                 isa: tuple[int, int] | None = None) -> None:
        self.kind, self.arch, self.cuda_version, self.ptx_isa = kind, parse_arch(target), cuda, isa


def test_needs_compile_is_true_for_ptx_only() -> None:
    """Mutants: ``needs_compile`` returning ``kind != "ptx"`` / None."""
    cubin = select_image([_img("cubin", "sm_80")], "sm_80", 12040)
    ptx = select_image([_img("ptx", "compute_80")], "sm_90", 12040)
    assert cubin.needs_compile is False
    assert ptx.needs_compile is True


def test_an_image_of_unknown_kind_is_rejected_by_name() -> None:
    """Mutants: the ``kind not in ("cubin", "ptx")`` check dropped (a ``fatbin`` went down
    the PTX path and was chosen)."""
    with pytest.raises(CompatibilityError, match="unknown image kind 'fatbin'"):
        select_image([_Duck("fatbin", "sm_80", isa=(8, 0))], "sm_80", 12040)


def test_a_cubin_is_gated_by_its_toolkit_even_when_it_carries_a_ptx_isa() -> None:
    """Mutant: ``gated = False or ptx_isa is None`` (a cubin with a ptx_isa escaped the
    toolkit-major gate; kp.Image accepts ptx_isa on any kind)."""
    cubin = _img("cubin", "sm_90", cuda=13000, isa=(8, 0))
    with pytest.raises(CompatibilityError, match="newer major than the driver"):
        select_image([cubin], "sm_90", 12090)


@pytest.mark.parametrize("driver", [12000, 12040, 12090])
def test_a_cuda_13_cubin_is_refused_by_every_12_x_driver(driver: int) -> None:
    """Mutant: ``cuda // 1001`` (13000 // 1001 == 12: a 13.0 cubin passed a 12.x driver)."""
    with pytest.raises(CompatibilityError, match=r"built by CUDA 13\.0, newer major"):
        select_image([_img("cubin", "sm_90", cuda=13000)], "sm_90", driver)
    # the same major is fine, whatever the minor (minor-version compatibility)
    assert select_image([_img("cubin", "sm_90", cuda=12090)], "sm_90", driver).chosen.kind \
        == "cubin"


def test_exact_cubin_is_reported_as_exact() -> None:
    """Mutants: ``if arch.minor == dev.minor`` -> False, and its return -> pass (the exact
    cubin was still chosen, but explained as 'same major, lower minor')."""
    sel = select_image([_img("cubin", "sm_80"), _img("cubin", "sm_86")], "sm_86", 12040)
    assert sel.chosen.arch == Arch(8, 6)
    chosen = {img.target: why for img, why in sel.reasons}
    assert chosen["sm_86"] == "chosen: exact cubin"
    assert "lower minor" in chosen["sm_80"]


@pytest.mark.parametrize("order", ["family_first", "plain_first"])
def test_plain_cubin_beats_family_cubin_of_the_same_arch(order: str) -> None:
    """Mutants: the tie-break ``0 if arch.suffix else 1`` of exact and lower-minor cubins
    (either way the choice then depended on the order the images are listed in)."""
    for device in ("sm_100", "sm_103"):  # exact, then a lower minor of the same major
        images = [_img("cubin", "sm_100f"), _img("cubin", "sm_100")]
        if order == "plain_first":
            images.reverse()
        sel = select_image(images, device, 12090)
        assert sel.chosen.target == "sm_100", device


def test_family_ptx_runs_on_its_own_arch() -> None:
    """Mutant: ``arch.minor >= dev.minor`` in the family-PTX rule (compute_100f refused on
    an sm_100)."""
    sel = select_image([_img("ptx", "compute_100f", isa=(8, 8))], "sm_100", 12090)
    assert sel.chosen.target == "compute_100f"
    sel = select_image([_img("ptx", "compute_100f", isa=(8, 8))], "sm_103", 12090)
    assert sel.chosen.target == "compute_100f"
    with pytest.raises(CompatibilityError, match="family PTX runs only on 10.x"):
        select_image([_img("ptx", "compute_103f", isa=(8, 8))], "sm_100", 12090)


def test_ptx_without_a_recorded_isa_is_usable_under_a_driver() -> None:
    """Mutant: ``isa is not None`` -> True (``tuple(None)``: a TypeError for PTX whose
    ``.version`` was not recorded)."""
    sel = select_image([_Duck("ptx", "compute_80", cuda=12040, isa=None)], "sm_90", 12040)
    assert sel.chosen.kind == "ptx"


def test_isa_rejection_names_the_drivers_limit() -> None:
    """Mutant: ``limit = ... if top else "no PTX ISA known"`` -> the else branch (the message
    lost the ISA the driver accepts)."""
    with pytest.raises(CompatibilityError) as info:
        select_image([_img("ptx", "compute_80", isa=(9, 5))], "sm_90", 12040)
    assert "PTX ISA 9.5 is newer than the driver accepts (CUDA 12.4: ISA 8.4)" in str(info.value)


def test_selection_lines_mark_only_the_chosen_image_and_name_the_driver() -> None:
    """Mutants: ``mark = "*" if True`` (every image starred) and the driver shown as
    'not given' although one was."""
    images = [_img("cubin", "sm_80"), _img("cubin", "sm_86"), _img("ptx", "compute_80")]
    lines = select_image(images, "sm_86", 12040).lines()
    assert lines[0] == "device 8.6, driver CUDA 12.4"
    assert [line[:3] for line in lines[1:]] == ["   ", " * ", "   "]
    assert explain(images, "sm_86")[0] == "device 8.6, driver not given"


def test_selection_device_drops_the_suffix() -> None:
    """Mutant: ``dev = Arch(dev.major, dev.minor)`` -> pass (the documented 'a suffix is
    ignored' did not hold for Selection.device)."""
    sel = select_image([_img("cubin", "sm_90a")], "sm_90a", 12040)
    assert sel.device == Arch(9, 0)
    assert sel.chosen.target == "sm_90a"


def test_no_images_at_all_says_so() -> None:
    """Mutants: ``or ["  (no images)"]`` -> ``or True`` / ``or False`` (a TypeError from
    join instead of the CompatibilityError)."""
    with pytest.raises(CompatibilityError, match=r"\(no images\)"):
        select_image([], "sm_90", 12040)
    assert explain([], "sm_90")[-1] == "  (no images)"


def test_selection_built_without_reasons_has_an_empty_list() -> None:
    """Mutant: ``reasons=[] if False else reasons`` (Selection(...).lines() iterated None)."""
    sel = Selection(_img("cubin", "sm_80"), Arch(8, 0), None)
    assert sel.reasons == []
    assert sel.lines() == ["device 8.0, driver not given"]


def test_selection_compares_and_copies_by_its_fields() -> None:
    """Mutant: ``Selection.__slots__`` dropped (FrozenRecord compares and copies the fields
    its class's ``__slots__`` names: every two selections were then equal, and
    ``copy.copy`` rebuilt a Selection from no fields, a TypeError)."""
    import copy

    images = [_img("cubin", "sm_80"), _img("cubin", "sm_86")]
    on_80 = select_image(images, "sm_80", 12040)
    on_86 = select_image(images, "sm_86", 12040)
    assert on_80 != on_86
    assert on_80 == select_image(images, "sm_80", 12040)
    clone = copy.copy(on_86)
    assert clone == on_86 and clone.chosen is on_86.chosen and clone.device == Arch(8, 6)
    with pytest.raises(TypeError):
        hash(on_80)


@pytest.mark.parametrize("driver, isa", [
    (10010, (6, 4)), (10020, (6, 5)), (11000, (7, 0)), (11010, (7, 1)), (11020, (7, 2)),
    (11030, (7, 3)), (11040, (7, 4)), (11050, (7, 5)), (11060, (7, 6)), (11070, (7, 7)),
    (11080, (7, 8)), (12000, (8, 0)), (12050, (8, 5)), (12060, (8, 5)), (12080, (8, 7)),
    (12090, (8, 8)), (13010, (9, 1)),
])
def test_max_ptx_isa_follows_the_ptx_release_history(driver: int, isa: tuple[int, int]) -> None:
    """Mutants: the CUDA 10.x/11.x rows of PTX_ISA_BY_CUDA (the public ``max_ptx_isa``
    answers for any driver; no test read those rows). Values: the PTX ISA release notes, as
    cuda-bindings' ``get_minimal_required_cuda_ver_from_ptx_ver`` has them."""
    assert max_ptx_isa(driver) == isa


def test_max_ptx_isa_of_cuda_10_0_is_6_3() -> None:
    """BUG: the table says CUDA 10.0 accepts PTX ISA 6.4; ISA 6.4 came with CUDA 10.1 and
    10.0's is 6.3 (PTX ISA release history; cuda-bindings maps "6.3" to (10, 0) and "6.4" to
    (10, 1)). ``max_ptx_isa(10000)`` is therefore one ISA too new."""
    assert max_ptx_isa(10000) == (6, 3)


# ---- targets.py --------------------------------------------------------------------------------


def test_first_and_last_majors_parse() -> None:
    """Mutants: ``0 < self.major < 100`` -> ``1 < ...`` / ``... < 99`` (sm_10 and sm_990, the
    ends of the documented ``sm_XY`` with X of 1 or more and at most two digits)."""
    assert parse_arch("sm_10") == Arch(1, 0)
    assert parse_arch("compute_990") == Arch(99, 0)


@pytest.mark.parametrize("text", ["sm_80a", "sm_89a", "sm_90f", "compute_90f"])
def test_suffixes_before_they_existed_are_refused(text: str) -> None:
    """Mutants: ``_FIRST_WITH_SUFFIX`` = {"a": 9, "f": 10} with 9/10 lowered, and the check
    that uses it dropped (LLVM only warned, then ptxas failed)."""
    with pytest.raises(ValueError, match=f"'{text}'.* variants exist from sm_"):
        parse_arch(text)
    assert parse_arch("sm_90a") == Arch(9, 0, "a") and parse_arch("sm_100f") == Arch(10, 0, "f")


def test_target_list_takes_any_iterable_once() -> None:
    """Mutant: ``targets = tuple(targets)`` -> pass (a generator was used up by the type
    check, and then 'targets name no architecture')."""
    assert parse_target_list(t for t in ["sm_90", "compute_80"]) == ([Arch(8, 0), Arch(9, 0)],
                                                                    True)


def test_target_list_names_a_non_string_item() -> None:
    """Mutant: the ``isinstance(item, str)`` check dropped (AttributeError: 'int' object has
    no attribute 'strip')."""
    with pytest.raises(TypeError, match=r"targets must be strings .*got 90 in"):
        parse_target_list(["sm_80", 90])


@pytest.mark.parametrize("archs, expected", [
    ([Arch(9, 0), Arch(8, 0)], Arch(8, 0)),                 # the lowest, not the highest
    ([Arch(9, 0, "a"), Arch(10, 0)], Arch(9, 0)),           # spans archs: suffix dropped
    ([Arch(10, 0, "f"), Arch(12, 0)], Arch(10, 0)),
    ([Arch(9, 0, "a")], Arch(9, 0, "a")),                   # one arch: suffix kept
    ([Arch(10, 0, "f"), Arch(10, 0, "f")], Arch(10, 0, "f")),
])
def test_portable_lowest(archs: list[Arch], expected: Arch) -> None:
    """Mutants: every line of ``portable_lowest`` (min -> max, the span test -> True/False
    or ``==``, the suffix drop, the return) survived: no existing test calls it directly."""
    assert portable_lowest(archs) == expected
    assert portable_lowest(iter(archs)) == expected        # an iterable, read once


# ---- cache/keys.py -----------------------------------------------------------------------------


def _key(**kw: object) -> CacheKey:
    args: dict = {"kind": "fusion", "source": b"src", "options": {"block": 128},
                  "targets": ["sm_80"]}
    args.update(kw)
    return kp.make_key(**args)


def test_cache_key_is_immutable_and_hashable() -> None:
    """Mutant: ``@dataclass(frozen=False)`` (a key could be edited in place and was no
    longer hashable: ``__eq__`` without ``frozen`` sets ``__hash__`` to None)."""
    key = _key()
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.digest = "0" * 64  # type: ignore[misc]
    assert {key: 1}[_key()] == 1
    assert str(key) == key.digest and len(key.digest) == 64


def test_key_part_of_an_unknown_label_raises_key_error() -> None:
    """Mutant: ``raise KeyError(label)`` -> pass (``part("nope")`` returned None)."""
    key = _key()
    assert key.part("kind") == "fusion"
    with pytest.raises(KeyError):
        key.part("nope")


def test_explain_aligns_the_values() -> None:
    """Mutant: ``width = min(...)`` (values no longer in one column)."""
    lines = _key().explain().splitlines()[1:]
    columns = {len(line) - len(line.split("  ", 2)[-1].lstrip()) for line in lines if
               line.split()[1:]}
    assert len(lines) == 12
    assert lines[0].startswith("  format       ") and lines[-2].startswith("  ptxas-guard  ")
    assert len(columns) == 1, lines


def test_diff_lists_parts_in_key_order_then_unknown_labels() -> None:
    """Mutants: ``_label_order`` with ``not in`` / the condition forced either way (the
    parts came out alphabetically, or ``tuple.index`` raised ValueError on a label the key
    does not know, such as one from a newer kernelpack's sidecar)."""
    a = _key()
    b = _key(source=b"other", options={"block": 256}, targets=["sm_90"])
    assert [label for label, _, _ in a.diff(b)] == ["source", "options", "targets"]
    c = CacheKey.from_parts(list(a.parts) + [("zeta", "1"), ("alpha", "2")])
    assert a.diff(c) == [("alpha", "<absent>", "2"), ("zeta", "<absent>", "1")]


@pytest.mark.parametrize("one, other", [
    (True, 1), (False, 0), (True, False), (None, 0), (1.0, 2.0), (b"1", "1"), (b"ab", [97, 98]),
], ids=["true-1", "false-0", "true-false", "none-0", "float-float", "bytes-str", "bytes-list"])
def test_option_values_of_different_type_or_value_give_different_keys(one: object,
                                                                      other: object) -> None:
    """Mutants in ``_encode``: the None, bool, bytes and NaN branches (None and bytes then
    raised TypeError; True encoded as the int 1, True as False; every float as NaN). The
    module promises "1, 1.0, True and "1" all differ"."""
    assert _key(options={"x": one}) != _key(options={"x": other})
    assert _key(options={"x": one}).digest != _key(options={"x": other}).digest


def test_canonical_text_of_each_option_type() -> None:
    """The same mutants, by the exact canonical text (what ``cache explain`` shows)."""
    text = canonical_options({"n": None, "t": True, "f": False, "y": bytearray(b"ab"),
                              "m": memoryview(b"ab"), "x": 1.5, "q": float("nan")})
    assert text == ("d7{s1:f=b0,s1:m=y2:6162,s1:n=n,s1:q=fnan,s1:t=b1,s1:x=f0x1.8000000000000p+0,"
                    "s1:y=y2:6162}")


@pytest.mark.parametrize("options", [[("a", 1)], "abc", 3], ids=["pairs", "str", "int"])
def test_options_that_are_no_mapping_are_named(options: object) -> None:
    """Mutant: the ``isinstance(options, Mapping)`` check dropped (a str gave Python's
    'string indices must be integers', a list 'option names must be str')."""
    with pytest.raises(TypeError, match="options must be a dict"):
        canonical_options(options)  # type: ignore[arg-type]


@pytest.mark.parametrize("targets", [["sm_80", 90], ["sm_80", "  "], ["sm_80", ""]],
                         ids=["int", "blank", "empty"])
def test_bad_target_items_are_type_errors(targets: list) -> None:
    """Mutants: ``not isinstance(t, str) or not t.strip()`` with ``and`` / either side
    dropped / the raise dropped (an int target raised AttributeError; a blank one was
    hashed as a target)."""
    with pytest.raises(TypeError, match="each target must be a non-empty str"):
        _key(targets=targets)


def test_one_shot_iterable_targets_are_refused() -> None:
    """Mutant: ``or not isinstance(targets, Sequence)`` -> ``or False`` (a generator or set
    of targets was taken; a one-shot iterator cannot be explained or re-keyed)."""
    with pytest.raises(TypeError, match="targets must be a list"):
        _key(targets=iter(["sm_80"]))


@pytest.mark.parametrize("kind", ["not an identifier", "", 3, None], ids=["space", "empty",
                                                                          "int", "none"])
def test_kind_must_be_an_identifier(kind: object) -> None:
    """Mutants: ``not isinstance(kind, str) or not kind.isidentifier()`` with ``and``, either
    side dropped, or the raise dropped."""
    with pytest.raises(TypeError, match="kind must be an identifier"):
        _key(kind=kind)


def test_source_text_is_its_utf8_bytes_and_other_types_are_refused() -> None:
    """Mutants: the ``str`` -> bytes conversion dropped (TypeError for a str source), and the
    bytes check dropped (``bytes(3)`` silently hashed three zero bytes)."""
    assert _key(source="é") == _key(source="é".encode())
    assert _key(source=bytearray(b"ab")) == _key(source=memoryview(b"ab"))
    for bad in (3, [1, 2], None):
        with pytest.raises(TypeError, match="source must be bytes"):
            _key(source=bad)


def test_codegen_digest_skips_dotfiles_and_directories(tmp_path: Path) -> None:
    """Mutants: the ``startswith(".") or not is_file()`` skip with ``and`` / either side
    dropped / ``continue`` -> pass (an editor's ``.#expr.py`` lock changed the key; a
    directory named ``x.py`` raised IsADirectoryError)."""
    clean, messy = tmp_path / "clean", tmp_path / "messy"
    for root in (clean, messy):
        (root / "lowering").mkdir(parents=True)
        (root / "expr.py").write_text("A = 1\n")
        (root / "lowering" / "emit.py").write_text("B = 2\n")
    (messy / ".#expr.py").write_text("lock")
    (messy / "._expr.py").write_text("resource fork")
    (messy / "dir.py").mkdir()
    (messy / "lowering" / ".hidden.py").write_text("C = 3\n")
    assert codegen_digest(root=clean) == codegen_digest(root=messy)
    assert codegen_digest(root=clean).endswith("(2 files)")


def test_codegen_digest_is_computed_once_unless_refreshed() -> None:
    """Mutants: ``refresh`` defaulting to True, ``if True or refresh`` and ``or False``
    (the digest, ~100 files hashed, recomputed on every key, or never refreshed)."""
    first = codegen_digest()
    assert codegen_digest() is first
    again = codegen_digest(refresh=True)
    assert again == first and again is not first
    assert codegen_digest() is again


def test_toolchain_identity_refresh_recomputes() -> None:
    """Mutant: ``if _TOOLCHAIN is None or False`` (refresh ignored)."""
    first = toolchain_identity()
    assert toolchain_identity() is first
    again = toolchain_identity(refresh=True)
    assert again == first and again is not first


@pytest.fixture
def _restore_toolchain(monkeypatch: pytest.MonkeyPatch):
    toolchain_identity()  # the libdevice lookup is cached with the real sys.path first
    # the fallbacks ask the libraries, imported before sys.path loses their distributions
    import llvmlite.binding as llvm

    from kernelpack.toolchain import nvjitlink

    assert llvm.llvm_version_info and nvjitlink.version()
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    monkeypatch.undo()
    toolchain_identity(refresh=True)


def test_toolchain_without_distributions_asks_the_libraries(_restore_toolchain) -> None:
    """Mutants in the probes' fallbacks (no dist-info on sys.path: a source build): ``if
    found`` -> True ('None'), ``"LLVM " - ...`` (TypeError, recorded as unavailable), the
    nvJitLink version lines dropped, and ``or "cuda-bindings ?"`` -> True/False."""
    import llvmlite.binding as llvm

    from kernelpack.toolchain import nvjitlink

    sys.path[:] = [p for p in sys.path if not Path(p or ".").is_dir()
                   or not any(Path(p or ".").glob("*.dist-info"))]
    parts = dict(toolchain_identity(refresh=True))
    assert parts["llvm"] == "LLVM " + ".".join(map(str, llvm.llvm_version_info))
    major, minor = nvjitlink.version()
    assert parts["nvjitlink"] == f"nvJitLink {major}.{minor}; cuda-bindings ?"


def test_toolchain_probe_that_fails_is_recorded_as_unavailable(
        _restore_toolchain, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants: ``return f"unavailable:..."`` -> pass in the LLVM and nvJitLink probes
    (the part became None, and the key's ``value.encode()`` an AttributeError)."""
    from kernelpack.toolchain import nvjitlink

    def broken() -> tuple[int, int]:
        raise OSError("libnvJitLink.so: cannot open shared object file")

    sys.path[:] = [p for p in sys.path if not Path(p or ".").is_dir()
                   or not any(Path(p or ".").glob("*.dist-info"))]
    monkeypatch.setitem(sys.modules, "llvmlite.binding", None)  # import raises ModuleNotFoundError
    monkeypatch.setattr(nvjitlink, "version", broken)
    parts = dict(toolchain_identity(refresh=True))
    assert parts["llvm"] == "unavailable:ModuleNotFoundError"
    assert parts["nvjitlink"] == "unavailable:OSError"
    assert kp.make_key("fusion", b"x").part("llvm") == "unavailable:ModuleNotFoundError"


def test_dist_info_in_the_current_directory_counts_first(
        _restore_toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants: ``os.listdir(entry or ".")`` -> ``or True`` / ``or False`` (the ``""`` entry,
    the current directory, which imports search first, was skipped), and ``continue`` ->
    pass after an unreadable entry (UnboundLocalError/NameError on a missing directory)."""
    (tmp_path / "llvmlite-99.1.dist-info").mkdir()
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [str(tmp_path / "missing"), ""] + sys.path
    assert dict(toolchain_identity(refresh=True))["llvm"] == "llvmlite 99.1"


# ---- expr_eval.py ------------------------------------------------------------------------------


IMIN, IMAX = -2**63, 2**63 - 1
_GRID = (0, 1, -1, 2, -3, 7, 63, 64, IMAX, IMIN)


def _fits(v: int) -> int | None:
    return v if IMIN <= v <= IMAX else None


# the documented semantics (FORMAT.md §2), None where evaluation must refuse
_REF = {
    "add": lambda a, b: _fits(a + b), "sub": lambda a, b: _fits(a - b),
    "mul": lambda a, b: _fits(a * b),
    "floordiv": lambda a, b: None if b == 0 else _fits(a // b),
    "ceildiv": lambda a, b: None if b == 0 else _fits(-((-a) // b)),
    "mod": lambda a, b: None if b == 0 else a % b,
    "min": min, "max": max,
    "shl": lambda a, b: _fits(a << b) if 0 <= b <= 63 else None,
    "shr": lambda a, b: a >> b if 0 <= b <= 63 else None,
    "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
    "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b),
    "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
    "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b)),
}
_BUILD = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": E.floordiv, "ceildiv": E.cdiv, "mod": E.mod, "min": E.emin, "max": E.emax,
    "shl": E.shl, "shr": E.shr, "eq": E.eq, "ne": E.ne, "lt": E.lt, "le": E.le, "gt": E.gt,
    "ge": E.ge, "and": E.land, "or": E.lor,
}


@pytest.mark.parametrize("op", sorted(_REF))
def test_tree_evaluation_and_constant_folding_match_the_reference(op: str) -> None:
    """Mutants: ``le`` as ``<``, ``and`` as ``or``, ``or`` as ``and`` in ``apply_op``. The
    existing exhaustive grid checks the planner and the loaded program only, and those share
    ``apply_op`` for these operators; ``Expr.evaluate`` and the builders' constant folding
    were compared with nothing independent."""
    tree = E.Expr(op, (E.sym("a"), E.sym("b")))
    bad = []
    for x in _GRID:
        for y in _GRID:
            want = _REF[op](x, y)
            folded = _BUILD[op](E.const(x), E.const(y))
            try:
                got = tree.evaluate(a=x, b=y)
            except ExpressionError:
                got = None
            if got != want:
                bad.append(("evaluate", x, y, want, got))
            if want is None:
                if folded.is_const:  # kept unfolded: evaluation reports it with context
                    bad.append(("folded a refusal", x, y, folded))
            elif not (folded.is_const and folded.value == want):
                bad.append(("folded", x, y, want, folded))
    assert not bad, bad[:8]


def test_unary_and_select_apply_op() -> None:
    """Mutants: ``op == "select"`` -> ``!=`` / True / False, its return -> pass, its
    condition forced, ``op == "neg"`` -> True (select became a negation), and the final
    ``raise ValueError`` -> pass (an unknown operator returned None)."""
    assert apply_op("select", 1, 2, 3) == 2
    assert apply_op("select", 0, 2, 3) == 3
    assert apply_op("neg", 5) == -5 and apply_op("not", 0) == 1 and apply_op("not", 7) == 0
    with pytest.raises(ValueError, match="unknown expression operator 'pow'"):
        apply_op("pow", 2, 3)


def test_evaluate_refuses_a_tree_deeper_than_the_limit() -> None:
    """Mutant: ``if e._depth > MAX_EXPR_DEPTH`` -> False (a tree the format and the loader
    refuse was evaluated anyway, by recursion)."""
    from kernelpack.limits import MAX_EXPR_DEPTH

    e = E.sym("n")
    for _ in range(MAX_EXPR_DEPTH):  # depth MAX_EXPR_DEPTH + 1; unfolded nodes
        e = E.Expr("neg", (e,))
    with pytest.raises(ExpressionError, match="MAX_EXPR_DEPTH"):
        e.evaluate(n=1)
    ok = E.sym("n")
    for _ in range(MAX_EXPR_DEPTH - 1):
        ok = E.Expr("neg", (ok,))
    assert ok.evaluate(n=1) == (-1 if (MAX_EXPR_DEPTH - 1) % 2 else 1)


class _CountingEnv(Mapping):
    def __init__(self, **values: int) -> None:
        self.values, self.reads = values, 0

    def __getitem__(self, key: str) -> int:
        self.reads += 1
        return self.values[key]

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def test_a_shared_node_is_evaluated_once_per_call() -> None:
    """Mutants: the memo in ``_eval`` (``if result is None`` -> True, or ``done[id(e)] =
    result`` -> pass): ``e = e + e * m`` built k times then cost 3**k steps instead of k."""
    from kernelpack.expr_eval import evaluate

    e = E.sym("n")
    for _ in range(12):
        e = e + e * E.sym("m")
    env = _CountingEnv(n=1, m=0)
    assert evaluate(e, env) == 1
    assert env.reads <= 2 * 12 + 2, env.reads  # 3**12 = 531441 reads without the memo


@pytest.mark.parametrize("value", [2.5, "3", None], ids=["float", "str", "none"])
def test_a_symbol_value_that_is_no_integer_is_named(value: object) -> None:
    """Mutant: its ``raise ExprEvalError(... not an integer)`` -> pass (UnboundLocalError,
    a non-kernelpack exception, escaped ``evaluate``)."""
    with pytest.raises(ExpressionError, match=r"symbol 'n' is .*, not an integer"):
        (E.sym("n") + 1).evaluate(n=value)


# ---- expr.py -----------------------------------------------------------------------------------


def _chain(depth: int, leaf: str = "n") -> E.Expr:
    e = E.sym(leaf)
    for _ in range(depth):
        e = E.Expr("neg", (e,))  # unfolded: -(-x) would fold
    return e


def test_deep_equality_with_colliding_hashes() -> None:
    """Mutants in the iterative ``__eq__`` of trees of depth >= 8 (``a is not b``, ``and``
    for ``or``, ``not in seen``, ``a.value == b.value``, the ``return False`` dropped or
    made True, the difference test forced either way, ``or True`` for either skip test):
    none was reached by a test where the two trees differ below an equal hash.
    ``hash(-1) == hash(-2)`` in CPython, so ``x + -1`` and ``x + -2`` hash alike."""
    assert hash(E.const(-1)) == hash(E.const(-2))
    # the top-level test ``op != op or value != value`` (mutant: ``and``)
    assert E.const(-1) != E.const(-2) and E.sym("n") + -1 != E.sym("n") + -2
    a = E.Expr("add", (_chain(9), E.const(-1)))
    b = E.Expr("add", (_chain(9), E.const(-2)))
    assert hash(a) == hash(b) and a._depth >= 8
    assert a != b and not a == b  # noqa: SIM201  # __eq__ and __ne__ each
    assert {a: 1}.get(b) is None
    same = E.Expr("add", (_chain(9), E.const(-1)))  # an equal, distinct copy
    assert a == same and not a != same and {a: 1}[same] == 1  # noqa: SIM202
    deep_sym = [E.Expr("add", (_chain(9, leaf), E.const(-1))) for leaf in ("p", "q")]
    if hash(deep_sym[0]) == hash(deep_sym[1]):  # pragma: no cover - needs a str collision
        assert deep_sym[0] != deep_sym[1]


def test_equal_copies_of_a_shared_chain_compare_in_linear_time() -> None:
    """Mutants: the ``seen`` set of the iterative ``__eq__`` bypassed (``a is b and ...``,
    ``or False``): two equal, distinct copies of ``e = e + e`` built k times were compared
    2**k pairs deep (here 2**24 node pairs: seconds; the code's own comment says a file can
    hold such copies)."""
    def shared(k: int) -> E.Expr:
        e = E.sym("n")
        for _ in range(k):
            e = e + e
        return e
    a, b = shared(24), shared(24)
    assert a is not b
    start = time.perf_counter()
    assert a == b
    assert time.perf_counter() - start < 1.0


def test_numeric_protocols_of_a_dim() -> None:
    """Mutants: ``__complex__`` of a constant (``!=``/False), ``abs`` as ``+self`` or None,
    ``round`` (``and`` for ``or``, the const branch, its condition), ``trunc``/``floor``/
    ``ceil`` returning None, ``divmod`` as ``%, %`` or None, the reflected ``divmod``."""
    n = E.sym("n")
    assert complex(E.const(3)) == 3 + 0j and float(E.const(3)) == 3.0
    with pytest.raises(TypeError, match="not a constant expression"):
        complex(n)
    with pytest.raises(TypeError, match="not a constant expression"):
        float(n)
    assert abs(n).evaluate(n=-5) == 5 and abs(n).evaluate(n=4) == 4
    assert round(n) is n and round(n, 2) is n and round(n, 0) is n
    assert round(E.const(1234), -2) == E.const(1200)
    with pytest.raises(TypeError, match="ndigits=-1"):
        round(n, -1)
    assert math.trunc(n) is n and math.floor(n) is n and math.ceil(n) is n
    q, r = divmod(n, 3)
    assert (q.evaluate(n=-7), r.evaluate(n=-7)) == (-3, 2)
    q, r = divmod(7, n)
    assert (q.evaluate(n=-2), r.evaluate(n=-2)) == (-4, -1)


def test_numpy_integers_beside_an_expression() -> None:
    """Mutants in ``__array_ufunc__`` outside a trace: its operator lookup or ``return
    op(a, b)`` dropped, the arity test ``!= 1``, ``or True``, ``kwargs`` ignored, and
    ``method != "__call__" and kwargs`` (``np.add.outer`` became an expression); and in
    ``as_expr`` the NumPy-bool exclusion (dropped or inverted)."""
    n = E.sym("n")
    assert np.int64(3) + n == n + 3
    assert (np.int64(10) // n).evaluate(n=3) == 3
    assert (np.int32(1) << n).evaluate(n=4) == 16
    for thunk in (lambda: np.sqrt(n), lambda: np.add.outer(np.int64(2), n),
                  lambda: np.add(np.int64(3), n, dtype=object)):
        with pytest.raises(TypeError):
            thunk()
    assert E.as_expr(np.int64(3)) == E.const(3)
    with pytest.raises(TypeError, match="expected an int, a symbol name or an expression"):
        E.as_expr(np.bool_(True))


def test_an_operand_of_no_known_kind_is_not_implemented() -> None:
    """Mutant: ``return NotImplemented`` -> pass in the operator methods (``n + object()``
    returned None instead of Python's TypeError)."""
    n = E.sym("n")
    for other in (object(), [1], 1.5):
        with pytest.raises(TypeError):
            n + other
        with pytest.raises(TypeError):
            other * n


def test_float_and_bitwise_dims_inside_a_fusion_trace() -> None:
    """Mutants: the float branch of ``_binop`` (``x.shape[0] * 0.5``), ``_traced_only``
    returning None, and the ``/``, ``^`` lines dropped: inside a trace a dim mixed with a
    float or a bitwise operator is a traced int64 value."""
    @kp.fusion
    def f(x: kp.Tensor[kp.f32, "m", "n"]):
        return (x / x.shape[1] + x.shape[0] * 0.5, x.shape[1] ^ x.shape[0], 1.0 / x.shape[0],
                x.shape[0] | x.shape[1], x.shape[0] & 3, x.shape[1] ** 0.5)

    graph = f.trace()
    ops = [node.op for node in graph.nodes]
    for op in ("div", "mul", "xor", "or", "and", "pow"):
        assert op in ops, (op, ops)
    assert len(graph.outputs) == 6


def test_reflected_float_operator_and_numpy_ufunc_on_a_dim_inside_a_trace() -> None:
    """Mutants: the reflected dunder's name (``2.5 - x.shape[0]`` traced as
    ``x.shape[0] - 2.5``) and ``__array_ufunc__`` not tracing the Expr inputs
    (``np.sqrt(x.shape[-1])``, the attention scale, failed inside a fusion)."""
    @kp.fusion
    def f(x: kp.Tensor[kp.f32, "m", "n"]):
        return 2.5 - x.shape[0], np.sqrt(x.shape[1])

    graph = f.trace()
    nodes = {node.id: node for node in graph.nodes}
    sub = nodes[dict(graph.outputs)["out0"]]
    assert sub.op == "sub"
    assert [nodes[i].op for i in sub.inputs] == ["const", "dim"]
    assert nodes[dict(graph.outputs)["out1"]].op == "sqrt"


def test_substitute_through_constants() -> None:
    """Mutant: ``return a if False else done[id(a)]`` in ``substitute``'s rebuild (every
    expression holding a constant raised KeyError)."""
    n, m = E.sym("n"), E.sym("m")
    e = E.cdiv(n * 4 + 1, 256)
    out = e.substitute({"n": m + 2})
    assert out == E.cdiv((m + 2) * 4 + 1, 256)
    assert out.evaluate(m=100) == e.evaluate(n=102)


def test_an_expression_never_equals_a_float_or_str() -> None:
    """Mutant: ``isinstance(other, int)`` -> True in ``__eq__`` (``const(3) == 3.0`` became
    True: only an int is a constant's value)."""
    assert E.const(3) == 3 and E.const(3) != 3.0 and E.const(3) != "3"
    assert not (E.const(1) == True)  # noqa: SIM201  # bool is no dim either


def test_round_with_a_non_integer_ndigits_is_refused() -> None:
    """Mutant: ``isinstance(ndigits, int)`` -> True in ``__round__`` (``round(n, 1.5)``
    returned n; Python's own ``round(5, 1.5)`` is a TypeError)."""
    with pytest.raises(TypeError, match="ndigits=1.5"):
        round(E.sym("n"), 1.5)  # type: ignore[call-overload]


def test_numpy_floats_and_bools_beside_an_expression_are_type_errors() -> None:
    """Mutant: ``return NotImplemented`` -> pass where ``as_expr`` refuses a NumPy operand
    (UnboundLocalError instead of NumPy's TypeError)."""
    n = E.sym("n")
    for other in (np.float64(1.5), np.bool_(True)):
        with pytest.raises(TypeError, match="NotImplemented"):
            other + n


def test_pickle_round_trip_of_an_expression() -> None:
    """Mutant: ``__reduce__`` -> pass (pickle then failed: ``__slots__`` without state)."""
    e = E.select(E.lt("n", 0), -E.sym("n"), E.cdiv("n", 256) * 4 + 1)
    back = pickle.loads(pickle.dumps(e))
    assert back == e and hash(back) == hash(e) and str(back) == str(e)
    assert back.evaluate(n=1000) == e.evaluate(n=1000)


def test_expr_constructor_refuses_bad_args_and_values() -> None:
    """Mutants: the ``args must be a tuple`` raise dropped (a list was taken), ``operator
    takes no value`` dropped (``Expr("add", (a, b), 5)`` kept a value) and ``const()``'s
    ``isinstance(value, int)`` test dropped (``const(2.5)`` made a float constant)."""
    a, b = E.sym("a"), E.sym("b")
    with pytest.raises(TypeError, match="args must be a tuple"):
        E.Expr("add", [a, b])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no value"):
        E.Expr("add", (a, b), 5)
    with pytest.raises(TypeError, match="must be an int"):
        E.const(2.5)  # type: ignore[arg-type]
    assert E.const(True) == E.const(1)


@pytest.mark.parametrize("build, n", [
    (lambda: E.select(E.gt(E.floordiv(1, "n"), 0), 5, 5), 0),
    (lambda: E.floordiv(1, "n") * 0, 0),
    (lambda: E.select(E.lt(E.shl(1, "n"), 0), "m", "m"), 64),
], ids=["select-same-sides", "times-zero", "select-shift"])
def test_a_fallible_operand_is_never_folded_away(build, n: int) -> None:
    """Mutants: ``_cannot_fail`` not walking the operands (``stack.extend`` -> pass),
    ``t == f and True`` in select, ``bv == 0 and True`` in mul: ``1 // n`` vanished, so
    n = 0 no longer raised."""
    e = build()
    with pytest.raises(ExpressionError):
        e.evaluate(n=n, m=1)


def test_reassociating_constants_needs_a_constant_on_both_levels() -> None:
    """Mutants: ``bv is not None`` -> True in the add and mul re-association, and
    ``a.args[1].is_const`` -> True in mul (``(n + 3) + m`` raised TypeError, ``(n * m) * 3``
    ValueError: the identity read a symbol's name as a number)."""
    n, m = E.sym("n"), E.sym("m")
    assert ((n + 3) + m).evaluate(n=1, m=2) == 6
    assert ((n * 3) * m).evaluate(n=2, m=5) == 30
    assert ((n * m) * 3).evaluate(n=2, m=5) == 30
    assert str((n + 3) + 4) == "n + 7" and str((n * 3) * 4) == "n * 12"


def test_reassociation_folds_up_to_int64_max_exactly() -> None:
    """Mutants: ``total <= INT64_MAX`` / ``product <= INT64_MAX`` as ``<`` (a sum or product
    of exactly INT64_MAX was left unfolded; printed and keyed differently)."""
    n = E.sym("n")
    assert str((n + (IMAX - 1)) + 1) == f"n + {IMAX}"
    assert str((n * 7) * (IMAX // 7)) == f"n * {IMAX}"
    assert str((n + (IMIN + 1)) + -1) == f"n + {IMIN}"
    # past int64 the nested form stays (mutant: the range test -> True, and const() of
    # the sum raised ValueError while building)
    assert ((n + IMAX) + 1).evaluate(n=-2) == IMAX - 1
    assert ((n * 2**62) * 4).evaluate(n=0) == 0


def test_codegen_digest_of_a_zip_import_equals_the_directorys(tmp_path: Path) -> None:
    """Mutants in ``codegen_digest``'s zip branch (``rpartition(".cache")[1]``, its
    assignment dropped, ``here.is_dir()`` -> True): the existing zip test zips the checkout's
    ``src/``, so it never sees the kernelpack actually imported. Here the imported package is
    zipped and its digest, computed from the zip, must equal the directory's."""
    import subprocess
    import zipfile

    pkg = Path(kp.__file__).resolve().parent
    zipped = tmp_path / "kp.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for f in sorted(pkg.rglob("*.py")):
            if "__pycache__" not in f.parts:
                zf.writestr(f.relative_to(pkg.parent).as_posix(), f.read_bytes())
    code = ("import kernelpack, sys\nfrom kernelpack.cache.keys import codegen_digest\n"
            "print(kernelpack.__file__)\nprint(codegen_digest())")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                           f"{str(zipped)!r})\n" + code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, digest = proc.stdout.split("\n")[:2]
    assert where.startswith(str(zipped))
    assert digest == codegen_digest() and digest.startswith("sha256:")


def test_explain_of_a_key_of_no_parts() -> None:
    """Review 35a's note: ``explain()`` of a hand-made key with no parts raised ValueError
    from ``max()`` of nothing; it is the digest line alone."""
    key = kp.CacheKey.from_parts([])
    assert key.explain() == f"key {key.digest}"
