"""Review 70: how ``@kp.fusion`` reads signatures and annotations on Python 3.14 (PEP 649/749,
deferred annotations), black-box against 3.11, at c85df6e.

Right on both (3.14-only constructs skipped below 3.14): names defined after the def (module,
class body: decorated later on 3.14; decorated at once: a TraceError naming the fusion, as for
an attribute typo or an ``__annotate__`` that raises, AttributeError too); loops decorating in
the loop, factories decorated later; a global rebound after the decorator (fusion, renamed
copy, re-fused function keep the decoration-time dtype); class bodies (staticmethod above or
below, class attribute shadowing a global, class in a function); the future import (closure
loops, class bodies, local Annotated aliases); README's Annotated form (same key); hand-set
``__annotations__``/``__annotate__``; wraps decorators below/above, a plain one (variadic
TraceError); kp.fusion(name=) of a staticmethod, bound method, wrapper, fusion; annotationlib's
formats of a fusion; inlining. Language changes (no test): on 3.14 a def in a loop decorated
*after* the loop reads the loop variable's last value, a global rebound between def and
kp.fusion is read rebound (3.11: def time; the future import did so on both already).

Bugs found, fixed the same session (session 56: fusion.py, fusion_signature.py); the tests
below were strict xfails before the fix:
1. All versions, future import: kp.fusion(name=...) of a fusion re-evaluated its strings:
   after ``DT`` was rebound it compiled float64 where the fusion is float32, and a closure's
   fusion could not be renamed outside it ("name 'dt' is not defined"). Now a Fusion on the
   ``__wrapped__`` chain lends its params (and its ``__annotations__``).
2. 3.14: a functools.wraps wrapper's ``__annotations__`` and its function's are evaluated
   apart; kp.fusion read the function's (inspect.unwrap), Fusion.__annotations__ the
   wrapper's. A registering decorator that read the wrapper's in a loop saw float32, float64;
   kp.fusion later compiled float64 twice (3.11: float32, float64) with __annotations__ saying
   float32. Now a disagreement is a TraceError naming the parameter, and __annotations__ comes
   from the function whose annotations were read.
3. 3.14: kp.fusion of an update_wrapper callable object or an lru_cache wrapper:
   inspect.get_annotations(fusion) was {} (session 55's family): taken from inspect.unwrap now.
4. An annotation that cannot be evaluated: the TraceError named the fusion, not the parameter
   (strings on all versions, unquoted on 3.14); each one's text is now evaluated on its own.
5. Gap (3.12+): ``type Rows = Annotated[Any, kp.Tensor[...]]`` (PEP 695) was refused ("got
   Rows"): a TypeAliasType's ``__value__`` is looked through now.
"""

import functools
import inspect
import sys

import pytest

import kernelpack as kp

T = kp.Tensor
PY314 = sys.version_info >= (3, 14)
needs_314 = pytest.mark.skipif(not PY314, reason="needs Python 3.14's deferred annotations "
                               "(PEP 649): the def itself evaluates them before")


def sig(f):
    """What the trace (hence the summary) takes: (name, dtype, dims) per parameter."""
    assert isinstance(f, kp.fusion.__globals__["Fusion"]), f
    return [(n, d.name, tuple(str(s) for s in shape)) for n, _, d, shape in f.trace().params]


def run(source, **names):
    """Run ``source`` as a module of its own (its own future imports, none inherited)."""
    ns = {"kp": kp, "T": T, **names}
    exec(compile(source, "<review70>", "exec", dont_inherit=True), ns)
    return ns


X32, X64, X16 = (("x", "float32", ("n",)), ("x", "float64", ("n",)), ("x", "float16", ("n",)))


# --- forward references and rebinding -----------------------------------------------------

@needs_314
def test_module_forward_reference_decorated_later_compiles_what_it_names():
    ns = run("def fb(x: T[DT, 'n'], s: DT):\n    return x * s\nDT = kp.f64\n"
             "fused = kp.fusion(fb)\n")
    summary = kp.compile(ns["fused"], targets=["sm_90"]).summary
    assert [(p.name, p.dtype.name) for p in summary.params] == [
        ("x", "float64"), ("s", "float64"), ("out", "float64")]


@needs_314
@pytest.mark.parametrize("ann, words", [("T[DT, 'n']", "name 'DT' is not defined"),
                                        ("T[kp.f33, 'n']", "has no attribute 'f33'"),
                                        ("T[kp.f32, 1.5]", "dims must be names or ints")])
def test_an_annotation_failing_at_decoration_is_a_trace_error_naming_the_fusion(ann, words):
    with pytest.raises(kp.TraceError, match=f"fusion early: cannot read the annotation of "
                       f"parameter 'x': .*{words}"):
        run(f"@kp.fusion\ndef early(x: {ann}):\n    return x\nDT = kp.f32\n")


def test_a_global_rebound_after_the_decorator_keeps_the_decoration_time_dtype():
    ns = run("DT = kp.f32\n@kp.fusion\ndef fd(x: T[DT, 'n']):\n    return x * 2\nDT = kp.f64\n")
    fd = ns["fd"]
    assert sig(fd) == sig(kp.fusion(name="fd2")(fd)) == sig(kp.fusion(name="fd3")(fd.fn)) \
        == [X32]


def test_loops_decorating_in_the_loop_see_each_dtype():
    ns = run("fs = []\nfor dt in (kp.f32, kp.f64, kp.f16):\n"
             "    @kp.fusion(name=f'fa_{dt.name}')\n"
             "    def f(x: T[dt, 'n'], s: dt):\n        return x * s\n    fs.append(f)\n")
    assert [(f.name, sig(f)) for f in ns["fs"]] == [
        (f"fa_{d}", [("x", d, ("n",)), ("s", d, ())]) for d in ("float32", "float64", "float16")]

    def closure_loop():
        fs = []
        for dt in (kp.f32, kp.f64):
            @kp.fusion(name=f"fc_{dt.name}")
            def f(x: T[dt, "n"]):
                return x + 1
            fs.append(f)
        return fs
    assert [sig(f) for f in closure_loop()] == [[X32], [X64]]

    def make(dt):  # a factory, its function decorated later
        def body(x: T[dt, "n"]):
            return x + 1
        return body
    assert [sig(kp.fusion(name=f"fe_{d.name}")(make(d))) for d in (kp.f32, kp.f64)] == [
        [X32], [X64]]


# --- class bodies ---------------------------------------------------------------------------

DT = kp.f32  # shadowed by the class attributes below


def test_class_body_fusions_read_the_class_namespace():
    class Ops:
        DT = kp.f64

        @staticmethod
        @kp.fusion
        def f(x: T[DT, "n"], s: DT):
            return x * s

        @kp.fusion
        @staticmethod
        def g(x: T[DT, "n"], s: DT):
            return x * s

        def h(x: T[DT, "n"], s: DT):
            return x * s
    want = [X64, ("s", "float64", ())]
    assert sig(Ops.f) == sig(Ops.g) == sig(kp.fusion(name="g2")(Ops.g)) == want
    assert sig(kp.fusion(Ops.h)) == sig(kp.fusion(name="sm")(Ops.__dict__["f"])) == want

    def c():  # a class inside a function sees the function's locals
        dt = kp.f16

        class Ops:
            @kp.fusion
            def f(x: T[dt, "n"]):
                return x + 1
        return Ops.f
    assert sig(c()) == [X16]


@needs_314
def test_a_class_body_forward_reference_is_read_when_fused():
    ns = run("class Ops:\n    def h(x: T[DT, 'n']):\n        return x + 1\n    DT = kp.f16\n"
             "fused = kp.fusion(Ops.h)\n")
    assert sig(ns["fused"]) == [X16]


# --- from __future__ import annotations, Annotated ------------------------------------------

FUTURE = """from __future__ import annotations
from typing import Annotated, Any
DT = kp.f32
def closure_loop():
    fs = []
    for dt in (kp.f32, kp.f64):
        @kp.fusion(name=f"fa_{dt.name}")
        def f(x: T[dt, "n"], s: dt):
            return x * s
        fs.append(f)
    return fs
def in_class():
    class Ops:
        DT = kp.f64
        @staticmethod
        @kp.fusion
        def f(x: T[DT, "n"], s: DT):
            return x * s
    return Ops.f
def local_alias():
    R = Annotated[Any, T[kp.f16, "n"]]
    @kp.fusion
    def f(x: R):
        return x + 1
    return f
"""


def test_future_import_strings_are_read_where_defined():
    ns = run(FUTURE)
    assert [sig(f) for f in ns["closure_loop"]()] == [
        [X32, ("s", "float32", ())], [X64, ("s", "float64", ())]]
    assert sig(ns["in_class"]()) == [X64, ("s", "float64", ())]
    assert sig(ns["local_alias"]()) == [X16]


def test_readme_annotated_form_is_the_same_fusion_as_unwrapped():
    from typing import Annotated, Any
    Rows = Annotated[Any, T[kp.f32, "b", "n"]]

    @kp.fusion(name="sm")
    def typed(x: Rows, s: Annotated[float, kp.f32]) -> Any:
        return x * s

    @kp.fusion(name="sm")
    def plain(x: T[kp.f32, "b", "n"], s: kp.f32):
        return x * s
    assert typed.params == plain.params
    assert typed.canonical_bytes() == plain.canonical_bytes()


# --- annotations set by hand ----------------------------------------------------------------

def test_hand_set_and_mutated_annotations_are_read():
    def body(x, s):
        return x * s
    body.__annotations__ = {"x": T[kp.f16, "n"], "s": kp.f16}
    assert sig(kp.fusion(body)) == [X16, ("s", "float16", ())]

    def other(x: T[kp.f32, "n"]):
        return x
    other.__annotations__["x"] = T[kp.f64, "n"]
    assert sig(kp.fusion(other)) == [X64]


@needs_314
def test_hand_set_annotate_functions():
    def body(x, s):
        return x * s

    def ann(fmt):
        if fmt != 1:
            raise NotImplementedError
        return {"x": T[kp.f64, "m"], "s": kp.f64}
    body.__annotate__ = ann
    assert sig(kp.fusion(body)) == [("x", "float64", ("m",)), ("s", "float64", ())]
    for exc in (RuntimeError("boom"), AttributeError("boom")):  # not swallowed by a getattr
        def raising(fmt, exc=exc):
            raise exc
        body.__annotate__ = raising
        with pytest.raises(kp.TraceError, match="fusion body: cannot read annotations.*: boom"):
            kp.fusion(body)
    body.__annotate__ = None  # clears them
    with pytest.raises(kp.TraceError, match="fusion body: parameter 'x' needs an annotation"):
        kp.fusion(body)


# --- decorators and wrappers ----------------------------------------------------------------

def logged(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)
    return wrapper


class Counted:
    def __init__(self, fn):
        functools.update_wrapper(self, fn)

    def __call__(self, *a, **k):
        return self.__wrapped__(*a, **k)


def body16(x: T[kp.f16, "n"]):
    return x + 1


class Holder:
    def m(self, x: T[kp.f16, "n"]):
        return x + 1


def test_stacked_decorators():
    below = kp.fusion(logged(body16))
    assert sig(below) == [X16] and below.name == "body16"
    above = logged(kp.fusion(body16))
    with pytest.raises(TypeError, match="kp.compile takes a @kp.fusion function"):
        kp.compile(above, targets=["sm_90"])
    assert sig(kp.fusion(name="again")(above)) == [X16]

    def plain(fn):
        def wrapper(*a, **k):
            return fn(*a, **k)
        return wrapper
    with pytest.raises(kp.TraceError, match="fusion wrapper: parameter 'a' is variadic"):
        kp.fusion(plain(body16))


@pytest.mark.parametrize("make", [lambda: body16, lambda: staticmethod(body16),
                                  lambda: Holder().m, lambda: logged(body16),
                                  lambda: kp.fusion(body16)],
                         ids=["function", "staticmethod", "bound", "wraps", "fusion"])
def test_renamed_wrappers_take_the_functions_annotations(make):
    f = kp.fusion(name="k")(make())
    assert sig(f) == [X16]
    assert inspect.get_annotations(f) == {"x": T[kp.f16, "n"]}


@pytest.mark.parametrize("make", [lambda: Counted(body16), lambda: functools.lru_cache(body16)],
                         ids=["callable-object", "lru_cache"])
def test_a_non_function_wrappers_fusion_has_the_functions_annotations(make):
    f = kp.fusion(name="k")(make())
    # right on both versions (params: an lru_cache'd body cannot be traced: Values are unhashable)
    assert f.params == [("x", T[kp.f16, "n"])]
    assert inspect.get_annotations(f) == {"x": T[kp.f16, "n"]}


@needs_314
def test_annotationlib_formats_of_a_fusion_match_its_functions():
    import annotationlib as al
    base = kp.fusion(body16)
    renamed = kp.fusion(name="renamed")(base)
    for fmt in (al.Format.VALUE, al.Format.FORWARDREF, al.Format.STRING):
        want = al.get_annotations(body16, format=fmt)
        assert al.get_annotations(base, format=fmt) == al.get_annotations(renamed, format=fmt) \
            == want, fmt
    assert al.get_annotations(base, format=al.Format.STRING) == {"x": "T[kp.f16, 'n']"}


REGISTRY = """
REG = []
def register(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)
    REG.append(({read}.dtype, wrapper))  # records each body's dtype
    return wrapper
for dt in (kp.f32, kp.f64):
    @register
    def body(x: T[dt, "n"]):
        return x + 1
"""


@pytest.mark.parametrize("read", ["wrapper.__annotations__['x']",
                                  "inspect.signature(fn).parameters['x'].annotation"],
                         ids=["wrapper-read-early", "function-read-early"])
def test_a_registering_wrapper_and_kp_fusion_agree_on_the_dtype(read):
    ns = run(REGISTRY.format(read=read), functools=functools, inspect=inspect)
    assert [d.name for d, _ in ns["REG"]] == ["float32", "float64"]
    for i, (dt, w) in enumerate(ns["REG"]):  # that dtype, or a refusal naming the parameter
        try:
            f = kp.fusion(name=f"r{i}")(w)
        except kp.TraceError as exc:
            assert "'x'" in str(exc)
            continue
        assert sig(f) == [("x", dt.name, ("n",))]
        assert f.__annotations__["x"] == f.params[0][1]


# --- inlining -------------------------------------------------------------------------------

def test_inlining_reads_callees_by_their_own_annotations():
    ns = run("@kp.fusion\ndef outer(x: T[DT, 'n']):\n    return inner(x) * 2\n"
             "@kp.fusion\ndef inner(x: T[DT, 'n']):\n    return x + 1\n", DT=kp.f64)
    assert sig(ns["outer"]) == [X64]
    ns = run("DT = kp.f32\n@kp.fusion\ndef inner(x: T[DT, 'n']):\n    return x + 1\n"
             "DT = kp.f64\n@kp.fusion\ndef outer(x: T[DT, 'n']):\n    return inner(x)\n")
    with pytest.raises(kp.TraceError, match="fusion inner called inside a trace: x is float64 "
                       "of rank 1, annotated float32"):
        ns["outer"].trace()


# --- renaming a fusion whose annotations are strings ------------------------------------------

RENAME = """from __future__ import annotations
DT = kp.f32
@kp.fusion
def f(x: T[DT, "n"], s: DT):
    return x * s
DT = kp.f64
def make():
    dt = kp.f64
    @kp.fusion
    def h(x: T[dt, "n"]):
        return x + 1
    return h
"""


@pytest.mark.parametrize("pick, want", [(lambda ns: ns["f"], [X32, ("s", "float32", ())]),
                                        (lambda ns: ns["make"](), [X64])],
                         ids=["global-rebound", "closure"])
def test_renaming_a_fusion_keeps_its_dtypes_under_the_future_import(pick, want):
    f = pick(run(RENAME))
    assert sig(f) == want
    assert sig(kp.fusion(name="renamed")(f)) == want


# --- error messages -------------------------------------------------------------------------

@pytest.mark.parametrize("future", [pytest.param(True, id="string"),
                                    pytest.param(False, id="deferred", marks=needs_314)])
def test_a_failing_annotation_names_its_parameter(future):
    with pytest.raises(kp.TraceError, match="fusion u: .*'s'.*name 'Nope' is not defined"):
        run("from __future__ import annotations\n" * future + "@kp.fusion\n"
            "def u(x: T[kp.f32, 'n'], s: Nope):\n    return x\n")


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the type statement is Python 3.12+")
def test_a_pep695_alias_of_the_readme_annotated_form():
    ns = run("from typing import Annotated, Any\n"
             "type Rows = Annotated[Any, T[kp.f32, 'b', 'n']]\n"
             "@kp.fusion\ndef f(x: Rows):\n    return x * 2\n")
    assert sig(ns["f"]) == [("x", "float32", ("b", "n"))]


# --- after the fix: the edges of the lender and the agreement check (session 56) ------------

def test_a_wrapper_annotated_otherwise_than_its_function_is_refused_on_every_version():
    """A decorator that sets its wrapper's annotations to another dtype than the function's:
    kp.fusion compiled the function's (float32) silently; now neither wins."""
    def as_float64(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            return fn(*args)
        wrapper.__annotations__ = {"x": T[kp.f64, "n"]}
        return wrapper

    def body(x: T[kp.f32, "n"]):
        return x + 1
    with pytest.raises(kp.TraceError, match=r"fusion body: parameter 'x' is annotated .*float64"
                       r".* on the wrapper .*wrapper.* but .*float32.* on the function it wraps"):
        kp.fusion(as_float64(body))


def test_a_fusion_under_a_wrapper_lends_its_params_when_fused_again():
    ns = run(RENAME)
    wrapped = logged(ns["f"])  # a functools.wraps wrapper whose __wrapped__ is the fusion
    again = kp.fusion(name="again")(wrapped)
    assert sig(again) == [X32, ("s", "float32", ())]
    assert again.__annotations__ == ns["f"].__annotations__ == {"x": "T[DT, 'n']", "s": "DT"}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the type statement is Python 3.12+")
def test_type_aliases_of_aliases_are_followed_and_a_self_alias_is_refused():
    ns = run("type Inner = T[kp.f64, 'n']\ntype Outer = Inner\n"
             "@kp.fusion\ndef f(x: Outer):\n    return x * 2\n")
    assert sig(ns["f"]) == [X64]
    with pytest.raises(kp.TraceError, match="fusion g: parameter 'x' is annotated with a type "
                       "alias nested more than 16 levels deep"):
        run("type Loop = Loop\n@kp.fusion\ndef g(x: Loop):\n    return x\n")


@pytest.mark.parametrize("named", [False, True], ids=["plain", "renamed"])
def test_a_classmethod_is_refused_with_words_saying_what_to_write(named):
    """It was a bare TypeError from inspect.signature ('<classmethod(...)> is not a callable
    object'), the same on 3.11 and 3.14 (review 70's side note)."""
    def body(cls, x: T[kp.f32, "n"]):
        return x
    decorate = kp.fusion(name="k") if named else kp.fusion
    with pytest.raises(TypeError, match=r"kp.fusion decorates a function or a staticmethod, "
                       r"not a classmethod \(.*body\).*@staticmethod above @kp.fusion"):
        decorate(classmethod(body))


def test_a_wrappers_own_return_annotation_is_not_compared():
    """Only parameters must agree: a decorator declaring its wrapper's result (here by hand,
    as a typed decorator may) says nothing about the fusion's inputs."""
    def typed(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            return fn(*args)
        wrapper.__annotations__ = {**fn.__annotations__, "return": object}
        return wrapper

    def body(x: T[kp.f32, "n"]) -> int:
        return x + 1
    assert sig(kp.fusion(typed(body))) == [X32]
