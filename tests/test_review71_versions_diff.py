"""Review 71: the public API black-box on Python 3.11 against 3.14.10 (and 3.15.2), at d1bbcca.

The same scripts (PYTHONHASHSEED=0, fixed paths) ran under the main venv (3.11.7) and
/tmp/kernelpack-py3.14's (3.14.10; /tmp/kernelpack-py3.15's 3.15.2 for most), outputs diffed.

Compared and found identical (kernelpack's own output, types, messages and exit codes):
- kp.save bytes (2 fusions, 3 targets, static dims; signed with a fixed key), cache key
  digests and parts, the disk cache's tree (names, modes), repr/str of KernelSummary, Tensor,
  Scalar, Variant, Launch, Arg, Image, Module, Compiled, Expr, Pack, Program, ModuleInfo,
  ImageInfo, SignatureInfo, CacheKey, Cache, Plan (program.plan for several shapes).
- The CLI's stdout, stderr and exit codes for ~60 invocations of inspect (--json, --device,
  --driver), verify, extract, eval, diff, keygen, sign and cache ls/stats/prune/clear/explain,
  bad files (missing, truncated, flipped, text, empty, a directory) and /dev/full included.
- ~120 bad inputs across plan, load (truncations, flips, trusted_keys), save, sign_with,
  kp.Cache, expressions, the data model's constructors, compile, fusion and external: the same
  exception type and text on every version.
- pickle (protocols 2, 4, 5), copy, deepcopy, dataclasses.replace/asdict/astuple/fields, hash,
  eq, weakrefs and ``__match_args__`` of the data model; the refusals of Pack, Program,
  ModuleInfo, ImageInfo and Cache; pickles made by each interpreter load equal (and hash equal)
  in the other; exceptions pickle with their ``log``/``reason``/notes.
- An artifact written by either loads and plans the same in the other (bytes are identical);
  a kp.Cache directory filled by one is hit by the other (origin "disk", lowering not
  imported), `kernelpack cache` reads it the same from both; the codegen digest of a zip
  install is the same on all three.
- File descriptors of mmapped (> 1 MiB) packs: a dropped pack closes its two at once, a pack in
  a cycle at gc.collect(), 1000 loads and drops stay at <= 2; threads loading/planning and
  threads compiling through one kp.Cache (each key compiled once, the rest disk hits).
- Warnings' category, text and attributed line (CacheWarning, external's width UserWarning),
  inspect.signature of the public API, threads planning on one Program.

Differences, all language changes (no kernelpack bug found):
- argparse: 3.13's help layout (``-o, --output DIR`` for ``-o DIR, --output DIR``), 3.14's
  "maybe you meant 'inspect'?" on a mistyped command, colored help/usage under FORCE_COLOR;
  kernelpack's own "error: ..." lines and exit codes do not change. Nothing in tests/ or the
  README depends on the layout (the test below accepts both).
- Python's own words: 3.14's "Did you mean 'shape'?" for an unknown keyword, "and no __dict__
  for setting new attributes", 3.12+'s "unhashable type: 'dict'" for a Plan (was
  'mappingproxy'), 3.13's docstring dedent, ``X | Y`` for Union in get_type_hints, NamedTuple
  signatures without ForwardRef, ``__dataclass_params__``'s longer repr.
- 3.13+: ``copy.replace`` works on the data model and Plan (through ``__init__``'s checks;
  tested below), and refuses Expr, Pack, Program, Fusion, Cache with Python's TypeError.
- hash(None) is a constant from 3.12: an Expr node's hash (``hash((op, args, None))``) now
  depends on PYTHONHASHSEED alone, while on 3.11 it changes with every process (ASLR). Nothing
  persists it: Expr pickles by structure, artifacts and keys do not depend on it.
Same on every version, noted: an exception kept from ``pack.verify()`` or a failed lazy
decode keeps its pack's two descriptors (the traceback holds the pack; review 39 cleared only
failed loads' frames); ``pack.compiled(name, origin="bogus")`` was accepted (a ValueError
since session 57, tests/test_compiled.py); the first key in a
cache root that does not exist yet writes no ``meta/digests.json`` (by design).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import hashlib
import json
import os
import pickle
import subprocess
import sys
import threading

import pytest

import kernelpack as kp
from kernelpack.summary import Constraint, Image, Launch, Scalar, Tensor

HERE = os.path.dirname(os.path.abspath(__file__))
PY311 = "/work/main/.venv/bin/python"
PY314 = "/tmp/kernelpack-py3.14/.venv/bin/python"
OTHER = PY311 if sys.version_info >= (3, 14) else PY314
needs_other = pytest.mark.skipif(not os.path.exists(PY314) or not os.path.exists(OTHER),
                                 reason=f"needs a second interpreter ({PY314} and {PY311}): "
                                        f"CI has Python 3.11 alone")
KEY = bytes(range(1, 33))  # a fixed ed25519 private key: signed bytes are deterministic

# The fusions both interpreters compile: one source, exec'd here and in the other process.
FUSIONS = '''
import kernelpack as kp

@kp.fusion(name="r71_softmax")
def softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

@kp.fusion(name="r71_addsum")
def addsum(x: kp.Tensor[kp.f16, "n"], y: kp.Tensor[kp.f16, "n"], a: kp.f16):
    return (x + y) * a, x.sum()
'''


def fusions(tag: str = "") -> dict:
    ns: dict = {}
    exec(compile(FUSIONS.replace("r71_", f"r71{tag}_"), "<r71 fusions>", "exec"), ns)
    return ns


def other(tmp_path, script: str, *args: str) -> dict:
    """Run ``script`` under the other interpreter, importing this checkout's kernelpack (not
    the other venv's own tree, which may be older: its keys and bytes would differ); its last
    stdout line is JSON."""
    path = tmp_path / "other_script.py"
    path.write_text(f"FUSIONS = {FUSIONS!r}\n"
                    f"import kernelpack as _kp\nassert _kp.__file__ == {kp.__file__!r}, "
                    f"_kp.__file__\n" + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(kp.__file__))  # this tree's src
    done = subprocess.run([OTHER, str(path), *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built():
    ns = fusions()
    c1 = kp.compile(ns["softmax"], targets=["sm_80", "sm_90", "ptx"])
    c2 = kp.compile(ns["addsum"], targets=["sm_90"], static={"n": 1000})
    return c1, kp.save([c1, c2], sign_with=KEY)


# --- object protocols ---------------------------------------------------------------------

REPLACERS = [dataclasses.replace] + ([copy.replace] if hasattr(copy, "replace") else [])


@pytest.mark.parametrize("replace", REPLACERS, ids=lambda f: f.__module__)
def test_replace_goes_through_the_constructors_checks(built, replace):
    c1, _ = built
    t = c1.summary.params[0]
    with pytest.raises(ValueError, match=r"tensor 'x': role must be one of .* \(got 'bogus'\)"):
        replace(t, role="bogus")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        replace(t, bogus=1)
    with pytest.raises(ValueError, match="program name must be an identifier"):
        replace(c1.summary, name="1bad")
    y = replace(t, name="y")
    assert (y.name, y.dtype, y.shape, y.role) == ("y", t.dtype, t.shape, t.role)
    assert replace(c1.summary) == c1.summary and hash(replace(c1.summary)) == hash(c1.summary)
    hit = replace(c1, origin="disk")  # origin is provenance only: equal, same hash
    assert hit.origin == "disk" and replace(hit).origin == "disk"
    assert hit == c1 and hash(hit) == hash(c1)


def test_match_args_patterns(built):
    c1, _ = built

    def kind(o):
        match o:
            case Tensor(name, dtype, shape, role):
                return ("tensor", name, dtype.name, len(shape), role)
            case Scalar(name, dtype, value):
                return ("scalar", name, dtype.name, value)
            case Launch(kernel, module, grid, block):
                return ("launch", kernel, module, len(grid), len(block))
            case Image(kind, arch):
                return ("image", kind, str(arch))
            case Constraint(expr, message):
                return ("constraint", str(expr), message)
        return None

    s = c1.summary
    assert kind(s.params[0]) == ("tensor", "x", "float32", 2, "in")
    assert kind(s.params[1]) == ("scalar", "s", "float32", None)
    assert kind(s.variants[0].launches[0])[2:] == ("r71_softmax", 3, 3)
    assert kind(c1.modules[0].images[0]) == ("image", "cubin", "sm_80")
    assert kind(Constraint(kp.sym("n") < 5, "small")) == ("constraint", "n < 5", "small")


def _model(c1, plan):
    s = c1.summary
    return dict(summary=s, tensor=s.params[0], scalar=s.params[1], launch=s.variants[0].launches[0],
                arg=s.variants[0].launches[0].args[0], image=c1.modules[0].images[0],
                module=c1.modules[0], compiled=c1, expr=kp.cdiv(kp.sym("n") * 3, 256),
                dtype=kp.bf16, plan=plan, constraint=Constraint(kp.sym("n") < 5, "small"))


@pytest.mark.parametrize("proto", [2, 4, 5])
def test_data_model_pickles_copies_and_hashes(built, proto):
    c1, data = built
    plan = kp.load(data)["r71_softmax"].plan(x=(3, 70000), s=0.5)
    for name, o in _model(c1, plan).items():
        for back in (pickle.loads(pickle.dumps(o, proto)), copy.copy(o), copy.deepcopy(o)):
            assert type(back) is type(o) and back == o and repr(back) == repr(o), name
            if name != "plan":  # a Plan holds mappingproxies: unhashable on every version
                assert hash(back) == hash(o), name


@pytest.mark.parametrize("what, words", [
    ("pack", "a loaded Pack cannot be pickled or copied"),
    ("program", "a loaded Program ('r71_softmax') cannot be pickled or copied"),
    ("modinfo", "a loaded ModuleInfo ('r71_softmax') cannot be pickled or copied"),
    ("imginfo", "a loaded image ('r71_softmax' cubin sm_80) cannot be pickled or copied"),
    ("cache", "a kp.Cache cannot be pickled or copied")])
def test_loaded_objects_refuse_pickle_and_copy(built, tmp_path, what, words):
    pack = kp.load(built[1])
    o = {"pack": pack, "program": pack["r71_softmax"],
         "modinfo": pack.modules["r71_softmax"], "imginfo": pack.modules["r71_softmax"].images[0],
         "cache": kp.Cache(tmp_path, remote=False)}[what]
    for attempt in (lambda: pickle.dumps(o, 5), lambda: copy.copy(o), lambda: copy.deepcopy(o)):
        with pytest.raises(TypeError, match=words.replace("(", r"\(").replace(")", r"\)")):
            attempt()


def test_expr_pickled_under_another_hash_seed_is_equal_here():
    """Expr pickles by structure: its cached hash (of str, and of None on 3.11) is made again."""
    code = ("import pickle, sys, kernelpack as kp; n = kp.sym('n'); "
            "sys.stdout.buffer.write(pickle.dumps([kp.select(n < 3, kp.cdiv(n, 7), n), "
            "kp.sym('n'), kp.emin(n, 1024)], 5))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                          check=True, timeout=60).stdout
    n = kp.sym("n")
    mine = [kp.select(n < 3, kp.cdiv(n, 7), n), n, kp.emin(n, 1024)]
    theirs = pickle.loads(blob)
    assert theirs == mine and [hash(e) for e in theirs] == [hash(e) for e in mine]
    assert set(theirs) == set(mine)


# --- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes, error, words", [
    (dict(x=(4,)), kp.RankError, r"x has rank 1 \(shape \(4,\)\), expected rank 2"),
    (dict(x=(4, -8)), kp.ConstraintError, r"x.shape\[1\] is -8, a negative size"),
    (dict(x=(4, 8.0)), TypeError, r"x.shape\[1\] must be an integer \(got 8.0\)"),
    (dict(x=(4, True)), TypeError, r"x.shape\[1\] must be an integer \(got True\)"),
    (dict(x=None), TypeError, r"tensor x must be a shape tuple or have .shape \(got None\)"),
    (dict(x=(2**63, 1)), kp.ConstraintError, r"x.shape\[0\] is 9223372036854775808, outside int64"),
    (dict(x=(4, 8), t=3), TypeError, r"has no input 't' \(inputs: \['x', 's'\]\)"),
    (dict(), TypeError, r"missing input\(s\) \['x'\]")])
def test_plan_errors_name_the_parameter(built, shapes, error, words):
    with pytest.raises(error, match=words):
        kp.load(built[1])["r71_softmax"].plan(**shapes, s=0.5)


def test_corrupt_artifacts_are_kernelpack_errors_naming_the_part(built):
    data = built[1]
    cases = {8: r"^file: root table: 4 bytes at offset \d+ run past the end of the 8-byte buffer$",
             1000: r"^file: Pack.body: \d+ bytes at offset \d+ run past the end of the 1000-byte "}
    for n, words in cases.items():
        with pytest.raises(kp.FormatError, match=words):
            kp.load(data[:n])
    flipped = bytearray(data)
    flipped[4] ^= 0x55
    with pytest.raises(kp.FormatError, match=r"file identifier: expected b'KPAK'"):
        kp.load(bytes(flipped))
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x55
    with pytest.raises(kp.IntegrityError, match=r"stored bytes do not match their digest"):
        kp.load(bytes(flipped)).verify()


def test_signature_errors_name_both_keys(built):
    from kernelpack import signing
    pub = signing.public_key_bytes(KEY)
    wrong = signing.public_key_bytes(bytes(range(2, 34)))
    assert signing.key_id(pub) == "65b60673d6ed884b"
    with pytest.raises(kp.SignatureError, match=r"signed by key 65b60673d6ed884b, which is not "
                                                r"trusted \(trusted: 947561e3eb43b38b\)"):
        kp.load(built[1], trusted_keys=[wrong])
    sig = kp.load(built[1], trusted_keys=[wrong, pub]).signature
    assert sig.verified and pickle.loads(pickle.dumps(sig)) == sig
    assert kp.save(kp.load(built[1]), sign_with=KEY.hex()) == built[1]  # deterministic


# --- descriptors, GC, threads -------------------------------------------------------------

def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_mmapped_packs_close_their_descriptors(tmp_path):
    sys.path.insert(0, HERE)
    try:
        from kp_samples import _noise
    finally:
        sys.path.remove(HERE)
    s = kp.KernelSummary("t", (Tensor("x", kp.f32, ("n",)),), (kp.Variant((Launch(
        "k", "m", (kp.cdiv("n", 128),), (128,), (kp.Arg.buffer("x"),)),)),))
    big = str(tmp_path / "big.kpack")  # over 1 MiB: memory-mapped, images read by pread
    kp.save(kp.Compiled(s, (kp.Module("m", ("k",), (Image("cubin", "sm_80", _noise(3 << 20),
                                                          "t", 12080),)),)), big)
    gc.collect()
    base = _fds()
    pack = kp.load(big)
    assert _fds() - base == 2
    del pack  # no gc.collect(): reference counting alone closes them
    assert _fds() == base
    pack = kp.load(big)
    loop = [pack]
    loop.append(loop)
    del pack, loop
    gc.collect()
    assert _fds() == base
    most = 0
    for i in range(300):
        p = kp.load(big)
        p["t"].plan(x=(i + 1,))
        if i % 3 == 0:
            p.modules["m"].images[0]
        most = max(most, _fds() - base)
    del p
    assert most <= 2 and _fds() == base


def test_threads_compile_through_one_cache_once_per_key(tmp_path):
    def scaled(k):
        def g(x: kp.Tensor[kp.f32, "n"]):
            return x * k + 1
        return kp.fusion(name=f"r71_thread{k}")(g)

    fs = [scaled(2), scaled(3)]
    cache = kp.Cache(tmp_path / "c", remote=False)
    origins, errors, barrier = [], [], threading.Barrier(4)

    def work():
        try:
            barrier.wait()
            for f in fs:
                origins.append((f.name, kp.compile(f, targets=["sm_90"], cache=cache).origin))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads], [t.join() for t in threads]
    assert errors == []
    assert sorted(origins) == sorted([(f.name, "compiled") for f in fs]
                                     + [(f.name, "disk") for f in fs for _ in range(3)])
    stats = cache.stats()
    assert (stats["compiles"], stats["disk_hits"], stats["puts"]) == (2, 6, 2)


# --- the CLI ------------------------------------------------------------------------------

def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHON_COLORS")}
    return subprocess.run([sys.executable, "-m", "kernelpack", *args], capture_output=True,
                          text=True, cwd=cwd, env=dict(env, COLUMNS="100"), timeout=60)


def test_cli_errors_exit_codes_and_help_whatever_argparse_version(built, tmp_path):
    (tmp_path / "trunc.kpack").write_bytes(built[1][:1000])
    r = _cli("inspect", "trunc.kpack", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("error: trunc.kpack: Pack.body: %s bytes at offset %s run past the end "
                        "of the 1000-byte buffer\n" % tuple(r.stderr.split()[3:8:4]))
    r = _cli("verify", "trunc.kpack", "--trusted-key", "none.pub", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (1, "error: none.pub: no such public key file\n")
    r = _cli("inspect", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "kernelpack inspect: error: the following arguments are required: file")
    r = _cli("extract", "--help", cwd=tmp_path)
    assert r.returncode == 0
    # 3.11-3.12: "-o DIR, --output DIR"; 3.13+: "-o, --output DIR" (argparse's own layout)
    assert ("-o DIR, --output DIR" in r.stdout) != ("-o, --output DIR" in r.stdout)
    assert "refuse to write more than this in total (default 4G" in r.stdout


# --- across interpreters ------------------------------------------------------------------

OTHER_BUILD = r'''
import hashlib, json, pickle, subprocess, sys
import kernelpack as kp
ns = {}
exec(compile(FUSIONS, "<r71 fusions>", "exec"), ns)
c1 = kp.compile(ns["softmax"], targets=["sm_80", "sm_90", "ptx"])
c2 = kp.compile(ns["addsum"], targets=["sm_90"], static={"n": 1000})
data = kp.save([c1, c2], sign_with=bytes(range(1, 33)))
theirs = open(sys.argv[1], "rb").read()
plan = kp.load(theirs)["r71_softmax"].plan(x=(3, 70000), s=0.5)
inspect = subprocess.run([sys.executable, "-m", "kernelpack", "inspect", "--json", sys.argv[1]],
                         capture_output=True, text=True)
mine = pickle.load(open(sys.argv[2], "rb"))
pickle.dump([c1, c1.summary, kp.cdiv(kp.sym("n") * 3, 256), plan], open("theirs.p", "wb"), 4)
print(json.dumps({"sha": hashlib.sha256(data).hexdigest(), "plan": repr(plan),
                  "inspect": [inspect.returncode, inspect.stdout, inspect.stderr],
                  "unpickled": [mine[0] == c1, hash(mine[0]) == hash(c1),
                                mine[1] == c1.summary, mine[2] == kp.cdiv(kp.sym("n") * 3, 256),
                                mine[3] == plan],
                  "version": sys.version_info[:2]}))
'''


@needs_other
def test_other_interpreter_writes_the_same_bytes_and_reads_ours(built, tmp_path):
    c1, data = built
    (tmp_path / "ours.kpack").write_bytes(data)
    plan = kp.load(data)["r71_softmax"].plan(x=(3, 70000), s=0.5)
    with open(tmp_path / "ours.p", "wb") as fh:
        pickle.dump([c1, c1.summary, kp.cdiv(kp.sym("n") * 3, 256), plan], fh, 5)
    got = other(tmp_path, OTHER_BUILD, "ours.kpack", "ours.p")
    assert tuple(got["version"]) != sys.version_info[:2]
    assert got["sha"] == hashlib.sha256(data).hexdigest()  # same compile, same signed bytes
    assert got["plan"] == repr(plan)
    assert got["unpickled"] == [True] * 5
    mine = _cli("inspect", "--json", "ours.kpack", cwd=tmp_path)
    assert got["inspect"] == [0, mine.stdout, ""] and mine.returncode == 0
    with open(tmp_path / "theirs.p", "rb") as fh:
        theirs = pickle.load(fh)
    assert theirs[:3] == [c1, c1.summary, kp.cdiv(kp.sym("n") * 3, 256)] and theirs[3] == plan
    assert hash(theirs[0]) == hash(c1) and hash(theirs[2]) == hash(kp.cdiv(kp.sym("n") * 3, 256))


OTHER_CACHE = r'''
import json, subprocess, sys
import kernelpack as kp
ns = {}
exec(compile(FUSIONS.replace("r71_", "r71c_"), "<r71 fusions>", "exec"), ns)
cache = kp.Cache(sys.argv[1], remote=False)
hit = kp.compile(ns["softmax"], targets=["sm_90"], cache=cache)
lowered = "kernelpack.lowering" in sys.modules
made = kp.compile(ns["addsum"], targets=["sm_90"], cache=cache)
ls = subprocess.run([sys.executable, "-m", "kernelpack", "cache", "ls", "--json", "--dir",
                     sys.argv[1]], capture_output=True, text=True)
print(json.dumps({"origins": [hit.origin, made.origin], "lowered_for_hit": lowered,
                  "stats": cache.stats(), "ls": [ls.returncode, ls.stdout, ls.stderr]}))
'''


@needs_other
def test_a_cache_directory_is_shared_between_interpreters(tmp_path):
    ns = fusions("c")
    root = tmp_path / "cache"
    cache = kp.Cache(root, remote=False)
    assert kp.compile(ns["softmax"], targets=["sm_90"], cache=cache).origin == "compiled"
    got = other(tmp_path, OTHER_CACHE, str(root))
    assert got["origins"] == ["disk", "compiled"] and not got["lowered_for_hit"]
    assert (got["stats"]["disk_hits"], got["stats"]["compiles"]) == (1, 1)
    hit = kp.compile(ns["addsum"], targets=["sm_90"], cache=cache)
    assert hit.origin == "disk"
    mine = _cli("cache", "ls", "--json", "--dir", str(root), cwd=tmp_path)
    assert got["ls"][0] == mine.returncode == 0 and got["ls"][2] == mine.stderr == ""
    entries = lambda text: sorted((e["key"], e["program"], e["bytes"]) for e in json.loads(text))
    assert entries(got["ls"][1]) == entries(mine.stdout)
    assert [e[1] for e in entries(mine.stdout)] in (["r71c_addsum", "r71c_softmax"],
                                                   ["r71c_softmax", "r71c_addsum"])
