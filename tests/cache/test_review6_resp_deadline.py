"""Review 6: a Redis that trickles its reply must not stretch one command without bound.

A per-``recv`` socket timeout never fires against a server sending one byte every few tenths
of a second, so a cache miss used to hang for hours; ``timeout_s`` now bounds the whole reply
(plus the transfer time of an announced bulk), and the cache falls back to a local compile.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from kernelpack.cache.resp import RespClient


@pytest.fixture()
def trickling_server() -> Iterator[int]:
    """Accepts, reads the command, then sends ``$`` forever, one byte per 50 ms."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(4096)
                    while not stop.is_set():
                        conn.sendall(b"$")
                        time.sleep(0.05)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        srv.close()


def test_trickled_reply_times_out_within_timeout_s(trickling_server: int) -> None:
    client = RespClient(f"redis://127.0.0.1:{trickling_server}/0", timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(OSError):
        client.get("kernelpack:1:entry:" + "0" * 64)
    assert time.monotonic() - start < 2.0  # was unbounded (64 KiB line limit at 20 B/s)
    client.close()


def test_cache_miss_against_trickling_server_compiles_locally(tmp_path, trickling_server: int,
                                                              axpy_cubin: bytes) -> None:
    from kernelpack.cache import Cache, CacheWarning, make_key
    from kernelpack.signing import generate_private_key

    from ._cache_kernels import from_cubin

    cache = Cache(tmp_path, remote=f"redis://127.0.0.1:{trickling_server}/0",
                  sign_with=generate_private_key(), timeout_s=0.3)
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="remote cache read failed"):
        got = cache.fetch_or_compile(make_key(kind="t", source=b"trickle"),
                                     lambda: from_cubin("axpy", axpy_cubin))
    assert got.origin == "compiled" and time.monotonic() - start < 3.0
    assert cache.stats()["remote_errors"] == 1
    cache.close()


def test_large_reply_from_real_server_still_arrives(redis_server) -> None:  # type: ignore[no-untyped-def]
    """The deadline grows with an announced bulk: a 4 MiB value is not cut off at 0.2 s."""
    client = RespClient(redis_server.url, timeout_s=0.2)
    blob = bytes(range(256)) * (16 << 10)
    assert client.set("review6:big", blob)
    assert client.get("review6:big") == blob
    client.close()
