"""A kernel's own thread limit (``.maxntid`` / ``.reqntid``) on the device: the declaration-time
check of kp.external (tests/test_external_thread_limit.py) refuses constant blocks over the
limit because the driver refuses such launches; a symbolic block over it fails at the launch,
as a LaunchError naming the driver's error, and leaves the program usable."""

import pytest

import kernelpack as kp

try:
    import torch
    _NO_GPU = "" if torch.cuda.is_available() else "no CUDA device (torch sees none)"
except ImportError:
    torch = None
    _NO_GPU = "torch is not installed (the GPU tests launch through torch tensors)"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_NO_GPU), reason=_NO_GPU or "-")]

# x[i] = i for every thread of block 0; the grid is one block
PTX = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry {name}(.param .u64 p)
{directive}
{{
  .reg .u32 t, ny, y, nx;
  .reg .u64 a, off;
  .reg .f32 v;
  mov.u32 t, %tid.x;
  mov.u32 y, %tid.y;
  mov.u32 nx, %ntid.x;
  mad.lo.u32 t, y, nx, t;
  cvt.rn.f32.u32 v, t;
  ld.param.u64 a, [p];
  mul.wide.u32 off, t, 4;
  add.u64 a, a, off;
  st.global.f32 [a], v;
  ret;
}}
"""


def _program(name: str, directive: str) -> kp.Compiled:
    tx, ty = kp.sym("tx"), kp.sym("ty")
    return kp.external(name, name, params=[kp.Tensor("x", kp.f32, ("tx", "ty"))],
                       grid=(1,), block=(tx, ty), args=["x"],
                       ptx=PTX.format(name=name, directive=directive),
                       targets=["sm_80", "sm_90", "ptx"])


@pytest.fixture(scope="module")
def pack():
    return kp.load(kp.save([_program("capped", ".maxntid 128, 1, 1"),
                            _program("required", ".reqntid 16, 8, 1")]))


@pytest.mark.parametrize("program, shape", [("capped", (128, 1)), ("capped", (32, 4)),
                                            ("required", (16, 8))])
def test_blocks_within_the_limit_run(pack, program, shape) -> None:
    out = torch.full((shape[0], shape[1]), -1.0, device="cuda")
    pack[program](out)
    torch.cuda.synchronize()
    assert sorted(out.flatten().tolist()) == [float(i) for i in range(shape[0] * shape[1])]


@pytest.mark.parametrize("program, shape", [("capped", (256, 1)), ("capped", (64, 4)),
                                            ("required", (16, 16))])
def test_a_block_over_the_limit_is_a_launch_error_and_the_program_still_works(
        pack, program, shape) -> None:
    out = torch.zeros(shape, device="cuda")
    with pytest.raises(kp.LaunchError, match="INVALID_VALUE|OUT_OF_RESOURCES"):
        pack[program](out)
        torch.cuda.synchronize()
    ok = (128, 1) if program == "capped" else (16, 8)
    good = torch.full(ok, -1.0, device="cuda")
    pack[program](good)
    torch.cuda.synchronize()
    assert good.min().item() == 0.0 and good.max().item() == ok[0] * ok[1] - 1
