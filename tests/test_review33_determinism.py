"""Review 33, determinism and reproducibility (a release engineer's view).

A fleet compares artifacts built in CI by digest, and a build farm builds the same kernels on
many machines and expects the same bytes and the same cache keys. These tests vary, between
fresh processes, what must not matter (hash seed, working directory, locale, time zone, umask,
HOME (a cold nvJitLink compute cache), TMPDIR, unrelated environment variables, the order in
which fusions are compiled and saved, the file and module name the fusions live in, unrelated
globals, the time) and check that the bytes, the cache keys and the inspection output stay the
same; that keys do change with what changes the code; that nothing host-specific (paths, host
name, user, pid) lands in an artifact or a cache entry; and that re-saving or splitting an
artifact reproduces what building gives.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import kernelpack as kp

ROOT = Path(__file__).resolve().parents[1]
PTX = ROOT / "examples" / "axpy.ptx"
KP = [sys.executable, "-m", "kernelpack"]

FUSIONS = '''
import kernelpack as kp

SCALE = 0.5


@kp.fusion
def gelu(x: kp.Tensor[kp.f32, "n"]):
    return SCALE * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


@kp.fusion
def rowsum(x: kp.Tensor[kp.f32, "b", "n"]):
    return x.sum(axis=1)


@kp.fusion
def norm(x: kp.Tensor[kp.f32, "b", "n"], w: kp.Tensor[kp.f32, "n"], s: kp.f32):
    m = x.mean(axis=1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=1, keepdims=True)
    y = (x - m) * kp.rsqrt(v + 1e-5) * w * s
    return y, v
'''

# One fresh interpreter: compile the fusions of cfg["src"] (imported under cfg["modname"]) in
# cfg["order"], add an external PTX program, save, and report digests and keys.
CHILD = r'''
import hashlib, importlib.util, json, os, sys
cfg = json.loads(sys.argv[1])
os.umask(int(cfg["umask"], 8))
unrelated = {"k%d" % i: [i] * i for i in range(cfg["junk"])}
import kernelpack as kp
from kernelpack.compile_entry import fusion_key
spec = importlib.util.spec_from_file_location(cfg["modname"], cfg["src"])
mod = importlib.util.module_from_spec(spec)
sys.modules[cfg["modname"]] = mod
spec.loader.exec_module(mod)
progs = [kp.compile(getattr(mod, n), targets=cfg["targets"]) for n in cfg["order"]]
progs.append(kp.external(
    "axpy", "axpy",
    params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
    grid=kp.cdiv("n", 256), block=256, ptx=cfg["ptx"], targets=cfg["targets"]))
if cfg["reverse_save"]:
    progs = progs[::-1]
data = kp.save(progs)
kp.save(progs, cfg["out"])
keys = {n: fusion_key(getattr(mod, n), cfg["targets"], None, {}).digest for n in cfg["order"]}
print(json.dumps({"sha": hashlib.sha256(data).hexdigest(), "keys": keys, "pid": os.getpid(),
                  "kernels": sorted((m.name, m.kernels) for c in progs for m in c.modules)}))
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KERNELPACK_", "PYTHONHASHSEED", "LC_", "LANG", "TZ"))}
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def _host_facts(tmp: Path) -> list[str]:
    """Strings that must never appear in an artifact or a cache entry (long enough that they
    cannot occur by chance in compressed or machine code bytes)."""
    facts = [str(tmp), str(tmp.resolve())]
    for fact in (socket.gethostname(), getpass.getuser()):
        if len(fact) >= 6:
            facts.append(fact)
    return facts


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    """The same fusions and external PTX built in two fresh processes that differ in everything
    that must not matter."""
    tmp = tmp_path_factory.mktemp("two_builds")
    a_dir = tmp / "a"
    b_dir = tmp / "b" / "deep" / "er"
    for d in (a_dir, b_dir, tmp / "home1", tmp / "home2", tmp / "tmp1", tmp / "tmp2"):
        d.mkdir(parents=True)
    (a_dir / "kernels.py").write_text(FUSIONS)
    # another file and module name, other line numbers, comments, unrelated globals
    (b_dir / "zz_other_name.py").write_text(
        "# a build farm's copy\nimport os\nUNRELATED = {'z', 'a', 'q'}\n\n\n" + FUSIONS
        + "\nMORE = [object() for _ in range(7)]\n")
    (b_dir / "kernel.ptx").write_bytes(PTX.read_bytes())
    order = ["gelu", "rowsum", "norm"]
    runs = []
    cfgs = [
        (a_dir, dict(src=str(a_dir / "kernels.py"), modname="kernels", order=order,
                     targets=["sm_80", "ptx"], ptx=str(PTX), umask="022", junk=0,
                     reverse_save=False, out=str(a_dir / "out.kpack")),
         _env(PYTHONHASHSEED="1", LC_ALL="C", TZ="UTC", HOME=str(tmp / "home1"),
              TMPDIR=str(tmp / "tmp1"))),
        (b_dir, dict(src="zz_other_name.py", modname="farm.pkg.zz_other_name",
                     order=order[::-1], targets=["ptx", "sm_80"], ptx="kernel.ptx",
                     umask="077", junk=5000, reverse_save=True, out="out.kpack"),
         _env(PYTHONHASHSEED="31337", LC_ALL="C.UTF-8", LANG="C.UTF-8",
              TZ="Asia/Kathmandu", HOME=str(tmp / "home2"), TMPDIR=str(tmp / "tmp2"),
              SOME_UNRELATED_VAR="1", CUDA_CACHE_DISABLE="1")),
    ]
    for cwd, cfg, env in cfgs:
        out = _run([sys.executable, "-c", CHILD, json.dumps(cfg)], cwd, env)
        runs.append(json.loads(out.splitlines()[-1]))
    return tmp, runs, a_dir / "out.kpack", b_dir / "out.kpack"


def test_same_inputs_give_the_same_bytes_and_keys_in_fresh_processes(two_builds):
    _, (one, two), path_one, path_two = two_builds
    assert one["pid"] != two["pid"]
    assert one["sha"] == two["sha"]
    assert one["keys"] == two["keys"]
    assert one["kernels"] == two["kernels"]
    data = path_one.read_bytes()
    assert hashlib.sha256(data).hexdigest() == one["sha"]
    assert path_two.read_bytes() == data
    # the artifact's kernel names and module/image order are what the format says: sorted
    pack = kp.load(data)
    assert pack.programs == ["axpy", "gelu", "norm", "rowsum"]
    assert list(pack.modules) == sorted(pack.modules)


def test_no_host_facts_in_the_artifact_or_its_images(two_builds, tmp_path):
    tmp, _, path_one, _ = two_builds
    data = path_one.read_bytes()
    out = tmp_path / "images"
    _run(KP + ["extract", str(path_one), "-o", str(out)], tmp_path, _env())
    blobs = [data] + [p.read_bytes() for p in sorted(out.iterdir())]
    assert len(blobs) >= 5
    for fact in _host_facts(tmp) + ["zz_other_name", "kernels.py", "kernel.ptx"]:
        for blob in blobs:
            found = fact.encode() in blob
            assert not found, fact
    text = _run(KP + ["inspect", "--json", str(path_one)], tmp_path, _env())
    for fact in _host_facts(tmp):
        assert fact not in text, fact


def test_inspect_and_eval_json_are_the_same_in_other_processes(two_builds, tmp_path):
    tmp, _, path_one, _ = two_builds
    rel = os.path.relpath(path_one, tmp)
    outputs = set()
    for i, (cwd, env) in enumerate([
            (tmp_path, _env(PYTHONHASHSEED="0", TZ="UTC", LC_ALL="C")),
            (tmp, _env(PYTHONHASHSEED="987", TZ="America/St_Johns", LC_ALL="C.UTF-8"))]):
        path = str(path_one) if i == 0 else rel
        inspect = _run(KP + ["inspect", "--json", path], cwd, env)
        plan = _run(KP + ["eval", path, "norm", "x=7,300", "w=300", "s=0.5", "--json"],
                    cwd, env)
        outputs.add((inspect, plan))
        json.loads(inspect)
        assert str(tmp) not in inspect
    assert len(outputs) == 1


def test_resave_and_order_reproduce_the_bytes(two_builds, tmp_path):
    _, _, path_one, _ = two_builds
    data = path_one.read_bytes()
    pack = kp.load(data)
    assert kp.save(pack) == data
    assert kp.save([pack[n] for n in reversed(pack.programs)]) == data
    assert kp.save([pack.compiled(n) for n in pack.programs]) == data
    # bytes no reader uses (after the last object) do not survive a re-save
    assert kp.save(kp.load(data + bytes(64))) == data
    _run(KP + ["keygen", "-o", str(tmp_path / "team")], tmp_path, _env())
    key = str(tmp_path / "team")
    signed = kp.save(pack, sign_with=key)
    assert signed != data
    # documented: re-saving a signed pack without sign_with is unsigned; signing the same
    # content with the same key gives the same bytes again (ed25519 is deterministic)
    assert kp.save(kp.load(signed)) == data
    assert kp.save(kp.load(signed), sign_with=key) == signed
    (tmp_path / "u.kpack").write_bytes(data)
    _run(KP + ["sign", str(tmp_path / "u.kpack"), "--key", key, "-o",
               str(tmp_path / "s.kpack")], tmp_path, _env())
    assert (tmp_path / "s.kpack").read_bytes() == signed


def test_cache_keys_change_exactly_when_the_code_can(tmp_path):
    from kernelpack.compile_entry import fusion_key

    def key(f, targets=("sm_80",), static=None, **options):
        return fusion_key(f, list(targets), static, options).digest

    def make(const=0.5, dtype=kp.f32, name="scaled"):
        @kp.fusion(name=name)
        def f(x: kp.Tensor[dtype, "b", "n"]):
            return (x * const).sum(axis=1)
        return f

    base = make()
    k = key(base)
    # same code: another function object, targets order and duplicates, default options
    assert key(make()) == k
    assert key(base, targets=("sm_80", "sm_80")) == k
    assert key(base, opt=3) == k
    two = key(base, targets=("sm_80", "sm_90", "ptx"))
    assert key(base, targets=("ptx", "sm_90", "sm_80")) == two
    # anything that changes the code or the summary changes the key
    changed = {
        "constant": key(make(0.25)),
        "zero": key(make(0.0)),
        "negative zero": key(make(-0.0)),  # x * 0.0 and x * -0.0 differ for x = -1
        "dtype": key(make(dtype=kp.f64)),
        "name": key(make(name="other")),
        "targets": two,
        "opt": key(base, opt=2),
        "static": key(base, static={"n": 1024}),
        "static value": key(base, static={"n": 2048}),
    }
    assert len(set(changed.values()) | {k}) == len(changed) + 1, changed
    # the key kp.compile files its cache entry under is this key
    cache = kp.Cache(tmp_path / "cache", remote=False)
    kp.compile(base, targets=["sm_80"], cache=cache)
    entries = json.loads(_run(KP + ["cache", "ls", "--dir", str(tmp_path / "cache"),
                                    "--json"], tmp_path, _env()))
    assert [e["key"] for e in entries] == [k]


def test_cache_entries_and_key_records_hold_no_host_facts(tmp_path):
    """Two processes with different hash seeds, cwd, TZ and HOME compile through one disk
    cache: the second hits; every file of the cache holds no path, host name, user or pid,
    and `cache explain --json` is the same in both."""
    src = tmp_path / "src" / "kern.py"
    src.parent.mkdir()
    src.write_text(FUSIONS)
    cache = tmp_path / "cache"
    script = (
        "import importlib.util, json, os, sys, kernelpack as kp\n"
        "spec = importlib.util.spec_from_file_location('kern', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "c = kp.Cache(sys.argv[2], remote=False)\n"
        "r = kp.compile(m.rowsum, targets=['sm_80'], cache=c)\n"
        "print(json.dumps({'origin': r.origin, 'pid': os.getpid()}))\n")
    runs = []
    for i, (cwd, env) in enumerate([
            (src.parent, _env(PYTHONHASHSEED="3", TZ="UTC", HOME=str(tmp_path))),
            (tmp_path, _env(PYTHONHASHSEED="77", TZ="Pacific/Chatham", LC_ALL="C"))]):
        runs.append(json.loads(_run([sys.executable, "-c", script, str(src), str(cache)],
                                    cwd, env).splitlines()[-1]))
    assert [r["origin"] for r in runs] == ["compiled", "disk"]
    files = [p for p in cache.rglob("*") if p.is_file() and "locks" not in p.parts]
    assert any(p.suffix == ".kpack" for p in files) and any(p.suffix == ".json" for p in files)
    for p in files:
        blob = p.read_bytes()
        for fact in _host_facts(tmp_path):
            found = fact.encode() in blob
            assert not found, (str(p), fact)
        if p.suffix == ".json":
            names = re.findall(rb'"([A-Za-z_]+)"\s*:', blob)
            assert names and not [n for n in names if re.search(
                rb"pid|host|user|time|date|path|cwd|dir", n, re.IGNORECASE)], names
    key = next(p.stem for p in files if p.suffix == ".kpack")
    explains = {_run(KP + ["cache", "explain", key, "--dir", str(cache), "--json"], cwd,
                     _env(PYTHONHASHSEED=seed, TZ=tz))
                for cwd, seed, tz in ((tmp_path, "5", "UTC"), (src.parent, "6", "Asia/Tokyo"))}
    assert len(explains) == 1
    assert str(tmp_path) not in explains.pop()


def test_kernelpack_build_by_path_or_module_name_gives_the_same_bytes(tmp_path):
    pkg = tmp_path / "proj" / "mykernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fused.py").write_text(FUSIONS)
    other = tmp_path / "elsewhere"
    other.mkdir()
    _run(KP + ["build", "mykernels.fused", "gelu", "rowsum", "-o", str(tmp_path / "m.kpack"),
               "--targets", "sm_80", "-q"], tmp_path / "proj", _env(PYTHONHASHSEED="2"))
    _run(KP + ["build", str(pkg / "fused.py"), "rowsum", "gelu", "-o", "p.kpack",
               "--targets", "sm_80", "-q"], other, _env(PYTHONHASHSEED="8", TZ="UTC"))
    assert (tmp_path / "m.kpack").read_bytes() == (other / "p.kpack").read_bytes()


# ---- findings ----------------------------------------------------------------------------------

CUDA_SRC = r"""
#include "defs.h"
extern "C" __global__ void scale(float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = times(x[i], a);
}
"""

DEFS_H = "__device__ __forceinline__ float times(float v, float a) { return v * a; }\n"

NVRTC_CHILD = r"""
import hashlib, json, sys
import kernelpack as kp
try:
    c = kp.external("scale_f32", "scale",
                    params=[kp.Tensor("x", kp.f32, ["n"], role="inout"), kp.Scalar("a", kp.f32),
                            kp.Scalar("n32", kp.u32, value="n")],
                    grid=kp.cdiv("n", 256), block=256, cuda=sys.argv[1],
                    nvrtc_options=sys.argv[2:], targets=["sm_80", "ptx"])
except ValueError as e:
    print(json.dumps({"refused": str(e)}))
else:
    data = kp.save([c])
    print(json.dumps({"sha": hashlib.sha256(data).hexdigest(), "hex": data.hex()}))
"""


@pytest.mark.parametrize("option", ["-DUNUSED=1", "--use_fast_math"])
def test_nvrtc_bytes_do_not_depend_on_the_checkout_directory(tmp_path, option):
    """`kp.external(cuda=...)`: "NVRTC's search of the current directory is switched off, so
    the bytes do not depend on where the call runs". The same call (the same source, the same
    relative `-Iinclude` holding the same header) from two checkouts gives the same bytes, and
    no image holds either checkout's path.

    The review found the exception: with `-lineinfo` or `-G` NVRTC writes the included
    files' absolute paths (and for `-G` the working directory) into the debug information, so
    those bytes differ between checkouts. Decided: documented (README, ``kp.external``), not
    changed; NVRTC has no option to map those paths."""
    results = []
    for sub in ("checkout_one", "another/checkout_two"):
        cwd = tmp_path / sub
        (cwd / "include").mkdir(parents=True)
        (cwd / "include" / "defs.h").write_text(DEFS_H)
        out = _run([sys.executable, "-c", NVRTC_CHILD, CUDA_SRC, "-Iinclude", option], cwd,
                   _env())
        results.append((cwd, json.loads(out.splitlines()[-1])))
    (_, one), (_, two) = results
    for cwd, res in results:
        assert "hex" in res, res
        art = tmp_path / "art.kpack"
        art.write_bytes(bytes.fromhex(res["hex"]))
        out = tmp_path / ("img_" + cwd.name)
        _run(KP + ["extract", str(art), "-o", str(out)], tmp_path, _env())
        for img in sorted(out.iterdir()):
            found = str(cwd).encode() in img.read_bytes()
            assert not found, f"{img.name} holds the directory {cwd} of its build"
    assert one["sha"] == two["sha"]


SHARED_PTX = r'''
.version 8.0
.target sm_80
.address_size 64

.visible .entry k_one(
	.param .u64 p0,
	.param .u32 n
)
{
	ret;
}

.visible .entry k_two(
	.param .u64 p0,
	.param .u32 n
)
{
	ret;
}
'''


def test_program_split_from_a_shared_module_saves_like_the_program_alone(tmp_path):
    """Two kp.external programs of one PTX source share `module="shared"` (documented: stored
    once, kernel entries merged). Splitting the combined artifact - `kp.save(pack["one"])`, as
    a release job that ships per-program artifacts does - must reproduce the artifact that
    `kp.save([one])` gives. It keeps the other program's kernel entry in the module instead:
    other bytes, and `kernelpack diff` reports the kernels as changed."""
    def mk(name: str, entry: str) -> kp.Compiled:
        return kp.external(name, entry,
                           params=[kp.Tensor("x", kp.f32, ["n"], role="inout"),
                                   kp.Scalar("n32", kp.u32, value="n")],
                           grid=kp.cdiv("n", 256), block=256, ptx=SHARED_PTX,
                           targets=["sm_80"], module="shared")

    one, two = mk("one", "k_one"), mk("two", "k_two")
    both = kp.load(kp.save([one, two]))
    assert both.modules["shared"].kernels == ("k_one", "k_two")
    alone = kp.save([one])
    split = kp.save([both["one"]])
    assert kp.load(split)["one"].summary == kp.load(alone)["one"].summary
    (tmp_path / "alone.kpack").write_bytes(alone)
    (tmp_path / "split.kpack").write_bytes(split)
    diff = subprocess.run(KP + ["diff", str(tmp_path / "alone.kpack"),
                                str(tmp_path / "split.kpack")],
                          capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert split == alone
