"""Explaining keys and misses: which inputs a key was made of, and why a lookup missed.

Pain point 6 of the survey (an identical machine missed a 3.8 GB cache and nobody could see
why): every entry written keeps its key's parts (a small JSON record on disk, and in Redis
beside the entry), and a record is believed only if its parts reproduce the digest.
"""

from __future__ import annotations

import json
from typing import Any

from .disk import DiskStore
from .keys import CacheKey

__all__ = ["key_record", "explain", "explain_miss"]


def key_record(disk: DiskStore, remote: Any, digest: str) -> CacheKey | None:
    """The recorded parts of ``digest``: the disk record, else the remote's, else None."""
    key = disk.read_parts(digest)
    if key is None and remote is not None and hasattr(remote, "get_parts"):
        try:
            raw = remote.get_parts(digest)
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
    return text + f"\n  on disk: {'yes' if path.exists() else 'no'} ({path})"


def explain_miss(disk: DiskStore, key: CacheKey) -> str:
    """The parts that differ between ``key`` and the nearest recorded key of the same kind
    (the fewest differing parts), e.g. ``options: 'd1{...i256}' -> 'd1{...i128}'``."""
    best: tuple[int, CacheKey] | None = None
    kind = dict(key.parts).get("kind")  # a hand-made CacheKey may lack one: none compares
    for other in disk.recorded_keys():
        if other.digest == key.digest or dict(other.parts).get("kind") != kind:
            continue
        n = len(key.diff(other))
        if best is None or n < best[0]:
            best = (n, other)
    if best is None:
        return f"{key.digest[:16]}: no recorded key of kind {kind!r} to compare"
    diffs = "; ".join(f"{label}: {theirs!r} -> {mine!r}"
                      for label, mine, theirs in key.diff(best[1]))
    return f"{key.digest[:16]} differs from {best[1].digest[:16]} in {diffs}"
