"""Review 56: the rest of review 53's mutants of the built-in zstd decoder, and _zstd.c's
libzstd door.

Method as review 53 (a throw-away mutator on a copy of the tree in /tmp/r56, the extension
rebuilt with gcc -O2 for each mutant, one mutation at a time; ``-x``, 120 s timeout, a crash
counts as a kill). The tests run were this file first, then test_zstd_inflate.py,
test_zstd.py and test_review53_c_mutants.py; so "killed here first" below means this file's
tests failed first, not that the older suite would miss the mutant (that was measured only
for the first 34 mutants, X00-C08 and MZ00-MZ06, run before this file existed).

252 mutants. ``_zstd_inflate.c`` (210): review 53's 101 generated-but-not-run mutants (its
ids kept, Z001-Z176: the status ``==``/``!=`` tests, the literals and sequences headers,
Huffman stream loops, frame-level flags), 27 generated here in the sites it skipped
(X00-X04 xxh64, B00-B06 build_fse, H00-H05 build_huffman's fill, C00-C08 copy_match) and 82
by hand (MZ00-MZ33: every xxh64 prime, rotation, seed lane, merge, length term and final
shift; MZ34-MZ43: build_fse's step, high/mask, "less than 1" slots and the state fill;
MZ44-MZ56: build_huffman's starts, spans, 8-byte stores, last weight and maxbits;
MZ57-MZ81: copy_match's room test, the 16/8-byte thresholds and strides, the short-offset
byte copy and its re-based distance, and the careful path). 177 were killed by the run
(10 by a crash, 44 by the older tests, 123 by this file first); of the 33 survivors, 3 are
killed here (X00, Z048, Z110), 23 are equivalent and 7 are neither. ``_zstd.c``'s libzstd
door (42: L00-L23 generated in open_libzstd, zstd_open, usable, zstd_content_size, run and
zstd_decompress; MS00-MS17 by hand: version and size constants, the state, the room and
input sizes given to libzstd, the pool, the result's length): 30 killed by the run (4 by a
crash, 1 by the older tests, 25 by this file first), 3 of the 12 survivors killed here (L00,
L01: libzstd never opened, so that every libzstd test skipped; MS09), 5 equivalent, 4
equivalent on this machine only.

Equivalent (no input tells them apart). build_huffman: ``k < maxbits`` (H01: the last start
is only the table's end, never read), spans of 4 stored one by one (H03, MZ48: the same
entries), ``j < span - 1`` with the 8-byte stores (MZ51: span >= 4, the last store starts at
span - 4). copy_match: the fast-path test made strict (C00) and the 16/8-byte thresholds
moved by one or to 16 (C01, C03, MZ61, MZ66, MZ67: the other path copies the same bytes: a
distance of 8 to 15 taken by the short-offset path re-bases to ``op - off``), one more wide
copy at ``op == end`` (C02, C06) or for ``len == 8`` (C05, MZ69), one more pattern byte
(C04: ``m[8]`` is that byte, in the WILD room), 7 instead of 8 after the bytes (MZ70: the
8th is written again with its value), the re-based distance ``off * ((8 + off) / off)``
(MZ71: still a multiple of off between 8 and 8 + off, inside the pattern), the careful
``off > len`` (C07). Others: ``count <= 0 ? -count`` (Z034: -0 is 0); the 4-stream fast
loop's exit ``k <= 4`` (Z070: the careful tail decodes the same literals); the literal count
bounds joined with ``&&`` (Z093, Z094, Z102: lits_cap or the sequences' checks refuse the
same frames with the same overflow words, as review 53's Z206-Z214). libzstd door: the GIL
threshold (L09, MS03), a 0-byte output buffer (L15), the idle context never kept or kept
over another (L20, MS13: a context made and freed per call, or one leaked when two threads
overlap; the output is the same). On this machine only (libzstd 1.5.4 with every symbol):
the version test at equality or joined with ``&&`` (L02, L03), no symbol test (MS05), the
failed state left at 0 (MS04: absent libraries would be retried per call).

Neither killed nor equivalent (undefined behaviour with the same output on this build):
B06 (``u <= size`` in build_fse writes one FseEntry past the table, a stack array at its
largest log), C08 (the careful byte loop's ``op <= end`` writes one byte past the match: at
the output's end that is the bytes object's NUL slot), Z051 (the direct Huffman weights read
one nibble more; the extra weight is overwritten by the implied last one, but for an even
count it reads one byte past the description), Z066 (the 4-stream loop's test reads
``b[4]`` past the array; either answer continues the loop), Z088 (the literals header reads
``p[hs]`` into bits that are masked off: one byte past the input only when the header ends
it). Not killed for want of input: Z075 (6 Huffman symbols per refill in the 1-stream loop:
wrong only where 6 codes in a row and the leftover bits exceed 64 bits, which zstandard's
trees for fewer than 256 literals did not produce in 800 tries; a hand-made stream would
kill it) and Z124 (the 3-byte sequence count read as a 2-byte one: needs a block of at least
0x7F00 sequences).

No real bug found: the decoder agreed with zstandard on every frame here. No GPU; < 1 s.
"""

from __future__ import annotations

import random

import pytest
import zstandard

try:
    from kernelpack.runtime import _launch as EXT
except ImportError:  # no C compiler at install time: the Python doors run alone
    EXT = None

pytestmark = pytest.mark.skipif(EXT is None, reason="kernelpack.runtime._launch is not built "
                                                    "(python setup.py build_ext)")
REFERENCE = zstandard.ZstdDecompressor()


def builtin(frame: bytes, raw_size: int) -> bytes:
    """The built-in decoder through its C door (ValueError on a refused frame)."""
    return EXT.zstd_builtin_decompress(frame, raw_size)  # type: ignore[union-attr, no-any-return]


def compress(data: bytes, level: int = 3, checksum: bool = True, **kw: object) -> bytes:
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=len(data), write_checksum=checksum, write_content_size=True, **kw)
    return zstandard.ZstdCompressor(compression_params=params).compress(data)


def same(data: bytes, frame: bytes) -> None:
    """The built-in decoder and zstandard both give back data."""
    assert REFERENCE.decompress(frame) == data
    got = builtin(frame, len(data))
    assert got == data, (len(got), len(data), next((i for i, (a, b) in enumerate(zip(got, data))
                                                   if a != b), None))


# ==== xxh64 (the content checksum) =============================================================

CHECKSUM_SIZES = [*range(0, 72), 95, 96, 97, 127, 128, 129, 255, 256, 1000, 4099, 65543]


def test_content_checksums_of_every_tail_length_are_accepted() -> None:
    """Kills X00 (only here: exactly 32 bytes) and fails first for 120 more: xxh64's MZ07-MZ33,
    build_fse's MZ34-MZ43, build_huffman's MZ44, MZ46, MZ52, MZ53, MZ55, MZ56, copy_match's
    MZ60, MZ62-MZ65, MZ68, MZ73-MZ81 and 62 of review 53's Z001-Z176. Each size from 0 to 71
    takes a different path through xxh64's 32-byte stripes, 8-byte lanes, 4-byte word and
    bytes: a wrong constant, rotation, bound or dropped step fails a correct frame."""
    rng = random.Random(56)
    for n in CHECKSUM_SIZES:
        for data in (rng.randbytes(n), bytes(rng.choice(b"ab") for _ in range(n))):
            same(data, compress(data, 1))


def test_content_checksums_flipped_by_one_bit_are_refused() -> None:
    """Pins the checksum comparison (Z176 turned, review 53's dropped one). Every bit of the
    stored checksum (the frame's last 4 bytes) flipped, for sizes on both sides of 32."""
    rng = random.Random(5)
    for n in (1, 7, 31, 32, 33, 200):  # 0: a header declaring no content is not read
        data = rng.randbytes(n)
        frame = compress(data, 3)
        for bit in range(32):
            bad = bytearray(frame)
            bad[len(bad) - 4 + bit // 8] ^= 1 << (bit % 8)
            with pytest.raises(zstandard.ZstdError):
                REFERENCE.decompress(bytes(bad))
            with pytest.raises(ValueError, match="checksum"):
                builtin(bytes(bad), n)


# ==== copy_match: overlapping and short-offset matches ========================================

def _repeat(rng: random.Random, off: int, length: int) -> bytes:
    """A random pattern of off bytes, then length more bytes repeating it (a match at off)."""
    pattern = rng.randbytes(off)
    return pattern + (pattern * (length // off + 1))[:length]


MATCH_LENGTHS = (3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 47, 64, 100, 301)


@pytest.mark.parametrize("level", [1, 19])
def test_matches_at_offsets_1_to_40_inside_the_output(level: int) -> None:
    """Kills MZ59, MZ72 first (copy_match's 16-byte threshold at 15, the re-based distance
    too short). Every offset 1..40 with lengths around 8, 16 and 32, each followed by random
    bytes: the wide copies of the fast paths run."""
    rng = random.Random(level)
    parts = []
    for off in range(1, 41):
        for length in MATCH_LENGTHS:
            parts.append(rng.randbytes(rng.randrange(1, 6)))
            parts.append(_repeat(rng, off, length))
    parts.append(rng.randbytes(64))
    data = b"".join(parts)
    same(data, compress(data, level))


def test_matches_at_offsets_1_to_40_at_the_end_of_the_output() -> None:
    """Pins copy_match's careful path (its mutants MZ79-MZ81 fail the tests above first).
    The match ends the output, or ends 0..40 bytes before it: less than the wide copies'
    room is left."""
    rng = random.Random(40)
    for off in range(1, 41):
        for length in (3, 5, 8, 9, 16, 17, 33, 70):
            for tail in (0, 1, 7, 16, 31, 40):
                data = rng.randbytes(7) + _repeat(rng, off, length) + rng.randbytes(tail)
                same(data, compress(data, 1))


# ==== _zstd.c's libzstd door (zstd_open, zstd_content_size, zstd_decompress) ===================

needs_libzstd = pytest.mark.skipif(EXT is None or not EXT.zstd_open(),
                                   reason="libzstd.so.1 (>= 1.4.0) is not usable here")


def _system_libzstd_version() -> int:
    """ZSTD_versionNumber() of the system's libzstd.so.1 through ctypes, 0 where absent."""
    import ctypes

    try:
        return int(ctypes.CDLL("libzstd.so.1").ZSTD_versionNumber())
    except (OSError, AttributeError):
        return 0


def test_the_libzstd_door_opens_a_usable_libzstd() -> None:
    """Kills L00, L01 (only here), L04, MS00, MS06: open_libzstd's state tests and constants
    reporting a usable library absent, after which every libzstd test would skip."""
    version = _system_libzstd_version()
    assert EXT.zstd_open() is (version >= 10400)  # type: ignore[union-attr]
    assert EXT.zstd_open() is (version >= 10400)  # type: ignore[union-attr]  # cached


@needs_libzstd
def test_libzstd_door_content_sizes() -> None:
    """Kills L05, L07, L08 (usable() and the UNKNOWN and ERROR comparisons), MS01, MS02
    (the two constants)."""
    assert EXT.zstd_content_size(compress(b"abc" * 9)) == 27
    unknown = zstandard.ZstdCompressor(write_content_size=False).compress(b"abc")
    assert EXT.zstd_content_size(unknown) == -1
    for bad in (b"\x28\xb5\x2f\xfd\xff", b"not a zstd frame"):
        with pytest.raises(ValueError, match="error determining content size"):
            EXT.zstd_content_size(bad)


@needs_libzstd
def test_libzstd_door_sizes_and_truncation() -> None:
    """Kills L11, L13, L14, L16, L18, L19, L21-L23, MS07 (one byte more of room given to
    libzstd), MS10 (raw_size 0 read as an empty frame), MS11 (the frame size's error
    ignored: libzstd told to read past the input), MS12, MS14, MS15 (an empty output
    returned as the 1-byte buffer), MS16 (raw_size bytes copied instead of those written)."""
    data = bytes(range(51))
    frame = compress(data)
    assert EXT.zstd_decompress(frame, 51) == data
    assert EXT.zstd_decompress(frame, 1000) == data
    for raw_size in (0, 50):
        with pytest.raises(ValueError, match="Destination buffer is too small"):
            EXT.zstd_decompress(frame, raw_size)
    unknown = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    with pytest.raises(ValueError, match="Destination buffer is too small"):
        EXT.zstd_decompress(unknown, 50)
    empty = zstandard.ZstdCompressor(write_content_size=False).compress(b"")
    assert EXT.zstd_decompress(empty, 0) == b""
    assert EXT.zstd_decompress(empty, 10) == b""
    for cut in (5, len(frame) - 1):
        with pytest.raises(ValueError, match="Src size is incorrect"):
            EXT.zstd_decompress(frame[:cut], 51)
    with pytest.raises(ValueError, match="Unknown frame descriptor"):
        EXT.zstd_decompress(b"not a zstd frame", 51)


@needs_libzstd
def test_libzstd_door_reads_only_the_first_frame() -> None:
    """Kills MS08, MS09 (only here): libzstd given the whole input decodes every frame; MS09
    on the path that releases the GIL, from 256 KiB of room."""
    first, second = compress(b"first " * 10), compress(b"second")
    assert EXT.zstd_decompress(first + second, 1000) == b"first " * 10
    assert EXT.zstd_decompress(first + second, 1 << 18) == b"first " * 10
    unknown = zstandard.ZstdCompressor(write_content_size=False)
    both = unknown.compress(b"first ") + unknown.compress(b"second")
    assert EXT.zstd_decompress(both, 1000) == b"first "
    assert EXT.zstd_decompress(both, 6) == b"first "


# ==== hand-made frames ==========================================================================

def _one_block(content: bytes) -> bytes:
    """A frame of one last compressed block, a 1 KiB window and no declared size."""
    header = (len(content) << 3) | (2 << 1) | 1
    return b"\x28\xb5\x2f\xfd\x00\x00" + header.to_bytes(3, "little") + content


def test_a_one_byte_huffman_tree_description_is_read_not_called_missing() -> None:
    """Kills Z048 (only here; Z155 first): read_huffman_tree's ``n < 1`` made ``n <= 1``
    called a description of one byte missing. Both refuse it; the words must name what is
    short."""
    literals = (2 | (3 << 4) | (1 << 14)).to_bytes(3, "little")  # Huffman, 3 literals, 1 byte
    for tree, words in ((b"\x80", "1 weights need 1 bytes, 0 left"),
                        (b"\x01", "1 compressed bytes, 0 left")):
        frame = _one_block(literals + tree + b"\x00")
        with pytest.raises(zstandard.ZstdError):
            REFERENCE.decompress(frame, max_output_size=3)
        with pytest.raises(ValueError, match=words):
            builtin(frame, 3)


def test_an_rle_code_that_ends_the_sequences_section_is_read() -> None:
    """Kills Z110 (only here): read_seq_table's ``n < 1`` made ``n <= 1`` called an RLE code
    that is the section's last byte missing. Three RLE codes, then no bitstream: both refuse
    it, and the words must blame the missing bitstream, not the code that is there."""
    literals = bytes([3 << 3]) + b"abc"  # raw, 3 literals
    frame = _one_block(literals + bytes([1, 0x54, 3, 0, 0]))  # 1 sequence, all RLE
    with pytest.raises(zstandard.ZstdError):
        REFERENCE.decompress(frame, max_output_size=100)
    with pytest.raises(ValueError, match="sequences bitstream is empty"):
        builtin(frame, 100)
    with pytest.raises(ValueError, match="match lengths RLE code missing"):
        builtin(_one_block(literals + bytes([1, 0x54, 3, 0])), 100)
