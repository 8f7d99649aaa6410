"""Review 29: kernelpack inside a long-running, many-threaded inference server, black-box.

The angle: races, leaks and half-states. Threads at a pack's first access (lazy decoding,
binding, module loads, ``warmup()``) through both doors to the fake driver (the
cuda.bindings-shaped fake and kernelpack's own ctypes/C door over the C-level fake); ``kp.save``
over a path that threads and processes keep loading, and a writer SIGKILLed mid-save; the
compile cache under threads, processes, eviction pressure, Redis and ``fork``; descriptors,
mappings, host memory and driver modules over thousands of loads, calls and short-lived
threads; ``os.fork()`` after loads, warmups and in the middle of other threads' calls.

Bugs (each test fails today):

* a process forked while another thread of the parent is compiling key K (inside
  ``Cache.fetch_or_compile``) hangs for ever when it asks for K: it inherited the descriptor
  holding the parent's lock on K's lock file, and its own ``flock`` on a new descriptor waits
  for itself (``test_forked_child_asking_for_a_key_the_parent_is_compiling_does_not_hang``);
  and a forked worker that never touches the cache keeps that lock as long as it lives, so
  *another* process waiting for K stays blocked after the parent is done
  (``test_a_forked_worker_that_never_uses_the_cache_does_not_block_other_processes``);
* a ``kp.save`` killed mid-write leaves its ``.NAME.XXXX.tmp`` beside the artifact, and no
  later save (nor anything else) removes it: one more file per crash, without bound
  (``test_killed_savers_leave_no_growing_pile_of_temporaries``);
* a dropped and collected pack never unloads its modules: a server that reloads new versions
  of its artifacts keeps every version's code resident on the GPU
  (``test_dropped_packs_do_not_keep_their_modules_loaded``);
* every live pack read from a file over 1 MiB holds two descriptors of that file (the file and
  the mapping's own duplicate): a server with a few hundred artifacts reaches the common
  1024-descriptor limit twice as early (``OSError: Too many open files`` from ``kp.load``)
  (``test_live_mapped_packs_hold_at_most_one_descriptor_each``).

The rest passes: many threads at a first call or ``warmup()`` load each module once and launch
on their own streams; threads waiting on a first load that fails get a LaunchError or a correct
result, and the next call loads; an interrupt inside the first load leaves nothing behind;
readers of a path that is saved over see the old or the new artifact, never a torn one (threads
and processes, mapped and read files, packs loaded before the replacement included); a killed
writer leaves the old artifact at the path; the cache compiles each key once across threads and
processes, survives eviction while other threads read, and shares one Redis connection between
threads and across ``fork``; no descriptor, mapping or host memory grows over thousands of loads
(corrupt files included), calls or exiting threads; a child forked after a launch or a warmup
gets the README's DeviceError (never a hang, even while other threads are launching), and one
forked before any launch, from a memory-mapped pack, plans, verifies and launches.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

import kernelpack as kp
from kernelpack.errors import KernelPackError, LaunchError
from kernelpack.summary import Compiled, Image, KernelSummary, Launch, Module, Variant

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "runtime"))
from kp_samples import axpy  # noqa: E402

from c_fake_driver import CFakeLibcuda  # noqa: E402
from fake_driver import CUresult, FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, _axpy_impl, axpby  # noqa: E402

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


# ---- helpers ---------------------------------------------------------------------------------
def _prog(name: str, module: str) -> Compiled:
    """axpby (z = a*x + y) as program ``name`` in its own module ``module``, whose image bytes
    name the module (so the fake's loads show which module was loaded)."""
    s = axpby().summary
    launch = s.variants[0].launches[0]
    moved = Launch(launch.kernel, module, launch.grid, launch.block, launch.args)
    image = Image("cubin", "sm_90", b"\x7fELF-" + module.encode(), "fake", 13000)
    return Compiled(KernelSummary(name, s.params, (Variant((moved,)),)),
                    (Module(module, ("axpby",), (image,)),))


def _values(z: Any) -> list:
    return list(struct.unpack(f"<{z.shape[0]}f", z.copy_to_host()))


def _loads(fake: FakeDriver) -> collections.Counter:
    """How many times each image was handed to cuLibraryLoadData."""
    return collections.Counter(c[1] for c in fake.calls if c[0] == "cuLibraryLoadData")


def _slow_loads(fake: FakeDriver, seconds: float = 0.02) -> None:
    """A module load that takes a while, as a real one does: it widens every race window."""
    real = fake.cuLibraryLoadData

    def slow(*args: Any) -> tuple:
        time.sleep(seconds)
        return real(*args)

    fake.cuLibraryLoadData = slow


def _run_threads(n: int, target: Callable[[int], None], timeout: float = 60.0) -> list:
    """Run ``target(i)`` in ``n`` threads; the exceptions they raised (a thread still running
    after ``timeout`` is one too)."""
    errors: list = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    errors += [("hung", t.name) for t in threads if t.is_alive()]
    return errors


def _in_child(body: Callable[[], str], alarm_s: int = 20) -> str:
    """``body()`` in a forked child: its text, its error as ``Type: message``, or ``HUNG`` when
    it ran past ``alarm_s`` (SIGALRM ends it, so a hang cannot hang the suite)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read)
        try:
            signal.alarm(alarm_s)
            text = body()
        except BaseException as exc:  # noqa: BLE001 - sent to the parent
            text = f"{type(exc).__name__}: {exc}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return f"HUNG (killed by SIGALRM after {alarm_s} s)"
    assert os.WIFEXITED(status), f"child ended with status {status}"
    return b"".join(chunks).decode()


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("KERNELPACK_REMOTE_CACHE", None)
    return env


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _big(tag: str, programs: int = 2, image_bytes: int = 600 << 10) -> list:
    """Programs whose artifact passes 1 MiB (kp.load maps such a file instead of reading it)."""
    return [axpy(f"{tag}{i}", module=f"{tag}m{i}",
                 images=(Image("cubin", "sm_90",
                               b"\x7fELF" + random.Random(f"{tag}{i}").randbytes(image_bytes),
                               "t", 13000),))
            for i in range(programs)]


@pytest.fixture(params=["bindings", "libcuda"])
def door(request, monkeypatch) -> FakeDriver:
    """The fake driver behind either door: as cuda.bindings (``install`` alone), or behind
    kernelpack's own ctypes/C door (``LibCuda`` over the C-level fake), the one a Linux
    install uses by default. Each thread has its own current context and context stack, as
    with a real driver: the fake's single shared stack raced between threads that push and
    pop (a lost push, then IndexError on a pop, under load)."""
    fake = FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl), "axpy": ("QQfI", _axpy_impl)},
                      thread_contexts=True)
    if request.param == "libcuda":
        from kernelpack.runtime.libcuda import LibCuda

        try:
            from kernelpack.runtime import _launch  # noqa: F401
        except ImportError:  # (Python 3.10, or no compiler at install)
            pytest.skip("without the C extension launches go through cuda.bindings' "
                        "cuLaunchKernel, which looks for a real driver")
        c = CFakeLibcuda(fake)
        install(monkeypatch, LibCuda(c.get_proc_address, False))
        fake.c_door = c  # kept alive with the fake
    else:
        install(monkeypatch, fake)
    yield fake
    assert not fake.callback_errors, fake.callback_errors


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl),
                                                    "axpy": ("QQfI", _axpy_impl)}))


# ---- threads at a pack's first access ---------------------------------------------------------
def test_first_calls_and_warmups_from_many_threads_load_each_module_once(door) -> None:
    """Twelve programs in four modules, nothing decoded or bound yet: twelve threads call all
    of them in different orders (half on a stream of their own), three more run warmup()."""
    _slow_loads(door)
    pack = kp.load(kp.save([_prog(f"p{i}", f"m{i % 4}") for i in range(12)]))
    n = 12
    barrier = threading.Barrier(n + 3, timeout=30)
    wrong: list = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def work(i: int) -> None:
        if i >= n:
            barrier.wait()
            pack.warmup()
            return
        x, y = HostArray([float(i)] * (i + 1)), HostArray([1.0] * (i + 1))
        barrier.wait()
        for k in range(12):
            name = f"p{(i + 5 * k) % 12}"
            z = pack[name](x, y, 2.0, stream=1000 + i) if i % 2 else pack[name](x, y, 2.0)
            if _values(z) != [2.0 * i + 1.0] * (i + 1):
                wrong.append((i, name, _values(z)))

    try:
        errors = _run_threads(n + 3, work)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    assert not wrong, wrong[:5]
    assert _loads(door) == {b"\x7fELF-m%d" % m: 1 for m in range(4)}, _loads(door)
    launches = [c for c in door.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == n * 12
    for c in launches:  # values: x, y, z, a, n32; thread i launched n = i + 1 elements
        i = c[6][4] - 1
        if i % 2:
            assert c[5] == 1000 + i, f"thread {i}'s launch went to stream {c[5]}"
        else:
            assert not 1000 <= c[5] < 1000 + n, f"thread {i} launched on stream {c[5]}"


def test_threads_that_each_load_the_pack_share_one_module(door) -> None:
    _slow_loads(door)
    data = kp.save([_prog("p", "m")])
    barrier = threading.Barrier(12, timeout=30)

    def work(i: int) -> None:
        barrier.wait()
        pack = kp.load(data)
        for _ in range(3):
            z = pack["p"](HostArray([float(i)]), HostArray([1.0]), 2.0)
            assert _values(z) == [2.0 * i + 1.0]

    assert not _run_threads(12, work)
    assert _loads(door) == {b"\x7fELF-m": 1}


def test_warmup_from_several_threads_then_calls_load_nothing_more(door) -> None:
    _slow_loads(door)
    pack = kp.load(kp.save([_prog(f"p{i}", f"m{i % 3}") for i in range(6)]))
    barrier = threading.Barrier(6, timeout=30)

    def warm(i: int) -> None:
        barrier.wait()
        pack.warmup()

    assert not _run_threads(6, warm)
    assert _loads(door) == {b"\x7fELF-m%d" % m: 1 for m in range(3)}
    for i in range(6):
        assert _values(pack[f"p{i}"](HostArray([1.0]), HostArray([1.0]), 1.0)) == [2.0]
    assert sum(_loads(door).values()) == 3


def test_threads_waiting_on_a_first_load_that_fails(door) -> None:
    """The first load fails (slowly) while seven more threads wait for it: each gets a
    LaunchError or a correct result, none hangs, and the program works afterwards."""
    real = door.cuLibraryLoadData
    attempts = [0]

    def first_fails(code: bytes, *rest: Any) -> tuple:
        attempts[0] += 1
        time.sleep(0.1)
        if attempts[0] == 1:
            door.calls.append(("failed load", code))
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return real(code, *rest)

    door.cuLibraryLoadData = first_fails
    prog = kp.load(kp.save([_prog("p", "m")]))["p"]
    barrier = threading.Barrier(8, timeout=30)
    outcomes: dict = {}

    def work(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = _values(prog(HostArray([float(i)]), HostArray([1.0]), 2.0))
        except LaunchError:
            outcomes[i] = "LaunchError"

    assert not _run_threads(8, work)
    assert list(outcomes.values()).count("LaunchError") >= 1
    for i, got in outcomes.items():
        assert got in ("LaunchError", [2.0 * i + 1.0]), (i, got)
    assert _values(prog(HostArray([3.0]), HostArray([1.0]), 2.0)) == [7.0]
    assert len(door.libraries) == 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
@pytest.mark.parametrize("where", ["cuLibraryLoadData", "cuLibraryGetKernel", "cuMemAlloc",
                                   "cuLaunchKernel"])
def test_an_interrupt_inside_the_first_call_leaves_nothing_behind(monkeypatch, where,
                                                                  exc) -> None:
    """Ctrl-C (or a MemoryError) raised from inside the driver during the first call: it
    propagates, and the next call loads what it needs once, with no module or allocation
    left over from the interrupted one. (The cuda.bindings-shaped door without a C launch
    entry: an exception cannot cross the C doors, which turn it into an error code.)"""
    fake = install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)},
                                           native=False))
    real = getattr(fake, where)
    armed = [True]

    def boom(*args: Any) -> Any:
        if armed:
            armed.clear()
            raise exc("interrupted")
        return real(*args)

    setattr(fake, where, boom)
    prog = kp.load(kp.save([axpby()]))["axpby"]
    with pytest.raises(exc):
        prog(HostArray([1.0, 2.0]), HostArray([1.0, 1.0]), 2.0)
    assert not armed
    assert _values(prog(HostArray([1.0, 2.0]), HostArray([1.0, 1.0]), 2.0)) == [3.0, 5.0]
    gc.collect()
    assert len(fake.libraries) == 1, fake.libraries
    assert not fake.memory  # the interrupted call's output was freed too


# ---- kp.save over a path that others keep loading ------------------------------------------
@pytest.mark.parametrize("size", ["read", "mapped"])
def test_save_over_a_path_while_threads_load_it(tmp_path, size) -> None:
    """Two writer threads keep replacing the artifact (A, B, A, ...; from Packs, one of them
    loaded from the path itself) while three readers load it: every load is A or B, verifies,
    and a pack loaded before the replacements still reads its own bytes."""
    make = (lambda tag: [axpy(f"{tag}{i}", module=f"{tag}m{i}") for i in range(3)]) \
        if size == "read" else _big
    a_bytes, b_bytes = kp.save(make("a")), kp.save(make("b"))
    if size == "mapped":
        assert len(a_bytes) > 1 << 20 and len(b_bytes) > 1 << 20
    a_pack, b_pack = kp.load(a_bytes), kp.load(b_bytes)
    names = {frozenset(a_pack.programs): a_bytes, frozenset(b_pack.programs): b_bytes}
    path = tmp_path / "model.kpack"
    kp.save(a_pack, path)
    before = kp.load(path)
    stop = threading.Event()
    seen: collections.Counter = collections.Counter()

    def work(i: int) -> None:
        k = 0
        while not stop.is_set():
            if i < 2:  # writers
                src = a_pack if k % 2 else b_pack
                kp.save(kp.load(path) if k % 5 == 4 else src, path)
            else:
                pack = kp.load(path)
                got = frozenset(pack.programs)
                assert got in names, sorted(got)
                pack.verify()
                name = min(got)
                assert pack[name].plan(x=(7,), y=(7,), a=1.0).launches[0].grid == (1, 1, 1)
                seen[got] += 1
            k += 1

    timer = threading.Timer(1.0, stop.set)
    timer.start()
    errors = _run_threads(5, work, timeout=30)
    stop.set()
    assert not errors, errors
    assert len(seen) == 2, f"readers saw only {len(seen)} of the two artifacts"
    before.verify()
    assert kp.save(before) == a_bytes  # loaded before the replacements: still its own bytes
    assert kp.load(path).programs in ([*sorted(a_pack.programs)], [*sorted(b_pack.programs)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.kpack"]


READER = textwrap.dedent("""
    import json, sys, time
    import kernelpack as kp
    path, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    allowed = set(json.loads(sys.argv[3]))
    out = {"loads": 0, "errors": []}
    while time.monotonic() < deadline:
        try:
            pack = kp.load(path)
            pack.verify()
            names = ",".join(pack.programs)
            if names not in allowed:
                out["errors"].append("unexpected programs " + names)
            out["loads"] += 1
        except BaseException as exc:
            out["errors"].append(type(exc).__name__ + ": " + str(exc)[:300])
    print(json.dumps(out))
""")


def test_save_over_a_path_while_processes_load_it(tmp_path) -> None:
    a, b = _big("a"), _big("b", programs=1)
    a_bytes, b_bytes = kp.save(a), kp.save(b)
    path = tmp_path / "model.kpack"
    path.write_bytes(a_bytes)
    allowed = [",".join(kp.load(x).programs) for x in (a_bytes, b_bytes)]
    procs = [subprocess.Popen([sys.executable, "-c", READER, str(path), "2.0",
                               json.dumps(allowed)], env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    saves = 0
    try:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            kp.save(a if saves % 2 else b, path)
            saves += 1
    finally:
        from cache.conftest import finish_workers

        results = finish_workers(procs, 60)  # the readers stop by themselves after 2 s
    for code, out, err in results:
        assert code == 0, err[-2000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert not got["errors"], got["errors"][:5]
        assert got["loads"] > 0
    assert saves > 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.kpack"]


SLOW_SAVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import kernelpack as kp
    from kp_samples import axpy
    real = os.fsync
    def stalled(fd):  # a slow disk: the data is written, not yet synced or renamed
        print("syncing", flush=True)
        time.sleep(60)
        real(fd)
    os.fsync = stalled
    kp.save([axpy("new")], sys.argv[1])
""")


def _kill_a_saver_mid_write(path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", SLOW_SAVER, str(path), str(HERE)], env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.strip() == "syncing", (line, p.stderr.read()[-2000:])
    finally:
        p.kill()
        p.communicate(timeout=30)


def test_a_killed_saver_leaves_the_old_artifact_at_the_path(tmp_path) -> None:
    path = tmp_path / "model.kpack"
    old = kp.save([axpy("old")], path)
    _kill_a_saver_mid_write(path)
    assert path.read_bytes() == old
    assert kp.load(path).programs == ["old"]
    kp.save([axpy("newer")], path)  # the next writer is not stopped by the leftover
    assert kp.load(path).programs == ["newer"]


def test_killed_savers_leave_no_growing_pile_of_temporaries(tmp_path) -> None:
    """A writer SIGKILLed mid-save (an OOM kill, a node drain) cannot clean up, but its
    temporary must not stay for ever: after three such crashes and a successful save, at most
    one leftover should remain beside the artifact (the save could sweep leftovers of writers
    that are gone, as ``kernelpack cache prune`` does for the cache's)."""
    path = tmp_path / "model.kpack"
    kp.save([axpy("old")], path)
    for _ in range(3):
        _kill_a_saver_mid_write(path)
        assert kp.load(path).programs == ["old"]
    kp.save([axpy("final")], path)
    assert kp.load(path).programs == ["final"]
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "model.kpack")
    assert len(left) <= 1, f"{len(left)} temporaries of killed writers left beside the " \
                           f"artifact after a successful save: {left}"


# ---- the compile cache under threads, processes and fork -----------------------------------
def _key(tag: str, i: int) -> kp.CacheKey:
    return kp.make_key("external", f"review29-{tag}-{i}".encode(), {"i": i}, ["sm_80"])


def test_cache_threads_compile_each_key_once(tmp_path) -> None:
    cache = kp.Cache(tmp_path / "c", remote=False)
    builds: collections.Counter = collections.Counter()
    origins: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def build(i: int) -> Compiled:
        with lock:
            builds[i] += 1
        time.sleep(0.01)
        return axpy(f"k{i}")

    def work(t: int) -> None:
        order = list(range(16))
        random.Random(t).shuffle(order)
        for i in order * 2:
            c = cache.fetch_or_compile(_key("threads", i), lambda i=i: build(i), name=f"k{i}")
            assert c.name == f"k{i}"
            with lock:
                origins[c.origin] += 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        errors = _run_threads(8, work)
    assert not errors, errors
    assert builds == {i: 1 for i in range(16)}, builds
    assert origins == {"compiled": 16, "disk": 8 * 32 - 16}
    assert not [str(w.message) for w in caught]


def test_cache_threads_under_eviction_pressure(tmp_path) -> None:
    """A cap that holds a few entries: entries are evicted while other threads read them;
    every fetch still returns its own program, with no error and no warning."""
    cache = kp.Cache(tmp_path / "c", remote=False, max_bytes=6000)

    def work(t: int) -> None:
        for j in range(40):
            i = (j * 3 + t) % 12
            c = cache.fetch_or_compile(_key("evict", i), lambda i=i: axpy(f"k{i}"),
                                       name=f"k{i}")
            assert c.name == f"k{i}" and c == axpy(f"k{i}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        errors = _run_threads(6, work)
    assert not errors, errors
    assert not [str(w.message) for w in caught]
    assert cache.stats()["evictions"] > 0  # the cap did bite


CACHE_WORKER = textwrap.dedent("""
    import json, os, random, sys, threading, time
    sys.path.insert(0, sys.argv[3])
    import kernelpack as kp
    from kp_samples import axpy
    cache = kp.Cache(sys.argv[1], remote=False)
    marker, seed = sys.argv[2], int(sys.argv[4])
    errors = []
    def key(i):
        return kp.make_key("external", f"review29-procs-{i}".encode(), {"i": i}, ["sm_80"])
    def build(i):
        fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{i}\\n".encode())
        os.close(fd)
        time.sleep(0.02)
        return axpy(f"k{i}")
    def work(t):
        try:
            order = list(range(12))
            random.Random(seed * 10 + t).shuffle(order)
            for i in order:
                c = cache.fetch_or_compile(key(i), lambda i=i: build(i), name=f"k{i}")
                assert c.name == f"k{i}", c.name
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"errors": errors}))
""")


def test_cache_processes_and_threads_compile_each_key_once(tmp_path) -> None:
    marker = tmp_path / "builds"
    procs = [subprocess.Popen([sys.executable, "-c", CACHE_WORKER, str(tmp_path / "c"),
                               str(marker), str(HERE), str(seed)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(3)]
    from cache.conftest import finish_workers

    for code, out, err in finish_workers(procs, 120):
        assert code == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"errors": []}, err[-2000:]
    built = collections.Counter(int(x) for x in marker.read_text().split())
    assert built == {i: 1 for i in range(12)}, built


def _redis(tmp_path: Path) -> Any:
    from kp_redis_helpers import RedisServer  # skips with a reason without redis-server

    return RedisServer(tmp_path)


def test_cache_one_redis_connection_shared_by_threads(tmp_path) -> None:
    """Eight threads of one process share one kp.Cache (and its Redis connection), with an
    empty disk tier: every entry comes from Redis intact, nothing is compiled or refused."""
    from kernelpack.signing import write_keypair

    server = _redis(tmp_path)
    try:
        private, public = write_keypair(tmp_path / "fleet.key")
        writer = kp.Cache(tmp_path / "w", remote=server.url, sign_with=private, timeout_s=10)
        for i in range(24):
            writer.fetch_or_compile(_key("redis", i), lambda i=i: axpy(f"k{i}"))
        reader = kp.Cache(tmp_path / "r", remote=server.url, trusted_keys=[public],
                          timeout_s=10)
        barrier = threading.Barrier(8, timeout=30)

        def work(t: int) -> None:
            barrier.wait()
            for j in range(24):
                i = (j * 5 + t * 7) % 24
                c = reader.fetch_or_compile(_key("redis", i), lambda: 1 / 0, name=f"k{i}")
                assert c.name == f"k{i}" and c.origin in ("remote", "disk")

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                errors = _run_threads(8, work)
        finally:
            sys.setswitchinterval(old)
        assert not errors, errors[:3]
        stats = reader.stats()
        assert stats["compiles"] == 0 and stats["refused"] == 0 and stats["errors"] == 0
        assert stats["remote_errors"] == 0 and stats["remote_hits"] >= 24, stats
        assert not [str(w.message) for w in caught
                    if not issubclass(w.category, ResourceWarning)]
    finally:
        server.kill()


@needs_fork
def test_cache_redis_connection_used_by_a_parent_and_its_forked_children(tmp_path) -> None:
    """A server process opens its Redis connection, then forks workers: parent and children
    reading at once must each talk on their own connection (a shared socket interleaves
    replies)."""
    from kernelpack.signing import write_keypair

    server = _redis(tmp_path)
    try:
        private, public = write_keypair(tmp_path / "fleet.key")
        writer = kp.Cache(tmp_path / "w", remote=server.url, sign_with=private, timeout_s=10)
        for i in range(30):
            writer.fetch_or_compile(_key("fork", i), lambda i=i: axpy(f"k{i}"))
        shared = kp.Cache(tmp_path / "r", remote=server.url, trusted_keys=[public],
                          timeout_s=10)
        assert shared.fetch_or_compile(_key("fork", 0), lambda: 1 / 0).origin == "remote"

        def body() -> str:
            bad = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(10):
                    for i in range(1, 30):
                        data = shared.get(_key("fork", i))
                        if data is None or kp.load(data).programs != [f"k{i}"]:
                            bad.append(i)
            noise = [str(w.message) for w in caught
                     if not issubclass(w.category, ResourceWarning)]
            return json.dumps({"bad": bad, "warnings": noise})

        read, write = os.pipe()
        pids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's coverage is not collected
                os.close(read)
                signal.alarm(60)
                try:
                    text = body()
                except BaseException as exc:  # noqa: BLE001 - sent to the parent
                    text = json.dumps({"error": repr(exc)})
                os.write(write, (text + "\n").encode())
                os._exit(0)
            pids.append(pid)
        os.close(write)
        mine = json.loads(body())
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        os.close(read)
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
        theirs = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
        assert len(theirs) == 2
        for r in [mine] + theirs:
            assert r == {"bad": [], "warnings": []}, r
    finally:
        server.kill()


def _compiling_in_a_thread(cache: kp.Cache, i: int) -> tuple[threading.Thread, threading.Event,
                                                             threading.Event]:
    """A thread of this process compiling key ``_key("fork", i)`` (holding its lock) until
    ``release`` is set; ``inside`` is set once it is compiling."""
    inside, release = threading.Event(), threading.Event()

    def slow() -> Compiled:
        inside.set()
        release.wait(30)
        return axpy(f"k{i}")

    t = threading.Thread(target=lambda: cache.fetch_or_compile(_key("fork", i), slow))
    t.start()
    return t, inside, release


@needs_fork
def test_forked_child_asking_for_another_key_while_the_parent_compiles(tmp_path) -> None:
    cache = kp.Cache(tmp_path / "c", remote=False)
    t, inside, release = _compiling_in_a_thread(cache, 0)
    try:
        assert inside.wait(10)
        text = _in_child(lambda: cache.fetch_or_compile(_key("fork", 1),
                                                        lambda: axpy("k1")).origin, 15)
    finally:
        release.set()
        t.join(30)
    assert text == "compiled", text


@needs_fork
def test_forked_child_asking_for_a_key_the_parent_is_compiling_does_not_hang(tmp_path) -> None:
    """A pre-fork server: a background thread compiles key K when a worker is forked, and the
    worker asks for K too. The parent finishes half a second later; the child must then get
    K (from disk, or by compiling it), not wait for ever on the parent's lock, which it
    inherited and still holds through its copy of the lock file's descriptor."""
    cache = kp.Cache(tmp_path / "c", remote=False)
    t, inside, release = _compiling_in_a_thread(cache, 0)
    timer = threading.Timer(0.5, release.set)
    try:
        assert inside.wait(10)
        timer.start()

        def child() -> str:
            fresh = kp.Cache(tmp_path / "c", remote=False)  # a worker's own Cache, same dir
            return fresh.fetch_or_compile(_key("fork", 0), lambda: axpy("k0")).origin

        text = _in_child(child, 6)
    finally:
        release.set()
        timer.cancel()
        t.join(30)
    assert text in ("disk", "compiled"), text
    assert kp.Cache(tmp_path / "c", remote=False).fetch_or_compile(
        _key("fork", 0), lambda: 1 / 0).origin == "disk"


OTHER_SERVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import kernelpack as kp
    from kp_samples import axpy
    key = kp.make_key("external", b"review29-fork-7", {"i": 7}, ["sm_80"])
    print("asking", flush=True)
    print(kp.Cache(sys.argv[1], remote=False).fetch_or_compile(key, lambda: axpy("k7")).origin)
""")


@needs_fork
def test_a_forked_worker_that_never_uses_the_cache_does_not_block_other_processes(
        tmp_path) -> None:
    """Server A compiles key K in a thread and forks a worker meanwhile (the worker never
    touches the cache); server B on the same machine asks for K and waits for A's lock. Once
    A is done, B must go on, not wait for as long as A's worker lives (it holds A's lock
    through the lock file's descriptor it inherited)."""
    assert _key("fork", 7) == kp.make_key("external", b"review29-fork-7", {"i": 7}, ["sm_80"])
    cache = kp.Cache(tmp_path / "c", remote=False)
    t, inside, release = _compiling_in_a_thread(cache, 7)
    worker = other = None
    try:
        assert inside.wait(10)
        worker = os.fork()
        if worker == 0:  # pragma: no cover - a worker that serves without the cache
            time.sleep(30)
            os._exit(0)
        other = subprocess.Popen([sys.executable, "-c", OTHER_SERVER, str(tmp_path / "c"),
                                  str(HERE)], env=_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "asking"
        time.sleep(1.0)  # B is waiting on A's lock by now
        release.set()
        t.join(30)
        try:
            out, err = other.communicate(timeout=6)
        except subprocess.TimeoutExpired:
            out, err = "still waiting 6 s after A finished", ""
        assert out.strip() == "disk", (out, err[-2000:])
    finally:
        release.set()
        t.join(30)
        if other is not None and other.poll() is None:
            other.kill()
            other.communicate()
        if worker:
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)


# ---- leaks: descriptors, mappings, host memory, modules ------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("r29files")
    small = kp.save([axpy()])
    big = kp.save(_big("a"))
    assert len(big) > 1 << 20
    flipped, big_flipped = bytearray(small), bytearray(big)
    flipped[len(small) // 2] ^= 0xFF
    big_flipped[-200] ^= 0xFF
    out = {"small": small, "big": big, "truncated": small[:len(small) // 2],
           "flipped": bytes(flipped), "big truncated": big[:-1000],
           "big flipped": bytes(big_flipped), "empty": b"", "not an artifact": b"hello" * 999}
    paths = {}
    for name, data in out.items():
        paths[name] = d / (name.replace(" ", "_") + ".kpack")
        paths[name].write_bytes(data)
    paths["a directory"] = d
    return paths


def _load_once(path: Path) -> str:
    try:
        pack = kp.load(path)
        pack.verify()
        pack[pack.programs[0]].plan(x=(5,), y=(5,), a=1.0)
        return "ok"
    except KernelPackError as exc:
        return type(exc).__name__
    except IsADirectoryError:
        return "IsADirectoryError"


@pytest.mark.parametrize("name", ["small", "big", "truncated", "flipped", "big truncated",
                                  "big flipped", "empty", "not an artifact", "a directory"])
def test_loading_and_dropping_many_packs_leaks_nothing(files, name) -> None:
    path = files[name]
    want = "ok" if name in ("small", "big") else None
    n = 150 if name.startswith("big") else 1000  # a big load digests 1.2 MB of images
    for _ in range(30):
        got = _load_once(path)
    if want:
        assert got == want
    else:
        assert got != "ok", f"{name}: loaded"
    gc.collect()
    fds, maps = _fds(), _maps()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            assert _load_once(path) == got
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert _fds() == fds, f"{name}: {_fds() - fds} descriptors more after {n} loads"
    assert _maps() <= maps + 2, f"{name}: {_maps() - maps} mappings more after {n} loads"
    assert grown < 64 << 10, f"{name}: {grown} bytes of Python memory kept by {n} loads"


def test_live_mapped_packs_hold_two_descriptors_each_and_give_them_back(files) -> None:
    """A pack read from a file over 1 MiB is a mapping of it, and its images are read with
    pread (a file truncated after the load is an IntegrityError, not SIGBUS): two descriptors
    per live pack, as the README says (the map's own and the reader's; review 29 asked for
    one, which Python's mmap before 3.13 cannot give), and every one back once dropped."""
    gc.collect()
    fds = _fds()
    packs = [kp.load(files["big"]) for _ in range(100)]
    held = _fds() - fds
    assert held <= 200, f"100 live packs of a mapped file hold {held} descriptors"
    del packs
    gc.collect()
    assert _fds() == fds


def _bounded_records(fake: FakeDriver) -> None:
    """The fake records every call; a bounded record keeps the test's own memory flat."""
    fake.calls = collections.deque(maxlen=256)
    fake.launch_contexts = collections.deque(maxlen=256)
    fake.load_contexts = collections.deque(maxlen=256)


def test_thousands_of_calls_keep_host_and_device_memory_flat(door) -> None:
    _bounded_records(door)
    pack = kp.load(kp.save([axpby(), axpy()]))
    ab, ax = pack["axpby"], pack["axpy"]
    x, y, out = HostArray([1.0] * 64), HostArray([1.0] * 64), HostArray([0.0] * 64)

    def round_() -> None:
        ab(x, y, 2.0, out=out)
        z = ab(x, y, 2.0)
        assert z.shape == (64,)
        ax(x, y, 0.0)

    for _ in range(200):
        round_()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(1500):
            round_()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 << 10, f"{grown} bytes of Python memory kept by 4500 calls"
    assert not door.memory, f"{len(door.memory)} device allocations not freed"
    assert out.values() == [3.0] * 64


def test_threads_that_exit_leave_no_state_behind(door) -> None:
    """A server's thread pool replaces its threads: each short-lived thread makes its first
    calls (the C fast path remembers per thread the context it confirmed) and exits."""
    _bounded_records(door)
    pack = kp.load(kp.save([axpby(), axpy()]))
    x, y, out = HostArray([1.0] * 8), HostArray([1.0] * 8), HostArray([0.0] * 8)

    def one(_: int) -> None:
        pack["axpby"](x, y, 2.0, out=out)
        pack["axpby"](x, y, 2.0)
        pack["axpy"](x, y, 0.0)

    def rounds(n: int) -> None:
        for _ in range(n // 10):
            assert not _run_threads(10, one)

    rounds(200)
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        rounds(600)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 << 10, f"{grown} bytes of Python memory kept by 600 exited threads"
    assert len(gc.get_objects()) - objects < 300
    assert not door.memory


def test_reloaded_packs_share_their_loaded_code(door) -> None:
    """A server that reloads its artifact on every deploy (hot reload): each version is
    loaded, called, dropped and collected. Loaded code is kept for the process, shared by
    content (README): reloading an unchanged artifact 30 times loads its module once; 30
    different versions keep 30 (review 29 asked for unloading; nothing unloads code that a
    captured CUDA graph may still launch, so it is documented instead)."""
    _bounded_records(door)

    def cycle(version: str) -> None:
        pack = kp.load(kp.save([_prog("model", version)]))
        assert _values(pack["model"](HostArray([1.0]), HostArray([1.0]), 1.0)) == [2.0]
        del pack
        gc.collect(1)  # the young generations: a full pass per cycle took ~40 s in a worker

    before = len(door.libraries)
    for _ in range(30):
        cycle("same")
    gc.collect()
    assert len(door.libraries) == before + 1
    for version in range(30):
        cycle(f"v{version}")
    gc.collect()
    assert len(door.libraries) == before + 31


# ---- fork ----------------------------------------------------------------------------------
@needs_fork
def test_fork_after_warmup_only_child_gets_the_device_error(fake) -> None:
    """README: "in a child forked after the parent initialized CUDA (its first launch or
    ``pack.warmup()``), a launch raises DeviceError"."""
    pack = kp.load(kp.save([axpby()]))
    pack.warmup()
    assert not [c for c in fake.calls if c[0] == "cuLaunchKernel"]

    def launch() -> str:
        return repr(_values(pack["axpby"](HostArray([1.0]), HostArray([1.0]), 1.0)))

    def fresh() -> str:
        other = kp.load(kp.save([_prog("p", "other")]))
        return repr(_values(other["p"](HostArray([1.0]), HostArray([1.0]), 1.0)))

    for body in (launch, fresh, lambda: (pack.warmup(), "warmed")[1]):
        text = _in_child(body)
        assert text.startswith("DeviceError") and "spawn" in text, text
    assert _values(pack["axpby"](HostArray([1.0]), HostArray([1.0]), 1.0)) == [2.0]


@needs_fork
def test_fork_while_other_threads_launch_never_hangs(door) -> None:
    _bounded_records(door)
    pack = kp.load(kp.save([axpby(), axpy()]))
    stop = threading.Event()
    wrong: list = []

    def busy(i: int) -> None:
        x, y = HostArray([float(i)] * 16), HostArray([1.0] * 16)
        while not stop.is_set():
            z = pack["axpby"](x, y, 2.0)
            if _values(z) != [2.0 * i + 1.0] * 16:
                wrong.append(i)

    threads = [threading.Thread(target=busy, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    texts = []
    try:
        time.sleep(0.05)
        for _ in range(6):
            texts.append(_in_child(lambda: repr(_values(pack["axpby"](
                HostArray([1.0]), HostArray([1.0]), 1.0))), 15))
            texts.append(_in_child(lambda: repr(pack["axpy"].plan(x=(3,), y=(3,), a=1.0)
                                                .launches[0].grid), 15))
    finally:
        sys.setswitchinterval(old)
        stop.set()
        for t in threads:
            t.join(30)
    assert not wrong
    for text in texts[0::2]:
        assert text.startswith("DeviceError"), text
    for text in texts[1::2]:
        assert text == "(1, 1, 1)", text


@needs_fork
def test_fork_before_any_launch_from_a_mapped_pack(fake, files) -> None:
    """Loaded (memory-mapped) and planned before the fork, never launched: the child plans,
    verifies, re-saves and launches on its own."""
    pack = kp.load(files["big"])
    name = pack.programs[0]
    pack[name].plan(x=(2,), y=(2,), a=1.0)

    def child() -> str:
        pack.verify()
        assert kp.save(pack) == files["big"].read_bytes()
        x, y = HostArray([1.0, 2.0]), HostArray([1.0, 1.0])
        pack[name](x, y, 3.0)
        return repr(y.values())

    assert _in_child(child) == "[4.0, 7.0]"


def test_a_cai_array_in_a_child_forked_after_cuda_use_is_the_fork_error(monkeypatch) -> None:
    """On the GPU (tests/gpu/test_review29_server_gpu.py), a forked child's driver answers
    nothing, so every __cuda_array_interface__ pointer read as host memory: "argument 'x' is
    in host memory", instead of the README's DeviceError about fork. The pointer query now
    says it first."""
    from kernelpack.errors import DeviceError
    from kernelpack.runtime import arrays, device

    monkeypatch.setattr(device, "_forked_after_init", True)
    with pytest.raises(DeviceError, match="fork"):
        arrays._pointer_device(0x7000_0000)


def test_a_memory_error_inside_cuinit_is_not_remembered_as_no_driver(monkeypatch) -> None:
    """Review 29: a MemoryError raised inside cuInit became the remembered DeviceError "no
    CUDA driver found" for the rest of the process. It is the process's trouble: it
    propagates as itself, and the next call initializes the driver."""
    from kernelpack.runtime import driver

    fake = install(monkeypatch, FakeDriver())
    real, calls = fake.cuInit, []

    def flaky(flags: int) -> tuple:
        calls.append(flags)
        if len(calls) == 1:
            raise MemoryError("out of memory in cuInit")
        return real(flags)

    monkeypatch.setattr(fake, "cuInit", flaky)
    monkeypatch.setattr(driver, "_initialized", threading.Event())
    with pytest.raises(MemoryError):
        driver.init()
    assert driver.init() is not None and len(calls) == 2
