"""Review 64b: tests that kill mutants of the artifact write path which survived the suite.

A throw-away mutator (outside the repo, on a copy of the tree at 1e691f3, one mutant at a
time, restored after each) changed the write path: serializer.py (S*), _encode.py (E*),
filewrite.py (F*), signing.py (G*), the data model's compiled.py (C*), compile_entry.py apart
from the cache key (K*, X*) and _fields.py/_records.py (D*). The helper's session ended before
it wrote its totals and its list of equivalent survivors, and its tools went with it: what
stands is this file. Each test names the mutants it kills (78 named: 13 S, 13 E, 23 F, 6 G,
5 C, 9 K, 5 X, 4 D); session 47 re-made three of them by hand
(S05, K06, D03), and each failed its test here. The gaps were the writer's limits taken
as exclusive, images stored zstd when the frame is no shorter, shared blobs keyed by raw
bytes, ``resign`` of truncated or many-blob files, file objects that are closed, read-only
or non-blocking, links, loops and ``..`` in paths, temporaries' names, locks and fsync
order, umask without /proc, key files and half-written key pairs, images holding a
caller's mutable buffer, ``sm_90``/``sm_90a`` ordering, the recent-compiles table's LRU
order and bound, and shapes and launch dims checked where the summary is written.

No real bug found. No GPU; the file runs in about a second.
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import zstandard

import kernelpack as kp
from kernelpack import compile_entry, filewrite, serializer, signing
from kernelpack.filewrite import write_file_object
from kernelpack.serializer import resign
from kernelpack.summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module,
                                Scalar, Tensor, Variant)

import kp_samples

HAVE_PROC = os.path.isdir("/proc/self/fd")


def _zstd(data: bytes) -> bytes:
    """The writer's own zstd settings (docs/FORMAT.md §3)."""
    return zstandard.ZstdCompressor(level=serializer.ZSTD_LEVEL, write_content_size=True,
                                    write_checksum=False, write_dict_id=False).compress(data)


def _one_launch(name: str, params: tuple, module: str = "m", *, predicate: Any = None,
                images: tuple[Image, ...] | None = None, **launch: Any) -> Compiled:
    """A program of one kernel ``k`` in module ``module`` (tiny raw images: no zstd)."""
    variants = (Variant((Launch("k", module, (1,), (1,), (), **launch),), predicate=predicate),)
    if predicate is not None:
        variants += (Variant((Launch("k", module, (2,), (1,), ()),)),)
    s = KernelSummary(name, params, variants)
    images = images or (Image("cubin", "sm_80", kp_samples._noise(40), "t", 12080),)
    return Compiled(s, (Module(module, ("k",), images),))


def _blobs(data: bytes) -> int:
    from kernelpack._fbread import Table

    return len(Table.root(data, "Pack").get("blobs"))


# ---- serializer.py: what is stored, and how ---------------------------------------------------

def test_an_image_zstd_cannot_shorten_is_stored_raw() -> None:
    """S05 (zstd kept when it is exactly as long as the image): FORMAT.md §3 stores an image
    raw "when compression does not make them smaller"; a frame of the same length is not
    smaller, and storing it would make every use decompress for nothing."""
    data = b"\xf9" + b"a" * 16
    assert len(_zstd(data)) == len(data)  # the case itself: a frame exactly as long
    c = _one_launch("p", (), images=(Image("cubin", "sm_80", data, "t", 12080),))
    image = kp.load(kp.save(c)).modules["m"].images[0]
    assert (image.codec, image.stored_size, image.raw_size) == ("none", 17, 17)
    assert image.read() == data


def test_images_whose_stored_bytes_are_equal_share_one_blob() -> None:
    """S08 (blobs keyed by the raw bytes' digest instead of the stored bytes'): "identical
    stored images share one blob". An image whose raw bytes are another image's zstd frame
    (stored raw: a frame does not compress) is stored as the very same bytes; keyed by raw
    bytes it was written twice."""
    inner = kp_samples.fake_image("cubin", "sm_80").data
    frame = _zstd(inner)
    assert len(_zstd(frame)) >= len(frame)  # the frame itself is stored raw
    a = Compiled(kp_samples.axpy_summary("a", "m1"),
                 (Module("m1", ("axpy",), (Image("cubin", "sm_80", inner),)),))
    b = Compiled(kp_samples.axpy_summary("b", "m2"),
                 (Module("m2", ("axpy",), (Image("cubin", "sm_80", frame),)),))
    data = kp.save([a, b])
    assert _blobs(data) == 1
    pack = kp.load(data)
    one, two = pack.modules["m1"].images[0], pack.modules["m2"].images[0]
    assert (one.codec, two.codec) == ("zstd", "none")
    assert one.read() == inner and two.read() == frame
    pack.verify()


def test_the_writers_limits_are_inclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    """S18, S19, S34 (MAX_PROGRAMS, MAX_IMAGE_SIZE and MAX_FILE_SIZE compared with ``>=``):
    a limit is the largest value allowed (docs/FORMAT.md §6); the writer refused files of
    exactly the limit. The limits are lowered here so that the edge is cheap to reach."""
    two = [kp_samples.tiny(), _one_launch("u", (), "mu")]
    monkeypatch.setattr(serializer, "MAX_PROGRAMS", 2)
    kp.save(two)
    with pytest.raises(ValueError, match="3 programs exceed MAX_PROGRAMS 2"):
        kp.save([*two, _one_launch("v", (), "mv")])
    monkeypatch.undo()

    monkeypatch.setattr(serializer, "MAX_IMAGE_SIZE", 84)  # tiny()'s image: 84 bytes
    kp.save(kp_samples.tiny())
    monkeypatch.setattr(serializer, "MAX_IMAGE_SIZE", 83)
    with pytest.raises(ValueError, match="84 bytes exceed MAX_IMAGE_SIZE 83"):
        kp.save(kp_samples.tiny())
    monkeypatch.undo()

    size = len(kp.save(kp_samples.tiny()))
    monkeypatch.setattr(serializer, "MAX_FILE_SIZE", size)
    assert len(kp.save(kp_samples.tiny())) == size
    monkeypatch.setattr(serializer, "MAX_FILE_SIZE", size - 1)
    with pytest.raises(ValueError, match=f"artifact of {size} bytes exceeds MAX_FILE_SIZE"):
        kp.save(kp_samples.tiny())


def test_a_ptx_isa_of_three_parts_is_refused_by_name() -> None:
    """S25 (``len(isa) != 2`` made ``< 2``): a 3-part ISA reached the builder, whose own
    error names nothing of the caller's."""
    image = Image("ptx", "sm_80", b".version 8.0", "t", 12080, (8, 0, 1))
    with pytest.raises(TypeError, match=r"compute_80: ptx_isa must be None or \(major, minor\)"):
        kp.save(_one_launch("p", (), images=(image,)))


def test_resigning_a_file_of_several_blobs_equals_saving_it_signed() -> None:
    """S39 (``resign`` taking the stored blobs in another order): for a file this writer made,
    ``resign`` gives the bytes of ``save(pack, sign_with=...)`` (its docstring); with blobs
    reordered, images named blobs that hold other images' bytes. S36 (a file of this writer's
    own version, 1.1, taken for a newer one and refused) and S38 (the file relabelled with
    this writer's version): each file keeps its version."""
    from kernelpack.verify import read_format_version

    key = signing.generate_private_key()
    old = kp.save([kp_samples.axpy(), kp_samples.rich()])
    new = kp.save(_pinned_rich())
    assert _blobs(old) > 2
    assert (read_format_version(old), read_format_version(new)) == ((1, 0), (1, 1))
    for data in (old, new):
        pack = kp.load(data)
        signed = resign(pack, key)
        assert signed == kp.save(pack, sign_with=key)
        assert read_format_version(signed) == read_format_version(data)
        kp.load(signed, trusted_keys=[signing.public_key_bytes(key)]).verify()


def test_either_field_of_format_1_1_makes_a_1_1_file() -> None:
    """S41 (``stores_after_loads`` left out of the version) and S42 (``reads_elsewhere`` left
    out): FORMAT.md §4, a writer labels a file with the oldest version that holds everything
    in it; a 1.0 reader ignores either field, so a file using either alone must say 1.1."""
    from kernelpack.verify import read_format_version

    x, y = Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",), role="out")
    args = (Arg.buffer("x"), Arg.buffer("y"))
    for extra, version in (({}, (1, 0)), ({"reads_elsewhere": ("x",)}, (1, 1)),
                           ({"stores_after_loads": True}, (1, 1))):
        launch = Launch("k", "m", (kp.cdiv("n", 128),), (128,), args, **extra)
        c = Compiled(KernelSummary("p", (x, y), (Variant((launch,)),)),
                     kp_samples.tiny().modules)
        data = kp.save(c)
        assert read_format_version(data) == version, extra
        assert kp.load(data).compiled("p") == c


_TRUNCATED_RESIGN = textwrap.dedent("""
    import random, sys
    import kernelpack as kp
    from kernelpack.errors import KernelPackError
    from kernelpack.serializer import resign
    from kernelpack.summary import Compiled, Image, Module
    sys.path.insert(0, sys.argv[2])
    import kp_samples
    c = kp_samples.tiny()
    big = Image("cubin", "sm_80", random.Random(64).randbytes((1 << 20) + 4096), "t", 12080)
    kp.save(Compiled(c.summary, (Module("m", ("k",), (big,)),)), sys.argv[1])
    pack = kp.load(sys.argv[1])
    assert pack._file is not None, "not memory-mapped"
    with open(sys.argv[1], "r+b") as f:
        f.truncate(4096)
    try:
        resign(pack, bytes(32))
    except KernelPackError as exc:
        print("refused:", type(exc).__name__)
""")


def test_resigning_a_mapped_file_truncated_since_load_is_an_error_not_a_crash(
        tmp_path: Path) -> None:
    """S40 (``resign`` reading a memory-mapped pack through its map instead of ``pread``): a
    file truncated since load is then touched past its new end, and the process dies of
    SIGBUS (FORMAT.md §3, 9: such a file is an IntegrityError, never a crash). In a child
    process, since the mutant kills it."""
    out = subprocess.run([sys.executable, "-c", _TRUNCATED_RESIGN, str(tmp_path / "a.kpack"),
                          str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == "refused: IntegrityError"


def test_an_empty_str_or_bytes_is_not_a_list_of_programs() -> None:
    """S51 (str and bytes let through to the iterable branch): ``kp.save("")`` saved an empty
    artifact, and ``kp.save(b"..")`` (artifact bytes, not programs) complained about ints."""
    with pytest.raises(TypeError, match=r"or an iterable of them \(got str\)"):
        kp.save("")
    with pytest.raises(TypeError, match=r"or an iterable of them \(got bytes\)"):
        kp.save(b"KPAK")


# ---- _encode.py: the tables -------------------------------------------------------------------

def _pinned_rich() -> list[Compiled]:
    """rich() (every summary feature: scratch, constraints, two variants, a repeated launch
    with its loop symbol, value arguments, computed scalars, sm_90a) with incompressible
    images, stored raw so that zstd's version cannot move the bytes, and a launch of the 1.1
    fields."""
    rich = kp_samples.rich()
    images = (Image("cubin", "sm_80", kp_samples._noise(48), "t", 12080),
              Image("cubin", "sm_90a", kp_samples._noise(56), "t", 12080),
              Image("ptx", "sm_80", kp_samples._noise(52), "t", 12080, (8, 5)))
    rich = Compiled(rich.summary, (Module("red", rich.modules[0].kernels, images),))
    x, y = Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",), role="out")
    launch = Launch("k", "m", (kp.cdiv("n", 128),), (128,), (Arg.buffer("x"), Arg.buffer("y")),
                    reads_elsewhere=("x",), stores_after_loads=True)
    elsewhere = Compiled(KernelSummary("inplace", (x, y), (Variant((launch,)),)), (Module(
        "m", ("k",), (Image("cubin", "sm_80", kp_samples._noise(40), "t", 12080),)),))
    return [rich, elsewhere]


def test_pinned_bytes_of_an_artifact_of_every_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """E07 (loop symbols listed before the bound ones), E32 (constraints registered in
    reverse), E04/E05 (vectors aligned otherwise), E20 (arch suffix stored as none) and the
    other layout mutants: test_serializer's pin covers a tiny artifact only, and a resave
    reproduces whatever the writer does (it decodes and encodes with the same rules). Exact
    bytes, safetensors style: a change here is a format change (DESIGN.md: deterministic
    bytes, byte for byte what an older writer wrote)."""
    monkeypatch.setattr(serializer, "_generator", lambda: "kernelpack pinned")
    data = kp.save(_pinned_rich())
    assert (len(data), hashlib.sha256(data).hexdigest()[:16]) == PINNED_RICH
    assert kp.save(kp.load(data)) == data
    # E05 (the int64 vector aligned to 4): each element is 8-aligned as it is prepended, so
    # only an empty vector shows it: a program with no expression at all (one empty variant)
    empty = kp.save(Compiled(KernelSummary("e", (), (Variant(()),)), ()))
    assert (len(empty), hashlib.sha256(empty).hexdigest()[:16]) == PINNED_EMPTY


PINNED_RICH = (3064, "07f7e144d6cff6b5")
PINNED_EMPTY = (272, "362b19aadf6fa572")


def test_a_first_expression_is_written_like_any_other() -> None:
    """E10 (a computed scalar's value written only for handle > 0) and E11 (the same for a
    variant's predicate): handles count from 0, and the first expression a program registers
    has handle 0; it was left out, so the loaded scalar was no longer computed and the
    variant's predicate was gone (the first variant then always ran)."""
    first_value = _one_launch("p", (Scalar("m", kp.i32, value="n"), Tensor("x", kp.f32, ("n",))))
    first_predicate = _one_launch("q", (Scalar("k", kp.i32),), predicate=kp.sym("k") > 0)
    for c in (first_value, first_predicate):
        assert kp.load(kp.save(c)).compiled(c.name) == c
    plan = kp.load(kp.save(first_predicate))["q"].plan(k=0)
    assert (plan.variant, plan.launches[0].grid) == (1, (2, 1, 1))


def test_an_expression_too_deep_on_its_own_is_named_within_the_search_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """E27 (the culprit field left out of the message), E28 (the reader's prefix repeated) and
    E25 (the culprit search giving up when its node budget is exactly spent, not exceeded):
    the refusal names the one field past a limit on its own, as long as the fields up to it
    read at most MAX_EXPR_WORK nodes (review 35's bound on the search), and none after."""
    from kernelpack import _encode
    from kernelpack.expr import iter_nodes

    n = kp.sym("n")
    deep = n
    for i in range(300):  # nests 300 deep (no simplification folds max/mul/add of symbols)
        deep = (deep * n) + (i + 1) if i % 2 else kp.emax(deep, n + i)
    x = Tensor("x", kp.f32, ("n",))
    c = Compiled(KernelSummary("deep", (x,), (Variant((Launch(
        "k", "m", (deep,), (1,), (Arg.buffer("x"),)),)),)), kp_samples.tiny().modules)
    named = (r"^program 'deep': variant 0 launch 0 grid\[0\]: expressions exceed the format's "
             r"limits: expression nested deeper than 256$")
    with pytest.raises(ValueError, match=named):
        kp.save(c)
    budget = 1 + sum(1 for _ in iter_nodes((deep,)))  # x's shape[0], then grid[0]
    monkeypatch.setattr(_encode, "MAX_EXPR_WORK", budget)
    with pytest.raises(ValueError, match=named):
        kp.save(c)
    monkeypatch.setattr(_encode, "MAX_EXPR_WORK", budget - 1)
    with pytest.raises(ValueError, match=r"^program 'deep': expressions exceed the format's "
                                         r"limits: expression nested deeper than 256$"):
        kp.save(c)


def test_free_text_that_is_not_utf8_is_refused_by_field() -> None:
    """E06 (strings encoded with ``surrogatepass``) and E29 (the bare UnicodeEncodeError let
    through): a lone surrogate (as ``os.fsdecode`` makes of a stray byte) must be refused
    naming the field, not written as bytes a reader refuses, nor as an error naming nothing."""
    c = kp_samples.axpy()
    bad = KernelSummary("axpy", c.summary.params, c.summary.variants,
                        (Constraint(kp.sym("n") > 0, "bad \udc80 text"),))
    with pytest.raises(ValueError, match=r"program 'axpy': constraint message 'bad \\udc80 "
                                         r"text' is not valid UTF-8 text: surrogates not "
                                         r"allowed at character 4"):
        kp.save(Compiled(bad, c.modules))
    image = Image("cubin", "sm_80", b"x", "gcc \udcff")
    with pytest.raises(ValueError, match="image sm_80: toolchain .* is not valid UTF-8 text"):
        kp.save(_one_launch("p", (), images=(image,)))


def test_a_ptx_isa_is_written_as_given_even_zero() -> None:
    """E19 (``ptx_isa`` written only when its major is non-zero): FORMAT.md §7, ``kp.save``
    writes a hand-built image's ``ptx_isa`` as given, absent only when it is None."""
    for isa in ((0, 0), (0, 7), (9, 0)):
        image = Image("ptx", "sm_80", b".version", "t", 12080, isa)
        c = _one_launch("p", (), images=(image,))
        loaded = kp.load(kp.save(c))
        assert loaded.modules["m"].images[0].ptx_isa == isa
        assert loaded.compiled("p") == c


# ---- filewrite.py: file objects ---------------------------------------------------------------

def test_a_closed_or_read_only_file_object_is_refused_by_name(tmp_path: Path) -> None:
    """F02 (the closed-file check dropped) and F03 (io's UnsupportedOperation let through):
    both errors name the parameter and say what to do, instead of io's "write to closed
    file" / "write"."""
    closed = io.BytesIO()
    closed.close()
    with pytest.raises(ValueError, match="kp.save: path_or_file is a closed file"):
        kp.save(kp_samples.tiny(), closed)
    (tmp_path / "a.kpack").write_bytes(b"old")
    refused = pytest.raises(io.UnsupportedOperation, match=r"kp.save: path_or_file is not open "
                                                          r"for writing .*; open it with 'wb'")
    with open(tmp_path / "a.kpack", "rb") as f, refused:
        kp.save(kp_samples.tiny(), f)
    assert (tmp_path / "a.kpack").read_bytes() == b"old"


def test_a_duck_typed_writer_that_returns_nothing_wrote_everything() -> None:
    """F04 (a None from any object taken as "would block"): only a raw file's None means
    nothing was written; a duck-typed ``write(self, b)`` that returns nothing took it all
    (write_file_object's docstring)."""
    class Sink:
        def __init__(self) -> None:
            self.got = b""

        def write(self, b: bytes) -> None:
            self.got += bytes(b)

    sink = Sink()
    data = kp.save(kp_samples.tiny(), sink)
    assert sink.got == data


def test_a_raw_file_that_would_block_says_how_much_it_took() -> None:
    """F07 (the count of bytes written left out of the sum): the BlockingIOError says how far
    the artifact got."""
    class Blocking(io.RawIOBase):
        def __init__(self) -> None:
            self.calls = 0

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int | None:  # type: ignore[override]
            self.calls += 1
            return 3 if self.calls <= 2 else None

    with pytest.raises(BlockingIOError, match=r"after 6 of 10 bytes"):
        write_file_object(Blocking(), b"0123456789")


# ---- filewrite.py: paths ----------------------------------------------------------------------

def test_a_symlink_loop_is_refused_and_left_alone(tmp_path: Path) -> None:
    """F11 (ELOOP taken as "nothing there yet"): ``open(path, "wb")`` fails on a loop of links,
    and so must the save; the mutant replaced the link with the artifact."""
    a, b = tmp_path / "a.kpack", tmp_path / "b.kpack"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(OSError) as info:
        kp.save(kp_samples.tiny(), a)
    assert info.value.errno == errno.ELOOP and info.value.filename == str(a)
    assert a.is_symlink() and b.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kpack", "b.kpack"]


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_a_proc_fd_link_of_a_deleted_file_is_written_directly(tmp_path: Path) -> None:
    """F12 (a link that no path resolves to written through its target's name): the target of
    ``/proc/self/fd/N`` of a deleted file reads "NAME (deleted)"; the artifact goes into the
    open file, not into a new file of that name."""
    path = tmp_path / "gone"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.unlink(path)
        data = kp.save(kp_samples.tiny(), f"/proc/self/fd/{fd}")
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.read(fd, len(data) + 16) == data
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


def test_names_up_to_name_max_save_and_their_temporaries_are_utf8(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F13 (the temporary's extra bytes left out of the length check), F15 (the cut one byte
    longer) and F14 (the cut taken inside a UTF-8 character): a legal name of 242..255 bytes
    gets a shortened temporary that fits NAME_MAX and is still valid UTF-8 text."""
    import tempfile

    prefixes: list[str] = []
    real = tempfile.mkstemp

    def mkstemp(**kwargs: Any) -> tuple[int, str]:
        prefixes.append(kwargs["prefix"])
        return real(**kwargs)

    monkeypatch.setattr(filewrite.tempfile, "mkstemp", mkstemp)
    names = ["a" * 236 + ".kpack", "b" * 249 + ".kpack", "a" + "\u00e9" * 127]
    for name in names:
        assert len(name.encode()) in (242, 255)
        data = kp.save(kp_samples.tiny(), tmp_path / name)
        assert (tmp_path / name).read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for prefix in prefixes:
        assert len(prefix.encode("utf-8")) + len("XXXXXXXX.tmp") <= 255
    assert prefixes[-1].startswith(".a\u00e9") and "~" in prefixes[-1]


def test_only_temporaries_named_as_the_writer_names_them_are_swept(tmp_path: Path) -> None:
    """F18 (any length of random suffix taken for a temporary) and F19 (a long name's
    orphans looked for under the full name, not the shortened one it is written under)."""
    target = tmp_path / "a.kpack"
    orphan = tmp_path / ".a.kpack.abcd1234.tmp"
    others = [tmp_path / ".a.kpack.abcd123.tmp", tmp_path / ".a.kpack.abcd12345.tmp"]
    for p in (orphan, *others):
        p.write_bytes(b"partial")
    kp.save(kp_samples.tiny(), target)
    assert not orphan.exists() and all(p.exists() for p in others)

    long = "c" * 240 + ".kpack"
    stem = filewrite._temp_stem(long)
    assert stem != long
    long_orphan = tmp_path / f".{stem}.abcd1234.tmp"
    long_orphan.write_bytes(b"partial")
    kp.save(kp_samples.tiny(), tmp_path / long)
    assert not long_orphan.exists()


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_a_temporary_swept_before_it_was_locked_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F16 (a temporary taken once locked, without checking it still has its name): a sweep
    may remove the new temporary between its creation and the lock; the writer must make
    another, not write into the removed file (the rename then failed)."""
    real = filewrite._try_lock
    calls = []

    def lock(fd: int) -> bool | None:
        calls.append(fd)
        if len(calls) == 1:  # a concurrent sweep removes it first
            os.unlink(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(filewrite, "_try_lock", lock)
    data = kp.save(kp_samples.tiny(), tmp_path / "a.kpack")
    assert (tmp_path / "a.kpack").read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["a.kpack"]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_a_temporary_someone_else_locked_is_given_up(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """F17 (a temporary used whatever the lock said), F39 (a lock held by another taken as "no
    flock here") and F40 (the given-up temporary's descriptor left open): a temporary whose
    lock is held is a sweep's, which removes it; the writer makes another and closes the
    first descriptor."""
    import fcntl
    import tempfile

    real_flock, real_mkstemp = fcntl.flock, tempfile.mkstemp
    locks: list[int] = []
    made: list[str] = []

    def flock(fd: int, op: int) -> None:
        locks.append(fd)
        if len(locks) == 1:
            raise BlockingIOError(errno.EWOULDBLOCK, "held by a sweep")
        real_flock(fd, op)

    def mkstemp(**kwargs: Any) -> tuple[int, str]:
        fd, name = real_mkstemp(**kwargs)
        made.append(name)
        return fd, name

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(filewrite.tempfile, "mkstemp", mkstemp)
    before = _open_fds()
    data = kp.save(kp_samples.tiny(), tmp_path / "a.kpack")
    assert _open_fds() == before
    assert len(made) == 2
    assert (tmp_path / "a.kpack").read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["a.kpack"]  # the first swept after


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_the_temporary_is_whole_locked_and_synced_then_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F23 (the temporary not fsynced), F31 (fsynced before the buffered bytes were flushed),
    F38 (no locked temporary: mkstemp's unlocked fallback, which a concurrent write of the name
    could sweep as an orphan), F30 and F34 (the directory not fsynced after the rename):
    DESIGN.md 15, a crash mid-save leaves no partial file under the name, and the rename is
    durable."""
    import fcntl
    import stat

    real_fsync = os.fsync
    target = tmp_path / "a.kpack"
    seen: list[tuple] = []

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        where = os.readlink(f"/proc/self/fd/{fd}")
        if stat.S_ISDIR(st.st_mode):
            seen.append(("dir", where, target.exists()))
        else:
            probe = os.open(where, os.O_RDONLY)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = False
            except BlockingIOError:
                locked = True
            finally:
                os.close(probe)
            seen.append(("file", os.path.basename(where), st.st_size, locked))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    data = kp.save(kp_samples.tiny(), target)
    assert len(seen) == 2, seen
    kind, name, size, locked = seen[0]
    assert kind == "file" and name.startswith(".a.kpack.") and name.endswith(".tmp")
    assert (size, locked) == (len(data), True)
    assert seen[1] == ("dir", os.path.realpath(tmp_path), True)


def test_without_proc_a_new_file_still_follows_the_umask(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """F33 (where /proc cannot be read, a fixed 0o644): the fallback reads the umask too;
    under umask 077 a new artifact must not be world-readable."""
    def no_proc(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOENT, "no /proc here")

    monkeypatch.setattr(filewrite, "open", no_proc, raising=False)
    old = os.umask(0o077)
    try:
        kp.save(kp_samples.tiny(), tmp_path / "a.kpack")
    finally:
        os.umask(old)
    assert (tmp_path / "a.kpack").stat().st_mode & 0o777 == 0o600


def test_a_path_through_a_link_and_dotdot_is_written_where_the_kernel_puts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F36 (the path made absolute with ``abspath``, which drops ``link/..`` textually): the
    file named ``link/../a.kpack`` lies in the link target's parent; its temporary and the
    sweep of its orphans must be there too, not in the working directory."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real / "sub")
    orphan = real / ".a.kpack.abcd1234.tmp"
    orphan.write_bytes(b"partial")
    monkeypatch.chdir(tmp_path)
    data = kp.save(kp_samples.tiny(), "link/../a.kpack")
    assert (real / "a.kpack").read_bytes() == data
    assert not orphan.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_directory_is_refused_saying_a_file_path_is_expected(tmp_path: Path) -> None:
    """F22 (the directory check dropped: open() said only "Is a directory")."""
    with pytest.raises(IsADirectoryError, match="is a directory, expected a file path"):
        kp.save(kp_samples.tiny(), tmp_path)



@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_a_failed_close_closes_no_other_descriptor(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """X33 (the descriptor's slot set to 0, not -1, once the file object owns it): a close
    that fails after the rename reached the clean-up with ``fd`` 0, which closed the
    process's stdin. "f or fd owns the descriptor, never both"."""
    import types

    real_fdopen = os.fdopen

    class FailingClose:
        def __init__(self, fd: int, mode: str) -> None:
            self.f = real_fdopen(fd, mode)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def close(self) -> None:
            self.f.close()
            raise OSError(errno.EIO, "Input/output error")

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os)
                                       if not k.startswith("__")})
    fake_os.fdopen = FailingClose
    saved = os.dup(0)
    try:
        monkeypatch.setattr(filewrite, "os", fake_os)
        with pytest.raises(OSError, match="Input/output error") as info:
            kp.save(kp_samples.tiny(), tmp_path / "a.kpack")
        monkeypatch.setattr(filewrite, "os", os)
        assert info.value.filename == str(tmp_path / "a.kpack")
        os.fstat(0)  # still open
    finally:
        os.dup2(saved, 0)
        os.close(saved)

# ---- signing.py -------------------------------------------------------------------------------

def test_an_existing_file_named_like_a_hex_seed_is_read_as_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """G06 (a str always tried as 64 hex digits first): a str names a key file when such a file
    exists; only when none does is it the seed itself."""
    name, inside = bytes(range(32)), bytes(range(32, 64))
    monkeypatch.chdir(tmp_path)
    Path(name.hex()).write_text(inside.hex() + "\n")
    assert signing.public_key_bytes(name.hex()) == signing.public_key_bytes(inside)
    os.unlink(name.hex())
    assert signing.public_key_bytes(name.hex()) == signing.public_key_bytes(name)


def test_a_pem_private_key_of_another_algorithm_is_refused() -> None:
    """G08 (any PEM private key accepted): an EC key cannot make an ed25519 signature; it
    must be refused where given, naming its kind."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    with pytest.raises(ValueError, match=r"not an ed25519 private key \(\w+\)"):
        signing.load_private_key(pem)
    with pytest.raises(ValueError, match="sign_with: .*not an ed25519 private key"):
        kp.save(kp_samples.tiny(), sign_with=pem)


def test_write_keypair_leaves_no_half_pair_and_refuses_bad_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """G20 (the private key left behind when writing the public one fails), G28 (an empty path
    let through) and G29 (a private key written at a ``.pub`` path, which
    ``load_private_key`` refuses: the pair could never sign)."""
    with pytest.raises(ValueError, match="the private key's path is empty"):
        signing.write_keypair("")
    with pytest.raises(ValueError, match=r"'.*k\.pub' ends in \.pub"):
        signing.write_keypair(str(tmp_path / "k.pub"))
    assert list(tmp_path.iterdir()) == []

    def broken(private: object) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(signing, "public_key_bytes", broken)
    with pytest.raises(OSError, match="No space left"):
        signing.write_keypair(tmp_path / "k")
    assert list(tmp_path.iterdir()) == []



@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/fd")
def test_write_keypair_closes_its_files_and_names_a_failed_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """X39 (``_write_new`` never closing its descriptor: two leaked per key pair) and X44 (a
    failed write's errno and reason swapped in the error that names the file)."""
    before = _open_fds()
    signing.write_keypair(tmp_path / "a")
    assert _open_fds() == before

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(signing.os, "write", full)
    with pytest.raises(OSError) as info:
        signing.write_keypair(tmp_path / "b")
    monkeypatch.undo()
    assert (info.value.errno, info.value.strerror, info.value.filename) == (
        errno.ENOSPC, "No space left on device", str(tmp_path / "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a.pub"]
    assert _open_fds() == before

class _BytesPath(os.PathLike):
    def __init__(self, path: bytes) -> None:
        self.path = path

    def __fspath__(self) -> bytes:  # type: ignore[override]
        return self.path


def test_key_paths_whose_fspath_is_bytes(tmp_path: Path) -> None:
    """G30 (an ``os.PathLike`` giving bytes used as it is): its ``.endswith(".pub")`` with a
    str failed with TypeError; such a path is a path like any other."""
    private, public = signing.write_keypair(tmp_path / "k")
    key = signing.load_private_key(_BytesPath(os.fsencode(private)))
    assert signing.public_key_bytes(key) == signing.load_public_key(public)
    assert signing.load_public_key(_BytesPath(os.fsencode(public))) == \
        signing.load_public_key(public)
    data = kp.save(kp_samples.tiny(), sign_with=_BytesPath(os.fsencode(private)))
    kp.load(data, trusted_keys=[_BytesPath(os.fsencode(public))])


# ---- compiled.py ------------------------------------------------------------------------------

def test_image_data_is_copied_into_bytes() -> None:
    """C04 (a bytearray or memoryview kept as given): the image must hold its own immutable
    bytes: a caller's later change to the buffer changed a frozen image (and what was
    saved), and a bytearray made the image unhashable."""
    buf = bytearray(b"\x7fELF image")
    image = Image("cubin", "sm_80", buf)
    buf[0] = 0
    assert type(image.data) is bytes and image.data == b"\x7fELF image"
    view = Image("cubin", "sm_80", memoryview(b"\x7fELF view"))
    assert type(view.data) is bytes
    assert len({image, view, Image("cubin", "sm_80", b"\x7fELF image")}) == 2


def test_arch_specific_and_plain_images_of_one_arch() -> None:
    """C06 (the arch suffix left out of the sort key) and C14 (a target told apart by kind,
    major and minor only): ``sm_90`` and ``sm_90a`` are two targets; a module holds both, in
    one order whatever order they are given in, and saves to the same bytes."""
    plain = Image("cubin", "sm_90", kp_samples._noise(30), "t", 12080)
    special = Image("cubin", "sm_90a", kp_samples._noise(31), "t", 12080)
    one = Module("m", ("k",), (special, plain))
    two = Module("m", ("k",), (plain, special))
    assert one == two and [i.target for i in one.images] == ["sm_90", "sm_90a"]
    a = _one_launch("p", (), images=(special, plain))
    b = _one_launch("p", (), images=(plain, special))
    assert kp.save(a) == kp.save(b)
    assert kp.load(kp.save(a)).compiled("p") == a


def test_compiled_equality_leaves_the_origin_out_and_takes_any_iterable() -> None:
    """C21 (``origin`` compared): provenance, not content: a cache hit equals the program
    compiled afresh. C26 (``modules`` kept as given): a generator was read by the check and
    stored empty, a list made the program unhashable."""
    c = kp_samples.axpy()
    hit = Compiled(c.summary, c.modules, origin="disk")
    assert hit == c and hash(hit) == hash(c)
    again = Compiled(c.summary, (m for m in c.modules))
    assert again.modules == c.modules and again == c
    listed = Compiled(c.summary, list(c.modules))
    assert listed.modules == c.modules and hash(listed) == hash(c)


# ---- compile_entry.py (not the cache key) -----------------------------------------------------

F32_N = kp.Tensor[kp.f32, "n"]
F32_AB = kp.Tensor[kp.f32, "a", "b"]


@kp.fusion
def _double(x: F32_N) -> Any:
    return x * 2


@kp.fusion
def _twice_ab(x: F32_AB) -> Any:
    return x + x


def test_compile_options_and_arguments_are_checked_before_any_work() -> None:
    """K01 (unknown options ignored), K03 (an opt of the wrong type taken as the default),
    K07 (``cache=`` of the wrong type let through), K08 (a plain function let through)."""
    with pytest.raises(TypeError, match=r"unknown kp.compile option\(s\) \['fast'\]"):
        compile_entry.fusion_key(_double, ["sm_80"], None, {"fast": True})
    for bad in ("3", 1.5, None):
        with pytest.raises(ValueError, match=r"opt must be an integer 0..3 \(got "):
            compile_entry.Options.parse({"opt": bad})
    assert compile_entry.Options.parse({"opt": 0}).opt == 0
    with pytest.raises(TypeError, match="cache= takes a kp.Cache"):
        kp.compile(_double, targets=["sm_80"], cache="/tmp/cache")
    with pytest.raises(TypeError, match="kp.compile takes a @kp.fusion function"):
        kp.compile(lambda x: x, targets=["sm_80"])  # type: ignore[arg-type]


def test_a_target_str_and_the_default_options() -> None:
    """X53 (a str of targets split into its letters before the check): the error quotes what
    was given. X54 (``Options``' default opt 4): ``Options()`` (the build's default) and
    ``Options.parse({})`` (``kp.compile``'s) agree."""
    with pytest.raises(TypeError, match=r"targets must be a list such as .* \(got 'sm_80'\)"):
        kp.compile(_double, targets="sm_80")  # type: ignore[arg-type]
    assert compile_entry.Options() == compile_entry.Options.parse({})
    assert compile_entry.Options().opt == 3


def test_static_dims_are_sorted() -> None:
    """K09 (``static_dims`` in the order given): the build's static dims are normalized, so
    ``static={"b": .., "a": ..}`` and ``{"a": .., "b": ..}`` build alike."""
    assert compile_entry.static_dims(_twice_ab, {"b": 2, "a": 3}) == (("a", 3), ("b", 2))


@pytest.fixture
def fake_lowering(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``compile_traced`` replaced by a recorder (no LLVM), and an empty recent-compiles
    table: what ``kp.compile`` asks the lowering for, and when."""
    from kernelpack.lowering import pipeline

    calls: list[tuple] = []

    def compile_traced(f: Any, graph: Any, targets: Any, static: Any, options: Any) -> Any:
        calls.append((f.name, list(targets), dict(static or {})))
        return object()

    monkeypatch.setattr(pipeline, "compile_traced", compile_traced)
    monkeypatch.setattr(compile_entry, "_RECENT", OrderedDict())
    return calls


def test_targets_given_as_a_generator_reach_the_lowering(fake_lowering: list[tuple]) -> None:
    """K04 (a generator of targets passed on as it is): the key read it, and the lowering got
    it exhausted."""
    kp.compile(_double, targets=(t for t in ["sm_80", "ptx"]))
    assert fake_lowering == [("_double", ["sm_80", "ptx"], {})]


def test_recent_compiles_are_kept_least_recently_used_and_bounded(
        fake_lowering: list[tuple]) -> None:
    """K10 (a compile not recorded), K06 (a repeat not moved to the end: first in, first out)
    and K05 (one more kept than ``_RECENT_SIZE``): a repeat within the last 32 is a lookup,
    and the table stays bounded (its reason: LLVM memory per compile)."""
    size = compile_entry._RECENT_SIZE

    def build(n: int) -> object:
        return kp.compile(_double, targets=["sm_80"], static={"n": n})

    first = build(1)
    assert build(1) is first and len(fake_lowering) == 1
    for n in range(2, size + 1):
        build(n)
    assert build(1) is first and len(fake_lowering) == size  # used again: now the newest
    build(size + 1)  # evicts the least recently used: n=2
    assert len(compile_entry._RECENT) == size
    assert build(1) is first and len(fake_lowering) == size + 1
    build(2)
    assert len(fake_lowering) == size + 2 and fake_lowering[-1][2] == {"n": 2}


# ---- _fields.py / _records.py -----------------------------------------------------------------

def test_shapes_and_launch_dims_are_checked_where_given() -> None:
    """D02 (a constant dim of -1 let through), D03 (rank 17 let through), D04 (a grid of no
    dims padded to (1, 1, 1)): each must fail where the summary is written, naming the field."""
    with pytest.raises(ValueError, match=r"tensor 'x': shape\[0\] = -1 is negative"):
        Tensor("x", kp.f32, (-1,))
    with pytest.raises(ValueError, match="tensor 'x': rank 17 exceeds the limit 16"):
        Tensor("x", kp.f32, ["n"] * 17)
    assert len(Tensor("x", kp.f32, ["n"] * 16).shape) == 16
    with pytest.raises(ValueError, match=r"grid takes 1 to 3 dimensions \(got 0\)"):
        Launch("k", "m", (), (1,), ())


def test_frozen_records_compare_every_field() -> None:
    """D09 (equality leaving the last field out): a signature checked against trusted keys is
    not the same record as one that was not."""
    from kernelpack.loader import SignatureInfo

    assert SignatureInfo("a", "b", True) != SignatureInfo("a", "b", False)
    assert SignatureInfo("a", "b", True) == SignatureInfo("a", "b", True)
