"""Review round 11 (B): the compile cache of issue 5 as an outside checker drives it.

``kp.Cache(path, remote, trusted_keys, sign_with, max_bytes)`` in the issue's order, the
README's ``origin`` story ("compiled", then "disk" in later processes, with the default
directory from ``$XDG_CACHE_HOME``), corrupt entries of every kind met through ``kp.compile``
(quarantined and recompiled with a warning), and the size cap seen from ``kp.compile``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import CacheWarning

# The fusion is defined in the child's source too: the key is the traced graph and the
# program's name, not the file or the function object (README, "Warm start for a fleet").
FUSION_SRC = '''
import kernelpack as kp

@kp.fusion
def add1(x: kp.Tensor[kp.f32, "n"]):
    return x + 1.0
'''
namespace: dict = {}
exec(compile(FUSION_SRC, "<fusion>", "exec"), namespace)  # noqa: S102 - our own constant text
add1 = namespace["add1"]


@kp.fusion
def mul2(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
    return x * 2.0


@kp.fusion
def sub3(x: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
    return x - 3.0


@pytest.fixture(scope="module")
def fresh() -> dict[str, kp.Compiled]:
    """Each fusion compiled once, without a cache, to compare hits with."""
    return {f.name if hasattr(f, "name") else f.__name__: kp.compile(f, targets=["sm_80"])
            for f in (add1, mul2, sub3)}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELPACK_CACHE_DIR", "XDG_CACHE_HOME", "KERNELPACK_REMOTE_CACHE",
                        "KERNELPACK_CACHE_MAX_BYTES")}
    env.update(extra)
    return env


def _entries(root: Path) -> list[Path]:
    return sorted((root / "entries").glob("*/*.kpack"))


def test_origin_compiled_then_disk_then_disk_in_a_new_process(tmp_path: Path,
                                                               fresh: dict) -> None:
    """The README's warm start, with the default root taken from $XDG_CACHE_HOME in the child
    and listed by ``kernelpack cache ls`` under the same environment."""
    root = tmp_path / "xdg" / "kernelpack"
    cache = kp.Cache(root, None, None, None, None)  # the positional order
    first = kp.compile(add1, targets=["sm_80"], cache=cache)
    second = kp.compile(add1, targets=["sm_80"], cache=cache)
    assert (first.origin, second.origin) == ("compiled", "disk")
    assert first == second == fresh["add1"] and hash(second) == hash(fresh["add1"])
    assert kp.save([second]) == kp.save([fresh["add1"]])
    stats = cache.stats()
    assert (stats["compiles"], stats["disk_hits"], stats["puts"]) == (1, 1, 1)
    [entry] = _entries(root)

    child = FUSION_SRC + '''
cache = kp.Cache()
c = kp.compile(add1, targets=["sm_80"], cache=cache)
print(c.origin, cache.disk.root, cache.stats()["compiles"])
'''
    env = _env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["disk", str(root), "0"]
    ls = subprocess.run([sys.executable, "-m", "kernelpack", "cache", "ls", "--json"], env=env,
                        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    listed = json.loads(ls.stdout)
    assert [e["program"] for e in listed] == ["add1"]
    assert entry.name.startswith(listed[0]["key"][:16])


def _truncate(path: Path, other: bytes) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _flip(path: Path, other: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def _empty(path: Path, other: bytes) -> None:
    path.write_bytes(b"")


def _other_program(path: Path, other: bytes) -> None:
    path.write_bytes(other)  # a valid artifact, of another program


@pytest.mark.parametrize("damage, why", [(_truncate, "FormatError"), (_flip, "IntegrityError"),
                                         (_empty, "FormatError"),
                                         (_other_program, "not the requested 'add1'")],
                         ids=["truncated", "flipped", "empty", "other-program"])
def test_a_damaged_entry_is_quarantined_and_recompiled(tmp_path: Path, fresh: dict, damage,
                                                       why: str) -> None:
    cache = kp.Cache(tmp_path)
    kp.compile(add1, targets=["sm_80"], cache=cache)
    [entry] = _entries(tmp_path)
    damage(entry, kp.save([fresh["mul2"]]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = kp.compile(add1, targets=["sm_80"], cache=cache)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert again.origin == "compiled" and again == fresh["add1"]
    assert len(messages) == 1 and "quarantine" in messages[0] and why in messages[0]
    assert cache.stats()["quarantined"] == 1
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    assert kp.compile(add1, targets=["sm_80"], cache=cache).origin == "disk"


def test_an_entry_larger_than_the_cap_is_compiled_but_not_kept(tmp_path: Path,
                                                               fresh: dict) -> None:
    cache = kp.Cache(tmp_path, max_bytes=100)
    with pytest.warns(CacheWarning, match="exceed the cache's cap of 100 bytes"):
        c = kp.compile(add1, targets=["sm_80"], cache=cache)
    assert c == fresh["add1"] and c.origin == "compiled"
    assert _entries(tmp_path) == [] and cache.stats()["disk_too_large"] == 1
    assert cache.stats()["errors"] == 0  # a size the operator chose is no failure


def test_the_cap_evicts_the_least_recently_used_entry(tmp_path: Path, fresh: dict) -> None:
    size = len(kp.save([fresh["add1"]]))
    cache = kp.Cache(tmp_path, max_bytes=int(size * 2.5))
    kp.compile(add1, targets=["sm_80"], cache=cache)
    kp.compile(mul2, targets=["sm_80"], cache=cache)
    assert kp.compile(add1, targets=["sm_80"], cache=cache).origin == "disk"  # add1 used last
    kp.compile(sub3, targets=["sm_80"], cache=cache)
    assert len(_entries(tmp_path)) == 2 and cache.stats()["evictions"] == 1
    assert kp.compile(add1, targets=["sm_80"], cache=cache).origin == "disk"
    assert kp.compile(sub3, targets=["sm_80"], cache=cache).origin == "disk"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert kp.compile(mul2, targets=["sm_80"], cache=cache).origin == "compiled"


def test_get_and_put_refuse_what_is_not_a_key_or_one_program(tmp_path: Path,
                                                             fresh: dict) -> None:
    cache = kp.Cache(tmp_path)
    key = "ab" * 32
    assert cache.get(key) is None
    data = kp.save([fresh["add1"]])
    cache.put(key, bytearray(data))
    assert cache.get(key) == data
    for bad in ("AB" * 32, "ab" * 31, "xyz"):
        with pytest.raises(ValueError, match="64 lowercase hex digits"):
            cache.get(bad)
    with pytest.raises(TypeError, match="cache key must be"):
        cache.get(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a single-program kernelpack artifact"):
        cache.put(key, b"junk")
    with pytest.raises(ValueError, match="exactly 1 program"):
        cache.put(key, kp.save([]))
    with pytest.raises(ValueError, match="exactly 1 program"):
        cache.put(key, kp.save([fresh["add1"], fresh["mul2"]]))
    with pytest.raises(TypeError, match="data must be artifact bytes"):
        cache.put(key, "text")  # type: ignore[arg-type]
    assert cache.get(key) == data  # the refused puts changed nothing
