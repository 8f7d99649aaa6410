"""kp.load's index of a pack, made lazily where that cannot change an outcome: a Program's
table is made when it is decoded (``_fbread.Tables``), a module's ImageInfo objects when its
``images`` are first read (their metadata is still checked at load: ``loader._plain_images``
accepts only what ImageInfo would, and anything else is made, and refused, at load)."""

from __future__ import annotations

import random
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import loader, verify
from kernelpack._fbread import Table, Tables, tree_spec
from kernelpack._images import ImageInfo
from kernelpack.errors import KernelPackError
from kernelpack.limits import FILE_IDENTIFIER

from test_verify_c_differential import artifacts, body_of, mutate, strings

_NAME = tree_spec("Program", ("name",))


def body_table(data: bytes) -> Table:
    body = body_of(data)
    return Table(body, verify.verify_buffer(body, "Body", identifier=None), "Body")


def test_tables_are_the_vectors_tables_made_on_request() -> None:
    for name, data in artifacts().items():
        body = body_table(data)
        for field in ("programs", "modules"):
            made, lazy = body.get(field), body.tables(field)
            assert isinstance(lazy, Tables) and len(lazy) == len(made), (name, field)
            assert [t.pos for t in lazy] == [t.pos for t in made]
            assert [lazy[i].pos for i in range(len(lazy))] == [t.pos for t in made]
            assert [lazy.position(i) for i in range(len(lazy))] == [t.pos for t in made]
            spec = tree_spec(made[0].name, ("name",)) if made else _NAME
            assert [lazy.tree(i, spec) for i in range(len(lazy))] == [t.tree(spec) for t in made]
            for bad in (-1, len(lazy)):
                with pytest.raises(IndexError):
                    lazy[bad]
                with pytest.raises(IndexError):
                    lazy.tree(bad, spec)


def test_an_absent_vector_is_empty() -> None:
    body = body_table(artifacts()["hand"])
    empty = Tables(body.buf, 0, (), "Program")
    assert len(empty) == 0 and list(empty) == []
    with pytest.raises(IndexError):
        empty[0]


def loadable() -> list[Any]:
    """The corpus's artifacts that load (some are there for the verifier only)."""
    out = []
    for data in artifacts().values():
        try:
            out.append(kp.load(data))
        except KernelPackError:
            pass
    return out


def image_facts(images: Any) -> list[tuple]:
    return [(i.module, i.kind, i.arch, i.codec, i.stored_size, i.raw_size, i.digest,
             i.raw_digest, i.toolchain, i.cuda_version, i.ptx_isa, i.blob, i.target)
            for i in images]


@pytest.fixture(autouse=True)
def defer_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defer in packs of any size (kp.load defers only in packs of many modules/programs)."""
    monkeypatch.setattr(loader, "_DEFER_TABLES_FROM", 0)


def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every table and ImageInfo at load, as kp.load did before the lazy index."""
    monkeypatch.setattr(loader, "_DEFER_TABLES_FROM", 10 ** 9)


def outcome(data: bytes) -> Any:
    """What loading ``data`` and reading every module's images gives: the images' facts per
    module, or the error's type and words."""
    try:
        pack = kp.load(data)
        return {name: image_facts(m.images) for name, m in pack.modules.items()}
    except KernelPackError as exc:
        return type(exc).__name__, str(exc)


def test_lazy_images_are_the_images_made_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    lazy = {name: outcome(data) for name, data in artifacts().items()}
    assert any(isinstance(v, dict) and v for v in lazy.values())
    deferred = sum(m._images is None for pack in loadable() for m in pack.modules.values())
    assert deferred > 10  # most modules of the corpus defer their images
    eager(monkeypatch)
    assert lazy == {name: outcome(data) for name, data in artifacts().items()}


@pytest.mark.parametrize("seed", range(3))
def test_mutated_packs_load_or_fail_as_before(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutations of the body (re-digested, so that load gets to the index): the lazy index
    fails at load exactly where and how the eager one did, and where it loads, the images it
    makes later are the eager ones."""
    rng = random.Random(seed)
    cases: list[bytes] = []
    for name, data in artifacts().items():
        if name == "hundred":
            continue
        body = body_of(data)
        strs = strings(body)
        for _ in range(120):
            cases.append(rebuild(data, mutate(rng, body, strs)))
    lazy = [outcome(c) for c in cases]
    eager(monkeypatch)
    assert lazy == [outcome(c) for c in cases]
    assert sum(isinstance(v, dict) for v in lazy) > 20  # enough loads to say something
    assert sum(isinstance(v, tuple) for v in lazy) > 20  # and enough refusals


def metas(module: loader.ModuleInfo) -> Any:
    """A module's image metadata as Table.tree read it (an indexed module's, read now)."""
    if module._metas is None:
        module._read()
    return module._metas


def rebuild(data: bytes, body: bytes) -> bytes:
    """``data`` (an unsigned artifact) with its body replaced by ``body`` of the same length
    and the body digest fixed, so that load checks the new body's index."""
    import hashlib

    pack = Table(data, verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER), "Pack")
    start = pack.target("body") + 4
    digest_at = pack.target("body_digest") + 4
    out = bytearray(data)
    out[start:start + len(body)] = body
    out[digest_at:digest_at + 32] = hashlib.sha256(body).digest()
    return bytes(out)


def test_bad_image_metadata_is_still_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thing ImageInfo checks, broken in one image of a pack that otherwise defers its
    images: load refuses it, with ImageInfo's words."""
    data = artifacts()["axpy"]
    pack = kp.load(data)
    module = next(iter(pack.modules.values()))
    assert module._images is None  # deferred: the case under test
    good = list(metas(module)[0])
    breaks = {0: 3, 1: 0, 2: 10, 3: 3, 7: 2, 8: (1 << 30) + 1, 9: b"x" * 31, 10: b"x" * 33,
              11: 10 ** 6}
    for index, value in breaks.items():
        meta = list(good)
        meta[index] = value
        with pytest.raises(Exception) as lazy_exc:
            loader.ModuleInfo([module.name, list(module.kernels), [meta]], module._blobs)
        with pytest.raises(Exception) as direct:
            ImageInfo(module.name, meta, module._blobs)
        assert (type(lazy_exc.value), str(lazy_exc.value)) == \
            (type(direct.value), str(direct.value)), index
    assert not loader._plain_images([], 1)
    assert loader._plain_images([good], 10 ** 6)
    assert not loader._plain_images([good, good], 10 ** 6)  # two images for one target


def test_a_raw_image_is_made_at_load() -> None:
    """An uncompressed image's stored size is checked against its raw_size when the pack is
    loaded, so such a module makes its images then."""
    raw = [m for pack in loadable() for m in pack.modules.values()
           if any(meta[7] == 0 for meta in metas(m))]
    assert raw, "the corpus has an image stored uncompressed"
    assert all(m._images is not None for m in raw)


def test_only_large_packs_defer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small pack's modules and programs are all likely used: it makes them at load (the
    first call does not pay for deferring); a pack of many defers."""
    monkeypatch.undo()
    small, large = kp.load(artifacts()["axpy"]), kp.load(artifacts()["hundred"])
    assert len(small.modules) <= loader._DEFER_TABLES_FROM < len(large.modules)
    assert all(m._images is not None for m in small.modules.values())
    assert isinstance(small._programs, list)
    assert all(m._images is None for m in large.modules.values())
    assert isinstance(large._programs, Tables)
    name = large.programs[3]
    assert large[name].summary == kp.load(artifacts()["hundred"]).compiled(name).summary
    used = large[name].modules
    assert [m._images is not None for m in used.values()] == [False] * len(used)
    assert all(image_facts(m.images) for m in used.values())
