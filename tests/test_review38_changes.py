"""Review 38: the session's changes (e208a2e..HEAD) as a user meets them.

- runtime-ptx/ (runtime/_ptx_load.py) now asks ``DiskStore(root).untrusted(...)`` before it
  reads or writes a kept cubin. ``DiskStore`` makes its root absolute, while
  ``ptx_cache_path`` keeps ``$KERNELPACK_CACHE_DIR`` as given: with a relative cache
  directory ``Path.relative_to`` fails, the ValueError reads as "untrusted", and the cubins are
  never kept again (a warning at each load). Worse, where the working directory was removed,
  ``DiskStore`` raises FileNotFoundError, which escapes ``_ptx_code``: a failed launch, where the
  cache is best effort (both worked before).
- fusion.py's ``typing.Annotated`` support: kernelpack metadata that conflicts (an alias
  ``Annotated[Any, kp.Tensor[f32, ...]]`` re-annotated ``Annotated[Rows, kp.Tensor[f16, ...]]``,
  which Python flattens) silently takes the innermost; and ``Annotated[np.float32, "doc"]`` is
  refused although ``np.float32`` alone is a scalar annotation (PEP 593: metadata a tool does
  not know is ignored).

Regression tests (passing) for what was right: the data model's written-out constructors
behave as the generated ones did, expression printing is the old recursive printer's output,
the PTX cache under a world-writable root whose runtime-ptx/ is another user's, the signal
flag through a stale extension, and imports in a fresh process.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

import kernelpack as kp
from kernelpack.errors import TraceError

# ---- runtime-ptx/: a fake nvJitLink (no GPU, no toolkit: fast and deterministic) -------------
PTX = b".version 8.0\n.target sm_90\n"


class _Device:
    """What ``_ptx_code`` asks of a device: its arch and the driver's CUDA version."""

    class arch:  # noqa: N801
        major, minor = 9, 0

    driver_version = 12080


@pytest.fixture
def ptx_code(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``_ptx_code(PTX, device)`` with nvJitLink faked; ``.compiles`` counts assemblies."""
    from kernelpack.runtime import _ptx_load
    from kernelpack.toolchain import nvjitlink

    compiles: list[int] = []

    def ptx_to_cubin(ptx: bytes, arch: object, *, name: str = "") -> bytes:
        compiles.append(1)
        return b"\x7fELF" + ptx

    monkeypatch.setattr(nvjitlink, "version", lambda: (12, 8))
    monkeypatch.setattr(nvjitlink, "toolchain_id", lambda: "nvJitLink 12.8")
    monkeypatch.setattr(nvjitlink, "ptx_to_cubin", ptx_to_cubin)

    def run() -> tuple[bytes, str, Path | None]:
        return _ptx_load._ptx_code(PTX, _Device())  # type: ignore[arg-type]

    run.compiles = compiles  # type: ignore[attr-defined]
    return run


def _kept_path() -> Path:
    from kernelpack.runtime._ptx_load import ptx_cache_path

    path = ptx_cache_path(PTX, "sm_90", "nvJitLink 12.8")
    assert path is not None
    return path


def test_bug_relative_cache_dir_keeps_ptx_cubins(ptx_code: Any, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """KERNELPACK_CACHE_DIR=relcache (relative, as kp.Cache(path=...) and the disk tier take
    it): the cubin assembled from PTX is kept and read back, without a warning. Now: "'relcache/
    runtime-ptx/..' is not in the subpath of '/cwd/relcache'" at every load, never kept."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", "relcache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = ptx_code()
        second = ptx_code()
    assert first[1] == "ptx->cubin (nvJitLink)"
    assert second[1] == "ptx->cubin (cached)" and len(ptx_code.compiles) == 1
    assert (tmp_path / "relcache" / "runtime-ptx").is_dir()


def test_bug_relative_cache_dir_and_removed_cwd_never_fail_the_load(
        ptx_code: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A cache that cannot be used costs an assembly, never a failed launch (_ptx_load's own
    rule). Now: FileNotFoundError 'the working directory no longer exists' from DiskStore()."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", "relcache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, source, _ = ptx_code()
    assert code[:4] == b"\x7fELF" and source == "ptx->cubin (nvJitLink)"


def test_missing_root_is_made_private_and_used(ptx_code: Any, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    root = tmp_path / "a" / "cache"
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ptx_code()[1] == "ptx->cubin (nvJitLink)"
        assert ptx_code()[1] == "ptx->cubin (cached)"
    for d in (root, root / "runtime-ptx", _kept_path().parent):
        assert d.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="needs root to give runtime-ptx/ to another uid")
def test_world_writable_root_with_another_users_runtime_ptx(ptx_code: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A sticky, world-writable root (/tmp) whose runtime-ptx/ another user made: their
    cubin is not loaded, nor is ours written there."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(root))
    path = _kept_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF planted")
    for p in (root / "runtime-ptx", path.parent, path):
        os.chown(p, 54321, 54321)
    with pytest.warns(RuntimeWarning, match="belongs to uid 54321"):
        code, source, kept = ptx_code()
    assert code == b"\x7fELF" + PTX and source == "ptx->cubin (nvJitLink)" and kept is None
    assert path.read_bytes() == b"\x7fELF planted"


def test_concurrent_first_loads_leave_one_whole_cubin(ptx_code: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELPACK_CACHE_DIR", str(tmp_path / "cache"))
    codes: list[bytes] = []
    threads = [threading.Thread(target=lambda: [codes.append(ptx_code()[0]) for _ in range(5)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert codes == [b"\x7fELF" + PTX] * 20
    path = _kept_path()
    assert [p.name for p in path.parent.iterdir()] == [path.name]


# ---- fusion parameters annotated with typing.Annotated ----------------------------------------
def _param(fn: Any) -> object:
    return kp.fusion(fn).params[0][1]


def test_bug_conflicting_annotated_metadata_is_not_silently_the_innermost() -> None:
    """``Rows`` (README's pattern) re-annotated for one fusion: Python flattens it to
    Annotated[Any, Tensor[f32, n], Tensor[f16, n]]. kernelpack takes the first (f32) without a
    word; the outer annotation, what the author wrote last, should win, or the conflict be a
    TraceError."""
    from typing import Annotated

    rows = Annotated[Any, kp.Tensor[kp.f32, "n"]]

    def half(x: Annotated[rows, kp.Tensor[kp.f16, "n"]]) -> Any:  # type: ignore[valid-type]
        return x

    try:
        got = _param(half)
    except TraceError:
        return
    assert got == kp.Tensor[kp.f16, "n"], f"silently {got}"


def test_bug_annotated_numpy_scalar_with_foreign_metadata() -> None:
    """``s: np.float32`` is a float32 scalar; ``s: Annotated[np.float32, "learning rate"]``
    (metadata for another tool) must be the same (PEP 593: unknown metadata is ignored). Now:
    TraceError 'needs an annotation'."""
    from typing import Annotated

    np = pytest.importorskip("numpy")

    def plain(s: np.float32) -> Any:
        return s

    def documented(s: Annotated[np.float32, "learning rate"]) -> Any:
        return s

    assert _param(plain) == kp.f32
    assert _param(documented) == kp.f32


def test_annotated_and_plain_trace_alike() -> None:
    from typing import Annotated

    def typed(x: Annotated[Any, "rows", kp.Tensor[kp.f32, "b", "n"]],
              s: Annotated[float, kp.f32]) -> Any:
        return x * s

    def plain(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32) -> Any:  # type: ignore[valid-type]
        return x * s

    a, b = kp.fusion(typed, name="f"), kp.fusion(plain, name="f")
    assert a.params == b.params
    assert a.canonical_bytes() == b.canonical_bytes()


# ---- the data model's written-out constructors --------------------------------------------------
def _compiled() -> kp.Compiled:
    n = kp.sym("n")
    launch = kp.Launch("k", "m", [n], 256, [kp.Arg.buffer("x")], count=2, loop="i")
    summary = kp.KernelSummary(
        "p", [kp.Tensor("x", kp.f32, ["n"]), kp.Scalar("s", kp.i32)],
        [kp.Variant([launch], [kp.Scratch("w", kp.f32, ["n"])], n > 0)],
        [kp.Constraint(n >= 0, "c")])
    images = [kp.Image("cubin", "sm_90", b"x", "tc", 12000),
              kp.Image("ptx", "sm_80", b"p", ptx_isa=[8, 0])]
    return kp.Compiled(summary, [kp.Module("m", ["k"], images)])


def _objects() -> dict[str, Any]:
    c = _compiled()
    variant = c.summary.variants[0]
    return {"Tensor": c.summary.params[0], "Scalar": c.summary.params[1],
            "Constraint": c.summary.constraints[0], "KernelSummary": c.summary,
            "Variant": variant, "Launch": variant.launches[0], "Scratch": variant.scratch[0],
            "Image": c.modules[0].images[1], "Module": c.modules[0], "Compiled": c}


@pytest.mark.parametrize("name", sorted(_objects()))
def test_data_model_round_trips(name: str) -> None:
    obj, again = _objects()[name], _objects()[name]
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    assert type(obj)(**fields) == obj == again and hash(obj) == hash(again)
    assert type(obj)(*fields.values()) == obj
    assert type(obj).__match_args__ == tuple(fields)
    assert dataclasses.replace(obj) == obj
    for clone in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
        assert clone == obj and repr(clone) == repr(obj)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, next(iter(fields)), 1)


def test_data_model_defaults_and_errors_as_before() -> None:
    launch = kp.Launch("k", "m", 1, 1, [])
    assert type(launch.shared_mem) is kp.Expr and launch.shared_mem == 0
    assert launch == kp.Launch("k", "m", 1, 1, [], shared_mem=0, count=None, loop="")
    assert kp.Image("ptx", "sm_80", b"p", ptx_isa=[8, 0]).ptx_isa == (8, 0)
    with pytest.raises(TypeError, match=r"Tensor.__init__\(\) missing 1 required positional "
                                        r"argument: 'shape'"):
        kp.Tensor("x", kp.f32)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        kp.Scalar("s", kp.f32, foo=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="role must be one of"):
        dataclasses.replace(kp.Tensor("x", kp.f32, ["n"]), role="bad")
    with pytest.raises(TypeError, match="shared_mem: expected an int"):
        kp.Launch("k", "m", 1, 1, [], shared_mem=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loop must be a symbol name"):
        kp.Launch("k", "m", 1, 1, [], loop=None)  # type: ignore[arg-type]


def test_subclasses_of_the_data_model() -> None:
    @dataclasses.dataclass(frozen=True)
    class Tagged(kp.Tensor):
        tag: str = ""

    t = Tagged("x", kp.f32, ["n", 4], tag="t")
    assert t.shape == (kp.sym("n"), 4) and t.tag == "t"
    assert dataclasses.replace(t, tag="u").tag == "u"

    class Fixed(kp.Launch):
        def __init__(self, kernel: str) -> None:
            super().__init__(kernel, "m", 1, 32, [])

    assert Fixed("k").block[0] == 32 and Fixed("k").shared_mem == 0


def test_lazy_image_reads_once_and_copies_whole() -> None:
    from kernelpack.targets import parse_arch

    reads: list[int] = []
    img = kp.Image._lazy("cubin", parse_arch("sm_90"), lambda: reads.append(1) or b"DATA",
                         "tc", 1, None, "d")
    assert "data" not in img.__dict__ and reads == []
    assert img == kp.Image("cubin", "sm_90", b"DATA", "tc", 1) and reads == [1]
    assert pickle.loads(pickle.dumps(img)).data == b"DATA"
    assert dataclasses.replace(img, toolchain="x").data == b"DATA" and reads == [1]


# ---- expression printing: the old recursive printer's output, whatever the depth --------------
def _old_format(e: Any, parent_prec: int, budget: list[int]) -> str:
    """expr_text._format at e208a2e (recursive), verbatim."""
    from kernelpack.expr_text import _INFIX

    budget[0] -= 1
    if budget[0] < 0:
        return "..."
    if e.op in ("const", "sym"):
        return str(e.value)
    if e.op == "neg":
        return f"-{_old_format(e.args[0], 7, budget)}"
    if e.op == "not":
        text = f"not {_old_format(e.args[0], 2, budget)}"
        return f"({text})" if parent_prec > 2 else text
    if e.op in _INFIX:
        sign, prec = _INFIX[e.op]
        left = prec + 1 if prec == 3 else prec
        lhs = _old_format(e.args[0], left, budget)
        text = f"{lhs} {sign} {_old_format(e.args[1], prec + 1, budget)}"
        return f"({text})" if prec < parent_prec else text
    name = {"ceildiv": "cdiv"}.get(e.op, e.op)
    return f"{name}({', '.join(_old_format(a, -1, budget) for a in e.args)})"


def _random_tree(rng: random.Random, depth: int, shared: list[Any]) -> Any:
    from kernelpack.expr import OPERATORS, Expr

    if depth <= 1 or rng.random() < 0.1:
        if shared and rng.random() < 0.3:
            return rng.choice(shared)
        if rng.random() < 0.5:
            return Expr._node("const", (), rng.randint(-3, 3))
        return Expr._node("sym", (), rng.choice("abn"))
    op = rng.choice(sorted(OPERATORS))
    deep = rng.randrange(OPERATORS[op])
    args = tuple(_random_tree(rng, depth - 1 if i == deep else rng.randint(1, max(1, depth // 3)),
                              shared) for i in range(OPERATORS[op]))
    node = Expr._node(op, args)
    if rng.random() < 0.2:
        shared.append(node)
    return node


@pytest.mark.parametrize("seed", range(4), ids=[f"seed{s}" for s in range(4)])
def test_printing_matches_the_recursive_printer(seed: int) -> None:
    from kernelpack.expr_text import _PRINT_NODES, _format, whole_text

    rng = random.Random(seed)
    for _ in range(60):
        e = _random_tree(rng, rng.choice([3, 23, 24, 25, 26, 40, 90]), [])
        assert str(e) == _old_format(e, -1, [_PRINT_NODES])
        for budget in (0, 1, 2, 7, 25, 26, 64, 10 ** 6):
            for prec in (-1, 0, 2, 3, 4, 7):
                old, new = [budget], [budget]
                assert _format(e, prec, new) == _old_format(e, prec, old)
                assert (old[0] < 0) == (new[0] < 0) and (old[0] < 0 or old == new)
            text, used = whole_text(e, budget)
            old = [budget]
            expected = _old_format(e, -1, old)
            assert (text, used) == ((None, budget) if old[0] < 0 else (expected, budget - old[0]))


# ---- SA_RESTART without the extension's signal_restarts (a stale build) ------------------------
@pytest.fixture
def usr1_restarting() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed in the main thread only")
    previous = signal.getsignal(signal.SIGUSR1)
    handler = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGUSR1, handler)
    signal.siginterrupt(signal.SIGUSR1, False)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SA_RESTART is read on Linux")
def test_stale_extension_falls_back_to_ctypes(usr1_restarting: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelpack._interrupts import _Restarts, deferred_interrupts

    monkeypatch.setitem(sys.modules, "kernelpack.runtime._launch",
                        types.ModuleType("kernelpack.runtime._launch"))  # no signal_restarts
    monkeypatch.setattr(_Restarts, "_native", None)
    handler = signal.getsignal(signal.SIGUSR1)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGUSR1) is not handler
        assert _Restarts.of(signal.SIGUSR1) is True
    assert _Restarts._native is False
    assert signal.getsignal(signal.SIGUSR1) is handler and _Restarts.of(signal.SIGUSR1) is True


# ---- imports in a fresh process ------------------------------------------------------------------
_SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.parametrize("first", ["kernelpack.summary", "kernelpack.compiled",
                                   "kernelpack.program", "kernelpack.expr"])
def test_fresh_import_order(first: str) -> None:
    code = (f"import {first}, sys, typing\n"
            "import kernelpack as kp\n"
            "from kernelpack import summary, program, expr_text, expr_eval\n"
            "assert summary.Compiled is kp.Compiled and kp.Pack.__name__ == 'Pack'\n"
            "typing.get_type_hints(program.Program.__init__)\n"
            "typing.get_type_hints(expr_text._format); typing.get_type_hints(expr_eval.evaluate)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('llvmlite', 'numpy', 'torch', 'cupy') or m.startswith('cuda.bindings')]\n"
            "assert not bad, bad\n")
    env = dict(os.environ, PYTHONPATH=_SRC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
