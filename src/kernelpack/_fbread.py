"""A small reader for *verified* kernelpack FlatBuffers, driven by :data:`verify.TABLES`.

Why not the flatc-generated accessors? Importing the ``flatbuffers`` runtime imports NumPy
(``flatbuffers.compat.import_numpy``), and the load path must stay light. The generated code is
still the writer's (``serializer.py``) and the schema's check; reading is a few struct calls,
safe because :func:`verify.verify_buffer` has already proved every offset and length.
"""

from __future__ import annotations

import struct
from typing import Any

from .verify import DEFAULTS, ENUMS, SCALARS, STRUCTS, TABLES, Buffer

__all__ = ["Table"]

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from


def _category(ftype: str) -> tuple[str, str]:
    """(category, struct code) of a field type from verify.TABLES."""
    if ftype in SCALARS:
        return "n", SCALARS[ftype][1]
    if ftype in ENUMS:
        return "n", "B"
    if ftype in STRUCTS:
        return "S", "".join(SCALARS[t][1] for _, t in STRUCTS[ftype][2])
    if ftype == "str":
        return "s", ""
    if ftype.startswith("["):
        elem = ftype[1:-1]
        if elem == "u8":
            return "b", ""
        if elem in SCALARS:
            return "v", SCALARS[elem][1]
        return ("vs", "") if elem == "str" else ("vt", elem)
    return "t", ""


_SLOTS = {t: {name: (slot, ftype, *_category(ftype))
              for slot, (name, ftype, _) in enumerate(fields)} for t, fields in TABLES.items()}


class Table:
    """One verified table: ``table.get("field")`` returns a Python value by the field's type
    (int, str, bytes, tuple for structs and scalar vectors, Table, list of Table/str)."""

    __slots__ = ("buf", "pos", "name", "_vt", "_nslots")

    def __init__(self, buf: Buffer, pos: int, name: str) -> None:
        self.buf, self.pos, self.name = buf, pos, name
        self._vt = pos - _I32(buf, pos)[0]
        self._nslots = (_U16(buf, self._vt)[0] - 4) // 2

    @classmethod
    def root(cls, buf: Buffer, name: str) -> "Table":
        return cls(buf, _U32(buf, 0)[0], name)

    def _field(self, slot: int) -> int:
        if slot >= self._nslots:
            return 0
        voff = _U16(self.buf, self._vt + 4 + 2 * slot)[0]
        return self.pos + voff if voff else 0

    def _target(self, fpos: int) -> int:
        return fpos + _U32(self.buf, fpos)[0]

    def position(self, field: str) -> int:
        """Where ``field`` is stored in the buffer (0 when absent); for tools and tests."""
        return self._field(_SLOTS[self.name][field][0])

    def target(self, field: str) -> int:
        """Where the string/vector/table that offset field ``field`` points to starts."""
        return self._target(self.position(field))

    def has(self, field: str) -> bool:
        return self._field(_SLOTS[self.name][field][0]) != 0

    def get(self, field: str) -> Any:
        slot, ftype, cat, code = _SLOTS[self.name][field]
        fpos = self._field(slot)
        buf = self.buf
        if cat == "n":
            if not fpos:
                return DEFAULTS.get((self.name, field), 0)
            return struct.unpack_from("<" + code, buf, fpos)[0]
        if not fpos:
            return {"s": "", "b": b"", "v": (), "vs": [], "vt": []}.get(cat)
        if cat == "S":
            return struct.unpack_from("<" + code, buf, fpos)
        target = self._target(fpos)
        if cat == "t":
            return Table(buf, target, ftype)
        count = _U32(buf, target)[0]
        start = target + 4
        if cat == "s":
            return bytes(buf[start:start + count]).decode("utf-8")
        if cat == "b":
            return bytes(buf[start:start + count])
        if cat == "v":
            return struct.unpack_from(f"<{count}{code}", buf, start)
        targets = [start + 4 * i + _U32(buf, start + 4 * i)[0] for i in range(count)]
        if cat == "vs":
            return [bytes(buf[t + 4:t + 4 + _U32(buf, t)[0]]).decode("utf-8") for t in targets]
        return [Table(buf, t, code) for t in targets]

    def view(self, field: str) -> memoryview:
        """A ``[ubyte]`` field as a zero-copy view (image blobs, the nested body)."""
        fpos = self._field(_SLOTS[self.name][field][0])
        if not fpos:
            return memoryview(b"")
        target = self._target(fpos)
        start = target + 4
        return memoryview(self.buf)[start:start + _U32(self.buf, target)[0]]
