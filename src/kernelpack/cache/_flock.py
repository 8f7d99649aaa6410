"""The disk tier's ``flock`` locks across ``fork`` and interrupts.

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

A third: a ``KeyboardInterrupt`` can arrive in the clean-up that releases a lock (after the
entry is written, before the unlock), and no Python code can stop that. The descriptor then
stays open and locked with no one left to release it, and the next compile of that key in the
process (a notebook cell run again) waited for a lock it held itself (review 32c). So every
descriptor is recorded with the thread that opened it, *before* it is locked, and
:func:`drop_dead_holds` releases the records a thread cannot still be using: those of a thread
that has ended, and a thread's own hold of the very lock file it is asking for (a thread
cannot be waiting for itself; no compile locks its own key twice).

The records are a plain dict: one item's assignment or removal is atomic under the GIL, so no
lock guards them (a guard is one more thing an interrupt can leave held).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

__all__ = ["drop_dead_holds", "hold", "release", "remove_if_unheld"]

_held: dict[int, int] = {}  # descriptor -> ident of the thread that opened it


def hold(fd: int) -> None:
    """Record ``fd`` as this thread's (closed in a forked child, released by
    :func:`drop_dead_holds` once the thread cannot be using it). Call it right after the open,
    before the ``flock``: an interrupt between the two must not leave an unrecorded lock."""
    _held[fd] = threading.get_ident()


def release(fd: int, unlink: str | os.PathLike[str] | None = None) -> None:
    """Unlock ``fd``'s lock, even where a forked child still has a copy of it, and close it.

    With ``unlink``, first remove that lock file when ``fd`` holds its lock (or can take it
    without waiting) and the path still names ``fd``'s inode: the protocol of
    :func:`remove_if_unheld`, so the caller needs no flag saying whether its ``flock`` had
    returned when an exception arrived."""
    try:
        if unlink is not None:
            _unlink_if_ours(fd, unlink)
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            _held.pop(fd, None)
            os.close(fd)


def _unlink_if_ours(fd: int, path: str | os.PathLike[str]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # already ours: returns at once
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:
        pass  # held by another process, or already gone: theirs to remove


def drop_dead_holds(fd: int) -> int:
    """Release the recorded descriptors on ``fd``'s file that no running code can be using:
    the current thread's (other than ``fd``), and any of a thread that has ended. Call it
    before blocking on ``fd``'s lock. Returns how many were released."""
    try:
        st = os.fstat(fd)
    except OSError:
        return 0
    me = threading.get_ident()
    others = [(other, tid) for other, tid in list(_held.items()) if other != fd]
    if not others:
        return 0
    alive = {t.ident for t in threading.enumerate()}
    dropped = 0
    for other, tid in others:
        if tid != me and tid in alive:
            continue  # another thread's compile in progress: wait for it
        try:
            ost = os.fstat(other)
        except OSError:
            _held.pop(other, None)  # closed already (an interrupt after the close)
            continue
        if (ost.st_dev, ost.st_ino) != (st.st_dev, st.st_ino):
            continue
        with contextlib.suppress(OSError):
            release(other)
        dropped += 1
    return dropped


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
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
