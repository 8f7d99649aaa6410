"""Where a process's ``kp.load`` + first call spends its time, step by step: timers wrapped
around the load path's main functions in a benchmark's child process (``--stamps`` of
``first_call_cpu.py`` and ``load_gpu.py``).

A profiler would multiply the cost of every small call of a cold first call (several times,
unevenly); these timers cost about a microsecond per wrapped call, and a first call makes
about a dozen such calls, so the parts add up to the clock. Each part is inclusive (a
function's callees count in it); the ones listed as "of which" are inside the step above them,
and "the rest" is the clock minus the top-level steps. The garbage collector's passes in the
clock (``gc.callbacks``, from the timers' installation on) are shown apart: they run inside
whichever step allocated past a threshold. The children import kernelpack before
installing the timers (so no import is timed), then run ``kp.load`` and the first call.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

# (module, attribute path, label): a label starting with two spaces is inside the one before
STAMPS: tuple[tuple[str, str, str], ...] = (
    ("kernelpack.loader", "Pack.__init__", "kp.load: verify and index the file (Pack)"),
    ("kernelpack.program", "decode_program", "decode the summary"),
    ("kernelpack.runtime.launcher", "BoundSummary.__init__", "bind the summary (slots)"),
    ("kernelpack.runtime.launcher", "_planner_of", "build the planner"),
    ("kernelpack.runtime.launcher", "check_ordinal", "check the inputs' device (driver init)"),
    ("kernelpack.runtime.launcher", "get_device", "the device (attributes, primary context)"),
    ("kernelpack.runtime.launcher", "load_module", "load_module (select, read, load)"),
    ("kernelpack.runtime.library", "image_bytes", "  read the image (digests, zstd)"),
    ("kernelpack.runtime.library", "_load_library", "  cuLibraryLoadData + cuLibraryGetKernel"),
    ("kernelpack.planner", "Planner.plan_shapes", "plan the call (shapes -> launches)"),
    ("kernelpack.runtime.launcher", "run", "allocate, write the slots, launch (execute.run)"),
)

# Installed in a child after ``import kernelpack``: fills STAMPED {label: µs}.
INSTALL = r'''
import importlib as _il, time as _time
STAMPED = {}


def _stamp(owner, attr, label):
    original = getattr(owner, attr)
    static = isinstance(vars(owner).get(attr), staticmethod)

    def timed(*args, **kwargs):
        t = _time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            STAMPED[label] = STAMPED.get(label, 0.0) + (_time.perf_counter() - t) * 1e6

    setattr(owner, attr, staticmethod(timed) if static else timed)


import gc as _gc
_GC_START = [0.0]


def _gc_timed(phase, info):  # the collector's own time, whichever step triggered it
    if phase == "start":
        _GC_START[0] = _time.perf_counter()
        return
    took = (_time.perf_counter() - _GC_START[0]) * 1e6
    STAMPED["gc: us"] = STAMPED.get("gc: us", 0.0) + took
    STAMPED["gc: longest us"] = max(STAMPED.get("gc: longest us", 0.0), took)
    STAMPED["gc: collected"] = STAMPED.get("gc: collected", 0) + info["collected"]
    key = "gc: gen%d" % info["generation"]
    STAMPED[key] = STAMPED.get(key, 0) + 1


_gc.callbacks.append(_gc_timed)

for _module, _path, _label in STAMPS:
    _owner = _il.import_module(_module)
    *_parents, _attr = _path.split(".")
    for _part in _parents:
        _owner = getattr(_owner, _part)
    _stamp(_owner, _attr, _label)
'''


# A warm start (``warmstart.py --gpu --stamps``): fifty ``kp.compile`` cache hits and first
# calls in one process, each step summed over them.
WARM_STAMPS: tuple[tuple[str, str, str], ...] = (
    ("kernelpack.compile_entry", "_traced_key", "cache keys (trace, canonical bytes, digest)"),
    ("kernelpack.cache.disk_tier", "DiskTier.entry", "disk hits (read, kp.load, decode, digests)"),
    ("kernelpack.cache", "Cache._decode", "  kp.load + Pack.compiled of the entries"),
    ("kernelpack.program", "decode_program", "  decode the summaries"),
) + STAMPS[2:]

REST = "the rest (file read, argument checks, Python between the steps)"


def install_code(stamps: Sequence[tuple[str, str, str]] = STAMPS) -> str:
    """Source for a child (after ``import kernelpack``, before its clock starts)."""
    return f"STAMPS = {tuple(stamps)!r}\n" + INSTALL


def table(runs: Sequence[dict[str, Any]], total_key: str, total_label: str,
          stamps: Sequence[tuple[str, str, str]] = STAMPS, unit: str = "µs",
          scale: float = 1.0, rest_label: str = REST) -> list[str]:
    """A markdown table of the stamps' medians over ``runs`` (each a child's ``stamps`` dict
    and its clock, ``total_key``, in µs), with the rest of the clock; figures are shown
    multiplied by ``scale`` (1e-3 for ms) in ``unit``."""
    if not runs:
        return []
    rows = [f"| step | median {unit} |", "| --- | ---: |"]
    medians = {label: statistics.median(r["stamps"].get(label, 0.0) for r in runs) * scale
               for _, _, label in stamps}
    total = statistics.median(r[total_key] for r in runs) * scale
    digits = 0 if scale == 1.0 else 1
    for _, _, label in stamps:
        inside = label.startswith("  ")
        rows.append(f"| {'&nbsp;&nbsp;of which: ' + label.strip() if inside else label} | "
                    f"{medians[label]:.{digits}f} |")
    # the rest, per run (medians do not add up)
    rest = statistics.median(r[total_key] - sum(v for k, v in r["stamps"].items()
                                                if not k.startswith(("  ", "gc: ")))
                             for r in runs)
    rows.append(f"| {rest_label} | {rest * scale:.{digits}f} |")
    # the garbage collector's passes, inside whichever steps allocated past its thresholds: a
    # first call's figures move by its generation-1 pass (~1 ms after a large import)
    gc_us = statistics.median(r["stamps"].get("gc: us", 0.0) for r in runs) * scale
    passes = ", ".join(
        f"gen{g} {statistics.median(r['stamps'].get(f'gc: gen{g}', 0) for r in runs):g}"
        for g in range(3))
    longest = statistics.median(r["stamps"].get("gc: longest us", 0.0) for r in runs)
    freed = statistics.median(r["stamps"].get("gc: collected", 0) for r in runs)
    rows.append(f"| (inside the steps: garbage collection, median passes {passes}; longest "
                f"pass {longest:.0f} µs, {freed:g} objects freed) | {gc_us:.{digits}f} |")
    rows.append(f"| **{total_label}** | **{total:.{digits}f}** |")
    return rows
