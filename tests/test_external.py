"""kp.external: existing PTX and cubins behind a declared summary (nvJitLink, no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.errors import CompileError
from kernelpack.external import cubin_arch, cubin_entries, ptx_entries
from kernelpack.summary import Arg, Constraint, Scratch

PTX_PATH = Path(__file__).resolve().parents[1] / "examples" / "axpy.ptx"
PTX = PTX_PATH.read_text()

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")


def _params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


def _axpy(**kw: object) -> kp.Compiled:
    fields: dict = dict(ptx=PTX, targets=("sm_80", "sm_90", "ptx"))
    fields.update(kw)
    return kp.external("axpy", "axpy", _params(), kp.cdiv("n", 256), 256, **fields)


@pytest.fixture(scope="module")
def axpy() -> kp.Compiled:
    return _axpy()


def test_ptx_builds_cubins_and_keeps_ptx(axpy: kp.Compiled) -> None:
    from kernelpack.toolchain import nvjitlink

    assert axpy.origin == "external" and axpy.name == "axpy"
    (module,) = axpy.modules
    assert module.name == "axpy" and module.kernels == ("axpy",)
    assert [i.target for i in module.images] == ["sm_80", "sm_90", "compute_80"]
    for image in module.images[:2]:
        assert image.kind == "cubin" and image.data[:4] == b"\x7fELF"
        assert cubin_arch(image.data) == image.arch.major * 10 + image.arch.minor
        assert cubin_entries(image.data) == ["axpy"]
        assert image.toolchain == nvjitlink.toolchain_id()
        assert image.cuda_version == nvjitlink.cuda_version() > 0
    ptx = module.images[2]
    assert ptx.kind == "ptx" and ptx.ptx_isa == (8, 0) and b".entry axpy" in ptx.data
    assert ptx.toolchain == "external PTX"


def test_default_args_bind_every_param_in_order(axpy: kp.Compiled) -> None:
    (launch,) = axpy.summary.variants[0].launches
    assert launch.args == (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"), Arg.scalar("n32"))
    assert str(launch.grid[0]) == "cdiv(n, 256)" and launch.block[0] == kp.Expr("const", (), 256)
    assert launch.kernel == "axpy" and launch.module == "axpy"


def test_ptx_sources_bytes_path_and_str_path(tmp_path: Path) -> None:
    a = _axpy(ptx=PTX.encode(), targets=["sm_80"])
    b = _axpy(ptx=PTX_PATH, targets=["sm_80"])
    c = _axpy(ptx=str(PTX_PATH), targets=["sm_80"])
    assert a.modules[0].images == b.modules[0].images == c.modules[0].images
    with pytest.raises(ValueError, match="ptx: cannot read file"):
        _axpy(ptx=str(tmp_path / "missing.ptx"))
    with pytest.raises(TypeError, match="ptx must be"):
        _axpy(ptx=12)


def test_compute_target_alone_keeps_only_ptx() -> None:
    c = _axpy(targets=["compute_80"])
    assert [i.target for i in c.modules[0].images] == ["compute_80"]


def test_missing_entry_lists_the_entries_found() -> None:
    with pytest.raises(CompileError, match=r"'axpz' is not in the PTX \(entries found: \['axpy'\]"):
        kp.external("p", "axpz", _params(), 1, 1, ptx=PTX)
    assert ptx_entries(b".visible .entry a(\n) {}\n.entry b_2 ( ) {}") == ["a", "b_2"]


def test_bad_ptx_carries_the_nvjitlink_log() -> None:
    broken = PTX.replace("fma.rn.f32", "fma.bogus.f32")
    with pytest.raises(CompileError, match="nvJitLink failed") as info:
        kp.external("p", "axpy", _params(), 1, 1, ptx=broken, targets=["sm_90"])
    assert info.value.log  # ptxas' own message is attached


def test_cubin_bytes_and_dict(axpy: kp.Compiled) -> None:
    sm80, sm90 = (i.data for i in axpy.modules[0].images[:2])
    one = kp.external("p", "axpy", _params(), kp.cdiv("n", 256), 256, cubin=sm90,
                      targets=["sm_90"])
    assert [(i.target, i.toolchain) for i in one.modules[0].images] == [("sm_90", "external cubin")]
    both = kp.external("p", "axpy", _params(), 1, 1, cubin={"sm_90": sm90, "sm_80": sm80})
    assert [i.target for i in both.modules[0].images] == ["sm_80", "sm_90"]
    assert both.modules[0].images[1].data == sm90


@pytest.mark.parametrize("cubin, targets, error, message", [
    (b"hello world", ["sm_90"], CompileError, "not an ELF file"),
    (b"\x7fELF" + bytes(60), ["sm_90"], CompileError, "not a 64-bit little-endian ELF"),
    (b"\x7fELF\x02\x01" + bytes(58), ["sm_90"], CompileError, "not CUDA"),
    ("SM90", ["sm_80", "sm_90"], ValueError, "exactly one sm_XY target"),
    ("SM90", ["sm_90", "ptx"], ValueError, "exactly one sm_XY target"),
    ("SM90", ["sm_80"], CompileError, "declared as sm_80 was built for sm_90"),
    ({"compute_90": "SM90"}, [], ValueError, "must be sm_XY"),
    ({}, [], ValueError, "names no target"),
    ("text", ["sm_90"], TypeError, "cubin must be bytes"),
])
def test_bad_cubins(axpy: kp.Compiled, cubin, targets, error, message) -> None:
    sm90 = axpy.modules[0].images[1].data
    if cubin == "SM90":
        cubin = sm90
    elif isinstance(cubin, dict):
        cubin = {k: sm90 for k in cubin}
    with pytest.raises(error, match=message):
        kp.external("p", "axpy", _params(), 1, 1, cubin=cubin, targets=targets)


def test_cubin_without_the_entry(axpy: kp.Compiled) -> None:
    with pytest.raises(CompileError, match=r"'other' is not in the cubin for sm_90 \(entries "
                                            r"found: \['axpy'\]"):
        kp.external("p", "other", _params(), 1, 1, cubin=axpy.modules[0].images[1].data,
                    targets=["sm_90"])


def test_truncated_cubin_is_a_compile_error(axpy: kp.Compiled) -> None:
    data = axpy.modules[0].images[1].data
    with pytest.raises(CompileError, match="outside the file"):
        kp.external("p", "axpy", _params(), 1, 1, cubin=data[:200], targets=["sm_90"])


def test_explicit_args_scratch_constraints_and_repeat() -> None:
    params = [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
              kp.Scalar("a", kp.f32)]
    c = kp.external(
        "wht", "axpy", params, grid=kp.cdiv("n", kp.shl(1, "s")), block=(128, 2),
        shared_mem=kp.sym("n") * 4, ptx=PTX, targets=["sm_80"], module="kernels",
        args=["x", "w", Arg.scalar("a"), (kp.shl(1, "s"), kp.u32)],
        scratch=[Scratch("w", kp.f32, ["n"])],
        constraints=[kp.sym("n") > 0, (kp.eq(kp.sym("n") % 32, 0), "n must be a multiple of 32"),
                     Constraint(kp.sym("n") < (1 << 31))],
        count=8, loop="s")
    (launch,) = c.summary.variants[0].launches
    assert c.modules[0].name == "kernels" and launch.module == "kernels"
    assert launch.args[1] == Arg.buffer("w") and launch.args[3] == Arg.of(kp.shl(1, "s"), kp.u32)
    assert launch.count == kp.Expr("const", (), 8) and launch.loop == "s"
    assert launch.block[1] == kp.Expr("const", (), 2) and str(launch.shared_mem) == "n * 4"
    assert [x.message for x in c.summary.constraints] == ["", "n must be a multiple of 32", ""]
    assert c.summary.variants[0].scratch[0].name == "w"


@pytest.mark.parametrize("kw, error, message", [
    (dict(args=["nope"]), ValueError, r"args\[0\]: 'nope' is neither a parameter"),
    (dict(args=[3.5]), TypeError, r"args\[0\] must be"),
    (dict(args="x"), TypeError, "args must be a sequence"),
    (dict(constraints=[3.5]), TypeError, "a constraint must be"),
    (dict(scratch=["w"]), TypeError, "scratch items must be kp.Scratch"),
    (dict(cubin=b"x"), TypeError, r"exactly one kernel source: ptx=, cubin=, llvm_ir= or cuda= \(got ptx, cubin\)"),
    (dict(ptx=None), TypeError, r"\(got none\)"),
    (dict(grid=kp.cdiv("m", 256)), ValueError, r"reads unbound symbol\(s\) \['m'\]"),
    (dict(targets=["sm_8"]), ValueError, "not a GPU architecture"),
    (dict(targets="sm_80"), TypeError, r"targets must be a list"),
    (dict(name="my-kernel"), ValueError, r"program name must be an identifier .*'my-kernel'"),
    (dict(block=0), ValueError, r"block \(0, 1, 1\): CUDA needs every dim >= 1"),
    (dict(block=2048), ValueError, r"block \(2048, 1, 1\)"),
    (dict(block=(32, 32, 2)), ValueError, r"at most 1024 threads in all"),
    (dict(block=(1, 1, 65)), ValueError, r"z <= 64"),
])
def test_misuse(kw: dict, error: type, message: str) -> None:
    fields: dict = dict(name="p", entry="axpy", params=_params(), grid=1, block=1, ptx=PTX)
    fields.update(kw)
    with pytest.raises(error, match=message):
        kp.external(**fields)


def test_params_must_be_tensors_or_scalars() -> None:
    with pytest.raises(TypeError, match="params must be kp.Tensor or kp.Scalar"):
        kp.external("p", "axpy", ["x"], 1, 1, ptx=PTX)


def test_same_input_gives_identical_images(axpy: kp.Compiled) -> None:
    again = _axpy()
    assert again.modules == axpy.modules and again.summary == axpy.summary


# ---- LLVM IR --------------------------------------------------------------------------------
SCALE_IR = """
target triple = "nvptx64-nvidia-cuda"
define void @scale(ptr %x, float %a, i32 %n) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %ok = icmp ult i32 %tid, %n
  br i1 %ok, label %body, label %done
body:
  %p = getelementptr float, ptr %x, i32 %tid
  %v = load float, ptr %p
  %m = fmul float %v, %a
  store float %m, ptr %p
  br label %done
done:
  ret void
}
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
!nvvm.annotations = !{!0}
!0 = !{ptr @scale, !"kernel", i32 1}
"""


def _scale_params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"], role="inout"), kp.Scalar("a", kp.f32),
            kp.Scalar("n32", kp.i32, value="n")]


def test_llvm_ir_goes_through_ptx() -> None:
    pytest.importorskip("llvmlite", reason="llvmlite (kernelpack[compile]) missing")
    c = kp.external("scale", "scale", _scale_params(), kp.cdiv("n", 128), 128, llvm_ir=SCALE_IR,
                    targets=["sm_80", "sm_90", "ptx"])
    images = c.modules[0].images
    assert [i.target for i in images] == ["sm_80", "sm_90", "compute_80"]
    assert cubin_entries(images[1].data) == ["scale"]
    assert images[2].toolchain.startswith("LLVM ") and b".entry scale" in images[2].data


def test_llvm_ir_errors() -> None:
    pytest.importorskip("llvmlite", reason="llvmlite (kernelpack[compile]) missing")
    with pytest.raises(CompileError, match="LLVM rejected the IR") as info:
        kp.external("scale", "scale", _scale_params(), 1, 1, llvm_ir="define void @f( {\n")
    assert info.value.log
    with pytest.raises(CompileError, match="target triple must be"):
        kp.external("scale", "scale", _scale_params(), 1, 1,
                    llvm_ir=SCALE_IR.replace("nvptx64-nvidia-cuda", "x86_64-unknown-linux-gnu"))
    with pytest.raises(CompileError, match="'nope' is not in the PTX"):
        kp.external("scale", "nope", _scale_params(), 1, 1, llvm_ir=SCALE_IR)


def test_cubin_reader_survives_corruption(axpy: kp.Compiled) -> None:
    """Truncations and byte flips of a real cubin give CompileError or a clean answer, never
    struct.error / IndexError (the ELF reader checks every offset)."""
    import random

    data = axpy.modules[0].images[1].data
    rng = random.Random(1234)
    cases = [data[:n] for n in range(0, len(data), 97)]
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(mutated)) if rng.random() < 0.5 else rng.randrange(64)
            mutated[pos] = rng.randrange(256)
        cases.append(bytes(mutated))
    # section header table: corrupt its offsets and sizes specifically
    shoff = int.from_bytes(data[40:48], "little")
    for i in range(0, len(data) - shoff, 8):
        mutated = bytearray(data)
        mutated[shoff + i:shoff + i + 8] = (0xFFFFFFFF00000000 + i).to_bytes(8, "little")
        cases.append(bytes(mutated))
    for case in cases:
        try:
            cubin_entries(case)
            cubin_arch(case)
        except CompileError:
            pass


def test_in_place_facts_of_an_external_launch() -> None:
    """kp.external's ``reads_elsewhere`` and ``stores_after_loads`` (format 1.1) reach the
    launch, the file and the runtime's in-place rule: ``y`` (inout) over ``x`` is read from
    a copy when the kernel says it reads ``x`` elsewhere; names that are not the launch's
    buffers are refused, naming the field."""
    from kernelpack.runtime.in_place import refused_in_variant

    plain = _axpy(targets=["sm_90"])
    assert kp.load(kp.save(plain)).format_version == (1, 0)
    assert ("y", "x") not in refused_in_variant(plain.summary, 0)
    marked = _axpy(targets=["sm_90"], reads_elsewhere=["x"], stores_after_loads=True)
    (launch,) = marked.summary.variants[0].launches
    assert launch.reads_elsewhere == ("x",) and launch.stores_after_loads
    pack = kp.load(kp.save(marked))
    assert pack.format_version == (1, 1) and pack["axpy"].summary == marked.summary
    assert "at other elements" in refused_in_variant(marked.summary, 0)[("y", "x")]
    with pytest.raises(ValueError, match="reads_elsewhere: 'a' is not a buffer argument"):
        _axpy(targets=["sm_90"], reads_elsewhere=["a"])
    with pytest.raises(TypeError, match="stores_after_loads must be a bool"):
        _axpy(targets=["sm_90"], stores_after_loads="yes")
