"""Regressions from an adversarial review of the cache (issue 5): constructor validation, a
bare trusted key, ``stats()["evictions"]``, ``Cache.get``/``put``, and ``cache prune`` on a
directory that does not exist."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning
from kernelpack.cli import main

from .conftest import RedisServer, from_cubin
from .worker import key_for


@pytest.mark.parametrize("kwargs, error, match", [
    ({"path": 123}, TypeError, "path must be a directory path"),
    ({"path": b"/tmp"}, TypeError, "path must be a directory path"),
    ({"max_bytes": -1}, ValueError, "max_bytes must be a positive"),
    ({"max_bytes": 0}, ValueError, "max_bytes must be a positive"),
    ({"max_bytes": 1.5}, TypeError, "max_bytes must be an int"),
    ({"max_bytes": "10"}, TypeError, "max_bytes must be an int"),
    ({"max_bytes": True}, TypeError, "max_bytes must be an int"),
    ({"trusted_keys": 5}, TypeError, "trusted_keys must be a list"),
    ({"sign_with": 5}, TypeError, "^sign_with: "),
    ({"sign_with": "/nonexistent/key"}, ValueError, "^sign_with: cannot read key file"),
    ({"remote": "redis://127.0.0.1:1/0", "trusted_keys": ["abc"]}, ValueError,
     "^trusted_keys: "),
])
def test_bad_constructor_arguments_name_the_parameter(tmp_path: Path, kwargs: dict,
                                                      error: type, match: str) -> None:
    kwargs = {"path": tmp_path, "remote": False, **kwargs}
    with pytest.raises(error, match=match):
        Cache(**kwargs)


def test_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="is not a directory"):
        Cache(blocker, remote=False)


def test_bare_trusted_key_is_one_key(tmp_path: Path, signing_keys: tuple[Path, Path],
                                     redis_server: RedisServer, axpy_cubin: bytes) -> None:
    """Like kp.load: a single key path is one key, not a list of its characters."""
    private, public = signing_keys
    writer = Cache(tmp_path / "a", remote=redis_server.url, sign_with=str(private))
    writer.fetch_or_compile(key_for(1), lambda: from_cubin("k1", axpy_cubin))
    reader = Cache(tmp_path / "b", remote=redis_server.url, trusted_keys=str(public))
    assert reader.trusted_keys == [bytes.fromhex(Path(public).read_text().strip())]
    hit = reader.fetch_or_compile(key_for(1), lambda: pytest.fail("compiled"))
    assert hit.origin == "remote"


def test_get_and_put_cover_both_tiers(tmp_path: Path, signing_keys: tuple[Path, Path],
                                      redis_server: RedisServer, axpy_cubin: bytes) -> None:
    private, public = signing_keys
    data = kp.save(from_cubin("k2", axpy_cubin))
    a = Cache(tmp_path / "a", remote=redis_server.url, sign_with=str(private))
    assert a.get(key_for(2)) is None
    a.put(key_for(2), data)
    # stored signed with sign_with, as the cache signs what it compiles (remote readers take
    # an artifact only with a trusted signature of its own): the same program and images
    stored = a.get(key_for(2))
    assert stored != data and a.stats()["disk_hits"] == 1
    assert kp.load(stored, trusted_keys=[str(public)]).compiled("k2") == \
        kp.load(data).compiled("k2")
    b = Cache(tmp_path / "b", remote=redis_server.url, trusted_keys=[str(public)])
    assert b.get(key_for(2)) == stored and b.stats()["remote_hits"] == 1
    a.put(key_for(2), stored)  # signed by sign_with already: kept byte for byte
    assert a.get(key_for(2)) == stored
    assert b.fetch_or_compile(key_for(2), lambda: pytest.fail("compiled")).origin == "disk"
    with pytest.raises(TypeError, match="data must be artifact bytes"):
        a.put(key_for(3), "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data is not a single-program kernelpack artifact"):
        a.put(key_for(3), b"garbage")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        a.get("not-a-key")


def test_put_reads_the_artifact_once_when_it_re_signs(tmp_path: Path,
                                                     signing_keys: tuple[Path, Path],
                                                     axpy_cubin: bytes,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``put`` verifies the data and re-signs the pack it verified: one ``kp.load`` of it, not
    a second one for ``resign`` (session 38). The stored entry is the re-signed artifact."""
    import kernelpack.loader as loader

    private, public = signing_keys
    data = kp.save(from_cubin("k5", axpy_cubin))
    cache = Cache(tmp_path, remote=False, sign_with=str(private))
    loads: list[int] = []
    real = loader.load

    def counted(*args, **kwargs):
        loads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "load", counted)
    cache.put(key_for(5), data)
    assert len(loads) == 1
    monkeypatch.undo()
    stored = cache.get(key_for(5))
    assert stored != data
    assert kp.load(stored, trusted_keys=[str(public)]).signature is not None
    assert kp.load(stored).compiled("k5") == kp.load(data).compiled("k5")


def test_get_quarantines_a_corrupt_entry(tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    cache.put(key_for(4), kp.save(from_cubin("k4", axpy_cubin)))
    path = cache.disk.path(key_for(4))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(CacheWarning, match="invalid"):
        assert cache.get(key_for(4)) is None
    assert cache.stats()["quarantined"] == 1 and not path.exists()


def test_stats_count_evictions(tmp_path: Path, axpy_cubin: bytes) -> None:
    size = len(kp.save(from_cubin("k0", axpy_cubin)))
    cache = Cache(tmp_path, remote=False, max_bytes=int(size * 2.5))
    for i in range(5):
        cache.fetch_or_compile(key_for(i), lambda i=i: from_cubin(f"k{i}", axpy_cubin))
    stats = cache.stats()
    assert stats["compiles"] == 5 and stats["evictions"] == 5 - len(cache.disk.entries()) > 0
    assert set(stats) == set(kp.cache.STAT_NAMES)


def test_prune_of_a_missing_directory_creates_nothing(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nowhere"
    assert main(["cache", "prune", "--dir", str(missing)]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert not missing.exists()


def test_cli_on_a_file_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for action in ("ls", "stats", "prune", "clear"):
        assert main(["cache", action, "--dir", str(blocker)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "not a directory" in err and "Traceback" not in err


def test_no_warning_for_a_plain_disk_cache(tmp_path: Path, axpy_cubin: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = Cache(tmp_path, remote=False)
        cache.fetch_or_compile(key_for(6), lambda: from_cubin("k6", axpy_cubin))
        assert cache.fetch_or_compile(key_for(6), lambda: pytest.fail("x")).origin == "disk"


def test_close_and_context_manager_release_the_remote_connection(
        tmp_path: Path, signing_keys: tuple[Path, Path], redis_server: RedisServer) -> None:
    """A Cache with a Redis remote closes its socket on close() / leaving a with-block, and a
    dropped client leaves no open socket behind (no ResourceWarning)."""
    import gc

    private, _ = signing_keys
    with Cache(tmp_path / "c", remote=redis_server.url, sign_with=str(private)) as cache:
        assert cache.remote.get("0" * 64) is None          # connects
        client = cache.remote._client
        assert client._sock is not None
    assert cache.remote._client is None and client._sock is None  # closed on exit
    assert cache.remote.get("0" * 64) is None                # and usable again
    sock = cache.remote._client._sock
    assert sock.fileno() >= 0
    del cache, client
    gc.collect()
    assert sock.fileno() == -1  # the dropped client closed its socket
