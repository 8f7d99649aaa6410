"""The fusion DSL front: tracing, symbolic shapes, typing rules, trace errors, canonical bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kernelpack as kp
from kernelpack.expr import shl, sym
from kernelpack.fusion import Fusion

T = kp.Tensor


def test_decorator_traces_symbolic_shapes_and_outputs():
    @kp.fusion
    def f(x: T[kp.f32, "b", "n"], s: kp.f32):
        return {"y": x * s, "m": x.max(axis=1)}

    g = f.trace()
    assert isinstance(f, Fusion) and f.name == "f"
    assert [p[0] for p in g.params] == ["x", "s"]
    shapes = {name: g.nodes[nid].shape for name, nid in g.outputs}
    assert shapes == {"y": (sym("b"), sym("n")), "m": (sym("b"),)}
    assert g.nodes[dict(g.outputs)["y"]].dtype == kp.f32


def test_arange_of_a_shifted_dim_gives_shl_shapes():
    @kp.fusion
    def f(x: T[kp.f64, "b", "n"]):
        idx = kp.arange(1 << x.shape[1])
        return idx[None, :].astype(kp.f64) + x.sum(axis=1, keepdims=True)

    g = f.trace()
    (name, nid), = g.outputs
    assert g.nodes[nid].shape == (sym("b"), shl(1, "n"))


def test_integer_scalar_is_usable_as_a_size():
    @kp.fusion
    def f(j: T[kp.i64, "b"], n: kp.i64):
        return kp.arange(1 << n)[None, :] == j[:, None]

    g = f.trace()
    assert g.nodes[g.outputs[0][1]].shape == (sym("b"), shl(1, "n"))
    assert g.nodes[g.outputs[0][1]].dtype == kp.bool_


def test_weak_python_scalars_keep_the_tensor_dtype():
    @kp.fusion
    def f(x: T[kp.f32, "n"], i: T[kp.i32, "n"]):
        return 2.5 * x + 1, i * 3, i * 0.5

    g = f.trace()
    dts = [g.nodes[nid].dtype for _, nid in g.outputs]
    assert dts == [kp.f32, kp.i32, kp.f64]


def test_reductions_keepdims_axes_and_accumulator_dtypes():
    @kp.fusion
    def f(x: T[kp.f32, "a", "b", "c"], m: T[kp.bool_, "a", "b", "c"]):
        return (x.sum(axis=(0, 2)), x.mean(axis=-1, keepdims=True), m.sum(), x.max())

    g = f.trace()
    outs = [g.nodes[nid] for _, nid in g.outputs]
    assert outs[0].shape == (sym("b"),)
    assert outs[1].shape == (sym("a"), sym("b"), kp.Expr("const", (), 1))
    assert outs[2].shape == () and outs[2].dtype == kp.i64
    assert outs[3].shape == () and outs[3].dtype == kp.f32


def test_functional_reductions_match_the_methods():
    """kp.sum / kp.prod / kp.mean are NumPy's functional forms of the methods."""
    @kp.fusion
    def functional(x: T[kp.f32, "a", "b"]):
        return (kp.sum(x, axis=1), kp.prod(x, 0, keepdims=True), kp.mean(x, -1, kp.f64),
                kp.sum(x))

    @kp.fusion
    def methods(x: T[kp.f32, "a", "b"]):
        return (x.sum(axis=1), x.prod(0, keepdims=True), x.mean(-1, kp.f64), x.sum())

    got, want = functional.trace(), methods.trace()
    assert [(n.shape, n.dtype) for n in (got.nodes[i] for _, i in got.outputs)] == \
        [(n.shape, n.dtype) for n in (want.nodes[i] for _, i in want.outputs)]
    assert [(n.shape, n.dtype) for n in (got.nodes[i] for _, i in got.outputs)][2] == \
        ((sym("a"),), kp.f64)

    @kp.fusion
    def bad(x: T[kp.f32, "a"]):
        return kp.sum(3) + x

    with pytest.raises(kp.TraceError, match=r"kp\.sum: expects a traced tensor \(got 3\)"):
        bad.trace()


def test_static_dims_are_substituted():
    @kp.fusion
    def f(x: T[kp.f32, "b", "n"]):
        return x + 1

    g = f.trace(static={"n": 128})
    assert g.params[0][3][1].is_const and int(g.params[0][3][1]) == 128


@pytest.mark.parametrize("static,error,match", [
    ({"m": 4}, kp.TraceError, r"static= names unknown dim\(s\) \['m'\] \(the fusion's dims: \['b', 'n'\]\)"),
    ({"n": -1}, ValueError, r"static\['n'\] = -1: a dim cannot be negative"),
    ({"n": "x"}, TypeError, r"static\['n'\] must be an int \(got 'x'\)"),
    ({"n": True}, TypeError, r"static\['n'\] must be an int"),
    ([("n", 4)], TypeError, r"static= must map dim names to sizes"),
])
def test_static_dims_are_checked_against_the_fusion(static, error, match, tmp_path):
    @kp.fusion
    def f(x: T[kp.f32, "b", "n"]):
        return x + 1

    with pytest.raises(error, match=match):
        f.trace(static=static)
    with pytest.raises(error, match=match):
        kp.compile(f, targets=["sm_80"], static=static, cache=kp.Cache(tmp_path, remote=False))


def test_compile_argument_types_are_checked_before_any_work():
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x + 1

    with pytest.raises(TypeError, match=r"targets must be a list .* \(got 'sm_80'\)"):
        kp.compile(f, targets="sm_80")
    with pytest.raises(TypeError, match=r"targets must be strings .* \(got 90 in"):
        kp.compile(f, targets=["sm_80", 90])
    with pytest.raises(TypeError, match=r"cache= takes a kp.Cache \(got str"):
        kp.compile(f, targets=["sm_80"], cache="/tmp/somewhere")
    import numpy as np
    assert f.static_dims({"n": np.int64(8)}) == {"n": 8}


@pytest.mark.parametrize("body,match", [
    (lambda x, y: x + y, r"add: dtype mismatch float32\[n\] and float64\[m\]"),
    (lambda x, y: x + y.astype(kp.f32), r"add: shapes \(n,\) and \(m,\) do not broadcast"),
    (lambda x, y: x << 1, r"shl: needs integer"),
    (lambda x, y: x.sum(axis=3), r"sum: axis 3 out of range"),
    (lambda x, y: x[0], r"only ':'"),
    (lambda x, y: kp.where(x, x, y), r"where: dtype mismatch float32\[n\] and float64\[m\]"),
])
def test_trace_errors_name_the_op_and_shapes(body, match):
    @kp.fusion
    def f(x: T[kp.f32, "n"], y: T[kp.f64, "m"]):
        return body(x, y)

    with pytest.raises(kp.TraceError, match=match):
        f.trace()


def test_annotations_are_required():
    with pytest.raises(kp.TraceError, match="parameter 'x' needs an annotation"):
        @kp.fusion
        def f(x):
            return x


def test_calling_a_fusion_directly_is_a_clear_type_error():
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x

    with pytest.raises(TypeError, match="kp.compile"):
        f(1)


def test_canonical_bytes_are_stable_across_processes():
    code = ("import kernelpack as kp\n"
            "@kp.fusion\n"
            "def f(x: kp.Tensor[kp.f32, 'b', 'n'], s: kp.f32):\n"
            "    e = kp.exp(x * s - (x * s).max(axis=1, keepdims=True))\n"
            "    return e / e.sum(axis=1, keepdims=True)\n"
            "import sys; sys.stdout.buffer.write(f.canonical_bytes(options={'opt': 3}))\n")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                           env=_env()).stdout for _ in range(2)}
    assert len(runs) == 1
    assert b"0x" not in next(iter(runs))  # no addresses


def test_canonical_bytes_change_with_the_graph_and_options():
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x + 1.0

    @kp.fusion(name="f")
    def g(x: T[kp.f32, "n"]):
        return x + 2.0

    assert f.canonical_bytes() != g.canonical_bytes()
    assert f.canonical_bytes() != f.canonical_bytes(options={"opt": 2})
    assert f.canonical_bytes(static={"n": 4}) != f.canonical_bytes()


def test_expr_fallbacks_for_plain_ints():
    assert kp.max(3, sym("n")) == kp.emax(3, "n")
    assert kp.min(2, 5) == kp.emin(2, 5)
    assert kp.where(sym("n") > 0, 1, 2) == kp.select(sym("n") > 0, 1, 2)
    assert kp.abs(-4) == 4


def test_import_kernelpack_does_not_import_llvmlite():
    out = subprocess.run([sys.executable, "-c", "import sys, kernelpack as kp; "
                          "kp.fusion; print('llvmlite' in sys.modules, "
                          "'kernelpack.lowering' in sys.modules)"],
                         capture_output=True, text=True, check=True, env=_env()).stdout
    assert out.split() == ["False", "False"]


def _env() -> dict:
    import os
    from pathlib import Path

    env = dict(os.environ)
    src = str(Path(kp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def test_dims_on_the_left_of_tensor_arithmetic():
    """``x.shape[0] * x``: the dim (an Expr) declines the traced tensor, which then multiplies
    (reflected); an Expr with a float still fails as Python does."""
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x.shape[0] * x + (1 + x.shape[0]) - x.shape[0] // 2 * x

    ops = [n.op for n in f.trace().nodes]
    assert ops.count("dim") >= 1 and "mul" in ops
    with pytest.raises(TypeError, match="unsupported operand"):
        sym("n") * 2.5


def test_zeros_for_imag_and_power_zero_do_not_read_the_values():
    """``x.imag`` of a real tensor and ``x ** 0`` are constants of x's shape (a select on a
    constant condition), not ``0 * x``, which is NaN where x is NaN or infinite."""
    @kp.fusion
    def f(x: T[kp.f32, "n"]):
        return x.imag, x ** 0

    g = f.trace()
    for _, nid in g.outputs:
        node = g.nodes[nid]
        while node.op != "where":
            node = g.nodes[node.inputs[0]]
        cond, zero, _ = (g.nodes[i] for i in node.inputs)
        assert cond.op == "const" and cond.attrs[0] is True and zero.attrs[0] == 0


def test_canonical_bytes_write_long_size_expressions_in_full():
    """Two fusions whose sizes differ only past the few hundred nodes str() prints used to
    get the same cache key (one would be served the other's kernel)."""
    def make(last: int) -> Fusion:
        @kp.fusion(name="long_size")
        def f(x: T[kp.f32, "n"]):
            terms = [kp.emax(x.shape[0] - i, i) for i in range(300)]
            while len(terms) > 1:  # pairwise: long to print, shallow enough to save
                terms = [kp.emax(*terms[k:k + 2]) if k + 1 < len(terms) else terms[k]
                         for k in range(0, len(terms), 2)]
            return kp.arange(terms[0] + last).astype(kp.f32)
        return f

    assert make(1).canonical_bytes() != make(2).canonical_bytes()
    assert make(1).canonical_bytes() == make(1).canonical_bytes()


def test_torch_style_size_call_names_shape():
    """``x.size`` is NumPy's element count (an expression); torch's ``x.size(0)`` used to fail
    with Python's bare "'Expr' object is not callable". The error now points at x.shape[i]."""
    @kp.fusion
    def scaled(x: kp.Tensor[kp.f32, "n"]):
        return x * x.size(0)

    with pytest.raises(TypeError, match=r"not callable .*write x\.shape\[i\].*x\.size is the "
                                         r"element count"):
        kp.compile(scaled, targets=["sm_80"])


def test_annotated_parameters_are_read_from_their_metadata() -> None:
    """``typing.Annotated[T, kp.Tensor[...]]`` (what a mypy/pyright user writes: README "Type
    checkers") traces as the plain annotation: same parameters, same key."""
    from typing import Annotated, Any

    rows = Annotated[Any, kp.Tensor[kp.f32, "b", "n"]]

    @kp.fusion(name="scaled")
    def typed(x: rows, s: Annotated[float, kp.f32]) -> Any:
        return x * s

    @kp.fusion(name="scaled")
    def plain(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
        return x * s

    assert typed.params == plain.params
    assert typed.canonical_bytes() == plain.canonical_bytes()
    def no_kernelpack_metadata(x: Annotated[Any, "rows"]) -> Any:
        return x

    with pytest.raises(kp.TraceError, match=r"parameter 'x' needs an annotation"):
        kp.fusion(no_kernelpack_metadata)


def test_a_fusion_wrapped_again_reads_its_functions_annotations():
    """``kp.fusion(name=...)`` of a fusion, and ``kp.fusion`` of that, read the function's
    annotations on every Python: from 3.14 (PEP 649) ``functools.update_wrapper`` copies
    ``__annotate__``, which a wrapper that is not a function does not use, and the renamed
    fusion read none ("parameter 'x' needs an annotation ... (got None)"). A fusion's
    ``inspect.get_annotations`` is its function's, as before 3.14."""
    import inspect

    @kp.fusion
    def base(x: T[kp.f32, "n"], s: kp.f64):
        return x * s

    renamed = kp.fusion(name="renamed")(base)
    again = kp.fusion(renamed)
    assert (renamed.name, again.name) == ("renamed", "renamed")
    assert renamed.params == again.params == base.params == [
        ("x", kp.Tensor[kp.f32, "n"]), ("s", kp.f64)]
    assert inspect.get_annotations(again) == inspect.get_annotations(base) \
        == base.fn.__annotations__ != {}


@pytest.mark.skipif(sys.version_info < (3, 14), reason="before Python 3.14 (PEP 649) the def "
                    "itself raises NameError for a name its annotations use that does not exist")
def test_an_annotation_naming_nothing_is_a_trace_error_naming_the_fusion():
    """From 3.14 annotations are evaluated when first read: kp.fusion reads them, so their
    NameError is its TraceError (it came from inspect.signature before)."""
    source = "@kp.fusion\ndef lost(x: Nope[kp.f32, 'n']):\n    return x\n"
    code = compile(source, "<fusion>", "exec", dont_inherit=True)  # no future import here
    with pytest.raises(kp.TraceError, match="fusion lost: cannot read the annotation of "
                       "parameter 'x': name 'Nope'"):
        exec(code, {"kp": kp})


@pytest.mark.parametrize("how", ["functools.cache", "lru_cache", "dict key", "set member"])
def test_hashing_a_traced_tensor_is_a_trace_error_that_says_why(how):
    """A bare "unhashable type: 'Value'" named neither the cause nor the fix (reviews 70, 71).
    Still a TypeError for code that catches one."""
    import functools

    def body(x: kp.Tensor[kp.f32, "n"]):
        if how == "dict key":
            return {x: 2}[x] * x
        if how == "set member":
            return x * len({x})
        return x * 2

    wrapped = {"functools.cache": functools.cache, "lru_cache": functools.lru_cache(None)}
    f = kp.fusion(name="hashy")(wrapped.get(how, lambda fn: fn)(body))
    with pytest.raises(kp.TraceError, match=r"fusion hashy: a traced tensor was hashed.*"
                       r"functools\.cache.*apply @kp\.fusion to the function itself") as info:
        f.trace()
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value.__cause__, TypeError)


def test_an_inlined_fusions_hashing_error_names_the_inlined_fusion():
    @kp.fusion
    def inner(x: kp.Tensor[kp.f32, "n"]):
        return x * len({x})

    @kp.fusion
    def outer(x: kp.Tensor[kp.f32, "n"]):
        return inner(x) + 1

    with pytest.raises(kp.TraceError, match="^fusion inner: a traced tensor was hashed"):
        outer.trace()


def test_other_type_errors_of_a_fusions_function_pass_unchanged():
    @kp.fusion
    def f(x: kp.Tensor[kp.f32, "n"]):
        return sorted([x, x], key=None, reverse=1, extra=True)

    with pytest.raises(TypeError) as info:
        f.trace()
    assert not isinstance(info.value, kp.KernelPackError)
