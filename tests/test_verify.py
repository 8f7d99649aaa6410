"""Malformed files: one hand-crafted file per error class, and the verifier's schema
description (kernelpack._schema) checked field-for-field against schema/kernelpack.fbs."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import _schema, verify
from kernelpack._fbread import Table
from kernelpack.errors import (CompatibilityError, FormatError, IntegrityError, KernelPackError,
                               SignatureError)
from kernelpack.serializer import assemble, encode
from kernelpack.signing import generate_private_key, public_key_bytes, sign_digest

import kp_samples

SCHEMA = Path(__file__).parents[1] / "schema" / "kernelpack.fbs"
FBS_SCALARS = {"bool": "bool", "ubyte": "u8", "ushort": "u16", "uint": "u32", "int": "i32",
               "ulong": "u64", "long": "i64", "string": "str"}


# ---- the description matches the schema --------------------------------------------------------
def parse_fbs(text: str) -> tuple[dict, dict, dict, dict]:
    """Tables, structs, enums and non-zero defaults of our .fbs subset."""
    text = re.sub(r"//[^\n]*", "", text)
    enums = {m[1]: [v.split("=")[0].strip() for v in m[3].split(",") if v.strip()]
             for m in re.finditer(r"enum\s+(\w+)\s*:\s*(\w+)\s*\{([^}]*)\}", text)}
    for m in re.finditer(r"enum\s+(\w+)\s*:\s*(\w+)\s*\{([^}]*)\}", text):
        values = [int(v.split("=")[1]) for v in m[3].split(",") if v.strip()]
        assert values == list(range(len(values))), f"enum {m[1]} values must be 0..n-1"
        assert m[2] == "ubyte", f"enum {m[1]} must be ubyte (the verifier assumes it)"
    tables, structs, defaults = {}, {}, {}
    for m in re.finditer(r"(table|struct)\s+(\w+)\s*\{([^}]*)\}", text):
        fields = []
        for decl in (d.strip() for d in m[3].split(";")):
            if not decl:
                continue
            fm = re.fullmatch(r"(\w+)\s*:\s*(\[?\w+\]?)\s*(?:=\s*(-?\w+))?\s*(\(.*\))?", decl)
            assert fm, f"cannot parse field {decl!r}"
            name, ftype, default = fm[1], fm[2], fm[3]
            inner = ftype.strip("[]")
            mapped = FBS_SCALARS.get(inner, inner)
            fields.append((name, f"[{mapped}]" if ftype.startswith("[") else mapped))
            if default is not None and default != "0":
                defaults[(m[2], name)] = int(default)
        (tables if m[1] == "table" else structs)[m[2]] = fields
    return tables, structs, enums, defaults


def test_description_matches_schema_field_for_field() -> None:
    tables, structs, enums, defaults = parse_fbs(SCHEMA.read_text())
    assert {t: [(n, ty) for n, ty, _ in f] for t, f in _schema.TABLES.items()} == tables
    assert {s: list(f) for s, (_, _, f) in _schema.STRUCTS.items()} == structs
    assert {e: len(v) for e, v in enums.items()} == _schema.ENUMS
    assert _schema.DEFAULTS == defaults
    for name, (size, align, fields) in _schema.STRUCTS.items():
        sizes = [_schema.SCALARS[t][0] for _, t in fields]
        assert size == sum(sizes) and align == max(sizes), name  # no padding in our structs
    text = SCHEMA.read_text()
    assert 'file_identifier "KPAK"' in text and "root_type Pack;" in text


def test_the_verifier_walks_the_described_tables() -> None:
    """The description checked above is the one the verifier and the reader work from."""
    from kernelpack import _fbread

    assert verify.TABLES is _schema.TABLES and _fbread.TABLES is _schema.TABLES
    assert {t: [f[0] for f in plan] for t, plan in verify._PLANS.items()} == \
        {t: [n for n, _, _ in f] for t, f in _schema.TABLES.items()}


def test_parser_sees_a_drift() -> None:
    tables, *_ = parse_fbs(SCHEMA.read_text().replace("raw_size:ulong;", "raw_size:uint;"))
    described = {t: [(n, ty) for n, ty, _ in f] for t, f in _schema.TABLES.items()}
    assert described != tables


def test_enum_names_match_the_python_tables() -> None:
    _, _, enums, _ = parse_fbs(SCHEMA.read_text())
    from kernelpack.dtypes import ALL_DTYPES
    assert [d.code for d in ALL_DTYPES] == list(range(1, len(enums["DType"])))
    assert enums["ImageKind"] == ["Cubin", "Ptx", "Host"]
    assert enums["Role"] == ["In", "Out", "InOut"]


# ---- helpers to craft files --------------------------------------------------------------------
def parts(c=None) -> tuple[bytearray, list[bytes]]:
    body, blobs = encode([c or kp_samples.axpy()])
    return bytearray(body), blobs


def build(body: bytes, blobs: list[bytes], sig=None) -> bytes:
    return assemble(bytes(body), blobs, sig)


def body_tables(body: bytes) -> Table:
    return Table.root(bytes(body), "Body")


def raises(exc: type, match: str, data: bytes, *, full: bool = False, **kw) -> None:
    with pytest.raises(exc, match=match):
        pack = kp.load(bytes(data), **kw)
        if full:
            pack.verify()


# ---- FormatError: the outer structure ----------------------------------------------------------
GOOD = build(*parts())


@pytest.mark.parametrize("data, match", [
    (b"", "at least 8"),
    (b"\x08\x00\x00\x00KPA", "at least 8"),
    (GOOD[:4] + b"KPAX" + GOOD[8:], "file identifier.*KPAK"),
    (struct.pack("<I", len(GOOD) + 4) + GOOD[4:], "root table"),
    (struct.pack("<I", 10) + GOOD[4:], "root offset: 10"),
])
def test_header_errors(data: bytes, match: str) -> None:
    raises(FormatError, match, data)


def _root(data: bytes) -> int:
    return struct.unpack_from("<I", data, 0)[0]


def test_vtable_outside_buffer() -> None:
    data = bytearray(GOOD)
    struct.pack_into("<i", data, _root(data), -(len(data) * 2))
    raises(FormatError, "vtable.*outside", data)


def test_vtable_size_odd() -> None:
    data = bytearray(GOOD)
    vt = _root(data) - struct.unpack_from("<i", data, _root(data))[0]
    struct.pack_into("<H", data, vt, 7)
    raises(FormatError, "vtable at .* size 7", data)


def test_field_outside_table() -> None:
    data = bytearray(GOOD)
    vt = _root(data) - struct.unpack_from("<i", data, _root(data))[0]
    struct.pack_into("<H", data, vt + 4 + 2 * 4, 0xFFF0)  # Pack.blobs
    raises(FormatError, r"Pack\.blobs: field at table offset 65520", data)


def test_vector_longer_than_buffer() -> None:
    data = bytearray(GOOD)
    blobs = Table.root(bytes(data), "Pack").get("blobs")
    struct.pack_into("<I", data, blobs[0].target("data"), 10_000_000)
    raises(FormatError, r"Pack\.blobs\[0\]\.data: .* run past the end", data)


def test_vector_over_limit() -> None:
    data = bytearray(GOOD)
    struct.pack_into("<I", data, Table.root(bytes(data), "Pack").target("body_digest"), 33)
    raises(FormatError, r"body_digest: vector of 33 elements exceeds the limit 32", data)


def test_offset_pointing_outside() -> None:
    data = bytearray(GOOD)
    pos = Table.root(bytes(data), "Pack").position("blobs")
    struct.pack_into("<I", data, pos, len(data))
    raises(FormatError, r"Pack\.blobs: 4 bytes at offset", data)


def test_newer_major_is_compatibility_error_before_anything_else() -> None:
    data = bytearray(GOOD)
    pos = Table.root(bytes(data), "Pack").position("format_major")
    struct.pack_into("<H", data, pos, 2)
    data[-16:] = b"\xff" * 16  # the rest need not even be valid
    raises(CompatibilityError, r"format 2\.\d+ is newer", data)


def test_major_zero_is_format_error() -> None:
    data = bytearray(GOOD)
    struct.pack_into("<H", data, Table.root(bytes(data), "Pack").position("format_major"), 0)
    raises(FormatError, "format_major is 0", data)


def test_newer_minor_with_unknown_field_loads() -> None:
    import flatbuffers
    from kernelpack._encode import byte_vector, offset_vector
    from kernelpack._generated import Blob as FBlob
    from kernelpack._generated import Pack as FPack

    body, blobs = parts()
    b = flatbuffers.Builder(0)
    blob_tables = []
    for data in blobs:
        vec = byte_vector(b, data)
        FBlob.Start(b)
        FBlob.AddData(b, vec)
        blob_tables.append(FBlob.End(b))
    bvec = offset_vector(b, blob_tables)
    digest = byte_vector(b, hashlib.sha256(body).digest())
    body_vec = byte_vector(b, bytes(body), 8)
    b.StartObject(8)  # two slots more than format 1.0 knows
    FPack.AddFormatMajor(b, 1)
    FPack.AddFormatMinor(b, 9)
    FPack.AddBody(b, body_vec)
    FPack.AddBodyDigest(b, digest)
    FPack.AddBlobs(b, bvec)
    b.PrependUint64Slot(7, 0xDEADBEEF, 0)
    b.Finish(b.EndObject(), file_identifier=b"KPAK")
    pack = kp.load(bytes(b.Output()))
    assert pack.format_version == (1, 9) and pack.programs == ["axpy"]
    assert pack["axpy"].plan((10,), (10,), 1.0).launches[0].grid == (1, 1, 1)


def test_missing_body() -> None:
    import flatbuffers
    from kernelpack._generated import Pack as FPack

    b = flatbuffers.Builder(0)
    FPack.Start(b)
    FPack.AddFormatMajor(b, 1)
    b.Finish(FPack.End(b), file_identifier=b"KPAK")
    raises(FormatError, "Pack.body is missing", bytes(b.Output()))


def test_table_depth_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "MAX_TABLE_DEPTH", 2)
    raises(FormatError, "nested deeper than 2", GOOD)


def test_signature_block_wrong_size() -> None:
    body, blobs = parts()
    raises(FormatError, "31-byte key", build(body, blobs, (b"k" * 31, b"s" * 64)))


# ---- FormatError: the body (digest fixed up, so only the structure is wrong) ----------------
def test_body_string_without_nul() -> None:
    body, blobs = parts()
    t = body_tables(body)
    start = t.target("generator")
    n = struct.unpack_from("<I", body, start)[0]
    body[start + 4 + n] = ord("x")
    raises(FormatError, r"body: Body\.generator: string at .* not NUL-terminated", build(body, blobs))


def test_body_string_bad_utf8() -> None:
    body, blobs = parts()
    body[body_tables(body).target("generator") + 4] = 0xFF
    raises(FormatError, "generator: string .* not valid UTF-8", build(body, blobs))


def test_body_enum_out_of_range() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[-1]  # ptx: kind is stored
    body[image.position("kind")] = 3
    raises(FormatError, r"images\[2\]\.kind: enum value 3 is not one of 0\.\.2", build(body, blobs))


def test_body_bool_out_of_range() -> None:
    body, blobs = parts(kp_samples.rich())
    params = body_tables(body).get("programs")[0].get("params")
    out = next(p for p in params if p.get("name") == "out")
    body[out.position("zero_init")] = 2
    raises(FormatError, "zero_init: bool value 2", build(body, blobs))


def test_body_shared_subobject() -> None:
    body, blobs = parts()
    t = body_tables(body)
    module = t.get("modules")[0]
    images_vec = module.target("images")
    first = images_vec + 4 + struct.unpack_from("<I", body, images_vec + 4)[0]
    second_slot = images_vec + 8
    struct.pack_into("<I", body, second_slot, first - second_slot)
    raises(FormatError, "referenced twice", build(body, blobs))


def test_expression_bad_opcode() -> None:
    body, blobs = parts()
    ops = body_tables(body).get("programs")[0].target("ops")
    body[ops + 4] = 99
    raises(FormatError, "unknown expression opcode 99", build(body, blobs), full=True)


def test_expression_root_out_of_range() -> None:
    body, blobs = parts()
    launch = body_tables(body).get("programs")[0].get("variants")[0].get("launches")[0]
    struct.pack_into("<I", body, launch.position("grid"), 9999)
    raises(FormatError, "grid refers to expression root 9999", build(body, blobs), full=True)


def test_dtype_code_zero() -> None:
    body, blobs = parts()
    param = body_tables(body).get("programs")[0].get("params")[0]
    body[param.position("dtype")] = 0
    raises(FormatError, "dtype code 0", build(body, blobs), full=True)


def test_invalid_name_in_summary() -> None:
    body, blobs = parts()
    param = body_tables(body).get("programs")[0].get("params")[0]
    body[param.target("name") + 4] = ord("1")
    raises(FormatError, "program 'axpy': invalid summary: tensor name", build(body, blobs),
           full=True)


def test_program_names_unsorted() -> None:
    body, blobs = (bytearray(x) if i == 0 else x
                   for i, x in enumerate(encode([kp_samples.axpy("p1"), kp_samples.axpy("p2")])))
    second = body_tables(body).get("programs")[1]
    body[second.target("name") + 5] = ord("0")
    raises(FormatError, "program names must be sorted", build(body, blobs))


def test_launch_names_missing_module() -> None:
    body, blobs = parts()
    launch = body_tables(body).get("programs")[0].get("variants")[0].get("launches")[0]
    body[launch.target("module") + 4] = ord("b")
    raises(FormatError, "uses module 'bxpy', which the file does not contain",
           build(body, blobs), full=True)


def test_blob_index_out_of_range() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[1]  # blob 1: stored
    struct.pack_into("<I", body, image.position("blob"), 77)
    raises(FormatError, "blob index 77", build(body, blobs))


def test_digest_of_wrong_length() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[0]
    struct.pack_into("<I", body, image.target("digest"), 31)
    raises(FormatError, "digests must be 32 bytes", build(body, blobs))


def test_raw_size_over_limit() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[0]
    struct.pack_into("<Q", body, image.position("raw_size"), 1 << 40)
    raises(FormatError, "exceeds MAX_IMAGE_SIZE", build(body, blobs))


# ---- IntegrityError ------------------------------------------------------------------------------
def test_body_digest_mismatch() -> None:
    data = bytearray(GOOD)
    pack = Table.root(bytes(data), "Pack")
    data[pack.target("body") + 40] ^= 0x10
    raises(IntegrityError, "body does not match body_digest", data)


def test_image_bytes_corrupt() -> None:
    data = bytearray(GOOD)
    blob = Table.root(bytes(data), "Pack").get("blobs")[1]
    data[blob.target("data") + 10] ^= 1
    pack = kp.load(bytes(data))
    with pytest.raises(IntegrityError, match="stored bytes do not match their digest"):
        pack.verify()


def test_raw_digest_mismatch() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[0]
    body[image.target("raw_digest") + 4] ^= 1
    raises(IntegrityError, "decompressed bytes do not match raw_digest", build(body, blobs),
           full=True)


def test_zstd_frame_size_disagrees_with_raw_size() -> None:
    body, blobs = parts()
    image = body_tables(body).get("modules")[0].get("images")[0]
    assert image.get("codec") == 1
    struct.pack_into("<Q", body, image.position("raw_size"), image.get("raw_size") + 1)
    raises(IntegrityError, "zstd frame declares", build(body, blobs), full=True)


def test_uncompressed_size_mismatch() -> None:
    c = kp_samples.tiny()
    body, blobs = parts(c)
    image = body_tables(body).get("modules")[0].get("images")[0]
    assert image.get("codec") == 0
    struct.pack_into("<Q", body, image.position("raw_size"), 5)
    raises(IntegrityError, "stored uncompressed as 84 bytes but raw_size is 5", build(body, blobs))


# ---- SignatureError ------------------------------------------------------------------------------
KEY = generate_private_key()
OTHER = generate_private_key()


def test_unsigned_with_trusted_keys() -> None:
    raises(SignatureError, "unsigned", GOOD, trusted_keys=[public_key_bytes(KEY)])


def test_signed_by_untrusted_key() -> None:
    body, blobs = parts()
    data = build(body, blobs, sign_digest(OTHER, hashlib.sha256(body).digest()))
    raises(SignatureError, "not trusted", data, trusted_keys=[public_key_bytes(KEY)])


def test_signature_bytes_tampered() -> None:
    body, blobs = parts()
    key, sig = sign_digest(KEY, hashlib.sha256(body).digest())
    data = build(body, blobs, (key, bytes([sig[0] ^ 1]) + sig[1:]))
    raises(SignatureError, "does not verify", data, trusted_keys=[public_key_bytes(KEY)])


def test_body_changed_after_signing() -> None:
    body, blobs = parts()
    sig = sign_digest(KEY, hashlib.sha256(body).digest())
    body[body_tables(body).target("generator") + 4] = ord("K")  # digest recomputed, sig stale
    raises(SignatureError, "does not verify", build(body, blobs, sig),
           trusted_keys=[public_key_bytes(KEY)])


def test_every_error_is_a_kernelpack_error() -> None:
    for exc in (FormatError, IntegrityError, SignatureError, CompatibilityError):
        assert issubclass(exc, KernelPackError)
