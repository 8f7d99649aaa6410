"""zstd decoding on the load path: kernelpack's own decoder against libzstd and zstandard (CPU).

A process's first kernel load decompresses one image (a cubin, 4 KB to a few MB), through
``kernelpack._zstd``: since ``_zstd_inflate.c`` that is the decoder built into the runtime
extension ("builtin"), where it was the system's libzstd opened with dlopen from the same
extension ("libzstd"); the ``zstandard`` package is the fallback. This times the three on the
same frames, in one run:

  warm   each decoder's one-shot call on frames of cubin-like data (16-byte instructions,
         zero padding, symbol names: the byte statistics of a real sm_90 cubin) of 4 KiB,
         64 KiB, 1 MiB and 8 MiB, plus a real cubin when nvJitLink is here, compressed as the
         serializer stores images (``serializer.ZSTD_LEVEL``, content size, no checksum);
         calls interleaved round-robin, median of ``--reps`` (fewer for the large sizes);
  fresh  the first decode of the 4 KiB frame in a fresh ``python`` process, each decoder's
         one-time costs inside the clock (libzstd: ``zstd_open``, its dlopen, and a context;
         zstandard: its import and a decompressor; builtin: nothing to open), with the
         runtime extension imported before it; ``--fresh`` processes per decoder,
         interleaved, medians. The second call of the same process is shown beside it, so
         "one-time" is the first minus the second.

Prints both tables and appends them to benchmarks/RESULTS.md with the machine and the date
(``--no-results``: print only). The box is shared: expect noise, compare within one run.

    python benchmarks/zstd_decode.py [--reps N] [--fresh N] [--sizes 4K,64K,1M,8M]
        [--no-results] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = ROOT / "src"
RESULTS = HERE / "RESULTS.md"
sys.path.insert(0, str(SRC))
sys.path.insert(1, str(ROOT / "tests"))  # the tests' cubin-like data generator

# The first decode in a fresh process; argv: decoder, frame path, raw size. The runtime
# extension is imported before the clock (a process that launches has imported it).
CHILD = r'''
import json, sys, time
which, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
from kernelpack.runtime import _launch
frame = open(path, "rb").read()

def builtin():
    return _launch.zstd_builtin_decompress(frame, size)

def libzstd():
    if not _launch.zstd_open():
        raise SystemExit("no libzstd here")
    return _launch.zstd_decompress(frame, size)

DCTX = []
def zstandard_():
    if not DCTX:
        import zstandard
        DCTX.append(zstandard.ZstdDecompressor())
    return DCTX[0].decompress(frame, max_output_size=size)

fn = {"builtin": builtin, "libzstd": libzstd, "zstandard": zstandard_}[which]
t0 = time.perf_counter(); first = fn(); t1 = time.perf_counter()
second = fn(); t2 = time.perf_counter()
assert len(first) == size and first == second
print(json.dumps([(t1 - t0) * 1e6, (t2 - t1) * 1e6]))
'''


def cubin_like(n: int, seed: int = 0) -> bytes:
    """ELF-like machine code, as tests/test_zstd_inflate.py makes it (~half zero bytes, ~4.5x
    smaller at level 9; a real 264 KB sm_90 cubin: 5.9x)."""
    from test_zstd_inflate import _cubin_like

    return _cubin_like(n, random.Random(seed))


def real_cubin() -> bytes | None:
    """examples/axpy.ptx as an sm_90 cubin through nvJitLink, or None without it."""
    try:
        from kernelpack.targets import Arch
        from kernelpack.toolchain import nvjitlink

        return nvjitlink.ptx_to_cubin((ROOT / "examples" / "axpy.ptx").read_bytes(), Arch(9, 0))
    except Exception:  # noqa: BLE001 - no nvJitLink (or no CUDA wheel): synthetic data only
        return None


def parse_size(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else \
        f"{n >> 10} KiB" if n % 1024 == 0 else f"{n:,} B"


def warm(frames: list[tuple[str, bytes, bytes]], reps: int) -> list[dict[str, Any]]:
    """Median µs per decoder and frame, the decoders called round-robin."""
    import zstandard

    from kernelpack.runtime import _launch

    have_libzstd = _launch.zstd_open()
    dctx = zstandard.ZstdDecompressor()
    rows = []
    for name, raw, frame in frames:
        n = len(raw)
        calls: dict[str, Callable[[], bytes]] = {
            "builtin": lambda: _launch.zstd_builtin_decompress(frame, n),
            "zstandard": lambda: dctx.decompress(frame, max_output_size=n)}
        if have_libzstd:
            calls["libzstd"] = lambda: _launch.zstd_decompress(frame, n)
        for fn in calls.values():
            assert fn() == raw
        count = max(7, min(reps, (256 << 20) // max(n, 1)))
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(count):
            for key, fn in calls.items():
                t = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t)
        rows.append({"data": name, "raw": n, "stored": len(frame), "reps": count,
                     **{k: statistics.median(v) * 1e6 for k, v in times.items()}})
        print(f"warm {name}: " + ", ".join(f"{k} {rows[-1][k]:.1f} µs" for k in calls))
    return rows


def fresh(frame: bytes, size: int, processes: int) -> dict[str, dict[str, float]]:
    """First and second decode of a fresh process, per decoder (medians, µs)."""
    from kernelpack.runtime import _launch

    which = ["builtin", "zstandard"] + (["libzstd"] if _launch.zstd_open() else [])
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    runs: dict[str, list[list[float]]] = {k: [] for k in which}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "frame.zst"
        path.write_bytes(frame)
        for _ in range(processes):
            for key in which:
                out = subprocess.run([sys.executable, "-c", CHILD, key, str(path), str(size)],
                                     capture_output=True, text=True, check=True, env=env,
                                     timeout=120).stdout
                runs[key].append(json.loads(out.splitlines()[-1]))
    result = {}
    for key, samples in runs.items():
        first = [s[0] for s in samples]
        second = [s[1] for s in samples]
        result[key] = {"first": statistics.median(first), "first_min": min(first),
                       "second": statistics.median(second),
                       "once": statistics.median(f - s for f, s in samples)}
        print(f"fresh {key}: first {result[key]['first']:.1f} µs, second "
              f"{result[key]['second']:.1f} µs")
    return result


def libzstd_version() -> str:
    try:
        number = ctypes.CDLL("libzstd.so.1").ZSTD_versionNumber()
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    except (OSError, AttributeError):
        return "none"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report(rows: list[dict[str, Any]], first: dict[str, dict[str, float]], level: int,
           argv: list[str], fresh_size: int, processes: int) -> list[str]:
    import zstandard

    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"## zstd decoding: kernelpack's decoder vs libzstd vs zstandard (CPU, "
             f"`benchmarks/zstd_decode.py`) — {cpu_name()}, {now:%Y-%m-%d %H:%M} UTC", "",
             f"Command: `{' '.join(['python benchmarks/zstd_decode.py', *argv])}` — "
             f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"system libzstd {libzstd_version()}, zstandard {zstandard.__version__} (its "
             f"libzstd {'.'.join(map(str, zstandard.ZSTD_VERSION))}). Frames as the serializer "
             f"writes them (level {level}, content size, no checksum).", "",
             "(a) Warm one-shot decode, median µs (calls interleaved); MB/s of output.", "",
             "| data | raw | stored | builtin µs | libzstd µs | zstandard µs | builtin MB/s | "
             "libzstd MB/s | builtin / libzstd time |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lib = r.get("libzstd")
        cells = [r["data"], f"{r['raw']:,}", f"{r['stored']:,}", f"{r['builtin']:.1f}",
                 "-" if lib is None else f"{lib:.1f}", f"{r['zstandard']:.1f}",
                 f"{r['raw'] / r['builtin']:.0f}", "-" if lib is None else f"{r['raw'] / lib:.0f}",
                 "-" if lib is None else f"{r['builtin'] / lib:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"(b) The first decode in a fresh process ({label(fresh_size)} cubin-like "
              f"frame; runtime extension imported before the clock), median of {processes} "
              f"processes per decoder, interleaved.", "",
              "| decoder | first decode µs | min µs | second decode µs | one-time µs (first − "
              "second) |", "| --- | ---: | ---: | ---: | ---: |"]
    what = {"builtin": "builtin (nothing to open)",
            "libzstd": "libzstd from C (`zstd_open`: dlopen + context)",
            "zstandard": "zstandard (import + decompressor)"}
    for key in ("builtin", "libzstd", "zstandard"):
        if key in first:
            f = first[key]
            lines.append(f"| {what[key]} | {f['first']:.1f} | {f['first_min']:.1f} | "
                         f"{f['second']:.1f} | {f['once']:.1f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--reps", type=int, default=201,
                    help="warm calls per decoder and frame (capped at 256 MiB of output)")
    ap.add_argument("--fresh", type=int, default=15, help="fresh processes per decoder")
    ap.add_argument("--sizes", default="4K,64K,1M,8M", help="cubin-like data sizes")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--json", help="write the raw figures here")
    args = ap.parse_args()

    import zstandard

    from kernelpack.serializer import ZSTD_LEVEL

    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                          write_checksum=False, write_dict_id=False)
    frames = []
    cubin = real_cubin()
    if cubin is not None:
        frames.append(("axpy sm_90 cubin (real)", cubin, compressor.compress(cubin)))
    for i, size in enumerate(parse_size(s) for s in args.sizes.split(",")):
        raw = cubin_like(size, seed=i)
        frames.append((f"cubin-like {label(size)}", raw, compressor.compress(raw)))
    rows = warm(frames, args.reps)
    small = min((f for f in frames if f[0].startswith("cubin-like")), key=lambda f: len(f[1]))
    first = fresh(small[2], len(small[1]), args.fresh)
    lines = report(rows, first, ZSTD_LEVEL, sys.argv[1:], len(small[1]), args.fresh)
    section = "\n".join(lines)
    print("\n" + section)
    if args.json:
        Path(args.json).write_text(json.dumps({"warm": rows, "fresh": first}, indent=1))
    if not args.no_results:
        text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
        RESULTS.write_text(text.rstrip("\n") + "\n\n" + section + "\n")
        print(f"appended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
