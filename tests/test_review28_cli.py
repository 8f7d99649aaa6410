"""Review 28 (round 5): the `kernelpack` command against the Python API on the same artifact."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import kernelpack as kp
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar, Scratch,
                                Tensor, Variant)
from kp_cli import run
from kp_samples import axpy, axpy_summary, fake_image, rich

_DTYPES = dict(b=kp.bool_, i8=kp.i8, i16=kp.i16, i32=kp.i32, i64=kp.i64, u8=kp.u8, u16=kp.u16,
               u32=kp.u32, u64=kp.u64, h=kp.f16, bh=kp.bf16, f=kp.f32, d=kp.f64)


def _all_scalars() -> Compiled:
    params = (Tensor("x", kp.f32, ("n",)),) + tuple(Scalar(k, v) for k, v in _DTYPES.items())
    args = (Arg.buffer("x"),) + tuple(Arg.scalar(k) for k in _DTYPES)
    s = KernelSummary("allscalars", params,
                      (Variant((Launch("k", "m", (kp.cdiv("n", 128),), (128,), args),)),))
    return Compiled(s, (Module("m", ("k",), (fake_image("cubin", "sm_80"),)),))


def _bigs() -> Compiled:
    """Two variants, a u64 scalar read by one, computed scalars, a static size, a loop, scratch."""
    n = kp.sym("n")
    params = (Tensor("x", kp.f32, ("n",)), Tensor("w", kp.f16, (16, "n")), Scalar("big", kp.u64),
              Scalar("c8", kp.i8, value=n), Scalar("cu", kp.u64, value=n * 2),
              Tensor("y", kp.f32, (n * 2,), role="out"))
    args = (Arg.buffer("x"), Arg.buffer("w"), Arg.scalar("big"), Arg.scalar("c8"),
            Arg.scalar("cu"), Arg.buffer("y"))
    v0 = Variant((Launch("k", "m", (kp.cdiv("big", 1 << 40) + 1,), (128,), args),),
                 predicate=n < 50)
    v1 = Variant((Launch("k", "m", (n,), (64,), args, count=kp.emin(n, 4), loop="i"),
                  Launch("j", "m", (kp.sym("i") + 1,), (32,), (Arg.buffer("ws"),
                         Arg.of(kp.sym("i"), kp.i32)), count=3, loop="i")),
                 scratch=(Scratch("ws", kp.f64, (n, 3), zero_init=True),))
    s = KernelSummary("bigs", params, (v0, v1))
    return Compiled(s, (Module("m", ("j", "k"), (fake_image("cubin", "sm_80"),)),))


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("r28cli")
    out = {}
    imgs = (fake_image("cubin", "sm_80"), fake_image("cubin", "sm_90", seed=3),
            fake_image("ptx", "sm_80", seed=5))
    s = axpy_summary()
    v = s.variants[0]
    launch = v.launches[0]
    block = dataclasses.replace(s, variants=(dataclasses.replace(
        v, launches=(dataclasses.replace(launch, block=(128,)),)),))
    sig = dataclasses.replace(s, params=(s.params[0], s.params[1], Scalar("a", kp.f64),
                                         s.params[3]))
    sets = {
        "a": [rich(), axpy(), _bigs(), _all_scalars()],
        "order": [rich(), axpy(images=(imgs[1], imgs[2], imgs[0])), _bigs(), _all_scalars()],
        "block": [rich(), Compiled(block, axpy().modules), _bigs(), _all_scalars()],
        "sig": [rich(), Compiled(sig, axpy().modules), _bigs(), _all_scalars()],
        "uni": [axpy(name="σ_prog", module="модуль")],
    }
    for name, programs in sets.items():
        out[name] = str(d / f"{name}.kpack")
        kp.save(programs, out[name])
    return out


def _plan_json(p) -> dict:
    return {"program": p.program, "variant": p.variant, "symbols": dict(p.symbols),
            "computed": dict(p.computed),
            "allocations": [{"name": a.name, "kind": a.kind, "dtype": str(a.dtype.name
                             if hasattr(a.dtype, "name") else a.dtype), "shape": list(a.shape),
                             "nbytes": a.nbytes, "zero_init": a.zero_init}
                            for a in p.allocations.values()],
            "launches": [(l.kernel, l.module, list(l.grid), list(l.block), l.shared_mem)
                         for l in p.launches]}


@pytest.mark.parametrize("program, cli, api", [
    ("rowsum", ["x=4,2000", "m=2000", "scale=1.5"], dict(x=(4, 2000), m=2000, scale=1.5)),
    ("rowsum", ["x=4,20", "m=20", "scale=-inf"], dict(x=(4, 20), m=20, scale=-math.inf)),
    ("bigs", ["x=10", "w=16,10", "big=100"], dict(x=(10,), w=(16, 10), big=100)),
    ("bigs", ["x=0", "w=16,0", "big=9223372036854775807"],
     dict(x=(0,), w=(16, 0), big=2**63 - 1)),
    ("bigs", ["x=60", "w=16,60", "big=1"], dict(x=(60,), w=(16, 60), big=1)),
    ("allscalars", ["x=3", "b=true", "i8=-128", "i16=-1", "i32=-5", "i64=-9223372036854775808",
                    "u8=255", "u16=65535", "u32=4294967295", "u64=18446744073709551615",
                    "h=nan", "bh=1e39", "f=inf", "d=-0.0"],
     dict(x=(3,), b=True, i8=-128, i16=-1, i32=-5, i64=-2**63, u8=255, u16=65535,
          u32=2**32 - 1, u64=2**64 - 1, h=math.nan, bh=1e39, f=math.inf, d=-0.0)),
])
def test_eval_json_is_the_python_plan(art, capsys, program, cli, api) -> None:
    code, out, err = run(capsys, "eval", art["a"], program, *cli, "--json")
    assert (code, err) == (0, "")
    got = json.loads(out)
    plan = kp.load(art["a"])[program].plan(**api)
    want = _plan_json(plan)
    assert (got["program"], got["variant"]) == (want["program"], want["variant"])
    assert got["symbols"] == want["symbols"] and got["computed"] == want["computed"]
    assert [(a["name"], a["kind"], a["shape"], a["nbytes"], a["zero_init"])
            for a in got["allocations"]] == [(a["name"], a["kind"], a["shape"], a["nbytes"],
                                              a["zero_init"]) for a in want["allocations"]]
    assert [(l["kernel"], l["module"], l["grid"], l["block"], l["shared_mem"])
            for l in got["launches"]] == want["launches"]


@pytest.mark.parametrize("program, cli, api", [
    ("bigs", ["x=10", "w=16,10", "big=9223372036854775808"], dict(x=(10,), w=(16, 10), big=2**63)),
    ("bigs", ["x=200", "w=16,200", "big=1"], dict(x=(200,), w=(16, 200), big=1)),
    ("bigs", ["x=10", "w=15,10", "big=1"], dict(x=(10,), w=(15, 10), big=1)),
    ("bigs", ["x=10,1", "w=16,10", "big=1"], dict(x=(10, 1), w=(16, 10), big=1)),
    ("bigs", ["x=10", "w=16,10"], dict(x=(10,), w=(16, 10))),
    ("bigs", ["x=10", "w=16,10", "big=1", "bgi=2"], dict(x=(10,), w=(16, 10), big=1, bgi=2)),
    ("bigs", ["x=10", "w=16,10", "big=-1"], dict(x=(10,), w=(16, 10), big=-1)),
    ("allscalars", ["x=3", "b=2", "i8=0", "i16=0", "i32=0", "i64=0", "u8=0", "u16=0", "u32=0",
                    "u64=0"], dict(x=(3,), b=2, i8=0, i16=0, i32=0, i64=0, u8=0, u16=0, u32=0,
                                   u64=0)),
    ("allscalars", ["x=3", "b=0", "i8=128", "i16=0", "i32=0", "i64=0", "u8=0", "u16=0", "u32=0",
                    "u64=0"], dict(x=(3,), b=0, i8=128, i16=0, i32=0, i64=0, u8=0, u16=0, u32=0,
                                   u64=0)),
])
def test_eval_refuses_what_plan_refuses_with_the_same_words(art, capsys, program, cli,
                                                             api) -> None:
    code, out, err = run(capsys, "eval", art["a"], program, *cli)
    with pytest.raises(Exception) as info:
        kp.load(art["a"])[program].plan(**api)
    assert (code, out) == (1, "") and err.startswith("error: ") and err.count("\n") == 1
    assert "Traceback" not in err
    first = str(info.value).split(" (")[0].split(":")[-1].strip()
    assert first in err


def test_inspect_json_matches_load(art, capsys) -> None:
    code, out, _ = run(capsys, "inspect", art["a"], "--json")
    assert code == 0
    d = json.loads(out)
    pack = kp.load(art["a"])
    assert [p["name"] for p in d["programs"]] == list(pack.programs)
    assert [m["name"] for m in d["modules"]] == list(pack.modules)
    for m in d["modules"]:
        info = pack.modules[m["name"]]
        assert m["kernels"] == list(info.kernels)
        assert len(m["images"]) == len(info.images)
    for p in d["programs"]:
        summary = pack[p["name"]].summary
        assert [q["name"] for q in p["params"]] == [q.name for q in summary.params]
        assert len(p["variants"]) == len(summary.variants)
        assert set(pack[p["name"]].modules) == {l["module"] for v in p["variants"]
                                                for l in v["launches"]}


@pytest.mark.parametrize("other, status, words", [
    ("a", 0, ""), ("order", 0, ""), ("block", 1, "block[0]: 256 -> 128"),
    ("sig", 1, "params[2].dtype: float32 -> float64"),
])
def test_diff_one_program_signature_and_image_order(art, capsys, other, status, words) -> None:
    code, out, err = run(capsys, "diff", art["a"], art[other])
    assert code == status and err == "" and words in out
    if status:
        assert "rowsum" not in out and "bigs" not in out  # only the program that changed


def test_unicode_names_eval_and_inspect(art, capsys) -> None:
    code, out, _ = run(capsys, "eval", art["uni"], "σ_prog", "x=1000", "y=1000", "a=2", "--json")
    assert code == 0 and json.loads(out)["launches"][0]["module"] == "модуль"
    code, out, _ = run(capsys, "inspect", art["uni"])
    assert code == 0 and "модуль" in out and "σ_prog" in out


def test_extract_of_a_unicode_module_says_which_module_each_file_holds(art, capsys,
                                                                       tmp_path) -> None:
    """README: extract writes `<module>.sm_90.cubin`. A module named `модуль` (a valid
    identifier, shown as such by inspect and eval) is written as `______-eb1bb884.sm_80.cubin`,
    and nothing printed links that file to `модуль`: with several such modules nobody can tell
    which file is whose. Either keep the (validated, separator-free) name in the file name or
    name the module on the line that reports the file."""
    code, out, err = run(capsys, "extract", art["uni"], "-o", tmp_path / "x")
    assert code == 0 and err == ""
    names = sorted(p.name for p in (tmp_path / "x").iterdir())
    assert len(names) == 3
    lines = out.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert "модуль" in line, line


def test_extract_into_an_existing_directory_refuses_then_forces(art, capsys, tmp_path) -> None:
    out_dir = tmp_path / "x"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    assert run(capsys, "extract", art["a"], "-o", out_dir)[0] == 0
    code, _, err = run(capsys, "extract", art["a"], "-o", out_dir)
    assert code == 1 and err.count("\n") == 1 and "--force" in err
    assert run(capsys, "extract", art["a"], "-o", out_dir, "--force")[0] == 0
    assert (out_dir / "keep.txt").read_text() == "mine"
