"""kp.save: deterministic bytes, dedup rules, crash-safe writes, file objects, limits."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import serializer
from kernelpack.summary import Compiled, Image, Module

import kp_samples


def test_same_input_same_bytes() -> None:
    a = kp.save([kp_samples.axpy(), kp_samples.rich()])
    b = kp.save([kp_samples.rich(), kp_samples.axpy()])  # order of items does not matter
    assert a == b
    assert kp.save(kp_samples.axpy()) == kp.save(kp_samples.axpy())


def test_pinned_bytes_of_a_tiny_artifact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Exact-bytes pin of the writer (safetensors style): a change here is a format change.
    # The tiny image is stored uncompressed, so zstd's version cannot move this.
    import hashlib
    monkeypatch.setattr(serializer, "_generator", lambda: "kernelpack pinned")
    data = kp.save(kp_samples.tiny())
    assert data[4:8] == b"KPAK"
    assert len(data) == PINNED_SIZE
    assert hashlib.sha256(data).hexdigest()[:16] == PINNED_TINY


PINNED_TINY = "a48e914dc58fbd59"
PINNED_SIZE = 824


def test_resaving_a_loaded_pack_reproduces_bytes() -> None:
    data = kp.save([kp_samples.axpy(), kp_samples.rich()])
    pack = kp.load(data)
    assert kp.save(pack) == data
    assert kp.save([pack.compiled("axpy"), pack.compiled("rowsum")]) == data
    assert kp.save([pack]) == data


def test_shared_module_is_stored_once() -> None:
    a, b = kp_samples.axpy("a"), kp_samples.axpy("b")
    pack = kp.load(kp.save([a, b]))
    assert list(pack.modules) == ["axpy"]
    assert pack.programs == ["a", "b"]


def test_same_module_name_different_content() -> None:
    other = (kp_samples.fake_image("cubin", "sm_80", seed=42),)
    with pytest.raises(ValueError, match="two different modules are named 'axpy'"):
        kp.save([kp_samples.axpy("a"), kp_samples.axpy("b", images=other)])


def test_duplicate_program_names() -> None:
    with pytest.raises(ValueError, match="two programs are named 'axpy'"):
        kp.save([kp_samples.axpy(), kp_samples.axpy()])


def test_bad_items() -> None:
    with pytest.raises(TypeError, match="got str"):
        kp.save("axpy")
    with pytest.raises(TypeError, match="got int"):
        kp.save([kp_samples.axpy(), 3])


def test_zero_programs() -> None:
    pack = kp.load(kp.save([]))
    assert pack.programs == [] and len(pack) == 0 and pack.modules == {}
    pack.verify()


def test_unused_modules_are_not_stored() -> None:
    c = kp_samples.axpy()
    extra = Module("unused", ("k",), (kp_samples.fake_image(),))
    with_extra = Compiled(c.summary, (*c.modules, extra))
    assert kp.save(with_extra) == kp.save(c)


def test_identical_images_share_one_blob() -> None:
    img = kp_samples.fake_image("cubin", "sm_80")
    a = Compiled(kp_samples.axpy_summary("a", "m1"), (Module("m1", ("axpy",), (img,)),))
    b = Compiled(kp_samples.axpy_summary("b", "m2"), (Module("m2", ("axpy",), (img,)),))
    from kernelpack._fbread import Table
    data = kp.save([a, b])
    assert len(Table.root(data, "Pack").get("blobs")) == 1
    pack = kp.load(data)
    assert pack.modules["m1"].images[0].read() == pack.modules["m2"].images[0].read() == img.data


def test_codec_choice() -> None:
    pack = kp.load(kp.save([kp_samples.axpy(), kp_samples.tiny()]))
    assert {i.codec for i in pack.modules["axpy"].images} == {"zstd"}
    tiny = pack.modules["m"].images[0]
    assert tiny.codec == "none" and tiny.stored_size == tiny.raw_size == 84


def test_empty_image() -> None:
    c = Compiled(kp_samples.axpy_summary(), (Module("axpy", ("axpy",), (
        Image("cubin", "sm_80", b""),)),))
    pack = kp.load(kp.save(c))
    assert pack.modules["axpy"].images[0].read() == b""


def test_write_to_path_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.kpack"
    data = kp.save(kp_samples.axpy(), path)
    assert path.read_bytes() == data
    assert os.listdir(tmp_path) == ["a.kpack"]

    def crash(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(serializer.os, "replace", crash)
    with pytest.raises(OSError, match="disk on fire"):
        kp.save(kp_samples.rich(), path)
    assert path.read_bytes() == data  # the old file is intact
    assert os.listdir(tmp_path) == ["a.kpack"]  # and no temp file is left behind


def test_write_to_file_object_and_pathlike(tmp_path: Path) -> None:
    buf = io.BytesIO()
    data = kp.save(kp_samples.axpy(), buf)
    assert buf.getvalue() == data
    kp.save(kp_samples.axpy(), str(tmp_path / "b.kpack"))
    assert (tmp_path / "b.kpack").read_bytes() == data


def test_image_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serializer, "MAX_IMAGE_SIZE", 100)
    with pytest.raises(ValueError, match="exceed MAX_IMAGE_SIZE 100"):
        kp.save(kp_samples.axpy())
    bad = Compiled(kp_samples.axpy_summary(), (Module("axpy", ("axpy",), (
        Image("cubin", "sm_80", b"x", cuda_version=1 << 40),)),))
    with pytest.raises(ValueError, match="cuda_version must fit"):
        kp.save(bad)


def test_generator_has_no_timestamp() -> None:
    pack = kp.load(kp.save(kp_samples.axpy()))
    assert pack.generator == f"kernelpack {kp.__version__}"


def test_write_errors_name_the_path_not_a_temp_file(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as info:
        kp.save(kp_samples.axpy(), tmp_path)
    assert info.value.filename == str(tmp_path)
    missing = tmp_path / "no" / "a.kpack"
    with pytest.raises(FileNotFoundError) as info2:
        kp.save(kp_samples.axpy(), missing)
    assert info2.value.filename == str(missing)
    assert os.listdir(tmp_path) == []


def test_overwriting_keeps_the_file_mode(tmp_path: Path) -> None:
    """A new file gets 0666 & ~umask (pinned to 022 here: CI runners use 002 or 077 too, so
    a bare 0644 failed there); an overwrite keeps the mode the file has."""
    path = tmp_path / "a.kpack"
    old = os.umask(0o022)
    try:
        kp.save(kp_samples.axpy(), path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
    os.chmod(path, 0o600)
    kp.save(kp_samples.rich(), path)  # e.g. `kernelpack sign` in place
    assert os.stat(path).st_mode & 0o777 == 0o600
