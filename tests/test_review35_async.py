"""Review 35: kernelpack inside asyncio servers and multiprocessing worlds (black box).

An inference service calls kernelpack from coroutines on the event loop's thread, through
``asyncio.to_thread`` / ``run_in_executor``, cancels those calls on timeouts, installs its own
signal handlers (``loop.add_signal_handler``, ``signal.set_wakeup_fd``), and runs worker pools
under the ``spawn``, ``forkserver`` and ``fork`` start methods that share one cache directory and
one Redis. Each test states what the documentation promises (README, ``help(kp.Cache)``,
``help(kernelpack._interrupts)``) and checks it from the outside.

Signals that must arrive *inside* kernelpack's descriptor hand-overs are injected
deterministically: ``os.open`` (which kernelpack calls through the ``os`` module) is wrapped so
that it raises the signal as it is called or as it returns.

Worker functions live in a small module written to a temporary directory at session start (so
that spawn/forkserver children import it whatever pytest's import mode).
"""

from __future__ import annotations

import asyncio
import ctypes
import glob
import importlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kp_redis_helpers import RedisServer

import kernelpack as kp
from kernelpack.signing import generate_private_key, public_key_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="signals, fork and /proc/self/fd as on Linux")

WORKER_NAME = "kp_review35_async_worker"
WORKER_SRC = textwrap.dedent('''
    """Worker side of tests/test_review35_async.py (generated; importable by spawn children)."""
    import os
    import time
    import warnings

    import kernelpack as kp


    @kp.fusion
    def axpy35(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"], a: kp.f32):
        return a * x + y


    @kp.fusion
    def mixed35(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f64, "n"]):
        return x + y


    BAD_PTX = """.version 8.0
    .target sm_80
    .address_size 64
    .visible .entry k35(.param .u64 p) { bogus_instruction_35; ret; }
    """


    def make_cache(path, url, private, public, **kw):
        return kp.Cache(path=path, remote=url if url else False, sign_with=private,
                        trusted_keys=[public] if public else None, timeout_s=10.0, **kw)


    def compile_task(args):
        """One request of a pool: compile (or fetch) axpy35 at opt 1 + i % 3."""
        path, own_disk, url, private, public, i = args
        if own_disk:
            path = f"{path}-{os.getpid()}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache = make_cache(path, url, private, public)
            c = kp.compile(axpy35, targets=["sm_80"], cache=cache, opt=1 + i % 3)
        stats = cache.stats()
        return {"variant": i % 3, "origin": c.origin, "pid": os.getpid(),
                "errors": stats["errors"], "remote_errors": stats["remote_errors"],
                "refused": stats["refused"]}


    def fail(kind, payload=None):
        """Raise the kernelpack error of ``kind`` (the same call in both processes)."""
        if kind == "trace":
            kp.compile(mixed35, targets=["sm_80"])
        elif kind == "compile-log":
            kp.external("k35", "k35", params=[kp.Tensor("x", kp.f32, ["n"])], grid=1,
                        block=1, ptx=BAD_PTX, targets=["sm_80"])
        elif kind == "constraint":
            kp.load(payload)["axpy35"].plan(x=(10,), y=(11,), a=1.0)
        elif kind == "format":
            kp.load(payload[:100])
        elif kind == "bad-option":
            kp.compile(axpy35, targets=["sm_80"], opt=7)
        raise AssertionError(f"{kind}: no error")


    def use_compiled(compiled):
        """Save, load and plan a kp.Compiled received from the parent."""
        data = kp.save([compiled])
        pack = kp.load(data)
        plan = pack[compiled.name].plan(x=(1000,), y=(1000,), a=0.5)
        return pack.programs, plan.launches[0].grid, data


    def load_pack(data):
        return kp.load(data)


    def hold_compile(path, url, private, public, key, flag):
        """Compile ``key`` with a build that never ends (the parent SIGKILLs us)."""
        cache = make_cache(path, url, private, public)

        def build():
            open(flag, "w").close()
            time.sleep(120)
            raise AssertionError("not killed")

        cache.fetch_or_compile(key, build, name="axpy35")
''')


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    where = tmp_path_factory.mktemp("review35_worker")
    (where / f"{WORKER_NAME}.py").write_text(WORKER_SRC)
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(WORKER_NAME)
    finally:
        sys.path.remove(str(where))


@pytest.fixture(scope="session")
def compiled(worker: ModuleType) -> kp.Compiled:
    return kp.compile(worker.axpy35, targets=["sm_80"])


@pytest.fixture(scope="session")
def keys() -> tuple[bytes, bytes]:
    private = generate_private_key()
    return private, public_key_bytes(private)


@pytest.fixture()
def artifact(tmp_path: Path, compiled: kp.Compiled) -> Path:
    path = tmp_path / "model.kpack"
    kp.save([compiled], path)
    return path


@pytest.fixture(scope="module")
def spawn_pool(worker: ModuleType) -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        yield pool


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis35"), needs_redis_py=False) as server:
        yield server.url


def _open_paths() -> list[str]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            pass
    return out


def _leftovers(root: Path) -> list[str]:
    """Temporaries (dot files) anywhere under ``root``."""
    return sorted(p for p in glob.glob(str(root / "**" / ".*"), recursive=True))


def _wait_child(pid: int, timeout_s: float) -> int | None:
    """The child's exit code, or None when it was still running after ``timeout_s`` (then it
    is killed and reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _needs_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed from the main thread")


# ---- the operations that hand descriptors over -------------------------------------------------
def _operations(tmp_path: Path, worker: ModuleType, compiled: kp.Compiled
                ) -> dict[str, Callable[[], object]]:
    kp.save([compiled], tmp_path / "a.kpack")
    warm = tmp_path / "warm-cache"
    kp.compile(worker.axpy35, targets=["sm_80"], cache=kp.Cache(path=warm, remote=False))
    return {
        "save": lambda: kp.save([compiled], tmp_path / "a.kpack"),
        "load": lambda: kp.load(tmp_path / "a.kpack"),
        "cache-miss": lambda: kp.compile(worker.axpy35, targets=["sm_80"], opt=2,
                                         cache=kp.Cache(path=tmp_path / "cold", remote=False)),
        "cache-hit": lambda: kp.compile(worker.axpy35, targets=["sm_80"],
                                        cache=kp.Cache(path=warm, remote=False)),
    }


OPS = ["save", "load", "cache-miss", "cache-hit"]


@pytest.mark.parametrize("op", OPS)
def test_asyncio_signal_handlers_fire_once_when_the_signal_lands_in_a_handover(
        op: str, tmp_path: Path, worker: ModuleType, compiled: kp.Compiled,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM and SIGINT (``loop.add_signal_handler``) arriving while kernelpack opens a file
    in the event loop's thread reach the app's callback exactly once, and afterwards
    ``signal.getsignal`` is asyncio's own handler again (kernelpack documents that it only holds
    Python handlers back around descriptor hand-overs)."""
    _needs_main_thread()
    ops = _operations(tmp_path, worker, compiled)
    real_open = os.open
    pending: list[signal.Signals] = []

    def opener(*args: Any, **kwargs: Any) -> int:
        while pending:  # the first open of the operation: the signals arrive now
            signal.raise_signal(pending.pop(0))
        return real_open(*args, **kwargs)

    async def main() -> tuple[list[int], bool, object]:
        loop = asyncio.get_running_loop()
        got: list[int] = []
        sigs = (signal.SIGTERM, signal.SIGINT)
        for s in sigs:
            loop.add_signal_handler(s, got.append, int(s))
        try:
            before = {s: signal.getsignal(s) for s in sigs}
            monkeypatch.setattr(os, "open", opener)
            pending.extend(sigs)
            result = ops[op]()
            monkeypatch.setattr(os, "open", real_open)
            deadline = time.monotonic() + 5
            while len(got) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # a second delivery would show up here
            restored = all(signal.getsignal(s) is before[s] for s in sigs)
            return got, restored, result
        finally:
            for s in sigs:
                loop.remove_signal_handler(s)

    got, restored, result = asyncio.run(main())
    assert not pending, f"{op}: kernelpack opened no file through os.open"
    assert sorted(got) == sorted([int(signal.SIGTERM), int(signal.SIGINT)]), (
        f"{op}: the app's callbacks ran {got} (expected SIGTERM and SIGINT once each)")
    assert restored, f"{op}: signal.getsignal is not asyncio's handler after the call"
    if op.startswith("cache"):
        assert isinstance(result, kp.Compiled)


def test_plain_handler_and_wakeup_fd_get_a_signal_held_back_during_load(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler installed with ``signal.signal`` and a ``signal.set_wakeup_fd`` socket: a
    SIGUSR1 arriving while ``kp.load`` opens the file runs the handler once, after the
    hand-over, and writes its byte to the wakeup fd once."""
    _needs_main_thread()
    calls: list[int] = []

    def app(signum: int, frame: object) -> None:
        calls.append(signum)

    seen_in_handover: list[bool] = []
    real_open = os.open

    def opener(*args: Any, **kwargs: Any) -> int:
        if not seen_in_handover:
            signal.raise_signal(signal.SIGUSR1)
            seen_in_handover.append(bool(calls))
        return real_open(*args, **kwargs)

    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    old_handler = signal.signal(signal.SIGUSR1, app)
    old_fd = signal.set_wakeup_fd(w.fileno())
    try:
        monkeypatch.setattr(os, "open", opener)
        kp.load(artifact)
        monkeypatch.setattr(os, "open", real_open)
        handler_after = signal.getsignal(signal.SIGUSR1)
        try:
            wake = r.recv(64)
        except BlockingIOError:
            wake = b""
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGUSR1, old_handler)
        r.close()
        w.close()
    assert seen_in_handover == [False], "the handler ran inside the hand-over (not held back)"
    assert calls == [signal.SIGUSR1], f"handler calls: {calls}"
    assert handler_after is app
    assert wake == bytes([signal.SIGUSR1]), f"wakeup fd got {wake!r}"


# ---- finding: SA_RESTART (signal.siginterrupt(sig, False)) is undone -----------------------------
SA_RESTART = 0x10000000


class _SigAction(ctypes.Structure):
    # glibc's struct sigaction on Linux (x86_64, aarch64): handler, sa_mask (1024 bits), flags,
    # restorer; padded generously.
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p),
                ("_pad", ctypes.c_char * 64)]


def _sa_flags(signum: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    act = _SigAction()
    if libc.sigaction(int(signum), None, ctypes.byref(act)) != 0:
        pytest.skip(f"sigaction: errno {ctypes.get_errno()}")
    return act.flags


@pytest.mark.parametrize("op", ["load", "save", "cache-hit"])
def test_asyncio_signal_handler_keeps_restarting_syscalls_after_kernelpack_calls(
        op: str, tmp_path: Path, worker: ModuleType, compiled: kp.Compiled) -> None:
    """``loop.add_signal_handler`` (like any app calling ``signal.siginterrupt(sig, False)``)
    installs its handler with SA_RESTART, so a SIGTERM does not make blocking system calls of C
    code (drivers, DB clients, ctypes) fail with EINTR. Putting "the application's handler
    back" must put back that too. kernelpack's swap re-installs the handler through
    ``signal.signal``, which drops SA_RESTART: after one ``kp.load`` in the event loop's thread
    a SIGTERM makes a blocking ``read(2)`` in C return -1/EINTR where it restarted before
    (seen with ctypes ``libc.read`` on a pipe and ``signal.pthread_kill``)."""
    _needs_main_thread()
    ops = _operations(tmp_path, worker, compiled)

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        try:
            before = _sa_flags(signal.SIGTERM)
            ops[op]()
            return before, _sa_flags(signal.SIGTERM)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    before, after = asyncio.run(main())
    assert before & SA_RESTART, f"asyncio installed SIGTERM without SA_RESTART ({before:#x})"
    assert after & SA_RESTART, (
        f"kp {op} in the event loop's thread dropped SA_RESTART from the app's SIGTERM "
        f"handler: sa_flags {before:#x} -> {after:#x}")


# ---- finding: the hand-over guard is off in a child forked from a non-main thread ----------------
@pytest.mark.parametrize("forked_from", ["main-thread", "worker-thread"])
def test_alarm_as_load_opens_its_file_leaks_no_descriptor_in_a_forked_child(
        forked_from: str, artifact: Path) -> None:
    """A worker forked from a thread (``multiprocessing.Pool(maxtasksperchild=...)`` with
    ``fork`` forks its replacements from the pool's handler thread; a server forking from an
    executor) runs Python signal handlers in that thread: it is the child's main thread. There,
    an alarm-style timeout (SIGALRM handler raising) landing as ``kp.load``'s ``os.open``
    returns must be held back until the descriptor is owned, as in any main thread. In a child
    forked from a worker thread kernelpack holds nothing back: the handler raises right at the
    return, the descriptor is lost and the artifact stays open for the life of the worker."""
    r, w = os.pipe()

    def child() -> None:
        report: dict[str, Any] = {}
        try:
            class Timeout(Exception):
                pass

            calls: list[int] = []

            def on_alarm(signum: int, frame: object) -> None:
                calls.append(signum)
                raise Timeout

            signal.signal(signal.SIGALRM, on_alarm)
            real_open = os.open
            armed = [True]

            def opener(*args: Any, **kwargs: Any) -> int:
                fd = real_open(*args, **kwargs)
                if armed[0]:
                    armed[0] = False
                    signal.raise_signal(signal.SIGALRM)  # arrives as os.open returns
                return fd

            os.open = opener  # the child's own module: nothing to restore
            try:
                kp.load(str(artifact))
                report["outcome"] = "loaded"
            except Timeout:
                report["outcome"] = "timeout"
            os.open = real_open
            report["calls"] = len(calls)
            report["open"] = [p for p in _open_paths() if p == str(artifact)]
            report["main"] = threading.current_thread() is threading.main_thread()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            report["error"] = repr(exc)
        os.write(w, json.dumps(report).encode())
        os._exit(0)

    pids: list[int] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            try:
                child()
            finally:
                os._exit(1)
        pids.append(pid)

    if forked_from == "main-thread":
        fork()
    else:
        t = threading.Thread(target=fork)
        t.start()
        t.join()
    os.close(w)
    code = _wait_child(pids[0], 30)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    assert code == 0, f"child exit {code}: {raw!r}"
    report = json.loads(raw)
    assert "error" not in report, report
    assert report["calls"] == 1, report
    assert report["open"] == [], (
        f"forked from the {forked_from}: the SIGALRM handler raised as os.open returned and "
        f"{artifact.name} stayed open in the child ({report})")


# ---- finding: a child forked during a hand-over keeps kernelpack's handlers ---------------------
def test_child_forked_while_the_main_thread_is_in_a_handover_keeps_the_apps_handlers(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread forks (a ``multiprocessing.Pool`` repopulating its ``fork`` workers from
    its handler thread, a request thread submitting to a process pool) while the main thread
    is inside one of kernelpack's descriptor hand-overs, where every Python handler is swapped
    for kernelpack's note-taker. Nothing puts the app's handlers back in the child: there
    ``signal.getsignal`` is ``deferred_interrupts._note`` and a signal only gets noted, for
    ever (review 34's symptom: "Ctrl-C did nothing from then on"), in every such worker."""
    _needs_main_thread()
    calls: list[int] = []

    def app(signum: int, frame: object) -> None:
        calls.append(signum)

    go, forked = threading.Event(), threading.Event()
    r, w = os.pipe()
    pids: list[int] = []

    def forker() -> None:
        if not go.wait(30):
            forked.set()
            return
        pid = os.fork()
        if pid == 0:
            report: dict[str, Any] = {}
            try:
                report["handler"] = repr(signal.getsignal(signal.SIGUSR1))
                report["is_app"] = signal.getsignal(signal.SIGUSR1) is app
                signal.raise_signal(signal.SIGUSR1)
                time.sleep(0.05)
                report["app_calls"] = len(calls)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                report["error"] = repr(exc)
            os.write(w, json.dumps(report).encode())
            os._exit(0)
        pids.append(pid)
        forked.set()

    real_open = os.open

    def opener(*args: Any, **kwargs: Any) -> int:
        if not go.is_set():  # kp.load is opening its file: fork now, from the other thread
            go.set()
            forked.wait(30)
        return real_open(*args, **kwargs)

    old = signal.signal(signal.SIGUSR1, app)
    t = threading.Thread(target=forker)
    t.start()
    try:
        monkeypatch.setattr(os, "open", opener)
        kp.load(artifact)
        monkeypatch.setattr(os, "open", real_open)
    finally:
        go.set()
        t.join(30)
        signal.signal(signal.SIGUSR1, old)
    os.close(w)
    assert pids, "no fork happened"
    code = _wait_child(pids[0], 30)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    assert code == 0, raw
    report = json.loads(raw)
    assert "error" not in report, report
    assert report["is_app"] and report["app_calls"] == 1, (
        f"in the forked child SIGUSR1's handler is {report['handler']} and the app's handler "
        f"ran {report['app_calls']} times for one SIGUSR1 (expected the app's own handler, "
        f"called once)")


# ---- finding: a fork while a thread waits on Redis hangs the child for ever ----------------------
@pytest.mark.filterwarnings("ignore::kernelpack.cache.CacheWarning")
def test_child_forked_while_a_thread_waits_on_redis_does_not_hang(
        tmp_path: Path, keys: tuple[bytes, bytes]) -> None:
    """README: "The compile cache is safe across fork: a child forked while a parent thread
    compiles a key waits for that compile like any other process, and keeps no lock of its
    parent's", and a slow Redis "only costs a warning and a local compile" (``timeout_s``).
    A child forked while a parent thread waits for a Redis reply (a slow server; here one that
    never answers) inherits the Redis client's lock in the locked state: its first cache
    lookup blocks on that lock for ever (no timeout applies), so a pool worker forked at the
    wrong moment hangs."""
    _, public = keys
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    command_arrived = threading.Event()
    conns: list[socket.socket] = []

    def silent_server() -> None:
        conn, _ = srv.accept()
        conns.append(conn)
        conn.recv(65536)
        command_arrived.set()  # never answered

    threading.Thread(target=silent_server, daemon=True).start()
    cache = kp.Cache(path=tmp_path / "c", remote=f"redis://127.0.0.1:{port}/0",
                     trusted_keys=[public], timeout_s=2.0)
    parent_lookup = threading.Thread(target=cache.get, args=("cd" * 32,), daemon=True)
    parent_lookup.start()
    try:
        assert command_arrived.wait(20), "the parent's lookup never reached the server"
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                cache.get("ef" * 32)
                code = 0
            finally:
                os._exit(code)
        code = _wait_child(pid, 10)
    finally:
        parent_lookup.join(20)
        for c in conns:
            c.close()
        srv.close()
    assert code == 0, ("the child's cache.get() was still blocked 10 s after the fork "
                       "(timeout_s=2): it waits for a lock the parent's thread held at the fork"
                       if code is None else f"child exit {code}")


def test_child_forked_while_a_thread_compiles_waits_for_that_compile(
        tmp_path: Path, compiled: kp.Compiled) -> None:
    """The documented half of fork safety (disk tier): the child waits for the parent
    thread's compile of the same key and takes its entry; it never compiles it itself."""
    cache = kp.Cache(path=tmp_path / "c", remote=False)
    key = "ab" * 32
    started = threading.Event()

    def slow_build() -> kp.Compiled:
        started.set()
        time.sleep(1.0)
        return compiled

    origins: list[str] = []
    t = threading.Thread(target=lambda: origins.append(
        cache.fetch_or_compile(key, slow_build, name="axpy35").origin))
    t.start()
    assert started.wait(20)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out = b"error"
        try:
            def refuse() -> kp.Compiled:
                raise RuntimeError("the child compiled")
            out = cache.fetch_or_compile(key, refuse, name="axpy35").origin.encode()
        except BaseException as exc:  # noqa: BLE001
            out = repr(exc).encode()
        finally:
            os.write(w, out)
            os._exit(0)
    os.close(w)
    code = _wait_child(pid, 30)
    t.join(30)
    with os.fdopen(r, "rb") as f:
        child_origin = f.read().decode()
    assert code == 0
    assert origins == ["compiled"]
    assert child_origin == "disk", child_origin


# ---- asyncio: threads, timeouts, cancellation ----------------------------------------------------
def test_wait_for_timeout_and_cancel_leave_the_cache_consistent(
        tmp_path: Path, compiled: kp.Compiled, worker: ModuleType) -> None:
    """A request timing out (``asyncio.wait_for``) or cancelled (``task.cancel()``) while its
    thread compiles through the cache: the thread finishes, the entry is whole, nothing is left
    locked, open or half-written, and the next requests (concurrent threads) are hits."""
    cache = kp.Cache(path=tmp_path / "c", remote=False)
    builds: list[str] = []
    started = {"a": threading.Event(), "b": threading.Event()}

    def build(tag: str) -> Callable[[], kp.Compiled]:
        def run() -> kp.Compiled:
            builds.append(tag)
            if tag in started:
                started[tag].set()
            time.sleep(0.6)
            return compiled
        return run

    before = set(_open_paths())

    async def main() -> list[str]:
        out = []
        loop = asyncio.get_running_loop()
        running = asyncio.ensure_future(asyncio.to_thread(
            cache.fetch_or_compile, "ab" * 32, build("a"), name="axpy35"))
        assert await asyncio.to_thread(started["a"].wait, 30)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(running, 0.05)  # the request times out mid-compile
        hit = await asyncio.to_thread(cache.fetch_or_compile, "ab" * 32, build("a2"),
                                      name="axpy35")
        out.append(hit.origin)
        task = asyncio.ensure_future(loop.run_in_executor(
            None, lambda: cache.fetch_or_compile("cd" * 32, build("b"), name="axpy35")))
        assert await asyncio.to_thread(started["b"].wait, 30)
        task.cancel()  # the request is cancelled mid-compile
        with pytest.raises(asyncio.CancelledError):
            await task
        hits = await asyncio.gather(*[asyncio.to_thread(
            cache.fetch_or_compile, "cd" * 32, build("b2"), name="axpy35") for _ in range(3)])
        out += [h.origin for h in hits]
        gathered = await asyncio.gather(*[asyncio.to_thread(
            kp.compile, worker.axpy35, ["sm_80"], cache=cache, opt=1) for _ in range(4)])
        out += sorted(g.origin for g in gathered)
        return out

    origins = asyncio.run(main())
    assert builds == ["a", "b"], f"builds: {builds}"
    assert origins == ["disk"] * 4 + ["compiled"] + ["disk"] * 3, origins
    assert _leftovers(tmp_path / "c") == []
    assert not [p for p in set(_open_paths()) - before if str(tmp_path) in p]
    fresh = kp.Cache(path=tmp_path / "c", remote=False)
    for key in ("ab" * 32, "cd" * 32):
        assert fresh.load(key, name="axpy35") == compiled


# ---- multiprocessing: pools sharing a cache ------------------------------------------------------
@pytest.mark.parametrize("method,own_disk", [("spawn", False), ("forkserver", True),
                                             ("fork", False)],
                         ids=["spawn-shared-disk", "forkserver-own-disks", "fork-shared-disk"])
def test_pool_of_four_compiles_each_key_once(method: str, own_disk: bool, tmp_path: Path,
                                             worker: ModuleType, redis_url: str,
                                             keys: tuple[bytes, bytes]) -> None:
    """``ProcessPoolExecutor(max_workers=4)``, 12 requests for 3 keys, one Redis (signed
    entries) and one cache directory (or one per worker): each key is compiled once in the
    whole pool, every other request is a disk or remote hit, no errors or refusals."""
    private, public = keys
    root = tmp_path / "cache"
    db = {"spawn": 1, "forkserver": 2, "fork": 3}[method]  # one Redis db per test: no shared keys
    url = redis_url.rsplit("/", 1)[0] + f"/{db}"
    jobs = [(str(root), own_disk, url, private, public, i) for i in range(12)]
    with ProcessPoolExecutor(4, mp_context=mp.get_context(method)) as pool:
        results = list(pool.map(worker.compile_task, jobs, timeout=120))
    compiles = {v: sum(1 for r in results if r["variant"] == v and r["origin"] == "compiled")
                for v in range(3)}
    assert compiles == {0: 1, 1: 1, 2: 1}, results
    assert {r["origin"] for r in results} <= {"compiled", "disk", "remote"}
    assert all(r["errors"] == r["remote_errors"] == r["refused"] == 0 for r in results), results
    for d in glob.glob(str(root) + "*"):
        assert _leftovers(Path(d)) == []


@pytest.mark.filterwarnings("ignore::kernelpack.cache.CacheWarning")
def test_worker_killed_mid_compile_holds_nothing_for_longer_than_wait_s(
        tmp_path: Path, worker: ModuleType, redis_url: str, keys: tuple[bytes, bytes]) -> None:
    """A worker SIGKILLed while it compiles a key (it holds the disk lock and the fleet lock):
    the next process compiles the key itself after at most ``wait_s`` (the documented wait for
    another compile), and ``prune`` finds no lock file or temporary left behind."""
    private, public = keys
    url = redis_url.rsplit("/", 1)[0] + "/4"
    root = tmp_path / "c"
    flag = tmp_path / "compiling"
    key = "ef" * 32
    ctx = mp.get_context("fork")
    p = ctx.Process(target=worker.hold_compile,
                    args=(str(root), url, private, public, key, str(flag)))
    p.start()
    try:
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline and p.is_alive():
            time.sleep(0.02)
        assert flag.exists(), "the worker never started compiling"
    finally:
        p.kill()
        p.join()
    cache = worker.make_cache(str(root), url, private, public, wait_s=1.0)
    t0 = time.monotonic()
    got = cache.fetch_or_compile(key, lambda: kp.compile(worker.axpy35, targets=["sm_80"]),
                                 name="axpy35")
    took = time.monotonic() - t0
    assert got.origin == "compiled"
    assert took < 1.0 + 8.0, f"waited {took:.1f} s for a dead worker's compile (wait_s=1)"
    kp.Cache(path=root, remote=False).prune()
    assert _leftovers(root) == []
    assert not glob.glob(str(root / "locks" / "*")), "a lock file outlived prune"


# ---- multiprocessing: what crosses a process boundary ------------------------------------------
FAILURES = ["trace", "compile-log", "constraint", "format", "bad-option"]


def test_errors_raised_in_a_spawn_worker_arrive_intact(spawn_pool: ProcessPoolExecutor,
                                                       worker: ModuleType,
                                                       compiled: kp.Compiled) -> None:
    """A ``TraceError``, a ``CompileError`` with nvJitLink's log, a ``ConstraintError``, a
    ``FormatError`` and a ``ValueError`` raised in a worker come out of ``future.result()``
    with their class, message and attributes (``log``) as the same call raises here."""
    data = kp.save([compiled])
    futures = {kind: spawn_pool.submit(worker.fail, kind, data) for kind in FAILURES}
    for kind, fut in futures.items():
        exc = fut.exception(timeout=120)
        with pytest.raises(Exception) as local:
            worker.fail(kind, data)
        assert type(exc) is type(local.value), (kind, exc, local.value)
        assert str(exc) == str(local.value), kind
        assert vars(exc) == vars(local.value), kind
        if kind == "compile-log":
            assert "bogus_instruction_35" in exc.log


def test_compiled_goes_to_workers_and_a_loaded_pack_says_what_to_send(
        spawn_pool: ProcessPoolExecutor, worker: ModuleType, compiled: kp.Compiled,
        tmp_path: Path) -> None:
    """``kp.Compiled`` objects (fresh, a cache hit, ``pack.compiled(name)``) pickle and work in
    a spawn worker; a loaded ``Pack``/``Program`` refuses with a TypeError that says what to
    send instead, also when a worker tries to return one."""
    cache = kp.Cache(path=tmp_path / "c", remote=False)
    kp.compile(worker.axpy35, targets=["sm_80"], cache=cache)
    hit = kp.compile(worker.axpy35, targets=["sm_80"], cache=cache)
    assert hit.origin == "disk"
    kp.save([compiled], tmp_path / "m.kpack")
    pack = kp.load(tmp_path / "m.kpack")
    expected = worker.use_compiled(compiled)
    for item in (compiled, hit, pack.compiled("axpy35")):
        got = spawn_pool.submit(worker.use_compiled, item).result(timeout=120)
        assert got == expected  # same programs, plan and artifact bytes as here
    for obj in (pack, pack["axpy35"]):
        with pytest.raises(TypeError, match=r"kp\.load|compiled\("):
            pickle.dumps(obj)
    with pytest.raises(TypeError, match=r"kp\.load"):
        spawn_pool.submit(worker.load_pack, kp.save([compiled])).result(timeout=120)


def test_cache_pickles_or_refuses_by_name(tmp_path: Path, compiled: kp.Compiled) -> None:
    """A ``kp.Cache`` is what a pool initializer naturally receives (``initargs=(cache,)``).
    It should either cross the process boundary (it is configuration: a directory, a URL,
    keys) or be refused like a loaded Pack, with an error naming ``kp.Cache`` and what to send
    instead. Today ``pickle.dumps(cache)`` (and ``copy.deepcopy``) fail with CPython's
    "cannot pickle '_thread.lock' object", which names neither."""
    cache = kp.Cache(path=tmp_path / "c", remote=False)
    cache.fetch_or_compile("ab" * 32, lambda: compiled, name="axpy35")
    try:
        clone = pickle.loads(pickle.dumps(cache))
    except TypeError as exc:
        msg = str(exc)
        assert "Cache" in msg and "_thread.lock" not in msg, (
            f"pickling a kp.Cache failed with {msg!r}: it names neither kp.Cache nor what "
            f"to send to the worker instead")
    else:
        assert clone.load("ab" * 32, name="axpy35") == compiled


def test_kernelpack_exceptions_pickle_round_trip() -> None:
    """Every exception class a caller can meet survives pickling (what concurrent.futures,
    multiprocessing and task queues do with it) with its class, message and attributes.
    ``kernelpack.runtime.driver.CudaResultError(code, name, text)`` (documented as the
    ``__cause__`` of every driver failure, in the module's ``__all__``) cannot be unpickled:
    ``TypeError: CudaResultError.__init__() missing 2 required positional arguments``; a
    framework that pickles causes (or an app that re-raises the cause) turns a GPU error into
    a pickling crash."""
    from kernelpack import errors
    from kernelpack.runtime.driver import CudaResultError

    cases: list[BaseException] = []
    for name in ("KernelPackError", "CacheError", "CompatibilityError", "ConstraintError",
                 "ExpressionError", "FormatError", "IntegrityError", "LaunchError",
                 "DeviceError", "SignatureError", "RankError"):
        cases.append(getattr(errors, name)(f"{name}: x.shape[0] is 3 but n = 4"))
    cases.append(errors.CompileError("ptxas failed", log="line 4: error"))
    cases.append(errors.TraceError("add: dtype mismatch", log=""))
    cases.append(CudaResultError(700, "CUDA_ERROR_ILLEGAL_ADDRESS",
                                 "an illegal memory access was encountered"))
    failures = []
    for exc in cases:
        try:
            back = pickle.loads(pickle.dumps(exc))
        except Exception as err:  # noqa: BLE001 - collected and reported
            failures.append(f"{type(exc).__name__}: {type(err).__name__}: {err}")
            continue
        if type(back) is not type(exc) or str(back) != str(exc) or vars(back) != vars(exc):
            failures.append(f"{type(exc).__name__}: came back as {back!r} {vars(back)}")
    assert not failures, failures
