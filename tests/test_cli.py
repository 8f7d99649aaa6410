"""The ``kernelpack`` command on real artifacts built from examples/axpy.ptx (no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main, parse_assignment, safe_filename

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")
save = pytest.importorskip("kernelpack.serializer").save

PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()


def _axpy(block: int = 256, targets=("sm_80", "sm_90", "ptx")) -> kp.Compiled:
    return kp.external(
        "axpy", "axpy",
        [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
         kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", block), block=block, ptx=PTX, targets=targets,
        constraints=[(kp.sym("n") < (1 << 32), "32-bit n")])


def _stages() -> kp.Compiled:
    """A program with an output, a scratch buffer and a repeated launch (declared only: the
    summary, not the kernel, is what the CLI shows; the PTX's `.param .f32 a` gets a
    pointer, which kp.external warns about)."""
    with pytest.warns(UserWarning, match="a launch passes the kernel a wrong value"):
        return _declared_stages()


def _declared_stages() -> kp.Compiled:
    return kp.external(
        "stages", "axpy",
        [kp.Tensor("x", kp.f32, ["b", "n"]), kp.Tensor("out", kp.f32, ["b", "n"], role="out",
                                                       zero_init=True),
         kp.Scalar("k", kp.i32)],
        grid=(kp.cdiv("n", kp.shl(1, "s")), "b"), block=128, shared_mem=kp.sym("k") * 4,
        ptx=PTX, targets=["sm_80"], module="shared_kernels",
        args=["x", "out", "tmp", (kp.shl(1, "s"), kp.u32)],
        scratch=[kp.Scratch("tmp", kp.f32, [kp.cdiv("n", 2)])], count=3, loop="s")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    out = {"a": d / "a.kpack", "a2": d / "a2.kpack", "b": d / "b.kpack"}
    save([_axpy(), _stages()], out["a"])
    save([_stages(), _axpy()], out["a2"])  # same content, other order
    save([_axpy(block=128, targets=("sm_80", "sm_86"))], out["b"])
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- inspect -----------------------------------------------------------------------------------
def test_inspect_text(files, capsys) -> None:
    code, out, err = run(capsys, "inspect", files["a"])
    assert code == 0 and err == ""
    for fact in ("format 1.0", "unsigned", "program axpy", "program stages", "cdiv(n, 256)",
                 "(n,)", "passed by caller", "n < 4294967296", "32-bit n", "module axpy",
                 "compute_80", "sm_90", "nvJitLink", "zstd", "8.0", "uint32(1 << s)", "3x, loop s",
                 "scratch tmp: float32[cdiv(n, 2)]", "zero-init", "k * 4",
                 "(cdiv(n, 1 << s), b)"):
        assert fact in out, fact


def test_inspect_json(files, capsys) -> None:
    code, out, _ = run(capsys, "inspect", files["a"], "--json")
    facts = json.loads(out)
    assert code == 0 and facts["format_version"] == "1.0"
    assert facts["signature"] == {"signed": False, "key_id": None, "verified": None,
                                  "intact": None}
    axpy = {p["name"]: p for p in facts["programs"]}["axpy"]
    assert [p["name"] for p in axpy["params"]] == ["x", "y", "a", "n32"]
    assert axpy["params"][3] == {"name": "n32", "kind": "scalar", "role": "computed",
                                 "dtype": "uint32", "value": "n"}
    launch = axpy["variants"][0]["launches"][0]
    assert launch["grid"] == ["cdiv(n, 256)", "1", "1"] and launch["block"][0] == "256"
    assert [a["text"] for a in launch["args"]] == ["x", "y", "a", "n32"]
    module = {m["name"]: m for m in facts["modules"]}["axpy"]
    assert [i["target"] for i in module["images"]] == ["sm_80", "sm_90", "compute_80"]
    for image in module["images"]:
        assert image["codec"] in ("zstd", "none") and len(image["raw_digest"]) == 64
        assert image["raw_size"] > 0 and image["ratio"] == round(
            image["raw_size"] / image["stored_size"], 2)
    assert module["images"][0]["cuda_version"] >= 12000 and module["images"][2]["ptx_isa"] == "8.0"


def test_inspect_device_explains_the_choice(files, capsys) -> None:
    code, out, _ = run(capsys, "inspect", files["a"], "--device", "sm_86", "--json")
    sel = {m["name"]: m for m in json.loads(out)["modules"]}["axpy"]["selection"]
    assert code == 0 and sel["chosen"] == "cubin sm_80"
    reasons = {r["image"]: r["reason"] for r in sel["reasons"]}
    assert reasons["cubin sm_90"].startswith("rejected")
    code, out, _ = run(capsys, "inspect", files["a"], "--device", "sm_75")
    assert code == 0 and "no usable image" in out
    code, out, _ = run(capsys, "inspect", files["a"], "--device", "sm_90")
    assert "loads cubin sm_90" in out


def test_inspect_device_with_driver(files, capsys) -> None:
    # a CUDA 12.0 driver cannot load cubins from a 13.x toolkit, but can JIT ISA 8.0 PTX
    code, out, _ = run(capsys, "inspect", files["a"], "--device", "sm_90", "--driver", "12.0",
                       "--json")
    sel = {m["name"]: m for m in json.loads(out)["modules"]}["axpy"]["selection"]
    assert code == 0 and sel["driver_version"] == 12000
    from kernelpack.toolchain import nvjitlink

    if nvjitlink.version()[0] > 12:
        assert sel["chosen"] == "ptx compute_80 (ISA 8.0)"
    code, _, err = run(capsys, "inspect", files["a"], "--driver", "12.0")
    assert code == 2 and "--driver needs --device" in err  # a usage error, as argparse's
    with pytest.raises(SystemExit):
        main(["inspect", str(files["a"]), "--device", "sm_90", "--driver", "twelve"])


def test_inspect_rejects_a_bad_device(files, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(files["a"]), "--device", "hopper"])
    assert info.value.code == 2
    assert "not a GPU architecture" in capsys.readouterr().err


# ---- verify and bad files ----------------------------------------------------------------------
def test_verify_ok(files, capsys) -> None:
    code, out, _ = run(capsys, "verify", files["a"])
    assert code == 0 and out.startswith("OK:") and "2 program(s), 2 module(s), 4 image(s)" in out


def _corrupt_image(src: Path, dst: Path) -> None:
    data = bytearray(src.read_bytes())
    frame = data.find(b"\x28\xb5\x2f\xfd")  # a zstd frame: an image's stored bytes
    assert frame > 0
    data[frame + 40] ^= 0xFF
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("make, message", [
    (lambda src, dst: dst.write_bytes(src.read_bytes()[:100]), "Pack.body"),
    (lambda src, dst: dst.write_bytes(b"not a kernelpack file at all"), "file identifier"),
    (lambda src, dst: dst.write_bytes(b""), "header: 0 bytes"),
    (_corrupt_image, "module 'axpy' image"),
])
def test_bad_files_exit_1_with_one_line(files, capsys, tmp_path, make, message) -> None:
    bad = tmp_path / "bad.kpack"
    make(files["a"], bad)
    code, out, err = run(capsys, "verify", bad)
    assert code == 1 and out == ""
    # one line, naming the file (not a generic "file:") and what is wrong with it
    assert err.startswith(f"error: {bad}: ") and message in err and err.count("\n") == 1


def test_corrupt_image_still_inspects_but_fails_verify_and_extract(files, capsys, tmp_path) -> None:
    bad = tmp_path / "bad.kpack"
    _corrupt_image(files["a"], bad)
    assert run(capsys, "inspect", bad)[0] == 0  # images are checked when read, not at load
    code, _, err = run(capsys, "extract", bad, "-o", tmp_path / "x")
    assert code == 1 and "digest" in err


@pytest.mark.parametrize("path, message", [("missing.kpack", "no such file"), (".", "not a regular")])
def test_missing_files(capsys, tmp_path, path, message) -> None:
    code, _, err = run(capsys, "inspect", tmp_path / path)
    assert code == 1 and message in err


# ---- extract -----------------------------------------------------------------------------------
def test_extract_writes_raw_images(files, capsys, tmp_path) -> None:
    out_dir = tmp_path / "images"
    code, out, _ = run(capsys, "extract", files["a"], "-o", out_dir)
    assert code == 0
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["axpy.compute_80.ptx", "axpy.sm_80.cubin", "axpy.sm_90.cubin",
                     "shared_kernels.sm_80.cubin"]
    compiled = {i.target: i.data for i in _axpy().modules[0].images}
    assert (out_dir / "axpy.sm_90.cubin").read_bytes() == compiled["sm_90"]
    assert (out_dir / "axpy.sm_90.cubin").read_bytes()[:4] == b"\x7fELF"
    assert (out_dir / "axpy.compute_80.ptx").read_bytes() == compiled["compute_80"]
    code, _, err = run(capsys, "extract", files["a"], "-o", out_dir)
    assert code == 1 and "refusing to overwrite" in err and "--force" in err
    (out_dir / "axpy.sm_80.cubin").write_bytes(b"stale")
    assert run(capsys, "extract", files["a"], "-o", out_dir, "--force")[0] == 0
    assert (out_dir / "axpy.sm_80.cubin").read_bytes() == compiled["sm_80"]


@pytest.mark.parametrize("tool, args", [("nvdisasm", []), ("cuobjdump", ["-sass"])])
def test_extracted_cubins_disassemble(files, capsys, tmp_path, tool, args) -> None:
    import shutil

    exe = shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} not on PATH (pip install nvidia-cuda-{tool} to run this check)")
    run(capsys, "extract", files["a"], "-o", tmp_path)
    done = subprocess.run([exe, *args, str(tmp_path / "axpy.sm_90.cubin")], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "axpy" in done.stdout


@pytest.mark.parametrize("name, safe", [("axpy", "axpy"), ("../../etc/passwd", "_.._etc_passwd"),
                                        ("a/b\\c", "a_b_c"), (".hidden", "hidden"), ("..", "_"),
                                        ("", "_"), ("sm_90a", "sm_90a"), ("x..y", "x_y")])
def test_safe_filename(name: str, safe: str) -> None:
    result = safe_filename(name)
    assert "/" not in result and "\\" not in result and ".." not in result
    assert not result.startswith(".")
    if name != "../../etc/passwd":
        assert result == safe


# ---- eval --------------------------------------------------------------------------------------
def test_eval_text_and_json(files, capsys) -> None:
    code, out, _ = run(capsys, "eval", files["a"], "axpy", "x=1000000", "y=1000000", "a=0.5")
    assert code == 0 and "(3907, 1, 1)" in out and "n=1000000" in out
    code, out, _ = run(capsys, "eval", files["a"], "stages", "x=4,1000", "k=16", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["symbols"]["b"] == 4 and plan["symbols"]["n"] == 1000
    allocs = {a["name"]: a for a in plan["allocations"]}
    assert allocs["out"]["shape"] == [4, 1000] and allocs["out"]["nbytes"] == 16000
    assert allocs["out"]["zero_init"] and allocs["tmp"]["nbytes"] == 2000
    assert [launch["grid"] for launch in plan["launches"]] == [[1000, 4, 1], [500, 4, 1],
                                                               [250, 4, 1]]
    assert plan["launches"][2]["shared_mem"] == 64
    assert plan["launches"][2]["args"] == ["x", "out", "tmp", "uint32(4)"]


@pytest.mark.parametrize("argv, message", [
    (["axpy", "x=10", "y=11", "a=1"], "y.shape[0] is 11 but n = 10"),
    (["axpy", "x=10"], "missing input"),
    (["axpy", "x=10", "y=10", "a=1", "z=3"], "no input 'z'"),
    (["axpy", "x=ten"], "x: expected a shape of integers"),
    (["axpy", "a=1,2"], "a: expected a number"),
    (["axpy", "4096"], "expected NAME=VALUE"),
    (["nope"], "no program 'nope'"),
    (["axpy", "x=4294967296", "y=4294967296", "a=1"], "32-bit n"),
])
def test_eval_errors(files, capsys, argv, message) -> None:
    code, _, err = run(capsys, "eval", files["a"], *argv)
    assert code == 1 and message in err and err.startswith("error: ")


def test_parse_assignment() -> None:
    kinds = {"x": "tensor", "s": "int", "a": "float"}
    assert parse_assignment("x=4096,1000", kinds) == ("x", (4096, 1000))
    assert parse_assignment("x=4096", kinds) == ("x", (4096,))
    assert parse_assignment("x=4096,", kinds) == ("x", (4096,))
    assert parse_assignment("x=", kinds) == ("x", ())
    assert parse_assignment("s=3", kinds) == ("s", 3)
    assert parse_assignment("a=0.5", kinds) == ("a", 0.5)
    assert parse_assignment("other=2,3", kinds) == ("other", (2, 3))


# ---- diff --------------------------------------------------------------------------------------
def test_diff_identical(files, capsys) -> None:
    assert run(capsys, "diff", files["a"], files["a2"]) == (0, "", "")


def test_diff_reports_changes(files, capsys) -> None:
    code, out, _ = run(capsys, "diff", files["a"], files["b"])
    assert code == 1
    assert "- program stages" in out and "- module shared_kernels" in out
    assert "~ program axpy" in out and "cdiv(n, 256) -> cdiv(n, 128)" in out
    assert "- image sm_90" in out and "+ image sm_86" in out and "- image compute_80" in out


# ---- keys and signatures -----------------------------------------------------------------------
def test_keygen_sign_and_verify(files, capsys, tmp_path) -> None:
    key = tmp_path / "release"
    code, out, _ = run(capsys, "keygen", "-o", key)
    assert code == 0 and key.exists() and Path(f"{key}.pub").exists()
    assert run(capsys, "keygen", "-o", key)[0] == 1  # never overwrites a private key
    signed = tmp_path / "signed.kpack"
    code, out, _ = run(capsys, "sign", files["a"], "--key", key, "-o", signed)
    assert code == 0 and "key id" in out
    code, out, _ = run(capsys, "verify", signed, "--trusted-key", f"{key}.pub")
    assert code == 0 and "(trusted)" in out
    run(capsys, "keygen", "-o", tmp_path / "other")
    code, _, err = run(capsys, "verify", signed, "--trusted-key", tmp_path / "other.pub")
    assert code == 1 and "not trusted" in err
    code, _, err = run(capsys, "verify", files["a"], "--trusted-key", f"{key}.pub")
    assert code == 1 and "unsigned" in err
    code, out, _ = run(capsys, "diff", files["a"], signed)
    assert code == 0 and "note: signature: unsigned -> signed" in out
    code, out, _ = run(capsys, "inspect", signed)
    assert "signed, key" in out


def test_sign_in_place(files, capsys, tmp_path) -> None:
    copy = tmp_path / "copy.kpack"
    copy.write_bytes(files["b"].read_bytes())
    run(capsys, "keygen", "-o", tmp_path / "k")
    assert run(capsys, "sign", copy, "--key", tmp_path / "k")[0] == 0
    assert json.loads(run(capsys, "inspect", copy, "--json")[1])["signature"]["signed"]


# ---- usage -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["inspect"], ["verify"], ["extract"], ["eval"], ["diff"],
                                     ["keygen"], ["sign"]])
def test_help_everywhere(capsys, command) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0 and "usage: kernelpack" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys) -> None:
    for argv in ([], ["frobnicate"], ["extract", "f.kpack"], ["diff", "a"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2


@pytest.mark.parametrize("argv, usage", [
    (["inspect", "--bogus", "f.kpack"], "usage: kernelpack inspect [-h] [--json]"),
    (["cache", "ls", "--bogus"], "usage: kernelpack cache ls [-h] [--dir DIR]"),
    (["build", "src.py", "-o", "x.kpack", "--bogus"], "usage: kernelpack build [-h] -o OUT"),
    (["eval", "f.kpack", "prog", "--bogus"], "usage: kernelpack eval [-h] [--json]"),
])
def test_an_unknown_option_shows_the_commands_usage(capsys, argv, usage) -> None:
    """Was: the top-level usage ("kernelpack [-h] [--version] COMMAND ..."), which does not
    list the options the command does take."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert " ".join(err.split()).startswith(usage), err
    assert f"kernelpack {' '.join(argv[:2 if argv[0] == 'cache' else 1])}: error: " \
           "unrecognized arguments: --bogus" in err, err


def test_module_entry_point_exit_status(files, tmp_path) -> None:
    bad = tmp_path / "bad.kpack"
    bad.write_bytes(b"\0" * 64)
    cmd = [sys.executable, "-m", "kernelpack.cli"]
    ok = subprocess.run([*cmd, "verify", str(files["a"])], capture_output=True, text=True,
                        timeout=120, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0 and ok.stdout.startswith("OK:")
    failed = subprocess.run([*cmd, "inspect", str(bad)], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("error: ") and failed.stderr.count("\n") == 1
    usage = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert usage.returncode == 2


def test_cache_subcommand_hook(capsys) -> None:
    import importlib.util

    if importlib.util.find_spec("kernelpack.cli_cache") is None:
        pytest.skip("kernelpack.cli_cache is not part of this checkout yet")
    with pytest.raises(SystemExit) as info:
        main(["cache", "--help"])
    assert info.value.code == 0 and "cache" in capsys.readouterr().out


def test_corrupt_files_never_crash_the_cli(files, capsys, tmp_path) -> None:
    """Byte flips and truncations of an artifact: every command exits 0 or 1 with an
    ``error:`` line, never a traceback (the CLI only sees KernelPackError from the loader)."""
    data = files["b"].read_bytes()
    bad = tmp_path / "bad.kpack"
    cases = [data[:n] for n in range(0, len(data), max(1, len(data) // 60))]
    for pos in range(0, len(data), max(1, len(data) // 200)):
        flipped = bytearray(data)
        flipped[pos] ^= 0x55
        cases.append(bytes(flipped))
    failures = 0
    for case in cases:
        bad.write_bytes(case)
        for argv in (["inspect", bad, "--json"], ["verify", bad]):
            code, _, err = run(capsys, *argv)
            assert code in (0, 1)
            if code == 1:
                assert err.startswith("error: ") and err.count("\n") == 1
                failures += 1
    assert failures > len(cases)  # most corruptions are caught (verify catches every flip)


# ---- review: errors name the file; diff, extract and eval edge cases -----------------------------
def test_diff_names_the_bad_file_and_never_calls_a_corrupt_one_identical(files, capsys,
                                                                         tmp_path) -> None:
    empty = tmp_path / "empty.kpack"
    empty.write_bytes(b"")
    for argv in ([files["a"], empty], [empty, files["a"]]):
        code, out, err = run(capsys, "diff", *argv)  # 2: trouble, not "different" (1)
        assert code == 2 and out == "" and err.startswith(f"error: {empty}: header")
    bad = tmp_path / "bad.kpack"
    _corrupt_image(files["a"], bad)  # same metadata, so the recorded digests are equal
    code, out, err = run(capsys, "diff", files["a"], bad)
    assert code == 2 and err.startswith(f"error: {bad}: module") and "digest" in err


def test_extract_of_a_corrupt_file_writes_nothing(files, capsys, tmp_path) -> None:
    bad = tmp_path / "bad.kpack"
    _corrupt_image(files["a"], bad)
    out_dir = tmp_path / "x"
    code, out, err = run(capsys, "extract", bad, "-o", out_dir)
    assert code == 1 and out == "" and err.startswith(f"error: {bad}: ")
    assert not out_dir.exists()  # not even the directory: every image is checked first


def test_eval_refuses_a_repeated_name_and_takes_python_shapes(files, capsys) -> None:
    code, _, err = run(capsys, "eval", files["a"], "axpy", "x=10", "x=11", "y=10")
    assert code == 1 and "x is given twice" in err
    code, out, _ = run(capsys, "eval", files["a"], "axpy", "x=(10,)", "y=[10]", "--json")
    assert code == 0 and json.loads(out)["symbols"]["n"] == 10  # `a` (a float) not needed
    assert parse_assignment("x=(4096, 1000)", {"x": "tensor"}) == ("x", (4096, 1000))
    assert parse_assignment("x=()", {"x": "tensor"}) == ("x", ())
    code, _, err = run(capsys, "eval", files["a"], "stages", "x=4,10", "k=1", "out=4,10")
    assert code == 1 and "'out' is not an input, it is an output" in err


def test_keys_of_the_wrong_kind_are_refused(files, capsys, tmp_path) -> None:
    key = tmp_path / "k"
    run(capsys, "keygen", "-o", key)
    # both files hold 64 hex digits: a .pub read as a seed would sign with a meaningless key
    code, _, err = run(capsys, "sign", files["a"], "--key", f"{key}.pub", "-o", tmp_path / "s")
    assert code == 1 and "public key file (.pub) cannot sign" in err
    assert not (tmp_path / "s").exists()
    run(capsys, "sign", files["a"], "--key", key, "-o", tmp_path / "s")
    code, _, err = run(capsys, "verify", tmp_path / "s", "--trusted-key", key)
    assert code == 1 and f"{key} is a private key; trust its public key {key}.pub" in err
    code, _, err = run(capsys, "verify", tmp_path / "s", "--trusted-key", tmp_path / "no.pub")
    assert code == 1 and "no such public key file" in err


def test_keygen_never_overwrites_a_public_key(capsys, tmp_path) -> None:
    pub = tmp_path / "k.pub"
    pub.write_text("old\n")
    code, _, err = run(capsys, "keygen", "-o", tmp_path / "k")
    assert code == 1 and f"{pub}: already exists, and a key is never overwritten" in err
    assert pub.read_text() == "old\n" and not (tmp_path / "k").exists()


def test_keygen_without_a_name_writes_the_default_pair_once(capsys, tmp_path,
                                                             monkeypatch) -> None:
    """Bare ``kernelpack keygen`` (issue 2, DESIGN.md) writes kernelpack-signing.key and its
    .pub in the working directory; run again, it refuses rather than replace the key (review
    73: it was a usage error)."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "keygen")
    assert code == 0 and "private key: kernelpack-signing.key (keep it secret)" in out
    seed = (tmp_path / "kernelpack-signing.key").read_text()
    code, _, err = run(capsys, "keygen")
    assert code == 1 and "-o NAME" in err
    assert (tmp_path / "kernelpack-signing.key").read_text() == seed


def test_artifact_text_cannot_drive_the_terminal(capsys, tmp_path) -> None:
    """Free text in an untrusted file (a constraint message) is shown with its control and
    bidi characters escaped, in tables, in error lines and in diffs; JSON escapes them too."""
    hostile = "\x1b]0;pwned\x07\x1b[2J\u202egnp.exe\b"
    c = kp.external("axpy", "axpy",
                    [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                     kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
                    grid=kp.cdiv("n", 256), block=256, ptx=PTX, targets=["sm_80"],
                    constraints=[(kp.sym("n") < 5, hostile)])
    path = tmp_path / "hostile.kpack"
    save([c], path)
    code, out, _ = run(capsys, "inspect", path)
    assert code == 0 and "\\x1b]0;pwned\\x07\\x1b[2J\\u202egnp.exe\\x08" in out
    code, _, err = run(capsys, "eval", path, "axpy", "x=10", "y=10")
    assert code == 1 and "\\x1b[2J" in err
    other = tmp_path / "other.kpack"
    save([_axpy(targets=("sm_80",))], other)
    code, diff_out, _ = run(capsys, "diff", path, other)
    assert code == 1 and "\\u202e" in diff_out
    code, out, _ = run(capsys, "inspect", path, "--json")
    assert json.loads(out)["programs"][0]["constraints"][0]["message"] == hostile
    for text in (out, err, diff_out):
        assert "\x1b" not in text and "\u202e" not in text and "\b" not in text


def _wide_axpy(changed_leaf: int | None, tmp_path: Path) -> Path:
    """axpy with a computed scalar ``max`` over 256 leaves ``n + i`` (one leaf changed): ~1000
    nodes, past the few hundred that str() prints."""
    import dataclasses

    import kp_samples
    from kernelpack.summary import Scalar

    leaves = [kp.sym("n") + (i * 1000 if i == changed_leaf else i) for i in range(256)]
    while len(leaves) > 1:
        leaves = [kp.emax(a, b) for a, b in zip(leaves[::2], leaves[1::2])]
    c = kp_samples.axpy()
    params = tuple(Scalar("n32", kp.u32, value=leaves[0]) if p.name == "n32" else p
                   for p in c.summary.params)
    path = tmp_path / f"wide{changed_leaf}.kpack"
    save([dataclasses.replace(c, summary=dataclasses.replace(c.summary, params=params))], path)
    return path


def test_diff_and_json_see_expressions_past_the_short_printed_form(tmp_path, capsys,
                                                                   monkeypatch) -> None:
    """Review 30: inspect's facts printed expressions as str() does, cut after a few hundred
    nodes, so ``diff`` called two programs identical (exit 0) when they differed only past
    that point, and ``--json`` gave machines a truncated expression. Facts now print each
    expression whole (up to ExprText.WHOLE_NODES nodes), and diff compares the summaries
    themselves where the printed facts agree."""
    from kernelpack.cli_facts import ExprText

    a, b = _wide_axpy(None, tmp_path), _wide_axpy(250, tmp_path)
    code, out, _ = run(capsys, "inspect", a, "--json")
    value = next(p for p in json.loads(out)["programs"][0]["params"] if p["name"] == "n32")
    assert code == 0 and "..." not in value["value"] and "n + 255" in value["value"]
    code, out, _ = run(capsys, "diff", a, b)
    assert code == 1 and "n + 250000" in out
    # past what facts print whole (a huge or hostile expression): still not "identical"
    monkeypatch.setattr(ExprText, "WHOLE_NODES", 16)
    code, out, _ = run(capsys, "diff", a, b)
    assert code == 1 and "expressions differ past their printed part" in out, out
    assert run(capsys, "diff", a, _wide_axpy(None, tmp_path))[0] == 0


def test_ctrl_c_during_set_up_or_parsing_is_exit_130(capsys, monkeypatch) -> None:
    """Review 30: a KeyboardInterrupt before the command ran (building the parser, guarding
    stdout) escaped main() as an exception instead of the README's exit status 130; main()
    also restores sys.stdout whatever happens."""
    import kernelpack.cli as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    stdout = sys.stdout
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["inspect", "x.kpack"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n" and sys.stdout is stdout


def test_unwritable_stdout_without_a_spare_descriptor(files) -> None:
    """Output to /dev/full with no descriptor left (EMFILE) for the clean-up that drops the
    unwritten buffer: the OSError of its ``os.dup`` escaped main() as a traceback. It is still
    the one-line error and status 1."""
    script = (
        "import errno, os, sys\n"
        "from kernelpack.cli import main\n"
        "full = os.open('/dev/full', os.O_WRONLY); os.dup2(full, 1); os.close(full)\n"
        "def dup(fd):\n"
        "    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))\n"
        "os.dup = dup\n"
        "rc = main(['inspect', sys.argv[1]])\n"
        "sys.stderr.write('RC=%r\\n' % rc)\n"
        "os._exit(0)\n"  # the buffer for the full device stays: not what is tested here
    )
    res = subprocess.run([sys.executable, "-c", script, str(files["a"])],
                         capture_output=True, text=True, timeout=60)
    assert "RC=1" in res.stderr, res.stderr
    assert "error: cannot write to standard output" in res.stderr
    assert "Traceback" not in res.stderr
