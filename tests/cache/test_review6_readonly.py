"""Review 6: a read-only cache directory (a shared, pre-filled cache mounted read-only).

Hits work and misses compile with a warning (already so); ``prune()`` of a cache under its
cap used to raise a bare OSError creating its lock file, and ``prune``/``clear`` that cannot
write raised OSError instead of a CacheError naming the directory. Read-only-ness is
simulated (tests run as root, where permission bits do not bind): every write-mode open,
unlink, rename, mkdir and utime under the cache root fails with EROFS.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from kernelpack.cache import Cache, CacheWarning, make_key
from kernelpack.errors import CacheError

from ._cache_kernels import from_cubin

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@pytest.fixture()
def read_only(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``read_only(root)``: from now on writes under ``root`` fail with EROFS."""
    def make(root: Path) -> None:
        prefix = str(root)

        def under(path: object) -> bool:
            return os.fspath(path).startswith(prefix)  # type: ignore[arg-type]

        def refuse(path: object) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))  # type: ignore[arg-type]

        real_open, real_unlink, real_replace = os.open, os.unlink, os.replace
        real_mkdir, real_utime = os.mkdir, os.utime

        def ro_open(path, flags, *a, **k):  # type: ignore[no-untyped-def]
            if flags & _WRITE and under(path):
                refuse(path)
            return real_open(path, flags, *a, **k)

        def guard(real):  # type: ignore[no-untyped-def]
            def call(path, *a, **k):  # type: ignore[no-untyped-def]
                if under(path):
                    refuse(path)
                return real(path, *a, **k)
            return call

        monkeypatch.setattr(os, "open", ro_open)
        monkeypatch.setattr(os, "unlink", guard(real_unlink))
        monkeypatch.setattr(os, "replace", guard(real_replace))
        monkeypatch.setattr(os, "mkdir", guard(real_mkdir))
        monkeypatch.setattr(os, "utime", guard(real_utime))

    return make


def test_read_only_cache_serves_hits_prunes_and_refuses_clear(tmp_path: Path, read_only,  # type: ignore[no-untyped-def]
                                                              axpy_cubin: bytes) -> None:
    key = make_key(kind="t", source=b"ro")
    Cache(tmp_path, remote=False).fetch_or_compile(key, lambda: from_cubin("axpy", axpy_cubin))
    read_only(tmp_path)
    cache = Cache(tmp_path, remote=False, max_bytes=1 << 20)
    assert cache.fetch_or_compile(key, lambda: from_cubin("axpy", axpy_cubin)).origin == "disk"
    with pytest.warns(CacheWarning):
        miss = cache.fetch_or_compile(make_key(kind="t", source=b"ro2"),
                                      lambda: from_cubin("axpy", axpy_cubin))
    assert miss.origin == "compiled"
    assert cache.prune() == (0, 0)  # under the cap: nothing to write, no error
    with pytest.raises(CacheError, match="cannot prune the disk cache"):
        cache.prune(0)
    with pytest.raises(CacheError, match="cannot clear the disk cache"):
        cache.clear()
    assert cache.fetch_or_compile(key, lambda: from_cubin("axpy", axpy_cubin)).origin == "disk"
