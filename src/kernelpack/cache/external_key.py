"""Keys for ``kp.external`` calls, so externals go through the cache like fusions.

The key must cover everything that shapes the artifact: the source bytes (PTX, LLVM IR or
cubins — read once, so the key and the build see the same bytes and a path never enters the
key) and every other argument (parameters, launch expressions, targets). Those arguments are
frozen dataclasses, expressions and plain values whose ``repr`` is deterministic, so their
repr is the canonical form; two spellings of one launch (``block=256`` vs ``block=(256,)``)
give two keys, which costs a compile, never a stale hit.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..compiled import Compiled
from .keys import CacheKey, make_key

__all__ = ["external_key", "source_bytes"]

_SOURCES = ("ptx", "llvm_ir", "cubin", "cuda")


def source_bytes(value: object, what: str) -> bytes:
    """Text given as bytes, as a str of code, or as a path: the bytes (never the path)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).rstrip(b"\0")
    if isinstance(value, str) and any(m in value for m in ("\n", ".entry", ".version", "define ",
                                                            "__global__")):
        return value.encode().rstrip(b"\0")
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read().rstrip(b"\0")
    raise TypeError(f"{what} must be text (str/bytes) or a path (got {type(value).__name__})")


def external_key(args: tuple, kwargs: dict[str, Any]) -> tuple[CacheKey, Callable[[], Compiled]]:
    """The key of ``kp.external(*args, **kwargs)`` and a build function calling it with the
    source already read. Misuse (no source, two sources) is left to ``kp.external``."""
    from ..external import _sequence, external

    kwargs = dict(kwargs)
    # checked as kp.external checks it: a bare "sm_80" is not a list of characters
    targets = list(_sequence(kwargs.pop("targets", ("sm_80", "sm_90")), "targets"))
    given = [k for k in _SOURCES if kwargs.get(k) is not None]
    if len(given) != 1:
        external(*args, targets=targets, **kwargs)  # raises the TypeError naming the problem
        raise TypeError(f"kp.external needs exactly one of {_SOURCES} (got {given})")
    kind = given[0]
    value = kwargs.pop(kind)
    if kind == "cubin" and isinstance(value, dict):
        source = b"".join(len(t).to_bytes(8, "big") + t.encode() + len(d).to_bytes(8, "big")
                          + bytes(d) for t, d in sorted(value.items()))
    elif kind == "cubin":
        source = bytes(value)
    else:
        source = value = source_bytes(value, kind)
    options = {"args": repr(args), "kwargs": repr(sorted(kwargs.items())), "source": kind}
    if kind == "cuda":  # nvrtc_options are in kwargs; NVRTC's build is not in toolchain_identity
        from ..toolchain import nvrtc

        options["nvrtc"] = nvrtc.key_identity()
    key = make_key("external", source, options, targets)
    return key, lambda: external(*args, targets=targets, **{kind: value}, **kwargs)
