"""Review 28 (black box): the ways users *write* fusions and programs.

Signatures, annotations, function forms, Python control flow on traced values, returns,
names, ``kp.compile`` options, ``kernelpack build`` and determinism. Numerics go through the
SIMT emulator (``tests/lowering/simt.py``) against NumPy. The tests at the top fail today;
each docstring says what goes wrong and what the README / ``help()`` / issue 3 lead one to
expect. The tests after them record behaviour that was checked and found right.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kernelpack as kp
from kernelpack.cli import main as cli_main

from lowering.simt import Kernels, run_fusion

T = kp.Tensor
ARCH = ["sm_80"]


def _load(tmp_path: Path, *compiled: kp.Compiled) -> kp.Pack:
    path = tmp_path / "p.kpack"
    kp.save(list(compiled), path)
    return kp.load(path)


def _define(src: str, **env: object):
    """Define one function from source (odd parameter names); compiled without this file's
    ``from __future__ import annotations``, so annotations are objects or plain strings."""
    ns: dict[str, object] = {}
    code = compile(textwrap.dedent(src), "<review28>", "exec", dont_inherit=True)
    exec(code, {"kp": kp, "T": T, **env}, ns)
    return next(v for v in ns.values() if callable(v))


def _import_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, src: str):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


# ---------------------------------------------------------------------------------------------
# Bugs: these fail now.
# ---------------------------------------------------------------------------------------------

def test_default_value_of_a_scalar_is_refused_where_declared():
    """``s: kp.f32 = 2.0`` compiled, but the default was dropped without a word: the program
    required ``s`` (``f(x)`` was a TypeError 'missing input(s) ['s']'). Decided: refused when
    the fusion is declared (the format has no defaults; a constant is a closure variable)."""
    with pytest.raises(kp.TraceError, match=r"parameter 's' has a default value \(2.0\)"):
        @kp.fusion
        def dflt(x: T[kp.f32, "n"], s: kp.f32 = 2.0):
            return x * s


def test_default_value_of_a_wrong_type_is_refused():
    """``s: kp.f32 = "abc"`` traced and compiled."""
    with pytest.raises(kp.TraceError, match="'s' has a default value"):
        @kp.fusion
        def bad_default(x: T[kp.f32, "n"], s: kp.f32 = "abc"):
            return x * s


@pytest.mark.parametrize("pname", ["stream", "out"])
def test_a_parameter_named_like_a_call_keyword_is_callable_by_name_or_refused(tmp_path, pname):
    """A fusion parameter named ``stream`` or ``out`` compiles (the output is even renamed
    ``out_`` to dodge the clash), but the loaded program cannot take it by name, as the README
    promises for every input (``softmax(x=x, s=0.5)``): ``p(stream=x)`` is swallowed by the
    call's own ``stream=``/``out=`` keyword and fails with 'missing input(s)'. Refuse such a
    name when the fusion is declared, or bind it."""
    fn = _define(f"""
        def kw_{pname}({pname}: T[kp.f32, "n"]):
            return {pname} * 2
    """)
    try:
        c = kp.compile(kp.fusion(fn), targets=ARCH)
    except (kp.TraceError, ValueError) as exc:
        assert pname in str(exc)
        return
    prog = _load(tmp_path, c)[f"kw_{pname}"]
    with pytest.raises(kp.LaunchError, match="host memory"):
        prog(**{pname: np.ones(4, np.float32)})


@pytest.mark.parametrize("where", ["param", "output"])
def test_names_over_1024_bytes_are_refused_by_name_not_by_llvm(where):
    """A parameter or dict-output name of 1025+ UTF-8 bytes fails deep in the lowering:
    ``CompileError: LLVM rejected the generated IR ... redefinition of argument '%ppp...``.
    The README caps every name at 1024 UTF-8 bytes and a too-long *dim* name already gets
    'a symbol name must be at most 1024 UTF-8 bytes'; a parameter/output name should too."""
    long = ("p" if where == "param" else "o") * 1025
    src = (f"def longname({long}: T[kp.f32, 'n']): return {long} * 2" if where == "param"
           else f"def longname(x: T[kp.f32, 'n']): return {{'{long}': x * 2}}")
    with pytest.raises(Exception) as info:
        kp.compile(kp.fusion(_define(src)), targets=ARCH)
    msg = str(info.value)
    assert "1024" in msg and "LLVM" not in msg, msg[:300]


def test_inlined_fusion_checks_its_scalar_parameters():
    """``help(Fusion.__call__)``: an inlined fusion's arguments 'must match its annotations'
    in dtype and rank; tensors are checked ('x is float32 of rank 1, annotated float64'), but
    a scalar parameter takes anything: a rank-1 tensor for ``s: kp.f32`` silently gives
    ``x * x``."""
    @kp.fusion
    def scale(x: T[kp.f32, "n"], s: kp.f32):
        return x * s

    @kp.fusion
    def caller(x: T[kp.f32, "n"]):
        return scale(x, x)

    with pytest.raises(kp.TraceError, match="'s'"):
        caller.trace()


def test_inlined_fusion_checks_scalar_dtype():
    """Same rule, dtype: an int32 scalar passed for ``s: kp.f32`` is inlined as int32."""
    @kp.fusion
    def scale2(x: T[kp.f32, "n"], s: kp.f32):
        return x * s

    @kp.fusion
    def caller2(x: T[kp.f32, "n"], k: kp.i32):
        return scale2(x, k)

    with pytest.raises(kp.TraceError, match="int32"):
        caller2.trace()


def test_inlined_fusion_checks_literal_sizes():
    """``T[kp.f32, 4]`` is a fixed dim (issue 3), yet an inlined fusion annotated with 4 takes
    a tensor of 5 and its ``x.shape[0]`` reads 5: the annotation is silently contradicted."""
    @kp.fusion
    def four(x: T[kp.f32, 4]):
        return x * x.shape[0]

    @kp.fusion
    def five(x: T[kp.f32, 5]):
        return four(x)

    with pytest.raises(kp.TraceError, match="4"):
        five.trace()


def test_inlined_fusion_checks_shared_dim_names():
    """An inlined ``f(x: T[.., "n"], y: T[.., "n"])`` promises equal sizes; called with
    literal sizes 3 and 7 it traces without a word (top level, the same annotation is a
    ConstraintError at plan time)."""
    @kp.fusion
    def same_n(x: T[kp.f32, "n"], y: T[kp.f32, "n"]):
        return x * 2

    @kp.fusion
    def three_seven(x: T[kp.f32, 3], y: T[kp.f32, 7]):
        return same_n(x, y)

    with pytest.raises(kp.TraceError):
        three_seven.trace()


def test_recursive_fusion_is_a_trace_error():
    """A fusion calling itself is inlined forever and ends in a bare RecursionError with a
    1000-frame traceback; a TraceError saying the fusion calls itself is expected."""
    @kp.fusion
    def rec(x: T[kp.f32, "n"]):
        return rec(x) + 1

    with pytest.raises(kp.TraceError, match="rec"):
        rec.trace()


def test_item_assignment_is_a_trace_error():
    """``x[0] = 1`` in a fusion is Python's raw "'Value' object does not support item
    assignment" (an internal class name), while every other misuse (``len(x)``, ``x.T``,
    ``x[1:]``, ``np.sort(x)``) is a TraceError saying what to write instead."""
    @kp.fusion
    def setitem(x: T[kp.f32, "n"]):
        x[...] = 0.0
        return x

    with pytest.raises(kp.TraceError):
        setitem.trace()


def test_empty_fusion_name_is_refused():
    """``@kp.fusion(name="")`` silently names the program after the function; any other
    non-identifier name is a ValueError."""
    fn = _define("def plain(x: T[kp.f32, 'n']): return x * 2")
    with pytest.raises(ValueError, match="name"):
        kp.fusion(name="")(fn)


def test_fusion_of_a_non_function_is_a_type_error():
    """``kp.fusion(3)`` says 'a fusion's name must be an ASCII identifier ... (got None)':
    the problem is not a name. A TypeError saying it takes a function is expected."""
    with pytest.raises(TypeError, match="function|callable"):
        kp.fusion(3)


def test_partial_is_supported_or_refused_without_a_false_message():
    """``kp.fusion(name="pb")(functools.partial(base, s=2.0))``: 'parameter 'x' needs an
    annotation (got None)' although ``x`` is annotated; support partials (their signature has
    the annotations) or say partials are not supported."""
    def base(x: T[kp.f32, "n"], s: kp.f32):
        return x * s

    try:
        kp.fusion(name="pb")(functools.partial(base, s=2.0)).trace()
    except Exception as exc:  # noqa: BLE001 - any clear refusal will do
        assert "needs an annotation" not in str(exc), str(exc)


def test_numpy_ints_are_accepted_where_python_ints_are():
    """``static={"n": np.int64(4)}`` is accepted (same key, same bytes as 4), but
    ``opt=np.int64(2)`` said 'opt must be 0..3 (got np.int64(2))' and
    ``kp.Tensor[kp.f32, np.int64(4)]`` 'dims must be names or ints (got np.int64(4))':
    messages that contradict their value; sizes computed with NumPy are common."""
    @kp.fusion
    def np_ints(x: T[kp.f32, "n"]):
        return x * 2

    kp.compile(np_ints, targets=ARCH, opt=np.int64(2))
    assert T[kp.f32, np.int64(4)] == T[kp.f32, 4]


def test_future_annotations_resolve_in_the_functions_own_scope(tmp_path, monkeypatch):
    """With ``from __future__ import annotations`` the annotation text is evaluated in the
    frame that *called* ``kp.fusion``: through a registering decorator that frame is the
    decorator's, so a closure variable of the fusion (``dt``) is 'not defined', or, where the
    decorator has a local of that name, silently takes the decorator's value: ``make(kp.f64)``
    below compiles a float32 kernel."""
    mod = _import_source(tmp_path, monkeypatch, "r28_future_scope", """
        from __future__ import annotations
        import kernelpack as kp

        def register(fn, dt=kp.f32):
            return kp.fusion(fn)

        def make(dt):
            @register
            def body(x: kp.Tensor[dt, "n"]):
                return x.astype(dt) * 2  # dt is also a closure cell of body
            return body
    """)
    g = mod.make(kp.f64).trace()
    assert g.params[0][2] == kp.f64, g.params


def test_quoted_annotation_under_future_import(tmp_path, monkeypatch):
    """A file with ``from __future__ import annotations`` that still quotes one annotation
    (``y: "kp.Tensor[kp.f32, 'n']"``, common in code migrated to PEP 563) fails to import:
    'parameter 'y' needs an annotation ... (got "kp.Tensor[kp.f32, 'n']")'. The same quoted
    annotation works without the ``__future__`` import, and ``typing.get_type_hints``
    resolves both levels of quoting; so does ``kernelpack build`` of that file fail."""
    mod = _import_source(tmp_path, monkeypatch, "r28_quoted", """
        from __future__ import annotations
        import kernelpack as kp

        @kp.fusion
        def axpy(x: kp.Tensor[kp.f32, "n"], y: "kp.Tensor[kp.f32, 'n']", a: kp.f32):
            return a * x + y
    """)
    assert [p[0] for p in mod.axpy.trace().params] == ["x", "y", "a"]


def test_module_level_fusion_pickles(tmp_path, monkeypatch):
    """A module-level fusion cannot be pickled ("Can't pickle <function gelu>: it's not the
    same object as mod.gelu"), so ``ProcessPoolExecutor().map(kp.compile, fusions)`` (spawn
    workers, as the README recommends) fails; ``kp.Compiled`` pickles fine."""
    mod = _import_source(tmp_path, monkeypatch, "r28_pickle_mod", """
        import kernelpack as kp

        @kp.fusion
        def gelu(x: kp.Tensor[kp.f32, "n"]):
            return x * kp.sigmoid(1.702 * x)
    """)
    back = pickle.loads(pickle.dumps(mod.gelu))
    assert back.canonical_bytes() == mod.gelu.canonical_bytes()


# ---------------------------------------------------------------------------------------------
# Verified: these pass.
# ---------------------------------------------------------------------------------------------

X4 = np.arange(4, dtype=np.float32)


def test_signature_forms_that_work():
    """Keyword-only and positional-only parameters, string annotations (no ``__future__``
    import in the defining code) and a type alias trace and run."""
    forms = kp.fusion(_define("""
        def forms(x: Vec, /, y: "T[kp.f32, 'n']", *, z: T[kp.f32, "n"], s: kp.f32):
            return x + y * z * s
    """, Vec=T[kp.f32, "n"]))
    a, b, c = X4, X4 + 1, X4 - 1
    (got,) = run_fusion(forms, a, b, c, np.float32(0.5))
    np.testing.assert_allclose(got, a + b * c * 0.5, rtol=1e-6)


@pytest.mark.parametrize("src,match", [
    ("def f(*xs: T[kp.f32, 'n']): return xs[0]", "parameter 'xs' is variadic"),
    ("def f(x: T[kp.f32, 'n'], **kw): return x", "parameter 'kw' is variadic"),
    ("def f(x): return x", "parameter 'x' needs an annotation"),
    ("def f(x: T): return x", "parameter 'x' needs an annotation"),
    ("def f(x: T[kp.f32, 'n'], s: float): return x * s", "parameter 's' needs an annotation"),
    ("def f(x: 'Later'): return x", "name 'Later' is not defined"),
])
def test_malformed_signatures_name_the_parameter(src, match):
    with pytest.raises(kp.TraceError, match=match):
        kp.fusion(_define(src)).trace()


@pytest.mark.parametrize("build,exc,match", [
    (lambda: T["n"], TypeError, "not a kernelpack dtype"),
    (lambda: T[kp.f32, 3.5], TypeError, "dims must be names or ints"),
    (lambda: T[kp.f32, -3], ValueError, ">= 0"),
    (lambda: T[kp.f32, "2n"], ValueError, "identifier"),
    (lambda: T[kp.f32, True], TypeError, "dims must be names or ints"),
])
def test_malformed_tensor_annotations(build, exc, match):
    with pytest.raises(exc, match=match):
        build()


def test_repeated_dim_name_means_equal_sizes(tmp_path):
    @kp.fusion
    def square(x: T[kp.f32, "n", "n"]):
        return x.sum(axis=1)

    prog = _load(tmp_path, kp.compile(square, targets=ARCH))["square"]
    assert prog.plan(x=(3, 3)).allocations["out"].shape == (3,)
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[1\] is 4 but n = 3"):
        prog.plan(x=(3, 4))


@pytest.mark.parametrize("body", [
    lambda x: x if x.sum() > 0 else -x, lambda x: bool(x), lambda x: len(x),
    lambda x: [v for v in x], lambda x: x[0], lambda x: x[1:], lambda x: x[::-1],
    lambda x: np.sort(x), lambda x: np.dot(x, x), lambda x: x @ x, lambda x: x.reshape(2, 2),
    lambda x: int(x), lambda x: round(x), lambda x: x[x > 0],
    lambda x: [x for _ in range(x.shape[0])],
])
def test_python_control_flow_and_data_movement_are_trace_errors(body):
    fn = kp.fusion(name="cf")(_define("def cf(x: T[kp.f32, 'n']): return body(x)", body=body))
    with pytest.raises(kp.TraceError):
        fn.trace()


def test_static_range_indexing_inplace_and_numpy_functions_compute_right():
    @kp.fusion
    def many(x: T[kp.f32, 4], y: T[kp.f32, "m"]):
        acc = x * 0
        for i in range(x.shape[0]):          # a literal dim is a Python int
            acc = acc + i
        z = x
        z += 1                               # rebinding: x keeps its value
        z *= 2
        outer = x[:, None] + y[None, ...]
        return acc, z, x, outer, np.exp(x) + np.sum(y), np.where(x > 1, x, 0.0)

    y = np.array([0.5, -1.0, 2.0], np.float32)
    got = run_fusion(many, X4, y)
    refs = [np.full(4, 6.0), (X4 + 1) * 2, X4, X4[:, None] + y[None, :],
            np.exp(X4) + y.sum(), np.where(X4 > 1, X4, 0.0)]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-6)


def test_function_forms_that_work():
    """Closures over numbers and NumPy scalars, a plain helper, an inlined fusion, a
    staticmethod either side, functools.wraps, decorated twice."""
    c, w = 3.0, np.float32(2)

    def helper(t):
        return kp.exp(t) - 1

    @kp.fusion
    def inner(x: T[kp.f32, "n"]):
        return x * c

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k)
        return wrapper

    @kp.fusion
    @kp.fusion
    @deco
    def outer(x: T[kp.f32, "n"]):
        return inner(x) + helper(x) * w

    class K:
        @staticmethod
        @kp.fusion
        def st(x: T[kp.f32, "n"]):
            return x * 2

    assert outer.name == "outer"
    (got,) = run_fusion(outer, X4)
    np.testing.assert_allclose(got, X4 * 3 + np.expm1(X4) * 2, rtol=1e-5)
    np.testing.assert_array_equal(run_fusion(K.st, X4)[0], X4 * 2)
    with pytest.raises(TypeError, match="compile it with kp.compile"):
        inner(X4)


def test_inlined_fusion_dtype_and_rank_are_checked():
    @kp.fusion
    def f64(x: T[kp.f64, "n"]):
        return x

    @kp.fusion
    def bad(x: T[kp.f32, "n"]):
        return f64(x)

    with pytest.raises(kp.TraceError, match="annotated float64"):
        bad.trace()


def test_returns(tmp_path):
    @kp.fusion
    def outs(x: T[kp.f32, "n"]):
        return {"a": x + 1, "same": x, "n_": x.shape[0]}

    c = kp.compile(outs, targets=ARCH)
    assert [t.name for t in c.summary.outputs] == ["a", "same", "n_"]
    a, same, n = run_fusion(outs, X4)
    np.testing.assert_array_equal(a, X4 + 1)
    np.testing.assert_array_equal(same, X4)
    assert int(n) == 4
    for body, match in [("return None", "returns nothing"), ("return ()", "no outputs"),
                        ("return ((x, x), x)", "tuple"), ("return {1: x}", "identifiers"),
                        ("return {'x': x}", "clashes with a parameter")]:
        fn = kp.fusion(_define(f"def r(x: T[kp.f32, 'n']): {body}"))
        with pytest.raises(kp.TraceError, match=match):
            fn.trace()


def test_names_in_save_and_build(tmp_path, capsys):
    @kp.fusion(name="same")
    def one(x: T[kp.f32, "n"]):
        return x + 1

    @kp.fusion(name="same")
    def two(x: T[kp.f32, "n"]):
        return x + 2

    with pytest.raises(ValueError, match="two programs are named 'same'"):
        kp.save([kp.compile(one, targets=ARCH), kp.compile(two, targets=ARCH)],
                tmp_path / "s.kpack")
    for bad in ("größe", "my kernel", "a" * 961, "<lambda>"):
        with pytest.raises(ValueError, match="ASCII identifier"):
            kp.fusion(name=bad)(lambda x: x)
    src = tmp_path / "r28_clash.py"
    src.write_text(textwrap.dedent("""
        import kernelpack as kp
        @kp.fusion(name="k")
        def a(x: kp.Tensor[kp.f32, "n"]): return x + 1
        @kp.fusion(name="k")
        def b(x: kp.Tensor[kp.f32, "n"]): return x + 2
    """))
    code = cli_main(["build", str(src), "-o", str(tmp_path / "o.kpack"), "--targets", "sm_80",
                     "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "both make a program named 'k'" in err
    assert not (tmp_path / "o.kpack").exists()


def test_build_with_future_annotations_and_aliases(tmp_path, capsys):
    src = tmp_path / "r28_future.py"
    src.write_text(textwrap.dedent("""
        from __future__ import annotations
        import kernelpack as kp
        Vec = kp.Tensor[kp.f32, "n"]

        @kp.fusion
        def axpy(x: Vec, y: kp.Tensor[kp.f32, 'n'], *, a: kp.f32):
            return {"r": a * x + y}

        def _make(dt):
            Local = kp.Tensor[dt, "k"]
            @kp.fusion(name="twice64")
            def twice(x: Local):
                return x * 2
            return twice

        twice64 = _make(kp.f64)
    """))
    out = tmp_path / "f.kpack"
    assert cli_main(["build", str(src), "-o", str(out), "--targets", "sm_80", "-q"]) == 0
    pack = kp.load(out)
    assert sorted(pack.programs) == ["axpy", "twice64"]
    assert pack["twice64"].summary.inputs[0].dtype == kp.f64
    assert [p.name for p in pack["axpy"].summary.inputs] == ["x", "y", "a"]


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"foo": 1}, TypeError, r"unknown kp.compile option\(s\) \['foo'\]"),
    ({"statics": {"n": 4}}, TypeError, "statics"),
    ({"static": {"m": 4}}, kp.TraceError, r"unknown dim\(s\) \['m'\]"),
    ({"static": {"x": 4}}, kp.TraceError, r"unknown dim\(s\) \['x'\]"),
    ({"static": {"n": 4.0}}, TypeError, "must be an int"),
    ({"static": {"n": True}}, TypeError, "must be an int"),
    ({"static": {"n": -1}}, ValueError, "cannot be negative"),
    ({"static": {"n": 1 << 63}}, ValueError, "does not fit int64"),
    ({"static": [("n", 4)]}, TypeError, "must map dim names"),
    ({"targets": "sm_80"}, TypeError, "targets must be a list"),
    ({"targets": []}, ValueError, "no architecture"),
    ({"targets": [80]}, TypeError, "must be strings"),
    ({"opt": 4}, ValueError, "0..3"),
    ({"cache": True}, TypeError, "kp.Cache"),
])
def test_compile_option_errors(kwargs, exc, match):
    @kp.fusion
    def opts(x: T[kp.f32, "b", "n"]):
        return x * 2

    kwargs = {"targets": ARCH, **kwargs}
    with pytest.raises(exc, match=match):
        kp.compile(opts, **kwargs)


def test_static_every_dim_numpy_ints_and_duplicated_targets(tmp_path):
    @kp.fusion
    def st(x: T[kp.f32, "b", "n"], y: T[kp.f32, "n"]):
        return (x + y).sum(axis=1)

    a = kp.compile(st, targets=["sm_80", "sm_80", "ptx", "ptx"], static={"n": np.int64(4)})
    b = kp.compile(st, targets=("ptx", "sm_80"), static={"n": 4})
    assert a == b
    assert sorted(i.target for m in a.modules for i in m.images) == ["compute_80", "sm_80"]
    k = Kernels(st, {"b": 3, "n": 4})
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(k(x, X4)[0], (x + X4).sum(1), rtol=1e-6)
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[1\] is 5, expected 4"):
        k.planner.plan((3, 5), (5,))


_DET_SRC = """
import sys, kernelpack as kp
T = kp.Tensor
@kp.fusion
def ln(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n"], eps: kp.f32):
    m = x.mean(axis=1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=1, keepdims=True)
    y = (x - m) * kp.rsqrt(v + eps) * w
    return {"y": y, "tot": y.sum(), "col": x.sum(axis=0)}
@kp.fusion
def g(x: T[kp.f64, "n"]):
    return kp.tanh(x) * 3.0 + x.max()
progs = [kp.compile(f, targets=%s) for f in (%s)]
kp.save(progs, sys.argv[1])
"""


def test_builds_are_byte_identical_across_processes_orders_and_hash_seeds(tmp_path):
    paths = []
    for seed, targets, order in (("1", '["sm_80", "ptx"]', "ln, g"),
                                 ("2", '["ptx", "sm_80"]', "g, ln")):
        script = tmp_path / f"det{seed}.py"
        script.write_text(_DET_SRC % (targets, order))
        out = tmp_path / f"det{seed}.kpack"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, str(script), str(out)], check=True, env=env,
                       timeout=120)
        paths.append(out)
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert len(digests) == 1
