"""Hand-written summaries: yes/no and expression fields are checked where they are made.

A ``zero_init`` that is not a bool used to pass the data model and crash ``kp.save`` inside
the FlatBuffers builder (``TypeError: '<=' not supported between 'bool' and 'str'``); a bool
given as a count, shared memory size, computed scalar or value argument silently became 1
(dims already refused it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.compiled import Compiled, Module
from kernelpack.summary import Arg, KernelSummary, Launch, Scalar, Scratch, Tensor, Variant

sys.path.insert(0, str(Path(__file__).parent))
import kp_samples  # noqa: E402


def _compiled(params: list, scratch: tuple = ()) -> Compiled:
    launch = Launch("k", "m", kp.cdiv("n", 256), 256, [Arg.buffer("x")])
    summary = KernelSummary("p", params, [Variant([launch], scratch)])
    return Compiled(summary, (Module("m", ("k",), (kp_samples.fake_image(),)),), "external")


@pytest.mark.parametrize("bad", ["yes", "no", 2, None, 1.0])
def test_tensor_zero_init_must_be_a_bool(bad: object) -> None:
    with pytest.raises(TypeError, match=r"tensor 'o': zero_init must be a bool \(got"):
        Tensor("o", kp.f32, ["n"], "out", zero_init=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["yes", 2, None])
def test_scratch_zero_init_must_be_a_bool(bad: object) -> None:
    with pytest.raises(TypeError, match=r"scratch 'w': zero_init must be a bool"):
        Scratch("w", kp.i32, [4], zero_init=bad)  # type: ignore[arg-type]


def test_zero_init_int_and_numpy_bool_are_stored_as_bool(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    out = Tensor("o", kp.f32, ["n"], "out", zero_init=1)  # type: ignore[arg-type]
    w = Scratch("w", kp.i32, [4], zero_init=np.bool_(True))  # type: ignore[arg-type]
    assert out.zero_init is True and w.zero_init is True
    assert Tensor("o", kp.f32, ["n"], "out", zero_init=0).zero_init is False  # type: ignore[arg-type]
    c = _compiled([Tensor("x", kp.f32, ["n"]), out], (w,))
    kp.save([c], tmp_path / "a.kpack")
    loaded = kp.load(tmp_path / "a.kpack")["p"]
    assert loaded.summary == c.summary
    plan = loaded.plan(x=(10,))
    assert plan.allocations["o"].zero_init and plan.allocations["w"].zero_init


def test_bad_zero_init_never_reaches_save(tmp_path: Path) -> None:
    """The old failure: accepted here, then an internal TypeError from flatbuffers in save."""
    with pytest.raises(TypeError, match="zero_init must be a bool"):
        c = _compiled([Tensor("x", kp.f32, ["n"])], (Scratch("w", kp.i32, [4], zero_init="no"),))
        kp.save([c], tmp_path / "a.kpack")


@pytest.mark.parametrize("make, match", [
    (lambda: Launch("k", "m", 1, 1, [], count=True), "launch 'k': count must be an int"),
    (lambda: Launch("k", "m", 1, 1, [], shared_mem=False), "launch 'k': shared_mem must be an int"),
    (lambda: Scalar("c", kp.i32, value=True), "scalar 'c': value must be an int"),
    (lambda: Arg.of(True, kp.i32), "value argument must be an int"),
    (lambda: Arg("value", value=False, dtype=kp.u8), "value argument must be an int"),
])
def test_bool_is_not_an_expression(make: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make()  # type: ignore[operator]


def test_expression_fields_name_themselves() -> None:
    with pytest.raises(TypeError, match=r"launch 'k': shared_mem: .*got 1\.5"):
        Launch("k", "m", 1, 1, [], shared_mem=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"scalar 'c': value: .*got 5\.0"):
        Scalar("c", kp.i32, value=5.0)  # type: ignore[arg-type]


def test_correct_fields_unchanged() -> None:
    launch = Launch("k", "m", 1, 1, [Arg.of(kp.sym("i") * 2, kp.i32), Arg.of(3, kp.u8)],
                    shared_mem=kp.sym("i") * 4, count=3, loop="i")
    assert launch.count == kp.expr.const(3) and launch.args[1].value == kp.expr.const(3)
    assert Scalar("c", kp.u32, value="n").value == kp.sym("n")
    assert Tensor("o", kp.f32, ["n"], "out", zero_init=True).zero_init is True
