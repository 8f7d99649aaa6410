"""Second adversarial review of the format: artifacts built with the FlatBuffers builder
directly, structurally valid but hostile (overlapping objects, quadratic expression sharing,
one zstd frame named by thousands of images). Each must fail fast with a KernelPackError
naming the problem, or load without the amplified cost."""

from __future__ import annotations

import hashlib
import struct
import time
from typing import Any

import flatbuffers
import pytest

import kernelpack as kp
from kernelpack import _decode, _images
from kernelpack._encode import byte_vector
from kernelpack._fbread import Table
from kernelpack._schema import BODY_ALIGNMENT, ENUMS, SCALARS, STRUCTS, TABLES
from kernelpack.errors import FormatError
from kernelpack.limits import FILE_IDENTIFIER

# ---- a schema-driven builder: any table from a dict, no summary validation -----------------------
_PREPEND = {"bool": "PrependUint8", "u8": "PrependUint8", "u16": "PrependUint16",
            "u32": "PrependUint32", "i32": "PrependInt32", "u64": "PrependUint64",
            "i64": "PrependInt64"}


def _vector(b: flatbuffers.Builder, elem: str, values: Any) -> int:
    if elem == "u8":
        return byte_vector(b, bytes(values))
    if elem in SCALARS:
        size = SCALARS[elem][0]
        b.StartVector(size, len(values), size)
        for v in reversed(values):
            getattr(b, _PREPEND[elem])(v)
        return b.EndVector()
    offsets = [b.CreateString(v) if elem == "str" else table(b, elem, v) for v in values]
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def table(b: flatbuffers.Builder, tname: str, d: dict) -> int:
    """Table ``tname`` with the fields of ``d`` (absent keys: absent fields)."""
    fields = TABLES[tname]
    made = {}
    for name, ftype, _ in fields:
        if name not in d:
            continue
        if ftype == "str":
            made[name] = b.CreateString(d[name])
        elif name == "body":
            made[name] = byte_vector(b, d[name], BODY_ALIGNMENT)
        elif ftype.startswith("["):
            made[name] = _vector(b, ftype[1:-1], d[name])
        elif ftype in TABLES:
            made[name] = table(b, ftype, d[name])
    b.StartObject(len(fields))
    for slot, (name, ftype, _) in enumerate(fields):
        if name not in d:
            continue
        if name in made:
            b.PrependUOffsetTRelativeSlot(slot, made[name], 0)
        elif ftype in STRUCTS:
            size, align, members = STRUCTS[ftype]
            b.Prep(align, size)
            for (_, stype), value in reversed(list(zip(members, d[name]))):
                getattr(b, _PREPEND[stype])(value)
            b.PrependStructSlot(slot, b.Offset(), 0)
        else:
            stype = "u8" if ftype in ENUMS else ftype
            getattr(b, _PREPEND[stype] + "Slot")(slot, d[name], None)  # None: always written
    return b.EndObject()


def body(d: dict) -> bytes:
    b = flatbuffers.Builder(1024)
    b.Finish(table(b, "Body", d))
    return bytes(b.Output())


def pack(body_bytes: bytes, blobs: list[bytes]) -> bytes:
    b = flatbuffers.Builder(1024)
    d = {"format_major": 1, "format_minor": 0, "body": body_bytes,
         "body_digest": hashlib.sha256(body_bytes).digest(), "blobs": [{"data": x} for x in blobs]}
    b.Finish(table(b, "Pack", d), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


ELF = b"\x7fELF-fake"


def image(blob: int = 0, stored: bytes = ELF, raw: bytes | None = None, **kw: Any) -> dict:
    raw = stored if raw is None else raw
    d = {"kind": 0, "arch_major": 8, "arch_minor": 0, "arch_suffix": 0, "cuda_version": 12080,
         "toolchain": "t", "codec": 0, "raw_size": len(raw),
         "digest": hashlib.sha256(stored).digest(), "raw_digest": hashlib.sha256(raw).digest(),
         "blob": blob}
    d.update(kw)
    return d


def module(name: str = "m", images: list[dict] | None = None) -> dict:
    return {"name": name, "kernels": ["k"], "images": images or [image()]}


def program(name: str = "p", ops: bytes | None = None, imms: list[int] | None = None,
            params: list[dict] | None = None, **kw: Any) -> dict:
    """x: f32[n] (root 0 = n); one launch of m.k, grid and block each of roots that are 1."""
    d = {"name": name, "symbols": ["n"],
         "ops": bytes([2, 0, 1, 0, 1, 0]) if ops is None else ops,   # n, 1, 1
         "imms": [0, 1, 1] if imms is None else imms,
         "params": params or [{"kind": 0, "name": "x", "dtype": 12, "shape": [0]}],
         "variants": [{"launches": [{"kernel": "k", "module": "m", "grid": (1, 1, 1),
                                     "block": (2, 2, 2), "shared_mem": 1, "args": []}]}]}
    d.update(kw)
    return d


def artifact(programs: list[dict], modules: list[dict] | None = None,
             blobs: list[bytes] | None = None) -> bytes:
    return pack(body({"generator": "g", "programs": programs,
                      "modules": [module()] if modules is None else modules}),
                [ELF] if blobs is None else blobs)


def test_the_builder_makes_loadable_artifacts() -> None:
    pack_ = kp.load(artifact([program()]))
    pack_.verify()
    assert pack_["p"].plan(x=(7,)).launches[0].grid == (1, 1, 1)


# ---- objects that share bytes ------------------------------------------------------------------
# Every 4-aligned position of a run of 00 00 01 00 reads as a 65536-byte string (or [ubyte]
# vector) whose terminator is the next 00: distinct positions, all overlapping.
RUN = b"\x00\x00\x01\x00"


def _point_into_run(buf: bytearray, positions: list[int]) -> bytearray:
    """Append a run and point the uoffset fields at ``positions`` to successive 4-aligned
    places in it."""
    while len(buf) % 8:
        buf.append(0)
    start = len(buf)
    buf += RUN * (65536 // 4 + len(positions) + 2)
    for k, fpos in enumerate(positions):
        struct.pack_into("<I", buf, fpos, start + 4 * k - fpos)
    return buf


def test_overlapping_strings_are_refused_before_they_are_decoded() -> None:
    """Was: 64 constraint messages naming overlapping 64 KiB strings loaded, and every decoded
    copy cost its full size (a 645 KB file held 1.3 GB after Pack.verify())."""
    prog = program(constraints=[{"predicate": 1, "message": "m"} for _ in range(64)])
    raw = bytearray(body({"generator": "g", "programs": [prog], "modules": [module()]}))
    fields = [c.position("message")
              for c in Table.root(bytes(raw), "Body").get("programs")[0].get("constraints")]
    data = pack(bytes(_point_into_run(raw, fields)), [ELF])
    assert len(data) < 100_000  # 64 x 65536 bytes of strings in a < 100 KB file
    with pytest.raises(FormatError, match=r"Body\.programs\[0\]\.constraints\[\d+\]: strings "
                                          r"and vectors overlap"):
        kp.load(data)


def test_overlapping_byte_vectors_are_refused() -> None:
    """The same for [ubyte] vectors: blobs of the outer file sharing one run."""
    b = flatbuffers.Builder(1024)
    inner = body({"generator": "g"})
    d = {"format_major": 1, "format_minor": 0, "body": inner,
         "body_digest": hashlib.sha256(inner).digest(), "blobs": [{"data": b"x"}] * 40}
    b.Finish(table(b, "Pack", d), file_identifier=FILE_IDENTIFIER)
    raw = bytearray(b.Output())
    root = struct.unpack_from("<I", raw, 0)[0]
    fields = [blob.position("data") for blob in Table(bytes(raw), root, "Pack").get("blobs")]
    data = bytes(_point_into_run(raw, fields))
    with pytest.raises(FormatError, match=r"file: Pack\.blobs\[\d+\]: strings and vectors "
                                          r"overlap: their data adds up to more than"):
        kp.load(data)


# ---- expression work ---------------------------------------------------------------------------
def dag_program(levels: int, fields: int) -> dict:
    """A balanced DAG of 2**levels leaves (shared through LOAD) read by ``fields`` dims."""
    ops, imms, level = bytearray(), [], []
    for j in range(1 << levels):  # leaf j: n + j
        ops += bytes([2, 1, 10, 0])
        imms += [0, j]
        level.append(len(level))
    roots = len(level)
    while len(level) > 1:
        nxt = []
        for a, c in zip(level[::2], level[1::2]):
            ops += bytes([3, 3, 10, 0])
            imms += [a, c]
            nxt.append(roots)
            roots += 1
        level = nxt
    top = level[0]
    ops += bytes([2, 0, 1, 0])  # roots: n, 1
    imms += [0, 1]
    n, one = roots, roots + 1
    params = [{"kind": 0, "name": "x", "dtype": 12, "shape": [n]}]
    params += [{"kind": 0, "name": f"o{i}", "dtype": 12, "role": 1, "shape": [top] * 16}
               for i in range(fields // 16)]
    return program(ops=bytes(ops), imms=imms, params=params,
                   variants=[{"launches": [{"kernel": "k", "module": "m",
                                            "grid": (one, one, one), "block": (one, one, one),
                                            "shared_mem": one, "args": []}]}])


def test_fields_sharing_one_large_expression_are_refused_quickly() -> None:
    """Was: KernelSummary.check walked the shared expression once per field, so 1008 dims
    reading a 4096-node DAG took seconds (minutes for a 3 MB file) and then loaded."""
    data = artifact([dag_program(11, 1008)])
    assert len(data) < 100_000
    pack_ = kp.load(data)
    start = time.perf_counter()
    with pytest.raises(FormatError, match=r"program 'p': the expression fields read more than "
                                          r"MAX_EXPR_WORK 1048576 expression nodes"):
        pack_["p"].summary
    assert time.perf_counter() - start < 1.0


def test_expression_work_limit_is_what_reader_and_writer_share(monkeypatch) -> None:
    """Under the limit the same shape of program loads; lowering the limit makes the reader
    refuse it and the writer refuse to write it (writers refuse what readers refuse)."""
    data = artifact([dag_program(4, 64)])  # 4 x 16 dims reading a 46-node DAG
    summary = kp.load(data)["p"].summary
    compiled = kp.load(data).compiled("p")
    assert kp.load(kp.save(compiled))["p"].summary == summary
    monkeypatch.setattr(_decode, "MAX_EXPR_WORK", 1000)
    with pytest.raises(FormatError, match="MAX_EXPR_WORK 1000"):
        kp.load(data)["p"].summary
    with pytest.raises(ValueError, match="expressions exceed the format's limits: .*"
                                         "MAX_EXPR_WORK 1000"):
        kp.save(compiled)


# ---- one zstd frame named by many images -------------------------------------------------------
def test_images_sharing_a_blob_are_decompressed_once(monkeypatch, tmp_path) -> None:
    """Was: Pack.verify() decompressed every image, so thousands of images naming one
    32 KiB frame of 1 GiB (a few dozen bytes each) kept it busy for hours."""
    import zstandard

    raw = bytes(1 << 16)
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    images = [image(0, frame, raw, codec=1, arch_major=major) for major in (7, 8, 9, 10)]
    data = artifact([], [module("a", images), module("b", images)], [frame])
    calls = []
    inflate = _images._inflate
    monkeypatch.setattr(_images, "_inflate", lambda *a: calls.append(1) or inflate(*a))
    kp.load(data).verify()
    assert len(calls) == 1
    calls.clear()
    path = tmp_path / "shared.kpack"
    path.write_bytes(data)
    from kernelpack.cli import main

    assert main(["extract", str(path), "-o", str(tmp_path / "out")]) == 0
    assert len(calls) == 1 + 8  # checked once, then each file written
    assert (tmp_path / "out" / "b.sm_100.cubin").read_bytes() == raw


def test_an_image_with_a_bad_architecture_names_the_fields() -> None:
    data = artifact([], [module(images=[image(arch_major=0, arch_minor=12)])])
    with pytest.raises(FormatError, match=r"module 'm': image has arch_major 0, arch_minor 12 "
                                          r"\(expected 1\.\.99 and 0\.\.9\)"):
        kp.load(data)


# ---- a memory-mapped file rewritten in place after loading -------------------------------------
def test_summaries_decode_the_verified_body_of_a_mapped_file(tmp_path) -> None:
    """Was: files over 1 MiB are memory-mapped and summaries decoded lazily from the map, so
    overwriting the file in place after kp.load (``cp new.kpack model.kpack``) gave a
    struct.error from unverified bytes. The body is now a private copy; images are checked
    at every read and report the change."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import kp_samples
    from kernelpack.errors import IntegrityError
    from kernelpack.summary import Image

    path = tmp_path / "big.kpack"
    kp.save([kp_samples.axpy(images=(Image("cubin", "sm_80", os.urandom(3 << 19)),))], path)
    pack_ = kp.load(path)
    assert type(pack_._buf.obj).__name__ == "mmap"  # the case this test is about
    with open(path, "r+b") as f:
        f.write(b"\xff" * path.stat().st_size)
    assert pack_["axpy"].plan(x=(5,), y=(5,), a=1.0).launches[0].grid == (1, 1, 1)
    with pytest.raises(IntegrityError, match="module 'axpy' image sm_80: stored bytes do not "
                                             "match their digest"):
        pack_.verify()


def test_blobs_no_image_names_cost_nothing_at_load(monkeypatch) -> None:
    """Was: a Table and a view per blob at load, named or not: 8 MB of empty blobs (a million)
    took 3.5 s and 400 MB. Views are now made for the blobs images name, and the right one."""
    blobs = [bytes([i % 251]) * (i % 7) for i in range(10_000)]
    modules = [module("m", [image(3, blobs[3])]), module("n", [image(9_999, blobs[9_999])])]
    data = artifact([], modules, blobs)
    views = []
    view = Table.view
    monkeypatch.setattr(Table, "view", lambda self, field: views.append(field) or view(self, field))
    pack_ = kp.load(data)
    assert views == ["body", "data", "data"]
    pack_.verify()
    assert pack_.modules["m"].images[0].read() == blobs[3]
    assert pack_.modules["n"].images[0].read() == blobs[9_999]


def test_a_body_that_is_not_8_aligned_is_refused() -> None:
    """docs/FORMAT.md §3, 4: the nested body MUST start 8-aligned (its int64 vectors are
    aligned relative to it). Four bytes inserted after the header keep every offset and
    4-alignment valid and move the body to 4 mod 8."""
    good = artifact([program()])
    root = struct.unpack_from("<I", good, 0)[0]
    shifted = struct.pack("<I", root + 4) + good[4:8] + bytes(4) + good[8:]
    with pytest.raises(FormatError, match=r"file: Pack\.body: nested body at \d+ is not "
                                          r"8-aligned"):
        kp.load(shifted)
    kp.load(good)  # the same file unshifted loads


def test_body_mutations_under_a_recomputed_digest() -> None:
    """tests/fuzz_load.py mutates whole files, so nearly every change to the body stops at
    its digest. Here the digest is recomputed after mutating the body, so the mutations reach
    the body's verifier, the decoder, the planner and the CLI's facts: each case must load
    and work or raise a KernelPackError, never anything else."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import kp_samples
    from kernelpack.cli_facts import pack_facts
    from kernelpack.errors import KernelPackError
    from kernelpack.serializer import assemble, encode

    seeds = [encode([kp_samples.rich(), kp_samples.axpy()]), encode([kp_samples.tiny()])]
    rng = random.Random(20240607)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(600):
        body_, blobs = rng.choice(seeds)
        mutated = bytearray(body_)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(mutated))
            if rng.random() < 0.5:
                mutated[pos] ^= 1 << rng.randrange(8)
            else:
                mutated[pos] = rng.choice((0, 1, 3, 29, 30, 0x7F, 0x80, 0xFF))
        try:
            loaded = kp.load(assemble(bytes(mutated), blobs, None))
            loaded.verify()
            for name in loaded.programs:
                s = loaded[name].summary
                shapes = {p.name: (3,) * len(p.shape) for p in s.inputs
                          if isinstance(p, kp.Tensor)}
                try:
                    loaded[name].plan(**shapes, **{p.name: 3 for p in s.inputs
                                                   if isinstance(p, kp.Scalar)})
                except TypeError:
                    pass  # an int for a float scalar: the caller's mistake, not the file's
            pack_facts(loaded, device="sm_90")
            outcomes["ok"] += 1
        except KernelPackError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 10 and outcomes["error"] > 300  # both paths are exercised
