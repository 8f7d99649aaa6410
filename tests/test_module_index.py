"""kp.load's module index checked in C (``module_index`` in ``_fbread.c``).

A pack of many modules read into memory has its whole index checked by one C call that makes
only the module names; each :class:`~kernelpack.loader.ModuleInfo` then reads its kernel names
and image metadata on first use. The C check must accept exactly what the Python checks accept
(``ModuleInfo.__init__`` and ``loader._plain_images``) — it never refuses a file itself: where
it answers None the Python path decides and words the error — and an indexed module must give
what the eager index gave.
"""

from __future__ import annotations

import pickle
import random
import threading
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import _fbread, loader, verify
from kernelpack._fbread import Table
from kernelpack.errors import KernelPackError
from kernelpack.limits import MAX_IMAGE_SIZE
from test_lazy_index import image_facts
from test_review24_lazy_decode import BLOBS, HOSTILE, build as build_pack
from test_verify_c_differential import artifacts, body_of, mutate, strings

native = pytest.mark.skipif(_fbread._native_for(b"") is None,
                            reason="the C extension is not built")


def build(kernels: dict[int, list[str]] | None = None, *,
          names: dict[int, str] | None = None,
          images: dict[int, list[dict]] | None = None) -> bytes:
    """Review 24's pack of many modules, with these kernels, module names and images."""
    return build_pack(images, names=names, kernels=kernels)


def body_index(body: bytes | memoryview) -> tuple[Any, int]:
    """(the Module tables, the pack's blob count) of a verified body."""
    fbody = Table(body, verify.verify_buffer(body, "Body", identifier=None), "Body")
    return fbody.tables("modules"), len(BLOBS)


def c_says(modules: Any, blobs: int) -> list[str] | None:
    return _fbread.module_index(modules, loader._MODULE, loader._INDEX_LIMITS + (blobs,))


def python_says(modules: Any, blobs: int) -> list[str] | None:
    """What the Python checks make of every module: the names if all pass, else None."""
    names = []
    for i in range(len(modules)):
        name, kernels, metas = modules.tree(i, loader._MODULE)
        if not (name.isidentifier() and kernels == sorted(set(kernels)) and all(kernels)
                and loader._plain_images(metas, blobs)):
            return None
        names.append(name)
    return names


def outcome(data: bytes) -> Any:
    """Every module's name, kernels and image facts after load, or the error's words."""
    try:
        pack = kp.load(data)
        return {name: (m.name, m.kernels, image_facts(m.images))
                for name, m in pack.modules.items()}
    except KernelPackError as exc:
        return type(exc).__name__, str(exc)


def eager_outcome(data: bytes, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(loader, "_DEFER_TABLES_FROM", 10 ** 9)
        return outcome(data)


# ---- the C check against the Python checks --------------------------------------------------
KERNELS: dict[str, tuple[list[str], bool]] = {
    "one": (["k"], True),
    "none at all": ([], True),  # the eager check accepts an empty list
    "sorted": (["a", "b", "c"], True),
    "a prefix first": (["k", "k2", "k20"], True),
    "a prefix second": (["k2", "k"], False),
    "twice": (["k", "k"], False),
    "unsorted": (["b", "a"], False),
    "empty name": (["", "k"], False),
    "code point order": (["z", "é", "ü", "中"], True),
    "code point order broken": (["é", "z"], False),
    "astral after BMP": (["\uffff", "\U00010000"], True),
    "astral before BMP": (["\U00010000", "\uffff"], False),
}


@native
@pytest.mark.parametrize("label", list(KERNELS))
def test_kernel_names_are_judged_as_the_python_check_judges_them(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels, plain = KERNELS[label]
    data = build({4: kernels})
    modules, blobs = body_index(body_of(data))
    assert c_says(modules, blobs) == python_says(modules, blobs)
    assert (c_says(modules, blobs) is not None) == plain
    assert outcome(data) == eager_outcome(data, monkeypatch)


MODULE_NAMES = {"plain": ("m04x", True), "unicode identifier": ("modulé", True),
                "leading digit": ("4m", False), "dash": ("m-4", False),
                "empty": ("", False), "keyword is an identifier": ("class", True)}


@native
@pytest.mark.parametrize("label", list(MODULE_NAMES))
def test_module_names_are_judged_as_the_python_check_judges_them(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, plain = MODULE_NAMES[label]
    data = build(names={4: name})
    modules, blobs = body_index(body_of(data))
    assert c_says(modules, blobs) == python_says(modules, blobs)
    assert (c_says(modules, blobs) is not None) == plain
    assert outcome(data) == eager_outcome(data, monkeypatch)


EDGES = {
    "raw_size MAX_IMAGE_SIZE": {5: [dict(raw_size=MAX_IMAGE_SIZE)]},
    "raw_size 0": {5: [dict(raw_size=0)]},
    "arch 99.9": {5: [dict(major=99, minor=9)]},
    "arch 1.0": {5: [dict(major=1, minor=0)]},
    "suffixes in order": {5: [dict(major=9), dict(major=9, suffix=1, blob=1),
                              dict(major=9, suffix=2, blob=2)]},
    "kinds in order": {5: [dict(kind=0, major=9), dict(kind=1, major=9, blob=1),
                           dict(kind=2, major=9, blob=2)]},
    "the last blob": {5: [dict(blob=len(BLOBS) - 1, codec=1)]},
}  # (an unknown kind, suffix or codec is refused by the verifier, before the index)


@native
@pytest.mark.parametrize("label", list(HOSTILE) + list(EDGES))
def test_image_metadata_is_judged_as_the_python_check_judges_it(
        label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    images = HOSTILE[label][0] if label in HOSTILE else EDGES[label]
    data = build(images=images)
    modules, blobs = body_index(body_of(data))
    assert c_says(modules, blobs) == python_says(modules, blobs)
    if label in HOSTILE:
        assert c_says(modules, blobs) is None  # the Python path words these at load
        assert outcome(data) == HOSTILE[label][1:]
    assert outcome(data) == eager_outcome(data, monkeypatch)


@native
@pytest.mark.parametrize("seed", range(4))
def test_mutated_bodies_are_judged_as_the_python_check_judges_them(seed: int) -> None:
    """Random byte mutations of the corpus's bodies (those still verifying): the C check's
    answer is the Python checks' answer, and it never raises on a verified body."""
    rng = random.Random(seed)
    agreed = accepted = 0
    for name, data in artifacts().items():
        body = body_of(data)
        strs = strings(body)
        for _ in range(60 if name != "hundred" else 10):
            mutated = mutate(rng, body, strs)
            try:
                modules, _ = body_index(mutated)
            except KernelPackError:
                continue  # the verifier refuses it: module_index never sees it
            for blobs in (1, 5, 10 ** 6):
                try:
                    want: Any = python_says(modules, blobs)
                except UnicodeDecodeError:  # cannot happen to a verified body
                    raise AssertionError("verified body with a bad string") from None
                got = c_says(modules, blobs)
                assert got == want, (name, blobs)
                agreed += 1
                accepted += got is not None
    assert agreed > 300 and accepted > 30  # enough of both answers to say something


# ---- indexed modules ------------------------------------------------------------------------
@native
def test_an_indexed_pack_gives_the_eager_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    data = build({3: ["a", "k"], 7: ["k", "k2"]})
    pack = kp.load(data)
    assert all(m._source is not None and m._kernels is None and m._metas is None
               for m in pack.modules.values())  # the case under test
    assert outcome(data) == eager_outcome(data, monkeypatch)
    pack.verify()
    hundred = artifacts()["hundred"]
    assert outcome(hundred) == eager_outcome(hundred, monkeypatch)
    lazy, made = kp.load(hundred), None
    with monkeypatch.context() as m:
        m.setattr(loader, "_DEFER_TABLES_FROM", 10 ** 9)
        made = kp.load(hundred)
    for name in lazy.programs[:5]:
        assert lazy.compiled(name) == made.compiled(name)
        assert repr(lazy.modules[lazy[name].summary.variants[0].launches[0].module]) == \
            repr(made.modules[made[name].summary.variants[0].launches[0].module])


@native
def test_an_indexed_module_refuses_pickling_as_before() -> None:
    module = next(iter(kp.load(build()).modules.values()))
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(module)


@native
def test_racing_first_reads_of_an_indexed_module_agree() -> None:
    for _ in range(20):
        module = kp.load(build()).modules["m06"]
        barrier = threading.Barrier(6)
        seen: list[Any] = []

        def read(i: int) -> None:
            barrier.wait()
            seen.append((module.kernels, module.images) if i % 2 else
                        (module.images, module.kernels)[::-1])

        threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(images) for _, images in seen}) == 1  # one set of ImageInfo objects
        assert {kernels for kernels, _ in seen} == {("k",)}


@native
def test_a_small_or_mapped_pack_is_not_indexed_in_c(tmp_path: Any) -> None:
    small = kp.load(artifacts()["axpy"])
    assert all(m._source is None for m in small.modules.values())
    data = build()
    # a read-only view of the caller's bytearray can change after load: not deferred at all
    view = memoryview(bytearray(data)).toreadonly()
    assert all(m._source is None for m in kp.load(view).modules.values())
    assert all(m._source is not None for m in kp.load(bytearray(data)).modules.values())  # copied
    assert all(m._source is not None for m in kp.load(data).modules.values())


@native
def test_the_c_check_refuses_bad_arguments_without_reading_outside_the_buffer() -> None:
    modules, blobs = body_index(body_of(build()))
    limits = loader._INDEX_LIMITS + (blobs,)
    assert c_says(modules, blobs) is not None
    call = _fbread._native_index
    assert call is not None
    with pytest.raises(TypeError):
        call(modules.buf, modules.start, len(modules.offsets), loader._MODULE)
    with pytest.raises(TypeError):
        call(modules.buf, modules.start, len(modules.offsets), loader._MODULE, limits[:-1])
    with pytest.raises(ValueError):
        call(modules.buf, modules.start, len(modules.offsets), loader._MODULE[:2], limits)
    with pytest.raises(ValueError):
        call(modules.buf, modules.start, -1, loader._MODULE, limits)
    with pytest.raises(ValueError, match="outside the buffer"):
        call(modules.buf, len(modules.buf) - 2, 1, loader._MODULE, limits)
    with pytest.raises(ValueError, match="outside the buffer"):
        call(modules.buf, modules.start, len(modules.offsets) + 10 ** 6, loader._MODULE, limits)
    assert call(modules.buf, modules.start, 0, loader._MODULE, limits) == []
    # garbage bytes: errors or answers, never a crash
    rng = random.Random(7)
    for _ in range(300):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(4, 200)))
        try:
            call(junk, rng.randrange(len(junk)), rng.randrange(4), loader._MODULE, limits)
        except ValueError:
            pass
