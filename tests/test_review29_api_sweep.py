"""Review 29: a sweep of the public entry points with wrong and edge arguments.

Black-box: only the documented API (README, DESIGN.md, docs/FORMAT.md) is used. The rule under
test is the brief's: bad input gets a clear error naming the parameter, of a documented type
(kernelpack.errors, or TypeError/ValueError where the docs say so); never an internal exception
leaking, never a traceback from the CLI, never a silent wrong result or a half-written output;
and valid edge values (zero sizes, the largest documented limits) work.

The first block holds the tests that fail on the reviewed tree (each one a finding of the
report); the sweeps after it pass and guard the behaviour they pin.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelpack as kp
from kernelpack.summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module,
                                Scalar, Variant)
from kp_cli import run
from kp_samples import _noise, axpy, axpy_summary, fake_image, rich

PTX = Path(__file__).parent / "golden" / "axpy.ptx"
AXPY_PARAMS = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
               kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]
SWEEP = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def _external(**kw: object) -> Compiled:
    base: dict[str, object] = dict(params=AXPY_PARAMS, grid=kp.cdiv("n", 256), block=256,
                                   ptx=PTX, targets=["sm_80"])
    base.update(kw)
    return kp.external("axpy", "axpy", **base)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Findings: these fail on the reviewed tree.
# --------------------------------------------------------------------------------------------

def test_extract_writes_a_module_whose_valid_name_is_longer_than_a_file_name(tmp_path,
                                                                              capsys) -> None:
    """Names may be 1024 UTF-8 bytes (FORMAT §6; a fusion name up to 960 characters), and
    `extract` "writes each image raw" of any valid artifact. A 300-byte module name makes
    `<module>.sm_80.cubin` longer than NAME_MAX (255): extract exits 1 with 'File name too
    long' and writes nothing, for every module of the file, not only the long one."""
    long_name = "k" * 300
    c = Compiled(axpy_summary("longprog", long_name),
                 (Module(long_name, ("axpy",), (fake_image("cubin", "sm_80"),)),))
    art = tmp_path / "long.kpack"
    kp.save([c, axpy()], art)
    out = tmp_path / "x"
    code, _stdout, err = run(capsys, "extract", art, "-o", out)
    assert code == 0, err
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 4, written            # 1 image of the long module + 3 of axpy
    assert all(len(n.encode()) <= 255 for n in written)


class _RawSink(io.RawIOBase):
    """A raw binary stream as the io contract allows it to behave: write() may take fewer
    bytes than given (at most 1000 here) and, on a stream "set not to block", return None when
    it can take no byte right now (the second call here), as a non-blocking pipe or socket
    does."""

    def __init__(self, would_block_on: int | None = 2) -> None:
        self.data = bytearray()
        self.calls = 0
        self.would_block_on = would_block_on

    def writable(self) -> bool:
        return True

    def write(self, b) -> int | None:  # type: ignore[override]
        self.calls += 1
        if self.calls == self.would_block_on:
            return None
        chunk = bytes(b[:1000])
        self.data += chunk
        return len(chunk)


def test_save_to_a_raw_file_object_writes_every_byte_or_raises() -> None:
    """kp.save(items, binary_file) takes write()'s None (no byte written, the stream would
    block) as the end of the job: it returns the whole artifact's bytes as if written while
    the stream holds only the first 1000 of them — a truncated artifact and no error."""
    sink = _RawSink()
    try:
        data = kp.save([axpy()], sink)
    except OSError:
        return                                   # refusing is fine; a silent truncation is not
    assert bytes(sink.data) == data, f"{len(sink.data)} of {len(data)} bytes written, no error"


def test_save_to_a_non_blocking_pipe_does_not_truncate_silently() -> None:
    """The same with a real stream: a non-blocking pipe (64 KiB buffer, nobody reading yet)
    gets 65536 of the artifact's ~1 MiB and kp.save returns normally."""
    import fcntl
    c = Compiled(axpy_summary(), (Module("axpy", ("axpy",),
                                         (Image("cubin", "sm_80", _noise(1 << 20)),)),))
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        with open(w, "wb", buffering=0) as f, pytest.raises(OSError):
            kp.save([c], f)
    finally:
        os.close(r)


def test_save_handles_short_writes() -> None:
    """Guard: short counts (not None) are looped over, every byte arrives."""
    sink = _RawSink(would_block_on=None)
    data = kp.save([axpy()], sink)
    assert bytes(sink.data) == data and sink.calls > 1


@pytest.mark.parametrize("field,kw", [
    ("grid", dict(grid=kp.shl(1, 64))),
    ("grid", dict(grid=kp.cdiv(1, 0))),
    ("block", dict(block=kp.cdiv(256, 0))),
    ("shared_mem", dict(shared_mem=kp.shl(1, -1))),
    ("count", dict(count=kp.cdiv(1, 0))),
    ("n32", dict(params=AXPY_PARAMS[:3] + [kp.Scalar("n32", kp.u32, value=kp.cdiv(1, 0))])),
])
def test_external_refuses_a_constant_launch_expression_that_cannot_evaluate(field, kw) -> None:
    """README: "Whatever is constant in the summary is checked where it is declared, since
    every call would otherwise be refused: block, grid, shared memory and count ... computed
    scalars". `grid=1 << 40` (an int) is refused there; `grid=kp.shl(1, 64)` or
    `kp.cdiv(1, 0)` reads no symbol either, yet is accepted and saved, and then every
    plan() raises ExpressionError."""
    with pytest.raises((ValueError, kp.ExpressionError)) as info:
        _external(**kw)
    assert field in str(info.value), str(info.value)


def test_pad_to_a_negative_constant_size_is_a_trace_error_naming_pad() -> None:
    """README: "A fusion is checked the same way when traced: a size that reads no symbol but
    cannot exist ... is a TraceError" (kp.iota(-1) is one: "iota: shape (-1,) has a negative
    size"; kp.pad(x, -1) with static n is one: "pad: size -1 is below ..."). kp.pad(x, -1)
    over a symbolic axis leaks the summary's ValueError "tensor 'out': shape[1] = -1 is
    negative", which names neither pad nor its size."""
    def padded(x: kp.Tensor[kp.f32, "b", "n"]):  # type: ignore[valid-type]
        return kp.pad(x, -1)

    with pytest.raises(kp.TraceError, match="pad"):
        kp.compile(kp.fusion(padded), targets=["sm_80"])


@pytest.mark.parametrize("field", ["message", "toolchain", "kernels"])
def test_save_names_the_field_holding_text_that_is_not_utf8(field) -> None:
    """FORMAT §3: kp.save "raises ValueError naming what a reader would refuse". A lone
    surrogate (what os.fsdecode makes of a non-UTF-8 file name) in a constraint message, an
    image's toolchain or a kernel name gives a bare UnicodeEncodeError ("'utf-8' codec can't
    encode character '\\udcff'") that names no field, no program and no module."""
    bad = "x\udcff"
    s = axpy_summary()
    kernels: tuple[str, ...] = ("axpy",)
    toolchain = "t"
    if field == "message":
        s = KernelSummary("axpy", s.params, s.variants, (Constraint(kp.sym("n") < 5, bad),))
    elif field == "toolchain":
        toolchain = bad
    else:
        kernels = ("axpy", bad)
    c = Compiled(s, (Module("axpy", kernels, (Image("cubin", "sm_80", b"\x7fELF", toolchain),)),))
    with pytest.raises(ValueError) as info:
        kp.save([c])
    assert field.rstrip("s") in str(info.value), str(info.value)


def test_reduction_keyword_typo_names_the_kp_function() -> None:
    """A misspelled keyword is a TypeError naming it, as for every other kp op (`kp.exp()
    got an unexpected keyword argument 'out'`, `pad() got ...`); kp.sum/prod/mean say
    `_reduction.<locals>.fn() got an unexpected keyword argument 'axes'`."""
    def f(x: kp.Tensor[kp.f32, "b", "n"]):  # type: ignore[valid-type]
        return kp.sum(x, axes=1)

    with pytest.raises(TypeError) as info:
        kp.compile(kp.fusion(f), targets=["sm_80"])
    assert "axes" in str(info.value)
    assert "<locals>" not in str(info.value) and "sum" in str(info.value), str(info.value)


@pytest.fixture(scope="module")
def sm80_cubin() -> bytes:
    return _external().modules[0].images[0].data


def test_external_cubin_dict_refuses_an_invalid_target(sm80_cubin) -> None:
    """targets= is validated everywhere (`'sm_xx'` is "not a GPU architecture" for ptx=,
    cuda=, cubin=bytes and kp.compile); with cubin={...} it is silently ignored, whatever it
    holds."""
    with pytest.raises(ValueError, match="sm_xx"):
        _external(ptx=None, cubin={"sm_80": sm80_cubin}, targets=["sm_xx"])


def test_external_cubin_dict_does_not_drop_requested_targets(sm80_cubin) -> None:
    """targets=["sm_90", "ptx"] with cubin={"sm_80": ...} gives an sm_80-only artifact and no
    error: the targets the caller asked for are silently not there (on an sm_90 device the
    load then fails with CompatibilityError). The docs do not say targets= is ignored with a
    dict; either honour it (refuse what cannot be built) or refuse the combination."""
    try:
        c = _external(ptx=None, cubin={"sm_80": sm80_cubin}, targets=["sm_90", "ptx"])
    except ValueError:
        return
    got = sorted(i.target for i in c.modules[0].images)
    assert "sm_90" in got, f"asked for sm_90 and ptx, got {got} and no error"


# --------------------------------------------------------------------------------------------
# Sweeps that pass: each pins documented behaviour for wrong and edge arguments.
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("r29") / "a.kpack"
    kp.save([axpy(), rich()], path)
    return path


@pytest.mark.parametrize("arg,exc", [
    (None, TypeError), (3, TypeError), (3.5, TypeError), ([1, 2], TypeError),
    (b"", kp.FormatError), (b"KPAK" * 4, kp.FormatError), ("/dev/null", kp.FormatError),
    ("/nonexistent/x.kpack", FileNotFoundError), ("/", IsADirectoryError),
])
def test_load_refuses_wrong_arguments(arg, exc) -> None:
    with pytest.raises(exc):
        kp.load(arg)


def test_load_refuses_a_file_object_and_bad_keys(art) -> None:
    with open(art, "rb") as f, pytest.raises(TypeError, match="path or bytes"):
        kp.load(f)
    for keys in ("abc", [None], [3], [b"x"]):
        with pytest.raises(ValueError, match="trusted_keys"):
            kp.load(art, trusted_keys=keys)
    with pytest.raises(kp.SignatureError, match="unsigned"):
        kp.load(art, trusted_keys=[])
    with pytest.raises(TypeError):
        kp.load(art, trusted_key=["x"])  # type: ignore[call-arg]


def test_save_failures_leave_previous_output_untouched(tmp_path) -> None:
    target = tmp_path / "prev.kpack"
    target.write_bytes(b"previous")
    buf = io.BytesIO(b"previous")
    buf.seek(0, io.SEEK_END)

    def broken():
        yield axpy()
        raise RuntimeError("generator broke")

    for items in ([axpy(), axpy()], broken()):
        with pytest.raises((ValueError, RuntimeError)):
            kp.save(items, target)
        assert target.read_bytes() == b"previous"
    with pytest.raises(ValueError, match="unique"):
        kp.save([axpy(), axpy()], buf)
    assert buf.getvalue() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["prev.kpack"]        # no temporary left behind


@pytest.mark.parametrize("path,exc", [
    (3, TypeError), (b"/tmp/x.kpack", TypeError), (io.StringIO(), TypeError),
    ("", FileNotFoundError),
])
def test_save_refuses_bad_destinations(path, exc) -> None:
    with pytest.raises(exc):
        kp.save([axpy()], path)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(x=None), TypeError, "tensor x"),
    (dict(x=1000), TypeError, "tensor x"),
    (dict(x="10"), TypeError, "tensor x"),
    (dict(x=(10.0,)), TypeError, "x.shape[0]"),
    (dict(x=(True,)), TypeError, "x.shape[0]"),
    (dict(x=(-1,)), kp.ConstraintError, "negative"),
    (dict(x=(2**64,)), kp.ConstraintError, "int64"),
    (dict(x=(10, 2)), kp.RankError, "rank"),
    (dict(x=()), kp.RankError, "rank"),
    (dict(y=(11,)), kp.ConstraintError, "y.shape[0] is 11 but n = 10"),
    (dict(z=3), TypeError, "'z'"),
    (dict(n32=3), TypeError, "computed"),
])
def test_plan_refuses_bad_inputs_naming_them(art, kw, exc, words) -> None:
    args = dict(x=(10,), y=(10,), a=0.5)
    args.update(kw)
    with pytest.raises(exc) as info:
        kp.load(art)["axpy"].plan(**args)
    assert words in str(info.value)


@SWEEP
@given(n=st.one_of(st.integers(-2**70, 2**70), st.sampled_from(
    [0, 1, 255, 256, 257, 2**31 - 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, -1])))
def test_plan_shape_sweep_is_right_or_a_constraint_error(art, n) -> None:
    p = kp.load(art)["axpy"]
    if 0 <= n < 2**32:
        plan = p.plan(x=(n,), y=(n,), a=0.5)
        assert plan.launches[0].grid == (-(-n // 256), 1, 1)
        assert plan.symbols["n32"] == n
    else:
        with pytest.raises(kp.ConstraintError):
            p.plan(x=(n,), y=(n,), a=0.5)


@pytest.mark.parametrize("m,exc", [
    (100.0, TypeError), ("100", TypeError), (None, TypeError), (2**31, kp.ConstraintError),
    (2**64, kp.ConstraintError), (True, kp.ConstraintError),     # True binds 1, not 100
])
def test_plan_integer_scalar_checks(art, m, exc) -> None:
    with pytest.raises(exc):
        kp.load(art)["rowsum"].plan(x=(4, 100), m=m, scale=1.0)


def test_zero_sizes_and_largest_limits_plan(art) -> None:
    p = kp.load(art)["axpy"]
    assert p.plan(x=(0,), y=(0,), a=0.5).launches[0].grid == (0, 1, 1)
    assert p.plan(x=(2**32 - 1,), y=(2**32 - 1,), a=0.5).symbols["n32"] == 2**32 - 1
    name = "a" * 1024          # the largest documented name (UTF-8 bytes)
    c = kp.external(name, "axpy", AXPY_PARAMS, kp.cdiv("n", 256), 256, ptx=PTX,
                    targets=["sm_80"], module="m" * 1024)
    loaded = kp.load(kp.save([c]))
    assert loaded.programs == [name]
    assert loaded[name].plan(x=(7,), y=(7,), a=1.0).launches[0].module == "m" * 1024
    with pytest.raises(ValueError, match="1024"):
        kp.external(name + "a", "axpy", AXPY_PARAMS, 1, 256, ptx=PTX, targets=["sm_80"])


# -------- expressions: evaluation agrees with a reference, the saved program and its planner

_OPS = ["+", "-", "*", "//", "%", "cdiv", "min", "max", "shl", "shr", "<", "<=", "==", "and",
        "or", "sel", "neg"]
LO, HI = -2**63, 2**63 - 1


class _Err(Exception):
    pass


def _ck(v: int) -> int:
    if not LO <= v <= HI:
        raise _Err
    return v


def _ref(node, env) -> int:
    op = node[0]
    if op == "s":
        return env[node[1]]
    if op == "sel":
        return _ref(node[2], env) if _ref(node[1], env) else _ref(node[3], env)
    if op == "neg":
        return _ck(-_ref(node[1], env))
    a, b = _ref(node[1], env), _ref(node[2], env)
    if op in ("//", "%", "cdiv") and b == 0:
        raise _Err
    if op in ("shl", "shr") and not 0 <= b <= 63:
        raise _Err
    return {"+": lambda: _ck(a + b), "-": lambda: _ck(a - b), "*": lambda: _ck(a * b),
            "//": lambda: _ck(a // b), "%": lambda: _ck(a % b),
            "cdiv": lambda: _ck(-((-a) // b)), "min": lambda: min(a, b),
            "max": lambda: max(a, b), "shl": lambda: _ck(a << b), "shr": lambda: a >> b,
            "<": lambda: int(a < b), "<=": lambda: int(a <= b), "==": lambda: int(a == b),
            "and": lambda: int(bool(a) and bool(b)), "or": lambda: int(bool(a) or bool(b)),
            }[op]()


def _build(node) -> kp.Expr:
    op = node[0]
    if op == "s":
        return kp.sym(node[1])
    if op == "sel":
        return kp.select(_build(node[1]), _build(node[2]), _build(node[3]))
    if op == "neg":
        return -_build(node[1])
    a, b = _build(node[1]), _build(node[2])
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
            "%": lambda: a % b, "cdiv": lambda: kp.cdiv(a, b), "min": lambda: kp.emin(a, b),
            "max": lambda: kp.emax(a, b), "shl": lambda: kp.shl(a, b),
            "shr": lambda: kp.shr(a, b), "<": lambda: kp.lt(a, b), "<=": lambda: kp.le(a, b),
            "==": lambda: kp.eq(a, b), "and": lambda: kp.land(a, b),
            "or": lambda: kp.lor(a, b)}[op]()


_SYMS = ("a", "b", "c", "d")
_leaf = st.sampled_from(_SYMS).map(lambda s: ("s", s))
_tree = st.recursive(_leaf, lambda sub: st.one_of(
    st.tuples(st.sampled_from([o for o in _OPS if o not in ("sel", "neg")]), sub, sub),
    st.tuples(st.just("sel"), sub, sub, sub), st.tuples(st.just("neg"), sub)), max_leaves=8)
_val = st.one_of(st.sampled_from([0, 1, -1, 2, 3, 63, 64, -64, 2**31, 2**32, 2**62, HI, LO]),
                 st.integers(-300, 300))


@SWEEP
@given(tree=_tree, vals=st.tuples(_val, _val, _val, _val))
def test_expression_evaluation_matches_reference_and_saved_planner(tree, vals) -> None:
    """Symbols only at the leaves (constants are bound through symbols), so no build-time
    folding is involved: Expr.evaluate, the reference and the loaded program's planner (a
    computed i64 scalar over i64 caller scalars) agree, or all raise ExpressionError."""
    env = dict(zip(_SYMS, vals))
    try:
        want: object = _ref(tree, env)
    except _Err:
        want = "error"
    e = _build(tree)
    try:
        got: object = e.evaluate(env) if isinstance(e, kp.Expr) else e
    except kp.ExpressionError:
        got = "error"
    assert got == want, (e, env)
    params = tuple(Scalar(s, kp.i64) for s in _SYMS) + (Scalar("v", kp.i64, value=e),)
    s = KernelSummary("e", params, (Variant((Launch("k", "m", (1,), (1,),
                                                    (Arg.scalar("v"),)),)),))
    prog = kp.load(kp.save([Compiled(s, (Module("m", ("k",), (fake_image(),)),))]))["e"]
    try:
        planned: object = prog.plan(**env).computed["v"]
    except kp.ExpressionError:
        planned = "error"
    assert planned == want, (e, env)


@pytest.mark.parametrize("call,exc", [
    (lambda: kp.sym(None), TypeError), (lambda: kp.sym(""), ValueError),
    (lambda: kp.sym("a b"), ValueError), (lambda: kp.sym("a" * 1025), ValueError),
    (lambda: kp.sym("n") + 2**63, ValueError), (lambda: kp.sym("n") + 1.5, TypeError),
    (lambda: kp.sym("n") / 2, TypeError), (lambda: bool(kp.sym("n") < 3), TypeError),
    (lambda: int(kp.sym("n")), TypeError), (lambda: kp.lnot(None), TypeError),
    (lambda: (kp.sym("n") + 1).evaluate({"n": 1.5}), kp.ExpressionError),
    (lambda: (kp.sym("n") + 1).evaluate({}), kp.ExpressionError),
    (lambda: kp.shl(1, kp.sym("n")).evaluate({"n": 64}), kp.ExpressionError),
])
def test_expression_api_refuses_bad_arguments(call, exc) -> None:
    with pytest.raises(exc):
        call()


# -------- declarations: kp.external, kp.compile, kp.fusion, kp.Cache

@pytest.mark.parametrize("kw,exc,words", [
    (dict(grid=None), TypeError, "grid"), (dict(grid=1.5), TypeError, "grid"),
    (dict(grid=True), TypeError, "grid"), (dict(grid=-1), ValueError, "grid"),
    (dict(grid=2**31), ValueError, "grid"), (dict(grid=(1, 65536)), ValueError, "grid.y"),
    (dict(grid=(1, 2, 3, 4)), ValueError, "grid"), (dict(grid="m"), ValueError, "unbound"),
    (dict(block=0), ValueError, "block"), (dict(block=(32, 33)), ValueError, "block"),
    (dict(block=256.0), TypeError, "block"), (dict(shared_mem=-1), ValueError, "shared_mem"),
    (dict(shared_mem=None), TypeError, "shared_mem"), (dict(count=2**20 + 1), ValueError,
                                                        "count"),
    (dict(targets=[]), ValueError, "targets"), (dict(targets="sm_80"), TypeError, "targets"),
    (dict(targets=["sm_xx"]), ValueError, "sm_xx"), (dict(targets=[None]), TypeError,
                                                     "targets"),
    (dict(ptx=None), TypeError, "ptx="), (dict(ptx=3), TypeError, "ptx"),
    (dict(ptx="/nonexistent.ptx"), ValueError, "ptx"), (dict(params=None), TypeError, "params"),
    (dict(constraints=[(False, "x")]), ValueError, "always false"),
    (dict(args=[]), ValueError, "args"), (dict(loop="s"), ValueError, "loop"),
    (dict(module=""), ValueError, "module"),
])
def test_external_refuses_bad_arguments_naming_them(kw, exc, words) -> None:
    with pytest.raises(exc) as info:
        _external(**kw)
    assert words in str(info.value)


def _add(x: kp.Tensor[kp.f32, "n"], y: kp.Tensor[kp.f32, "n"]):  # type: ignore[valid-type]
    return x + y


@pytest.mark.parametrize("kw,exc,words", [
    (dict(targets="sm_80"), TypeError, "targets"), (dict(targets=["ptx"]), ValueError,
                                                    "architecture"),
    (dict(opt=5), ValueError, "opt"), (dict(opt=True), ValueError, "opt"),
    (dict(optimize=3), TypeError, "optimize"), (dict(static={"m": 3}), kp.TraceError, "'m'"),
    (dict(static={"n": -1}), ValueError, "negative"), (dict(static={"n": 1.5}), TypeError, "'n'"),
    (dict(static={"n": 2**64}), ValueError, "int64"), (dict(static=[("n", 3)]), TypeError,
                                                       "static"),
    (dict(cache="/tmp"), TypeError, "kp.Cache"),
])
def test_compile_refuses_bad_arguments_before_compiling(kw, exc, words) -> None:
    kw.setdefault("targets", ["sm_80"])
    with pytest.raises(exc) as info:
        kp.compile(kp.fusion(_add), **kw)
    assert words in str(info.value)


@pytest.mark.parametrize("kw,exc", [
    (dict(path=3), TypeError), (dict(path=""), ValueError), (dict(max_bytes=-1), ValueError),
    (dict(max_bytes=1.5), TypeError), (dict(max_bytes=True), TypeError),
    (dict(remote=3), TypeError), (dict(remote="http://x"), ValueError),
    (dict(remote="redis://h:99999/0"), ValueError), (dict(timeout_s=float("nan")), ValueError),
    (dict(timeout_s=0), ValueError), (dict(ttl_s=1.5), TypeError),
    (dict(wait_s=-1), ValueError), (dict(trusted_keys=[None]), ValueError),
    (dict(sign_with=3), TypeError), (dict(maxbytes=1), TypeError),
])
def test_cache_constructor_refuses_bad_arguments(tmp_path, kw, exc) -> None:
    kw.setdefault("path", tmp_path / "c")
    with pytest.raises(exc):
        kp.Cache(**kw)


def test_cache_get_put_refuse_bad_keys_and_data(tmp_path) -> None:
    cache = kp.Cache(tmp_path / "c")
    for key in ("", "zz", "../../etc/passwd", "A" * 64):
        with pytest.raises(ValueError, match="64"):
            cache.get(key)
    with pytest.raises(TypeError):
        cache.get(None)
    with pytest.raises(TypeError, match="bytes"):
        cache.put("a" * 64, "text")
    with pytest.raises(ValueError, match="artifact"):
        cache.put("a" * 64, b"garbage")
    assert cache.get("a" * 64) is None
    assert not any(p.is_file() for p in (tmp_path / "c").rglob("*.kpack"))


# -------- the command: every bad argument is one error line and a documented status

@pytest.mark.parametrize("argv,status,words", [
    (["inspect", "{dir}"], 1, "not a regular file"),
    (["inspect", "/nonexistent.kpack"], 1, "no such file"),
    (["inspect", "{art}", "--device", "sm_xx"], 2, "--device"),
    (["inspect", "{art}", "--device", "sm_86", "--driver", "12.x"], 2, "--driver"),
    (["inspect", "{art}", "--driver", "12.4"], 2, "--device"),
    (["verify", "/dev/null"], 1, "not a regular file"),
    (["verify", "{art}", "--trusted-key", "/nonexistent.pub"], 1, "public key"),
    (["eval", "{art}", "nope", "x=1"], 1, "no program 'nope'"),
    (["eval", "{art}", "axpy", "x=abc", "y=1"], 1, "x: expected a shape"),
    (["eval", "{art}", "axpy", "x=-1", "y=-1"], 1, "negative"),
    (["eval", "{art}", "axpy", "x=99999999999999999999999", "y=1"], 1, "int64"),
    (["eval", "{art}", "axpy", "x=10", "x=10", "y=10"], 1, "twice"),
    (["eval", "{art}", "axpy", "x", "10"], 1, "NAME=VALUE"),
    (["eval", "{art}", "axpy", "x=10", "y=10", "a=abc"], 1, "a: expected a number"),
    (["eval", "{art}", "rowsum", "x=4,100", "m=100.0", "scale=1"], 1, "m: expected an integer"),
    (["eval", "{art}", "rowsum", "x=4,100", "m=\udcff", "scale=1"], 1, "m: expected"),
    (["extract", "{art}", "-o", "{art}"], 1, "not a directory"),
    (["extract", "{art}", "-o", "{tmp}/x", "--max-bytes", "0"], 1, "over the limit"),
    (["extract", "{art}", "-o", "{tmp}/x", "--max-bytes", "-1"], 2, "--max-bytes"),
    (["extract", "{art}", "-o", ""], 2, "empty path"),
    (["diff", "{art}", "/nonexistent.kpack"], 2, "no such file"),
    (["keygen", "-o", "{dir}"], 1, "exists"),
    (["sign", "{art}", "--key", "/nonexistent", "-o", "{tmp}/s.kpack"], 1, "/nonexistent"),
    (["cache", "explain", "../../etc/passwd", "--dir", "{tmp}/c"], 1, "64 hex"),
    (["cache", "prune", "--dir", "{tmp}/c", "--max-bytes", "-5"], 2, "--max-bytes"),
    (["build", "{dir}", "-o", "{tmp}/b.kpack"], 1, "directory"),
    (["build", "no.such.module.r29", "-o", "{tmp}/b.kpack"], 1, "no such module"),
])
def test_cli_bad_arguments_give_one_error_line_and_status(art, tmp_path, capsys, argv, status,
                                                          words) -> None:
    subst = dict(art=str(art), dir=str(art.parent), tmp=str(tmp_path))
    code, _out, err = run(capsys, *[a.format(**subst) if "{" in a else a for a in argv])
    assert code == status, err
    assert "Traceback" not in err
    assert words in err, err
    assert not (tmp_path / "s.kpack").exists() and not (tmp_path / "b.kpack").exists()


# --------------------------------------------------------------------------------------------
# After the fixes: the neighbours of the findings.
# --------------------------------------------------------------------------------------------

def test_external_refuses_an_unevaluable_constant_scratch_size() -> None:
    with pytest.raises(ValueError, match=r"scratch 't' shape\[0\]"):
        _external(scratch=[kp.Scratch("t", kp.f32, (kp.shl(1, 64),))])


def test_external_cubin_dict_with_matching_or_no_targets(sm80_cubin) -> None:
    """targets= naming exactly the dict's architectures (any order, any case) is accepted, as
    is leaving it out; PTX or a missing key is refused naming what differs."""
    for targets in (None, ["SM_80"]):
        kw = {} if targets is None else {"targets": targets}
        c = _external(ptx=None, cubin={"sm_80": sm80_cubin}, **kw)
        assert [i.target for i in c.modules[0].images] == ["sm_80"]
    with pytest.raises(ValueError, match="asks for PTX"):
        _external(ptx=None, cubin={"sm_80": sm80_cubin}, targets=["sm_80", "ptx"])
    with pytest.raises(ValueError, match="leaves out sm_80"):
        _external(ptx=None, cubin={"sm_80": sm80_cubin}, targets=["sm_90"])


def test_extract_keeps_distinct_long_names_apart(tmp_path) -> None:
    """Two modules whose names share their first 160 characters get two files (the hash)."""
    from kernelpack.cli import main

    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"
    programs = [Compiled(axpy_summary(f"p{i}", m), (Module(m, ("axpy",), (
        Image("cubin", "sm_80", _noise(64 + i)),)),)) for i, m in enumerate((long_a, long_b))]
    art = tmp_path / "long.kpack"
    kp.save(programs, art)
    assert main(["extract", str(art), "-o", str(tmp_path / "x")]) == 0
    names = sorted(p.name for p in (tmp_path / "x").iterdir())
    assert len(names) == 2 and all(len(n) < 200 for n in names), names


def test_save_to_a_duck_typed_writer_returning_none() -> None:
    """A plain object whose write() returns nothing (not an io class) took every byte."""
    class Sink:
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, b) -> None:
            self.data += b

    sink = Sink()
    assert bytes(sink.data) == b"" and kp.save([axpy()], sink) == bytes(sink.data)


def test_plan_does_not_read_a_float_scalar(art) -> None:
    """Review 29 asked plan() to check a float scalar it is given (a="abc" returns a plan).
    Decided against it: plan() never reads a float scalar (none can change a plan), and
    callers pass `.shape` for every argument (tests/lowering/simt.py does: `()` for a 0-d
    scalar); a call checks the value (and `kernelpack eval` its text)."""
    pack = kp.load(art)
    for value in ("abc", (), None, 0.5):
        assert pack["axpy"].plan(x=(10,), y=(10,), a=value).launches


@pytest.mark.parametrize("call", [lambda x: x.mean(dim=-1, keepdim=True),
                                  lambda x: x.sum(keepdim=True), lambda x: x.max(dim=0),
                                  lambda x: kp.max(x, dim=1), lambda x: kp.mean(x, dim=1)])
def test_torch_reduction_keywords_get_numpys_names(call) -> None:
    """Review 29 (models): torch's dim=/keepdim= on a reduction named the internal class
    ("Value.mean() got an unexpected keyword argument 'dim'"); the TypeError now names the
    call as the user wrote it and says which names kernelpack reads."""
    def f(x: kp.Tensor[kp.f32, "b", "n"]):  # type: ignore[valid-type]
        return call(x)

    with pytest.raises(TypeError, match=r"^(x|kp)\.(mean|sum|max)\(\) got an unexpected keyword "
                                        r"argument '(dim|keepdim)'.*NumPy's axis= and keepdims="):
        kp.compile(kp.fusion(f), targets=["sm_80"])
