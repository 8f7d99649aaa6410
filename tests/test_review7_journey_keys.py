"""Review 7: the cache key as a newcomer exercises it.

What the trace reads (a module constant, a closure value, a helper's default argument, a
``static=`` size) must change the key; what it does not (the process's hash seed, the working
directory, the order targets are listed in) must not. And ``kp.compile(..., cache=...)`` must
accept the same ``targets`` as ``kp.compile`` without a cache: a generator was consumed by the
key, so the build on a miss saw it empty ("targets name no architecture (got [])").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kernelpack as kp
from kernelpack.compile_entry import fusion_key

SCALE = 2.0


def _key(f: object, targets: object = ("sm_80",), static: dict | None = None,
         **options: object) -> str:
    return fusion_key(f, targets, static, options).digest  # type: ignore[arg-type]


def _module_constant() -> object:
    @kp.fusion
    def scaled(x: kp.Tensor[kp.f32, "n"]):
        return x * SCALE
    return scaled


def _closure(c: float) -> object:
    @kp.fusion
    def scaled(x: kp.Tensor[kp.f32, "n"]):
        return x * c
    return scaled


def _default(c: float) -> object:
    def helper(x: object, s: float = c) -> object:
        return x * s  # type: ignore[operator]

    @kp.fusion
    def scaled(x: kp.Tensor[kp.f32, "n"]):
        return helper(x)
    return scaled


@kp.fusion
def _add_one(x: kp.Tensor[kp.f32, "n"]):
    return x + 1


def test_what_the_trace_reads_changes_the_key() -> None:
    global SCALE
    before = _key(_module_constant())
    SCALE = 3.0
    try:
        assert _key(_module_constant()) != before
    finally:
        SCALE = 2.0
    assert _key(_closure(1.0)) != _key(_closure(2.0))
    assert _key(_closure(0.0)) != _key(_closure(-0.0))
    assert _key(_default(1.5)) != _key(_default(2.5))
    assert _key(_add_one, static={"n": 4}) != _key(_add_one, static={"n": 5})
    assert _key(_add_one, static={"n": 4}) != _key(_add_one)
    assert _key(_add_one, opt=2) != _key(_add_one)


def test_what_the_trace_does_not_read_keeps_the_key() -> None:
    assert _key(_add_one, ["sm_80", "sm_90"]) == _key(_add_one, ["sm_90", "sm_80"])
    assert _key(_add_one, ["sm_90"]) == _key(_add_one, (t for t in ["sm_90"]))
    assert _key(_add_one) == _key(_add_one, opt=3)  # the default, spelled out


_PROGRAM = """
import json, kernelpack as kp
from kernelpack.compile_entry import fusion_key
@kp.fusion
def softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=(1,), keepdims=True), "m": z.max(axis=(1, 0))}
print(json.dumps(fusion_key(softmax, ["sm_90", "ptx"], None, {}).digest))
"""


def test_key_is_the_same_across_hash_seeds_and_working_directories(tmp_path: Path) -> None:
    keys = set()
    for seed, cwd in (("0", tmp_path), ("12345", Path(__file__).parent)):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _PROGRAM], cwd=cwd, env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        keys.add(json.loads(out))
    assert len(keys) == 1, keys


def test_generator_targets_compile_through_the_cache(tmp_path: Path) -> None:
    """Without a cache a generator of targets compiles; with one it raised ValueError
    'targets name no architecture (got [])' because the key had consumed it."""
    cache = kp.Cache(tmp_path / "cache")
    first = kp.compile(_add_one, targets=(t for t in ["sm_80"]), cache=cache)
    assert first.origin == "compiled"
    assert [i.target for m in first.modules for i in m.images] == ["sm_80"]
    again = kp.compile(_add_one, targets=iter(["sm_80"]), cache=cache)
    assert again.origin == "disk"
