"""Review 3: the loader and CLI under files that change after load, and hostile sizes.

- A memory-mapped artifact truncated after ``kp.load`` must give IntegrityError on the next
  image read, never SIGBUS (run in a child process: a crash there fails the test, not pytest).
- ``kernelpack extract`` refuses to write more than ``--max-bytes`` in total.
- ``kernelpack verify`` / ``sign`` check a signature's integrity with the digest verified at
  load: one load of the file, and a tampered signature still fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import cli, loader, signing
from kernelpack.errors import IntegrityError
from kernelpack.summary import Image

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def _big(path: Path, sign_with: bytes | None = None) -> Path:
    """An artifact over loader._READ_LIMIT (so it is memory-mapped), images uncompressible."""
    kp.save([kp_samples.axpy(images=(Image("cubin", "sm_80", os.urandom(3 << 19)),))], path,
            sign_with=sign_with)
    assert path.stat().st_size > loader._READ_LIMIT
    return path


_CHILD = textwrap.dedent("""
    import os, sys
    import kernelpack as kp
    from kernelpack.errors import KernelPackError
    path, how = sys.argv[1], sys.argv[2]
    pack = kp.load(path)
    if how == "compiled":
        compiled = pack.compiled("axpy")  # stored digests checked now, data read lazily
    os.truncate(path, 4096)
    try:
        if how == "verify":
            pack.verify()
        elif how == "compiled":
            compiled.modules[0].images[0].data
        elif how == "resign":
            from kernelpack.serializer import resign
            from kernelpack.signing import generate_private_key
            resign(pack, generate_private_key())
    except KernelPackError as exc:
        print(type(exc).__name__, exc)
        sys.exit(0)
    sys.exit(3)
""")


@pytest.mark.parametrize("how", ["verify", "compiled", "resign"])
def test_truncated_after_load_is_an_error_not_sigbus(tmp_path: Path, how: str) -> None:
    path = _big(tmp_path / "big.kpack")
    run = subprocess.run([sys.executable, "-c", _CHILD, str(path), how],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)  # -7: SIGBUS
    assert run.stdout.startswith("IntegrityError ")
    assert str(path) in run.stdout and "truncated" in run.stdout


def test_mapped_file_rewritten_in_place_is_checked_at_each_read(tmp_path: Path) -> None:
    path = _big(tmp_path / "big.kpack")
    pack = kp.load(path)
    with open(path, "r+b") as f:
        f.write(b"\xff" * path.stat().st_size)
    with pytest.raises(IntegrityError, match="stored bytes do not match their digest"):
        pack.verify()


def test_mapped_pack_reads_images_and_closes_its_descriptor(tmp_path: Path) -> None:
    path = _big(tmp_path / "big.kpack")
    pack = kp.load(path)
    raw = pack.compiled("axpy").modules[0].images[0].data
    assert raw == kp.load(path.read_bytes()).compiled("axpy").modules[0].images[0].data
    fd = pack._file.fd
    os.fstat(fd)  # open while the pack lives
    del pack, raw
    import gc

    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def _hostile_many_images(tmp_path: Path) -> Path:
    """Many modules whose images share one tiny zstd blob declaring 64 MiB raw."""
    import zstandard

    raw = bytes(64 << 20)
    frame = zstandard.ZstdCompressor().compress(raw)
    assert len(frame) < 64 << 10
    image = Image("cubin", "sm_80", raw)
    compiled = [kp_samples.axpy(name=f"p{i}", module=f"m{i}", images=(image,))
                for i in range(3)]
    path = tmp_path / "many.kpack"
    kp.save(compiled, path)
    assert path.stat().st_size < 1 << 20
    return path


def test_extract_refuses_a_total_over_max_bytes(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _hostile_many_images(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["extract", str(path), "-o", str(out), "--max-bytes", "100M"]) == 1
    err = capsys.readouterr().err
    assert f"would write {3 * (64 << 20)} bytes in 3 file(s), over the limit of " \
           f"{100 << 20}" in err and "--max-bytes" in err
    assert not out.exists()  # nothing created
    assert cli.main(["extract", str(path), "-o", str(out), "--max-bytes", "192M"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"m{i}.sm_80.cubin" for i in range(3)]


def test_extract_default_limit_and_bad_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _hostile_many_images(tmp_path)
    monkeypatch.setattr(cli, "EXTRACT_LIMIT", 1 << 20)
    assert cli.main(["extract", str(path), "-o", str(tmp_path / "o")]) == 1
    assert "over the limit of 1048576" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["extract", str(path), "-o", str(tmp_path / "o"), "--max-bytes", "lots"])
    assert exc.value.code == 2
    assert "expected a size in bytes" in capsys.readouterr().err


@pytest.fixture(scope="module")
def key() -> bytes:
    return signing.generate_private_key()


def test_verify_of_a_signed_file_loads_it_once(tmp_path: Path, key: bytes,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.kpack"
    kp.save([kp_samples.tiny()], path, sign_with=key)
    calls: list[object] = []
    real = loader.load
    monkeypatch.setattr(loader, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert cli.main(["verify", str(path)]) == 0
    assert len(calls) == 1
    assert "signature intact" in capsys.readouterr().out


def test_verify_and_sign_refuse_a_tampered_signature(tmp_path: Path, key: bytes,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.kpack"
    data = bytearray(kp.save([kp_samples.tiny()], sign_with=key))
    sig = bytes(kp.load(bytes(data))._signed[1])
    at = bytes(data).index(sig)
    data[at] ^= 1  # the signature bytes only: structure and body digest still verify
    path.write_bytes(bytes(data))
    assert kp.load(path).signature is not None  # loads without trusted keys
    assert cli.main(["verify", str(path)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and "does not verify" in err
    keyfile = tmp_path / "k"
    keyfile.write_text(key.hex() + "\n")
    assert cli.main(["sign", str(path), "--key", str(keyfile), "-o", str(tmp_path / "o.kpack")]) == 1
    assert "does not verify" in capsys.readouterr().err
    assert not (tmp_path / "o.kpack").exists()


def test_extract_non_ascii_module_names_get_one_file_each(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "u.kpack"
    kp.save([kp_samples.axpy(name="größe", module="mé"),
             kp_samples.axpy(name="größè", module="mè"),
             kp_samples.axpy(name="plain", module="plain")], path)
    out = tmp_path / "out"
    assert cli.main(["extract", str(path), "-o", str(out)]) == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 9 and "plain.sm_80.cubin" in names  # 3 modules x 3 images
    assert all(n.isascii() and n.startswith(("m_-", "plain.")) for n in names)
    raw = kp.load(path).compiled("größe").modules[0].images[0].data
    cubins = [n for n in names if n.startswith("m_-") and n.endswith(".sm_80.cubin")]
    assert len(cubins) == 2 and all((out / n).read_bytes() == raw for n in cubins)
