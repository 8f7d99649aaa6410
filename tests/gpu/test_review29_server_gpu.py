"""Review 29: the GPU runtime inside a many-threaded, long-running inference server.

Beyond review 28 (tests/gpu/test_review28_runtime_gpu.py, sixteen threads right after a load):
eight threads calling the same two programs (a pointwise one and a softmax, its split variant
with scratch included) each on a stream of its own, with the order on that stream checked (a
stream held busy, then a NaN fill, then an ``out=`` launch: a launch that went to another
stream runs before the fill and leaves NaN); a CUDA graph captured with ``out=`` by one thread
while four others keep launching (the graph must hold the capturing thread's launches only,
and replay correctly); host-visible GPU memory over 5,000 calls (``memory_allocated`` and
the driver's free memory, through torch's allocator and kernelpack's own buffers); a pack
dropped, collected (nothing keeps it alive after fast-path calls) and loaded again; and, each
in a fresh process (so that modules are loaded for the first time there): threads that each
load the pack themselves, ``warmup()`` from several threads while others make first calls,
and ``fork`` before and after CUDA use (the child must launch, resp. raise ``DeviceError``
as the README says, and never hang).

Every test is marked ``gpu`` and skips with a reason where torch sees no CUDA device.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from .torch_checks import NO_GPU, targets, torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(NO_GPU), reason=NO_GPU or "-")]


@kp.fusion
def r29_axpy(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"], a: kp.f32):
    return x * a + y


@kp.fusion
def r29_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    compiled = [kp.compile(f, targets=targets(NO_GPU)) for f in (r29_axpy, r29_softmax)]
    path = tmp_path_factory.mktemp("r29") / "r29.kpack"
    kp.save(compiled, path)
    return path


# --------------------------------------------------------------------------------------------
# helpers

# About 20 ms of an H200 (near 2 GHz): a stream queued behind it shows where a launch went.
_BUSY_CYCLES = 40_000_000


def _err(got, ref):
    """Normwise relative error as a 0-d device tensor (no host sync), float64."""
    got, ref = got.double(), ref.double()
    return (got - ref).abs().max() / ref.abs().max().clamp_min(1e-300)


def _softmax_ref(x, s: float):
    return torch.softmax(x.double() * float(np.float32(s)), dim=1)


def _run_threads(n: int, target, timeout: float = 120.0) -> list:
    errors: list = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            errors.append((i, f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    errors += [("hung", t.name) for t in threads if t.is_alive()]
    return errors


class _CAI:
    """Only ``__cuda_array_interface__``: the general path, kernelpack buffers back."""

    def __init__(self, t) -> None:
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


# --------------------------------------------------------------------------------------------
# threads on their own streams


def test_threads_call_the_same_programs_on_their_own_streams(artifact) -> None:
    pack = kp.load(artifact)
    ax, sm = pack["r29_axpy"], pack["r29_softmax"]
    n_threads, rounds = 8, 30
    gen = torch.Generator(device="cuda").manual_seed(29)
    inputs = []
    for i in range(n_threads):
        n = 100_003 + 977 * i
        shape = (3, 70000) if i % 2 else (64, 1000)  # the split softmax (scratch) and the row one
        inputs.append((torch.randn(n, device="cuda", generator=gen),
                       torch.randn(n, device="cuda", generator=gen),
                       torch.randn(shape, device="cuda", generator=gen),
                       0.25 + i, 0.5 + 0.125 * i))
    torch.cuda.synchronize()
    barrier = threading.Barrier(n_threads, timeout=60)
    errs: dict = {}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def work(i: int) -> None:
        x, y, xs, a, s = inputs[i]
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            ref, ref_sm = x * a + y, _softmax_ref(xs, s)
            out, out_sm = torch.empty_like(x), torch.empty_like(xs)
            barrier.wait()
            torch.cuda._sleep(_BUSY_CYCLES)  # this thread's stream runs behind its host
            found = []
            for _ in range(rounds):
                out.fill_(float("nan"))  # queued on this stream: a launch elsewhere runs first
                ax(x, y, a, out=out)
                out_sm.fill_(float("nan"))
                sm(xs, s, out=out_sm)
                z, w = ax(x, y, a), sm(xs, s)
                found.append(torch.stack([_err(out, ref), _err(out_sm, ref_sm), _err(z, ref),
                                          _err(w, ref_sm)]))
            errs[i] = torch.stack(found)
        stream.synchronize()
        errs[i] = errs[i].cpu().numpy()

    try:
        errors = _run_threads(n_threads, work)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    for i, e in errs.items():
        assert not np.isnan(e).any(), \
            f"thread {i}: NaN in a result (a launch went to another stream than the thread's)"
        assert e[:, [0, 2]].max() <= 1e-6, f"thread {i}: axpy error {e[:, [0, 2]].max():.2e}"
        assert e[:, [1, 3]].max() <= 1e-5, f"thread {i}: softmax error {e[:, [1, 3]].max():.2e}"


# --------------------------------------------------------------------------------------------
# graph capture while other threads launch


def test_graph_capture_and_replay_with_out_while_other_threads_launch(artifact) -> None:
    pack = kp.load(artifact)
    ax, sm = pack["r29_axpy"], pack["r29_softmax"]
    n = 1 << 20
    gx, gy, gout = (torch.randn(n, device="cuda"), torch.randn(n, device="cuda"),
                    torch.empty(n, device="cuda"))
    gxs, gys = torch.randn(64, 1000, device="cuda"), torch.empty(64, 1000, device="cuda")
    for _ in range(3):  # warm: modules loaded, fast paths built, outside the capture
        ax(gx, gy, 2.0, out=gout)
        sm(gxs, 0.5, out=gys)
    n_others = 4
    others = []
    for i in range(n_others):
        shape = (3, 70000) if i % 2 else (64, 1000)
        x, y = torch.randn(50_000 + i, device="cuda"), torch.randn(50_000 + i, device="cuda")
        xs = torch.randn(shape, device="cuda")
        others.append((x, y, torch.empty_like(x), xs, torch.empty_like(xs), 1.0 + i))
    torch.cuda.synchronize()
    stop = threading.Event()
    running = threading.Barrier(n_others + 1, timeout=60)
    worst: dict = {}
    iterations: dict = {}

    def other(i: int) -> None:
        x, y, out, xs, out_sm, a = others[i]
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            ref, ref_sm = x * a + y, _softmax_ref(xs, 0.75)
            bad = torch.zeros((), dtype=torch.float64, device="cuda")
            k = 0
            while not stop.is_set() or k < 20:
                out.fill_(float("nan"))
                ax(x, y, a, out=out)
                out_sm.fill_(float("nan"))
                sm(xs, 0.75, out=out_sm)
                bad = torch.maximum(bad, torch.maximum(_err(out, ref), _err(out_sm, ref_sm)))
                k += 1
                if k == 5:
                    running.wait()
        stream.synchronize()
        worst[i], iterations[i] = float(bad), k

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=lambda i=i: _guard(other, i, worst), daemon=True)
               for i in range(n_others)]
    for t in threads:
        t.start()
    try:
        running.wait()  # every other thread is launching now
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=torch.cuda.Stream(), capture_error_mode="thread_local"):
            ax(gx, gy, 2.0, out=gout)
            sm(gxs, 0.5, out=gys)
        for trial in range(5):
            gx.normal_()
            gy.normal_()
            gxs.normal_()
            gout.fill_(float("nan"))
            gys.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert float(_err(gout, gx * 2.0 + gy)) <= 1e-6, f"replay {trial}: axpy"
            assert float(_err(gys, _softmax_ref(gxs, 0.5))) <= 1e-5, f"replay {trial}: softmax"
    finally:
        stop.set()
        sys.setswitchinterval(old)
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads), "a launching thread did not finish"
    for i in range(n_others):
        assert isinstance(worst.get(i), float), f"thread {i}: {worst.get(i)!r}"
        assert worst[i] <= 1e-5 and not np.isnan(worst[i]), \
            f"thread {i}: error {worst[i]} over {iterations.get(i)} iterations"
    # The graph holds the capturing thread's launches only: replaying it leaves the others'
    # outputs alone.
    for _, _, out, _, out_sm, _ in others:
        out.fill_(7.0)
        out_sm.fill_(7.0)
    g.replay()
    torch.cuda.synchronize()
    for i, (_, _, out, _, out_sm, _) in enumerate(others):
        assert bool((out == 7.0).all()) and bool((out_sm == 7.0).all()), \
            f"replaying the graph wrote thread {i}'s outputs: its launch was captured"


def _guard(fn, i: int, into: dict) -> None:
    try:
        fn(i)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        into[i] = f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------
# memory over many calls; a pack dropped and loaded again


def test_gpu_memory_is_flat_over_5000_calls(artifact) -> None:
    pack = kp.load(artifact)
    ax, sm = pack["r29_axpy"], pack["r29_softmax"]
    x, y = torch.randn(1 << 16, device="cuda"), torch.randn(1 << 16, device="cuda")
    out = torch.empty_like(x)
    xs, xl = torch.randn(64, 1000, device="cuda"), torch.randn(3, 70000, device="cuda")

    def round_() -> None:
        z = ax(x, y, 1.5)
        ax(x, y, 1.5, out=out)
        w = sm(xs, 0.5)
        v = sm(xl, 0.5)  # the split variant: scratch on every call
        del z, w, v

    for _ in range(50):
        round_()
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    allocated, free = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    for _ in range(1250):  # 5,000 calls
        round_()
    torch.cuda.synchronize()
    gc.collect()
    grown = torch.cuda.memory_allocated() - allocated
    assert grown <= 1 << 20, f"torch's allocated memory grew by {grown} bytes over 5,000 calls"
    torch.cuda.empty_cache()
    lost = free - torch.cuda.mem_get_info()[0]
    assert lost <= 64 << 20, f"the driver's free memory fell by {lost >> 20} MiB over 5,000 calls"
    assert float(_err(ax(x, y, 1.5), x * 1.5 + y)) <= 1e-6
    assert float(_err(sm(xl, 0.5), _softmax_ref(xl, 0.5))) <= 1e-5

    # kernelpack's own buffers (an array that is no framework's): cuMemAlloc / cuMemFree
    cx, cy = _CAI(x), _CAI(y)
    for _ in range(20):
        del_me = ax(cx, cy, 1.0)
        del del_me
    gc.collect()
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    for _ in range(1000):
        buf = ax(cx, cy, 1.0)
        del buf
    gc.collect()
    torch.cuda.synchronize()
    lost = free - torch.cuda.mem_get_info()[0]
    assert lost <= 32 << 20, f"{lost >> 20} MiB of device memory not given back after 1,000 " \
                             f"dropped kernelpack buffers"


def test_a_dropped_pack_is_collected_and_loads_again(artifact) -> None:
    x, y = torch.randn(100_000, device="cuda"), torch.randn(100_000, device="cuda")
    xl = torch.randn(3, 70000, device="cuda")
    frees = []
    for cycle in range(6):
        pack = kp.load(artifact)
        for _ in range(3):  # warm: the C fast path is built and used
            z = pack["r29_axpy"](x, y, 2.0)
            w = pack["r29_softmax"](xl, 0.5)
        assert float(_err(z, x * 2.0 + y)) <= 1e-6, f"cycle {cycle}: axpy"
        assert float(_err(w, _softmax_ref(xl, 0.5))) <= 1e-5, f"cycle {cycle}: softmax"
        watch = weakref.ref(pack)
        del pack, z, w
        gc.collect()
        assert watch() is None, f"cycle {cycle}: something still holds the dropped pack"
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        frees.append(torch.cuda.mem_get_info()[0])
    lost = frees[1] - frees[-1]
    assert lost <= 16 << 20, f"{lost >> 20} MiB of device memory lost over 4 load/drop cycles"


# --------------------------------------------------------------------------------------------
# fresh processes: threads that each load the pack, warmup from threads, fork

CHILD = r'''
import json, os, signal, sys, threading, traceback
import torch
import kernelpack as kp

path, mode = sys.argv[1], sys.argv[2]


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max()) / max(float(ref.abs().max()), 1e-300)


def sm_ref(x, s):
    return torch.softmax(x.double() * s, dim=1)


def run_threads(n, fn):
    errors = []

    def guarded(i):
        try:
            fn(i)
        except BaseException as exc:
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    ts = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if any(t.is_alive() for t in ts):
        errors.append("a thread did not finish within 120 s")
    return errors


def inputs(n):
    data = {}
    for i in range(n):
        x = torch.randn(50_000 + i, device="cuda")
        y = torch.randn(50_000 + i, device="cuda")
        xs = torch.randn((3, 70000) if i % 2 else (64, 1000), device="cuda")
        data[i] = (x, y, xs)
    torch.cuda.synchronize()
    return data


def calls(pack, i, x, y, xs, times):
    worst = 0.0
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(times):
            z = pack["r29_axpy"](x, y, 2.0)
            w = pack["r29_softmax"](xs, 0.5)
            worst = max(worst, rel(z, x * 2.0 + y), rel(w, sm_ref(xs, 0.5)) / 10)
    stream.synchronize()
    assert worst <= 1e-6, f"thread {i}: error {worst}"


def each_loads():
    """Eight threads, each its own kp.load of the file, first calls at once."""
    data = inputs(8)
    barrier = threading.Barrier(8, timeout=60)

    def fn(i):
        barrier.wait()
        pack = kp.load(path)
        calls(pack, i, *data[i], 5)

    errors = run_threads(8, fn)
    assert not errors, errors
    return "ok"


def warmup_threads():
    """Four threads run pack.warmup() while eight make their first calls (fresh process)."""
    pack = kp.load(path)
    data = inputs(8)
    barrier = threading.Barrier(12, timeout=60)

    def fn(i):
        barrier.wait()
        if i >= 8:
            pack.warmup()
        else:
            calls(pack, i, *data[i], 3)

    errors = run_threads(12, fn)
    assert not errors, errors
    pack.warmup()  # once more, after everything is loaded: harmless
    calls(pack, 0, *data[0], 1)
    return "ok"


class CAI:
    def __init__(self, t):
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def wait_child(pid):
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}" + (
            " (SIGALRM: it hung)" if os.WTERMSIG(status) == signal.SIGALRM else "")
    return os.WEXITSTATUS(status)


def fork():
    out = {}
    pack = kp.load(path)
    pack["r29_axpy"].plan(x=(10,), y=(10,), a=1.0)
    # 1. fork before any CUDA use: the child initializes CUDA itself and launches
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        code = 3
        try:
            x, y = torch.ones(1000, device="cuda"), torch.ones(1000, device="cuda")
            z = pack["r29_axpy"](x, y, 2.0)
            code = 0 if bool((z == 3.0).all()) else 4
        except BaseException:
            traceback.print_exc()
            code = 5
        os._exit(code)
    out["before_cuda"] = wait_child(pid)
    # 2. use CUDA in the parent (a launch), then fork: each launch in the child is a DeviceError
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    out["parent"] = rel(pack["r29_axpy"](x, y, 2.0), x * 2.0 + y)
    torch.cuda.synchronize()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        os.close(read)

        def attempt(label, fn):
            try:
                fn()
                text = "launched"
            except BaseException as exc:
                text = f"{type(exc).__name__}: {exc}"
            os.write(write, (json.dumps([label, text]) + "\n").encode())

        attempt("array", lambda: pack["r29_axpy"](CAI(x), CAI(y), 2.0))
        attempt("fresh pack", lambda: kp.load(path)["r29_axpy"](CAI(x), CAI(y), 2.0))
        attempt("warmup", lambda: pack.warmup())
        attempt("torch", lambda: pack["r29_axpy"](x, y, 2.0))
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    out["after_cuda_status"] = wait_child(pid)
    out["after_cuda"] = dict(json.loads(line) for line in b"".join(chunks).decode().splitlines())
    out["parent_after"] = rel(pack["r29_axpy"](x, y, 3.0), x * 3.0 + y)
    return out


try:
    detail = globals()[mode]()
    torch.cuda.synchronize()
    print(json.dumps({"ok": True, "detail": detail}))
except BaseException as exc:
    print(json.dumps({"ok": False, "detail": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc()[-3000:]}))
'''

CHILD_MODES = ["each_loads", "warmup_threads", "fork"]


@pytest.fixture(scope="module")
def child_results(artifact) -> dict:
    """Every mode at once, each in its own process (and CUDA context)."""
    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = {m: subprocess.Popen([sys.executable, "-c", CHILD, str(artifact), m],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env) for m in CHILD_MODES}
    results = {}
    for m, p in procs.items():
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results[m] = {"ok": False, "detail": "timed out after 180 s (a hang)",
                          "stderr": err[-3000:]}
            continue
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            results[m] = {"ok": False, "detail": f"exit code {p.returncode}",
                          "stderr": err[-3000:]}
        else:
            results[m] = json.loads(lines[-1])
            results[m]["stderr"] = err[-2000:]
    return results


def _child(child_results: dict, mode: str):
    r = child_results[mode]
    assert r["ok"], f"{mode}: {r['detail']}\n{r.get('trace', '')}\n{r.get('stderr', '')}"
    return r["detail"]


def test_threads_that_each_load_the_pack_in_a_fresh_process(child_results) -> None:
    assert _child(child_results, "each_loads") == "ok"


def test_warmup_from_several_threads_during_first_calls(child_results) -> None:
    assert _child(child_results, "warmup_threads") == "ok"


def test_fork_before_and_after_cuda_use(child_results) -> None:
    d = _child(child_results, "fork")
    assert d["before_cuda"] == 0, f"a child forked before any CUDA use: {d['before_cuda']}"
    assert d["parent"] <= 1e-6
    assert d["after_cuda_status"] == 0, f"the child forked after CUDA use: " \
                                        f"{d['after_cuda_status']} ({d['after_cuda']})"
    after = d["after_cuda"]
    assert set(after) == {"array", "fresh pack", "warmup", "torch"}, after
    for label in ("array", "fresh pack", "warmup"):
        assert after[label].startswith("DeviceError") and "fork" in after[label], \
            (label, after[label])
    # torch tensors: kernelpack's DeviceError, or torch's own refusal of CUDA in a forked child
    assert after["torch"].startswith("DeviceError") or (
        after["torch"].startswith("RuntimeError") and "fork" in after["torch"]), after["torch"]
    assert d["parent_after"] <= 1e-6
