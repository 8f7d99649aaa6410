"""Structural verification of kernelpack FlatBuffers, before any generated accessor runs.

The FlatBuffers Python runtime trusts the buffer completely: a bad offset gives an IndexError, a
garbage length a huge slice, a bad string a UnicodeDecodeError. So every buffer is first walked
here, with explicit bounds checks, against :data:`kernelpack._schema.TABLES` — a compact
description of ``schema/kernelpack.fbs`` (``tests/test_verify.py`` parses the schema and fails
if the two drift apart). Checked: root offset, file identifier, every vtable (size, alignment,
bounds), every field (inside its table, aligned), every offset target (inside the buffer,
aligned, and referenced only once: no shared sub-objects, so the work is linear in the buffer
size and the decoder can never be made to loop), every vector (length limit, bounds,
alignment), every string (bounds, NUL terminator, UTF-8, length limit), every enum value,
every bool, the table nesting depth, and that the data of all strings and vectors adds up to
at most the buffer (objects may not overlap: see :meth:`_Walker.overlap`). Any failure is a
:class:`~kernelpack.errors.FormatError` naming the field, the offset and what was expected.

The same walk exists in C (``_verify.c``, built into the runtime's optional extension, asked
through :mod:`kernelpack._verify_native`), 20-100x faster (the more tables, the more):
:func:`verify_buffer` asks it first and returns its answer when it accepts.
The Python walker here stays the reference and raises every error: the C walker only says
"reject", and then this one runs (``tests/test_verify_c_differential.py`` holds the two to
the same verdict on thousands of mutated artifacts).
"""

from __future__ import annotations

import codecs
import struct
from typing import Any

from . import _verify_native as _native
from ._schema import BODY_ALIGNMENT, ENUMS, SCALARS, STRUCTS, TABLES
from .errors import CompatibilityError, FormatError
from .limits import FILE_IDENTIFIER, FORMAT_MAJOR, MAX_FILE_SIZE, MAX_NAME_LENGTH, MAX_TABLE_DEPTH

__all__ = ["Buffer", "verify_buffer", "read_format_version"]

# PEP 604 union (a C-level types.UnionType): ``typing.Union[...]`` costs ~0.1 ms at import
Buffer = bytes | bytearray | memoryview

_U16 = struct.Struct("<H").unpack_from
_U16U16 = struct.Struct("<HH").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
# called as _UTF8(data, "strict", True): final=True, so a cut-off sequence is an error too
_UTF8 = codecs.utf_8_decode

# Per field, precomputed: (name, category, size, align, extra, limit). Categories:
# "s" scalar (extra: struct code), "e" enum (extra: count), "b" bool, "S" struct,
# "str" string, "v" scalar vector (extra: elem size), "vs" string vector, "vt" table vector
# (extra: table name), "t" table (extra: table name).
_Plan = tuple[tuple[str, str, int, int, object, int], ...]


def _compile(fields: tuple[tuple[str, str, int], ...]) -> _Plan:
    out: list[tuple[str, str, int, int, object, int]] = []
    for name, ftype, limit in fields:
        if ftype in SCALARS:
            size, code = SCALARS[ftype]
            out.append((name, "b" if ftype == "bool" else "s", size, size, code, limit))
        elif ftype in ENUMS:
            out.append((name, "e", 1, 1, ENUMS[ftype], limit))
        elif ftype in STRUCTS:
            size, align, _ = STRUCTS[ftype]
            out.append((name, "S", size, align, ftype, limit))
        elif ftype == "str":
            out.append((name, "str", 4, 4, None, limit))
        elif ftype.startswith("["):
            elem = ftype[1:-1]
            if elem in SCALARS:
                out.append((name, "v", 4, 4, SCALARS[elem][0], limit))
            elif elem == "str":
                out.append((name, "vs", 4, 4, None, limit))
            else:
                out.append((name, "vt", 4, 4, elem, limit))
        else:
            out.append((name, "t", 4, 4, ftype, limit))
    return tuple(out)


_PLANS: dict[str, _Plan] = {name: _compile(fields) for name, fields in TABLES.items()}
# vtable entries of a table, read in one call (one reader per field count)
_VOFFS = [struct.Struct(f"<{k}H").unpack_from
          for k in range(max(len(p) for p in _PLANS.values()) + 1)]
# The C walker's copy of the plans, made with them: static schema data, which the first
# kp.load of a process would otherwise build inside its own time (~40 µs cold).
_native.tables(_PLANS)


_LAYOUTS: dict[tuple[str, bytes], Any] = {}
_MAX_LAYOUTS = 4096  # distinct vtables remembered per process (a hostile file can make many)


def _layout(tname: str, vt_size: int, t_size: int, voffs: tuple[int, ...]) -> Any:
    """What a vtable alone decides for a ``tname`` table: which fields are present, that each
    lies inside the table and is aligned (tables are 4-aligned, so only 8-byte fields depend
    on the table's position). Returns the fields left to check per table, as (name, category,
    table offset, extra, limit), or None when a static check fails (the walker then checks
    that table field by field, so that the first problem is the one reported). A pure
    function of the vtable's bytes, so the walker caches it by them: tables of one shape,
    within a file and across files, share the work."""
    dynamic = []
    for (name, cat, size, align, extra, limit), voff in zip(_PLANS[tname], voffs):
        if voff == 0:
            continue
        if voff < 4 or voff + size > t_size or (align < 8 and voff % align):
            return None
        if align == 8 or (cat != "s" and cat != "S"):
            dynamic.append((name, "s8" if cat == "s" else cat, voff, extra, limit))
    return tuple(dynamic)


def _cached_layout(tname: str, buf: Buffer, vt: int, vt_size: int, t_size: int) -> Any:
    """:func:`_layout` of the vtable at ``vt``, remembered by the bytes it depends on (the
    table size and the slots of the plan's fields) across files. Not by the whole vtable: a
    vtable may claim up to 64 KiB, and a hostile file of thousands of overlapping ones kept
    that much per entry alive for the life of the process (~250 MiB from a 177 KB file)."""
    slots = min((vt_size - 4) // 2, len(_PLANS[tname]))
    key = (tname, bytes(buf[vt + 2:vt + 4 + 2 * slots]))
    fields = _LAYOUTS.get(key, False)
    if fields is False:
        fields = _layout(tname, vt_size, t_size, _VOFFS[slots](buf, vt + 4))
        if len(_LAYOUTS) < _MAX_LAYOUTS:
            _LAYOUTS[key] = fields
    return fields


def _path(where: object) -> str:
    """A field path for messages. The walker passes paths as nested tuples — ``(parent,
    "field")`` or ``(parent, index)`` — and only formats one when it reports a failure."""
    parts: list[str] = []
    while isinstance(where, tuple):
        where, last = where
        parts.append(f"[{last}]" if isinstance(last, int) else f".{last}")
    return str(where) + "".join(reversed(parts))


class _Walker:
    """One verification pass over one buffer (the file, or the nested body).

    The hot loop (:meth:`table`) tests each condition inline and calls the slower helpers
    only to raise their exact message; paths are formatted only on failure (see :func:`_path`).
    """

    def __init__(self, buf: Buffer, what: str) -> None:
        self.buf = buf
        self.n = len(buf)
        self.what = what
        self.seen: set[int] = set()
        # (table type, vtable position) -> _layout(): tables of a type share vtables
        self.layouts: dict[tuple[str, int], Any] = {}

    def fail(self, where: object, message: str) -> FormatError:
        return FormatError(f"{self.what}: {_path(where)}: {message}")

    def overlap(self, covered: int, where: object) -> FormatError:
        """The error for string and vector data adding up to more than the buffer. Distinct
        positions are not enough: every 4-aligned position of a 64 KiB run of ``00 00 01 00``
        is a valid 65536-byte string, and each decoded copy costs its full size (a 600 KB
        file held 1.3 GB). Objects that share no bytes hold at most the buffer, so the walk
        sums each subtree's data (what :meth:`table` and the others return) and refuses more."""
        return self.fail(where, f"strings and vectors overlap: their data adds up to more "
                                f"than the {self.n}-byte buffer ({covered} bytes so far; "
                                f"objects may not share bytes)")

    def need(self, pos: int, size: int, where: object) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            raise self.fail(where, f"{size} bytes at offset {pos} run past the end of the "
                                   f"{self.n}-byte buffer")

    def deref(self, pos: int, where: object) -> int:
        """Follow the uoffset at ``pos``: the target must be inside, aligned, and new."""
        off = _U32(self.buf, pos)[0]
        target = pos + off
        if off == 0 or target % 4:
            raise self.fail(where, f"offset {off} at {pos} points to {target}, expected a "
                                   f"non-zero offset to a 4-aligned position")
        if target + 4 > self.n:
            self.need(target, 4, where)
        if target in self.seen:
            raise self.fail(where, f"object at {target} is referenced twice (shared "
                                   f"sub-objects are not allowed)")
        self.seen.add(target)
        return target

    def vtable(self, pos: int, where: object) -> tuple[int, int, int]:
        """Check the table at ``pos`` and its vtable; returns (vtable, vtable size, table size)."""
        if pos % 4:
            raise self.fail(where, f"table at {pos} is not 4-aligned")
        self.need(pos, 4, where)
        vt = pos - _I32(self.buf, pos)[0]
        if vt % 2 or vt < 0 or vt + 4 > self.n:
            raise self.fail(where, f"vtable of the table at {pos} is at {vt}, outside the "
                                   f"buffer or misaligned")
        vt_size, t_size = _U16U16(self.buf, vt)
        if vt_size < 4 or vt_size % 2:
            raise self.fail(where, f"vtable at {vt} has size {vt_size}, expected an even "
                                   f"size >= 4")
        if vt + vt_size > self.n:
            self.need(vt, vt_size, f"{_path(where)} vtable")
        if t_size < 4:
            raise self.fail(where, f"table at {pos} has size {t_size}, expected >= 4")
        self.need(pos, t_size, where)
        return vt, vt_size, t_size

    def string(self, target: int, limit: int, where: object) -> int:
        buf = self.buf
        length = _U32(buf, target)[0]
        if length > limit:
            raise self.fail(where, f"string of {length} bytes exceeds the limit {limit}")
        end = target + 4 + length
        if end + 1 > self.n:
            self.need(target + 4, length + 1, where)
        if buf[end] != 0:
            raise self.fail(where, f"string at {target} is not NUL-terminated")
        try:
            _UTF8(buf[target + 4:end], "strict", True)
        except UnicodeDecodeError as exc:
            raise self.fail(where, f"string at {target} is not valid UTF-8 ({exc.reason} at "
                                   f"byte {exc.start})") from None
        return length

    def vector(self, target: int, elem_size: int, limit: int, where: object) -> int:
        count = _U32(self.buf, target)[0]
        if count > limit:
            raise self.fail(where, f"vector of {count} elements exceeds the limit {limit}")
        if target + 4 + count * elem_size > self.n:
            self.need(target + 4, count * elem_size, where)
        if (target + 4) % (elem_size if elem_size < 8 else 8):
            raise self.fail(where, f"vector data at {target + 4} is not aligned to {elem_size}")
        return count

    def table(self, pos: int, tname: str, depth: int, where: object) -> int:
        """Check the ``tname`` table at ``pos`` and everything below it; returns the bytes of
        string and vector data in that subtree (see :meth:`overlap`)."""
        if depth > MAX_TABLE_DEPTH:
            raise self.fail(where, f"tables nested deeper than {MAX_TABLE_DEPTH}")
        buf, n = self.buf, self.n
        if pos % 4 or pos + 4 > n:
            self.vtable(pos, where)  # raises the exact message
        vt = pos - _I32(buf, pos)[0]
        if vt % 2 or vt < 0 or vt + 4 > n:
            self.vtable(pos, where)
        vt_size, t_size = _U16U16(buf, vt)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > n or t_size < 4 or pos + t_size > n:
            self.vtable(pos, where)
        layouts = self.layouts
        key = (tname, vt)
        fields = layouts.get(key, False)
        if fields is False:
            fields = layouts[key] = _cached_layout(tname, buf, vt, vt_size, t_size)
        if fields is None:
            return self.slow_table(pos, tname, depth, where)
        seen = self.seen
        covered = 0  # string and vector data bytes below this table (see overlap())
        # The common cases inline; field() / deref() / vector() / string() check them all in
        # the same order with their messages, so on any failure they are called to raise it.
        for name, cat, voff, extra, limit in fields:
            fpos = pos + voff
            if cat == "e":
                if buf[fpos] < extra:  # type: ignore[operator]
                    continue
            elif cat == "b":
                if buf[fpos] <= 1:
                    continue
            elif cat != "s8" and cat != "S":  # an offset: string, vector or table
                target = fpos + _U32(buf, fpos)[0]
                if target == fpos or target % 4 or target + 4 > n or target in seen:
                    self.deref(fpos, (where, name))  # raises the exact message
                seen.add(target)
                if cat == "t":
                    covered += self.table(target, extra, depth + 1,  # type: ignore[arg-type]
                                          (where, name))
                    continue
                count = _U32(buf, target)[0]
                start = target + 4
                if cat == "str":
                    end = start + count
                    if count <= limit and end < n and buf[end] == 0:
                        try:
                            _UTF8(buf[start:end], "strict", True)
                            covered += count
                            continue
                        except UnicodeDecodeError:
                            pass
                    self.string(target, limit, (where, name))  # raises the exact message
                    continue
                if cat == "v":
                    if (count <= limit and start + count * extra <= n  # type: ignore[operator]
                            and not start % (extra if extra < 8 else 8)  # type: ignore[operator]
                            and tname != "Pack"):
                        covered += count * extra  # type: ignore[operator]
                        continue
                    count = self.vector(target, extra, limit,  # type: ignore[arg-type]
                                        (where, name))
                    covered += count * extra  # type: ignore[operator]
                    if tname == "Pack" and name == "body" and start % BODY_ALIGNMENT:
                        raise self.fail((where, name), f"nested body at {start} is not "
                                                       f"{BODY_ALIGNMENT}-aligned")
                    continue
                if count:  # an empty vector of strings or tables has nothing more to check
                    covered += self.elements(target, count, cat, extra, limit, depth,
                                             (where, name))
                continue
            covered += self.field(pos, fpos, tname, name, cat, extra, limit, depth,
                                  (where, name))
        if covered > n:
            raise self.overlap(covered, where)
        return covered

    def elements(self, target: int, count: int, cat: str, extra: object, limit: int,
                 depth: int, fwhere: object) -> int:
        """The elements of a vector of strings (``cat`` "vs") or tables ("vt") at ``target``
        holding ``count`` offsets: each new, inside and aligned, then checked itself. Returns
        the string and vector data bytes below (see :meth:`overlap`)."""
        buf, n = self.buf, self.n
        start = target + 4
        if count > limit or start + 4 * count > n:
            self.vector(target, 4, limit, fwhere)  # raises the exact message
        offsets = struct.unpack_from(f"<{count}I", buf, start)
        seen = self.seen
        covered = 0
        for i, off in enumerate(offsets):
            epos = start + 4 * i
            elem = epos + off
            if off == 0 or elem % 4 or elem + 4 > n or elem in seen:
                self.deref(epos, (fwhere, i))  # raises the exact message
            seen.add(elem)
            if cat == "vs":  # all are names
                end = elem + 4 + _U32(buf, elem)[0]
                if end - elem - 4 <= MAX_NAME_LENGTH and end < n and buf[end] == 0:
                    try:
                        _UTF8(buf[elem + 4:end], "strict", True)
                        covered += end - elem - 4
                        continue
                    except UnicodeDecodeError:
                        pass
                self.string(elem, MAX_NAME_LENGTH, (fwhere, i))  # raises the exact message
            else:
                covered += self.table(elem, extra, depth + 1, (fwhere, i))  # type: ignore[arg-type]
            if covered > n:  # per element: stop before more overlapping strings are decoded
                raise self.overlap(covered, (fwhere, i))
        return covered

    def slow_table(self, pos: int, tname: str, depth: int, where: object) -> int:
        """Every field checked in slot order; used for vtables whose fields do not all pass
        the static checks, so that the first problem is the one reported. Returns what
        :meth:`table` returns."""
        vt, vt_size, t_size = self.vtable(pos, where)
        buf = self.buf
        plan = _PLANS[tname]
        nslots = (vt_size - 4) // 2
        if nslots < len(plan):
            plan = plan[:nslots]  # written by an older minor version: absent fields default
        voffs = _VOFFS[len(plan)](buf, vt + 4)
        covered = 0
        for (name, cat, size, align, extra, limit), voff in zip(plan, voffs):
            if voff == 0:
                continue
            if voff < 4 or voff + size > t_size:
                raise self.fail((where, name), f"field at table offset {voff} ({size} bytes) "
                                               f"lies outside the {t_size}-byte table at {pos}")
            fpos = pos + voff
            if fpos % align:
                raise self.fail((where, name), f"field at {fpos} is not aligned to {align}")
            if cat == "s" or cat == "S":
                continue
            covered += self.field(pos, fpos, tname, name, cat, extra, limit, depth,
                                  (where, name))
        if covered > self.n:
            raise self.overlap(covered, where)
        return covered

    def field(self, pos: int, fpos: int, tname: str, name: str, cat: str, extra: object,
              limit: int, depth: int, fwhere: object) -> int:
        """The value checks of one field at ``fpos`` (enum and bool values, offset targets);
        returns the string and vector data bytes it holds (see :meth:`overlap`)."""
        buf = self.buf
        if cat == "s8" or cat == "S":
            if fpos % 8:
                raise self.fail(fwhere, f"field at {fpos} is not aligned to 8")
            return 0
        if cat == "e":
            value = buf[fpos]
            if value >= extra:  # type: ignore[operator]
                raise self.fail(fwhere, f"enum value {value} is not one of "
                                               f"0..{extra - 1}")  # type: ignore[operator]
            return 0
        if cat == "b":
            if buf[fpos] > 1:
                raise self.fail(fwhere, f"bool value {buf[fpos]}, expected 0 or 1")
            return 0
        target = self.deref(fpos, fwhere)
        if cat == "str":
            return self.string(target, limit, fwhere)
        if cat == "v":
            count = self.vector(target, extra, limit, fwhere)  # type: ignore[arg-type]
            if tname == "Pack" and name == "body" and (target + 4) % BODY_ALIGNMENT:
                raise self.fail(fwhere, f"nested body at {target + 4} is not "
                                        f"{BODY_ALIGNMENT}-aligned")
            return count * extra  # type: ignore[operator]
        if cat == "t":
            return self.table(target, extra, depth + 1, fwhere)  # type: ignore[arg-type]
        count = self.vector(target, 4, limit, fwhere)
        return self.elements(target, count, cat, extra, limit, depth, fwhere)

    def root(self, identifier: bytes | None) -> int:
        if self.n > MAX_FILE_SIZE:
            raise self.fail("size", f"{self.n} bytes exceed the limit {MAX_FILE_SIZE}")
        header = 8 if identifier is not None else 4
        if self.n < header:
            raise self.fail("header", f"{self.n} bytes, expected at least {header}")
        if identifier is not None and bytes(self.buf[4:8]) != identifier:
            raise self.fail("file identifier", f"expected {identifier!r}, got "
                                               f"{bytes(self.buf[4:8])!r}")
        root = _U32(self.buf, 0)[0]
        if root < header or root % 4:
            raise self.fail("root offset", f"{root}, expected a 4-aligned offset >= {header}")
        self.need(root, 4, "root table")
        return root


_USE_C = True  # tests turn the C walker off here to run the Python walker alone


def verify_buffer(buf: Buffer, root_type: str, *, identifier: bytes | None,
                  what: str = "file", _use_c: bool = True) -> int:
    """Walk ``buf`` as a ``root_type`` FlatBuffer; returns the root table position.

    The C walker (``_verify.c``, when the runtime's extension is built) answers first: an
    accepted buffer costs ~0.5 µs instead of ~40 (a 100-program body: 30 µs, not 3 ms).
    It never accepts what the Python
    walker rejects; on a reject the Python walker runs to raise the exact error (and, should
    the C walker ever be stricter, its verdict stands). ``_use_c=False`` (or ``_USE_C``) skips
    the C walker, for tests.

    Raises FormatError naming the field path (``Pack.blobs[3].data``), offset and expectation.
    """
    if _use_c and _USE_C:
        root = _native.root(buf, root_type, identifier, _PLANS,
                            (MAX_TABLE_DEPTH, MAX_NAME_LENGTH, MAX_FILE_SIZE, BODY_ALIGNMENT))
        if root >= 0:
            return root
    walker = _Walker(buf, what)
    root = walker.root(identifier)
    walker.seen.add(root)
    walker.table(root, root_type, 0, root_type)
    return root


def read_format_version(buf: Buffer) -> tuple[int, int]:
    """Read ``Pack.format_major/minor`` with just enough checking to trust the two numbers,
    and refuse a newer major *before* anything else of the file is interpreted.

    Raises FormatError (not a kernelpack file) or CompatibilityError (newer major).
    """
    walker = _Walker(buf, "file")
    root = walker.root(FILE_IDENTIFIER)
    vt, vt_size, t_size = walker.vtable(root, "Pack")
    values = []
    for slot, name in enumerate(("format_major", "format_minor")):
        voff = _U16(buf, vt + 4 + 2 * slot)[0] if 4 + 2 * slot < vt_size else 0
        if voff == 0:
            values.append(0)
            continue
        if voff < 4 or voff + 2 > t_size or (root + voff) % 2:
            raise walker.fail(f"Pack.{name}", f"field at table offset {voff} is outside the "
                                              f"{t_size}-byte root table or misaligned")
        values.append(_U16(buf, root + voff)[0])
    major, minor = values
    if major > FORMAT_MAJOR:
        raise CompatibilityError(f"file format {major}.{minor} is newer than this reader "
                                 f"(reads {FORMAT_MAJOR}.x): upgrade kernelpack")
    if major < 1:
        raise FormatError(f"file: Pack.format_major is {major}, expected 1..{FORMAT_MAJOR}")
    return major, minor
