"""``Launch.reads_elsewhere`` as the lowering fills it (lowering/elsewhere.py).

Each launch names the inputs its kernel may read at elements other than the ones it stores, so
that the runtime reads them from a copy when an output is passed over them (review 54's gap:
``x @ x.T`` as one kernel was allowed in place and gave wrong results). Checked three ways:
the names for known kernels (contractions listed, softmax and layernorm rows and elementwise
kernels not); every contraction one can write with axis insertions and one reduction over
square inputs, run on the SIMT emulator in place for each pair the runtime now allows, thread
by thread in both orders (review 48's runner), giving the separate-buffer bits; and the
summary's field surviving save and load.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.lowering import pipeline
from kernelpack.lowering.elsewhere import input_labels, reads_elsewhere

from .simt import Kernels
from .test_review48_in_place import _launches, allowed_pairs, wrong_in_place

T = kp.Tensor


def _summary(f: Any, static: dict | None = None) -> kp.KernelSummary:
    return kp.compile(f, targets=["sm_90"], static=static).summary


def _by_kernel(summary: kp.KernelSummary) -> dict[str, tuple[str, ...]]:
    """``{kernel name without the program's prefix: reads_elsewhere}`` over every variant."""
    out: dict[str, tuple[str, ...]] = {}
    for v in summary.variants:
        for ln in v.launches:
            out[ln.kernel.removeprefix(summary.name + "_")] = ln.reads_elsewhere
    return out


@kp.fusion
def gram(x: T[kp.f32, "n", "k"]):
    return (x[:, None, :] * x[None, :, :]).sum(-1)


@kp.fusion
def at_b(a: T[kp.f32, "k", "n"], b: T[kp.f32, "k", "m"]):
    return (a[:, :, None] * b[:, None, :]).sum(0)


@kp.fusion
def matvec(m: T[kp.f32, "n", "n"], v: T[kp.f32, "n"]):
    return (m * v[None, :]).sum(-1)


@kp.fusion
def softmax(x: T[kp.f32, "b", "n"]):
    e = kp.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@kp.fusion
def layernorm(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], c: T[kp.f32, "n"]):
    m = x.mean(-1, keepdims=True)
    d = x - m
    return d * kp.rsqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + c


@kp.fusion
def axpy(x: T[kp.f32, "n"], y: T[kp.f32, "n"], a: kp.f32):
    return a * x + y


@kp.fusion
def share(x: T[kp.f32, "n"]):
    return x / x.sum()


@kp.fusion
def padded(x: T[kp.f32, "b", "l"], q: kp.i32):
    return kp.pad(x, 1 << q)


def test_contractions_name_what_they_read_across_rows() -> None:
    # a thread, a warp or a block per output element, each reading rows i and j of x; the
    # split schedule's partial pass stores a workspace only, its last kernel reads none of x
    assert _by_kernel(_summary(gram)) == {
        "0_split_partial0": ("x",), "0_split_rowblock": (), "0_rowthread": ("x",),
        "0_rowwarpt16": ("x",), "0_rowblock256t16": ("x",)}
    # a.T @ b: split column sums (then combine kernels reading only the partials), or one
    # thread per output element summing a column of each inline
    assert _by_kernel(_summary(at_b)) == {
        "0_colsplit": ("a", "b"), "0_colfinalthread": (), "0_colfinalwarp": (),
        "0_colfinalblock": (), "0_pointwise": ("a", "b")}
    assert _by_kernel(_summary(matvec))["0_rowthread"] == ("m", "v")


def test_rows_and_elementwise_kernels_read_only_where_they_store() -> None:
    rows = _by_kernel(_summary(softmax))
    assert any(k.startswith("0_row") for k in rows)
    assert all(names == () for k, names in rows.items() if "partial" not in k), rows
    assert _by_kernel(_summary(axpy)) == {"0_pointwise": ()}
    # the gain and bias are read along every row: listed (an output over them would need b = 1)
    norm = _by_kernel(_summary(layernorm))
    assert all(names == ("c", "w") for k, names in norm.items()
               if "partial" not in k and "combine" not in k), norm
    # x / x.sum(): partial passes read x (they store workspaces), the last kernel x[i] alone
    full = _by_kernel(_summary(share))
    assert full["0_pointwise"] == () and full["0_partial0"] == ("x",)
    # a row padded from l to 2^q elements: element k of x is not element k of the output
    assert all(names == ("x",) for names in _by_kernel(_summary(padded)).values())


def test_the_labels_follow_views_reductions_and_broadcasts() -> None:
    b = pipeline.run(pipeline.new_build(gram, ["sm_90"], None, {}), stop="schedule")
    assert b.graph is not None
    spec = next(s for st in b.stages for alt in st.alternatives for s in alt.kernels
                if s.name.endswith("rowthread"))
    labels = input_labels(b.graph, spec)
    # x read as (i, k) for the first factor and (j, k) for the second, k the reduced axis
    ways = {tuple(lab[0] if lab[0] != "o" else lab for lab in ls) for ls, _ in labels["x"]}
    assert ways == {(("o", 0), "r"), (("o", 1), "r")}
    assert reads_elsewhere(b.graph, spec, ["out", "x"]) == ("x",)
    assert reads_elsewhere(b.graph, spec, ["out"]) == ()  # only buffers the kernel takes


# ---- every one-reduction contraction of square inputs, on the emulator ----------------------

# where a (n, n) input's two axes go in a rank-3 product: None marks the inserted axis
_VIEWS = {"ab_": (slice(None), slice(None), None), "a_b": (slice(None), None, slice(None)),
          "_ab": (None, slice(None), slice(None))}


def _contraction(first: str, second: str, axis: int, same: bool, tail: str) -> Any:
    """``(p[first] * q[second]).sum(axis)`` (then ``tail``) over square inputs; ``same``: p
    and q are one input (``x @ x.T``-like)."""
    def body(p, q):  # type: ignore[no-untyped-def]
        out = (p[_VIEWS[first]] * q[_VIEWS[second]]).sum(axis)
        return {"": out, "+p": out + p, "*2": out * 2}[tail]

    if same:
        def one(x: T[kp.f32, "n", "n"]):
            return body(x, x)
        fn: Any = one
    else:
        def two(x: T[kp.f32, "n", "n"], y: T[kp.f32, "n", "n"]):
            return body(x, y)
        fn = two
    fn.__name__ = fn.__qualname__ = f"c_{first}_{second}_{axis}_{int(same)}{tail and '_t'}"
    return kp.fusion(fn)


_PAIRS = [(f, s) for f, s in itertools.product(_VIEWS, repeat=2) if f != s]
_EXTRAS = list(itertools.product((True, False), ("", "+p", "*2")))
# every view pair and axis once (6 x 3 = 18 fusions, which keeps the emulator's share of CI
# small), each with the next of the six (shared inputs or not, tail) in turn
_SAMPLE = [(f, s, axis, *_EXTRAS[j % len(_EXTRAS)])
           for j, ((f, s), axis) in enumerate(itertools.product(_PAIRS, (0, 1, 2)))]


@pytest.mark.parametrize("first, second, axis, same, tail", _SAMPLE,
                         ids=[f"{f}*{s}.sum({a}){'-same' if m else ''}{t}"
                              for f, s, a, m, t in _SAMPLE])
def test_contractions_in_place_are_refused_or_right(first, second, axis, same, tail) -> None:
    """Each pair the runtime runs in place gives the separate-buffer bits in both thread
    orders; a kernel that reads an input across rows has it refused (read from a copy)."""
    k = Kernels(_contraction(first, second, axis, same, tail))
    rng = np.random.default_rng(40)
    inputs = [rng.standard_normal((5, 5)).astype(np.float32) for _ in k.summary.inputs]
    pairs, refused = allowed_pairs(k, inputs)
    wrong = list(wrong_in_place(k, inputs, pairs))
    assert not wrong, "\n".join(wrong)
    launches = _launches(k, inputs)
    if len(launches) == 1:  # the contraction stores the output itself: some input is copied
        assert refused >= 1, launches
    # (else a pass stored the contraction into a workspace first, and the kernel writing the
    # output adds ``p`` elementwise: right in place, and allowed)


# ---- the field through save and load ---------------------------------------------------------

def test_the_field_survives_save_and_load_and_sets_the_version() -> None:
    compiled = kp.compile(gram, targets=["sm_90"])
    data = kp.save(compiled)
    pack = kp.load(data)
    assert pack.format_version == (1, 1)
    assert pack["gram"].summary == compiled.summary
    (launch,) = pack["gram"].summary.variants[1].launches
    assert launch.kernel.endswith("rowthread") and not launch.stores_after_loads
    axpy_pack = kp.load(kp.save(kp.compile(axpy, targets=["sm_90"])))
    (launch,) = axpy_pack["axpy"].summary.variants[0].launches
    assert launch.stores_after_loads and axpy_pack.format_version == (1, 1)


# ---- stores_after_loads: several outputs, each over an input -----------------------------------

@kp.fusion
def momentum(p: T[kp.f32, "n"], m: T[kp.f32, "n"], g: T[kp.f32, "n"], lr: kp.f32):
    m_new = 0.9 * m + g
    return p - lr * m_new, m_new


@kp.fusion
def momentum_c128(p: T[kp.c128, "n"], m: T[kp.c128, "n"], g: T[kp.c128, "n"]):
    m_new = m * 0.5 + g  # 16-byte elements: no vector groups, the element loop alone
    return p - m_new, m_new


@kp.fusion
def unrelated(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
    return x * 2, y + 1  # out0 over y: its store depends on nothing out1 loads


@pytest.mark.parametrize("f, n", [(momentum, 37), (momentum, 1), (momentum_c128, 9),
                                  (unrelated, 23)])
def test_a_pointwise_kernel_storing_two_arrays_runs_over_its_inputs(f, n) -> None:
    """An optimizer step's ``out=(p, m)`` (and the swapped ``out=(m, p)``), each output over an
    input of the same launch: allowed since session 40 (``Launch.stores_after_loads``: each
    thread loads every element it reads before it stores any, in the 16-byte groups and in
    the element loop after them), and the separate-buffer bits in both thread orders with
    both outputs in place at once. 37 float32 elements: nine groups of 4 and one left over."""
    from .test_review48_in_place import run_plan

    k = Kernels(f)
    rng = np.random.default_rng(n)
    dtype = np.complex128 if f is momentum_c128 else np.float32
    inputs: list = [(rng.standard_normal(n) + (1j * rng.standard_normal(n)
                                               if dtype is np.complex128 else 0)).astype(dtype)
                    for _ in [t for t in k.summary.inputs if isinstance(t, kp.Tensor)]]
    inputs += [np.float32(0.01)] * (len(k.summary.inputs) - len(inputs))
    (launch,) = k.summary.variants[0].launches
    assert launch.stores_after_loads and launch.reads_elsewhere == ()
    names = [t.name for t in k.summary.inputs]
    pairs, refused = allowed_pairs(k, inputs)
    assert refused == 0 and len(pairs) == 2 * (len(k.summary.inputs) - (f is momentum)), pairs
    for both in ((("out0", names[0]), ("out1", names[1])),
                 (("out0", names[1]), ("out1", names[0]))):
        for reverse in (False, True):
            ref = run_plan(k, inputs, reverse=reverse)
            got = run_plan(k, inputs, reverse=reverse, more=both)
            assert all(np.array_equal(a, b) for a, b in zip(got, ref)), (both, reverse)


def test_the_in_place_step_benchmark_builds_both_ways() -> None:
    """benchmarks/in_place_step.py --dry-run (no GPU): 'now' runs the step in place, 'before'
    (the flag cleared, as session 39's lowering wrote it) copies ``p`` and ``m``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "KERNELPACK_CACHE")}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "in_place_step.py"),
                           "--dry-run"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'now' runs in place, 'before' copies p and m" in done.stdout
