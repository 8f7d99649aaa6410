"""Review 12: a remote host name that does not resolve, or resolves slowly, is bounded by
``timeout_s``.

A socket timeout does not bound ``getaddrinfo``: with a hung DNS resolver,
``socket.create_connection`` blocked for resolver timeouts x retries, and every compile of a
process whose remote is ``redis://cache.internal`` stalled far beyond ``timeout_s``. The
lookup now runs in one daemon thread per host that the caller waits for only ``timeout_s``;
IP literals and ``localhost`` never reach the resolver. The resolver is replaced here by one
that hangs (``socket.getaddrinfo``, as resp.py and redis-py call it), released at teardown.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from typing import Any, Iterator

import pytest

from kernelpack.cache import resp
from kernelpack.cache.resp import HostLookupError, HostLookupTimeout, RespClient, connect_tcp

from .conftest import free_port

HANG_S = 5.0
LOOSE_S = 2.0  # a loaded 2-core box: far above timeout_s, far below the hang


class HungResolver:
    """``socket.getaddrinfo`` that blocks (up to HANG_S, or until released), then fails."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> list:
        self.calls.append(str(host))
        self.release.wait(HANG_S)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


def _lookup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kernelpack-resolve-")]


@pytest.fixture()
def hung_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungResolver]:
    fake = HungResolver()
    monkeypatch.setattr(resp.socket, "getaddrinfo", fake)
    try:
        yield fake
    finally:  # let the lookup threads finish, so no test inherits an in-flight lookup
        fake.release.set()
        for thread in _lookup_threads():
            thread.join(HANG_S)


def _open_fds() -> int:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to count open sockets")
    return len(os.listdir("/proc/self/fd"))


def test_hung_resolver_is_bounded_by_timeout_s(hung_resolver: HungResolver) -> None:
    client = RespClient("redis://slow-a.invalid:6379/0", timeout_s=0.3)
    fds = _open_fds()
    for _ in range(2):  # the second call waits on the same lookup: no second thread
        start = time.monotonic()
        with pytest.raises(OSError) as info:
            client.ping()
        assert time.monotonic() - start < LOOSE_S  # was HANG_S (the resolver's own timeout)
        assert isinstance(info.value, HostLookupTimeout)
        assert isinstance(info.value, TimeoutError)
        assert "'slow-a.invalid'" in str(info.value) and "0.3 s" in str(info.value)
    assert hung_resolver.calls == ["slow-a.invalid"]
    assert len(_lookup_threads()) == 1
    assert _open_fds() == fds  # no socket left behind by a failed connect
    client.close()


def test_resolver_error_names_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(*args: Any, **kwargs: Any) -> list:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(resp.socket, "getaddrinfo", no_such_name)
    start = time.monotonic()
    with pytest.raises(HostLookupError) as info:
        RespClient("redis://nx-d.invalid:6379/0", timeout_s=0.3).ping()
    assert time.monotonic() - start < LOOSE_S
    assert isinstance(info.value, OSError) and not isinstance(info.value, TimeoutError)
    assert "'nx-d.invalid'" in str(info.value) and "Name or service not known" in str(info.value)
    assert isinstance(info.value.__cause__, socket.gaierror)


def test_cache_falls_back_and_backs_off(tmp_path, hung_resolver: HungResolver,
                                        monkeypatch: pytest.MonkeyPatch,
                                        axpy_cubin: bytes) -> None:
    """A compile pays the lookup's timeout once, warns with the host, and the remote is then
    skipped: the next key neither connects nor warns."""
    from kernelpack.cache import Cache, CacheWarning, make_key
    from kernelpack.signing import generate_private_key

    from ._cache_kernels import from_cubin

    connects: list[str] = []
    real_connect = resp.connect_tcp
    monkeypatch.setattr(resp, "connect_tcp",
                        lambda host, *a, **k: connects.append(host) or real_connect(host, *a, **k))
    cache = Cache(tmp_path, remote="redis://slow-b.invalid:6379/0",
                  sign_with=generate_private_key(), timeout_s=0.3)
    start = time.monotonic()
    with pytest.warns(CacheWarning, match=r"remote cache read failed \(HostLookupTimeout: "
                                          r"redis host 'slow-b.invalid' did not resolve within "
                                          r"0.3 s") as caught:
        got = cache.fetch_or_compile(make_key(kind="t", source=b"dns-1"),
                                     lambda: from_cubin("axpy", axpy_cubin))
    assert got.origin == "compiled" and time.monotonic() - start < LOOSE_S
    assert "using the local cache and compiler for 30 s" in str(caught[0].message)
    assert cache.stats()["remote_errors"] == 1 and connects == ["slow-b.invalid"]

    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # within the back-off: not a word
        got = cache.fetch_or_compile(make_key(kind="t", source=b"dns-2"),
                                     lambda: from_cubin("axpy", axpy_cubin))
    assert got.origin == "compiled"
    assert cache.stats()["remote_errors"] == 1 and cache.stats()["compiles"] == 2
    assert connects == ["slow-b.invalid"] and hung_resolver.calls == ["slow-b.invalid"]
    cache.close()


def test_literal_ip_and_localhost_need_no_resolver_nor_thread(
        redis_server: Any, hung_resolver: HungResolver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    real_thread = threading.Thread

    class CountingThread(real_thread):  # type: ignore[misc,valid-type]
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(resp.threading, "Thread", CountingThread)
    for host in ("127.0.0.1", "localhost"):
        client = RespClient(f"redis://{host}:{redis_server.port}/0", timeout_s=0.3)
        start = time.monotonic()
        assert client.set("review12:k", b"v") and client.get("review12:k") == b"v"
        assert time.monotonic() - start < LOOSE_S
        client.close()
    assert started == [] and hung_resolver.calls == []


def test_addresses_are_tried_in_order_and_failures_close_their_socket(
        redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first address refuses, the second is the server: connected, with nothing left
    open by the refused attempt; every address refusing raises the last error."""
    closed = free_port()
    rows = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))
            for port in (closed, redis_server.port)]
    monkeypatch.setattr(resp.socket, "getaddrinfo", lambda *a, **k: list(rows))
    fds = _open_fds()
    sock = connect_tcp("two-addresses.test", 6379, 0.5)
    assert sock.getpeername()[1] == redis_server.port
    sock.close()
    assert _open_fds() == fds
    del rows[1]
    with pytest.raises(ConnectionRefusedError):
        connect_tcp("one-address.test", 6379, 0.5)
    assert _open_fds() == fds


def test_redis_package_client_is_bounded_too(tmp_path, redis_server: Any,
                                             hung_resolver: HungResolver,
                                             axpy_cubin: bytes) -> None:
    """``rediss://`` (TLS) goes through the redis package; its connect uses the same bounded
    lookup, and its plain-TCP class still talks to a real server. (``redis_server`` comes
    before ``hung_resolver``: its start-up check asks the resolver, even for 127.0.0.1.)"""
    from kernelpack.cache import Cache, CacheWarning, make_key
    from kernelpack.cache.remote import RedisStore
    from kernelpack.signing import generate_private_key

    from ._cache_kernels import from_cubin

    cache = Cache(tmp_path, remote="rediss://slow-e.invalid:6380/0",
                  sign_with=generate_private_key(), timeout_s=0.3)
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="remote cache read failed"):
        got = cache.fetch_or_compile(make_key(kind="t", source=b"dns-tls"),
                                     lambda: from_cubin("axpy", axpy_cubin))
    assert got.origin == "compiled" and time.monotonic() - start < LOOSE_S
    assert hung_resolver.calls == ["slow-e.invalid"]
    cache.close()

    store = RedisStore(redis_server.url, timeout_s=0.5, client="redis-py")
    assert store.put("ab" * 32, b"entry") and store.get("ab" * 32) == b"entry"
    assert hung_resolver.calls == ["slow-e.invalid"]  # the literal never asked the resolver
    store.close()
