"""Review 5: every documented and common key form works for ``sign_with`` / ``trusted_keys``.

Were: a 64-hex-digit seed string (what keygen writes) was opened as a file name; a hex public
key read with ``open(...).read()`` (trailing newline) and a ``memoryview`` were refused; PEM
contents given as bytes were refused; ``ssh-keygen -t ed25519`` keys (OpenSSH format) were
refused; a wrong-length seed was a TypeError saying "must be ... 32 bytes (got bytes)".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

import kernelpack as kp
from kernelpack import signing

import kp_samples


@pytest.fixture
def key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _raw_pub(key: ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def test_hex_seed_string_signs_like_the_key_file(key, tmp_path: Path) -> None:
    private, public = signing.write_keypair(tmp_path / "team")
    text = Path(private).read_text()
    by_file = kp.save([kp_samples.axpy()], sign_with=private)
    assert kp.save([kp_samples.axpy()], sign_with=text) == by_file
    assert kp.save([kp_samples.axpy()], sign_with=text.strip()) == by_file
    # a public key read as text (trailing newline included) is trusted as written
    pack = kp.load(by_file, trusted_keys=Path(public).read_text())
    assert pack.signature.verified
    assert kp.load(by_file, trusted_keys=[Path(public).read_bytes()]).signature.verified


def test_memoryview_and_pem_bytes(key) -> None:
    signed = kp.save([kp_samples.axpy()], sign_with=memoryview(bytes(range(32))))
    pub = _raw_pub(key)
    assert kp.load(signed, trusted_keys=memoryview(pub)).signature.verified
    pem_private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                    ser.NoEncryption())
    pem_public = key.public_key().public_bytes(ser.Encoding.PEM,
                                               ser.PublicFormat.SubjectPublicKeyInfo)
    assert kp.save([kp_samples.axpy()], sign_with=pem_private) == signed
    assert kp.load(signed, trusted_keys=[pem_public]).signature.verified


def test_openssh_key_files(key, tmp_path: Path) -> None:
    (tmp_path / "id_ed25519").write_bytes(key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()))
    (tmp_path / "id_ed25519.pub").write_bytes(key.public_key().public_bytes(
        ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH) + b" user@host\n")
    signed = kp.save([kp_samples.axpy()], sign_with=tmp_path / "id_ed25519")
    assert signed == kp.save([kp_samples.axpy()], sign_with=key)
    pack = kp.load(signed, trusted_keys=[tmp_path / "id_ed25519.pub"])
    assert pack.signature.verified and pack.signature.public_key == _raw_pub(key).hex()
    # an OpenSSH RSA key is named as not ed25519, not a traceback
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_pub = rsa.generate_private_key(65537, 1024).public_key()
    (tmp_path / "id_rsa.pub").write_bytes(rsa_pub.public_bytes(ser.Encoding.OpenSSH,
                                                               ser.PublicFormat.OpenSSH))
    with pytest.raises(ValueError, match=r"id_rsa\.pub: not an ed25519 public key"):
        kp.load(signed, trusted_keys=[tmp_path / "id_rsa.pub"])


def test_wrong_keys_name_what_is_wrong(key) -> None:
    with pytest.raises(ValueError, match=r"3 bytes, not the 32-byte seed"):
        kp.save([kp_samples.axpy()], sign_with=b"abc")
    with pytest.raises(TypeError, match="a public key cannot sign"):
        kp.save([kp_samples.axpy()], sign_with=key.public_key())
    with pytest.raises(ValueError, match=r"not an ed25519 public key: .*\(got 3 bytes\)"):
        kp.load(kp.save([kp_samples.axpy()], sign_with=key), trusted_keys=[b"abc"])
    # a string that is neither 64 hex digits nor an existing file stays a missing file,
    # named as the parameter it was given as
    with pytest.raises(ValueError, match=r"sign_with: cannot read key file 'no-such-key-file'"):
        kp.save([kp_samples.axpy()], sign_with="no-such-key-file")


def test_verify_digest_takes_one_bare_key(key) -> None:
    """Was: a bare hex string or path was iterated as one-character "keys"."""
    import hashlib

    digest = hashlib.sha256(b"body").digest()
    public, sig = signing.sign_digest(key, digest)
    signing.verify_digest(public, sig, digest, public.hex())
    signing.verify_digest(public, sig, digest, key.public_key())
    signing.verify_digest(public, sig, digest, [public])
    with pytest.raises(kp.SignatureError, match="not trusted"):
        signing.verify_digest(public, sig, digest, bytes(range(1, 33)))
