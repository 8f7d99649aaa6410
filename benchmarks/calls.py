"""Host time per call of compiled multi-launch programs: the fast path against the general
path and PyTorch eager, in one run.

A fast path (``runtime/fastpath.py``, in C: ``runtime/_fastcall.c``) used to take only
programs without scratch buffers anywhere. A row softmax or layer norm has a split variant
for long rows that needs scratch, so every call of those programs, on any shape, went through
the general path; column reductions need scratch on every shape. Now a call whose variant has
scratch allocates it as one buffer of the caller's framework and launches from the fast path.

Each method is called ``--calls`` times back to back, then the device is synchronized; the
time per call is the median over ``--reps`` repetitions with the methods interleaved. Small
shapes keep the kernels short, so the figure is mostly host time; the ``device`` column (the
same calls with ``out=`` captured in one CUDA graph and replayed) says what the GPU needs per
call. Methods:
``kp`` (``program(x)``), ``kp general`` (the same program through the general path,
``program._kp_bound.__call__``: what every call of these programs took before), and the
torch ops. Results are checked against float64 torch before timing: the first call (which
binds), the general path, and the call through the fast path that the second call builds
(the script stops if no fast path was built); with the C fast path, its own counter must show
that every timed ``kp`` call took it.

With ``--stream`` every call passes ``out=`` and ``stream=`` a side stream (torch's op runs
inside ``with torch.cuda.stream(side)``): until session 42 a call with scratch and
``stream=`` took the general path, now the fast path allocates its scratch for that stream.
With ``--stream-outputs`` every call passes ``stream=`` and no ``out=``: until session 43
such calls took the general path, now the fast path allocates the outputs from that
stream's pool.

With ``--cupy`` the calls take CuPy arrays (views of the same inputs through
``__cuda_array_interface__``), ``--stream``/``--stream-outputs`` pass a ``cupy.cuda.Stream``,
and the peer is the same math in CuPy ops (inside ``with side:``) instead of torch's; until
session 44 CuPy calls with ``stream=`` and no ``out=`` took the general path.

    python benchmarks/calls.py [--calls 200] [--reps 15] [--stream | --stream-outputs]
        [--cupy] [--no-results]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from _gpu_timing import (RESULTS, append_results, cuda_torch, markdown_table,  # noqa: E402
                         per_call_us, rel_err)

T = kp.Tensor
EPS = 1e-5


@kp.fusion
def softmax(x: T[kp.f32, "n", "d"]):
    e = kp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@kp.fusion
def layernorm(x: T[kp.f32, "n", "d"], w: T[kp.f32, "d"], b: T[kp.f32, "d"]):
    c = x - x.mean(axis=1, keepdims=True)
    return c * kp.rsqrt((c * c).mean(axis=1, keepdims=True) + EPS) * w + b


@kp.fusion
def colsum(x: T[kp.f32, "a", "b"]):
    return x.sum(axis=0)


@kp.fusion
def colstd(x: T[kp.f32, "a", "b"]):
    c = x - x.mean(axis=0, keepdims=True)
    return kp.sqrt((c * c).mean(axis=0))


FUSIONS = (softmax, layernorm, colsum, colstd)
# (program, input shape): a row variant without scratch, the split variant of long rows
# (scratch), and column reductions (scratch)
CASES = [("softmax", (32, 512)), ("softmax", (4, 65536)), ("layernorm", (32, 512)),
         ("layernorm", (4, 65536)), ("colsum", (512, 64)), ("colstd", (512, 64))]


def _inputs(name: str, shape: tuple, torch: Any) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(shape[0] * 131 + shape[1])
    x = torch.randn(shape, device="cuda", generator=gen)
    if name != "layernorm":
        return (x,)
    w = torch.randn(shape[1], device="cuda", generator=gen)
    return x, w, torch.randn(shape[1], device="cuda", generator=gen)


def _torch_op(name: str, torch: Any) -> Callable[..., Any]:
    F = torch.nn.functional
    return {"softmax": lambda x: torch.softmax(x, dim=1),
            "layernorm": lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, EPS),
            "colsum": lambda x: x.sum(0),
            "colstd": lambda x: x.std(0, unbiased=False)}[name]


def _cupy_op(name: str, cp: Any) -> Callable[..., Any]:
    """The same math in CuPy ops (the peer with ``--cupy``)."""
    def softmax_op(x: Any) -> Any:
        e = cp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layernorm_op(x: Any, w: Any, b: Any) -> Any:
        c = x - x.mean(axis=1, keepdims=True)
        return c / cp.sqrt((c * c).mean(axis=1, keepdims=True) + EPS) * w + b

    return {"softmax": softmax_op, "layernorm": layernorm_op,
            "colsum": lambda x: x.sum(axis=0), "colstd": lambda x: x.std(axis=0)}[name]


def _reference(name: str, args: tuple, torch: Any) -> Any:
    return _torch_op(name, torch)(*(a.double() for a in args))


def _fast_call(call: Callable[..., Any], flavor: str) -> Any:
    """The C FastCall serving ``flavor``'s arrays ("torch" or "cupy"), or None on a closure
    path: with both frameworks imported the torch one comes first and hands other arrays to
    the CuPy one (``fastpath.make_fast_path``)."""
    while type(fc := getattr(call, "__self__", None)).__name__ == "FastCall":
        if fc.flavor == flavor:
            return fc
        call = fc.hooks.slow
    return None


def _graph_us(fn: Callable[[], Any], torch: Any, calls: int, reps: int = 11) -> float:
    """Device time per call: ``calls`` calls captured in one CUDA graph, replayed ``reps``
    times (CUDA events), median / calls. No host work between the kernels, so this is what
    the GPU needs per call; a per-call time near it is device-bound, one well above it
    host-bound."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def main() -> int:
    from _cli import parser_for

    ap = parser_for(__doc__)
    ap.add_argument("--calls", type=int, default=200, help="back-to-back calls per sample")
    ap.add_argument("--reps", type=int, default=15, help="samples per method (median)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--stream", action="store_true",
                     help="every call with out= and stream= a side stream")
    how.add_argument("--stream-outputs", action="store_true",
                     help="every call with stream= a side stream and no out= (kernelpack "
                          "allocates the outputs from that stream's pool)")
    ap.add_argument("--cupy", action="store_true",
                    help="call with CuPy arrays (and a CuPy side stream); the peer is the same "
                         "math in CuPy ops")
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    args = ap.parse_args()
    torch = cuda_torch("calls.py")
    if torch is None:
        return 0
    cp = None
    if args.cupy:
        try:
            import cupy as cp
        except ImportError as exc:
            print(f"calls.py --cupy: CuPy is not importable ({exc}); nothing measured")
            return 0
    streams = args.stream or args.stream_outputs
    side = (cp.cuda.Stream() if cp is not None else torch.cuda.Stream()) if streams else None
    peer_name = "cupy" if cp is not None else "torch"
    use_out = side is not None and not args.stream_outputs
    major, minor = torch.cuda.get_device_capability()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.kpack"
        kp.save([kp.compile(f, targets=[f"sm_{major}{minor}"]) for f in FUSIONS], str(path))
        pack = kp.load(str(path))
        rows = []
        for name, shape in CASES:
            prog = pack[name]
            tensors = _inputs(name, shape, torch)
            ref = _reference(name, tensors, torch)
            # with --cupy: the same memory as CuPy arrays (results read back the same way)
            inputs = tensors if cp is None else tuple(cp.asarray(t) for t in tensors)
            # with --stream: out= arrays (one per method: the checks read them) and stream=
            outs = [(torch.empty_like(ref, dtype=torch.float32) if cp is None
                     else cp.empty(tuple(ref.shape), dtype=cp.float32)) if use_out else None
                    for _ in range(3)]

            def call(out: Any = outs[0]) -> Any:
                return prog(*inputs, out=out, stream=side)

            def general(out: Any = outs[1]) -> Any:
                return prog._kp_bound.__call__(inputs, out, side)

            for how, got in (("kp", call()), ("kp general", general())):
                torch.cuda.synchronize()
                err = rel_err(torch.as_tensor(got, device="cuda"), ref)
                if not err <= 1e-5:
                    raise SystemExit(f"{name} {shape} {how}: relative error {err:.2e}")
            second = call()  # the second call builds the fast path (and runs on it)
            bound = prog._kp_bound
            fast = bound.call != bound.__call__
            if not fast:
                raise SystemExit(f"{name} {shape}: the second call built no fast path: the "
                                 f"'kp' row would time the general path")
            counter = _fast_call(bound.call, "cupy" if cp is not None else "torch")
            before = getattr(counter, "fast_calls", None)
            for how, got in (("kp, second call", second), ("kp, fast path", call(outs[2]))):
                torch.cuda.synchronize()
                err = rel_err(torch.as_tensor(got, device="cuda"), ref)
                if not err <= 1e-5:
                    raise SystemExit(f"{name} {shape} {how}: relative error {err:.2e}")
            if before is not None and counter.fast_calls != before + 1:
                raise SystemExit(f"{name} {shape}: a call after the fast path was built did "
                                 f"not take it (FastCall.fast_calls {before} -> "
                                 f"{counter.fast_calls})")
            op = _torch_op(name, torch) if cp is None else _cupy_op(name, cp)
            peer_err = rel_err(torch.as_tensor(op(*inputs), device="cuda"), ref)
            if not peer_err <= 1e-5:
                raise SystemExit(f"{name} {shape} {peer_name}: relative error {peer_err:.2e}")
            warm = 20
            before = getattr(counter, "fast_calls", None)

            def peer_call() -> Any:
                if side is None:
                    return op(*inputs)
                with (side if cp is not None else torch.cuda.stream(side)):
                    return op(*inputs)

            t = per_call_us({"kp": call, "kp general": general, "torch": peer_call},
                            torch.cuda.synchronize, args.calls, args.reps, warm=warm)
            if before is not None and counter.fast_calls - before != warm + args.reps * args.calls:
                raise SystemExit(f"{name} {shape}: {counter.fast_calls - before} of the "
                                 f"{warm + args.reps * args.calls} timed kp calls took the C "
                                 f"fast path")
            out = torch.empty_like(ref, dtype=torch.float32)
            device_us = _graph_us(lambda: prog(*tensors, out=out), torch, args.calls)
            err = rel_err(out, ref)
            if not err <= 1e-5:
                raise SystemExit(f"{name} {shape} in a CUDA graph: relative error {err:.2e}")
            plan = prog.plan(*tensors)
            launches = sum(1 for pl in plan.launches if all(pl.grid))
            scratch = "yes" if prog.summary.variants[plan.variant].scratch else "no"
            print(f"{name} {shape}: kp {t['kp']:.2f} us, general {t['kp general']:.2f} us, "
                  f"{peer_name} {t['torch']:.2f} us, device {device_us:.2f} us", flush=True)
            rows.append([name, "x".join(map(str, shape)), str(launches), scratch,
                         "yes" if fast else "no", f"{t['kp']:.2f}", f"{t['kp general']:.2f}",
                         f"{t['torch']:.2f}", f"{device_us:.2f}",
                         f"{t['kp general'] / t['kp']:.2f}x", f"{t['kp'] / t['torch']:.2f}"])
    inside = "`with side:`" if cp is not None else "`with torch.cuda.stream(side)`"
    body = [
        f"`python benchmarks/calls.py --calls {args.calls} --reps {args.reps}"
        f"{' --stream' if use_out else ' --stream-outputs' if side else ''}"
        f"{' --cupy' if cp is not None else ''}`; float32. "
        + ("CuPy arrays in and out (views of the same inputs), the peer the same math in CuPy "
           "ops. " if cp is not None else "")
        + (f"Every call with out= and stream= a side stream ({peer_name}: its op inside "
           f"{inside}). " if use_out else "")
        + (f"Every call with stream= a side stream and no out= ({peer_name}: its op inside "
           f"{inside}). " if side and not use_out else "") +
        "µs per call: the median over the samples of (calls back to back + sync) / calls, the "
        "methods interleaved. 'kp general': the same program through the general path (what "
        "every call of a program with scratch in any variant took before the fast paths took "
        "scratch). 'device': the calls (out=) captured in one CUDA graph, replayed, median "
        "µs per call: what the GPU needs without any host work. Every result checked against "
        "float64 torch (relative error <= 1e-5) before timing, the graph's too.",
        "",
        *markdown_table(["program", "shape", "launches", "scratch", "fast path", "kp µs",
                         "kp general µs", f"{peer_name} µs", "device µs", "general / kp",
                         f"kp / {peer_name}"], rows),
    ]
    section = append_results("Host time per call (`benchmarks/calls.py`)", body,
                             results=None if args.no_results else RESULTS)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
