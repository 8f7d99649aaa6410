"""Review 53: tests that kill mutants of the load path's C code which survived the suite.

A throw-away mutator (outside the repo, on copies of ``src/`` and ``tests/``, the extension
rebuilt with gcc for each mutant, so that the suite's subprocesses load the mutant too)
changed the C twins of the load path one site at a time and ran the tests that exercise each
file (``-x``, a 120 s timeout; a crash counts as a kill): flipped comparisons, ``&&``/``||``
swapped, dropped checks and terms of checks, constants off by one. 481 mutants ran: 173 in
``_verify.c`` (all check sites of the walk, ``walk``, ``load_desc``, ``verify_fast``), 160 in
``_fbread.c`` (all of ``rd``, ``vector``, ``table``, ``field_of``, ``plain_images``,
``plain_kernels``, ``module_index``), 134 in ``_zstd_inflate.c`` (58 dropped checks by hand and
76 of the 177 generated ones: the header, frame size, bit streams, FSE and Huffman table
limits, literals and sequences bounds; not xxh64, ``copy_match``'s fast paths,
``build_fse``/``build_huffman``'s table fill or the status ``==``/``!=`` tests) and 14 in
``_zstd.c``'s built-in door (the libzstd door was not mutated). 334 were killed by the suite
(21 of them by a crash), 68 survived it and are killed here (each test names its mutants), 76
are equivalent and 3 are neither (below).

Equivalent survivors (no input tells them apart). ``_verify.c``: UTF-8 bounds made one
larger (V000, V006, V012, V022: the string's NUL, checked before ``utf8_valid`` runs, is read
instead, and is no continuation byte; V001: the 8-byte ASCII step taken one step later); an
offset vector ending at the buffer's end (V043: its last target lies past the end, refused
by ``deref``); ``table``'s position checks (V053, V133, V134) and ``walk``'s root alignment
(V100, V163), which ``deref`` and ``walk`` guarantee or ``table`` re-checks; the slot clamp at
equality (V066); the 8-byte alignment cap at 8 (V084); ``n <= header`` (V091: no root offset
fits then); the bitmap on the heap from 4096 bytes (V102); the per-element overlap check
(V129: the table's check refuses the same files later; it only bounds the UTF-8 work); the
root left unmarked (V166: offsets point forward, nothing reaches the root); the item size
test (V172: format "B" implies 1). ``_fbread.c``: ``rd``'s ``pos >= n`` (F000); ``vector``'s
``*start > n`` (F120: the count's read bounds it); scalar code 0 on either side of a
comparison (F008, F012, F037: ``code_size`` refuses 0); ``vlen > 4`` (F013); the ``min``
written ``<=`` (F040); a kind's conversion error caught one step later with the same
exception (F031); the ``big`` flags dropped or joined with ``&&`` (F057-F062, F129-F133, F135:
only ``raw_size`` is 64-bit, and above INT64_MAX it reads negative and fails ``0 <= raw``),
2^63 (F125) and INT64_MAX (F038: above MAX_IMAGE_SIZE) alike; ``0 <=`` of unsigned fields
(F136, F141, F144, F149, F151); the first key compared with zeros (F127: major >= 1); ``>=``
after the first differing key member (F094); the first kernel name compared with an empty
one (F097). ``_zstd_inflate.c``: ``bb_init`` at exactly 8 bytes (Z020); ``bb_refill`` at ``step
== pos`` (Z022); ``bb_read`` at ``used == 64`` (Z024: only reading past a stream, which ends
in the overread error); ``count >= threshold`` (Z033: equal only when ``max`` is 0);
``remaining < 1`` (Z189: no symbol reads more than ``remaining``); ``pos != 0`` after
spreading (Z191, unreachable as its comment says); ``desc >= hdr`` (Z055, Z199: an empty rest
fails ``bb_init`` with the same words); the second weight-count check (Z059, Z201: the count
is odd there, at most 253); the 3-byte sequence count at ``n <= 3`` (Z126: it is at least
0x7F00, and the missing rest gives the same words); the fast paths' entry tests made stricter
or one step longer (Z067, Z068, Z072, Z073, Z135, Z145, Z146, Z148: the careful paths give
the same bytes; the longer copy stays inside the WILD room); redundant literal bounds (Z206,
Z207, Z208, Z210, Z211, Z214: ``lits_cap`` is the smaller of the block maximum and the
capacity, and the sequences' checks name the same overflow). ``_zstd.c``: ``declared <=
raw_size`` (S005: the same cap), a 0-byte output buffer (S006: nothing is written to it) and
the GIL released from one byte more (S008).

Neither killed nor equivalent: F092 (``k <= 4`` reads one ``int64_t`` past both keys for two
images of one target: undefined; on this build the read gives the original verdict, and
test_module_index_leaves_two_images_of_one_target_to_python pins the site), Z118 (``s <=
count`` reads ``OF_DEFAULT[29]``, one past the array, for the predefined offsets table: 0 on
this build) and Z187 (the repeat flags' truncation check dropped: the check after the symbol
gives the same words, except for a flag cut off by the end that also passes the last symbol).

One real disagreement found (not a mutant): the built-in decoder split 3 or 4 literals into 4
Huffman streams, which zstandard (libzstd's MIN_LITERALS_FOR_4_STREAMS = 6) refuses
(test_four_streams_of_fewer_than_six_literals_are_refused_as_zstandard_refuses_them); fixed in
_zstd_inflate.c the same session. The guard-page test reads buffers that end where an
unreadable page starts, so the out-of-bounds reads of V127, V128, V160, F126 and Z023 crash its
child. No GPU; well under 1 s.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import flatbuffers
import pytest
import zstandard

import kernelpack
from kernelpack import _fbread, _verify_native, loader, verify
from kernelpack._fbread import Table
from kernelpack.errors import FormatError

from kp_handwritten import _offsets
from test_fbread_tree import chain
from test_review24_lazy_decode import BLOBS, _image

try:
    from kernelpack.runtime import _launch as EXT
except ImportError:  # no C compiler at install time: the Python doors run alone
    EXT = None

FAST = _verify_native.load() if _verify_native.walker is None else _verify_native.walker
pytestmark = pytest.mark.skipif(not FAST or EXT is None,
                                reason="kernelpack.runtime._launch is not built "
                                       "(python setup.py build_ext)")
LIMITS = (verify.MAX_TABLE_DEPTH, verify.MAX_NAME_LENGTH, verify.MAX_FILE_SIZE,
          verify.BODY_ALIGNMENT)


# ==== _verify.c: the C walker against the Python walker ========================================

def c_verdict(buf: bytes, root_type: str, ident: bytes | None = None) -> int:
    """The C walker alone: the root offset, or -1 (reject)."""
    _, index, tables = _verify_native.tables(verify._PLANS)
    return FAST(buf, index[root_type], ident, tables, *LIMITS)  # type: ignore[no-any-return]


def py_verdict(buf: bytes, root_type: str, ident: bytes | None = None) -> int | None:
    """The Python walker alone (the reference): the root offset, or None (FormatError)."""
    try:
        return verify.verify_buffer(buf, root_type, identifier=ident, _use_c=False)
    except FormatError:
        return None


def same_verdict(buf: bytes, root_type: str) -> int | None:
    """Both walkers' verdict, asserted equal: the root offset, or None for a reject."""
    c, py = c_verdict(buf, root_type), py_verdict(buf, root_type)
    assert c == (-1 if py is None else py), (c, py)
    return py


def constraint(message: bytes) -> bytes:
    """A buffer whose root is a ``Constraint`` table (predicate 7) with ``message`` as its
    string's bytes, written by hand: root offset, vtable at 4, table at 12, string at 24."""
    vtable = struct.pack("<HHHH", 8, 12, 4, 8)
    table = struct.pack("<iII", 8, 7, 4)
    string = struct.pack("<I", len(message)) + message + b"\0"
    return struct.pack("<I", 12) + vtable + table + string + bytes(-len(string) % 4)


UTF8_EDGES = {  # the first and last code point of each range of Unicode's table 3-7
    "U+0080": ("\x80".encode(), True), "U+07FF": ("\u07ff".encode(), True),
    "U+0800": ("\u0800".encode(), True), "U+1000": ("\u1000".encode(), True),
    "U+D7FF": ("\ud7ff".encode(), True), "U+E000": ("\ue000".encode(), True),
    "U+10000": ("\U00010000".encode(), True), "U+40000": ("\U00040000".encode(), True),
    "U+10FFFF": ("\U0010ffff".encode(), True),
    "overlong 2": (b"\xc1\xbf", False), "overlong 3": (b"\xe0\x9f\xbf", False),
    "surrogate": (b"\xed\xa0\x80", False), "overlong 4": (b"\xf0\x8f\xbf\xbf", False),
    "above U+10FFFF": (b"\xf4\x90\x80\x80", False), "F5 lead": (b"\xf5\x80\x80\x80", False),
    "cut 4": (b"\xf0\x90\x80", False), "cut 2": (b"\xe1\x80", False),
}


@pytest.mark.parametrize("label", list(UTF8_EDGES))
def test_utf8_range_edges_get_the_python_walkers_verdict(label: str) -> None:
    """V023 (``s[i + 1] <= lo`` for a 4-byte sequence: U+10000 and U+40000, valid, were
    refused by C alone); the other edges pin the rest of ``utf8_valid``'s table."""
    data, valid = UTF8_EDGES[label]
    assert (same_verdict(constraint(data), "Constraint") is not None) == valid


def overlapping_kernel_names(extra: int) -> bytes:
    """A ``Module`` root whose two kernel names overlap (the second lies inside the first's
    bytes, which stay valid UTF-8): their lengths add up to the buffer's size plus extra."""
    la, lb = 100, 37 + extra
    n = 37 + la
    buf = bytearray(n)
    # root 12; vtable at 4 (name absent, kernels at 4; table 8 bytes); table at 12
    struct.pack_into("<IHHHHi", buf, 0, 12, 8, 8, 0, 4, 8)
    # kernels: a vector at 20 of 2 offsets, to the names at 32 and 40
    struct.pack_into("<IIII", buf, 16, 4, 2, 8, 12)
    struct.pack_into("<I", buf, 32, la)
    buf[36:n - 1] = b"a" * (n - 37)  # the first name, its NUL the buffer's last byte
    struct.pack_into("<I", buf, 40, lb)
    buf[44:44 + lb] = b"b" * lb
    buf[44 + lb] = 0
    return bytes(buf)


def test_string_data_adding_up_to_exactly_the_buffer_is_no_overlap() -> None:
    """V047 (``covered >= w->n`` per element) and the table's twin: data adding up to the
    buffer's size is accepted by the Python walker (``covered > n``), one byte more is not."""
    assert same_verdict(overlapping_kernel_names(-1), "Module") == 12
    assert same_verdict(overlapping_kernel_names(0), "Module") == 12
    assert same_verdict(overlapping_kernel_names(1), "Module") is None


def test_a_vtable_at_position_zero_is_accepted_as_python_accepts_it() -> None:
    """V054 (``vts <= 0``): a root offset of 0x00040004 also reads as a 4-byte vtable of a
    4-byte table; the Python walker refuses only ``vt < 0``."""
    root = 4 | 4 << 16
    buf = bytearray(root + 4)
    struct.pack_into("<I", buf, 0, root)
    struct.pack_into("<i", buf, root, root)  # the table's vtable is 262148 bytes back: at 0
    assert same_verdict(bytes(buf), "Constraint") == root


def test_an_offset_to_the_last_three_bytes_is_refused_even_if_the_fourth_reads_zero() -> None:
    """V116 (``t + 3 > w->n`` in ``deref``): a vector of names at n - 3 was followed, its count
    read one byte past the buffer; a zero there made an empty vector, accepted. The view here
    ends one byte before a zero byte of its exporter, so that byte is the one C would read."""
    buf = bytearray(23)
    # root 12; vtable at 4 (kernels at 4); table at 12; its kernels offset at 16 -> 20 = n - 3
    struct.pack_into("<IHHHHiI", buf, 0, 12, 8, 8, 0, 4, 8, 4)
    view = memoryview(bytes(buf) + b"\0")[:23]
    assert c_verdict(view, "Module") == -1  # type: ignore[arg-type]
    assert py_verdict(view, "Module") is None  # type: ignore[arg-type]


def test_a_vtable_before_the_buffers_start_is_refused() -> None:
    """V135 (``vts < 0`` dropped): a table 4 bytes into the buffer whose vtable is 8 bytes back
    lies at -4; unsigned, -4 + 4 wrapped to 0 and passed the bounds check, and the vtable was
    read from the 4 bytes before the buffer. Here they are a view's exporter's bytes, a
    4-byte vtable of a 4-byte table: the C walker accepted the table."""
    data = struct.pack("<HH", 4, 4) + struct.pack("<Ii", 4, 8)
    view = memoryview(data)[4:]
    assert c_verdict(view, "Constraint") == -1  # type: ignore[arg-type]
    assert py_verdict(view, "Constraint") is None  # type: ignore[arg-type]


def test_a_root_inside_the_header_is_refused_whatever_the_identifier() -> None:
    """V162 (``root < header`` dropped): with an identifier of FC FF FF FF, a root offset of 4
    reads the identifier as the table's soffset (-4), whose vtable at 8 is a valid 4-byte one;
    the root table then lay inside the 8-byte header."""
    ident = b"\xfc\xff\xff\xff"
    data = struct.pack("<I", 4) + ident + struct.pack("<HH", 4, 4)
    assert c_verdict(data, "Constraint", ident) == -1
    assert py_verdict(data, "Constraint", ident) is None


BAD_DESCRIPTIONS = {
    "V167 alignment 3": (0, 4, 3, 0, 0),
    "V168 vector of 9-byte elements": (4, 4, 4, 9, 10),
    "V169 table index = table count": (8, 4, 4, 1, 0),
}


@pytest.mark.parametrize("label", list(BAD_DESCRIPTIONS))
def test_inconsistent_descriptions_are_refused(label: str) -> None:
    """V167 (the power-of-two test of an alignment dropped from ``load_desc``), V168 (vector
    elements up to 9 bytes), V169 (a table index equal to the table count: later read one
    ``Table`` past the array)."""
    with pytest.raises(ValueError, match=r"tables\[0\]\[0\] is inconsistent"):
        FAST(bytes(16), 0, None, ((BAD_DESCRIPTIONS[label],),), *LIMITS)


def test_a_body_alignment_of_zero_is_refused() -> None:
    """V170 (``body_align == 0`` dropped: ``(target + 4) % 0`` for a ``Pack.body``)."""
    _, _, tables = _verify_native.tables(verify._PLANS)
    with pytest.raises(ValueError, match="body_align > 0"):
        FAST(bytes(16), 0, None, tables, *LIMITS[:3], 0)


# ==== _zstd_inflate.c: frame boundaries and the decoder's words ===============================

MAGIC = struct.pack("<I", 0xFD2FB528)
EMPTY_FRAME = bytes.fromhex("28b52ffd" "20" "00" "010000")  # single segment, size 0, last raw


def test_frame_size_of_frames_ending_exactly_at_the_buffers_end() -> None:
    """Z012 (``len - pos <= 3``: a last block header ending the buffer), Z016 (``<= bsize``: a
    last block ending it) and Z017 (``<= 4``: a checksum ending it); the suite measured frames
    with trailing bytes only."""
    assert EXT.zstd_builtin_frame_size(EMPTY_FRAME) == len(EMPTY_FRAME)
    data = bytes(range(256)) * 20
    for checksum in (True, False):
        frame = zstandard.ZstdCompressor(level=3, write_checksum=checksum).compress(data)
        assert EXT.zstd_builtin_frame_size(frame) == len(frame)
        with pytest.raises(ValueError, match="truncated"):
            EXT.zstd_builtin_frame_size(frame[:-1])


def test_frame_size_refuses_a_block_above_the_window() -> None:
    """Z182 (``bsize > block_max`` dropped in ``kp_zstd_frame_size``): a 2000-byte raw block in
    a frame of a 1 KiB window is refused by the size reader as by the decoder."""
    frame = MAGIC + b"\0\0" + ((2000 << 3) | 1).to_bytes(3, "little") + bytes(2000)
    for door in (EXT.zstd_builtin_frame_size, lambda f: EXT.zstd_builtin_decompress(f, 4000)):
        with pytest.raises(ValueError, match="size 2000 exceeds the block maximum 1024"):
            door(frame)


def test_blocks_past_a_declared_size_equal_to_the_capacity_are_named_as_such() -> None:
    """Z154 (``content_size < cap``: a frame declaring exactly raw_size was held to the
    capacity instead, so its error named the capacity, not the declaration)."""
    blocks = (3 << 3).to_bytes(3, "little") + b"abc" + ((1 << 3) | 1).to_bytes(3, "little")
    frame = MAGIC + b"\x20\x03" + blocks + b"d"  # single segment, content size 3
    with pytest.raises(ValueError, match="frame declares 3 bytes of content, its blocks hold "
                                         r"more \(block at offset 12\)"):
        EXT.zstd_builtin_decompress(frame, 3)


def test_a_damaged_frame_declaring_no_content_is_read_at_any_raw_size() -> None:
    """_zstd.c S004 (``raw_size == 0 || declared == 0``: a frame declaring 0 bytes answered b""
    unread whatever raw_size; only at raw_size 0 is that zstandard's rule)."""
    frame = MAGIC + b"\x20\0" + ((3 << 1) | 1).to_bytes(3, "little")  # reserved block type
    assert EXT.zstd_builtin_decompress(frame, 0) == b""
    with pytest.raises(ValueError, match="reserved block type 3"):
        EXT.zstd_builtin_decompress(frame, 5)


def test_a_frame_cut_after_its_magic_number_is_named_as_such() -> None:
    """Z000 (``len <= 4``): four bytes of magic number lack the header descriptor; they are
    not "a frame starts with a 4-byte magic number"."""
    for door in (EXT.zstd_builtin_frame_size, EXT.zstd_builtin_content_size):
        with pytest.raises(ValueError, match="offset 4: no frame header descriptor"):
            door(EMPTY_FRAME[:4])
        with pytest.raises(ValueError, match="offset 3: a frame starts with a 4-byte magic"):
            door(EMPTY_FRAME[:3])


# ==== _fbread.c: module_index ==================================================================

def test_module_index_refuses_a_spec_item_with_a_negative_slot() -> None:
    """F124 (``f->slot < 0`` dropped from ``field_of``): a negative slot in the Module spec is
    a caller's error, not an absent field."""
    spec = ((-1,) + loader._MODULE[0][1:],) + loader._MODULE[1:]
    with pytest.raises(ValueError, match="spec item 0 has kind 2 and slot -1"):
        EXT.module_index(bytes(16), 0, 0, spec, loader._INDEX_LIMITS + (1,))


def index_of_images(*images: dict[str, int]) -> list[str] | None:
    """module_index's answer for one module "m" (kernel "k") of these images (see
    test_review24_lazy_decode._image), in a body that is not verified: the C check runs on
    verified bodies, where the verifier refuses these enum values first, but it reads any
    buffer, and only ever answers "plainly good" or "the Python path decides"."""
    b = flatbuffers.Builder(256)
    metas = [_image(b, **image) for image in images]
    name, kernels = b.CreateString("m"), _offsets(b, [b.CreateString("k")])
    vector = _offsets(b, metas)
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, kernels, 0)
    b.PrependUOffsetTRelativeSlot(2, vector, 0)
    modules = _offsets(b, [b.EndObject()])
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(2, modules, 0)
    b.Finish(b.EndObject())
    buf = bytes(b.Output())
    body = Table(buf, struct.unpack_from("<I", buf)[0], "Body")
    return _fbread.module_index(body.tables("modules"), loader._MODULE,  # type: ignore[no-any-return]
                                loader._INDEX_LIMITS + (len(BLOBS),))


@pytest.mark.parametrize("field", ["kind", "suffix"])
def test_module_index_leaves_an_unknown_kind_or_suffix_to_python(field: str) -> None:
    """F137 (``kind.v < lim[L_KINDS]`` dropped) and F145 (``suffix.v < lim[L_SUFFIXES]``
    dropped): enum value 3 is not plain; 2, the last known one, is."""
    assert index_of_images({}) == ["m"]
    assert index_of_images({field: 2}) == ["m"]
    assert index_of_images({field: 3}) is None


def test_module_index_leaves_two_images_of_one_target_to_python() -> None:
    """F092 (``k <= 4``: two images of one target compared a fifth key member, read past both
    keys)."""
    assert index_of_images({}, dict(major=9, blob=1)) == ["m"]
    assert index_of_images({}, dict(blob=1)) is None


# ==== _fbread.c: fb_tree ========================================================================
# one table at 12 (vtable at 4: one slot, field at table offset 4, table 8 bytes) and its field
TABLE_OF_ONE = struct.pack("<IHHHHi", 0, 6, 8, 4, 0, 8)


def test_fb_tree_reads_a_field_ending_at_the_buffers_last_byte() -> None:
    """F001 (``size >= buf->n - pos`` in ``rd``: a read ending exactly at the end refused)."""
    buf = TABLE_OF_ONE + struct.pack("<I", 7)
    assert EXT.fb_tree(buf, 12, ((0, 0, 4, 0, "u32"),)) == [7]
    assert EXT.fb_tree(buf, 12, ((0, 0, -4, 0, "i32"),)) == [7]


def test_fb_tree_reads_a_signed_byte() -> None:
    """F005 (``code == -1 || PyErr_Occurred()`` in ``code_size``: code -1, an int8, read as a
    failed conversion, with no exception set)."""
    buf = TABLE_OF_ONE + b"\xff\0\0\0"
    assert EXT.fb_tree(buf, 12, ((0, 0, -1, 0, "i8"),)) == [-1]
    assert EXT.fb_tree(buf, 12, ((0, 0, 1, 0, "u8"),)) == [255]


def test_fb_tree_reads_empty_vectors_ending_the_buffer() -> None:
    """F016 (``*start >= buf->n`` in ``vector``: an empty vector or string whose count is the
    buffer's last 4 bytes refused)."""
    buf = TABLE_OF_ONE + struct.pack("<II", 4, 0)  # the field: an offset to a count of 0
    spec = ((0, 4, 1, None, "u8s"), (0, 3, 0, None, "bytes"), (0, 2, 0, None, "str"),
            (0, 5, 0, None, "strs"), (0, 7, (), None, "tables"))
    assert EXT.fb_tree(buf, 12, spec) == [(), b"", "", [], []]


def test_fb_tree_reads_seventeen_nested_tables_and_refuses_eighteen() -> None:
    """F022 (``depth >= MAX_SPEC_DEPTH``: the table at depth 16, the deepest allowed, refused;
    the suite read 16 tables, depths 0 to 15)."""
    data, spec = chain(17)
    tree = EXT.fb_tree(data, 16, spec)
    for _ in range(16):
        (tree,) = tree
    assert tree == [None]
    data, spec = chain(18)
    with pytest.raises(ValueError, match="more than 16 tables deep"):
        EXT.fb_tree(data, 16, spec)


def test_fb_tree_spec_items_of_four_and_bad_slots() -> None:
    """F027 (``PyTuple_Size(item) <= 4``: a 4-item spec item, (slot, kind, arg, default),
    refused), F030 and F032 (the conversion error of a slot that is no C long went unnoticed
    unless the kind failed too, and became "slot -1 is negative")."""
    buf = TABLE_OF_ONE + struct.pack("<I", 7)
    assert EXT.fb_tree(buf, 12, ((0, 0, 4, 0),)) == [7]
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        EXT.fb_tree(buf, 12, (("x", 0, 4, 0),))
    with pytest.raises(OverflowError):
        EXT.fb_tree(buf, 12, ((2 ** 70, 0, 4, 0),))


# ==== huffman weights, by hand (RFC 8878 4.2.1.2) ==============================================
# an FSE table description of Huffman weights 0 and 1, 16 of 32 states each, so that every
# state reads 1 bit: accuracy log 5 (4 bits 0), 17 in 5 bits, 17 as 31 in 5 bits (14 bits)
WEIGHTS_01 = bytes([0x10, 0x3F])


def one_block_frame(block: bytes) -> bytes:
    """A frame of one last compressed block, a 1 KiB window and no declared size."""
    return MAGIC + b"\0\0" + ((len(block) << 3) | (2 << 1) | 1).to_bytes(3, "little") + block


def huffman_literals(tree: bytes, streams: bytes = b"", regen: int = 3) -> bytes:
    """A block of Huffman-compressed literals (one stream) with this tree description, and no
    sequences."""
    csize = len(tree) + len(streams)
    return (2 | (regen << 4) | (csize << 14)).to_bytes(3, "little") + tree + streams + b"\0"


def decode_error(block: bytes, size: int = 3) -> str:
    with pytest.raises(ValueError) as info:
        EXT.zstd_builtin_decompress(one_block_frame(block), size)
    return str(info.value)


def test_huffman_weights_stop_at_255_decoded() -> None:
    """Z058 (``count > HUF_MAX_WEIGHTS - 1`` before the first state's weight): 264 bits of
    1-bit states decode 256 weights, one more than RFC 8878 allows (the 256th symbol's weight
    is implied), and made a 257-symbol table. 263 bits decode 255: past that check."""
    tree = bytes([2 + 34]) + WEIGHTS_01 + bytes(33) + b"\x01"  # 8 * 33 bits below the marker
    assert decode_error(huffman_literals(tree)).endswith("Huffman weights: more than 255")
    tree = bytes([2 + 33]) + WEIGHTS_01 + bytes(32) + b"\x80"  # 8 * 32 + 7 bits
    assert decode_error(huffman_literals(tree)).endswith("Huffman weights are all zero")


def test_stored_weights_needing_twelve_bits_are_refused() -> None:
    """Z194 (``maxbits > HUF_MAX_BITS`` dropped): weights 11 and 11 sum to 2^11, a 12-bit code
    whose table would overrun the decoder's 2^11 entries."""
    assert decode_error(huffman_literals(bytes([129, 0xBB]), b"\x01")).endswith(
        "Huffman weights need 12 bits, more than 11")


TREE_BEYOND_SECTION = {
    "Z196 128 stored weights in 2 bytes": (bytes([255, 0x10]), "128 weights need 64 bytes, 2 left"),
    "Z197 no FSE bytes": (bytes([0]), "0 compressed bytes, 1 left"),
    "Z198 100 FSE bytes in 3": (bytes([100]) + WEIGHTS_01, "100 compressed bytes, 3 left"),
}


@pytest.mark.parametrize("label", list(TREE_BEYOND_SECTION))
def test_tree_descriptions_longer_than_their_section_are_refused_first(label: str) -> None:
    """Z196 (``n - 1 < bytes`` dropped: stored weights read past the literals section, whose
    size then went below zero), Z197 (``hdr == 0`` dropped) and Z198 (``n - 1 < hdr``
    dropped: an FSE description read past the section)."""
    tree, words = TREE_BEYOND_SECTION[label]
    assert decode_error(huffman_literals(tree, b"\x01")).endswith(
        "Huffman tree description: " + words)


def test_a_tree_description_filling_the_literals_leaves_no_stream() -> None:
    """Z050 (stored weights, ``n - 1 <= bytes``) and Z053 (FSE weights, ``n - 1 <= hdr``): a
    tree that fills the compressed literals exactly is a good tree followed by no stream, not a
    tree cut short."""
    for tree in (bytes([128, 0x10]), bytes([3]) + WEIGHTS_01 + b"\x03"):
        assert decode_error(huffman_literals(tree)).endswith(
            "Huffman stream is empty or has no end marker")


def test_weight_descriptions_ending_on_their_last_bit() -> None:
    """Z042 (``bitpos >= 8 * n`` after a symbol): a 16-bit description (weights 0, 1, 2 with
    16, 15 and 1 states) in a 2-byte section is complete, its bitstream missing; Z036 (the
    same after a repeat flag): so is one ending on a flag; Z037
    (``sym + repeat >= maxsym + 1``): zeros repeated up to the last weight symbol are allowed,
    the next probability is the error."""
    assert decode_error(huffman_literals(bytes([2, 0x10, 0xFD]))).endswith(
        "Huffman weights: the bitstream is empty or has no end marker")
    # weight 0 "probability 0", then repeat flags 3, 3, 3, 2: zeros for weights 1..11
    assert "Huffman weights FSE table: probabilities for more than 12 symbols" in decode_error(
        huffman_literals(bytes([3, 0x10, 0x7E, 0x01])))
    # Z036 (``bitpos >= 8 * n`` after a repeat flag): accuracy log 6, weight 0 probability 1,
    # weight 1 probability 0, repeat flags 3, 3, 3, 1 ending on bit 24 of 24: complete
    assert decode_error(huffman_literals(bytes([3, 0x21, 0x04, 0x7F]))).endswith(
        "Huffman weights FSE table: probabilities for more than 12 symbols (they do not sum "
        "to 64)")


def test_repeated_zero_probabilities_stop_at_the_last_symbol() -> None:
    """Z188 (``sym + repeat > maxsym + 1`` dropped): repeat flags 3, 3, 3, 3 after weight 0's
    zero ask for weights 1..12, one past the last; the mutant wrote that zero past the end of
    ``norm`` (12 entries) and failed later with other words."""
    assert decode_error(huffman_literals(bytes([3, 0x10, 0xFE, 0x01]))).endswith(
        "Huffman weights FSE table: zero probabilities past symbol 11")


def four_stream_block(regen: int, jump: tuple[int, int, int], streams: bytes) -> bytes:
    """Huffman literals in 4 streams (stored weights: symbols 0 and 1 of 1 bit) with this jump
    table and these stream bytes, then no sequences."""
    body = bytes([128, 0x10]) + struct.pack("<HHH", *jump) + streams
    header = 2 | (1 << 2) | (regen << 4) | (len(body) << 14)
    return header.to_bytes(3, "little") + body + b"\0"


def four_stream_literals(regen: int) -> bytes:
    """regen literals in 4 streams of 1 byte each: their zero bits under the end marker."""
    seg = (regen + 3) // 4
    streams = bytes([1 << max(0, n) for n in (seg, seg, seg, regen - 3 * seg)])
    return four_stream_block(regen, (1, 1, 1), streams)


def test_a_jump_table_longer_than_the_literals_is_refused() -> None:
    """Z202 (the jump table's sum check dropped: the fourth stream's size went below zero and
    its end marker was read from far past the input)."""
    block = four_stream_block(6, (100, 1, 1), b"\x04\x04\x04\x01")
    assert decode_error(block, 6).endswith(
        "Huffman jump table: streams of 102 bytes in 4")


def test_literals_that_four_streams_cannot_hold_are_refused() -> None:
    """Z203 (``3 * seg > regen`` dropped: 5 literals made three streams of 2 and a fourth of
    -1; the check is ``regen < 6`` since review 53's finding, as libzstd's) and Z205
    (``csize > n - hs`` dropped: 50 bytes of compressed literals in a 4-byte rest of a block,
    read past it)."""
    for regen in (1, 2, 3, 4, 5):
        assert decode_error(four_stream_literals(regen), regen).endswith(
            f"Huffman literals: {regen} literals cannot be split in 4 streams (6 at least)")
    block = (2 | (3 << 4) | (50 << 14)).to_bytes(3, "little") + bytes([128, 0x10]) + b"\x0d\0"
    assert decode_error(block).endswith("literals section longer than block")


def test_four_stream_jump_tables_leaving_no_stream_bytes() -> None:
    """Z060 (``n <= 6``: a 6-byte section, the jump table alone, said to be too short for it)
    and Z061 (``sum >= n - 6``: three streams filling the section, said to be longer than
    it): both are good jump tables of empty streams."""
    assert decode_error(four_stream_block(6, (0, 0, 0), b""), 6).endswith(
        "Huffman stream 1 is empty or has no end marker")
    assert decode_error(four_stream_block(6, (1, 1, 1), b"\x04\x04\x04"), 6).endswith(
        "Huffman stream 4 is empty or has no end marker")


def test_four_streams_of_six_or_more_literals_decode_as_zstandard_decodes_them() -> None:
    """Z062 (``3 * seg >= regen``: 6 literals refused), and the boundary of the bug below,
    where the decoders agree."""
    reference = zstandard.ZstdDecompressor()
    for regen in (6, 7, 8):
        frame = one_block_frame(four_stream_literals(regen))
        assert EXT.zstd_builtin_decompress(frame, regen) == bytes(regen)
        assert reference.decompress(frame, max_output_size=regen) == bytes(regen)


def test_rle_literals_without_their_byte_are_refused() -> None:
    """Z213 (``n - hs < 1`` dropped: the byte after the block, here after the input, was read
    as the literal, and the block's rest went below zero)."""
    assert decode_error(bytes([(3 << 3) | 1])).endswith("literals section longer than block")


def sequence_block(literals: bytes, ll: int, of: int, ml: int, stream: bytes) -> bytes:
    """Raw literals, then one sequence of RLE codes (literal length, offset, match length)."""
    return bytes([len(literals) << 3]) + literals + bytes([1, 0x54, ll, of, ml]) + stream


def test_an_rle_sequence_code_above_the_last_is_refused() -> None:
    """Z216 (``p[0] > maxsym`` dropped: LL_BASE read at index 36) and Z111 (``p[0] >=
    maxsym``: code 35, the last, refused; its 65536 literals are what is wrong here)."""
    block = sequence_block(b"abc", 36, 2, 0, b"\x06")
    assert decode_error(block, 6).endswith("literal lengths RLE code 36 exceeds 35")
    block = sequence_block(b"abc", 35, 2, 0, b"\0\0\x04")  # 2 + 16 zero bits
    assert decode_error(block, 6).endswith("sequence 0 takes 65536 literals, 3 left")


def test_literals_after_the_last_sequence_stop_at_the_capacity() -> None:
    """Z224 (``rest > limit - op`` dropped: the literals left after the sequences were copied
    past the output's end): "abc", a match of 3 at offset 3, then "def" make 9 bytes."""
    frame = one_block_frame(sequence_block(b"abcdef", 3, 2, 0, b"\x06"))
    assert EXT.zstd_builtin_decompress(frame, 9) == b"abcabcdef"
    with pytest.raises(ValueError, match="output exceeds the 6 bytes allowed"):
        EXT.zstd_builtin_decompress(frame, 6)


def test_a_block_decoding_past_the_block_maximum_is_refused() -> None:
    """Z234 (the sequences' limit made the output's end, not the block maximum): in a 1 KiB
    window, "a" and a match of 515 (code 45) fit, of 1027 (code 46) do not."""
    # offset code 2 with bits 0 (offset 1), then the match length's extra bits, all zero
    frame = one_block_frame(sequence_block(b"a", 1, 2, 45, b"\0\x08"))
    assert EXT.zstd_builtin_decompress(frame, 5000) == b"a" * 516
    frame = one_block_frame(sequence_block(b"a", 1, 2, 46, b"\0\x10"))
    with pytest.raises(ValueError, match=r"decodes to more than the block maximum \(1024"):
        EXT.zstd_builtin_decompress(frame, 5000)


def test_literals_sections_filling_their_block_leave_no_sequences_section() -> None:
    """Z081 (``n <= hs``, raw literals: a 1-byte section of 0 literals said to be longer than
    its block), Z085 (``n <= hs``, compressed literals: a 3-byte header with a 0-byte
    section, the same) and Z089 (``csize >= n - hs``: compressed literals filling the
    block's rest said to be longer than it)."""
    assert decode_error(b"\0").endswith("the sequences section is missing")
    header = (2 | (3 << 4)).to_bytes(3, "little")  # 3 literals in 0 compressed bytes
    assert decode_error(header).endswith("Huffman tree description is missing")
    assert EXT.zstd_builtin_decompress(
        one_block_frame(huffman_literals(bytes([128, 0x10]), b"\x0d")), 3) == b"\x01\0\x01"
    assert decode_error(huffman_literals(bytes([128, 0x10]), b"\x0d")[:-1]).endswith(
        "the sequences section is missing")


def rle_literals(regen: int, byte: bytes = b"r", sequences: bytes = b"\0") -> bytes:
    """RLE literals (a 2-byte header: up to 4095) of ``byte``, then ``sequences``."""
    return bytes([1 | (1 << 2) | ((regen & 15) << 4), regen >> 4]) + byte + sequences


def test_literals_of_exactly_the_block_maximum_or_the_capacity() -> None:
    """Z090 (``regen >= f->block_max``, compressed literals), Z100 (the same, RLE literals),
    Z107 (``regen >= f->block_max`` in naming the error: 1024 literals over a 1000-byte
    capacity are an overflow, not a block above its maximum) and Z106 (``regen >=
    c->lits_cap``: 3 RLE literals in a 3-byte output), in a 1 KiB window."""
    stream = bytes(32) + b"\x01"  # 256 zero bits under the end marker
    body = bytes([128, 0x10]) + struct.pack("<HHH", 33, 33, 33) + stream * 4
    header = (2 | (2 << 2) | (1024 << 4) | (len(body) << 18)).to_bytes(4, "little")
    frame = one_block_frame(header + body + b"\0")
    assert EXT.zstd_builtin_decompress(frame, 5000) == bytes(1024)
    assert EXT.zstd_builtin_decompress(one_block_frame(rle_literals(1024)), 5000) == b"r" * 1024
    assert decode_error(rle_literals(1024), 1000).endswith("output exceeds the 1000 bytes "
                                                           "allowed (block at offset 6)")
    assert decode_error(rle_literals(1025), 5000).endswith(
        "1025 literals, more than the block maximum (1024 bytes)")
    assert EXT.zstd_builtin_decompress(one_block_frame(rle_literals(3, b"x")), 3) == b"xxx"


def test_no_sequences_in_the_two_byte_form() -> None:
    """Z125 (``n <= 2``: a 2-byte sequences header, 0x80 0x00, that is 0 sequences written
    long, said to be longer than its block); zstandard reads it too."""
    frame = one_block_frame(bytes([3 << 3]) + b"abc" + b"\x80\0")
    assert EXT.zstd_builtin_decompress(frame, 3) == b"abc"
    assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=3) == b"abc"


def test_raw_or_rle_literals_ending_the_block_leave_no_sequences_section() -> None:
    """Z104 (``regen >= n - hs``: raw literals filling the block) and Z105 (``n - hs <= 1``:
    an RLE byte ending the block), each said to be a literals section longer than its block."""
    for block in (bytes([3 << 3]) + b"abc", bytes([(3 << 3) | 1]) + b"x"):
        assert decode_error(block).endswith("the sequences section is missing")


@pytest.mark.parametrize("regen", [3, 4])
def test_four_streams_of_fewer_than_six_literals_are_refused_as_zstandard_refuses_them(
        regen: int) -> None:
    """Found while judging Z062 (``3 * seg >= regen``): ``huf_decode`` refused only a count
    that 4 streams of ceil(n / 4) cannot hold (1, 2, 5), and decoded 3 and 4 literals, which
    zstandard, the decoder's reference, refuses ("Header of Literals' block doesn't respect
    format specification"). Fixed the same session: fewer than 6 literals in 4 streams are
    refused, as libzstd does."""
    frame = one_block_frame(four_stream_literals(regen))
    with pytest.raises(zstandard.ZstdError, match="Literals"):
        zstandard.ZstdDecompressor().decompress(frame, max_output_size=regen)
    with pytest.raises(ValueError):
        EXT.zstd_builtin_decompress(frame, regen)


# ==== reads stop at the buffer's end: buffers against a guard page ============================
GUARDED = textwrap.dedent("""
    import ctypes, mmap, struct, sys
    from kernelpack import _verify_native, verify
    from kernelpack.runtime import _launch as EXT

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def at_page_end(data):
        mm = mmap.mmap(-1, 2 * PAGE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        assert libc.mprotect(addr + PAGE, PAGE, 0) == 0  # PROT_NONE: a read there is SIGSEGV
        mm[PAGE - len(data):PAGE] = data
        return memoryview(mm)[PAGE - len(data):PAGE]

    _, index, tables = _verify_native.tables(verify._PLANS)
    limits = (verify.MAX_TABLE_DEPTH, verify.MAX_NAME_LENGTH, verify.MAX_FILE_SIZE,
              verify.BODY_ALIGNMENT)
    module = bytes.fromhex(sys.argv[1])
    print(EXT.verify_fast(at_page_end(module), index["Module"], None, tables, *limits))
    for n in range(4):  # shorter than the root offset
        print(EXT.verify_fast(at_page_end(module[:n]), index["Module"], None, tables, *limits))
    frame = bytes.fromhex(sys.argv[2])
    print(EXT.zstd_builtin_decompress(at_page_end(frame), 6).decode())
    from kernelpack import loader
    modules = at_page_end(bytes.fromhex(sys.argv[3]))
    print(EXT.module_index(modules, 0, 1, loader._MODULE, loader._INDEX_LIMITS + (1,)))
""")


def kernels_k0k_then_k() -> bytes:
    """A vector of one Module table (name "m"), by hand, whose kernel names are "k\\0k" and
    "k", the second one's NUL the buffer's last byte (unsorted: not plain)."""
    buf = bytearray(58)
    # the vector's one offset (-> 12); vtable at 4 (name at 4, kernels at 8; 12 bytes); the
    # table at 12: name -> 24, kernels -> 32
    struct.pack_into("<IHHHHiII", buf, 0, 12, 8, 12, 4, 8, 8, 8, 12)
    struct.pack_into("<I2s", buf, 24, 1, b"m")
    struct.pack_into("<III", buf, 32, 2, 8, 12)  # 2 names, at 44 and 52
    struct.pack_into("<I4s", buf, 44, 3, b"k\0k")
    struct.pack_into("<I1s", buf, 52, 1, b"k")
    return bytes(buf)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
def test_reads_stop_at_the_end_of_a_buffer_followed_by_a_guard_page() -> None:
    """V128 (``start + 3 * count > w->n``: a vector of one offset 3 bytes from the end was
    read, one byte past it), V160 (``n < header`` dropped: the root offset of a buffer of 0 to
    3 bytes was read) and Z023 (``b->pos >= 0`` in ``bb_refill``: a sequences bitstream
    shorter than 8 bytes, the frame's last, was reloaded 8 bytes wide) and F126 (``memcmp`` of
    two kernel names over the first one's length: "k\\0k" against "k" read 1 byte past the
    buffer after the equal NULs): each buffer ends where
    an unreadable page starts, so a read past it ends the child process."""
    module = bytearray(27)  # root 12, vtable at 4, table at 12, kernels -> 20: 1 offset at 24
    struct.pack_into("<IHHHHiII", module, 0, 12, 8, 8, 0, 4, 8, 4, 1)
    # raw literals "abc", one sequence (RLE codes: literal length 3, offset code 2, match 3),
    # its 1-byte bitstream (offset bits 0b10) the frame's last byte
    block = bytes([3 << 3]) + b"abc" + bytes([1, 0x54, 3, 2, 0]) + b"\x06"
    src = str(Path(kernelpack.__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", GUARDED, bytes(module).hex(),
                          one_block_frame(block).hex(), kernels_k0k_then_k().hex()],
                         capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["-1"] * 5 + ["abcabc", "None"]
