"""Table.tree: the C reader (``_fbread.c``) against the Python one (``_fbread._tree``, which
reads through Table.get), on every writer's artifacts, on mutated ones the verifier accepts,
and on hostile buffers and specs that only the C reader is ever handed unchecked."""

from __future__ import annotations

import random
import struct
import sys
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import _decode, _fbread, verify
from kernelpack._fbread import Table, tree_spec
from kernelpack._schema import TABLES
from kernelpack.limits import FILE_IDENTIFIER

from test_verify_c_differential import artifacts, body_of, mutate, strings

fb_tree = pytest.importorskip("kernelpack.runtime._launch").__dict__.get("fb_tree")
pytestmark = pytest.mark.skipif(fb_tree is None, reason="the extension lacks _fbread.c")


def every_field(table: str) -> tuple[Any, ...]:
    """tree_spec fields naming every field of ``table`` and of every table within."""
    out: list[Any] = []
    for name, ftype, _ in TABLES[table]:
        elem = ftype[1:-1] if ftype.startswith("[") else ftype
        out.append((name, every_field(elem)) if elem in TABLES else name)
    return tuple(out)


FULL = {name: tree_spec(name, every_field(name)) for name in ("Pack", "Body")}


def both(table: Table, spec: tuple) -> tuple[Any, Any]:
    return fb_tree(table.buf, table.pos, spec), _fbread._tree(table, spec)


def roots(data: bytes) -> list[Table]:
    """The Pack and Body root tables of a verified artifact."""
    body = body_of(data)
    return [Table(data, verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER), "Pack"),
            Table(body, verify.verify_buffer(body, "Body", identifier=None), "Body")]


def test_every_writers_artifact_reads_the_same_in_c_and_python() -> None:
    assert len(artifacts()) >= 10
    for name, data in artifacts().items():
        for table in roots(data):
            c, py = both(table, FULL[table.name])
            assert c == py, (name, table.name)
            for buf in (bytearray(table.buf), memoryview(table.buf)):  # what kp.load passes
                assert Table(buf, table.pos, table.name).tree(FULL[table.name]) == py, name


def test_tree_reads_what_get_reads_field_by_field() -> None:
    body = roots(artifacts()["tiny+rich"])[1]
    generator, programs = body.tree(tree_spec("Body", ("generator", ("programs", ("name",
                                                                                   "ops")))))
    assert generator == body.get("generator")
    assert programs == [[p.get("name"), p.get("ops")] for p in body.get("programs")]
    assert isinstance(programs[0][1], bytes)


@pytest.mark.parametrize("seed", range(3))
def test_mutated_artifacts_the_verifier_accepts_read_the_same(seed: int) -> None:
    rng = random.Random(seed)
    compared = 0
    for name, data in artifacts().items():
        if name == "hundred":
            continue
        body = body_of(data)
        strs = strings(body)
        for i in range(150):
            buf = mutate(rng, body, strs)
            try:
                root = verify.verify_buffer(buf, "Body", identifier=None)
            except kp.KernelPackError:
                check_no_crash(buf, FULL["Body"])
                continue
            c, py = both(Table(buf, root, "Body"), FULL["Body"])
            assert c == py, f"{name} seed {seed} #{i}"
            compared += 1
    assert compared > 20  # enough accepted mutations for the comparison to say something


def check_no_crash(buf: bytes, spec: tuple, pos: int | None = None) -> None:
    """Reading an unverified buffer: a value or a ValueError (UnicodeDecodeError is one),
    never a crash or another error."""
    if pos is None:
        pos = struct.unpack_from("<I", buf, 0)[0] if len(buf) >= 4 else 0
    try:
        fb_tree(buf, pos, spec)
    except ValueError:
        pass


def test_garbage_and_cut_buffers_raise_value_errors_naming_the_offset() -> None:
    rng = random.Random(7)
    data = body_of(artifacts()["tiny+rich"])
    for cut in range(0, len(data), 3):
        check_no_crash(data[:cut], FULL["Body"])
    for _ in range(2000):
        n = rng.randrange(0, 96)
        buf = bytes(rng.randrange(256) for _ in range(n))
        check_no_crash(buf, FULL[rng.choice(("Pack", "Body"))], rng.randrange(0, n + 8))
    beyond = len(data) + 8
    with pytest.raises(ValueError, match=f"4 bytes at offset {beyond} is outside the buffer"):
        fb_tree(data, beyond, FULL["Body"])
    with pytest.raises(ValueError, match=f"at offset {len(data) - 2} "):
        fb_tree(data, len(data) - 2, FULL["Body"])


def test_absent_fields_read_as_their_defaults_and_fresh_lists() -> None:
    import kp_handwritten

    data = kp_handwritten.artifact()
    body = roots(data)[1]
    spec = tree_spec("Body", (("programs", ("name", ("params", ("value", "shape")),
                                            ("variants", ("predicate", ("scratch", ("name",)))))),))
    (programs,) = body.tree(spec)
    py = _fbread._tree(body, spec)
    assert [programs] == py
    first = fb_tree(body.buf, body.pos, spec)
    second = fb_tree(body.buf, body.pos, spec)
    for vector in first[0][0][2][0][1], second[0][0][2][0][1]:  # absent scratch: []
        assert vector == []
    first[0][0][2][0][1].append("kept")  # a caller may keep and extend what it was given
    assert second[0][0][2][0][1] == [] and fb_tree(body.buf, body.pos, spec) == second


def test_bad_specs_are_errors_not_crashes() -> None:
    body = roots(artifacts()["axpy"])[1]
    buf, pos = body.buf, body.pos
    good = tree_spec("Body", ("generator",))
    for spec, error in [
        ([good[0]], TypeError),                       # not a tuple
        ((("x",),), TypeError),                       # an item too short
        (("not an item",), TypeError),
        (((0, 99, 0, None, "g"),), ValueError),       # unknown kind
        (((-1, 2, 0, "", "g"),), ValueError),         # negative slot
        (((1, 7, "not a spec", None, "p"),), TypeError),
        (((1, 0, 3, 0, "p"),), ValueError),           # scalar code 3
        (((1, 0, "B", 0, "p"),), TypeError),          # code not an int
        (((1, 1, (4, 5), None, "p"),), ValueError),   # struct member code 5
        (((1, 1, 4, None, "p"),), TypeError),         # struct codes not a tuple
        (((1, 4, 16, (), "p"),), ValueError),         # vector element code 16
    ]:
        with pytest.raises(error):
            fb_tree(buf, pos, spec)
    with pytest.raises(TypeError, match="3 arguments"):
        fb_tree(buf, pos)
    with pytest.raises(OverflowError):
        fb_tree(buf, -1, good)
    with pytest.raises(TypeError):
        fb_tree("not a buffer", 0, good)


def chain(depth: int) -> tuple[bytes, tuple]:
    """A buffer of ``depth`` nested tables (each one field: an offset to the next, the last
    none) and the spec reading them all: the schema has no such table, so both are by hand."""
    vtable_one = struct.pack("<HHH", 6, 8, 4)  # one field at offset 4 of an 8-byte table
    vtable_none = struct.pack("<HH", 4, 4)
    # layout: [root offset][vtable_one (6) + pad (2)][vtable_none][tables, 8 bytes each]
    tables_at = 4 + 8 + 4
    out = bytearray(struct.pack("<I", tables_at) + vtable_one + b"\0\0" + vtable_none)
    for i in range(depth):
        pos = tables_at + 8 * i
        last = i == depth - 1
        vt = 12 if last else 4
        out += struct.pack("<iI", pos - vt, 0 if last else 4)  # next table: pos + 4 + 4
    spec: tuple = ()
    for _ in range(depth):
        spec = ((0, 6, spec, None, "next"),)
    return bytes(out), spec


def test_the_recursion_follows_the_spec_and_stops_at_sixteen_levels() -> None:
    data, spec = chain(16)
    tree = fb_tree(data, 16, spec)
    for _ in range(15):
        (tree,) = tree
    assert tree == [None]
    data, spec = chain(20)
    with pytest.raises(ValueError, match="more than 16 tables deep"):
        fb_tree(data, 16, spec)


def test_no_reference_or_buffer_export_is_left_behind() -> None:
    body = roots(artifacts()["tiny+rich"])[1]
    buf = bytearray(body.buf)
    marker = object()
    spec = ((1, 7, tree_spec("Program", ("name", ("params", ("shape", "value")))), None,
             "programs"), (9, 0, 4, marker, "absent"))
    before = sys.getrefcount(marker), sys.getrefcount(buf)
    for _ in range(300):
        tree = fb_tree(buf, body.pos, spec)
        assert tree[1] is marker
        with pytest.raises(ValueError):
            fb_tree(buf, len(buf) - 2, spec)
    del tree
    assert (sys.getrefcount(marker), sys.getrefcount(buf)) == before
    buf.extend(b"\0" * 4)  # no export left: a bytearray with one cannot be resized


def test_tree_spec_asks_for_a_tables_fields_and_only_a_tables() -> None:
    with pytest.raises(ValueError, match=r"Body.programs is of type \[Program\]"):
        tree_spec("Body", ("programs",))
    with pytest.raises(ValueError, match="Body.generator is of type str"):
        tree_spec("Body", (("generator", ("name",)),))
    with pytest.raises(KeyError):
        tree_spec("Body", ("nope",))


def test_decoding_without_the_c_reader_gives_the_same_summaries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def decode_all(data: bytes) -> list[object]:
        out: list[object] = []
        for program in roots(data)[1].get("programs"):
            try:
                out.append(_decode.decode_program(program))
            except kp.FormatError as exc:  # hand-made names that are not identifiers
                out.append(str(exc))
        return out

    decoded = {name: decode_all(data) for name, data in artifacts().items()}
    assert sum(isinstance(s, str) for got in decoded.values() for s in got) < 4
    monkeypatch.setattr(_fbread, "_native_tree", False)
    for name, data in artifacts().items():
        assert decode_all(data) == decoded[name], name
        body = roots(data)[1]
        try:
            pack = kp.load(data)
        except kp.FormatError:
            continue
        assert [m.name for m in pack.modules.values()] == \
            [m.get("name") for m in body.get("modules")], name
