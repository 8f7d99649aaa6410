"""Review 27: kp.save / kp.load / Pack / Program.plan / expressions, checked from the outside.

Black-box tests written against the public API (README, docs/FORMAT.md, DESIGN.md): plan()
argument conventions and its checked int64 evaluation, variant choice at predicate
boundaries, save determinism across processes, newer-minor files with appended fields in
every table (written here with the flatbuffers Builder alone), newer majors, corrupted image
bytes, signatures, the Pack container and threads.

Two tests fail at the time of writing (see the review report):
* ``test_zero_size_call_with_a_computed_scalar_plans_like_a_value_argument``: a computed
  ``kp.Scalar(value=n - 1)`` refuses n = 0 although the only launch that passes it has an
  empty grid and never runs, while the same quantity as ``Arg.of(n - 1, kp.u32)`` is accepted
  (FORMAT.md section 7: empty-grid launches are not held to the value limits).
* ``test_numpy_integer_on_the_left_of_an_expression``: ``np.int64(3) + kp.sym("n")`` is a
  NumPy TypeError while ``kp.sym("n") + np.int64(3)`` works.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import subprocess
import sys
import threading
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

import kernelpack as kp
from kernelpack import (Arg, Compiled, Image, KernelSummary, Launch, Module, Scalar,
                        Scratch, Tensor, Variant)

ROOT = Path(__file__).resolve().parent.parent
AXPY_PTX = ROOT / "examples" / "axpy.ptx"
GOLDEN = ROOT / "tests" / "golden" / "format-1.0.kpack"
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
n, m = kp.sym("n"), kp.sym("m")


# ---- helpers -----------------------------------------------------------------------------------
def _image(seed: int = 1) -> Image:
    return Image("cubin", "sm_80", b"\x7fELF" + bytes((i * seed) % 251 for i in range(300)),
                 "review27 1.0", 12080)


def _prog(name: str, params: list, variants: list, constraints: tuple = ()) -> Compiled:
    summary = KernelSummary(name, tuple(params), tuple(variants), tuple(constraints))
    return Compiled(summary, (Module("m", ("k",), (_image(),)),))


def _launch(*args: object, grid: object = (1,), block: object = (1,), **kw: object) -> Launch:
    return Launch("k", "m", grid, block, tuple(args) or (Arg.buffer("x"),), **kw)  # type: ignore[arg-type]


X = [Tensor("x", kp.f32, ("n",))]


def _axpy() -> Compiled:
    return kp.external(
        "axpy", "axpy",
        params=[kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
                kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")],
        grid=kp.cdiv("n", 256), block=256, ptx=AXPY_PTX, targets=["sm_80", "ptx"],
        constraints=[(kp.sym("n") < (1 << 32), "the kernel indexes with 32-bit n")])


@pytest.fixture(scope="module")
def axpy_bytes() -> bytes:
    return kp.save([_axpy()])


@pytest.fixture(scope="module")
def axpy(axpy_bytes: bytes) -> kp.Program:
    return kp.load(axpy_bytes)["axpy"]


# ---- plan(): calling conventions ---------------------------------------------------------------
class _TorchLike:
    def __init__(self, *shape: int) -> None:
        self.shape = shape


def test_plan_accepts_the_documented_shape_forms(axpy: kp.Program) -> None:
    want = (4, 1, 1)  # cdiv(1000, 256)
    forms = [dict(x=(1000,), y=(1000,), a=0.5), dict(x=[1000], y=[1000]),
             dict(x=(np.int64(1000),), y=(np.int32(1000),)),
             dict(x=np.zeros(1000, np.float32), y=_TorchLike(1000)),
             dict(x=_TorchLike(np.int64(1000)), y=(1000,))]
    for kwargs in forms:
        assert axpy.plan(**kwargs).launches[0].grid == want, kwargs
    assert axpy.plan((1000,), (1000,), 0.5).launches[0].grid == want
    assert axpy.plan((1000,), y=(1000,)).launches[0].grid == want
    plan = axpy.plan(x=(1000,), y=(1000,))
    assert dict(plan.symbols) == {"n": 1000, "n32": 1000} and dict(plan.computed) == {"n32": 1000}
    assert dict(plan.allocations) == {}  # y is inout: the caller's


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=(10,)), r"missing input\(s\) \['y'\]"),
    (dict(x=(10,), y=(10,), z=3), "has no input 'z'"),
    (dict(x=(10,), y=(10,), n32=10), "'n32' is not an input, it is computed"),
    (dict(x=(10,), y=None), "tensor y must be a shape tuple"),
    (dict(x=10, y=(10,)), "tensor x must be a shape tuple"),
    (dict(x="10", y=(10,)), "tensor x must be a shape tuple"),
    (dict(x={10: 1}, y=(10,)), "tensor x must be a shape tuple"),
    (dict(x=(True,), y=(1,)), r"x.shape\[0\] must be an integer"),
    (dict(x=(np.bool_(True),), y=(1,)), r"x.shape\[0\] must be an integer"),
    (dict(x=(10.0,), y=(10,)), r"x.shape\[0\] must be an integer"),
])
def test_plan_misuse_is_a_type_error_naming_the_input(axpy: kp.Program, kwargs: dict,
                                                      match: str) -> None:
    with pytest.raises(TypeError, match=match):
        axpy.plan(**kwargs)


def test_plan_positional_misuse(axpy: kp.Program) -> None:
    with pytest.raises(TypeError, match=r"takes 3 inputs .* \(got 4 positional\)"):
        axpy.plan((10,), (10,), 0.5, 7)
    with pytest.raises(TypeError, match="input 'x' given twice"):
        axpy.plan((10,), x=(10,), y=(10,))
    with pytest.raises(TypeError, match="missing input"):
        axpy.plan()


@pytest.mark.parametrize("dim, error, match", [
    (-1, kp.ConstraintError, "negative size"),
    (1 << 32, kp.ConstraintError, "32-bit n"),
    (INT64_MAX, kp.ConstraintError, "32-bit n"),
    (1 << 63, kp.ConstraintError, "outside int64"),
    (1 << 100, kp.ConstraintError, "outside int64"),
])
def test_plan_dims_out_of_range(axpy: kp.Program, dim: int, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        axpy.plan(x=(dim,), y=(dim,))


def test_plan_rank_and_binding_errors_name_both_places(axpy: kp.Program) -> None:
    with pytest.raises(kp.RankError, match="x has rank 2"):
        axpy.plan(x=(10, 3), y=(10,))
    assert issubclass(kp.RankError, kp.ConstraintError)
    with pytest.raises(kp.ConstraintError, match=r"y.shape\[0\] is 11 but n = 10 from x.shape\[0\]"):
        axpy.plan(x=(10,), y=(11,))
    assert axpy.plan(x=(0,), y=(0,)).launches[0].grid == (0, 1, 1)


# ---- scalars -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scalars_pack() -> kp.Pack:
    big, flag = kp.sym("big"), kp.sym("flag")
    progs = [
        _prog("sc", X + [Scalar("k8", kp.i8), Scalar("u", kp.u16), Scalar("flag", kp.bool_)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("k8"), Arg.scalar("u"), Arg.scalar("flag"),
                                grid=(kp.emax(kp.sym("k8"), 1), kp.select(flag, 2, 3))),))]),
        _prog("u64read", X + [Scalar("big", kp.u64)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("big"), grid=(kp.emin(big, 5),)),))]),
        _prog("u64pass", X + [Scalar("big", kp.u64)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("big")),))]),
        _prog("bind", [Tensor("x", kp.f32, ("n", "m")), Scalar("m", kp.i32), Tensor("y", kp.f32, ("m",))],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("m"), Arg.buffer("y")),))]),
        _prog("exprdim", [Tensor("x", kp.f32, (m * 2,)), Scalar("m", kp.i64)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("m")),))]),
        _prog("comp", X + [Scalar("c", kp.u32, value=n - 10)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("c")),))]),
    ]
    return kp.load(kp.save(progs))


@pytest.mark.parametrize("k8, ok", [(127, True), (-128, True), (128, False), (-129, False)])
def test_scalar_dtype_range(scalars_pack: kp.Pack, k8: int, ok: bool) -> None:
    sc = scalars_pack["sc"]
    if ok:
        assert sc.plan(x=(1,), k8=k8, u=0, flag=False).symbols["k8"] == k8
    else:
        with pytest.raises(kp.ConstraintError, match=f"scalar k8 = {k8} is outside its dtype range -128..127"):
            sc.plan(x=(1,), k8=k8, u=0, flag=False)


def test_scalar_types(scalars_pack: kp.Pack) -> None:
    sc = scalars_pack["sc"]
    for bad in (1.0, 2.5, None, "3", np.float64(1)):
        with pytest.raises(TypeError, match="scalar k8 must be an integer"):
            sc.plan(x=(1,), k8=bad, u=0, flag=False)
    with pytest.raises(kp.ConstraintError, match="scalar u = 65536"):
        sc.plan(x=(1,), k8=1, u=65536, flag=False)
    with pytest.raises(kp.ConstraintError, match="scalar flag = 2 is outside its dtype range 0..1"):
        sc.plan(x=(1,), k8=1, u=1, flag=2)
    grid = lambda **kw: sc.plan(x=(1,), k8=3, u=1, **kw).launches[0].grid  # noqa: E731
    assert grid(flag=True) == grid(flag=1) == grid(flag=np.bool_(True)) == (3, 2, 1)
    assert grid(flag=False) == grid(flag=0) == (3, 3, 1)
    assert sc.plan(x=(1,), k8=np.int8(-5), u=np.uint16(7), flag=False).symbols["u"] == 7


def test_uint64_scalar_beyond_int64(scalars_pack: kp.Pack) -> None:
    top = (1 << 64) - 1
    assert scalars_pack["u64pass"].plan(x=(1,), big=top).symbols["big"] == top
    assert scalars_pack["u64read"].plan(x=(1,), big=INT64_MAX).launches[0].grid == (5, 1, 1)
    with pytest.raises(kp.ExpressionError, match="outside int64"):
        scalars_pack["u64read"].plan(x=(1,), big=1 << 63)
    for prog in ("u64pass", "u64read"):
        with pytest.raises(kp.ConstraintError, match="outside its dtype range"):
            scalars_pack[prog].plan(x=(1,), big=1 << 64)
        with pytest.raises(kp.ConstraintError, match="outside its dtype range"):
            scalars_pack[prog].plan(x=(1,), big=-1)


def test_scalar_binding_and_expression_dims(scalars_pack: kp.Pack) -> None:
    with pytest.raises(kp.ConstraintError, match=r"scalar m is 4 but m = 3 from x.shape\[1\]"):
        scalars_pack["bind"].plan(x=(2, 3), m=4, y=(3,))
    with pytest.raises(kp.ConstraintError, match=r"y.shape\[0\] is 4 but m = 3 from x.shape\[1\]"):
        scalars_pack["bind"].plan(x=(2, 3), m=3, y=(4,))
    assert scalars_pack["exprdim"].plan(x=(6,), m=3).symbols["m"] == 3
    with pytest.raises(kp.ConstraintError, match=r"x.shape\[0\] is 7, expected m \* 2 = 6"):
        scalars_pack["exprdim"].plan(x=(7,), m=3)
    with pytest.raises(kp.ExpressionError, match="int64 overflow"):
        scalars_pack["exprdim"].plan(x=(6,), m=1 << 62)
    assert dict(scalars_pack["comp"].plan(x=(4294967305,)).computed) == {"c": 4294967295}
    with pytest.raises(kp.ConstraintError, match="computed scalar c = 4294967296"):
        scalars_pack["comp"].plan(x=(4294967306,))


def test_zero_size_call_a_computed_scalar_is_range_checked_a_value_argument_is_not() -> None:
    """n = 0 gives an empty grid, so the launch never runs (FORMAT.md section 7: such a
    launch is not held to the value-argument limits). Passing n - 1 as a value argument is
    accepted; a computed scalar parameter is a value of the whole call (in the plan, read by
    any launch) and is held to its dtype's range in every plan (FORMAT.md section 7, as
    decided in review 27)."""
    pack = kp.load(kp.save([
        _prog("as_value", X, [Variant((_launch(Arg.buffer("x"), Arg.of(n - 1, kp.u32), grid=(n,)),))]),
        _prog("as_scalar", X + [Scalar("last", kp.u32, value=n - 1)],
              [Variant((_launch(Arg.buffer("x"), Arg.scalar("last"), grid=(n,)),))]),
    ]))
    assert pack["as_value"].plan(x=(0,)).launches[0].grid == (0, 1, 1)
    assert pack["as_scalar"].plan(x=(5,)).computed["last"] == 4
    with pytest.raises(kp.ConstraintError, match="last"):
        pack["as_scalar"].plan(x=(0,))


# ---- checked int64 evaluation ------------------------------------------------------------------
@pytest.fixture(scope="module")
def eval_pack() -> kp.Pack:
    s = kp.sym("s")
    progs = [
        _prog("sq", X, [Variant((_launch(Arg.buffer("x"), Arg.buffer("ws")),),
                                scratch=(Scratch("ws", kp.f64, (n * n,)),))]),
        _prog("sh", X + [Scalar("s", kp.i32)],
              [Variant((_launch(),), scratch=(Scratch("ws", kp.f32, (kp.shl(1, s),)),))]),
        _prog("out", X + [Tensor("y", kp.f32, (kp.shl(1, n),), role="out")],
              [Variant((_launch(Arg.buffer("x"), Arg.buffer("y")),))]),
        _prog("div", X, [Variant((_launch(grid=(1000 // n,)),))]),
        _prog("mod", X, [Variant((_launch(grid=(1000 % n,)),))]),
        _prog("sel", X, [Variant((_launch(grid=(kp.select(n > 0, 1000 // n, 0),
                                                kp.select(n > 0, 1000 // n, 1),
                                                kp.select(kp.eq(n, 0), 7, kp.emin(kp.cdiv(1000, n), 5)))),))]),
        _prog("val", X, [Variant((_launch(Arg.buffer("x"), Arg.of(n * 2, kp.i32)),))]),
        _prog("negout", X + [Tensor("y", kp.f32, (n - 10,), role="out")],
              [Variant((_launch(Arg.buffer("x"), Arg.buffer("y")),))]),
    ]
    return kp.load(kp.save(progs))


def test_overflow_is_a_constraint_error_naming_the_expression(eval_pack: kp.Pack) -> None:
    assert eval_pack["sq"].plan(x=(1000,)).allocations["ws"].nbytes == 8_000_000
    with pytest.raises(kp.ConstraintError, match="needs 36893488147419103232 bytes, more than int64"):
        eval_pack["sq"].plan(x=(1 << 31,))
    with pytest.raises(kp.ExpressionError, match=r"cannot evaluate n \* n \(scratch ws.shape\[0\]\): "
                                                r"int64 overflow in mul \(with n=4294967296\)"):
        eval_pack["sq"].plan(x=(1 << 32,))
    with pytest.raises(kp.ExpressionError, match=r"n \* 2 .*int64 overflow"):
        eval_pack["val"].plan(x=(1 << 62,))
    with pytest.raises(kp.ConstraintError, match="value argument 1 = 2147483648 does not fit int32"):
        eval_pack["val"].plan(x=(1 << 30,))
    assert issubclass(kp.ExpressionError, kp.ConstraintError)


@pytest.mark.parametrize("s, error, match", [
    (10, None, None),
    (62, kp.ConstraintError, "more than int64 can hold"),
    (63, kp.ExpressionError, r"1 << s .*int64 overflow in shl"),
    (64, kp.ExpressionError, "shift count 64 outside 0..63"),
    (-1, kp.ExpressionError, "shift count -1 outside 0..63"),
    (1 << 40, kp.ConstraintError, "outside its dtype range"),
])
def test_shift_sizes(eval_pack: kp.Pack, s: int, error: type | None, match: str | None) -> None:
    if error is None:
        assert eval_pack["sh"].plan(x=(1,), s=s).allocations["ws"].shape == (1 << s,)
        assert eval_pack["out"].plan(x=(s,)).allocations["y"].nbytes == 4 << s
        return
    with pytest.raises(error, match=match):
        eval_pack["sh"].plan(x=(1,), s=s)
    if 0 <= s < 1 << 31:
        with pytest.raises(error, match=match.replace("1 << s", "1 << n")):
            eval_pack["out"].plan(x=(s,))


def test_division_and_lazy_select(eval_pack: kp.Pack) -> None:
    for name, op in (("div", "floordiv"), ("mod", "mod")):
        with pytest.raises(kp.ExpressionError, match=f"division by zero in {op} \\(with n=0\\)"):
            eval_pack[name].plan(x=(0,))
    assert eval_pack["div"].plan(x=(7,)).launches[0].grid == (142, 1, 1)
    # the untaken branch of a select never raises, even where it is a shared subexpression
    assert eval_pack["sel"].plan(x=(0,)).launches[0].grid == (0, 1, 7)
    assert eval_pack["sel"].plan(x=(7,)).launches[0].grid == (142, 142, 5)
    with pytest.raises(kp.ConstraintError, match=r"output y.shape\[0\] = -1 is negative"):
        eval_pack["negout"].plan(x=(9,))
    assert eval_pack["negout"].plan(x=(10,)).allocations["y"].nbytes == 0


# ---- launch limits, repeats, variants ----------------------------------------------------------
@pytest.fixture(scope="module")
def launch_pack() -> kp.Pack:
    i = kp.sym("i")
    progs = [
        _prog("gridx", X, [Variant((_launch(grid=(n,)),))]),
        _prog("gridy", X, [Variant((_launch(grid=(1, n, 1)),))]),
        _prog("blk", X, [Variant((_launch(block=(n,)),))]),
        _prog("blk3", X, [Variant((_launch(block=(32, 32, n)),))]),
        _prog("smem", X, [Variant((_launch(shared_mem=n),))]),
        _prog("empty", X, [Variant((_launch(Arg.buffer("x"), Arg.of(n - 1, kp.u8), grid=(n,),
                                            block=(kp.emin(n, 4096),), shared_mem=n * 10_000_000_000),))]),
        _prog("cnt", X, [Variant((_launch(Arg.buffer("x"), Arg.of(i, kp.i64), count=n - 5, loop="i"),))]),
        _prog("two", X, [Variant((_launch(count=n, loop="i"), _launch(count=n, loop="i")))]),
        _prog("var", X, [Variant((_launch(grid=(1,)),), predicate=n <= 1024),
                         Variant((_launch(grid=(2,)),), predicate=n < 4096),
                         Variant((_launch(grid=(3,)),))]),
        _prog("lazyvar", X, [Variant((_launch(grid=(1,)),), predicate=n < 10),
                             Variant((_launch(grid=(n * n * n,)),), predicate=n * n * n > 5)]),
        _prog("nonefits", X, [Variant((_launch(),), predicate=n < 10)]),
    ]
    return kp.load(kp.save(progs))


@pytest.mark.parametrize("prog, ok, bad, match", [
    ("gridx", (1 << 31) - 1, 1 << 31, r"grid \(2147483648, 1, 1\) outside the limits"),
    ("gridy", 65535, 65536, r"grid \(1, 65536, 1\) outside the limits"),
    ("blk", 1024, 1025, r"block \(1025, 1, 1\) outside the limits"),
    ("blk", 1, 0, r"block \(0, 1, 1\) outside the limits"),
    ("blk3", 1, 2, r"block \(32, 32, 2\) outside the limits"),
    ("smem", (1 << 32) - 1, 1 << 32, "shared_mem = 4294967296, expected 0..2\\^32-1"),
])
def test_launch_limits(launch_pack: kp.Pack, prog: str, ok: int, bad: int, match: str) -> None:
    assert len(launch_pack[prog].plan(x=(ok,)).launches) == 1
    with pytest.raises(kp.ConstraintError, match=match):
        launch_pack[prog].plan(x=(bad,))


def test_empty_grid_is_not_held_to_launch_limits(launch_pack: kp.Pack) -> None:
    (launch,) = launch_pack["empty"].plan(x=(0,)).launches
    assert launch.grid == (0, 1, 1) and launch.block == (0, 1, 1)
    with pytest.raises(kp.ConstraintError):
        launch_pack["empty"].plan(x=(1,))  # 10 GB of shared memory once it runs


def test_repeated_launch_counts(launch_pack: kp.Pack) -> None:
    plan = launch_pack["cnt"].plan(x=(8,))
    assert [ln.args[1] for ln in plan.launches] == [("value", i, kp.i64) for i in range(3)]
    assert {ln.index for ln in plan.launches} == {0}
    assert launch_pack["cnt"].plan(x=(5,)).launches == ()
    with pytest.raises(kp.ConstraintError, match=r"count = -1, expected 0..1048576"):
        launch_pack["cnt"].plan(x=(4,))
    with pytest.raises(kp.ConstraintError, match="count = 1048577"):
        launch_pack["cnt"].plan(x=((1 << 20) + 6,))
    with pytest.raises(kp.ConstraintError, match="more than MAX_PLANNED_LAUNCHES 1048576"):
        launch_pack["two"].plan(x=((1 << 19) + 1,))


@pytest.mark.parametrize("size, variant", [(0, 0), (1024, 0), (1025, 1), (4095, 1), (4096, 2),
                                           (10**12, 2)])
def test_first_variant_that_holds_at_the_boundary(launch_pack: kp.Pack, size: int,
                                                  variant: int) -> None:
    plan = launch_pack["var"].plan(x=(size,))
    assert plan.variant == variant and plan.launches[0].grid == (variant + 1, 1, 1)


def test_variant_predicates_are_evaluated_lazily(launch_pack: kp.Pack) -> None:
    assert launch_pack["lazyvar"].plan(x=(3,)).variant == 0  # n*n*n never evaluated
    assert launch_pack["lazyvar"].plan(x=(10,)).launches[0].grid == (1000, 1, 1)
    with pytest.raises(kp.ExpressionError, match=r"variant 1 predicate.*overflow"):
        launch_pack["lazyvar"].plan(x=(1 << 21,))
    with pytest.raises(kp.ConstraintError, match="no variant applies to n=30"):
        launch_pack["nonefits"].plan(x=(30,))


@pytest.fixture(scope="module")
def colsum() -> kp.Program:
    @kp.fusion
    def colsum(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):  # type: ignore[no-untyped-def]
        return (x * s).sum(axis=0)

    return kp.load(kp.save([kp.compile(colsum, targets=["sm_80"])]))["colsum"]


def _colsum_expected(b: int, cols: int) -> int:
    """The variant the compiled column sum's predicates pick, computed from the printed
    predicates with plain Python (splits k = min(cdiv(524288, max(n, 1)), cdiv(b, 16), 16384))."""
    k = min(-(-524288 // max(cols, 1)), -(-b // 16), 16384)
    if 4 <= k <= 32:
        return 0
    if 4 <= k <= 512:
        return 1
    return 2 if k >= 4 else 3


def test_compiled_fusion_variant_boundaries(colsum: kp.Program) -> None:
    preds = [str(v.predicate) for v in colsum.summary.variants]
    assert preds[-1] == "None" and "cdiv(524288, max(n, 1))" in preds[0], preds
    for b in (1, 48, 49, 512, 513, 8192, 8193, 1 << 40):
        for cols in (1, 16384, 16385, 1 << 20):
            plan = colsum.plan(x=(b, cols), s=1.0)
            assert plan.variant == _colsum_expected(b, cols), (b, cols)
            assert plan.allocations["out"].shape == (cols,)
    with pytest.raises(kp.ConstraintError, match="more than int64 can hold"):
        colsum.plan(x=(1, 1 << 62))
    with pytest.raises(kp.ConstraintError, match="outside int64"):
        colsum.plan(x=(1, 1 << 63))


# ---- a differential check of the evaluator ------------------------------------------------------
class _Err(Exception):
    pass


def _chk(v: int) -> int:
    if not INT64_MIN <= v <= INT64_MAX:
        raise _Err
    return v


_CONSTS = [0, 1, -1, 2, 3, 7, -7, 63, 64, 256, 1 << 31, 1 << 32, 1 << 62, -(1 << 62),
           INT64_MIN, INT64_MAX]
_BIN = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "fdiv": lambda a, b: a // b, "cdiv": kp.cdiv, "mod": lambda a, b: a % b,
        "min": kp.emin, "max": kp.emax, "shl": kp.shl, "shr": kp.shr, "lt": kp.lt, "le": kp.le,
        "gt": kp.gt, "ge": kp.ge, "eq": kp.eq, "ne": kp.ne, "and": kp.land, "or": kp.lor}


def _gen(rnd: random.Random, depth: int) -> tuple:
    if depth == 0 or rnd.random() < 0.25:
        if rnd.random() < 0.5:
            s = rnd.choice("nmt")
            return kp.sym(s), ("sym", s)
        c = rnd.choice(_CONSTS)
        return kp.sym("n") * 0 + c, ("c", c)
    op = rnd.choice([*_BIN, "not", "neg", "sel"])
    a, ta = _gen(rnd, depth - 1)
    b, tb = _gen(rnd, depth - 1)
    if op == "sel":
        c, tc = _gen(rnd, depth - 1)
        return kp.select(c, a, b), ("sel", tc, ta, tb)
    if op == "not":
        return kp.lnot(a), ("not", ta)
    if op == "neg":
        return -a, ("neg", ta)
    return _BIN[op](a, b), (op, ta, tb)


def _ev(t: tuple, env: dict) -> int:
    """FORMAT.md section 2, written out: exact int64, Python's floor semantics, lazy select."""
    k = t[0]
    if k == "sym":
        return env[t[1]]
    if k == "c":
        return t[1]
    if k == "sel":
        return _ev(t[2], env) if _ev(t[1], env) else _ev(t[3], env)
    a = _ev(t[1], env)
    if k == "not":
        return 0 if a else 1
    if k == "neg":
        return _chk(-a)
    b = _ev(t[2], env)
    if k in ("fdiv", "cdiv", "mod"):
        if b == 0:
            raise _Err
        return _chk(a // b if k == "fdiv" else -((-a) // b) if k == "cdiv" else a % b)
    if k in ("shl", "shr"):
        if not 0 <= b <= 63:
            raise _Err
        return _chk(a << b) if k == "shl" else a >> b
    if k in ("add", "sub", "mul"):
        return _chk({"add": a + b, "sub": a - b, "mul": a * b}[k])
    if k in ("min", "max"):
        return min(a, b) if k == "min" else max(a, b)
    return int({"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                "ne": a != b, "and": bool(a) and bool(b), "or": bool(a) or bool(b)}[k])


def test_random_expressions_agree_with_the_format_semantics() -> None:
    rnd = random.Random(2027)
    progs, trees = [], []
    for i in range(120):
        e, tree = _gen(rnd, 4)
        summary = KernelSummary(f"e{i:03d}", (Tensor("x", kp.f32, ("n", "m")), Scalar("t", kp.i64)),
                                (Variant((_launch(Arg.buffer("x"), Arg.of(e, kp.i64)),)),))
        progs.append(Compiled(summary, (Module("m", ("k",), (_image(),)),)))
        trees.append((tree, e))
    pack = kp.load(kp.save(progs))
    envs = [dict(n=a, m=b, t=c) for a in (0, 1, 5, 1 << 31, INT64_MAX) for b in (0, 3, 64)
            for c in (0, -1, 7, INT64_MIN, INT64_MAX)]
    wrong = []
    for (tree, e), c in zip(trees, progs):
        for env in envs:
            try:
                want: object = _ev(tree, env)
            except _Err:
                want = _Err
            try:
                got: object = pack[c.name].plan(x=(env["n"], env["m"]), t=env["t"]).launches[0].args[1][1]
            except kp.ExpressionError:
                got = _Err
            # (a simplification may remove an error, e.g. (n * n) * 0 is 0: not counted)
            if want is not _Err and got != want:
                wrong.append((str(e), env, want, got))
    assert not wrong, wrong[:5]


# ---- the expression API ------------------------------------------------------------------------
def test_expression_api_misuse() -> None:
    for bad in ("", "1a", "x.shape[0]"):
        with pytest.raises(ValueError, match="must be a Python identifier"):
            kp.sym(bad)
    with pytest.raises(TypeError, match="must be a str"):
        kp.sym(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="constant outside int64"):
        n + (1 << 63)
    with pytest.raises(TypeError, match="truth of a symbolic expression is unknown"):
        bool(n < 3)
    with pytest.raises(TypeError, match="not a constant expression"):
        int(n)
    with pytest.raises(TypeError):
        n / 2  # noqa: B018
    assert (n == 3) is False and kp.sym("n") * 0 == 0 and str(kp.cdiv(n, 256)) == "cdiv(n, 256)"
    assert n + np.int64(3) == n + 3


def test_numpy_integer_on_the_left_of_an_expression() -> None:
    """Was a bug (review 27, fixed): ``kp.sym("n") + np.int64(3)`` is ``n + 3``, but ``np.int64(3) +
    kp.sym("n")``
    raises NumPy's "operand type(s) all returned NotImplemented from __array_ufunc__"
    TypeError (Expr.__array_ufunc__ returns NotImplemented outside a fusion trace, so Python
    never tries Expr.__radd__). Sizes computed with NumPy (np.prod(shape) * n) hit this."""
    assert np.int64(3) + n == n + 3
    assert np.int32(256) * n == n * 256
    assert np.int64(1000) // n == 1000 // n


def test_too_deep_expression_is_refused_at_save_not_a_recursion_error() -> None:
    e = n
    for i in range(20000):
        e = kp.emax(e, n + i) if i % 2 else kp.emin(e + 1, 1 << 40)
    with pytest.raises(ValueError, match="nested deeper than 256"):
        kp.save([_prog("deep", X, [Variant((_launch(grid=(kp.emin(e, 1000),)),))])])


# ---- save --------------------------------------------------------------------------------------
_BUILD = f"""
import hashlib, sys
import kernelpack as kp
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_review27_load_plan import _axpy, _prog, _launch, X, n
from kernelpack import Variant, Scratch
other = _prog("other", X, [Variant((_launch(grid=(kp.cdiv(n, 128),)),), predicate=n < 4096,
                                   scratch=(Scratch("ws", kp.f32, (n,)),)),
                           Variant((_launch(grid=(n,)),))])
sys.stdout.write(hashlib.sha256(kp.save([other, _axpy()])).hexdigest())
"""


def test_save_is_deterministic_across_processes_and_hash_seeds() -> None:
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _BUILD], env=env, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_save_edge_cases(axpy_bytes: bytes) -> None:
    other = _prog("other", X, [Variant((_launch(),))])
    assert kp.save([_axpy(), other]) == kp.save([other, _axpy()]) == kp.save(x for x in [other, _axpy()])
    empty = kp.load(kp.save([]))
    assert (empty.programs, len(empty), list(empty.modules)) == ([], 0, [])
    empty.verify()
    with pytest.raises(ValueError, match="two programs are named 'axpy'"):
        kp.save([_axpy(), kp.load(axpy_bytes)["axpy"]])
    for bad in ("a-b", "a b", "1x"):
        with pytest.raises(ValueError, match="must be an identifier"):
            _prog(bad, X, [Variant((_launch(),))])
    assert kp.load(kp.save([_prog("ñame", X, [Variant((_launch(),))])])).programs == ["ñame"]
    # 600 "é" are 1200 UTF-8 bytes: refused where the name is given (the format's limit
    # counts bytes), not only by the serializer
    with pytest.raises(ValueError, match="at most 1024 UTF-8 bytes"):
        _prog("é" * 600, X, [Variant((_launch(),))])
    with pytest.raises(TypeError, match="writes to a path"):
        kp.save([other], b"/tmp/x.kpack")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kp.save(None)


def test_resave_of_loaded_artifacts_is_byte_identical(axpy_bytes: bytes) -> None:
    pack = kp.load(axpy_bytes)
    assert kp.save(pack) == kp.save(pack["axpy"]) == kp.save(pack.compiled("axpy")) == axpy_bytes
    assert kp.save(pickle.loads(pickle.dumps(pack.compiled("axpy")))) == axpy_bytes
    golden = GOLDEN.read_bytes()
    assert kp.save(kp.load(golden)) == golden


# ---- load: versions, hand-written newer minors --------------------------------------------------
_HW_IMAGE = b"\x7fELF review27 hand-written image"
# roots: 0 n, 1 cdiv(n, 128), 2 128, 3 1, 4 0, 5 n <= 1024, 6 n >= 1
_HW_OPS = bytes([2, 0, 2, 1, 14, 0, 1, 0, 1, 0, 1, 0, 2, 1, 23, 0, 2, 1, 25, 0])
_HW_IMMS = (0, 0, 128, 128, 1, 0, 0, 1024, 0, 1)
TABLES = ("Pack", "Blob", "Body", "Module", "ImageMeta", "Program", "Param", "Constraint",
          "Scratch", "Arg", "Launch", "Variant")


def _bytes(b: flatbuffers.Builder, data: bytes, align: int = 1) -> int:
    b.StartVector(1, len(data), align)
    b.head -= len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return b.EndVector()


def _vec(b: flatbuffers.Builder, values: list, kind: str) -> int:
    size = 8 if kind == "i64" else 4
    b.StartVector(size, len(values), size)
    for v in reversed(values):
        {"off": b.PrependUOffsetTRelative, "u32": b.PrependUint32, "i64": b.PrependInt64}[kind](v)
    return b.EndVector()


def _table(b: flatbuffers.Builder, name: str, nslots: int, fields: list, extra: set) -> int:
    """A table from (slot, kind, value); a table named in ``extra`` gets three fields of a
    newer minor after its known slots: a string, a long and a vector."""
    if name in extra:
        ext_str, ext_vec = b.CreateString(f"future {name}"), _vec(b, [7, 8, 9], "u32")
    b.StartObject(nslots + (3 if name in extra else 0))
    for slot, kind, value in fields:
        if kind == "dim3":
            b.Prep(4, 12)
            for v in reversed(value):
                b.PrependUint32(v)
            b.PrependStructSlot(slot, b.Offset(), 0)
        else:
            default = -1 if kind == "i32" else 0
            getattr(b, {"u8": "PrependUint8Slot", "u16": "PrependUint16Slot",
                        "u32": "PrependUint32Slot", "i32": "PrependInt32Slot",
                        "u64": "PrependUint64Slot", "off": "PrependUOffsetTRelativeSlot"}[kind])(
                slot, value, default)
    if name in extra:
        b.PrependUOffsetTRelativeSlot(nslots, ext_str, 0)
        b.PrependInt64Slot(nslots + 1, -12345, 0)
        b.PrependUOffsetTRelativeSlot(nslots + 2, ext_vec, 0)
    return b.EndObject()


def _hw_program(b: flatbuffers.Builder, name: str, extra: set) -> int:
    """p(x: f32[n], y: f32[n] out) with constraint n >= 1, variant 0 (n <= 1024, scratch ws
    of cdiv(n, 128) floats) and variant 1; one launch each: grid cdiv(n, 128), block 128."""
    s = b.CreateString
    pname, symbols = s(name), _vec(b, [s("n")], "off")
    ops, imms = _bytes(b, _HW_OPS), _vec(b, list(_HW_IMMS), "i64")
    params = []
    for param, role in (("x", 0), ("y", 1)):
        pn, shape = s(param), _vec(b, [0], "u32")
        params.append(_table(b, "Param", 7, [(0, "u8", 0), (1, "off", pn), (2, "u8", 12),
                                             (3, "u8", role), (5, "off", shape)], extra))
    params_vec = _vec(b, params, "off")
    msg = s("need n >= 1")
    constraints = _vec(b, [_table(b, "Constraint", 2, [(0, "u32", 6), (1, "off", msg)], extra)], "off")
    variants = []
    for vi in range(2):
        args = [_table(b, "Arg", 4, [(1, "off", s(a))], extra)
                for a in ["x", "y"] + (["ws"] if vi == 0 else [])]
        args_vec = _vec(b, args, "off")
        kernel, module = s("k"), s("m")
        # (10 slots since format 1.1: slots 8 and 9, reads_elsewhere and stores_after_loads,
        # are left absent)
        launch = _table(b, "Launch", 10, [(0, "off", kernel), (1, "off", module),
                                          (2, "dim3", (1, 3, 3)), (3, "dim3", (2, 3, 3)),
                                          (4, "u32", 4), (7, "off", args_vec)], extra)
        fields = [(2, "off", _vec(b, [launch], "off"))]
        if vi == 0:
            sname, sshape = s("ws"), _vec(b, [1], "u32")
            scratch = _table(b, "Scratch", 4, [(0, "off", sname), (1, "u8", 12),
                                               (2, "off", sshape)], extra)
            fields += [(0, "i32", 5), (1, "off", _vec(b, [scratch], "off"))]
        variants.append(_table(b, "Variant", 3, fields, extra))
    variants_vec = _vec(b, variants, "off")
    return _table(b, "Program", 7, [(0, "off", pname), (1, "off", symbols), (2, "off", ops),
                                    (3, "off", imms), (4, "off", params_vec),
                                    (5, "off", constraints), (6, "off", variants_vec)], extra)


def _hw_body(extra: set, programs: tuple) -> bytes:
    b = flatbuffers.Builder(1024)
    toolchain = b.CreateString("hand")
    digest, raw_digest = (_bytes(b, hashlib.sha256(_HW_IMAGE).digest()) for _ in range(2))
    image = _table(b, "ImageMeta", 12, [(0, "u8", 0), (1, "u8", 8), (2, "u8", 0),
                                        (5, "u32", 12080), (6, "off", toolchain), (7, "u8", 0),
                                        (8, "u64", len(_HW_IMAGE)), (9, "off", digest),
                                        (10, "off", raw_digest)], extra)
    mname, kernels = b.CreateString("m"), _vec(b, [b.CreateString("k")], "off")
    images = _vec(b, [image], "off")
    module = _table(b, "Module", 3, [(0, "off", mname), (1, "off", kernels), (2, "off", images)], extra)
    progs = [_hw_program(b, p, extra) for p in sorted(programs)]
    gen = b.CreateString("review27 hand writer")
    pv, mv = _vec(b, progs, "off"), _vec(b, [module], "off")
    b.Finish(_table(b, "Body", 3, [(0, "off", gen), (1, "off", pv), (2, "off", mv)], extra))
    return bytes(b.Output())


def _hw_artifact(extra: tuple = (), programs: tuple = ("p",), major: int = 1, minor: int = 0,
                 body_digest: bytes | None = None) -> bytes:
    body = _hw_body(set(extra), programs)
    b = flatbuffers.Builder(1024)
    vec = _bytes(b, _HW_IMAGE)
    blobs = _vec(b, [_table(b, "Blob", 1, [(0, "off", vec)], set(extra))], "off")
    digest = _bytes(b, body_digest or hashlib.sha256(body).digest())
    body_vec = _bytes(b, body, 8)
    root = _table(b, "Pack", 6, [(0, "u16", major), (1, "u16", minor), (2, "off", body_vec),
                                 (3, "off", digest), (4, "off", blobs)], set(extra))
    b.Finish(root, file_identifier=b"KPAK")
    return bytes(b.Output())


def _hw_facts(pack: kp.Pack) -> list:
    out = []
    for name in pack:
        for size in (1000, 5000):
            plan = pack[name].plan(x=(size,))
            out.append((plan.variant, {k: (a.shape, a.nbytes) for k, a in plan.allocations.items()},
                        [(ln.grid, ln.block, ln.args) for ln in plan.launches]))
    return out


def test_hand_written_baseline_plans_as_specified() -> None:
    pack = kp.load(_hw_artifact())
    assert _hw_facts(pack) == [
        (0, {"y": ((1000,), 4000), "ws": ((8,), 32)},
         [((8, 1, 1), (128, 1, 1), (("buffer", "x"), ("buffer", "y"), ("buffer", "ws")))]),
        (1, {"y": ((5000,), 20000)}, [((40, 1, 1), (128, 1, 1), (("buffer", "x"), ("buffer", "y")))]),
    ]
    with pytest.raises(kp.ConstraintError, match="need n >= 1"):
        pack["p"].plan(x=(0,))
    pack.verify()


@pytest.mark.parametrize("programs", [("p",), tuple(f"p{i:02d}" for i in range(12))],
                         ids=["one", "twelve"])
@pytest.mark.parametrize("table", [*TABLES, "all"])
def test_newer_minor_with_fields_appended_to_any_table_loads(table: str, programs: tuple) -> None:
    extra = TABLES if table == "all" else (table,)
    pack = kp.load(_hw_artifact(extra=extra, programs=programs, minor=4))
    assert pack.format_version == (1, 4) and pack.programs == list(programs)
    assert _hw_facts(pack) == _hw_facts(kp.load(_hw_artifact(programs=programs)))
    assert pack.modules["m"].images[0].read() == _HW_IMAGE
    pack.verify()
    assert kp.load(kp.save(pack)).format_version == (1, 0)


def test_newer_major_is_refused_first() -> None:
    for major in (2, 65535):
        with pytest.raises(kp.CompatibilityError, match=f"file format {major}.0 is newer"):
            kp.load(_hw_artifact(major=major))
    # nothing else is interpreted: a wrong body digest or another layout is still version skew
    with pytest.raises(kp.CompatibilityError, match="2.0 is newer"):
        kp.load(_hw_artifact(major=2, body_digest=bytes(32)))
    b = flatbuffers.Builder(64)
    text = b.CreateString("a future layout")
    b.StartObject(5)
    b.PrependUint16Slot(0, 2, 0)
    b.PrependUint16Slot(1, 3, 0)
    b.PrependUOffsetTRelativeSlot(2, text, 0)
    b.PrependUint64Slot(3, (1 << 64) - 1, 0)
    b.PrependInt8Slot(4, -1, 0)
    b.Finish(b.EndObject(), file_identifier=b"KPAK")
    with pytest.raises(kp.CompatibilityError, match="2.3 is newer"):
        kp.load(bytes(b.Output()))
    assert kp.load(_hw_artifact(minor=65535)).format_version == (1, 65535)
    with pytest.raises(kp.FormatError, match="format_major is 0"):
        kp.load(_hw_artifact(major=0))


def test_golden_loads_plans_and_verifies() -> None:
    pack = kp.load(GOLDEN)
    assert pack.format_version == (1, 0) and pack.programs == ["axpy", "features"]
    assert pack["axpy"].plan(x=(1_000_000,), y=(1_000_000,), a=0.5).launches[0].grid == (3907, 1, 1)
    pack.verify()


# ---- load: damaged files ------------------------------------------------------------------------
def test_trailing_bytes_never_give_a_foreign_exception(axpy_bytes: bytes) -> None:
    for tail in (b"\0", b"garbage!", b"\xff" * 4096):
        try:
            pack = kp.load(axpy_bytes + tail)
        except kp.KernelPackError:
            continue
        assert pack.programs == ["axpy"]
        pack.verify()


def test_image_bytes_changed_after_signing_the_body(axpy_bytes: bytes) -> None:
    """Body digest intact, one blob changed: load and plan work (they need no image); every
    path that reads the image raises IntegrityError before decompressing it."""
    pack = kp.load(axpy_bytes)
    image = pack.modules["axpy"].images[0]
    from kernelpack._generated.Pack import Pack as FPack

    fpack = FPack.GetRootAs(axpy_bytes, 0)
    blobs = [fpack.Blobs(i).DataAsNumpy().tobytes() for i in range(fpack.BlobsLength())]
    stored = next(blob for blob in blobs if hashlib.sha256(blob).hexdigest() == image.digest)
    at = axpy_bytes.find(stored) + len(stored) // 2
    bad = bytearray(axpy_bytes)
    bad[at] ^= 0x40
    damaged = kp.load(bytes(bad))
    assert damaged["axpy"].plan(x=(10,), y=(10,)).launches[0].grid == (1, 1, 1)
    for use in (lambda: damaged.modules["axpy"].images[0].read(), damaged.verify,
                lambda: damaged.compiled("axpy"), lambda: kp.save(damaged),
                lambda: kp.save(damaged["axpy"])):
        with pytest.raises(kp.IntegrityError, match="stored bytes do not match their digest"):
            use()


def test_load_argument_types(axpy_bytes: bytes, tmp_path: Path) -> None:
    assert kp.load(bytearray(axpy_bytes)).programs == ["axpy"]
    assert kp.load(memoryview(axpy_bytes)).programs == ["axpy"]
    path = tmp_path / "a.kpack"
    path.write_bytes(axpy_bytes)
    assert kp.load(path).programs == kp.load(str(path)).programs == ["axpy"]
    for bad in (3, None):
        with pytest.raises(TypeError, match="kp.load takes a path or bytes"):
            kp.load(bad)
    with pytest.raises(kp.FormatError, match="0 bytes, expected at least 8"):
        kp.load(b"")


# ---- signatures --------------------------------------------------------------------------------
def test_trusted_key_forms(tmp_path: Path) -> None:
    from kernelpack.signing import write_keypair

    priv, pub = write_keypair(tmp_path / "team")
    _, pub2 = write_keypair(tmp_path / "other")
    signed = kp.save([_prog("p", X, [Variant((_launch(),))])], sign_with=priv)
    unsigned = kp.save([_prog("p", X, [Variant((_launch(),))])])
    hexkey = Path(pub).read_text().strip()
    raw = bytes.fromhex(hexkey)
    assert kp.load(signed).signature.verified is False
    for keys in (pub, [pub], Path(pub), hexkey, hexkey.upper(), [hexkey], raw, [raw],
                 bytearray(raw), (pub2, pub), (k for k in [pub])):
        info = kp.load(signed, trusted_keys=keys).signature
        assert info.verified and info.key_id == hashlib.sha256(raw).hexdigest()[:16]
    with pytest.raises(kp.SignatureError, match="not trusted"):
        kp.load(signed, trusted_keys=[pub2])
    with pytest.raises(kp.SignatureError, match=r"not trusted \(trusted: none\)"):
        kp.load(signed, trusted_keys=[])
    with pytest.raises(kp.SignatureError, match="unsigned"):
        kp.load(unsigned, trusted_keys=[pub])
    with pytest.raises(ValueError, match="is a private key; trust its public key"):
        kp.load(signed, trusted_keys=[priv])
    for bad in ("zz", bytes(31), 5, [None]):
        with pytest.raises(ValueError, match="trusted_keys: not an ed25519 public key"):
            kp.load(signed, trusted_keys=bad)
    with pytest.raises(ValueError, match="no such public key file"):
        kp.load(signed, trusted_keys=str(tmp_path / "missing.pub"))
    assert kp.save(kp.load(unsigned), sign_with=priv) == signed  # deterministic signing
    assert kp.load(kp.save(kp.load(signed))).signature is None


# ---- Pack as a container, pickling, threads -----------------------------------------------------
def test_pack_container_protocol(axpy_bytes: bytes) -> None:
    pack = kp.load(kp.save([_axpy(), _prog("other", X, [Variant((_launch(),))])]))
    assert len(pack) == 2 and list(pack) == pack.programs == ["axpy", "other"]
    assert "axpy" in pack and "zz" not in pack and 3 not in pack
    assert pack["axpy"] is pack["axpy"]
    with pytest.raises(KeyError, match="no program 'zz' in this pack \\(has: axpy, other\\)"):
        pack["zz"]
    pack.programs.append("x")  # a copy
    assert pack.programs == ["axpy", "other"]
    with pytest.raises(TypeError):
        pack.modules["x"] = None  # type: ignore[index]
    for obj in (pack, pack["axpy"], pack.modules["axpy"]):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)
    plan = pack["axpy"].plan(x=(10,), y=(10,))
    assert pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises((TypeError, AttributeError)):
        plan.symbols["n"] = 3  # type: ignore[index]


def test_concurrent_first_plans_from_eight_threads() -> None:
    variants = []
    for v in range(8):
        g = kp.cdiv(n * (v + 3), 7 + v) + kp.emin(m, 100 + v)
        variants.append(Variant(
            (Launch("k", "m", (g, kp.emin(m, 17 * (v + 1))), (32 * (v + 1),),
                    (Arg.buffer("x"), Arg.buffer("ws"), Arg.of(g * 2 + v, kp.i64)),
                    shared_mem=kp.emin(n * 4 + v, 4096)),
             Launch("k", "m", (kp.cdiv(m, v + 1),), (64,), (Arg.buffer("ws"), Arg.buffer("out")))),
            scratch=(Scratch("ws", kp.f32, (kp.cdiv(n, v + 1) + v, m)),),
            predicate=(n <= (1 << (4 + 2 * v))) if v < 7 else None))
    summary = KernelSummary("many", (Tensor("x", kp.f32, ("n", "m")),
                                     Tensor("out", kp.f32, (n + 1,), role="out")), tuple(variants))
    data = kp.save([Compiled(summary, (Module("m", ("k",), (_image(),)),))])
    shapes = [(a, b) for a in (1, 16, 17, 64, 65, 256, 257, 1024, 1025, 4096, 4097, 16385, 65537,
                               262145, 10**6) for b in (1, 5, 64)]
    reference = kp.load(data)["many"]
    expected = {sh: reference.plan(x=sh) for sh in shapes}
    assert len({p.variant for p in expected.values()}) == 8
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(6):
            pack = kp.load(data)
            barrier = threading.Barrier(8)
            problems: list = []

            def work(seed: int) -> None:
                order = shapes[:]
                random.Random(seed).shuffle(order)
                barrier.wait()
                try:
                    for sh in order:
                        if pack["many"].plan(x=sh) != expected[sh]:
                            problems.append(sh)
                        with pytest.raises(kp.RankError):
                            pack["many"].plan(x=sh[:1])
                except BaseException as exc:  # noqa: BLE001 - reported below
                    problems.append(repr(exc))

            threads = [threading.Thread(target=work, args=(trial * 10 + i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not problems, problems[:3]
    finally:
        sys.setswitchinterval(old)
