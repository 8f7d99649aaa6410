"""Review 3: cache keys given to the API are exactly 64 lowercase hex digits (a trailing
newline passed ``re.match(...$)`` and named a file ``<digest>\\n.kpack``), and a key of the
wrong type is a TypeError, not a ValueError."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelpack.cache import Cache
from kernelpack.cache.disk import DiskStore, check_digest


@pytest.mark.parametrize("bad", ["a" * 64 + "\n", "a" * 64 + "\r\n", "\n" + "a" * 63])
def test_a_digest_with_a_newline_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        check_digest(bad)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        Cache(tmp_path, remote=False).get(bad)


def test_entries_ignores_a_name_with_a_newline(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    shard = tmp_path / "entries" / "aa"
    shard.mkdir(parents=True)
    (shard / ("a" * 64 + "\n.kpack")).write_bytes(b"x")
    assert store.entries() == []


@pytest.mark.parametrize("bad", [123, None, b"a" * 64, ["a" * 64]])
def test_a_key_of_the_wrong_type_is_a_type_error(tmp_path: Path, bad: object) -> None:
    cache = Cache(tmp_path, remote=False)
    with pytest.raises(TypeError, match="cache key must be a CacheKey or a str"):
        cache.get(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cache key must be a CacheKey or a str"):
        cache.fetch_or_compile(bad, lambda: pytest.fail("compiled"))  # type: ignore[arg-type]
