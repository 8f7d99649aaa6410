"""The verifier's C walker (``_verify.c``, in the runtime's optional extension): loading it,
describing the schema to it, and asking it.

:func:`kernelpack.verify.verify_buffer` asks :func:`root` first; a non-negative answer is the
root table's position of a buffer the Python walker would accept too, anything else sends
the buffer to the Python walker, which stays the reference and words every error. The C side
is not compiled against the schema: it gets verify.py's ``_PLANS`` as numbers (:func:`tables`),
so the two walkers read one description and cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["load", "tables", "root"]

# plan categories (verify.py's) -> the C walker's codes; table names become indexes
CATEGORIES = {"s": 0, "S": 0, "e": 1, "b": 2, "str": 3, "v": 4, "vs": 6, "vt": 7, "t": 8}
BODY = 5  # a "v" field whose data must also be BODY_ALIGNMENT-aligned: Pack.body

#: ``verify_fast`` once loaded, False when the extension is missing or lacks it, None before
walker: Any = None
#: (the plans described, table indexes by name, the description the C side reads)
_desc: Any = (None, {}, ())


def load() -> Any:
    """The C walker, or False: an extension built without ``_verify.c``, or none at all,
    leaves the Python walker alone."""
    global walker
    try:
        from .runtime._launch import verify_fast
    except ImportError:
        walker = False
    else:
        walker = verify_fast
    return walker


def tables(plans: Mapping[str, Any]) -> Any:
    """``plans`` as the C walker reads it: per table, per field (category, size, align, extra,
    limit), with extra the enum count, the vector element size or the table index. Built once
    per plans object (the C side caches its conversion by the description's identity)."""
    global _desc
    if _desc[0] is plans:
        return _desc
    index = {name: i for i, name in enumerate(plans)}
    described = tuple(
        tuple((BODY if (tname, name) == ("Pack", "body") else CATEGORIES[cat], size, align,
               index[extra] if cat in ("t", "vt") else extra if cat in ("e", "v") else 0,
               limit)
              for name, cat, size, align, extra, limit in plan)
        for tname, plan in plans.items())
    _desc = (plans, index, described)
    return _desc


def root(buf: Any, root_type: str, identifier: bytes | None, plans: Mapping[str, Any],
         limits: tuple[int, int, int, int]) -> int:
    """The root table's position when the C walker accepts ``buf``; -1 when it rejects it,
    -2 when it leaves it to the Python walker (a buffer that is not exactly bytes, bytearray
    or a flat unsigned-byte memoryview, an identifier that is not exactly bytes: a subclass's
    own ``__len__``/``__ne__`` is what the Python walker reads; an unknown root type; no C
    walker). ``limits``: table depth, name length, file size, body alignment
    (read by the caller at call time, so a patched limit reaches both walkers)."""
    fast = walker if walker is not None else load()
    if not fast:
        return -2
    _, index, described = tables(plans)
    table = index.get(root_type)
    if table is None:
        return -2
    return fast(buf, table, identifier, described, *limits)  # type: ignore[no-any-return]
