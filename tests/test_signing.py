"""ed25519 signing: key handling, signed save/load, refusal of unsigned or foreign files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack import signing
from kernelpack.errors import SignatureError

import kp_samples


@pytest.fixture(scope="module")
def key() -> bytes:
    return signing.generate_private_key()


def test_key_forms(key: bytes, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = signing.public_key_bytes(key)
    assert len(key) == 32 and len(pub) == 32
    obj = signing.load_private_key(key)
    assert signing.load_private_key(obj) is obj
    pem = tmp_path / "k.pem"
    pem.write_bytes(obj.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    assert signing.public_key_bytes(str(pem)) == pub
    hexfile = tmp_path / "k.hex"
    hexfile.write_text(key.hex() + "\n")
    assert signing.public_key_bytes(hexfile) == pub
    assert signing.load_public_key(pub) == pub
    assert signing.load_public_key(pub.hex()) == pub
    assert signing.load_public_key(obj.public_key()) == pub
    pub_pem = tmp_path / "k.pub"
    pub_pem.write_bytes(obj.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    assert signing.load_public_key(pub_pem) == pub
    with pytest.raises(TypeError, match="got int"):
        signing.load_private_key(5)
    with pytest.raises(ValueError, match="not an ed25519 public key"):
        signing.load_public_key(b"short")
    bad = tmp_path / "bad.hex"
    bad.write_text("zz")
    with pytest.raises(ValueError, match="64 hex digits"):
        signing.load_private_key(bad)
    assert isinstance(Ed25519PrivateKey.generate(), Ed25519PrivateKey)


def test_write_keypair(tmp_path: Path) -> None:
    private, public = signing.write_keypair(tmp_path / "kp")
    assert public == private + ".pub"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert signing.load_public_key(public) == signing.public_key_bytes(private)
    with pytest.raises(FileExistsError):
        signing.write_keypair(tmp_path / "kp")


def test_signed_round_trip(key: bytes) -> None:
    pub = signing.public_key_bytes(key)
    data = kp.save(kp_samples.axpy(), sign_with=key)
    assert data == kp.save(kp_samples.axpy(), sign_with=key)  # ed25519 is deterministic
    pack = kp.load(data, trusted_keys=[pub])
    assert pack.signature.verified and pack.signature.key_id == signing.key_id(pub)
    assert pack.signature.public_key == pub.hex()
    unchecked = kp.load(data)
    assert unchecked.signature is not None and not unchecked.signature.verified
    assert kp.save(pack, sign_with=key) == data


def test_refusals(key: bytes) -> None:
    pub = signing.public_key_bytes(key)
    other = signing.public_key_bytes(signing.generate_private_key())
    with pytest.raises(SignatureError, match="unsigned"):
        kp.load(kp.save(kp_samples.axpy()), trusted_keys=[pub])
    signed = kp.save(kp_samples.axpy(), sign_with=key)
    with pytest.raises(SignatureError, match=f"signed by key {signing.key_id(pub)}, which is "
                                             f"not trusted"):
        kp.load(signed, trusted_keys=[other])
    with pytest.raises(SignatureError):
        kp.load(signed, trusted_keys=[])
    assert kp.load(signed, trusted_keys=[other, pub]).signature.verified
    assert kp.load(signed, trusted_keys=pub).signature.verified  # one key, given bare
    assert kp.load(signed, trusted_keys=pub.hex()).signature.verified


def test_message_is_domain_separated() -> None:
    digest = bytes(range(32))
    assert signing.signed_message(digest) == b"kernelpack-signature-v1\0" + digest


def test_unsigned_load_does_not_import_cryptography() -> None:
    data = kp.save(kp_samples.axpy())
    code = ("import sys, json, kernelpack as kp\n"
            f"kp.load({data!r}).verify()\n"
            "print(json.dumps([m for m in sys.modules if m.startswith('cryptography')]))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_key_files_of_the_wrong_kind_are_refused(tmp_path: Path) -> None:
    # keygen writes both halves as 64 hex digits: without these checks a .pub would sign as
    # a (meaningless) private seed and a private key would be trusted as some public key
    private, public = signing.write_keypair(tmp_path / "kp")
    with pytest.raises(ValueError, match="public key file \\(.pub\\) cannot sign"):
        signing.load_private_key(public)
    with pytest.raises(ValueError, match="is a private key; trust its public key"):
        signing.load_public_key(private)
    with pytest.raises(ValueError, match="no such public key file"):
        signing.load_public_key(str(tmp_path / "missing.pub"))
    assert signing.load_public_key(public) == signing.public_key_bytes(private)


def test_write_keypair_never_replaces_a_public_key(tmp_path: Path) -> None:
    (tmp_path / "kp.pub").write_text("someone else's\n")
    with pytest.raises(FileExistsError):
        signing.write_keypair(tmp_path / "kp")
    assert not (tmp_path / "kp").exists()
    assert (tmp_path / "kp.pub").read_text() == "someone else's\n"
