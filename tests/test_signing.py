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


# ---- small-order public keys ----------------------------------------------------------------
def _small_order_points() -> dict[str, bytes]:
    """Encodings of points of order 1, 2, 4 and 8, computed here from the curve equation
    (-x^2 + y^2 = 1 + d x^2 y^2 over GF(2^255 - 19)), not copied from a list."""
    p = 2 ** 255 - 19
    d = -121665 * pow(121666, p - 2, p) % p

    def sqrt(a: int) -> int | None:
        x = pow(a, (p + 3) // 8, p)
        if (x * x - a) % p:
            x = x * pow(2, (p - 1) // 4, p) % p
        return x if (x * x - a) % p == 0 else None

    def enc(y: int, sign: int = 0) -> bytes:
        return (y | sign << 255).to_bytes(32, "little")

    r = sqrt((1 + d) % p)
    # a point of order 8 doubles to (±sqrt(-1), 0): x^2 = -y^2, so d y^4 + 2 y^2 - 1 = 0
    y8 = next(y for y in (sqrt((-1 + r) * pow(d, p - 2, p) % p),
                          sqrt((-1 - r) * pow(d, p - 2, p) % p)) if y is not None)
    return {"identity": enc(1), "identity with the sign bit": enc(1, 1), "order 2": enc(p - 1),
            "order 4": enc(0), "order 8": enc(y8), "order 8, other x": enc(y8, 1),
            "y >= p (not canonical)": enc(p + 1)}


@pytest.mark.parametrize("name", list(_small_order_points()))
def test_small_order_public_keys_are_never_trusted(name: str, tmp_path) -> None:
    """With the identity point as the trusted key, R = identity and S = 0 verify every
    message (review 29): such keys, however given, are a ValueError, and kp.load names
    trusted_keys."""
    raw = _small_order_points()[name]
    assert signing.small_order(raw)
    path = tmp_path / "planted.pub"
    path.write_text(raw.hex() + "\n")
    for given in (raw, raw.hex(), str(path)):
        with pytest.raises(ValueError, match="small order"):
            signing.load_public_key(given)
    with pytest.raises(ValueError, match="trusted_keys"):
        kp.load(kp.save([kp_samples.axpy()]), trusted_keys=[raw])


def test_ordinary_public_keys_are_not_small_order() -> None:
    for _ in range(20):
        raw = signing.public_key_bytes(signing.generate_private_key())
        assert not signing.small_order(raw)
        assert signing.load_public_key(raw) == raw


def test_a_key_file_of_several_public_keys_is_refused(tmp_path: Path) -> None:
    """PEM and OpenSSH parsers read a file's first key and ignore the rest: a list of keys in
    one file (authorized_keys style) would have trusted only its first key, silently. Such a
    file is refused, naming it and the count; a file of one key still loads."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    first, second = (Ed25519PrivateKey.generate().public_key() for _ in range(2))
    forms = {"pem": (ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo),
             "ssh": (ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)}
    for name, (encoding, fmt) in forms.items():
        one, two = (k.public_bytes(encoding, fmt) for k in (first, second))
        both = tmp_path / f"both.{name}"
        both.write_bytes(one + b"\n" + two + b"\n")
        with pytest.raises(ValueError, match=rf"both\.{name}: holds 2 .* keys"):
            signing.load_public_key(str(both))
        with pytest.raises(ValueError, match="holds 2"):
            kp.load(kp.save(kp_samples.axpy()), trusted_keys=[str(both)])
        single = tmp_path / f"one.{name}"
        single.write_bytes(one + b"\n")
        assert signing.load_public_key(str(single)) == first.public_bytes(
            ser.Encoding.Raw, ser.PublicFormat.Raw)
