"""Review of Table.tree (``_fbread.c``'s fb_tree, ``_fbread._tree``) and of its users
(decode_program, Pack.__init__'s module index) and of KernelSummary.check's shortcuts.

Tests whose docstring starts with "Was a bug:" show a problem the review found, fixed since (the
reads are staged, each checked before the next; spec codes are checked whole); the others hold
properties that the change keeps and must keep."""

from __future__ import annotations

import gc
import mmap
import random
import struct
import sys
import tracemalloc
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import _fbread, verify
from kernelpack._fbread import Table
from kernelpack.errors import KernelPackError
from kernelpack.serializer import assemble, encode
from kernelpack.summary import Arg, KernelSummary, Launch, Scalar, Scratch, Tensor, Variant

import kp_samples
from test_fbread_tree import FULL, artifacts, body_of, roots
from test_review2_hostile import artifact, program
from test_verify_c_differential import mutate, strings

fb_tree = pytest.importorskip("kernelpack.runtime._launch").__dict__.get("fb_tree")
pytestmark = pytest.mark.skipif(fb_tree is None, reason="the extension lacks _fbread.c")

# Python 3.12 and later run the collector only from the interpreter loop (its eval breaker, and
# PyErr_CheckSignals, which fb_tree never calls), never inside a C function's allocations: there
# no finalizer can run inside fb_tree at all, and the premise below (one that does) cannot be set
# up; the reads are still checked against the Python reader's.
COLLECTS_INSIDE_C = sys.version_info < (3, 12)


# ---- the buffer cannot change under the C reader ------------------------------------------------
def _with_finalizer_during_read(action: Any, buf: Any, pos: int, spec: tuple) -> tuple[list, Any]:
    """Call fb_tree with the collector set to run on every allocation and a piece of cyclic
    garbage whose __del__ runs ``action``: Python code inside the C call. Returns what the
    finalizer saw (raised or not, and whether it ran inside the call) and the read."""
    seen: list[tuple[bool, str]] = []
    state = {"inside": False}

    class Hook:
        def __del__(self) -> None:
            try:
                action()
                seen.append((state["inside"], "done"))
            except BufferError:
                seen.append((state["inside"], "BufferError"))

    old = gc.get_threshold()
    gc.collect()
    try:
        gc.set_threshold(1)
        hook = Hook()
        hook.cycle = hook  # type: ignore[attr-defined]
        del hook
        state["inside"] = True
        out = fb_tree(buf, pos, spec)
        state["inside"] = False
    finally:
        state["inside"] = False
        gc.set_threshold(*old)
    gc.collect()
    return seen, out


def test_a_finalizer_cannot_resize_a_bytearray_while_it_is_read() -> None:
    """Python code can run inside fb_tree (a collection on one of its allocations runs
    finalizers). The buffer export fb_tree holds for the whole call must make a resize of the
    bytearray being read fail (BufferError), so no read ever sees freed memory; the result is
    the Python reader's, and the export is gone afterwards."""
    body = roots(artifacts()["tiny+rich"])[1]
    buf = bytearray(body.buf)
    expected = _fbread._tree(body, FULL["Body"])
    ran_inside = 0
    for _ in range(5):
        seen, out = _with_finalizer_during_read(lambda: buf.extend(bytes(4096)), buf, body.pos,
                                                FULL["Body"])
        assert out == expected
        assert all(what == "BufferError" for inside, what in seen if inside), seen
        ran_inside += sum(inside for inside, _ in seen)
    if COLLECTS_INSIDE_C:
        assert ran_inside > 0  # the finalizer did run inside the call at least once
    buf.extend(b"\0")  # no export left behind


def test_a_finalizer_cannot_close_a_mapped_buffer_while_it_is_read() -> None:
    """The same for a memoryview of an mmap (what kp.load reads a large file through): closing
    the map inside the call must fail, never unmap the bytes being read."""
    body = roots(artifacts()["tiny+rich"])[1]
    data = bytes(body.buf)
    m = mmap.mmap(-1, len(data))
    m[:] = data
    view = memoryview(m)
    expected = _fbread._tree(body, FULL["Body"])
    try:
        seen, out = _with_finalizer_during_read(m.close, view, body.pos, FULL["Body"])
        assert out == expected
        assert all(what == "BufferError" for inside, what in seen if inside), seen
        assert not m.closed
    finally:
        view.release()
        m.close()


# ---- verified buffers never make the C reader raise ----------------------------------------------
def test_every_string_the_verifier_accepts_decodes_in_c_and_python_alike() -> None:
    """fb_tree decodes strings with CPython's strict UTF-8 and decode_program calls it outside
    its try: a string the verifier (C walker) accepted but fb_tree refused would escape
    kp.load / .summary as a UnicodeDecodeError. Every lead byte with edge continuation bytes,
    written over a symbol of a real body: verifier accepts <=> fb_tree reads, same values."""
    data = body_of(kp_handwritten_artifact())
    spec = _fbread.tree_spec("Body", (("programs", ("name", "symbols")),))
    target = next(p for p, n in strings(data) if n >= 4 and data[p + 4:p + 4 + n].isalpha())
    edges = (0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF)
    accepted = rejected = 0
    for lead in range(0x80, 0x100):
        for c1 in edges:
            for c2 in (0x80, 0xBF, 0x41):
                seq = bytes((lead, c1, c2, 0x80))
                buf = bytearray(data)
                buf[target + 4:target + 8] = seq
                buf = bytes(buf)
                try:
                    root = verify.verify_buffer(buf, "Body", identifier=None)
                except kp.FormatError:
                    rejected += 1
                    continue
                accepted += 1
                table = Table(buf, root, "Body")
                assert fb_tree(buf, root, spec) == _fbread._tree(table, spec), seq
    assert accepted > 40 and rejected > 500


def kp_handwritten_artifact() -> bytes:
    import kp_handwritten

    return kp_handwritten.artifact(symbols=("abcd", "n"))


def _outcome(data: bytes) -> list[Any]:
    """What a user sees of an artifact: kp.load, every summary, every compiled program."""
    try:
        pack = kp.load(data)
    except KernelPackError as exc:
        return [("load", type(exc).__name__, str(exc))]
    out: list[Any] = [("generator", pack.generator)]
    for m in pack.modules.values():
        out.append((m.name, m.kernels, [(i.kind, str(i.arch), i.codec, i.raw_size, i.digest,
                                         i.raw_digest, i.toolchain, i.cuda_version, i.ptx_isa,
                                         i.blob, i.stored_size) for i in m.images]))
    for name in pack.programs:
        for what in ("summary", "compiled"):
            try:
                got = pack[name].summary if what == "summary" else pack.compiled(name).summary
                out.append((what, name, repr(got)))
            except KernelPackError as exc:
                out.append((what, name, type(exc).__name__, str(exc)))
    return out


def test_load_summary_and_compiled_are_the_same_with_the_c_and_the_python_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies mutated under a recomputed digest (so the mutations reach the body's verifier,
    the module index and the decoder): every outcome of kp.load, .summary and compiled() is
    the same, message for message, whichever reader Table.tree uses, and nothing but a
    KernelPackError ever escapes (the C reader's ValueError included)."""
    seeds = [encode([kp_samples.rich(), kp_samples.axpy()]), encode([kp_samples.tiny()])]
    rng = random.Random(2311)
    cases = []
    for _ in range(160):
        body, blobs = rng.choice(seeds)
        cases.append(assemble(mutate(rng, body, strings(body)), blobs, None))
    with_c = [_outcome(data) for data in cases]
    monkeypatch.setattr(_fbread, "_native_tree", False)
    with_python = [_outcome(data) for data in cases]
    assert with_c == with_python
    loaded = sum(len(o) > 1 for o in with_c)
    assert 10 < loaded < len(cases)  # both loads and refusals were compared


def test_absent_fields_beyond_a_short_vtable_read_their_schema_defaults() -> None:
    """The FlatBuffers builder trims a vtable after its last present field, so Param.value
    (slot 6), Launch.count (5) and Variant.predicate (0, absent) can lie beyond it: both
    readers answer the schema default -1 (no value, no count, no predicate), as Table.get
    did before the change."""
    prog = program(params=[{"kind": 0, "name": "x", "dtype": 12, "shape": [0]},
                           {"kind": 1, "name": "s", "dtype": 6}])
    data = artifact([prog])
    body = roots(data)[1]
    spec = _fbread.tree_spec("Body", (("programs", (("params", ("name", "value")), (
        "variants", ("predicate", ("launches", ("count", "shared_mem")))))),))
    c = fb_tree(body.buf, body.pos, spec)
    assert c == _fbread._tree(body, spec)
    (programs,) = c
    assert programs[0][0] == [["x", -1], ["s", -1]]
    assert programs[0][1] == [[-1, [[-1, 1]]]]  # program()'s shared_mem is 1
    summary = kp.load(data)["p"].summary
    assert summary.params[1].value is None and summary.variants[0].predicate is None
    assert summary.variants[0].launches[0].count is None


# ---- malformed specs ---------------------------------------------------------------------------
@pytest.mark.parametrize("code", [2 ** 32 + 4, -(2 ** 32) - 8, 2 ** 32 + 1, -(2 ** 33) - 2])
def test_scalar_codes_are_checked_whole_not_by_their_low_32_bits(code: int) -> None:
    """Was a bug: _fbread.c code_size() cast the code to unsigned before checking it, so a spec
    code of 2**32 + 4 passes as 4 (a u32 is read) where every other bad code is a ValueError
    ("scalar code ... is not one of +-1, 2, 4, 8"). (Its negation of LONG_MIN, for a code of
    -2**63, is undefined behaviour that UBSan reports: same fix.)"""
    body = roots(artifacts()["axpy"])[1]
    slot = [name for name, _, _ in _schema_fields("Body")].index("generator")
    for spec in (((slot, 0, code, 0, "g"),), ((slot, 1, (code,), None, "g"),),
                 ((slot, 4, code, (), "g"),)):
        with pytest.raises(ValueError, match="is not one of"):
            fb_tree(body.buf, body.pos, spec)


def test_scalar_code_of_the_smallest_long_is_refused() -> None:
    """A code of -2**63 is refused with the message of any other bad code. Passes in a normal
    build; in the ASan+UBSan build (halt_on_error=1) code_size()'s ``-code`` is reported as
    signed overflow and the process aborted: see the test above, same fix."""
    body = roots(artifacts()["axpy"])[1]
    with pytest.raises(ValueError, match="is not one of"):
        fb_tree(body.buf, body.pos, ((0, 0, -2 ** 63, 0, "g"),))


def _schema_fields(table: str) -> tuple:
    from kernelpack._schema import TABLES

    return TABLES[table]


# ---- hostile bodies: the whole tree is read before the first check -------------------------------
def _wide_body(modules: int, images: int) -> bytes:
    """A verifiable Body of ``modules`` nameless modules, each with ``images`` empty ImageMeta
    tables (8 bytes each: an offset and a table; the vtables are shared). Module 0's missing
    name is an error the loader reports at once."""
    out = bytearray(4)
    vt_body = len(out)
    out += struct.pack("<5H", 10, 8, 0, 0, 4) + b"\0\0"  # Body.modules at 4
    vt_module = len(out)
    out += struct.pack("<5H", 10, 8, 0, 0, 4) + b"\0\0"  # Module.images at 4
    vt_image = len(out)
    out += struct.pack("<2H", 4, 4)                      # ImageMeta: no fields
    body = len(out)
    struct.pack_into("<I", out, 0, body)
    out += struct.pack("<iI", body - vt_body, 4)  # modules vector right after
    out += struct.pack("<I", modules)
    slots = len(out)
    out += bytes(4 * modules)
    for m in range(modules):
        mt = len(out)
        struct.pack_into("<I", out, slots + 4 * m, mt - (slots + 4 * m))
        out += struct.pack("<iII", mt - vt_module, 4, images)
        islots = len(out)
        out += bytes(4 * images)
        for i in range(images):
            it = len(out)
            struct.pack_into("<I", out, islots + 4 * i, it - (islots + 4 * i))
            out += struct.pack("<i", it - vt_image)
    return bytes(out)


def _deep_body(variants: int, launches: int, args: int, ops: bytes = b"\xff" * 4) -> bytes:
    """A verifiable Body of one program 'p' whose expression program is ``ops`` (by default
    garbage: the decoder's first check; at most 4 bytes) and which has ``variants`` x
    ``launches`` x ``args`` empty tables."""
    assert len(ops) <= 4
    out = bytearray(4)

    def patch(at: int, target: int) -> None:
        struct.pack_into("<I", out, at, target - at)

    vt_body = len(out)
    out += struct.pack("<5H", 10, 8, 0, 4, 0) + b"\0\0"            # Body.programs at 4
    vt_prog = len(out)
    out += struct.pack("<9H", 18, 16, 4, 0, 8, 0, 0, 0, 12) + b"\0\0"  # name, ops, variants
    vt_variant = len(out)
    out += struct.pack("<5H", 10, 8, 0, 0, 4) + b"\0\0"            # Variant.launches at 4
    vt_launch = len(out)
    out += struct.pack("<10H", 20, 8, 0, 0, 0, 0, 0, 0, 0, 4)        # Launch.args at 4
    vt_empty = len(out)
    out += struct.pack("<2H", 4, 4)
    body = len(out)
    struct.pack_into("<I", out, 0, body)
    out += struct.pack("<iI", body - vt_body, 4) + struct.pack("<II", 1, 4)
    prog = len(out)
    out += struct.pack("<iIII", prog - vt_prog, 12, 16, 20)  # name, ops, variants follow
    out += struct.pack("<I", 1) + b"p\0\0\0"                  # name at prog + 16
    out += struct.pack("<I", len(ops)) + ops.ljust(4, b"\0")  # ops at prog + 24
    out += struct.pack("<I", variants)                        # variants at prog + 32
    vslots = len(out)
    out += bytes(4 * variants)
    for v in range(variants):
        vt = len(out)
        patch(vslots + 4 * v, vt)
        out += struct.pack("<iII", vt - vt_variant, 4, launches)
        lslots = len(out)
        out += bytes(4 * launches)
        for li in range(launches):
            lt = len(out)
            patch(lslots + 4 * li, lt)
            out += struct.pack("<iII", lt - vt_launch, 4, args)
            aslots = len(out)
            out += bytes(4 * args)
            for a in range(args):
                at = len(out)
                patch(aslots + 4 * a, at)
                out += struct.pack("<i", at - vt_empty)
    return bytes(out)


def _peak(call: Any) -> tuple[int, str]:
    """Peak traced allocation of ``call()`` and the KernelPackError it raises."""
    gc.collect()
    tracemalloc.start()
    try:
        call()
        raised = "nothing"
    except KernelPackError as exc:
        raised = str(exc)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def test_the_hostile_bodies_are_what_the_bug_tests_say() -> None:
    """The two hostile bodies below are verifiable (so the readers get them) and small ones
    fail at the first check, as before the change."""
    wide = assemble(_wide_body(3, 5), [], None)
    with pytest.raises(kp.FormatError, match="module name '' is not an identifier"):
        kp.load(wide)
    pack = kp.load(assemble(_deep_body(2, 3, 4), [], None))
    assert pack.programs == ["p"]
    with pytest.raises(kp.FormatError, match="program 'p': expression program"):
        pack["p"].summary


def test_a_hostile_module_index_is_refused_without_reading_every_image() -> None:
    """Was a bug: Pack.__init__ read the whole module index (every module's every ImageMeta,
    a 12-item list each) in one tree before looking at module 0. A verifiable body of empty
    ImageMeta tables (8 bytes each) makes kp.load allocate ~20x the file before the first
    module's missing name is reported: 2,000 x 64 here (1 MB) ~21 MB; at MAX_MODULES x
    MAX_IMAGES_PER_MODULE (53 MB) ~1 GB and 7 s, where the previous code failed in 0.3 s
    with no allocation to speak of. Expected: the same FormatError without reading far
    beyond the first bad module (peak well under twice the file)."""
    data = assemble(_wide_body(2000, 64), [], None)
    peak, raised = _peak(lambda: kp.load(data))
    assert "module name '' is not an identifier" in raised
    assert peak < 2 * len(data), f"kp.load of a {len(data)}-byte file peaked at {peak} bytes"


def test_a_hostile_program_is_refused_without_reading_every_launch() -> None:
    """Was a bug: decode_program read the whole Program (every variant, launch and argument)
    before its first check, the expression program. A verifiable program with garbage ops
    and 64 x 64 x 16 empty Launch/Arg tables (0.6 MB) makes .summary allocate ~8 MB first;
    at 64 x 4096 x 512 (a 1 GB file) it is ~14 GB. The previous code raised at ExprProgram
    before reading any variant. Expected: the same FormatError, peak well under the file."""
    data = assemble(_deep_body(64, 64, 16), [], None)
    pack = kp.load(data)
    peak, raised = _peak(lambda: pack["p"].summary)
    assert "program 'p': expression program" in raised
    assert peak < len(data), f".summary of a {len(data)}-byte file peaked at {peak} bytes"


def test_a_program_failing_at_its_first_launch_reads_only_that_launchs_arguments() -> None:
    """A valid (empty) expression program, then 64 variants of 64 empty launches of 64 empty
    arguments: the decoder reads variant 0's launch tables and launch 0's arguments, then
    refuses launch 0's first argument (a buffer without a name), without reading the other
    262,000 argument tables."""
    data = assemble(_deep_body(64, 64, 64, ops=b""), [], None)
    pack = kp.load(data)
    peak, raised = _peak(lambda: pack["p"].summary)
    assert "program 'p': invalid summary: buffer argument must be an identifier" in raised, \
        raised
    assert peak < len(data) // 8, f".summary of a {len(data)}-byte file peaked at {peak} bytes"


# ---- KernelSummary.check's shortcuts -------------------------------------------------------------
def test_a_shared_node_read_under_a_loop_then_outside_it_is_still_unbound() -> None:
    """check()'s memo hit answers a node's symbols, never whether they were bound: one Expr
    object (reading the loop symbol s) is launch 0's grid under ``loop="s"`` and launch 1's
    grid without a loop; launch 1 must still be refused, with the message naming it."""
    x, y = Tensor("x", kp.f32, ["n"]), Tensor("y", kp.f32, ["n"], role="out")
    grid = kp.cdiv("n", kp.shl(1, "s"))
    looped = Launch("k", "m", grid, 256, (Arg.buffer("x"),), count="n", loop="s")
    plain = Launch("k", "m", grid, 256, (Arg.buffer("x"),))
    KernelSummary("p", (x, y), (Variant((looped,)),))  # fine alone
    with pytest.raises(ValueError, match=r"^program 'p': variant 0 launch 1 \(k\) reads "
                                         r"unbound symbol\(s\) \['s'\] \(bound: \['n'\]\)$"):
        KernelSummary("p", (x, y), (Variant((looped, plain)),))


def test_the_first_unbound_field_is_still_the_one_reported() -> None:
    """With the subset test first, the error is still raised at the first field reading an
    unbound symbol, in check()'s order (params, constraints, predicate, scratch, launches),
    naming only the unbound symbols; a node asked again (the memo) gives the same answer."""
    m = kp.sym("m")
    x = Tensor("x", kp.f32, ["n"])
    w = Scratch("w", kp.f32, [m])
    launch = Launch("k", "mod", m, 256, (Arg.buffer("x"),))
    with pytest.raises(ValueError, match=r"scratch w\.shape\[0\] reads unbound symbol\(s\) "
                                         r"\['m'\] \(bound: \['n'\]\)"):
        KernelSummary("p", (x, Tensor("y", kp.f32, ["n"], role="out")),
                      (Variant((launch,), scratch=(w,)),))
    with pytest.raises(ValueError, match=r"^program 'p': scalar c reads unbound symbol\(s\) "
                                         r"\['m'\] \(bound: \['n'\]\)$"):
        KernelSummary("p", (x, Scalar("c", kp.i32, value=m), Tensor("y", kp.f32, [m],
                                                                      role="out")),
                      (Variant((launch,)),))
