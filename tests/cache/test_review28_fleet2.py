"""Review 28 (round 4): black-box attack on session 28's cache changes (the RESP client's
reconnect-and-retry, the Redis write pause, the disk write pause, revoked signers on disk,
future-dated entries, the ``codegen`` key part), with a real redis-server.

Bugs (each test fails today):

* the fleet lock ``SET NX PX`` is retried after a connection that dropped the reply: Redis
  already holds *our* lock, the retry answers nil, and the process waits ``wait_s`` (30 s by
  default) for itself, warns "waited ... for another process", and leaves its lock behind;
* one key's unwritable directory or lock file (a shard another user created, a stale lock
  file) pauses disk writes for *every* key for 30 s (a warm start loses all its entries);
* a revoked disk entry that is recompiled is counted twice in ``stats()["refused"]`` (and
  warned twice);
* ``kernelpack cache ls`` shows a future-dated entry as unused for 20786 days (since 1970),
  and one dated a few minutes ahead with a negative age;
* an editor's lock file (Emacs ``.#expr.py``, a dangling symlink) next to the package's
  modules makes every ``kp.make_key`` raise FileNotFoundError; an AppleDouble ``._expr.py``
  (a tree copied from macOS) changes the digest though it is no module;
* ``kernelpack/_generated/`` (the flatbuffers writers that lay out every artifact) is not in
  the ``codegen`` digest, although the README says "all but runtime/ and cache/": after a
  fix there, the cache still serves what the buggy writer stored.

The rest pass: a reset on a fresh connection is one outage (one connect, one warning), a
server closing after each reply still works, AUTH and SELECT on the reconnect, a compile
longer than Redis's idle timeout still puts and unlocks; a full Redis is read while writes
pause, unlocks what it locked, warns once, resumes writing after 30 s, and pauses no other
Redis; a read-only disk tier serves hits, resumes after 30 s once writable, and pauses no
other directory; revocation through ``require_signed_remote=False`` is consistent with the
remote, a cache with no trust configured serves signed entries, a revoked disk copy is
replaced by a trusted Redis entry without a compile; prune evicts future-dated entries first
and keeps those within the 300 s tolerance, a hit touches a future entry; the digest is the
same across processes, hash seeds, a wheel's file set, ``__pycache__`` and a built ``.so``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cache import CacheWarning, keys
from kernelpack.signing import write_keypair

from .conftest import SRC, RedisServer, from_cubin, worker_env

HERE = Path(__file__).resolve().parent


def _key(i: int) -> kp.CacheKey:
    return kp.make_key("external", f"review28r4-{i}".encode(), {"i": i}, ["sm_80"])


def _get(cache: kp.Cache, i: int, cubin: bytes) -> str:
    return cache.fetch_or_compile(_key(i), lambda: from_cubin(f"k{i}", cubin)).origin


def _cache_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def _entry(root: Path, k: kp.CacheKey) -> Path:
    return root / "entries" / k.digest[:2] / f"{k.digest}.kpack"


def _chattr(flag: str, *paths: Path) -> None:
    """``+i`` raises CalledProcessError where it fails; ``-i`` (recursive) never does."""
    args = ["chattr", "-R", "-i"] if flag == "-i" else ["chattr", "+i"]
    subprocess.run([*args, *map(str, paths)], check=flag == "+i", capture_output=True,
                   text=True)


@pytest.fixture()
def immutable() -> Iterator[list[Path]]:
    """Paths appended here get ``chattr +i`` (EPERM on writes, even for root) and lose it at
    teardown whatever happens, so pytest can remove tmp_path."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr (an immutable directory stands for an unwritable one)")
    marked: list[Path] = []
    try:
        yield marked
    finally:
        for p in marked:
            _chattr("-i", p)


def _freeze(marked: list[Path], *paths: Path) -> None:
    for p in paths:
        try:
            _chattr("+i", p)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"chattr +i is not supported here: {exc.stderr}")
        marked.append(p)


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the monotonic clock forward (the 30 s pauses) without sleeping."""
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + seconds)


# ---- a proxy that loses one reply ---------------------------------------------------------------
class LoseLockReply:
    """A TCP proxy before redis-server. Once ``armed``, the next fleet-lock ``SET ... NX`` on a
    connection that already carried a command is forwarded, Redis executes it, and the proxy
    closes the client's connection instead of relaying the reply (a proxy restart, a failover
    killing clients, a network blip: the command ran, its reply was lost)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.armed = threading.Event()
        self.dropped = 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.socks: list[socket.socket] = [self.srv]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.srv.accept()
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                return
            self.socks += [client, up]
            state = {"commands": 0, "drop_next_reply": False}
            threading.Thread(target=self._up, args=(client, up, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, up, state), daemon=True).start()

    def _up(self, client: socket.socket, up: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(1 << 20):
                if (self.armed.is_set() and state["commands"] > 0 and b":lock:" in data
                        and b"NX" in data.upper()):
                    self.armed.clear()
                    state["drop_next_reply"] = True
                state["commands"] += 1
                up.sendall(data)
        except OSError:
            pass

    def _down(self, client: socket.socket, up: socket.socket, state: dict) -> None:
        try:
            while data := up.recv(1 << 20):
                if state["drop_next_reply"]:
                    self.dropped += 1
                    break
                client.sendall(data)
        except OSError:
            pass
        for s in (client, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        for s in self.socks:
            s.close()


# ==== bugs: the remote tier =====================================================================
@pytest.mark.redis
def test_lost_reply_to_the_fleet_lock_does_not_make_a_process_wait_for_itself(
        tmp_path: Path, redis_server: RedisServer, signing_keys: tuple[Path, Path],
        axpy_cubin: bytes) -> None:
    """The retry is right for GET and SET (idempotent), not for ``SET lock token NX PX``: the
    first send took the lock, the retried one answers nil, so the process believes another
    one compiles, polls for ``wait_s`` (30 s by default: 3 s here), warns "waited 3 s for
    another process to compile ...; compiling here", and its own lock stays in Redis until
    ``lock_ttl_s``. A retried lock must recognise its own token (GET the lock: ours means
    taken), or not be retried."""
    private, _ = signing_keys
    proxy = LoseLockReply(redis_server.port)
    try:
        cache = kp.Cache(tmp_path, remote=f"redis://127.0.0.1:{proxy.port}/0",
                         sign_with=str(private), timeout_s=5.0, wait_s=3.0)
        assert _get(cache, 0, axpy_cubin) == "compiled"  # the connection is open now
        proxy.armed.set()
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            origin = _get(cache, 1, axpy_cubin)
        took = time.monotonic() - start
    finally:
        proxy.close()
    assert proxy.dropped == 1, "the proxy did not lose the lock's reply"
    assert origin == "compiled"
    assert not _cache_warnings(caught), _cache_warnings(caught)
    assert cache.stats()["remote_waits"] == 0 and took < 2.0, (took, cache.stats())
    assert redis_server.client().keys("kernelpack:1:lock:*") == []  # released, not left


# ==== bugs: the disk tier =======================================================================
@pytest.mark.parametrize("where", ["shard", "lock file"])
def test_one_unwritable_key_does_not_pause_disk_writes_for_all(
        tmp_path: Path, immutable: list[Path], axpy_cubin: bytes, where: str) -> None:
    """A cache directory shared by a team (group-writable root): a shard ``entries/xx`` that
    another user created with umask 022, or a lock file a killed process of another user left,
    cannot be written by us (EACCES; here EPERM of an immutable path, as tests run as root).
    That is one key's failure, yet it pauses the whole tier for 30 s: the next kernels, whose
    directories are writable, are compiled and never stored, so the next start compiles them
    again. Before session 28 only that key was lost. The pause is for a tier that cannot be
    written (full, read-only, another user's root); a failure under one key's path should
    cost that key only (or pause that directory only)."""
    first = _key(0)
    others = [k for k in map(_key, range(1, 40)) if k.digest[:2] != first.digest[:2]][:4]
    root = tmp_path / "cache"
    kp.Cache(root, remote=False)  # lays out the root
    if where == "shard":
        (root / "entries" / first.digest[:2]).mkdir(parents=True, exist_ok=True)
        _freeze(immutable, root / "entries" / first.digest[:2])
    else:
        (root / "locks").mkdir(parents=True, exist_ok=True)
        lock = root / "locks" / f"{first.digest}.lock"
        lock.write_bytes(b"")
        _freeze(immutable, lock)
    cache = kp.Cache(root, remote=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.fetch_or_compile(first, lambda: from_cubin("k0", axpy_cubin))
        for k in others:
            cache.fetch_or_compile(k, lambda: from_cubin("k", axpy_cubin))
    stored = [_entry(root, k).exists() for k in others]
    assert all(stored), (stored, _cache_warnings(caught))
    again = [cache.fetch_or_compile(k, lambda: from_cubin("k", axpy_cubin)).origin
             for k in others]
    assert again == ["disk"] * 4


# ==== bugs: revocation ==========================================================================
def test_a_refused_revoked_entry_is_counted_once(tmp_path: Path, axpy_cubin: bytes) -> None:
    """One disk entry signed by a revoked key, one fetch: ``stats()["refused"]`` says 2 and
    two warnings come (the entry is checked again once the disk lock is taken, and counted
    again). When Redis serves the key instead (no compile) it is 1. A fleet dashboard summing
    "refused" sees twice the revoked entries there are."""
    priv_a, _ = write_keypair(tmp_path / "a.key")
    _, pub_b = write_keypair(tmp_path / "b.key")
    assert _get(kp.Cache(tmp_path / "c", remote=False, sign_with=str(priv_a)), 0,
                axpy_cubin) == "compiled"
    cache = kp.Cache(tmp_path / "c", remote=False, trusted_keys=[str(pub_b)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _get(cache, 0, axpy_cubin) == "compiled"
    s = cache.stats()
    assert s["refused"] == 1 and len(_cache_warnings(caught)) == 1, (s, _cache_warnings(caught))


# ==== bugs: future-dated entries ================================================================
_AGE = re.compile(r"^(-?\d+(?:\.\d+)?)(s|m|h|d)$")


def test_cache_ls_shows_no_impossible_age_for_future_dated_entries(tmp_path: Path,
                                                                   axpy_cubin: bytes) -> None:
    """``kernelpack cache ls`` of a cache made a second ago: an entry dated a year ahead (clock
    skew) shows "unused 20786.2d" (the age of the Unix epoch), one dated 250 s ahead "unused
    -250s". Neither was ever true; an operator reading ls to decide what to prune is misled.
    Any age shown must lie between 0 and the cache's own age (or say it is in the future)."""
    cache = kp.Cache(tmp_path, remote=False)
    for i in range(3):
        _get(cache, i, axpy_cubin)
    now = time.time()
    for i, ahead in ((1, 365 * 86400), (2, 250)):
        os.utime(_entry(tmp_path, _key(i)), (now + ahead, now + ahead))
    out = subprocess.run([sys.executable, "-m", "kernelpack", "cache", "ls", "--dir",
                          str(tmp_path)], env=worker_env(), capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    shown = {}
    for line in out.stdout.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3 and cols[0] in {_key(i).digest[:16] for i in range(3)}:
            shown[cols[0]] = cols[2]
    assert len(shown) == 3, out.stdout
    for key, text in shown.items():
        m = _AGE.match(text)
        if m:
            age = float(m.group(1)) * scale[m.group(2)]
            assert 0 <= age <= 3600, f"entry {key} shown unused for {text}:\n{out.stdout}"


# ==== bugs: the codegen digest ==================================================================
def _copy_src(dst: Path) -> Path:
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dst


_KEY_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kernelpack as kp
from _cache_kernels import from_cubin
key = kp.make_key("external", b"review28r4-codegen", {}, ["sm_80"])
print(json.dumps({"codegen": dict(key.parts)["codegen"], "file": kp.__file__}))
"""


def _tree_env(tree: Path) -> dict[str, str]:
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [
        p for p in env["PYTHONPATH"].split(os.pathsep) if p and Path(p) != SRC])
    return env


def test_an_editor_lock_file_does_not_break_every_key(tmp_path: Path) -> None:
    """Emacs marks a buffer with unsaved changes by a dangling symlink ``.#expr.py`` next to
    the file, in the package directory of an editable install (the developer the codegen part
    is for). The digest reads every ``*.py`` there, that one included: ``kp.make_key`` (so
    every cached compile) raises FileNotFoundError. (lowering/ had this before; the top level
    is new and is where expr.py, fusion.py, graph.py are edited.) A hidden name is no module:
    it should be skipped, and the digest stay the tree's."""
    tree = _copy_src(tmp_path / "src")
    expected = keys.codegen_digest(root=tree / "kernelpack")
    os.symlink("dev@host.4242:1700000000", tree / "kernelpack" / ".#expr.py")
    out = subprocess.run([sys.executable, "-c", _KEY_CHILD, str(HERE)], env=_tree_env(tree),
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-1500:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(tree)) and got["codegen"] == expected


def test_hidden_non_module_files_do_not_enter_the_codegen_digest(tmp_path: Path) -> None:
    """A tree copied from macOS (tar, a USB disk, a shared folder) carries AppleDouble files
    ``._expr.py`` beside each module: binary, no module (a name starting with "." cannot be
    imported). They enter the digest ("82 files"), so such an install misses every entry its
    builder filled, although its code is the same."""
    tree = _copy_src(tmp_path / "src") / "kernelpack"
    base = keys.codegen_digest(root=tree)
    (tree / "._expr.py").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    (tree / "lowering" / "._tuning.py").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00")
    assert keys.codegen_digest(root=tree) == base


_GENERATED_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[3])
import kernelpack as kp
from _cache_kernels import from_cubin
cubin = open(sys.argv[2], "rb").read()
key = kp.make_key("external", b"review28r4-generated", {}, ["sm_80"])
build = lambda: from_cubin("r28gen", cubin)
got = kp.Cache(sys.argv[1], remote=False).fetch_or_compile(key, build)
grid = lambda c: list(kp.load(kp.save(c))["r28gen"].plan(x=(1000,), y=(1000,), a=1.0,
                                                          n=1000).launches[0].grid)
print(json.dumps({"origin": got.origin, "key": key.digest, "cached_grid": grid(got),
                  "fresh_grid": grid(build()), "file": kp.__file__}))
"""

# appended to a copy of _generated/Dim3.py, a writer bug: the first Dim3 of each launch (its
# grid) gets the block's x expression as its y
_DIM3_BUG = """

_review28_create = CreateDim3
_review28_calls = [0]


def CreateDim3(builder, x, y, z):  # type: ignore[no-redef]
    _review28_calls[0] += 1
    return _review28_create(builder, x, 3 if _review28_calls[0] % 2 else y, z)
"""


def test_a_fixed_generated_module_is_not_served_the_old_code(tmp_path: Path,
                                                            cubin_file: Path) -> None:
    """README: the key digests "the source of everything that makes an artifact — kernelpack's
    own modules, lowering/ and toolchain/, all but runtime/ and cache/". ``_generated/`` is
    neither runtime nor cache: its flatbuffers writers (``Dim3.CreateDim3``,
    ``Launch.AddGrid``, ...) lay out every artifact the cache stores, yet its source is not in
    the ``codegen`` part (CODEGEN_PACKAGES = ('', 'lowering', 'toolchain')). A tree whose
    ``_generated/Dim3.py`` writes a wrong grid (4, 256, 1 for 4, 1, 1) fills the cache; the
    fixed tree computes the same key and is served the wrong launch grid."""
    buggy = _copy_src(tmp_path / "src")
    with open(buggy / "kernelpack" / "_generated" / "Dim3.py", "a") as f:
        f.write(_DIM3_BUG)
    cache_dir = tmp_path / "cache"

    def run(env: dict[str, str]) -> dict:
        out = subprocess.run([sys.executable, "-c", _GENERATED_CHILD, str(cache_dir),
                              str(cubin_file), str(HERE)], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    old = run(_tree_env(buggy))
    assert old["file"].startswith(str(buggy)) and old["origin"] == "compiled"
    assert old["fresh_grid"] == [4, 256, 1], "the writer bug did not reach the artifact"
    fixed = run(worker_env())
    assert fixed["fresh_grid"] == [4, 1, 1]
    assert fixed["cached_grid"] == fixed["fresh_grid"], (
        f"stale hit: the fixed tree launches {fixed['fresh_grid']}, the cache served "
        f"{fixed['cached_grid']} (origin {fixed['origin']}, same key: "
        f"{fixed['key'] == old['key']})")


# ==== what works: the remote tier ===============================================================
class _BadServer:
    """``reset``: reads a command, then closes with RST. ``one``: answers one command per
    connection (nil to GET or GETEX, +OK otherwise), then closes."""

    def __init__(self, mode: str) -> None:
        self.mode, self.connections = mode, 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
            if data and self.mode == "one":
                command = data.split(b"\r\n")[2].upper()
                conn.sendall(b"$-1\r\n" if command in (b"GET", b"GETEX") else b"+OK\r\n")
                conn.recv(65536)
            elif data:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.srv.close()


@pytest.mark.parametrize("mode", ["reset", "one"])
def test_reset_on_a_fresh_connection_is_one_outage_not_a_loop(tmp_path: Path, axpy_cubin: bytes,
                                                              mode: str) -> None:
    from kernelpack.signing import generate_private_key

    server = _BadServer(mode)
    try:
        cache = kp.Cache(tmp_path, remote=f"redis://127.0.0.1:{server.port}/0",
                         sign_with=generate_private_key(), timeout_s=1.0)
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            origins = [_get(cache, i, axpy_cubin) for i in range(5)]
        took = time.monotonic() - start
    finally:
        server.close()
    assert origins == ["compiled"] * 5 and took < 5.0
    shown = _cache_warnings(caught)
    if mode == "reset":  # the reconnect's own failure is the outage: once, then 30 s off
        assert server.connections == 1 and len(shown) == 1 and "30 s" in shown[0], shown
        assert cache.stats()["remote_errors"] == 1
    else:  # a server that closes after every reply still serves (one reconnect a command)
        assert not shown and cache.stats()["remote_puts"] == 5
        assert server.connections <= 8 * 5


@pytest.mark.redis
def test_reconnect_authenticates_and_selects_the_database(tmp_path: Path,
                                                         signing_keys: tuple[Path, Path],
                                                         axpy_cubin: bytes) -> None:
    server = RedisServer(tmp_path, password="s3cret")
    try:
        private, public = signing_keys
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        writer = kp.Cache(tmp_path / "a", remote=url, sign_with=str(private), timeout_s=5.0)
        assert _get(writer, 0, axpy_cubin) == "compiled"
        server.client().config_set("timeout", "1")
        time.sleep(2.5)  # the server closes the idle, authenticated, db-3 connection
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _get(writer, 1, axpy_cubin) == "compiled"
        assert not _cache_warnings(caught) and writer.stats()["remote_puts"] == 2
        import redis

        db3 = redis.Redis(host="127.0.0.1", port=server.port, password="s3cret", db=3)
        assert db3.exists(f"kernelpack:1:entry:{_key(1).digest}") == 1
        assert server.client().keys("*") == []  # nothing landed in db 0
        reader = kp.Cache(tmp_path / "b", remote=url, trusted_keys=[str(public)])
        assert _get(reader, 1, axpy_cubin) == "remote"
    finally:
        server.kill()


@pytest.mark.redis
def test_a_compile_longer_than_the_idle_timeout_still_puts_and_unlocks(
        tmp_path: Path, redis_server: RedisServer, signing_keys: tuple[Path, Path],
        axpy_cubin: bytes) -> None:
    private, _ = signing_keys
    redis_server.client().config_set("timeout", "1")
    cache = kp.Cache(tmp_path, remote=redis_server.url, sign_with=str(private), timeout_s=5.0)

    def slow() -> kp.Compiled:
        time.sleep(2.5)  # the lock holder's connection is closed meanwhile
        return from_cubin("k0", axpy_cubin)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.fetch_or_compile(_key(0), slow).origin == "compiled"
    assert not _cache_warnings(caught) and cache.stats()["remote_puts"] == 1
    client = redis_server.client()
    assert client.keys("kernelpack:1:lock:*") == []
    assert client.exists(f"kernelpack:1:entry:{_key(0).digest}") == 1


@pytest.mark.redis
def test_full_redis_unlocks_warns_once_resumes_and_pauses_no_other_redis(
        tmp_path: Path, redis_server: RedisServer, signing_keys: tuple[Path, Path],
        axpy_cubin: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis fills up while this process holds the fleet lock (its put is refused): the lock
    is still released (DEL is allowed at maxmemory), so other machines do not wait for an
    entry that will never come; then six more kernels give one warning; a second Redis used
    by another Cache is not paused; 30 s later (memory freed) writes resume."""
    private, public = signing_keys
    (tmp_path / "other").mkdir()
    other_server = RedisServer(tmp_path / "other")
    try:
        client = redis_server.client()
        cache = kp.Cache(tmp_path / "a", remote=redis_server.url, sign_with=str(private),
                         trusted_keys=[str(public)], timeout_s=5.0)
        other = kp.Cache(tmp_path / "b", remote=other_server.url, sign_with=str(private),
                         timeout_s=5.0)

        def fills_up() -> kp.Compiled:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
            return from_cubin("k0", axpy_cubin)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cache.fetch_or_compile(_key(0), fills_up).origin == "compiled"
            assert client.keys("kernelpack:1:lock:*") == []
            assert [_get(cache, i, axpy_cubin) for i in range(1, 7)] == ["compiled"] * 6
            assert _get(other, 9, axpy_cubin) == "compiled"
        shown = _cache_warnings(caught)
        assert len(shown) == 1 and "30 s" in shown[0], shown
        assert cache.stats()["remote_puts"] == 0 and other.stats()["remote_puts"] == 1
        client.config_set("maxmemory", "0")
        _later(monkeypatch, 31)
        assert _get(cache, 7, axpy_cubin) == "compiled"
        assert cache.stats()["remote_puts"] == 1
        assert client.exists(f"kernelpack:1:entry:{_key(7).digest}") == 1
    finally:
        other_server.kill()


# ==== what works: the disk tier =================================================================
def test_unwritable_disk_serves_hits_resumes_after_the_pause_and_pauses_no_other_dir(
        tmp_path: Path, immutable: list[Path], axpy_cubin: bytes,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, elsewhere = tmp_path / "a", tmp_path / "b"
    seed = kp.Cache(root, remote=False)
    assert _get(seed, 100, axpy_cubin) == "compiled"
    _freeze(immutable, root / "locks", root / "entries", *(root / "entries").iterdir())
    cache, other = kp.Cache(root, remote=False), kp.Cache(elsewhere, remote=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [_get(cache, i, axpy_cubin) for i in range(3)] == ["compiled"] * 3
        assert _get(cache, 100, axpy_cubin) == "disk"  # reads go on
        assert [_get(other, i, axpy_cubin) for i in range(3)] == ["compiled"] * 3
    shown = _cache_warnings(caught)
    assert len(shown) == 1 and str(root) in shown[0] and "30 s" in shown[0], shown
    assert other.stats()["puts"] == 3 and cache.stats()["puts"] == 0
    for p in immutable:
        _chattr("-i", p)
    _later(monkeypatch, 31)
    assert [_get(cache, i, axpy_cubin) for i in range(3)] == ["compiled"] * 3
    assert [_get(cache, i, axpy_cubin) for i in range(3)] == ["disk"] * 3


# ==== what works: revocation ====================================================================
@pytest.mark.redis
def test_revocation_edges(tmp_path: Path, redis_server: RedisServer, axpy_cubin: bytes) -> None:
    """A disk entry signed by A: served by a cache with no trust configured (nothing to
    revoke), refused by one trusting B but replaced by B's Redis entry without a compile
    (then served from disk), and accepted with ``require_signed_remote=False`` exactly as the
    remote accepts A's entry there (consistent tiers)."""
    priv_a, pub_a = write_keypair(tmp_path / "a.key")
    priv_b, pub_b = write_keypair(tmp_path / "b.key")
    url = redis_server.url
    assert _get(kp.Cache(tmp_path / "m", remote=False, sign_with=str(priv_a)), 0,
                axpy_cubin) == "compiled"
    assert _get(kp.Cache(tmp_path / "m", remote=False), 0, axpy_cubin) == "disk"
    assert _get(kp.Cache(tmp_path / "m", remote=False, trusted_keys=[str(pub_a)]), 0,
                axpy_cubin) == "disk"
    assert _get(kp.Cache(tmp_path / "o", remote=url, sign_with=str(priv_b)), 0,
                axpy_cubin) == "compiled"
    trusting_b = kp.Cache(tmp_path / "m", remote=url, trusted_keys=[str(pub_b)])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert _get(trusting_b, 0, axpy_cubin) == "remote"
    assert trusting_b.stats()["compiles"] == 0
    assert _get(kp.Cache(tmp_path / "m", remote=False, trusted_keys=[str(pub_b)]), 0,
                axpy_cubin) == "disk"
    # require_signed_remote=False: A's entry is accepted from Redis, and so from its disk copy
    assert _get(kp.Cache(tmp_path / "w", remote=url, sign_with=str(priv_a)), 1,
                axpy_cubin) == "compiled"
    lax = {"trusted_keys": [str(pub_b)], "require_signed_remote": False}
    assert _get(kp.Cache(tmp_path / "lax", remote=url, **lax), 1, axpy_cubin) == "remote"
    assert _get(kp.Cache(tmp_path / "lax", remote=url, **lax), 1, axpy_cubin) == "disk"


# ==== what works: future-dated entries ==========================================================
def test_prune_evicts_future_dated_first_keeps_the_tolerance_and_hits_touch(
        tmp_path: Path, axpy_cubin: bytes) -> None:
    cache = kp.Cache(tmp_path, remote=False)
    for i in range(6):
        _get(cache, i, axpy_cubin)
    now = time.time()
    ahead = {0: -100, 1: -50, 2: 365 * 86400, 3: 330, 4: 240, 5: -10}
    for i, s in ahead.items():
        os.utime(_entry(tmp_path, _key(i)), (now + s, now + s))
    size = _entry(tmp_path, _key(0)).stat().st_size
    out = subprocess.run([sys.executable, "-m", "kernelpack", "cache", "prune", "--max-bytes",
                          str(size * 3 + size // 2), "--dir", str(tmp_path)], env=worker_env(),
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    left = {i for i in ahead if _entry(tmp_path, _key(i)).exists()}
    assert left == {1, 4, 5}, (left, out.stdout)  # future first (2, 3), then the oldest (0)
    os.utime(_entry(tmp_path, _key(4)), (now + 86400, now + 86400))
    assert _get(kp.Cache(tmp_path, remote=False), 4, axpy_cubin) == "disk"
    assert abs(_entry(tmp_path, _key(4)).stat().st_mtime - time.time()) < 60


# ==== what works: the codegen digest ============================================================
def test_codegen_digest_is_stable_across_processes_and_installs(tmp_path: Path) -> None:
    """Two processes with other hash seeds and working directories agree; so do a tree laid
    out as a wheel installs it (setuptools' packages, .py files only), a copy with
    ``__pycache__`` compiled in it, and one with a built extension module beside the .py."""
    import compileall

    import setuptools

    digests = set()
    for seed, cwd in (("1", tmp_path), ("2", HERE)):
        env = worker_env()
        env["PYTHONHASHSEED"] = seed
        script = "from kernelpack.cache import keys; print(keys.codegen_digest())"
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd,
                             capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert digests == {keys.codegen_digest()}
    wheel = tmp_path / "wheel"
    for package in setuptools.find_packages(str(SRC)):
        for f in (SRC / package.replace(".", "/")).glob("*.py"):
            target = wheel / f.relative_to(SRC)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)  # a fresh mtime, as an install gives
    assert keys.codegen_digest(root=wheel / "kernelpack") == keys.codegen_digest()
    built = _copy_src(tmp_path / "built") / "kernelpack"
    compileall.compile_dir(str(built), quiet=1)
    (built / "runtime" / "_launch.abi3.so").write_bytes(os.urandom(256))
    (built / "_launch.abi3.so").write_bytes(os.urandom(256))
    assert keys.codegen_digest(root=built) == keys.codegen_digest()
