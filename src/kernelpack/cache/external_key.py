"""Keys for ``kp.external`` calls, so externals go through the cache like fusions.

The key must cover everything that shapes the artifact: the source bytes (PTX, LLVM IR, CUDA C
or cubins — read once, so the key and the build see the same bytes and a path never enters the
key), every other argument (parameters, launch expressions, targets) and, for ``cuda=``, the
headers NVRTC can include (the contents of every ``-I`` directory and ``-include`` file; their
paths are replaced by those digests, so two machines with the same headers in different places
share entries, and a changed header is never a stale hit).

Arguments are encoded by :func:`canonical`: dataclasses field by field, containers element by
element, expressions by :func:`kernelpack.expr.canonical_text` (complete, where ``repr`` of a
large expression is cut short for printing), sets in a sorted order, anything else by its
``repr`` unless that names a memory address (an object's default ``repr``, a generator's),
which is refused: the address is reused as soon as the object is freed, and two calls with
different arguments shared a key (review 40). One-shot iterators (a generator of
constraints) are read once into lists, which both the key and the build then use. Two
spellings of one launch (``block=256`` vs ``block=(256,)``) give two keys, which costs a
compile, never a stale hit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Callable

from ..compiled import Compiled
from ..expr import Expr, canonical_text
from .keys import CacheKey, make_key

__all__ = ["external_key", "source_bytes", "canonical", "include_digests",
           "MAX_INCLUDE_FILES", "MAX_INCLUDE_BYTES"]

_SOURCES = ("ptx", "llvm_ir", "cubin", "cuda")
MAX_INCLUDE_FILES = 20_000        # beyond this, a directory is fingerprinted by stat, not read
MAX_INCLUDE_BYTES = 512 << 20


def source_bytes(value: object, what: str) -> bytes:
    """Text given as bytes, as a str of code, or as a path: the bytes (never the path), read
    by the rules ``kp.external`` itself uses (:func:`kernelpack.external_images.read_source`),
    so that the key covers exactly what is compiled, and a missing file is the same
    ValueError naming the argument. (An own copy of those rules took ``'#include "k.cuh"'``
    for a path and raised a bare FileNotFoundError.)"""
    from ..external_images import read_source

    return read_source(value, what)  # type: ignore[arg-type]


def canonical(value: object) -> str:
    """A deterministic text of an argument of ``kp.external`` (see the module docstring)."""
    if isinstance(value, Expr):
        return f"Expr<{canonical_text(value)}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ",".join(f"{f.name}={canonical(getattr(value, f.name))}"
                          for f in dataclasses.fields(value))
        return f"{type(value).__qualname__}({fields})"
    if isinstance(value, (list, tuple)):
        inner = ",".join(canonical(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}"
                              for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, (set, frozenset)):  # iteration order follows per-process str hashes
        return "set{" + ",".join(sorted(canonical(v) for v in value)) + "}"
    text = repr(value)
    if " at 0x" in text:
        raise TypeError(f"kp.Cache.external cannot key an argument of type "
                        f"{type(value).__name__} ({text[:80]}): its repr names a memory address, "
                        f"not its content; pass a list, tuple or the data model's objects")
    return text


def _read_once(value: object) -> object:
    """A one-shot iterator (a generator, ``map``) as the list it yields, so that the key and
    ``kp.external`` see the same items (and the key sees items, not an address)."""
    return list(value) if isinstance(value, Iterator) else value


# ---- headers of cuda= sources ------------------------------------------------------------------
# NVRTC's include flags, normalized to "-I" (a search directory) or "-include" (a file)
_SEPARATE = {"-I": "-I", "--include-path": "-I", "-include": "-include",
             "--pre-include": "-include"}
_ATTACHED = (("--include-path=", "-I"), ("--pre-include=", "-include"),
             ("-include=", "-include"), ("-I", "-I"))


def _tree_digest(root: str) -> str:
    """SHA-256 over the relative paths and contents of the regular files under ``root``
    (sorted), or of the file ``root``. Contents are read again only when a file's size, inode
    or modification time changed since this process last looked (a warm start must not read a
    whole toolkit's headers per kernel). Past :data:`MAX_INCLUDE_FILES` files or
    :data:`MAX_INCLUDE_BYTES` bytes, the digest is over those stat facts instead: never
    stale, but not shared across hosts."""
    if os.path.isfile(root):
        files = [(os.path.basename(root), root)]
    elif os.path.isdir(root):
        files = []
        walked: set[str] = set()  # real paths: a symlinked folder is followed, a cycle is not
        for top, dirs, names in os.walk(root, followlinks=True):
            real = os.path.realpath(top)
            if real in walked:
                dirs[:] = []
                continue
            walked.add(real)
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(top, name)
                if os.path.isfile(path):
                    files.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    else:
        return "missing"
    facts = []
    for rel, path in files:
        st = os.stat(path)
        facts.append((rel, st.st_size, st.st_ino, st.st_mtime_ns))
    signature = (os.path.isdir(root), tuple(facts))
    memo = _TREES.get(os.path.abspath(root))
    if memo is not None and memo[0] == signature:
        return memo[1]
    by_content = len(files) <= MAX_INCLUDE_FILES and \
        sum(f[1] for f in facts) <= MAX_INCLUDE_BYTES
    h = hashlib.sha256(b"dir" if signature[0] else b"file")
    for (rel, path), (_, size, _, mtime) in zip(files, facts):
        h.update(len(rel).to_bytes(8, "big") + rel.encode())
        if by_content:
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        else:
            h.update(f"{size}:{mtime}".encode())
    digest = ("sha256:" if by_content else "stat:") + h.hexdigest()
    _TREES[os.path.abspath(root)] = (signature, digest)
    return digest


_TREES: dict[str, tuple[tuple, str]] = {}  # abspath -> (stat signature, digest)


def include_digests(options: Any) -> list[str]:
    """``nvrtc_options`` with each include directory or pre-included file replaced by the
    digest of what it holds (``-I<dir>``, ``-I <dir>``, ``--include-path=<dir>``,
    ``-include <file>``, ``--pre-include=<file>``); other options unchanged. Anything that is
    not a list of strings is returned as its canonical text, for ``kp.external`` to refuse."""
    if isinstance(options, (str, bytes)) or not isinstance(options, (list, tuple)) or \
            not all(isinstance(o, str) for o in options):
        return [canonical(options)]
    out: list[str] = []
    pending: str | None = None  # a flag whose path is the next option
    for opt in options:
        if pending is not None:
            out.append(f"{pending} {_tree_digest(opt)}")
            pending = None
        elif opt in _SEPARATE:
            pending = _SEPARATE[opt]
        else:
            for prefix, flag in _ATTACHED:
                if opt.startswith(prefix) and len(opt) > len(prefix):
                    out.append(f"{flag} {_tree_digest(opt[len(prefix):])}")
                    break
            else:
                out.append(opt)
    if pending is not None:  # a flag without its path: kp.external words the error
        out.append(pending)
    return out


def external_key(args: tuple, kwargs: dict[str, Any]) -> tuple[CacheKey, Callable[[], Compiled]]:
    """The key of ``kp.external(*args, **kwargs)`` and a build function calling it with the
    source already read. Misuse (no source, two sources) is left to ``kp.external``."""
    from ..external import DEFAULT_TARGETS, _sequence, external

    args = tuple(_read_once(a) for a in args)
    kwargs = {k: _read_once(v) for k, v in kwargs.items()}
    asked = kwargs.pop("targets", None)
    # checked as kp.external checks it: a bare "sm_80" is not a list of characters
    targets = list(_sequence(DEFAULT_TARGETS if asked is None else asked, "targets"))
    given = [k for k in _SOURCES if kwargs.get(k) is not None]
    if len(given) != 1:
        external(*args, targets=targets, **kwargs)  # raises the TypeError naming the problem
        raise TypeError(f"kp.external needs exactly one of {_SOURCES} (got {given})")
    kind = given[0]
    value = kwargs.pop(kind)
    if asked is None and kind == "cubin" and isinstance(value, Mapping):
        targets = sorted(str(t) for t in value)  # the mapping's keys are its targets
    # kp.external checks targets= beside a cubin mapping only when given: passed on as given
    passed: dict[str, Any] = {} if asked is None else {"targets": targets}
    if kind == "cubin" and isinstance(value, Mapping):
        source = b"".join(len(t).to_bytes(8, "big") + t.encode() + len(d).to_bytes(8, "big")
                          + bytes(d) for t, d in sorted(value.items()))
    elif kind == "cubin":
        source = bytes(value)
    else:
        source = value = source_bytes(value, kind)
    keyed = dict(kwargs)
    if kind == "cuda":  # headers by content, not by where they are
        keyed["nvrtc_options"] = include_digests(kwargs.get("nvrtc_options", ()))
    options = {"args": canonical(args), "kwargs": canonical(sorted(keyed.items())),
               "source": kind}
    if kind == "cuda":  # NVRTC's build is not in toolchain_identity
        from ..toolchain import nvrtc

        options["nvrtc"] = nvrtc.key_identity()
    key = make_key("external", source, options, targets)
    # (the mappings share no key: targets and the source were popped from kwargs above)
    return key, lambda: external(*args, **passed, **{kind: value}, **kwargs)  # type: ignore[misc]
