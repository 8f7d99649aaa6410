"""kernelpack._interrupts: reading a handler's SA_RESTART flag through either door (the
extension's ``signal_restarts`` and ctypes' libc ``sigaction``), and keeping it through a
hand-over whichever door read it."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Iterator

import pytest

from kernelpack import _interrupts
from kernelpack._interrupts import _Restarts, deferred_interrupts

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="SA_RESTART is read on Linux only")


def _native() -> object:
    try:
        from kernelpack.runtime._launch import signal_restarts
    except ImportError:
        pytest.skip("the C extension kernelpack.runtime._launch is not built")
    return signal_restarts


@pytest.fixture
def usr1() -> Iterator[None]:
    """SIGUSR1 with a Python handler (restored afterwards), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed in the main thread only")
    previous = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.fixture(params=["extension", "ctypes"])
def door(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each door in turn: ``ctypes`` is what an install without the extension uses."""
    if request.param == "extension":
        monkeypatch.setattr(_Restarts, "_native", _native())
    else:
        monkeypatch.setattr(_Restarts, "_native", False)
    return str(request.param)


@pytest.mark.parametrize("restarts", [True, False], ids=["SA_RESTART", "no-SA_RESTART"])
def test_both_doors_read_the_flag(usr1: None, door: str, restarts: bool) -> None:
    signal.siginterrupt(signal.SIGUSR1, not restarts)
    assert _Restarts.of(signal.SIGUSR1) is restarts


@pytest.mark.parametrize("restarts", [True, False], ids=["SA_RESTART", "no-SA_RESTART"])
def test_a_hand_over_keeps_the_flag(usr1: None, door: str, restarts: bool) -> None:
    signal.siginterrupt(signal.SIGUSR1, not restarts)
    app = signal.getsignal(signal.SIGUSR1)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGUSR1) is not app  # swapped for the note-taker
    assert signal.getsignal(signal.SIGUSR1) is app
    assert _interrupts._Restarts.of(signal.SIGUSR1) is restarts


def test_the_extension_answers_none_for_what_is_no_signal() -> None:
    native = _native()
    assert native(0) is None  # type: ignore[operator]
    assert native(100_000) is None  # type: ignore[operator]
    assert native(-1) is None  # type: ignore[operator]
    with pytest.raises(OverflowError):
        native(1 << 80)  # type: ignore[operator]
    with pytest.raises(TypeError):
        native("2")  # type: ignore[operator]


def test_the_doors_agree_on_every_signal() -> None:
    native = _native()
    for signum in _interrupts._SIGNALS:
        assert native(signum) == _Restarts._by_ctypes(signum), f"signal {signum}"  # type: ignore[operator]
