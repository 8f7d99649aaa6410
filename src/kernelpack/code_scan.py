"""What compiled code declares, read without a GPU or a toolkit: the kernel entries of PTX
text and of cubins, their parameter lists, and the architecture a cubin was built for.

PTX is scanned as text (comments skipped); a cubin is parsed as a CUDA ELF file, with every
offset and size checked against the file (a malformed one is a CompileError) and the work kept
linear in its size, since the bytes come from the user or from a file. The parameter readers
answer None for anything they do not understand: the caller then checks nothing rather than
refusing a kernel that is fine.

Split from :mod:`kernelpack.external_images`, which turns sources into images and checks them
with these readers; import the public names from either module.
"""

from __future__ import annotations

import re
import struct

from .errors import CompileError
from .limits import MAX_NAME_LENGTH

__all__ = ["ptx_entries", "ptx_entry_params", "ptx_entry_max_threads", "cubin_entries",
           "cubin_arch", "cubin_entry_params", "cubin_entry_max_threads"]

_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$]*)")
_PTX_COMMENT_RE = re.compile(rb"//[^\n]*|/\*.*?\*/", re.DOTALL)
_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10


# ---- PTX ---------------------------------------------------------------------------------------
def ptx_entries(ptx: bytes) -> list[str]:
    """The kernel entry names declared in PTX text (``.entry NAME``), in order. Comments are
    skipped: a commented-out ``// .entry old(`` is not a kernel ptxas will build."""
    code = _PTX_COMMENT_RE.sub(b" ", ptx)
    return [m.group(1).decode("ascii", "replace") for m in _ENTRY_RE.finditer(code)]


_PARAM_TYPE_BYTES = {"pred": 1, "b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2,
                     "f16": 2, "bf16": 2, "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8,
                     "u64": 8, "s64": 8, "f64": 8}
_PARAM_ARRAY_RE = re.compile(r"\[\s*(\d+)\s*\]\s*$")
_PARAM_WORD_RE = re.compile(r"\.([A-Za-z]\w*)")


def _ptx_entry(ptx: bytes, entry: str) -> tuple[str, int, int] | None:
    """Kernel ``entry``'s declaration in PTX text (comments blanked): ``(code, start, close)``
    with ``start`` just after the name and ``close`` the position of the parameter list's
    ``)`` (``close == start`` when there is no list); None when the entry is not found or its
    list is not closed."""
    code = _PTX_COMMENT_RE.sub(b" ", ptx).decode("utf-8", "replace")
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"(?![\w$])\s*", code)
    if match is None:
        return None
    start = match.end()
    if not code.startswith("(", start):
        return code, start, start
    close = code.find(")", start)
    return None if close < 0 else (code, start, close)


def ptx_entry_params(ptx: bytes, entry: str) -> list[tuple[str, int]] | None:
    """The ``.param`` list of kernel ``entry`` in PTX text as ``(declaration, bytes)`` pairs,
    in order (``[]`` for a kernel without parameters); None when the entry is not found or a
    declaration is not one this reader understands (the caller then checks nothing).

    Why: the runtime passes one pointer per summary argument to cuLaunchKernel, which reads
    as many parameters, of the sizes the kernel declares, as the kernel has. An argument list
    of another length or width is read out of bounds on the GPU, not reported."""
    found = _ptx_entry(ptx, entry)
    if found is None:
        return None
    code, start, close = found
    if close == start:
        return []  # ".entry k {": no parameters
    body = code[start + 1:close].strip()
    if not body:
        return []
    params: list[tuple[str, int]] = []
    for decl in body.split(","):
        decl = " ".join(decl.split())
        # directives, not words: ".param.u64 x" assembles, and a name ("xf32") is no type
        words = _PARAM_WORD_RE.findall(decl)
        if not decl.startswith(".param") or words[0] != "param":
            return None
        types = [w for w in words if w in _PARAM_TYPE_BYTES]
        if len(types) != 1:
            return None
        size = _PARAM_TYPE_BYTES[types[0]]
        array = _PARAM_ARRAY_RE.search(decl)
        if array is not None:
            size *= int(array.group(1))
        params.append((decl, size))
    return params


_PTX_INT = r"(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)[uU]?"
_THREAD_LIMIT_RE = re.compile(r"\.(maxntid|reqntid)\s+" + _PTX_INT +
                              r"(?:\s*,\s*" + _PTX_INT + r")?(?:\s*,\s*" + _PTX_INT + r")?")


def _ptx_int(text: str) -> int:
    """A PTX integer literal as ptxas reads it, C's way: 0x hex, 0b binary, a leading 0
    octal (``.maxntid 0200`` is 128 threads), else decimal."""
    if text[:2] in ("0x", "0X"):
        return int(text[2:], 16)
    if text[:2] in ("0b", "0B"):
        return int(text[2:], 2)
    if len(text) > 1 and text[0] == "0":
        return int(text, 8)
    return int(text)


def ptx_entry_max_threads(ptx: bytes, entry: str) -> tuple[str, int] | None:
    """The thread limit kernel ``entry`` declares between its parameter list and its body
    (``.maxntid 256`` or ``.reqntid 16, 16``, e.g. from ``__launch_bounds__``) as
    ``(directive, threads per block)``; None when it declares none or is not found.

    Why: a launch with more threads per block than that fails on the GPU, at every call; a
    constant block can be checked against it when the kernel is declared."""
    found = _ptx_entry(ptx, entry)
    if found is None:
        return None
    code, start, close = found
    start = close + 1 if close > start else start  # after the parameter list, if any
    body = code.find("{", start)
    if body < 0:
        return None
    limit = _THREAD_LIMIT_RE.search(code, start, body)
    if limit is None:
        return None
    threads = 1
    try:
        for dim in limit.groups()[1:]:
            threads *= _ptx_int(dim) if dim is not None else 1
    except ValueError:  # "089": not a literal ptxas reads either; it will say so
        return None
    return f".{limit.group(1)} {limit.group(0).split(None, 1)[1]}", threads


# ---- cubins ------------------------------------------------------------------------------------
def _elf_header(data: bytes, what: str) -> tuple[int, int, int, int]:
    """Check the ELF identification of a cubin; returns (shoff, shentsize, shnum, flags)."""
    if data[:4] != _ELF_MAGIC:
        raise CompileError(f"{what} is not an ELF file (starts with {data[:4]!r}, expected "
                           f"{_ELF_MAGIC!r}); pass PTX with ptx= instead")
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise CompileError(f"{what} is not a 64-bit little-endian ELF file")
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine != _EM_CUDA:
        raise CompileError(f"{what} is an ELF file for machine {machine}, not CUDA "
                           f"({_EM_CUDA})")
    (shoff,) = struct.unpack_from("<Q", data, 40)
    (flags,) = struct.unpack_from("<I", data, 48)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    return shoff, shentsize, shnum, flags


def cubin_arch(data: bytes, what: str = "cubin") -> int | None:
    """The SM number (90 for sm_90) a cubin was built for, from its ELF flags; None when the
    ELF ABI version is one this reader does not know."""
    _elf_header(data, what)
    abi = data[8]
    (flags,) = struct.unpack_from("<I", data, 48)
    if abi >= 8:
        return (flags >> 8) & 0xFF
    if abi == 7:
        return flags & 0xFF
    return None


_EIFMT_SVAL, _EIATTR_KPARAM_INFO = 4, 0x17
_PARAM_ATTRS = (0x0A, 0x17, 0x19)  # PARAM_CBANK, KPARAM_INFO, CBANK_PARAM_SIZE


def _nv_info(data: bytes, entry: str) -> list[tuple[int, int, bytes]] | None:
    """The attributes of kernel ``entry``'s ``.nv.info.<entry>`` section in a cubin as
    ``(format, attribute, payload)``; None when the section is missing, not unique or not as
    expected (every offset checked against the file)."""
    try:
        shoff, shentsize, shnum, _ = _elf_header(data, "cubin")
        (shstrndx,) = struct.unpack_from("<H", data, 62)
        if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
            return None
        # (name, offset, size) of each section header
        sections = [struct.unpack_from("<I20xQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        names_at = sections[shstrndx][1]
        want = b".nv.info." + entry.encode() + b"\0"
        found = [sec for sec in sections
                 if data[names_at + sec[0]:names_at + sec[0] + len(want)] == want]
        if len(found) != 1 or found[0][1] + found[0][2] > len(data):
            return None
        info = data[found[0][1]:found[0][1] + found[0][2]]
        attrs: list[tuple[int, int, bytes]] = []
        pos = 0
        while pos + 4 <= len(info):
            fmt, attr = info[pos], info[pos + 1]
            if fmt != _EIFMT_SVAL:  # no value, a byte or a half word: 4 bytes in all
                attrs.append((fmt, attr, info[pos + 2:pos + 4]))
                pos += 4
                continue
            (size,) = struct.unpack_from("<H", info, pos + 2)
            attrs.append((fmt, attr, info[pos + 4:pos + 4 + size]))
            pos += 4 + size
        return attrs
    except (struct.error, CompileError):
        return None


def cubin_entry_params(data: bytes, entry: str) -> list[tuple[str, int]] | None:
    """The parameters of kernel ``entry`` in a cubin, from the ``KPARAM_INFO`` attributes of
    its ``.nv.info.<entry>`` section, as ``(description, bytes)`` pairs by ordinal (``[]``
    when the section has no parameter attribute at all: a kernel without parameters); None
    when the section or the attributes are missing or not as expected (nothing is checked).

    Why: as :func:`ptx_entry_params`, so that ``cubin=`` arguments are checked like PTX's."""
    attrs = _nv_info(data, entry)
    if attrs is None:
        return None
    sizes: dict[int, int] = {}
    param_attrs = 0
    for fmt, attr, payload in attrs:
        param_attrs += attr in _PARAM_ATTRS
        if fmt == _EIFMT_SVAL and attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
            _, ordinal, _, flags = struct.unpack_from("<IHHI", payload)
            sizes[ordinal] = (flags >> 18) & 0x3FFF
    if not sizes and not param_attrs:
        return []  # a kernel without parameters has no parameter bank: none to pass
    if not sizes or sorted(sizes) != list(range(len(sizes))):
        return None
    return [(f"parameter {i} ({sizes[i]} bytes)", sizes[i]) for i in range(len(sizes))]


# EIATTR_MAX_THREADS (__launch_bounds__, .maxntid) and EIATTR_REQNTID (.reqntid): x, y, z as
# three u32 (checked against an NVRTC cubin of __launch_bounds__(96): 0x05 = 96, 1, 1)
_THREAD_ATTRS = {0x05: ".maxntid", 0x10: ".reqntid"}


def cubin_entry_max_threads(data: bytes, entry: str) -> tuple[str, int] | None:
    """As :func:`ptx_entry_max_threads`, from a cubin's ``.nv.info.<entry>`` attributes:
    ``("__launch_bounds__/.maxntid 96, 1, 1", 96)``; None when it declares none."""
    for fmt, attr, payload in _nv_info(data, entry) or ():
        if fmt == _EIFMT_SVAL and attr in _THREAD_ATTRS and len(payload) >= 12:
            dims = struct.unpack_from("<III", payload)
            return (f"{_THREAD_ATTRS[attr]} {dims[0]}, {dims[1]}, {dims[2]}",
                    dims[0] * dims[1] * dims[2])
    return None


def cubin_entries(data: bytes, what: str = "cubin") -> list[str]:
    """Kernel entry names of a cubin: function symbols marked as CUDA entries.

    Every offset is checked against the file size; a malformed ELF gives CompileError. The
    work stays linear in the file size: symbol tables may not overlap (a thousand section
    headers naming one table made a 300 KB file take seconds, quadratically more for larger
    ones), and a name is read up to MAX_NAME_LENGTH bytes (an entry kernelpack can launch is
    no longer; twenty thousand symbols naming one 500 KB string held 10 GB of names).
    Longer names are skipped: they cannot be the entry asked for.
    """
    shoff, shentsize, shnum, _ = _elf_header(data, what)
    if shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise CompileError(f"{what}: section header table outside the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names: list[str] = []
    scanned = 0
    for _name, sh_type, _f, _a, offset, size, link, _i, _al, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        if link >= shnum or offset + size > len(data) or entsize < 24:
            raise CompileError(f"{what}: malformed symbol table")
        scanned += size
        if scanned > len(data):
            raise CompileError(f"{what}: symbol tables overlap (together {scanned}+ bytes in a "
                               f"{len(data)}-byte file)")
        str_off, str_size = sections[link][4], sections[link][5]
        if str_off + str_size > len(data):
            raise CompileError(f"{what}: string table outside the file")
        str_end = str_off + str_size
        for pos in range(offset, offset + size - entsize + 1, entsize):
            st_name, info, other = struct.unpack_from("<IBB", data, pos)
            if info & 0xF != _STT_FUNC or not other & _STO_CUDA_ENTRY:
                continue
            if st_name >= str_size:
                raise CompileError(f"{what}: symbol name outside the string table")
            start = str_off + st_name
            end = data.find(b"\0", start, min(str_end, start + MAX_NAME_LENGTH + 1))
            if end < 0:
                if start + MAX_NAME_LENGTH + 1 < str_end:
                    continue  # longer than any entry name: not the one asked for
                raise CompileError(f"{what}: unterminated symbol name")
            names.append(data[start:end].decode("ascii", "replace"))
    return names
