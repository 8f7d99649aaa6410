"""Review 63b: tests that kill mutants of the ``kernelpack`` command line which survived the
existing suite.

A throw-away mutator (outside the repo) changed, one site at a time, ``cli.py``,
``cli_commands.py``, ``cli_render.py``, ``cli_facts.py`` (all but ``selection_facts``, review
52's), ``cli_build.py`` and ``cli_cache.py`` at commit 178acc0, in a copy of the tree run with
PYTHONPATH on the copy (subprocesses included). 314 sites drawn at random from 1974 (flipped
comparisons and boolean operators, dropped operands, ``not`` dropped, conditions forced
true/false, statements and raises dropped, constants off by one, ``+``/``-`` and ``*``/``//``
swapped, dict entries dropped from the JSON facts, tuple/list elements dropped, ``min``/
``max`` and ``any``/``all`` swapped, ``printable``/``sorted``/``int``/``str`` calls dropped,
argparse defaults and flags changed, help texts emptied, strings changed), plus 53
hand-written ones: KiB as kB and 1000-byte thresholds, stored/raw sizes swapped, the ratio
inverted, the digest column showing the raw digest, CUDA and driver minors decoded wrong,
"verified" for any signed file, DOES NOT VERIFY never shown, modules unsorted, one program of
several, the signature always intact, ``verify`` counting stored bytes as raw, extract's
limit off by one, diff notes inverted, usage errors exiting 1, ``prune`` evicting everything
or ignoring ``--max-bytes`` or removing fresh temporaries, ``stats`` adding runtime cubins to
``bytes``, ``explain`` saying ``on_disk`` always or exiting 0 for an unknown key, ``clear``
reporting 0, ``diff | head -1`` answering 0, ``EXTRACT_LIMIT`` 4 MiB, the default targets
short of sm_90, private names built. Each mutant ran the tests that reach its lines (found
by a line tracer over the CLI tests, in-process and in their subprocesses), ``-x``; the
survivors also ran ``tests/test_review34_modes.py`` and ``tests/cache/
test_review10_record_fifo.py``, whose subprocesses get an environment of their own.

367 mutants: 289 killed by the suite, 62 by the tests here, 16 equivalent. The gaps were in
what the text shows (sizes and their units, the ratio, CUDA 12.8, the toolchain's "-", the
generator, symbols, computed scalars, "variant i: when", a (1, 1, 1) grid, the signature's
three states, in-place lines, the 160-column width, styles), ``diff``'s lines for what one
side lacks and for an image that kept its size, ``diff | head -1``'s status, ``cache ls``
ages and a vanished entry, ``cache explain``'s prefixes, ``on_disk`` and ``--json`` status,
``extract`` of long module names and of an empty artifact, sizes past Python's 4300-digit
limit, an ASCII-only stderr, a descriptor leaked when /dev/null cannot be opened, and
``build``'s errors (a non-.py file, a SyntaxError, fusions beside kp.Compiled objects with no
lowering, the source's directory first on sys.path).

Two real bugs, both small, found as strict xfails and fixed in session 44 (the two tests
below that say so): ``cache explain --json`` of a key with no record exited 1 with nothing on
stderr; ``build`` of a file Python cannot import as source wrapped its own message ("X:
importing it failed: CLIError: X: cannot be imported as Python source").

Survivors judged equivalent: ``str(key)`` in ``_dict_changes`` (facts keys are strings);
``int()`` around ``stored_size`` and around diff's ``answer`` (already ints); ``hasattr(arch,
"sX")`` (``str(Arch)`` is ``Arch.sm``); ``isinstance(allocations, Mapping)`` forced true
(``Plan.allocations`` is a Mapping); ``_short``'s ``value and`` (an empty list is "[]" either
way); ``printable_facts`` dropped for eval's non-launch facts, and ``cache ls``'s
``printable(program)`` (names there are identifiers, dtype and kind names or "<gone>"/
"<invalid: ...>", and no identifier holds a Cc/Cf character: checked over all of Unicode);
eval's launches made printable twice (idempotent; only slower); the text of the
BrokenPipeError raised in ``on_broken_pipe`` (never shown); ``or unit == "GiB"`` dropped (the
loop ends at GiB anyway); ``spec is None or spec.loader is None`` reduced to ``spec is None``
(``spec_from_file_location`` gives a spec with a loader or None); the handler's
``Formatter("%(message)s")`` dropped (the default format); CUDA and driver minors read as
``% 100 // 10`` (the same for every X*1000 + Y*10 with Y <= 9: real CUDA versions, and all
``--driver`` makes); ``cache stats --json`` indented 2 (formatting only).
Not mutated: unsampled sites, ``selection_facts``. Not run: ``tests/test_review34_versions``'
25 tests that need git history (skipped in the copy) and the slow files that do not run the
CLI (lowering reductions, sanitizers, server). No GPU; about two seconds.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import kp_samples
import pytest
from kp_cli import run
from rich.console import Console

import kernelpack as kp
from kernelpack import cli_cache, signing
from kernelpack.cache import Cache
from kernelpack.cli import build_parser, main
from kernelpack.cli_commands import parse_assignment
from kernelpack.cli_facts import ExprText, launch_facts, pack_facts, printable
from kernelpack.cli_render import human_size, render_pack, signature_text
from kernelpack.summary import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                                Tensor, Variant)

# ---- artifacts -----------------------------------------------------------------------------------


def _zero_d() -> Compiled:
    """A program with no symbols (a 0-D tensor, a (1, 1, 1) launch) and a module whose images
    are past 1 KiB raw, one of them with no toolchain recorded."""
    s = KernelSummary("z", (Tensor("x", kp.f32, ()),),
                      (Variant((Launch("k", "m", (1,), (1,), (Arg.buffer("x"),)),)),))
    images = (Image("cubin", "sm_80", b"\x7fELF" + bytes(3000), "", 12080, None),
              kp_samples.fake_image("cubin", "sm_90", size=3000, seed=3))
    return Compiled(s, (Module("m", ("k",), images),))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("r63")
    ns = SimpleNamespace(dir=d, rich=d / "rich.kpack", zero=d / "zero.kpack",
                         empty=d / "empty.kpack", signed=d / "signed.kpack")
    kp.save([kp_samples.rich()], ns.rich)
    kp.save([_zero_d()], ns.zero)
    kp.save([], ns.empty)
    ns.private, ns.public = signing.write_keypair(d / "team")
    kp.save([kp_samples.axpy()], ns.signed, sign_with=ns.private)
    return ns


def _cells(out: str, first: str) -> list[str]:
    """The cells of the table row of ``out`` whose first cell is ``first``."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{out}")


# ---- inspect: what the text shows -------------------------------------------------------------


def test_human_size_is_binary_units_with_one_decimal() -> None:
    """Kills cli_render human_size: ``n < 1000`` for ``n < 1024``, ``/ 1000`` for ``/ 1024``,
    ``:.0f``, ``"KiB"`` dropped from the units, the loop's break forced off or to
    ``value < 1024 and unit == "GiB"`` or ``unit == "GiB"`` (every size in GiB)."""
    assert human_size(0) == "0 B" and human_size(1023) == "1023 B"
    assert human_size(1024) == "1.0 KiB" and human_size(1536) == "1.5 KiB"
    assert human_size(10 << 20) == "10.0 MiB" and human_size(3 << 30) == "3.0 GiB"
    assert human_size(5 << 40) == "5120.0 GiB"  # no unit past GiB


def test_inspect_image_rows_show_stored_raw_ratio_digest_toolchain_and_cuda(
        files: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """Each image row says what --json says: stored and raw size (not swapped), the ratio raw
    / stored, the digest's first 16 hex digits, the toolchain ("-" when none is recorded) and
    CUDA 12.8 for 12080. Kills: stored/raw columns swapped, the ratio inverted, the
    toolchain's ``or "-"`` dropped, ``cuda % 1000 * 10``, ``cuda % 1001 // 10`` and ``cuda %
    1000 // 11``; with the sizes past 1 KiB also the human_size mutants in the table."""
    code, out, _ = run(capsys, "inspect", files.zero)
    jcode, jout, _ = run(capsys, "inspect", "--json", files.zero)
    assert code == 0 and jcode == 0
    images = {i["target"]: i for i in json.loads(jout)["modules"][0]["images"]}
    for target, toolchain in (("sm_80", "-"), ("sm_90", "fake-toolchain 1.0")):
        img = images[target]
        cells = _cells(out, target)
        assert cells[1:] == ["cubin", "zstd", human_size(img["stored_size"]), "2.9 KiB",
                             f"{img['raw_size'] / img['stored_size']:.2f}x",
                             img["digest"][:16], toolchain, "12.8", "-"], cells
        assert img["raw_size"] == 3004 and img["stored_size"] < 1024


def test_inspect_header_symbols_and_computed_scalars(
        files: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """The first line names the generator; a program's symbols are listed ("-" when it has
    none); a computed scalar shows its expression; a (1, 1, 1) grid reads "1"; a variant
    that copies no pair in place prints no in-place line. Kills: ``generator or "-"`` as
    ``and`` or reduced to ``"-"``, ``", ".join(symbols) or "-"`` with either operand dropped,
    ``p.get("value") or "passed by caller"`` reduced to its default (generated and by hand),
    ``_dim3``'s ``len > 1`` as ``>= 1`` (``()``), ``if refused and key in shown`` without
    ``refused`` (an empty refusal list "the same pairs copied as in variant 0") and the
    variant line's ``": when "`` changed."""
    code, out, _ = run(capsys, "inspect", files.rich)
    assert code == 0
    assert out.splitlines()[0] == (f"format 1.0   generator kernelpack {kp.__version__}   "
                                   f"signature unsigned")
    assert "symbols: n, m\n" in out
    assert _cells(out, "total")[1:] == ["scalar", "computed", "int64", "n * m"]
    assert _cells(out, "m")[1:] == ["scalar", "in", "int32", "passed by caller"]
    assert "in place" not in out  # neither variant of rowsum copies a pair
    assert "variant 0: when m <= 1024\n" in out and "variant 1: when always\n" in out
    code, out, _ = run(capsys, "inspect", files.zero)
    assert code == 0 and "symbols: -\n" in out
    assert _cells(out, "x")[1:] == ["tensor", "in", "float32", "()"]
    assert _cells(out, "0")[1:6] == ["k", "m", "1", "1", "0"]


def test_inspect_pipes_160_columns(files: SimpleNamespace,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Piped, the tables are laid out 160 columns wide (a program's rule spans them). Kills
    cli_render.console's width 159."""
    code, out, _ = run(capsys, "inspect", files.rich)
    assert code == 0 and max(len(line) for line in out.splitlines()) == 160


def test_labels_are_styled_on_a_terminal(files: SimpleNamespace) -> None:
    """On a terminal the header's labels are bold and "no usable image" for --device is red.
    Kills ``("   generator ", "bold")`` cut to ``("   generator ",)`` and ``("no usable
    image", "red")`` cut to ``("no usable image",)`` (their styles dropped)."""
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, color_system="standard", width=160)
    render_pack(con, pack_facts(kp.load(files.rich), device="sm_75"))
    lines = buf.getvalue().splitlines()
    for label in ("format ", "   generator ", "   signature "):
        assert f"\x1b[1m{label}\x1b[0m" in lines[0], repr(lines[0])
    assert "on sm_75: \x1b[31mno usable image\x1b[0m" in lines, lines


def test_in_place_lines_are_cut_after_eight_pairs(files: SimpleNamespace) -> None:
    """Eight refused pairs are all listed with no "more" line; nine print eight and "1 more".
    Kills ``len(refused) > IN_PLACE_LINES`` as ``>=`` ("0 more pairs") and IN_PLACE_LINES
    7."""
    facts = pack_facts(kp.load(files.rich))
    variants = facts["programs"][0]["variants"]
    pairs = [{"output": f"o{i}", "input": "x", "why": "reads x elsewhere"} for i in range(9)]
    variants[0]["in_place_refused"], variants[1]["in_place_refused"] = pairs[:8], pairs
    buf = io.StringIO()
    render_pack(Console(file=buf, width=160, no_color=True), facts)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("  in place:")]
    assert len(lines) == 17 and lines[-1].endswith("1 more pairs read from a copy (--json "
                                                   "lists them)"), lines
    assert not any("more pairs" in ln for ln in lines[:16])


def _forged(files: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Path:
    """axpy signed by the team's key with one bit of the signature flipped."""
    real = signing.sign_digest

    def flipped(key: object, digest: bytes) -> tuple[bytes, bytes]:
        public, sig = real(key, digest)
        return public, bytes([sig[0] ^ 1]) + sig[1:]

    path = files.dir / "forged.kpack"
    with monkeypatch.context() as m:
        m.setattr(signing, "sign_digest", flipped)
        kp.save([kp_samples.axpy()], path, sign_with=files.private)
    return path


def test_signature_states_in_text(files: SimpleNamespace, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """inspect shows an intact signature as "not checked against a trusted key", a broken
    one as "DOES NOT VERIFY", and a pack loaded with the key trusted as "verified". Kills
    signature_text's ``sig["verified"]`` forced False, "verified" shown for any signed file,
    and ``intact is False`` as ``is None`` (DOES NOT VERIFY never shown)."""
    key_id = signing.key_id(signing.load_public_key(files.public))
    code, out, _ = run(capsys, "inspect", files.signed)
    assert code == 0 and f"signature signed, key {key_id}: not checked against a trusted key" \
        in out.splitlines()[0]
    forged = _forged(files, monkeypatch)
    assert run(capsys, "verify", forged)[0] == 1
    code, out, _ = run(capsys, "inspect", forged)
    assert code == 0 and f"signed, key {key_id}: DOES NOT VERIFY" in out.splitlines()[0]
    trusted = pack_facts(kp.load(files.signed, trusted_keys=[files.public]))["signature"]
    assert signature_text(trusted) == f"signed, key {key_id}: verified"


def test_printable_escapes_controls_and_keeps_other_characters() -> None:
    """Only control and format characters are escaped: the rest of a text that has one stays
    as it is. Kills printable's ``or`` chain as ``and`` (every non-ASCII character escaped)."""
    assert printable("café\u00a0\x1b[2J") == "café\u00a0\\x1b[2J"
    assert printable("naïve\u202e") == "naïve\\u202e"


def test_arg_text_counts_against_the_artifacts_budget() -> None:
    """An expression argument printed after the artifact's node budget is spent gets str()'s
    short form, as every other expression does. Kills arg_text's ``text or ExprText()`` as a
    fresh ExprText (a budget of its own for every argument)."""
    leaves = [kp.sym("n") + i for i in range(256)]
    while len(leaves) > 1:
        leaves = [kp.emax(a, b) for a, b in zip(leaves[::2], leaves[1::2])]
    launch = Launch("k", "m", (kp.cdiv("n", 256),), (256,),
                    (Arg.buffer("x"), Arg.of(leaves[0], kp.i64)))
    spent = ExprText()
    spent.left = 0
    assert launch_facts(launch, spent)["args"][1]["text"] == f"int64({leaves[0]})"
    whole = launch_facts(launch, ExprText())["args"][1]["text"]
    assert whole != f"int64({leaves[0]})" and "n + 255" in whole


# ---- diff ---------------------------------------------------------------------------------------


def _with_param(kind: str) -> Compiled:
    """axpy whose ``a`` is a float scalar or a float tensor of shape (n,)."""
    c = kp_samples.axpy()
    a = Scalar("a", kp.f32) if kind == "scalar" else Tensor("a", kp.f32, ("n",))
    arg = Arg.scalar("a") if kind == "scalar" else Arg.buffer("a")
    s = c.summary
    params = tuple(a if p.name == "a" else p for p in s.params)
    launch = s.variants[0].launches[0]
    args = tuple(arg if x.name == "a" else x for x in launch.args)
    variant = dataclasses.replace(s.variants[0], launches=(dataclasses.replace(launch,
                                                                               args=args),))
    return dataclasses.replace(c, summary=dataclasses.replace(s, params=params,
                                                              variants=(variant,)))


def test_diff_names_fields_a_record_gains_or_loses(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A parameter that turns from a scalar into a tensor loses ``value`` and gains ``shape``
    and ``zero_init``: diff prints each. Kills _dict_changes' dropped ``-> (absent)`` line."""
    a, b = tmp_path / "a.kpack", tmp_path / "b.kpack"
    kp.save([_with_param("scalar")], a)
    kp.save([_with_param("tensor")], b)
    code, out, _ = run(capsys, "diff", a, b)
    assert code == 1
    assert "    params[2].kind: scalar -> tensor" in out.splitlines()
    assert "    params[2].value: None -> (absent)" in out.splitlines()
    assert "    params[2].shape: (absent) -> ['n']" in out.splitlines()


def test_diff_lists_what_only_one_side_has(files: SimpleNamespace, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Programs and modules only in the old file are "-" lines, only in the new one "+".
    Kills diff_facts' dropped ``+ module`` line."""
    axpy = tmp_path / "axpy.kpack"
    kp.save([kp_samples.axpy()], axpy)
    code, out, _ = run(capsys, "diff", axpy, files.rich)
    assert code == 1 and out.splitlines() == ["- program axpy", "+ program rowsum",
                                              "- module axpy", "+ module red"]


def test_diff_of_an_image_of_the_same_size(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """An image whose bytes changed but not its size reads "604 bytes", one that grew "604
    -> 1004 bytes". Kills ``ia["raw_size"] == ib["raw_size"]`` flipped."""
    paths = []
    for seed, size in ((1, 600), (2, 600), (2, 1000)):
        images = (kp_samples.fake_image("cubin", "sm_80", size=size, seed=seed),)
        paths.append(tmp_path / f"{seed}-{size}.kpack")
        kp.save([kp_samples.axpy(images=images)], paths[-1])
    code, out, _ = run(capsys, "diff", paths[0], paths[1])
    line = next(ln for ln in out.splitlines() if "~ image sm_80" in ln)
    assert code == 1 and line.endswith(", 604 bytes"), line
    code, out, _ = run(capsys, "diff", paths[0], paths[2])
    line = next(ln for ln in out.splitlines() if "~ image sm_80" in ln)
    assert code == 1 and line.endswith(", 604 -> 1004 bytes"), line


def test_diff_cut_short_by_its_reader_still_answers(files: SimpleNamespace,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``diff a b | head -1``: the reader leaves, and the status is still diff's answer, 1
    for different (0 for identical). Kills ``return int(getattr(args, "answer", 0))`` as
    ``return 0``."""
    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["diff", str(files.rich), str(files.zero)]) == 1
    assert main(["diff", str(files.rich), str(files.rich)]) == 0


# ---- eval, extract and the options --------------------------------------------------------------


def test_eval_shows_bytes_and_their_size_and_names_the_programs(
        files: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """An allocation row gives its bytes and their binary size; a program that is not there
    is refused with the programs listed (no "and N more" for fewer than 21); symbols are
    listed, "-" when there are none. Kills the human size dropped from the bytes cell,
    ``len(names) > 20`` forced true and the symbols line's ``or "-"`` dropped."""
    code, out, _ = run(capsys, "eval", files.rich, "rowsum", "x=1000,5", "m=5", "scale=1")
    assert code == 0 and _cells(out, "out")[4] == "4000 (3.9 KiB)"
    assert "symbols: n=1000, m=5, total=5000\n" in out
    code, out, _ = run(capsys, "eval", files.zero, "z", "x=")
    assert code == 0 and "symbols: -\n" in out
    code, _, err = run(capsys, "eval", files.rich, "nope")
    assert code == 1 and err == (f"error: no program 'nope' in {files.rich} (programs: rowsum; "
                                 f"`kernelpack inspect` lists them)\n")


def test_sizes_past_python_int_digit_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape of 5000 digits, past int()'s default limit of 4300, is read in chunks, every
    digit counted. Kills ``value * 10 ** len(chunk) - int(chunk)`` and ``start - 600``."""
    name, value = parse_assignment("x=" + "7" * 5000 + ",3", {"x": "tensor"})
    assert name == "x" and value == (7 * (10 ** 5000 - 1) // 9, 3)


def test_extract_stems_long_module_names_to_160_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A module name of 300 characters gets a file stem of exactly 160 (the safe name cut,
    "-", 8 hex digits of its hash). Kills _MAX_STEM 161."""
    path = tmp_path / "long.kpack"
    images = (kp_samples.fake_image("cubin", "sm_80"),)
    kp.save([kp_samples.axpy(module="m" * 300, images=images)], path)
    code, out, _ = run(capsys, "extract", path, "-o", tmp_path / "out")
    assert code == 0
    (written,) = (tmp_path / "out").iterdir()
    stem = written.name[:-len(".sm_80.cubin")]
    assert len(stem) == 160 and stem.startswith("m" * 151 + "-"), stem
    assert f", module {'m' * 300}" in out


def test_extract_of_an_artifact_without_images_says_so(
        files: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kills the dropped "holds no images; nothing written" line (an artifact of no program
    would print nothing at all)."""
    code, out, _ = run(capsys, "extract", files.empty, "-o", tmp_path / "out")
    assert code == 0 and out == f"{files.empty} holds no images; nothing written\n"


def test_extract_refuses_past_4_gib_by_default() -> None:
    """The README's default --max-bytes is 4G. Kills EXTRACT_LIMIT ``4 << 20``."""
    args = build_parser().parse_args(["extract", "f.kpack", "-o", "out"])
    assert args.max_bytes == 4 << 30


def test_an_ascii_stderr_gets_escaped_names_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``PYTHONIOENCODING=ascii`` an error naming a non-ASCII file is one escaped line.
    Kills the dropped ``stream.reconfigure(errors="backslashreplace")`` (UnicodeEncodeError
    out of main)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    err = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    missing = tmp_path / "kérnel.kpack"
    assert main(["inspect", str(missing)]) == 1
    err.flush()
    text = err.buffer.getvalue().decode("ascii")  # type: ignore[attr-defined]
    assert text == f"error: {str(missing).replace('é', chr(92) + 'xe9')}: no such file\n"


# ---- cache --------------------------------------------------------------------------------------


def _filled(root: Path, n: int = 2) -> list[str]:
    """``n`` entries (axpy programs p0, p1, ...) with their key records; their digests."""
    cache = Cache(root, remote=False)
    digests = []
    for i in range(n):
        key = kp.make_key("external", f"r63-{i}".encode(), {"i": i}, ["sm_80"])
        cache.fetch_or_compile(key, lambda i=i: kp_samples.axpy(name=f"p{i}"))
        digests.append(key.digest)
    return digests


def test_ls_shows_an_entry_gone_while_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An entry evicted between the listing and the read of its programs is "<gone>", not
    "<invalid: TypeError>". Kills ``found is None`` forced false."""
    from kernelpack.cache.disk import DiskStore

    _filled(tmp_path, 1)
    monkeypatch.setattr(DiskStore, "read", lambda self, digest, touch=True: None)
    code, out, _ = run(capsys, "cache", "ls", "--json", "--dir", tmp_path)
    assert code == 0 and [r["program"] for r in json.loads(out)] == ["<gone>"]


@pytest.mark.parametrize("age, shown", [(59, "59s"), (60, "1.0m"), (3600, "1.0h"),
                                        (86399, "24.0h"), (86400, "1.0d"), (172800, "2.0d")])
def test_ls_ages_in_the_largest_whole_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str], age: int,
                                           shown: str) -> None:
    """An entry unused for exactly an hour reads "1.0h" (not "60.0m"), for a day "1.0d".
    Kills ``seconds >= size`` as ``>``, the day's 86400 as 86401 or 86399, the "d" unit
    dropped, and ``if e.mtime`` forced false (every age "future")."""
    (digest,) = _filled(tmp_path, 1)
    entry = Cache(tmp_path, remote=False).disk.path(digest)
    os.utime(entry, (1_000_000_000, 1_000_000_000))
    monkeypatch.setattr(cli_cache, "time", SimpleNamespace(time=lambda: 1_000_000_000.0 + age))
    code, out, _ = run(capsys, "cache", "ls", "--dir", tmp_path)
    assert code == 0 and out.splitlines()[1].split()[2] == shown, out


def test_explain_prefixes_keys_and_json(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``explain`` resolves a prefix matching exactly one key, and refuses one matching none
    or two (exit 1, one line naming the count), and a key longer than 64 digits; ``--json``
    says whether the entry is on disk and exits 1 for a key with no record. Kills
    ``len(found) != 1`` forced false (a KeyError traceback, or an arbitrary key), a key of 64
    or more digits cut to 64, ``on_disk`` always true and ``--json``'s exit 0 for an unknown
    key."""
    d0, d1 = _filled(tmp_path, 2)
    code, out, _ = run(capsys, "cache", "explain", d0[:10], "--dir", tmp_path)
    assert code == 0 and d0 in out
    code, _, err = run(capsys, "cache", "explain", "deadbeef00", "--dir", tmp_path)
    assert code == 1 and err == (f"error: key prefix 'deadbeef00' matches 0 keys in "
                                 f"{tmp_path} (expected exactly 1)\n")
    for c in "ab":  # two key records whose digests share 9 digits
        (tmp_path / "keys" / "fe").mkdir(parents=True, exist_ok=True)
        (tmp_path / "keys" / "fe" / f"{'fedcba987' + c * 55}.json").write_text("{}")
    code, _, err = run(capsys, "cache", "explain", "fedcba987", "--dir", tmp_path)
    assert code == 1 and err == (f"error: key prefix 'fedcba987' matches 2 keys in "
                                 f"{tmp_path} (expected exactly 1)\n")
    assert run(capsys, "cache", "explain", d1 + "0", "--dir", tmp_path)[0] == 1
    Cache(tmp_path, remote=False).disk.path(d1).unlink()
    code, out, _ = run(capsys, "cache", "explain", "--json", d1, "--dir", tmp_path)
    facts = json.loads(out)
    assert code == 0 and facts["on_disk"] is False and facts["parts"]["kind"] == "external"
    code, out, _ = run(capsys, "cache", "explain", "--json", "0" * 64, "--dir", tmp_path)
    assert code == 1 and json.loads(out) == {"key": "0" * 64, "parts": None, "on_disk": False}


def test_explain_json_of_an_unknown_key_says_why_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 63b's bug (fixed in session 44): ``cache explain --json`` of a key with no
    record exited 1 with nothing on stderr; the text form prints 'error: no record of key
    ...', and the README says status 1 comes with one error line."""
    _filled(tmp_path, 1)
    code, _, err = run(capsys, "cache", "explain", "--json", "0" * 64, "--dir", tmp_path)
    assert code == 1 and err.startswith("error: no record of key 0000")


# ---- build --------------------------------------------------------------------------------------


@pytest.fixture
def build_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An in-process build changes sys.path and may leave modules of ``tmp_path`` in
    sys.modules: put sys.path back, and forget those modules after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_build_of_a_file_that_is_not_python_source(
        tmp_path: Path, build_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A path Python cannot import as source (no .py suffix) is named as such. Kills the
    dropped ``raise CLIError(... cannot be imported as Python source)``, and ``spec is None
    and spec.loader is None`` or the test forced false (an AttributeError reported
    instead)."""
    src = tmp_path / "kernels.txt"
    src.write_text("X = 1\n")
    code, _, err = run(capsys, "build", src, "-o", tmp_path / "m.kpack")
    assert code == 1 and f"{src}: cannot be imported as Python source" in err


def test_build_of_a_file_that_is_not_python_source_in_one_message(
        tmp_path: Path, build_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Review 63b's bug (wording; fixed in session 44): import_source's catch-all wrapped
    _import_file's own CLIError: 'X: importing it failed: CLIError: X: cannot be imported as
    Python source'."""
    src = tmp_path / "kernels.txt"
    src.write_text("X = 1\n")
    code, _, err = run(capsys, "build", src, "-o", tmp_path / "m.kpack")
    assert code == 1 and err == f"error: {src}: cannot be imported as Python source\n"


def test_build_syntax_error_names_no_importlib_frame(
        tmp_path: Path, build_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A SyntaxError names its line itself: no "(at <frozen importlib...>)" is added. Kills
    _user_line's filter forced true."""
    src = tmp_path / "broken.py"
    src.write_text("def (:\n")
    code, _, err = run(capsys, "build", src, "-o", tmp_path / "m.kpack")
    assert code == 1 and "SyntaxError" in err and "<frozen" not in err and "(at " not in err


def test_build_puts_the_sources_directory_first(
        tmp_path: Path, build_env: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The source's directory goes first on sys.path even when it is already second: its own
    ``helper`` module wins over another directory's. Kills _path_first's ``sys.path[1]``."""
    proj, other = tmp_path / "proj", tmp_path / "other"
    for d, name in ((proj, "mine"), (other, "theirs")):
        d.mkdir()
        (d / "helper.py").write_text(f"import kp_samples\nPROG = kp_samples.axpy(name={name!r})\n")
    (proj / "kernels.py").write_text("from helper import PROG\n")
    sys.path[:0] = [str(other), str(proj)]
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    code, _, err = run(capsys, "build", proj / "kernels.py", "-o", tmp_path / "m.kpack")
    assert code == 0, err
    assert kp.load(tmp_path / "m.kpack").programs == ["mine"]


def test_build_of_fusions_beside_compiled_objects_without_the_lowering(
        tmp_path: Path, build_env: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A source with a kp.Compiled and a fusion, and no llvmlite: one line saying what to
    install, before anything is compiled. Kills ``any(not isinstance(v, Compiled) ...)`` as
    ``all`` (then the fusion failed on its own)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llvmlite" else real(name, *a))
    src = tmp_path / "mixed_r63.py"
    src.write_text("import kernelpack as kp\nimport kp_samples\nA = kp_samples.axpy()\n\n"
                   "@kp.fusion\ndef double(x: kp.Tensor[kp.f32, 'n']):\n    return x * 2\n")
    code, _, err = run(capsys, "build", src, "-o", tmp_path / "m.kpack")
    assert code == 1 and err == ("error: compiling fusions needs the lowering (llvmlite, "
                                 "nvJitLink, libdevice): pip install 'kernelpack[compile]'\n")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_no_descriptor_leaks_when_devnull_cannot_be_opened(
        files: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader of stdout left and /dev/null cannot be opened (no descriptor to spare):
    the clean-up gives back the descriptor it duplicated. Kills the dropped ``os.close(saved)``
    in _flush_into_devnull."""
    import contextlib
    import errno

    read, write = os.pipe()
    os.close(read)  # the reader has gone: writes fail with EPIPE
    stream = os.fdopen(write, "w")
    real_open = os.open

    def no_devnull(path: object, *args: object, **kwargs: object) -> int:
        if path == os.devnull:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(os, "open", no_devnull)
    try:
        before = len(os.listdir("/proc/self/fd"))
        assert main(["inspect", str(files.rich)]) == 0
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        with contextlib.suppress(OSError):
            stream.close()
