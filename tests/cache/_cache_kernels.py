"""Kernels for the cache tests, importable without pytest (worker processes use them)."""

from __future__ import annotations

import kernelpack as kp

AXPY_PTX = """\
.version 8.0
.target sm_80
.address_size 64
.visible .entry axpy(.param .u64 x, .param .u64 y, .param .f32 a, .param .u32 n)
{
  .reg .pred p; .reg .b32 r<6>; .reg .b64 rd<8>; .reg .f32 f<4>;
  ld.param.u64 rd1, [x]; ld.param.u64 rd2, [y]; ld.param.f32 f1, [a]; ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x; mov.u32 r3, %ntid.x; mov.u32 r4, %tid.x; mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1; @p bra DONE;
  cvta.to.global.u64 rd3, rd1; cvta.to.global.u64 rd4, rd2; mul.wide.u32 rd5, r5, 4;
  add.s64 rd6, rd3, rd5; add.s64 rd7, rd4, rd5; ld.global.f32 f2, [rd6]; ld.global.f32 f3, [rd7];
  fma.rn.f32 f3, f1, f2, f3; st.global.f32 [rd7], f3;
DONE: ret;
}
"""


def axpy_params() -> list:
    return [kp.Tensor("x", kp.f32, ["n"]), kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32), kp.Scalar("n", kp.u32)]


def axpy_external(name: str = "axpy", ptx: str = AXPY_PTX, block: int = 256) -> kp.Compiled:
    """A real compile: PTX through nvJitLink for sm_80."""
    return kp.external(name, "axpy", axpy_params(), grid=kp.cdiv("n", block), block=block,
                       ptx=ptx, targets=["sm_80"])


def from_cubin(name: str, cubin: bytes) -> kp.Compiled:
    """A cheap build: a fixed cubin behind a summary named ``name`` (no nvJitLink call)."""
    return kp.external(name, "axpy", axpy_params(), grid=kp.cdiv("n", 256), block=256,
                       cubin={"sm_80": cubin})
