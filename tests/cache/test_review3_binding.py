"""Review 3: a cache hit must hold what its key asked for. A disk entry carries no key, so a
file copied from key A's name to key B's was served for B (another program, or another image
set); now it is quarantined and B compiled. Remote entries are held to the same checks."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.remote import wrap_entry

from .conftest import axpy_params
from .test_remote_tier import MemoryStore


def _external(cache: Cache, name: str, cubin: bytes) -> kp.Compiled:
    return cache.external(name, "axpy", axpy_params(), grid=kp.cdiv("n", 256), block=256,
                          cubin={"sm_80": cubin})


def _copy(cache: Cache, src: str, dst: str) -> None:
    target = cache.disk.path(dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cache.disk.path(src), target)


def _key_of_external(name: str, cubin: bytes) -> str:
    from kernelpack.cache.external_key import external_key

    key, _ = external_key((name, "axpy", axpy_params()),
                          {"grid": kp.cdiv("n", 256), "block": 256, "cubin": {"sm_80": cubin}})
    return key.digest


def test_an_entry_copied_under_another_programs_key_is_not_served(tmp_path: Path,
                                                                    axpy_cubin: bytes) -> None:
    cache = Cache(tmp_path, remote=False)
    assert _external(cache, "prog_a", axpy_cubin).origin == "compiled"
    a, b = _key_of_external("prog_a", axpy_cubin), _key_of_external("prog_b", axpy_cubin)
    _copy(cache, a, b)
    with pytest.warns(CacheWarning, match="prog_a.*not the requested 'prog_b'"):
        got = _external(cache, "prog_b", axpy_cubin)
    assert (got.origin, got.name) == ("compiled", "prog_b")
    assert cache.stats()["quarantined"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the right entries still hit, silently
        assert (_external(cache, "prog_b", axpy_cubin).origin,
                _external(cache, "prog_a", axpy_cubin).origin) == ("disk", "disk")


def test_fetch_or_compile_checks_the_name_it_is_given(tmp_path: Path, axpy_cubin: bytes) -> None:
    from .conftest import from_cubin

    cache = Cache(tmp_path, remote=False)
    digest = "ab" * 32
    cache.fetch_or_compile(digest, lambda: from_cubin("one", axpy_cubin), name="one")
    assert cache.fetch_or_compile(digest, lambda: pytest.fail("compiled"),
                                  name="one").origin == "disk"
    with pytest.warns(CacheWarning, match="not the requested 'two'"):
        got = cache.fetch_or_compile(digest, lambda: from_cubin("two", axpy_cubin), name="two")
    assert got.origin == "compiled" and got.name == "two"
    with pytest.raises(TypeError, match="name"):
        cache.fetch_or_compile(digest, lambda: from_cubin("two", axpy_cubin), name=3)


@kp.fusion
def _add(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"]):  # type: ignore[no-untyped-def]
    return x + y


def test_a_fusion_entry_of_other_targets_is_not_served(tmp_path: Path) -> None:
    from kernelpack.compile_entry import fusion_key

    pytest.importorskip("llvmlite")
    cache = Cache(tmp_path, remote=False)
    try:
        first = kp.compile(_add, targets=["sm_80"], cache=cache)
    except kp.CompileError as exc:
        pytest.skip(f"no toolchain: {exc}")
    assert first.origin == "compiled"
    _copy(cache, fusion_key(_add, ["sm_80"], None, {}).digest,
          fusion_key(_add, ["sm_80", "ptx"], None, {}).digest)
    with pytest.warns(CacheWarning, match="PTX"):
        got = kp.compile(_add, targets=["sm_80", "ptx"], cache=cache)
    assert got.origin == "compiled"
    assert sorted(img.kind for m in got.modules for img in m.images) == ["cubin", "ptx"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for targets in (["sm_80"], ["ptx", "sm_80"]):
            assert kp.compile(_add, targets=targets, cache=cache).origin == "disk"


def test_a_trusted_remote_entry_holding_another_program_is_refused(tmp_path: Path,
                                                                  axpy_cubin: bytes) -> None:
    from .conftest import from_cubin

    pytest.importorskip("cryptography")
    from kernelpack.signing import generate_private_key

    private = generate_private_key()
    store = MemoryStore()
    digest = "cd" * 32
    store.entries[digest] = wrap_entry(digest, kp.save(from_cubin("other", axpy_cubin),
                                                       sign_with=private), private)
    cache = Cache(tmp_path, remote=store, sign_with=private)  # type: ignore[arg-type]
    with pytest.warns(CacheWarning, match="refused"):
        got = cache.fetch_or_compile(digest, lambda: from_cubin("mine", axpy_cubin),
                                     name="mine")
    assert (got.origin, got.name, cache.stats()["refused"]) == ("compiled", "mine", 1)


def test_a_fusion_entry_copied_under_another_fusions_key_is_not_served(tmp_path: Path) -> None:
    """kp.compile(f, cache=) names the program it expects: two fusions with one target list
    differ in nothing else the artifact records."""
    from kernelpack.compile_entry import fusion_key

    @kp.fusion
    def double(x: kp.Tensor[kp.f32, "n"]):
        return x * 2

    @kp.fusion
    def triple(x: kp.Tensor[kp.f32, "n"]):
        return x * 3

    cache = Cache(tmp_path, remote=False)
    assert kp.compile(double, targets=["sm_80"], cache=cache).origin == "compiled"
    _copy(cache, fusion_key(double, ["sm_80"], None, {}).digest,
          fusion_key(triple, ["sm_80"], None, {}).digest)
    with pytest.warns(CacheWarning, match="'double', not the requested 'triple'"):
        got = kp.compile(triple, targets=["sm_80"], cache=cache)
    assert (got.origin, got.name) == ("compiled", "triple")
    assert kp.compile(double, targets=["sm_80"], cache=cache).origin == "disk"
