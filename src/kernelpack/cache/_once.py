"""A bounded memory of what a cache tier has already warned about.

Why: under ``warnings.simplefilter("error")`` a warning given at every lookup of a key raised
before (or after) the work that would settle it, at every call: a refused remote entry, a disk
entry of a revoked signer and an entry over the disk cap each blocked their key for good
(reviews 35 and 36). Each is warned about once per key, recorded before the warning.
"""

from __future__ import annotations

from typing import Hashable

__all__ = ["WarnedOnce"]


class WarnedOnce:
    """``first(what)``: True the first time ``what`` is asked. Bounded: past ``limit`` items
    it forgets them all (at worst a warning is given again)."""

    def __init__(self, limit: int = 4096) -> None:
        self._seen: set[Hashable] = set()
        self._limit = limit

    def first(self, what: Hashable) -> bool:
        if what in self._seen:
            return False
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(what)
        return True
