"""Explaining keys and misses: which inputs a key was made of, and why a lookup missed.

Pain point 6 of the survey (an identical machine missed a 3.8 GB cache and nobody could see
why): every entry written keeps its key's parts (a small JSON record on disk, and in Redis
beside the entry), and a record is believed only if its parts reproduce the digest.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .disk import DiskStore
from .keys import CacheKey

__all__ = ["key_record", "explain", "explain_miss"]


def key_record(disk: DiskStore, remote: Any, digest: str,
               unreachable: Callable[[Exception], None]) -> CacheKey | None:
    """The recorded parts of ``digest``: the disk record, else the remote's, else None.
    ``unreachable`` is told when the remote cannot be asked (down, a wrong password): that
    is not "no record" (review 33), and the Cache counts it and backs off (review 35)."""
    key = disk.read_parts(digest)
    if key is None and remote is not None and hasattr(remote, "get_parts"):
        try:
            raw = remote.get_parts(digest)
        except Exception as exc:
            unreachable(exc)
            return None
        try:
            if raw is not None:
                found = CacheKey.from_parts(json.loads(raw)["parts"])
                found.part("kind")  # as on disk (DiskStore.read_parts): none, no record
                key = found if found.digest == digest else None
        except Exception:  # an explanation is best effort; a bad record explains nothing
            key = None
    return key


def explain(disk: DiskStore, digest: str, record: CacheKey | None) -> str:
    """The parts of a key (or a note that none are recorded) and where its entry lives."""
    text = record.explain() if record else f"key {digest}\n  (no record of its parts)"
    path = disk.path(digest)
    try:
        on_disk = "yes" if path.exists() else "no"
    except OSError as exc:  # inside another user's private directory
        on_disk = f"cannot tell ({exc.strerror})"
    return text + f"\n  on disk: {on_disk} ({path})"


def explain_miss(disk: DiskStore, key: CacheKey, program: str | None = None) -> str:
    """The parts that differ between ``key`` and the nearest recorded key of the same kind
    (the fewest differing parts), e.g. ``options: 'd1{...i256}' -> 'd1{...i128}'``. With
    ``program`` (the name of the program the key is for), the nearest among that program's
    own recorded keys: an edited fusion's key differs from every other key in ``source``
    alone, and the one that explains the miss is its own previous key."""
    kind = dict(key.parts).get("kind")  # a hand-made CacheKey may lack one: none compares
    own: tuple[int, CacheKey] | None = None
    best: tuple[int, CacheKey, str | None] | None = None
    for other, recorded_for in disk.recorded():
        if other.digest == key.digest or dict(other.parts).get("kind") != kind:
            continue
        n = len(key.diff(other))
        if program is not None and recorded_for == program and (own is None or n < own[0]):
            own = (n, other)
        if best is None or n < best[0]:
            best = (n, other, recorded_for)
    what = key.digest[:16] if program is None else f"program {program!r} ({key.digest[:16]})"
    if own is not None:
        return f"{what} differs from its recorded key {own[1].digest[:16]} in " + \
            _differences(key, own[1])
    if best is None:
        return f"{what}: no recorded key of kind {kind!r} to compare"
    nearest = best[1].digest[:16] + ("" if best[2] is None else f" (program {best[2]!r})")
    first = ("" if program is None else
             "no recorded key of this program; nearest: " if best[2] is not None else
             # a record written before records named their program: it may be this one's
             "no key recorded under this program's name (older records name none); nearest: ")
    return f"{what}: {first}differs from {nearest} in {_differences(key, best[1])}"


def _differences(key: CacheKey, other: CacheKey) -> str:
    return "; ".join(f"{label}: {theirs!r} -> {mine!r}"
                     for label, mine, theirs in key.diff(other))
