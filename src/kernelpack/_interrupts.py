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

# _signal: signal's C functions; its Python wrappers (enums) tripled the cost, and importing
# them costs a first load the enums' construction
import _signal
import os
import sys
import threading
from types import FrameType, TracebackType
from typing import Any, Callable

__all__ = ["deferred_interrupts"]

_SIGNALS = tuple(sorted(set(_signal.valid_signals()) - {
    getattr(_signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(_signal, name)}))
_MAIN = threading.main_thread().ident
_ACTIVE: set[deferred_interrupts] = set()  # blocks whose swap is in place (main thread only)


def _after_fork_in_child() -> None:
    """The forking thread is the child's main thread (it alone runs the child's signal
    handlers), whichever thread it was in the parent; and a block that was active in the
    parent's main thread, which the child does not have, never ends there: put back what it
    swapped (review 35: such a child kept the note-takers, and its signals went nowhere)."""
    global _MAIN
    _MAIN = threading.get_ident()
    blocks = list(_ACTIVE)
    _ACTIVE.clear()
    for block in blocks:
        block._caught = []  # the parent's signals, noted for the parent
        block._restore()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Restarts:
    """Whether a signal's action restarts interrupted system calls (``SA_RESTART``, what
    ``signal.siginterrupt(sig, False)`` sets, and asyncio's ``add_signal_handler`` does).
    ``signal.signal`` installs a handler without it, so the swap would silently turn it off
    for good: a C library's blocking ``read`` then failed with EINTR at the next signal
    (review 35). Read with libc's ``sigaction``: the extension's ``signal_restarts``, else
    ctypes (loaded by ``import kernelpack``, but its first use here cost a process's first
    ``kp.load`` ~40 µs); None where neither can (the flag is then left as ``signal.signal``
    sets it)."""

    SA_RESTART = 0x10000000  # Linux (x86, ARM, POWER)
    _native: Any = None  # the extension's signal_restarts; False: not built (ctypes then)
    _lib: Any = None
    _buffer: Any = None

    @classmethod
    def of(cls, signum: int) -> bool | None:
        native = cls._native
        if native is None:
            try:  # ~1 µs a signal, where ctypes' first use cost a first kp.load ~40 µs
                # (rebinds the local read above, as intended)
                from .runtime._launch import signal_restarts as native  # type: ignore[no-redef]
            except ImportError:
                native = False
            cls._native = native
        if native:
            return native(signum)  # type: ignore[no-any-return]
        return cls._by_ctypes(signum)

    @classmethod
    def _by_ctypes(cls, signum: int) -> bool | None:
        """:meth:`of` without the extension: libc's ``sigaction`` through ctypes."""
        if cls._lib is None:
            if not sys.platform.startswith("linux"):
                return None
            try:
                import ctypes

                cls._buffer = ctypes.create_string_buffer(512)  # past any struct sigaction
                cls._lib = ctypes.CDLL(None).sigaction
            except (ImportError, OSError, AttributeError):
                cls._lib = False
        if not cls._lib:
            return None
        if cls._lib(signum, None, cls._buffer) != 0:
            return None
        # struct sigaction: the handler (a pointer), sa_mask (128 bytes), then int sa_flags
        at = cls._buffer.raw[_FLAGS_AT:_FLAGS_AT + 4]
        return bool(int.from_bytes(at, sys.byteorder) & cls.SA_RESTART)


_FLAGS_AT = (8 if sys.maxsize > 2 ** 32 else 4) + 128


def _install(signum: int, handler: Callable[..., Any], restarts: bool | None) -> None:
    """``signal.signal(signum, handler)``, keeping the ``SA_RESTART`` flag ``restarts``."""
    _signal.signal(signum, handler)
    if restarts:
        _signal.siginterrupt(signum, False)


class deferred_interrupts:  # noqa: N801 (used as a context manager, like contextlib's)
    """``with deferred_interrupts(): fd = os.open(...)``: a signal whose handler is Python
    code, arriving in the block, is handed to that handler when the block ends."""

    __slots__ = ("_previous", "_caught", "_active")

    def __enter__(self) -> None:
        self._previous: list[tuple[int, Callable[..., Any], bool | None]] = []
        self._caught: list[tuple[int, FrameType | None]] = []
        self._active = True
        if threading.get_ident() != _MAIN:
            return
        try:
            for signum in _SIGNALS:
                handler = _signal.getsignal(signum)
                if callable(handler):
                    restarts = _Restarts.of(signum)
                    # recorded first: undone below
                    self._previous.append((signum, handler, restarts))
                    _ACTIVE.add(self)
                    _install(signum, self._note, restarts)
        except BaseException:  # another signal's handler raised: leave nothing swapped
            self._deliver(self._restore())  # (and lose no signal noted meanwhile)
            raise

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._active:
            self._caught.append((signum, frame))
            return
        # A block that ended without putting this back (it cannot happen through __exit__,
        # but an exception can strike anywhere): restore the application's, and deliver.
        for recorded, handler, restarts in self._previous:
            if recorded == signum:
                if _signal.getsignal(signum) == self._note:
                    _install(signum, handler, restarts)
                handler(signum, frame)
                return

    def _restore(self) -> dict[int, Callable[..., Any]]:
        """Put back every recorded handler still replaced by ours (one the application
        installed meanwhile stays); the handlers now in place, by signal. Signals arriving
        meanwhile are still only noted (inactive, the note would run a handler now, and an
        exception from it left the rest swapped)."""
        now = {}
        for signum, handler, restarts in self._previous:
            if _signal.getsignal(signum) == self._note:
                _install(signum, handler, restarts)
            now[signum] = _signal.getsignal(signum)
        self._active = False
        _ACTIVE.discard(self)
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
