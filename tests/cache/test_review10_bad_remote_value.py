"""Review 10: one oversized value, or a value of another type, planted under a remote entry
key is that entry's problem, not an outage of the whole remote.

The RESP client refuses a bulk reply larger than ``max_entry_bytes`` (plus the envelope
header) before reading it, which is right (a hostile value must not exhaust memory); but the
refusal surfaced as a remote *failure*, so the cache backed off the remote for
``REMOTE_BACKOFF_S`` and every other key, good entries included, was compiled locally. Anyone
who can write one key could switch the fleet's cache off, again after every back-off.
A hash (or list, set...) at an entry key did the same through Redis' ``WRONGTYPE`` error
reply. Now the entry is refused and counted (as any entry the cache will not use), and the
remote stays in use; a redis-py client's oversized value is refused the same way.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.remote import RedisStore, wrap_entry

BAD = "ab" * 32
GOOD = "cd" * 32


def _fleet(tmp_path: Path, redis_server, axpy_cubin: bytes, client: str,  # type: ignore[no-untyped-def]
           bad: str = "large") -> Cache:
    pytest.importorskip("cryptography")
    from kernelpack.signing import generate_private_key

    from .conftest import from_cubin

    private = generate_private_key()
    artifact = kp.save(from_cubin("good", axpy_cubin), sign_with=private)  # as Cache writes
    limit = len(artifact) + 1024
    raw = redis_server.client()
    raw.set(f"kernelpack:1:entry:{GOOD}", wrap_entry(GOOD, artifact, private))
    if bad == "large":
        raw.set(f"kernelpack:1:entry:{BAD}", b"\0" * (limit + 4096))
    else:
        raw.hset(f"kernelpack:1:entry:{BAD}", "field", "value")
    store = RedisStore(redis_server.url, max_entry_bytes=limit, client=client)
    return Cache(tmp_path / "disk", remote=store, sign_with=private)


@pytest.mark.parametrize("bad", ["large", "hash"])
@pytest.mark.parametrize("client", ["resp", "redis-py"])
def test_a_bad_value_is_refused_and_the_remote_stays_in_use(
        tmp_path: Path, redis_server, axpy_cubin: bytes, client: str, bad: str) -> None:  # type: ignore[no-untyped-def]
    cache = _fleet(tmp_path, redis_server, axpy_cubin, client, bad)
    with pytest.warns(CacheWarning, match="refused") as record:
        assert cache.load(BAD) is None
    assert not any("using the local cache" in str(w.message) for w in record)
    stats = cache.stats()
    assert (stats["refused"], stats["remote_errors"]) == (1, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        hit = cache.load(GOOD)  # not skipped by a back-off
    assert hit is not None and hit.origin == "remote" and hit.name == "good"
    cache.close()


@pytest.mark.parametrize("bad", ["large", "hash"])
def test_an_unsigned_writer_replaces_a_bad_value(
        tmp_path: Path, redis_server, axpy_cubin: bytes, bad: str) -> None:  # type: ignore[no-untyped-def]
    """A put without ``sign_with`` looks at the existing value first (never replace a signed
    entry); a bad one is not signed, so it is overwritten, not a write failure."""
    from .conftest import from_cubin

    cache = _fleet(tmp_path, redis_server, axpy_cubin, "resp", bad)
    unsigned = Cache(tmp_path / "other", remote=cache.remote, require_signed_remote=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        unsigned.put(BAD, kp.save(from_cubin("good", axpy_cubin)))
    assert unsigned.stats()["remote_puts"] == 1
    assert unsigned.stats()["remote_errors"] == 0
    assert redis_server.client().get(f"kernelpack:1:entry:{BAD}").startswith(b"KPCE")
    cache.close()
