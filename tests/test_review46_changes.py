"""Review 46: attacks on the session's changes (``git diff d2c1ede..HEAD``).

1. Lowering: a row reduction read at another row (``d[None, :]`` of ``d = a.sum(-1)``) is
   computed into a workspace (``pipeline._row_read_elsewhere`` / ``_settle``,
   ``materialize.materialize_nodes``); row reductions below a general stage are workspaces
   too unless short and static (``materialize.SHORT_ROW``); ``schedule.plan``'s ``general``
   is keyed by output names.
2. Runtime: an ``inout`` argument partially overlapping another tensor argument, or two
   ``inout`` arguments sharing memory, is a LaunchError on every path
   (``execute.check_written_arguments``, ``fastpath.written_pairs``/``written_conflict``, the
   torch and CuPy closures, the C ``FastCall``'s ``pairs_from``/``written_conflict``).
3. Benchmarks: ``reads_elsewhere.py``, ``_compiles.now_and_before``, ``_cli.comparison_args``
   (``--dry-run`` only: no GPU here).

Checked on the CPU: summaries and plans (``Planner``), the SIMT emulator
(tests/lowering/simt.py) against NumPy, the fake driver (tests/runtime/fake_driver.py) with the
stand-in torch/CuPy of tests/runtime/test_fastpath_fake.py on the C fast path, the C path
through DLPack's exchange API and the Python closures.

Five bugs, all fixed the same session (materialize_rows looks at the stages still general
once the other workspaces are in place and leaves nested reductions to NESTED;
pipeline._settle probes every stage after the failing one before the one restart; out= is
checked against inout arguments for any shared byte, fastpath.WRITTEN_SPAN; pairs_from checks
each conversion); the tests below pin the fixes and what was checked and holds:

- the new row rule in ``materialize.materialize`` takes a row reduction whose stage is general
  only because it shares that stage with a column reduction that is materialized anyway:
  ``(x - x.mean(0, keepdims=True)).sum(-1)`` or ``x.sum(-1) + y.sum(0)`` now take an extra
  launch (a row kernel into a workspace, then a pointwise copy), where before the re-planned
  stage was one row kernel;
- the same rule makes ``materialize.NESTED = False`` a no-op for the cross-entropy it exists
  for (its docstring: "False gives the schedules from before, for benchmarks/losses.py"), so
  ``benchmarks/losses.py`` (``--dry-run`` and the GPU run alike) stops with "the two builds are
  identical";
- code generation is still quadratic in the number of stages whose reductions are read
  elsewhere: ``llvm_ir`` restarts the whole program after each stage's ``_settle`` (32 such
  stages: 1141 kernel emissions for 70 kernels, 5.5 s; 1.1 s before the session);
- ``out=`` the very same array as an ``inout`` argument is allowed on every path: two arrays
  the program writes share every byte, which the new rule refuses for two ``inout`` arguments;
- the C ``pairs_from`` keeps converting after a failed conversion: a malformed pair whose
  "both written" flag has a Python ``__bool__`` raises SystemError, not TypeError.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.errors import LaunchError

pytest.importorskip("llvmlite")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from lowering import simt  # noqa: E402  (tests/lowering/simt.py: the CPU emulator)
from kernelpack.lowering import materialize, pipeline  # noqa: E402
from kernelpack.planner import Planner  # noqa: E402
from kernelpack.runtime import call_program  # noqa: E402
from kernelpack.runtime.launcher import bind  # noqa: E402
from kernelpack.summary import (Arg, Compiled, KernelSummary, Launch, Module, Scalar,  # noqa: E402
                                Tensor as TensorSpec, Variant)

from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from kp_samples import fake_image  # noqa: E402
from test_fastpath_fake import (NDArray, Tensor, cupy, select_path,  # noqa: E402,F401
                                torch)
from test_launch_fake import _axpby_impl, axpby  # noqa: E402
from test_review8_dlpack_producers import Producer  # noqa: E402
from test_review9_outputs_fast import _array_view, _tensor_view  # noqa: E402

T = kp.Tensor


def _build(f, static=None) -> pipeline.Build:
    return pipeline.run(pipeline.new_build(f, ["sm_80"], static, {}), stop="llvm_ir")


def _summary(f, static=None) -> kp.KernelSummary:
    return pipeline.summarize(_build(f, static)).summary


def _launched(f, static=None, **shapes) -> tuple[list[str], list[str]]:
    """The kernels a plan for ``shapes`` launches (non-empty grids) and its scratch names."""
    plan = Planner(_summary(f, static)).plan(**shapes)
    return ([l.kernel for l in plan.launches if all(l.grid)],
            sorted(k for k, a in plan.allocations.items() if a.kind == "scratch"))


# ==== 1. lowering ==============================================================================

@kp.fusion
def softmax(x: T[kp.f32, "n", "m"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@kp.fusion
def layernorm(x: T[kp.f32, "n", "m"], w: T[kp.f32, "m"]):
    mu = x.mean(-1, keepdims=True)
    v = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * kp.rsqrt(v + 1e-5) * w


@kp.fusion
def row_sum(x: T[kp.f32, "n", "m"]):
    return x.sum(-1)


@kp.fusion
def softmax_beside_strided(x: T[kp.f32, "n", "m"], c: T[kp.f32, "p", "n", "q"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), c.sum(axis=(0, 2))


@pytest.mark.parametrize("shape", [(64, 1000), (4096, 4096), (100000, 64), (1, 1)])
def test_plain_row_programs_keep_their_single_fused_row_kernel(shape):
    """README: a softmax, a layernorm and a row sum are one row kernel each; neither the
    read-elsewhere workspaces nor the new row rule (which only looks below general stages)
    may add a launch or a workspace."""
    for f, shapes in ((softmax, {"x": shape}), (layernorm, {"x": shape, "w": shape[1:]}),
                      (row_sum, {"x": shape})):
        kernels, scratch = _launched(f, **shapes)
        assert len(kernels) == 1 and "_row" in kernels[0], (f.name, shape, kernels)
        assert not [s for s in scratch if "_m" in s], (f.name, scratch)


def test_a_softmax_beside_a_general_stage_keeps_its_row_kernel():
    """The softmax's stage is not below the general (0, 2) sum: no workspace for its row
    max/sum (the new row rule must not reach it)."""
    kernels, scratch = _launched(softmax_beside_strided, x=(256, 1000), c=(3, 256, 5))
    assert kernels[0].startswith("softmax_beside_strided_0_row"), kernels
    assert len(kernels) == 2 and scratch == [], (kernels, scratch)


@kp.fusion
def row_beside_strided(a: T[kp.f64, "n", "m"], c: T[kp.f64, "p", "n", "q"]):
    return a.sum(-1), c.sum(axis=(0, 2))


@pytest.mark.parametrize("m, workspace", [(1, False), (32, False), (33, True), (None, True)])
def test_short_row_boundary_with_static_dims(m, workspace):
    """``kp.compile(..., static=...)`` makes the row length a constant: up to SHORT_ROW = 32
    elements the row sum stays inline in the general stage, from 33 (or a dynamic length) it is
    a workspace of its own; the results agree with NumPy either way."""
    static = None if m is None else {"m": m}
    build = _build(row_beside_strided, static)
    assert bool(build.workspaces) is workspace, build.workspaces
    k = simt.Kernels(row_beside_strided, static)
    rng = np.random.default_rng(m or 7)
    for n, p, q in ((5, 2, 3), (1, 1, 1), (0, 2, 2), (4, 3, 0)):
        a, c = rng.random((n, m or 40)), rng.random((p, n, q))
        got_a, got_c = k(a, c)
        simt.assert_close(got_a, a.sum(-1), 1e-12, f"rows m={m} n={n}")
        simt.assert_close(got_c, c.sum(axis=(0, 2)), 1e-12, f"strided m={m} n={n}")


@kp.fusion
def int_elsewhere(a: T[kp.i64, "n", "n"]):
    d = a.sum(-1)
    return d, a * d[None, :] - d[:, None]


@kp.fusion
def c128_elsewhere(a: T[kp.c128, "n", "n"]):
    d = a.sum(-1)
    return a * d[None, :], d[:, None]


@kp.fusion
def int32_max_elsewhere(a: T[kp.i32, "n", "n"], c: T[kp.i32, "p", "n", "q"]):
    d = a.max(-1)
    return a - d[None, :], d.astype(kp.i64) + c.sum(axis=(0, 2))


@kp.fusion
def elsewhere_inside_general(a: T[kp.f64, "n", "m"], b: T[kp.f64, "n", "n"],
                             c: T[kp.f64, "p", "n", "q"]):
    d = a.sum(-1)
    e = (b * d[None, :]).sum(-1)
    return e * c.sum(axis=(0, 2)), d


@pytest.mark.parametrize("static", [None, {"n": 1}, {"n": 7}])
def test_outputs_that_are_the_materialized_reduction_integer_and_complex(static):
    """The reduction read elsewhere is itself an output (a copy of its workspace), beside its
    readers; int64 exact, complex128 to rounding; static n of 1 (a single row: no other row)
    and 7, and dynamic n with 0, 1 and 5 rows."""
    rng = np.random.default_rng(3)
    ki, kc = simt.Kernels(int_elsewhere, static), simt.Kernels(c128_elsewhere, static)
    for n in ((static["n"],) if static else (0, 1, 5)):
        a = rng.integers(-50, 50, (n, n)).astype(np.int64)
        got_d, got = ki(a)
        d = a.sum(-1)
        assert (got_d == d).all() and (got == a * d[None, :] - d[:, None]).all(), n
        z = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
        got, got_d = kc(z)
        dz = z.sum(-1)
        simt.assert_close(got, z * dz[None, :], 1e-12, f"c128 n={n}")
        simt.assert_close(got_d, dz[:, None], 1e-12, f"c128 d n={n}")


@pytest.mark.parametrize("static, dims", [(None, dict(n=4, p=2, q=0)),
                                          ({"n": 3}, dict(n=3, p=1, q=2))])
def test_int32_max_read_elsewhere_beside_a_general_stage(static, dims):
    rng = np.random.default_rng(5)
    a = rng.integers(-9, 9, (dims["n"], dims["n"])).astype(np.int32)
    c = rng.integers(-9, 9, (dims["p"], dims["n"], dims["q"])).astype(np.int32)
    got, got_s = simt.Kernels(int32_max_elsewhere, static)(a, c)
    d = a.max(-1)
    assert (got == a - d[None, :]).all()
    assert (got_s == d.astype(np.int64) + c.sum(axis=(0, 2))).all()


@pytest.mark.parametrize("static, n", [(None, 5), ({"m": 3}, 5), ({"m": 3, "n": 1}, 1)])
def test_a_read_elsewhere_below_a_general_stage(static, n):
    """``d`` read at other rows inside a row reduction ``e`` that a general stage reads: ``d``
    short and static (SHORT_ROW) or not; ``d`` also returned."""
    rng = np.random.default_rng(n)
    a, b, c = rng.random((n, 3)), rng.random((n, n)), rng.random((2, n, 3))
    got, got_d = simt.Kernels(elsewhere_inside_general, static)(a, b, c)
    d = a.sum(-1)
    simt.assert_close(got, (b * d[None, :]).sum(-1) * c.sum(axis=(0, 2)), 1e-12, "e")
    simt.assert_close(got_d, d, 1e-12, "d")


@kp.fusion
def centred_row_sums(x: T[kp.f32, "n", "m"]):
    """Row sums of column-centred data: the column mean is a workspace (broadcast), after
    which the stage is a plain row sum."""
    return (x - x.mean(0, keepdims=True)).sum(-1)


@kp.fusion
def row_plus_column(x: T[kp.f32, "n", "m"], y: T[kp.f32, "k", "n"]):
    return x.sum(-1) + y.sum(0)


_COLUMN_SHAPES = {centred_row_sums: {"x": (4096, 1024)},
                  row_plus_column: {"x": (64, 1000), "y": (50, 64)}}


@pytest.mark.parametrize("f", list(_COLUMN_SHAPES), ids=lambda f: f.name)
def test_column_siblings_of_a_row_sum_are_right(f):
    rng = np.random.default_rng(11)
    if f is centred_row_sums:
        x = rng.random((9, 5)).astype(np.float32)
        (got,) = simt.Kernels(f)(x)
        ref = (x.astype(np.float64) - x.astype(np.float64).mean(0, keepdims=True)).sum(-1)
        simt.assert_close(got, ref, 1e-5, "centred row sums")
    else:
        x, y = rng.random((6, 7)).astype(np.float32), rng.random((4, 6)).astype(np.float32)
        (got,) = simt.Kernels(f)(x, y)
        simt.assert_close(got, x.sum(-1, dtype=np.float64) + y.sum(0, dtype=np.float64), 1e-5,
                          "row plus column")


@pytest.mark.parametrize("f", list(_COLUMN_SHAPES), ids=lambda f: f.name)
def test_a_row_sum_beside_a_column_reduction_keeps_its_row_kernel(f):
    kernels, scratch = _launched(f, **_COLUMN_SHAPES[f])
    assert f"{f.name}_m1" not in scratch, scratch
    assert len(kernels) == 3 and "_row" in kernels[-1], kernels


sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from losses import cross_entropy  # noqa: E402 - the benchmark's own fusion


def test_nested_false_still_gives_the_old_cross_entropy_schedule(monkeypatch):
    now = _launched(cross_entropy, x=(256, 1000), t=(256,))
    monkeypatch.setattr(materialize, "NESTED", False)
    before = _launched(cross_entropy, x=(256, 1000), t=(256,))
    assert now != before, now


def _stages_reading_elsewhere(k: int) -> kp.Fusion:
    """``k`` outputs of ``k`` distinct shapes, each reading its own row sums at other rows:
    ``k`` stages, each found by the codegen (nothing is general before scheduling)."""
    params = ", ".join(f"a{i}: T[kp.f32, 'n{i}', 'n{i}']" for i in range(k))
    body = ", ".join(f"a{i} * a{i}.sum(-1)[None, :]" for i in range(k))
    ns: dict = {"kp": kp, "T": T}
    exec(f"def stages_{k}({params}):\n    return {body}\n", ns)
    return kp.fusion(ns[f"stages_{k}"])


def test_stages_reading_elsewhere_do_not_restart_code_generation_per_stage(emitted_kernels):
    emitted = emitted_kernels
    counts = []
    for k in (8, 16):
        emitted.clear()
        build = _build(_stages_reading_elsewhere(k))
        assert len(build.workspaces) == k
        assert len(emitted) <= 4 * len(build.kernels), (k, len(emitted), len(build.kernels))
        counts.append(len(emitted))
    assert counts[1] <= 2.2 * counts[0], counts  # linear (quadratic: ~4x)


def _benchmark(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "KERNELPACK_CACHE")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))


def test_reads_elsewhere_dry_run_builds_both_ways():
    done = _benchmark("reads_elsewhere.py", "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "now and before builds differ" in done.stdout


def test_losses_dry_run_builds_both_ways():
    done = _benchmark("losses.py", "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr


def test_comparison_args_defaults(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _cli
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["x.py", "--dry-run"])
    monkeypatch.setenv("OUT", "/tmp/somewhere")
    args = _cli.comparison_args("Doc.\n\nMore.", "stem")
    assert args.dry_run and not args.no_results and args.md == "/tmp/somewhere/stem.md"
    monkeypatch.setattr(sys, "argv", ["x.py", "--md", "f.md", "--no-results"])
    args = _cli.comparison_args(None, "stem")
    assert args.md == "f.md" and args.no_results and not args.dry_run
    monkeypatch.delenv("OUT")
    monkeypatch.setattr(sys, "argv", ["x.py"])
    assert _cli.comparison_args(None, "stem").md is None


def test_now_and_before_restores_the_switch_and_the_memo(tmp_path):
    """The 'before' build (general schedule) must not answer a later kp.compile of the same
    key (the memo is emptied around each), and the switch is put back even when the two
    builds are the same (SystemExit)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _compiles
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    @kp.fusion
    def sym_norm46(a: T[kp.f32, "n", "n"]):
        d = kp.rsqrt(a.sum(-1))
        return a * d[:, None] * d[None, :]

    now, before = _compiles.now_and_before(sym_norm46, materialize, "ROWS_READ_ELSEWHERE",
                                           "sm_80", tmp_path, "r46")
    assert materialize.ROWS_READ_ELSEWHERE is True
    assert "sym_norm46_m0" in now.plan(a=(64, 64)).allocations
    assert [l.kernel for l in before.plan(a=(64, 64)).launches] == ["sym_norm46_0_pointwise"]
    later = kp.compile(sym_norm46, targets=["sm_80"])
    assert any(w.name == "sym_norm46_m0" for v in later.summary.variants for w in v.scratch)
    with pytest.raises(SystemExit, match="identical"):
        _compiles.now_and_before(row_sum, materialize, "ROWS_READ_ELSEWHERE", "sm_80",
                                 tmp_path, "plain row sum")
    assert materialize.ROWS_READ_ELSEWHERE is True


@kp.fusion
def mixed46(a: T[kp.f32, "n", "n"], x: T[kp.f32, "n", "m"], y: T[kp.f32, "k", "n"],
            c: T[kp.f32, "p", "n", "q"]):
    """Up-front workspaces (column mean, the row rule), then one found by the codegen."""
    ca = a - a.mean(axis=0, keepdims=True)
    d = kp.rsqrt((ca * ca).sum(-1) + 1.0)
    return d, ca * d[:, None] * d[None, :], x.sum(-1) + y.sum(0), x.max(-1) * c.sum(axis=(0, 2))


_DIGEST = ("import hashlib, sys\nsys.path.insert(0, {tests!r})\n"
           "from test_review46_changes import mixed46\nimport kernelpack as kp\n"
           "from kernelpack.lowering import pipeline\n"
           "c = pipeline.compile_traced(mixed46, None, ['sm_80'], None, {{}})\n"
           "print(hashlib.sha256(kp.save([c])).hexdigest())\n")


def test_compiles_are_deterministic():
    """Same fusion compiled twice (the lowering itself, no memo) and in another process with
    another hash seed: identical kp.save bytes."""
    digests = [hashlib.sha256(kp.save([pipeline.compile_traced(mixed46, None, ["sm_80"], None,
                                                                {})])).hexdigest()
               for _ in range(2)]
    env = dict(os.environ, PYTHONHASHSEED="4646")
    env.pop("KERNELPACK_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _DIGEST.format(tests=str(ROOT / "tests"))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert digests[0] == digests[1] == done.stdout.strip()


# ==== 2. runtime: inout arguments ==============================================================

def _f32(addr: int, n: int) -> list:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(addr, 4 * n)))


def _acc_impl(grid, block, shmem, v) -> None:
    """``y += x; z = 2 * y``."""
    x, y, z, n = v
    ys = [p + q for p, q in zip(_f32(x, n), _f32(y, n))]
    ctypes.memmove(y, struct.pack(f"<{n}f", *ys), 4 * n)
    ctypes.memmove(z, struct.pack(f"<{n}f", *[2 * q for q in ys]), 4 * n)


def acc() -> Compiled:
    """x read, y written (inout), z an output."""
    s = KernelSummary("acc", (TensorSpec("x", kp.f32, ("n",)),
                              TensorSpec("y", kp.f32, ("n",), role="inout"),
                              TensorSpec("z", kp.f32, ("n",), role="out"),
                              Scalar("n32", kp.u32, value="n")),
                      (Variant((Launch("acc", "acc", (kp.cdiv("n", 256),), (256,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.buffer("z"),
                                        Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("acc", ("acc",), (fake_image("cubin", "sm_90", seed=3),)),))


def _addsum_impl(grid, block, shmem, v) -> None:
    """``y += x.sum()``."""
    x, y, m, n = v
    s = sum(_f32(x, m))
    ctypes.memmove(y, struct.pack(f"<{n}f", *[q + s for q in _f32(y, n)]), 4 * n)


def addsum(y_shape: tuple = ("n",)) -> Compiled:
    """x (m,) read, y (n,) or () written (inout): shapes of their own."""
    s = KernelSummary("addsum", (TensorSpec("x", kp.f32, ("m",)),
                                 TensorSpec("y", kp.f32, y_shape, role="inout"),
                                 Scalar("m32", kp.u32, value="m"),
                                 Scalar("n32", kp.u32, value="n" if y_shape else 1)),
                      (Variant((Launch("addsum", "addsum", (1,), (1,),
                                       (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("m32"),
                                        Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("addsum", ("addsum",), (fake_image("cubin", "sm_90"),)),))


def _bump_impl(grid, block, shmem, v) -> None:
    """``u += 1; w *= 2`` (both written)."""
    u, w, m, n = v
    ctypes.memmove(u, struct.pack(f"<{m}f", *[p + 1 for p in _f32(u, m)]), 4 * m)
    ctypes.memmove(w, struct.pack(f"<{n}f", *[q * 2 for q in _f32(w, n)]), 4 * n)


def bump2() -> Compiled:
    s = KernelSummary("bump2", (TensorSpec("u", kp.f32, ("m",), role="inout"),
                                TensorSpec("w", kp.f32, ("n",), role="inout"),
                                Scalar("m32", kp.u32, value="m"), Scalar("n32", kp.u32,
                                                                          value="n")),
                      (Variant((Launch("bump", "bump", (1,), (1,),
                                       (Arg.buffer("u"), Arg.buffer("w"), Arg.scalar("m32"),
                                        Arg.scalar("n32"))),)),))
    return Compiled(s, (Module("bump", ("bump",), (fake_image("cubin", "sm_90", seed=5),)),))


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={
        "acc": ("QQQI", _acc_impl), "addsum": ("QQII", _addsum_impl),
        "bump": ("QQII", _bump_impl), "axpby": ("QQQfI", _axpby_impl)}))


@pytest.fixture(params=["C", "C-dlpack", "closure"])
def path(request, monkeypatch):
    """Each torch/CuPy fast path: C FastCall, C through DLPack's exchange API, the closure."""
    which = select_path(request.param, monkeypatch)
    fx = None
    if which == "C-dlpack":
        from dlpack_exchange import FakeExchange

        fx = FakeExchange()  # alive while the test runs (the capsule points into it)
        monkeypatch.setattr(Tensor, "__dlpack_c_exchange_api__", fx.capsule, raising=False)
    yield which
    del fx


def _launches(fake) -> int:
    return len([c for c in fake.calls if c[0] == "cuLaunchKernel"])


def _fast_calls(prog, path: str) -> int | None:
    fast = getattr(bind(prog).call, "__self__", None)
    return fast.fast_calls if path.startswith("C") else None


def _view(mem, offset: int, n: int, shape: tuple | None = None):
    """``n`` float32 of ``mem``'s memory ``offset`` bytes in, of ``shape`` (default (n,))."""
    if isinstance(mem, Tensor):
        t = _tensor_view(mem, offset, max(n, 1))
    else:
        t = _array_view(mem, offset, max(n, 1))
    t.shape = (n,) if shape is None else shape
    return t


def _maker(framework: str, request):
    mod = request.getfixturevalue(framework)
    return (lambda v: Tensor(v, mod.float32)) if framework == "torch" else NDArray


@pytest.mark.parametrize("framework", ["torch", "cupy"])
@pytest.mark.parametrize("offset, message", [
    (20, "partially overlaps argument 'y'"),
    (16, "shares memory with argument 'y'.* the program writes both"),  # out=y (was a bug)
])
def test_out_sharing_memory_with_an_inout_argument_is_refused_on_every_path(
        fake, path, framework, request, offset, message):
    make = _maker(framework, request)
    prog = acc()
    mem = make([float(i) for i in range(12)])
    x, y, z = _view(mem, 0, 4), _view(mem, 16, 4), make([0.0] * 4)
    call_program(prog, x, y, out=z)
    call_program(prog, x, y, out=z)  # fast from here
    fast, launches, before = _fast_calls(prog, path), _launches(fake), mem.values()
    with pytest.raises(LaunchError, match=f"acc: out 'z' {message}"):
        call_program(prog, x, y, out=_view(mem, offset, 4))
    assert _launches(fake) == launches and mem.values() == before
    # the very same array as the read-only x: in-place use, but the kernel that stores z
    # stores y too and may load x after storing z (session 37, runtime/in_place.py): x is
    # read from a copy (a LaunchError in sessions 37-38), on the general path
    expected = make(before)
    call_program(prog, _view(expected, 0, 4), _view(expected, 16, 4),
                 out=_view(expected, 32, 4))
    fast, launches = _fast_calls(prog, path), _launches(fake)
    call_program(prog, x, y, out=x)
    assert _launches(fake) == launches + 1
    assert mem.values()[:8] == expected.values()[8:12] + expected.values()[4:8]
    if fast is not None:
        assert _fast_calls(prog, path) == fast
    call_program(prog, x, y, out=z)
    if fast is not None:
        assert _fast_calls(prog, path) == fast + 1


def test_out_the_very_same_array_as_an_inout_argument_is_refused(fake):
    """Was a bug (fixed the same session): allowed as in-place use of an input, so y's update
    was lost (y ended as z = 2 * (x + y))."""
    x, y = HostArray([10.0, 20.0, 30.0]), HostArray([1.0, 2.0, 3.0])
    with pytest.raises(LaunchError, match="out 'z' shares memory with argument 'y'.* writes "
                       "both"):
        call_program(acc(), x, y, out=y)
    assert y.values() == [1.0, 2.0, 3.0]


def test_zero_size_arguments_share_nothing_and_stay_fast(fake, path, torch):
    """An empty argument whose pointer lies inside a written one (or the other way round)
    shares no memory: launched, on the fast path; two written arguments, one empty, at one
    pointer likewise."""
    prog = addsum()
    mem = Tensor([float(i) for i in range(8)], torch.float32)
    for _ in range(2):
        call_program(prog, _view(mem, 0, 2), Tensor([0.0, 0.0], torch.float32))
    fast, launches = _fast_calls(prog, path), _launches(fake)
    call_program(prog, _view(mem, 4, 0), _view(mem, 0, 4))  # y += 0
    call_program(prog, _view(mem, 0, 4), _view(mem, 4, 0))  # nothing written
    assert mem.values() == [float(i) for i in range(8)]
    assert _launches(fake) == launches + 2
    if fast is not None:
        assert _fast_calls(prog, path) == fast + 2
    prog = bump2()
    for _ in range(2):
        call_program(prog, Tensor([1.0], torch.float32), Tensor([1.0], torch.float32))
    fast = _fast_calls(prog, path)
    call_program(prog, _view(mem, 0, 0), _view(mem, 0, 2))  # u empty at w's start
    assert mem.values()[:3] == [0.0, 2.0, 2.0]
    if fast is not None:
        assert _fast_calls(prog, path) == fast + 1
    with pytest.raises(LaunchError, match="arguments 'u' and 'w' overlap .* writes both"):
        call_program(prog, _view(mem, 0, 1), _view(mem, 0, 2))


def test_a_0d_inout_argument_on_every_path(fake, path, torch):
    """y of shape () (4 bytes): the very same 4 bytes as x (1,) is in-place use; inside a
    longer x, or at its start, a partial overlap (refused, nothing launched)."""
    prog = addsum(())
    mem = Tensor([1.0, 2.0, 3.0, 4.0], torch.float32)
    for _ in range(2):
        call_program(prog, _view(mem, 0, 1), _view(mem, 0, 1, ()))
    assert mem.values() == [4.0, 2.0, 3.0, 4.0]  # 1 + 1, then 2 + 2
    fast, launches = _fast_calls(prog, path), _launches(fake)
    for at in (4, 0, 8):
        with pytest.raises(LaunchError, match=r"argument 'y', which the program writes \(role "
                           r"'inout'\), partially overlaps argument 'x'"):
            call_program(prog, _view(mem, 0, 3), _view(mem, at, 1, ()))
    call_program(prog, _view(mem, 0, 3), _view(mem, 12, 1, ()))  # right after x: fine
    assert mem.values() == [4.0, 2.0, 3.0, 13.0]
    assert _launches(fake) == launches + 1
    if fast is not None:
        assert _fast_calls(prog, path) == fast + 1


def test_programs_without_inout_check_nothing(fake, path, torch):
    """Two read-only inputs over overlapping memory are fine (nothing is written to them); the
    fast path's entries carry no pairs and the calls stay fast."""
    prog = axpby()
    mem = Tensor([1.0, 2.0, 3.0, 4.0, 5.0], torch.float32)
    for _ in range(2):
        z = call_program(prog, _view(mem, 0, 3), _view(mem, 4, 3), 1.0)
    assert z.values() == [3.0, 5.0, 7.0]
    if path.startswith("C"):
        assert _fast_calls(prog, path) == 1
        entries = list(bind(prog).call.__self__.hooks.core.cache.values())
        assert entries and all(entry[-1] == () for entry in entries)


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_the_fast_paths_raise_the_general_paths_very_message(fake, path, framework, request):
    make = _maker(framework, request)
    mem = make([float(i) for i in range(16)])
    cases = ((acc(), lambda: (_view(mem, 0, 4), _view(mem, 8, 4))),
             (bump2(), lambda: (_view(mem, 0, 4), _view(mem, 12, 2))),
             (bump2(), lambda: (_view(mem, 8, 2), _view(mem, 8, 2))))
    for prog, args in cases:
        call_program(prog, _view(mem, 32, 2), make([0.0, 0.0]))
        call_program(prog, _view(mem, 32, 2), make([0.0, 0.0]))  # fast from here
        launches = _launches(fake)
        with pytest.raises(LaunchError) as general:
            bind(prog)(args(), None, None)  # BoundProgram.__call__: the general path
        with pytest.raises(LaunchError) as fast:
            call_program(prog, *args())
        assert str(fast.value) == str(general.value)
        assert _launches(fake) == launches


def test_dlpack_arrays_that_overlap_a_written_one_are_refused(fake):
    """Generic arrays read through DLPack (byte_offset into one buffer): refused, each capsule
    deleted once, nothing launched; adjacent views of the same buffer run."""
    base = Producer([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def view(offset: int, n: int) -> Producer:
        p = Producer([0.0] * n)
        p.buf, p.byte_offset = base.buf, offset
        return p

    x, y = view(0, 3), view(4, 3)
    with pytest.raises(LaunchError, match=r"argument 'y', which the program writes .* "
                                          r"partially overlaps argument 'x'"):
        call_program(addsum(), x, y)
    assert len(x.deleted) == len(x.capsules) == 1 and len(y.deleted) == len(y.capsules) == 1
    assert _launches(fake) == 0 and base.values() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    call_program(addsum(), view(0, 2), view(8, 3))
    assert base.values() == [1.0, 2.0, 6.0, 7.0, 8.0, 6.0]


# ---- the C FastCall's written pairs --------------------------------------------------------

def _c_path(monkeypatch):
    select_path("C", monkeypatch)
    from kernelpack.runtime.native import launcher

    if not launcher().native:
        pytest.skip("the fake driver's C launch entry is not in use")


@pytest.mark.parametrize("pairs, error, message", [
    ([(1, 8, 0, 8, False)], TypeError, "written pairs are a tuple"),
    (((1, 8, 0),), TypeError, r"a written pair is \(slot, nbytes"),
    ((-1,), TypeError, r"a written pair is \(slot, nbytes"),
    (((1, 8, 99, 8, False),), ValueError, "value slot of a written pair is out of range"),
    (((-1, 8, 0, 8, False),), ValueError, "value slot of a written pair is out of range"),
    (((1.5, 8, 0, 8, True),), TypeError, "integer"),
    (((1, "8", 0, 8, True),), TypeError, "int"),
])
def test_malformed_written_pairs_are_errors_not_crashes(fake, monkeypatch, torch, pairs,
                                                        error, message):
    _c_path(monkeypatch)
    from kernelpack.runtime import fastpath

    monkeypatch.setattr(fastpath, "written_pairs", lambda *a: pairs)
    prog = addsum()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([0.0, 0.0], torch.float32)
    call_program(prog, x, y)  # the general path binds the device
    launches = _launches(fake)
    with pytest.raises(error, match=message):
        call_program(prog, x, y)
    assert _launches(fake) == launches


class _Truthy:
    def __bool__(self) -> bool:
        return True


def test_a_malformed_pair_with_a_python_flag_is_a_type_error(fake, monkeypatch, torch):
    _c_path(monkeypatch)
    from kernelpack.runtime import fastpath

    monkeypatch.setattr(fastpath, "written_pairs", lambda *a: (("a", 8, 0, 8, _Truthy()),))
    prog = addsum()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([0.0, 0.0], torch.float32)
    call_program(prog, x, y)
    with pytest.raises(TypeError):
        call_program(prog, x, y)


@pytest.mark.parametrize("cut", [lambda a: a + (1,), lambda a: a[:6], lambda a: list(a)])
def test_entries_of_the_wrong_length_or_kind_are_type_errors(fake, monkeypatch, torch, cut):
    _c_path(monkeypatch)
    from kernelpack.runtime import fast_native

    real = fast_native.Hooks.entry
    monkeypatch.setattr(fast_native.Hooks, "entry",
                        lambda self, key: (lambda a: a and cut(a))(real(self, key)))
    prog = addsum()
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([0.0, 0.0], torch.float32)
    call_program(prog, x, y)
    with pytest.raises(TypeError, match="hooks.entry must answer None or"):
        call_program(prog, x, y)
    assert _launches(fake) == 1


def test_refused_and_fast_calls_leave_no_references_behind(fake, monkeypatch, torch):
    _c_path(monkeypatch)
    prog = addsum()
    mem = Tensor([float(i) for i in range(8)], torch.float32)
    x, y = _view(mem, 0, 4), _view(mem, 4, 4)            # partial: refused
    ok_x, ok_y = _view(mem, 0, 2), _view(mem, 8, 2)      # adjacent: fast
    u = _view(mem, 0, 4)

    def calls() -> None:
        ctypes.memset(ctypes.addressof(mem._buf), 0, 32)  # the sums stay finite
        with pytest.raises(LaunchError):
            call_program(prog, x, y)
        call_program(prog, ok_x, ok_y)
        call_program(prog, u, u)                         # in place: fast

    calls()
    calls()
    gc.collect()
    watched = (x, y, ok_x, ok_y, u, x.shape, torch.float32)
    before = [sys.getrefcount(o) for o in watched]
    fast = _fast_calls(prog, "C")
    for _ in range(200):
        calls()
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before
    assert _fast_calls(prog, "C") == fast + 400
