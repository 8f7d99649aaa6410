"""Regressions from an adversarial review of the CLI and the signing helpers (no GPU, no
nvJitLink: the artifacts hold fake images from kp_samples)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main
from kernelpack.summary import Image

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402

save = pytest.importorskip("kernelpack.serializer").save


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture()
def axpy_file(tmp_path: Path) -> Path:
    path = tmp_path / "a.kpack"
    save([kp_samples.axpy()], path)  # cubin sm_80, cubin sm_90, ptx compute_80
    return path


# ---- inspect --device: why no image is usable ----------------------------------------------------
def test_no_usable_image_text_lists_every_rejected_image(axpy_file, capsys) -> None:
    """The reasons used to vanish from the text output: printable_facts escaped the error's
    newlines, so splitting it into lines found nothing after the first."""
    code, out, _ = run(capsys, "inspect", axpy_file, "--device", "sm_75")
    assert code == 0 and "on sm_75: no usable image" in out
    assert "cubin sm_90: rejected: a cubin runs only on 9.x devices (device is 7.5)" in out
    assert "ptx compute_80 (ISA 8.0): rejected: PTX for 8.0 is newer than the device" in out
    code, out, _ = run(capsys, "inspect", axpy_file, "--device", "sm_86", "--driver", "11.0")
    assert code == 0 and "on sm_86 (driver CUDA 11.0): no usable image" in out
    # an 11.x driver has no cuLibraryLoadData: every image is rejected for that (review 28)
    assert "rejected: the driver's CUDA 11.0 predates cuLibraryLoadData (CUDA 12.0)" in out


def test_no_usable_image_json_has_structured_reasons(axpy_file, capsys) -> None:
    code, out, _ = run(capsys, "inspect", axpy_file, "--device", "sm_75", "--json")
    sel = json.loads(out)["modules"][0]["selection"]
    assert code == 0 and sel["chosen"] is None and "no image of module" in sel["error"]
    assert [r["image"] for r in sel["reasons"]] == ["cubin sm_80", "cubin sm_90",
                                                    "ptx compute_80 (ISA 8.0)"]
    assert all(r["reason"].startswith("rejected: ") for r in sel["reasons"])


# ---- diff: same bytes, different driver requirements ---------------------------------------------
def test_diff_reports_a_changed_cuda_version_of_identical_bytes(tmp_path, capsys) -> None:
    """A driver gates an image on its cuda_version (and PTX ISA): artifacts whose images differ
    only there load differently, so they are not identical."""
    def build(cuda: int, name: str) -> Path:
        image = Image("cubin", "sm_80", b"\x7fELF" * 40, "t", cuda)
        path = tmp_path / name
        save([kp_samples.axpy(images=(image,))], path)
        return path

    a, b = build(12080, "a.kpack"), build(13000, "b.kpack")
    code, out, _ = run(capsys, "diff", a, b)
    assert code == 1 and "~ image sm_80: cuda_version 12080 -> 13000" in out
    assert run(capsys, "diff", a, build(12080, "a2.kpack")) == (0, "", "")


# ---- extract: never write through a link or over a directory -------------------------------------
def test_extract_refuses_a_dangling_symlink_without_force(axpy_file, tmp_path, capsys) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    (out_dir / "axpy.sm_80.cubin").symlink_to(victim)
    code, out, err = run(capsys, "extract", axpy_file, "-o", out_dir)
    assert code == 1 and "refusing to overwrite" in err and not victim.exists()
    code, out, err = run(capsys, "extract", axpy_file, "-o", out_dir, "--force")
    assert code == 1 and "not a regular file" in err and not victim.exists()
    assert sorted(p.name for p in out_dir.iterdir()) == ["axpy.sm_80.cubin"]  # nothing written


def test_extract_force_fails_before_writing_when_a_target_is_a_directory(axpy_file, tmp_path,
                                                                         capsys) -> None:
    out_dir = tmp_path / "out"
    (out_dir / "axpy.sm_90.cubin").mkdir(parents=True)
    code, _, err = run(capsys, "extract", axpy_file, "-o", out_dir, "--force")
    assert code == 1 and "axpy.sm_90.cubin: exists and is not a regular file" in err
    assert sorted(p.name for p in out_dir.iterdir()) == ["axpy.sm_90.cubin"]
    code, out, _ = run(capsys, "extract", axpy_file, "-o", tmp_path / "fresh")
    assert code == 0 and len(list((tmp_path / "fresh").iterdir())) == 3


# ---- signing: PEM keys that cannot be used -------------------------------------------------------
def _pem_files(tmp_path: Path) -> dict[str, Path]:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    key = ed25519.Ed25519PrivateKey.generate()
    other = x25519.X25519PrivateKey.generate()
    files = {
        "encrypted": key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                       ser.BestAvailableEncryption(b"pw")),
        "garbage": b"-----BEGIN PRIVATE KEY-----\nzzzz\n-----END PRIVATE KEY-----\n",
        "good": key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                  ser.NoEncryption()),
        "good_pub": key.public_key().public_bytes(ser.Encoding.PEM,
                                                  ser.PublicFormat.SubjectPublicKeyInfo),
        "x25519_pub": other.public_key().public_bytes(ser.Encoding.PEM,
                                                      ser.PublicFormat.SubjectPublicKeyInfo),
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp_path / f"{name}.pem"
        out[name].write_bytes(data)
    return out


def test_sign_with_an_unusable_pem_key_is_a_one_line_error(axpy_file, tmp_path, capsys) -> None:
    """An encrypted PEM key made cryptography raise TypeError: a traceback from the CLI."""
    pems = _pem_files(tmp_path)
    for name in ("encrypted", "garbage"):
        code, _, err = run(capsys, "sign", axpy_file, "--key", pems[name],
                           "-o", tmp_path / "s.kpack")
        assert code == 1 and err.startswith(f"error: {pems[name]}: not a usable PEM private key")
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "s.kpack").exists()
    code, out, _ = run(capsys, "sign", axpy_file, "--key", pems["good"], "-o",
                       tmp_path / "s.kpack")
    assert code == 0
    code, out, _ = run(capsys, "verify", tmp_path / "s.kpack", "--trusted-key",
                       pems["good_pub"])
    assert code == 0 and "(trusted)" in out


def test_trusting_a_non_ed25519_or_broken_pem_names_the_file(axpy_file, tmp_path) -> None:
    from kernelpack.signing import load_public_key

    pems = _pem_files(tmp_path)
    with pytest.raises(ValueError, match=r"x25519_pub\.pem: not an ed25519 public key"):
        load_public_key(pems["x25519_pub"])
    with pytest.raises(ValueError, match=r"garbage\.pem: not a usable PEM public key"):
        load_public_key(pems["garbage"])
    signed = save(kp.load(axpy_file), tmp_path / "s.kpack", sign_with=pems["good"])
    assert kp.load(signed, trusted_keys=[pems["good_pub"]]).signature.verified
    with pytest.raises(ValueError, match=r"x25519_pub\.pem"):
        kp.load(signed, trusted_keys=[pems["x25519_pub"]])


# ---- output that the terminal cannot encode ------------------------------------------------------
def test_non_ascii_names_on_an_ascii_terminal(tmp_path) -> None:
    """With PYTHONIOENCODING=ascii, a non-ASCII program name stopped inspect half-way with
    UnicodeEncodeError; it is now shown escaped."""
    path = tmp_path / "u.kpack"
    save([kp_samples.axpy("\u00f1ame", "m\u00f6dule")], path)
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    for argv in (["inspect", str(path)], ["eval", str(path), "\u00f1ame", "x=3", "y=3"]):
        proc = subprocess.run([sys.executable, "-m", "kernelpack.cli", *argv], env=env,
                              capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert b"\\xf1ame" in proc.stdout and b"Traceback" not in proc.stderr


def test_tolerant_output_leaves_utf8_streams_alone() -> None:
    from kernelpack.cli import _tolerant_output

    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    old = sys.stdout
    sys.stdout = buf
    try:
        _tolerant_output()
    finally:
        sys.stdout = old
    assert buf.errors == "strict"


# ---- help names every positional argument --------------------------------------------------------
@pytest.mark.parametrize("command", ["inspect", "verify", "extract", "eval", "diff", "sign"])
def test_help_explains_positional_arguments(command, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "a .kpack artifact" in out or "the old artifact" in out


# ---- eval: an unknown name is named as such, whatever its value looks like --------------------
def test_eval_unknown_parameter_is_named_before_its_value_is_parsed(axpy_file, capsys) -> None:
    """``q=0.5`` used to fail as "q: expected an integer" (a guess at an unknown name's kind)
    instead of saying that axpy has no input q."""
    for value in ("q=0.5", "q=abc", "q=3"):
        code, _, err = run(capsys, "eval", axpy_file, "axpy", "x=4", "y=4", value)
        assert (code, err) == (1, "error: axpy has no input 'q' (inputs: x, y, a)\n")
    code, _, err = run(capsys, "eval", axpy_file, "axpy", "x=4", "y=4", "n32=4")
    assert code == 1 and "computed from the shapes" in err


# ---- verify: a signature that does not hold is never "OK" ----------------------------------------
def test_verify_without_trusted_keys_still_refuses_a_broken_signature(tmp_path, capsys) -> None:
    """Without --trusted-key the signature was not looked at: a file whose signature does not
    verify under its own key (changed after signing) passed ``verify`` with exit status 0."""
    import hashlib

    from kernelpack import serializer
    from kernelpack.signing import sign_digest

    body, blobs = serializer.encode(serializer._collect([kp_samples.axpy()]))
    key = bytes(range(32))
    good, bad = tmp_path / "good.kpack", tmp_path / "bad.kpack"
    good.write_bytes(serializer.assemble(body, blobs,
                                         sign_digest(key, hashlib.sha256(body).digest())))
    bad.write_bytes(serializer.assemble(body, blobs,
                                        sign_digest(key, hashlib.sha256(b"other").digest())))
    code, out, _ = run(capsys, "verify", good)
    assert code == 0 and "signature intact" in out
    code, out, err = run(capsys, "verify", bad)
    assert (code, out) == (1, "") and err.startswith(f"error: {bad}: signature by key ")
    assert "does not verify" in err
    kp.load(bad)  # the library itself checks signatures only against trusted keys


def test_save_refuses_a_bytes_path_with_a_clear_type_error(tmp_path) -> None:
    """``kp.save(items, b"out.kpack")`` failed inside the temp-file naming with "can only
    concatenate str (not "bytes") to str"."""
    with pytest.raises(TypeError, match=r"kp.save writes to a path .* \(got bytes\)"):
        save([kp_samples.axpy()], os.fsencode(tmp_path / "x.kpack"))
    assert list(tmp_path.iterdir()) == []


# ---- kp.load never waits on a FIFO ---------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_load_refuses_a_fifo_instead_of_waiting_for_a_writer(tmp_path) -> None:
    """open() of a FIFO blocks until someone writes to it: kp.load hung forever."""
    fifo = tmp_path / "pipe.kpack"
    os.mkfifo(fifo)
    code = ("import sys, kernelpack as kp\n"
            "try:\n    kp.load(sys.argv[1])\n"
            "except kp.errors.KernelPackError as exc:\n    print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                          text=True, timeout=30)
    assert proc.stdout.startswith(f"FormatError {fifo}: not a regular file"), proc.stderr
    with pytest.raises(IsADirectoryError):  # directories and missing paths: OSError, as before
        kp.load(tmp_path)


# ---- checking every image must not keep every image ----------------------------------------------
def test_verify_keeps_checked_images_only_up_to_a_budget(monkeypatch) -> None:
    """A 10 KB file can declare thousands of images of up to 1 GiB (identical stored bytes
    share one blob): Pack.verify() decompressed and kept every one, so ``kernelpack verify``
    of such a file allocated the sum of all raw sizes."""
    from kernelpack import loader

    monkeypatch.setattr(loader, "_VERIFY_KEEP_BYTES", 1000)
    pack = kp.load(save([kp_samples.axpy()]))  # three images of 604 raw bytes
    pack.verify()
    images = list(pack.modules["axpy"].images)
    assert [i._data is not None for i in images] == [True, False, False]
    assert all(len(i.read()) == 604 for i in images)  # still readable, checked again


def test_extract_and_read_keep_false_hold_no_image(axpy_file, tmp_path, capsys) -> None:
    pack = kp.load(axpy_file)
    image = pack.modules["axpy"].images[0]
    raw = image.read(keep=False)
    assert image._data is None and image.read() == raw and image._data is not None
    code, _, _ = run(capsys, "extract", axpy_file, "-o", tmp_path / "x")
    assert code == 0
    written = {p.name: p.read_bytes() for p in (tmp_path / "x").iterdir()}
    assert written == {f"axpy.{i.target}.{'ptx' if i.kind == 'ptx' else 'cubin'}": i.read()
                       for i in pack.modules["axpy"].images}


# ---- cache ls / explain: record text never drives the terminal -----------------------------------
def test_cache_ls_and_explain_escape_control_characters(tmp_path, capsys) -> None:
    """A key record (which a shared remote cache may have written) is printed by ``cache ls``
    and ``cache explain``: its ESC sequences reached the terminal raw."""
    from kernelpack.cache.disk import DiskStore
    from kernelpack.cache.keys import CacheKey

    store = DiskStore(tmp_path)
    key = CacheKey.from_parts([("kind", "evil\x1b[2J"), ("note", "title\x1b]0;x\x07")])
    store.put(key, save([kp_samples.axpy()]))
    store.record_parts(key)
    code, out, _ = run(capsys, "cache", "ls", "--dir", tmp_path)
    assert code == 0 and "evil\\x1b[2J" in out and "\x1b" not in out
    code, out, _ = run(capsys, "cache", "explain", "--dir", tmp_path, key.digest[:12])
    assert code == 0 and "title\\x1b]0;x\\x07" in out and "\x1b" not in out


# ---- sign wraps the verified bytes; it does not re-encode them -----------------------------------
def test_sign_keeps_the_verified_body_and_blobs(tmp_path, capsys, monkeypatch) -> None:
    """``sign`` re-saved the pack: every image decompressed and held at once (a 10 KB file
    declaring gigabytes made it allocate them all) and recompressed, so the signed blobs were
    not the verified ones whenever another writer (or zstd level) had made the file."""
    from kernelpack import serializer
    from kernelpack.signing import write_keypair

    key, pub = write_keypair(tmp_path / "k")
    ours, other = tmp_path / "ours.kpack", tmp_path / "other.kpack"
    save([kp_samples.axpy()], ours)
    code, _, _ = run(capsys, "sign", ours, "--key", key, "-o", tmp_path / "s1.kpack")
    assert code == 0
    assert (tmp_path / "s1.kpack").read_bytes() == save(kp.load(ours), sign_with=key)

    monkeypatch.setattr(serializer, "ZSTD_LEVEL", 1)  # "another writer"
    original = save([kp_samples.axpy()], other)
    monkeypatch.undo()
    code, _, _ = run(capsys, "sign", other, "--key", key)  # in place
    assert code == 0
    signed = kp.load(other, trusted_keys=[pub])
    before = kp.load(original)
    assert signed.body_digest == before.body_digest
    assert [bytes(i._stored) for i in signed.modules["axpy"].images] == \
        [bytes(i._stored) for i in before.modules["axpy"].images]
