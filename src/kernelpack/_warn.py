"""Warnings that point at the user's line, however deep inside kernelpack they are raised.

Why not a fixed ``stacklevel``: the same warning is reached through different call chains
(``cache.get``, ``cache.fetch_or_compile``, ``kp.compile(f, cache=...)``, the CLI), and a fixed
count named a kernelpack line for all but one of them, so that Python printed kernelpack's own
source line and a ``filterwarnings(module=...)`` rule for the caller's module never matched.
The first frame outside the package is the one a user can act on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

__all__ = ["warn_caller"]

# Frames of these files are passed over too: a warning raised in a ``@contextmanager``'s exit
# has contextlib's frame between kernelpack's and the caller's.
_INSIDE = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
           os.path.abspath(contextlib.__file__))


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside kernelpack
    (the outermost frame when every frame is inside, as in a thread kernelpack started)."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
