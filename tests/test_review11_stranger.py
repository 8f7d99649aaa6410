"""Review round 11 (B): artifacts, Pack, signing and the CLI as an outside checker uses them.

Written from DESIGN.md and README.md alone, first the calls a stranger makes (``kp.save`` /
``kp.load`` of the README's axpy, hand-built ``kp.Compiled`` sharing a module, signing keys
in every documented form), then the edges: where two documented spellings must give the same
bytes, and where a mistake must be named. The artifacts are built once per module.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
AXPY_PTX = ROOT / "examples" / "axpy.ptx"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _axpy_params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


@pytest.fixture(scope="module")
def axpy() -> kp.Compiled:
    """README's quick start, verbatim but for the PTX path."""
    return kp.external("axpy", "axpy", params=_axpy_params(), grid=kp.cdiv("n", 256),
                       block=256, ptx=str(AXPY_PTX), targets=["sm_80", "sm_90", "ptx"],
                       constraints=[(kp.sym("n") < (1 << 32), "32-bit n")])


@pytest.fixture(scope="module")
def axpy_bytes(axpy: kp.Compiled) -> bytes:
    return kp.save([axpy])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, axpy_bytes: bytes) -> dict[str, Path]:
    """The artifacts the CLI tests read: good, truncated, garbage, tampered, signed."""
    d = tmp_path_factory.mktemp("r11b")
    out = {"ex": d / "ex.kpack", "trunc": d / "trunc.kpack", "text": d / "text.kpack",
           "tamp": d / "tamp.kpack", "dir": d}
    out["ex"].write_bytes(axpy_bytes)
    out["trunc"].write_bytes(axpy_bytes[:1000])
    out["text"].write_text("hello\n")
    bad = bytearray(axpy_bytes)
    bad[-300] ^= 1  # inside the last stored image: the structure stays valid
    out["tamp"].write_bytes(bytes(bad))
    return out


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = cli([str(a) for a in argv])
    except SystemExit as exc:  # argparse: --help, usage errors
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


# ---- loading from every documented source ----------------------------------------------------

def test_every_documented_source_loads_the_same_pack(axpy_bytes: bytes, files: dict) -> None:
    """``kp.load`` takes a path (str or PathLike) or bytes / bytearray / memoryview; each gives
    the same programs and re-saves to the very bytes it was loaded from."""
    path = files["ex"]
    for source in (axpy_bytes, bytearray(axpy_bytes), memoryview(axpy_bytes), str(path), path):
        pack = kp.load(source)
        assert pack.programs == ["axpy"] and list(pack) == ["axpy"] and len(pack) == 1
        assert kp.save(pack) == axpy_bytes, type(source).__name__
    with open(path, "rb") as f, pytest.raises(TypeError, match="path or bytes"):
        kp.load(f)  # file objects are not documented for load: refused by name, not misread


def test_pack_is_a_read_only_mapping_of_programs(axpy_bytes: bytes) -> None:
    pack = kp.load(axpy_bytes)
    names = pack.programs
    names.append("evil")
    assert pack.programs == ["axpy"]  # a copy, not the pack's own list
    assert "axpy" in pack and "AXPY" not in pack and 5 not in pack and b"axpy" not in pack
    with pytest.raises(KeyError, match=r"no program 'nope'.*has: axpy"):
        pack["nope"]
    assert pack["axpy"] is pack["axpy"]


# ---- hand-built programs sharing one module ---------------------------------------------------

@pytest.fixture(scope="module")
def shared() -> tuple[kp.Compiled, kp.Compiled]:
    """Two hand-built programs over one PTX module, per DESIGN's data model: one with an output,
    a scratch buffer and two variants split by a predicate; one in place."""
    img = kp.Image("ptx", "sm_80", AXPY_PTX.read_bytes(), toolchain="by hand", ptx_isa=(8, 0))
    module = kp.Module("shared", ["axpy"], [img])
    n = kp.sym("n")

    def launch(block: int) -> kp.Launch:
        return kp.Launch("axpy", "shared", grid=(kp.cdiv(n, block), 1, 1), block=(block, 1, 1),
                         args=[kp.Arg("buffer", "x"), kp.Arg("buffer", "y"),
                               kp.Arg("scalar", "a"), kp.Arg("value", value=n, dtype=kp.u32)])

    a = kp.KernelSummary("prog_a", params=[kp.Tensor("x", kp.f32, ["n"]),
                                           kp.Tensor("y", kp.f32, ["n"], role="out"),
                                           kp.Scalar("a", kp.f32)],
                         variants=[kp.Variant([launch(128)], predicate=n < 1000),
                                   kp.Variant([launch(256)], scratch=[
                                       kp.Scratch("ws", kp.f32, [kp.cdiv(n, 256)])])])
    b = kp.KernelSummary("prog_b", params=[kp.Tensor("x", kp.f32, ["n"]),
                                           kp.Tensor("y", kp.f32, ["n"], role="inout"),
                                           kp.Scalar("a", kp.f32)],
                         variants=[kp.Variant([launch(64)])])
    return kp.Compiled(a, [module]), kp.Compiled(b, [module])


def test_shared_module_is_stored_once_and_round_trips(shared: tuple) -> None:
    ca, cb = shared
    data = kp.save([cb, ca])
    assert kp.save([ca, cb]) == data  # sorted tables: the order of the list does not matter
    pack = kp.load(data)
    assert pack.programs == ["prog_a", "prog_b"] and list(pack.modules) == ["shared"]
    assert pack.compiled("prog_a") == ca and pack.compiled("prog_b") == cb
    assert kp.save([pack.compiled("prog_a"), pack.compiled("prog_b")]) == data
    assert kp.save(pack) == data and kp.save([pack["prog_b"], pack["prog_a"]]) == data


def test_hand_built_variants_and_scratch_plan_as_declared(shared: tuple) -> None:
    pack = kp.load(kp.save(list(shared)))
    prog = pack["prog_a"]
    small, edge = prog.plan(x=(999,), a=1.0), prog.plan(x=(1000,), a=1.0)
    assert (small.variant, small.launches[0].grid) == (0, (8, 1, 1))
    assert "ws" not in small.allocations
    assert (edge.variant, edge.launches[0].grid, edge.launches[0].block) == (
        1, (4, 1, 1), (256, 1, 1))
    assert edge.allocations["ws"].shape == (4,) and edge.allocations["ws"].nbytes == 16
    assert edge.allocations["y"].kind == "output" and edge.allocations["y"].nbytes == 4000
    assert edge.launches[0].args[3] == ("value", 1000, kp.u32)
    with pytest.raises(TypeError, match="'y' is not an input, it is an output"):
        prog.plan(x=(10,), y=(10,), a=1.0)


def test_plan_binds_positionally_and_by_keyword_alike(shared: tuple) -> None:
    prog = kp.load(kp.save(list(shared)))["prog_b"]
    by_name = prog.plan(x=(70,), y=(70,), a=2.0)
    assert prog.plan((70,), (70,), 2.0) == by_name == prog.plan((70,), y=(70,), a=2.0)
    assert by_name.launches[0].grid == (2, 1, 1)
    with pytest.raises(TypeError, match=r"takes 3 inputs .* \(got 4 positional\)"):
        prog.plan((7,), (7,), 2.0, 3)
    with pytest.raises(TypeError, match="'x' given twice"):
        prog.plan((7,), x=(7,), a=2.0)
    with pytest.raises(TypeError, match="no input 'z'"):
        prog.plan(x=(7,), y=(7,), z=1)
    with pytest.raises(kp.ConstraintError, match=r"y has rank 2"):
        prog.plan(x=(7,), y=(7, 1))
    with pytest.raises(kp.ConstraintError, match=r"y\.shape\[0\] is 8 but n = 7"):
        prog.plan(x=(7,), y=(8,))
    with pytest.raises(TypeError, match=r"x\.shape\[0\] must be an integer \(got 7\.0\)"):
        prog.plan(x=(7.0,), y=(7,))


# ---- signing: every documented key form gives the same artifact --------------------------------

@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    for name in ("team", "other"):
        assert cli(["keygen", "-o", str(d / name)]) == 0
    return {"team": d / "team", "team.pub": d / "team.pub", "other.pub": d / "other.pub"}


def test_every_sign_with_form_gives_the_same_bytes(axpy: kp.Compiled, keys: dict) -> None:
    seed_hex = keys["team"].read_text().strip()
    forms = {"name": str(keys["team"]), "path": keys["team"],
             "file bytes": keys["team"].read_bytes(), "seed": bytes.fromhex(seed_hex),
             "hex": seed_hex, "bytearray": bytearray.fromhex(seed_hex)}
    signed = {label: kp.save([axpy], sign_with=key) for label, key in forms.items()}
    assert len(set(signed.values())) == 1, {k: len(v) for k, v in signed.items()}
    data = signed["name"]
    pub = keys["team.pub"]
    for trusted in ([str(pub)], str(pub), pub, {str(pub)}, (p for p in [str(pub)]),
                    pub.read_text().strip(), bytes.fromhex(pub.read_text().strip()),
                    [keys["other.pub"], pub]):
        assert kp.load(data, trusted_keys=trusted).signature.verified
    with pytest.raises(kp.SignatureError, match="not trusted"):
        kp.load(data, trusted_keys=[keys["other.pub"]])
    with pytest.raises(kp.SignatureError, match="unsigned"):
        kp.load(kp.save([axpy]), trusted_keys=[pub])
    with pytest.raises(ValueError, match="private key"):
        kp.load(data, trusted_keys=[keys["team"]])
    # re-saving a signed pack drops the signature unless asked; asking again gives the same bytes
    assert kp.save(kp.load(data)) == kp.save([axpy])
    assert kp.save(kp.load(data), sign_with=keys["team"]) == data


@pytest.mark.parametrize("bad", [5, [5], 1.5, [None]])
def test_a_wrong_trusted_keys_type_names_the_parameter(axpy_bytes: bytes, bad: object) -> None:
    # kp.Cache words these "trusted_keys must be a list ..." (TypeError) and "trusted_keys: ..."
    with pytest.raises((TypeError, ValueError), match="^trusted_keys"):
        kp.load(axpy_bytes, trusted_keys=bad)


# ---- the CLI ------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["inspect", "verify", "extract", "eval", "diff", "keygen",
                                     "sign", "cache"])
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([command, "--help"], capsys)
    assert rc == 0 and out.startswith(f"usage: kernelpack {command}") and not err


BAD_FILE_CASES = [
    (["inspect", "{missing}"], 1, "no such file"),
    (["inspect", "{dir}"], 1, "not a regular file"),
    (["verify", "{trunc}"], 1, "run past the end"),
    (["inspect", "{text}"], 1, "header: 6 bytes"),
    (["verify", "{tamp}"], 1, "do not match their digest"),
    (["extract", "{tamp}", "-o", "{dir}/tout"], 1, "do not match their digest"),
    (["sign", "{tamp}", "--key", "{key}", "-o", "{dir}/tsig.kpack"], 1, "digest"),
    (["eval", "{ex}", "nope", "x=10"], 1, "no program 'nope'"),
    (["eval", "{ex}", "axpy", "x=10,a", "y=10"], 1, "x: expected a shape of integers"),
    (["eval", "{ex}", "axpy", "x=1e3", "y=1000"], 1, "x: expected a shape of integers"),
    (["eval", "{ex}", "axpy", "=10"], 1, "expected NAME=VALUE"),
    (["eval", "{ex}", "axpy", "x=10", "x=12", "y=10"], 1, "x is given twice"),
    (["eval", "{ex}", "axpy", "x=10", "y=11"], 1, "y.shape[0] is 11 but n = 10"),
    (["eval", "{ex}", "axpy", "x=99999999999999999999999", "y=1"], 1, "outside int64"),
    (["eval", "{ex}", "axpy", "x=10", "y=10", "a=abc"], 1, "a: expected a number"),
    (["diff", "{ex}", "{trunc}"], 2, "run past the end"),
    (["diff", "{ex}", "{missing}"], 2, "no such file"),
]


@pytest.mark.parametrize("argv, rc, message", BAD_FILE_CASES,
                         ids=[" ".join(c[0][:3]) for c in BAD_FILE_CASES])
def test_failures_are_one_line_on_stderr(argv: list[str], rc: int, message: str, files: dict,
                                         keys: dict, capsys: pytest.CaptureFixture[str]) -> None:
    names = {k: str(v) for k, v in files.items()}
    names.update(missing=str(files["dir"] / "missing.kpack"), key=str(keys["team"]))
    got, out, err = _run([a.format(**names) for a in argv], capsys)
    assert got == rc
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err
    assert not (files["dir"] / "tout").exists() and not (files["dir"] / "tsig.kpack").exists()


def test_diff_answers_like_diff1(files: dict, shared: tuple, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.kpack"
    kp.save(list(shared), other)
    assert _run(["diff", files["ex"], files["ex"]], capsys)[0] == 0
    rc, out, _ = _run(["diff", files["ex"], other], capsys)
    assert rc == 1 and "- program axpy" in out and "+ program prog_a" in out


def test_sign_then_verify_with_the_cli(files: dict, keys: dict, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    signed = tmp_path / "signed.kpack"
    assert _run(["sign", files["ex"], "--key", keys["team"], "-o", signed], capsys)[0] == 0
    rc, out, _ = _run(["verify", signed, "--trusted-key", keys["team.pub"]], capsys)
    assert rc == 0 and "(trusted)" in out
    rc, _, err = _run(["verify", signed, "--trusted-key", keys["other.pub"]], capsys)
    assert rc == 1 and "not trusted" in err
    rc, _, err = _run(["verify", files["ex"], "--trusted-key", keys["team.pub"]], capsys)
    assert rc == 1 and "unsigned" in err
    # the CLI's signature is the API's: same key, same content, same bytes
    assert signed.read_bytes() == kp.save(kp.load(files["ex"]), sign_with=keys["team"])


@pytest.fixture(scope="module")
def arch_pack(tmp_path_factory: pytest.TempPathFactory, axpy: kp.Compiled) -> Path:
    """axpy's cubins relabelled sm_90a and sm_80 (selection reads the manifest alone)."""
    images = {i.target: i for i in axpy.modules[0].images}
    module = kp.Module("axpy", ["axpy"], [dataclasses.replace(images["sm_90"], arch="sm_90a"),
                                          images["sm_80"]])
    path = tmp_path_factory.mktemp("arch") / "arch.kpack"
    kp.save([kp.Compiled(axpy.summary, [module])], path)
    return path


@pytest.mark.parametrize("device, chosen", [("sm_90", "cubin sm_90a"), ("sm_90a", "cubin sm_90a"),
                                            ("sm_89", "cubin sm_80"), ("sm_86", "cubin sm_80"),
                                            ("sm_100", None), ("sm_75", None)])
def test_inspect_device_explains_the_choice(arch_pack: Path, device: str, chosen: str | None,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 4: exact cubin (sm_90a only on 9.0) > same major, lower minor > PTX > none."""
    rc, out, _ = _run(["inspect", arch_pack, "--device", device, "--json"], capsys)
    assert rc == 0
    selection = json.loads(out)["modules"][0]["selection"]
    # a device is a compute capability: sm_90a names the device sm_90 (review 28)
    assert selection["device"] == device.rstrip("af") and selection["chosen"] == chosen
    assert len(selection["reasons"]) == 2  # every image is accounted for
    rc, text, _ = _run(["inspect", arch_pack, "--device", device], capsys)
    assert rc == 0 and (f"loads {chosen}" if chosen else "no usable image") in text


def test_eval_json_is_the_python_plan(files: dict, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["eval", files["ex"], "axpy", "x=1000000", "y=1000000", "a=0.5",
                       "--json"], capsys)
    plan = kp.load(files["ex"])["axpy"].plan(x=(1_000_000,), y=(1_000_000,), a=0.5)
    got = json.loads(out)
    assert rc == 0 and got["variant"] == plan.variant
    assert got["symbols"] == dict(plan.symbols) == {"n": 1_000_000, "n32": 1_000_000}
    assert [tuple(ln["grid"]) for ln in got["launches"]] == [ln.grid for ln in plan.launches]


def test_extract_refuses_overwrite_then_forces(files: dict, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    assert _run(["extract", files["ex"], "-o", out_dir], capsys)[0] == 0
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["axpy.compute_80.ptx", "axpy.sm_80.cubin", "axpy.sm_90.cubin"]
    assert (out_dir / "axpy.compute_80.ptx").read_bytes() == AXPY_PTX.read_bytes()
    rc, _, err = _run(["extract", files["ex"], "-o", out_dir], capsys)
    assert rc == 1 and "--force" in err
    assert _run(["extract", files["ex"], "-o", out_dir, "--force"], capsys)[0] == 0
    rc, _, err = _run(["extract", files["ex"], "-o", tmp_path / "small", "--max-bytes", "1K"],
                      capsys)
    assert rc == 1 and "over the limit of 1024" in err and not (tmp_path / "small").exists()


# ---- README claims -----------------------------------------------------------------------------

def test_readme_variant_count_of_scaled_softmax() -> None:
    m = re.search(r"`kernelpack inspect model\.kpack` then shows (\w+) variants", README)
    assert m, "the README's sentence about scaled_softmax's variants is gone or reworded"
    words = {"seven": 7, "eight": 8, "nine": 9, "ten": 10}

    @kp.fusion
    def scaled_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):  # type: ignore[no-untyped-def]
        z = x * s
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    compiled = kp.compile(scaled_softmax, targets=["sm_80"])
    assert len(compiled.summary.variants) == words.get(m.group(1), -1)
