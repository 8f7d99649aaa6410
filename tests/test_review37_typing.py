"""Review 37: static typing as a user of kernelpack experiences it.

kernelpack ships ``py.typed``, so a user's mypy/pyright reads its annotations. These tests
check the annotations a user's tools see, two ways:

- at run time (no type checker needed): ``typing.get_type_hints`` resolves on the public API,
  names in ``__all__`` are bound where a type checker looks for them, constructor annotations
  accept the values the docs pass, documented return types are annotated (not ``Any`` /
  ``object``), and annotated returns hold;
- with mypy (``python -m mypy --strict`` from this interpreter; skipped without mypy): short
  user scripts, several taken from README.md, type-check without ``# type: ignore`` and
  ``reveal_type`` gives the documented types. One mypy run serves every such test.
"""

from __future__ import annotations

import ast
import collections.abc
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import pytest

import kernelpack as kp
from kernelpack import loader as kp_loader
from kernelpack import planner as kp_planner
from kernelpack import runtime as kp_runtime
from kernelpack.cache import Cache, CacheKey
from kernelpack.loader import ImageInfo, ModuleInfo, Pack, SignatureInfo
from kernelpack.program import Program

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


# ---- helpers ------------------------------------------------------------------------------------

def _accepts(tp: Any, value: object) -> bool:
    """Whether ``value`` is an instance of the annotation ``tp``, as a type checker reads it
    (the numeric tower included: an int is a float). Enough of typing for kernelpack's
    annotations: unions, Optional, tuple (fixed and variadic), list/Sequence/Iterable, Mapping,
    Literal, plain classes; anything else is taken as accepted."""
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return any(_accepts(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_accepts(args[0], v) for v in value)
        if not args:
            return True
        return len(args) == len(value) and all(_accepts(a, v) for a, v in zip(args, value))
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        return not args or all(_accepts(args[0], k) and _accepts(args[1], v)
                               for k, v in value.items())
    if origin in (list, set, frozenset, collections.abc.Sequence, collections.abc.Iterable,
                  collections.abc.Collection):
        if not isinstance(value, origin):
            return False
        return not args or all(_accepts(args[0], v) for v in value)  # type: ignore[attr-defined]
    if origin is not None:
        return isinstance(value, origin) if isinstance(origin, type) else True
    if isinstance(tp, type):
        if tp is float:
            return isinstance(value, (int, float))
        if tp is complex:
            return isinstance(value, (int, float, complex))
        return isinstance(value, tp)
    return True


def _python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL)]


def _doc_texts() -> dict[str, str]:
    docs = {"README.md": README.read_text(encoding="utf-8")}
    for p in sorted((REPO / "docs").glob("*.md")):
        docs[f"docs/{p.name}"] = p.read_text(encoding="utf-8")
    return docs


def _doc_fusion_recipes() -> list[str]:
    """Python blocks of the docs that show a ``@kp.fusion`` with ``kp.Tensor[...]``
    annotations *for a type checker* (they mention mypy, pyright or ``type: ignore``)."""
    found = []
    for text in _doc_texts().values():
        for block in _python_blocks(text):
            if ("@kp.fusion" in block and "kp.Tensor[" in block
                    and re.search(r"mypy|pyright|type: ignore", block)):
                found.append(block)
    return found


def _readme_block(*needles: str, exclude: tuple[str, ...] = ()) -> list[str]:
    return [b for b in _python_blocks(README.read_text(encoding="utf-8"))
            if all(n in b for n in needles) and not any(e in b for e in exclude)]


def _sample_compiled() -> kp.Compiled:
    """A small program of the data model (fake cubin bytes: nothing here runs it)."""
    summary = kp.KernelSummary(
        "axpy",
        (kp.Tensor("x", kp.f32, ("n",)), kp.Tensor("y", kp.f32, ("n",), role="inout"),
         kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")),
        (kp.Variant((kp.Launch("axpy", "axpy", (kp.cdiv("n", 256),), (256,),
                               (kp.Arg.buffer("x"), kp.Arg.buffer("y"), kp.Arg.scalar("a"),
                                kp.Arg.scalar("n32"))),)),),
        (kp.Constraint(kp.sym("n") < (1 << 32), "32-bit n"),))
    image = kp.Image("cubin", "sm_90", b"\x7fELF" + bytes(range(200)), "fake 1.0", 12080)
    return kp.Compiled(summary, (kp.Module("axpy", ("axpy",), (image,)),))


# ---- runtime: typing.get_type_hints resolves on the public API -----------------------------------

def _public_members(obj: type) -> list[tuple[str, Callable[..., Any]]]:
    out = []
    for name, member in sorted(vars(obj).items()):
        if name.startswith("_") and name not in ("__init__", "__call__", "__getitem__"):
            continue
        if isinstance(member, property):
            if member.fget is not None:
                out.append((name, member.fget))
        elif isinstance(member, (staticmethod, classmethod)):
            out.append((name, member.__func__))
        elif inspect.isfunction(member):
            out.append((name, member))
    return out


def _hint_targets() -> list[tuple[str, Any]]:
    """Public functions, classes and their methods whose hints a user's tools evaluate
    (sphinx-autodoc-typehints, typeguard, beartype, pydantic's validate_call ...)."""
    targets: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def add(label: str, obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if inspect.isclass(obj):
            targets.append((label, obj))
            for name, fn in _public_members(obj):
                targets.append((f"{label}.{name}", fn))
        elif inspect.isfunction(obj):
            targets.append((label, obj))

    for name in kp.__all__:
        add(f"kp.{name}", getattr(kp, name))
    for cls in (Pack, Program, ModuleInfo, ImageInfo, SignatureInfo):
        add(f"kernelpack.loader.{cls.__name__}", cls)
    for cls in (Cache, CacheKey):
        add(f"kernelpack.cache.{cls.__name__}", cls)
    add("kernelpack.planner.Planner", kp_planner.Planner)
    for name in ("select_image", "explain", "Selection"):
        add(f"kernelpack.runtime.{name}", getattr(kp_runtime, name))
    expr_mod = importlib.import_module("kernelpack.expr")
    for name in expr_mod.__all__:
        add(f"kernelpack.expr.{name}", getattr(expr_mod, name))
    return targets


_HINT_TARGETS = _hint_targets()


@pytest.mark.parametrize("label,obj", _HINT_TARGETS, ids=[t[0] for t in _HINT_TARGETS])
def test_get_type_hints_resolves(label: str, obj: Any) -> None:
    """``typing.get_type_hints`` on a public function, class or method resolves: every name
    its annotations use exists at run time (not only under ``if TYPE_CHECKING:``)."""
    try:
        typing.get_type_hints(obj)
    except NameError as exc:
        pytest.fail(f"typing.get_type_hints({label}) raised NameError: {exc} (a name only "
                    f"imported under TYPE_CHECKING)")


# ---- runtime: names in __all__ exist, and are bound where a type checker looks -----------------

def _all_modules() -> list[str]:
    names = ["kernelpack"]
    for info in pkgutil.walk_packages(kp.__path__, "kernelpack."):
        if info.name.endswith("__main__") or "._generated" in info.name:
            continue
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("modname", _all_modules())
def test_all_names_exist(modname: str) -> None:
    """Every name in a module's ``__all__`` is an attribute of it (``from m import *``)."""
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:  # an optional dependency of that module
        pytest.skip(f"{modname}: {exc}")
    missing = [n for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
    assert not missing, f"{modname}.__all__ names missing attributes: {missing}"


def _statically_bound(tree: ast.Module) -> set[str]:
    """Names a type checker sees bound at a module's top level: imports, defs, classes and
    assignments, including those under ``if``/``try`` (``if TYPE_CHECKING:``)."""
    bound: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    bound.add((a.asname or a.name).split(".")[0])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            bound.add(n.id)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                if isinstance(node.target, ast.Name):
                    bound.add(node.target.id)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
    visit(tree.body)
    return bound


_LAZY_MODULES = ["kernelpack", "kernelpack.external", "kernelpack.runtime", "kernelpack.summary"]


@pytest.mark.parametrize("modname", _LAZY_MODULES)
def test_all_names_statically_bound(modname: str) -> None:
    """A name of ``__all__`` that only a module ``__getattr__`` (PEP 562) provides has, for
    mypy and pyright, the type ``__getattr__`` returns: ``object`` in kernelpack, so
    ``kp.Cache()`` is "object not callable" and ``def f(p: kp.Pack)`` "Variable is not valid
    as a type". Lazy names must also be imported under ``if TYPE_CHECKING:``."""
    mod = importlib.import_module(modname)
    source = Path(mod.__file__).read_text(encoding="utf-8")  # type: ignore[arg-type]
    bound = _statically_bound(ast.parse(source))
    unbound = [n for n in mod.__all__ if n not in bound]
    assert not unbound, (f"{modname}.__all__ names a type checker cannot see (only the module "
                         f"__getattr__ -> object provides them): {unbound}")


def test_py_typed_shipped() -> None:
    """The package carries the PEP 561 marker, so users' type checkers read it at all."""
    assert (Path(kp.__file__).parent / "py.typed").is_file()


# ---- runtime: the entry points are annotated with their documented types -----------------------

@pytest.mark.parametrize("name,expected", [("compile", kp.Compiled), ("save", bytes),
                                           ("load", Pack)], ids=["compile", "save", "load"])
def test_entry_points_annotated(name: str, expected: type) -> None:
    """``kp.compile`` (documented ``-> kp.Compiled``), ``kp.save`` (``-> bytes``) and
    ``kp.load`` (``-> Pack``) carry annotations on every parameter and their return: without
    them a ``mypy --strict`` user gets "Call to untyped function in typed context" on each of
    the three calls every script makes, and ``Any`` for what they return."""
    fn = getattr(kp, name)
    sig = inspect.signature(fn)
    unannotated = [p.name for p in sig.parameters.values()
                   if p.annotation is inspect.Parameter.empty]
    assert not unannotated, f"kp.{name}: parameters without annotations: {unannotated}"
    assert typing.get_type_hints(fn).get("return") is expected


def _fget(cls: type, name: str) -> Callable[..., Any]:
    member = inspect.getattr_static(cls, name)
    return member.fget if isinstance(member, property) else member


@pytest.mark.parametrize("label,fn,expected", [
    ("Program.plan", _fget(Program, "plan"), kp.Plan),
    ("Program.planner", _fget(Program, "planner"), kp_planner.Planner),
], ids=["Program.plan", "Program.planner"])
def test_documented_return_types_not_any(label: str, fn: Callable[..., Any],
                                         expected: type) -> None:
    """``pack[name].plan(...)`` is documented to return a :class:`Plan` (README:
    ``plan.launches[0].grid``) and ``.planner`` the :class:`Planner`; annotated ``Any``, a
    user's ``plan.lanches`` typo passes the type checker."""
    assert typing.get_type_hints(fn).get("return") is expected, label


def test_fusion_decorator_return_not_any() -> None:
    """``kp.fusion`` "Returns a :class:`Fusion`" (its docstring); annotated ``Any``, every
    ``@kp.fusion`` function is ``Any`` to a type checker (overloads give ``Fusion`` for
    ``@kp.fusion`` and a ``Callable[..., Fusion]`` for ``@kp.fusion(name=...)``)."""
    fn = kp.fusion
    overloads = getattr(typing, "get_overloads", lambda f: [])(fn)
    returns = [typing.get_type_hints(o).get("return") for o in overloads] or \
        [typing.get_type_hints(fn).get("return")]
    assert all(r is not Any and r is not None for r in returns), returns


# ---- runtime: DSL op functions do not return `object` ------------------------------------------

_OPS = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
        "sigmoid", "floor", "ceil", "abs", "pow", "where", "minimum", "maximum", "min", "max"]


@pytest.mark.parametrize("name", _OPS)
def test_dsl_op_return_annotation_usable(name: str) -> None:
    """``kp.exp(z)`` and the other math functions are documented to give a traced tensor (or,
    of plain numbers, a Python float). Annotated ``-> object``, the README's own fusion body
    ``e = kp.exp(...); e / e.sum(axis=1)`` is a type error ("object" has no attribute "sum");
    a union such as ``Value | int | float`` (``kp.pow``) forces an isinstance check at every
    use. The return must be ``Any`` or precise per overload."""
    fn = getattr(kp, name)
    overloads = getattr(typing, "get_overloads", lambda f: [])(fn)
    for target in overloads or [fn]:
        ret = typing.get_type_hints(target).get("return")
        assert ret is not object, f"kp.{name} is annotated -> object"
        if typing.get_origin(ret) in (Union, getattr(types, "UnionType", Union)) \
                and not overloads:
            pytest.fail(f"kp.{name} is annotated -> {ret} without overloads: every use "
                        f"needs narrowing")


# ---- runtime: the data model's constructors accept what the docs pass ---------------------------

def _ctor_cases() -> list[tuple[str, type, tuple[Any, ...], dict[str, Any]]]:
    launch = kp.Launch("k", "m", grid=kp.cdiv("n", 256), block=256, args=[kp.Arg.buffer("x")],
                       shared_mem=0, count=2, loop="i")
    scratch = kp.Scratch("w", kp.f32, [kp.cdiv("n", 256)])
    tensor = kp.Tensor("x", kp.f32, ["n"])
    variant = kp.Variant([launch])
    summary = kp.KernelSummary("p", [tensor], [variant])
    image = kp.Image("cubin", "sm_90", b"\x7fELF....")
    module = kp.Module("m", ["k"], [image])
    return [
        # README's kp.external example
        ("Tensor.shape_names", kp.Tensor, ("x", kp.f32, ["n"]), {}),
        ("Tensor.shape_mixed", kp.Tensor, ("x", kp.f32, ("n", 4, kp.cdiv("n", 2))), {}),
        ("Scalar.value_name", kp.Scalar, ("n32", kp.u32), {"value": "n"}),
        ("Scalar.value_int", kp.Scalar, ("k", kp.i64), {"value": 3}),
        ("Scratch.shape_list", kp.Scratch, ("w", kp.f32, [kp.cdiv("n", 256)]), {}),
        ("Launch.dims_ints", kp.Launch, ("k", "m"),
         {"grid": kp.cdiv("n", 256), "block": 256, "args": [kp.Arg.buffer("x")],
          "shared_mem": 0, "count": 2, "loop": "i"}),
        ("Variant.lists", kp.Variant, ([launch],), {"scratch": [scratch],
                                                      "predicate": kp.sym("n") < 10}),
        ("KernelSummary.lists", kp.KernelSummary, ("p", [tensor], [variant]),
         {"constraints": [kp.Constraint(kp.sym("n") < 5, "small")]}),
        ("Image.arch_str", kp.Image, ("cubin", "sm_90", b"\x7fELF...."), {}),
        ("Module.lists", kp.Module, ("m", ["k"], [image]), {}),
        ("Compiled.modules_list", kp.Compiled, (summary, [module]), {}),
    ]


_CTOR_CASES = _ctor_cases()


@pytest.mark.parametrize("label,cls,args,kwargs", _CTOR_CASES, ids=[c[0] for c in _CTOR_CASES])
def test_constructor_annotations_accept_documented_values(label: str, cls: type,
                                                          args: tuple[Any, ...],
                                                          kwargs: dict[str, Any]) -> None:
    """``kp.Tensor("x", kp.f32, ["n"])`` and ``kp.Scalar("n32", kp.u32, value="n")`` (README)
    work, but the dataclass fields they go through are annotated with the *stored* form
    (``tuple[Expr, ...]``, ``Expr | None``), which is also the constructor's signature to a
    type checker: the README's kp.external example has three mypy/pyright errors."""
    cls(*args, **kwargs)  # accepted at run time
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    bound = inspect.signature(cls).bind(*args, **kwargs)
    refused = {name: f"{value!r} is not {hints[name]}" for name, value in bound.arguments.items()
               if name in hints and not _accepts(hints[name], value)}
    assert not refused, f"{cls.__name__}.__init__ annotations refuse accepted values: {refused}"


def test_constructor_annotation_checker_can_fail() -> None:
    """The checker above refuses what the annotations refuse (so its passes mean something)."""
    assert not _accepts(tuple[str, ...], ["n"])
    assert not _accepts(int | None, "n")
    assert _accepts(str | None, None)
    assert not _accepts(kp.Expr, "n")
    assert _accepts(collections.abc.Sequence[int | str], ["n", 4])
    assert not _accepts(collections.abc.Sequence[kp.Expr], ["n", 4])


# ---- runtime: records expose their fields to type checkers --------------------------------------

@pytest.mark.parametrize("cls", [SignatureInfo, kp_runtime.Selection],
                         ids=["SignatureInfo", "Selection"])
def test_record_fields_annotated(cls: type) -> None:
    """``pack.signature.verified`` / ``.key_id`` (docs/FORMAT.md §5) and
    ``kernelpack.runtime.select_image(...).chosen`` / ``.reasons``: set through
    ``FrozenRecord._set`` from ``__slots__``, they are unknown to a type checker ("SignatureInfo"
    has no attribute "verified") unless the class annotates them."""
    hints = typing.get_type_hints(cls)
    missing = [n for n in cls.__slots__ if not n.startswith("_") and n not in hints]
    assert not missing, f"{cls.__name__}: fields without class annotations: {missing}"


@pytest.mark.parametrize("cls", [kp.Plan, kp_planner.PlannedLaunch, kp_planner.Allocation],
                         ids=["Plan", "PlannedLaunch", "Allocation"])
def test_namedtuple_fields_as_type_checkers_read_them(cls: type) -> None:
    """In a ``NamedTuple`` class body a type checker reads every non-method statement as a
    field: ``__str__ = __repr__`` in ``kp.Plan`` makes mypy see seven fields, so unpacking a
    plan into its six (``program, variant, symbols, allocations, launches, computed = plan``)
    is "Too many values to unpack" and ``kp.Plan(p, v, s, a, l)`` "Missing positional argument
    'computed'"."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    fields = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Pass)):
            continue
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            fields.append(stmt.target.id)
            continue
        pytest.fail(f"{cls.__name__}: line {stmt.lineno} of its class body "
                    f"({ast.unparse(stmt)!r}) is read as a field by type checkers")
    assert tuple(fields) == cls._fields  # type: ignore[attr-defined]


# ---- runtime: annotated returns hold ---------------------------------------------------------

@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("r37")
    compiled = _sample_compiled()
    data = kp.save([compiled], d / "a.kpack")
    pack = kp_loader.load(d / "a.kpack")
    cache = Cache(path=d / "cache", remote=False)
    return {"data": data, "pack": pack, "cache": cache, "compiled": compiled}


_RETURN_CASES: list[tuple[str, Callable[..., Any], Callable[[dict[str, Any]], Any]]] = [
    ("serializer.save", importlib.import_module("kernelpack.serializer").save,
     lambda e: e["data"]),
    ("loader.load", kp_loader.load, lambda e: e["pack"]),
    ("Pack.programs", _fget(Pack, "programs"), lambda e: e["pack"].programs),
    ("Pack.modules", _fget(Pack, "modules"), lambda e: e["pack"].modules),
    ("Pack.nbytes", _fget(Pack, "nbytes"), lambda e: e["pack"].nbytes),
    ("Pack.__getitem__", Pack.__getitem__, lambda e: e["pack"]["axpy"]),
    ("Pack.compiled", Pack.compiled, lambda e: e["pack"].compiled("axpy")),
    ("Program.summary", _fget(Program, "summary"), lambda e: e["pack"]["axpy"].summary),
    ("Program.compiled", Program.compiled, lambda e: e["pack"]["axpy"].compiled()),
    ("Planner.plan", kp_planner.Planner.plan,
     lambda e: kp_planner.Planner(e["pack"]["axpy"].summary).plan(x=(10,), y=(10,), a=0.5)),
    ("ModuleInfo.kernels", _fget(ModuleInfo, "kernels"),
     lambda e: e["pack"].modules["axpy"].kernels),
    ("ModuleInfo.images", _fget(ModuleInfo, "images"),
     lambda e: e["pack"].modules["axpy"].images),
    ("ModuleInfo.module", _fget(ModuleInfo, "module"),
     lambda e: e["pack"].modules["axpy"].module()),
    ("ImageInfo.read", ImageInfo.read, lambda e: e["pack"].modules["axpy"].images[0].read()),
    ("Cache.stats", Cache.stats, lambda e: e["cache"].stats()),
    ("Cache.get", Cache.get, lambda e: e["cache"].get("0" * 64)),
    ("Cache.trusted_keys", _fget(Cache, "trusted_keys"), lambda e: e["cache"].trusted_keys),
]


@pytest.mark.parametrize("label,fn,get", _RETURN_CASES, ids=[c[0] for c in _RETURN_CASES])
def test_annotated_returns_hold(loaded: dict[str, Any], label: str, fn: Callable[..., Any],
                                get: Callable[[dict[str, Any]], Any]) -> None:
    """What these public calls return is what their return annotation says (a user's code
    narrowed by the annotation would otherwise be wrong at run time)."""
    ret = typing.get_type_hints(fn).get("return")
    value = get(loaded)
    assert _accepts(ret, value), f"{label} is annotated -> {ret} but returned {value!r:.200}"


def test_path_parameters_take_pathlike(tmp_path: Path) -> None:
    """``kp.save(items, path)``, ``kernelpack.loader.load(path)`` and ``kp.Cache(path=...)``
    take ``pathlib.Path`` at run time, and their annotations say so."""
    compiled = _sample_compiled()
    target = tmp_path / "p.kpack"
    save = importlib.import_module("kernelpack.serializer").save
    save([compiled], target)
    kp_loader.load(target)
    Cache(path=tmp_path / "c", remote=False)
    assert _accepts(typing.get_type_hints(save)["path_or_file"], target)
    assert _accepts(typing.get_type_hints(kp_loader.load)["path_or_bytes"], target)
    assert _accepts(typing.get_type_hints(Cache.__init__)["path"], target)


# ---- docs: what a type-checking user writes for a fusion ---------------------------------------

def test_docs_show_a_type_checked_fusion() -> None:
    """``kp.Tensor[kp.f32, "b", "n"]`` and ``s: kp.f32`` are not types to mypy or pyright
    (``"Tensor" expects no type arguments``, ``Name "b" is not defined``, ``Variable
    "kernelpack.dtypes.f32" is not valid as a type``): the DSL's annotation style is inherent,
    so the docs must say what a mypy/pyright user writes. Expected: a ```python block in
    README.md or docs/*.md with a ``@kp.fusion`` using ``kp.Tensor[...]`` that names the
    recipe (a ``# mypy:`` line, ``# type: ignore[...]``, ...); test_mypy_user_scripts checks
    that it type-checks under ``mypy --strict``."""
    assert _doc_fusion_recipes(), ("README.md and docs/*.md say nothing about type-checking "
                                   "a @kp.fusion: no example mentions mypy/pyright")


# ---- mypy: users' scripts type-check ------------------------------------------------------------

_KERNELS_MOD = "# mypy: ignore-errors\n" + (_readme_block("@kp.fusion", "kp.compile(")
                                             or ["import kernelpack as kp\n"])[0]

_SNIPPETS: dict[str, str] = {
    # README's "Quick start": kp.external of PTX and of CUDA C (Tensor/Scalar constructors)
    "readme_external": "import kernelpack as kp\n" + "\n".join(
        _readme_block("kp.external(", exclude=("@kp.fusion",))),
    # README's "Later, anywhere" (kp.load, then plan)
    "readme_load_plan": "import kernelpack as kp\n" + "\n".join(
        _readme_block("kp.load(", ".plan(", exclude=("torch",))),
    # README's kp.Cache block (the fusion comes from a module the user keeps out of mypy)
    "readme_cache": "import kernelpack as kp\nfrom kernels_mod import scaled_softmax\n"
                    + "\n".join(_readme_block("kp.Cache(")),
    "entry_points": """
        import kernelpack as kp
        from kernels_mod import scaled_softmax

        c = kp.compile(scaled_softmax, targets=["sm_80", "sm_90", "ptx"])
        reveal_type(c)  # expect: kernelpack.compiled.Compiled
        data: bytes = kp.save([c], "model.kpack")
        pack = kp.load("model.kpack", trusted_keys=None)
        reveal_type(pack)  # expect: kernelpack.loader.Pack
        names: list[str] = pack.programs
        pack.warmup()
    """,
    "lazy_names": """
        import kernelpack as kp
        from kernelpack.runtime import DeviceBuffer
        from kernelpack.summary import Compiled, Image, Module

        cache = kp.Cache(path="/tmp/kp-r37-cache", remote=False)
        reveal_type(cache)  # expect: kernelpack.cache.Cache
        stats: dict[str, int] = cache.stats()

        def use(p: kp.Pack, c: kp.Cache, k: kp.CacheKey) -> list[str]:
            return p.programs

        def keep(c: Compiled, m: Module, i: Image) -> Compiled:
            return c

        def host(b: DeviceBuffer) -> None:
            reveal_type(b)  # expect: DeviceBuffer
    """,
    "data_model": """
        import kernelpack as kp

        t = kp.Tensor("x", kp.f32, ["n", 4])
        s = kp.Scalar("n32", kp.u32, value="n")
        k = kp.Scalar("k", kp.i64, value=3)
        w = kp.Scratch("w", kp.f32, [kp.cdiv("n", 256)])
        launch = kp.Launch("k", "m", grid=kp.cdiv("n", 256), block=256,
                           args=[kp.Arg.buffer("x")], shared_mem=0, count=2, loop="i")
        v = kp.Variant([launch], scratch=[w], predicate=kp.sym("n") < 10)
        summary = kp.KernelSummary("p", (t, s), [v],
                                   constraints=[kp.Constraint(kp.sym("n") < 5, "small")])
        img = kp.Image("cubin", "sm_90", b"...")
        m = kp.Module("m", ["k"], [img])
        c = kp.Compiled(summary, [m])
    """,
    "dsl_ops": """
        from typing import Any
        import kernelpack as kp

        def body(x: Any, s: Any) -> Any:
            z = x * s
            e = kp.exp(z - kp.max(z, axis=1, keepdims=True))
            r = kp.sqrt(e).sum(axis=1)
            m = kp.maximum(x, 0.0).astype(kp.f16)
            w = kp.where(x > 0, x, 0.0) * 2
            p = kp.pow(x, 2).mean()
            a = kp.abs(x).max()
            return e / e.sum(axis=1, keepdims=True), r, m, w, p, a

        c: float = kp.sqrt(2.0 / 3.14159)  # host math of a number: a float (README)
    """,
    "records": """
        from kernelpack.loader import load
        from kernelpack.runtime import select_image

        pack = load("model.kpack", trusted_keys=["team.pub"])
        sig = pack.signature
        if sig is not None:
            verified: bool = sig.verified
            key_id: str = sig.key_id
        sel = select_image(pack.modules["m"].images, "sm_90", 12080)
        needs: bool = sel.needs_compile
        chosen = sel.chosen
        reasons = sel.reasons
    """,
    "plan_tuple": """
        import kernelpack as kp

        def unpack(plan: kp.Plan) -> int:
            program, variant, symbols, allocations, launches, computed = plan
            return variant + len(launches) + len(computed)

        def make() -> kp.Plan:
            return kp.Plan("p", 0, {}, {}, ())
    """,
    "reveals": """
        from typing import Any
        import kernelpack as kp
        from kernelpack.loader import load

        def fn(x: Any) -> Any:
            return x

        reveal_type(kp.fusion(fn))  # expect: Fusion
        reveal_type(kp.fusion(name="g")(fn))  # expect: Fusion
        prog = load("example.kpack")["axpy"]
        reveal_type(prog.plan(x=(10,), y=(10,), a=0.5))  # expect: Plan
        reveal_type(prog.planner)  # expect: Planner
    """,
}

_MYPY_LINE = re.compile(r"^(?P<file>[\w.]+)\.py:(?P<line>\d+): (?P<sev>error|note): (?P<msg>.*)$")


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``python -m mypy --strict`` run over every snippet (and the docs' fusion recipe);
    its errors and revealed types per snippet."""
    pytest.importorskip("mypy")
    d = tmp_path_factory.mktemp("r37_mypy")
    (d / "kernels_mod.py").write_text(_KERNELS_MOD, encoding="utf-8")
    sources = dict(_SNIPPETS)
    recipes = _doc_fusion_recipes()
    if recipes:
        sources["doc_fusion_recipe"] = recipes[0]
    files = []
    for name, src in sources.items():
        path = d / f"{name}.py"
        path.write_text(textwrap.dedent(src), encoding="utf-8")
        files.append(path.name)
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    cmd = [sys.executable, "-m", "mypy", "--strict", "--show-error-codes", "--no-color-output",
           "--no-error-summary", "--hide-error-context", "--no-pretty",
           "--cache-dir", str(d / ".mypy_cache"), *files]
    proc = subprocess.run(cmd, check=False, cwd=d, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, 1):
        pytest.fail(f"mypy crashed (exit {proc.returncode}): {proc.stdout}{proc.stderr}")
    report: dict[str, Any] = {name: {"errors": [], "reveals": {}} for name in sources}
    for line in proc.stdout.splitlines():
        m = _MYPY_LINE.match(line)
        if not m or m["file"] not in report:
            continue
        entry = report[m["file"]]
        if m["sev"] == "error":
            entry["errors"].append(f"{m['line']}: {m['msg']}")
        elif m["msg"].startswith("Revealed type is "):
            entry["reveals"][int(m["line"])] = m["msg"][len("Revealed type is "):]
    report["_sources"] = {n: textwrap.dedent(s) for n, s in sources.items()}
    report["_output"] = proc.stdout + proc.stderr
    return report


_MYPY_CASES = ["readme_external", "readme_load_plan", "readme_cache", "entry_points",
               "lazy_names", "data_model", "dsl_ops", "records", "plan_tuple", "reveals",
               "doc_fusion_recipe"]


@pytest.mark.parametrize("name", _MYPY_CASES)
def test_mypy_user_scripts(mypy_report: dict[str, Any], name: str) -> None:
    """Each user script type-checks under ``mypy --strict`` with no ``# type: ignore``, and
    each ``reveal_type(...)  # expect: T`` reveals a type naming ``T`` (not ``Any``)."""
    if name not in mypy_report:
        pytest.fail("the docs show no type-checked @kp.fusion (see "
                    "test_docs_show_a_type_checked_fusion)")
    entry = mypy_report[name]
    assert not entry["errors"], f"mypy --strict errors in {name}.py:\n" + "\n".join(
        entry["errors"]) + "\n--- source ---\n" + mypy_report["_sources"][name]
    wrong = []
    for lineno, line in enumerate(mypy_report["_sources"][name].splitlines(), 1):
        m = re.search(r"# expect: (\S+)", line)
        if m:
            got = entry["reveals"].get(lineno)
            if got is None or not re.search(rf"\b{re.escape(m[1])}\b", got):
                wrong.append(f"line {lineno}: expected {m[1]}, revealed {got}")
    assert not wrong, f"reveal_type in {name}.py: " + "; ".join(wrong)
