"""Review 51: tests that kill mutants of the load path which survived the existing suite.

A throw-away mutator (outside the repo, on a copy of ``src/`` and ``tests/``, so that the
suite's subprocesses import the mutant too) changed the load path's Python code one site at
a time and ran the tests that exercise each module. All 206 mutants ran: 48 written by hand
against the rules that do not bend (the body digest, the stored and raw image digests, the
frame's declared size, ``check_key``, a large pack's deferred image index, unsigned or
untrusted files, small-order keys, the signature's domain prefix, re-signing,
``check_readable``, the walker's overlap, alignment, size and version checks, the
expression-work bound, FIFOs), and 158 generated ones (flipped comparisons, dropped terms and
checks, negated conditions, constants off by one) in ``verify.py``'s Python walker,
``_fbread.py``, ``signing.py``, ``loader.py``, ``serializer.py``, ``_images.py``,
``_decode.py``, ``_zstd.py``, ``compiled.py`` and ``_smallfile.py``. 147 were killed by the
suite (4 of them, M074, M086, M087 and M103, only by tests outside the module's list the
mutator ran: ``test_verify``, ``test_review39_fdowner`` and this file), 31 survived it and
are killed by the tests here (each names its mutant; M140's run crashed with SIGSEGV), 28
are judged equivalent. The C twins were not mutated.

Equivalent survivors, hand-written: ``_READ_LIMIT`` compared with ``<`` (a file of exactly
1 MiB is mapped instead of read: same results); ``_inflate`` refusing only longer output
(every zstd backend refuses a frame that decodes to other than its declared size, and the
raw digest follows); three ``small_order`` changes (``y > p``: y = p reads as the order-4
point, still small; only ``X == 0`` after three doublings: no point of order 16 exists; the
sign bit inverted: P and -P have one order); zstd kept at an equal size (a frame exactly as
long as its input); a parameter kind tested as ``!= 1`` (the verifier refuses kinds above 1).
Generated, in the Python walker: the layout cache one entry larger, ``need`` refusing
position 0 (no object lies there), 8-byte vector alignment with ``<=``, four inline
fast-path bounds made stricter or dropped (``pos + 4``, ``t_size < 5``, ``target + 5``)
whose slow helpers re-check the exact bound and return, or whose callers checked it already,
and a string vector's UTF-8 check reading one byte early (M023: the length's high byte, 0
for names within MAX_NAME_LENGTH, a valid NUL); in ``signing.py``: ``small_order`` taking
the sign from ``raw[30]`` (M057: P or -P, one order) and ``len(data) >= 32`` (M060: 32 bytes
returned just above); in ``loader.py``: ``ModuleInfo`` deferring images of ``FileBlobs``
(M070: a mapped file is never deferred, its buffer is not ``bytes``), the traceback walk's
cap of 8 exceptions made 9 (M088) and following ``__context__`` only (M089: every ``raise
... from`` on the load path names the exception being handled); in ``serializer.py``: merging
a module equal to the one kept (M099: ``Module`` sorts its kernels already) and the builder's
initial size (M100); ``_arch``'s cache one larger (M105); ``_Ctx.dims`` sending index 0 to
the slow path that accepts it (M129); ``_fbread``'s code for i16, which no field uses (M036),
and reloading its C reader on every call (M041); ``Image.data``'s type check of the lazy
reader, which is always ``ImageInfo.read`` (M148); and the ctypes zstd door returning b""
for a frame declaring no content at any ``raw_size`` (M139: the declared size must equal
``raw_size`` before ``_inflate`` runs, and it checks the length; judging it found the
zstandard door disagreeing with the others on such a frame with a damaged block, fixed in
session 38: test_every_zstd_door_judges_an_empty_frame_with_a_damaged_block_alike).

One gap found (not a mutant): ``ImageInfo.read`` did not re-check the stored digest of an
in-memory view it checked once, though a read-only view of a caller's bytearray can change
after load (the first test below; fixed in session 38). No GPU; well under 1 s.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard

import kernelpack as kp
from kernelpack.errors import IntegrityError

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kp_samples import tiny  # noqa: E402
from test_review2_hostile import artifact, image, module, program  # noqa: E402

RAW = b"\x7fELF" + bytes(range(200)) * 4
ZST = zstandard.ZstdCompressor(level=9, write_content_size=True).compress(RAW)


def _zimage(**kw: Any) -> dict:
    return image(0, ZST, RAW, codec=1, **kw)


# ==== _images.py / Pack.verify: every image checked, each distinct claim once ===================

def test_bytes_reaching_the_decompressor_match_their_digest_in_a_changed_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real gap found while judging the survivors of ``ImageInfo.read``'s
    ``if not (self._stored_ok and isinstance(self._stored, memoryview))``: kp.load keeps a
    read-only view of a caller's bytearray as it is (loader.py says such a view can change
    and copies the body for that reason), and a cache hit's ``pack.compiled(name)`` checks
    each image's stored digest once. When the caller then reuses its buffer, the first read of
    ``image.data`` hands the changed, unchecked bytes to the zstd decoder (FORMAT.md §3, 9:
    the digest is checked *before* the bytes reach a decompressor); only the raw digest after
    it catches the change. Fixed in session 38: the re-check is skipped only where the
    buffer cannot change (a view of ``bytes``)."""
    from kernelpack import _zstd

    data = artifact([program(name="p")], [module("m", [_zimage()])], [ZST])
    backing = bytearray(data)
    compiled = kp.load(memoryview(backing).toreadonly()).compiled("p")  # stored digest checked
    backing[bytes(backing).find(ZST) + 20] ^= 0xFF  # the caller reuses its buffer
    fed: list[bool] = []
    decompress = _zstd.decompress

    def spy(stored: Any, raw_size: int) -> bytes:
        fed.append(bytes(stored) == ZST)
        return decompress(stored, raw_size)

    monkeypatch.setattr(_zstd, "decompress", spy)
    with pytest.raises(IntegrityError):
        compiled.modules[0].images[0].data
    assert fed == [], "changed bytes reached the decompressor before their digest was checked"


def test_ptx_isa_on_a_cubin_reads_as_absent() -> None:
    """H23 (``ImageInfo`` keeping ``ptx_isa`` on a cubin): FORMAT.md §7, a reader ignores
    ``ptx_isa`` on kinds other than PTX and reports it as absent; kept, the runtime would
    gate a cubin by an ISA no writer meant for it, and re-saving it raises ValueError."""
    cubin = image(0, ptx_isa=(8, 5))
    ptx = image(0, kind=1, ptx_isa=(8, 5))
    pack = kp.load(artifact([program(name="p")], [module("m", [cubin, ptx])]))
    got = {i.kind: i.ptx_isa for i in pack.modules["m"].images}
    assert got == {"cubin": None, "ptx": (8, 5)}
    assert [i.ptx_isa for i in pack.compiled("p").modules[0].images] == [None, (8, 5)]


# ==== serializer.resign: what is signed is what was verified ====================================

def test_resigning_a_mapped_file_changed_after_load_is_refused(tmp_path: Path) -> None:
    """H32 (``resign``'s comparison of the re-read body with ``pack.body_digest`` dropped):
    ``kernelpack sign`` re-reads a memory-mapped file (> 1 MiB) with pread; a file rewritten
    in place since load was then signed as it is now, so the signature vouched for a body
    no check had seen (a hostile one planted between the check and the signing)."""
    import random

    from kernelpack.serializer import resign
    from kernelpack.signing import generate_private_key
    from kernelpack.summary import Compiled, Image, Module

    c = tiny()
    big = Image("cubin", "sm_80", random.Random(51).randbytes((1 << 20) + 4096), "t", 12080)
    c = Compiled(c.summary, (Module("m", ("k",), (big,)),))
    path = tmp_path / "big.kpack"
    data = kp.save(c, path)
    pack = kp.load(path)
    assert pack._file is not None  # memory-mapped (images read with pread)
    at = data.index(b"kernelpack ")  # Body.generator: inside the body
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"K")
    with pytest.raises(IntegrityError, match="body changed"):
        resign(pack, generate_private_key())


def test_saving_a_pack_with_a_broken_signature_under_a_new_key_is_refused() -> None:
    """H34 (``save``'s ``_check_signatures_intact`` dropped): a signed pack loaded without
    trusted keys is not checked against its signature; one whose signature was forged or whose
    content changed after signing was then re-signed by ``kp.save(pack, sign_with=...)``
    under the saver's key, laundering it into a file that verifies."""
    from kernelpack.errors import SignatureError
    from kernelpack.signing import generate_private_key, sign_digest

    key = generate_private_key()
    data = bytearray(kp.save(tiny(), sign_with=key))
    pack = kp.load(bytes(data))
    signature = sign_digest(key, bytes.fromhex(pack.body_digest))[1]
    data[data.index(signature) + 5] ^= 1  # a forged signature: loads without trusted keys
    forged = kp.load(bytes(data))
    with pytest.raises(SignatureError, match="does not verify"):
        kp.save(forged, sign_with=generate_private_key())
    assert kp.load(kp.save(pack, sign_with=key)).body_digest == pack.body_digest


def test_save_refuses_what_a_reader_refuses() -> None:
    """H36 (``save``'s ``check_readable`` skipped): a module's kernel names are limited in
    UTF-8 bytes by the format and by nothing in ``kp.Module``; a module listing a 1100-byte
    entry name was written, and every reader then refused the file."""
    from kernelpack.summary import Compiled, Module

    c = tiny()
    m = c.modules[0]
    c = Compiled(c.summary, (Module(m.name, (*m.kernels, "z" * 1100), m.images),))
    with pytest.raises(ValueError, match="would not load"):
        kp.save(c)


# ==== _decode.py: the expression-work bound ======================================================

def test_the_work_walk_counts_one_node_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """H43 (the walk of one field capped at the budget left instead of one more): a last
    field reading exactly one node more than the budget left then counted as fitting it, so a
    program over ``MAX_EXPR_WORK`` by one node was accepted."""
    from kernelpack import _decode
    from kernelpack.errors import FormatError

    from kernelpack.expr import iter_nodes

    n, m = kp.sym("n"), kp.sym("m")
    e = n
    for i in range(5):
        e = e * m + n if i % 2 else e * n + m
    size = sum(1 for _ in iter_nodes((e,)))
    monkeypatch.setattr(_decode, "MAX_EXPR_WORK", size - 1)
    with pytest.raises(FormatError, match="MAX_EXPR_WORK"):
        _decode.check_expression_work(1, size, lambda: [e])
    monkeypatch.setattr(_decode, "MAX_EXPR_WORK", size)
    _decode.check_expression_work(2, size, lambda: [e])  # exactly the budget fits


def test_launch_dimensions_count_toward_the_work_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """H44 (``_Ctx.dims`` not counting a launch's grid and block fields): the cheap gate
    ``refs * nodes <= MAX_EXPR_WORK`` skips the walk; without the six dimension fields per
    launch it skipped programs whose grids alone read more than the budget, which decoding
    is bounded by (FORMAT.md §3, 8: launch dimensions are expression fields)."""
    from kernelpack import _decode
    from kernelpack.errors import FormatError
    from kernelpack.summary import Arg, Compiled, KernelSummary, Launch, Tensor, Variant

    n = kp.sym("n")
    e = n
    for i in range(9):
        e = e * (i + 2) + 1
    launches = tuple(Launch("k", "m", (e, e, e), (32,), (Arg.buffer("x"),)) for _ in range(2))
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n",)),), (Variant(launches),))
    data = kp.save(Compiled(s, tiny().modules))
    kp.load(data).verify()
    monkeypatch.setattr(_decode, "MAX_EXPR_WORK", 150)  # 6 grid fields read 28+ nodes each
    with pytest.raises(FormatError, match="MAX_EXPR_WORK"):
        kp.load(data).verify()


# ==== verify.py: the Python walker, the reference that raises every error =======================

def _program_with_imms(target: int) -> bytes:
    """A ``Program`` FlatBuffer by hand holding only ``imms`` (``[i64]``, vtable slot 3), one
    element, its vector at ``target``: root offset, vtable at 4, table at 16."""
    buf = bytearray(target + 12)
    struct.pack_into("<I", buf, 0, 16)
    struct.pack_into("<6H", buf, 4, 12, 8, 0, 0, 0, 4)
    struct.pack_into("<iI", buf, 16, 16 - 4, target - 20)
    struct.pack_into("<Iq", buf, target, 1, -7)
    return bytes(buf)


def test_the_python_walker_refuses_an_eight_byte_vector_on_a_four_byte_boundary() -> None:
    """M019 (the walker's inline alignment test of a scalar vector, ``start % 8`` for 8-byte
    elements, made ``start % 7``): ``Program.imms`` whose data starts at 28 (4- and 7-aligned,
    not 8-aligned) passed the Python walker, the reference that raises every error and the
    only walker where the C extension is not built (the C walker refuses it)."""
    from kernelpack import verify
    from kernelpack.errors import FormatError

    assert verify.verify_buffer(_program_with_imms(28), "Program", identifier=None,
                                _use_c=False) == 16  # data at 32: aligned
    with pytest.raises(FormatError, match="vector data at 28 is not aligned to 8"):
        verify.verify_buffer(_program_with_imms(24), "Program", identifier=None, _use_c=False)


def test_a_misaligned_format_version_is_a_format_error_not_a_newer_format() -> None:
    """M029 (``read_format_version`` not checking that ``Pack.format_major`` is 2-aligned):
    the version is read before anything else of the file is checked; a corrupt vtable
    placing it at an odd offset then read two arbitrary bytes as the version, and a hostile
    or damaged file was reported as a newer format to upgrade to (CompatibilityError), or
    read as version 1 when the bytes said 1."""
    from kernelpack.errors import FormatError
    from kernelpack.limits import FILE_IDENTIFIER
    from kernelpack.verify import read_format_version

    for value in (99, 1):
        buf = bytearray(24)  # root offset, identifier, vtable at 8 (format_major at 5), table
        struct.pack_into("<I4s3HxxiBH", buf, 0, 16, FILE_IDENTIFIER, 6, 8, 5, 8, 0, value)
        with pytest.raises(FormatError, match="format_major.*misaligned"):
            read_format_version(bytes(buf))
        with pytest.raises(FormatError, match="format_major.*misaligned"):
            kp.load(bytes(buf))


# ==== signing.py: a trusted key that is no key is named for what it is ==========================

@pytest.mark.parametrize("text, match", [
    (b"", r"expected a PEM or OpenSSH public key or 64 hex"),  # M063: not "holds 0 hex keys"
    (b"not a key\n", r"expected a PEM or OpenSSH public key or 64 hex"),  # M064, M065
    (b"%s\n%s\n" % (b"ab" * 32, b"cd" * 32), r"holds 2 hex keys; a key file must hold one"),
])
def test_a_key_file_that_is_no_single_key_says_why(tmp_path: Path, text: bytes,
                                                   match: str) -> None:
    """M063 (``len(lines) > 1`` dropped: an empty file "holds 0 hex keys"), M064 (``_hex32(line)
    is None``: a list of hex keys read as garbage, garbage as a list of keys) and M065 (``or``:
    any unreadable file of several words "holds N hex keys"), in ``load_public_key``'s message
    for a file it cannot read: a list of keys (an authorized_keys habit) needs one file per key,
    anything else is not a key at all."""
    from kernelpack.signing import load_public_key

    path = tmp_path / "team.pub"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=match):
        load_public_key(str(path))


def test_a_missing_key_path_without_pub_is_named_missing(tmp_path: Path) -> None:
    """M067 (``os.sep in path`` dropped from the missing-file test): a trusted key given as a
    path to a file that does not exist, not ending in .pub (``keys/team``), was reported as
    "not an ed25519 public key: expected 32 bytes, 64 hex characters..." instead of as a
    missing file."""
    from kernelpack.signing import load_public_key

    with pytest.raises(ValueError, match="team: no such public key file"):
        load_public_key(str(tmp_path / "team"))


# ==== loader.py: Pack.verify ====================================================================

def test_verify_keeps_images_up_to_and_including_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """M080 (``kept + image.raw_size <= _VERIFY_KEEP_BYTES`` made ``<``): the budget of
    checked images ``Pack.verify`` keeps for the launches that follow is inclusive; an image
    filling it exactly was checked and then dropped, to be decompressed and hashed again."""
    from kernelpack import loader
    from kp_samples import axpy

    monkeypatch.setattr(loader, "_VERIFY_KEEP_BYTES", 2 * 604)
    pack = kp.load(kp.save(axpy()))  # three images of 604 raw bytes
    pack.verify()
    images = pack.modules["axpy"].images
    assert [i.raw_size for i in images] == [604] * 3
    assert [i._data is not None for i in images] == [True, True, False]


# ==== loader.py: _open ==========================================================================

def test_a_buffer_of_exactly_max_file_size_is_read(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """M081 (``view.nbytes > MAX_FILE_SIZE`` made ``>=``): the limit is the largest file the
    format allows (FlatBuffers' offset range), so a buffer of exactly that size was refused
    from memory while the same file loaded from its path (shown with the limit lowered to
    one small file's size)."""
    from kernelpack import loader
    from kernelpack.errors import FormatError

    data = kp.save(tiny())
    path = tmp_path / "t.kpack"
    path.write_bytes(data)
    monkeypatch.setattr(loader, "MAX_FILE_SIZE", len(data))
    assert kp.load(data).body_digest == kp.load(path).body_digest
    monkeypatch.setattr(loader, "MAX_FILE_SIZE", len(data) - 1)
    for source in (data, path):
        with pytest.raises(FormatError, match="exceed MAX_FILE_SIZE"):
            kp.load(source)


def test_a_read_only_view_of_another_format_is_read_as_bytes() -> None:
    """M082 (``view.format != "B"`` made ``==``): a read-only view of the artifact's bytes in
    another format (``memoryview(data).cast("c")``, an ``array('I')``'s buffer) was kept as
    it is, its items not ints: the walker's ``buf[end] == 0`` read ``b"\\x00"`` and refused a
    valid file ("Body.generator: string at 40 is not NUL-terminated")."""
    data = kp.save(tiny())
    name = kp.load(data).programs[0]
    pack = kp.load(memoryview(data).cast("c"))
    assert pack.body_digest == kp.load(data).body_digest
    assert pack.compiled(name).summary == kp.load(data).compiled(name).summary


# ==== serializer.py: what kp.save refuses, it refuses with its own message ======================

def _with_image(image: Any) -> Any:
    from kernelpack.summary import Compiled, Module

    c = tiny()
    return Compiled(c.summary, (Module(c.modules[0].name, c.modules[0].kernels, (image,)),))


@pytest.mark.parametrize("kw, exc, match", [
    (dict(kind="ptx", ptx_isa=(True, 0)), TypeError, "ptx_isa must be None or"),  # M094
    (dict(cuda_version=1 << 32), ValueError, "cuda_version must fit in 32 bits"),  # M096
    (dict(kind="ptx", ptx_isa=(256, 0)), ValueError, r"ptx_isa parts must be 0\.\.255"),  # M097
])
def test_save_refuses_image_fields_the_format_cannot_hold(kw: dict, exc: type,
                                                          match: str) -> None:
    """M094 (``ptx_isa`` parts may be bools), M096 (``cuda_version < 1 << 32`` made ``<=``)
    and M097 (``ptx_isa`` parts ``< 257``): a PTX ISA of ``(True, 0)`` was written as 1.0;
    a cuda_version of 2**32 and an ISA part of 256 got past the checks to the FlatBuffers
    builder, whose TypeError ("bad number 256 for type uint8") names no image."""
    from kernelpack.summary import Image

    image = Image(kw.pop("kind", "cubin"), "sm_80", b"\x7fELF", "t", **kw)
    with pytest.raises(exc, match=match):
        kp.save(_with_image(image))


def test_save_of_something_not_iterable_names_what_it_takes() -> None:
    """M091 (``not isinstance(items, Iterable)`` dropped): ``kp.save(42)`` raised Python's
    "'int' object is not iterable" instead of saying what kp.save takes."""
    with pytest.raises(TypeError, match="kp.save takes a Compiled, a Pack"):
        kp.save(42)


# ==== _images.py: ImageInfo.read and PackFile.read ==============================================

@pytest.mark.parametrize("img, match", [
    # M115: codec "none" and a raw_digest other than the stored digest
    (image(0, RAW, raw_digest=bytes(32)), "decompressed bytes do not match raw_digest"),
    # M116: codec "zstd", its stored bytes the raw bytes (both digests equal)
    (image(0, RAW, RAW, codec=1), "not a zstd frame"),
], ids=["none-two-digests", "zstd-not-a-frame"])
def test_every_claim_of_an_image_is_checked_on_read(img: dict, match: str) -> None:
    """M115 and M116 (``ImageInfo.read``'s one-hash fast path, ``codec == "none" and
    raw_digest == digest``, taken with ``!=`` or without the codec test): the fast path checks
    the stored digest only. Taken for an uncompressed image whose two digests differ, it
    returned bytes that do not match ``raw_digest``; taken for a "zstd" image whose stored
    bytes are the raw bytes, it handed out bytes no zstd frame held (FORMAT.md: the codec
    says what the stored bytes are), where the reader refuses both."""
    from kernelpack.errors import KernelPackError

    pack = kp.load(artifact([program(name="p")], [module("m", [img])], [RAW]))
    with pytest.raises(KernelPackError, match=match):
        pack.modules["m"].images[0].read()
    with pytest.raises(KernelPackError, match=match):
        kp.load(artifact([program(name="p")], [module("m", [img])], [RAW])).verify()


def test_an_image_read_in_short_preads_is_whole(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """M109 (``PackFile.read`` returning ``chunks[0]`` when there are several): pread may
    return fewer bytes than asked (Linux: at most about 2 GiB per call, so a ~2 GiB
    artifact's re-read in ``kernelpack sign``); the reader loops, and returned only the first
    chunk. Shown with pread capped at 64 KiB on a memory-mapped (> 1 MiB) file."""
    import os
    import random

    from kernelpack.summary import Compiled, Image, Module

    raw = random.Random(51).randbytes((1 << 20) + 4096)  # incompressible: stored as is
    c = tiny()
    c = Compiled(c.summary, (Module("m", ("k",), (Image("cubin", "sm_80", raw, "t", 12080),)),))
    path = tmp_path / "big.kpack"
    kp.save(c, path)
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: pread(fd, min(n, 1 << 16), at))
    pack = kp.load(path)
    assert pack._file is not None  # memory-mapped: images read with pread
    assert pack.modules["m"].images[0].read() == raw


# ==== _decode.py: what a program's fields read, and how a bad one is named ======================

def test_variant_predicates_count_toward_the_work_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """M121 and M122 (``field_expressions`` yielding a variant's predicate only when it is
    None): the walk that bounds decoding by ``MAX_EXPR_WORK`` skipped every variant
    predicate, so a program whose predicates alone read more than the budget was accepted
    (FORMAT.md §3, 8: predicates are expression fields like the rest)."""
    from kernelpack import _decode
    from kernelpack.errors import FormatError
    from kernelpack.summary import Arg, Compiled, KernelSummary, Launch, Tensor, Variant

    n = kp.sym("n")
    e = n
    for i in range(12):
        e = e * (i + 2) + 1  # 38 nodes
    ln = Launch("k", "m", (1,), (32,), (Arg.buffer("x"),))
    variants = tuple(Variant((ln,), predicate=e > i) for i in range(3))
    s = KernelSummary("p", (Tensor("x", kp.f32, ("n",)),), variants)
    data = kp.save(Compiled(s, tiny().modules))
    kp.load(data).verify()
    monkeypatch.setattr(_decode, "MAX_EXPR_WORK", 100)  # 3 predicates: 117+ nodes
    with pytest.raises(FormatError, match="MAX_EXPR_WORK"):
        kp.load(data).verify()


def _launch(**kw: Any) -> dict:
    d = {"kernel": "k", "module": "m", "grid": (1, 1, 1), "block": (2, 2, 2),
         "shared_mem": 1, "args": []}
    d.update(kw)
    return d


def test_a_launch_without_block_is_named_so() -> None:
    """M132 (``grid is None or block is None`` without its second term): a launch table
    with no ``block`` got past the check to ``dims(None)``, and the error was Python's
    "'NoneType' object is not iterable" as an invalid summary."""
    from kernelpack.errors import FormatError

    ln = {k: v for k, v in _launch().items() if k != "block"}
    pack = kp.load(artifact([program(variants=[{"launches": [ln]}])]))
    with pytest.raises(FormatError, match="variant 0 launch 0 has no block$"):
        pack.verify()


def test_the_loop_name_hint_goes_with_its_error_only() -> None:
    """M133 (the hint for the rule added 2026-11-24 given when the message does *not* name
    it): a loop symbol shadowing a dimension was told to rebuild an old artifact, and the
    artifacts older writers made (a loop named like a scalar parameter) lost their hint."""
    from kernelpack.errors import FormatError

    scalar = [{"kind": 0, "name": "x", "dtype": 12, "shape": [0]},
              {"kind": 1, "name": "s", "dtype": 12}]
    old = program(params=scalar, variants=[{"launches": [_launch(count=1, loop="s")]}])
    with pytest.raises(FormatError, match="scalar parameter; kernelpack before 2026-11-24"):
        kp.load(artifact([old])).verify()
    shadow = program(variants=[{"launches": [_launch(count=1, loop="n")]}])
    with pytest.raises(FormatError, match="shadows a bound symbol$"):
        kp.load(artifact([shadow])).verify()


# ==== _zstd.py: the libzstd door through ctypes =================================================

def _libzstd() -> Any:
    from kernelpack import _zstd

    backend = _zstd._open_libzstd()
    if backend is None:
        pytest.skip("no libzstd.so.1 >= 1.4.0 here")
    return backend


def test_libzstd_of_exactly_the_minimum_version_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """M143 (``version() < _MIN_VERSION`` made ``<=``): libzstd 1.4.0, the version every
    function used is stable in, was refused, and such a system fell back to a slower door."""
    import ctypes

    from kernelpack import _zstd

    _libzstd()
    real = ctypes.CDLL

    class AtMinimum:
        def __init__(self, name: str) -> None:
            self._lib = real(name)

            def version() -> int:
                return _zstd._MIN_VERSION

            self.ZSTD_versionNumber = version

        def __getattr__(self, name: str) -> Any:
            return getattr(self._lib, name)

    monkeypatch.setattr(ctypes, "CDLL", AtMinimum)
    backend = _zstd._open_libzstd()
    assert backend is not None
    assert backend.decompress(ZST, len(RAW)) == RAW


def test_a_failed_context_allocation_is_a_memory_error() -> None:
    """M140 (``if not dctx`` dropped in ``_LibZstd._take``): ``ZSTD_createDCtx`` returning
    NULL (out of memory) was handed to ``ZSTD_decompressDCtx`` as a context (the mutant's
    run died of SIGSEGV)."""
    backend = _libzstd()
    backend._idle.clear()
    backend._create = lambda: None  # NULL, as a c_void_p restype reads it
    with pytest.raises(MemoryError, match="ZSTD_createDCtx failed"):
        backend.decompress(ZST, len(RAW))


def test_every_zstd_door_judges_an_empty_frame_with_a_damaged_block_alike() -> None:
    """Found judging M139 (``raw_size == 0 and`` dropped from ``_LibZstd.decompress``'s
    shortcut for a frame declaring no content): the shortcut exists so that no input is
    accepted by one backend only, yet at raw_size 5 the zstandard package still returns
    ``b""`` for such a frame whose block is damaged (block type 3, reserved) while libzstd
    (ctypes, the extension's door) and the built-in decoder refuse it. Harmless on the load
    path (the declared size must equal ``raw_size``, and ``_inflate`` checks the length), but
    ``kernelpack._zstd`` promises one verdict. Fixed in session 38: ``_Zstandard.decompress``
    reads such a frame through ``decompressobj()`` when ``raw_size`` > 0."""
    from kernelpack import _zstd

    frame = bytes.fromhex("28b52ffd2000070000")  # content size 0, a last block of type 3
    doors = [_zstd._Zstandard(), _zstd._open_libzstd(), _zstd._open_native(),
             _zstd._open_builtin()]
    verdicts = {type(d).__name__: _zstd_outcome(d, frame, 5) for d in doors if d is not None}
    assert len(set(verdicts.values())) == 1, verdicts


def _zstd_outcome(door: Any, frame: bytes, raw_size: int) -> str:
    from kernelpack import _zstd

    try:
        return repr(door.decompress(frame, raw_size))
    except _zstd.ZstdFormatError:
        return "refused"


# ==== compiled.py and _smallfile.py =============================================================

def test_module_kernels_that_are_no_list_are_named_so() -> None:
    """M149 and M150 (``kernels``/``images`` that are bytes *or* not iterable, tested with
    ``and`` or not at all): ``Module("m", 5, ...)`` raised Python's "'int' object is not
    iterable" instead of naming the module and the field."""
    from kernelpack.summary import Module

    images = tiny().modules[0].images
    with pytest.raises(TypeError, match="module 'm': kernels must be a list"):
        Module("m", 5, images)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="module 'm': images must be a list"):
        Module("m", ("k",), None)  # type: ignore[arg-type]


def test_a_key_file_opened_as_descriptor_zero_is_closed(tmp_path: Path) -> None:
    """M157 (``if fd >= 0: os.close(fd)`` made ``fd > 0``): in a process whose stdin is
    closed (a daemon), ``os.open`` returns descriptor 0, and every key or small file read
    through ``read_regular`` left it open."""
    import os

    from kernelpack._smallfile import read_regular

    path = tmp_path / "k.pub"
    path.write_bytes(b"ab" * 32)
    saved = os.dup(0)
    try:
        os.close(0)
        assert read_regular(str(path), 100) == b"ab" * 32
        with pytest.raises(OSError):
            os.fstat(0)  # closed again
    finally:
        os.dup2(saved, 0)
        os.close(saved)
