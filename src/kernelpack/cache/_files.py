"""File operations of the disk tier (:mod:`kernelpack.cache.disk`) on a directory that is
untrusted input: atomic writes, reads of key records that a planted FIFO or device cannot block,
and removals that a directory planted under a file's name cannot stop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

from .._interrupts import deferred_interrupts
from .._smallfile import read_regular
from ..errors import CacheError

__all__ = ["MAX_RECORD", "make_private_dirs", "read_record", "remove_file", "write_atomic"]

MAX_RECORD = 16 << 20  # a key record is usually a few hundred bytes of parts


def make_private_dirs(path: str | Path) -> None:
    """``mkdir -p path``, each directory it creates with mode 0700 (as the XDG base directory
    spec asks): whoever can write a cache directory can plant an unsigned entry, which is taken
    as this machine's own compile, and under a umask of 002 or 000 (CI runners, containers)
    ``mkdir`` made them group- or world-writable. Directories that exist are left as they
    are."""
    missing = []
    path = os.fspath(path)  # strings: a key's shard must not be interned (disk.py's paths)
    while not os.path.exists(path) and path != os.path.dirname(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:  # made meanwhile by another process (or not a directory)
            if not os.path.isdir(directory):
                raise


def remove_file(path: str | Path) -> None:
    """Remove an entry, key record or quarantined file; FileNotFoundError when it is gone.

    A directory under such a name (planted, or left by another tool) can never be one, and
    ``unlink`` refusing it stopped every eviction (the size cap no longer held, every put
    warned) and every ``clear``/``prune``: it is removed with its contents. ``rmtree`` does not
    follow symlinks, and a symlink itself is unlinked, never its target.
    """
    try:
        os.unlink(path)
    except OSError as exc:  # EISDIR on Linux, EPERM elsewhere
        if exc.errno not in (errno.EISDIR, errno.EPERM) or not stat.S_ISDIR(
                os.lstat(path).st_mode):
            raise
        shutil.rmtree(path)


def read_record(path: str | Path) -> bytes:
    """A key record's bytes, opened as entries are: a FIFO planted under a record's name must
    not block ``cache ls``, ``cache explain`` or every explained miss, nor a device or a huge
    file exhaust memory. ValueError for anything but a regular file of ``MAX_RECORD`` bytes
    at most (then there is no record to believe)."""
    data = read_regular(path, MAX_RECORD)
    if data is None or len(data) > MAX_RECORD:
        raise ValueError(f"key record {str(path)!r} is not a regular file of at most "
                         f"{MAX_RECORD} bytes")
    return data


def write_atomic(path: str | Path, data: bytes, sync: bool = True) -> None:
    """Temp file in the target's directory, (fsync), ``os.replace``: all or nothing.

    Without ``sync`` a crash may leave a truncated file under the final name on some
    filesystems; callers use it only for data that is verified on every read (and then
    quarantined) or that is advisory (key records). The temporary's name is joined as a
    string: a Path would have interned it for the process's life on Python 3.12
    (:mod:`.disk`'s paths say why).
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd, made = -1, False
    try:  # whatever is raised from here on (Ctrl-C included) leaves no descriptor or temp
        try:
            with deferred_interrupts():  # a Ctrl-C as the open returns lost the descriptor
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # first entry of its shard: create the folder (rarely)
            try:
                make_private_dirs(directory)
            except OSError as exc:
                raise CacheError(f"cache directory {directory!r} cannot be created: "
                                 f"{exc.strerror}") from exc
            with deferred_interrupts():
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        made = True
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
        # -1 first: a Ctrl-C between a close and the assignment closed it twice, and the
        # second close's EBADF replaced the KeyboardInterrupt (a "write failed" warning)
        closing, fd = fd, -1
        os.close(closing)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        if made or fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
