"""A separate process for the cache tests (run as a script, not collected by pytest).

Modes:
  race CACHE_DIR REMOTE|- MARKER CUBIN NKEYS SEED KEYFILE|-
      ask for NKEYS keys in a shuffled order; each build appends "<digest>\\n" to MARKER.
      Prints one JSON line: {"origins": {...}, "stats": {...}, "warnings": [...]}.
  slowwrite CACHE_DIR CUBIN
      put one entry with a write that stalls after the first chunk; prints "writing" first.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings
from pathlib import Path

import kernelpack as kp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cache_kernels import from_cubin  # noqa: E402  (no pytest in workers)


def key_for(i: int) -> kp.CacheKey:
    return kp.make_key("external", f"race-kernel-{i}".encode(), {"i": i}, ["sm_80"])


def race(cache_dir: str, remote: str, marker: str, cubin_path: str, nkeys: str, seed: str,
         keyfile: str) -> None:
    cubin = Path(cubin_path).read_bytes()
    kwargs = {}
    if keyfile != "-":
        kwargs = {"sign_with": keyfile}
    # timeout_s well above the 1 s default: eight workers on a loaded 2-core CI box may wait
    # over a second for Redis, and one timeout switches that worker's remote off for 30 s
    # (it then compiles keys the others did: a failed race that is no product bug).
    cache = kp.Cache(cache_dir, remote=None if remote == "-" else remote, timeout_s=10.0,
                     **kwargs)
    order = list(range(int(nkeys)))
    random.Random(int(seed)).shuffle(order)
    origins: dict[str, int] = {}

    def build(i: int) -> kp.Compiled:
        with open(marker, "a") as f:  # O_APPEND: one short line per write, never interleaved
            f.write(f"{key_for(i).digest}\n")
        time.sleep(0.02)  # a compile takes time: widen the race window
        return from_cubin(f"k{i}", cubin)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in order:
            c = cache.fetch_or_compile(key_for(i), lambda i=i: build(i))
            assert c.name == f"k{i}", (c.name, i)
            origins[c.origin] = origins.get(c.origin, 0) + 1
    print(json.dumps({"origins": origins, "stats": cache.stats(),
                      "warnings": [str(w.message) for w in caught]}))


def slowwrite(cache_dir: str, cubin_path: str) -> None:
    from kernelpack.cache import disk

    real_write = os.write
    calls = {"n": 0}

    def stalling_write(fd: int, data) -> int:  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 1:
            print("writing", flush=True)
            time.sleep(60)
        return real_write(fd, data[:64])

    cache = kp.Cache(cache_dir, remote=False)
    key = key_for(0)  # before the stall: the key's digest memo is written with os.write too
    cubin = Path(cubin_path).read_bytes()
    disk.os.write = stalling_write  # type: ignore[attr-defined]
    cache.fetch_or_compile(key, lambda: from_cubin("k0", cubin))


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    {"race": race, "slowwrite": slowwrite}[mode](*rest)
