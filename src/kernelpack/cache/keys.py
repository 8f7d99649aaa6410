"""Cache keys: a stable digest of every input that can change a compiled artifact.

The key is SHA-256 over length-prefixed, labelled parts, in a fixed order:

``format`` (artifact major.minor), ``kernelpack`` (version), ``codegen`` (digest of the source
of what makes an artifact: the package's own modules, ``lowering/`` and ``toolchain/``; not
``runtime/`` or ``cache/``), ``kind``, ``source``
(digest of the canonical source bytes: the lowering's canonical fusion serialization, or the
PTX/cubin bytes of an external kernel), ``options`` (canonical, type-tagged, sorted),
``targets`` (normalized, sorted), ``llvm``, ``nvjitlink``, ``libdevice`` (toolchain identity),
``ptxas-guard`` and ``env`` (every codegen knob declared in :mod:`kernelpack.config`).

Why ``codegen`` beside the version: a schedule changed without a release (a development
install, a patched wheel) kept the version, and every cache that held the old code went on
answering with it — Triton hashes its compiler's ``.py`` files into its key for the same
reason (``triton_key()``). The digest is computed once per process, from the files alone
(nothing is imported: a warm hit still loads no llvmlite); a ``kp.Cache`` lends it, and the
libdevice digest, a memo of its own (:mod:`kernelpack.cache.digest_memo`: the files' stat
stands for their bytes until one changes).

What is deliberately *not* in it: ``id()``, Python ``hash()`` (salted per process), absolute
paths and device indices — each made Triton or Inductor keys unstable across processes, hosts
or ranks. A toolchain probe that fails is recorded as ``unavailable:<ExceptionClass>``: the key
still changes when the toolchain appears or disappears (fail closed, never a stale hit).

Toolchain identity is computed once per process and kept cheap, because a warm start pays for
it: package versions come from installed distribution metadata (a wheel pins its library
builds) and the library is loaded and asked only when no distribution provides it.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import config
from .._frozen import frozen_dataclass
from ..toolchain.ptxas_guard import GUARD_ID
from ..limits import FORMAT_MAJOR, FORMAT_MINOR

__all__ = ["CacheKey", "make_key", "canonical_options", "toolchain_identity", "codegen_digest",
           "remember_digests_in", "digest_parts", "KEY_LABELS", "CODEGEN_PACKAGES"]

KEY_LABELS = ("format", "kernelpack", "codegen", "kind", "source", "options", "targets", "llvm",
              "nvjitlink", "libdevice", "ptxas-guard", "env")
#: kernelpack's subpackages whose source decides the code an artifact holds
# "" is the package's own modules: the tracer, expressions (cdiv's meaning: a grid), the
# summary, the serializer and its generated FlatBuffers writers also shape an artifact; only
# runtime/ and cache/ make no code (review 28: an edited expr.py was served the old grids).
CODEGEN_PACKAGES = ("", "_generated", "lowering", "toolchain")
_DOMAIN = b"kernelpack-cache-key/1\0"


@frozen_dataclass
class CacheKey:
    """A cache key: ``digest`` (64 hex chars; the entry's name everywhere) and the ``parts``
    it was computed from, as ``(label, text)`` pairs, kept so a miss can be explained."""

    digest: str
    parts: tuple[tuple[str, str], ...]

    def __init__(self, digest: str, parts: tuple[tuple[str, str], ...]) -> None:
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "parts", parts)

    def __str__(self) -> str:
        return self.digest

    def part(self, label: str) -> str:
        for name, value in self.parts:
            if name == label:
                return value
        raise KeyError(label)

    def explain(self) -> str:
        """The parts, one per line, as ``kernelpack cache explain`` prints them."""
        width = max((len(label) for label, _ in self.parts), default=0)  # a key of no parts
        lines = [f"key {self.digest}"]
        lines += [f"  {label:<{width}}  {value}" for label, value in self.parts]
        return "\n".join(lines)

    def diff(self, other: "CacheKey") -> list[tuple[str, str, str]]:
        """``(label, mine, theirs)`` for every part that differs: why ``other`` is not a hit."""
        mine, theirs = dict(self.parts), dict(other.parts)
        return [(label, mine.get(label, "<absent>"), theirs.get(label, "<absent>"))
                for label in sorted(set(mine) | set(theirs), key=_label_order)
                if mine.get(label) != theirs.get(label)]

    @staticmethod
    def from_parts(parts: Sequence[Sequence[str]]) -> "CacheKey":
        """Rebuild a key from recorded parts (a sidecar); the digest is recomputed, so a
        tampered record cannot pass for another key."""
        items = tuple((str(label), str(value)) for label, value in parts)
        return CacheKey(digest_parts(items), items)


def _label_order(label: str) -> tuple[int, str]:
    return (KEY_LABELS.index(label) if label in KEY_LABELS else len(KEY_LABELS), label)


def digest_parts(parts: Sequence[tuple[str, str]]) -> str:
    """SHA-256 over the domain tag and each ``label``/``value`` pair, every field prefixed by
    its 8-byte length, so no two different part lists can produce the same byte stream."""
    h = hashlib.sha256(_DOMAIN)
    for label, value in parts:
        for field in (label.encode(), value.encode()):
            h.update(struct.pack(">Q", len(field)))
            h.update(field)
    return h.hexdigest()


# ---- options -----------------------------------------------------------------------------------
def _encode(value: object, where: str) -> str:
    """A type-tagged canonical text for an option value: 1, 1.0, True and "1" all differ."""
    from ..dtypes import DType  # light module; imported here to keep this file's header short

    if value is None:
        return "n"
    if isinstance(value, bool):
        return "b1" if value else "b0"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        if math.isnan(value):
            return "fnan"  # every NaN is one option value; float.hex would keep the payload
        return "f" + value.hex()
    if isinstance(value, str):
        return f"s{len(value)}:{value}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return f"y{len(data)}:{data.hex()}"
    if isinstance(value, DType):
        return f"t{value.name}"
    if isinstance(value, (list, tuple)):
        return f"l{len(value)}[" + ",".join(_encode(v, f"{where}[{i}]")
                                           for i, v in enumerate(value)) + "]"
    if isinstance(value, (set, frozenset)):
        items = sorted(_encode(v, where + "{}") for v in value)
        return f"e{len(items)}{{" + ",".join(items) + "}"
    if isinstance(value, Mapping):
        return _encode_mapping(value, where)
    raise TypeError(f"cache key option {where} must be None, bool, int, float, str, bytes, a "
                    f"kp dtype, or a list/tuple/set/dict of those (got {type(value).__name__})")


def _encode_mapping(value: Mapping, where: str) -> str:
    items = []
    for k in value:
        if not isinstance(k, str):
            raise TypeError(f"cache key option names must be str (got {k!r} in {where})")
    for k in sorted(value):
        items.append(_encode(k, where) + "=" + _encode(value[k], f"{where}.{k}"))
    return f"d{len(items)}{{" + ",".join(items) + "}"


def canonical_options(options: Mapping[str, object]) -> str:
    """The canonical text of an options dict (sorted names, type-tagged values)."""
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict (got {type(options).__name__})")
    return _encode_mapping(options, "options")


def _canonical_targets(targets: Sequence[str]) -> str:
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise TypeError(f"targets must be a list such as ['sm_80', 'ptx'] (got {targets!r})")
    names = []
    for t in targets:
        if not isinstance(t, str) or not t.strip():
            raise TypeError(f"each target must be a non-empty str (got {t!r})")
        names.append(t.strip().lower())
    # The image set does not depend on the order targets are listed in (parse_target_list
    # sorts them), so neither does the key: ["sm_90", "sm_80"] hits ["sm_80", "sm_90"].
    return ",".join(sorted(set(names)))


# ---- toolchain identity ------------------------------------------------------------------------
_DIST_INFO = re.compile(r"^([A-Za-z0-9_.]+)-([^-]+?)\.(?:dist-info|egg-info)$")


def _installed() -> dict[str, str]:
    """``{normalized distribution name: version}`` from the ``*.dist-info`` folders on
    ``sys.path`` — what ``importlib.metadata`` reads, without its ~30 ms import, since a warm
    start pays for every key's toolchain probe. The first folder on the path wins, as for
    imports."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            match = _DIST_INFO.match(name)
            if match:
                found.setdefault(_normalize(match.group(1)), match.group(2))
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_version(*names: str, installed: dict[str, str] | None = None) -> str | None:
    if installed is None:
        installed = _installed()
    for name in names:
        version = installed.get(_normalize(name))
        if version is not None:
            return f"{name} {version}"
    return None


def _probe_llvm(installed: dict[str, str] | None = None) -> str:
    found = _dist_version("llvmlite", installed=installed)
    if found:
        return found  # an llvmlite wheel statically links one LLVM build
    try:
        import llvmlite.binding as llvm  # a source build: ask the library itself

        return "LLVM " + ".".join(str(v) for v in llvm.llvm_version_info)
    except Exception as exc:
        return f"unavailable:{type(exc).__name__}"


def _probe_nvjitlink(installed: dict[str, str] | None = None) -> str:
    found = _dist_version("nvidia-nvjitlink", "nvidia-nvjitlink-cu13", "nvidia-nvjitlink-cu12",
                          installed=installed)
    bindings = _dist_version("cuda-bindings", installed=installed) or "cuda-bindings ?"
    if found:
        return f"{found}; {bindings}"
    try:
        from ..toolchain import nvjitlink

        major, minor = nvjitlink.version()
        return f"nvJitLink {major}.{minor}; {bindings}"
    except Exception as exc:
        return f"unavailable:{type(exc).__name__}"


def _probe_libdevice(memo: bool = True) -> str:
    """The digest of the very file the lowering links (its locator, not a copy of it)."""
    try:
        from ..toolchain import libdevice

        # A digest this process already holds (the lowering's, or an earlier key's) is the
        # libdevice it links: used as it is, and never filed under the file's stamps of now,
        # which may be a newer file's (review 68: an upgrade then poisoned the memo)
        if memo and _MEMO is not None and not libdevice.digest.cache_info().currsize:
            path = libdevice.find()
            return _MEMO.digest(f"libdevice {path}", [("libdevice", path)], libdevice.digest)
        return libdevice.digest()
    except Exception as exc:
        return f"unavailable:{type(exc).__name__}"


# ``meta/digests.json`` of the first kp.Cache made in this process (a digest_memo.DigestMemo):
# this module's two once-per-process digests, remembered across processes by the files' stat
_MEMO: Any = None


def remember_digests_in(memo: Any) -> None:
    """Let the once-per-process digests (codegen sources, libdevice) come from ``memo`` (a
    :class:`~kernelpack.cache.digest_memo.DigestMemo`) when their files have not changed:
    called by ``kp.Cache``; the first cache of a process is the one used."""
    global _MEMO
    if _MEMO is None:
        _MEMO = memo


_TOOLCHAIN: tuple[tuple[str, str], ...] | None = None


def toolchain_identity(refresh: bool = False) -> tuple[tuple[str, str], ...]:
    """``(("llvm", ...), ("nvjitlink", ...), ("libdevice", ...))``, computed once per process
    (a few milliseconds: no shared library is loaded when wheels provide the tools)."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None or refresh:
        installed = _installed()  # one scan of sys.path for both probes
        _TOOLCHAIN = (("llvm", _probe_llvm(installed)), ("nvjitlink", _probe_nvjitlink(installed)),
                      ("libdevice", _probe_libdevice(memo=not refresh)))
    return _TOOLCHAIN


_CODEGEN: str | None = None


def codegen_digest(refresh: bool = False, root: Path | None = None) -> str:
    """``sha256:<hex> (<n> files)`` over the ``.py`` files of :data:`CODEGEN_PACKAGES` under
    ``root`` (default: this kernelpack's package directory; each file's package-relative name,
    length and bytes, in name order), computed once per process for the default root;
    ``unavailable:no source`` for an install that ships no ``.py`` files there (the version
    alone then decides, as before this part existed)."""
    global _CODEGEN
    if root is not None:
        return _codegen_of(root)
    if _CODEGEN is None or refresh:
        here = Path(__file__).resolve().parent.parent
        if here.is_dir() and _MEMO is not None and not refresh:
            sources = _codegen_sources(here)
            _CODEGEN = _MEMO.digest(f"codegen {here}", sources,
                                    lambda: _codegen_of(here, sources))
        elif here.is_dir():
            _CODEGEN = _codegen_of(here)
        else:  # imported from a zip: read the sources through the package's loader (a stale
            # hit between two zips of one version otherwise: review 34)
            from importlib.resources import files

            _CODEGEN = _codegen_of(files(__name__.rpartition(".cache")[0]))
    return _CODEGEN


def _codegen_sources(root: Any) -> list[tuple[str, Any]]:
    """``(package-relative name, file)`` of every module the codegen digest reads, in its
    order. ``root``: a directory (files as str paths), or any ``importlib.resources``
    Traversable (a zip's; files as Traversables)."""
    out = []
    for package in CODEGEN_PACKAGES:
        base = root.joinpath(package) if package else root
        try:
            if isinstance(base, Path):  # scandir's entries know their type: no stat each,
                with os.scandir(base) as listing:  # and plain str paths (no Path objects)
                    found = [(e.name, e.path) for e in listing
                             if e.name.endswith(".py") and e.is_file()]
            else:
                found = [(e.name, e) for e in base.iterdir()
                         if e.name.endswith(".py") and e.is_file()]
        except (OSError, ValueError):  # no such package under root
            continue
        for name, path in sorted(found, key=lambda e: e[0]):
            if not name.startswith("."):  # an editor's lock (.#expr.py), macOS's ._expr.py
                out.append((f"{package + '/' if package else ''}{name}", path))
    return out


def _codegen_of(root: Any, sources: list[tuple[str, Any]] | None = None) -> str:
    """The codegen digest of ``root`` (its :func:`_codegen_sources`, when already listed)."""
    h = hashlib.sha256()
    count = 0
    for name, path in _codegen_sources(root) if sources is None else sources:
        if isinstance(path, str):
            with open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
        count += 1
    return f"sha256:{h.hexdigest()} ({count} files)" if count else "unavailable:no source"


# ---- the key -----------------------------------------------------------------------------------
def make_key(kind: str, source: bytes | str, options: Mapping[str, object] | None = None,
             targets: Sequence[str] = ()) -> CacheKey:
    """The cache key of one compilation.

    Parameters
    ----------
    kind:
        What ``source`` is: ``"fusion"`` (the lowering's canonical bytes), ``"external"``
        (PTX or cubin bytes), or another producer's name.
    source:
        Canonical source bytes (a str is UTF-8 encoded). Must not contain paths or ids.
    options:
        Everything else the producer's output depends on (entry names, summaries in canonical
        form, block sizes, ...): None, bool, int, float, str, bytes, dtypes, and containers.
    targets:
        The requested targets (order does not matter).

    Raises
    ------
    TypeError
        A part has a type that has no canonical form (an object would hash by identity).
    """
    from .. import __version__

    if not isinstance(kind, str) or not kind.isidentifier():
        raise TypeError(f"kind must be an identifier such as 'fusion' or 'external' (got {kind!r})")
    if isinstance(source, str):
        source = source.encode()
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"source must be bytes (got {type(source).__name__})")
    data = bytes(source)
    parts = (
        ("format", f"{FORMAT_MAJOR}.{FORMAT_MINOR}"),
        ("kernelpack", __version__),
        ("codegen", codegen_digest()),
        ("kind", kind),
        ("source", f"sha256:{hashlib.sha256(data).hexdigest()} ({len(data)} bytes)"),
        ("options", canonical_options(options or {})),
        ("targets", _canonical_targets(targets)),
        *toolchain_identity(),
        ("ptxas-guard", GUARD_ID),  # cubins assembled before a workaround are not reused
        ("env", ";".join(f"{n}={v}" for n, v in config.codegen_env())),
    )
    return CacheKey(digest_parts(parts), parts)
