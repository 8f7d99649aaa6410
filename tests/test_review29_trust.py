"""Review 29: trust, black-box. An attacker who can write the files a victim loads, or entries
into the shared Redis / disk cache; a victim who configured trusted keys. Can the victim be
made to load code no trusted key signed, be told "signed/trusted" when it is not, or have a
trusted-key setup silently degrade to accepting unsigned data?

Bugs (each test fails today):

* a remote entry whose envelope is signed by key A but whose artifact inside is unsigned is
  accepted, and its disk copy, being unsigned, is still served after A is revoked
  (``trusted_keys`` no longer lists it): a compromised key's entries outlive its revocation
  (README: "a disk copy of one whose signer is no longer in trusted_keys (a revoked key) is
  refused too"; ``kernelpack.cache.remote``: "the artifact inside carries its own kernelpack
  signature, checked again by kp.load(trusted_keys=...)");
* the same path with an artifact inside signed by an untrusted key: the remote tier accepts
  it, the disk tier refuses the copy it just wrote, so every new process warns, counts a
  refusal and downloads it again (the two tiers disagree about one entry);
* ``kernelpack inspect`` (text and ``--json``) reports a signature that does not verify
  exactly like an intact one ("signed, key <id>"), while ``kernelpack verify`` exits 1 on it;
  anyone can put the team's public key beside 64 bytes of garbage and be listed as signed by
  the team;
* a trusted signed artifact carries, under a "trusted" verdict, bytes that no signature
  covers: an unreferenced blob of any size, or any data after the FlatBuffer (FORMAT §5:
  "this one signature covers the whole artifact").

What holds is pinned below it (degenerate ``trusted_keys`` values, key encodings, hostile
signature blocks, other-domain signatures, swapped blobs, rewriting a file or buffer after a
trusted load, the ``verify``/``sign`` CLI matrix, keygen against planted links, an envelope by
an untrusted key around a trusted artifact).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import flatbuffers
import kp_handwritten as hw
import kp_samples
import pytest
from kp_cli import run
from kp_redis_helpers import RedisServer

import kernelpack as kp
from kernelpack import signing
from kernelpack.errors import (
    FormatError,
    IntegrityError,
    SignatureError,
)
from kernelpack.summary import Compiled, Image, Module

# ---- helpers ------------------------------------------------------------------------------------


def _pack(key: bytes | None, sig: bytes | None, *, extra_blobs: tuple[bytes, ...] = (),
          body: bytes | None = None, blobs: list[bytes] | None = None) -> bytes:
    """The hand-written artifact of kp_handwritten with a Signature table whose fields may be
    absent (None) or of any length, and extra blobs after the referenced one."""
    body_bytes = body if body is not None else hw.body(hw.Spec())
    b = flatbuffers.Builder(1024)
    tables = []
    for data in (blobs if blobs is not None else [hw.IMAGE, *extra_blobs]):
        vec = hw._bytes(b, data)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, vec, 0)
        tables.append(b.EndObject())
    blob_vec = hw._offsets(b, tables)
    key_vec = hw._bytes(b, key) if key is not None else None
    sig_vec = hw._bytes(b, sig) if sig is not None else None
    b.StartObject(2)
    if key_vec is not None:
        b.PrependUOffsetTRelativeSlot(0, key_vec, 0)
    if sig_vec is not None:
        b.PrependUOffsetTRelativeSlot(1, sig_vec, 0)
    signature = b.EndObject()
    digest = hw._bytes(b, hashlib.sha256(body_bytes).digest())
    body_vec = hw._bytes(b, body_bytes, 8)
    b.StartObject(6)
    b.PrependUint16Slot(0, 1, 0)
    b.PrependUint16Slot(1, 0, 0)
    b.PrependUOffsetTRelativeSlot(2, body_vec, 0)
    b.PrependUOffsetTRelativeSlot(3, digest, 0)
    b.PrependUOffsetTRelativeSlot(4, blob_vec, 0)
    b.PrependUOffsetTRelativeSlot(5, signature, 0)
    b.Finish(b.EndObject(), file_identifier=b"KPAK")
    return bytes(b.Output())


BODY_DIGEST = hashlib.sha256(hw.body(hw.Spec())).digest()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, bytes]:
    """keygen's files: (private path, public path, raw public key)."""
    private, public = signing.write_keypair(tmp_path_factory.mktemp("keys") / "team")
    return private, public, signing.load_public_key(public)


def _signed_hw(private: str) -> tuple[bytes, bytes]:
    """(public key, signature) of the team over the hand-written body."""
    return signing.sign_digest(private, BODY_DIGEST)


def _big(grid: int, seed: bytes, size: int = 1_100_000) -> Compiled:
    """A program whose incompressible image makes the file over 1 MiB (memory-mapped)."""
    out, h = bytearray(), seed
    while len(out) < size:
        h = hashlib.sha256(h).digest()
        out += h
    s = kp.summary.KernelSummary(
        "t", (kp.Tensor("x", kp.f32, ("n",)),),
        (kp.Variant((kp.Launch("k", "m", (kp.cdiv("n", grid),), (128,),
                               (kp.Arg.buffer("x"),)),)),))
    image = Image("cubin", "sm_80", b"\x7fELF" + bytes(out[:size]), "t", 12080)
    return Compiled(s, (Module("m", ("k",), (image,)),))


# ==== bugs: the remote tier and revocation =======================================================
@pytest.fixture(scope="module")
def cubin() -> bytes:
    try:
        from cache._cache_kernels import AXPY_PTX

        from kernelpack.targets import parse_arch
        from kernelpack.toolchain.nvjitlink import ptx_to_cubin

        return ptx_to_cubin(AXPY_PTX, parse_arch("sm_80"))
    except kp.CompileError as exc:
        pytest.skip(f"nvJitLink is not available: {exc}")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


def _key(tag: str) -> kp.CacheKey:
    return kp.make_key("external", f"review29-trust-{tag}".encode(), {"tag": tag}, ["sm_80"])


def _plant(url: str, key: kp.CacheKey, artifact: bytes, envelope_key: object) -> None:
    import redis

    from kernelpack.cache.remote import wrap_entry

    client = redis.Redis.from_url(url, socket_timeout=5)
    client.set(f"kernelpack:1:entry:{key.digest}", wrap_entry(key.digest, artifact, envelope_key))
    client.close()


def _fetch(cache: kp.Cache, key: kp.CacheKey, name: str, cubin: bytes) -> tuple[str, list[str]]:
    from cache._cache_kernels import from_cubin

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        origin = cache.fetch_or_compile(key, lambda: from_cubin(name, cubin)).origin
    return origin, [str(w.message) for w in caught if "cache" in str(w.message)]


@pytest.mark.redis
def test_an_entry_whose_only_signature_is_the_envelopes_outlives_the_revocation(
        tmp_path: Path, redis_url: str, cubin: bytes) -> None:
    """Key A is compromised. Before it is revoked, its holder plants an entry: envelope signed
    by A (so the remote accepts it), artifact inside unsigned. Machine m pulls it to disk. The
    fleet is redeployed trusting only B: A's own signed entries are now refused from disk,
    but this one is served from disk forever, because its disk copy carries no signature at
    all and unsigned disk entries count as this machine's own compiles."""
    from cache._cache_kernels import from_cubin

    priv_a, pub_a = signing.write_keypair(tmp_path / "a.key")
    priv_b, pub_b = signing.write_keypair(tmp_path / "b.key")
    key = _key("envelope-only")
    _plant(redis_url, key, kp.save(from_cubin("evil", cubin)), priv_a)
    before = kp.Cache(tmp_path / "m", remote=redis_url, trusted_keys=[pub_a, pub_b])
    first, _ = _fetch(before, key, "evil", cubin)
    after = kp.Cache(tmp_path / "m", remote=redis_url, trusted_keys=[pub_b], sign_with=priv_b)
    second, _ = _fetch(after, key, "evil", cubin)
    assert not (first == "remote" and second == "disk"), (
        "an entry that reached this machine signed only by key A (its envelope) was still "
        "served from the disk after A was revoked")


@pytest.mark.redis
def test_remote_and_disk_tiers_agree_about_an_artifact_signed_by_an_untrusted_key(
        tmp_path: Path, redis_url: str, cubin: bytes) -> None:
    """Envelope signed by the trusted key T, artifact inside signed by a stranger U. Whatever
    the verdict, both tiers must reach the same one: today the remote accepts it and writes
    it to disk, and every later process refuses that disk copy ("signed by a key this cache
    no longer trusts"), counts a refusal, and downloads it again."""
    from cache._cache_kernels import from_cubin

    priv_t, pub_t = signing.write_keypair(tmp_path / "t.key")
    priv_u, _ = signing.write_keypair(tmp_path / "u.key")
    key = _key("inner-untrusted")
    _plant(redis_url, key, kp.save(from_cubin("k", cubin), sign_with=priv_u), priv_t)
    first = kp.Cache(tmp_path / "m", remote=redis_url, trusted_keys=[pub_t])
    origin1, _ = _fetch(first, key, "k", cubin)
    second = kp.Cache(tmp_path / "m", remote=redis_url, trusted_keys=[pub_t])
    origin2, warned = _fetch(second, key, "k", cubin)
    assert (origin2, warned, second.stats()["refused"]) == ("disk", [], 0), (
        f"first process: {origin1}; the next one on the same disk: {origin2}, "
        f"{second.stats()['refused']} refused, warnings {warned}")


@pytest.mark.redis
def test_an_untrusted_envelope_around_a_trusted_artifact_is_refused(
        tmp_path: Path, redis_url: str, cubin: bytes) -> None:
    """What holds: a team-signed artifact (e.g. taken from another key's entry) re-wrapped by
    a stranger, or unwrapped, is refused and compiled; nothing reaches the disk."""
    from cache._cache_kernels import from_cubin

    priv_t, pub_t = signing.write_keypair(tmp_path / "t.key")
    priv_u, _ = signing.write_keypair(tmp_path / "u.key")
    for tag, envelope_key in (("stranger", priv_u), ("none", None)):
        key = _key(f"wrapped-{tag}")
        _plant(redis_url, key, kp.save(from_cubin("k", cubin), sign_with=priv_t), envelope_key)
        cache = kp.Cache(tmp_path / tag, remote=redis_url, trusted_keys=[pub_t])
        origin, warned = _fetch(cache, key, "k", cubin)
        assert origin == "compiled" and cache.stats()["refused"] == 1, (tag, origin, warned)
        assert any("refused" in w for w in warned), warned


# ==== bugs: honest reporting =====================================================================
def test_inspect_does_not_report_a_broken_signature_like_an_intact_one(
        tmp_path: Path, team: tuple[str, str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """The team's public key beside a signature that does not verify: ``verify`` exits 1,
    but ``inspect`` prints the same status as for the intact file ("signature signed, key
    <team id>: not checked against a trusted key"), and its JSON is identical too."""
    private, _, _ = team
    pk, sig = _signed_hw(private)
    broken = bytearray(sig)
    broken[7] ^= 1
    intact_path, broken_path = tmp_path / "intact.kpack", tmp_path / "broken.kpack"
    intact_path.write_bytes(_pack(pk, sig))
    broken_path.write_bytes(_pack(pk, bytes(broken)))
    assert run(capsys, "verify", intact_path)[0] == 0
    assert run(capsys, "verify", broken_path)[0] == 1  # verify sees it

    def status(path: Path) -> tuple[int, list[str], object]:
        code, out, _ = run(capsys, "inspect", path)
        lines = [ln for ln in out.splitlines() if "signature" in ln.lower() or "signed" in ln]
        jcode, jout, _ = run(capsys, "inspect", "--json", path)
        sig_json = json.loads(jout).get("signature") if jcode == 0 else jcode
        return code, lines, sig_json

    assert status(broken_path) != status(intact_path), (
        f"inspect shows a signature that does not verify as {status(broken_path)}, exactly "
        f"as an intact one")


@pytest.mark.parametrize("extra", ["unreferenced blob", "trailing data"])
def test_bytes_no_reader_uses_are_outside_the_signature_and_never_used(
        tmp_path: Path, team: tuple[str, str, bytes], extra: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Review 29 found that a payload appended to the team's signed artifact (a second blob
    no image names, or bytes after the FlatBuffer) is covered by nothing, while FORMAT.md
    section 5 said the signature "covers the whole artifact". Decided, and FORMAT.md now says
    so: the signature covers everything a reader uses (the body and every image a module
    names); unnamed blobs must stay readable (a newer minor may name them from fields an
    older reader does not know). What must hold is that nothing reaches such bytes: the
    trusted pack's programs and images are exactly the signed ones."""
    private, public, pub = team
    pk, sig = _signed_hw(private)
    payload = b"#!/bin/sh\necho not signed by anyone\n" * 1000
    clean = _pack(pk, sig)
    data = (_pack(pk, sig, extra_blobs=(payload,)) if extra == "unreferenced blob"
            else clean + payload)
    path = tmp_path / "x.kpack"
    path.write_bytes(data)
    code, out, _ = run(capsys, "verify", path, "--trusted-key", public)
    assert code == 0 and "trusted" in out
    pack, reference = kp.load(data, trusted_keys=[pub]), kp.load(clean, trusted_keys=[pub])
    pack.verify()
    assert pack.body_digest == reference.body_digest and pack.programs == reference.programs
    for name in pack.programs:
        assert pack.compiled(name) == reference.compiled(name)
    images = [img.read() for m in pack.modules.values() for img in m.images]
    assert images and all(payload[:64] not in raw for raw in images)


# ==== what holds: trusted_keys values ============================================================
@pytest.mark.parametrize("value", ["", b"", " ", "\n", [""], [b""], [None], False, 0,
                                   bytearray(), memoryview(b"")],
                         ids=lambda v: "memoryview(b'')" if isinstance(v, memoryview)
                         else repr(v))  # (a memoryview's repr holds its address: xdist)
def test_degenerate_trusted_keys_are_errors_not_no_check(value: object) -> None:
    unsigned = kp.save(kp_samples.tiny())
    with pytest.raises((ValueError, TypeError), match="trusted_keys"):
        kp.load(unsigned, trusted_keys=value)


@pytest.mark.parametrize("empty", [[], (), set(), {}, "iter"], ids=repr)
def test_empty_trusted_keys_trust_nothing(empty: object) -> None:
    stranger = signing.generate_private_key()
    for data in (kp.save(kp_samples.tiny()), kp.save(kp_samples.tiny(), sign_with=stranger)):
        with pytest.raises(SignatureError):
            kp.load(data, trusted_keys=iter([]) if empty == "iter" else empty)


def test_public_key_encodings(tmp_path: Path, team: tuple[str, str, bytes],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public, pub = team
    h = pub.hex()
    for form in (h.upper(), f"  {h}\n", h.encode(), pub, public, Path(public)):
        assert signing.load_public_key(form) == pub, form
    link = tmp_path / "link.pub"
    link.symlink_to(public)
    assert signing.load_public_key(str(link)) == pub
    # a private key where a public one is expected: refused, never silently "some key"
    seed = bytes.fromhex(Path(private).read_text().strip())
    for wrong in (private, Ed25519PrivateKey.from_private_bytes(seed)):
        with pytest.raises(ValueError, match="private key"):
            signing.load_public_key(wrong)
    # a 64-hex string that also names a file (holding a stranger's key) is read as hex
    monkeypatch.chdir(tmp_path)
    stranger = signing.public_key_bytes(signing.generate_private_key())
    (tmp_path / h).write_text(stranger.hex())
    assert signing.load_public_key(h) == pub
    for bad in ("0x" + h, ":".join(h[i:i + 2] for i in range(0, 64, 2))):
        with pytest.raises(ValueError):
            signing.load_public_key(bad)
    for content in ("", h + "\n" + stranger.hex() + "\n", h + " junk\n"):
        f = tmp_path / "bad.pub"
        f.write_text(content)
        with pytest.raises(ValueError):
            signing.load_public_key(str(f))


def test_a_different_trusted_key_refuses_and_names_both(team: tuple[str, str, bytes]) -> None:
    private, _, pub = team
    other = signing.public_key_bytes(signing.generate_private_key())
    data = kp.save(kp_samples.tiny(), sign_with=private)
    with pytest.raises(SignatureError, match=signing.key_id(pub)) as err:
        kp.load(data, trusted_keys=[other])
    assert signing.key_id(other) in str(err.value)


# ==== what holds: hostile signature blocks and other domains =====================================
@pytest.mark.parametrize("lengths", [(None, None), (32, None), (None, 64), (31, 64), (33, 64),
                                     (32, 63), (32, 65), (0, 64), (32, 0), (32, 64 + (1 << 20))],
                         ids=str)
def test_a_signature_block_of_the_wrong_shape_is_a_format_error(
        team: tuple[str, str, bytes], lengths: tuple[int | None, int | None]) -> None:
    private, _, pub = team
    pk, sig = _signed_hw(private)
    key = None if lengths[0] is None else (pk * 2)[:lengths[0]]
    s = None if lengths[1] is None else (sig + bytes(lengths[1]))[:lengths[1]]
    data = _pack(key, s)
    for trusted in (None, [pub]):
        start = time.perf_counter()
        with pytest.raises(FormatError):
            kp.load(data, trusted_keys=trusted)
        assert time.perf_counter() - start < 0.5


def test_signatures_over_another_message_do_not_verify(team: tuple[str, str, bytes]) -> None:
    """The right key, a valid ed25519 signature, the wrong message: the bare digest, the
    cache-entry domain, another body's digest, and a malleated S (S + L)."""
    from kernelpack.cache.remote import ENTRY_DOMAIN

    private, _, pub = team
    sk = signing.load_private_key(private)
    other_body = hw.body(hw.Spec(module="m", kernels=("k",), programs=("u",)))
    _, sig = _signed_hw(private)
    order = 2 ** 252 + 27742317777372353535851937790883648493
    malleated = sig[:32] + (int.from_bytes(sig[32:], "little") + order).to_bytes(32, "little")
    for forged in (sk.sign(BODY_DIGEST), sk.sign(ENTRY_DOMAIN + BODY_DIGEST),
                   signing.sign_digest(private, hashlib.sha256(other_body).digest())[1],
                   malleated):
        data = _pack(pub, forged)
        with pytest.raises(SignatureError):
            kp.load(data, trusted_keys=[pub])
        with pytest.raises(SignatureError):
            kp.load(data).verify()


# ==== what holds: image bytes against the signed digests =========================================
def test_a_swapped_blob_under_an_intact_signature_never_passes(
        tmp_path: Path, team: tuple[str, str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    private, public, pub = team
    pk, sig = _signed_hw(private)
    swapped = hw.IMAGE[:-4] + b"EVIL"  # same length, so only the digest can tell
    data = _pack(pk, sig, blobs=[swapped])
    pack = kp.load(data, trusted_keys=[pub])  # the body is the signed one
    with pytest.raises(IntegrityError, match="digest"):
        pack.compiled("t")
    with pytest.raises(IntegrityError):
        pack.verify()
    path, out = tmp_path / "swapped.kpack", tmp_path / "resigned.kpack"
    path.write_bytes(data)
    assert run(capsys, "verify", path, "--trusted-key", public)[0] == 1
    assert run(capsys, "sign", path, "--key", private, "-o", out)[0] == 1
    assert not out.exists()


def test_rewriting_a_mapped_file_after_a_trusted_load_changes_nothing(
        tmp_path: Path, team: tuple[str, str, bytes]) -> None:
    """Over 1 MiB the file is memory-mapped: rewrite it in place after ``kp.load`` checked its
    signature (a new grid constant in the body, new image bytes and their digest)."""
    private, _, pub = team
    compiled = _big(128, b"a")
    good = kp.save(compiled, sign_with=private)
    path = tmp_path / "big.kpack"
    path.write_bytes(good)
    pack = kp.load(path, trusted_keys=[pub])
    assert path.stat().st_size > 1 << 20
    data = bytearray(good)
    data = bytearray(bytes(data).replace(struct.pack("<q", 128), struct.pack("<q", 64)))
    image = compiled.modules[0].images[0].data
    evil = b"\x7fELF" + b"A" * (len(image) - 4)
    at = bytes(data).find(image[:64])
    assert at > 0
    data[at:at + len(image)] = evil
    data = bytearray(bytes(data).replace(hashlib.sha256(image).digest(),
                                         hashlib.sha256(evil).digest()))
    with open(path, "r+b") as f:
        f.write(data)
    assert pack["t"].plan(x=(1024,)).launches[0].grid == (8, 1, 1)
    with pytest.raises(IntegrityError):
        pack.compiled("t")


def test_mutating_the_loaded_buffer_after_a_trusted_load_changes_nothing(
        team: tuple[str, str, bytes]) -> None:
    private, _, pub = team
    good = kp.save(_big(128, b"b", size=600), sign_with=private)
    buf = bytearray(good)
    pack = kp.load(memoryview(buf), trusted_keys=[pub])
    buf[:] = bytes(buf).replace(struct.pack("<q", 128), struct.pack("<q", 64))
    assert pack["t"].plan(x=(1024,)).launches[0].grid == (8, 1, 1)
    pack.verify()


# ==== what holds: the CLI ========================================================================
def test_verify_exit_status_and_wording(tmp_path: Path, team: tuple[str, str, bytes],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    private, public, _ = team
    stranger, _ = signing.write_keypair(tmp_path / "stranger")
    files = {"unsigned": kp.save(kp_samples.tiny()),
             "team": kp.save(kp_samples.tiny(), sign_with=private),
             "stranger": kp.save(kp_samples.tiny(), sign_with=stranger)}
    pk, sig = _signed_hw(private)
    files["broken"] = _pack(pk, sig[:10] + bytes([sig[10] ^ 1]) + sig[11:])
    for name, data in files.items():
        (tmp_path / f"{name}.kpack").write_bytes(data)

    def verify(name: str, *extra: object) -> tuple[int, str]:
        code, out, err = run(capsys, "verify", tmp_path / f"{name}.kpack", *extra)
        return code, (out + err).lower()

    code, text = verify("unsigned")
    assert code == 0 and "unsigned" in text and "trusted" not in text
    code, text = verify("unsigned", "--trusted-key", public)
    assert code == 1 and "unsigned" in text
    code, text = verify("team")
    assert code == 0 and "not checked" in text and "(trusted)" not in text
    code, text = verify("team", "--trusted-key", public)
    assert code == 0 and "(trusted)" in text
    code, text = verify("stranger", "--trusted-key", public)
    assert code == 1 and "not trusted" in text
    for extra in ((), ("--trusted-key", public)):
        code, text = verify("broken", *extra)
        assert code == 1 and "does not verify" in text
    code, text = verify("team", "--trusted-key", "")
    assert code != 0


def test_sign_refuses_a_broken_signature_and_replaces_a_foreign_one(
        tmp_path: Path, team: tuple[str, str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    private, public, pub = team
    stranger, stranger_pub = signing.write_keypair(tmp_path / "stranger")
    pk, _ = signing.sign_digest(stranger, BODY_DIGEST)
    broken = tmp_path / "broken.kpack"
    broken.write_bytes(_pack(pk, bytes(64)))
    assert run(capsys, "sign", broken, "--key", private, "-o", tmp_path / "o.kpack")[0] == 1
    assert not (tmp_path / "o.kpack").exists()
    foreign = tmp_path / "foreign.kpack"
    foreign.write_bytes(kp.save(kp_samples.tiny(), sign_with=stranger))
    assert run(capsys, "sign", foreign, "--key", private)[0] == 0  # in place
    assert kp.load(foreign, trusted_keys=[pub]).signature.verified
    with pytest.raises(SignatureError):
        kp.load(foreign, trusted_keys=[stranger_pub])
    assert run(capsys, "sign", foreign, "--key", public)[0] == 1  # a .pub cannot sign


def test_non_regular_files_are_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.kpack"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.kpack"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        start = time.perf_counter()
        with pytest.raises(FormatError, match="not a regular file"):
            kp.load(path, trusted_keys=[bytes(range(32))])
        assert time.perf_counter() - start < 2.0


def test_keygen_never_writes_through_a_planted_link(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker who can write the directory plants dangling links where keygen will write
    (the private key into a place they can read, the public key over a file of the victim's)."""
    loot = tmp_path / "loot"
    loot.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "a").symlink_to(loot / "private")
    (work / "b.pub").symlink_to(loot / "public")
    for name in ("a", "b"):
        assert run(capsys, "keygen", "-o", work / name)[0] == 1
    assert sorted(os.listdir(loot)) == []


def test_save_does_not_sign_the_content_of_a_pack_whose_signature_is_broken(
        team: tuple[str, str, bytes]) -> None:
    """Review 29: ``kernelpack sign`` refuses a file whose signature does not verify, but
    ``kp.save(pack, sign_with=...)`` signed its content anyway (laundering a forged or stale
    signature into a good one). Now a SignatureError, for the pack, a program of it, or any
    iterable holding either (a generator too); an intact pack is re-signed as
    before."""
    private, _, pub = team
    pk, sig = _signed_hw(private)
    broken = bytearray(sig)
    broken[3] ^= 1
    bad = kp.load(_pack(pk, bytes(broken)))
    name = bad.programs[0]
    for items in (bad, bad[name], [bad], [bad[name]], (p for p in [bad])):
        with pytest.raises(SignatureError, match="does not verify"):
            kp.save(items, sign_with=private)
    assert kp.save(bad)  # unsigned re-save: nothing vouched for
    good = kp.load(_pack(pk, sig))
    again = kp.load(kp.save(good, sign_with=private), trusted_keys=[pub])
    assert again.signature.verified
