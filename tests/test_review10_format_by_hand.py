"""Review 10: docs/FORMAT.md read as a specification by someone without kernelpack's writer.

``tests/kp_handwritten.py`` writes artifacts from the prose and the schema alone (the
``flatbuffers`` Builder, no kernelpack code). A valid one must load, plan and verify; each
documented violation must be refused with the documented error class.

Failed before its fix: a launch naming a module the file does not contain, or a kernel its
module does not list, decoded, planned, and was shown by ``kernelpack inspect`` / ``eval``
with exit status 0, although FORMAT.md §3, 8 says decoding a program checks that "every
launch's module and kernel exist" (only ``Pack.verify`` and a launch noticed).

Documented with this review (true before, but not written down): major 0 is a FormatError,
``arch_major``/``arch_minor`` are 1..99 / 0..9, fields that do not apply to an object's kind
are not read, and ``kp.save`` writes a hand-built PTX image's missing ``ptx_isa`` as absent.
"""

from __future__ import annotations

import hashlib

import pytest

import kernelpack as kp
from kernelpack.cli import main
from kp_handwritten import IMAGE, Spec, artifact

_SIG_PREFIX = b"kernelpack-signature-v1\0"


def test_handwritten_artifact_loads_plans_and_verifies() -> None:
    pack = kp.load(artifact())
    assert pack.programs == ["t"] and list(pack.modules) == ["m"]
    assert pack.format_version == (1, 0)
    summary = pack["t"].summary
    # absent fields take their schema defaults: Variant.predicate -1 (always), Launch.count -1
    assert summary.variants[0].predicate is None and summary.variants[0].launches[0].count is None
    plan = pack["t"].plan(x=(1000,))
    (launch,) = plan.launches
    assert (launch.kernel, launch.module, launch.grid, launch.block, launch.shared_mem) == (
        "k", "m", (8, 1, 1), (128, 1, 1), 0)
    image = pack.modules["m"].images[0]
    assert (image.target, image.codec, image.raw_size) == ("sm_80", "none", len(IMAGE))
    assert image.read() == IMAGE
    pack.verify()


def test_newer_minor_with_an_appended_field_loads_and_newer_major_does_not() -> None:
    assert kp.load(artifact(minor=7, appended_pack_field=99)).format_version == (1, 7)
    with pytest.raises(kp.CompatibilityError, match="2.0 is newer"):
        kp.load(artifact(major=2))
    with pytest.raises(kp.FormatError, match="format_major is 0"):
        kp.load(artifact(major=0))


def test_handwritten_signature_verifies_under_the_documented_message() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from kp_handwritten import body

    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    digest = hashlib.sha256(body(Spec())).digest()
    signed = artifact(signature=(public, key.sign(_SIG_PREFIX + digest)))
    info = kp.load(signed, trusted_keys=[public]).signature
    assert info.verified and info.key_id == hashlib.sha256(public).hexdigest()[:16]
    with pytest.raises(kp.SignatureError):  # the same signature without the domain prefix
        kp.load(artifact(signature=(public, key.sign(digest))), trusted_keys=[public])


@pytest.mark.parametrize("changes, error, match", [
    ({"body_digest": bytes(32)}, kp.IntegrityError, "body_digest"),
    ({"body_digest": bytes(31)}, kp.FormatError, "31 bytes, expected 32"),
    ({"signature": (bytes(31), bytes(64))}, kp.FormatError, "31-byte key"),
    ({"signature": (bytes(32), bytes(63))}, kp.FormatError, "63-byte signature"),
    ({"programs": ("u", "t")}, kp.FormatError, "sorted and unique"),
    ({"programs": ("t", "t")}, kp.FormatError, "sorted and unique"),
    ({"programs": ("a-b",)}, kp.FormatError, "not an identifier"),
    ({"kernels": ("k", "a")}, kp.FormatError, "sorted and unique"),
    ({"arch": (0, 0)}, kp.FormatError, "arch_major 0"),
    ({"arch": (100, 0)}, kp.FormatError, "arch_major 100"),
    ({"arch": (8, 10)}, kp.FormatError, "arch_minor 10"),
    ({"suffix": 3}, kp.FormatError, "arch_suffix: enum value 3"),
    ({"kind": 3}, kp.FormatError, "kind: enum value 3"),
    ({"dtype": 16}, kp.FormatError, "dtype: enum value 16"),
    ({"raw_size": len(IMAGE) + 1}, kp.IntegrityError, "raw_size"),
    ({"raw_size": (1 << 30) + 1, "codec": 1}, kp.FormatError, "MAX_IMAGE_SIZE"),
    ({"blobs": []}, kp.FormatError, "blob index 0"),
])
def test_each_documented_violation_is_refused_at_load(changes: dict, error: type,
                                                      match: str) -> None:
    with pytest.raises(error, match=match):
        kp.load(artifact(**changes))


@pytest.mark.parametrize("changes, error, match", [
    ({"dtype": 0}, kp.FormatError, "dtype code 0"),
    ({"ops": bytes([2, 0, 99, 0]), "imms": (0,)}, kp.FormatError, "opcode 99"),
    ({"imms": (5, 0, 128, 128, 1, 0)}, kp.FormatError, "SYM index 5"),
    ({"launch_module": "zz"}, kp.FormatError, "module 'zz', which the file does not contain"),
    ({"launch_kernel": "zz"}, kp.FormatError, "has no kernel 'zz'"),
])
def test_each_documented_violation_is_refused_when_the_program_is_decoded(
        changes: dict, error: type, match: str) -> None:
    pack = kp.load(artifact(**changes))  # programs decode lazily (FORMAT.md §3, 8)
    with pytest.raises(error, match=match):
        pack["t"].summary
    with pytest.raises(error, match=match):
        kp.load(artifact(**changes))["t"].plan(x=(1000,))
    with pytest.raises(error, match=match):
        kp.load(artifact(**changes)).verify()


@pytest.mark.parametrize("changes, error, match", [
    ({"raw_digest": bytes(32)}, kp.IntegrityError, "raw_digest"),
    ({"blobs": [IMAGE[:-1] + b"?"]}, kp.IntegrityError, "digest"),
])
def test_image_bytes_are_checked_when_used(changes: dict, error: type, match: str) -> None:
    pack = kp.load(artifact(**changes))
    with pytest.raises(error, match=match):
        pack.verify()


@pytest.mark.parametrize("changes", [{"launch_module": "zz"}, {"launch_kernel": "zz"}])
@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], ["eval"]])
def test_cli_refuses_a_launch_of_missing_code(tmp_path, capsys, changes: dict,
                                              command: list[str]) -> None:
    path = tmp_path / "missing.kpack"
    path.write_bytes(artifact(**changes))
    argv = command + [str(path)] + (["t", "x=1000"] if command == ["eval"] else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "zz" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [0, 99, -2])
def test_a_field_that_does_not_apply_to_the_kind_is_not_read(value: int) -> None:
    """FORMAT.md §3, 8: a tensor's ``value`` (a scalar's root) is not read, whatever it holds,
    as ``ptx_isa`` on a cubin; the same root index on a scalar would be checked."""
    pack = kp.load(artifact(tensor_value=value))
    (param,) = pack["t"].summary.params
    assert isinstance(param, kp.Tensor) and [str(d) for d in param.shape] == ["n"]
    assert pack["t"].plan(x=(256,)).launches[0].grid == (2, 1, 1)


def test_kp_save_writes_a_hand_built_ptx_image_without_an_isa_as_absent() -> None:
    """FORMAT.md §7: kp.save writes a kp.Image's ptx_isa as given; kernelpack's own PTX images
    carry the ISA of their .version (tests/test_external.py covers those)."""
    n = kp.sym("n")
    launch = kp.Launch("k", "m", (kp.cdiv(n, 128),), (128,), [kp.Arg("buffer", "x")])
    summary = kp.KernelSummary("p", params=[kp.Tensor("x", kp.f32, ["n"])],
                               variants=[kp.Variant([launch])])
    images = [kp.Image("ptx", "sm_80", b".version 8.0\n.target sm_80\n"),
              kp.Image("ptx", "sm_90", b".version 8.3\n.target sm_90\n", ptx_isa=(8, 3))]
    pack = kp.load(kp.save([kp.Compiled(summary, [kp.Module("m", ["k"], images)])]))
    assert [i.ptx_isa for i in pack.modules["m"].images] == [None, (8, 3)]
