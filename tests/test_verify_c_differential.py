"""The verifier's C walker (``_verify.c``) against the Python walker, its reference.

The rule the C walker keeps: it never accepts what the Python walker rejects (and accepts with
the same root offset), and it rejects nothing the Python walker accepts. Checked here on a
corpus of real artifacts (every kind the writers make: samples, kp.external, kp.compile
fusions, hand-written FlatBuffers, signed packs, a 100-program pack; each file and its nested
body) and thousands of seeded mutations of them aimed at every check: byte flips,
truncations, offsets and counts set to edge values, vtable sizes, string bytes replaced by
valid and invalid UTF-8, string lengths around their limits, shared sub-objects.
"""

from __future__ import annotations

import random
import struct
from functools import lru_cache
from typing import Callable

import pytest

import kernelpack as kp
from kernelpack import _verify_native, verify
from kernelpack._fbread import Table
from kernelpack.errors import FormatError
from kernelpack.limits import FILE_IDENTIFIER, MAX_NAME_LENGTH, MAX_SYMBOLS, MAX_TEXT_LENGTH
from kernelpack.signing import generate_private_key

import kp_handwritten
import kp_samples

FAST = _verify_native.load() if _verify_native.walker is None else _verify_native.walker
pytestmark = pytest.mark.skipif(not FAST, reason="kernelpack.runtime._launch built without "
                                                 "_verify.c (python setup.py build_ext)")

Case = tuple[bytes, str, "bytes | None"]  # (buffer, root type, identifier)


def c_verdict(buf: object, root_type: str, identifier: bytes | None) -> int:
    """The C walker alone: the root offset, -1 (reject) or -2 (left to Python)."""
    _, index, tables = _verify_native.tables(verify._PLANS)
    return FAST(buf, index[root_type], identifier, tables, verify.MAX_TABLE_DEPTH,
                verify.MAX_NAME_LENGTH, verify.MAX_FILE_SIZE, verify.BODY_ALIGNMENT)


def py_verdict(buf: object, root_type: str, identifier: bytes | None) -> int | None:
    """The Python walker alone: the root offset, or None when it raises FormatError."""
    try:
        return verify.verify_buffer(buf, root_type, identifier=identifier,  # type: ignore[arg-type]
                                    _use_c=False)
    except FormatError:
        return None


def body_of(data: bytes) -> bytes:
    pack = Table(data, verify.verify_buffer(data, "Pack", identifier=FILE_IDENTIFIER), "Pack")
    return bytes(pack.view("body"))


@kp.fusion
def _double(x: kp.Tensor[kp.f32, "n"]):  # noqa: F821
    return x * 2.0


@kp.fusion
def _softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):  # noqa: F821
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@lru_cache(maxsize=None)
def artifacts() -> dict[str, bytes]:
    """Real artifacts of every writer, by name (built once per test session)."""
    out = {
        "axpy": kp.save(kp_samples.axpy()),
        "tiny+rich": kp.save([kp_samples.tiny(), kp_samples.rich()]),
        "signed": kp.save(kp_samples.axpy(), sign_with=generate_private_key()),
        "hand": kp_handwritten.artifact(),
        "hand-newer-minor": kp_handwritten.artifact(appended_pack_field=7, minor=3),
        "hand-signed": kp_handwritten.artifact(signature=(b"k" * 32, b"s" * 64)),
        "hand-utf8": kp_handwritten.artifact(programs=("é€😀\U0010FFFF", "\x00nul"),
                                             symbols=("n", "ß")),
        "hand-longest-name": kp_handwritten.artifact(programs=("p" * MAX_NAME_LENGTH,)),
        "hand-most-symbols": kp_handwritten.artifact(symbols=tuple(f"s{i}" for i in
                                                                   range(MAX_SYMBOLS))),
        "hundred": kp.save([kp_samples.axpy(f"p{i:03d}", f"m{i:03d}") for i in range(100)]),
    }
    try:
        from kp_samples import PTX_PATH
        ptx = PTX_PATH.read_text()
        params = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                  kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]
        out["external"] = kp.save(kp.external("axpy", "axpy", params, kp.cdiv("n", 256), 256,
                                              ptx=ptx, targets=("sm_80", "ptx")))
        out["fusions"] = kp.save([kp.compile(_double, targets=["sm_90"]),
                                  kp.compile(_softmax, targets=["sm_80"])])
    except ImportError:  # pragma: no cover - compile extras missing: the rest still runs
        pass
    return out


def cases() -> list[tuple[str, Case]]:
    out: list[tuple[str, Case]] = []
    for name, data in artifacts().items():
        out.append((name, (data, "Pack", FILE_IDENTIFIER)))
        out.append((name + ".body", (body_of(data), "Body", None)))
    return out


def test_corpus_is_accepted_by_both_with_the_same_root() -> None:
    assert len(artifacts()) >= 10
    for name, (buf, root_type, ident) in cases():
        expected = py_verdict(buf, root_type, ident)
        assert expected is not None, name
        assert c_verdict(buf, root_type, ident) == expected, name
        assert verify.verify_buffer(buf, root_type, identifier=ident) == expected, name
        for view in (bytearray(buf), memoryview(buf), memoryview(bytearray(buf))):
            assert c_verdict(view, root_type, ident) == expected, (name, type(view))


# ---- mutations --------------------------------------------------------------------------------
EDGE_U32 = (0, 1, 2, 3, 4, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0xFFFFFFF8)
EDGE_U16 = (0, 1, 2, 3, 4, 5, 6, 8, 0xFFFE, 0xFFFF)
# same-length replacements for string bytes: valid sequences, then each way UTF-8 goes wrong
UTF8 = [b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xed\x9f\xbf", b"\xee\x80\x80",
        b"\xf4\x8f\xbf\xbf", b"\xc2\x80", b"\xef\xbf\xbf",
        b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80",
        b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80", b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc3", b"\xe2\x82",
        b"\xf0\x9f\x98", b"\xc3\x28", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\xf8\x88\x80\x80"]


def strings(buf: bytes) -> list[tuple[int, int]]:
    """(position, length) of what looks like a string: a length, printable bytes, a NUL."""
    out = []
    for p in range(0, len(buf) - 5, 4):
        n = struct.unpack_from("<I", buf, p)[0]
        if 1 <= n <= 4096 and p + 4 + n < len(buf) and buf[p + 4 + n] == 0 and \
                all(32 <= c < 127 for c in buf[p + 4:p + 4 + n]):
            out.append((p, n))
    return out


def mutate(rng: random.Random, buf: bytes, strs: list[tuple[int, int]]) -> bytes:
    """One seeded mutation of ``buf``, of a kind picked at random."""
    b = bytearray(buf)
    n = len(b)
    strs = [(p, length) for p, length in strs if p + 4 + length < n]  # after a cut
    kind = rng.randrange(9)
    if kind == 0:  # random bytes
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(n)] = rng.randrange(256)
    elif kind == 1:  # cut off
        return bytes(b[:rng.randrange(n)])
    elif kind == 2:  # a u32 (offset, count, length, soffset) set to an edge value
        p = rng.randrange(0, n - 3, 4)
        value = rng.choice(EDGE_U32 + (n, n - p, n - p - 4, n - p + 4, rng.randrange(1 << 32)))
        struct.pack_into("<I", b, p, value % (1 << 32))
    elif kind == 3:  # a u16 (vtable size, table size, field offset) set to an edge value
        p = rng.randrange(0, n - 1, 2)
        struct.pack_into("<H", b, p, rng.choice(EDGE_U16 + (rng.randrange(1 << 16),)))
    elif kind == 4 and strs:  # string bytes replaced by valid or invalid UTF-8
        p, length = rng.choice(strs)
        seq = rng.choice(UTF8)[:length]
        at = p + 4 + rng.randrange(length - len(seq) + 1)
        b[at:at + len(seq)] = seq
    elif kind == 5 and strs:  # a string length around its limits
        p, length = rng.choice(strs)
        value = rng.choice((length + 1, length - 1, 0, MAX_NAME_LENGTH, MAX_NAME_LENGTH + 1,
                            MAX_TEXT_LENGTH, MAX_TEXT_LENGTH + 1, n, 0xFFFFFFFF))
        struct.pack_into("<I", b, p, value)
    elif kind == 6 and strs:  # a string's NUL terminator overwritten
        p, length = rng.choice(strs)
        b[p + 4 + length] = rng.randrange(1, 256)
    elif kind == 7 and len(strs) >= 2:  # an offset to a string redirected to another one
        (p, _), (q, _) = rng.sample(strs, 2)
        refs = [r for r in range(0, n - 3, 4) if r + struct.unpack_from("<I", b, r)[0] == p]
        if refs:
            r = rng.choice(refs)
            struct.pack_into("<I", b, r, (q - r) % (1 << 32))
    else:  # an aligned u32 made to point at another aligned position (shared objects)
        p = rng.randrange(0, n - 3, 4)
        struct.pack_into("<I", b, p, (rng.randrange(0, n, 4) - p) % (1 << 32))
    return bytes(b)


def check(buf: bytes, root_type: str, ident: bytes | None, what: str) -> str:
    """Compare the walkers on one buffer; returns "accept" or "reject"."""
    c = c_verdict(buf, root_type, ident)
    py = py_verdict(buf, root_type, ident)
    assert c != -2, what
    if c >= 0:
        assert py == c, f"{what}: C accepts (root {c}), Python: {py}"
    else:
        assert py is None, f"{what}: C is stricter than Python (which accepts, root {py})"
    return "accept" if c >= 0 else "reject"


@pytest.mark.parametrize("seed", range(4))
def test_mutations_get_the_same_verdict(seed: int) -> None:
    rng = random.Random(seed)
    verdicts = {"accept": 0, "reject": 0}
    for name, (buf, root_type, ident) in cases():
        strs = strings(buf)
        # the 100-program pack costs the Python walker ~10 ms a pass: fewer of its mutations
        rounds = 40 if name.startswith("hundred") else 300
        for i in range(rounds):
            data = mutate(rng, buf, strs)
            verdicts[check(data, root_type, ident, f"{name} seed {seed} #{i}")] += 1
    # both verdicts are exercised, or the comparison says little
    assert verdicts["accept"] > 200 and verdicts["reject"] > 1000, verdicts


def test_stacked_mutations_get_the_same_verdict() -> None:
    rng = random.Random(99)
    for name, (buf, root_type, ident) in cases():
        if name.startswith("hundred"):
            continue
        strs = strings(buf)
        for i in range(150):
            data = buf
            for _ in range(rng.randint(2, 6)):
                data = mutate(rng, data, strs) if len(data) > 8 else buf
            check(data, root_type, ident, f"{name} stacked #{i}")


@pytest.mark.parametrize("name, values", [
    ("hand.body", (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF)),
    ("tiny+rich.body", (0x00, 0x02, 0xFF)),  # every enum, bool and field kind, ~2.5 KB
])
def test_every_byte_of_a_small_body_set_to_each_edge_value(name: str,
                                                           values: tuple[int, ...]) -> None:
    # exhaustive over positions (random picks miss the one byte of a bool)
    buf, root_type, ident = dict(cases())[name]
    for p in range(len(buf)):
        for value in values:
            if buf[p] != value:
                data = buf[:p] + bytes([value]) + buf[p + 1:]
                check(data, root_type, ident, f"{name} byte {p} = {value:#x}")
    for cut in range(0, len(buf), 1 if name == "hand.body" else 7):
        check(buf[:cut], root_type, ident, f"{name} cut at {cut}")


@pytest.mark.parametrize("name", ["hand", "hand.body", "axpy.body", "tiny+rich.body"])
@pytest.mark.parametrize("gap", range(6))
def test_root_vtable_moved_behind_the_data(name: str, gap: int) -> None:
    # a vtable may be anywhere (FlatBuffers shares them), but 2-aligned: an odd one is refused
    buf, root_type, ident = dict(cases())[name]
    root = struct.unpack_from("<I", buf, 0)[0]
    vt = root - struct.unpack_from("<i", buf, root)[0]
    moved = bytearray(buf) + bytes(gap)
    new_vt = len(moved)
    moved += buf[vt:vt + struct.unpack_from("<H", buf, vt)[0]]
    struct.pack_into("<i", moved, root, root - new_vt)
    expected = "reject" if new_vt % 2 else "accept"
    assert check(bytes(moved), root_type, ident, f"{name} vtable at {new_vt}") == expected
    # and before the buffer: positions -2, -4, ... (unsigned arithmetic would wrap them)
    struct.pack_into("<i", moved, root, root + 2 + 2 * gap)
    assert check(bytes(moved), root_type, ident, f"{name} vtable at {-2 - 2 * gap}") == "reject"


# ---- limits the walkers read at call time ------------------------------------------------------
@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4, 16])
def test_table_depth_limit_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch,
                                                depth: int) -> None:
    # Body -> Program -> Variant -> Launch -> Arg: four levels below the root
    body = body_of(artifacts()["axpy"])
    monkeypatch.setattr(verify, "MAX_TABLE_DEPTH", depth)
    assert check(body, "Body", None, f"depth {depth}") == ("accept" if depth >= 4 else "reject")


def test_name_length_limit_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    body = body_of(kp_handwritten.artifact(kernels=("k" * 40,), launch_kernel="k" * 40))
    assert check(body, "Body", None, "kernel name of 40") == "accept"
    monkeypatch.setattr(verify, "MAX_NAME_LENGTH", 39)  # the limit of names in [str] vectors
    assert check(body, "Body", None, "kernel name of 40, limit 39") == "reject"


def test_longest_string_and_longest_vector_pass_and_one_more_fails() -> None:
    too_long = kp_handwritten.artifact(programs=("p" * (MAX_NAME_LENGTH + 1),))
    assert check(body_of(too_long), "Body", None, "name over the limit") == "reject"
    too_many = kp_handwritten.artifact(symbols=tuple(f"s{i}" for i in range(MAX_SYMBOLS + 1)))
    assert check(body_of(too_many), "Body", None, "symbols over the limit") == "reject"
    for name in ("hand-longest-name", "hand-most-symbols"):
        assert check(body_of(artifacts()[name]), "Body", None, name) == "accept"


def test_file_size_limit_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    data = artifacts()["axpy"]
    monkeypatch.setattr(verify, "MAX_FILE_SIZE", len(data) - 1)
    assert check(data, "Pack", FILE_IDENTIFIER, "file over the size limit") == "reject"
    monkeypatch.setattr(verify, "MAX_FILE_SIZE", len(data))
    assert check(data, "Pack", FILE_IDENTIFIER, "file at the size limit") == "accept"


# ---- what the C walker leaves to Python ---------------------------------------------------------
@pytest.mark.parametrize("convert", [
    lambda b: memoryview(b).cast("c"),          # items are bytes objects to the Python walker
    lambda b: memoryview(b).cast("b"),          # signed items
    lambda b: memoryview(b + bytes(-len(b) % 4)).cast("I"),  # 4-byte items
    lambda b: memoryview(bytes(2 * len(b)))[::2],  # not contiguous
    lambda b: memoryview(b[:len(b) // 2 * 2]).cast("B", (2, len(b) // 2)),  # two dimensions
])
def test_unusual_buffers_are_left_to_the_python_walker(convert: Callable) -> None:
    data = artifacts()["hand"]
    view = convert(data)
    assert c_verdict(view, "Pack", FILE_IDENTIFIER) == -2
    answers = []
    for use_c in (True, False):  # the same answer, or the same exception, either way
        try:
            answers.append(verify.verify_buffer(view, "Pack", identifier=FILE_IDENTIFIER,
                                                _use_c=use_c))
        except Exception as exc:  # noqa: BLE001 - a strided view is not even readable
            answers.append((type(exc), str(exc)))
    assert answers[0] == answers[1]


def test_identifier_that_is_not_bytes_is_left_to_the_python_walker() -> None:
    data = artifacts()["hand"]
    assert c_verdict(data, "Pack", bytearray(b"KPAK")) == -2  # type: ignore[arg-type]
    assert verify.verify_buffer(data, "Pack", identifier=bytearray(b"KPAK")) == \
        py_verdict(data, "Pack", FILE_IDENTIFIER)  # type: ignore[arg-type]
    assert c_verdict(data, "Pack", b"KPA") == -1  # Python compares 4 bytes with 3: a mismatch
    assert py_verdict(data, "Pack", b"KPA") is None


def test_a_malformed_description_is_refused() -> None:
    _, index, tables = _verify_native.tables(verify._PLANS)
    args = (index["Pack"], FILE_IDENTIFIER)
    limits = (16, MAX_NAME_LENGTH, verify.MAX_FILE_SIZE, 8)
    data = artifacts()["hand"]
    with pytest.raises(ValueError, match=r"tables\[0\]\[0\]\[0\] must be in 0..8 \(got 9\)"):
        FAST(data, *args, ((( 9, 4, 4, 0, 0),),), *limits)
    with pytest.raises(ValueError, match="inconsistent"):
        FAST(data, *args, (((8, 4, 4, 5, 0),),), *limits)  # table index out of range
    with pytest.raises(TypeError, match="5-tuple"):
        FAST(data, *args, (((8, 4, 4),),), *limits)
    with pytest.raises(ValueError, match="root_table must be"):
        FAST(data, len(tables), FILE_IDENTIFIER, tables, *limits)
    with pytest.raises(TypeError, match="8 arguments"):
        FAST(data, *args, tables)
    assert FAST(data, *args, tables, *limits) == py_verdict(data, "Pack", FILE_IDENTIFIER)
