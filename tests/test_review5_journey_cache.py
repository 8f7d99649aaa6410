"""Journey review 5 (fleet warm start): found by an outside user's end-to-end script.

A process of the fleet that cannot sign (no ``sign_with``) or signs with a key the fleet does
not trust compiles locally (fine) but then *overwrites* the fleet's trusted remote entry with
its own unsigned/untrusted one. Every correctly configured machine after it refuses the entry
and recompiles: one misconfigured node turns the warm start off for the whole fleet.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.signing import generate_private_key, public_key_bytes

pytest.importorskip("llvmlite")


class MemoryStore:
    """A remote with ``get``/``put`` in a dict (what ``kp.Cache(remote=...)`` accepts)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def get(self, digest: str) -> bytes | None:
        return self.entries.get(digest)

    def put(self, digest: str, data: bytes) -> bool:
        self.entries[digest] = data
        return True


@kp.fusion
def _double(x: kp.Tensor[kp.f32, "n"]):
    return x * 2.0


# Only the unsigned writer: a node signing with another key replaces the entry (the last
# signer wins, as a trusted signer replaces a stranger's entry: tests/cache/test_remote.py).
@pytest.mark.parametrize("intruder", ["unsigned"])
def test_untrusted_writer_does_not_evict_the_fleets_signed_entry(tmp_path: Path,
                                                                  intruder: str) -> None:
    team = generate_private_key()
    store = MemoryStore()
    first = kp.Cache(tmp_path / "a", remote=store, sign_with=team)
    assert kp.compile(_double, targets=["sm_80"], cache=first).origin == "compiled"

    with warnings.catch_warnings():  # "written but never read" / "entry refused": expected
        warnings.simplefilter("ignore", kp.cache.CacheWarning)
        if intruder == "unsigned":
            other = kp.Cache(tmp_path / "b", remote=store)
        else:
            other = kp.Cache(tmp_path / "b", remote=store, sign_with=generate_private_key())
        kp.compile(_double, targets=["sm_80"], cache=other)

    fleet = kp.Cache(tmp_path / "c", remote=store, trusted_keys=[public_key_bytes(team)])
    assert kp.compile(_double, targets=["sm_80"], cache=fleet).origin == "remote"
