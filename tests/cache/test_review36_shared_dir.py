"""Review 36, angle F: a cache directory shared between Unix users, and hostile neighbours.

Production hosts share one cache directory between accounts (a setgid group directory such as
``/srv/kernelpack-cache``), put it under a sticky world-writable ``/tmp``, or point
``KERNELPACK_CACHE_DIR``/``$HOME`` at another account's private directory (``su`` without
``-`` keeps ``HOME``). README ("Warm start for a fleet"): a disk tier that cannot be written
("full, read-only, another user's") warns once, naming the directory, and pauses its writes;
``Cache.clear`` is a CacheError naming the directory when it cannot be emptied; the cache
directories kernelpack makes are 0700 whatever the umask. DESIGN: a cache entry is untrusted
input; a crash or a followed symlink to a file outside the cache is a bug.

Black-box: only README, DESIGN, the issue text, ``--help`` and public docstrings were read.
Other users are simulated in forked children (``setgroups``/``setgid``/``setuid`` to uid
4001/4002, gid 4000): the interpreter lives under ``/root`` (0700), so no fresh process can
start as another user, and everything a child imports lazily is imported here first, as root.
Needs root; skipped otherwise.
"""

from __future__ import annotations

import contextlib
import errno  # noqa: F401 - imported while root: a forked child cannot read the stdlib
import gc
import gettext  # noqa: F401
import grp  # noqa: F401
import io
import json
import locale  # noqa: F401
import os
import pwd  # noqa: F401
import select
import shutil
import signal
import stat  # noqa: F401
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kernelpack as kp
from kernelpack.cache import CacheWarning
from kernelpack.cli import main as cli_main

from ._cache_kernels import from_cubin

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="needs root to run children as other users")

A_UID, B_UID, GID = 4001, 4002, 4000  # user A (the victim / first user), user B (neighbour)

FUSION_SRC = (
    "import kernelpack as kp\n\n"
    "@kp.fusion\n"
    "def add2(x: kp.Tensor[kp.f32, 'n']):\n"
    "    return x + 2.0\n"
)


def _digest(i: int, shard: str = "00") -> str:
    return f"{shard}{i:062x}"


# ---- running code as another user ------------------------------------------------------------
def as_user(fn: Callable[[], Any], uid: int, *, umask: int = 0o022, env: dict | None = None,
            timeout_s: float = 30.0) -> dict:
    """``fn()`` in a forked child running as ``uid`` (gid/group GID) with ``umask``.

    Returns ``{"res": ..., "warnings": [...]}`` (JSON-able), ``{"exc": "Type: message",
    "tb": ...}`` when ``fn`` raised, or ``{"hang": True}`` when it did not finish in time (the
    child is killed). ``env`` is set in the child before ``fn`` runs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.close(r)
            os.setgroups([GID])
            os.setgid(GID)
            os.setuid(uid)
            os.umask(umask)
            for k, v in (env or {}).items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            # what earlier tests of this worker left to collect (a file object in a cycle
            # warns "unclosed file" when collected), collected before the recording starts:
            # the warnings recorded are fn's
            gc.collect()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    out: dict = {"res": fn()}
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    out = {"exc": f"{type(exc).__name__}: {exc}",
                           "tb": traceback.format_exc()[-3000:]}
                gc.collect()  # an unclosed iterator warns when collected
            out["warnings"] = [f"{x.category.__name__}: {x.message}" for x in caught]
            data = json.dumps(out, default=repr).encode()
        except BaseException:  # noqa: BLE001
            data = json.dumps({"exc": "harness", "tb": traceback.format_exc()}).encode()
        try:
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    buf, deadline = b"", time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return {"hang": True}
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                buf += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return json.loads(buf)


def cli(*args: str) -> dict:
    """``kernelpack ARGS`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main(list(args))
        except SystemExit as exc:
            rc = exc.code
    return {"rc": rc, "out": out.getvalue()[-2000:], "err": err.getvalue()[-2000:]}


def fetch(root: str | Path | None, i: int, cub: bytes, shard: str = "00") -> str:
    """One ``fetch_or_compile`` through a fresh Cache (None: the default root); the origin."""
    cache = kp.Cache(root, remote=False) if root is not None else kp.Cache(remote=False)
    return cache.fetch_or_compile(_digest(i, shard), lambda: from_cubin(f"p{i}", cub),
                                  name=f"p{i}").origin


def _cache_warnings(result: dict) -> list[str]:
    return [w for w in result.get("warnings", []) if w.startswith("CacheWarning")]


def _ok(result: dict) -> Any:
    assert "res" in result, result
    return result["res"]


# ---- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cub(axpy_cubin: bytes) -> bytes:
    """The cheap cubin, and every code path the children take run once here as root, so that
    nothing a child needs is imported lazily from the unreadable /root interpreter."""
    with tempfile.TemporaryDirectory() as t, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            fetch(t, 1, axpy_cubin)
        cache = kp.Cache(t, remote=False)
        cache.get(_digest(1))
        cache.load(_digest(1))
        cache.explain(_digest(1))
        cache.put(_digest(2), kp.save([from_cubin("p2", axpy_cubin)]))
        (Path(t) / "entries" / "00" / f"{_digest(1)}.kpack").write_bytes(b"junk")
        fetch(t, 1, axpy_cubin)  # quarantine
        for action in ("ls", "stats", "prune", "clear"):
            cli("cache", action, "--dir", t)
        cli("cache", "explain", "--dir", t, _digest(1))
        cli("cache", "ls", "--no-such-option")  # argparse's error path
        Path(t, "fus.py").write_text(FUSION_SRC)
        cli("build", str(Path(t, "fus.py")), "-o", str(Path(t, "o.kpack")), "--targets",
            "sm_80", "--cache-dir", str(Path(t, "bc")))
        cache.prune(0)
        cache.clear()
        try:
            kp.Cache(Path(t) / "fus.py", remote=False)
        except ValueError:
            pass
    return axpy_cubin


@pytest.fixture()
def base() -> Iterator[Path]:
    """A directory under /tmp every test user can traverse (0755); removed as root after."""
    path = Path(tempfile.mkdtemp(prefix="kp-r36-users-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _dir(path: Path, uid: int, gid: int, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


# ==== another user's private directory: warn, go on ==============================================
def test_cache_dir_env_at_another_users_private_dir_warns_and_compiles(base: Path,
                                                                        cub: bytes) -> None:
    """KERNELPACK_CACHE_DIR at A's 0700 directory, used by B: README, a disk tier that is
    "another user's" warns once naming the directory and the compile goes on. Every lookup
    raised PermissionError (os.stat of <root>/entries), so kp.compile(..., cache=) failed."""
    private = _dir(base / "a-private", A_UID, GID, 0o700)
    assert _ok(as_user(lambda: fetch(private, 1, cub), A_UID)) == "compiled"

    def b_run() -> list[str]:
        cache = kp.Cache(remote=False)  # the root comes from KERNELPACK_CACHE_DIR
        return [cache.fetch_or_compile(_digest(i), lambda i=i: from_cubin(f"p{i}", cub),
                                       name=f"p{i}").origin for i in (1, 2, 2)]

    got = as_user(b_run, B_UID, env={"KERNELPACK_CACHE_DIR": str(private)})
    assert got.get("res") == ["compiled"] * 3, got
    warned = _cache_warnings(got)
    assert len(warned) == 1 and str(private) in warned[0], warned


def test_default_root_under_another_users_home_warns_and_compiles(base: Path,
                                                                 cub: bytes) -> None:
    """``su svc`` (without ``-``) keeps HOME: kp.Cache() then defaults to
    ~/.cache/kernelpack inside another user's 0700 home. The constructor accepted it, and every
    fetch_or_compile raised PermissionError instead of warning and compiling."""
    home = _dir(base / "home-a", A_UID, GID, 0o700)
    got = as_user(lambda: [fetch(None, 1, cub), fetch(None, 1, cub)], B_UID,
                  env={"HOME": str(home), "KERNELPACK_CACHE_DIR": None, "XDG_CACHE_HOME": None})
    assert got.get("res") == ["compiled", "compiled"], got
    assert any(str(home) in w for w in _cache_warnings(got)), got


def test_build_with_cache_dir_of_another_user_still_writes_the_artifact(base: Path,
                                                                       cub: bytes) -> None:
    """``kernelpack build --cache-dir`` at a directory the builder cannot read: the cache is an
    optimisation, the artifact must still be written (it failed every program with
    "FAILED: PermissionError" and wrote nothing)."""
    private = _dir(base / "a-private", A_UID, GID, 0o700)
    work = _dir(base / "b-work", B_UID, GID, 0o755)
    (work / "fus.py").write_text(FUSION_SRC)
    os.chown(work / "fus.py", B_UID, GID)
    out = work / "o.kpack"
    got = as_user(lambda: cli("build", str(work / "fus.py"), "-o", str(out), "--targets",
                              "sm_80", "--cache-dir", str(private)), B_UID)
    res = _ok(got)
    assert res["rc"] == 0 and out.is_file(), res
    assert "PermissionError" not in res["err"], res


@pytest.mark.parametrize("call", ["get", "load", "put", "explain"])
def test_api_on_another_users_private_dir_raises_no_permission_error(base: Path, cub: bytes,
                                                                     call: str) -> None:
    """get/load: a miss (None); put: a warning; explain: text (or a CacheError naming the
    directory), never a bare PermissionError."""
    private = _dir(base / "a-private", A_UID, GID, 0o700)
    assert _ok(as_user(lambda: fetch(private, 1, cub), A_UID)) == "compiled"
    data = kp.save([from_cubin("p3", cub)])

    def b_call() -> object:
        cache = kp.Cache(private, remote=False)
        if call == "put":
            return cache.put(_digest(3), data)
        result = getattr(cache, call)(_digest(1))
        return result if result is None or isinstance(result, str) else type(result).__name__

    got = as_user(b_call, B_UID)
    if "exc" in got:
        assert got["exc"].startswith("CacheError") and str(private) in got["exc"], got
    elif call in ("get", "load", "put"):
        assert got["res"] is None, got


# ==== symlinks a neighbour plants where kernelpack creates files ==================================
def _shared_root(base: Path) -> Path:
    """A setgid group directory, as an admin makes it: root:GID 2775."""
    return _dir(base / "shared", 0, GID, 0o2775)


def _neighbour_dir(path: Path, root: Path) -> None:
    """``path`` and its parents up to ``root``, made by the neighbour, open to everyone."""
    if path != root:
        _neighbour_dir(path.parent, root)
        path.mkdir(exist_ok=True)
        path.chmod(0o777)


def test_lock_symlink_planted_by_a_neighbour_creates_no_file_outside(base: Path,
                                                                     cub: bytes) -> None:
    """B (same group) pre-creates ``locks/`` in the shared root and a dangling symlink at the
    lock of a key A will compile, pointing into A's home (which B cannot write). The lock is
    opened O_CREAT without O_NOFOLLOW: A's process created the file in A's home, silently."""
    root = _shared_root(base)
    home_a = _dir(base / "home-a", A_UID, GID, 0o755)
    target = home_a / "planted-by-b"

    def plant() -> str:
        locks = root / "locks"
        locks.mkdir()
        locks.chmod(0o777)
        os.symlink(target, locks / f"{_digest(7)}.lock")
        return "ok"

    assert _ok(as_user(plant, B_UID)) == "ok"
    got = as_user(lambda: [fetch(root, 7, cub), fetch(root, 7, cub)], A_UID)
    assert "res" in got, got
    assert not target.exists() and not target.is_symlink(), (
        f"A's cache created {target} through B's symlink; A: {got}")


# (planted link, what it points at in A's home, the name of A's file there, A's cache action)
_PLANTED = {
    "quarantine->models (clear)": ("quarantine", "model.kpack", "clear"),
    "locks->run (clear)": ("locks", "app.lock", "clear"),
    "locks->run (prune)": ("locks", "app.lock", "prune"),
    "keys/ab->conf (clear)": ("keys/ab", "settings.json", "clear"),
    "entries/ab->tmp (prune)": ("entries/ab", ".download.tmp", "prune"),
}


@pytest.mark.parametrize("case", list(_PLANTED))
def test_prune_and_clear_do_not_delete_through_planted_symlinks(base: Path, cub: bytes,
                                                                case: str) -> None:
    """B plants a symlink where A's cache expects one of its directories, pointing at a
    directory of A's own files; A's ``kernelpack cache clear``/``prune`` deleted A's files
    there (a quarantined-looking ``*.kpack``, ``*.lock``, ``*.json``, an old ``.*.tmp``).
    DESIGN: a symlink in the cache is never followed (cf. review 10: "a symlink inside is
    removed, never followed")."""
    link, name, action = _PLANTED[case]
    root = _shared_root(base)
    home_a = _dir(base / "home-a", A_UID, GID, 0o755)
    victim_dir = _dir(home_a / "data", A_UID, GID, 0o755)
    victim = victim_dir / name
    victim.write_bytes(b"A's own file\n")
    os.chown(victim, A_UID, GID)
    os.utime(victim, (1e9, 1e9))  # old, as a stale temporary would be

    def plant() -> str:
        path = root / link
        _neighbour_dir(path.parent, root)
        os.symlink(victim_dir, path)
        return "ok"

    assert _ok(as_user(plant, B_UID)) == "ok"
    args = ["cache", action, "--dir", str(root)] + (["--max-bytes", "0"]
                                                     if action == "prune" else [])
    got = as_user(lambda: [fetch(root, 1, cub), cli(*args)], A_UID)
    assert "res" in got, got
    assert victim.exists(), f"`kernelpack {' '.join(args)}` deleted {victim}: {got}"


@pytest.mark.parametrize("link", ["entries/00", "quarantine"])
def test_entries_are_not_written_through_a_planted_symlink(base: Path, cub: bytes,
                                                          link: str) -> None:
    """A shard directory (or the quarantine) that is a symlink B planted into A's home: A's new
    entry (or the bad entry it moves aside) landed in A's home, outside the cache."""
    root = _shared_root(base)
    home_a = _dir(base / "home-a", A_UID, GID, 0o755)
    elsewhere = _dir(home_a / "docs", A_UID, GID, 0o755)

    def plant() -> str:
        path = root / link
        _neighbour_dir(path.parent, root)
        os.symlink(elsewhere, path)
        if link == "quarantine":  # and a bad entry for A's key, to be moved aside
            shard = root / "entries" / "00"
            _neighbour_dir(shard, root)
            (shard / f"{_digest(1)}.kpack").write_bytes(b"not an artifact")
        return "ok"

    assert _ok(as_user(plant, B_UID)) == "ok"
    got = as_user(lambda: [fetch(root, 1, cub), fetch(root, 1, cub)], A_UID)
    assert "res" in got, got
    assert sorted(p.name for p in elsewhere.iterdir()) == [], (
        f"A's cache wrote into {elsewhere} through B's {link} symlink; A: {got}")


def test_a_root_planted_by_another_user_in_sticky_tmp_is_not_trusted_silently(
        base: Path, cub: bytes) -> None:
    """B pre-creates A's configured cache root in a sticky /tmp-like directory (B-owned, 0777)
    with an entry for a key A will ask for: code B wrote would run in A's process. It was served
    as a disk hit with no word. README tells users never to point the cache at a directory
    others can write; a root owned by another user and writable by everyone must at least be
    named in a CacheWarning (or not be read)."""
    sticky = base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    root = sticky / "kernelpack-cache"
    planted = kp.save([from_cubin("p1", cub)])  # B's "code" for A's key

    def plant() -> str:
        os.umask(0)
        (root / "entries" / "00").mkdir(parents=True, mode=0o777)
        (root / "entries" / "00" / f"{_digest(1)}.kpack").write_bytes(planted)
        return "ok"

    assert _ok(as_user(plant, B_UID)) == "ok"
    got = as_user(lambda: fetch(root, 1, cub), A_UID)
    assert "res" in got, got
    named = [w for w in _cache_warnings(got) if str(root) in w]
    assert got["res"] != "disk" or named, (
        f"A served B's planted entry from {root} (uid {B_UID}, mode 0777) without a warning")


def test_prune_with_a_dangling_locks_symlink_names_it(tmp_path: Path, cub: bytes) -> None:
    """``locks`` a dangling symlink (planted, or left by a removed mount): fetches work (a
    warning names ``locks``), but prune(0) raised "cannot prune the disk cache '<root>': File
    exists", naming neither ``locks`` nor what to remove. Either prune works (as it does when
    ``locks`` is a plain file) or the error names the path."""
    root = tmp_path / "c"
    root.mkdir()
    os.symlink(tmp_path / "gone" / "locks", root / "locks")
    cache = kp.Cache(root, remote=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        fetch(root, 1, cub)
        try:
            cache.prune(0)
        except kp.CacheError as exc:
            assert str(root / "locks") in str(exc), str(exc)


# ==== another user's leftovers inside one's own cache (a `sudo` run with the same HOME) ============
def _own_cache_with_foreign_subdir(base: Path, cub: bytes, sub: str, name: str) -> Path:
    """A's cache (A-owned, 0700) with one entry, then ``sub`` created by root (0700) holding
    ``name``: what a single ``sudo`` run with A's HOME leaves behind."""
    sticky = base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    root = sticky / "cache-a"
    assert _ok(as_user(lambda: fetch(root, 1, cub), A_UID)) == "compiled"
    foreign = root / sub
    foreign.mkdir(parents=True, exist_ok=True)
    (foreign / name).write_bytes(b"x" * 64)
    foreign.chmod(0o700)  # root:root 0700
    return root


def test_clear_does_not_report_success_over_a_quarantine_it_cannot_read(base: Path,
                                                                         cub: bytes) -> None:
    """Cache.clear: "CacheError naming the directory when it cannot be emptied (read-only,
    another user's)"; `cache clear` "removes every ... quarantined file". With a root-owned
    quarantine it printed "removed 1 entries", exit 0, and left the quarantined file."""
    root = _own_cache_with_foreign_subdir(base, cub, "quarantine",
                                          f"{_digest(9)}.1795980273153441840.kpack")

    def a_clear() -> list:
        try:
            api: object = kp.Cache(root, remote=False).clear()
        except kp.CacheError as exc:
            api = f"CacheError: {exc}"
        return [api, cli("cache", "clear", "--dir", str(root))]

    api, res = _ok(as_user(a_clear, A_UID))
    assert isinstance(api, str) and "quarantine" in api, api
    assert res["rc"] != 0 and "quarantine" in res["err"], res


def test_clear_error_names_the_foreign_directory_and_leaks_no_iterator(base: Path,
                                                                     cub: bytes) -> None:
    """A root-owned shard directory in A's cache: Cache.clear's CacheError named only the root
    ("cannot clear the disk cache '<root>': Permission denied": which of its directories?
    the CLI names it), and a ``ResourceWarning: unclosed scandir iterator`` leaked."""
    root = _own_cache_with_foreign_subdir(base, cub, "entries/ab", f"{_digest(3, 'ab')}.kpack")

    def a_clear() -> str:
        try:
            kp.Cache(root, remote=False).clear()
        except kp.CacheError as exc:
            return str(exc)
        return "no error"

    got = as_user(a_clear, A_UID)
    assert str(root / "entries" / "ab") in got.get("res", ""), got
    leaks = [w for w in got["warnings"] if w.startswith("ResourceWarning")]
    assert leaks == [], leaks


# ==== a setgid group directory shared by two users ================================================
def test_shared_dir_warning_says_which_directory_denies_and_why(base: Path, cub: bytes) -> None:
    """B in A's group, the shared root 2775: kernelpack made ``entries/`` 0700 for A, so B's
    reads fail. The warning named the entry file (mode 0644, which looks readable) and said
    "Permission denied": it should name what actually denies (``<root>/entries``, owned by uid
    4001, mode 0700: kernelpack's caches are per-user) so the operator knows what to fix."""
    root = _shared_root(base)
    assert _ok(as_user(lambda: fetch(root, 1, cub), A_UID, umask=0o002)) == "compiled"
    got = as_user(lambda: fetch(root, 1, cub), B_UID, umask=0o002)
    assert got.get("res") == "compiled", got
    [warning] = _cache_warnings(got)
    assert str(root) in warning, warning
    assert any(hint in warning for hint in (str(A_UID), "owned by", "another user", "0700",
                                            "0o700", "drwx------")), warning


@pytest.mark.parametrize("umask", ["002", "022", "077"])
def test_shared_setgid_dir_two_users_never_crash_and_keep_their_work(base: Path, cub: bytes,
                                                                     umask: str) -> None:
    """Regression: whatever the umask, B compiles everything (A's 0700 directories are not
    readable to it: documented), its CLI errors name the path, nothing is lost for A, and
    nothing either user made is writable by others."""
    root = _shared_root(base)
    mask = int(umask, 8)
    assert _ok(as_user(lambda: [fetch(root, i, cub) for i in (1, 2)], A_UID, umask=mask)) \
        == ["compiled", "compiled"]

    def b_run() -> list:
        cache = kp.Cache(root, remote=False)
        origins = [cache.fetch_or_compile(_digest(i), lambda i=i: from_cubin(f"p{i}", cub),
                                          name=f"p{i}").origin for i in (1, 2, 3, 3)]
        return [origins, [cli("cache", a, "--dir", str(root)) for a in ("ls", "stats", "prune",
                                                                         "clear")]]

    got = as_user(b_run, B_UID, umask=mask)
    origins, clis = _ok(got)
    assert origins == ["compiled"] * 4, got
    assert len(_cache_warnings(got)) == 1, got["warnings"]
    for res in clis:  # B cannot read A's entries: a one-line error naming the path, or success
        assert res["rc"] in (0, 1) and "Traceback" not in res["err"], res
        assert res["rc"] == 0 or str(root) in res["err"], res
    assert _ok(as_user(lambda: [fetch(root, i, cub) for i in (1, 2)], A_UID, umask=mask)) \
        == ["disk", "disk"]
    for path in root.rglob("*"):
        assert path.stat().st_mode & 0o002 == 0, (path, oct(path.stat().st_mode))
        if path.is_dir():
            assert path.stat().st_mode & 0o777 == 0o700, (path, oct(path.stat().st_mode))


def test_admin_opened_group_tree_b_hits_quarantines_and_prunes(base: Path, cub: bytes) -> None:
    """Regression: the admin opened A's tree to the group (chmod -R g+rwX, umask 002): B hits
    A's entries, quarantines one that went bad (one warning naming it), and prunes; A goes on."""
    root = _dir(base / "shared", 0, GID, 0o2770)
    assert _ok(as_user(lambda: [fetch(root, i, cub) for i in (1, 2)], A_UID, umask=0o002)) \
        == ["compiled", "compiled"]
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o060 | (0o010 if path.is_dir() else 0))
    with open(root / "entries" / "00" / f"{_digest(2)}.kpack", "r+b") as f:
        f.write(b"junk")

    def b_run() -> list:
        return [fetch(root, 1, cub), fetch(root, 2, cub),
                cli("cache", "prune", "--max-bytes", "0", "--dir", str(root))["rc"]]

    got = as_user(b_run, B_UID, umask=0o002)
    assert got.get("res") == ["disk", "compiled", 0], got
    [warning] = _cache_warnings(got)
    assert "quarantine" in warning and _digest(2)[:16] in warning, warning
    assert _ok(as_user(lambda: fetch(root, 1, cub), A_UID, umask=0o002)) == "compiled"


@pytest.mark.parametrize("kind", ["file", "dangling symlink"])
def test_cache_dir_env_at_a_file_or_dangling_link_is_one_error_naming_it(
        base: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: KERNELPACK_CACHE_DIR at a file or a dangling symlink is a ValueError at
    construction naming the path (and the link's target)."""
    path = base / "not-a-dir"
    if kind == "file":
        path.write_text("")
    else:
        os.symlink(base / "nowhere" / "cache", path)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(path))
    with pytest.raises(ValueError) as info:
        kp.Cache(remote=False)
    assert str(path) in str(info.value)
    if kind != "file":
        assert str(base / "nowhere" / "cache") in str(info.value)
