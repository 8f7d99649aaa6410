"""The disk tier: one file per entry, written atomically, shared safely by many processes.

Layout under the cache root::

    entries/ab/<key>.kpack     the artifact itself (bytes from kp.save); nothing else is needed
    keys/ab/<key>.json         the key's parts, for ``kernelpack cache explain`` (optional)
    locks/<key>.lock           per-key single-flight lock (flock), removed after use
    quarantine/<key>.<ns>.kpack entries that failed verification, moved aside
    meta/digests.json          the keys' codegen and libdevice digests, by the files' stat

Guarantees, and how:

- **All or nothing.** An entry is written to a temporary file in its final directory, fsynced,
  then ``os.replace``d onto its name: a reader sees the old state or the whole new entry, and a
  writer killed mid-write leaves only a ``.tmp`` file (ignored, removed by ``prune``).
  A single-file entry cannot be torn across files (Triton's group files, JAX's -cache/-atime).
- **Many processes.** Readers never lock; an entry disappearing under a reader (eviction,
  ``clear``) is a miss, never an exception.
- **Single-flight.** :meth:`DiskStore.lock` takes ``flock`` on a per-key lock file; the kernel
  releases it if the holder dies, and a forked child neither keeps nor waits for its parent's
  (:mod:`._flock`). The file is unlinked by the holder before releasing, and an
  acquirer re-checks that the path still names the inode it locked, so deleting lock files
  cannot let two holders in.
- **Bounded.** With ``max_bytes``, least-recently-used entries (by mtime, refreshed on a hit at
  most once a minute to spare network filesystems; within one process, by its own exact hit
  times) are removed down to 90% of the cap.
- **Hostile files.** An entry name that holds anything but a regular file (a FIFO, a device, a
  symlink to ``/dev/zero``, a directory) or one larger than the format allows is quarantined
  without being read: it can neither block a reader nor exhaust its memory. A key record is
  read the same way, and a directory under any file's name is removed by eviction and
  ``clear`` instead of stopping them (:mod:`kernelpack.cache._files`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import stat
import time
import weakref
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, cast

from .._frozen import frozen_dataclass
from .._interrupts import deferred_interrupts
from ..errors import CacheError
from ..limits import MAX_FILE_SIZE, shown_int
from ..filewrite import absolute
from ._files import make_private_dirs, read_record as _read_record, remove_file as _remove
from ._files import write_atomic as _write_atomic
from .digest_memo import DigestMemo
from ._flock import check_not_own, drop_finished, hold, release, remove_if_unheld
from .keys import CacheKey

__all__ = ["DiskStore", "EntryInfo", "check_digest", "TOUCH_INTERVAL_S", "LOW_WATER",
           "MAX_QUARANTINED"]

TOUCH_INTERVAL_S = 60.0
# An entry's mtime further ahead of this machine's clock than this is taken as unknown (oldest).
FUTURE_SLACK_S = 300.0
_MAX_USED = 1 << 16  # hit times a store remembers
MAX_QUARANTINED = 32
LOW_WATER = 0.9
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")  # used with fullmatch: "$" would pass a "\n"
_SUFFIX = ".kpack"


def check_digest(key: str | CacheKey) -> str:
    """The key's hex digest: TypeError for a key that is neither a CacheKey nor a str,
    ValueError for a str that is not a digest (a path, a prefix, upper case)."""
    digest = key.digest if isinstance(key, CacheKey) else key
    if not isinstance(digest, str):
        raise TypeError(f"cache key must be a CacheKey or a str of 64 lowercase hex digits "
                        f"(got {type(digest).__name__}: {digest!r:.60})")
    if not _DIGEST_RE.fullmatch(digest):
        raise ValueError(f"cache key must be 64 lowercase hex digits (got {digest!r})")
    return digest


@frozen_dataclass
class EntryInfo:
    """One entry on disk."""

    digest: str
    size: int
    mtime: float
    path: Path

    def __init__(self, digest: str, size: int, mtime: float, path: Path) -> None:
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "mtime", mtime)
        object.__setattr__(self, "path", path)


class DiskStore:
    """The disk tier: ``get(key) -> bytes | None`` and ``put(key, data)`` over one directory."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if not isinstance(root, (str, os.PathLike)) or isinstance(root, bytes):
            raise TypeError(f"path must be a directory path (str or os.PathLike), or None for "
                            f"the default (got {type(root).__name__}: {root!r:.60})")
        root = os.fsdecode(os.fspath(root))  # an os.PathLike of bytes too
        if not root:  # Path("") is ".": entries/ locks/ keys/ in the working dir
            raise ValueError("path must name a directory (got ''), or be None for the default")
        if max_bytes is not None and (not isinstance(max_bytes, int) or
                                      isinstance(max_bytes, bool)):
            raise TypeError(f"max_bytes must be an int (bytes) or None (got "
                            f"{type(max_bytes).__name__}: {max_bytes!r})")
        if max_bytes is not None and max_bytes <= 0:
            # A cap of 0 would evict every entry right after writing it (a cache that never
            # hits, silently); $KERNELPACK_CACHE_MAX_BYTES=0 means "no cap", which is None here.
            raise ValueError(f"max_bytes must be a positive byte count, or None for the default "
                             f"cap (got {shown_int(max_bytes)})")
        # ``~`` expanded (as for $KERNELPACK_CACHE_DIR) and made absolute once: a relative root
        # must not move with a later os.chdir, nor a "~" folder appear in the working directory
        self.root = Path(absolute(os.path.expanduser(root)))
        try:
            st: os.stat_result | None = os.stat(self.root)
        except OSError as exc:  # a symbolic link loop "did not exist": 0 entries, exit 0
            if exc.errno == errno.ELOOP:
                raise ValueError(f"path {str(self.root)!r}: {exc.strerror} (the cache root "
                                 f"must be a directory)") from None
            if os.path.islink(self.root):  # a moved or unmounted target: nothing was stored
                raise ValueError(f"path {str(self.root)!r} is a symbolic link to "
                                 f"{os.readlink(self.root)!r}, which does not exist (the cache "
                                 f"root must be a directory)") from None
            st = None  # not there yet: made on the first write
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"path {str(self.root)!r} is not a directory (the cache root must "
                             f"be one)")
        self.max_bytes = max_bytes
        self.evicted = 0  # entries this store removed for the cap (Cache.stats()["evictions"])
        self._written_since_evict: int | None = None  # None: never evicted in this process
        # digest -> time of this process's last hit: exact LRU order for what this process
        # used, where the on-disk mtime is refreshed at most once a TOUCH_INTERVAL_S
        self._used: dict[str, float] = {}

    # ---- paths ---------------------------------------------------------------------------------
    # A key's own file names are joined as strings (_file): on Python 3.12, pathlib interns
    # every component of a path it parses (sys.intern, gh-119518) and interned strings are
    # immortal there (gh-113993), so each key's digest, and each writer's temporary name, that
    # went through a Path stayed in memory for the process's life: ~6 blocks per cache miss in
    # a long-running server (tests/test_review30_longrun.py, under 3.12). The top directories
    # stay Paths; a key's shard and files are strings.
    def path(self, key: str | CacheKey) -> Path:
        """The entry's file, as a Path (for tools and tests; the store's own operations
        use :meth:`_file`)."""
        return Path(self._file("entries", check_digest(key), _SUFFIX))

    def _shard(self, top: str, digest: str) -> str:
        return os.path.join(os.fspath(self.root), top, digest[:2])

    def _file(self, top: str, digest: str, suffix: str) -> str:
        return os.path.join(os.fspath(self.root), top, digest[:2], digest + suffix)

    def _parts_path(self, digest: str) -> Path:
        """The key record's file, as a Path (for tests; the store uses :meth:`_file`)."""
        return Path(self._file("keys", digest, ".json"))

    def digest_memo(self) -> DigestMemo:
        """``meta/digests.json``: the cache keys' once-per-process digests, remembered across
        processes (:mod:`kernelpack.cache.digest_memo`); used only where entries may be."""
        meta = self.root / "meta"
        return DigestMemo(meta / "digests.json", lambda: self.untrusted(meta, "meta"))

    # ---- the storage interface -----------------------------------------------------------------
    # ---- the cache's own directories -----------------------------------------------------------
    # A directory of the cache (entries/, a shard, keys/, locks/, quarantine/, runtime-ptx/)
    # that is a symbolic link is never followed: one planted by a neighbour with write access
    # to the root made writes land, and clear/prune delete, in the link's target (review 36).
    # The root itself may be a link (a user's choice of where the cache lives).
    def _first_not_dir(self, directory: str | Path) -> tuple[str, int | None] | None:
        """The first component of ``directory`` below the root that is not a directory of
        its own, with its ``lstat`` mode (None when it is missing); None when every component
        is one. OSError when one cannot be looked at; ValueError for a directory not below
        the root. (Strings: a key's shard must not be interned, see the paths' note.)"""
        path = os.fspath(self.root)
        given = os.fspath(directory)
        if given != path and not given.startswith(path.rstrip(os.sep) + os.sep):
            Path(given).relative_to(self.root)  # Path's own error (or a spelling it accepts)
            given = str(Path(given))
        # component by component as given: a ".." after a planted link must reach the link
        # (normalizing it away, as relpath does, skipped the link; review 69)
        for part in given[len(path):].split(os.sep):
            if part in ("", os.curdir):
                continue
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return path, None
            if not stat.S_ISDIR(mode):
                return path, mode
        return None

    def _inside(self, *parts: str) -> Path | None:
        """``root/parts`` when every component below the root is a directory of its own (not
        a link); None when one is missing or is not."""
        path = self.root.joinpath(*parts)
        try:
            return None if self._first_not_dir(path) else path
        except OSError:  # (one that cannot be looked at is not one of its own either)
            return None

    def exposed(self, key: str | CacheKey) -> str | None:
        """Why ``key``'s entry could have been put there by anyone (then it must not be
        read), or None: its shard or ``entries/`` writable by every user, or a root writable by
        every user (``/tmp``) whose ``entries/`` is not this user's. Entries are executable
        code: one planted in a root another user made in a sticky ``/tmp`` was served as a
        hit without a word (review 36). A directory shared with a group is not exposed."""
        return self._exposed(self._shard("entries", check_digest(key)), "entries")

    def untrusted(self, directory: Path, top: str) -> str | None:
        """Why files in ``directory`` (``root/top`` or below it) must be neither read nor
        written as this user's own: a component below the root that is not a directory of its
        own (a link: never followed), or one writable by every user (see :meth:`exposed`);
        None when they can (components not made yet included). For the cache's other
        directories, e.g. the runtime's cubins assembled from PTX (``runtime-ptx/``)."""
        try:
            found = self._not_own(directory)
        except OSError as exc:
            return f"{exc.filename or directory} cannot be looked at ({exc.strerror})"
        if found is not None:
            return f"{found[0]} is {found[1]}"
        return self._exposed(directory, top)

    def _exposed(self, directory: str | Path, top: str) -> str | None:
        me = os.getuid()
        entries = self.root / top
        for path in (directory, entries):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):  # (a link's own mode is always 0777: not "writable")
                return f"{path} is a symbolic link (the cache's own directories are never " \
                       f"followed)"
            if st.st_mode & stat.S_IWOTH:
                return f"{path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) " \
                       f"is writable by every user"
        try:
            st = os.stat(self.root)
            owner = os.lstat(entries).st_uid
        except OSError:
            return None
        if st.st_mode & stat.S_IWOTH and owner != me:
            return (f"{self.root} is writable by every user (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}) and its {top}/ belongs to uid {owner}")
        return None

    def _not_own(self, directory: str | Path) -> tuple[str, str] | None:
        """The first component of ``directory`` below the root that exists and is not a
        directory of its own, and what it is (``"a symbolic link"``, ``"not a directory"``);
        None when there is none (missing ones are made by a write). OSError as
        :meth:`_first_not_dir`."""
        found = self._first_not_dir(directory)
        if found is None or found[1] is None:
            return None
        path, mode = found
        return path, "a symbolic link" if stat.S_ISLNK(cast(int, mode)) else "not a directory"

    def _check_no_links(self, directory: str | Path) -> None:
        """OSError (ELOOP, naming it) when a component of ``directory`` below the root exists
        and is not a directory of its own; missing ones are made by the write."""
        found = self._not_own(directory)
        if found is not None:
            path, what = found
            raise OSError(errno.ELOOP, f"{path} is {what}: the cache's own directories are "
                                       f"never followed (remove it)", str(path))

    def _files(self, top: str, sharded: bool, match: Callable[[str], bool],
               strict: bool = False) -> list[Path]:
        """:meth:`_file_names` as Paths (for listings: tools and ``kernelpack cache``)."""
        return [Path(name) for name in self._file_names(top, sharded, match, strict)]

    def _file_names(self, top: str, sharded: bool, match: Callable[[str], bool],
                    strict: bool = False) -> list[str]:
        """What lies under ``root/top`` (``top/??/`` when ``sharded``) with a name that
        ``match``-es: files, and whatever else was planted under such a name (for removal:
        a link is removed, never followed); the walk enters no linked directory. A directory
        that cannot be listed is skipped, or raised (OSError naming it) when ``strict``:
        ``clear`` must not report success over what it could not see. Strings, not Paths:
        what a long-running process removes must not be interned (see the paths' note)."""
        base = self._inside(top)
        if base is None:
            return []
        out: list[str] = []
        dirs: list[str | Path] = [base]
        if sharded:
            dirs = []
            for shard in _listed(base, strict):
                if shard.is_dir(follow_symlinks=False):
                    dirs.append(shard.path)
        for directory in dirs:
            for item in _listed(directory, strict):
                if match(item.name):
                    out.append(item.path)
        return out

    def get(self, key: str | CacheKey) -> bytes | None:
        """The entry's bytes, or None when absent. Refreshes its LRU time (coarsely)."""
        found = self.read(key)
        return None if found is None else found[0]

    def read(self, key: str | CacheKey,
             touch: bool = True) -> tuple[bytes, tuple[int, int]] | None:
        """``(bytes, identity)`` of the entry, or None; ``identity`` (inode, mtime) lets
        :meth:`quarantine` move aside exactly the file that was read and not a good entry
        another process wrote since. Anything but a regular file reads as ``b""`` (it never
        verifies). ``touch=False`` leaves the LRU time alone (``kernelpack cache ls``)."""
        digest = check_digest(key)
        path = self._file("entries", digest, _SUFFIX)
        drop_finished()  # a lock an interrupt left (its key may only ever hit from now on)
        fd = -1
        try:  # the open inside: a Ctrl-C held back past it (deferred_interrupts) lands in here
            try:  # O_NONBLOCK: opening a FIFO planted under the name must not wait for a writer
                with deferred_interrupts():  # a Ctrl-C as the open returns lost the descriptor
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                return None
            st = os.fstat(fd)
            identity = (st.st_ino, st.st_mtime_ns)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_SIZE:
                return b"", identity  # can never verify (or never end): quarantined unread
            with open(fd, "rb", closefd=False) as f:
                data = f.read()  # a regular file of at most MAX_FILE_SIZE bytes
            now = time.time()
            if touch and not 0 <= now - st.st_mtime <= TOUCH_INTERVAL_S:  # old, or future-dated
                # Through the descriptor, and the identity taken again after it: the
                # identity is the file as it is now, so a quarantine after a failed
                # verification moves it instead of taking our own touch for another
                # process's fresh entry.
                with contextlib.suppress(OSError):  # read-only cache dirs still serve hits
                    os.utime(fd, (now, now))
                    st = os.fstat(fd)
                    identity = (st.st_ino, st.st_mtime_ns)
        finally:
            if fd >= 0:
                os.close(fd)
        if not touch:
            return data, identity
        if len(self._used) >= _MAX_USED:
            self._used.clear()  # a bound, not a policy: the mtimes still order the entries
        self._used[digest] = now
        return data, identity

    def put(self, key: str | CacheKey, data: bytes, *, sync: bool = True) -> None:
        """Write the entry atomically (temp file, fsync, rename), then evict if over the cap.

        ``sync=False`` skips the fsync, for entries that are cheap to fetch again (copies of
        remote entries): a crash can then at worst leave an entry that fails verification,
        which is quarantined and refetched.
        Raises OSError when the disk refuses (full, read-only), or when the entry alone is
        larger than the cap (it would be the first evicted, right after the write: it is not
        written, and the cache's warning says why); the cache turns that into a warning.
        """
        if self.max_bytes is not None and len(data) > self.max_bytes:
            # E2BIG, not EFBIG (a file size limit): this entry alone is not kept, and the
            # tier keeps writing the others (EFBIG paused it for 30 s)
            raise OSError(errno.E2BIG, f"the entry's {len(data)} bytes exceed the cache's cap of "
                                       f"{self.max_bytes} bytes (max_bytes / "
                                       f"KERNELPACK_CACHE_MAX_BYTES), so it is not kept")
        digest = check_digest(key)
        self._check_no_links(self._shard("entries", digest))
        _write_atomic(self._file("entries", digest, _SUFFIX), bytes(data), sync=sync)
        self._used.pop(digest, None)  # its mtime is now
        if self.max_bytes is not None:
            pending = (self._written_since_evict or 0) + len(data)
            # Scanning the directory on every put would be O(entries); evict on the first put
            # of a process and then after every 1/16 of the cap written.
            if self._written_since_evict is None or pending > self.max_bytes // 16:
                # what killed writers left counts against no cap: removed here too, or each
                # killed put kept up to an entry's size beyond it for ever (review 30)
                with contextlib.suppress(OSError):
                    self.prune_temps()
                self.evict(self.max_bytes, keep=check_digest(key))
                self._written_since_evict = 0
            else:
                self._written_since_evict = pending

    # ---- key records (for explain) -------------------------------------------------------------
    def record_parts(self, key: CacheKey, program: str | None = None) -> None:
        """Record ``key``'s parts, and the name of the ``program`` its entry holds: a key's
        source is a digest, so an explained miss finds the same program's earlier key by it
        (every key of an edited fusion differs from the new one in ``source`` alone)."""
        path = self._file("keys", key.digest, ".json")
        self._check_no_links(self._shard("keys", key.digest))
        if not os.path.exists(path):
            record: dict = {"digest": key.digest, "parts": key.parts}
            if program is not None:
                record["program"] = program
            _write_atomic(path, json.dumps(record, indent=1).encode(), sync=False)

    def read_parts(self, digest: str) -> CacheKey | None:
        """The recorded key, or None when there is no record, it does not reproduce
        ``digest`` (a tampered or foreign record is not trusted), or it has no ``kind`` (every
        key :func:`~.keys.make_key` makes has one, and ``ls`` and explained misses read it)."""
        return self._read_record(digest)[0]

    def _read_record(self, digest: str) -> tuple[CacheKey | None, str | None]:
        """``read_parts``, and the recorded program name (None when not recorded)."""
        try:
            record = json.loads(_read_record(self._file("keys", check_digest(digest), ".json")))
            key = CacheKey.from_parts(record["parts"])
            key.part("kind")
            program = record.get("program")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None, None
        if key.digest != digest:
            return None, None
        return key, program if isinstance(program, str) else None

    def recorded_keys(self) -> Iterator[CacheKey]:
        for key, _ in self.recorded():
            yield key

    def recorded(self) -> Iterator[tuple[CacheKey, str | None]]:
        """Every trusted record: its key and the program name it recorded (or None)."""
        for path in sorted(self._files("keys", True, lambda n: n.endswith(".json"))):
            key, program = self._read_record(path.stem)
            if key is not None:
                yield key, program

    # ---- single-flight -------------------------------------------------------------------------
    def lock(self, key: str | CacheKey, wait_s: float | None = None) -> ContextManager[None]:
        """Hold the per-key lock: one process (and one thread) at a time compiles ``key``.
        Raises CacheError when this thread is already inside that key's lock (a compile of
        the key inside its own compile: the wait would be for ever), and when another holder
        keeps it longer than ``wait_s`` seconds (None: wait as long as it takes). A holder
        that never finishes (a hung compiler, a stopped process) kept every other process
        of the machine asking for that key waiting for ever (review 35)."""
        digest = check_digest(key)
        owner: list[Any] = []
        context = self._locked(digest, owner, wait_s)
        # recorded with the lock: its end tells a leaked hold (_flock); weak, or the
        # generator's own frame (which holds the list) would make a cycle of it
        owner.append(weakref.ref(context.gen))
        return context

    @contextlib.contextmanager
    def _locked(self, digest: str, owner: list[Any], wait_s: float | None) -> Iterator[None]:
        lock_dir = self.root / "locks"
        path = os.path.join(os.fspath(lock_dir), digest + ".lock")
        made_dir = False
        f = None
        self._check_no_links(lock_dir)
        try:  # from the open on, any exception (Ctrl-C included) closes the descriptor: one
            # left open kept the key locked for as long as the process lived (review 30)
            while True:
                try:  # a file object: an interrupt as the open returns leaves it to be closed
                    # by its deallocation (an int would be lost); a planted link is not
                    # followed (O_NOFOLLOW: ELOOP, a warning, a compile without the lock).
                    # The opener is Python code: an interrupt as it returns would lose its
                    # descriptor, so interrupts wait until FileIO owns it
                    with deferred_interrupts():
                        f = io.FileIO(path, "a+", opener=_no_follow)
                except FileNotFoundError:
                    if made_dir:  # still missing (a dangling symlink as the lock): no loop
                        raise
                    make_private_dirs(lock_dir)
                    made_dir = True
                    continue
                fd = f.fileno()
                hold(fd, owner=owner[0], file=f)  # recorded before it is locked (_flock)
                drop_finished()  # an interrupted compile's lock: not waited for, not kept
                check_not_own(fd, f"key {digest[:16]}")
                _flock_within(fd, wait_s, digest)
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                closing, f = f, None
                release(fd, file=closing)  # the holder before us unlinked it: lock the new file
            yield
        finally:
            if f is not None:  # unlinked only where still ours (the protocol: remove_if_unheld)
                release(f.fileno(), unlink=path, file=f)  # LOCK_UN: a forked child must not
                # keep it (_flock.py)

    # ---- maintenance ---------------------------------------------------------------------------
    def quarantine(self, key: str | CacheKey, seen: tuple[int, int] | None = None) -> Path | None:
        """Move a bad entry aside (kept for inspection); None when it is already gone, or
        when it is no longer the file identified by ``seen`` (from :meth:`read`). Raises
        OSError when it cannot be moved (``quarantine`` is not a directory, a read-only
        cache): the caller warns, and the next good write replaces the entry."""
        digest = check_digest(key)
        qdir = self.root / "quarantine"
        target = qdir / f"{digest}.{time.time_ns()}{_SUFFIX}"
        try:
            entry = self._file("entries", digest, _SUFFIX)
            if seen is not None:
                st = os.stat(entry)
                if (st.st_ino, st.st_mtime_ns) != seen:
                    return None  # replaced by a fresh entry since we read it: leave it
            self._check_no_links(qdir)
            make_private_dirs(qdir)
            os.replace(entry, target)
        except FileNotFoundError:
            return None
        for old in self.quarantined()[:-MAX_QUARANTINED]:  # keep evidence, but bounded
            with contextlib.suppress(OSError):
                _remove(old)
        return target

    def entries(self) -> list[EntryInfo]:
        """Every complete entry (temporary files excluded), oldest first."""
        return [EntryInfo(digest, size, mtime, Path(file))
                for digest, size, mtime, file in self._entries()]

    def _entries(self) -> list[tuple[str, int, float, str | Path]]:
        """:meth:`entries` as ``(digest, size, mtime, file)``, the file a string: eviction
        goes through them all, and a Path of each would intern its name (the paths' note)."""
        out: list[tuple[str, int, float, str | Path]] = []
        base = self._inside("entries")
        if base is None:
            return out
        now = time.time()
        for shard in _listed(base, True):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for item in _listed(shard.path, True):
                name = item.name
                stem = name[:-len(_SUFFIX)]
                if not name.endswith(_SUFFIX) or not _DIGEST_RE.fullmatch(stem):
                    continue
                try:
                    st = item.stat()
                except FileNotFoundError:
                    continue
                used = self._used.get(stem, 0.0)
                mtime = st.st_mtime
                if mtime > now + FUTURE_SLACK_S:
                    # dated in the future (clock skew on a shared filesystem, a cache copied
                    # from another machine): when it was used is unknown, so it goes first;
                    # as "newest" it pinned the cache and the working set was evicted instead
                    mtime = 0.0
                out.append((stem, st.st_size, used if used > mtime else mtime, item.path))
        out.sort(key=lambda e: (e[2], e[0]))
        return out

    def _evictable(self) -> list[tuple[str, int, float, str | Path]]:
        """Entries and runtime cubins together as ``(digest, size, mtime, file)``, least
        recently used first."""
        both = self._entries()
        both += [(e.digest, e.size, e.mtime, e.path) for e in self.runtime_cubins()]
        both.sort(key=lambda e: (e[2], e[0]))
        return both

    def evict(self, max_bytes: int, *, keep: str | None = None) -> tuple[int, int]:
        """Remove least-recently-used entries until the total is at most ``max_bytes`` (to
        ``LOW_WATER`` of it when over). Returns ``(entries removed, bytes freed)``; does
        nothing when another process is already evicting, or when there is no cache there
        (``kernelpack cache prune`` on a missing directory must not create one).

        The most recently used entry that fits the cap by itself, and ``keep`` (the entry a
        put just wrote), are never removed: with entries near the cap's size the low-water
        goal lies below one entry, and going down to it would evict what was just written, a
        cache that never hits."""
        if self._inside("entries") is None and self._inside("runtime-ptx") is None:
            return 0, 0
        if sum(e[1] for e in self._evictable()) <= max_bytes:
            return 0, 0  # nothing to evict: no lock file either (a read-only cache stays usable)
        lock_dir = self.root / "locks"
        self._check_no_links(lock_dir)
        make_private_dirs(lock_dir)
        fd = -1
        try:  # the open inside: a Ctrl-C held back past it (deferred_interrupts) lands in here
            with deferred_interrupts():
                fd = os.open(lock_dir / "evict", os.O_CREAT | os.O_RDWR, 0o644)
                hold(fd)  # (no owner: only this finally releases it)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return 0, 0
                raise
            entries = self._evictable()
            total = sum(e[1] for e in entries)
            if total <= max_bytes:
                return 0, 0
            goal = int(max_bytes * LOW_WATER)
            removed = freed = 0
            newest = entries[-1] if entries and entries[-1][1] <= max_bytes else None
            for entry in entries:
                digest, size, _, file = entry
                if total <= goal:
                    break
                if digest == keep or entry is newest:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    _remove(file)  # a directory under an entry's name too
                    removed += 1
                    freed += size
                total -= size
                self._used.pop(digest, None)
                with contextlib.suppress(OSError):
                    os.unlink(self._file("keys", digest, ".json"))
            self.evicted += removed
            return removed, freed
        finally:
            if fd >= 0:
                release(fd)  # (not locked: LOCK_UN of a lock not held does nothing)

    def temporaries(self) -> list[Path]:
        """Writers' temporary files (``write_atomic``'s ``.<name>.<pid>.<hex>.tmp``), in
        every directory the cache writes files to: a killed writer's are left behind."""
        return [Path(name) for name in self._temporary_names()]

    def _temporary_names(self) -> list[str]:
        """:meth:`temporaries` as strings (what :meth:`prune_temps` removes: the paths'
        note)."""
        def temporary(name: str) -> bool:
            return name.startswith(".") and name.endswith(".tmp")

        return [name for top, sharded in (("entries", True), ("keys", True),
                                          ("runtime-ptx", True), ("meta", False))
                for name in self._file_names(top, sharded, temporary)]

    def prune_temps(self, older_than_s: float = 3600.0) -> int:
        """Remove what killed processes left: temporary files of writers (older than
        ``older_than_s``) and per-key lock files that no process holds. Returns how many."""
        removed = 0
        cutoff = time.time() - older_than_s
        for name in self._temporary_names():
            with contextlib.suppress(OSError):
                if os.lstat(name).st_mtime < cutoff:
                    os.unlink(name)
                    removed += 1
        for name in self._file_names("locks", False, lambda n: n.endswith(".lock")):
            removed += remove_if_unheld(name)
        return removed

    def runtime_cubins(self) -> list[EntryInfo]:
        """Cubins the runtime assembled from PTX (``runtime-ptx/``, runtime/_ptx_load.py), as
        entries: eviction, ``clear`` and ``stats`` count them, or a server loading ever new
        PTX-only artifacts grew that directory past any cap. Oldest first."""
        out = []
        for path in self._files("runtime-ptx", True, lambda n: n.endswith(".cubin")):
            with contextlib.suppress(OSError):
                st = path.lstat()
                if stat.S_ISREG(st.st_mode):
                    out.append(EntryInfo(path.parent.name + path.stem, st.st_size, st.st_mtime,
                                         path))
        out.sort(key=lambda e: (e.mtime, e.digest))
        return out

    def quarantined(self) -> list[Path]:
        """Quarantined files, oldest first."""
        paths = self._files("quarantine", False, lambda n: n.endswith(_SUFFIX))
        return sorted(paths, key=_quarantine_order)

    def clear(self) -> int:
        """Remove every entry, runtime cubin, key record, quarantined file and unheld lock
        file, and the keys' digest memo; returns the entries removed."""
        count = 0
        for name in self._file_names("meta", False, lambda n: n == "digests.json",
                                     strict=True):
            with contextlib.suppress(FileNotFoundError):
                _remove(name)
        for _, _, _, file in self._entries():  # what entries() lists, oldest first (a
            with contextlib.suppress(FileNotFoundError):  # dangling link is none: review 69)
                _remove(file)
                count += 1
        for e in self.runtime_cubins():
            with contextlib.suppress(FileNotFoundError):
                _remove(e.path)
        for name in self._file_names("locks", False, lambda n: n.endswith(".lock"),
                                     strict=True):
            remove_if_unheld(name)
        for top, sharded, suffix in (("keys", True, ".json"), ("quarantine", False, _SUFFIX)):
            for name in self._file_names(top, sharded, lambda n: n.endswith(suffix),
                                         strict=True):
                with contextlib.suppress(FileNotFoundError):
                    _remove(name)
        return count


def _quarantine_order(path: Path) -> tuple[int, str]:
    """``<digest>.<ns>.kpack`` sorts by its time; a file someone else put there (any other
    name) sorts first instead of stopping every quarantine and ``cache stats`` with a
    ValueError."""
    parts = path.name.split(".")
    stamp = parts[1] if len(parts) == 3 else ""
    return (int(stamp) if stamp.isdigit() else 0, path.name)


def _flock_within(fd: int, wait_s: float | None, digest: str) -> None:
    """``flock(fd, LOCK_EX)``, or CacheError once ``wait_s`` seconds have passed with the
    lock held by another. The wait polls (an uncontended lock is one call, as before; a
    freed one is taken within 50 ms): a blocking flock cannot be given a deadline."""
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + wait_s
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise CacheError(f"another process on this machine has held the compile lock of "
                             f"key {digest[:16]} for more than {wait_s:g} s")
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def _no_follow(path: str, flags: int) -> int:
    """``io.FileIO``'s opener: the path's last component is never a followed link."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)


def _listed(directory: str | Path, strict: bool) -> list[os.DirEntry[str]]:
    """The entries of ``directory`` (the scandir iterator closed whatever happens: an error
    mid-walk left it to the collector, with a ResourceWarning); [] when it cannot be listed,
    unless ``strict`` (then the OSError, naming it)."""
    try:
        with os.scandir(directory) as items:
            return list(items)
    except FileNotFoundError:
        return []
    except OSError:
        if strict:
            raise
        return []
