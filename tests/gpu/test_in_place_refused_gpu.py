"""In-place use that a later kernel would undo, on the device: ``x * 2, x.sum(0)`` compiles to
a pointwise kernel and then a column sum, so ``out=(x, s)`` made the second kernel sum the
doubled ``x`` (before session 37: ``s`` twice the column sums, no error; sessions 37-38: a
``LaunchError``). Since session 39 the call reads ``x`` from a copy and gives what separate
outputs give; in-place use of programs that read their input before storing (a softmax in every
schedule, a centring) still runs: tests/gpu/test_review28_runtime_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

from .torch_checks import NO_GPU as _NO_GPU, check, cuda, host, on_gpu, targets, torch

T = kp.Tensor


@kp.fusion
def s37_double_and_colsum(x: T[kp.f32, "n", "m"]):
    return x * 2, x.sum(0)


@kp.fusion
def s37_rowsum_and_double(x: T[kp.f32, "n", "m"]):
    return x.sum(1), x * 2


@kp.fusion
def s38_double_and_other_sum(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y.sum()


@pytest.fixture(scope="module")
def pack():
    fusions = (s37_double_and_colsum, s37_rowsum_and_double, s38_double_and_other_sum)
    return kp.load(kp.save([kp.compile(f, targets=targets(_NO_GPU)) for f in fusions]))


@on_gpu
@pytest.mark.parametrize("n, m", [(3, 5), (1000, 300), (64, 100000)])
def test_in_place_undone_by_a_later_kernel_reads_a_copy(pack, n, m):
    """``out=(x, s)``: the column sum would read the doubled ``x``; the call reads ``x`` from
    a copy (session 39; a LaunchError in sessions 37-38), by tuple or by name, and gives what
    separate outputs give. Called three times (the fast path hands such a call over)."""
    prog = pack["s37_double_and_colsum"]
    xh = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    for form in ("tuple", "dict", "tuple"):
        x, s = cuda(xh), torch.full((m,), float("nan"), device="cuda")
        got = prog(x, out=(x, s) if form == "tuple" else {"out0": x, "out1": s})
        assert got[0] is x and got[1] is s
        check(host(x), 2 * xh.astype(np.float64), 1e-6, f"x * 2 in place ({n}, {m})")
        check(host(s), xh.astype(np.float64).sum(0), 1e-5, f"x.sum(0) beside ({n}, {m})")
    x, s = cuda(xh), torch.full((m,), float("nan"), device="cuda")
    o = torch.empty_like(x)
    prog(x, out=(o, s))
    check(host(o), 2 * xh.astype(np.float64), 1e-6, f"x * 2 ({n}, {m})")
    check(host(s), xh.astype(np.float64).sum(0), 1e-5, f"x.sum(0) ({n}, {m})")
    np.testing.assert_array_equal(host(x), xh)


@on_gpu
@pytest.mark.parametrize("n, m", [(300, 70), (4, 200000)])
def test_in_place_stored_by_the_last_kernel_runs(pack, n, m):
    """The row sum's kernel runs first and stores only the sums; the pointwise kernel that
    stores ``x * 2`` runs last, reading each element before storing it: in place is fine."""
    prog = pack["s37_rowsum_and_double"]
    plan = prog.plan(x=(n, m))
    assert plan.launches[-1].kernel == "s37_rowsum_and_double_1_pointwise", plan
    xh = np.random.default_rng(n).standard_normal((n, m)).astype(np.float32)
    x, s = cuda(xh), torch.empty(n, device="cuda")
    assert prog(x, out=(s, x))[1] is x
    check(host(x), 2 * xh.astype(np.float64), 1e-6, f"x * 2 in place ({n}, {m})")
    check(host(s), xh.astype(np.float64).sum(1), 1e-5, f"x.sum(1) ({n}, {m})")


@on_gpu
@pytest.mark.parametrize("n", [5, 70000, 3000001])
def test_in_place_beside_kernels_that_never_read_the_input_runs(pack, n):
    """Session 38: each kernel takes only the arrays its code uses, so the sum's kernels are
    not given ``x`` and ``out=(x, s)`` is in-place use of the pointwise kernel alone (refused
    before, when every kernel took every input). Called three times: the first call plans on
    the general path, the later ones take the fast path."""
    prog = pack["s38_double_and_other_sum"]
    assert all("x" not in [a.name for a in launch.args if a.kind == "buffer"]
               for launch in prog.summary.variants[0].launches if "out1" in
               [a.name for a in launch.args])
    rng = np.random.default_rng(n)
    xh = rng.standard_normal(n).astype(np.float32)
    yh = rng.standard_normal(n).astype(np.float32)
    x, y, s = cuda(xh), cuda(yh), torch.empty((), device="cuda")
    want = xh.astype(np.float64)
    for call in range(3):
        got = prog(x, y, out=(x, s))
        assert got[0] is x and got[1] is s
        want = 2 * want
        check(host(x), want, 1e-6, f"x * 2 in place, call {call} (n={n})")
        check(host(s), np.array(yh.astype(np.float64).sum()), 1e-5, f"y.sum() (n={n})")


@kp.fusion
def s39_momentum_step(p: T[kp.f32, "n"], m: T[kp.f32, "n"], g: T[kp.f32, "n"], lr: kp.f32,
                      beta: kp.f32):
    m_new = beta * m + g
    return p - lr * m_new, m_new


@on_gpu
@pytest.mark.parametrize("n", [7, 100003])
def test_an_optimizer_step_updates_its_state_in_place(n):
    """The in-place use an optimizer or a simulation step makes: ``out=(p, m)`` over its own
    inputs. One pointwise kernel stores both: a LaunchError before session 39, copies of
    ``p`` and ``m`` in session 39, and since session 40 no copy (the kernel loads all it
    reads before storing: ``Launch.stores_after_loads``); every step must give what separate
    arrays give, on the general path and after the fast path was built."""
    prog = kp.load(kp.save([kp.compile(s39_momentum_step, targets=targets(_NO_GPU))]))[
        "s39_momentum_step"]
    assert len(prog.plan(p=(n,), m=(n,), g=(n,)).launches) == 1
    (launch,) = prog.summary.variants[0].launches
    assert launch.stores_after_loads and not launch.reads_elsewhere
    rng = np.random.default_rng(n)
    ph, mh = rng.standard_normal(n), rng.standard_normal(n)
    p, m = cuda(ph.astype(np.float32)), cuda(mh.astype(np.float32))
    want_p, want_m = host(p).astype(np.float64), host(m).astype(np.float64)
    for step in range(4):
        gh = rng.standard_normal(n).astype(np.float32)
        got = prog(p, m, cuda(gh), 0.01, 0.9, out=(p, m))
        assert got[0] is p and got[1] is m
        want_m = 0.9 * want_m + gh
        want_p = want_p - 0.01 * want_m
        check(host(m), want_m, 1e-5, f"m after step {step} (n={n})")
        check(host(p), want_p, 1e-5, f"p after step {step} (n={n})")


def _fast_call_of(call, framework: str):
    """The C FastCall serving ``framework``'s arrays, or None (a closure path). With torch
    and CuPy both imported the torch path comes first and hands other arrays to the CuPy path
    (fastpath.make_fast_path); each FastCall says which arrays it takes (``flavor``)."""
    while type(fc := getattr(call, "__self__", None)).__name__ == "FastCall":
        if fc.flavor == framework:
            return fc
        call = fc.hooks.slow
    return None


@on_gpu
@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_an_optimizer_step_with_two_out_arrays_takes_the_fast_path(framework):
    """Session 41: ``out=(p, m)`` (and separate ``out=`` arrays) no longer go to the general
    path every call: the C fast path checks each array and that no two share memory, and
    launches itself (counted by its ``fast_calls``); results as on the general path. Two
    ``out=`` arrays sharing memory still get the general path's error."""
    from kernelpack.errors import LaunchError
    from kernelpack.runtime.launcher import bind

    xp = torch if framework == "torch" else pytest.importorskip("cupy")
    n = 4099
    prog = kp.load(kp.save([kp.compile(s39_momentum_step, targets=targets(_NO_GPU))]))[
        "s39_momentum_step"]
    rng = np.random.default_rng(41)
    arr = (lambda a: cuda(a)) if framework == "torch" else (lambda a: xp.asarray(a))
    back = host if framework == "torch" else (lambda a: xp.asnumpy(a))
    p, m = arr(rng.standard_normal(n).astype(np.float32)), \
        arr(rng.standard_normal(n).astype(np.float32))
    want_p, want_m = back(p).astype(np.float64), back(m).astype(np.float64)
    gh = rng.standard_normal(n).astype(np.float32)
    g = arr(gh)
    for step in range(5):
        got = prog(p, m, g, 0.01, 0.9, out=(p, m))
        assert got[0] is p and got[1] is m
        want_m = 0.9 * want_m + gh
        want_p = want_p - 0.01 * want_m
    check(back(m), want_m, 1e-5, f"m after 5 steps ({framework})")
    check(back(p), want_p, 1e-5, f"p after 5 steps ({framework})")
    fast = _fast_call_of(bind(prog).call, framework)
    if fast is not None:
        before = fast.fast_calls
        p2, m2 = arr(np.zeros(n, np.float32)), arr(np.zeros(n, np.float32))
        prog(p, m, g, 0.01, 0.9, out=(p2, m2))
        prog(p, m, g, 0.01, 0.9, out=(p, m))
        assert fast.fast_calls == before + 2, (framework, fast.fast_calls, before)
        with pytest.raises(LaunchError, match="overlap in memory"):
            prog(p, m, g, 0.01, 0.9, out=(p2, p2))
        assert fast.fast_calls == before + 2


@kp.fusion
def s40_gram(x: T[kp.f32, "n", "k"]):
    return (x[:, None, :] * x[None, :, :]).sum(-1)


@kp.fusion
def s40_at_b(a: T[kp.f32, "k", "n"], b: T[kp.f32, "k", "m"]):
    return (a[:, :, None] * b[:, None, :]).sum(0)


@on_gpu
@pytest.mark.parametrize("n", [3, 40, 300])
def test_a_contraction_over_its_input_reads_a_copy(n):
    """Review 54's gap, closed in session 40: ``x @ x.T`` (one kernel reading rows ``i`` and
    ``j`` of ``x`` for ``out[i, j]``) and ``a.T @ b`` with the output over their input ran in
    place and gave wrong results. Each launch now names what it reads elsewhere
    (``Launch.reads_elsewhere``, format 1.1) and the call reads that input from a copy."""
    pack = kp.load(kp.save([kp.compile(f, targets=targets(_NO_GPU)) for f in (s40_gram,
                                                                               s40_at_b)]))
    assert pack.format_version == (1, 1)
    rng = np.random.default_rng(n)
    xh = rng.standard_normal((n, n)).astype(np.float32)
    want = xh.astype(np.float64) @ xh.T.astype(np.float64)
    for call in range(3):
        x = cuda(xh)
        assert pack["s40_gram"](x, out=x) is x
        check(host(x), want, 1e-5, f"x @ x.T over x, call {call} (n={n})")
    ah = rng.standard_normal((n, n)).astype(np.float32)
    want = ah.T.astype(np.float64) @ xh.astype(np.float64)
    for over in ("a", "b"):
        a, b = cuda(ah), cuda(xh)
        out = a if over == "a" else b
        assert pack["s40_at_b"](a, b, out=out) is out
        check(host(out), want, 1e-5, f"a.T @ b over {over} (n={n})")


@kp.fusion
def s40_double_beside(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, kp.exp(y) / (y + 3)


@on_gpu
@pytest.mark.parametrize("n", [5, 4099, 3000001])
def test_an_output_over_what_only_the_other_output_reads(n):
    """``out=(y, x)``: out0 = x * 2 is stored over ``y``, which only out1 reads, so nothing
    in out0's value orders its store after the load of ``y``. The kernel loads every element
    first (kernels._vectors, kernels._store_outputs) with plain, ordered ``ld.global``, so
    the device keeps that order: run in place (no copy since session 40) and right, in the
    16-byte groups and in the element loop after them (n = 4099 leaves 3)."""
    prog = kp.load(kp.save([kp.compile(s40_double_beside, targets=targets(_NO_GPU))]))[
        "s40_double_beside"]
    rng = np.random.default_rng(n)
    xh, yh = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    for call in range(3):
        x, y = cuda(xh), cuda(yh)
        got = prog(x, y, out=(y, x))
        assert got[0] is y and got[1] is x
        check(host(y), 2 * xh.astype(np.float64), 1e-6, f"x * 2 over y, call {call} (n={n})")
        y64 = yh.astype(np.float64)
        check(host(x), np.exp(y64) / (y64 + 3), 1e-5, f"exp(y) / (y + 3) over x (n={n})")
