"""Review 5: the loaded ``Pack`` of the public API.

Was: ``pack.verify()`` ("check everything load() leaves for later") passed for a signed
artifact whose body was changed and re-digested after signing, when it was loaded without
``trusted_keys``; only the CLI's ``verify`` noticed. A bare ``memoryview`` key given as
``trusted_keys`` was iterated as a list of integers.
"""

from __future__ import annotations

import hashlib

import pytest

import kernelpack as kp
from kernelpack import serializer, signing
from kernelpack.loader import Pack

import kp_samples

SEED = bytes(range(32))


def _tampered_signed() -> bytes:
    """A signed artifact whose body is replaced by another program's (digest recomputed),
    keeping the original signature block: structurally valid, signature no longer holds."""
    signed = kp.load(kp.save([kp_samples.axpy()], sign_with=SEED))
    body, blobs = serializer.encode([kp_samples.axpy("other")])
    return serializer.assemble(body, blobs, (bytes.fromhex(signed.signature.public_key),
                                             signed._signed[1]))


def test_verify_checks_a_carried_signature() -> None:
    pack = kp.load(_tampered_signed())
    assert pack.signature is not None and not pack.signature.verified
    with pytest.raises(kp.SignatureError, match="does not verify"):
        pack.verify()
    # intact signed and unsigned packs verify, with or without trusted keys
    good = kp.save([kp_samples.axpy()], sign_with=SEED)
    kp.load(good).verify()
    kp.load(good, trusted_keys=signing.public_key_bytes(SEED)).verify()
    kp.load(kp.save([kp_samples.axpy()])).verify()


def test_bare_memoryview_key_is_one_key() -> None:
    good = kp.save([kp_samples.axpy()], sign_with=SEED)
    pub = signing.public_key_bytes(SEED)
    assert kp.load(good, trusted_keys=memoryview(pub)).signature.verified
    with pytest.raises(kp.SignatureError, match="not trusted"):
        kp.load(good, trusted_keys=memoryview(bytes(range(1, 33))))


def test_pack_protocol_and_round_trip() -> None:
    data = kp.save([kp_samples.axpy(), kp_samples.tiny(), kp_samples.rich()])
    pack = kp.load(data)
    assert isinstance(pack, Pack) and len(pack) == 3 and list(pack) == pack.programs
    assert "axpy" in pack and "nope" not in pack and pack.nbytes == len(data)
    again = kp.save([pack.compiled(name) for name in pack])
    assert again == data == kp.save(pack)
    assert hashlib.sha256(kp.save(kp.load(again))).digest() == hashlib.sha256(data).digest()
    with pytest.raises(KeyError, match="no program 'nope'"):
        pack["nope"]


def test_an_image_ptx_isa_given_as_a_list_equals_its_loaded_form() -> None:
    """``Image(..., ptx_isa=[8, 0])`` saved fine, but compared unequal to the loaded image's
    tuple ``(8, 0)``, so ``load(save(c)).compiled(name).modules != c.modules``."""
    from kernelpack.compiled import Compiled, Image, Module

    ptx = b".version 8.0\n.target sm_80\n.address_size 64\n"
    image = Image("ptx", "sm_80", ptx, ptx_isa=[8, 0])
    assert image.ptx_isa == (8, 0)  # (bad values are the writer's to refuse, naming the field)
    c = kp_samples.axpy()
    module = c.modules[0]
    c2 = Compiled(c.summary, (Module(module.name, module.kernels, (image,)),))
    assert kp.load(kp.save([c2])).compiled(c2.name).modules == c2.modules
