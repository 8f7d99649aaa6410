"""Run a call with a KeyboardInterrupt raised at its k-th instruction boundary in given files.

This is what a SIGINT arriving meanwhile does: the eval loop raises it at its next check,
which CPython makes at every CALL's end, at RESUME and at backward jumps. Every opcode boundary
here is a superset of those. A signal that lands while a C function runs with the GIL released
is raised as that CALL ends, before its result is stored. Used by the interrupt sweeps of
reviews 62 (torch's pool blocks) and 72a (CuPy's stream-ordered scratch).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

__all__ = ["run_interrupted"]


def run_interrupted(call: Callable[[], Any], files: Mapping[str, str],
                    k: int) -> tuple[tuple[str, int] | None, Any]:
    """``call()`` with a KeyboardInterrupt raised at the ``k``-th opcode executed in a frame of
    one of ``files`` (path -> the name to report). Returns ``((name, line), None)`` where it
    was raised, or ``(None, result)`` when the call ran through first."""
    state: dict[str, Any] = {"left": k, "at": None}

    def local(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_code.co_filename in files:
            state["left"] -= 1
            if state["left"] == 0:
                state["at"] = (files[frame.f_code.co_filename], frame.f_lineno)
                raise KeyboardInterrupt
        return local

    def enter(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace = local  # (3.13 turns them on only with f_trace set too)
        return local

    before = sys.gettrace()
    # 3.12.1 gave the callees no opcode events unless the frame that sets the tracer asks for
    # them too (3.11 and 3.13 do without)
    sys._getframe().f_trace_opcodes = True
    sys.settrace(enter)
    try:
        got = call()
    except KeyboardInterrupt:
        got = None
    finally:
        sys.settrace(before)
    return state["at"], got
