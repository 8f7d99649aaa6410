"""Review 24: the lazy index of c9e8d44 and the decode/trace fast paths of a80be45.

c9e8d44: ``kp.load`` of a pack of more than ``loader._DEFER_TABLES_FROM`` modules/programs
read into memory makes each module's ImageInfo objects on the first read of
``ModuleInfo.images`` (``loader._plain_images`` decides at load that ImageInfo cannot fail
later) and each Program's table on first decode. Pinned here: every hostile image field of a
pack of 12 modules is refused *by kp.load*, with the words the eager index used; valid edge
values defer and give the eager images; Pack.verify, re-saving, pickling, repr and the CLI
give what the eager index gave. Behaviour changes it found (fixed with this file's
commit) are pinned by tests that fail on a80be45:
``test_images_do_not_reread_a_callers_buffer_after_load`` and
``test_a_callers_memory_map_is_not_read_after_load`` (one cause: deferred images locate
their blobs in the caller's buffer after load), and
``test_racing_first_reads_of_images_see_one_set_of_images``.

a80be45: the data model skips re-checking values already in checked form. Pinned here: the
words of every ``KernelSummary.check`` failure, and what the fields accept and refuse for
unusual inputs (namedtuples, NumPy ints/bools, bools, negative constants, ranks at the
limit, short grids, Expr subclasses), and the cache-key bytes of traces. Two behaviour
changes (fixed) are pinned by tests that failed on a80be45:
``test_a_constant_dim_that_is_not_an_int_is_judged_as_before`` and
``test_expression_immediates_must_be_ints_whatever_was_cached``.

The expectations were taken from 95fe373 (before both commits; c9e8d44 for the traces) and
checked to hold there, except those that pin the deferral itself (``_images is None``).
"""

from __future__ import annotations

import collections
import copy
import hashlib
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable

import flatbuffers
import numpy as np
import pytest
import zstandard

import kernelpack as kp
from kernelpack import _fbread, cli, loader
from kernelpack.errors import FormatError, IntegrityError, KernelPackError
from kernelpack.expr import Expr, _CONST_CACHE, const, sym
from kernelpack.expr_program import OP_CONST, OP_END, OP_SYM, EncodedExprs, ExprProgram
from kernelpack.limits import MAX_ARGS, MAX_IMAGE_SIZE, MAX_RANK
from kernelpack.serializer import assemble

from kp_handwritten import Spec, _bytes, _offsets, _program
from test_verify_c_differential import artifacts


# ---- a hand-built pack of many modules, every ImageMeta field set by the test -------------------
def _zstd(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=True).compress(raw)


RAWS = [b"\x7fELF cubin %d " % i * 40 for i in range(4)]
# blobs 0..3: zstd frames; blob 4: stored uncompressed (stored == raw)
BLOBS: list[tuple[bytes, bytes]] = [(_zstd(r), r) for r in RAWS] + [(b"raw image", b"raw image")]
N_MODULES = 12  # > loader._DEFER_TABLES_FROM (8): the pack defers
assert N_MODULES > getattr(loader, "_DEFER_TABLES_FROM", 8)


def _image(b: flatbuffers.Builder, *, kind: int = 0, major: int = 8, minor: int = 0,
           suffix: int = 0, codec: int = 1, blob: int = 0, raw_size: int | None = None,
           digest: bytes | None = None, raw_digest: bytes | None = None,
           ptx_isa: tuple[int, int] | None = None, cuda: int = 12080,
           toolchain: str = "t") -> int:
    """One ImageMeta; digests and raw_size default to those of blob ``blob``."""
    stored, raw = BLOBS[blob] if blob < len(BLOBS) else (b"", b"")
    tc = b.CreateString(toolchain)
    dg = _bytes(b, hashlib.sha256(stored).digest() if digest is None else digest)
    rdg = _bytes(b, hashlib.sha256(raw).digest() if raw_digest is None else raw_digest)
    b.StartObject(12)
    b.PrependUint8Slot(0, kind, 0)
    b.PrependUint8Slot(1, major, 0)
    b.PrependUint8Slot(2, minor, 0)
    b.PrependUint8Slot(3, suffix, 0)
    if ptx_isa is not None:
        b.Prep(1, 2)
        b.PrependUint8(ptx_isa[1])
        b.PrependUint8(ptx_isa[0])
        b.Slot(4)
    b.PrependUint32Slot(5, cuda, 0)
    b.PrependUOffsetTRelativeSlot(6, tc, 0)
    b.PrependUint8Slot(7, codec, 0)
    b.PrependUint64Slot(8, len(raw) if raw_size is None else raw_size, 0)
    b.PrependUOffsetTRelativeSlot(9, dg, 0)
    b.PrependUOffsetTRelativeSlot(10, rdg, 0)
    b.PrependUint32Slot(11, blob, 0)
    return b.EndObject()


def _bare_program(b: flatbuffers.Builder, name: str | None) -> int:
    """A Program table holding only its name (or nothing): load reads only the names."""
    off = b.CreateString(name) if name is not None else None
    b.StartObject(7)
    if off is not None:
        b.PrependUOffsetTRelativeSlot(0, off, 0)
    return b.EndObject()


GOOD = [dict(blob=0), dict(kind=1, major=9, blob=1, ptx_isa=(8, 5))]


def build(images: dict[int, list[dict]] | None = None, *, names: dict[int, str] | None = None,
          programs: list[str | None] | None = None, n: int = N_MODULES,
          extra_blobs: tuple[bytes, ...] = (),
          kernels: dict[int, list[str]] | None = None) -> bytes:
    """A pack of ``n`` modules m00.. (module i's images: ``images[i]``, else two good ones
    naming blobs i % 4 and (i + 1) % 4; its kernels ``kernels[i]``, else ["k"]) and one
    program p<i> launching kernel k of each; ``programs``: bare programs of these names
    instead (load-time name checks only)."""
    images = images or {}
    names = names or {}
    kernels = kernels or {}
    b = flatbuffers.Builder(4096)
    mods = []
    mnames = [names.get(i, f"m{i:02d}") for i in range(n)]
    for i, mname in enumerate(mnames):
        spec = images.get(i, [dict(GOOD[0], blob=i % 4), dict(GOOD[1], blob=(i + 1) % 4)])
        offs = [_image(b, **kw) for kw in spec]
        nm = b.CreateString(mname)
        kern = _offsets(b, [b.CreateString(k) for k in kernels.get(i, ["k"])])
        iv = _offsets(b, offs)
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, nm, 0)
        b.PrependUOffsetTRelativeSlot(1, kern, 0)
        b.PrependUOffsetTRelativeSlot(2, iv, 0)
        mods.append(b.EndObject())
    if programs is None:
        # program p<i> launches module m<i> by its default name (``names`` can remove it)
        progs = [_program(b, f"p{i:02d}", Spec(launch_module=f"m{i:02d}")) for i in range(n)]
    else:
        progs = [_bare_program(b, p) for p in programs]
    gen = b.CreateString("review24")
    pv, mv = _offsets(b, progs), _offsets(b, mods)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, gen, 0)
    b.PrependUOffsetTRelativeSlot(1, pv, 0)
    b.PrependUOffsetTRelativeSlot(2, mv, 0)
    b.Finish(b.EndObject())
    return assemble(bytes(b.Output()), [s for s, _ in BLOBS] + list(extra_blobs), None)


def facts(images: Any) -> list[tuple]:
    return [(i.module, i.kind, i.arch, i.codec, i.stored_size, i.raw_size, i.digest,
             i.raw_digest, i.toolchain, i.cuda_version, i.ptx_isa, i.blob, i.target, repr(i))
            for i in images]


def outcome(data: bytes | memoryview) -> Any:
    """Facts of every module's images after load, or the load error's type and words."""
    try:
        pack = kp.load(data)
    except KernelPackError as exc:
        return type(exc).__name__, str(exc)
    return {name: facts(m.images) for name, m in pack.modules.items()}


def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """kp.load as before c9e8d44: every ImageInfo and Program table made at load."""
    monkeypatch.setattr(loader, "_DEFER_TABLES_FROM", 10 ** 9, raising=False)


def test_the_hand_built_pack_defers_and_matches_the_eager_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = build()
    pack = kp.load(data)
    assert len(pack.modules) == N_MODULES and len(pack) == N_MODULES
    assert all(m._images is None for m in pack.modules.values())  # the case under test
    lazy = outcome(data)
    pack.verify()
    eager(monkeypatch)
    assert all(m._images is not None for m in kp.load(data).modules.values())
    assert outcome(data) == lazy
    assert lazy["m03"][1][12:] == ("compute_90", "ImageInfo(m03:compute_90, zstd, 30/520 bytes)")


# ---- hostile image metadata in a deferring pack: refused by kp.load, with the same words --------
HOSTILE: dict[str, tuple[dict[int, list[dict]], str, str]] = {
    "arch_major 0": ({5: [dict(major=0)]}, "FormatError",
                     "module 'm05': image has arch_major 0, arch_minor 0 (expected 1..99 and "
                     "0..9)"),
    "arch_major 100": ({5: [dict(major=100)]}, "FormatError",
                       "module 'm05': image has arch_major 100, arch_minor 0 (expected 1..99 and "
                       "0..9)"),
    "arch_major 255": ({5: [dict(major=255, minor=255)]}, "FormatError",
                       "module 'm05': image has arch_major 255, arch_minor 255 (expected 1..99 and "
                       "0..9)"),
    "arch_minor 10": ({5: [dict(major=9, minor=10)]}, "FormatError",
                      "module 'm05': image has arch_major 9, arch_minor 10 (expected 1..99 and "
                      "0..9)"),
    "digest 31 bytes": ({5: [dict(digest=b"d" * 31)]}, "FormatError",
                        "module 'm05' image sm_80: digests must be 32 bytes (got 31 and 32)"),
    "digest empty": ({5: [dict(digest=b"")]}, "FormatError",
                     "module 'm05' image sm_80: digests must be 32 bytes (got 0 and 32)"),
    "raw_digest 1 byte on a ptx image": (
        {5: [dict(kind=1, major=9, raw_digest=b"r")]}, "FormatError",
        "module 'm05' image compute_90: digests must be 32 bytes (got 32 and 1)"),
    "raw_size over MAX_IMAGE_SIZE": (
        {5: [dict(raw_size=MAX_IMAGE_SIZE + 1)]}, "FormatError",
        f"module 'm05' image sm_80: raw_size {MAX_IMAGE_SIZE + 1} exceeds MAX_IMAGE_SIZE "
        f"{MAX_IMAGE_SIZE}"),
    "raw_size 2**64 - 1": (
        {5: [dict(raw_size=(1 << 64) - 1)]}, "FormatError",
        f"module 'm05' image sm_80: raw_size {(1 << 64) - 1} exceeds MAX_IMAGE_SIZE "
        f"{MAX_IMAGE_SIZE}"),
    "blob one past the end": ({5: [dict(blob=len(BLOBS))]}, "FormatError",
                              "module 'm05' image sm_80: blob index 5 outside 0..4"),
    "blob 2**32 - 1": ({5: [dict(blob=(1 << 32) - 1)]}, "FormatError",
                       "module 'm05' image sm_80: blob index 4294967295 outside 0..4"),
    "uncompressed, size differs": (
        {5: [dict(codec=0, blob=0, raw_size=len(RAWS[0]))]}, "IntegrityError",
        f"module 'm05' image sm_80: stored uncompressed as {len(BLOBS[0][0])} bytes but raw_size "
        f"is {len(RAWS[0])}"),
    "no images": ({5: []}, "FormatError",
                  "module 'm05': images must be non-empty, sorted by target and one per target "
                  "(got [])"),
    "targets unsorted": ({5: [dict(major=9), dict(major=8, blob=1)]}, "FormatError",
                         "module 'm05': images must be non-empty, sorted by target and one per "
                         "target (got ['sm_90', 'sm_80'])"),
    "one target twice": ({5: [dict(major=9, blob=0), dict(major=9, blob=1)]}, "FormatError",
                         "module 'm05': images must be non-empty, sorted by target and one per "
                         "target (got ['sm_90', 'sm_90'])"),
    "ptx before cubin": ({5: [dict(kind=1), dict(kind=0, blob=1)]}, "FormatError",
                         "module 'm05': images must be non-empty, sorted by target and one per "
                         "target (got ['compute_80', 'sm_80'])"),
    "suffix a before plain": ({5: [dict(major=9, suffix=1), dict(major=9, blob=1)]},
                              "FormatError",
                              "module 'm05': images must be non-empty, sorted by target and one "
                              "per target (got ['sm_90a', 'sm_90'])"),
    "host before cubin": ({5: [dict(kind=2, major=9), dict(kind=0, major=9, blob=1)]},
                          "FormatError",
                          "module 'm05': images must be non-empty, sorted by target and one per "
                          "target (got ['host-sm_90', 'sm_90'])"),
    "the second image bad": ({5: [dict(), dict(major=9, blob=9)]}, "FormatError",
                             "module 'm05' image sm_90: blob index 9 outside 0..4"),
    "the first of two faults wins": ({5: [dict(blob=9), dict(major=9, digest=b"")]},
                                     "FormatError",
                                     "module 'm05' image sm_80: blob index 9 outside 0..4"),
    "unsorted and a bad blob: the blob": ({5: [dict(major=9), dict(major=8, blob=7)]},
                                          "FormatError",
                                          "module 'm05' image sm_80: blob index 7 outside 0..4"),
    "first module": ({0: [dict(major=0)]}, "FormatError",
                     "module 'm00': image has arch_major 0, arch_minor 0 (expected 1..99 and "
                     "0..9)"),
    "last module": ({N_MODULES - 1: [dict(digest=b"x" * 16)]}, "FormatError",
                    "module 'm11' image sm_80: digests must be 32 bytes (got 16 and 32)"),
    "two bad modules: the first": ({3: [dict(blob=8)], 7: [dict(major=0)]}, "FormatError",
                                   "module 'm03' image sm_80: blob index 8 outside 0..4"),
}


@pytest.mark.parametrize("label", list(HOSTILE))
def test_hostile_image_metadata_is_refused_by_load_with_the_eager_words(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    images, kind, words = HOSTILE[label]
    data = build(images)
    assert outcome(data) == (kind, words)
    eager(monkeypatch)
    assert outcome(data) == (kind, words)


def test_load_errors_keep_their_order_across_modules_and_programs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A module's bad name is found before a later module's bad image; a bad image before
    the module names' order and the program names (checked after every module)."""
    cases = [
        (build({5: [dict(major=0)]}, names={3: "3bad"}),
         ("FormatError", "module name '3bad' is not an identifier")),
        (build({9: [dict(blob=99)]}, names={1: "m99"}),
         ("FormatError", "module 'm09' image sm_80: blob index 99 outside 0..4")),
        (build({2: [dict(minor=10)]}, programs=["b", "a"] + [f"p{i:02d}" for i in range(10)]),
         ("FormatError", "module 'm02': image has arch_major 8, arch_minor 10 (expected 1..99 "
                         "and 0..9)")),
        (build(names={1: "m99"}),
         ("FormatError", "body: module names must be sorted and unique ('m99' then 'm02')")),
    ]
    got = [outcome(data) for data, _ in cases]
    assert got == [want for _, want in cases]
    eager(monkeypatch)
    assert [outcome(data) for data, _ in cases] == got


VALID_EDGES: dict[str, list[dict]] = {
    "arch 1.0 and 99.9": [dict(major=1, minor=0), dict(major=99, minor=9, blob=1)],
    "every suffix": [dict(major=10, suffix=0), dict(major=10, suffix=1, blob=1),
                     dict(major=10, suffix=2, blob=2)],
    "every kind of one arch": [dict(kind=0, major=12), dict(kind=1, major=12, ptx_isa=(8, 7)),
                               dict(kind=2, major=12)],
    "ptx_isa on a cubin is dropped": [dict(kind=0, ptx_isa=(9, 9))],
    "raw_size 0 and MAX_IMAGE_SIZE": [dict(raw_size=0), dict(major=9, raw_size=MAX_IMAGE_SIZE)],
    "one blob for all": [dict(major=8, blob=3), dict(major=9, blob=3), dict(kind=1, blob=3)],
    "last blob, no toolchain": [dict(blob=3, toolchain="", cuda=0)],
}


@pytest.mark.parametrize("label", list(VALID_EDGES))
def test_valid_edge_metadata_defers_and_gives_the_eager_images(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = build({5: VALID_EDGES[label], 6: [dict(codec=0, blob=4), dict(major=9, blob=1)]})
    pack = kp.load(data)
    assert pack.modules["m05"]._images is None  # deferred (the case under test)
    assert pack.modules["m06"]._images is not None  # an uncompressed image: made at load
    lazy = outcome(data)
    eager(monkeypatch)
    assert outcome(data) == lazy
    assert [f[12] for f in lazy["m05"]] == [i.target for i in kp.load(data).modules["m05"].images]


def test_verify_finds_the_same_first_bad_image_as_the_eager_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Images whose stored bytes do not match their digest (claims that load cannot check):
    Pack.verify names the same image, and reading it raises the same words."""
    data = build({4: [dict(digest=b"\x01" * 32)], 8: [dict(raw_digest=b"\x02" * 32)]})

    def run() -> tuple:
        pack = kp.load(data)
        with pytest.raises(IntegrityError) as first:
            pack.verify()
        with pytest.raises(IntegrityError) as later:
            pack.modules["m08"].images[0].read()
        return str(first.value), str(later.value), facts(pack.modules["m04"].images)

    lazy = run()
    assert lazy[0].startswith("module 'm04' image sm_80: stored bytes do not match their "
                              "digest (expected sha256 " + "01" * 32 + ", got ")
    assert lazy[1].startswith("module 'm08' image sm_80: decompressed bytes do not match "
                              "raw_digest (expected sha256 " + "02" * 32 + ", got ")
    eager(monkeypatch)
    assert run() == lazy


# ---- what a loaded pack of many modules gives later ----------------------------------------------
def test_hundred_program_pack_gives_the_eager_results(monkeypatch: pytest.MonkeyPatch) -> None:
    data = artifacts()["hundred"]

    def run() -> tuple:
        pack = kp.load(data)
        pack.verify()
        names = pack.programs
        summaries = [pack[n].summary for n in names[::17]]
        compiled = [pack.compiled(n) for n in (names[0], names[50], names[-1])]
        reprs = [repr(m) for m in pack.modules.values()]
        return (kp.save(pack), summaries, compiled, reprs, outcome(data), repr(pack),
                sorted(pack["p042"].modules))

    lazy = run()
    assert lazy[0] == data  # re-saved byte for byte
    eager(monkeypatch)
    assert run() == lazy


def test_program_names_are_checked_as_the_eager_index_checked_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack of > 8 programs reads their names in one Table.tree call (the C reader where
    built, else Python): absent, empty, non-identifier, unsorted and duplicate names."""
    ten = [f"p{i:02d}" for i in range(10)]
    cases = {
        "absent": [None] + ten,
        "empty": [""] + ten,
        "not an identifier": ["0p"] + ten,
        "unsorted": ten[:4] + [ten[5], ten[4]] + ten[6:],
        "twice": ten + [ten[-1]],
        "fine": ten,
    }
    want = {
        "absent": ("FormatError", "program name '' is not an identifier"),
        "empty": ("FormatError", "program name '' is not an identifier"),
        "not an identifier": ("FormatError", "program name '0p' is not an identifier"),
        "unsorted": ("FormatError", "body: program names must be sorted and unique ('p05' then "
                                    "'p04')"),
        "twice": ("FormatError", "body: program names must be sorted and unique ('p09' then "
                                 "'p09')"),
    }

    def names(data: bytes) -> Any:
        try:
            return kp.load(data).programs
        except KernelPackError as exc:
            return type(exc).__name__, str(exc)

    packs = {label: build(programs=progs) for label, progs in cases.items()}
    lazy = {label: names(data) for label, data in packs.items()}
    assert lazy == dict(want, fine=ten)
    monkeypatch.setattr(_fbread, "_native_tree", False)  # the Python reader
    assert {label: names(data) for label, data in packs.items()} == lazy
    eager(monkeypatch)
    assert {label: names(data) for label, data in packs.items()} == lazy


def test_a_program_naming_a_missing_module_fails_at_decode_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = build(names={7: "m07x"})  # p07 launches m07, which the file now lacks

    def run() -> tuple:
        pack = kp.load(data)
        with pytest.raises(FormatError) as decode:
            pack["p07"].summary
        with pytest.raises(FormatError) as check:
            kp.load(data).verify()
        return str(decode.value), str(check.value), pack["p06"].summary

    lazy = run()
    assert lazy[0] == ("program 'p07' variant 0: launch of 'k' uses module 'm07', which the "
                       "file does not contain")
    assert lazy[1] == lazy[0]
    eager(monkeypatch)
    assert run() == lazy


def test_loaded_modules_and_images_refuse_pickling_and_print_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> list:
        pack = kp.load(build())
        out = []
        for name in ("m00", "m11"):
            module = pack.modules[name]
            for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError) as exc:
                    attempt(module)
                out.append(str(exc.value))
            out.append(repr(module))
            image = module.images[1]
            with pytest.raises(TypeError) as exc:
                pickle.dumps(image)
            out.append(str(exc.value))
            out.append(module.module())
        return out

    lazy = run()
    assert lazy[0] == ("a loaded ModuleInfo ('m00') cannot be pickled or copied: it reads from "
                       "its pack's buffer; send .module() (a kp.Module) or pack.compiled(name) "
                       "instead")
    assert lazy[3] == "ModuleInfo(m00, kernels=['k'], images=['sm_80', 'compute_90'])"
    assert lazy[4] == ("a loaded image ('m00' ptx sm_90) cannot be pickled or copied: it reads "
                       "from its pack's buffer; send pack.compiled(name) (or the artifact's "
                       "bytes) instead")
    assert pickle.loads(pickle.dumps(lazy[5])) == lazy[5]  # .module() is a plain kp.Module
    eager(monkeypatch)
    assert run() == lazy


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_inspect_verify_extract_print_as_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    hundred = tmp_path / "hundred.kpack"
    hundred.write_bytes(artifacts()["hundred"])
    corrupt = tmp_path / "corrupt.kpack"
    corrupt.write_bytes(build({6: [dict(digest=b"\x03" * 32)]}))

    def run(tag: str) -> list:
        out = []
        for path in (hundred, corrupt):
            for argv in (["inspect"], ["inspect", "--json"], ["inspect", "--device", "sm_90"],
                         ["verify"]):
                out.append(_cli(argv + [str(path)], capsys))
            dest = tmp_path / f"x-{tag}-{path.stem}"
            status = _cli(["extract", "-o", str(dest), str(path)], capsys)
            files = sorted((p.relative_to(dest).as_posix(), p.read_bytes())
                           for p in dest.rglob("*") if p.is_file()) if dest.exists() else []
            out.append((status[0], status[1].replace(str(dest), "DEST"),
                        status[2].replace(str(dest), "DEST"), files))
        return out

    lazy = run("lazy")
    assert [r[0] for r in lazy] == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert "module 'm06' image sm_80: stored bytes do not match their digest" in lazy[8][2]
    images = sum(len(m.images) for m in kp.load(artifacts()["hundred"]).modules.values())
    assert len(lazy[4][3]) == images == 300  # hundred: every image of its 100 modules
    eager(monkeypatch)
    assert run("eager") == lazy


# ---- the buffer the caller handed kp.load --------------------------------------------------------
def test_images_do_not_reread_a_callers_buffer_after_load() -> None:
    """Was a bug of c9e8d44 (fixed after this review):
    kp.load keeps a read-only view of a writable buffer as it is (only a
    writable view is copied), and checked every image's blob location at load. With the
    images of a pack of > 8 modules deferred, the first ``module.images`` (and so
    Pack.verify, repr, the runtime) reads the blob vector's offsets from the caller's buffer
    *after* load: changed bytes then give wrong stored sizes or a bare ``struct.error``,
    where before images were what load saw and reading them was an IntegrityError."""
    data = build()
    want = outcome(data)
    for fill in (b"\x00", b"\xff"):
        backing = bytearray(data)
        pack = kp.load(memoryview(backing).toreadonly())
        backing[:] = fill * len(backing)  # the caller reuses its buffer
        got = {}
        for name, module in pack.modules.items():
            try:
                got[name] = facts(module.images)
            except Exception as exc:  # noqa: BLE001 - what is raised is the finding
                got[name] = (type(exc).__name__, str(exc)[:80])
        assert got == want, f"fill {fill!r}: images changed after load"
        with pytest.raises(IntegrityError, match="stored bytes do not match their digest"):
            pack.verify()


def _child(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter importing this checkout's kernelpack."""
    src = Path(kp.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, env=env, timeout=60)


def test_a_callers_memory_map_is_not_read_after_load(tmp_path: Path) -> None:
    """Was a bug of c9e8d44 (fixed), the same cause as above:
    kp.load takes ``memoryview(mmap)`` of the
    caller's own map as it is, and a pack of > 8 modules now reads it on the first
    ``module.images`` (even ``repr(module)``). The file truncated after load then kills the
    process with SIGBUS (exit -7) where the eager index had located every blob at load.
    (The loader's own map of a file over 1 MiB is eager: the next test.)"""
    path = tmp_path / "mapped.kpack"
    path.write_bytes(build())
    run = _child(f"""
        import mmap, os, kernelpack as kp
        with open({str(path)!r}, "rb") as f:
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        pack = kp.load(view)
        os.truncate({str(path)!r}, 0)
        print(repr(pack.modules["m03"]))
        print(pack["p03"].summary.name)
    """)
    assert (run.returncode, run.stdout.split("\n")[:2]) == (
        0, ["ModuleInfo(m03, kernels=['k'], images=['sm_80', 'compute_90'])", "p03"]), \
        run.stderr[-2000:]


def test_a_large_file_makes_its_images_at_load(tmp_path: Path) -> None:
    """A file over 1 MiB is memory-mapped: its images are located at load, so a file
    truncated after load gives IntegrityError when read, never SIGBUS (in a child process:
    a fault would kill it, not the test run)."""
    path = tmp_path / "big.kpack"
    path.write_bytes(build(extra_blobs=(os.urandom((1 << 20) + 4096),)))
    assert path.stat().st_size > loader._READ_LIMIT
    run = _child(f"""
        import os, kernelpack as kp
        pack = kp.load({str(path)!r})
        os.truncate({str(path)!r}, 64)
        print([repr(m) for m in pack.modules.values()][5])
        print(pack['p03'].summary.name)
        try:
            pack.verify()
        except kp.errors.IntegrityError as exc:
            print("IntegrityError", "truncated after load" in str(exc))
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:3] == [
        "ModuleInfo(m05, kernels=['k'], images=['sm_80', 'compute_90'])", "p03",
        "IntegrityError True"]


def test_racing_first_reads_of_images_see_one_set_of_images(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was a bug of c9e8d44 (minor; fixed):
    threads reading a deferred ``module.images`` for the first time
    at once each make and return their own ImageInfo objects (ImageInfo has no __eq__, so
    the tuples are not "equal", and each caller keeps its own): an image one thread checked
    or decompressed (its ``_stored_ok``/``_data``) is checked or decompressed again by the
    next, and ``a.images[0] is b.images[0]`` fails, where the eager index gave every thread
    the same objects. The barrier below only widens the window (it gives up after 1 s, so a
    fix that serialises the first read passes)."""
    pack = kp.load(build())
    module = pack.modules["m04"]  # deferred: see the first test
    threads = 4
    barrier = threading.Barrier(threads, timeout=1.0)
    entered: set[int] = set()
    real = loader.ImageInfo

    class SlowImageInfo(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            me = threading.get_ident()
            if me not in entered:
                entered.add(me)
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    pass
            super().__init__(*args)

    monkeypatch.setattr(loader, "ImageInfo", SlowImageInfo)
    results: list[Any] = [None] * threads

    def read(i: int) -> None:
        results[i] = module.images

    workers = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    final = module.images
    assert all(r is not None for r in results)
    assert all(r[0] is final[0] and r[1] is final[1] for r in results), \
        "racing threads got different ImageInfo objects"


# ---- a80be45: KernelSummary.check's words for every field ---------------------------------------
X = kp.Tensor("x", kp.f32, ["n"])


def _launch(**kw: Any) -> kp.Launch:
    fields = dict(kernel="k", module="m", grid=(1,), block=(128,), args=(kp.Arg.buffer("x"),))
    fields.update(kw)
    return kp.Launch(**fields)


def _summary(params: tuple = (X,), variants: tuple | None = None, constraints: tuple = (),
             **launch: Any) -> kp.KernelSummary:
    return kp.KernelSummary("p", params, variants or (kp.Variant((_launch(**launch),)),),
                            constraints)


UNBOUND = "reads unbound symbol(s) ['q'] (bound: ['n'])"
CHECKS: dict[str, tuple[Callable[[], Any], str]] = {
    "tensor shape": (lambda: _summary(params=(X, kp.Tensor("y", kp.f32, ["n", "q"], role="out"))),
                     f"program 'p': y.shape[1] {UNBOUND}"),
    "computed scalar": (lambda: _summary(params=(X, kp.Scalar("s", kp.i32, value=sym("q") + 1))),
                        f"program 'p': scalar s {UNBOUND}"),
    "constraint": (lambda: _summary(constraints=(kp.Constraint(sym("q") > 1, "m"),)),
                   f"program 'p': a constraint {UNBOUND}"),
    "variant predicate": (lambda: _summary(variants=(
        kp.Variant((_launch(),)), kp.Variant((_launch(),), predicate=sym("q") > 1))),
        f"program 'p': variant 1 predicate {UNBOUND}"),
    "scratch shape": (lambda: _summary(variants=(
        kp.Variant((_launch(),), scratch=(kp.Scratch("w", kp.f32, [2, "q"]),)),)),
        f"program 'p': scratch w.shape[1] {UNBOUND}"),
    "launch count": (lambda: _summary(count=sym("q"), loop="i"),
                     f"program 'p': variant 0 launch 0 (k) count {UNBOUND}"),
    "count reading its own loop symbol": (
        lambda: _summary(count=sym("i"), loop="i"),
        "program 'p': variant 0 launch 0 (k) count reads unbound symbol(s) ['i'] (bound: ['n'])"),
    "grid": (lambda: _summary(grid=(sym("q"),)),
             f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "grid reading a loop symbol without a loop": (
        lambda: _summary(grid=(sym("i") + 1,)),
        "program 'p': variant 0 launch 0 (k) reads unbound symbol(s) ['i'] (bound: ['n'])"),
    "grid reading the loop symbol and another": (
        lambda: _summary(grid=(sym("i") + sym("q"),), count=2, loop="i"),
        f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "block": (lambda: _summary(block=(32, sym("q"))),
              f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "shared_mem": (lambda: _summary(shared_mem=sym("q") * 4),
                   f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "value argument": (lambda: _summary(args=(kp.Arg.buffer("x"), kp.Arg.of(sym("q"), kp.i32))),
                       f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "value argument with a loop": (
        lambda: _summary(args=(kp.Arg.buffer("x"), kp.Arg.of(sym("i") * sym("q"), kp.i32)),
                         count=3, loop="i"),
        f"program 'p': variant 0 launch 0 (k) {UNBOUND}"),
    "second variant, second launch": (lambda: _summary(variants=(
        kp.Variant((_launch(),)),
        kp.Variant((_launch(), _launch(kernel="k2", block=(sym("zz"),)))))),
        "program 'p': variant 1 launch 1 (k2) reads unbound symbol(s) ['zz'] (bound: ['n'])"),
    "several symbols": (lambda: _summary(grid=(sym("b") + sym("a"),)),
                        "program 'p': variant 0 launch 0 (k) reads unbound symbol(s) ['a', 'b'] "
                        "(bound: ['n'])"),
    "loop symbol shadows a dim": (lambda: _summary(count=2, loop="n"),
                                  "variant 0 launch 0 (k): loop symbol 'n' shadows a bound symbol"),
    "loop symbol names a scalar": (
        lambda: _summary(params=(X, kp.Scalar("s", kp.f32)), count=2, loop="s"),
        "variant 0 launch 0 (k): loop symbol 's' is also the name of a scalar parameter"),
    "loop symbol names a computed scalar": (
        lambda: _summary(params=(X, kp.Scalar("s", kp.i32, value="n")), count=2, loop="s"),
        "variant 0 launch 0 (k): loop symbol 's' is also the name of a scalar parameter"),
    "buffer argument": (lambda: _summary(args=(kp.Arg.buffer("z"),)),
                        "variant 0 launch 0 (k): buffer argument 'z' is neither a tensor "
                        "parameter nor a scratch buffer"),
    "scalar argument": (lambda: _summary(args=(kp.Arg.scalar("z"),)),
                        "variant 0 launch 0 (k): scalar argument 'z' is not a scalar parameter"),
    "scratch clash": (lambda: _summary(variants=(
        kp.Variant((_launch(),), scratch=(kp.Scratch("x", kp.f32, [1]),)),)),
        "program 'p': scratch 'x' clashes with another name"),
    "parameter twice": (lambda: _summary(params=(X, X)),
                        "program 'p': parameter 'x' appears twice"),
}


@pytest.mark.parametrize("label", list(CHECKS))
def test_check_names_each_field_in_the_same_words(label: str) -> None:
    make, words = CHECKS[label]
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == words


def test_loop_symbols_are_accepted_where_they_apply() -> None:
    s = _summary(grid=(sym("i") + 1, "n"), shared_mem=sym("i") * 4, count=3, loop="i",
                 args=(kp.Arg.buffer("x"), kp.Arg.of(sym("i") * 2, kp.i32)))
    launch = s.variants[0].launches[0]
    assert launch.grid == (sym("i") + 1, sym("n"), const(1)) and launch.count == const(3)
    assert s.loop_symbols() == ["i"] and s.bound_symbols() == ["n"]


# ---- a80be45: what the fields accept and refuse --------------------------------------------------
NT = collections.namedtuple("NT", "a b")
G3 = collections.namedtuple("G3", "x y z")


class SubExpr(Expr):
    __slots__ = ()


class SubArg(kp.Arg):
    pass


def _value(make: Callable[[], Any]) -> Any:
    try:
        return "ok", make()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return type(exc).__name__, str(exc)


def _shape(shape: Any) -> Any:
    return _value(lambda: kp.Tensor("x", kp.f32, shape).shape)


ONE = const(1)
FIELDS: dict[str, tuple[Callable[[], Any], Any]] = {
    "namedtuple shape": (lambda: _shape(NT("n", 3)), ("ok", (sym("n"), const(3)))),
    "numpy int dims": (lambda: _shape((np.int64(3), np.int32(2))), ("ok", (const(3), const(2)))),
    "numpy negative dim": (lambda: _shape((np.int64(-3),)),
                           ("ValueError", "tensor 'x': shape[0] = -3 is negative")),
    "bool dim": (lambda: _shape((True,)),
                 ("TypeError", "tensor 'x': shape[0] must be an int, a symbol name or an "
                               "expression (got True)")),
    "numpy bool dim": (lambda: _shape((sym("n"), np.bool_(True))),
                       ("TypeError", "tensor 'x': shape[1]: expected an int, a symbol name or an "
                                     "expression (got np.True_)")),
    "negative constant Expr dim": (lambda: _shape((sym("n"), const(-5))),
                                   ("ValueError", "tensor 'x': shape[1] = -5 is negative")),
    "negative constant SubExpr dim": (lambda: _shape((SubExpr("const", (), -3),)),
                                      ("ValueError", "tensor 'x': shape[0] = -3 is negative")),
    "negated symbol dim": (lambda: _shape((-sym("n"),)), ("ok", (-sym("n"),))),
    "rank MAX_RANK of Exprs": (lambda: _shape((ONE,) * MAX_RANK), ("ok", (ONE,) * MAX_RANK)),
    "rank MAX_RANK + 1 of Exprs": (lambda: _shape((ONE,) * (MAX_RANK + 1)),
                                   ("ValueError", f"tensor 'x': rank {MAX_RANK + 1} exceeds the "
                                                  f"limit {MAX_RANK}")),
    "rank MAX_RANK + 1, negative": (lambda: _shape((const(-1),) * (MAX_RANK + 1)),
                                    ("ValueError", f"tensor 'x': rank {MAX_RANK + 1} exceeds the "
                                                   f"limit {MAX_RANK}")),
    "rank MAX_RANK + 1 with a bool": (lambda: _shape((ONE,) * MAX_RANK + (True,)),
                                      ("TypeError", f"tensor 'x': shape[{MAX_RANK}] must be an "
                                                    f"int, a symbol name or an expression (got "
                                                    f"True)")),
    "an Expr as the shape": (lambda: _shape(sym("n")),
                             ("TypeError", "tensor 'x': shape must be a sequence of dims (got "
                                           "Expr(n))")),
    "a str as the shape": (lambda: _shape("n"),
                           ("TypeError", "tensor 'x': shape must be a sequence of dims (got "
                                         "'n')")),
    "None in a tuple": (lambda: _shape((sym("n"), None)),
                        ("TypeError", "tensor 'x': shape[1]: expected an int, a symbol name or "
                                      "an expression (got None)")),
    "scratch negative dim": (lambda: _value(lambda: kp.Scratch("w", kp.f32, (const(-2),))),
                             ("ValueError", "scratch 'w': shape[0] = -2 is negative")),
    "2-tuple grid": (lambda: _value(lambda: _launch(grid=(sym("n"), const(2))).grid),
                     ("ok", (sym("n"), const(2), ONE))),
    "namedtuple grid": (lambda: _value(lambda: _launch(grid=G3(1, 2, 3)).grid),
                        ("ok", (ONE, const(2), const(3)))),
    "4-tuple grid": (lambda: _value(lambda: _launch(grid=(ONE,) * 4).grid),
                     ("ValueError", "grid takes 1 to 3 dimensions (got 4)")),
    "bool in a 3-tuple block": (lambda: _value(lambda: _launch(block=(ONE, True, ONE)).block),
                                ("TypeError", "block must be an int, a symbol name or an "
                                              "expression (got True)")),
    "negative constant grid (allowed)": (
        lambda: _value(lambda: _launch(grid=(const(-1), ONE, ONE)).grid),
        ("ok", (const(-1), ONE, ONE))),
    "bool shared_mem": (lambda: _value(lambda: _launch(shared_mem=True)),
                        ("TypeError", "launch 'k': shared_mem must be an int, a symbol name or "
                                      "an expression (got True)")),
    "numpy shared_mem": (lambda: _value(lambda: _launch(shared_mem=np.int64(4)).shared_mem),
                         ("ok", const(4))),
    "float shared_mem": (lambda: _value(lambda: _launch(shared_mem=1.5)),
                         ("TypeError", "launch 'k': shared_mem: expected an int, a symbol name or "
                                       "an expression (got 1.5)")),
    "args as a list": (lambda: _value(lambda: _launch(args=[kp.Arg.buffer("x")]).args),
                       ("ok", (kp.Arg.buffer("x"),))),
    "a str in the args": (lambda: _value(lambda: _launch(args=(kp.Arg.buffer("x"), "y"))),
                          ("TypeError", "launch 'k': args[1] must be a kp.Arg (got 'y')")),
    "args of an Arg subclass": (
        lambda: _value(lambda: type(_launch(args=(SubArg("buffer", "x"),)).args[0]).__name__),
        ("ok", "SubArg")),
    "MAX_ARGS + 1 args": (
        lambda: _value(lambda: _launch(args=(kp.Arg.buffer("x"),) * (MAX_ARGS + 1))),
        ("ValueError", f"launch 'k': {MAX_ARGS + 1} arguments exceed {MAX_ARGS}")),
    "bool count": (lambda: _value(lambda: _launch(count=True, loop="i")),
                   ("TypeError", "launch 'k': count must be an int, a symbol name or an expression "
                                 "(got True)")),
    "zero_init 1": (lambda: _value(lambda: kp.Tensor("y", kp.f32, [1], role="out",
                                                      zero_init=1).zero_init), ("ok", True)),
    "zero_init 2": (lambda: _value(lambda: kp.Tensor("y", kp.f32, [1], role="out", zero_init=2)),
                    ("TypeError", "tensor 'y': zero_init must be a bool (got 2)")),
    "zero_init numpy False on an input": (
        lambda: _value(lambda: kp.Tensor("y", kp.f32, [1], zero_init=np.bool_(False)).zero_init),
        ("ok", False)),
    "zero_init True on an input": (lambda: _value(lambda: kp.Tensor("y", kp.f32, [1],
                                                                     zero_init=True)),
                                   ("ValueError", "tensor 'y': zero_init applies to role='out' "
                                                  "only")),
    "scalar value bool": (lambda: _value(lambda: kp.Scalar("s", kp.i32, value=True)),
                          ("TypeError", "scalar 's': value must be an int, a symbol name or an "
                                        "expression (got True)")),
    "scalar Expr value, float dtype": (
        lambda: _value(lambda: kp.Scalar("s", kp.f32, value=sym("n"))),
        ("ValueError", "scalar 's': a computed scalar must have an integer dtype (got "
                       "float32)")),
    "scalar SubExpr value, float dtype": (
        lambda: _value(lambda: kp.Scalar("s", kp.f32, value=SubExpr("sym", (), "n"))),
        ("ValueError", "scalar 's': a computed scalar must have an integer dtype (got "
                       "float32)")),
    "scalar numpy value": (lambda: _value(lambda: kp.Scalar("s", kp.i64, value=np.int64(3)).value),
                           ("ok", const(3))),
    "scalar argument bad name": (lambda: _value(lambda: kp.Arg("scalar", "")),
                                 ("ValueError", "scalar argument must be an identifier of at most "
                                                "1024 UTF-8 bytes (got '')")),
    "buffer argument bad name": (lambda: _value(lambda: kp.Arg("buffer", "1x")),
                                 ("ValueError", "buffer argument must be an identifier of at most "
                                                "1024 UTF-8 bytes (got '1x')")),
    "value argument bool": (lambda: _value(lambda: kp.Arg.of(True, kp.i32)),
                            ("TypeError", "value argument must be an int, a symbol name or an "
                                          "expression (got True)")),
}


@pytest.mark.parametrize("label", list(FIELDS))
def test_fields_accept_and_refuse_as_before(label: str) -> None:
    make, want = FIELDS[label]
    assert make() == want


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "3", "-3", None],
                         ids=["nan", "inf", "str3", "str-3", "None"])
def test_a_constant_dim_that_is_not_an_int_is_judged_as_before(value: Any) -> None:
    """Was a bug of a80be45 (minor; fixed):
    ``_fields._shape``'s fast path tested ``d.value < 0`` where the full check tests
    ``int(d.value) < 0``, so ``kp.Expr("const", (), v)`` built directly with a NaN, an inf, a
    str or None was judged differently by the two. Since review 30 ``Expr``'s constructor
    checks its node, so no such constant reaches a shape: a TypeError naming the value."""
    for make in (kp.Tensor, kp.Scratch):
        got = _value(lambda: make("x", kp.f32, (Expr("const", (), value),)).shape)
        assert got == ("TypeError", f"a const expression's value must be an int (got "
                                    f"{value!r:.80})"), make
    assert kp.Tensor("x", kp.f32, (Expr("const", (), 3),)).shape == (3,)


def test_expression_immediates_must_be_ints_whatever_was_cached() -> None:
    """Was a bug of a80be45 (minor, internal API; fixed):
    ExprProgram now looks a CONST immediate up in
    ``expr._CONST_CACHE`` before calling ``const()``; a float or NumPy immediate equal to a
    cached small int (5.0, np.int64(5)) is then accepted as that constant, where const()
    refused it ("an expression constant must be an int"), and whether it is accepted depends
    on which constants the process made before. A decoded file's immediates are ints, so
    only a directly built EncodedExprs reaches this."""
    const(5)  # now cached
    assert _CONST_CACHE.get(5) is not None
    for imm in (5.0, np.int64(5), 1.5):
        got = _value(lambda: ExprProgram(EncodedExprs((), bytes([OP_CONST, OP_END]), (imm,))))
        assert got == ("TypeError", f"an expression constant must be an int (got {imm!r})")


def test_expression_programs_share_symbol_nodes_without_changing_values() -> None:
    """``n`` read by three roots: one node, equal to kp.sym("n"); the roots evaluate and
    print as before; an invalid symbol name is still refused at its first SYM."""
    prog = ExprProgram(EncodedExprs(("n", "m"), bytes([OP_SYM, OP_SYM, 12, OP_END, OP_SYM,
                                                       OP_CONST, 10, OP_END, OP_SYM, OP_END]),
                                    (0, 0, 0, 7, 1)))
    a, b, c = prog.exprs
    assert (a, b, c) == (sym("n") * sym("n"), sym("n") + 7, sym("m"))
    assert a.args[0] is a.args[1] is b.args[0]
    assert [str(e) for e in prog.exprs] == ["n * n", "n + 7", "m"]
    frame = prog.new_frame([3, 4])
    assert [prog.value(frame, i) for i in range(3)] == [9, 10, 4]
    with pytest.raises(ValueError, match=r"a symbol name must be a Python identifier \(got '1n'\)"):
        ExprProgram(EncodedExprs(("1n",), bytes([OP_SYM, OP_END, OP_SYM, OP_END]), (0, 0)))


def test_decoded_summaries_equal_what_was_saved() -> None:
    """Decoding goes through the fast paths (Exprs, tuples of Exprs, tuples of Args): the
    decoded summary equals the user-built one, for summaries with loops, scratch, value
    arguments, computed scalars, constraints and predicates."""
    from kp_samples import rich, tiny

    for c in (rich(), tiny()):
        pack = kp.load(kp.save(c))
        assert pack[c.name].summary == c.summary
        assert kp.save(pack) == kp.save(c)


# ---- a80be45: traced graphs and their cache-key bytes --------------------------------------------
@kp.fusion
def _softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):  # noqa: F821
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@kp.fusion
def _dims(x: kp.Tensor[kp.f32, "n", "m"]):  # noqa: F821
    return np.sqrt(x.shape[-1]) * x.sum(axis=0) + 1.0 / x.shape[0]


_leak: list = []


@kp.fusion
def _grab(x: kp.Tensor[kp.f32, "n"]):  # noqa: F821
    _leak.append(x)
    return x


@kp.fusion
def _reuse(x: kp.Tensor[kp.f32, "n"]):  # noqa: F821
    return x + _leak[0]


def test_traces_give_the_cache_key_bytes_of_before() -> None:
    """sha256 of Fusion.canonical_bytes (a cache key's source), as c9e8d44 (before the fast
    paths) made them for these fusions."""
    got = {(f.name, str(st)): hashlib.sha256(f.canonical_bytes(st)).hexdigest()
           for f in (_softmax, _dims) for st in (None, {"n": 8})}
    assert got == {
        ("_softmax", "None"): "08c5fd913cdfb83a2b40e9139876dac5188483ccec093f25932262951821e334",
        ("_softmax", "{'n': 8}"):
            "feaaccda2845f0a9937407a7aa21cb3f5133b346304fd80eece5bfa3857fea2c",
        ("_dims", "None"): "bee8c8914d1ec34beb01808c4fe4d110a8ea983d16fdfd6b587f435650ebce6b",
        ("_dims", "{'n': 8}"): "bd165fe40b0e96a792fbc751da3aa22f380f6bb689a2ec7f327b48a073fce259",
    }


def test_a_value_from_another_trace_is_still_refused() -> None:
    _leak.clear()
    _grab.trace()
    with pytest.raises(kp.errors.TraceError,
                       match="^a traced tensor from another fusion was used$"):
        _reuse.trace()
