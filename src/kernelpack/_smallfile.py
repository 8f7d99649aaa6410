"""Reading a small file that someone else may have planted: key records and key files.

Why not ``Path.read_bytes``: a FIFO under the expected name would block the reader for ever
(waiting for a writer), and a device or a huge file would be read whole into memory. The file
is opened non-blocking, refused unless it is a regular file, and read up to a limit. A Ctrl-C
as the open returns must not lose the descriptor either (:func:`deferred_interrupts`).
"""

from __future__ import annotations

import os
import stat

from ._interrupts import deferred_interrupts

__all__ = ["read_regular"]


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of ``path`` (so a caller sees that it is longer than
    ``limit``), or None when ``path`` is not a regular file. OSError as ``os.open`` raises
    it (a missing file, no permission)."""
    fd = -1
    try:  # the open inside: a Ctrl-C held back past it (deferred_interrupts) lands in here
        with deferred_interrupts():
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_CLOEXEC", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
