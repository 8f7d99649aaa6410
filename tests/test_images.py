"""Lazy images of ``Pack.compiled`` (kernelpack._images): what a cache hit checks at once, what
it leaves for the first read of ``Image.data``, and that a lazy image is an ordinary Image."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

import kernelpack as kp
from kernelpack._fbread import Table
from kernelpack.errors import IntegrityError

import kp_samples


@pytest.fixture(scope="module")
def data() -> bytes:
    return kp.save(kp_samples.axpy())


def _images(compiled: kp.Compiled) -> list[kp.Image]:
    return [i for m in compiled.modules for i in m.images]


def test_hit_decompresses_nothing_until_data_is_read(data: bytes) -> None:
    pack = kp.load(data)
    compiled = pack.compiled("axpy")
    infos = pack.modules["axpy"].images
    assert all(i._data is None for i in infos)  # stored digests checked, nothing decompressed
    first = _images(compiled)[0]
    assert "data" not in first.__dict__
    assert first.data == kp_samples.axpy().modules[0].images[0].data
    assert infos[0]._data is not None and all(i._data is None for i in infos[1:])


def test_lazy_image_behaves_like_an_image(data: bytes) -> None:
    eager = kp_samples.axpy()
    for maker in (lambda c: c, copy.copy, copy.deepcopy,
                  lambda c: pickle.loads(pickle.dumps(c))):
        compiled = maker(kp.load(data).compiled("axpy"))
        assert compiled.modules == eager.modules
        assert [hash(i) for i in _images(compiled)] == [hash(i) for i in _images(eager)]
    image = _images(kp.load(data).compiled("axpy"))[1]
    assert dataclasses.replace(image, toolchain="x").data == _images(eager)[1].data
    assert repr(image) == repr(_images(eager)[1])
    assert image.sort_key() == _images(eager)[1].sort_key()
    # a lazy image carries its checked stored digest (the runtime's library-cache key), the
    # same one the loader's ImageInfo has, so loading it does not hash the bytes again
    info = next(i for m in kp.load(data).modules.values() for i in m.images
                if i.target == image.target)
    assert image.digest == info.digest


def test_saving_a_hit_gives_the_same_bytes(data: bytes) -> None:
    assert kp.save(kp.load(data).compiled("axpy")) == data


def test_corrupt_stored_bytes_fail_the_hit_itself(data: bytes) -> None:
    """A flipped blob byte is caught when the Compiled is made (so the cache quarantines the
    entry), not at the first launch."""
    bad = bytearray(data)
    blob = Table.root(data, "Pack").get("blobs")[2]
    bad[blob.target("data") + 8] ^= 0x40
    pack = kp.load(bytes(bad))
    with pytest.raises(IntegrityError, match="stored bytes do not match"):
        pack.compiled("axpy")


def test_a_bad_frame_size_fails_the_hit_itself(data: bytes, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    pack = kp.load(data)
    info = next(i for i in pack.modules["axpy"].images if i.codec == "zstd")
    monkeypatch.setattr(info, "raw_size", info.raw_size + 1)
    with pytest.raises(IntegrityError, match="zstd frame declares"):
        pack.compiled("axpy")


def test_raw_digest_is_still_checked_on_first_read(data: bytes,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pack = kp.load(data)
    compiled = pack.compiled("axpy")
    info = pack.modules["axpy"].images[0]
    monkeypatch.setattr(info, "raw_digest", "0" * 64)
    with pytest.raises(IntegrityError, match="raw_digest"):
        _images(compiled)[0].data
    with pytest.raises(IntegrityError):  # and again: a failed read caches nothing
        _images(compiled)[0].data


def test_unknown_attributes_still_raise(data: bytes) -> None:
    image = _images(kp.load(data).compiled("axpy"))[0]
    with pytest.raises(AttributeError, match="no attribute 'read'"):
        image.read  # noqa: B018 - the runtime probes for a loader ``read`` this way
    with pytest.raises(dataclasses.FrozenInstanceError):
        image.data = b""  # type: ignore[misc]


# ---- PackFile: the descriptor a large pack's images are read from -----------------------------
@pytest.mark.parametrize("owner", ["extension", "finalizer"])
def test_pack_file_descriptor_closes_with_its_last_reader(owner: str, tmp_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the last reference closes the private duplicate, whether the extension owns it
    (``owned_dup``: closed by no Python code, review 34) or, without it, a finalizer does."""
    import gc
    import os

    from kernelpack import _images

    if owner == "extension":
        pytest.importorskip("kernelpack.runtime._launch", reason="the C extension is not built")
        from kernelpack.runtime._launch import owned_dup  # noqa: F401 (an older build lacks it)
    else:
        monkeypatch.setattr(_images, "_OWNED_DUP", False)
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    with open(path, "rb") as f:
        pf = _images.PackFile(f.fileno(), str(path), 10)
    assert pf.read(2, 3, "test") == b"234"  # the original is closed; the duplicate reads
    assert (pf._owner is not None) == (owner == "extension")
    fd = pf.fd
    os.fstat(fd)
    del pf
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_owned_dup_refuses_what_is_no_descriptor() -> None:
    pytest.importorskip("kernelpack.runtime._launch", reason="the C extension is not built")
    from kernelpack.runtime._launch import owned_dup

    with pytest.raises(ValueError, match="not a file descriptor"):
        owned_dup(-1)
    with pytest.raises(OSError):
        owned_dup(2**31 - 2)  # (EBADF: nothing is open there)
    with pytest.raises(TypeError):
        owned_dup("3")
    owner = owned_dup(0)
    owner.close()
    owner.close()  # twice: nothing happens
    with pytest.raises(ValueError, match="closed"):
        owner.fileno()
