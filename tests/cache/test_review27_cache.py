"""Review 27: an independent black-box check of the compile-or-load cache through the public
API (``kp.Cache``, ``kp.compile(..., cache=)``, ``cache.stats()``, ``kernelpack cache``), with
real fusions compiled for ``sm_80`` (nvJitLink, no GPU) and a real redis-server.

What it checks: the key changes with everything that changes the code (body, constants,
scalar dtypes, dim names, options, ``static=``, targets, values a trace reads from globals and
closures) and with nothing that does not (target order, the process, its hash seed, working
directory and cache location); origins and counters; constructor arguments named in errors;
a corrupt entry quarantined; the size cap keeping the most recently used; threads compiling
once; ``cache explain``; remote entries shared, refused when unsigned or untrusted, and Redis
down, paused or holding garbage costing only a warning and a local compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.cache import CacheWarning
from kernelpack.compile_entry import fusion_key

from .conftest import RedisServer, worker_env

T80 = ["sm_80"]


def _fusion(body: str, name: str = "f", env: dict[str, Any] | None = None) -> kp.Fusion:
    """A fusion from source text ``def f(...): ...`` (so variants can share one name)."""
    ns: dict[str, Any] = {"kp": kp, **(env or {})}
    exec(body, ns)  # noqa: S102 - test-local source
    return kp.fusion(name=name)(ns["f"])


BASE = '''
def f(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
    return x * s + 1.0
'''


def _key(f: Any, targets: Any = T80, static: Any = None, **options: Any) -> str:
    return fusion_key(f, targets, static, options).digest


def _quiet_cache(path: Path, **kw: Any) -> kp.Cache:
    kw.setdefault("remote", False)
    return kp.Cache(path, **kw)


# ---- the key: everything that changes the code changes it ------------------------------------
VARIANTS = {
    "constant": BASE.replace("1.0", "2.0"),
    "body": BASE.replace("+ 1.0", "- 1.0"),
    "scalar dtype": '''
def f(x: kp.Tensor[kp.f32, "n"], s: kp.i64):
    return x * s + 1.0
''',
    "dim name": BASE.replace('"n"', '"m"'),
    "param name": BASE.replace("x:", "y:").replace("x *", "y *"),
    "param order": '''
def f(s: kp.f32, x: kp.Tensor[kp.f32, "n"]):
    return x * s + 1.0
''',
    "tensor dtype": '''
def f(x: kp.Tensor[kp.f64, "n"], s: kp.f64):
    return x * s + 1.0
''',
    "int constant": BASE.replace("1.0", "1"),
    "negative zero": BASE.replace("1.0", "-0.0"),
    "output name": BASE.replace("return x * s + 1.0", "return {'y': x * s + 1.0}"),
}


def test_key_changes_with_every_part_of_the_fusion() -> None:
    base = _key(_fusion(BASE))
    keys = {name: _key(_fusion(src)) for name, src in VARIANTS.items()}
    assert base not in keys.values()
    assert len(set(keys.values())) == len(keys), keys
    assert _key(_fusion(BASE)) == base  # and the same source gives the same key


def test_key_changes_with_options_static_targets() -> None:
    f = _fusion(BASE)
    base = _key(f)
    others = [_key(f, opt=2), _key(f, opt=0), _key(f, static={"n": 1024}),
              _key(f, static={"n": 2048}), _key(f, targets=["sm_90"]),
              _key(f, targets=["sm_80", "ptx"]), _key(f, targets=["sm_80", "sm_90"]),
              _key(f, targets=["sm_90a"]), _key(_fusion(BASE, name="g"))]
    assert base not in others and len(set(others)) == len(others)
    # ... and not with what changes nothing: the default opt, spelling, order, duplicates
    assert _key(f, opt=3) == base and _key(f, static={}) == base
    assert _key(f, targets=[" SM_80 "]) == base and _key(f, targets=("sm_80", "sm_80")) == base
    assert _key(f, targets=["sm_90", "sm_80"]) == _key(f, targets=["sm_80", "sm_90"])
    assert _key(f, targets=iter(["sm_80"])) == base


def test_target_order_shares_one_entry(tmp_path: Path) -> None:
    cache = _quiet_cache(tmp_path)
    f = _fusion(BASE)
    a = kp.compile(f, targets=["sm_90", "sm_80"], cache=cache)
    b = kp.compile(f, targets=["sm_80", "sm_90"], cache=cache)
    assert (a.origin, b.origin) == ("compiled", "disk") and a == b


def test_values_read_from_globals_and_closures_change_the_key(tmp_path: Path) -> None:
    cache = _quiet_cache(tmp_path)
    env = {"SCALE": 2.0, "USE_EXP": True}
    f = _fusion('''
def f(x: kp.Tensor[kp.f32, "n"]):
    y = kp.exp(x) if USE_EXP else kp.log(x)
    return y * SCALE
''', env=env)
    assert kp.compile(f, targets=T80, cache=cache).origin == "compiled"
    assert kp.compile(f, targets=T80, cache=cache).origin == "disk"
    f.fn.__globals__["SCALE"] = 3.0
    assert kp.compile(f, targets=T80, cache=cache).origin == "compiled"
    f.fn.__globals__["USE_EXP"] = False
    assert kp.compile(f, targets=T80, cache=cache).origin == "compiled"
    f.fn.__globals__["SCALE"] = 2.0
    f.fn.__globals__["USE_EXP"] = True
    assert kp.compile(f, targets=T80, cache=cache).origin == "disk"

    def make(v: float) -> kp.Fusion:
        def f(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
            return x * v
        return kp.fusion(f)

    assert _key(make(2.0)) != _key(make(3.0))
    assert _key(make(2.0)) == _key(make(2.0))


def test_stale_hit_never_served_after_a_change(tmp_path: Path) -> None:
    """The end-to-end property: a hit is the code of *this* fusion (the PTX differs)."""
    cache = _quiet_cache(tmp_path)
    a = kp.compile(_fusion(BASE), targets=["sm_80", "ptx"], cache=cache)
    b = kp.compile(_fusion(BASE.replace("1.0", "2.0")), targets=["sm_80", "ptx"], cache=cache)
    assert (a.origin, b.origin) == ("compiled", "compiled") and a != b
    again = kp.compile(_fusion(BASE.replace("1.0", "2.0")), targets=["sm_80", "ptx"],
                       cache=cache)
    assert again.origin == "disk" and again == b and hash(again) == hash(b)


_CHILD = """
import json, sys, kernelpack as kp
from kernelpack.compile_entry import fusion_key
@kp.fusion
def review27(x: kp.Tensor[kp.f32, "b", "n"], y: kp.Tensor[kp.f32, "n"], k: kp.i32, s: kp.f32):
    z = x * y + s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return {"sm": e / e.sum(axis=1, keepdims=True), "col": x.mean(axis=0) * (x.shape[0] + k),
            "r": kp.arange(x.shape[1] * 2 + x.shape[0]).astype(kp.f32) * s}
key = fusion_key(review27, ["sm_90", "sm_80", "ptx"], {"n": 64}, {"opt": 2})
cache = kp.Cache(remote=False)
c = kp.compile(review27, targets=["sm_80"], cache=cache)
print(json.dumps({"key": key.digest, "origin": c.origin}))
"""


def _child(cwd: Path, cache_dir: Path, seed: str) -> dict[str, str]:
    env = worker_env()
    env.update(PYTHONHASHSEED=seed, KERNELPACK_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_key_is_stable_across_processes_and_locations(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _child(tmp_path / "a", tmp_path / "cache1", "1")
    second = _child(tmp_path / "b", tmp_path / "cache2" / "deeper", "2")
    again = _child(tmp_path / "b", tmp_path / "cache1", "3")
    assert first["key"] == second["key"] == again["key"]
    assert (first["origin"], second["origin"], again["origin"]) == ("compiled", "compiled",
                                                                    "disk")


# ---- origins and counters ----------------------------------------------------------------------
def test_origin_and_stats_on_disk(tmp_path: Path) -> None:
    f = _fusion(BASE)
    cache = _quiet_cache(tmp_path)
    assert kp.compile(f, targets=T80, cache=cache).origin == "compiled"
    assert kp.compile(f, targets=T80, cache=cache).origin == "disk"
    s = cache.stats()
    assert (s["compiles"], s["puts"], s["disk_hits"], s["disk_misses"]) == (1, 1, 1, 1)
    assert s["errors"] == s["quarantined"] == s["refused"] == s["remote_hits"] == 0
    # a second Cache object (another process's view) on the same directory: a disk hit
    other = _quiet_cache(tmp_path)
    assert kp.compile(f, targets=T80, cache=other).origin == "disk"
    assert other.stats()["compiles"] == 0 and other.stats()["disk_hits"] == 1


# ---- constructor arguments ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc, param", [
    ({"max_bytes": -1}, ValueError, "max_bytes"),
    ({"max_bytes": 0}, ValueError, "max_bytes"),
    ({"max_bytes": True}, TypeError, "max_bytes"),
    ({"max_bytes": "1G"}, TypeError, "max_bytes"),
    ({"max_bytes": 1.5e9}, TypeError, "max_bytes"),
    ({"remote": "http://127.0.0.1:6379/0"}, ValueError, "remote"),
    ({"remote": "redis://127.0.0.1:6379/abc"}, ValueError, "remote"),
    ({"remote": 5}, TypeError, "remote"),
    ({"trusted_keys": 5}, TypeError, "trusted_keys"),
    ({"remote": "redis://127.0.0.1:1/0", "trusted_keys": ["zz"]}, ValueError, "trusted_keys"),
    ({"remote": "redis://127.0.0.1:1/0", "trusted_keys": [5]}, ValueError, "trusted_keys"),
    ({"sign_with": 5}, TypeError, "sign_with"),
    ({"sign_with": "/nonexistent/review27.key"}, ValueError, "sign_with"),
    ({"timeout_s": 0}, ValueError, "timeout_s"),
    ({"ttl_s": 1.5}, TypeError, "ttl_s"),
])
def test_bad_arguments_name_the_parameter(tmp_path: Path, kwargs: dict, exc: type,
                                          param: str) -> None:
    kwargs = {"remote": False, **kwargs}
    with pytest.raises(exc, match=param):
        kp.Cache(tmp_path, **kwargs)


def test_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "afile"
    file.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        kp.Cache(file, remote=False)
    with pytest.raises(TypeError, match="path"):
        kp.Cache(5, remote=False)  # type: ignore[arg-type]


def test_bad_trusted_key_is_refused_with_or_without_a_remote(tmp_path: Path) -> None:
    """Was a bug (review 27, fixed): ``trusted_keys=[5]`` is a ValueError naming trusted_keys when a
    remote is given,
    but accepted silently without one, while ``trusted_keys=5`` is refused either way. The
    cache checks its arguments "whether or not a remote is configured, so a program behaves
    the same with and without one" (kernelpack.cache._args); here the program that works on
    a developer's box fails only once $KERNELPACK_REMOTE_CACHE is set on the fleet."""
    with pytest.raises((TypeError, ValueError), match="trusted_keys"):
        kp.Cache(tmp_path, remote=False, trusted_keys=[5])


def test_compile_arguments_name_the_parameter(tmp_path: Path) -> None:
    cache = _quiet_cache(tmp_path)
    f = _fusion(BASE)
    with pytest.raises(TypeError, match="cache"):
        kp.compile(f, targets=T80, cache=str(tmp_path))
    with pytest.raises(ValueError, match="opt"):
        kp.compile(f, targets=T80, cache=cache, opt=True)
    with pytest.raises(TypeError, match="bogus"):
        kp.compile(f, targets=T80, cache=cache, bogus=1)
    with pytest.raises(TypeError, match="targets"):
        kp.compile(f, targets="sm_80", cache=cache)
    with pytest.raises(kp.KernelPackError, match="static"):
        kp.compile(f, targets=T80, cache=cache, static={"q": 3})
    assert cache.stats()["compiles"] == 0


# ---- corrupt entries, the size cap, threads ------------------------------------------------------
def test_corrupt_entry_is_quarantined_and_recompiled(tmp_path: Path) -> None:
    f = _fusion(BASE)
    cache = _quiet_cache(tmp_path)
    good = kp.compile(f, targets=T80, cache=cache)
    path = cache.disk.path(_key(f))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = _quiet_cache(tmp_path)
    with pytest.warns(CacheWarning, match="invalid"):
        c = kp.compile(f, targets=T80, cache=fresh)
    assert c.origin == "compiled" and c == good
    assert fresh.stats()["quarantined"] == 1 and len(fresh.disk.quarantined()) == 1
    assert kp.compile(f, targets=T80, cache=fresh).origin == "disk"
    path.write_bytes(b"")  # truncated to nothing
    with pytest.warns(CacheWarning):
        assert kp.compile(f, targets=T80, cache=_quiet_cache(tmp_path)).origin == "compiled"


def _numbered(i: int) -> kp.Fusion:
    return _fusion(BASE.replace("1.0", f"{i}.5"), name=f"k{i}")


def test_size_cap_evicts_the_least_recently_used(tmp_path: Path) -> None:
    fs = [_numbered(i) for i in range(4)]
    probe = _quiet_cache(tmp_path / "probe")
    kp.compile(fs[0], targets=T80, cache=probe)
    size = probe.disk.entries()[0].size
    cache = _quiet_cache(tmp_path / "capped", max_bytes=int(size * 2.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kp.compile(fs[0], targets=T80, cache=cache)
        kp.compile(fs[1], targets=T80, cache=cache)
        assert kp.compile(fs[0], targets=T80, cache=cache).origin == "disk"  # k0 used last
        kp.compile(fs[2], targets=T80, cache=cache)
    kept = {e.digest for e in cache.disk.entries()}
    assert _key(fs[0]) in kept and _key(fs[2]) in kept and _key(fs[1]) not in kept
    assert sum(e.size for e in cache.disk.entries()) <= cache.disk.max_bytes
    assert cache.stats()["evictions"] == 1
    assert kp.compile(fs[0], targets=T80, cache=cache).origin == "disk"
    assert kp.compile(fs[1], targets=T80, cache=cache).origin == "compiled"


def test_size_cap_never_evicts_the_entry_just_written(tmp_path: Path) -> None:
    """Was a bug (review 27, fixed): with a cap that holds one entry but not 1/0.9 of it (the entry
    is over 90% of
    max_bytes), writing a second entry evicts down to 90% of the cap, which removes the old
    entry *and the one just written*: every compile of A, B, B, A, ... compiles, silently
    (no warning, unlike an entry over the cap, which put() refuses with a CacheWarning). The
    most recently used entry, which fits the cap on its own, must stay (issue 5: "size cap
    with LRU eviction"; DiskStore's own comment calls a cache that evicts every entry right
    after writing it "a cache that never hits, silently")."""
    a, b = _numbered(1), _numbered(2)
    probe = _quiet_cache(tmp_path / "probe")
    kp.compile(a, targets=T80, cache=probe)
    kp.compile(b, targets=T80, cache=probe)
    size = max(e.size for e in probe.disk.entries())  # each fits the cap on its own
    cache = _quiet_cache(tmp_path / "capped", max_bytes=int(size * 1.05))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning is given either
        assert kp.compile(a, targets=T80, cache=cache).origin == "compiled"
        assert kp.compile(b, targets=T80, cache=cache).origin == "compiled"
    kept = {e.digest for e in cache.disk.entries()}
    assert _key(b) in kept, "the entry just written was evicted by its own put"
    assert kp.compile(b, targets=T80, cache=cache).origin == "disk"


def test_threads_compile_a_key_once(tmp_path: Path) -> None:
    cache = _quiet_cache(tmp_path)
    f = _fusion('''
def f(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
    return kp.tanh(x * s) + 1.0
''')
    origins: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            origins.append(kp.compile(f, targets=T80, cache=cache).origin)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sorted(origins) == ["compiled"] + ["disk"] * 4
    assert cache.stats()["compiles"] == 1 and cache.stats()["puts"] == 1


# ---- kernelpack cache explain ---------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelpack", *args], env=worker_env(),
                          capture_output=True, text=True, timeout=60)


def test_cli_explain_real_and_bogus_keys(tmp_path: Path) -> None:
    f = _fusion(BASE)
    kp.compile(f, targets=T80, cache=_quiet_cache(tmp_path))
    key = fusion_key(f, T80, None, {})
    out = _cli("cache", "explain", key.digest[:12], "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert key.digest in out.stdout and key.part("source") in out.stdout
    assert "on disk: yes" in out.stdout
    out = _cli("cache", "explain", "0" * 64, "--dir", str(tmp_path))
    assert out.returncode == 1 and "no record" in out.stderr
    out = _cli("cache", "explain", "not-a-key", "--dir", str(tmp_path))
    assert out.returncode != 0 and "Traceback" not in out.stderr and "key" in out.stderr
    out = _cli("cache", "explain", "ab", "--dir", str(tmp_path))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    stats = _cli("cache", "stats", "--json", "--dir", str(tmp_path))
    assert stats.returncode == 0 and json.loads(stats.stdout)["entries"] == 1


# ---- the remote tier ----------------------------------------------------------------------------
def _fleet(path: Path, server: RedisServer, keys: tuple[Path, Path], **kw: Any) -> kp.Cache:
    private, public = keys
    kw.setdefault("timeout_s", 5.0)
    return kp.Cache(path, remote=server.url, sign_with=str(private),
                    trusted_keys=[str(public)], **kw)


@pytest.mark.redis
def test_second_machine_loads_from_redis(tmp_path: Path, redis_server: RedisServer,
                                         signing_keys: tuple[Path, Path]) -> None:
    f = _fusion(BASE)
    a = _fleet(tmp_path / "a", redis_server, signing_keys)
    b = _fleet(tmp_path / "b", redis_server, signing_keys)
    first = kp.compile(f, targets=T80, cache=a)
    second = kp.compile(f, targets=T80, cache=b)
    third = kp.compile(f, targets=T80, cache=b)
    assert (first.origin, second.origin, third.origin) == ("compiled", "remote", "disk")
    assert first == second == third
    sa, sb = a.stats(), b.stats()
    assert (sa["compiles"], sa["remote_puts"], sa["remote_misses"]) == (1, 1, 1)
    assert (sb["compiles"], sb["remote_hits"], sb["disk_hits"], sb["refused"]) == (0, 1, 1, 0)


@pytest.mark.redis
@pytest.mark.parametrize("writer", ["unsigned", "untrusted"])
def test_unsigned_or_untrusted_remote_entries_are_refused(tmp_path: Path,
                                                          redis_server: RedisServer,
                                                          signing_keys: tuple[Path, Path],
                                                          writer: str) -> None:
    from kernelpack.signing import write_keypair

    f = _fusion(BASE)
    if writer == "unsigned":
        w = kp.Cache(tmp_path / "w", remote=redis_server.url, require_signed_remote=False)
    else:
        private, _ = write_keypair(tmp_path / "stranger.key")
        w = kp.Cache(tmp_path / "w", remote=redis_server.url, sign_with=str(private))
    assert kp.compile(f, targets=T80, cache=w).origin == "compiled"
    assert w.stats()["remote_puts"] == 1
    reader = _fleet(tmp_path / "r", redis_server, signing_keys)
    with pytest.warns(CacheWarning, match="refused"):
        c = kp.compile(f, targets=T80, cache=reader)
    assert c.origin == "compiled"
    assert reader.stats()["refused"] == 1 and reader.stats()["remote_hits"] == 0
    # the reader's signed put-through replaced it: the fleet now loads it
    assert kp.compile(f, targets=T80, cache=_fleet(tmp_path / "r2", redis_server,
                                                   signing_keys)).origin == "remote"


@pytest.mark.redis
def test_redis_killed_mid_run_warns_and_compiles(tmp_path: Path, redis_server: RedisServer,
                                                 signing_keys: tuple[Path, Path]) -> None:
    cache = _fleet(tmp_path, redis_server, signing_keys)
    fs = [_numbered(i) for i in range(4)]
    assert kp.compile(fs[0], targets=T80, cache=cache).origin == "compiled"
    redis_server.kill()
    with pytest.warns(CacheWarning, match="remote cache"):
        origins = [kp.compile(f, targets=T80, cache=cache).origin for f in fs[1:]]
    assert origins == ["compiled"] * 3
    s = cache.stats()
    assert s["compiles"] == 4 and s["remote_puts"] == 1 and s["remote_errors"] >= 1
    assert kp.compile(fs[2], targets=T80, cache=cache).origin == "disk"


@pytest.mark.redis
def test_paused_redis_costs_a_timeout_not_a_hang(tmp_path: Path, redis_server: RedisServer,
                                                 signing_keys: tuple[Path, Path]) -> None:
    f = _fusion(BASE)
    cache = _fleet(tmp_path, redis_server, signing_keys, timeout_s=0.3)
    redis_server.client().execute_command("CLIENT", "PAUSE", "4000", "ALL")
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="remote cache"):
        c = kp.compile(f, targets=T80, cache=cache)
    assert c.origin == "compiled" and time.monotonic() - start < 3.0
    assert cache.stats()["remote_errors"] == 1


@pytest.mark.redis
@pytest.mark.parametrize("garbage", ["bytes", "hash", "list"])
def test_garbage_in_redis_is_refused(tmp_path: Path, redis_server: RedisServer,
                                     signing_keys: tuple[Path, Path], garbage: str) -> None:
    f = _fusion(BASE)
    name = f"kernelpack:1:entry:{_key(f)}"
    client = redis_server.client()
    if garbage == "bytes":
        client.set(name, os.urandom(3000))
    elif garbage == "hash":
        client.hset(name, "a", "b")
    else:
        client.rpush(name, "a", "b")
    cache = _fleet(tmp_path, redis_server, signing_keys)
    with pytest.warns(CacheWarning, match="refused"):
        c = kp.compile(f, targets=T80, cache=cache)
    assert c.origin == "compiled" and cache.stats()["refused"] == 1
    assert cache.stats()["remote_errors"] == 0  # one bad value does not switch Redis off
    other = _numbered(7)
    kp.compile(other, targets=T80, cache=cache)
    assert cache.stats()["remote_puts"] >= 1


@pytest.mark.redis
def test_redis_refusing_writes_costs_a_warning(tmp_path: Path, redis_server: RedisServer,
                                               signing_keys: tuple[Path, Path]) -> None:
    """Reads answer, writes fail (a server out of memory): the lock and the put-through fail,
    which is a warning and a local compile, and the disk still gets the entry."""
    client = redis_server.client()
    client.config_set("maxmemory", "1")
    client.config_set("maxmemory-policy", "noeviction")
    cache = _fleet(tmp_path, redis_server, signing_keys)
    f = _fusion(BASE)
    with pytest.warns(CacheWarning, match="remote cache"):
        c = kp.compile(f, targets=T80, cache=cache)
    assert c.origin == "compiled" and cache.stats()["remote_errors"] == 1
    assert cache.stats()["remote_puts"] == 0
    assert kp.compile(f, targets=T80, cache=cache).origin == "disk"


@pytest.mark.redis
def test_fleet_lock_held_elsewhere_waits_at_most_wait_s(tmp_path: Path,
                                                        redis_server: RedisServer,
                                                        signing_keys: tuple[Path, Path]) -> None:
    f = _fusion(BASE)
    redis_server.client().set(f"kernelpack:1:lock:{_key(f)}", "someone-else", px=60_000)
    cache = _fleet(tmp_path, redis_server, signing_keys, wait_s=0.5)
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="waited"):
        c = kp.compile(f, targets=T80, cache=cache)
    assert c.origin == "compiled" and 0.4 < time.monotonic() - start < 5.0
    assert cache.stats()["remote_waits"] == 1 and cache.stats()["remote_puts"] == 1
    # the other holder's lock is not ours to delete
    assert redis_server.client().get(f"kernelpack:1:lock:{_key(f)}") == b"someone-else"


@pytest.mark.redis
def test_lock_holder_finishing_during_the_wait_is_a_remote_hit(
        tmp_path: Path, redis_server: RedisServer, signing_keys: tuple[Path, Path]) -> None:
    f = _fusion(BASE)
    lock = f"kernelpack:1:lock:{_key(f)}"
    redis_server.client().set(lock, "holder", px=60_000)
    holder = _fleet(tmp_path / "holder", redis_server, signing_keys)

    def finish() -> None:  # the other machine compiles, puts, and releases its lock
        time.sleep(0.3)
        holder.put(_key(f), kp.save(kp.compile(f, targets=T80)))
        redis_server.client().delete(lock)

    t = threading.Thread(target=finish)
    t.start()
    waiter = _fleet(tmp_path / "waiter", redis_server, signing_keys, wait_s=20.0)
    c = kp.compile(f, targets=T80, cache=waiter)
    t.join(60)
    assert c.origin == "remote" and waiter.stats()["compiles"] == 0
    assert waiter.stats()["remote_waits"] == 1


@pytest.mark.redis
def test_bytes_interface_get_put_over_both_tiers(tmp_path: Path, redis_server: RedisServer,
                                                 signing_keys: tuple[Path, Path]) -> None:
    f = _fusion(BASE)
    key = fusion_key(f, T80, None, {})
    a = _fleet(tmp_path / "a", redis_server, signing_keys)
    assert a.get(key) is None
    data = kp.save(kp.compile(f, targets=T80))
    a.put(key, data)
    b = _fleet(tmp_path / "b", redis_server, signing_keys)
    got = b.get(key)
    assert got is not None and kp.load(got).programs == ["f"]
    assert b.stats()["remote_hits"] == 1
    assert kp.compile(f, targets=T80, cache=b).origin == "disk"
    with pytest.raises(ValueError, match="data"):
        a.put(key, b"not an artifact")
    with pytest.raises(ValueError, match="key"):
        a.get("not-a-digest")


@pytest.mark.redis
def test_threads_share_one_redis_connection_safely(tmp_path: Path, redis_server: RedisServer,
                                                   signing_keys: tuple[Path, Path]) -> None:
    """Several threads of one process, one Cache, different keys at once: replies must not
    be crossed between threads (a warning or a refused entry would show it)."""
    fs = [_numbered(i) for i in range(10, 16)]
    cache = _fleet(tmp_path / "a", redis_server, signing_keys)
    errors: list[BaseException] = []

    def run(f: kp.Fusion) -> None:
        try:
            kp.compile(f, targets=T80, cache=cache)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=run, args=(f,)) for f in fs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors and not [w for w in caught if issubclass(w.category, CacheWarning)]
    s = cache.stats()
    assert s["compiles"] == len(fs) and s["remote_puts"] == len(fs) and s["remote_errors"] == 0
    other = _fleet(tmp_path / "b", redis_server, signing_keys)
    assert [kp.compile(f, targets=T80, cache=other).origin for f in fs] == ["remote"] * len(fs)
