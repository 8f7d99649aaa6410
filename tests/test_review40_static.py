"""Review 40: static analysis (mypy, ruff B/PL) as a bug finder, each candidate taken to the
public API.

Bugs (fail until fixed):
- ``kp.Cache.external`` keys ``kp.external``'s arguments by ``repr`` (cache/external_key.py
  ``canonical``): a one-shot iterable for ``constraints=`` (documented ``Iterable``) is keyed by
  its object address, so a later call whose generator reuses the address is served another
  call's artifact (other constraints), and equal calls never hit.
- ``kp.Cache.external`` takes ``cubin={...}`` only as a ``dict`` (``isinstance(value, dict)``),
  where ``kp.external`` takes any ``Mapping``: ``bytes(mapping)`` then raises a bare TypeError.

Regressions for mypy findings proved unreachable (float.bit_length in _host_math, S_ISLNK of
None in cache/disk.py, None compared with ints in ops.pad/iota): they pass today.
"""

from __future__ import annotations

import collections.abc
import gc
import os
import types
import warnings
from pathlib import Path

import pytest

import kernelpack as kp

PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


@pytest.fixture(scope="module")
def sm90_cubin() -> bytes:
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")
    c = kp.external("axpy", "axpy", _params(), 1, 256, ptx=PTX, targets=["sm_90"])
    return c.modules[0].images[0].data


# ---- bug: iterator arguments keyed by identity ---------------------------------------------------
def _external_with_constraints(cache: kp.Cache, constraints: object) -> kp.Compiled:
    return cache.external("axpy", "axpy", _params(), kp.cdiv("n", 256), 256, ptx=PTX,
                          targets=["sm_90"], constraints=constraints)


def test_cache_external_generator_constraints_never_serve_other_constraints(
        tmp_path: Path, sm90_cubin: bytes) -> None:
    """Each call asks for its own constraint through a generator (``constraints`` is an
    Iterable); the generator of one call is freed before the next, whose generator CPython
    usually allocates at the same address: the key (``repr`` of the generator) is the same and
    the first call's artifact, with ``n % 2 == 0``, came back for ``n % 3 == 0`` and later."""
    cache = kp.Cache(tmp_path / "c")
    n = kp.sym("n")
    wrong = []
    for k in range(2, 10):
        wanted = [kp.Constraint(kp.eq(n % k, 0))]
        try:
            got = _external_with_constraints(cache, (c for c in wanted))
        except TypeError:  # refusing a one-shot iterable is a fix too
            continue
        gc.collect()
        if list(got.summary.constraints) != wanted:
            wrong.append((k, got.origin, [str(c.predicate) for c in got.summary.constraints]))
    assert wrong == []


def test_cache_external_equal_generator_constraints_hit(tmp_path: Path,
                                                        sm90_cubin: bytes) -> None:
    """Two calls with equal arguments (both generators alive, so at different addresses)
    must share one key: the second compiled again (its key held ``<generator object at 0x…>``;
    across processes such keys never hit, and each call adds an entry)."""
    cache = kp.Cache(tmp_path / "c")
    cons = [kp.Constraint(kp.eq(kp.sym("n") % 4, 0))]
    g1, g2 = (c for c in cons), (c for c in cons)
    try:
        first = _external_with_constraints(cache, g1)
        second = _external_with_constraints(cache, g2)
    except TypeError:  # refusing a one-shot iterable is a fix too
        return
    assert (first.origin, second.origin) == ("compiled", "disk")
    assert list(second.summary.constraints) == cons


# ---- bug: cubin= as a Mapping that is no dict ----------------------------------------------------
class _Cubins(collections.abc.Mapping):
    def __init__(self, d: dict) -> None:
        self._d = d

    def __getitem__(self, k: str) -> bytes:
        return self._d[k]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


@pytest.mark.parametrize("wrap", [types.MappingProxyType, _Cubins],
                         ids=["mappingproxy", "abc_mapping"])
def test_cache_external_takes_cubin_mappings_like_kp_external(tmp_path: Path, sm90_cubin: bytes,
                                                              wrap: type) -> None:
    cubins = wrap({"sm_90": sm90_cubin})
    direct = kp.external("p", "axpy", _params(), 1, 256, cubin=cubins)
    assert [i.target for i in direct.modules[0].images] == ["sm_90"]
    cached = kp.Cache(tmp_path / "c").external("p", "axpy", _params(), 1, 256, cubin=cubins)
    assert cached.modules[0].images == direct.modules[0].images


# ---- regressions: mypy findings proved unreachable -----------------------------------------------
@pytest.mark.parametrize("call", [
    lambda: kp.exp(10 ** 400), lambda: kp.sqrt(-(10 ** 400)), lambda: kp.maximum(10 ** 400, 0.5),
    lambda: kp.minimum(0.5, -(10 ** 400)),
], ids=["exp", "sqrt_negative", "maximum", "minimum"])
def test_host_math_huge_int_is_a_trace_error(call) -> None:  # type: ignore[no-untyped-def]
    """_host_math.as_float: ``x.bit_length()`` on ``int | float`` (mypy union-attr); only an
    int can overflow float(), so the float branch is unreachable."""
    with pytest.raises(kp.TraceError, match=r"too large for a float64 .*1329 bits"):
        call()


def test_pad_and_iota_with_symbolic_sizes_trace() -> None:
    """ops.pad/iota compare ``Expr.value`` (``int | str | None``) with ints (mypy operator):
    guarded by ``is_const``, so symbolic sizes trace."""
    @kp.fusion
    def f(x: kp.Tensor[kp.f32, "n"], m: kp.i64):  # noqa: F821, UP037
        return kp.pad(x, m), kp.pad(x, x.shape[0] + 3), kp.iota((m, 4), axis=-1)

    @kp.fusion
    def g(x: kp.Tensor[kp.f32, 4], m: kp.i64):  # type: ignore[no-untyped-def]
        return kp.pad(x, m)

    assert f.trace() is not None and g.trace() is not None


def test_cache_entries_symlink_is_named_not_a_crash(tmp_path: Path, sm90_cubin: bytes) -> None:
    """cache/disk.py ``stat.S_ISLNK(mode)`` with ``mode: int | None`` (mypy arg-type): a
    missing component (None) never reaches it; a linked ``entries/`` is named."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / "c").mkdir()
    os.symlink(other, tmp_path / "c" / "entries")
    cache = kp.Cache(tmp_path / "c")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cache.external("axpy", "axpy", _params(), 1, 256, ptx=PTX, targets=["sm_90"])
    assert got.origin == "compiled" and os.listdir(other) == []
    assert any("is a symbolic link" in str(w.message) for w in caught)


def test_a_linked_entries_directory_is_named_a_link_not_world_writable(tmp_path) -> None:
    """lstat of a symbolic link reports mode 0777: the exposure check called a linked
    ``entries/`` "writable by every user" (review 40's side note)."""
    from kernelpack.cache.disk import DiskStore

    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (root / "entries").symlink_to(target)
    why = DiskStore(root).exposed("0" * 64)
    assert why is not None and "symbolic link" in why and "writable by every user" not in why
