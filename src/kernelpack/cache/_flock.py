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

A third: a ``KeyboardInterrupt`` can arrive in the clean-up of a lock before its release
begins (the release itself holds interrupts back: :mod:`kernelpack._interrupts`). The descriptor then
stays open and locked with no one left to release it, and the next compile of that key in the
process (a notebook cell run again) waited for a lock it held itself (review 32c). So every
lock is recorded *before* it is taken, with its owner: the generator of the ``DiskStore.lock``
context holding it. :func:`drop_finished` releases a recorded lock whose owner has finished (an
exception left it without a release) and nothing else: an owner still running is waited for,
whatever thread runs it (a thread ``threading`` does not list, a native one, included); one of
the asking thread itself is a key asked for inside its own compile, refused as an error instead
of a wait for ever (:func:`check_not_own`). A record is removed before its descriptor is
closed, so a recorded descriptor is never one its owner has closed (closing it here could close
a file the application opened under the reused number). The records are a plain dict: one
item's assignment or removal is atomic under the GIL, so no lock guards them (a guard is one
more thing an interrupt can leave held).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from typing import Any, Callable

from .._interrupts import deferred_interrupts
from ..errors import CacheError

__all__ = ["check_not_own", "drop_finished", "hold", "release", "remove_if_unheld"]


class _Hold:
    """One recorded lock: how to close its descriptor (through the file object owning it, or
    ``os.close``), the thread that took it, and a weak reference to the generator of the
    context holding it. (A plain class: a dataclass costs its import time on the warm path.)"""

    __slots__ = ("close", "thread", "owner")

    def __init__(self, close: Callable[[], Any], thread: int,
                 owner: Callable[[], Any] | None) -> None:
        self.close, self.thread, self.owner = close, thread, owner


_held: dict[int, _Hold] = {}  # descriptor -> its hold


def hold(fd: int, *, owner: Callable[[], Any] | None = None, file: Any = None) -> None:
    """Record that ``fd`` is (about to be) locked by the running thread. ``owner``: a weak
    reference to the generator of the context that will release it (without one the record
    is never dropped by :func:`drop_finished`); ``file``: the file object owning ``fd``
    (closed through it, never under it). Call it before the ``flock``: an interrupt between
    the two must not leave an unrecorded lock."""
    close = file.close if file is not None else (lambda: os.close(fd))
    _held[fd] = _Hold(close, threading.get_ident(), owner)


def release(fd: int, unlink: str | os.PathLike[str] | None = None, file: Any = None) -> None:
    """Unlock ``fd``'s lock, even where a forked child still has a copy of it, and close it
    (through ``file`` when a file object owns it). Ctrl-C waits until all of it is done
    (an interrupt between the unlink and the close left a descriptor of a deleted file open).

    With ``unlink``, first remove that lock file when ``fd`` holds its lock (or can take it
    without waiting) and the path still names ``fd``'s inode: the protocol of
    :func:`remove_if_unheld`, so the caller needs no flag saying whether its ``flock`` had
    returned when an exception arrived."""
    with deferred_interrupts():
        try:
            if unlink is not None:
                _unlink_if_ours(fd, unlink)
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                recorded = _held.pop(fd, None)
                if file is not None:
                    file.close()
                elif recorded is not None:
                    recorded.close()
                else:
                    os.close(fd)


def _unlink_if_ours(fd: int, path: str | os.PathLike[str]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # already ours: returns at once
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:
        pass  # held by another process, or already gone: theirs to remove


def _finished(held: _Hold) -> bool:
    if held.owner is None:
        return False
    owner = held.owner()
    return owner is None or getattr(owner, "gi_frame", None) is None


def drop_finished() -> int:
    """Release every recorded lock whose owner has finished without releasing it (an
    interrupt in its clean-up): cheap when there is none, so it runs on every disk read
    and lock (the key of a leaked lock may never be compiled again in this process).
    Returns how many were released."""
    if not _held:
        return 0
    dropped = 0
    for fd, held in list(_held.items()):
        if _finished(held) and _held.get(fd) is held:  # not released meanwhile by its owner
            with contextlib.suppress(OSError):
                release(fd)
            dropped += 1
    return dropped


def check_not_own(fd: int, what: str) -> None:
    """Raise CacheError when a running context of this very thread holds ``fd``'s file: a
    key asked for inside its own compile, which would wait for itself for ever."""
    me = threading.get_ident()
    others = [(other, held) for other, held in list(_held.items())
              if other != fd and held.thread == me and not _finished(held)]
    if not others:
        return
    try:
        st = os.fstat(fd)
    except OSError:
        return
    for other, _ in others:
        try:
            ost = os.fstat(other)
        except OSError:
            continue
        if (ost.st_dev, ost.st_ino) == (st.st_dev, st.st_ino):
            raise CacheError(f"{what} is being compiled by this very thread (asked for "
                             f"again inside its own compile): it would wait for itself")


def remove_if_unheld(path: str | os.PathLike[str]) -> bool:
    """Unlink the per-key lock file at ``path`` when no process holds it (one left by a
    compile that was killed: only a later request for that very key removed it, so a
    server's killed compiles left one file each for ever). By the holders' own protocol:
    lock it without waiting, check the path still names that inode, unlink, unlock; an
    acquirer that opened the file before the unlink re-checks the inode after its flock
    and retries (``DiskStore.lock``), so no two holders can result. True when removed."""
    with deferred_interrupts():  # short, and no Ctrl-C may lose the descriptor it opens
        return _remove_if_unheld(path)


def _remove_if_unheld(path: str | os.PathLike[str]) -> bool:
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
    holds = list(_held.values())
    _held.clear()
    for held in holds:  # the child's copies; the locks stay the parent's
        with contextlib.suppress(OSError):
            held.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
