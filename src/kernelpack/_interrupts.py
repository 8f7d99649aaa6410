"""Hold back Ctrl-C (and the CLI's SIGTERM) while a descriptor passes from a call into its owner.

A Python signal handler runs between two bytecodes of the main thread, and one of those points
lies between a call's return and the store of its result: a ``KeyboardInterrupt`` raised there,
as ``os.open``, ``os.dup`` or ``tempfile.mkstemp`` returns, loses the descriptor it returned,
and no ``try``/``finally`` can close a descriptor it never received. A notebook interrupted
often, or a service stopped with SIGINT while it compiles, leaked one such descriptor (and the
disk space of a deleted temporary it still held) each time (review 33: 10-30 in 1200 random
interrupts of cached compiles).

:class:`deferred_interrupts` replaces the Python handlers of SIGINT and SIGTERM, for the few
lines that acquire and record a descriptor, by one that only notes the signal, and calls the
original handler after restoring it: the interrupt arrives once the descriptor is owned by
something that closes it. Only the main thread runs Python signal handlers (and only it can
install them), so other threads pass through untouched; a signal with no Python handler
(ignored, or the default action) is left alone.
"""

from __future__ import annotations

import _signal  # signal's C functions: its Python wrappers (enums) tripled the cost, and
import threading  # importing them costs a first load the enums' construction
from types import FrameType, TracebackType
from typing import Any, Callable

__all__ = ["deferred_interrupts"]

_SIGNALS = tuple(getattr(_signal, name) for name in ("SIGINT", "SIGTERM")
                 if hasattr(_signal, name))
_MAIN = threading.main_thread().ident


class deferred_interrupts:  # noqa: N801 (used as a context manager, like contextlib's)
    """``with deferred_interrupts(): fd = os.open(...)``: a SIGINT or SIGTERM arriving in the
    block is delivered to its handler when the block ends."""

    __slots__ = ("_previous", "_caught")

    def __enter__(self) -> None:
        self._previous: list[tuple[int, Callable[..., Any]]] = []
        self._caught: list[tuple[int, FrameType | None]] = []
        if threading.get_ident() != _MAIN:
            return
        for signum in _SIGNALS:
            handler = _signal.getsignal(signum)
            if callable(handler):
                _signal.signal(signum, self._note)
                self._previous.append((signum, handler))

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._caught.append((signum, frame))

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        handlers = dict(self._previous)
        for signum, handler in self._previous:
            _signal.signal(signum, handler)
        self._previous = []
        for signum, frame in self._caught:  # in order; one that raises ends the rest, as it
            handlers[signum](signum, frame)  # would have without the deferral
