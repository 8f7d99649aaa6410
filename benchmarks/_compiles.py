"""Real compiles for the benchmarks, and a guard that a tuning switch changed the code.

Since commit 4ef3a03, ``kp.compile`` without a cache remembers the process's last 32 results
by cache key (``kernelpack.compile_entry._RECENT``: LLVM keeps native memory per compile, so
a service compiling per request grew without bound). The key is the fusion, its static dims,
the options, the targets and the toolchain, not the lowering's module constants. So a
benchmark that compiles the same fusion again got the first result back:

- a timed repeat (``compile.py``) timed a dictionary lookup, not a compile;
- "compile twice with a tuning switch flipped" (``columns.py``, ``amplitude.py``,
  ``losses.py``, ``rowsplit.py``, ``_columns_sweep.py``) got the first build twice and timed
  the same kernels as "before" and "after".

kernelpack has no public call to forget that memo, and benchmarks must not add one to
``src/``; :func:`forget_compiles` clears the private dictionary under its lock. The guards
here fail loudly if a later change of the memo (its name, or a second memo) makes a compile a
lookup again: :class:`CompileCounter` counts the lowering's ``compile_traced`` calls, and
:func:`must_differ` compares the artifacts of two builds.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

__all__ = ["forget_compiles", "CompileCounter", "fresh_compile", "patched_build",
           "artifact_digest", "must_differ", "now_and_before"]


def forget_compiles() -> None:
    """Empty ``kp.compile``'s per-process memo, so that the next compile lowers afresh.

    Private names on purpose (no public API exists, and the benchmarks may not add one to
    src/): ``compile_entry._RECENT`` and its lock ``_RECENT_LOCK``. Raises AttributeError
    naming them when they change, rather than silently timing lookups again."""
    from kernelpack import compile_entry

    recent = getattr(compile_entry, "_RECENT", None)
    lock = getattr(compile_entry, "_RECENT_LOCK", None)
    if recent is None or lock is None:
        raise AttributeError("kernelpack.compile_entry has no _RECENT/_RECENT_LOCK any more: "
                             "benchmarks/_compiles.py must learn how to forget compiles")
    with lock:
        recent.clear()


class CompileCounter:
    """Counts calls of the lowering's ``pipeline.compile_traced`` (what ``kp.compile`` runs
    on a memo miss) while installed; a context manager. ``compile_entry`` imports the
    function from the module at each miss, so patching the module attribute sees them all."""

    def __init__(self) -> None:
        self.calls = 0
        self._real: Callable[..., Any] | None = None

    def __enter__(self) -> "CompileCounter":
        from kernelpack.lowering import pipeline

        real = self._real = pipeline.compile_traced

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        pipeline.compile_traced = counted
        return self

    def __exit__(self, *exc: object) -> None:
        from kernelpack.lowering import pipeline

        pipeline.compile_traced = self._real
        self._real = None


def fresh_compile(fusion: Any, counter: CompileCounter, **kwargs: Any) -> Any:
    """``kp.compile(fusion, **kwargs)`` with the memo emptied before it and after it (so that
    neither an earlier build nor this one, made under patched constants, answers a later
    compile of the same key); asserts that the lowering really ran once."""
    import kernelpack as kp

    forget_compiles()
    before = counter.calls
    try:
        compiled = kp.compile(fusion, **kwargs)
    finally:
        forget_compiles()
    if counter.calls != before + 1:
        raise AssertionError(f"kp.compile of {getattr(fusion, 'name', fusion)!r} ran the "
                             f"lowering {counter.calls - before} times (expected 1): a memo "
                             f"answered it")
    return compiled


def patched_build(fusions: Iterable[Any], setup: Callable[[], Callable[[], None]],
                  **kwargs: Any) -> list[Any]:
    """Each of ``fusions`` compiled afresh (see :func:`fresh_compile`) with ``setup()``'s
    patch in place; ``setup`` returns the function that undoes it (run whatever happens)."""
    undo = setup()
    try:
        with CompileCounter() as counter:
            return [fresh_compile(f, counter, **kwargs) for f in fusions]
    finally:
        undo()


def artifact_digest(compiled: Any) -> str:
    """SHA-256 of ``kp.save(compiled)``: summary (variants, launches, plans' expressions) and
    every image's bytes. Equal programs save to equal bytes (``load(save([c])).compiled(name)
    == c``), so equal digests mean the same code and plans."""
    import kernelpack as kp

    items = compiled if isinstance(compiled, (list, tuple)) else [compiled]
    return hashlib.sha256(kp.save(list(items))).hexdigest()


def must_differ(first: Any, second: Any, what: str) -> None:
    """Raise SystemExit when two builds saved to the same bytes: the switch between them did
    not change the code (or a memo answered the second build)."""
    if artifact_digest(first) == artifact_digest(second):
        raise SystemExit(f"{what}: the two builds are identical (same summary and image "
                         f"bytes): the tuning switch did not reach the compile")


def now_and_before(fusion: Any, module: Any, switch: str, target: str, workdir: Any,
                   what: str) -> tuple[Any, Any]:
    """The loaded programs of ``fusion`` compiled afresh for ``target`` with ``module.switch``
    True ('now') and False ('before', the schedule a change replaced), each saved under
    ``workdir`` and loaded back; SystemExit when the two builds are the same code (see
    :func:`must_differ`). The benchmarks that time a lowering change against what it
    replaced (``losses.py``, ``reads_elsewhere.py``) build both this way."""
    import kernelpack as kp
    from pathlib import Path

    programs, builds = [], []
    for value in (True, False):
        saved = getattr(module, switch)
        setattr(module, switch, value)
        try:
            with CompileCounter() as counter:
                compiled = fresh_compile(fusion, counter, targets=[target])
        finally:
            setattr(module, switch, saved)
        path = Path(workdir) / f"{fusion.name}_{switch}_{int(value)}.kpack"
        kp.save([compiled], str(path))
        programs.append(kp.load(str(path))[fusion.name])
        builds.append(compiled)
    must_differ(builds[0], builds[1], what)
    return programs[0], programs[1]
