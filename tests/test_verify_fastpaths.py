"""The verifier's and reader's fast paths keep every check: cut-off UTF-8, cached vtable
layouts, one-shot zstd decompression, reused decompression contexts."""

from __future__ import annotations

import struct
import threading

import kernelpack as kp
from kernelpack.errors import FormatError, IntegrityError
from kernelpack.loader import _decompress
from kernelpack.serializer import encode

import kp_samples
from test_verify import body_tables, build, parts, raises


def test_string_ending_in_a_cut_off_utf8_sequence() -> None:
    body, blobs = parts()
    start = body_tables(body).target("generator")
    n = struct.unpack_from("<I", body, start)[0]
    body[start + 4 + n - 1] = 0xC3  # the first byte of a two-byte sequence, then the NUL
    raises(FormatError, r"generator: string .* not valid UTF-8 \(unexpected end of data",
           build(body, blobs))


def test_name_in_a_vector_ending_in_a_cut_off_utf8_sequence() -> None:
    body, blobs = parts()
    program = body_tables(body).get("programs")[0]
    start = program.target("symbols") + 4
    first = start + struct.unpack_from("<I", body, start)[0]
    n = struct.unpack_from("<I", body, first)[0]
    body[first + 4 + n - 1] = 0xE2
    raises(FormatError, r"symbols\[0\]: string .* not valid UTF-8", build(body, blobs))


def test_layout_cache_does_not_hide_a_later_tables_problem() -> None:
    # two programs of one shape share vtables: the second one's bad enum must still be found,
    # also when the first file seen (same vtable bytes) filled the process-wide cache
    body, blobs = encode([kp_samples.axpy(), kp_samples.axpy("bxpy")])
    kp.load(build(body, blobs))
    body = bytearray(body)
    param = body_tables(body).get("programs")[1].get("params")[0]
    body[param.position("dtype")] = 200
    raises(FormatError, r"programs\[1\]\.params\[0\]\.dtype: enum value 200 is not one of",
           build(body, blobs))


def test_zstd_frame_with_more_data_than_declared() -> None:
    import zstandard

    frame = zstandard.ZstdCompressor().compress(b"x" * 5000)
    assert _decompress(memoryview(frame), 5000, "img") == b"x" * 5000
    assert zstandard.frame_content_size(frame) == 5000
    for size in (4999, 5001):
        try:
            _decompress(memoryview(frame), size, "img")
        except IntegrityError as exc:
            assert "declares 5000 bytes" in str(exc)
        else:  # pragma: no cover - the size check must refuse it
            raise AssertionError(size)
    try:
        _decompress(memoryview(frame[:-3]), 5000, "img")
    except IntegrityError as exc:
        assert "zstd decompression failed" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("truncated frame accepted")


def test_decompression_contexts_per_thread() -> None:
    import zstandard

    payloads = [bytes([i]) * (1000 + 37 * i) for i in range(16)]
    frames = [zstandard.ZstdCompressor().compress(p) for p in payloads]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(50):
                for p, f in zip(payloads, frames):
                    assert _decompress(memoryview(f), len(p), "img") == p
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
