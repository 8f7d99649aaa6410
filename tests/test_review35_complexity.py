"""Review 35: algorithmic complexity and resource exhaustion (black box, CPU only).

Each test feeds kernelpack a large or adversarial-but-valid input and checks that the cost
stays where the documentation puts it: linear work (measured as a doubling ratio of this
process's CPU time, which other processes on a shared machine barely move), bounded memory,
and a kernelpack error (naming the parameter) rather than a RecursionError, an int-to-str
``ValueError`` or a refusal that takes minutes.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import time

import pytest

import kernelpack as kp

FAKE_CUBIN = b"\x7fELF" + bytes(range(100))


# ----------------------------------------------------------------------------------- helpers

def _cpu(fn, repeat: int = 1) -> float:
    """Best CPU time of ``fn`` over ``repeat`` runs (process time: robust to other load),
    the collector off meanwhile (its full passes grow with the heap, not with ``fn``)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        finally:
            gc.enable()
    return best


def _one_launch_program(name: str, module: str, image_seed: int) -> kp.Compiled:
    s = kp.KernelSummary(
        name, (kp.Tensor("x", kp.f32, ("n",)),),
        (kp.Variant((kp.Launch("k", module, (kp.cdiv("n", 128),), (128,),
                               (kp.Arg.buffer("x"),)),)),))
    data = FAKE_CUBIN + image_seed.to_bytes(4, "little")
    return kp.Compiled(s, (kp.Module(module, ("k",), (kp.Image("cubin", "sm_80", data, "t",
                                                               12080),)),))


def _wide_shared_expr(leaves: int) -> kp.Expr:
    """A balanced max-tree over ``leaves`` distinct leaves: ~4 nodes per leaf, depth ~log2."""
    s = [kp.sym(f"s{j}") for j in range(8)]
    layer = [s[i % 8] * (i + 2) + s[(i * 3 + 1) % 8] for i in range(leaves)]
    while len(layer) > 1:
        layer = [kp.emax(layer[i], layer[i + 1]) if i + 1 < len(layer) else layer[i]
                 for i in range(0, len(layer), 2)]
    return layer[0]


def _many_launches_reading(e: kp.Expr, launches: int) -> kp.Compiled:
    """One variant of ``launches`` launches whose grid each reads the shared expression."""
    params = (kp.Tensor("x", kp.f32, ("n",)),) + tuple(kp.Scalar(f"s{j}", kp.i32)
                                                       for j in range(8))
    ls = tuple(kp.Launch("k", "m", (kp.emin(e + i, 1000),), (128,), (kp.Arg.buffer("x"),))
               for i in range(launches))
    s = kp.KernelSummary("wide", params, (kp.Variant(ls),))
    return kp.Compiled(s, (kp.Module("m", ("k",), (kp.Image("cubin", "sm_80", FAKE_CUBIN, "t",
                                                            12080),)),))


def _run_forked(fn, timeout_s: float) -> tuple[str, float]:
    """Run ``fn()`` in a forked child; return (outcome text, wall seconds) or ("TIMEOUT", t).

    The child is the only process this kills (by its pid), and it is always reaped.
    """
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            try:
                fn()
                out = "returned"
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = f"{type(exc).__name__}: {exc}"
            os.write(w, out.encode("utf-8", "replace")[:4000])
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], timeout_s)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return "TIMEOUT", time.perf_counter() - t0
        chunks = []
        while True:
            b = os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks).decode(), time.perf_counter() - t0
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def _repeated_launch_program() -> kp.Compiled:
    """A launch repeated ``c`` times (FORMAT.md §7: up to 2^20 launches in a plan)."""
    s = kp.KernelSummary(
        "rep", (kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("c", kp.i32)),
        (kp.Variant((kp.Launch("k", "m", (kp.cdiv("n", kp.sym("s") + 1),), (128,),
                               (kp.Arg.buffer("x"), kp.Arg.of(kp.sym("s"), kp.i32)),
                               count="c", loop="s"),)),))
    return kp.Compiled(s, (kp.Module("m", ("k",), (kp.Image("cubin", "sm_80", FAKE_CUBIN, "t",
                                                            12080),)),))


# ------------------------------------------------------------------------------ findings

def test_save_refuses_expr_work_overflow_without_quadratic_rework():
    """FORMAT.md §3.8/§6: MAX_EXPR_WORK (2^20 nodes) exists so that checking a summary whose
    fields share one large expression is not quadratic. A summary over the limit must be
    refused in about the time it takes to read the limit's worth of nodes. kp.save instead
    re-emits every field on its own before refusing: 64 launches reading a 65k-node shared
    expression took 39 s to refuse (8 launches saved in 1.3 s), growing with every field."""
    e = _wide_shared_expr(4096)                      # ~16k distinct nodes, depth 13
    ok = _many_launches_reading(e, 32)               # ~0.5M node reads: under the limit
    t_ok = _cpu(lambda: kp.save([ok]))
    over = _many_launches_reading(e, 256)            # ~4M node reads: 4x over the limit
    # wall time in a busy suite (two pytest runs on two cores once timed out at 7.4 s when a
    # quiet run takes ~2 s): generous, since the bug took minutes
    budget = min(30.0, max(15.0, 10 * t_ok))
    outcome, wall = _run_forked(lambda: kp.save([over]), budget)
    assert outcome != "TIMEOUT", (
        f"kp.save of 256 launches sharing one ~16k-node expression (4x MAX_EXPR_WORK) was "
        f"still working after {wall:.1f} s; the same summary with 32 launches saves in "
        f"{t_ok:.2f} s CPU: the refusal does per-field work instead of stopping at the limit")
    assert outcome.startswith("ValueError") and "MAX_EXPR_WORK" in outcome, outcome


def test_plan_cache_does_not_retain_hundreds_of_megabytes():
    """A program caches its recent plans (repeated shapes plan in < 1 us). The cache is
    bounded by a count (256 plans) but not by size, and a plan may hold up to 2^20 launches
    (~350 B each): 12 distinct shapes of a 2^18-launch program kept 1 GB alive after the
    caller dropped every plan (256 such plans: ~90 GB). Dropped plans must not stay alive
    beyond a modest bound: here at most 2^17 launches (~45 MB) in all."""
    prog = kp.load(kp.save([_repeated_launch_program()]))["rep"]
    first = prog.plan(x=(1000,), c=4)
    launch_type = type(first.launches[0])
    del first
    per_plan = 1 << 14
    for i in range(24):                                   # 24 x 16384 = 393k launches
        prog.plan(x=(1000 + i,), c=per_plan)
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is launch_type)
    assert alive <= 1 << 17, (
        f"{alive} PlannedLaunch objects (~{alive * 350 >> 20} MB) stay alive after 24 plans "
        f"of {per_plan} launches were dropped by the caller: the plan cache keeps big plans")


HUGE = 10 ** 5000          # more than Python's 4300-digit int<->str conversion limit


def _plan_with(**kw):
    s = kp.KernelSummary(
        "p", (kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("m", kp.i32)),
        (kp.Variant((kp.Launch("k", "mod", (kp.cdiv("n", 128),), (128,),
                               (kp.Arg.buffer("x"), kp.Arg.scalar("m"))),)),))
    c = kp.Compiled(s, (kp.Module("mod", ("k",), (kp.Image("cubin", "sm_80", FAKE_CUBIN, "t",
                                                            12080),)),))
    return lambda: kp.load(kp.save([c]))["p"].plan(**kw)


def _static_huge():
    @kp.fusion
    def huge_static(x: kp.Tensor[kp.f32, "n"]):
        return x + 1
    return lambda: huge_static.trace(static={"n": HUGE})


def _env_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELPACK_CACHE_MAX_BYTES", "9" * 5000)
    return lambda: kp.Cache(path=tmp_path / "c", remote=False)


HUGE_CASES = {
    # id: (factory(tmp_path, monkeypatch) -> callable, names it must mention, exc types)
    "plan-scalar-huge": (lambda t, m: _plan_with(x=(4,), m=HUGE), ("scalar m",),
                         (kp.ConstraintError,)),
    "plan-dim-negative-huge": (lambda t, m: _plan_with(x=(-HUGE,), m=1), ("x.shape[0]",),
                               (kp.ConstraintError,)),
    "fusion-static-huge": (lambda t, m: _static_huge(), ("static['n']",),
                           (ValueError, kp.KernelPackError)),
    "cache-timeout_s-huge": (lambda t, m: (lambda: kp.Cache(path=t / "c", remote=False,
                                                            timeout_s=10 ** 400)),
                             ("timeout_s",), (ValueError, TypeError)),
    "cache-wait_s-huge": (lambda t, m: (lambda: kp.Cache(path=t / "c", remote=False,
                                                         wait_s=10 ** 400)),
                          ("wait_s",), (ValueError, TypeError)),
    "cache-max_entry_bytes-neg-huge": (lambda t, m: (lambda: kp.Cache(
        path=t / "c", remote=False, max_entry_bytes=-HUGE)), ("max_entry_bytes",),
        (ValueError, TypeError)),
    "cache-prune-huge": (lambda t, m: (lambda: kp.Cache(path=t / "c", remote=False)
                                       .prune(-HUGE)), ("max_bytes",), (ValueError, TypeError)),
    "env-KERNELPACK_CACHE_MAX_BYTES-huge": (_env_cache, ("KERNELPACK_CACHE_MAX_BYTES",),
                                            (ValueError,)),
}


@pytest.mark.parametrize("case", sorted(HUGE_CASES), ids=sorted(HUGE_CASES))
def test_huge_integers_get_an_error_naming_the_parameter(case, tmp_path, monkeypatch):
    """Huge Python ints must give the documented error naming what is wrong, as
    plan(x=(10**5000,)) already does ("x.shape[0] is an integer of 16610 bits, outside
    int64"). Elsewhere the error path formats the int and dies in Python's int->str limit
    ("Exceeds the limit (4300 digits) for integer string conversion", naming nothing), or a
    float conversion raises OverflowError where kp.Cache documents "every number is checked
    here: TypeError/ValueError naming the parameter"; kernelpack/config.py's variables
    promise "a ValueError naming the variable"."""
    factory, names, types = HUGE_CASES[case]
    call = factory(tmp_path, monkeypatch)
    with pytest.raises(BaseException) as info:
        call()
    exc = info.value
    msg = str(exc)
    assert isinstance(exc, types) and "integer string conversion" not in msg, (
        f"{type(exc).__name__}: {msg[:200]}")
    assert any(n in msg for n in names), f"message names none of {names}: {msg[:200]}"
    assert len(msg) < 2000, f"message of {len(msg)} characters"


def test_arange_of_a_deep_size_is_a_clean_error_not_recursion():
    """A size nested deeper than the format allows (256) is refused with a ValueError naming
    the limit when it reaches kp.save through kp.iota or kp.pad. Through kp.arange the
    trace itself dies with RecursionError (ops.nonneg walks the size recursively)."""
    @kp.fusion
    def deep_arange(x: kp.Tensor[kp.f32, "n"]):
        m = x.shape[0]
        for _ in range(128):              # depth 384: past MAX_EXPR_DEPTH, no overflow
            m = (m * 2 + 1) // 3
        return kp.arange(m)

    with pytest.raises(BaseException) as info:
        kp.save([kp.compile(deep_arange, targets=["sm_80"])])
    exc = info.value
    assert not isinstance(exc, RecursionError), "RecursionError from kp.arange's trace"
    assert isinstance(exc, (kp.KernelPackError, ValueError)), f"{type(exc).__name__}: {exc}"
    assert "256" in str(exc), str(exc)[:300]


def test_substitute_of_a_long_sum_does_not_hit_the_recursion_limit():
    """Expr.substitute ("each node is rebuilt once") recursed: n + s0 + ... + s499 (a sum
    of 500 symbols, nested 500 deep as a chain) raised RecursionError, while evaluate() on
    the same expression raises ExpressionError naming MAX_EXPR_DEPTH. Either a result or a
    kernelpack error is fine; a RecursionError is not."""
    e = kp.sym("n")
    for i in range(500):
        e = e + kp.sym(f"s{i}")
    with pytest.raises(kp.ExpressionError):
        e.evaluate({"n": 1, **{f"s{i}": 1 for i in range(500)}})
    try:
        out = e.substitute({"n": 2})
    except (kp.KernelPackError, ValueError):
        return
    except RecursionError:
        pytest.fail("Expr.substitute raised RecursionError on a 500-term sum")
    assert out.symbols() == {f"s{i}" for i in range(500)}


def test_rank_error_message_is_bounded():
    """Passing data where a shape belongs (plan(x=list_of_values)) is a RankError; its
    message printed the whole 'shape': 7.9 MB for a million values. An error message must
    name the parameter and the ranks, not copy the input."""
    prog = kp.load(kp.save([_one_launch_program("r", "rm", 1)]))["r"]
    with pytest.raises(kp.RankError) as info:
        prog.plan(x=list(range(200_000)))
    msg = str(info.value)
    assert "x" in msg and "200000" in msg
    assert len(msg) < 4096, f"RankError message of {len(msg)} characters"


# ------------------------------------------------------------------- regression (right now)

def test_load_verify_plan_scale_linearly_with_programs():
    """kp.load + Pack.verify + planning every program of 1000 vs 2000 programs: about
    twice the CPU time (a quadratic lookup would give ~4)."""
    def build(n):
        return kp.save([_one_launch_program(f"p{i:05d}", f"m{i:05d}", i) for i in range(n)])

    small, big = build(1000), build(2000)

    def run(data):
        def go():
            pack = kp.load(data)
            pack.verify()
            for name in pack.programs:
                pack[name].plan(x=(100,))
        return go

    run(small)()                                             # warm imports and caches
    t1 = _cpu(run(small), repeat=2)
    t2 = _cpu(run(big), repeat=2)
    assert t2 / t1 < 3.2, f"1000 programs {t1:.3f} s, 2000 programs {t2:.3f} s"


def test_shared_dag_expressions_stay_linear_end_to_end():
    """e = max(e + m, e * 2), 60 times: a DAG of ~180 nodes whose tree has 2^60 paths.
    Every operation (text, symbols, substitute, pickle, save, load, summary, plan) must
    walk each node once."""
    n, m = kp.sym("n"), kp.sym("m")
    e = n
    for _ in range(60):
        e = kp.emax(e + m, e * 2)
    t0 = time.process_time()
    str(e), e.symbols(), e.substitute({"m": 3}), pickle.loads(pickle.dumps(e))
    assert e.substitute({"m": 3}).symbols() == {"n"}
    s = kp.KernelSummary(
        "dag", (kp.Tensor("x", kp.f32, ("n",)), kp.Scalar("m", kp.i32)),
        (kp.Variant((kp.Launch("k", "mod", (kp.emin(e, 1000),), (128,),
                               (kp.Arg.buffer("x"),)),)),))
    c = kp.Compiled(s, (kp.Module("mod", ("k",), (kp.Image("cubin", "sm_80", FAKE_CUBIN, "t",
                                                            12080),)),))
    prog = kp.load(kp.save([c]))["dag"]
    assert prog.summary.name == "dag"
    assert prog.plan(x=(0,), m=0).launches[0].grid == (0, 1, 1)
    assert prog.plan(x=(1,), m=1).launches[0].grid == (1000, 1, 1)     # e is ~2^60
    assert time.process_time() - t0 < 5.0


def test_fusion_trace_and_key_scale_linearly_with_ops():
    """Tracing a chain of pointwise ops and computing its canonical bytes (the cache key's
    source): 4000 vs 8000 ops cost about twice as much."""
    def chain(n_ops):
        def f(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"]):
            z = x
            for _ in range(n_ops):
                z = z * 1.0001 + y
            return z
        f.__name__ = f"chain_{n_ops}"
        return kp.fusion(f)

    def cost(n_ops):
        fusion = chain(n_ops)
        return _cpu(lambda: fusion.canonical_bytes(graph=fusion.trace()), repeat=2)

    cost(500)                                                # warm
    t1, t2 = cost(4000), cost(8000)
    assert t2 / t1 < 3.2, f"4000 ops {t1:.3f} s, 8000 ops {t2:.3f} s"
