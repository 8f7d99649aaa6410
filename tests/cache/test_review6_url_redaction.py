"""Review 6: a Redis password in the remote URL never shows in a repr or an error message.

``repr(cache)`` is what logs and tracebacks print, and URL errors are raised at start-up where
fleets log them; both used to carry ``redis://:password@host`` verbatim.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelpack.cache import Cache
from kernelpack.cache.remote import RedisStore, redact_url
from kernelpack.cache.resp import RespClient

SECRET = "s3cr%40t-pw"


@pytest.mark.parametrize("url, shown", [
    (f"redis://:{SECRET}@h:6379/5", "redis://:***@h:6379/5"),
    (f"redis://ops:{SECRET}@h/0", "redis://ops:***@h/0"),
    (f"rediss://ops:{SECRET}@h:6380/2?ssl_cert_reqs=none",
     "rediss://ops:***@h:6380/2?ssl_cert_reqs=none"),
    (f"unix:///run/redis.sock?db=1&password={SECRET}", "unix:///run/redis.sock?db=1&password=***"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis://ops@h/0", "redis://ops@h/0"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_cache_repr_hides_the_password(tmp_path: Path) -> None:
    cache = Cache(tmp_path, remote=f"redis://:{SECRET}@127.0.0.1:6379/3",
                  require_signed_remote=False)
    assert SECRET not in repr(cache) and SECRET not in repr(cache.remote)
    assert "redis://:***@127.0.0.1:6379/3" in repr(cache)


@pytest.mark.parametrize("url", [f"redis://:{SECRET}@h:6379/x", f"redis://:{SECRET}@h:99999/0",
                                 f"redis://:{SECRET}@/0", f"redis:/:{SECRET}@h/0"])
def test_url_errors_hide_the_password(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValueError, match="remote") as info:
        Cache(tmp_path, remote=url, require_signed_remote=False)
    assert SECRET not in str(info.value)


def test_resp_client_errors_hide_the_password() -> None:
    with pytest.raises(ValueError) as info:
        RespClient(f"redis://:{SECRET}@h:1/abc")
    assert SECRET not in str(info.value) and "abc" in str(info.value)
    store = RedisStore(f"redis://:{SECRET}@h:1/0")
    assert SECRET not in repr(store)
