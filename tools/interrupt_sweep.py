"""A diagnostic, not part of the suite: review 30's interruption sweep (tests/ does not collect
it; run it with ``.venv/bin/python -m pytest -q -p no:cacheprovider tools/interrupt_sweep.py``,
about 80 s).

It raises KeyboardInterrupt at every point of an operation where CPython checks for signals
(right after a call returns) and checks invariants after each. The consequential findings it
made are fixed, with deterministic tests (tests/cache/test_interrupts.py, test_filewrite.py,
test_cli.py: a key left locked for the process's life, Ctrl-C swallowed into a warning, exit
130 during set-up). What it still reports (16 of 23 tests at 2682b92) are one-opcode windows
between a call's return and the store of its result, mostly ``fd = os.open(...)``: a
descriptor the code never received cannot be closed by any try/finally, so an interrupt there
leaks it (and, for a temporary, the lock it holds keeps the next save from sweeping it while
the process lives). Closing them means opening through file objects (dropped ones close their
descriptor) and registering new paths before creating them; see the closing note of session 30.

Review 30: interruption at every step (atomicity and recovery).

A production process gets ``KeyboardInterrupt`` (Ctrl-C, SIGINT; Jupyter's "interrupt kernel")
at arbitrary points, and a long-running one (a notebook, a server that catches it) carries on
afterwards. The documentation promises crash-safe writes (``kp.save``: temp + fsync + rename, "a
killed save's temporary is removed by the next save of that name"), cache entries written
atomically with a per-key lock, nothing half-loaded, and a CLI that exits 130 on Ctrl-C
"leaving no partly written file".

Method: run an operation once under ``sys.settrace`` (opcode events) counting the points in
kernelpack's own frames where a real SIGINT can raise ``KeyboardInterrupt`` (right after a call
returns: CPython checks for signals there), then re-run it raising ``KeyboardInterrupt`` at the
k-th such point, for every k (or a dense head/tail plus a stride through the middle, to stay
fast). After each interrupted run the invariants are checked, then the operation runs again
normally. The real-signal tests at the end confirm the in-process findings with SIGINT storms,
and cover SIGINT/SIGTERM deaths.

Sweeps that may hang (a lock left held, a half-built plan) run in a child process with a
timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack import cli, signing

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts open descriptors through /proc/self/fd")

PKG = os.path.dirname(kp.__file__) + os.sep
PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
KEY = "ab" * 32


# --------------------------------------------------------------------------------------------
# the interrupt harness (also written into the child scripts below, as HARNESS)
# --------------------------------------------------------------------------------------------

HARNESS = r'''
import dis, gc, os, sys
import kernelpack as kp
PKG = os.path.dirname(kp.__file__) + os.sep
_POINTS = {}

def signal_points(code):
    """Offsets right after a CALL: where CPython 3.11+ raises a KeyboardInterrupt from a real
    SIGINT (the eval breaker is checked when a call returns, and a blocking C call
    interrupted by a signal raises there too). Injecting only there keeps the sweep
    faithful: a line tracer could also raise where no signal can land (at a with block's
    exit, a try: line), and what breaks there is CPython's bookkeeping, not the code."""
    s = _POINTS.get(code)
    if s is None:
        ins = list(dis.get_instructions(code))
        s = frozenset(ins[i + 1].offset for i in range(len(ins) - 1)
                      if ins[i].opname in ("CALL", "CALL_FUNCTION_EX"))
        _POINTS[code] = s
    return s

def count_events(fn, files=None):
    """Signal points (see signal_points) passed in kernelpack's frames while fn() runs;
    `files`, a list, gets each point's module path (relative to the package)."""
    n = [0]
    def tr(frame, ev, arg):
        code = frame.f_code
        if not code.co_filename.startswith(PKG):
            return None
        if ev == "call":
            frame.f_trace_opcodes = True
            frame.f_trace = tr  # (3.13 gives opcode events only with f_trace set here too)
        elif ev == "opcode" and frame.f_lasti in signal_points(code):
            n[0] += 1
            if files is not None:
                files.append(code.co_filename[len(PKG):])
        return tr
    prev = sys.gettrace()
    sys._getframe().f_trace_opcodes = True  # (3.12.1: else the callees get no opcode events)
    sys.settrace(tr)
    try:
        fn()
    finally:
        sys.settrace(prev)
    return n[0]

def interrupt_at(fn, k, exc=KeyboardInterrupt):
    """Run fn(), raising exc at kernelpack's k-th signal point. Returns (outcome, value,
    where): outcome "interrupted" (exc came out), "ok" (fn returned value) or "raised"
    (another exception: value); where is "file:line function" of the injection, or None
    when fn passed fewer than k points."""
    n = [0]
    where = [None]
    def tr(frame, ev, arg):
        code = frame.f_code
        if not code.co_filename.startswith(PKG):
            return None
        if ev == "call":
            frame.f_trace_opcodes = True
            frame.f_trace = tr  # (3.13 gives opcode events only with f_trace set here too)
        elif ev == "opcode" and where[0] is None and frame.f_lasti in signal_points(code):
            n[0] += 1
            if n[0] >= k:
                where[0] = f"{code.co_filename[len(PKG):]}:{frame.f_lineno} {code.co_name}"
                raise exc()
        return tr
    prev = sys.gettrace()
    sys._getframe().f_trace_opcodes = True  # (3.12.1: else the callees get no opcode events)
    sys.settrace(tr)
    try:
        value = fn()
        outcome = "ok"
    except exc:
        outcome, value = "interrupted", None
    except BaseException as e:  # noqa: BLE001 - reported, not swallowed
        outcome, value = "raised", e
    finally:
        sys.settrace(prev)
    return outcome, value, where[0]

def points(n, head=0, tail=0, stride=1):
    """Points to interrupt at: every one of the first `head` and last `tail`, and a stride
    through the rest (deterministic)."""
    ks = set(range(1, min(head, n) + 1)) | set(range(max(1, n - tail + 1), n + 1))
    ks |= set(range(1, n + 1, max(1, stride)))
    return sorted(ks)

def _fd_table():
    table = {}
    for x in os.listdir("/proc/self/fd"):
        try:
            table[int(x)] = os.readlink("/proc/self/fd/" + x)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return table

def open_fds():
    """{descriptor: what it points to} for this process."""
    return _fd_table()

def leaked_fds(before):
    """Descriptors open now that were not in `before` (after a garbage collection, so a
    file object merely waiting for its finalizer does not count), as their targets."""
    now = _fd_table()
    if set(now) - set(before):
        gc.collect()
        now = _fd_table()
    return sorted(now[fd] for fd in set(now) - set(before))
'''

_ns: dict[str, Any] = {}
exec(compile(HARNESS, "<review30 harness>", "exec"), _ns)  # noqa: S102 - our own text
count_events: Callable[..., int] = _ns["count_events"]
interrupt_at: Callable[..., tuple] = _ns["interrupt_at"]
points: Callable[..., list] = _ns["points"]
open_fds: Callable[[], dict] = _ns["open_fds"]
leaked_fds: Callable[[dict], list] = _ns["leaked_fds"]

FUSIONS = '''
import kernelpack as kp

@kp.fusion
def f(x: kp.Tensor[kp.f32, "n"]):
    return x * 2.0

@kp.fusion
def g(x: kp.Tensor[kp.f32, "n"]):
    return x + 1.0
'''
exec(compile(FUSIONS, "<review30 fusions>", "exec"), _ns)  # noqa: S102 - our own text
f = _ns["f"]
g = _ns["g"]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _entries(root: Path) -> list[Path]:
    """Disk-cache entries under their final names (dot-files are temporaries)."""
    return sorted(p for p in (root / "entries").rglob("*.kpack") if not p.name.startswith("."))


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def _child(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _report(problems: list[str], what: str) -> None:
    if problems:
        # from None: an interrupt injected inside an except block can leave the sweep's
        # exception context set, which would only clutter the report
        raise AssertionError(f"{what}: {len(problems)} interruption point(s) broke an "
                             "invariant:\n" + "\n".join(problems[:8])) from None


def _cli_points(tmp_path: Path, fill, argv_of, **spread):
    """The interruption points of ``kernelpack argv_of(d)``, each run in a fresh directory
    ``d`` that ``fill(d)`` creates: yields ``(k, d, where, bad)`` after the checks every CLI
    sweep makes (the command returned, with 0 or 130; no descriptor left open) in ``bad``, for
    the caller to add its own; ``d`` is removed when the caller is done with it. Points the
    command did not reach, or whose interrupt escaped ``main()``
    (test_cli_main_turns_ctrl_c_into_130's subject), are skipped."""
    probe = tmp_path / "probe"
    fill(probe)
    n = count_events(lambda: _cli(argv_of(probe)))
    for k in points(n, **spread):
        d = tmp_path / f"k{k}"
        fill(d)
        before = open_fds()
        outcome, value, where = interrupt_at(lambda d=d: _cli(argv_of(d)), k)
        if where is not None and outcome != "interrupted":
            leaked = leaked_fds(before)
            bad = []
            if outcome != "ok":
                bad.append(f"outcome {outcome} {value!r}")
            elif value[0] not in (0, 130):
                bad.append(f"exit {value[0]} {value[2].strip()}")
            if leaked:
                bad.append(f"{len(leaked)} file descriptor(s) left open: {leaked}")
            yield k, d, where, bad
        shutil.rmtree(d)


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    cf = kp.compile(f, targets=["sm_80"])
    cg = kp.compile(g, targets=["sm_80"])
    return {"f": cf, "g": cg, "f_bytes": kp.save([cf]), "g_bytes": kp.save([cg])}


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("key")
    rc, _, err = _cli(["keygen", "-o", str(d / "team")])
    assert rc == 0, err
    return d / "team"


# --------------------------------------------------------------------------------------------
# kp.save
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
def test_save_interrupted_anywhere_keeps_a_complete_file_and_leaks_nothing(
        tmp_path, compiled, keyfile, signed):
    """An interrupted save over an existing artifact leaves the old or the new file (complete),
    and nothing that lasts: no open descriptor, and after the next save of that name only the
    artifact in the directory (README: a killed save's temporary is removed by the next save
    of that name; a save that was interrupted, not killed, should not need even that)."""
    sign = str(keyfile) if signed else None
    path = tmp_path / "a.kpack"
    old = kp.save([compiled["g"]], path)
    new = kp.save([compiled["f"]], None, sign_with=sign)
    n = count_events(lambda: kp.save([compiled["f"]], path, sign_with=sign))
    problems: list[str] = []
    for k in points(n, tail=200, stride=5):
        kp.save([compiled["g"]], path)
        before = open_fds()
        outcome, value, where = interrupt_at(
            lambda: kp.save([compiled["f"]], path, sign_with=sign), k)
        if where is None:
            continue
        leaked = leaked_fds(before)
        bad = []
        if outcome != "interrupted":
            bad.append(f"outcome {outcome} {value!r}")
        if not path.exists():
            bad.append("the artifact vanished")
        elif path.read_bytes() not in (old, new):
            bad.append(f"{path.name} is neither the old nor the new artifact "
                       f"({path.stat().st_size} bytes)")
        if leaked:
            bad.append(f"{len(leaked)} file descriptor(s) left open: {leaked}")
        kp.save([compiled["g"]], path)
        stray = [p for p in _files(tmp_path) if p != "a.kpack"]
        if stray:
            bad.append(f"after the next save the directory still holds {stray}")
        for p in stray:
            (tmp_path / p).unlink()
        if bad:
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
    _report(problems, f"kp.save (sign_with={'key' if signed else None})")


@pytest.mark.parametrize("command", ["sign", "extract"])
def test_cli_write_interrupted_anywhere_leaves_no_partial_output(
        tmp_path, compiled, keyfile, command):
    """``kernelpack sign FILE`` (in place) and ``extract``: Ctrl-C gives 130 and leaves no
    partly written file, no open descriptor, and the rerun leaves only the real outputs."""
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    cf = kp.compile(f, targets=["sm_80", "ptx"])
    art = kp.save([cf])
    (ref_dir / "a.kpack").write_bytes(art)
    rc, _, err = _cli(["extract", str(ref_dir / "a.kpack"), "-o", str(ref_dir / "out")])
    assert rc == 0, err
    ref_images = {p.name: p.read_bytes() for p in (ref_dir / "out").iterdir()}
    signed = kp.save(kp.load(art), sign_with=str(keyfile))

    def argv(d: Path) -> list[str]:
        if command == "sign":
            return ["sign", str(d / "a.kpack"), "--key", str(keyfile)]
        return ["extract", str(d / "a.kpack"), "-o", str(d / "out"), "--force"]

    def expected(d: Path) -> dict[str, bytes | None]:
        if command == "sign":
            return {"a.kpack": None}  # the original or the signed artifact
        return {"a.kpack": art, **{f"out/{k}": v for k, v in ref_images.items()}}

    def fill(d: Path) -> None:
        d.mkdir()
        (d / "a.kpack").write_bytes(art)

    problems: list[str] = []
    for k, d, where, bad in _cli_points(tmp_path, fill, argv, tail=200, stride=6):
        exp = expected(d)
        for name in _files(d):
            if name in exp:
                data = (d / name).read_bytes()
                if name == "a.kpack" and command == "sign":
                    if data not in (art, signed):
                        bad.append("a.kpack is neither the original nor the signed artifact")
                elif data != exp[name]:
                    bad.append(f"{name}: {len(data)} bytes, not the complete image")
        rc, _, err = _cli(argv(d))
        if rc != 0:
            bad.append(f"the rerun exits {rc}: {err.strip()}")
        extra = [p for p in _files(d) if p not in exp]
        if extra:
            bad.append(f"after the rerun the directory still holds {extra}")
        if bad:
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
    _report(problems, f"kernelpack {command}")


def test_keygen_interrupted_leaves_no_half_written_key(tmp_path):
    """``kernelpack keygen -o NAME`` interrupted: exit 130 and either no key files or a
    complete pair (private 0600 + .pub); never an empty/truncated key under its final name,
    which the rerun then refuses with "File exists"."""
    problems: list[str] = []
    for k, d, where, bad in _cli_points(tmp_path, Path.mkdir,
                                        lambda d: ["keygen", "-o", str(d / "team")]):
        name = d / "team"
        priv, pub = name, d / "team.pub"
        present = {p.name: p.stat().st_size for p in (priv, pub) if p.exists()}
        if present and len(present) != 2:
            bad.append(f"half a key pair: {present}")
        if priv.exists():
            try:
                signing.load_private_key(str(priv))
            except ValueError as e:
                bad.append(f"private key file ({priv.stat().st_size} bytes) unusable: {e}")
            if stat.S_IMODE(priv.stat().st_mode) != 0o600:
                bad.append(f"private key mode {oct(priv.stat().st_mode)}")
        if pub.exists():
            try:
                signing.load_public_key(str(pub))
            except ValueError as e:
                bad.append(f"public key file ({pub.stat().st_size} bytes) unusable: {e}")
        if bad:
            if present and any("key" in b for b in bad):
                rc, _, err = _cli(["keygen", "-o", str(name)])
                bad.append(f"the rerun: exit {rc} {err.strip()}")
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
    _report(problems, "kernelpack keygen")


# --------------------------------------------------------------------------------------------
# the disk cache: put / get (in process), fetch_or_compile's key lock (in a child)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["put", "put_over", "get"])
def test_cache_interrupted_anywhere_is_all_or_nothing_and_leaks_nothing(tmp_path, compiled, op):
    """Cache.put / Cache.get interrupted at any point: the KeyboardInterrupt comes out (never
    turned into a CacheWarning and a normal return), every entry present loads, no descriptor
    stays open, no temporary survives (after the call and a prune), the counters stay sane, and
    the next put/get on the same key works."""
    data = compiled["f_bytes"]
    pre = op in ("put_over", "get")

    def run(cache: kp.Cache):
        if op == "get":
            assert cache.get(KEY) == data
        else:
            cache.put(KEY, data)

    probe = kp.Cache(path=tmp_path / "probe", remote=False)
    if pre:
        probe.put(KEY, data)
    run(probe)
    n = count_events(lambda: run(probe))
    problems: list[str] = []
    for k in points(n, head=80, tail=150, stride=4):
        root = tmp_path / f"k{k}"
        cache = kp.Cache(path=root, remote=False)
        if pre:
            cache.put(KEY, data)
        before = open_fds()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome, value, where = interrupt_at(lambda cache=cache: run(cache), k)
        if where is None:
            shutil.rmtree(root)
            continue
        leaked = leaked_fds(before)
        bad = []
        if outcome != "interrupted":
            bad.append(f"KeyboardInterrupt did not come out: outcome {outcome} {value!r}")
        msgs = [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)]
        if msgs:
            bad.append(f"warnings {msgs}")
        if leaked:
            bad.append(f"{len(leaked)} file descriptor(s) left open: {leaked}")
        for e in _entries(root):
            try:
                kp.load(e)
            except kp.KernelPackError as err:
                bad.append(f"entry {e.name} does not load: {err}")
        stats = cache.stats()
        if any(not isinstance(v, int) or v < 0 for v in stats.values()):
            bad.append(f"stats {stats}")
        again = kp.Cache(path=root, remote=False)
        again.put(KEY, data)
        if again.get(KEY) != data:
            bad.append("the next put/get does not give the artifact back")
        again.prune()
        tmps = [p for p in _files(root) if p.endswith(".tmp")]
        if tmps:
            bad.append(f"temporaries left after the next put and a prune: {tmps}")
        if bad:
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
        shutil.rmtree(root)
    _report(problems, f"Cache.{op}")


LOCK_SWEEP = HARNESS + FUSIONS + r'''
import json, shutil, subprocess, threading, time
root0, which = sys.argv[1], sys.argv[2]
KEY = "ab" * 32
c = kp.compile(f, targets=["sm_80"])

def op(root):
    cache = kp.Cache(path=root, remote=False)
    if which == "compile":
        return kp.compile(f, targets=["sm_80"], cache=cache)
    return cache.fetch_or_compile(KEY, lambda: c, name="f")

op(root0 + "/warm")
files = []
n = count_events(lambda: op(root0 + "/probe"), files)
if which == "compile":
    # every other point in the cache package (README layout: cache/, the disk and Redis
    # tiers; fetch_or_compile's sweep covers it densely), a stride through the rest (the
    # tracing and the lowering)
    ks = sorted(set([i for i, m in enumerate(files, 1) if m.startswith("cache" + os.sep)][::2])
                | set(range(1, n + 1, 80)))
else:
    ks = points(n, head=200, tail=160, stride=4)
CHILD = """
import sys, time, kernelpack as kp
@kp.fusion
def f(x: kp.Tensor[kp.f32, "n"]):
    return x * 2.0
cache = kp.Cache(path=sys.argv[1], remote=False)
t = time.time()
if sys.argv[2] == "compile":
    r = kp.compile(f, targets=["sm_80"], cache=cache)
else:
    r = cache.fetch_or_compile("ab" * 32, lambda: kp.compile(f, targets=["sm_80"]), name="f")
print(r.origin, round(time.time() - t, 2))
"""
problems = []
for k in ks:
    root = root0 + "/k%d" % k
    before = open_fds()
    outcome, value, where = interrupt_at(lambda: op(root), k)
    if where is None:
        continue
    leaked = leaked_fds(before)
    bad = []
    if outcome != "interrupted":
        bad.append("outcome %s %.80r" % (outcome, value))
    if leaked:
        bad.append("%d file descriptor(s) left open" % len(leaked))
    res = []
    th = threading.Thread(target=lambda: res.append(op(root).origin), daemon=True)
    th.start()
    th.join(4)
    if not res:
        bad.append("the next call for the key in this process blocks (> 4 s)")
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, root, which], capture_output=True,
                               text=True, timeout=8)
            bad.append("another process: " + (p.stdout.strip() or p.stderr.strip()[-200:]))
        except subprocess.TimeoutExpired:
            bad.append("another process blocks too (> 8 s, for as long as this one lives)")
    if bad:
        problems.append("k=%d at %s: %s" % (k, where, "; ".join(bad)))
        if not res:
            break  # one blocked key is enough (each costs seconds)
print("RESULT " + json.dumps(problems), flush=True)
os._exit(0)
'''


@pytest.mark.parametrize("which", ["fetch_or_compile", "compile"])
def test_compile_through_cache_interrupted_never_leaves_the_key_locked(tmp_path, which):
    """``kp.compile(f, cache=...)`` / ``Cache.fetch_or_compile`` interrupted at any point: the
    KeyboardInterrupt comes out, the per-key lock (thread and file lock) is released, no
    descriptor stays open, and the next call for that key (in this process and in another) is
    served at once. A notebook user who hits Ctrl-C during a compile and re-runs the cell must
    not hang forever, nor make every other process needing that kernel hang."""
    p = _child(LOCK_SWEEP, str(tmp_path), which, timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    _report(json.loads(line[0][len("RESULT "):]),
            "kp.compile(cache=)" if which == "compile" else "Cache.fetch_or_compile")


# --------------------------------------------------------------------------------------------
# kp.load + first plan
# --------------------------------------------------------------------------------------------

BIG = FUSIONS + r'''
import os, random, sys, time

def make(repo, lines):
    # an external PTX kernel padded with `lines` comment lines of random hex (compresses ~2x)
    ptx = open(os.path.join(repo, "examples", "axpy.ptx")).read()
    rnd = random.Random(0)
    junk = "".join("// %064x\n" % rnd.getrandbits(256) for _ in range(lines))
    return kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=ptx + junk, targets=["sm_80", "ptx"])

if __name__ == "__main__":
    ax = make(sys.argv[1], int(sys.argv[2]))
'''


@pytest.fixture(scope="module")
def big_artifact(tmp_path_factory) -> Path:
    """A ~4 MB artifact (an external PTX kernel padded with comments): over 1 MiB, so
    ``kp.load`` memory-maps it (README: such a pack holds two descriptors while it lives)."""
    ns: dict[str, Any] = {}
    exec(compile(BIG, "<review30 big>", "exec"), ns)  # noqa: S102 - our own text
    path = tmp_path_factory.mktemp("big") / "big.kpack"
    kp.save([ns["make"](str(REPO), 120000)], path)
    assert path.stat().st_size > (1 << 20)
    return path


@pytest.mark.parametrize("size", ["small", "mapped"])
def test_load_interrupted_anywhere_leaks_nothing_and_the_next_load_plans_right(
        tmp_path, compiled, big_artifact, size):
    """``kp.load(path)`` + the first ``plan`` interrupted at any point: no descriptor stays
    open (a long-running process that reloads artifacts would run out of them), and the next
    load + plan in this process gives the same plan."""
    if size == "small":
        path = tmp_path / "a.kpack"
        path.write_bytes(compiled["f_bytes"])
        name, shapes = "f", {"x": (1000,)}
        ks = {"head": 120, "tail": 60, "stride": 4}
    else:
        path = big_artifact
        name, shapes = "axpy", {"x": (1000,), "y": (1000,)}
        ks = {"head": 60, "stride": 25}

    def run():
        return repr(kp.load(path)[name].plan(**shapes))

    ref = run()
    n = count_events(run)
    problems: list[str] = []
    for k in points(n, **ks):
        before = open_fds()
        outcome, value, where = interrupt_at(run, k)
        if where is None:
            continue
        leaked = leaked_fds(before)
        bad = []
        if outcome != "interrupted":
            bad.append(f"outcome {outcome} {value!r}")
        if leaked:
            bad.append(f"{len(leaked)} file descriptor(s) left open: {leaked}")
        again = run()
        if again != ref:
            bad.append(f"the next load + plan differs: {again}")
        if bad:
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
    _report(problems, f"kp.load + plan ({size} artifact)")


PLAN_SWEEP = HARNESS + FUSIONS + r'''
import faulthandler
data = kp.save([kp.compile(f, targets=["sm_80"])])
ref = repr(kp.load(data)["f"].plan(x=(1000,)))
n = max(count_events(lambda: kp.load(bytes(data))["f"].plan(x=(1000,))) for _ in range(2))
for k in points(n):
    pack = kp.load(bytes(data))
    outcome, value, where = interrupt_at(lambda: pack["f"].plan(x=(1000,)), k)
    if where is None:
        continue
    print("AT", k, where, flush=True)
    faulthandler.dump_traceback_later(6, exit=True)
    again = repr(pack["f"].plan(x=(1000,)))
    fresh = repr(kp.load(bytes(data))["f"].plan(x=(1000,)))
    faulthandler.cancel_dump_traceback_later()
    if again != ref or fresh != ref:
        print("WRONG", k, where, again if again != ref else fresh, flush=True)
print("DONE", flush=True)
'''


def test_plan_interrupted_on_first_use_then_plan_again_works(tmp_path):
    """The first ``pack["f"].plan(...)`` of a loaded program interrupted at any point: the next
    plan of the same program (and of a fresh load) gives the same plan, promptly. No
    half-built state may stay cached in the program."""
    try:
        p = _child(PLAN_SWEEP, timeout=240)
    except subprocess.TimeoutExpired as e:  # pragma: no cover - the faulthandler exits first
        pytest.fail(f"the sweep hung: {e.stdout!s:.2000}")
    ats = [x for x in p.stdout.splitlines() if x.startswith("AT ")]
    wrong = [x for x in p.stdout.splitlines() if x.startswith("WRONG ")]
    if "DONE" not in p.stdout:
        pytest.fail(f"after an interrupt at {ats[-1] if ats else '?'}, the next plan() of the "
                    f"same program never returns (> 6 s, busy):\n{p.stderr[-1500:]}")
    assert not wrong, "\n".join(wrong[:5])


# --------------------------------------------------------------------------------------------
# kernelpack cache prune|clear, and main()'s own Ctrl-C handling
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_template(tmp_path_factory, compiled) -> Path:
    root = tmp_path_factory.mktemp("cache") / "c"
    cache = kp.Cache(path=root, remote=False)
    kp.compile(f, targets=["sm_80"], cache=cache)
    kp.compile(g, targets=["sm_80"], cache=cache)
    for i in range(3):
        cache.put(f"{i:064x}", compiled["f_bytes"])
    return root


@pytest.mark.parametrize("command", ["prune", "clear"])
def test_cli_cache_prune_clear_interrupted_anywhere(tmp_path, cache_template, compiled,
                                                    command):
    """``kernelpack cache prune|clear`` interrupted: exit 130 (or 0 if it finished), no open
    descriptor, every entry left loads, ``cache ls`` works, the next run and a compile through
    the cache work."""
    argv_of = {"prune": lambda d: ["cache", "prune", "--dir", str(d), "--max-bytes", "5000"],
               "clear": lambda d: ["cache", "clear", "--dir", str(d)]}[command]
    problems: list[str] = []
    for k, d, where, bad in _cli_points(
            tmp_path, lambda d: shutil.copytree(cache_template, d), argv_of):
        for e in _entries(d):
            try:
                kp.load(e)
            except kp.KernelPackError as err:
                bad.append(f"entry {e.name} does not load: {err}")
        rc, _, err = _cli(["cache", "ls", "--dir", str(d), "--json"])
        if rc != 0:
            bad.append(f"cache ls exits {rc}: {err.strip()}")
        rc, _, err = _cli(argv_of(d))
        if rc != 0:
            bad.append(f"the rerun exits {rc}: {err.strip()}")
        if k % 5 == 0 and kp.compile(f, targets=["sm_80"], cache=kp.Cache(
                path=d, remote=False)).summary != compiled["f"].summary:
            bad.append("a compile through the cache gives another program")
        if bad:
            problems.append(f"k={k} at {where}: " + "; ".join(bad))
    _report(problems, f"kernelpack cache {command}")


def test_cli_main_turns_ctrl_c_into_130(tmp_path, cache_template):
    """README: exit status 130 when interrupted (Ctrl-C). ``cli.main`` must return 130 wherever
    the interrupt lands, also while it builds its parser or dispatches: an escaping
    KeyboardInterrupt is a traceback for the user."""
    probe = tmp_path / "probe"
    shutil.copytree(cache_template, probe)
    n = count_events(lambda: _cli(["cache", "clear", "--dir", str(probe)]))
    escaped: list[str] = []
    for k in points(n):
        d = tmp_path / "d"
        shutil.copytree(cache_template, d)
        outcome, value, where = interrupt_at(
            lambda d=d: _cli(["cache", "clear", "--dir", str(d)]), k)
        shutil.rmtree(d)
        if where is not None and (outcome != "ok" or value[0] not in (0, 130)):
            escaped.append(f"k={k} at {where}: {outcome} {value!r}")
    assert not escaped, f"{len(escaped)} of {n} interruption points escape cli.main():\n" \
        + "\n".join(escaped[:3] + ["..."] + escaped[-3:])


# --------------------------------------------------------------------------------------------
# real signals
# --------------------------------------------------------------------------------------------

SAVER_STORM = BIG + r'''
import gc, json
path = sys.argv[3]
d = os.path.dirname(path)
def fds():
    gc.collect()
    return len(os.listdir("/proc/self/fd"))
kp.save([ax], path)
fd0 = fds()
open(path + ".ready", "w").close()
saves = ints = 0
t_end = time.time() + float(sys.argv[4])
def loop():
    global saves, ints
    while time.time() < t_end:
        try:
            kp.save([ax], path)
            saves += 1
        except KeyboardInterrupt:
            ints += 1
for _ in range(100000):
    try:
        try:
            loop()
            break
        except KeyboardInterrupt:
            ints += 1
    except KeyboardInterrupt:
        ints += 1
time.sleep(0.3)
kp.save([ax], path)   # the next save of that name
kp.load(path).verify()
print("RESULT " + json.dumps({"saves": saves, "interrupts": ints, "fds_before": fd0,
                              "fds_after": fds(),
                              "listing": sorted(x for x in os.listdir(d)
                                                if not x.endswith(".ready"))}), flush=True)
os._exit(0)
'''


def _storm(proc: subprocess.Popen, ready: Path, seconds: float) -> int:
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        assert time.time() < deadline, "the child never got ready"
        time.sleep(0.02)
    sent = 0
    t_end = time.time() + seconds
    while time.time() < t_end and proc.poll() is None:
        time.sleep(0.002 + (sent % 7) * 0.0005)
        proc.send_signal(signal.SIGINT)
        sent += 1
    return sent


def _result(out: str) -> dict:
    line = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert line, out[-3000:]
    return json.loads(line[0][len("RESULT "):])


def test_real_sigint_storm_on_a_process_that_keeps_saving(tmp_path):
    """A long-running process that catches KeyboardInterrupt and carries on (a notebook, a
    server) gets ~1000 real SIGINTs while saving in a loop: afterwards no descriptor is left
    open, and the next save leaves only the artifact (complete) in the directory."""
    path = tmp_path / "a.kpack"
    proc = subprocess.Popen([PY, "-c", SAVER_STORM, str(REPO), "10", str(path), "3.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sent = _storm(proc, Path(str(path) + ".ready"), 2.5)
    out = proc.communicate(timeout=120)[0]
    r = _result(out)
    assert r["interrupts"] > 100, (sent, r)
    assert r["fds_after"] == r["fds_before"] and r["listing"] == ["a.kpack"], \
        f"{r['interrupts']} interrupted saves left {r['fds_after'] - r['fds_before']} open " \
        f"descriptor(s) and these files: {r['listing']}"


CACHE_STORM = FUSIONS + r'''
import gc, json, os, sys, threading, time, warnings
root = sys.argv[1]
c = kp.compile(f, targets=["sm_80"])
cache = kp.Cache(path=root, remote=False)
def fds():
    gc.collect()
    return len(os.listdir("/proc/self/fd"))
cache.fetch_or_compile("f" * 64, lambda: c, name="f")
fd0 = fds()
open(root + "/.ready", "w").close()
n = 0
interrupted = []
t_end = time.time() + float(sys.argv[2])
def loop():
    global n
    while time.time() < t_end:
        key = "%064x" % n
        n += 1
        try:
            cache.fetch_or_compile(key, lambda: c, name="f")
        except KeyboardInterrupt:
            interrupted.append(key)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(100000):
        try:
            try:
                loop()
                break
            except KeyboardInterrupt:
                interrupted.append("%064x" % (n - 1))
        except KeyboardInterrupt:
            pass
    time.sleep(0.3)
    blocked = []
    for key in interrupted:
        done = []
        th = threading.Thread(target=lambda: done.append(
            cache.fetch_or_compile(key, lambda: c, name="f")), daemon=True)
        th.start()
        th.join(3)
        if not done:
            blocked.append(key)
            break
bad = []
for dp, dn, fn in os.walk(os.path.join(root, "entries")):
    for x in fn:
        if not x.startswith("."):
            try:
                kp.load(os.path.join(dp, x))
            except kp.KernelPackError:
                bad.append(x)
cache.prune()
tmps = [x for dp, dn, fn in os.walk(root) for x in fn if x.endswith(".tmp")]
print("RESULT " + json.dumps({
    "calls": n, "interrupts": len(interrupted), "blocked": blocked, "bad_entries": bad,
    "fds_before": fd0, "fds_after": fds(), "temporaries": len(tmps),
    "warnings": sorted({str(w.message)[:120] for w in caught
                        if not issubclass(w.category, ResourceWarning)})}), flush=True)
os._exit(0)
'''


def test_real_sigint_storm_on_a_process_that_keeps_compiling_through_the_cache(tmp_path):
    """The same with the compile cache (fetch_or_compile of new keys in a loop): no open
    descriptors or temporaries accumulate, no key stays locked, every entry loads, and no
    interrupt is turned into a "disk cache write failed" warning (that is Ctrl-C ignored)."""
    root = tmp_path / "c"
    root.mkdir()
    proc = subprocess.Popen([PY, "-c", CACHE_STORM, str(root), "3.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _storm(proc, root / ".ready", 2.5)
    r = _result(proc.communicate(timeout=120)[0])
    assert r["interrupts"] > 100, r
    summary = {k: r[k] for k in ("interrupts", "blocked", "bad_entries", "temporaries",
                                 "warnings")}
    summary["fds_leaked"] = r["fds_after"] - r["fds_before"]
    ok = (not r["blocked"] and not r["bad_entries"] and r["temporaries"] == 0
          and summary["fds_leaked"] == 0 and not r["warnings"])
    assert ok, "after a SIGINT storm on a process compiling through the cache: " + ", ".join(
        f"{k}={v}" for k, v in summary.items())


SAVER_LOOP = BIG + r'''
path = sys.argv[3]
kp.save([ax], path)
open(path + ".ready", "w").close()
while True:
    kp.save([ax], path)
'''


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_real_signal_kills_a_process_saving_a_large_artifact(tmp_path, sig):
    """A process saving a ~4 MB artifact in a loop dies of SIGINT/SIGTERM mid-save: the file
    under the name is complete, and the next save of that name (another process) leaves only
    the artifact."""
    path = tmp_path / "big.kpack"
    proc = subprocess.Popen([PY, "-c", SAVER_LOOP, str(REPO), "120000", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = Path(str(path) + ".ready")
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-2000:]
        time.sleep(0.01)
    ready.unlink()
    time.sleep(0.12)
    proc.send_signal(getattr(signal, sig))
    proc.communicate(timeout=60)
    assert proc.returncode == -getattr(signal, sig)
    kp.load(path).verify()
    p = _child("import sys, kernelpack as kp; kp.save(kp.load(sys.argv[1]), sys.argv[1])",
               str(path), timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert _files(tmp_path) == ["big.kpack"]
    kp.load(path).verify()


HOLDER = FUSIONS + r'''
import os, sys, time
root = sys.argv[1]
cache = kp.Cache(path=root, remote=False)
def build():
    open(os.path.join(root, ".holding"), "w").close()
    time.sleep(float(sys.argv[2]))
    return kp.compile(f, targets=["sm_80"])
try:
    print("holder", cache.fetch_or_compile("ab" * 32, build, name="f").origin, flush=True)
except KeyboardInterrupt:
    print("holder interrupted, staying alive", flush=True)
    time.sleep(float(sys.argv[3]))
'''

WAITER = FUSIONS + r'''
import os, sys, time
root = sys.argv[1]
cache = kp.Cache(path=root, remote=False)
t = time.time()
c = cache.fetch_or_compile("ab" * 32, lambda: kp.compile(f, targets=["sm_80"]), name="f")
assert cache.get("ab" * 32) is not None
print("waiter", c.origin, round(time.time() - t, 2), flush=True)
'''


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-2000:]
        time.sleep(0.02)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_real_signal_to_the_lock_holder_frees_the_key(tmp_path, sig):
    """A process compiling a key (holding its lock) gets SIGINT (catches it and stays alive)
    or SIGTERM (dies): another process then compiles that key at once and can get it."""
    root = tmp_path / "c"
    root.mkdir()
    holder = subprocess.Popen([PY, "-c", HOLDER, str(root), "60", "6"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(root / ".holding", holder)
    holder.send_signal(getattr(signal, sig))
    t = time.time()
    p = _child(WAITER, str(root), timeout=60)
    took = time.time() - t
    holder.kill()
    holder.communicate(timeout=30)
    assert p.returncode == 0, p.stderr[-2000:]
    assert took < 20 and "waiter compiled" in p.stdout, (took, p.stdout)


WAIT_INTERRUPTED = FUSIONS + r'''
import gc, os, sys, time, faulthandler
root = sys.argv[1]
cache = kp.Cache(path=root, remote=False)
def fds():
    gc.collect()
    return len(os.listdir("/proc/self/fd"))
fd0 = fds()
open(os.path.join(root, ".waiting"), "w").close()
try:
    cache.fetch_or_compile("ab" * 32, lambda: kp.compile(f, targets=["sm_80"]), name="f")
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
fd1 = fds()
faulthandler.dump_traceback_later(30, exit=True)
c = cache.fetch_or_compile("ab" * 32, lambda: kp.compile(f, targets=["sm_80"]), name="f")
print("again", c.origin, "fds", fd0, fd1, fds(), flush=True)
'''


def test_real_sigint_while_waiting_for_another_process_compile(tmp_path):
    """A process waiting for another's compile of the key gets SIGINT and catches it: it leaks
    no descriptor, and asking again gets the entry once the other process has written it."""
    root = tmp_path / "c"
    root.mkdir()
    holder = subprocess.Popen([PY, "-c", HOLDER, str(root), "3", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(root / ".holding", holder)
    waiter = subprocess.Popen([PY, "-c", WAIT_INTERRUPTED, str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(root / ".waiting", waiter)
    time.sleep(0.8)
    waiter.send_signal(signal.SIGINT)
    out = waiter.communicate(timeout=90)[0]
    assert "holder compiled" in holder.communicate(timeout=60)[0]
    assert waiter.returncode == 0, out[-2000:]
    lines = out.splitlines()
    assert lines[0] == "interrupted", out
    again = lines[-1].split()
    assert again[:2] == ["again", "disk"], out
    assert again[3] == again[4] == again[5], f"descriptors before/after the interrupt: {out}"
