"""Shared helpers of the GPU benchmarks: event-timed medians, the copy-bandwidth ceiling, error
measures and the RESULTS.md appender.

Timing follows ``triton.testing.do_bench``: before every timed call a 256 MiB buffer is zeroed
(this flushes L2), then a spin kernel keeps the GPU busy for ``HOST_LEAD_US`` more (the zeroing
alone hides only ~70 µs of host work: a peer that enqueues several launches per call had its
host time land inside the events), so the host queues the timed call ahead of the GPU; a pair
of CUDA events brackets the call, and the median over many calls is reported. Callers that
pass several closures get them in rotation, so inputs that would fit in L2 are not re-read from
it. ``per_call_us`` times host
overhead instead: many calls back to back, then a sync.

Only torch is needed (imported on first use), so ``benchmarks/kernels.py`` stays importable on a
machine without a GPU.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["cuda_torch", "median_ms", "per_call_us", "copy_bandwidth", "time_cell", "rel_err",
           "device_info", "markdown_table", "append_results", "l2_bytes", "rotation_count",
           "RESULTS"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
FLUSH_BYTES = 256 << 20
HOST_LEAD_US = 300.0  # GPU time queued ahead of each timed call, after the flush
_flush_buf: Any = None
_spin_cycles: int | None = None


def _torch() -> Any:
    import torch

    return torch


def cuda_torch(script: str) -> Any:
    """torch, when it is installed and sees a CUDA device; else None, after saying so (a GPU
    benchmark run on a machine without one measures nothing and exits cleanly)."""
    try:
        import torch
    except ImportError:
        print(f"{script}: needs torch and a CUDA device; nothing to measure")
        return None
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device; nothing to measure")
        return None
    return torch


def _flush() -> None:
    """Flush L2, then queue ``HOST_LEAD_US`` of spinning on the GPU (where torch has its
    ``torch.cuda._sleep`` spin kernel; without it only the zeroing's own time hides host work)."""
    global _flush_buf
    torch = _torch()
    if _flush_buf is None:
        _flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    _flush_buf.zero_()
    cycles = _lead_cycles()
    if cycles:
        torch.cuda._sleep(cycles)


def _lead_cycles() -> int:
    """Spin-kernel cycles lasting about ``HOST_LEAD_US`` on this device (measured once with
    events), or 0 without ``torch.cuda._sleep``."""
    global _spin_cycles
    if _spin_cycles is None:
        torch = _torch()
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            _spin_cycles = 0
            return 0
        probe = 1_000_000
        sleep(probe)  # first use: module load
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(probe)
        end.record()
        torch.cuda.synchronize()
        us = max(start.elapsed_time(end) * 1e3, 1.0)
        _spin_cycles = max(1, int(probe * HOST_LEAD_US / us))
    return _spin_cycles


def median_ms(fns: Callable[[], object] | Sequence[Callable[[], object]], *,
              warmup_ms: float = 25.0, rep_ms: float = 100.0, min_reps: int = 10,
              max_reps: int = 1000, flush: bool = True) -> float:
    """Median device time in milliseconds of one call, measured with CUDA events.

    ``fns``: one zero-argument callable, or several (used in rotation: call ``i`` runs
    ``fns[i % len(fns)]``; give each its own input/output buffers). The number of timed calls
    is chosen from a first estimate so that they last about ``rep_ms`` (within
    ``min_reps``..``max_reps``), after about ``warmup_ms`` of untimed calls.
    """
    torch = _torch()
    seq = list(fns) if isinstance(fns, (list, tuple)) else [fns]  # type: ignore[list-item]
    if not seq:
        raise ValueError("median_ms needs at least one callable (got none)")
    # First estimate (also warms caches, JIT compilers and allocators).
    seq[0]()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(5):
        seq[i % len(seq)]()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-4)
    warm = max(1, int(warmup_ms / est))
    reps = int(min(max(rep_ms / est, min_reps), max_reps))
    for i in range(warm):
        seq[i % len(seq)]()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush:
            _flush()
        starts[i].record()
        seq[i % len(seq)]()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def per_call_us(fns: dict[str, Callable[[], object]], sync: Callable[[], None], calls: int,
                reps: int, warm: int = 50) -> dict[str, float]:
    """Median host-side µs per call of each of ``fns``: ``reps`` rounds, each timing ``calls``
    back-to-back calls and a ``sync`` per method, the methods interleaved within a round so
    that clock drift hits them alike (after ``warm`` untimed calls of each). For launch
    overhead: with short kernels the figure is the host's time per call."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(warm):
            fn()
    sync()
    for _ in range(reps):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def copy_bandwidth(nbytes: int = 1 << 30, **kw: Any) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written
    (``dst.copy_(src)`` on ``nbytes``-byte buffers): the ceiling for memory-bound kernels."""
    torch = _torch()
    src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), **kw)
    if not torch.equal(src, dst):
        raise RuntimeError("copy_bandwidth: dst differs from src after the copy")
    del src, dst
    return 2 * nbytes / (ms * 1e-3)


def time_cell(ms: float, nbytes: int, copy_bw: float, digits: int = 3) -> str:
    """A table cell: ``ms`` and the bytes moved over that time as a fraction of ``copy_bw``
    (bytes per second), e.g. ``0.131 ms (97%)``."""
    return f"{ms:.{digits}f} ms ({nbytes / (ms * 1e-3) / copy_bw:.0%})"


def rel_err(got: Any, ref: Any) -> float:
    """Normwise relative error ‖got − ref‖₂ / ‖ref‖₂ in float64 (complex128 for complex), on
    the device. NaN anywhere in ``got`` gives NaN (never a pass); a zero ``ref`` gives the
    absolute error."""
    torch = _torch()
    wide = torch.complex128 if (got.is_complex() or ref.is_complex()) else torch.float64
    g, r = got.to(wide), ref.to(wide)
    if tuple(g.shape) != tuple(r.shape):
        raise ValueError(f"rel_err: shape {tuple(g.shape)} vs reference {tuple(r.shape)}")
    if bool(torch.isnan(g).any()):
        return math.nan
    num = float(torch.linalg.vector_norm(g - r))
    den = float(torch.linalg.vector_norm(r))
    return num / den if den > 0 else num


def l2_bytes() -> int:
    """The device's L2 size in bytes (50 MiB on an H100 when torch does not say)."""
    props = _torch().cuda.get_device_properties(0)
    return int(getattr(props, "L2_cache_size", 0) or (50 << 20))


def rotation_count(bytes_per_call: int, cap: int = 16) -> int:
    """How many input/output sets to rotate so that one pass over them is >= 4x L2."""
    if bytes_per_call <= 0:
        return 1
    return int(min(cap, max(1, math.ceil(4 * l2_bytes() / bytes_per_call))))


def device_info() -> dict[str, str]:
    """Device name, driver version and date (UTC) for the results heading."""
    torch = _torch()
    name = torch.cuda.get_device_name(0)
    driver = ""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30)
        driver = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = ""
    try:
        from cuda.bindings import driver as drv

        err, ver = drv.cuDriverGetVersion()
        if int(err) == 0:
            cuda = f"CUDA {ver // 1000}.{ver % 1000 // 10}"
            driver = f"{driver} ({cuda})" if driver else cuda
    except Exception:  # the bindings are optional for the heading
        pass
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"device": name, "driver": driver or "unknown",
            "date": now.strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__}


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   align: str | None = None) -> list[str]:
    """A GitHub markdown table; ``align`` is one letter per column (``l``/``r``)."""
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def append_results(title: str, body: Sequence[str], *, results: Path | None = RESULTS,
                   md_out: str | os.PathLike | None = None) -> str:
    """Append ``## title — device, driver, date`` and ``body`` to RESULTS.md (skipped when
    ``results`` is None) and, when given, write the same section to ``md_out``. Returns the
    section text (callers print it, since files written on a lent machine may not come back)."""
    info = device_info()
    section = "\n".join([f"## {title} — {info['device']}, driver {info['driver']}, "
                         f"{info['date']}", "", *body, ""])
    if results is not None:
        text = results.read_text() if results.exists() else "# Benchmark results\n"
        results.write_text(text.rstrip("\n") + "\n\n" + section)
    if md_out is not None:
        Path(md_out).parent.mkdir(parents=True, exist_ok=True)
        Path(md_out).write_text(section)
    return section
