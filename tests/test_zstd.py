"""The load path's zstd reader (kernelpack._zstd): libzstd from C (the runtime extension's
``_zstd.c``), libzstd through ctypes and the zstandard package must accept and refuse the same
frames, byte for byte."""

from __future__ import annotations

import random

import pytest
import zstandard

from kernelpack import _zstd

LIBZSTD = _zstd._open_libzstd()
NATIVE = _zstd._open_native()
needs_libzstd = pytest.mark.skipif(LIBZSTD is None, reason="no libzstd.so.1 >= 1.4.0 here")
needs_native = pytest.mark.skipif(NATIVE is None, reason="runtime extension without _zstd.c, "
                                  "or no libzstd.so.1 >= 1.4.0 here")
# both libzstd doors, each held to the zstandard package
DOORS = [pytest.param(lambda: LIBZSTD, marks=needs_libzstd, id="ctypes"),
         pytest.param(lambda: NATIVE, marks=needs_native, id="native")]


def _outcome(backend: object, method: str, *args: object) -> tuple[str, object]:
    try:
        return "ok", getattr(backend, method)(*args)
    except _zstd.ZstdFormatError as exc:
        return "error", str(exc)


def _frames(count: int) -> list[tuple[bytes, bytes]]:
    """(original, frame) pairs: valid frames and damaged ones (flipped bytes, cut short,
    trailing bytes), of sizes from empty to larger than zstd's block size."""
    rng = random.Random(7)
    compressor = zstandard.ZstdCompressor(level=19, write_content_size=True)
    out = []
    for i in range(count):
        n = rng.choice([0, 1, 5, 100, 4000, 140000])
        data = bytes(rng.getrandbits(8) if rng.random() < 0.3 else 0 for _ in range(n))
        frame = bytearray(compressor.compress(data))
        if i % 3:
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] = rng.getrandbits(8)
        if i % 7 == 0:
            frame = frame[:rng.randrange(len(frame) + 1)]
        if i % 11 == 0:
            frame += bytes(rng.getrandbits(8) for _ in range(5))
        out.append((data, bytes(frame)))
    return out


@pytest.mark.parametrize("door", DOORS)
def test_backends_agree_on_valid_and_damaged_frames(door) -> None:
    backend = door()
    reference = _zstd._Zstandard()
    checked = 0
    for data, frame in _frames(600):
        declared = _outcome(backend, "frame_content_size", frame)
        assert (declared[0] == "ok") == (_outcome(reference, "frame_content_size", frame)[0]
                                         == "ok")
        if declared[0] == "ok":
            assert declared == _outcome(reference, "frame_content_size", frame)
        if declared != ("ok", len(data)):
            continue  # the loader refuses such a frame before decompressing it
        checked += 1
        got = _outcome(backend, "decompress", frame, len(data))
        want = _outcome(reference, "decompress", frame, len(data))
        # accepted (the exact original) by both, or by neither: damaged content that still
        # decodes to the declared size is caught by the image's raw digest either way
        assert (got == ("ok", data)) == (want == ("ok", data)), (got, want)
    assert checked > 100


@pytest.mark.parametrize("door", DOORS)
def test_only_the_first_frame_is_read(door) -> None:
    compressor = zstandard.ZstdCompressor(write_content_size=True)
    first, second = b"kernel" * 100, b"other" * 50
    frames = compressor.compress(first) + compressor.compress(second)
    assert door().decompress(frames, len(first)) == first
    assert _zstd._Zstandard().decompress(frames, len(first)) == first


@pytest.mark.parametrize("door", DOORS)
def test_output_is_bounded_by_raw_size(door) -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(10000))
    with pytest.raises(_zstd.ZstdFormatError, match="decompression error"):
        door().decompress(frame, 100)


@pytest.mark.parametrize("door", DOORS)
def test_bytes_bytearray_memoryview_and_empty(door) -> None:
    compressor = zstandard.ZstdCompressor(write_content_size=True)
    data = bytes(range(256)) * 40
    frame = compressor.compress(data)
    backend = door()
    for form in (frame, bytearray(frame), memoryview(frame), memoryview(b"xx" + frame)[2:]):
        assert backend.frame_content_size(form) == len(data)
        assert backend.decompress(form, len(data)) == data
    assert backend.decompress(compressor.compress(b""), 0) == b""
    # fewer bytes than the caller allows: what came out (the loader compares the length)
    assert backend.decompress(frame, len(data) + 10) == data


@needs_native
def test_native_large_outputs_from_many_threads() -> None:
    """Outputs of 256 KiB and more are decompressed without the GIL, each thread with a
    context of its own when the idle one is taken: every result is exact."""
    import threading

    compressor = zstandard.ZstdCompressor(write_content_size=True)
    blobs = [bytes([i]) * (300_000 + 977 * i) + bytes(range(256)) * i for i in range(8)]
    frames = [compressor.compress(b) for b in blobs]
    failures: list[object] = []

    def work(i: int) -> None:
        for _ in range(20):
            got = NATIVE.decompress(frames[i], len(blobs[i]))
            if got != blobs[i]:
                failures.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@needs_native
def test_native_refuses_a_negative_size() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"abc")
    with pytest.raises(_zstd.ZstdFormatError, match="raw_size must be >= 0"):
        NATIVE.decompress(frame, -1)


@needs_libzstd
def test_contexts_are_pooled_not_leaked() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"x" * 1000)
    backend = _zstd._open_libzstd()
    assert backend is not None
    for _ in range(50):
        assert backend.decompress(frame, 1000) == b"x" * 1000
    assert len(backend._idle) == 1


def test_falls_back_to_zstandard_without_libzstd(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    def missing(name: str, *args: object, **kwargs: object) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    monkeypatch.setattr(_zstd, "_open_builtin", lambda: None)  # no extension
    monkeypatch.setattr(_zstd, "_open_native", lambda: None)  # no extension (or no libzstd)
    monkeypatch.setattr(_zstd, "_backend", None)
    assert _zstd.backend() == "zstandard"
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"abc" * 10)
    assert _zstd.frame_content_size(frame) == 30
    assert _zstd.decompress(frame, 30) == b"abc" * 10
    with pytest.raises(_zstd.ZstdFormatError):
        _zstd.frame_content_size(b"not a frame")


@needs_libzstd
def test_ctypes_door_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without the C extension reads frames through ctypes."""
    import sys

    monkeypatch.setitem(sys.modules, "kernelpack.runtime._launch", None)  # import fails
    assert _zstd._open_native() is None
    monkeypatch.setattr(_zstd, "_backend", None)
    assert _zstd.backend() == "libzstd-ctypes"
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"abc" * 10)
    assert _zstd.decompress(frame, 30) == b"abc" * 10


def test_old_libzstd_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    class Old:
        class ZSTD_versionNumber:  # noqa: N801 - mirrors the C name
            argtypes: tuple = ()
            restype: object = None

            def __call__(self) -> int:
                return 10308

        def __init__(self, name: str) -> None:
            self.ZSTD_versionNumber = Old.ZSTD_versionNumber()

    monkeypatch.setattr(ctypes, "CDLL", Old)
    assert _zstd._open_libzstd() is None
