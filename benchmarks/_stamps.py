"""Where a process's ``kp.load`` + first call spends its time, step by step: timers wrapped
around the load path's main functions in a benchmark's child process (``--stamps`` of
``first_call_cpu.py`` and ``load_gpu.py``).

A profiler would multiply the cost of every small call of a cold first call (several times,
unevenly); these timers cost about a microsecond per wrapped call, and a first call makes
about a dozen such calls, so the parts add up to the clock. Each part is inclusive (a
function's callees count in it); the ones listed as "of which" are inside the step above them,
and "the rest" is the clock minus the top-level steps. The children import kernelpack before
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

    def timed(*args, **kwargs):
        t = _time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            STAMPED[label] = STAMPED.get(label, 0.0) + (_time.perf_counter() - t) * 1e6

    setattr(owner, attr, timed)


for _module, _path, _label in STAMPS:
    _owner = _il.import_module(_module)
    *_parents, _attr = _path.split(".")
    for _part in _parents:
        _owner = getattr(_owner, _part)
    _stamp(_owner, _attr, _label)
'''


def install_code() -> str:
    """Source for a child (after ``import kernelpack``, before its clock starts)."""
    return f"STAMPS = {STAMPS!r}\n" + INSTALL


def table(runs: Sequence[dict[str, Any]], total_key: str, total_label: str) -> list[str]:
    """A markdown table of the stamps' medians over ``runs`` (each a child's ``stamps`` dict
    and its clock, ``total_key``, in µs), with the rest of the clock."""
    if not runs:
        return []
    rows = ["| step | median µs |", "| --- | ---: |"]
    medians = {label: statistics.median(r["stamps"].get(label, 0.0) for r in runs)
               for _, _, label in STAMPS}
    total = statistics.median(r[total_key] for r in runs)
    for _, _, label in STAMPS:
        inside = label.startswith("  ")
        rows.append(f"| {'&nbsp;&nbsp;of which: ' + label.strip() if inside else label} | "
                    f"{medians[label]:.0f} |")
    # the rest, per run (medians do not add up)
    rest = statistics.median(r[total_key] - sum(v for k, v in r["stamps"].items()
                                                if not k.startswith("  ")) for r in runs)
    rows.append(f"| the rest (file read, argument checks, Python between the steps) | "
                f"{rest:.0f} |")
    rows.append(f"| **{total_label}** | **{total:.0f}** |")
    return rows
