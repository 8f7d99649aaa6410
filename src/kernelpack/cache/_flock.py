"""The disk tier's ``flock`` locks across ``fork``.

A lock taken with ``flock`` belongs to the open file description, which a forked child shares
through its copy of the descriptor. Two consequences, both seen in a server that forks workers
while a thread compiles (review 29):

- releasing by ``close`` alone leaves the lock held as long as any child keeps its copy, so
  every other process waiting for that key waited for the child to exit;
- a child asking for the key its parent was compiling opened the lock file again and waited
  for a lock that its own inherited copy held: for ever.

So a lock is released with an explicit ``LOCK_UN`` (which releases it whoever else holds a
copy), and a child closes the copies of the locks it inherited (without unlocking them: the
lock is still its parent's) right after the fork.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

__all__ = ["hold", "release", "remove_if_unheld"]

_held: set[int] = set()  # descriptors this process holds a flock through
_guard = threading.Lock()


def hold(fd: int) -> None:
    """Record that ``fd`` now holds a lock (closed in a forked child)."""
    with _guard:
        _held.add(fd)


def release(fd: int) -> None:
    """Unlock ``fd``'s lock, even where a forked child still has a copy of it, and close it."""
    with _guard:
        _held.discard(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def remove_if_unheld(path: str | os.PathLike[str]) -> bool:
    """Unlink the per-key lock file at ``path`` when no process holds it (one left by a
    compile that was killed: only a later request for that very key removed it, so a
    server's killed compiles left one file each for ever). By the holders' own protocol:
    lock it without waiting, check the path still names that inode, unlink, unlock; an
    acquirer that opened the file before the unlink re-checks the inode after its flock
    and retries (``DiskStore.lock``), so no two holders can result. True when removed."""
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: a compile in progress
        os.close(fd)
        return False
    try:
        if os.stat(path).st_ino != os.fstat(fd).st_ino:
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        release(fd)


def _after_fork_in_child() -> None:
    global _guard
    _guard = threading.Lock()  # another thread of the parent may have held it at the fork
    for fd in _held:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
