"""Review 72b: a diff-reading review of the lowering's, DSL's, cache's and CLI's changes since
fc9220a (170 commits; HEAD 570851b when read).

**Read**: ``git diff fc9220a..HEAD`` and ``git log`` of lowering/{elsewhere, pipeline, regrows,
rows, kernels, memory, tuning, codegen, columns, schedule}.py, fusion.py, fusion_signature.py,
graph.py, cache/{digest_memo, disk, keys}.py, cli_build.py, cli_cache.py, cli_facts.py; the
reviews that already covered parts of it (57: reads_elsewhere/stores_after_loads on the
emulator; 63a/63b: DSL and CLI mutants; 65a/65b/66: scheduling and codegen mutants; 67: the
frozen dataclasses; 68: the digest memo; 69: the disk tier's string paths; 70/71: annotations
and the public API across Python versions) so as not to redo them.

**Checked, right** (by running code; tests below where none pinned it):

- ``kp.fusion(name=...)`` of a fusion (70edce0) keeps the parameters it was declared with, and
  so the cache key: a renamed fusion made after the global its string annotation names was
  rebound hits the entry the same program compiled before the rebinding
  (``test_renamed_fusion_after_a_rebound_global_hits_the_same_cache_entry``).
- ``kernelpack inspect --json`` and ``kernelpack diff`` show format 1.1's
  ``reads_elsewhere``/``stores_after_loads`` (cli_facts.launch_facts, fde7911); no CLI test
  read them (``test_inspect_json_and_diff_show_the_in_place_fields``).
- A failing string annotation names its parameter (70edce0's ``_failing_parameter``); a
  classmethod is a TypeError saying to use @staticmethod (00a8ca7); a staticmethod object is
  accepted (``test_failing_annotation_names_its_parameter``).
- pipeline._check_arguments (7c93dc1/a80e05d): its message is Launch's own ("N arguments
  exceed 512"), counted by the same ``_launch_arguments`` summarize uses; tests/lowering/
  test_kernel_buffers.py pins both sides of the limit already. ``made`` (6d0523a): kernel
  names within a fusion are unique per spec (the schedule's tags; LLVM would refuse a
  duplicate function name anyway).
- regrows' remaining-length form (8292f40): equivalent to ``lane0 + off < length`` for every
  offset emitted; tests/lowering/test_regrows.py runs every group on the emulator. rows.py's
  rows per block from ``spec.block`` (945c38a) agrees with schedule.py's grid (``block //
  32`` per warp group) and columns.py's finals (BLOCK); tests/lowering/test_rows.py pins it.
- kernels._store_outputs / _vectors: every output's value of an element (or 16-byte group)
  is computed before any store on every pointwise path (scalar tail, grouped rounds, the
  partial last round), which ``stores_after_loads=spec.kind == "pointwise"`` claims.
  memory._align (fd2f7a4): gcd(16, span, offset) never over-claims (review 65b/66 pin it).
  On the emulator, float16 (8-element groups, two a thread in blocks of 64: a whole round,
  the partial last round, the element loop) and bool two-output steps run in place with both
  outputs over both inputs, either way round, both thread orders: the separate-buffer bits
  (``test_two_outputs_over_their_inputs_on_grouped_rounds_and_narrow_dtypes``; it fails with
  ``_store_outputs`` as before fde7911, checked by patching it back); int64 and bfloat16 by
  hand. The same on the device: ``test_two_outputs_swapped_over_their_inputs_on_the_device``
  (gpu: ptxas may order loads and stores otherwise than the emulator's host build does).
- keys.py's memo (11b25d5, 2992a6d): the libdevice digest's form matches the memo's
  ``_DIGEST`` pattern (so it can hit); labels hold the absolute path but are not key parts.
- disk.py: ``temporaries()`` (fb74f89) lists entries/, keys/, runtime-ptx/ and meta/ for both
  ``cache stats`` and ``prune``; clear() removes meta/digests.json.

**Found** (strict xfails below):

- ``_check_wrappers_agree`` (70edce0, 68fa3f4) compared a wrapper's raw annotation objects
  with the function's, so two spellings kernelpack reads alike (README: ``Annotated[Any,
  kp.Tensor[...]]`` "is the same as unwrapped") were a TraceError whose text blamed Python
  3.14's late evaluation, on 3.11 too
  (``test_a_wrapper_annotated_in_the_annotated_form_agrees_with_the_plain_form``; fixed in
  session 57, with the message reworded).

**Observed, made consistent in session 57**: a wrapper (``__wrapped__``) over a *fusion* whose
own annotations disagree with it was accepted silently with the fusion's parameters (the
lender path in Fusion.__init__ never called the check), while the same wrapper over a plain
function is a TraceError; the lender path now checks too
(``test_a_wrapper_over_a_fusion_is_held_to_the_fusions_types``).
``ld.global.nc`` appears in row kernels (noalias buffers) that may run in place: formally
outside PTX's contract, harmless in practice since no element is read after another thread
stores it; GPU tests of every softmax variant in place exist (test_review28_runtime_gpu.py).

**Not done**: the GPU test was not run here (the lead runs ``-m gpu`` on the H200); the
PEP 695 alias path (``_alias_value``) and the 3.14-only parts of ``_check_wrappers_agree``
were looked at by hand under /tmp/kernelpack-py3.14 only (nothing found; review 70/71's tests
hold them); the disk tier's string paths and the digest memo were not attacked again
(reviews 68, 69); cli_build's ``_file_spec`` split was read, not run (review 63b's tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest

import kernelpack as kp

T = kp.Tensor
ROOT = Path(__file__).resolve().parents[1]


# ---- DSL: wrappers and renamed fusions (70edce0, ac9f2fb, 68fa3f4) ---------------------------

def _plain(x: T[kp.f32, "n"], s: kp.f32):
    return x * s


def _wrapper_of(fn: Any, annotations: dict) -> Any:
    """A wrapper with annotations of its own and ``__wrapped__`` set by hand (as a decorator
    that keeps its typed signature does): the case where wrapper and function may differ on
    3.11 as well as on 3.14."""
    def wrapper(x, s):
        return fn(x, s)
    wrapper.__annotations__ = dict(annotations)
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def test_a_wrapper_annotated_with_the_same_objects_is_accepted():
    """ac9f2fb: the wrapper's own return annotation is no input and is not compared."""
    w = _wrapper_of(_plain, {"x": T[kp.f32, "n"], "s": kp.f32, "return": int})
    assert kp.fusion(w).params == [("x", T[kp.f32, "n"]), ("s", kp.f32)]


def test_a_wrapper_that_disagrees_with_its_function_is_a_trace_error():
    w = _wrapper_of(_plain, {"x": T[kp.f64, "n"], "s": kp.f32})
    with pytest.raises(kp.TraceError, match=r"parameter 'x' is annotated .*float64.* on the "
                                            r"wrapper .*float32.* on the function"):
        kp.fusion(w)


# 70edce0 (_check_wrappers_agree; 68fa3f4 kept the comparison): a wrapper's annotation was
# compared with the function's as objects (``value == hints[key]``). ``Annotated[Any,
# kp.Tensor[f32, "n"]]`` and ``kp.Tensor[f32, "n"]`` are one parameter type to kernelpack
# (README, "Type checkers": the fusion, its key and its code are the same as unwrapped), yet
# the wrapper was refused, with a message blaming Python 3.14's late evaluation on 3.11.
# Fixed in session 57: fusion_signature.check_wrappers_agree compares what the fusion reads
# from each side (fusion._read_annotation) before calling them different.
@pytest.mark.parametrize("which", ["tensor", "scalar"])
def test_a_wrapper_annotated_in_the_annotated_form_agrees_with_the_plain_form(which):
    anns: dict = {"x": T[kp.f32, "n"], "s": kp.f32}
    if which == "tensor":
        anns["x"] = Annotated[Any, T[kp.f32, "n"]]
    else:
        anns["s"] = Annotated[float, kp.f32]
    f = kp.fusion(_wrapper_of(_plain, anns))
    assert f.params == [("x", T[kp.f32, "n"]), ("s", kp.f32)]


def test_a_wrapper_over_a_fusion_is_held_to_the_fusions_types():
    base = kp.fusion(_plain)
    agreeing = _wrapper_of(base, {"x": Annotated[Any, T[kp.f32, "n"]], "s": kp.f32})
    assert kp.fusion(name="same")(agreeing).params == base.params
    disagreeing = _wrapper_of(base, {"x": T[kp.f64, "n"], "s": kp.f32})
    with pytest.raises(kp.TraceError, match=r"fusion other: parameter 'x' is annotated "
                                            r".*float64.* on the wrapper .*float32"):
        kp.fusion(name="other")(disagreeing)


def test_failing_annotation_names_its_parameter():
    def f(x: "T[kp.f32, 'n']", s: "kp.f32", t: "no_such_name"):  # noqa: F821
        return x
    with pytest.raises(kp.TraceError, match=r"fusion f: cannot read the annotation of "
                                            r"parameter 't': name 'no_such_name'"):
        kp.fusion(f)

    class C:
        @classmethod
        def m(cls, x: T[kp.f32, "n"]):
            return x

        @staticmethod
        def s(x: T[kp.f32, "n"]):
            return x
    with pytest.raises(TypeError, match="not a classmethod .*write @staticmethod"):
        kp.fusion(C.__dict__["m"])
    assert kp.fusion(C.__dict__["s"]).params == [("x", T[kp.f32, "n"])]


DT = kp.f32  # rebound by the test below (string annotations read it when evaluated)


def _scaled(x: "T[DT, 'n']"):
    return x * 2


def test_renamed_fusion_after_a_rebound_global_hits_the_same_cache_entry(tmp_path, monkeypatch):
    """70edce0: a renamed fusion lends the parameters its fusion was declared with, so its
    cache key is the declared program's: before, ``kp.fusion(name=...)`` evaluated the string
    annotation again and read the rebound global (a float64 program under the same name)."""
    cache = kp.Cache(tmp_path / "cache")
    declared = kp.fusion(_scaled)
    first = kp.compile(kp.fusion(name="scaled2")(_scaled), targets=["sm_80"], cache=cache)
    assert first.origin == "compiled"
    monkeypatch.setitem(globals(), "DT", kp.f64)
    renamed = kp.fusion(name="scaled2")(declared)
    assert renamed.params == [("x", T[kp.f32, "n"])]
    again = kp.compile(renamed, targets=["sm_80"], cache=cache)
    assert again.origin == "disk" and again.summary == first.summary
    # the function itself, renamed now, is the float64 program: another key
    other = kp.compile(kp.fusion(name="scaled2")(_scaled), targets=["sm_80"], cache=cache)
    assert other.origin == "compiled"
    assert other.summary.params[0].dtype == kp.f64


# ---- CLI: format 1.1's launch fields in inspect --json and diff (fde7911's cli_facts) --------

def _axpy(**fields: Any) -> kp.Compiled:
    ptx = (ROOT / "examples" / "axpy.ptx").read_text()
    params = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="out"),
              kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]
    return kp.external("axpy", "axpy", params, kp.cdiv("n", 256), 256, ptx=ptx,
                       targets=["sm_80"], **fields)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelpack", *args], capture_output=True,
                          check=False, text=True, timeout=120)


def test_inspect_json_and_diff_show_the_in_place_fields(tmp_path):
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink missing")
    plain, elsewhere, after = (tmp_path / f"{n}.kpack" for n in "abc")
    kp.save([_axpy()], plain)
    kp.save([_axpy(reads_elsewhere=["x"])], elsewhere)
    kp.save([_axpy(stores_after_loads=True)], after)
    r = _cli("inspect", "--json", str(elsewhere))
    assert r.returncode == 0, r.stderr
    (launch,) = json.loads(r.stdout)["programs"][0]["variants"][0]["launches"]
    assert launch["reads_elsewhere"] == ["x"] and launch["stores_after_loads"] is False
    r = _cli("diff", str(plain), str(elsewhere))
    assert r.returncode == 1
    assert "launches[0].reads_elsewhere: [] -> ['x']" in r.stdout, r.stdout
    r = _cli("diff", str(plain), str(after))
    assert r.returncode == 1
    assert "launches[0].stores_after_loads: False -> True" in r.stdout, r.stdout
    assert _cli("diff", str(plain), str(plain)).returncode == 0


# ---- lowering: stores_after_loads on the grouped 16-byte rounds, narrow dtypes (fde7911) -----

@kp.fusion
def _heavy_step_f16(p: T[kp.f16, "n"], m: T[kp.f16, "n"], g: T[kp.f16, "n"]):
    # a division: HEAVY_POINTWISE, 2 groups a thread; out0 reads no m and out1 no p, so a
    # store of either over the other's input before that input is loaded changes the answer
    return p * 2 / (kp.abs(g) + 1), m / (kp.abs(g) + 2)


@kp.fusion
def _bool_step(p: T[kp.bool_, "n"], m: T[kp.bool_, "n"]):
    return ~p, m


@pytest.mark.parametrize("f, n", [(_heavy_step_f16, 1043), (_heavy_step_f16, 9),
                                  (_bool_step, 1031)])
def test_two_outputs_over_their_inputs_on_grouped_rounds_and_narrow_dtypes(f, n):
    """``Launch.stores_after_loads`` is set for every pointwise kernel; tests/lowering/
    test_elsewhere.py runs it for float32/complex128 one group per thread. Here float16 with
    8-element groups, two a thread in blocks of 64 (kernels._grouped_vectors: 1043 elements
    are 130 groups, so block 0 takes a whole round, block 1 the partial last round group by
    group, and 3 elements go to the element loop) and bool: both outputs in place over both
    inputs at once, either way round, in both thread orders, give the separate-buffer bits."""
    import numpy as np
    from lowering.simt import Kernels
    from lowering.test_review48_in_place import allowed_pairs, run_plan

    k = Kernels(f)
    rng = np.random.default_rng(n)
    if f is _bool_step:
        inputs = [rng.random(n) < 0.5 for _ in range(2)]
    else:
        inputs = [rng.standard_normal(n).astype(np.float16) for _ in range(3)]
    plan = k.planner.plan(*[a.shape for a in inputs])
    (launch,) = plan.launches
    assert launch.block[0] == (64 if f is _heavy_step_f16 else 256), launch
    (summary_launch,) = k.summary.variants[0].launches
    assert summary_launch.stores_after_loads and summary_launch.reads_elsewhere == ()
    pairs, refused = allowed_pairs(k, inputs)
    assert refused == 0 and ("out0", "p") in pairs and ("out1", "m") in pairs, pairs
    for both in ((("out0", "p"), ("out1", "m")), (("out0", "m"), ("out1", "p"))):
        for reverse in (False, True):
            ref = run_plan(k, inputs, reverse=reverse)
            got = run_plan(k, inputs, reverse=reverse, more=both)
            assert all(a.tobytes() == b.tobytes() for a, b in zip(got, ref)), (both, reverse)


@pytest.mark.gpu
@pytest.mark.parametrize("f, n", [(_heavy_step_f16, 1043), (_heavy_step_f16, (1 << 20) + 3),
                                  (_bool_step, (1 << 20) + 7)])
def test_two_outputs_swapped_over_their_inputs_on_the_device(f, n):
    """The emulator runs the host build of the IR; ptxas could still order a load after a
    store (every buffer is ``noalias``). ``out=(m, p)``: each output over the input that the
    *other* output reads, so a store landing before that load shows; bits must equal the
    separate-output call's (same kernel, same math)."""
    import numpy as np

    torch = pytest.importorskip("torch", reason="the GPU check launches through torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    prog = kp.load(kp.save([kp.compile(f, targets=["sm_80", "sm_90", "ptx"])]))[f.name]
    rng = np.random.default_rng(n)
    if f is _bool_step:
        hosts = [rng.random(n) < 0.5 for _ in range(2)]
    else:
        hosts = [rng.standard_normal(n).astype(np.float16) for _ in range(3)]
    args = [torch.from_numpy(h).cuda() for h in hosts]
    want = [t.cpu().numpy() for t in prog(*args)]
    p, m = (torch.from_numpy(h).cuda() for h in hosts[:2])
    got = prog(p, m, *args[2:], out=(m, p))
    assert got[0] is m and got[1] is p
    torch.cuda.synchronize()
    assert m.cpu().numpy().tobytes() == want[0].tobytes()
    assert p.cpu().numpy().tobytes() == want[1].tobytes()
