"""Review 49: tests that kill mutants of the cache package which survived the existing suite.

A throw-away mutator (outside the repo, on a copy of ``src/`` and ``tests/``, so that the
suite's worker processes import the mutant too) changed ``cache/keys.py``, ``disk.py``,
``disk_tier.py``, ``_files.py``, ``_flock.py``, ``_once.py``, ``binding.py``,
``remote.py``, ``remote_tier.py``, ``resp.py``, ``external_key.py`` and ``cache/__init__.py``
one site at a time: key parts dropped, label/length prefixes and type tags removed, sorting
removed, comparisons and boolean operators flipped, checks (inode, symlink, size, version,
signature, token) dropped, constants changed. 154 mutants ran: 100 were killed by the
existing suite (one of them, a FIFO opened without ``O_NONBLOCK``, by hanging it), 47
survived it and are killed by the tests here (each names its mutants in its docstring), and
7 are judged equivalent: ``MAX_QUARANTINED`` changed (the suite tests the bound with a
patched value), the symlink test in ``DiskStore._exposed`` dropped (a link's own mode is
0777, so the world-writable test still refuses it), the total re-checked under the evict
lock with ``<`` (the same check just ran before the lock), a key record written for a
remote put-through (the record is the key's own parts), a set keyed like a list of the same
items in ``external_key.canonical``, and two RESP client checks (error items inside arrays,
non-bytes GET replies) that no cache command can reach with another outcome. No mutant
revealed a bug in the current code. No GPU; one test uses the suite's redis-server; about
1.5 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import Cache, CacheWarning
from kernelpack.cache.keys import _probe_nvjitlink, canonical_options, make_key

from .conftest import from_cubin


# ==== keys.py: what goes into a key ==============================================================

def test_a_dtype_option_keys_by_its_name() -> None:
    """K17 (``_encode`` of a dtype as a bare ``"t"``): an accumulator of f16 and one of f32
    shared a key, so the second compile was served the first one's code."""
    assert canonical_options({"acc": kp.f16}) == "d1{s3:acc=tfloat16}"
    assert (make_key("fusion", b"g", {"acc": kp.f16}, ["sm_80"]).digest
            != make_key("fusion", b"g", {"acc": kp.f32}, ["sm_80"]).digest)


def test_a_cuda_12_nvjitlink_wheel_is_keyed_by_its_full_version() -> None:
    """K25 (``nvidia-nvjitlink-cu12`` dropped from the names probed): a CUDA 12 wheel was then
    asked for its major.minor only, so a patch release of the linker kept every key."""
    got = _probe_nvjitlink({"nvidia-nvjitlink-cu12": "12.4.127", "cuda-bindings": "12.6.0"})
    assert got == "nvidia-nvjitlink-cu12 12.4.127; cuda-bindings 12.6.0"


def test_labels_are_hashed_not_only_values() -> None:
    """K12 (only the values hashed): a key record whose labels were edited (``kind`` renamed,
    two labels swapped) still reproduced the digest, so ``read_parts`` trusted and explained
    a record that is not the key's."""
    from kernelpack.cache.keys import CacheKey, digest_parts

    assert digest_parts([("kind", "x")]) != digest_parts([("kinx", "x")])
    key = make_key("external", b"s", {}, ["sm_80"])
    renamed = [("kinx" if label == "kind" else label, value) for label, value in key.parts]
    assert CacheKey.from_parts(renamed).digest != key.digest


@pytest.mark.parametrize("package", ["", "_generated", "lowering", "toolchain"])
def test_every_codegen_package_is_in_the_digest(tmp_path: Path, package: str) -> None:
    """K28-K31 (a package dropped from ``CODEGEN_PACKAGES``): an edited FlatBuffers writer
    (``_generated/``) kept the key, and its old artifacts were served (review 28's test runs a
    subprocess and is one of the slow ones; this one reads a small tree)."""
    from kernelpack.cache.keys import codegen_digest

    for name in ("", "_generated", "lowering", "toolchain"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "m.py").write_text("x = 1\n")
    before = codegen_digest(root=tmp_path)
    (tmp_path / package / "m.py").write_text("x = 2\n")
    assert codegen_digest(root=tmp_path) != before


def _age(store: object, digest: str, seconds: float) -> None:
    """Date an entry ``seconds`` in the past (an LRU time, as an old hit leaves it)."""
    import os

    then = time.time() - seconds
    os.utime(store.path(digest), (then, then))  # type: ignore[attr-defined]


# ==== disk.py / _files.py: atomic writes =========================================================

def test_a_compiled_entry_is_fsynced_and_a_put_through_is_not(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """D08 (``put`` passing ``sync=False`` always) and F01 (the fsync dropped): an entry
    renamed into place before its bytes reached the disk could be an empty or torn file after
    a power loss, under the final name. A copy of a remote hit (``sync=False``) skips it."""
    import os

    from kernelpack.cache.disk import DiskStore

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    store = DiskStore(tmp_path)
    store.put("ab" * 32, b"entry")
    assert len(synced) == 1
    store.put("cd" * 32, b"copy", sync=False)
    assert len(synced) == 1
    assert store.get("ab" * 32) == b"entry" and store.get("cd" * 32) == b"copy"


def test_a_failed_write_leaves_neither_temp_nor_entry(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """F02 (written in place under the final name) and F03 (the temp file not removed when
    the write fails): a disk that fails mid-write must leave no half entry to be served and
    no temp file counting against nothing."""
    import os

    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    store.put("ef" * 32, b"first")  # the shard exists: the failure is the write itself
    real = os.write

    def short_then_fail(fd: int, data: object) -> int:
        if len(data) > 4:  # type: ignore[arg-type]
            return real(fd, bytes(data)[:4])  # type: ignore[index]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(OSError):
        store.put("ab" * 32, b"0123456789")
    monkeypatch.setattr(os, "write", real)
    assert store.get("ab" * 32) is None
    assert sorted(p.name for p in store.path("ab" * 32).parent.iterdir()) == []


@pytest.mark.parametrize("tail", ["0", "/../../x", ".kpack"])
def test_a_digest_with_anything_after_it_is_refused(tail: str) -> None:
    """D01 (``match`` for ``fullmatch``): a key of 64 hex digits and more named a path
    beyond its entry (``<digest>/../../x``) and was accepted."""
    from kernelpack.cache.disk import check_digest

    with pytest.raises(ValueError, match="64 lowercase hex"):
        check_digest("ab" * 32 + tail)


def test_an_entry_larger_than_the_format_allows_is_not_read(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """D03 (the size bound dropped): an entry file larger than any artifact can be (a huge
    file planted or grown under the name) was read whole into memory before verification."""
    from kernelpack.cache import disk

    store = disk.DiskStore(tmp_path)
    store.put("ab" * 32, b"x" * 9)
    monkeypatch.setattr(disk, "MAX_FILE_SIZE", 8)
    found = store.read("ab" * 32)
    assert found is not None and found[0] == b""  # never verifies: quarantined unread


def test_an_entry_of_exactly_the_cap_is_kept(tmp_path: Path) -> None:
    """D07 (``>=`` for ``>``): an entry whose size equals ``max_bytes`` fits the cap and must
    be kept; refused, it was recompiled at every call."""
    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path, max_bytes=10)
    store.put("ab" * 32, b"x" * 10)
    assert store.get("ab" * 32) == b"x" * 10


def test_the_entry_just_written_survives_a_future_dated_neighbour(tmp_path: Path) -> None:
    """D11 (``keep`` not passed to ``evict``): with another entry dated a little in the
    future (clock skew on a shared filesystem) that one is the newest, and the put's own
    eviction removed the entry it had just written: a cache that never hits that key."""
    import os
    import time

    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path, max_bytes=100)
    store.put("aa" * 32, b"a" * 60)
    ahead = time.time() + 100  # within FUTURE_SLACK_S: still taken as its real time
    os.utime(store.path("aa" * 32), (ahead, ahead))
    store.put("bb" * 32, b"b" * 60)
    assert store.get("bb" * 32) == b"b" * 60


def test_a_lock_file_unlinked_under_a_waiter_is_not_a_second_holder(tmp_path: Path) -> None:
    """D15 (the inode re-check after ``flock`` dropped): a waiter that got the lock of a file
    its holder had unlinked went on as holder, while a newcomer created a fresh lock file and
    held that one too: two compiles of one key, two writers of one entry."""
    import fcntl
    import os
    import threading

    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    digest = "ab" * 32
    path = tmp_path / "locks" / (digest + ".lock")
    path.parent.mkdir(parents=True)
    first = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(first, fcntl.LOCK_EX)  # the holder before
    inside, done = threading.Event(), threading.Event()

    def waiter() -> None:
        with store.lock(digest, wait_s=20):
            inside.set()
            done.wait(20)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        time.sleep(0.3)  # the waiter has opened the file and waits in flock
        os.unlink(path)  # the holder's protocol: unlink, then release
        fcntl.flock(first, fcntl.LOCK_UN)
        os.close(first)
        assert inside.wait(20)
        newcomer = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(newcomer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(newcomer)
    finally:
        done.set()
        thread.join(20)


def test_a_quarantine_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    """D18 (the link check of ``quarantine/`` dropped): a neighbour's symlink in place of
    ``quarantine/`` made a bad entry move into the link's target."""
    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path / "cache")
    store.put("ab" * 32, b"bad")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache" / "quarantine").symlink_to(elsewhere)
    with pytest.raises(OSError):
        store.quarantine("ab" * 32)
    assert list(elsewhere.iterdir()) == []


def test_an_entry_dated_far_in_the_future_is_evicted_first(tmp_path: Path) -> None:
    """D20 (the future-date rule dropped): an entry copied from a machine whose clock is an
    hour ahead sorted as the newest and pinned the cache while the working set was evicted."""
    import os

    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    store.put("aa" * 32, b"a")
    store.put("bb" * 32, b"b")
    ahead = time.time() + 3600
    os.utime(store.path("aa" * 32), (ahead, ahead))
    assert [e.digest for e in store.entries()] == ["aa" * 32, "bb" * 32]
    assert store.evict(1) == (1, 1) and store.get("bb" * 32) == b"b"


def test_eviction_keeps_the_newest_entry_and_drops_the_evicted_ones_records(tmp_path: Path
                                                                           ) -> None:
    """D23 (the newest entry not spared): with entries of the cap's size, the low-water goal
    lies below one entry and eviction emptied the cache; D26 (the key record not removed):
    records of evicted entries piled up in ``keys/`` outside any cap."""
    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    old, new = make_key("external", b"old", {}, ["sm_80"]), make_key("external", b"new", {},
                                                                         ["sm_80"])
    for age, key in ((100, old), (50, new)):
        store.put(key, b"x" * 10)
        store.record_parts(key)
        _age(store, key.digest, age)
    assert store.evict(10) == (1, 10)
    assert store.get(new) == b"x" * 10 and store.get(old) is None
    assert store.read_parts(old.digest) is None and store.read_parts(new.digest) == new


def test_eviction_stops_at_the_low_water_mark_exactly(tmp_path: Path) -> None:
    """D33 (``<`` for ``<=``): a total that reached 90 % of the cap exactly was taken as
    still over it, and one more entry was evicted."""
    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    for age, digest, size in ((300, "aa", 20), (200, "bb", 45), (100, "cc", 45)):
        store.put(digest * 32, b"x" * size)
        _age(store, digest * 32, age)
    assert store.evict(100) == (1, 20)
    assert [e.digest[:2] for e in store.entries()] == ["bb", "cc"]


# ==== disk_tier.py: verified reads =============================================================

def test_a_good_entry_written_during_a_bad_read_is_not_quarantined(tmp_path: Path) -> None:
    """T03 (``quarantine`` called without the identity of the file read): another process
    that replaced a bad entry with a good one while this one was verifying the bad bytes had
    its fresh entry moved aside, and every later lookup compiled again."""
    from kernelpack.errors import KernelPackError

    cache = Cache(tmp_path, remote=False)
    digest = "ab" * 32
    cache.disk.put(digest, b"bad entry")
    path = cache.disk.path(digest)

    def replaced_meanwhile(data: bytes, *args: object) -> object:
        path.unlink()
        path.write_bytes(b"a fresh entry of another process")
        raise KernelPackError("not an artifact")

    cache._decode = replaced_meanwhile  # type: ignore[method-assign]
    assert cache._from_disk(digest) is None
    assert path.read_bytes() == b"a fresh entry of another process"
    assert cache.disk.quarantined() == [] and cache.stats()["quarantined"] == 0


# ==== binding.py: does a hit hold what its key asked for ======================================

def test_a_fusion_entry_with_another_architecture_is_not_this_keys(axpy_cubin: bytes) -> None:
    """B04 (only the PTX image compared) and B05 (the cubin lists compared by length): an
    entry holding an sm_80 cubin, stored under the name of a key for sm_90, was served."""
    from kernelpack.cache.binding import check_binding
    from kernelpack.errors import CacheError

    compiled = from_cubin("k", axpy_cubin)
    check_binding(compiled, make_key("fusion", b"g", {}, ["sm_80"]), "k")  # its own key
    with pytest.raises(CacheError, match=r"cubins \['sm_80'\].*ask for cubins \['sm_90'\]"):
        check_binding(compiled, make_key("fusion", b"g", {}, ["sm_90"]), "k")


def test_an_external_entry_is_not_held_to_its_target_list(axpy_cubin: bytes) -> None:
    """B02 (``and`` for ``or``): an external kernel's images are the sources it was given,
    not what its target list names, and refusing them made such a key recompile at every
    call (quarantined each time)."""
    from kernelpack.cache.binding import check_binding

    compiled = from_cubin("k", axpy_cubin)
    check_binding(compiled, make_key("external", b"x", {}, ["sm_80", "ptx"]), "k")


# ==== remote.py / remote_tier.py: what is trusted ===============================================

def test_an_empty_trusted_key_list_trusts_nobody() -> None:
    """R02 (``not trusted_keys`` for ``trusted_keys is None``): ``unwrap_entry(..., [])``
    took every unsigned entry, where an empty list of trusted keys means that none is."""
    from kernelpack.cache.remote import unwrap_entry, wrap_entry
    from kernelpack.errors import SignatureError

    digest = "ab" * 32
    envelope = wrap_entry(digest, b"artifact", None)
    assert unwrap_entry(digest, envelope, None) == b"artifact"  # None: not checked
    with pytest.raises(SignatureError, match="unsigned"):
        unwrap_entry(digest, envelope, [])


def test_an_envelope_of_another_version_is_refused() -> None:
    """R06 (only the magic checked): an envelope of a later layout (version 2) was read as a
    version 1 one, its fields at the wrong offsets."""
    from kernelpack.cache.remote import unwrap_entry, wrap_entry
    from kernelpack.errors import CacheError

    digest = "ab" * 32
    envelope = bytearray(wrap_entry(digest, b"artifact", None))
    envelope[4] = 2
    with pytest.raises(CacheError, match="not a kernelpack cache envelope"):
        unwrap_entry(digest, bytes(envelope), None)


def test_a_forged_signature_does_not_make_an_entry_signed() -> None:
    """R07 (``signed_entry`` not verifying the signature): an envelope naming some key with
    a garbage signature counted as signed, so a node without ``sign_with`` never replaced it
    and every reader went on refusing the fleet's entry of that key."""
    from kernelpack.cache.remote import signed_entry, wrap_entry

    digest = "ab" * 32
    envelope = bytearray(wrap_entry(digest, b"artifact", None))
    envelope[37:69] = bytes(range(1, 33))  # a public key, with the zero signature
    assert not signed_entry(digest, bytes(envelope))


def test_an_oversized_value_from_the_redis_package_is_refused() -> None:
    """R08 (the size check after the fact dropped): the ``redis`` package has no reply
    limit, so a value larger than any entry may be was handed on to be parsed."""
    from kernelpack.cache.remote import BadEntryValue, RedisStore

    class Client:
        def getex(self, name: str, ex: int) -> bytes:
            return b"x" * 1000

    store = RedisStore("rediss://localhost:1/0", max_entry_bytes=10)
    store._client = Client()
    with pytest.raises(BadEntryValue, match="exceed the limit"):
        store.get("ab" * 32)


def test_entries_expire_and_stale_and_foreign_fleet_locks(redis_server) -> None:
    """R14 (an entry put without its TTL): entries nobody reads stayed in Redis for ever.
    R11 (a lock key without expiry taken as live): a value a crashed old version left at the
    lock key made every miss of that key wait ``wait_s``. R12 (unlock without comparing
    tokens): a holder whose lock had expired deleted the next holder's lock."""
    from kernelpack.cache.remote import RedisStore

    store = RedisStore(redis_server.url)
    client = redis_server.client()
    digest = "ab" * 32
    client.set(f"kernelpack:1:lock:{digest}", b"left by a crash")  # no expiry
    assert not store.is_locked(digest)
    token = store.try_lock(digest, 60_000)
    assert token is not None and store.is_locked(digest)
    store.unlock(digest, "not-" + token)
    assert store.is_locked(digest)
    store.unlock(digest, token)
    assert not store.is_locked(digest)
    assert store.put(digest, b"envelope")
    assert 0 < client.ttl(f"kernelpack:1:entry:{digest}") <= store.ttl_s


def test_a_node_without_a_key_replaces_garbage_but_not_a_signed_entry(
        tmp_path: Path, axpy_cubin: bytes, signing_keys: tuple[Path, Path]) -> None:
    """RT06 (any existing value kept from an unsigned writer): a garbage value under a key
    was never replaced by the compile that refused it, so every reader refused it again until
    its TTL ran out. A signed entry is still kept (review 35)."""
    from kernelpack.cache.remote import signed_entry, unwrap_entry, wrap_entry

    from .test_remote_tier import MemoryStore

    store = MemoryStore()
    key = make_key("external", b"rt06", {}, ["sm_80"])
    store.entries[key.digest] = b"garbage"
    cache = Cache(tmp_path / "a", remote=store, require_signed_remote=False)
    with pytest.warns(CacheWarning, match="refused"):
        got = cache.fetch_or_compile(key, lambda: from_cubin("k", axpy_cubin))
    assert got.origin == "compiled"
    assert unwrap_entry(key.digest, store.entries[key.digest], None)  # replaced: an envelope
    signed = wrap_entry(key.digest, b"signed artifact", signing_keys[0])
    store.entries[key.digest] = signed
    Cache(tmp_path / "b", remote=store, require_signed_remote=False).put(
        key, cache.get(key))  # type: ignore[arg-type]
    assert store.entries[key.digest] == signed and signed_entry(key.digest, signed)


def test_an_entry_that_arrived_before_the_fleet_lock_is_loaded_not_compiled(
        tmp_path: Path, axpy_cubin: bytes) -> None:
    """RT09 (no second look after taking the fleet lock): another machine that put the entry
    and released its lock between our miss and our lock had its compile done twice."""
    from kernelpack.cache.remote import wrap_entry

    from .test_remote_tier import MemoryStore

    key = make_key("external", b"rt09", {}, ["sm_80"])
    cache = Cache(tmp_path, remote=MemoryStore(), require_signed_remote=False)
    artifact = cache._encode(from_cubin("k", axpy_cubin))

    class LateStore(MemoryStore):
        def try_lock(self, digest: str, ttl_ms: int) -> str | None:
            self.entries[digest] = wrap_entry(digest, artifact, None)  # the other one's put
            return super().try_lock(digest, ttl_ms)

    cache.remote = LateStore()
    got = cache.fetch_or_compile(key, lambda: pytest.fail("compiled a second time"))
    assert got.origin == "remote" and cache.stats()["compiles"] == 0


def test_a_failure_in_flight_during_the_back_off_is_not_reported_again(tmp_path: Path) -> None:
    """RT10 (the back-off check dropped from ``failed``): every thread whose call was in
    flight when the remote went down warned and counted the same outage again."""
    from .test_remote_tier import MemoryStore

    cache = Cache(tmp_path, remote=MemoryStore(), require_signed_remote=False)
    with pytest.warns(CacheWarning) as caught:
        for _ in range(3):
            cache._remote_tier.failed("read", ConnectionError("down"))
    assert len(caught) == 1 and cache.stats()["remote_errors"] == 1


def test_error_replies_are_told_from_outages_and_oversized_replies() -> None:
    """RT11 (an oversized reply taken as an error reply) and RT12 (the ``redis`` package's
    ``ResponseError`` family not recognized): a full Redis (``OOM``) behind ``rediss://``
    backed the whole remote off, reads included, instead of pausing writes only."""
    from kernelpack.cache.remote_tier import _is_error_reply
    from kernelpack.cache.resp import ReplyTooLarge, RespError

    class ResponseError(Exception):
        pass

    class OutOfMemoryError(ResponseError):
        pass

    assert _is_error_reply(RespError("OOM")) and _is_error_reply(OutOfMemoryError("OOM"))
    assert not _is_error_reply(ReplyTooLarge("too large"))
    assert not _is_error_reply(ConnectionError("down"))


def test_a_refused_remote_entry_is_warned_about_once(tmp_path: Path) -> None:
    """RT14 (the once-per-digest memory bypassed): under ``simplefilter("error")`` the
    warning of a planted entry raised at every lookup, so whoever could write to Redis could
    make that key impossible to build (review 35)."""
    from .test_remote_tier import MemoryStore

    store = MemoryStore()
    digest = "ab" * 32
    store.entries[digest] = b"garbage"
    cache = Cache(tmp_path, remote=store, require_signed_remote=False)
    with pytest.warns(CacheWarning) as caught:
        assert cache.load(digest) is None and cache.load(digest) is None
    assert len(caught) == 1 and cache.stats()["refused"] == 2


# ==== external_key.py: keys of kp.external ======================================================

def _external_digest(**kwargs: object) -> str:
    from kernelpack.cache.external_key import external_key

    from .conftest import axpy_params

    args = {"grid": kp.cdiv("n", 256), "block": 256, "targets": ["sm_80"], **kwargs}
    return external_key(("k", "axpy", axpy_params()), args)[0].digest


def test_the_same_text_as_ptx_and_as_llvm_ir_are_two_keys() -> None:
    """E04 (the source's kind left out of the options): one text given as ``ptx=`` and as
    ``llvm_ir=`` shared a key, and the second was served the first one's images."""
    text = "// one text, two languages\n"
    assert _external_digest(ptx=text) != _external_digest(llvm_ir=text)


def test_external_arguments_key_by_content_in_a_stable_order() -> None:
    """E01 (an argument whose repr is an address accepted): the address is reused once the
    object is freed, and two calls with different arguments shared a key (review 40); E02
    (a mapping keyed in insertion order): one mapping spelled in two orders never hit."""
    from kernelpack.cache.external_key import canonical

    with pytest.raises(TypeError, match="memory address"):
        canonical(object())
    assert canonical({"b": 1, "a": 2}) == canonical({"a": 2, "b": 1})


def test_cubin_mappings_key_each_arch_with_its_own_bytes() -> None:
    """E05 (a cubin mapping keyed by its bytes run together): ``{"sm_80": b"cubin-A1",
    "sm_90": b"B"}`` and ``{"sm_80": b"cubin-A", "sm_90": b"1B"}`` shared a key, so each
    arch could be served a cubin that is not its own."""
    targets = ["sm_80", "sm_90"]
    assert (_external_digest(cubin={"sm_80": b"cubin-A1", "sm_90": b"B"}, targets=targets)
            != _external_digest(cubin={"sm_80": b"cubin-A", "sm_90": b"1B"}, targets=targets))


def test_a_header_edited_in_place_changes_the_include_digest(tmp_path: Path) -> None:
    """E06 (the per-process memo reused whatever the files' stat) and E07 (the modification
    time left out of what is compared): a header rewritten in place with the same size kept
    the digest of its old text, a stale hit for every ``cuda=`` kernel including it."""
    import os

    from kernelpack.cache.external_key import include_digests

    header = tmp_path / "inc" / "k.cuh"
    header.parent.mkdir()
    header.write_text("#define BLOCK 128\n")
    before = include_digests(["-I", str(header.parent)])
    with open(header, "r+") as f:  # same inode, same size
        f.write("#define BLOCK 256\n")
    os.utime(header, ns=(header.stat().st_atime_ns, header.stat().st_mtime_ns + 10**9))
    assert include_digests(["-I", str(header.parent)]) != before


@pytest.mark.parametrize("spelling", ["-I{}", "-I {}", "-include {}/k.cuh"])
def test_every_include_spelling_is_keyed_by_content(tmp_path: Path, spelling: str) -> None:
    """E08 (``-I<dir>`` attached not recognized) and E09 (``-include <file>`` not
    recognized): the option stayed a path, so two header trees at one path shared a key
    while two machines with the same headers elsewhere never did."""
    from kernelpack.cache.external_key import include_digests

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "k.cuh").write_text("#define A 1\n")
    options = spelling.format(inc).split(" ")
    first = include_digests(options)
    assert not any(str(tmp_path) in o for o in first)
    (inc / "k.cuh").write_text("#define A 22\n")
    assert include_digests(options) != first


# ==== _flock.py: the per-key lock files ========================================================

def test_prune_does_not_unlink_a_lock_file_that_replaced_the_one_it_locked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """L03 (the inode check of ``remove_if_unheld`` dropped): a lock file unlinked and made
    again by a new holder between prune's open and its flock was unlinked under that holder,
    and the next process made a third file and held the key at the same time."""
    import fcntl
    import os

    from kernelpack.cache import _flock

    path = tmp_path / ("ab" * 32 + ".lock")
    path.write_bytes(b"")
    real = fcntl.flock
    swapped: list[int] = []

    def flock(fd: int, op: int) -> None:
        if not swapped and op & fcntl.LOCK_NB:  # prune's try, on the file it opened
            path.unlink()
            swapped.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))  # a new holder's
        real(fd, op)

    monkeypatch.setattr(_flock.fcntl, "flock", flock)
    try:
        assert _flock.remove_if_unheld(path) is False
        assert path.exists() and path.stat().st_ino == os.fstat(swapped[0]).st_ino
    finally:
        os.close(swapped[0])


def test_a_holder_does_not_unlink_the_lock_file_of_the_next_holder(tmp_path: Path) -> None:
    """L04 (the inode check of the holder's unlink dropped): with the lock file removed by
    hand during a compile and made again by another process that holds it, the first
    holder's release unlinked that file too, letting a third process in beside the second."""
    import fcntl
    import os

    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    digest = "ab" * 32
    path = tmp_path / "locks" / (digest + ".lock")
    with store.lock(digest):
        path.unlink()  # ``rm -rf locks/`` by hand
        other = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(other, fcntl.LOCK_EX)  # the next holder
    try:
        assert path.exists() and path.stat().st_ino == os.fstat(other).st_ino
    finally:
        os.close(other)


def test_release_unlocks_even_while_a_copy_of_the_descriptor_lives(tmp_path: Path) -> None:
    """L05 (``LOCK_UN`` dropped, the lock released by ``close`` alone): a copy of the
    descriptor (a child forked while a thread compiled) kept the lock held until that copy
    closed, and every process waiting for the key waited for the child (review 29)."""
    import fcntl
    import os

    from kernelpack.cache import _flock
    from kernelpack.cache.disk import DiskStore

    store = DiskStore(tmp_path)
    digest = "ab" * 32
    with store.lock(digest):
        (fd,) = list(_flock._held)
        copy = os.dup(fd)  # what a forked child holds
        probe = os.open(tmp_path / "locks" / (digest + ".lock"), os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: no BlockingIOError
    finally:
        os.close(copy)
        os.close(probe)


def test_a_full_disk_pauses_disk_writes_with_one_warning(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """T09 (ENOSPC not taken as the whole directory's failure): a full disk gave one warning
    per compiled kernel, each write tried again, instead of one warning and a pause."""
    import errno

    cache = Cache(tmp_path, remote=False)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.disk, "put", full)
    with pytest.warns(CacheWarning, match="not writing to it for 30 s") as caught:
        for i in range(3):
            cache._put_disk("%064x" % i, b"entry")
    assert len(caught) == 1 and not cache._disk_tier.writable()
