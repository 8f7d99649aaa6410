"""Review round 11: a seeded structured fuzzer holding the C walker (``_verify.c``) to the
Python walker's verdict on buffers built from the schema, not only mutations of real files.

Two generators: :class:`Forward`, a hand-laid writer that places every object itself (vtables
before or after their tables, shared between tables, fields misaligned, counts and sizes off
by one, strings without NUL or with bad UTF-8, older and newer vtable lengths) and then
applies hostile twists (objects shared, offsets into other objects, vectors ending exactly at
the end of the buffer or one element past it, strings exactly at the end, a vtable at
position 0, soffset and count edge values, truncation); and :func:`built`, random schema
content through ``flatbuffers.Builder`` (which shares identical vtables) with byte flips.
Plus raw random bytes. The same run under AddressSanitizer (``_verify.c`` built with
``-fsanitize=address,undefined`` and loaded in place of the extension) found no error.
"""

from __future__ import annotations

import random
import struct

import flatbuffers
import pytest

from kernelpack import _verify_native, verify
from kernelpack.errors import FormatError
from kernelpack.limits import FILE_IDENTIFIER

FAST = _verify_native.load() if _verify_native.walker is None else _verify_native.walker
pytestmark = pytest.mark.skipif(not FAST, reason="kernelpack.runtime._launch built without "
                                                 "_verify.c (python setup.py build_ext)")
PLANS = verify._PLANS
ROOTS = (("Pack", FILE_IDENTIFIER), ("Body", None), ("Program", None), ("Pack", None),
         ("Launch", None))


def verdicts(buf: bytes, root_type: str, ident: bytes | None) -> tuple[int, int]:
    """(C walker, Python walker): a root offset, or -1 for a reject."""
    _, index, tables = _verify_native.tables(PLANS)
    c = FAST(buf, index[root_type], ident, tables, verify.MAX_TABLE_DEPTH,
             verify.MAX_NAME_LENGTH, verify.MAX_FILE_SIZE, verify.BODY_ALIGNMENT)
    try:
        py = verify.verify_buffer(buf, root_type, identifier=ident, _use_c=False)
    except FormatError:
        py = -1
    return c, py


class Forward:
    """A FlatBuffer written front to back from the schema, each object placed by hand."""

    def __init__(self, rng: random.Random, hostile: float) -> None:
        self.r, self.h = rng, hostile
        self.b = bytearray()
        self.vtables: dict[tuple[str, bytes], list[int]] = {}
        self.offsets: list[int] = []   # positions of uoffsets
        self.objects: list[int] = []   # positions of tables, strings, vectors
        self.vectors: list[tuple[int, int]] = []  # (position, element size)

    def coin(self, p: float) -> bool:
        return self.r.random() < p

    def pad(self, align: int) -> None:
        while len(self.b) % align:
            self.b.append(self.r.randrange(256) if self.coin(self.h) else 0)

    def string(self, limit: int) -> int:
        r = self.r
        s = r.choice((b"", bytes(r.randrange(256) for _ in range(r.randrange(1, 9))),
                      "é€😀".encode()[:r.randrange(1, 10)], b"_" * min(limit + r.randrange(-1, 2),
                                                                        600),
                      bytes(r.choice(b"abc_019") for _ in range(r.randrange(1, 9)))))
        self.pad(4)
        pos = len(self.b)
        self.b += struct.pack("<I", len(s)) + s + (b"" if self.coin(self.h / 3) else b"\0")
        self.objects.append(pos)
        return pos

    def vector(self, elem: int, body: bool) -> int:
        count = self.r.choice((0, 0, 1, 2, 3, 8, 17))
        while (len(self.b) + 4) % (8 if body or elem == 8 else max(elem, 4)):
            self.b.append(0)
        if self.coin(self.h / 2):
            self.b.append(0)  # misaligned data
        pos = len(self.b)
        self.b += struct.pack("<I", count) + bytes(self.r.randrange(256)
                                                   for _ in range(count * elem))
        self.objects.append(pos)
        self.vectors.append((pos, elem))
        return pos

    def table(self, tname: str, depth: int) -> int:
        r, plan = self.r, PLANS[tname]
        nslots = r.randrange(0, len(plan) + 3) if self.coin(self.h) else len(plan)
        voffs, off = [0] * nslots, 4
        for i in range(min(nslots, len(plan))):
            if self.coin(0.7):
                align = plan[i][3]
                off += 0 if self.coin(self.h / 3) else -off % align
                voffs[i], off = off, off + plan[i][2]
        tsize = off + (r.randrange(9) if self.coin(self.h) else 0)
        vtb = bytearray(struct.pack(f"<HH{nslots}H", 4 + 2 * nslots, tsize, *voffs))
        if self.coin(self.h / 2):
            vtb[r.randrange(len(vtb))] = r.randrange(256)
        shared = self.vtables.get((tname, bytes(vtb)), [])
        vt = r.choice(shared) if shared and self.coin(0.5) else None
        if vt is None and self.coin(0.5):  # a new vtable before the table
            self.pad(2)
            vt = len(self.b)
            self.b += vtb
            self.vtables.setdefault((tname, bytes(vtb)), []).append(vt)
        self.pad(8 if any(plan[i][3] == 8 for i in range(min(nslots, len(plan))) if voffs[i])
                 and not self.coin(self.h / 3) else 4)
        pos = len(self.b)
        self.b += bytes(tsize)
        self.objects.append(pos)
        if vt is None:  # after the table: a negative soffset
            self.pad(2)
            vt = len(self.b)
            self.b += vtb
            self.vtables.setdefault((tname, bytes(vtb)), []).append(vt)
        struct.pack_into("<i", self.b, pos, pos - vt)
        for i in range(min(nslots, len(plan))):
            name, cat, size, _, extra, limit = plan[i]
            fpos = pos + voffs[i]
            if not voffs[i] or fpos + size > len(self.b):
                continue
            if cat in ("e", "b"):
                top = extra if cat == "e" else 2
                self.b[fpos] = r.randrange(top + (1 if self.coin(self.h) else 0))  # type: ignore[operator]
            elif cat in ("s", "S"):
                self.b[fpos:fpos + size] = bytes(r.randrange(256) for _ in range(size))
            elif depth < 7:
                self.link(fpos, self.child(tname, name, cat, extra, limit, depth))
        return pos

    def child(self, tname: str, name: str, cat: str, extra: object, limit: int,
              depth: int) -> int:
        if cat == "t":
            return self.table(extra, depth + 1)  # type: ignore[arg-type]
        if cat == "str":
            return self.string(limit)
        if cat == "v":
            return self.vector(extra, (tname, name) == ("Pack", "body"))  # type: ignore[arg-type]
        count = self.r.choice((0, 1, 2, 3))
        self.pad(4)
        vec = len(self.b)
        self.b += struct.pack("<I", count) + bytes(4 * count)
        self.objects.append(vec)
        for k in range(count):
            elem = (self.string(verify.MAX_NAME_LENGTH) if cat == "vs"
                    else self.table(extra, depth + 1))  # type: ignore[arg-type]
            self.link(vec + 4 + 4 * k, elem)
        return vec

    def link(self, at: int, target: int) -> None:
        struct.pack_into("<I", self.b, at, target - at)
        self.offsets.append(at)

    def build(self, root_type: str, ident: bytes | None) -> bytes:
        self.b += bytes(4) + (ident if ident is not None else b"")
        struct.pack_into("<I", self.b, 0, self.table(root_type, 0))
        return bytes(self.b)

    def twist(self, data: bytes) -> bytes:
        """One hostile structural change (or none where it does not apply)."""
        r, b = self.r, bytearray(data)
        k = r.randrange(11)
        offs = [p for p in self.offsets if p + 4 <= len(b)]
        objs = [p for p in self.objects if p + 4 <= len(b)]
        if k == 0 and offs and objs:  # share an object (or point backwards: wraps in u32)
            p, t = r.choice(offs), r.choice(objs)
            struct.pack_into("<I", b, p, (t - p) % 2**32)
        elif k == 1 and offs:  # into the middle of anything, or just past the end
            p = r.choice(offs)
            struct.pack_into("<I", b, p, r.randrange(1, len(b) - p + 9))
        elif k == 2 and self.vectors:  # a vector ending exactly at the end, or one past
            p, e = r.choice(self.vectors)
            if p + 4 <= len(b) and e:
                struct.pack_into("<I", b, p, (len(b) - p - 4) // e + r.choice((0, 0, 1)))
        elif k == 3:
            b = b[:r.randrange(len(b) + 1)]
        elif k == 4 and objs:  # vtable at 0, one byte off, before the buffer, far away
            p = r.choice(objs)
            if p % 4 == 0:
                struct.pack_into("<i", b, p, r.choice((p, p - 2, p + 2, -(len(b) - p),
                                                       -2**31, 2**31 - 1, 0, 4, -4)))
        elif k == 5 and b:
            for _ in range(r.randrange(1, 5)):
                b[r.randrange(len(b))] = r.randrange(256)
        elif k == 6 and objs:  # counts and lengths at edge values
            struct.pack_into("<I", b, r.choice(objs), r.choice(
                (0, 1, 2**32 - 1, 2**30 - 1, 2**30, 2**31, len(b), len(b) // 4, 1024, 1025)))
        elif k == 7 and len(b) >= 4:
            struct.pack_into("<I", b, 0, r.choice((0, 4, 8, len(b) - 4, len(b), 2**32 - 4)))
        elif k in (8, 9) and offs:  # a zero-length vector / a string exactly at the end
            b += bytes(-len(b) % 4)
            t, p = len(b), r.choice(offs)
            b += struct.pack("<I", 0) if k == 8 else struct.pack("<I", 3) + b"end" + (
                b"\0" if r.random() < 0.5 else b"")
            struct.pack_into("<I", b, p, t - p)
        elif k == 10:  # vtable and table sizes at edge values
            for (_, _), where in self.vtables.items():
                for vt in where:
                    if vt + 4 <= len(b) and r.random() < 0.3:
                        struct.pack_into("<HH", b, vt, r.choice((0, 2, 4, 5, 0xFFFE, len(b) - vt)),
                                         r.choice((0, 3, 4, 8, 0xFFFF)))
        return bytes(b)


def built(rng: random.Random, root_type: str, ident: bytes | None) -> bytes:
    """Random schema content through flatbuffers.Builder (identical vtables shared)."""
    b = flatbuffers.Builder(256)

    def table(tname: str, depth: int) -> int:
        plan, values = PLANS[tname], []
        for slot, (name, cat, size, align, extra, limit) in enumerate(plan):
            if rng.random() < 0.35 or (cat == "t" or cat == "vt") and depth > 5:
                continue
            if cat == "str":
                values.append((slot, "o", b.CreateString("n" * rng.choice((0, 1, 5)))))
            elif cat == "t":
                values.append((slot, "o", table(extra, depth + 1)))  # type: ignore[arg-type]
            elif cat == "v":
                data = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 3, 8))
                                                                 * extra))  # type: ignore[operator]
                b.StartVector(1, len(data), 8 if extra == 8 or name == "body" else extra)
                b.head -= len(data)
                b.Bytes[b.head:b.head + len(data)] = data
                values.append((slot, "o", b.EndVector()))
            elif cat in ("vs", "vt"):
                elems = [b.CreateString(f"k{i}") if cat == "vs" else table(extra, depth + 1)
                         for i in range(rng.choice((0, 1, 2)))]  # type: ignore[arg-type]
                b.StartVector(4, len(elems), 4)
                for e in reversed(elems):
                    b.PrependUOffsetTRelative(e)
                values.append((slot, "o", b.EndVector()))
            else:  # scalars and structs: random bytes of their size, aligned
                top = extra if cat == "e" else 2 if cat == "b" else 256
                values.append((slot, (size, align), bytes(
                    [rng.randrange(top)] + [rng.randrange(256) for _ in range(size - 1)])))
        b.StartObject(len(plan))
        for slot, kind, value in values:
            if kind == "o":
                b.PrependUOffsetTRelativeSlot(slot, value, 0)
            else:
                b.Prep(kind[1], kind[0])
                b.head -= kind[0]
                b.Bytes[b.head:b.head + kind[0]] = value
                b.Slot(slot)
        return b.EndObject()

    b.Finish(table(root_type, 0), file_identifier=ident)
    return bytes(b.Output())


@pytest.mark.parametrize("seed", range(4))
def test_forward_built_buffers_get_the_same_verdict(seed: int) -> None:
    rng, accepted, bad = random.Random(seed), 0, []
    for i in range(2500):
        root_type, ident = rng.choice(ROOTS)
        gen = Forward(rng, rng.choice((0.0, 0.05, 0.2, 0.5)))
        buf = gen.build(root_type, ident)
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            buf = gen.twist(buf)
        c, py = verdicts(buf, root_type, ident)
        accepted += py >= 0
        if c != py:
            bad.append((seed, i, root_type, c, py, buf.hex()))
    assert not bad, bad[:3]
    assert 200 < accepted < 2300  # both verdicts well represented


def test_builder_buffers_and_raw_bytes_get_the_same_verdict() -> None:
    rng, accepted, bad = random.Random(11), 0, []
    for i in range(3000):
        root_type, ident = rng.choice(ROOTS)
        if i % 3 == 0:
            buf = bytearray(rng.choice((0, 1, 4, 8, 255, rng.randrange(256)))
                            for _ in range(rng.randrange(64)))
            if len(buf) >= 8:
                buf[4:8] = ident or buf[4:8]
                struct.pack_into("<I", buf, 0, rng.randrange(len(buf)) & ~3)
        else:
            buf = bytearray(built(rng, root_type, ident))
            for _ in range(rng.choice((0, 0, 1, 2))):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        c, py = verdicts(bytes(buf), root_type, ident)
        accepted += py >= 0
        if c != py:
            bad.append((i, root_type, c, py, bytes(buf).hex()))
    assert not bad, bad[:3]
    assert accepted > 800


@pytest.mark.parametrize("depth,name", [(0, 1024), (1, 1024), (2, 3), (3, 0)])
def test_patched_limits_get_the_same_verdict(monkeypatch: pytest.MonkeyPatch, depth: int,
                                            name: int) -> None:
    monkeypatch.setattr(verify, "MAX_TABLE_DEPTH", depth)
    monkeypatch.setattr(verify, "MAX_NAME_LENGTH", name)
    rng, bad, verdict = random.Random(depth), [], set()
    for i in range(400):
        root_type, ident = rng.choice(ROOTS)
        buf = Forward(rng, 0.0).build(root_type, ident)
        c, py = verdicts(buf, root_type, ident)
        verdict.add(py >= 0)
        if c != py:
            bad.append((i, root_type, c, py, buf.hex()))
    assert not bad, bad[:3]
    assert verdict == {True, False}


def overlapping_names(count: int) -> bytes:
    """A Module whose ``kernels`` name ``count`` strings at successive 4-aligned positions of
    one run of ``41 00 00 00``: each reads as a valid 65-byte name ("A\\0\\0\\0" * 16 + "A",
    its NUL the next group's second byte), so together they cover ~16x the run's bytes."""
    buf = bytearray(struct.pack("<I", 4))                 # root table at 4
    buf += struct.pack("<iI", 4 - 12, 24 - 8)            # vtable at 12; kernels at 24
    buf += struct.pack("<HHHHH", 10, 8, 0, 4, 0) + bytes(2)  # Module: only kernels
    run = 28 + 4 * count
    buf += struct.pack("<I", count)
    for k in range(count):
        at = 28 + 4 * k
        buf += struct.pack("<I", run + 4 * k - at)
    buf += b"\x41\0\0\0" * (count + 17)
    return bytes(buf)


def test_overlapping_strings_get_the_same_verdict() -> None:
    results = {}
    for count in (1, 2, 8, 20, 40):
        buf = overlapping_names(count)
        c, py = verdicts(buf, "Module", None)
        assert c == py, (count, c, py)
        results[count] = py >= 0
    # 65 bytes per name against ~8 bytes of buffer per name: a few fit, many do not
    assert results[1] and not results[40]
