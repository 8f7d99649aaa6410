"""Review 27: the ``kernelpack`` command and the artifact API, checked from the outside.

Artifacts are built here from ``examples/axpy.ptx`` with ``kp.external`` (nvJitLink, no GPU);
every command runs in-process through :func:`kernelpack.cli.main`. The tests at the end of the
file (``test_bug_*``) describe behaviour that is wrong today; each says what is expected and why.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from kp_cli import run  # noqa: E402

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()
SUBCOMMANDS = ["inspect", "verify", "extract", "eval", "diff", "keygen", "sign", "build",
               "cache"]
CACHE_ACTIONS = ["ls", "stats", "prune", "clear", "explain"]


def _axpy(name: str = "axpy", block: int = 256, targets=("sm_80", "ptx")) -> kp.Compiled:
    return kp.external(
        name, "axpy",
        [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
         kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", block), block=block, ptx=PTX, targets=list(targets),
        constraints=[(kp.sym("n") < (1 << 32), "32-bit n")])


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("r27")
    out = {"a": d / "a.kpack", "b": d / "b.kpack", "dir": d}
    kp.save([_axpy()], out["a"])
    kp.save([_axpy(block=128, targets=("sm_80", "sm_86"))], out["b"])
    return out


def _one_error_line(err: str) -> str:
    assert err.startswith("error: ") or ": error: " in err, err
    assert "Traceback" not in err
    return err


# ---- --help ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [[c] for c in SUBCOMMANDS] + [["cache", a] for a in CACHE_ACTIONS]
                         + [[]])
def test_every_help_exits_0_and_describes_the_command(argv, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    out, err = capsys.readouterr()
    assert info.value.code == 0 and err == ""
    assert out.startswith("usage: kernelpack") and "options:" in out


def test_top_level_help_lists_every_subcommand(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in out, name


# ---- bad paths -------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_missing_directory_and_empty_paths_exit_1_naming_the_file(art, command, capsys,
                                                                  tmp_path) -> None:
    empty = tmp_path / "empty.kpack"
    empty.write_bytes(b"")
    for path, words in ((tmp_path / "nope.kpack", "no such file"),
                        (tmp_path, "not a regular file"), (empty, "0 bytes")):
        code, out, err = run(capsys, command, path)
        assert code == 1 and out == ""
        _one_error_line(err)
        assert str(path) in err and words in err


def test_truncations_and_flips_are_one_line_errors_naming_the_file(art, capsys,
                                                                    tmp_path) -> None:
    data = art["a"].read_bytes()
    bad = tmp_path / "bad.kpack"
    # (the last bytes of a file can be alignment padding that no field covers: FORMAT.md 7)
    for n in (1, 4, 7, 8, 12, 40, 100, len(data) // 2, len(data) - 8):
        bad.write_bytes(data[:n])
        for command in ("inspect", "verify"):
            code, out, err = run(capsys, command, bad)
            assert code == 1 and out == "", (n, command)
            assert str(bad) in _one_error_line(err) and err.count("\n") == 1, (n, err)
        code, _, err = run(capsys, "diff", art["a"], bad)
        assert code == 2 and str(bad) in err
    for i in range(0, len(data), 53):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        bad.write_bytes(bytes(flipped))
        code, _, err = run(capsys, "verify", bad)
        assert code in (0, 1)
        if code:
            assert str(bad) in _one_error_line(err)
        dcode, _, _ = run(capsys, "diff", art["a"], bad)
        assert dcode == (0 if code == 0 else 2), i  # never "identical" to a corrupt file


# ---- inspect -----------------------------------------------------------------------------------
def test_inspect_json_is_valid_stable_and_holds_what_the_text_shows(art, capsys) -> None:
    code, text, err = run(capsys, "inspect", art["a"])
    assert code == 0 and err == ""
    code, out1, _ = run(capsys, "inspect", art["a"], "--json")
    code2, out2, _ = run(capsys, "inspect", art["a"], "--json")
    assert code == code2 == 0 and out1 == out2
    facts = json.loads(out1)
    assert [p["name"] for p in facts["programs"]] == kp.load(art["a"]).programs == ["axpy"]
    prog = facts["programs"][0]
    assert prog["constraints"] == [{"predicate": "n < 4294967296", "message": "32-bit n"}]
    assert prog["variants"][0]["launches"][0]["grid"] == ["cdiv(n, 256)", "1", "1"]
    targets = [i["target"] for i in facts["modules"][0]["images"]]
    assert targets == ["sm_80", "compute_80"]
    for fact in ("program axpy", "cdiv(n, 256)", "32-bit n", "module axpy", *targets,
                 facts["modules"][0]["images"][0]["digest"][:16]):
        assert fact in text, fact


@pytest.mark.parametrize("device, chosen", [
    ("sm_80", "cubin sm_80"), ("sm_86", "cubin sm_80"), ("sm_89", "cubin sm_80"),
    ("sm_90a", "ptx compute_80 (ISA 8.0)"), ("sm_100", "ptx compute_80 (ISA 8.0)"),
    ("sm_70", None), ("SM_86", "cubin sm_80")])
def test_inspect_device_choice_in_json_and_text(art, device, chosen, capsys) -> None:
    code, out, err = run(capsys, "inspect", art["a"], "--json", "--device", device)
    assert code == 0 and err == ""
    sel = json.loads(out)["modules"][0]["selection"]
    assert sel["chosen"] == chosen
    assert (sel["error"] is None) == (chosen is not None)
    code, text, _ = run(capsys, "inspect", art["a"], "--device", device)
    assert code == 0
    assert (f"loads {chosen}" if chosen else "no usable image") in text


@pytest.mark.parametrize("device", ["sm_x", "8.6", "sm_9", "gfx90a", "", "sm_90z"])
def test_inspect_rejects_a_garbage_device_as_a_usage_error(art, device, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(art["a"]), "--device", device])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--device" in err and repr(device) in err


def test_driver_without_device_is_a_usage_error(art, capsys) -> None:
    code, out, err = run(capsys, "inspect", art["a"], "--driver", "12.4")
    assert code == 2 and out == "" and "--driver needs --device" in err


# ---- eval --------------------------------------------------------------------------------------
def test_eval_json_matches_the_python_plan(art, capsys) -> None:
    code, out, err = run(capsys, "eval", art["a"], "axpy", "x=1000", "y=1000", "a=0.5",
                         "--json")
    assert code == 0 and err == ""
    facts = json.loads(out)
    plan = kp.load(art["a"])["axpy"].plan(x=(1000,), y=(1000,), a=0.5)
    assert facts["launches"][0]["grid"] == list(plan.launches[0].grid) == [4, 1, 1]
    assert facts["symbols"] == {"n": 1000, "n32": 1000}
    assert facts["computed"] == {"n32": 1000}


@pytest.mark.parametrize("values, words", [
    (["x=4", "y=4", "a=1", "q=1"], "no input 'q'"),
    (["x=4,2", "y=4"], "rank 2"),
    (["x=-5", "y=-5"], "negative"),
    (["x=99999999999999999999999", "y=99999999999999999999999"], "outside int64"),
    (["x=4294967296", "y=4294967296"], "32-bit n"),
    (["x=4", "y=5"], "y.shape[0] is 5"),
    (["x=4"], "missing input"),
    (["x=4", "y=4", "x=4"], "given twice"),
    (["x=4", "y=4", "n32=4"], "computed"),
    (["x=1.5", "y=4"], "x: expected a shape of integers"),
    (["x", "y=4"], "expected NAME=VALUE"),
])
def test_eval_errors_exit_1_naming_the_cause(art, values, words, capsys) -> None:
    code, out, err = run(capsys, "eval", art["a"], "axpy", *values)
    assert code == 1 and out == ""
    assert words in _one_error_line(err)


def test_eval_unknown_program_names_the_programs(art, capsys) -> None:
    code, out, err = run(capsys, "eval", art["a"], "nope", "x=4")
    assert code == 1 and out == ""
    assert "'nope'" in err and "programs: axpy" in err and str(art["a"]) in err


# ---- extract -----------------------------------------------------------------------------------
def test_extract_into_a_non_empty_directory_and_overwrite_rules(art, capsys,
                                                                tmp_path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    code, out, err = run(capsys, "extract", art["a"], "-o", out_dir)
    assert code == 0 and err == ""
    pack = kp.load(art["a"])
    images = {i.target: i.read() for i in pack.modules["axpy"].images}
    assert (out_dir / "axpy.sm_80.cubin").read_bytes() == images["sm_80"]
    assert (out_dir / "axpy.compute_80.ptx").read_bytes() == images["compute_80"]
    assert (out_dir / "keep.txt").read_text() == "mine"
    code, _, err = run(capsys, "extract", art["a"], "-o", out_dir)
    assert code == 1 and "--force" in err
    code, _, _ = run(capsys, "extract", art["a"], "-o", out_dir, "--force")
    assert code == 0
    code, _, err = run(capsys, "extract", art["a"], "-o", art["a"])
    assert code == 1 and "not a directory" in err


def test_extract_of_a_corrupt_image_writes_nothing(art, capsys, tmp_path) -> None:
    data = bytearray(art["a"].read_bytes())
    data[-3] ^= 0xFF  # inside the last blob: the structure holds, a digest does not
    bad = tmp_path / "bad.kpack"
    bad.write_bytes(bytes(data))
    code, _, _ = run(capsys, "inspect", bad)
    assert code == 0  # images are checked when used
    code, out, err = run(capsys, "extract", bad, "-o", tmp_path / "x")
    assert code == 1 and str(bad) in err
    assert not (tmp_path / "x").exists()


# ---- diff ----------------------------------------------------------------------------------
def test_diff_identical_different_and_missing(art, capsys) -> None:
    assert run(capsys, "diff", art["a"], art["a"])[:2] == (0, "")
    code, out, err = run(capsys, "diff", art["a"], art["b"])
    assert code == 1 and err == ""
    assert "cdiv(n, 256) -> cdiv(n, 128)" in out and "+ image sm_86" in out
    code, out, err = run(capsys, "diff", art["a"], art["dir"] / "missing.kpack")
    assert code == 2 and out == "" and "missing.kpack" in err


# ---- keygen / sign / verify --------------------------------------------------------------------
def test_sign_then_verify_with_right_and_wrong_keys(art, capsys, tmp_path) -> None:
    k1, k2 = tmp_path / "k1", tmp_path / "k2"
    assert run(capsys, "keygen", "-o", k1)[0] == 0
    assert run(capsys, "keygen", "-o", k2)[0] == 0
    assert stat.S_IMODE(os.stat(k1).st_mode) == 0o600
    signed = tmp_path / "s.kpack"
    code, out, _ = run(capsys, "sign", art["a"], "--key", k1, "-o", signed)
    assert code == 0 and "signed" in out
    code, out, _ = run(capsys, "verify", signed, "--trusted-key", f"{k1}.pub")
    assert code == 0 and "(trusted)" in out
    code, out, err = run(capsys, "verify", signed, "--trusted-key", f"{k2}.pub")
    assert code == 1 and out == "" and "not trusted" in err
    code, _, err = run(capsys, "verify", art["a"], "--trusted-key", f"{k1}.pub")
    assert code == 1 and "unsigned" in err
    code, _, err = run(capsys, "verify", signed, "--trusted-key", k1)
    assert code == 1 and "private key" in err
    # the Python API agrees with the command
    assert kp.load(signed, trusted_keys=[f"{k1}.pub"]).signature.verified is True
    with pytest.raises(kp.SignatureError):
        kp.load(signed, trusted_keys=[f"{k2}.pub"])
    assert kp.save(kp.load(art["a"]), None, sign_with=str(k1)) == signed.read_bytes()


def test_sign_in_place_keeps_the_file_mode(art, capsys, tmp_path) -> None:
    key = tmp_path / "k"
    assert run(capsys, "keygen", "-o", key)[0] == 0
    target = tmp_path / "t.kpack"
    target.write_bytes(art["a"].read_bytes())
    os.chmod(target, 0o640)
    code, _, _ = run(capsys, "sign", target, "--key", key)
    assert code == 0
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert kp.load(target, trusted_keys=[f"{key}.pub"]).signature.verified


def test_keygen_never_overwrites(capsys, tmp_path) -> None:
    key = tmp_path / "k"
    assert run(capsys, "keygen", "-o", key)[0] == 0
    before = key.read_bytes(), Path(f"{key}.pub").read_bytes()
    code, _, err = run(capsys, "keygen", "-o", key)
    assert code == 1 and "exists" in err.lower()
    assert (key.read_bytes(), Path(f"{key}.pub").read_bytes()) == before


# ---- the Python artifact API -------------------------------------------------------------------
def test_save_into_a_missing_directory_names_the_path(tmp_path) -> None:
    target = tmp_path / "nodir" / "x.kpack"
    with pytest.raises(FileNotFoundError) as info:
        kp.save([_axpy()], target)
    assert str(target) in str(info.value)
    assert not (tmp_path / "nodir").exists()


def test_failed_save_leaves_an_existing_file_as_it_was(art, tmp_path) -> None:
    target = tmp_path / "t.kpack"
    target.write_bytes(art["a"].read_bytes())
    with pytest.raises(ValueError, match="'axpy'"):
        kp.save([_axpy(), _axpy(block=128)], target)  # two programs named axpy
    assert target.read_bytes() == art["a"].read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.kpack"]  # no temporary left
    kp.save([_axpy(block=128, targets=("sm_80", "sm_86"))], target)
    assert target.read_bytes() == art["b"].read_bytes()


def test_load_of_bytes_bytearray_and_memoryview(art) -> None:
    data = art["a"].read_bytes()
    buf = bytearray(data)
    packs = [kp.load(data), kp.load(buf), kp.load(memoryview(buf)),
             kp.load(memoryview(b"??" + data)[2:])]
    for i in range(len(buf)):
        buf[i] = 0  # the caller's buffer changes after load: the packs do not
    for pack in packs:
        assert pack.programs == ["axpy"]
        assert pack["axpy"].plan(x=(1000,), y=(1000,)).launches[0].grid == (4, 1, 1)
        pack.verify()
    with pytest.raises(kp.FormatError):
        kp.load(b"")
    with pytest.raises(KeyError, match="nope"):
        packs[0]["nope"]


def test_summary_and_plan_errors_name_the_parameter(art) -> None:
    program = kp.load(art["a"])["axpy"]
    assert [p.name for p in program.summary.params] == ["x", "y", "a", "n32"]
    with pytest.raises(TypeError, match="3 inputs"):
        program.plan((4,), (4,), 1.0, 7)
    with pytest.raises(kp.ConstraintError, match="x.shape.0. is -1"):
        program.plan(x=(-1,), y=(-1,))
    with pytest.raises(kp.ConstraintError, match="outside int64"):
        program.plan(x=(1 << 70,), y=(1 << 70,))
    with pytest.raises(TypeError, match="no input 'z'"):
        program.plan(x=(4,), y=(4,), z=1)


# ---- bugs review 27 found, all fixed (each docstring tells what happened before the fix) -------
def test_keygen_refuses_an_output_ending_in_pub(art, capsys, tmp_path) -> None:
    """``keygen -o k.pub`` writes the private key as ``k.pub`` and the public one as
    ``k.pub.pub``. ``sign --key k.pub`` then refuses it ("a public key file (.pub) cannot
    sign"), and ``verify --trusted-key k.pub`` reads the private seed as some other public key.
    Expected: keygen refuses such a NAME (nothing written), or the pair it wrote works."""
    name = tmp_path / "k.pub"
    code, _, _ = run(capsys, "keygen", "-o", name)
    if code != 0:
        assert not name.exists() and not Path(f"{name}.pub").exists()
        return
    signed = tmp_path / "s.kpack"
    code, _, err = run(capsys, "sign", art["a"], "--key", name, "-o", signed)
    assert code == 0, err
    code, _, err = run(capsys, "verify", signed, "--trusted-key", f"{name}.pub")
    assert code == 0, err


def test_sign_refuses_an_empty_output_path(art, capsys, tmp_path) -> None:
    """``sign FILE --key K -o ""`` (an unset ``$OUT`` in a script) rewrote FILE: the empty
    path falls back to the "in place" default through ``args.output or args.file``. An output
    path that was given but is empty is an error; FILE must stay as it was."""
    key = tmp_path / "k"
    assert run(capsys, "keygen", "-o", key)[0] == 0
    target = tmp_path / "t.kpack"
    target.write_bytes(art["a"].read_bytes())
    code, _, err = run(capsys, "sign", target, "--key", key, "-o", "")
    assert code != 0
    assert target.read_bytes() == art["a"].read_bytes()


def test_extract_refuses_an_empty_output_dir(art, capsys, tmp_path, monkeypatch) -> None:
    """``extract FILE -o ""`` writes every image into the current directory (``Path("")`` is
    "."). An empty DIR is an error, as ``build -o ""`` and ``kp.Cache(path="")`` already
    treat it; nothing may be written."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, _, _ = run(capsys, "extract", art["a"], "-o", "")
    written = sorted(os.listdir(cwd))
    assert code != 0 and written == [], written


def test_keygen_with_an_empty_output_names_the_option(capsys, tmp_path, monkeypatch) -> None:
    """``keygen -o ""`` fails with ``error: : No such file or directory``: neither the
    option nor the problem is named. Expected: the error says the output NAME is empty
    (mentions -o/--output or "empty")."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "keygen", "-o", "")
    assert code != 0
    assert any(word in err for word in ("-o", "--output", "empty", "NAME")), err


def test_device_sm_00_error_names_the_text(art, capsys) -> None:
    """``--device sm_00`` (or ``sm_05``) is refused with ``bad architecture 0.0''``: the text
    the user typed is not named, unlike every other bad device (``not a GPU architecture: ...
    (got 'sm_x')``); parse_arch's docstring promises "ValueError naming the text"."""
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(art["a"]), "--device", "sm_00"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "sm_00" in err, err


def test_external_target_sm_05_error_names_the_target() -> None:
    """``kp.external(..., targets=["sm_05"])`` raises ``ValueError: bad architecture 0.5''``,
    which names neither the parameter nor the target given."""
    with pytest.raises(ValueError) as info:
        _axpy(targets=("sm_05",))
    assert "sm_05" in str(info.value), str(info.value)


def test_cache_dir_empty_string_is_refused(art, capsys, tmp_path, monkeypatch) -> None:
    """``kp.Cache(path="")`` is refused ("path must name a directory (got '')") because
    ``Path("")`` is "." and would put entries/ keys/ locks/ in the working directory. The
    command's ``--dir ""`` (and ``build --cache-dir ""``) goes through argparse's
    ``type=Path`` first, which turns "" into Path("."): ``cache clear --dir ""`` empties a
    cache that happens to live in the working directory, and ``build --cache-dir ""`` creates
    one there. Expected: the same refusal as the API, and nothing removed."""
    from kernelpack.cache.disk import DiskStore

    with pytest.raises(ValueError):
        kp.Cache(path="")
    monkeypatch.chdir(tmp_path)
    store = DiskStore(tmp_path)
    digest = "ab" * 32
    store.put(digest, art["a"].read_bytes())
    assert store.path(digest).exists()
    code, out, err = run(capsys, "cache", "clear", "--dir", "")
    assert code != 0, out
    assert store.path(digest).exists()


def test_sign_with_an_empty_key_names_the_option(art, capsys, tmp_path) -> None:
    """``sign FILE --key ""`` fails with ``error: : No such file or directory``: the option
    (--key) is not named. Expected: the error names --key (or says the key path is empty);
    nothing is written."""
    out = tmp_path / "s.kpack"
    code, _, err = run(capsys, "sign", art["a"], "--key", "", "-o", out)
    assert code != 0 and not out.exists()
    assert any(word in err for word in ("--key", "key", "empty")), err
