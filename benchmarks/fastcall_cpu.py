"""Host cost of the C fast path itself, without a GPU (a diagnostic, not a target).

``benchmarks/launch.py`` measures kernelpack's launch overhead on a GPU, where the driver's own
~3.5 µs per launch is most of every number. This script isolates what kernelpack adds. It
runs ``_launch.FastCall``, the C fast path of ``runtime/_fastcall.c``, on torch *CPU* tensors.
Its driver entry is bound to a C function that does nothing and returns 0 (libm's
``fegetround``: no arguments read, 0 under the default rounding mode). So every read, check
and packing step of a real call runs, and only the driver call is missing.

Rows:

- ``FastCall.call``: the runtime entry (what ``BoundProgram.call`` is), ``out=`` and allocating.
- ``Program-like call``: the same through ``_launch.CallBase`` (how ``pack[name](...)`` is
  called).
- The torch attribute reads a call makes, each timed from Python, for scale.

The program is ``z = a*x + y`` with n = 1024 float32: the same layout as launch.py's
``axpby``, built by hand here. Before timing, the driver entry is bound to a recording C
callback for the checking calls (``out=``, allocating, ``Program``-like, and the attribute-read
path): each launch's function handle, grid, block and the bytes its ``kernelParams`` point to
must be what the driver would need (``struct.pack("@QQQfI", x, y, z pointers, a, n)``, z the
call's output); then the no-op entry is bound for the timing.

Usage: ``python benchmarks/fastcall_cpu.py [--number 100000] [--repeat 7]``. It needs the
built extension (``pip install -e .``) and torch (the CPU wheel is enough). Each row is the
median of ``--repeat`` timings of ``--number`` calls, the fastest beside it. Results are
printed, not written to RESULTS.md: on a shared CI box they describe the box more than
kernelpack.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import struct
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

N = 1024
A = 2.0
LAYOUT = struct.Struct("@QQQfI")  # x, y, z, a, n (as launch.py's axpby)
SIZES = (8, 8, 8, 4, 4)           # the bytes each of the five kernelParams points to
FUNCTION = 0x1000                 # the function handle _State.flat gives
GRID, BLOCK = ((N + 127) // 128, 1, 1), (128, 1, 1)
# cuLaunchKernel's C signature, for the recording entry
_LAUNCH_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _Hooks:
    """What FastCall asks Python for (see runtime/fast_native.py's Hooks)."""

    def __init__(self) -> None:
        self.slow_calls = 0

    def entry(self, key: tuple) -> tuple:
        """(shapes, likes, launches, views, view_out, overlap, scratch), as
        ``fast_native.Hooks.entry`` answers since the fast paths took scratch (b96252d: a
        5-tuple answer is refused)."""
        (n,) = key[0]
        block = LAYOUT.pack(0, 0, 0, 0.0, n)  # n is the planner's value in the real path
        # no argument to ask for torch's lazy views (float32 tensors of 1024 elements); out=
        # must not partially overlap x (value slot 0) or y (slot 1): 4n bytes each
        overlap = (4 * n, ((0, 4 * n), (1, 4 * n)))
        return ((key[0],), (0,), ((0, (n + 127) // 128, 1, 1, 128, 1, 1, 0, block),), (),
                False, overlap, None)

    def slow(self, args: tuple, out: object, stream: object) -> str:
        self.slow_calls += 1
        return "slow"

    def context_was_lost(self, st: object) -> bool:
        return False


class _State:
    """A device state: FastCall reads the function handles from ``flat``."""

    flat = [0x1000]


def _noop_entry() -> int:
    name = ctypes.util.find_library("m") or "libm.so.6"
    return ctypes.cast(ctypes.CDLL(name).fegetround, ctypes.c_void_p).value or 0


class _Recorder:
    """A C-callable stand-in for ``cuLaunchKernel`` that copies out what the driver would
    read: the function, grid, block, shared memory, stream and the bytes behind each of the
    five ``kernelParams`` pointers (concatenated: the layout has no padding)."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.errors: list[BaseException] = []
        self.entry = _LAUNCH_C(self._launch)  # kept alive with the recorder

    def _launch(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):  # type: ignore[no-untyped-def]
        try:
            ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
            raw = b"".join(ctypes.string_at(ptrs[i], size) for i, size in enumerate(SIZES))
            self.launches.append((f or 0, (gx, gy, gz), (bx, by, bz), shmem, stream or 0, raw,
                                  extra or 0))
            return 0
        except BaseException as exc:  # noqa: BLE001 - cannot cross back into C; reported
            self.errors.append(exc)
            return 1

    @property
    def address(self) -> int:
        return ctypes.cast(self.entry, ctypes.c_void_p).value or 0

    def check(self, outs: list, x: object, y: object) -> None:
        """One launch per output in ``outs`` (in order), each with the expected handle, grid,
        block and parameter bytes; SystemExit naming the first difference."""
        if self.errors or len(self.launches) != len(outs):
            raise SystemExit(f"fastcall_cpu.py: {len(self.launches)} launches recorded for "
                             f"{len(outs)} calls (errors: {self.errors})")
        for i, (launch, z) in enumerate(zip(self.launches, outs)):
            want = (FUNCTION, GRID, BLOCK, 0, 0,
                    LAYOUT.pack(x.data_ptr(), y.data_ptr(), z.data_ptr(), A, N), 0)
            if launch != want:
                raise SystemExit(f"fastcall_cpu.py: launch {i}: the driver would get {launch}, "
                                 f"expected {want}")


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--number", type=int, default=100_000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=7,
                    help="timings per row: the median is shown, the fastest beside it "
                         "(default 7, at least 5)")
    opts = ap.parse_args()
    if opts.repeat < 5:
        ap.error(f"--repeat must be at least 5 (got {opts.repeat})")
    try:
        import torch
    except ImportError:
        print("fastcall_cpu.py needs torch (the CPU wheel is enough): pip install torch")
        return 2
    try:
        from kernelpack.runtime import _launch
    except ImportError:
        print("the C extension kernelpack.runtime._launch is not built (pip install -e .)")
        return 2
    recorder = _Recorder()
    _launch.bind(recorder.address)  # the checking calls below: their launches are recorded
    x, y, z = torch.randn(N), torch.randn(N), torch.empty(N)
    hooks = _Hooks()
    offsets = (0, 8, 16, 24, 28)
    dynamic = ((0, "Q", 0), (8, "Q", 1), (16, "Q", 2), (24, "f", 3))
    f32 = torch.float32
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    dlpack = None if api is None else (api, ((2, 32), (2, 32)), ((2, 32),))

    def fastcall(exchange: object) -> object:
        """FastCall for this program; ``exchange``: DLPack's C exchange API (or None: the
        tensors' attributes are read)."""
        return _launch.FastCall(torch.Tensor, torch.empty_like, lambda device: 0, hooks,
                                {-1: _State()}, 3, ((0, 0, f32), (1, 1, f32)), ((2, 3),), (),
                                ((2, f32),), 4, ((LAYOUT.size, offsets, dynamic),), True,
                                "torch", None, exchange)

    fast = fastcall(dlpack)
    attrs = fastcall(None) if dlpack is not None else None
    call = fast.call

    class Bound:
        pass

    class Program(_launch.CallBase):
        _kp_bound = None

        def _kp_general_call(self, *args: object, **kwargs: object) -> str:
            return "general"

    bound = Bound()
    bound.call = call  # type: ignore[attr-defined]
    prog = Program()
    prog._kp_bound = bound
    args = (x, y, A)
    # correctness first: the fast path ran (not the fallback), returned the right objects, and
    # handed the driver the right launch (the recording entry)
    assert call(args, z, None) is z and prog(x, y, A, out=z) is z
    made = call(args, None, None)
    assert made.shape == x.shape and made.dtype == f32 and made.data_ptr() != z.data_ptr()
    assert fast.fast_calls == 3 and hooks.slow_calls == 0, (fast.fast_calls, hooks.slow_calls)
    outs = [z, z, made]
    if attrs is not None:  # the same block either way: check the attribute path ran too
        assert attrs.call(args, z, None) is z and attrs.fast_calls == 1
        made2 = attrs.call(args, None, None)
        assert made2.shape == x.shape and made2.data_ptr() != z.data_ptr()
        outs += [z, made2]
    recorder.check(outs, x, y)
    print(f"checked: {len(outs)} launches' function, grid, block and kernelParams bytes "
          f"(x, y, z pointers, a, n) as the driver would read them")
    _launch.bind(_noop_entry())  # the timing: the driver entry does nothing

    how = "exchange API" if dlpack is not None else "attribute reads"
    rows = {
        f"FastCall.call, out= ({how})": lambda: call(args, z, None),
        f"FastCall.call, allocating ({how})": lambda: call(args, None, None),
        "Program-like call, out=": lambda: prog(x, y, A, out=z),
        "Program-like call, allocating": lambda: prog(x, y, A),
        "(empty lambda: timing floor)": lambda: None,
        **({} if attrs is None else {
            "FastCall.call, out= (attribute reads)": lambda: attrs.call(args, z, None),
            "FastCall.call, allocating (attribute reads)": lambda: attrs.call(args, None, None),
        }),
        "(torch.empty_like(x))": lambda: torch.empty_like(x),
        "(x.shape)": lambda: x.shape,
        "(x.dtype)": lambda: x.dtype,
        "(x.is_contiguous())": x.is_contiguous,
        "(x.get_device())": x.get_device,
        "(x.data_ptr())": x.data_ptr,
    }
    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"CallBase vectorcall: {bool(_launch.CALL_VECTORCALL)}; median of {opts.repeat} x "
          f"{opts.number} calls (min: the fastest); the driver entry is a no-op")
    print("| call | median µs | min µs |\n|---|---:|---:|")
    for name, fn in rows.items():
        times = timeit.repeat(fn, number=opts.number, repeat=opts.repeat)
        print(f"| {name} | {statistics.median(times) / opts.number * 1e6:.3f} | "
              f"{min(times) / opts.number * 1e6:.3f} |")
    assert hooks.slow_calls == 0
    assert len(recorder.launches) == len(outs), "a timed call reached the recording entry"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
