"""Hold back Python signal handlers while a descriptor passes from a call into its owner.

A Python signal handler runs between two bytecodes of the main thread, and one of those points
lies between a call's return and the store of its result: a ``KeyboardInterrupt`` (or a
``signal.alarm`` timeout's exception) raised there, as ``os.open``, ``os.dup`` or
``tempfile.mkstemp`` returns, loses the descriptor it returned, and no ``try``/``finally`` can
close a descriptor it never received. A notebook interrupted often, or a service stopped with
SIGINT while it compiles, leaked one such descriptor (and the disk space of a deleted
temporary it still held) each time (review 33: 10-30 in 1200 random interrupts of cached
compiles).

:class:`deferred_interrupts` replaces, for the few lines that acquire and record a descriptor,
every Python signal handler (SIGINT's ``default_int_handler``, an application's SIGALRM or
SIGTERM handler) by one that only notes the signal, then puts the application's handlers back
and calls them with what arrived: the exception comes once the descriptor is owned by
something that closes it. Only the main thread runs Python signal handlers (and only it can
install them), so other threads pass through untouched; a signal with no Python handler
(ignored, or the default action) is left alone.

The swap must never outlive the block (review 34: a timeout's exception landing inside the
swap left kernelpack's handler installed, and Ctrl-C did nothing from then on). So the
previous handler is recorded before the replacement is installed, and an exception while
installing undoes what was done; a handler the application installs meanwhile (from another
signal's handler) is kept, not overwritten; and the replacement, called after its block has
ended, puts the application's handler back and hands the signal to it.
"""

from __future__ import annotations

import _signal  # signal's C functions: its Python wrappers (enums) tripled the cost, and
import threading  # importing them costs a first load the enums' construction
from types import FrameType, TracebackType
from typing import Any, Callable

__all__ = ["deferred_interrupts"]

_SIGNALS = tuple(sorted(set(_signal.valid_signals()) - {
    getattr(_signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(_signal, name)}))
_MAIN = threading.main_thread().ident


class deferred_interrupts:  # noqa: N801 (used as a context manager, like contextlib's)
    """``with deferred_interrupts(): fd = os.open(...)``: a signal whose handler is Python
    code, arriving in the block, is handed to that handler when the block ends."""

    __slots__ = ("_previous", "_caught", "_active")

    def __enter__(self) -> None:
        self._previous: list[tuple[int, Callable[..., Any]]] = []
        self._caught: list[tuple[int, FrameType | None]] = []
        self._active = True
        if threading.get_ident() != _MAIN:
            return
        try:
            for signum in _SIGNALS:
                handler = _signal.getsignal(signum)
                if callable(handler):
                    self._previous.append((signum, handler))  # recorded first: undone below
                    _signal.signal(signum, self._note)
        except BaseException:  # another signal's handler raised: leave nothing swapped
            self._deliver(self._restore())  # (and lose no signal noted meanwhile)
            raise

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._active:
            self._caught.append((signum, frame))
            return
        # A block that ended without putting this back (it cannot happen through __exit__,
        # but an exception can strike anywhere): restore the application's, and deliver.
        handler = dict(self._previous).get(signum)
        if handler is not None:
            if _signal.getsignal(signum) == self._note:
                _signal.signal(signum, handler)
            handler(signum, frame)

    def _restore(self) -> dict[int, Callable[..., Any]]:
        """Put back every recorded handler still replaced by ours (one the application
        installed meanwhile stays); the handlers now in place, by signal. Signals arriving
        meanwhile are still only noted (inactive, the note would run a handler now, and an
        exception from it left the rest swapped)."""
        now = {}
        for signum, handler in self._previous:
            if _signal.getsignal(signum) == self._note:
                _signal.signal(signum, handler)
            now[signum] = _signal.getsignal(signum)
        self._active = False
        return now

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._deliver(self._restore())

    def _deliver(self, handlers: dict[int, Callable[..., Any]]) -> None:
        caught, self._caught = self._caught, []
        for signum, frame in caught:  # in order; one that raises ends the rest, as it would
            handler = handlers.get(signum)  # have without the deferral
            if callable(handler):
                handler(signum, frame)
