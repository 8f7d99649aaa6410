"""The summary model: the dataclasses validate themselves, with messages naming the culprit."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack.summary import (Arg, Constraint, KernelSummary, Launch, Scalar, Scratch, Tensor,
                                Variant)

X = Tensor("x", kp.f32, ["n"])
Y = Tensor("y", kp.f32, ["n"], role="out")


def _launch(*args: Arg, **kw: object) -> Launch:
    fields: dict = dict(kernel="k", module="m", grid=kp.cdiv("n", 256), block=256,
                        args=args or (Arg.buffer("x"), Arg.buffer("y")))
    fields.update(kw)
    return Launch(**fields)


def _summary(params=(X, Y), launches=None, **kw: object) -> KernelSummary:
    variant = kw.pop("variant", None) or Variant(launches or (_launch(),))
    return KernelSummary("prog", tuple(params), (variant,), **kw)  # type: ignore[arg-type]


# ---- a valid summary and its derived facts -----------------------------------------------------
def test_valid_summary_and_derived_facts() -> None:
    s = _summary((X, Scalar("alpha", kp.f32), Scalar("k", kp.i32), Y,
                  Scalar("n32", kp.u32, value="n")))
    assert s.bound_symbols() == ["n", "k"]  # float scalars are no symbols
    assert [p.name for p in s.inputs] == ["x", "alpha", "k"]
    assert [p.name for p in s.outputs] == ["y"]
    assert s.param("alpha").dtype is kp.f32
    with pytest.raises(KeyError):
        s.param("nope")


def test_normalisation() -> None:
    t = Tensor("t", "float16", ("b", 4, kp.sym("n") * 2))
    assert t.dtype is kp.f16 and t.shape == (kp.sym("b"), kp.Expr("const", (), 4), kp.sym("n") * 2)
    launch = _launch(grid=(4, "n"), block=(32, 8))
    assert launch.grid[2] == kp.Expr("const", (), 1) and len(launch.block) == 3


def test_loop_symbol_is_usable_in_its_launch() -> None:
    launch = _launch(Arg.buffer("x"), Arg.of(kp.shl(1, "s"), kp.i32), count="n", loop="s",
                     grid=kp.cdiv("n", kp.shl(1, "s")))
    s = _summary(launches=(launch,))
    assert s.loop_symbols() == ["s"]


# ---- validation errors -------------------------------------------------------------------------
@pytest.mark.parametrize("make, error, message", [
    (lambda: Tensor("1x", kp.f32, ["n"]), ValueError, "tensor name must be an identifier"),
    (lambda: Tensor("x", kp.f32, "n"), TypeError, "shape must be a sequence"),
    (lambda: Tensor("x", kp.f32, ["n"] * 17), ValueError, "rank 17 exceeds"),
    (lambda: Tensor("x", kp.f32, ["n"], role="output"), ValueError, "role must be one of"),
    (lambda: Tensor("x", kp.f32, ["n"], zero_init=True), ValueError, "zero_init applies to"),
    (lambda: Tensor("x", "float128", ["n"]), TypeError, "not a kernelpack dtype"),
    (lambda: Scalar("c", kp.c64), ValueError, "complex scalars"),
    (lambda: Scalar("c", kp.f32, value="n"), ValueError, "computed scalar must have an integer"),
    (lambda: Arg("pointer", "x"), ValueError, "argument kind must be"),
    (lambda: Arg("buffer", "x", value=kp.sym("n")), ValueError, "takes no value"),
    (lambda: Arg("value", value=kp.sym("n")), ValueError, "needs value= and dtype="),
    (lambda: Arg.of("n", kp.f32), ValueError, "integer dtype"),
    (lambda: Arg("value", "x", value=kp.sym("n"), dtype=kp.i32), ValueError, "has no name"),
    (lambda: _launch(kernel=""), ValueError, "non-empty entry name"),
    (lambda: _launch(grid=(1, 1, 1, 1)), ValueError, "grid takes 1 to 3"),
    (lambda: _launch(block=()), ValueError, "block takes 1 to 3"),
    (lambda: _launch(loop="s"), ValueError, "given without count"),
    (lambda: _launch(*[Arg.buffer("x")] * 513), ValueError, "513 arguments exceed"),
    (lambda: KernelSummary("p", (X,), ()), ValueError, "needs 1 to"),
])
def test_dataclass_validation(make, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("build, message", [
    (lambda: _summary((X, Tensor("x", kp.f32, ["n"], role="out"))), "parameter 'x' appears twice"),
    (lambda: _summary((X, Tensor("y", kp.f32, ["m"], role="out"))),
     r"y.shape\[0\] reads unbound symbol\(s\) \['m'\]"),
    (lambda: _summary((Tensor("x", kp.f32, [kp.sym("n") * 2]), Y)),
     "reads unbound symbol"),  # a compound dim binds nothing
    (lambda: _summary((X, Y, Scalar("c", kp.i32, value="q"))), r"scalar c reads unbound.*'q'"),
    (lambda: _summary(constraints=(Constraint(kp.sym("z") > 0),)), "a constraint reads unbound"),
    (lambda: _summary(launches=(_launch(grid=kp.cdiv("m", 256)),)),
     r"variant 0 launch 0 \(k\) reads unbound symbol\(s\) \['m'\]"),
    (lambda: _summary(launches=(_launch(Arg.buffer("x"), Arg.buffer("z")),)),
     "buffer argument 'z' is neither a tensor parameter nor a scratch buffer"),
    (lambda: _summary(launches=(_launch(Arg.scalar("x")),)),
     "scalar argument 'x' is not a scalar parameter"),
    (lambda: _summary(launches=(_launch(Arg.of("s", kp.i32)),)), "reads unbound symbol"),
    (lambda: _summary(launches=(_launch(count=4, loop="n"),)),
     "loop symbol 'n' shadows a bound symbol"),
    (lambda: _summary(launches=(_launch(count="m", loop="s"),)), "count reads unbound"),
    (lambda: _summary(variant=Variant((_launch(),), scratch=(Scratch("x", kp.f32, [4]),))),
     "scratch 'x' clashes with another name"),
    (lambda: _summary(variant=Variant((_launch(),), scratch=(Scratch("w", kp.f32, ["m"]),))),
     r"scratch w.shape\[0\] reads unbound"),
    (lambda: _summary(variant=Variant((_launch(),), predicate=kp.sym("m") > 4)),
     "variant 0 predicate reads unbound"),
])
def test_summary_consistency_errors(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_scratch_buffer_can_be_an_argument() -> None:
    variant = Variant((_launch(Arg.buffer("x"), Arg.buffer("w"), Arg.buffer("y")),),
                      scratch=(Scratch("w", kp.f32, [kp.cdiv("n", 256)], zero_init=True),))
    assert _summary(variant=variant).variants[0].scratch[0].name == "w"


def test_output_dims_may_be_expressions_of_bound_symbols() -> None:
    s = _summary((X, Tensor("y", kp.f32, [kp.cdiv("n", 2)], role="out")))
    assert s.outputs[0].shape[0] == kp.cdiv("n", 2)


def test_tensor_annotation() -> None:
    ann = kp.Tensor[kp.f32, "b", 4]
    assert ann.dtype is kp.f32 and ann.dims == ("b", 4)
    with pytest.raises(TypeError, match="names or ints"):
        kp.Tensor[kp.f32, 1.5]
    with pytest.raises(ValueError, match=">= 0"):
        kp.Tensor[kp.f32, -1]


def test_check_walks_shared_expressions_once_and_still_finds_unbound_symbols() -> None:
    """Fields that all read one large shared expression (what a loaded program's LOADs make)
    are checked with each node's symbols computed once; the answer is Expr.symbols()'s."""
    from kernelpack import summary as summary_module

    chain = kp.sym("n")
    for i in range(2000):
        chain = kp.emax(chain + i, kp.sym("m") * 2)
    outs = tuple(Tensor(f"t{k}", kp.f32, (chain + k,), role="out") for k in range(100))
    launch = Launch("k", "mod", (1,), (1,), (Arg.buffer("x"),))
    params = (Tensor("x", kp.f32, ("n",)), Scalar("m", kp.i64))
    KernelSummary("p", params + outs, (Variant((launch,)),))  # n and m are bound
    walked = []
    symbols = summary_module._symbols_of_many()
    real = kp.Expr.symbols
    try:
        kp.Expr.symbols = lambda self: walked.append(self) or real(self)  # type: ignore
        assert symbols(chain + 1) == {"n", "m"} == real(chain + 1)
        assert symbols(chain * 3) == {"n", "m"}  # the shared part from the memo
    finally:
        kp.Expr.symbols = real  # type: ignore[method-assign]
    assert walked == []  # check() does not walk each field on its own
    deep = kp.emax(chain, kp.sym("q"))  # an unbound symbol under the shared chain
    with pytest.raises(ValueError, match=r"t1\.shape\[0\] reads unbound symbol\(s\) \['q'\]"):
        KernelSummary("p", params + (Tensor("t0", kp.f32, (chain,), role="out"),
                                     Tensor("t1", kp.f32, (deep,), role="out")),
                      (Variant((launch,)),))


def test_numpy_scalar_types_are_dtypes() -> None:
    """kp.Tensor[np.float32, "n"] (NumPy's scalar types, as a NumPy user writes them)."""
    np = pytest.importorskip("numpy")
    assert kp.Tensor[np.float32, "n"].dtype is kp.f32
    assert kp.Tensor[np.bool_, "n"].dtype is kp.bool_
    assert kp.dtypes.as_dtype(np.complex128) is kp.c128 and kp.dtypes.as_dtype(np.uint8) is kp.u8
    with pytest.raises(TypeError, match="not a kernelpack dtype"):
        kp.Tensor[np.str_, "n"]
