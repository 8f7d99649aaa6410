"""Review 32: many threads compiling and loading in one process, black-box through
``kp.compile(f, cache=kp.Cache(dir))``, ``kp.load``/``plan``/``summary``, ``Cache.stats()``,
``explain_misses=True`` and ``kernelpack.cli.main([...])`` called from threads (8-16 threads
lined up with ``threading.Barrier``; every wait has a timeout), with real fusions compiled for
``sm_80`` (nvJitLink, no GPU) and a real redis-server.

Bugs (each test fails today):

* ``kernelpack.cli.main`` is not safe to call from several threads: each call swaps
  ``sys.stdout`` for a wrapper and puts back what it saw, so concurrent calls leave the
  process's ``sys.stdout`` a growing chain of ``kernelpack.cli._Stdout`` wrappers; calls then
  fail with ``AttributeError: 'str' object has no attribute 'write'`` or the process dies with
  a segmentation fault (``test_cli_main_from_threads_...``).
* After one ``cli.main`` call finds stdout unwritable (``> /dev/full``), fd 1 of the whole
  process is ``/dev/null``: every later call, in any thread, "succeeds" (status 0) with its
  output thrown away (``test_cli_main_unwritable_stdout_...``).
* ``kernelpack build`` in-process (``cli.main(["build", ...])``, a build service's threads):
  a source file's sibling module (``from helpers import NAME``) is taken from ``sys.modules``
  as an earlier build in this process imported it from *another* directory: the artifact is
  silently built from the other project's code (``test_in_process_builds_...``).
* ``Cache.stats()``: a call that waits for another thread's compile of its key and then hits
  counts as a disk miss *and* a disk hit: 8 threads asking for one key give
  ``disk_misses`` 8 + ``disk_hits`` 7 for 8 calls and 1 compile (one thread alone: 1 miss per
  compile) (``test_stats_count_each_call_once_...``).
* One corrupt disk entry read by several threads at once: each emits a ``CacheWarning``
  (all but one say "already replaced by another process; recompiling", though it was a
  thread of this process, nothing replaced it, and they do not recompile) and
  ``stats()["quarantined"]`` counts up to 8 for the one file moved to quarantine
  (``test_one_corrupt_entry_read_by_many_threads_...``).
* ``Cache.close()`` in one thread while others read the remote (a ``with cache:`` block
  ending, a reload): the in-flight command fails (``OSError: [Errno 9] Bad file
  descriptor``: its socket closed under it, and a reused descriptor number could be another
  file's; or a bare ``AssertionError``), the remote tier is switched off for 30 s, and every
  other thread's lookups miss (and would recompile) although Redis is up
  (``test_close_while_other_threads_...``).

Right (regression tests): a global that threads change between calls gives each compile the
code of the value its key was made from (cache and no cache; each disk entry afterwards holds
its own value's code, byte-identical to a single-threaded compile in another process); one
compile per key for threads with one Cache or one Cache each on a directory; every entry
loads and verifies, no temporaries or lock files left; concurrent ``kp.load``/``plan``/
``summary``/``compiled`` equal a single-threaded run; explained misses name each thread's own
program and its recorded key; ``clear``/``prune`` racing compiles cost only recompiles.
"""

from __future__ import annotations

import concurrent.futures as cf
import glob
import hashlib
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.cache import CacheWarning
from kernelpack.compile_entry import fusion_key

from ._cache_kernels import from_cubin
from .conftest import RedisServer, worker_env

T80 = ["sm_80"]
WAIT_S = 60.0  # every barrier and result() waits at most this long: a deadlock fails, not hangs

FUSIONS_SRC = '''
import kernelpack as kp

G = 0  # read by the traces below; tests change it from threads


@kp.fusion
def r32_global(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
    g = G  # read once: a thread changing G between two reads made a name and a constant
    return {"y%d" % g: kp.tanh(x * s) + float(g)}  # of two values (seen on Python 3.14)


@kp.fusion
def r32_rows(x: kp.Tensor[kp.f32, "b", "n"]):
    return x.sum(axis=1)


@kp.fusion
def r32_total(x: kp.Tensor[kp.f32, "n"]):
    return x.sum()


def _pointwise(i):
    def body(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
        return x * s + float(i) + G
    return kp.fusion(name="r32_pw%d" % i)(body)


PW = [_pointwise(i) for i in range(8)]
'''

REF_SCRIPT = '''
import hashlib, importlib.util, io, json, sys
import kernelpack as kp
spec = importlib.util.spec_from_file_location("r32_ref_fusions", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def digest(c):
    buf = io.BytesIO(); kp.save([c], buf); return hashlib.sha256(buf.getvalue()).hexdigest()
out = {}
for g in range(6):
    m.G = g
    out["global%d" % g] = digest(kp.compile(m.r32_global, targets=["sm_80"]))
m.G = 0
for i, f in enumerate(m.PW):
    out["pw%d" % i] = digest(kp.compile(f, targets=["sm_80"]))
print(json.dumps(out))
'''


# ---- helpers ---------------------------------------------------------------------------------
def _digest(c: kp.Compiled) -> str:
    buf = io.BytesIO()
    kp.save([c], buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def _threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(i)`` for i in 0..n-1 on n threads released together by a barrier; each result
    (an exception is re-raised here), within WAIT_S each."""
    barrier = threading.Barrier(n)

    def run(i: int) -> Any:
        barrier.wait(WAIT_S)
        return fn(i)

    with cf.ThreadPoolExecutor(n) as ex:
        futures = [ex.submit(run, i) for i in range(n)]
        return [f.result(WAIT_S) for f in futures]


def _cache(path: Path, **kw: Any) -> kp.Cache:
    kw.setdefault("remote", False)
    return kp.Cache(path, **kw)


def _fusion(body: str, name: str) -> kp.Fusion:
    ns: dict[str, Any] = {"kp": kp}
    exec(textwrap.dedent(body), ns)  # noqa: S102 - test-local source
    return kp.fusion(name=name)(ns["f"])


def _leftovers(root: Path) -> list[str]:
    """Files under the cache root that are neither entries nor key records (temporaries, lock
    files of finished compiles)."""
    bad = []
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in files:
            top = rel.split(os.sep)[0]
            if top == "entries" and name.endswith(".kpack") and not name.startswith("."):
                continue
            if top == "keys" and name.endswith(".json") and not name.startswith("."):
                continue
            if top == "locks" and name == "evict":  # the eviction lock, kept by design
                continue
            bad.append(os.path.join(rel, name))
    return bad


def _run_script(tmp_path: Path, name: str, source: str, *args: str,
                stdout: Any = subprocess.DEVNULL, timeout: float = 120.0
                ) -> subprocess.CompletedProcess:
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, "-X", "faulthandler", str(script), *args],
                          env=worker_env(), stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def fusions(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, dict[str, str]]:
    """The fusions module (imported here, untouched by any compile yet) and the digests of
    their artifacts compiled one at a time in another process (no memo, no threads)."""
    root = tmp_path_factory.mktemp("r32_fusions")
    src = root / "r32_fusions.py"
    src.write_text(FUSIONS_SRC)
    ref = subprocess.run([sys.executable, "-c", REF_SCRIPT, str(src)], env=worker_env(),
                         capture_output=True, text=True, timeout=120, check=False)
    assert ref.returncode == 0, ref.stderr
    spec = importlib.util.spec_from_file_location("r32_fusions_under_test", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, json.loads(ref.stdout)


# ---- right: each compile gets the code of its own key ------------------------------------------
def test_global_changed_by_threads_gives_each_compile_its_own_values_code(
        tmp_path: Path, fusions: tuple[ModuleType, dict[str, str]]) -> None:
    mod, ref = fusions
    f = mod.r32_global
    mismatches: list[tuple[int, str, str]] = []
    for phase in ("cache", "cache again", "no cache"):
        cache = _cache(tmp_path) if phase != "no cache" else None

        def work(i: int, cache: kp.Cache | None = cache) -> list[tuple[int, str, str]]:
            out = []
            for k in range(4):
                mod.G = (i + k) % 6  # races with the other threads on purpose
                c = kp.compile(f, targets=T80, cache=cache)
                g = int(c.summary.outputs[0].name[1:])  # the value this trace read
                out.append((g, _digest(c), c.origin))
            return out

        for got in _threads(12, work):
            mismatches += [(g, d, phase) for g, d, _ in got if d != ref[f"global{g}"]]
        if cache is not None:
            assert cache.stats()["compiles"] <= 6, (phase, cache.stats())
    assert not mismatches, mismatches[:3]
    # Every entry on disk holds the code of the key it is filed under.
    fresh = _cache(tmp_path)
    for g in range(6):
        mod.G = g
        c = kp.compile(f, targets=T80, cache=fresh)
        assert c.origin == "disk" and _digest(c) == ref[f"global{g}"], g
    mod.G = 0


def test_one_compile_per_key_across_threads_and_cache_objects_no_torn_files(
        tmp_path: Path, fusions: tuple[ModuleType, dict[str, str]]) -> None:
    """8 threads, each with its own Cache on one directory (two libraries of one service),
    8 fusions asked in rotated orders: each compiled once, every result byte-identical to a
    single-threaded compile, every entry loads and verifies, nothing else is left."""
    mod, ref = fusions
    mod.G = 0
    caches = [_cache(tmp_path) for _ in range(8)]

    def work(i: int) -> list[tuple[int, str, str]]:
        out = []
        for k in range(8):
            j = (i * 3 + k) % 8
            c = kp.compile(mod.PW[j], targets=T80, cache=caches[i])
            out.append((j, _digest(c), c.origin))
        return out

    results = [r for rs in _threads(8, work) for r in rs]
    assert [r for r in results if r[1] != ref[f"pw{r[0]}"]] == []
    assert sum(1 for r in results if r[2] == "compiled") == 8
    assert sum(c.stats()["compiles"] for c in caches) == 8
    assert sum(c.stats()["puts"] for c in caches) == 8
    entries = sorted(glob.glob(str(tmp_path / "entries" / "*" / "*.kpack")))
    assert len(entries) == 8
    for e in entries:
        pack = kp.load(e)
        pack.verify()
        assert len(pack.programs) == 1
    assert _leftovers(tmp_path) == []


def test_loads_plans_and_summaries_from_threads_equal_a_single_thread(
        tmp_path: Path, fusions: tuple[ModuleType, dict[str, str]]) -> None:
    mod, _ = fusions
    mod.G = 0
    programs = [kp.compile(f, targets=T80) for f in (mod.r32_rows, mod.r32_total, *mod.PW[:2])]
    path = tmp_path / "model.kpack"
    kp.save(programs, path)
    shapes = {"r32_rows": [(4, 100), (1, 1 << 20), (1000, 3), (2, 70000), (0, 5)],
              "r32_total": [(10,), (1 << 22,), (0,)],
              "r32_pw0": [(7,), (1 << 20,)], "r32_pw1": [(1,)]}

    def facts(pack: Any) -> dict[Any, str]:
        out: dict[Any, str] = {}
        for name in pack.programs:
            prog = pack[name]
            for shape in shapes[name]:
                args = [shape] + ([0.5] if "_pw" in name else [])
                out[(name, shape)] = repr(prog.plan(*args))
            out[(name, "summary")] = repr(prog.summary)
            out[(name, "images")] = repr(sorted(
                (im.target, hashlib.sha256(bytes(im.data)).hexdigest())
                for m in prog.compiled().modules for im in m.images))
        return out

    expected = facts(kp.load(path))
    for _ in range(3):
        shared = kp.load(path)  # nothing decoded yet: the threads race for the lazy parts

        def work(i: int, shared: Any = shared) -> dict[Any, str]:
            pack = shared if i % 2 else kp.load(path)
            if i % 4 == 1:
                pack.verify()
            return facts(pack)

        assert all(got == expected for got in _threads(16, work))


def test_explained_misses_name_each_threads_own_program_and_key(
        tmp_path: Path, fusions: tuple[ModuleType, dict[str, str]]) -> None:
    mod, _ = fusions
    cache = _cache(tmp_path, explain_misses=True)
    mod.G = 0
    for f in mod.PW:
        kp.compile(f, targets=T80, cache=cache)
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("kernelpack.cache")
    handler, level = Grab(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        mod.G = 1
        origins = _threads(8, lambda i: kp.compile(mod.PW[i], targets=T80, cache=cache).origin)
    finally:
        mod.G = 0
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert origins == ["compiled"] * 8
    misses = [r for r in records if r.startswith("cache miss")]
    assert len(misses) == 8, records
    for i in range(8):
        name = f"r32_pw{i}"
        mine = [r for r in misses if f"program '{name}'" in r]
        assert len(mine) == 1, (name, misses)
        old = fusion_key(mod.PW[i], T80, None, {})  # G is 0 again: the recorded key
        assert f"recorded key {old.digest[:16]}" in mine[0], mine[0]


def test_clear_and_prune_racing_compiles_cost_only_recompiles(
        tmp_path: Path, fusions: tuple[ModuleType, dict[str, str]]) -> None:
    mod, ref = fusions
    mod.G = 0
    cache = _cache(tmp_path)
    other = _cache(tmp_path)
    stop = threading.Event()

    def clearer(mode: int) -> int:
        n = 0
        while not stop.is_set():
            (cache.clear, lambda: cache.prune(0), other.clear)[mode]()
            n += 1
            stop.wait(0.005)
        return n

    def worker(i: int) -> list[bool]:
        return [_digest(kp.compile(mod.PW[(i + k) % 4], targets=T80, cache=cache))
                == ref[f"pw{(i + k) % 4}"] for k in range(8)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cf.ThreadPoolExecutor(9) as ex:
            clearers = [ex.submit(clearer, m) for m in range(3)]
            workers = [ex.submit(worker, i) for i in range(6)]
            try:
                results = [w.result(WAIT_S) for w in workers]
            finally:
                stop.set()
            assert all(c.result(WAIT_S) > 0 for c in clearers)
    assert all(all(r) for r in results)
    assert [str(w.message) for w in caught] == []
    assert cache.stats()["errors"] == 0


# ---- bugs: Cache.stats() and warnings under contention ----------------------------------------
def test_stats_count_each_call_once_when_threads_wait_for_one_compile(tmp_path: Path) -> None:
    """One thread alone: a compile is 1 disk miss, a hit 1 disk hit. 8 threads asking for one
    missing key: 1 compile, 7 hits, so hits + misses must be 8 (a dashboard's hit rate), not
    15 (every waiter counted as a miss and then as a hit)."""
    for rep in range(2):
        f = _fusion(f'''
            def f(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
                return kp.tanh(x * s) + {rep + 40}
        ''', name=f"r32_stats{rep}")
        cache = _cache(tmp_path / str(rep))
        origins = _threads(8, lambda i, f=f, c=cache: kp.compile(f, targets=T80,
                                                                 cache=c).origin)
        s = cache.stats()
        assert sorted(origins) == ["compiled"] + ["disk"] * 7
        assert (s["compiles"], s["disk_hits"], s["disk_misses"]) == (1, 7, 1), s


def test_one_corrupt_entry_read_by_many_threads_warns_once_and_counts_once(
        tmp_path: Path) -> None:
    f = _fusion('''
        def f(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
            return kp.tanh(x * s) + 77
    ''', name="r32_corrupt")
    key = fusion_key(f, T80, None, {}).digest
    kp.compile(f, targets=T80, cache=_cache(tmp_path / "good"))
    (good,) = glob.glob(str(tmp_path / "good" / "entries" / "*" / f"{key}.kpack"))
    bad = bytearray(Path(good).read_bytes())
    bad[len(bad) // 2] ^= 0xFF  # an image byte: the digest check fails
    rel = os.path.relpath(good, tmp_path / "good")
    for rep in range(6):
        root = tmp_path / f"rep{rep}"
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_bytes(bytes(bad))
        cache = _cache(root)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            origins = _threads(8, lambda i, c=cache: kp.compile(f, targets=T80,
                                                                cache=c).origin)
        msgs = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
        s = cache.stats()
        assert sorted(origins) == ["compiled"] + ["disk"] * 7
        assert len(glob.glob(str(root / "quarantine" / "*"))) == 1
        assert (s["compiles"], s["quarantined"]) == (1, 1), (rep, s, msgs)
        assert len(msgs) == 1 and key[:16] in msgs[0], (rep, msgs)
        assert "another process" not in msgs[0]


@pytest.mark.redis
def test_close_while_other_threads_read_the_remote_keeps_the_remote(
        tmp_path: Path, redis_server: RedisServer, signing_keys: tuple[Path, Path],
        axpy_cubin: bytes) -> None:
    """``close()``: "the cache stays usable: a later remote command reconnects". One thread
    closing a shared Cache while 8 others read 160 signed remote entries must not cost the
    others their hits (nor switch the remote off for 30 s while Redis is up)."""
    private, public = signing_keys
    buf = io.BytesIO()
    kp.save([from_cubin("r32_axpy", axpy_cubin)], buf)
    data = buf.getvalue()

    def fleet(path: Path) -> kp.Cache:
        return kp.Cache(path, remote=redis_server.url, sign_with=str(private),
                        trusted_keys=[str(public)], timeout_s=5.0)

    keys = [hashlib.sha256(b"r32-close-%d" % i).hexdigest() for i in range(160)]
    writer = fleet(tmp_path / "writer")
    for k in keys:
        writer.put(k, data)
    stored = writer.get(keys[0])  # ``data`` re-signed with ``sign_with``, as put stores it
    assert stored is not None
    for rep in range(6):
        cache = fleet(tmp_path / f"reader{rep}")
        done = [0]
        lock = threading.Lock()

        def closer(cache: kp.Cache = cache, done: list[int] = done) -> None:
            deadline = time.monotonic() + WAIT_S
            while done[0] < 40 and time.monotonic() < deadline:
                time.sleep(0.001)
            cache.close()

        def getter(i: int, cache: kp.Cache = cache, done: list[int] = done,
                   lock: threading.Lock = lock) -> list[bool]:
            out = []
            for k in keys[i::8]:
                out.append(cache.get(k) == stored)
                with lock:
                    done[0] += 1
            return out

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cf.ThreadPoolExecutor(9) as ex:
                c = ex.submit(closer)
                got = [g.result(WAIT_S) for g in [ex.submit(getter, i) for i in range(8)]]
                c.result(WAIT_S)
        s = cache.stats()
        assert [str(w.message) for w in caught] == [], (rep, s)
        assert all(all(g) for g in got) and s["remote_hits"] == 160, (rep, s)


# ---- bugs: kernelpack.cli.main from threads --------------------------------------------------
CLI_THREADS = '''
import concurrent.futures as cf, json, sys, threading
import kernelpack.cli as cli
path, report = sys.argv[1], sys.argv[2]
original = sys.stdout
rounds = []
for r in range(6):
    barrier = threading.Barrier(8)
    def run(i):
        barrier.wait(60)
        args = [["verify", path], ["inspect", path, "--json"], ["inspect", path],
                ["diff", path, path]][i % 4]
        try:
            return cli.main(args)
        except BaseException as exc:
            return repr(exc)
    with cf.ThreadPoolExecutor(8) as ex:
        statuses = [f.result(60) for f in [ex.submit(run, i) for i in range(8)]]
    rounds.append({"statuses": statuses, "stdout_restored": sys.stdout is original,
                   "stdout": type(sys.stdout).__module__ + "." + type(sys.stdout).__name__})
    sys.stdout = original  # each round starts clean
with open(report, "w") as fh:
    json.dump(rounds, fh)
'''


def test_cli_main_from_threads_leaves_sys_stdout_alone_and_does_not_crash(
        tmp_path: Path, axpy_cubin: bytes) -> None:
    artifact = tmp_path / "a.kpack"
    kp.save([from_cubin("r32_axpy", axpy_cubin)], artifact)
    report = tmp_path / "report.json"
    proc = _run_script(tmp_path, "cli_threads.py", CLI_THREADS, str(artifact), str(report))
    assert proc.returncode == 0, f"process died ({proc.returncode}): {proc.stderr[-2000:]}"
    rounds = json.loads(report.read_text())
    assert all(r["statuses"] == [0] * 8 for r in rounds), rounds
    assert all(r["stdout_restored"] for r in rounds), rounds


CLI_FULL = '''
import concurrent.futures as cf, json, sys, threading
import kernelpack.cli as cli
path, report = sys.argv[1], sys.argv[2]
statuses = [cli.main(["verify", path]), cli.main(["verify", path])]
with cf.ThreadPoolExecutor(4) as ex:
    statuses += [f.result(60) for f in [ex.submit(cli.main, ["verify", path]) for _ in range(4)]]
with open(report, "w") as fh:
    json.dump(statuses, fh)
'''


def test_cli_main_unwritable_stdout_fails_every_call_not_only_the_first(
        tmp_path: Path, axpy_cubin: bytes) -> None:
    """README: exit status 1 for an I/O error, "stdout that cannot be written, as
    > /dev/full, included". In a process calling ``cli.main`` more than once (threads of a
    service), each call whose output is lost must say so."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    artifact = tmp_path / "a.kpack"
    kp.save([from_cubin("r32_axpy", axpy_cubin)], artifact)
    report = tmp_path / "report.json"
    with open("/dev/full", "w") as full:
        proc = _run_script(tmp_path, "cli_full.py", CLI_FULL, str(artifact), str(report),
                           stdout=full)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(report.read_text()) == [1] * 6, proc.stderr


BUILD_THREADS = '''
import concurrent.futures as cf, json, sys, threading
import kernelpack as kp, kernelpack.cli as cli
root, report = sys.argv[1], sys.argv[2]
def build(i):
    status = cli.main(["build", f"{root}/proj{i}/kernels.py", "-o", f"{root}/out{i}.kpack",
                       "--targets", "sm_80", "-q"])
    if status != 0:
        return status
    return [t.name for t in kp.load(f"{root}/out{i}.kpack")["k"].summary.outputs]
results = [build(0)]  # one project built first, as a service would
barrier = threading.Barrier(3)
def run(i):
    barrier.wait(60)
    return build(i)
with cf.ThreadPoolExecutor(3) as ex:
    results += [f.result(120) for f in [ex.submit(run, i) for i in (1, 2, 3)]]
with open(report, "w") as fh:
    json.dump(results, fh)
'''


def test_in_process_builds_use_each_projects_own_sibling_modules(tmp_path: Path) -> None:
    """Four projects, each ``kernels.py`` beside its own ``r32_helpers.py``. Built by
    ``cli.main(["build", ...])`` in one process (first one, then three threads), each
    artifact must come from its own project's helper, as four ``kernelpack build`` runs
    give."""
    for i in range(4):
        proj = tmp_path / f"proj{i}"
        proj.mkdir()
        (proj / "r32_helpers.py").write_text(f'OUT = "from_project{i}"\n')
        (proj / "kernels.py").write_text(textwrap.dedent('''
            import kernelpack as kp
            from r32_helpers import OUT


            @kp.fusion
            def k(x: kp.Tensor[kp.f32, "n"], s: kp.f32):
                return {OUT: x * s}
        '''))
    report = tmp_path / "report.json"
    proc = _run_script(tmp_path, "build_threads.py", BUILD_THREADS, str(tmp_path), str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(report.read_text()) == [[f"from_project{i}"] for i in range(4)]
