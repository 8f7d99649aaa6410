"""Regressions from an adversarial review of ``kp.external`` and the summary data model: each
test is a misuse or an input that used to be accepted wrongly or fail with a raw Python error."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.external import cubin_entries, ptx_entries

from test_external import SCALE_IR

PTX = (Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx").read_text()
LLVM_IR = SCALE_IR  # an NVPTX kernel: scale(x, a, n)


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


def _axpy(**kw: object) -> kp.Compiled:
    base: dict = dict(entry="axpy", params=_params(), grid=kp.cdiv("n", 256), block=256,
                      ptx=PTX, targets=["sm_80"])
    base.update(kw)
    return kp.external("axpy", **base)


def _kinds(c: kp.Compiled) -> list[tuple[str, str]]:
    return [(i.kind, str(i.arch)) for m in c.modules for i in m.images]


# ---- sources ----------------------------------------------------------------------------------
def test_commented_out_entry_is_not_an_entry() -> None:
    ptx = PTX.replace(".entry axpy", ".entry axpy2") + "\n// .visible .entry axpy(\n/* .entry axpy */\n"
    assert ptx_entries(ptx.encode()) == ["axpy2"]
    with pytest.raises(CompileError, match=r"'axpy' is not in the PTX \(entries found: \['axpy2'\]"):
        _axpy(ptx=ptx)


def test_ptx_without_version_or_target_is_named() -> None:
    with pytest.raises(CompileError, match=r"no \.version"):
        _axpy(ptx=PTX.replace(".version 8.0", ""))
    with pytest.raises(CompileError, match=r"no \.target"):
        _axpy(ptx=PTX.replace(".target sm_80", ""))


@pytest.mark.parametrize("targets", [["sm_75"], ["compute_75"], ["sm_75", "sm_80", "ptx"]])
def test_target_below_the_ptx_target_is_named(targets: list[str]) -> None:
    """compute_75 used to be accepted silently with the sm_80 PTX (which no sm_75 can JIT)."""
    with pytest.raises(CompileError, match=r"written for sm_80 .*\['(sm|compute)_75'\]"):
        _axpy(targets=targets)


def test_ptx_with_embedded_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="ptx: .*NUL"):
        _axpy(ptx=PTX + "\0junk")
    assert _kinds(_axpy(ptx=PTX + "\0\0")) == [("cubin", "sm_80")]  # a C string's terminator


@pytest.mark.parametrize("kind", ["ptx", "cuda", "llvm_ir"])
def test_targets_given_as_a_generator_are_read_once(kind: str) -> None:
    """A generator was consumed by the first pass over the targets, so later passes saw none."""
    if kind == "llvm_ir":
        pytest.importorskip("llvmlite", reason="llvmlite (kernelpack[compile]) missing")
    listed = ["sm_80", "compute_90"] if kind == "ptx" else ["sm_80", "ptx"]
    if kind == "ptx":
        make = lambda t: _axpy(targets=t)  # noqa: E731
    elif kind == "cuda":
        src = 'extern "C" __global__ void axpy(float* x, float* y, float a, unsigned n) {}'
        make = lambda t: _axpy(ptx=None, cuda=src, targets=t)  # noqa: E731
    else:
        make = lambda t: kp.external(  # noqa: E731
            "scale", "scale", [kp.Tensor("x", kp.f32, ["n"], role="inout"),
                               kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.i32, value="n")],
            1, 1, llvm_ir=LLVM_IR, targets=t)
    assert _kinds(make(t for t in listed)) == _kinds(make(listed))


@pytest.mark.parametrize("targets", ["sm_80", 80, {"sm_80": 1}])
def test_targets_must_be_a_list(targets: object) -> None:
    with pytest.raises(TypeError, match="targets must be a list"):
        _axpy(targets=targets)


def test_targets_none_is_the_default() -> None:
    """targets=None means the default (sm_80 and sm_90): None is the signature's default
    since review 29 (a cubin dict's keys are its targets when targets= is left out)."""
    assert _kinds(_axpy(targets=None)) == _kinds(_axpy(targets=["sm_80", "sm_90"]))


def test_llvm_ir_for_an_arch_specific_and_a_later_target() -> None:
    """PTX emitted for sm_90a cannot be built for sm_100; the generic sm_90 PTX builds both."""
    pytest.importorskip("llvmlite", reason="llvmlite (kernelpack[compile]) missing")
    c = kp.external("scale", "scale", [kp.Tensor("x", kp.f32, ["n"], role="inout"),
                                       kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.i32, value="n")],
                    1, 1, llvm_ir=LLVM_IR, targets=["sm_90a", "sm_100", "ptx"])
    assert _kinds(c) == [("cubin", "sm_90a"), ("cubin", "sm_100"), ("ptx", "sm_90")]
    assert cubin_entries(c.modules[0].images[1].data) == ["scale"]


def test_cubin_bytes_targets() -> None:
    cubin = _axpy().modules[0].images[0].data
    assert _kinds(_axpy(ptx=None, cubin=cubin, targets=["sm_80", "SM_80"])) == [("cubin", "sm_80")]
    with pytest.raises(TypeError, match="targets must be a list"):
        _axpy(ptx=None, cubin=cubin, targets="sm_80")
    with pytest.raises(TypeError, match="targets must be strings"):
        _axpy(ptx=None, cubin=cubin, targets=["sm_80", None])


# ---- launch dimensions ------------------------------------------------------------------------
@pytest.mark.parametrize("grid, match", [(-1, r"grid\.x = -1"), (1 << 31, r"grid\.x = 2147483648"),
                                         ((1, 65536), r"grid\.y = 65536"),
                                         ((1, 1, -2), r"grid\.z = -2")])
def test_constant_grid_outside_cuda_limits(grid: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _axpy(grid=grid)


def test_constant_grid_and_shared_mem_within_limits() -> None:
    c = _axpy(grid=((1 << 31) - 1, 65535, 0), shared_mem=(1 << 32) - 1)
    assert c.summary.variants[0].launches[0].grid[0].value == (1 << 31) - 1


def test_negative_constant_shared_mem() -> None:
    with pytest.raises(ValueError, match=r"shared_mem = -1"):
        _axpy(shared_mem=-1)


@pytest.mark.parametrize("what", ["grid", "block"])
@pytest.mark.parametrize("value", [None, 1.5, True, b"4"])
def test_bad_dim3_names_the_parameter(what: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"^{what}"):
        _axpy(**{what: value})


# ---- parameters and lists ---------------------------------------------------------------------
@pytest.mark.parametrize("what, value", [
    ("params", None), ("params", kp.Tensor("x", kp.f32, ["n"])),
    ("scratch", kp.Scratch("w", kp.f32, ["n"])), ("scratch", None),
    ("constraints", kp.sym("n") > 0), ("constraints", None),
    ("args", 3), ("args", {"x": "x"}),
])
def test_a_bare_item_instead_of_a_list(what: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"^{what} must be a"):
        _axpy(**{what: value})


def test_tensor_shapes() -> None:
    with pytest.raises(TypeError, match=r"tensor 'x': shape must be a sequence"):
        kp.Tensor("x", kp.f32, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tensor 'x': shape\[1\] = -4 is negative"):
        kp.Tensor("x", kp.f32, ["n", -4])
    with pytest.raises(TypeError, match=r"tensor 'x': shape\[0\]"):
        kp.Tensor("x", kp.f32, [True])
    with pytest.raises(ValueError, match=r"scratch 'w': shape\[0\] = -1"):
        kp.Scratch("w", kp.f32, [-1])
    assert kp.Tensor("x", kp.f32, []).shape == ()


def test_loop_symbol() -> None:
    with pytest.raises(TypeError, match="loop must be a symbol name"):
        _axpy(count=2, loop=None)
    for name in ("a", "n32"):  # a float scalar, a computed one
        with pytest.raises(ValueError, match=f"loop symbol '{name}' is also the name of a scalar"):
            _axpy(count=2, loop=name, grid=kp.sym(name) + 1)
    c = _axpy(count=2, loop="i", grid=kp.sym("i") + 1)
    assert c.summary.loop_symbols() == ["i"]


def test_long_entry_message_is_bounded() -> None:
    with pytest.raises(ValueError, match="at most 1024 UTF-8 bytes") as info:
        _axpy(entry="k" * 5000)
    assert len(str(info.value)) < 300


# ---- round trip -------------------------------------------------------------------------------
def test_save_load_plan_round_trip_and_determinism(tmp_path: Path) -> None:
    def make() -> kp.Compiled:
        return _axpy(targets=["sm_80", "sm_90", "ptx"],
                     constraints=[(kp.sym("n") < (1 << 32), "32-bit n")])

    kp.save([make()], tmp_path / "a.kpack")
    kp.save([make()], tmp_path / "b.kpack")
    assert (tmp_path / "a.kpack").read_bytes() == (tmp_path / "b.kpack").read_bytes()
    prog = kp.load(tmp_path / "a.kpack")["axpy"]
    assert prog.plan(x=(257,), y=(257,)).launches[0].grid == (2, 1, 1)
    with pytest.raises(kp.ConstraintError, match="32-bit n"):
        prog.plan(x=(1 << 32,), y=(1 << 32,))
    with pytest.raises(kp.ConstraintError, match=r"y\.shape\[0\] is 3 but n = 4"):
        prog.plan(x=(4,), y=(3,))


def test_scalar_symbol_declared_before_the_tensor_that_uses_it() -> None:
    """An integer scalar declared before the tensor whose dim names the same symbol was
    compared while the symbol was still unset (both planners): dims now set it first."""
    from kernelpack.planner import Planner

    # (only planned, never launched: the u32 for axpy's `.param .f32 a` warns)
    with pytest.warns(UserWarning, match=r"args\[2\].*\.param \.f32 a"):
        c = kp.external("axpy", "axpy", [kp.Scalar("m", kp.i64),
                                         kp.Tensor("y", kp.f32, ["m"], role="inout")],
                        grid="m", block=256, ptx=PTX, targets=["sm_80"],
                        args=["y", "y", ("m", kp.u32), ("m", kp.u32)])
    assert Planner(c.summary).plan(m=5, y=(5,)).symbols["m"] == 5
    with pytest.raises(kp.ConstraintError, match=r"scalar m is 6 but m = 5 from y.shape\[0\]"):
        Planner(c.summary).plan(m=6, y=(5,))
    loaded = kp.load(kp.save([c]))["axpy"]  # the fast planner decides the same way
    assert loaded.plan(m=5, y=(5,)).symbols["m"] == 5
    with pytest.raises(kp.ConstraintError, match="m"):
        loaded.plan(m=6, y=(5,))
