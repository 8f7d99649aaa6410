"""Review 10: a key record without a ``kind`` part crashed ``kernelpack cache ls`` and, with
``explain_misses``, every compile miss (KeyError: 'kind').

A record is believed when its parts reproduce its digest, and anyone who can write to the
cache directory can compute such a record for arbitrary parts; ``ls`` and the miss explanation
then read ``part("kind")``, which every key ``make_key`` makes has but a planted one need not.
A record without one is no record now.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache
from kernelpack.cache.keys import CacheKey
from kernelpack.cli import main


@kp.fusion
def _negate(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
    return -x


def _plant(cache: Cache) -> CacheKey:
    key = CacheKey.from_parts([["x", "y"]])  # a digest its parts reproduce, but no kind
    path = cache.disk._parts_path(key.digest)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"digest": key.digest, "parts": [["x", "y"]]}))
    cache.disk.put(key.digest, b"junk")
    return key


def test_ls_lists_an_entry_whose_record_has_no_kind(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    key = _plant(Cache(tmp_path, remote=False))
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert key.digest[:16] in out and "1 entries" in out


def test_an_explained_miss_ignores_a_record_without_kind(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(tmp_path, remote=False, explain_misses=True)
    _plant(cache)
    assert cache.disk.read_parts(CacheKey.from_parts([["x", "y"]]).digest) is None
    with caplog.at_level(logging.INFO, logger="kernelpack.cache"):
        got = kp.compile(_negate, targets=["sm_80"], cache=cache)
    assert got.origin == "compiled"
    assert "no recorded key of kind 'fusion'" in caplog.text


def test_a_hand_made_key_without_kind_explains_its_miss(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=False)
    key = CacheKey("ab" * 32, (("source", "s"),))
    assert "no recorded key of kind None" in cache.explain_miss(key)


def test_a_remote_record_without_kind_is_no_record(tmp_path: Path) -> None:
    """The remote's records are believed on the same terms as the disk's: an empty part list
    reproduces its digest too, and ``explain`` of it failed on ``max()`` of no labels."""
    empty = CacheKey.from_parts([])

    class Records:
        def get(self, key: str) -> None:
            return None

        def put(self, key: str, data: bytes) -> None:
            raise AssertionError("nothing is written")

        def get_parts(self, key: str) -> bytes:
            return json.dumps({"parts": []}).encode()

    cache = Cache(tmp_path, remote=Records(), require_signed_remote=False)
    assert cache.key_record(empty.digest) is None
    assert "(no record of its parts)" in cache.explain(empty.digest)
