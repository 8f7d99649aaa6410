"""Review 31: the identity of a fusion in the compile-or-load cache (stale or missed hits),
black-box through ``kp.compile(f, cache=kp.Cache(...))``, ``Compiled ==``, ``.origin``, the
``kernelpack.cache`` miss explanations and the disk tier's files, with real fusions compiled
for ``sm_80`` (nvJitLink, no GPU).

Bugs (each test fails today):

* ``kp.compile`` traces a fusion twice: once for the key (and the in-process memo), once for
  the code. A value the trace reads that changes between the two (another thread, a config
  reload while the compile waits for the disk lock or the remote) files the *new* code under
  the *old* key, on disk and on the remote: every later process asking for the old fusion is
  served the other kernel (``test_a_value_changed_during_the_remote_lookup_...``). The memo of
  recent compiles has the same split (``test_the_memo_holds_the_code_of_the_trace_...``).
* A miss explanation (``KERNELPACK_CACHE_EXPLAIN`` / ``explain_misses=True``) compares with
  whichever recorded key sorts first among equally near ones, usually another program's, and
  names no program (``test_a_miss_is_explained_against_the_same_programs_...``).
* Decided, not changed: an older build of the same program for the same targets, copied by
  hand under a newer key's file name, is served (nothing in an artifact records its key; the
  disk directory is this machine's own). The README used to claim any copy under another
  key's name fails the hit checks; it now says which copies do.

Right (regression tests): edits a trace reads (a helper in another module, reloaded; dynamic
dispatch; a helper's default argument; closures made in a loop, whose ids are reused) miss, and
undoing them hits; the same fusion defined from a file, ``python -c``, stdin and ``exec``,
under other hash seeds, working directories and ``sys.path`` orders hits one entry.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp

from .conftest import worker_env

T80 = ["sm_80"]
F32N = kp.Tensor[kp.f32, "n"]


def _cache(path: Path, **kw: Any) -> kp.Cache:
    kw.setdefault("remote", False)
    return kp.Cache(path, **kw)


def _records(root: Path) -> set[str]:
    """Digests of the keys recorded under ``root`` (one ``keys/xx/<digest>.json`` each)."""
    return {p.name[:-5] for p in (root / "keys").glob("*/*.json")}


def _entry(root: Path, digest: str) -> Path:
    return root / "entries" / digest[:2] / f"{digest}.kpack"


# ---- bugs -------------------------------------------------------------------------------------
class _ChangingStore:
    """A remote store (``get``/``put``, as ``kp.Cache(remote=...)`` takes) during whose first
    lookup ``change()`` runs: another thread of the process editing a value the fusion reads
    while this compile waits on the network (up to ``timeout_s``, or ``wait_s`` for another
    machine's compile lock)."""

    def __init__(self, change: Callable[[], None]) -> None:
        self.change: Callable[[], None] | None = change
        self.puts: dict[str, bytes] = {}

    def get(self, key: object) -> bytes | None:
        if self.change is not None:
            change, self.change = self.change, None
            change()
        return None

    def put(self, key: object, data: bytes) -> None:
        self.puts[str(key)] = bytes(data)


def test_a_value_changed_during_the_remote_lookup_is_not_filed_under_the_old_key(
        tmp_path: Path) -> None:
    """The key comes from one trace (scale 2.0) and the code from another (scale 3.0): the
    entry for ``x * 2.0`` must not hold the kernel of ``x * 3.0``. Today it does, on disk and
    on the remote, so every later process asking for ``x * 2.0`` runs ``x * 3.0``."""
    conf = {"scale": 2.0}

    @kp.fusion(name="r31_scaled")
    def scaled(x: F32N):
        return x * conf["scale"]

    store = _ChangingStore(lambda: conf.update(scale=3.0))
    kp.compile(scaled, targets=T80,
               cache=kp.Cache(tmp_path, remote=store, require_signed_remote=False))
    assert conf["scale"] == 3.0, "the store was never asked: the test did not run its race"

    plain = _cache(tmp_path)
    conf["scale"] = 3.0
    three = kp.compile(scaled, targets=T80, cache=plain)
    conf["scale"] = 2.0
    two = kp.compile(scaled, targets=T80, cache=plain)
    assert two != three, (
        "the disk entry of `x * 2.0` holds the kernel of `x * 3.0`: the key was computed from "
        "one trace and the code from another (the remote got the same entry: "
        f"{sorted(k[:16] for k in store.puts)})")


def test_the_memo_holds_the_code_of_the_trace_its_key_came_from() -> None:
    """The process-wide memo of recent compiles (README, "Compile services") is keyed like the
    cache. A fusion whose constant changed while it compiled (here: right after the first
    read, as a config reload in another thread would) must not make a later compile of the
    *unchanged* value return the other value's code."""
    conf = {"scale": 5.0, "reads": 0}

    def scale() -> float:
        value = conf["scale"]
        conf["reads"] += 1
        if conf["reads"] == 1:
            conf["scale"] = 7.0  # a reload lands while kp.compile runs
        return value

    @kp.fusion(name="r31_memo_scaled")
    def scaled(x: F32N):
        return x * scale()

    kp.compile(scaled, targets=T80)
    conf["reads"] = 2  # from now on the value is stable
    conf["scale"] = 7.0
    seven = kp.compile(scaled, targets=T80)
    conf["scale"] = 5.0
    five = kp.compile(scaled, targets=T80)
    assert five != seven, ("kp.compile of `x * 5.0` returned the kernel of `x * 7.0` from the "
                           "memo: its key came from one trace and its code from another")


def test_a_miss_is_explained_against_the_same_programs_previous_key(tmp_path: Path) -> None:
    """README: ``KERNELPACK_CACHE_EXPLAIN`` logs "the nearest recorded key and the parts that
    differ". After an edit of one fusion among several, every recorded key differs from the new
    one in ``source`` alone, so the nearest must be that fusion's own previous key (the one a
    user debugging "why does softmax recompile" needs), and the line should name the program.
    Today the tie goes to whichever digest sorts first: another program's key."""
    seen: list[str] = []

    class _Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("kernelpack.cache")
    handler, level = _Handler(level=logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        cache = _cache(tmp_path, explain_misses=True)
        consts = {f"r31_prog{i}": float(i + 1) for i in range(6)}
        fusions, first_key = {}, {}
        for name in consts:
            fusions[name] = kp.fusion(name=name)(_bind(name, consts))
            before = _records(tmp_path)
            kp.compile(fusions[name], targets=T80, cache=cache)
            (first_key[name],) = _records(tmp_path) - before
        # the program whose key sorts last: every other program's key sorts before it
        edited = max(first_key, key=first_key.__getitem__)
        consts[edited] += 100.0
        seen.clear()
        kp.compile(fusions[edited], targets=T80, cache=cache)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    misses = [m for m in seen if "cache miss" in m]
    assert len(misses) == 1, seen
    others = {n: k[:16] for n, k in first_key.items() if n != edited}
    assert first_key[edited][:16] in misses[0], (
        f"the miss of {edited!r} (edited) is explained against another program's key "
        f"(keys of the others: {others}): {misses[0]!r}")
    assert edited in misses[0], f"the explanation does not name the program: {misses[0]!r}"


def _bind(name: str, consts: dict[str, float]) -> Callable[..., Any]:
    def f(x: F32N):
        return x * consts[name] + 1.0
    return f


def test_edits_a_trace_reads_miss_and_undoing_them_hits(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper in another module edited on disk and reloaded, a dispatch table entry, and a
    helper's default argument: each edit compiles new code (never the old entry), and undoing
    it is a disk hit equal to the first compile."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    helper_src = "def helper(x):\n    return x * {k}\n"
    (moddir / "r31_helpers.py").write_text(helper_src.format(k="2.0"))
    monkeypatch.syspath_prepend(str(moddir))
    helpers = importlib.import_module("r31_helpers")

    def defaulted(x, k=2.0):  # a helper the trace calls
        return x + k

    table = {"act": kp.sigmoid}

    @kp.fusion(name="r31_edits")
    def f(x: F32N):
        return table["act"](defaulted(helpers.helper(x)))

    cache = _cache(tmp_path / "cache")
    first = kp.compile(f, targets=T80, cache=cache)

    def reload(k: str) -> None:
        (moddir / "r31_helpers.py").write_text(helper_src.format(k=k))
        importlib.invalidate_caches()
        os.utime(moddir / "r31_helpers.py", (1, 1) if k == "2.0" else (2, 2))
        importlib.reload(helpers)

    edits: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("helper module", lambda: reload("3.0"), lambda: reload("2.0")),
        ("dispatch", lambda: table.update(act=kp.tanh), lambda: table.update(act=kp.sigmoid)),
        ("default argument", lambda: setattr(defaulted, "__defaults__", (4.0,)),
         lambda: setattr(defaulted, "__defaults__", (2.0,))),
    ]
    for what, edit, undo in edits:
        edit()
        changed = kp.compile(f, targets=T80, cache=cache)
        undo()
        again = kp.compile(f, targets=T80, cache=cache)
        assert changed.origin == "compiled" and changed != first, what
        assert again.origin == "disk" and again == first, what


def test_closures_made_in_a_loop_are_distinct_programs_despite_reused_ids(tmp_path: Path) -> None:
    """Same code, same name, different closure values, each fusion dropped before the next is
    made (so CPython reuses its id): every one compiles its own kernel, and the first again is
    a disk hit equal to its first compile."""
    cache = _cache(tmp_path)

    def make(k: float) -> Any:
        @kp.fusion(name="r31_loop")
        def f(x: F32N):
            return x * k
        return f

    results = []
    for k in (1.5, 2.5, 3.5):
        f = make(k)
        results.append(kp.compile(f, targets=T80, cache=cache))
        del f
        gc.collect()
    assert [r.origin for r in results] == ["compiled"] * 3
    assert len(set(results)) == 3
    again = kp.compile(make(1.5), targets=T80, cache=cache)
    assert again.origin == "disk" and again == results[0]


# ---- right: one fusion, many ways of defining and running it, one entry -----------------------
_SOURCE = textwrap.dedent('''
    import kernelpack as kp
    SCALE = 0.5

    @kp.fusion
    def r31_soft(x: kp.Tensor[kp.f32, "b", "n"], y: kp.Tensor[kp.f16, "n"], s: kp.f32):
        z = x * s + y.astype(kp.f32) * SCALE
        e = kp.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True), (z > 0).astype(kp.i32).sum()
''')

_REPORT = textwrap.dedent('''
    import hashlib, sys
    c = kp.Cache(sys.argv[1], remote=False)
    r = kp.compile(r31_soft, targets={targets}, cache=c)
    images = b"".join(i.data for m in r.modules for i in m.images)
    print(r.origin, hashlib.sha256(images).hexdigest())
''')


def _run(args: list[str], *, cwd: Path, seed: str, stdin: str | None = None,
         pythonpath: list[Path] = ()) -> tuple[str, str]:
    env = worker_env()
    env["PYTHONHASHSEED"] = seed
    env.pop("KERNELPACK_CACHE_EXPLAIN", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    origin, digest = proc.stdout.split()[-2:]
    return origin, digest


def test_one_fusion_defined_five_ways_in_five_processes_is_one_entry(tmp_path: Path) -> None:
    """A module file (two copies at two paths, other sys.path orders), ``python -c``, stdin
    (``python -``) and ``exec`` of the text with no file: other hash seeds and working
    directories, targets in another order. The first compiles, every other one is a disk hit of
    the same bytes, and the cache holds one entry."""
    cache = tmp_path / "cache"
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "r31_kmod.py").write_text(_SOURCE)
    script = _REPORT.format(targets='["sm_80", "ptx"]')
    module_run = "from r31_kmod import r31_soft\nimport kernelpack as kp\n" + script
    runs = [
        _run(["-c", module_run, str(cache)], cwd=a, seed="1", pythonpath=[a]),
        _run(["-c", module_run, str(cache)], cwd=tmp_path, seed="2", pythonpath=[b, a]),
        _run(["-c", _SOURCE + _REPORT.format(targets='["ptx", "sm_80"]'), str(cache)],
             cwd=b, seed="3"),
        _run(["-", str(cache)], cwd=Path("/"), seed="4", stdin=_SOURCE + script),
        _run(["-c", "import kernelpack as kp\nns = {}\n"
              f"exec(compile({_SOURCE!r}, '<cell>', 'exec'), ns)\nr31_soft = ns['r31_soft']\n"
              + script, str(cache)], cwd=a, seed="5"),
    ]
    assert [o for o, _ in runs] == ["compiled"] + ["disk"] * 4, runs
    assert len({d for _, d in runs}) == 1
    assert len(list((cache / "entries").glob("*/*.kpack"))) == 1
