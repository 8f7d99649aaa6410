"""The Redis tier against a real redis-server: sharing, faults, hostile entries, races."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.remote import RedisStore, unwrap_entry, wrap_entry
from kernelpack.signing import generate_private_key

from .conftest import RedisServer, finish_workers, from_cubin, spawn_worker
from .worker import key_for

pytestmark = pytest.mark.redis


def _cache(tmp: Path, server: RedisServer, keys: tuple[Path, Path], **kw: object) -> Cache:
    private, public = keys
    return Cache(tmp, remote=server.url, sign_with=str(private), trusted_keys=[str(public)],
                 **kw)  # type: ignore[arg-type]


def test_second_process_never_compiles(tmp_path: Path, redis_server: RedisServer,
                                       cubin_file: Path, signing_keys: tuple[Path, Path]) -> None:
    """Two processes, two machines' worth of disk, one Redis: the second loads everything."""
    marker = tmp_path / "compiles.log"
    outs = []
    for n, disk in enumerate(("disk-a", "disk-b")):
        proc = spawn_worker("race", str(tmp_path / disk), redis_server.url, str(marker),
                            str(cubin_file), "10", str(n), str(signing_keys[0]))
        [(code, out, err)] = finish_workers([proc])
        assert code == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[0]["origins"] == {"compiled": 10}
    assert outs[1]["origins"] == {"remote": 10} and outs[1]["stats"]["compiles"] == 0
    assert len(marker.read_text().split()) == 10
    assert outs[1]["stats"]["refused"] == 0 and not outs[1]["warnings"]


def test_disk_first_then_remote_then_put_through(tmp_path: Path, redis_server: RedisServer,
                                                 axpy_cubin: bytes,
                                                 signing_keys: tuple[Path, Path]) -> None:
    a = _cache(tmp_path / "a", redis_server, signing_keys)
    b = _cache(tmp_path / "b", redis_server, signing_keys)
    key = key_for(1)
    assert a.fetch_or_compile(key, lambda: from_cubin("k1", axpy_cubin)).origin == "compiled"
    assert b.fetch_or_compile(key, lambda: pytest.fail("compiled")).origin == "remote"
    assert b.fetch_or_compile(key, lambda: pytest.fail("compiled")).origin == "disk"
    ttl = redis_server.client().ttl(f"kernelpack:1:entry:{key.digest}")
    assert 0 < ttl <= 7 * 86400
    # The remote also explains the key to a machine that never compiled it.
    c = _cache(tmp_path / "c", redis_server, signing_keys)
    assert key.part("source") in c.explain(key.digest)


def test_redis_down_from_the_start_is_a_warning(tmp_path: Path, axpy_cubin: bytes,
                                                signing_keys: tuple[Path, Path],
                                                redis_server: RedisServer) -> None:
    redis_server.kill()
    cache = _cache(tmp_path, redis_server, signing_keys, timeout_s=0.2)
    with pytest.warns(CacheWarning, match="remote cache"):
        c = cache.fetch_or_compile(key_for(2), lambda: from_cubin("k2", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["remote_errors"] >= 1
    start = time.monotonic()  # the remote is now skipped for a while: no timeout per key
    for i in range(3, 8):
        cache.fetch_or_compile(key_for(i), lambda i=i: from_cubin(f"k{i}", axpy_cubin))
    assert time.monotonic() - start < 1.0


def test_redis_killed_mid_run(tmp_path: Path, redis_server: RedisServer, axpy_cubin: bytes,
                              signing_keys: tuple[Path, Path]) -> None:
    # A dead server refuses at once, so no timeout is waited for; a generous one keeps the
    # first four puts from timing out on a loaded CI machine (remote_puts would then be < 4).
    cache = _cache(tmp_path, redis_server, signing_keys, timeout_s=5.0)
    origins = []
    with pytest.warns(CacheWarning):
        for i in range(10):
            if i == 4:
                redis_server.kill()
            origins.append(cache.fetch_or_compile(
                key_for(i), lambda i=i: from_cubin(f"k{i}", axpy_cubin)).origin)
    assert origins == ["compiled"] * 10
    assert cache.stats()["remote_puts"] == 4 and cache.stats()["remote_errors"] >= 1
    # Disk still serves everything, Redis or not.
    assert {cache.fetch_or_compile(key_for(i), lambda: pytest.fail("x")).origin
            for i in range(10)} == {"disk"}


@pytest.mark.parametrize("kind", ["garbage", "unsigned", "untrusted", "replayed", "tampered",
                                  "truncated"])
def test_hostile_entries_are_refused_and_counted(tmp_path: Path, redis_server: RedisServer,
                                                 axpy_cubin: bytes,
                                                 signing_keys: tuple[Path, Path],
                                                 kind: str) -> None:
    key, other = key_for(10), key_for(11)
    artifact = kp.save(from_cubin("k10", axpy_cubin), sign_with=str(signing_keys[0]))
    if kind == "garbage":
        value = b"\x00garbage" * 100
    elif kind == "unsigned":
        value = wrap_entry(key.digest, kp.save(from_cubin("k10", axpy_cubin)), None)
    elif kind == "untrusted":
        stranger = generate_private_key()
        value = wrap_entry(key.digest, kp.save(from_cubin("k10", axpy_cubin), sign_with=stranger),
                           stranger)
    elif kind == "replayed":  # a trusted entry for another key, copied under this one
        value = redis_server.client().get(f"kernelpack:1:entry:{other.digest}") or \
            wrap_entry(other.digest, artifact, str(signing_keys[0]))
        value = value[:5] + bytes.fromhex(key.digest) + value[37:]
    elif kind == "tampered":
        value = bytearray(wrap_entry(key.digest, artifact, str(signing_keys[0])))
        value[-50] ^= 1
        value = bytes(value)
    else:
        value = wrap_entry(key.digest, artifact, str(signing_keys[0]))[:120]
    redis_server.client().set(f"kernelpack:1:entry:{key.digest}", value)
    cache = _cache(tmp_path, redis_server, signing_keys)
    with pytest.warns(CacheWarning, match="refused"):
        c = cache.fetch_or_compile(key, lambda: from_cubin("k10", axpy_cubin))
    assert c.origin == "compiled"
    assert cache.stats()["refused"] == 1 and cache.stats()["remote_hits"] == 0
    # The put-through replaced the bad entry with a good one.
    fresh = _cache(tmp_path / "fresh", redis_server, signing_keys)
    assert fresh.fetch_or_compile(key, lambda: pytest.fail("x")).origin == "remote"


def test_unsigned_remote_is_not_read_without_trust(tmp_path: Path, redis_server: RedisServer,
                                                   axpy_cubin: bytes) -> None:
    with pytest.warns(CacheWarning, match="never read"):
        writer = Cache(tmp_path / "a", remote=redis_server.url)
    writer.fetch_or_compile(key_for(12), lambda: from_cubin("k12", axpy_cubin))
    with pytest.warns(CacheWarning):
        reader = Cache(tmp_path / "b", remote=redis_server.url)
    assert reader.fetch_or_compile(key_for(12), lambda: from_cubin("k12", axpy_cubin)).origin \
        == "compiled"
    # Opting out of signatures reads it (an explicit, documented choice).
    lax = Cache(tmp_path / "c", remote=redis_server.url, require_signed_remote=False)
    assert lax.fetch_or_compile(key_for(12), lambda: pytest.fail("x")).origin == "remote"


def test_entry_size_limit(tmp_path: Path, redis_server: RedisServer, axpy_cubin: bytes,
                          signing_keys: tuple[Path, Path]) -> None:
    cache = _cache(tmp_path, redis_server, signing_keys, max_entry_bytes=100)
    cache.fetch_or_compile(key_for(13), lambda: from_cubin("k13", axpy_cubin))
    assert cache.stats()["remote_too_large"] == 1 and cache.stats()["remote_puts"] == 0
    assert redis_server.client().get(f"kernelpack:1:entry:{key_for(13).digest}") is None


def test_waits_for_the_fleet_lock_holder(tmp_path: Path, redis_server: RedisServer,
                                         axpy_cubin: bytes,
                                         signing_keys: tuple[Path, Path]) -> None:
    """Another machine holds the lock: we poll, and load its entry when it lands."""
    key = key_for(14)
    store = RedisStore(redis_server.url)
    token = store.try_lock(key, 10_000)
    assert token is not None
    other = _cache(tmp_path / "other", redis_server, signing_keys)

    import threading

    def finish_elsewhere() -> None:
        time.sleep(0.3)
        other.store(key, from_cubin("k14", axpy_cubin))
        store.unlock(key, token)

    t = threading.Thread(target=finish_elsewhere)
    t.start()
    cache = _cache(tmp_path / "me", redis_server, signing_keys)
    c = cache.fetch_or_compile(key, lambda: pytest.fail("compiled while another held the lock"))
    t.join()
    assert c.origin == "remote" and cache.stats()["remote_waits"] == 1


def test_lock_holder_vanishing_lets_us_compile(tmp_path: Path, redis_server: RedisServer,
                                               axpy_cubin: bytes,
                                               signing_keys: tuple[Path, Path]) -> None:
    key = key_for(15)
    assert RedisStore(redis_server.url).try_lock(key, 300) is not None  # expires in 0.3 s
    cache = _cache(tmp_path, redis_server, signing_keys)
    start = time.monotonic()
    assert cache.fetch_or_compile(key, lambda: from_cubin("k15", axpy_cubin)).origin == "compiled"
    assert time.monotonic() - start < 5


def test_eight_processes_twenty_keys_shared_redis(tmp_path: Path, redis_server: RedisServer,
                                                  cubin_file: Path,
                                                  signing_keys: tuple[Path, Path]) -> None:
    """Eight 'machines' (separate disk caches) race for 20 missing keys through one Redis."""
    marker = tmp_path / "compiles.log"
    procs = [spawn_worker("race", str(tmp_path / f"disk{seed}"), redis_server.url, str(marker),
                          str(cubin_file), "20", str(seed), str(signing_keys[0]))
             for seed in range(8)]
    results = []
    for code, out, err in finish_workers(procs):
        assert code == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    compiles = Counter(marker.read_text().split())
    assert len(compiles) == 20 and set(compiles.values()) == {1}, compiles
    assert all(r["stats"]["errors"] == 0 and r["stats"]["refused"] == 0 and
               r["stats"]["remote_errors"] == 0 for r in results)
    assert sum(r["origins"].get("remote", 0) for r in results) == 8 * 20 - 20
    for digest in compiles:  # every remote entry is whole and verifies
        raw = redis_server.client().get(f"kernelpack:1:entry:{digest}")
        artifact = unwrap_entry(digest, raw, [signing_keys[1].read_text().strip()])
        assert len(kp.load(artifact).programs) == 1


def test_hung_redis_times_out_and_compiles(tmp_path: Path, redis_server: RedisServer,
                                           axpy_cubin: bytes,
                                           signing_keys: tuple[Path, Path]) -> None:
    """A Redis that accepts connections but never answers (SIGSTOP): socket timeouts, one
    warning, a local compile, and no timeout paid per key afterwards."""
    import os
    import signal

    assert redis_server.proc is not None
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        cache = _cache(tmp_path, redis_server, signing_keys, timeout_s=0.3)
        start = time.monotonic()
        with pytest.warns(CacheWarning, match="remote cache"):
            for i in range(5):
                c = cache.fetch_or_compile(key_for(20 + i),
                                           lambda i=i: from_cubin(f"k{i}", axpy_cubin))
                assert c.origin == "compiled"
        assert time.monotonic() - start < 3.0
        assert cache.stats()["remote_errors"] == 1
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)


def test_server_speaking_garbage(tmp_path: Path, axpy_cubin: bytes,
                                 signing_keys: tuple[Path, Path]) -> None:
    """Something that is not Redis answers on the port: a warning and a local compile."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"\x00\xffHTTP/1.1 400 garbage\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        private, public = signing_keys
        cache = Cache(tmp_path, remote=f"redis://127.0.0.1:{port}/0", sign_with=str(private),
                      trusted_keys=[str(public)], timeout_s=0.5)
        with pytest.warns(CacheWarning, match="remote cache"):
            c = cache.fetch_or_compile(key_for(30), lambda: from_cubin("k30", axpy_cubin))
        assert c.origin == "compiled" and cache.stats()["remote_errors"] == 1
    finally:
        server.close()


def test_waiter_does_not_wait_for_an_entry_it_refuses(tmp_path: Path, redis_server: RedisServer,
                                                      axpy_cubin: bytes,
                                                      signing_keys: tuple[Path, Path]) -> None:
    """The lock holder (another fleet, another key) puts an entry we do not trust: we compile
    at once instead of polling until wait_s."""
    import threading

    key = key_for(31)
    store = RedisStore(redis_server.url)
    assert store.try_lock(key, 20_000) is not None  # held, never released
    stranger = generate_private_key()

    def put_untrusted() -> None:
        time.sleep(0.2)
        artifact = kp.save(from_cubin("k31", axpy_cubin), sign_with=stranger)
        store.put(key, wrap_entry(key.digest, artifact, stranger))

    t = threading.Thread(target=put_untrusted)
    t.start()
    cache = _cache(tmp_path, redis_server, signing_keys, wait_s=20.0)
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="refused"):
        c = cache.fetch_or_compile(key, lambda: from_cubin("k31", axpy_cubin))
    t.join()
    assert c.origin == "compiled" and time.monotonic() - start < 5
    assert cache.stats()["refused"] == 1 and cache.stats()["remote_waits"] == 1


def test_oversized_remote_entry_is_not_downloaded(tmp_path: Path, redis_server: RedisServer,
                                                  axpy_cubin: bytes,
                                                  signing_keys: tuple[Path, Path]) -> None:
    key = key_for(32)
    redis_server.client().set(f"kernelpack:1:entry:{key.digest}", bytes(200_000))
    cache = _cache(tmp_path, redis_server, signing_keys, max_entry_bytes=100_000)
    with pytest.warns(CacheWarning, match="exceeds the limit"):
        c = cache.fetch_or_compile(key, lambda: from_cubin("k32", axpy_cubin))
    assert c.origin == "compiled" and cache.stats()["remote_hits"] == 0


def test_unwrap_entry_never_crashes_on_random_bytes(signing_keys: tuple[Path, Path]) -> None:
    """Whatever Redis returns, unwrap_entry raises CacheError or SignatureError, nothing else."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kernelpack.errors import CacheError, SignatureError

    digest = key_for(50).digest
    good = wrap_entry(digest, b"artifact", str(signing_keys[0]))
    trusted = [signing_keys[1].read_text().strip()]

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.binary(max_size=300),
                     st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)).map(
                         lambda t: good[:t[0]] + bytes([good[t[0]] ^ t[1]]) + good[t[0] + 1:])))
    def check(data: bytes) -> None:
        try:
            unwrap_entry(digest, data, trusted)
        except (CacheError, SignatureError):
            return
        assert data == good

    check()
    assert unwrap_entry(digest, good, trusted) == b"artifact"


def test_cli_explain_asks_the_remote(tmp_path: Path, redis_server: RedisServer,
                                     axpy_cubin: bytes, signing_keys: tuple[Path, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from kernelpack.cli import main

    key = key_for(51)
    _cache(tmp_path / "a", redis_server, signing_keys).fetch_or_compile(
        key, lambda: from_cubin("k51", axpy_cubin))
    assert main(["cache", "explain", key.digest, "--dir", str(tmp_path / "b"),
                 "--remote", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert key.part("source") in out and "on disk: no" in out


def test_resp_client_survives_fork(redis_server: RedisServer) -> None:
    import os

    from kernelpack.cache.resp import RespClient

    client = RespClient(redis_server.url)
    assert client.ping()
    pid = os.fork()
    if pid == 0:  # the child must open its own connection, not share the parent's socket
        ok = False
        try:
            ok = client.set("forked", b"child") and client.get("forked") == b"child"
        except BaseException:
            pass
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert client.ping() and client.get("forked") == b"child"
