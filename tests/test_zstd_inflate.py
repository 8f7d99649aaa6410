"""kernelpack's own zstd decoder (``_zstd_inflate.c``, the runtime extension's
``zstd_builtin_*``), held to the zstandard package: every level, flag, size and kind of data
decodes byte for byte; damaged frames are refused or decode as zstandard decodes them, never
crash; hand-made frames break each rule of RFC 8878 and are refused with words that say which;
and the loader reads images through it as it did through libzstd."""

from __future__ import annotations

import os
import random
import struct

import pytest
import zstandard

from kernelpack import _images, _zstd
from kernelpack.errors import IntegrityError

BUILTIN = _zstd._open_builtin()
pytestmark = pytest.mark.skipif(BUILTIN is None, reason="runtime extension not built")
# libzstd's one-shot decoder allows windows up to 2 GiB, as ours does; zstandard's default
# (streaming) limit is 128 MiB
REFERENCE = zstandard.ZstdDecompressor(max_window_size=1 << 31)
KiB = 1024
BLOCK = 128 * KiB


def _ext():
    from kernelpack.runtime import _launch

    return _launch


def _decode(frame: bytes, raw_size: int) -> tuple[str, object]:
    """The built-in decoder's outcome: ("ok", bytes) or ("error", message). Anything but
    ZstdFormatError escapes and fails the test."""
    try:
        return "ok", BUILTIN.decompress(frame, raw_size)
    except _zstd.ZstdFormatError as exc:
        return "error", str(exc)


def _reference(frame: bytes, raw_size: int) -> tuple[str, object] | None:
    """zstandard's outcome, or None where it would allocate a hostile header's size."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        return "error", str(exc)
    if declared > 4 * raw_size + 4096:
        return None
    try:
        return "ok", REFERENCE.decompress(frame, max_output_size=max(raw_size, 1))
    except zstandard.ZstdError as exc:
        return "error", str(exc)


def _has_checksum(frame: bytes) -> bool:
    try:
        return bool(zstandard.get_frame_parameters(frame).has_checksum)
    except zstandard.ZstdError:
        return False


# ---------------------------------------------------------------- data of every kind

def _text(n: int, rng: random.Random) -> bytes:
    words = ("kernel launch grid block thread warp shared memory register float half "
             "tensor shape stride offset pointer module image cubin ptx driver context "
             "stream event").split()
    out = " ".join(rng.choice(words) + ("\n" if rng.random() < 0.1 else "")
                   for _ in range(n // 5 + 1)).encode()
    return out[:n]


def _cubin_like(n: int, rng: random.Random) -> bytes:
    """ELF-like machine code: 16-byte instructions from a skewed set of opcodes with register
    fields, half of them repeats of recent ones, zero padding and symbol names (a real sm_90
    cubin's byte statistics: ~half zero bytes; zstd level 9 makes it ~4-6x smaller)."""
    ops = [bytes((rng.randrange(256), rng.randrange(256))) for _ in range(160)]
    weights = [1.0 / (i + 1) for i in range(160)]
    out = bytearray(b"\x7fELF\x02\x01\x01\x33\x07" + bytes(55))
    recent: list[bytes] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.02:
            out += bytes(16 * rng.randint(1, 12))
        elif r < 0.03:
            out += b"_Z%dkernel_v%d\x00.nv.info.%d\x00" % (rng.randrange(99), rng.randrange(999),
                                                         rng.randrange(99))
        elif r < 0.62 and recent:
            out += recent[-1 - min(int(rng.expovariate(1 / 40)), len(recent) - 1)]
        else:
            ins = (rng.choices(ops, weights)[0]
                   + bytes((rng.choice((0, 0, 4, rng.randrange(64))),
                            rng.choice((0, 0, 255, rng.randrange(64))), 0, 0, 0,
                            rng.choice((0, 0, 0, 63)), rng.choice((0, 0, 255, rng.randrange(256))),
                            rng.choice((0, 0, 8, rng.randrange(16))), rng.choice((0, 128, 16)),
                            rng.choice((0, 7, 1)), 0, rng.choice((0xE2, 0xCE, 0xEA, 0)),
                            rng.choice((15, 15, 0)), 0)))
            recent.append(ins)
            if len(recent) > 4096:  # (bounded: benchmarks/zstd_decode.py makes MBs of it)
                del recent[:2048]
            out += ins
    return bytes(out[:n])


_CUBIN: list[bytes] = []


def _real_cubin() -> bytes:
    """A real sm_90 cubin (examples/axpy.ptx through nvJitLink), or b"" where nvJitLink is
    missing."""
    if not _CUBIN:
        try:
            from kernelpack.targets import Arch
            from kernelpack.toolchain import nvjitlink

            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            with open(os.path.join(root, "examples", "axpy.ptx"), "rb") as f:
                _CUBIN.append(nvjitlink.ptx_to_cubin(f.read(), Arch(9, 0)))
        except Exception:  # noqa: BLE001 - no nvJitLink here: the synthetic kinds stand in
            _CUBIN.append(b"")
    return _CUBIN[0]


KINDS = {
    "random": lambda n, rng: rng.randbytes(n),
    "zeros": lambda n, rng: bytes(n),
    "one-byte": lambda n, rng: b"\xa5" * n,
    "text": _text,
    "cubin-like": _cubin_like,
    "mixed": lambda n, rng: (_cubin_like(n // 3, rng) + rng.randbytes(n // 3)
                             + _text(n - 2 * (n // 3), rng)),
}
SIZES = [0, 1, 2, 5, 100, 4096, BLOCK - 1, BLOCK, BLOCK + 1]


def _data(kind: str, n: int, seed: int = 0) -> bytes:
    return KINDS[kind](n, random.Random(f"{kind}-{n}-{seed}"))


def _compress(data: bytes, level: int, checksum: bool = True, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_checksum=checksum,
                                    write_content_size=content_size).compress(data)


# ---------------------------------------------------------------- valid frames decode exactly

@pytest.mark.parametrize("level", [-100, -5, -1, 1, 3, 6, 9, 13, 16, 19, 22])
def test_every_level_kind_and_size(level: int) -> None:
    for kind in KINDS:
        for i, n in enumerate(SIZES):
            data = _data(kind, n)
            flags = ((True, True), (False, False), (True, False), (False, True))
            checksum, content_size = flags[(i + level) % 4]
            frame = _compress(data, level, checksum, content_size)
            assert BUILTIN.decompress(frame, n) == data, (kind, n, checksum, content_size)
            if n:  # with room to spare: still exactly the content
                assert BUILTIN.decompress(frame, n + 7) == data


@pytest.mark.parametrize("level", [1, 3, 9, 19])
def test_multi_block_megabytes(level: int) -> None:
    rng = random.Random(level)
    data = (_cubin_like(1536 * KiB, rng) + bytes(300 * KiB) + rng.randbytes(200 * KiB)
            + _text(400 * KiB, rng))
    for checksum, content_size in ((True, True), (False, False)):
        frame = _compress(data, level, checksum, content_size)
        assert BUILTIN.decompress(frame, len(data)) == data


def test_a_real_cubin() -> None:
    cubin = _real_cubin()
    if not cubin:
        pytest.skip("no nvJitLink here to make a cubin")
    for level in (1, 9, 19):
        frame = _compress(cubin, level, checksum=False)
        assert BUILTIN.decompress(frame, len(cubin)) == cubin
    tiled = b"".join(cubin[i:] + cubin[:i] for i in range(0, 64 * 16, 16))  # ~4 MB
    assert BUILTIN.decompress(_compress(tiled, 9), len(tiled)) == tiled


@pytest.mark.parametrize("window_log", [10, 11, 13, 17, 24, 27])
def test_small_windows_and_long_distance_matching(window_log: int) -> None:
    rng = random.Random(window_log)
    unit = rng.randbytes(1 << min(window_log, 20))
    data = unit + _cubin_like(300 * KiB, rng) + unit  # a match as far back as the window
    for ldm in (False, True):
        params = zstandard.ZstdCompressionParameters.from_level(
            9, window_log=window_log, enable_ldm=ldm, write_checksum=1)
        frame = zstandard.ZstdCompressor(compression_params=params).compress(data)
        assert BUILTIN.decompress(frame, len(data)) == data


def test_content_size_and_frame_size() -> None:
    ext = _ext()
    for n in (0, 1, 255, 256, 257, 65535 + 256, 65536 + 256, 300_000):
        data = _data("text", n)
        for content_size in (True, False):
            frame = _compress(data, 3, content_size=content_size)
            want = zstandard.frame_content_size(frame)
            assert BUILTIN.frame_content_size(frame) == want == (n if content_size else -1)
            assert ext.zstd_builtin_frame_size(frame + b"trailing bytes") == len(frame)
            with pytest.raises(ValueError, match="truncated"):
                ext.zstd_builtin_frame_size(frame[:-1])


def test_only_the_first_frame_and_at_most_raw_size() -> None:
    first, second = b"kernel" * 100, b"other" * 50
    frames = _compress(first, 3) + _compress(second, 3)
    assert BUILTIN.decompress(frames, len(first)) == first
    with pytest.raises(_zstd.ZstdFormatError, match="declares 600 bytes.*more than the 599"):
        BUILTIN.decompress(frames, len(first) - 1)
    unsized = _compress(first, 3, content_size=False)
    assert BUILTIN.decompress(unsized, 10_000) == first
    with pytest.raises(_zstd.ZstdFormatError, match="output exceeds the 599 bytes allowed"):
        BUILTIN.decompress(unsized, len(first) - 1)


def test_bytes_like_forms_and_empty_content() -> None:
    data = bytes(range(256)) * 40
    frame = _compress(data, 3)
    for form in (frame, bytearray(frame), memoryview(frame), memoryview(b"xx" + frame)[2:]):
        assert BUILTIN.frame_content_size(form) == len(data)
        assert BUILTIN.decompress(form, len(data)) == data
    empty = _compress(b"", 3)
    assert BUILTIN.decompress(empty, 0) == b""
    # a header declaring no content gives b"" unread, as zstandard and libzstd's door do
    assert BUILTIN.decompress(empty[:6], 0) == b""
    assert BUILTIN.decompress(_compress(b"", 3, content_size=False), 0) == b""
    with pytest.raises(_zstd.ZstdFormatError, match="raw_size must be >= 0"):
        BUILTIN.decompress(frame, -1)


def test_large_outputs_from_many_threads() -> None:
    """Outputs of 256 KiB and more are decoded without the GIL: threads at once, each exact."""
    import threading

    blobs = [_data("cubin-like", 300_000 + 977 * i, i) for i in range(6)]
    frames = [_compress(b, 9) for b in blobs]
    failures: list[int] = []

    def work(i: int) -> None:
        for _ in range(10):
            if BUILTIN.decompress(frames[i], len(blobs[i])) != blobs[i]:
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


# ---------------------------------------------------------------- damaged frames

def _mutate(frame: bytes, rng: random.Random) -> bytes:
    g = bytearray(frame)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 6))):
        op = rng.random()
        if op < 0.35 and g:
            g[rng.randrange(len(g))] ^= 1 << rng.randrange(8)
        elif op < 0.55 and g:
            g[rng.randrange(len(g))] = rng.randrange(256)
        elif op < 0.7:
            g = g[:rng.randrange(len(g) + 1)]
        elif op < 0.85:
            at = rng.randrange(len(g) + 1)
            g[at:at] = bytes([rng.randrange(256)]) * rng.randint(1, 3)
        elif g:
            at = rng.randrange(len(g))
            del g[at:at + rng.randint(1, 3)]
    return bytes(g)


def _corpus() -> list[tuple[bytes, bytes]]:
    out = []
    for kind in ("text", "cubin-like", "random", "zeros", "mixed"):
        for n in (1, 40, 700, 5000, 40_000, 140_000):
            data = _data(kind, n)
            for level in (-3, 1, 9, 19):
                out.append((data, _compress(data, level, checksum=level != 1,
                                            content_size=level != 9)))
    return out


def _check_damaged(frame: bytes, raw_size: int, counts: dict[str, int]) -> None:
    got = _decode(frame, raw_size)  # anything but ZstdFormatError fails here
    want = _reference(frame, raw_size)
    if want is None:
        return
    counts[f"{got[0]}/{want[0]}"] = counts.get(f"{got[0]}/{want[0]}", 0) + 1
    if got[0] == "ok" and want[0] == "ok":
        # a frame both decoders accept has one meaning (zstandard ignores the bound when
        # the header declares a size: compare what fits)
        assert got[1] == want[1][:raw_size], frame.hex()
    if _has_checksum(frame) and want[0] == "error":
        assert got[0] == "error", (want, frame.hex())


def test_random_mutations_never_crash_and_agree_with_zstandard() -> None:
    rng = random.Random(20261128)
    corpus = _corpus()
    counts: dict[str, int] = {}
    for _ in range(6000):
        data, frame = rng.choice(corpus)
        _check_damaged(_mutate(frame, rng), len(data), counts)
    # the mutations reach both outcomes, and the decoders disagree only where ours is the
    # stricter one (a Huffman stream with bits left, a block past the window's maximum, ...)
    assert counts.get("ok/ok", 0) > 300 and counts.get("error/error", 0) > 3000, counts
    assert counts.get("ok/error", 0) == 0, counts


def test_every_truncation_of_small_frames() -> None:
    counts: dict[str, int] = {}
    for kind in ("text", "cubin-like", "mixed"):
        data = _data(kind, 3000)
        for level, checksum in ((1, True), (19, False), (-5, True)):
            frame = _compress(data, level, checksum)
            for cut in range(len(frame)):
                _check_damaged(frame[:cut], len(data), counts)
                assert _decode(frame[:cut], len(data))[0] == "error"
    assert counts.get("ok/ok", 0) == 0 and counts.get("error/error", 0) > 1000, counts


def test_every_byte_of_a_small_frame_changed() -> None:
    """Each byte of a few frames set to each of a handful of values: the header, block
    headers, literals and sequences sections and the checksum all get hit."""
    rng = random.Random(5)
    counts: dict[str, int] = {}
    for kind, n in (("text", 600), ("cubin-like", 2000)):
        data = _data(kind, n)
        frame = _compress(data, 19)
        for at in range(len(frame)):
            for value in (0, 0xFF, frame[at] ^ 0x80, frame[at] ^ 1, rng.randrange(256)):
                g = bytearray(frame)
                g[at] = value
                _check_damaged(bytes(g), n, counts)
    assert counts.get("ok/error", 0) == 0, counts


# ---------------------------------------------------------------- hand-made frames

MAGIC = struct.pack("<I", 0xFD2FB528)


def _frame(content: bytes, block_type: int = 2) -> bytes:
    """A frame of one last block, a 1 KiB window and no declared size (a single-segment
    frame's window, its content size, would bound the block's stored size too)."""
    header = (len(content) << 3) | (block_type << 1) | 1
    return MAGIC + b"\x00\x00" + header.to_bytes(3, "little") + content


def _rle_sequences(of_code: int, stream: bytes, literals: bytes = b"abc", ll_code: int = 3,
                   ml_code: int = 0) -> bytes:
    """A compressed block: raw literals, then one sequence whose three codes are RLE."""
    assert len(literals) < 32
    lit = bytes([len(literals) << 3]) + literals  # raw, 1-byte header
    return lit + bytes([1, 0x54, ll_code, of_code, ml_code]) + stream


def _raises(frame: bytes, size: int, match: str) -> None:
    with pytest.raises(_zstd.ZstdFormatError, match=match):
        BUILTIN.decompress(frame, size)


def test_hand_made_sequences_offset_before_the_start() -> None:
    # 3 literals, then offset code 2 with bits 0b10: offset value 6, offset 3, match 3
    good = _frame(_rle_sequences(2, b"\x06"))
    assert BUILTIN.decompress(good, 6) == b"abcabc"
    assert REFERENCE.decompress(good, max_output_size=6) == b"abcabc"
    # offset code 4 with bits 0: offset value 16, offset 13, with 3 bytes written
    _raises(_frame(_rle_sequences(4, b"\x10")), 16,
            r"offset 13 points before the start of the output \(3 bytes written\)")
    # a repeat offset with no literals, "repeat 1 minus 1" with repeat 1 = 1: offset 0
    _raises(_frame(_rle_sequences(1, b"\x03", literals=b"", ll_code=0)), 3,
            "repeats offset 0")


def test_hand_made_sequences_bitstream_and_counts() -> None:
    # offset bits 0b10 as in the good frame above, and a third bit never read
    _raises(_frame(_rle_sequences(2, b"\x0d")), 6, "has bits left after its sequences")
    _raises(_frame(_rle_sequences(2, b"\x01")), 6, "ends before its sequences do")
    _raises(_frame(_rle_sequences(2, b"\x00")), 6, "no end marker")
    _raises(_frame(_rle_sequences(2, b"\x06", ll_code=5)), 8,
            "sequence 0 takes 5 literals, 3 left")
    block = _rle_sequences(2, b"\x06")
    _raises(_frame(block[:-6] + bytes([1, 0x55]) + block[-4:]), 6,
            r"reserved bits of the symbol compression modes are set \(0x55\)")
    _raises(_frame(b"\x18abc" + b"\x00junk"), 3,
            "4 bytes after a sequences section of no sequences")
    _raises(_frame(b"\x18abc" + bytes([1, 0xFC])), 3,
            "repeat mode for literal lengths without a previous table")


def test_hand_made_fse_tables() -> None:
    # offsets FSE-coded: accuracy log 5, symbol 0 with all 32 states (bits 0000, then 111111)
    def block(of_table: bytes) -> bytes:
        return b"\x18abc" + bytes([1, 0x64, 3]) + of_table + bytes([0]) + b"\x20"

    good = _frame(block(b"\xf0\x03"))
    assert BUILTIN.decompress(good, 6) == b"abcccc"
    assert REFERENCE.decompress(good, max_output_size=6) == b"abcccc"
    _raises(_frame(block(b"\xff\x03")), 6,
            "offsets FSE table: accuracy log 20 exceeds the maximum 8")
    # accuracy log 6 and nothing but "less than 1" probabilities: 64 states need more than
    # the 32 offset codes
    _raises(_frame(block(b"\x01" + bytes(30))), 6,
            "offsets FSE table: probabilities for more than 32 symbols")
    _raises(_frame(b"\x18abc" + bytes([1, 0x64, 3]) + b"\xf0"), 6,
            "offsets FSE table description is truncated")


def _huffman_block(weights: bytes, stream: bytes = b"\x0d", regen: int = 3) -> bytes:
    """Compressed literals, one stream, a tree of directly stored weights; no sequences."""
    tree = bytes([127 + len(weights) * 2 - (1 if weights[-1] & 15 == 0 else 0)]) + weights
    csize = len(tree) + len(stream)
    header = 2 | (regen << 4) | (csize << 14)
    return header.to_bytes(3, "little") + tree + stream + b"\x00"


def test_hand_made_huffman_trees() -> None:
    # one stored weight (1): symbols 0 and 1 of one bit each; stream bits 1, 0, 1
    good = _frame(_huffman_block(b"\x10"))
    assert BUILTIN.decompress(good, 3) == b"\x01\x00\x01"
    assert REFERENCE.decompress(good, max_output_size=3) == b"\x01\x00\x01"
    _raises(_frame(_huffman_block(b"\xc0")), 3, "Huffman weight 12 of symbol 0 exceeds 11")
    _raises(_frame(_huffman_block(b"\x22\x10")), 3,
            "Huffman weights do not complete a prefix code")
    _raises(_frame(_huffman_block(b"\x00")), 3, "Huffman weights are all zero")
    _raises(_frame(_huffman_block(b"\x10", stream=b"\x1d")), 3,
            "Huffman stream 1 has bits left after its literals")
    _raises(_frame(_huffman_block(b"\x10", stream=b"\x03")), 3,
            "Huffman stream 1 ends before its literals do")
    # treeless literals (type 3) with no earlier tree in the frame
    treeless = bytes([3 | (3 << 4), (1 << 6), 0]) + b"\x0d\x00"
    _raises(_frame(treeless), 3, "treeless literals without a previous Huffman table")
    _raises(_frame(bytes([20 << 3]) + b"abc\x00"), 20, "literals section longer than block")


def test_hand_made_frame_headers() -> None:
    raw = (1 | (0 << 1) | (3 << 3)).to_bytes(3, "little") + b"xyz"  # last raw block "xyz"
    assert BUILTIN.decompress(MAGIC + b"\x20\x03" + raw, 3) == b"xyz"
    _raises(MAGIC + b"\x28\x03" + raw, 3, r"reserved bit 3 of the descriptor \(0x28\) is set")
    _raises(MAGIC + b"\x21\x07\x03" + raw, 3, "needs dictionary 7: dictionaries are not")
    assert BUILTIN.decompress(MAGIC + b"\x21\x00\x03" + raw, 3) == b"xyz"  # ID 0: none
    assert BUILTIN.decompress(MAGIC + b"\x00\xa8" + raw, 3) == b"xyz"  # a 2 GiB window
    _raises(MAGIC + b"\x00\xa9" + raw, 3, r"window size 2\^31 \+ 1/8 exceeds the maximum 2\^31")
    _raises(MAGIC + b"\x00\xb0" + raw, 3, r"window size 2\^32")
    skippable = struct.pack("<II", 0x184D2A53, 4) + b"skip" + MAGIC + b"\x20\x03" + raw
    _raises(skippable, 3, r"skippable frame \(magic number 0x184D2A53\)")
    with pytest.raises(_zstd.ZstdFormatError, match="skippable frame"):
        BUILTIN.frame_content_size(skippable)
    _raises(b"\x28\xb5\x2f\xfe" + b"\x20\x03" + raw, 3, "not a zstd frame: magic number")
    _raises(MAGIC + b"\x20", 3, "frame truncated at offset 5: the frame header needs 6 bytes")
    _raises(MAGIC + b"\x20\x03" + raw[:5], 3,
            "frame truncated at offset 11: block at offset 6 needs 3")
    _raises(MAGIC + b"\x20\x04" + raw, 4, "declares 4 bytes of content, its blocks hold 3")
    _raises(MAGIC + b"\x24\x03" + raw + b"\x00\x00", 3,
            "frame truncated at offset 14: the content checksum needs 4 bytes")
    _raises(MAGIC + b"\x24\x03" + raw + b"\x00\x00\x00\x00", 3,
            "content checksum mismatch: the frame says 0x00000000")


def test_hand_made_blocks() -> None:
    rle = (1 | (1 << 1) | (5 << 3)).to_bytes(3, "little") + b"q"
    assert BUILTIN.decompress(MAGIC + b"\x20\x05" + rle, 5) == b"qqqqq"
    _raises(MAGIC + b"\x20\x05" + (1 | (3 << 1) | (5 << 3)).to_bytes(3, "little") + b"q", 5,
            "block at offset 6: reserved block type 3")
    # a 144 KiB window: a raw block of 128 KiB is the most a block may hold
    body = bytes(BLOCK + 1)
    for size, ok in ((BLOCK, True), (BLOCK + 1, False)):
        frame = MAGIC + b"\x00\x39" + (1 | (size << 3)).to_bytes(3, "little") + body[:size]
        if ok:
            assert BUILTIN.decompress(frame, size) == body[:size]
        else:
            _raises(frame, size, "block at offset 6: size 131073 exceeds the block maximum "
                    "131072")
    # a single-segment frame of 3 bytes: its window, and so its blocks, hold at most 3
    _raises(MAGIC + b"\x20\x03" + (1 | (4 << 3)).to_bytes(3, "little") + b"wxyz", 4,
            "exceeds the block maximum 3")


# ---------------------------------------------------------------- the Python layer

def test_builtin_is_chosen_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_zstd, "_backend", None)
    assert _zstd.backend() == "builtin"
    frame = _compress(b"abc" * 10, 3)
    assert _zstd.frame_content_size(frame) == 30
    assert _zstd.decompress(frame, 30) == b"abc" * 10


def _backends() -> dict[str, object]:
    found = {"builtin": BUILTIN, "native": _zstd._open_native(),
             "ctypes": _zstd._open_libzstd(), "zstandard": _zstd._Zstandard()}
    return {name: b for name, b in found.items() if b is not None}


def test_images_read_alike_through_every_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's checks (declared size = raw_size, exact output) answer the same whichever
    backend decodes: same bytes, or an IntegrityError naming the same failure."""
    data = _data("cubin-like", 50_000)
    frame = _compress(data, 9, checksum=False)
    checked = _compress(data, 9)
    cases = [(frame, len(data)), (frame, len(data) + 1), (frame[:-3], len(data)),
             (checked[:5000] + bytes([checked[5000] ^ 0x40]) + checked[5001:], len(data)),
             (_compress(b"", 9), 0), (b"not a frame", 5)]
    outcomes: dict[str, list[str]] = {}
    for name, backend in _backends().items():
        monkeypatch.setattr(_zstd, "_backend", backend)
        seen = outcomes[name] = []
        for stored, raw_size in cases:
            try:
                out = _images._decompress(memoryview(stored), raw_size, "img")
                seen.append("ok" if out == data[:raw_size] else "other bytes")
            except IntegrityError as exc:
                text = str(exc)
                seen.append("declares" if "declares" in text else
                            "not a frame" if "not a zstd frame" in text else
                            "decompression failed" if "decompression failed" in text else text)
    assert len(set(map(tuple, outcomes.values()))) == 1, outcomes
    assert outcomes["builtin"] == ["ok", "declares", "decompression failed",
                                   "decompression failed", "ok", "not a frame"]


def test_loading_an_image_needs_neither_zstandard_nor_libzstd(tmp_path) -> None:
    """A process that loads an artifact and reads a compressed image decodes it in the
    extension: zstandard is not imported and libzstd is not even mapped (by kernelpack: the
    interpreter's OpenSSL may map it already, as Debian's Python 3.14 does through hashlib)."""
    import json
    import subprocess
    import sys

    import kernelpack as kp

    from kp_samples import axpy

    path = tmp_path / "a.kpack"
    kp.save([axpy()], str(path))
    code = ("import sys, json, hashlib\n"
            "def mapped():\n"
            "    maps = open('/proc/self/maps').read() if sys.platform == 'linux' else ''\n"
            "    return 'libzstd' in maps\n"
            "before = mapped()  # the standard library's own (hashlib's OpenSSL)\n"
            "import kernelpack as kp\n"
            "pack = kp.load(sys.argv[1])\n"
            "images = [i for m in pack.compiled('axpy').modules for i in m.images]\n"
            "sizes = [len(i.data) for i in images]\n"
            "from kernelpack import _zstd\n"
            "print(json.dumps(['zstandard' in sys.modules, _zstd.backend(), sizes,\n"
            "                  mapped() and not before]))\n")
    src = os.path.dirname(os.path.dirname(kp.__file__))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": src}).stdout
    imported, backend, sizes, mapped = json.loads(out.splitlines()[-1])
    assert backend == "builtin" and not imported and not mapped
    assert sizes and all(size > 0 for size in sizes)
