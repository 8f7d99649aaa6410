"""Review 27, kp.external as a black box: PTX, CUDA C (NVRTC), NVPTX LLVM IR and cubins behind a
declared summary, checked up to the plan (no GPU): kp.external -> kp.save -> kp.load ->
program.plan and ``kernelpack eval``. Plans are compared with values worked out by hand.

The tests named ``test_bug_*`` fail on the reviewed checkout and pass once the bug is fixed;
every other test pins behaviour that is right today."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.dtypes import as_dtype
from kernelpack.errors import CompileError, ConstraintError, KernelPackError

ROOT = Path(__file__).resolve().parents[1]
AXPY = (ROOT / "examples" / "axpy.ptx").read_text()


def _nvrtc_ok() -> bool:
    try:
        from kernelpack.toolchain import nvrtc

        nvrtc.toolchain_id()
        return True
    except Exception:  # noqa: BLE001 - any failure means: no NVRTC here
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC (nvidia-cuda-nvrtc) missing")


def _axpy_params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n32", kp.u32, value="n")]


def _axpy(**kw: object) -> kp.Compiled:
    args: dict = dict(name="axpy", entry="axpy", params=_axpy_params(), grid=kp.cdiv("n", 256),
                      block=256, ptx=AXPY, targets=["sm_80"])
    args.update(kw)
    return kp.external(**args)


def _ptx(decl: str, entry: str = "k") -> str:
    """A kernel that does nothing, with the given .param list (nvJitLink assembles it)."""
    return (f".version 8.0\n.target sm_80\n.address_size 64\n"
            f".visible .entry {entry}({decl})\n{{\n  ret;\n}}\n")


def _k(decl: str, params: list, **kw: object) -> kp.Compiled:
    args: dict = dict(name="k", entry="k", params=params, grid=1, block=1, ptx=_ptx(decl),
                      targets=["sm_80"])
    args.update(kw)
    return kp.external(**args)


def _save_bytes(tmp_path: Path, *compiled: kp.Compiled, name: str = "a.kpack") -> bytes:
    path = tmp_path / name
    kp.save(list(compiled), path)
    return path.read_bytes()


def _load(tmp_path: Path, *compiled: kp.Compiled):
    path = tmp_path / "p.kpack"
    kp.save(list(compiled), path)
    return kp.load(path)


def _images(c: kp.Compiled) -> list[tuple[str, str]]:
    return sorted((i.kind, i.arch.sm) for m in c.modules for i in m.images)


# ================================================================================================
# PTX: entries, assembly errors, the .param list
# ================================================================================================
def test_entry_name_not_in_the_ptx_names_what_is_there() -> None:
    with pytest.raises(CompileError, match=r"'saxpy' is not in the PTX.*\['axpy'\]"):
        _axpy(entry="saxpy")


def test_ptx_syntax_error_is_a_compile_error_with_the_ptxas_log() -> None:
    with pytest.raises(CompileError) as info:
        _axpy(ptx=AXPY.replace("fma.rn.f32", "fmaXX.rn.f32"))
    text = str(info.value)
    assert "sm_80" in text and "fmaXX" in text  # the target and nvJitLink's log


def test_argument_count_differing_from_the_ptx_entry_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"3 kernel argument\(s\).*declares 4 parameter"):
        _axpy(args=["x", "y", "a"])
    with pytest.raises(ValueError, match=r"declares 4 parameter"):  # default args: 3 params
        _axpy(params=_axpy_params()[:3])


def test_width_and_kind_mismatches_warn_as_documented() -> None:
    # README: a different width (an f64 scalar for a .param .f32) is a UserWarning.
    params = _axpy_params()
    params[2] = kp.Scalar("a", kp.u64)  # 8-byte integer for ".param .f32 a"
    with pytest.warns(UserWarning, match=r"args\[2\].*'a'.*\.param \.f32 a"):
        _axpy(params=params)
    params[2] = kp.Scalar("a", kp.i32)  # same width, integer for a float
    with pytest.warns(UserWarning, match=r"args\[2\].*integer"):
        _axpy(params=params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _axpy()  # the README's declaration is silent


@pytest.mark.parametrize("dtype, decl", [
    ("bool", ".param .u8 s"), ("bool", ".param .b8 s"), ("f16", ".param .b16 s"),
    ("f16", ".param .f16 s"), ("bf16", ".param .b16 s"), ("f64", ".param .f64 s"),
    ("i8", ".param .s8 s"), ("u16", ".param .u16 s"), ("i64", ".param .s64 s"),
])
def test_every_scalar_dtype_meets_its_natural_ptx_type_silently(dtype: str, decl: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = _k(decl, [kp.Scalar("s", dtype)])
    assert c.summary.params[0].dtype == as_dtype(dtype)


def test_complex_scalars_are_refused_naming_the_scalar() -> None:
    with pytest.raises(ValueError, match=r"scalar 's': complex"):
        kp.Scalar("s", "complex64")


def test_unknown_argument_names_the_position_and_the_known_names() -> None:
    with pytest.raises(ValueError, match=r"args\[2\]: 'b'.*\['a', 'n32', 'x', 'y'\]"):
        _axpy(args=["x", "y", "b", "n32"])


def test_value_argument_needs_an_integer_dtype_and_bound_symbols() -> None:
    x = [kp.Tensor("x", kp.f32, ["n"])]
    with pytest.raises(ValueError, match="integer dtype"):
        _k(".param .f32 v", x, args=[("n", kp.f32)])
    with pytest.raises(ValueError, match=r"unbound symbol\(s\) \['m'\]"):
        _k(".param .u32 v", x, args=[("m", kp.u32)])


def test_output_shape_over_unbound_symbol_is_refused() -> None:
    with pytest.raises(ValueError, match=r"z\.shape\[0\] reads unbound symbol\(s\) \['m'\]"):
        _axpy(params=_axpy_params() + [kp.Tensor("z", kp.f32, ["m"], role="out")])


def test_duplicate_parameter_and_scratch_names_are_refused() -> None:
    with pytest.raises(ValueError, match="'a' appears twice"):
        _axpy(params=_axpy_params()[:3] + [kp.Scalar("a", kp.u32, value="n")])
    with pytest.raises(ValueError, match="scratch 'w' clashes"):
        _k(".param .u64 x, .param .u64 w", [kp.Tensor("x", kp.f32, ["n"])], args=["x", "w"],
           scratch=[kp.Scratch("w", kp.f64, ["n"]), kp.Scratch("w", kp.f32, ["n"])])


# ================================================================================================
# launch configuration checked at declaration
# ================================================================================================
@pytest.mark.parametrize("block", [2048, (32, 32, 2), 0, -1, (1, 1, 65)])
def test_constant_block_outside_cuda_limits(block: object) -> None:
    with pytest.raises(ValueError, match="block"):
        _axpy(block=block)


def test_constant_grid_and_shared_mem_outside_cuda_limits() -> None:
    with pytest.raises(ValueError, match=r"grid\.x = 2147483648"):
        _axpy(grid=2 ** 31)
    with pytest.raises(ValueError, match=r"grid\.y = 65536"):
        _axpy(grid=(1, 65536))
    with pytest.raises(ValueError, match="shared_mem = -1"):
        _axpy(shared_mem=-1)
    with pytest.raises(ValueError, match="count = 1000000000"):
        _axpy(count=10 ** 9, loop="i")


# ================================================================================================
# targets
# ================================================================================================
def test_duplicate_and_differently_spelled_targets_give_one_image_each() -> None:
    assert _images(_axpy(targets=["sm_80", "SM_80", " sm_80", "ptx", "PTX"])) == [
        ("cubin", "sm_80"), ("ptx", "sm_80")]


def test_compute_only_targets_keep_the_ptx_for_its_own_target() -> None:
    assert _images(_axpy(targets=["compute_80"])) == [("ptx", "sm_80")]
    assert _images(_axpy(targets=["compute_90", "sm_90"])) == [("cubin", "sm_90"),
                                                              ("ptx", "sm_80")]


def test_targets_without_an_architecture_or_below_the_ptx_target() -> None:
    with pytest.raises(ValueError, match="no architecture"):
        _axpy(targets=["ptx"])
    with pytest.raises(ValueError, match="no architecture"):
        _axpy(targets=[])
    with pytest.raises(CompileError, match=r"written for sm_80.*\['sm_70'\]"):
        _axpy(targets=["sm_70"])
    with pytest.raises(ValueError, match="sm_xx"):
        _axpy(targets=["sm_xx"])


# ================================================================================================
# cubins
# ================================================================================================
@pytest.fixture(scope="module")
def cubins() -> dict[str, bytes]:
    c = _axpy(targets=["sm_80", "sm_90"])
    return {i.arch.sm: i.data for i in c.modules[0].images}


def _from_cubin(cubin: object, **kw: object) -> kp.Compiled:
    args: dict = dict(name="axpy", entry="axpy", params=_axpy_params(), grid=kp.cdiv("n", 256),
                      block=256, cubin=cubin)
    args.update(kw)
    return kp.external(**args)


def test_cubin_built_for_another_architecture_is_refused(cubins: dict[str, bytes]) -> None:
    with pytest.raises(CompileError, match="declared as sm_90 was built for sm_80"):
        _from_cubin(cubins["sm_80"], targets=["sm_90"])
    with pytest.raises(CompileError, match="declared as sm_90 was built for sm_80"):
        _from_cubin({"sm_90": cubins["sm_80"]})


@pytest.mark.parametrize("mangle", ["garbage", "empty", "truncated", "ptx", "elf32", "x86"])
def test_bad_cubin_bytes_are_compile_errors(cubins: dict[str, bytes], mangle: str) -> None:
    good = cubins["sm_90"]
    data = {"garbage": b"garbage" * 10, "empty": b"", "truncated": good[: len(good) // 2],
            "ptx": AXPY.encode(), "elf32": good[:4] + b"\x01" + good[5:],
            "x86": good[:18] + (62).to_bytes(2, "little") + good[20:]}[mangle]
    with pytest.raises(CompileError, match="cubin for sm_90"):
        _from_cubin(data, targets=["sm_90"])


def test_cubin_entry_and_arguments_are_checked(cubins: dict[str, bytes]) -> None:
    with pytest.raises(CompileError, match=r"'saxpy' is not in the cubin.*\['axpy'\]"):
        _from_cubin(cubins["sm_90"], targets=["sm_90"], entry="saxpy")
    with pytest.raises(ValueError, match=r"3 kernel argument\(s\).*declares 4"):
        _from_cubin(cubins["sm_90"], targets=["sm_90"], args=["x", "y", "a"])
    with pytest.raises(ValueError, match="sm_XY"):
        _from_cubin({"compute_90": cubins["sm_90"]})


# ================================================================================================
# determinism
# ================================================================================================
def test_the_same_ptx_call_twice_gives_identical_artifacts(tmp_path: Path) -> None:
    a = _save_bytes(tmp_path, _axpy(targets=["sm_80", "sm_90", "ptx"]), name="a.kpack")
    b = _save_bytes(tmp_path, _axpy(targets=["ptx", "sm_90", "sm_80"]), name="b.kpack")
    assert a == b


LLVM_IR = r"""
target triple = "nvptx64-nvidia-cuda"
define void @scale(float* %x, float %a, i32 %n) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %c = icmp ult i32 %tid, %n
  br i1 %c, label %body, label %done
body:
  %p = getelementptr float, float* %x, i32 %tid
  %v = load float, float* %p
  %m = fmul float %v, %a
  store float %m, float* %p
  br label %done
done:
  ret void
}
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
!nvvm.annotations = !{!0}
!0 = !{void (float*, float, i32)* @scale, !"kernel", i32 1}
"""


def _scale_params(dtype: str = "f32") -> list:
    return [kp.Tensor("x", dtype, ["n"], role="inout"), kp.Scalar("a", dtype),
            kp.Scalar("n32", kp.u32, value="n")]


def test_llvm_ir_round_trip_checks_and_determinism(tmp_path: Path) -> None:
    pytest.importorskip("llvmlite")

    def make(**kw: object) -> kp.Compiled:
        args: dict = dict(name="scale", entry="scale", params=_scale_params(), grid=1,
                          block=256, llvm_ir=LLVM_IR, targets=["sm_80", "ptx"])
        args.update(kw)
        return kp.external(**args)

    assert _images(make()) == [("cubin", "sm_80"), ("ptx", "sm_80")]
    assert _save_bytes(tmp_path, make(), name="1") == _save_bytes(tmp_path, make(), name="2")
    with pytest.raises(ValueError, match=r"2 kernel argument\(s\).*declares 3"):
        make(params=_scale_params()[:2])
    with pytest.raises(CompileError, match="LLVM rejected"):
        make(llvm_ir=LLVM_IR.replace("fmul float", "fmulx float"))
    with pytest.raises(CompileError, match="triple"):
        make(llvm_ir=LLVM_IR.replace("nvptx64-nvidia-cuda", "x86_64-unknown-linux-gnu"))


# ================================================================================================
# CUDA C through NVRTC
# ================================================================================================
SCALE_C = ('extern "C" __global__ void scale(float* x, float a, unsigned n)'
           '{unsigned i=blockIdx.x*blockDim.x+threadIdx.x; if(i<n) x[i]*=a;}\n')
SCALE_CPP = SCALE_C.replace('extern "C" ', "")
SCALE_T = ('template <typename T> __global__ void scale(T* x, T a, unsigned n)'
           '{unsigned i=blockIdx.x*blockDim.x+threadIdx.x; if(i<n) x[i]*=a;}\n')


def _cuda(src: str, entry: str = "scale", **kw: object) -> kp.Compiled:
    args: dict = dict(name="scale", entry=entry, params=_scale_params(), grid=kp.cdiv("n", 256),
                      block=256, cuda=src, targets=["sm_80"])
    args.update(kw)
    return kp.external(**args)


@needs_nvrtc
def test_cuda_extern_c_template_and_plain_cpp(tmp_path: Path) -> None:
    assert _cuda(SCALE_C).modules[0].kernels == ("scale",)
    assert _cuda(SCALE_T, "scale<float>").modules[0].kernels == ("_Z5scaleIfEvPT_S0_j",)
    # a C++ kernel named as written: the hint says what to do
    with pytest.raises(CompileError, match=r"_Z5scalePffj.*extern \"C\""):
        _cuda(SCALE_CPP)
    assert _cuda(SCALE_CPP, "::scale").modules[0].kernels == ("_Z5scalePffj",)
    # a double instantiation behind float parameters: the cubin's sizes say so
    with pytest.warns(UserWarning, match=r"args\[1\].*8 bytes"):
        _cuda(SCALE_T, "scale<double>")
    a = _save_bytes(tmp_path, _cuda(SCALE_T, "scale<float>", targets=["sm_80", "ptx"]), name="1")
    b = _save_bytes(tmp_path, _cuda(SCALE_T, "scale<float>", targets=["ptx", "sm_80"]), name="2")
    assert a == b


@needs_nvrtc
def test_cuda_compile_error_carries_the_nvrtc_log() -> None:
    with pytest.raises(CompileError, match=r"(?s)sm_80.*--- log ---.*expected a \";\""):
        _cuda(SCALE_C.replace("x[i]*=a;", "x[i]*=a"))


@needs_nvrtc
@pytest.mark.parametrize("opts", [["-arch", "sm_90"], ["--gpu-architecture=sm_80"],
                                  ["  -arch=sm_90"], ["-rdc=true"], ["-dlto"]])
def test_cuda_options_that_pick_the_architecture_or_output_are_refused(opts: list) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        _cuda(SCALE_C, nvrtc_options=opts)


@needs_nvrtc
def test_architecture_smuggled_through_ptxas_options_is_caught() -> None:
    with pytest.raises(CompileError, match="declared as sm_80 was built for sm_90"):
        _cuda(SCALE_C, nvrtc_options=["-Xptxas", "--gpu-name=sm_90"])


@needs_nvrtc
def test_cuda_targets_ptx_compute_and_duplicates() -> None:
    assert _images(_cuda(SCALE_C, targets=["ptx", "compute_80", "sm_90"])) == [
        ("cubin", "sm_90"), ("ptx", "sm_80")]
    assert _images(_cuda(SCALE_C, targets=["sm_80", "SM_80"])) == [("cubin", "sm_80")]
    assert _images(_cuda(SCALE_C, targets=["compute_90"])) == [("ptx", "sm_90")]


# ================================================================================================
# plans against hand computation
# ================================================================================================
def test_readme_axpy_plan(tmp_path: Path) -> None:
    prog = _load(tmp_path, _axpy(targets=["sm_80", "ptx"]))["axpy"]
    plan = prog.plan(x=(1_000_000,), y=(1_000_000,), a=0.5)
    assert plan.launches[0].grid == (3907, 1, 1)  # ceil(1e6 / 256)
    assert plan.launches[0].block == (256, 1, 1)
    assert dict(plan.computed) == {"n32": 1_000_000}
    with pytest.raises(ConstraintError, match=r"y\.shape\[0\] is 11 but n = 10"):
        prog.plan(x=(10,), y=(11,), a=0.5)
    with pytest.raises(ConstraintError, match=r"n32 = 4294967296 is outside"):
        prog.plan(x=(2 ** 32,), y=(2 ** 32,), a=0.5)
    zero = prog.plan(x=(0,), y=(0,), a=0.5)
    assert zero.launches[0].grid == (0, 1, 1) and dict(zero.computed) == {"n32": 0}


def _multi() -> kp.Compiled:
    params = [kp.Tensor("x", kp.f16, ["b", "n"]), kp.Tensor("acc", kp.f32, ["b"], role="inout"),
              kp.Tensor("o1", kp.bf16, ["b", kp.cdiv("n", 2) + 1], role="out"),
              kp.Tensor("o2", kp.f64, [3, "n"], role="out", zero_init=True),
              kp.Tensor("o3", "bool", [], role="out"),
              kp.Scalar("eps", kp.f16), kp.Scalar("flag", "bool"), kp.Scalar("k", kp.i64),
              kp.Scalar("bn", kp.i32, value=kp.sym("b") * kp.sym("n"))]
    decl = ", ".join([f".param .u64 p{i}" for i in range(5)]
                     + [".param .b16 eps", ".param .u8 flag", ".param .s64 k", ".param .s32 bn"])
    return _k(decl, params, grid=(kp.cdiv("n", 128), "b"), block=(128,),
              shared_mem=kp.sym("k") * 4, constraints=[(kp.sym("k") >= 0, "k must be >= 0")])


def test_inout_plus_outputs_of_every_dtype_plan_by_hand(tmp_path: Path) -> None:
    prog = _load(tmp_path, _multi())["k"]
    plan = prog.plan(x=(4, 7), acc=(4,), eps=0.5, flag=True, k=3)
    alloc = {n: (a.shape, a.nbytes, a.zero_init) for n, a in plan.allocations.items()}
    assert alloc == {"o1": ((4, 5), 4 * 5 * 2, False),      # bf16, cdiv(7, 2) + 1 = 5
                     "o2": ((3, 7), 3 * 7 * 8, True),       # f64, zero-filled
                     "o3": ((), 1, False)}                  # a 0-d bool
    (launch,) = plan.launches
    assert launch.grid == (1, 4, 1) and launch.block == (128, 1, 1)
    assert launch.shared_mem == 12 and dict(plan.computed) == {"bn": 28}
    empty = prog.plan(x=(0, 0), acc=(0,), eps=0.5, flag=False, k=0)
    assert {n: a.nbytes for n, a in empty.allocations.items()} == {"o1": 0, "o2": 0, "o3": 1}
    assert empty.launches[0].grid == (0, 0, 1)
    with pytest.raises(ConstraintError, match="k must be >= 0"):
        prog.plan(x=(1, 1), acc=(1,), eps=0.5, flag=False, k=-1)
    with pytest.raises(ConstraintError, match=r"flag = 2 is outside"):
        prog.plan(x=(1, 1), acc=(1,), eps=0.5, flag=2, k=1)
    with pytest.raises(ConstraintError, match=r"acc\.shape\[0\] is 5 but b = 4"):
        prog.plan(x=(4, 7), acc=(5,), eps=0.5, flag=True, k=3)
    with pytest.raises(ConstraintError, match=r"grid \(1, 70000, 1\)"):
        prog.plan(x=(70000, 1), acc=(70000,), eps=0.5, flag=True, k=1)
    with pytest.raises(ConstraintError, match=r"bn = 4294967296"):
        prog.plan(x=(2 ** 16, 2 ** 16), acc=(2 ** 16,), eps=0.5, flag=True, k=1)


def test_kernelpack_eval_agrees_with_plan(tmp_path: Path) -> None:
    path = tmp_path / "m.kpack"
    kp.save([_multi()], path)
    cmd = [sys.executable, "-m", "kernelpack", "eval", str(path), "k", "x=4,7", "acc=4",
           "eps=0.5", "flag=true", "k=3", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["launches"][0]["grid"] == [1, 4, 1] and data["launches"][0]["shared_mem"] == 12
    assert {a["name"]: a["nbytes"] for a in data["allocations"]} == {"o1": 40, "o2": 168, "o3": 1}
    bad = subprocess.run(cmd[:-2] + ["k=-1"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert bad.returncode == 1 and "k must be >= 0" in bad.stderr


def test_repeated_launch_binds_the_loop_symbol(tmp_path: Path) -> None:
    c = _k(".param .u64 x, .param .u32 i, .param .s64 c", [kp.Tensor("x", kp.f32, ["n"], role="inout")],
           args=["x", ("i", kp.u32), (kp.sym("n") * 2 - 1, kp.i64)], count=kp.cdiv("n", 4),
           loop="i", grid=kp.emax(1, kp.sym("i") + 1), block=32)
    plan = _load(tmp_path, c)["k"].plan(x=(10,))
    assert [l.grid[0] for l in plan.launches] == [1, 2, 3]  # cdiv(10, 4) = 3 launches
    assert [l.args[1][1] for l in plan.launches] == [0, 1, 2]
    assert {l.args[2][1] for l in plan.launches} == {19}


def test_expression_dims_of_inputs_are_checked_against_bound_symbols(tmp_path: Path) -> None:
    c = _k(".param .u64 a, .param .u64 b",
           [kp.Tensor("x", kp.f32, ["n", kp.sym("n") + 1]), kp.Tensor("y", kp.f32, [kp.sym("n") * 2, 4])])
    prog = _load(tmp_path, c)["k"]
    assert dict(prog.plan(x=(3, 4), y=(6, 4)).symbols) == {"n": 3}
    with pytest.raises(ConstraintError, match=r"x\.shape\[1\] is 5, expected n \+ 1 = 4"):
        prog.plan(x=(3, 5), y=(6, 4))
    with pytest.raises(ConstraintError, match=r"y\.shape\[0\] is 7, expected n \* 2 = 6"):
        prog.plan(x=(3, 4), y=(7, 4))


def test_variants_built_from_two_externals_pick_by_predicate(tmp_path: Path) -> None:
    small = _axpy()
    big = _axpy(module="axpy_b", block=128, grid=kp.cdiv("n", 128))
    v1 = dataclasses.replace(small.summary.variants[0], predicate=kp.sym("n") < 1000)
    v2 = dataclasses.replace(big.summary.variants[0], predicate=kp.sym("n") >= 2000)
    c = kp.Compiled(summary=dataclasses.replace(small.summary, variants=(v1, v2)),
                    modules=small.modules + big.modules, origin="external")
    prog = _load(tmp_path, c)["axpy"]
    assert prog.plan(x=(10,), y=(10,), a=1.0).variant == 0
    plan = prog.plan(x=(5000,), y=(5000,), a=1.0)
    assert plan.variant == 1 and plan.launches[0].grid == (40, 1, 1)
    with pytest.raises(ConstraintError, match="no variant applies"):
        prog.plan(x=(1500,), y=(1500,), a=1.0)


def test_unicode_names_round_trip(tmp_path: Path) -> None:
    c = _axpy(name="axpy_é", module="模块")
    plan = _load(tmp_path, c)["axpy_é"].plan(x=(5,), y=(5,), a=1.0)
    assert plan.launches[0].module == "模块"


# ================================================================================================
# bugs review 27 found, all fixed (each failed on the reviewed checkout, 6eb1c2c)
# ================================================================================================
def test_computed_scalar_named_like_a_bound_symbol_keeps_both_values() -> None:
    """A computed scalar named like the dim symbol it reads. Review 27 first called it a bug
    (loop symbols may not clash so); it is a defined, tested case of format 1 (tests/
    test_planner.py::test_computed_values_and_launch_index, tests/runtime/test_plan_shared.py),
    and artifacts holding it must keep loading: ``symbols`` keeps the bound n, ``computed``
    (and the kernel's argument) the computed one."""
    params = _axpy_params()[:3] + [kp.Scalar("n", kp.u32, value=kp.sym("n") + 300)]
    plan = kp.load(kp.save([_axpy(params=params)]))["axpy"].plan(x=(10,), y=(10,))
    assert plan.symbols["n"] == 10 and plan.computed == {"n": 310}


def test_constant_value_argument_outside_its_dtype_is_refused_at_declaration() -> None:
    """(1000, u8) can never fit: every plan raises 'value argument = 1000 does not fit uint8'.
    Constant grid/block/shared_mem/count are refused at declaration for this very reason."""
    with pytest.raises(ValueError, match="1000"):
        _k(".param .u8 v", [kp.Tensor("x", kp.f32, ["n"])], args=[(1000, kp.u8)])


def test_constant_computed_scalar_outside_its_dtype_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="300"):
        _k(".param .u8 v", [kp.Tensor("x", kp.f32, ["n"]), kp.Scalar("m", kp.u8, value=300)],
           args=["m"])


def test_constraint_that_is_constant_false_is_refused_at_declaration() -> None:
    """`n * 0 > 1` simplifies to the constant 0: every plan fails 'constraint failed'."""
    with pytest.raises(ValueError):
        _axpy(constraints=[(kp.sym("n") * 0 > 1, "never")])


def test_symbol_names_longer_than_the_format_limit_are_refused_when_declared() -> None:
    """Program, parameter, module and loop names over 1024 are ValueErrors at once; a dim's
    symbol name is accepted and only kp.save says 'symbols[0]: string of 5000 bytes exceeds
    the limit 1024'."""
    with pytest.raises(ValueError, match="1024"):
        kp.Tensor("x", kp.f32, ["d" * 5000])


@pytest.mark.parametrize("field", ["name", "module", "param"])
def test_name_limit_counts_utf8_bytes_as_the_format_does(field: str) -> None:
    """FORMAT.md §6: name length 1,024 UTF-8 bytes. 'é' * 600 is 600 characters, 1200 bytes:
    kp.external accepts it and kp.save refuses it ('string of 1200 bytes exceeds 1024')."""
    long = "é" * 600
    with pytest.raises(ValueError, match="1024"):
        if field == "param":
            params = _axpy_params()
            params[0] = kp.Tensor(long, kp.f32, ["n"])
            _axpy(params=params)
        else:
            _axpy(**{field: long})


@needs_nvrtc
def test_overlong_mangled_name_is_not_reported_as_missing() -> None:
    """A name expression whose mangled name is 1231 characters: kp.external says 'kernel
    entry ... is not in the cubin for sm_80 (entries found: none)', but the cubin has it; the
    problem is the format's 1024-byte name limit."""
    long = "Q" * 300
    src = (f"struct {long}1 {{}}; struct {long}2 {{}}; struct {long}3 {{}}; struct {long}4 {{}};\n"
           f"using T1={long}1; using T2={long}2; using T3={long}3; using T4={long}4;\n"
           "template <typename T, typename U, typename V, typename W> "
           "__global__ void kern(float* x){x[0]=sizeof(T);}\n")
    with pytest.raises((ValueError, KernelPackError)) as info:
        kp.external("k", "kern<T1,T2,T3,T4>", params=[kp.Tensor("x", "f32", ["n"], role="inout")],
                    grid=1, block=1, cuda=src, targets=["sm_80"])
    assert "entries found: none" not in str(info.value)
    assert "1024" in str(info.value)


def test_shared_mem_true_is_refused_like_grid_block_and_count() -> None:
    """grid=True, block=True and count=True are TypeErrors ('True would silently become 1');
    shared_mem=True becomes 1 byte of shared memory."""
    with pytest.raises(TypeError, match="block"):
        _axpy(block=True)
    with pytest.raises(TypeError, match="shared_mem"):
        _axpy(shared_mem=True)


def test_bad_shared_mem_error_names_the_parameter() -> None:
    """grid=1.5 says 'grid must be ...'; shared_mem=1024.0 only 'expected an int, ...'."""
    with pytest.raises(TypeError, match="shared_mem"):
        _axpy(shared_mem=1024.0)


def test_numpy_integer_grid_and_block_are_accepted() -> None:
    """block=(np.int64(256),), shared_mem=np.int64(...), count=np.int64(...) and shapes take
    NumPy integers; a bare block=np.int64(256) or grid=np.int64(4) is a TypeError."""
    np = pytest.importorskip("numpy")
    assert _axpy(block=(np.int64(256),)).summary.variants[0].launches[0].block[0] == 256
    launch = _axpy(grid=np.int64(4), block=np.int64(256)).summary.variants[0].launches[0]
    assert launch.grid[0] == 4 and launch.block[0] == 256


def test_big_endian_dtype_is_not_silently_little_endian() -> None:
    """np.dtype('>f4') is a big-endian float32, which no GPU kernel reads as float32; it is
    taken as kp.float32 without a word."""
    np = pytest.importorskip("numpy")
    with pytest.raises((TypeError, ValueError)):
        kp.Tensor("x", np.dtype(">f4"), ["n"])


@pytest.mark.parametrize("field", ["name", "module", "targets", "args"])
def test_error_messages_for_huge_values_are_bounded(field: str) -> None:
    """An over-long entry gives a 158-character message; a 100,000-character name, module,
    target or argument name is echoed whole (a 100 kB message)."""
    huge = "z" * 100_000
    kw = {"name": {"name": huge}, "module": {"module": huge}, "targets": {"targets": [huge]},
          "args": {"args": [huge, "y", "a", "n32"]}}[field]
    with pytest.raises((TypeError, ValueError)) as info:
        _axpy(**kw)
    assert len(str(info.value)) < 2000


@needs_nvrtc
def test_cuda_programs_sharing_a_module_with_line_info(tmp_path: Path) -> None:
    """README: programs naming one module= share it when their images are the same (two
    kernels of one CUDA C source). With -lineinfo NVRTC records the program name, which is
    f'{name}.cu' per kp.external, so the images differ and kp.save refuses 'two different
    modules are named 'mod''. Without -lineinfo the same pair saves."""
    src = ('extern "C" __global__ void k1(float* x){x[0]=1;}\n'
           'extern "C" __global__ void k2(float* x){x[0]=2;}\n')

    def make(name: str, entry: str, opts: list) -> kp.Compiled:
        return kp.external(name, entry, params=[kp.Tensor("x", "f32", ["n"], role="inout")],
                           grid=1, block=1, cuda=src, targets=["sm_80"], nvrtc_options=opts,
                           module="mod")

    assert _load(tmp_path, make("a", "k1", []), make("b", "k2", [])).programs == ["a", "b"]
    pack = _load(tmp_path, make("a", "k1", ["-lineinfo"]), make("b", "k2", ["-lineinfo"]))
    assert pack.programs == ["a", "b"]
