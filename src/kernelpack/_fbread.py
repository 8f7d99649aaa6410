"""A small reader for *verified* kernelpack FlatBuffers, driven by :data:`_schema.TABLES`.

Why not the flatc-generated accessors? Importing the ``flatbuffers`` runtime imports NumPy
(``flatbuffers.compat.import_numpy``), and the load path must stay light. The generated code is
still the writer's (``serializer.py``) and the schema's check; reading is a few struct calls,
safe because :func:`verify.verify_buffer` has already proved every offset and length.
"""

from __future__ import annotations

import codecs
import struct
from typing import Any, Iterator

from ._schema import DEFAULTS, ENUMS, SCALARS, STRUCTS, TABLES
from .verify import _VOFFS as _VERIFY_VOFFS, Buffer

__all__ = ["Table", "Tables", "ByteViews", "tree_spec", "module_index", "KINDS"]

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
# called as _UTF8(data, "strict", True): final=True, so a cut-off sequence is an error too
_UTF8 = codecs.utf_8_decode
_LIST = object()  # absent vector of strings or tables: a fresh empty list each time
_EMPTY = {"s": "", "b": b"", "v": (), "vs": _LIST, "vt": _LIST, "t": None, "S": None}


def _category(ftype: str) -> tuple[str, str]:
    """(category, struct code) of a field type from _schema.TABLES."""
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


_READERS: dict[str, Any] = {}  # struct code -> unpack_from: fields of one type share one


def _slot(table: str, slot: int, name: str, ftype: str) -> tuple:
    """Everything :meth:`Table.get` needs for one field: (slot, category, reader or element
    code / table name, value when absent)."""
    cat, code = _category(ftype)
    if cat in ("n", "S"):
        reader: Any = _READERS.get(code)
        if reader is None:
            reader = _READERS[code] = struct.Struct("<" + code).unpack_from
    elif cat == "t":
        reader = ftype
    else:
        reader = code
    return (slot, cat, reader, DEFAULTS.get((table, name), 0) if cat == "n" else _EMPTY[cat])


_SLOTS = {t: {name: _slot(t, slot, name, ftype) for slot, (name, ftype, _) in enumerate(fields)}
          for t, fields in TABLES.items()}
_NFIELDS = {t: len(fields) for t, fields in TABLES.items()}
# a table's vtable entries in one call, one reader per field count (the verifier's: the same
# schema, so the same counts)
_VOFFS = _VERIFY_VOFFS
assert len(_VOFFS) == max(_NFIELDS.values()) + 1


def _read(buf: Buffer, fpos: int, cat: str, reader: Any) -> Any:
    """A present non-scalar field at ``fpos`` (see :meth:`Table.get`)."""
    if cat == "S":
        return reader(buf, fpos)
    target = fpos + _U32(buf, fpos)[0]
    if cat == "t":
        return Table(buf, target, reader)
    count = _U32(buf, target)[0]
    start = target + 4
    if cat == "s":
        return _UTF8(buf[start:start + count], "strict", True)[0]
    if cat == "b":
        return bytes(buf[start:start + count])
    if cat == "v":
        return struct.unpack_from(f"<{count}{reader}", buf, start)
    offsets = struct.unpack_from(f"<{count}I", buf, start)
    if cat == "vs":
        out = []
        for i, off in enumerate(offsets):
            t = start + 4 * i + off
            out.append(_UTF8(buf[t + 4:t + 4 + _U32(buf, t)[0]], "strict", True)[0])
        return out
    return _tables(buf, start, offsets, reader)


def _tables(buf: Buffer, start: int, offsets: tuple[int, ...], name: str) -> list["Table"]:
    """The tables of a vector, made as :class:`Table` would make each (inlined: a decoded
    summary reads a dozen such vectors, and a constructor call per element is most of it)."""
    out = []
    nfields, slots, readers = _NFIELDS[name], _SLOTS[name], _VOFFS
    new = object.__new__
    for i, off in enumerate(offsets):
        pos = start + 4 * i + off
        vt = pos - _I32(buf, pos)[0]
        count = (_U16(buf, vt)[0] - 4) // 2
        t = new(Table)
        t.buf, t.pos, t.name, t._slots = buf, pos, name, slots
        t._voffs = readers[count if count < nfields else nfields](buf, vt + 4)
        out.append(t)
    return out


# Table.tree: a spec's field kinds (the C reader's, ``_fbread.c``) and scalar codes (the size in
# bytes, negative for a signed type)
KINDS = {"n": 0, "S": 1, "s": 2, "b": 3, "v": 4, "vs": 5, "t": 6, "vt": 7}
_CODES = {"B": 1, "H": 2, "I": 4, "Q": 8, "b": -1, "h": -2, "i": -4, "q": -8}
_TABLE, _TABLES = KINDS["t"], KINDS["vt"]


def tree_spec(table: str, fields: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
    """What :meth:`Table.tree` reads of a ``table``: ``fields`` names its fields in the order
    wanted, each a name or, for a table or a vector of tables, ``(name, fields of that
    table)``. One ``(slot, kind, arg, default, name)`` item per field; arg is the scalar code,
    a struct's member codes or a table's own spec. Made once, at import, by whoever reads."""
    items = []
    sub: Any  # a table's fields when it names one (checked below), else None
    for f in fields:
        name, sub = (f, None) if isinstance(f, str) else f
        slot, cat, reader, default = _SLOTS[table][name]
        ftype = TABLES[table][slot][1]
        if (sub is None) != (cat not in ("t", "vt")):
            raise ValueError(f"{table}.{name} is of type {ftype}: name the fields of a table "
                             f"(and only of a table) to read")
        code = _category(ftype)[1]
        if cat in ("t", "vt"):
            arg: Any = tree_spec(reader, sub)
        elif cat == "S":
            arg = tuple(_CODES[c] for c in code)
        elif cat in ("n", "v"):
            arg = _CODES[code]
        else:
            arg = 0
        items.append((slot, KINDS[cat], arg, None if default is _LIST else default, name))
    return tuple(items)


def _tree(table: "Table", spec: tuple[tuple[Any, ...], ...]) -> list[Any]:
    """:meth:`Table.tree` in Python: what ``_fbread.c`` reads, through :meth:`Table.get`."""
    out = table.values(tuple(item[4] for item in spec))
    for i, (_, kind, sub, _, _) in enumerate(spec):
        if kind == _TABLE:
            out[i] = None if out[i] is None else _tree(out[i], sub)
        elif kind == _TABLES:
            out[i] = [_tree(t, sub) for t in out[i]]
    return out


_native_tree: Any = None  # fb_tree of the runtime's extension once looked for; False: none
_native_index: Any = None  # its module_index, found with it


def _load_native() -> Any:
    global _native_tree, _native_index
    try:  # a C module that imports nothing (no CUDA): fine on the load path
        from .runtime._launch import fb_tree, module_index as native_index
    except ImportError:
        _native_tree = False
    else:
        _native_tree, _native_index = fb_tree, native_index
    return _native_tree


def module_index(tables: "Tables", spec: tuple[tuple[Any, ...], ...],
                 limits: tuple[int, ...]) -> list[str] | None:
    """The names of the Module tables ``tables`` when the C check (``module_index`` in
    ``_fbread.c``, with kp.load's ``spec`` and ``limits``) finds every module plain, else None:
    no extension (or a buffer it does not take), or a module the caller's Python path must
    judge and name."""
    if _native_for(tables.buf) is None:  # (which looks for both C functions)
        return None
    return _native_index(tables.buf, tables.start, len(tables.offsets), spec,  # type: ignore
                         limits)


def _native_for(buf: Buffer) -> Any:
    """The C reader (``fb_tree``) where the extension is built and takes ``buf`` (bytes, a
    bytearray or a flat byte memoryview), else None."""
    native = _native_tree if _native_tree is not None else _load_native()
    if native and (type(buf) is bytes or type(buf) is bytearray or (
            type(buf) is memoryview and buf.format == "B" and buf.ndim == 1
            and buf.contiguous)):
        return native
    return None


class Table:
    """One verified table: ``table.get("field")`` returns a Python value by the field's type
    (int, str, bytes, tuple for structs and scalar vectors, Table, list of Table/str).

    The vtable is read once, when the table is made; each ``get`` is then a dict lookup and
    one struct call (the buffer has been verified, so nothing is re-checked here).
    """

    __slots__ = ("buf", "pos", "name", "_slots", "_voffs")

    def __init__(self, buf: Buffer, pos: int, name: str) -> None:
        self.buf, self.pos, self.name = buf, pos, name
        vt = pos - _I32(buf, pos)[0]
        count = min((_U16(buf, vt)[0] - 4) // 2, _NFIELDS[name])
        self._voffs = _VOFFS[count](buf, vt + 4)
        self._slots = _SLOTS[name]

    @classmethod
    def root(cls, buf: Buffer, name: str) -> "Table":
        return cls(buf, _U32(buf, 0)[0], name)

    def _field(self, slot: int) -> int:
        voffs = self._voffs
        voff = voffs[slot] if slot < len(voffs) else 0
        return self.pos + voff if voff else 0

    def _target(self, fpos: int) -> int:
        return fpos + _U32(self.buf, fpos)[0]

    def position(self, field: str) -> int:
        """Where ``field`` is stored in the buffer (0 when absent); for tools and tests."""
        return self._field(self._slots[field][0])

    def target(self, field: str) -> int:
        """Where the string/vector/table that offset field ``field`` points to starts."""
        return self._target(self.position(field))

    def has(self, field: str) -> bool:
        return self._field(self._slots[field][0]) != 0

    def get(self, field: str) -> Any:
        slot, cat, reader, default = self._slots[field]
        voffs = self._voffs
        voff = voffs[slot] if slot < len(voffs) else 0
        if not voff:
            return [] if default is _LIST else default
        if cat == "n":
            return reader(self.buf, self.pos + voff)[0]
        return _read(self.buf, self.pos + voff, cat, reader)

    def values(self, fields: tuple[str, ...]) -> list[Any]:
        """``[self.get(f) for f in fields]`` in one call (the decoder's bulk read)."""
        slots, voffs, buf, pos = self._slots, self._voffs, self.buf, self.pos
        n = len(voffs)
        out = []
        for field in fields:
            slot, cat, reader, default = slots[field]
            voff = voffs[slot] if slot < n else 0
            if not voff:
                out.append([] if default is _LIST else default)
            elif cat == "n":
                out.append(reader(buf, pos + voff)[0])
            else:
                out.append(_read(buf, pos + voff, cat, reader))
        return out

    def tree(self, spec: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """The fields ``spec`` names (see :func:`tree_spec`), as :meth:`values` reads them but
        with every table within read the same way: a table is the list of its spec's fields,
        a vector of tables a list of such lists. One C call where the extension is built (for
        a buffer of plain bytes), :func:`_tree` otherwise; the same values either way."""
        native = _native_for(self.buf)
        if native is not None:
            return native(self.buf, self.pos, spec)  # type: ignore[no-any-return]
        return _tree(self, spec)

    def tables(self, field: str) -> "Tables":
        """The tables of vector ``field``, each made when it is asked for (see
        :class:`Tables`); what ``get(field)`` returns, without making every table first."""
        fpos = self._field(self._slots[field][0])
        name = self._slots[field][2]
        if not fpos:
            return Tables(self.buf, 0, (), name)
        target = self._target(fpos)
        count = _U32(self.buf, target)[0]
        return Tables(self.buf, target + 4, struct.unpack_from(f"<{count}I", self.buf,
                                                               target + 4), name)

    def byte_views(self, field: str) -> "ByteViews":
        """The ``[ubyte] data`` fields of the tables of vector ``field`` (``Pack.blobs``),
        each made when it is first asked for (see :class:`ByteViews`)."""
        fpos = self._field(self._slots[field][0])
        if not fpos:
            return ByteViews(self.buf, 0, 0, self._slots[field][2])
        target = self._target(fpos)
        return ByteViews(self.buf, target + 4, _U32(self.buf, target)[0], self._slots[field][2])

    def view(self, field: str) -> memoryview:
        """A ``[ubyte]`` field as a zero-copy view (image blobs, the nested body)."""
        fpos = self._field(self._slots[field][0])
        if not fpos:
            return memoryview(b"")
        target = self._target(fpos)
        start = target + 4
        return memoryview(self.buf)[start:start + _U32(self.buf, target)[0]]


class Tables:
    """``len()``, ``[i]`` and iteration over a verified vector of tables, table ``i`` made on
    request: a pack of many programs decodes only the ones it calls, so making a
    :class:`Table` of each at load (~0.5 µs apiece) was most of what ``kp.load`` spent on
    them. :meth:`tree` reads one element as :meth:`Table.tree` does, without making its
    Table where the C reader is built."""

    __slots__ = ("buf", "start", "offsets", "name")

    def __init__(self, buf: Buffer, start: int, offsets: tuple[int, ...], name: str) -> None:
        self.buf, self.start, self.offsets, self.name = buf, start, offsets, name

    def __len__(self) -> int:
        return len(self.offsets)

    def position(self, index: int) -> int:
        """Where table ``index`` starts in the buffer (IndexError outside the vector)."""
        if not 0 <= index < len(self.offsets):
            raise IndexError(index)
        return self.start + 4 * index + self.offsets[index]

    def __getitem__(self, index: int) -> Table:
        return Table(self.buf, self.position(index), self.name)

    def __iter__(self) -> Iterator[Table]:
        return iter(_tables(self.buf, self.start, self.offsets, self.name))

    def tree(self, index: int, spec: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """``self[index].tree(spec)``."""
        native = _native_for(self.buf)
        if native is not None:
            return native(self.buf, self.position(index), spec)  # type: ignore[no-any-return]
        return _tree(self[index], spec)


class ByteViews:
    """``len()`` and ``[i]`` over a verified vector of tables whose ``data`` field is bytes:
    view ``i`` is made on request. A file may hold up to MAX_BLOBS blobs that no image names
    (8 MB of empty ones): making a Table and a view of each at load cost seconds and 400 MB.
    A view asked for is kept: images naming one blob (the same cubin in many modules) share
    it instead of each making a Table and a view at load."""

    __slots__ = ("buf", "start", "count", "table", "_made")

    def __init__(self, buf: Buffer, start: int, count: int, table: str) -> None:
        self.buf, self.start, self.count, self.table = buf, start, count, table
        self._made: dict[int, memoryview] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> memoryview:
        view = self._made.get(index)
        if view is None:
            view = self._made[index] = self._table(index).view("data")
        return view

    def _table(self, index: int) -> Table:
        if not 0 <= index < self.count:
            raise IndexError(index)
        pos = self.start + 4 * index
        return Table(self.buf, pos + _U32(self.buf, pos)[0], self.table)

    def span(self, index: int) -> tuple[int, int]:
        """(offset in the buffer, length) of view ``index``: where a reader that must not
        touch a memory map later (kernelpack._images.PackFile) finds the bytes."""
        table = self._table(index)
        fpos = table._field(table._slots["data"][0])
        if not fpos:
            return 0, 0
        target = table._target(fpos)
        return target + 4, _U32(self.buf, target)[0]
