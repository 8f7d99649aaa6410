"""PTX kernels and programs shared by the GPU tests and benchmarks/launch.py."""

from __future__ import annotations

import kernelpack as kp
from kernelpack.errors import KernelPackError
from kernelpack.summary import Arg, Compiled, KernelSummary, Launch, Scratch, Tensor, Variant


def gpu_count_or_skip() -> int:
    """The number of usable GPUs; skips the calling test module (with the driver's reason)
    where there is none."""
    import pytest

    try:
        from kernelpack.runtime.device import device_count
        count, why = device_count(), ""
    except KernelPackError as exc:
        count, why = 0, str(exc)
    if not count:
        pytest.skip(f"no usable GPU: {why}", allow_module_level=True)
    return count


AXPBY_PTX = """.version 8.0
.target sm_80
.address_size 64
.visible .entry axpby(.param .u64 x, .param .u64 y, .param .u64 z, .param .f32 a, .param .u32 n)
{
  .reg .pred p; .reg .b32 r<6>; .reg .b64 rd<10>; .reg .f32 f<4>;
  ld.param.u64 rd1, [x]; ld.param.u64 rd2, [y]; ld.param.u64 rd8, [z]; ld.param.f32 f1, [a];
  ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x; mov.u32 r3, %ntid.x; mov.u32 r4, %tid.x; mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1; @p bra DONE;
  cvta.to.global.u64 rd3, rd1; cvta.to.global.u64 rd4, rd2; cvta.to.global.u64 rd9, rd8;
  mul.wide.u32 rd5, r5, 4;
  add.s64 rd6, rd3, rd5; add.s64 rd7, rd4, rd5; ld.global.f32 f2, [rd6]; ld.global.f32 f3, [rd7];
  fma.rn.f32 f3, f1, f2, f3; add.s64 rd9, rd9, rd5; st.global.f32 [rd9], f3;
DONE: ret;
}
"""

# out[i] += x[i]: with a zero_init output this copies x, and it shows whether zeroing happened.
ACCUM_PTX = """.version 8.0
.target sm_80
.address_size 64
.visible .entry accum(.param .u64 x, .param .u64 out, .param .u32 n)
{
  .reg .pred p; .reg .b32 r<6>; .reg .b64 rd<8>; .reg .f32 f<4>;
  ld.param.u64 rd1, [x]; ld.param.u64 rd2, [out]; ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x; mov.u32 r3, %ntid.x; mov.u32 r4, %tid.x; mad.lo.s32 r5, r2, r3, r4;
  setp.ge.u32 p, r5, r1; @p bra DONE;
  cvta.to.global.u64 rd3, rd1; cvta.to.global.u64 rd4, rd2; mul.wide.u32 rd5, r5, 4;
  add.s64 rd6, rd3, rd5; add.s64 rd7, rd4, rd5; ld.global.f32 f2, [rd6]; ld.global.f32 f3, [rd7];
  add.f32 f3, f3, f2; st.global.f32 [rd7], f3;
DONE: ret;
}
"""

BLOCK = 256


def axpby(targets: tuple[str, ...] = ("sm_80", "sm_90", "ptx"), name: str = "axpby",
          entry: str = "axpby") -> Compiled:
    """z = a*x + y; z is an output allocated by the runtime (or passed with out=). Another
    ``entry`` name gives different machine code (a library of its own)."""
    return kp.external(name, entry,
                       [kp.Tensor("x", kp.f32, ("n",)), kp.Tensor("y", kp.f32, ("n",)),
                        kp.Tensor("z", kp.f32, ("n",), role="out"), kp.Scalar("a", kp.f32),
                        kp.Scalar("n32", kp.u32, value=kp.sym("n"))],
                       grid=kp.cdiv("n", BLOCK), block=BLOCK,
                       ptx=AXPBY_PTX.replace(".entry axpby(", f".entry {entry}("),
                       targets=list(targets))


def twostep(targets: tuple[str, ...] = ("sm_80", "sm_90")) -> Compiled:
    """out = x through a zero-initialized scratch buffer: ws += x; out += ws (two launches,
    scratch, zero_init output)."""
    base = kp.external("twostep", "accum",
                       [kp.Tensor("x", kp.f32, ("n",)),
                        kp.Tensor("out", kp.f32, ("n",), role="out", zero_init=True)],
                       grid=kp.cdiv("n", BLOCK), block=BLOCK, ptx=ACCUM_PTX,
                       targets=list(targets), module="accum",
                       args=["x", "out", (kp.sym("n"), kp.u32)])
    grid, block = (kp.cdiv("n", BLOCK),), (BLOCK,)
    n32 = Arg.of(kp.sym("n"), kp.u32)
    summary = KernelSummary(
        "twostep",
        (Tensor("x", kp.f32, ("n",)), Tensor("out", kp.f32, ("n",), role="out", zero_init=True)),
        (Variant((Launch("accum", "accum", grid, block, (Arg.buffer("x"), Arg.buffer("ws"), n32)),
                  Launch("accum", "accum", grid, block, (Arg.buffer("ws"), Arg.buffer("out"), n32))),
                 scratch=(Scratch("ws", kp.f32, ("n",), zero_init=True),)),))
    return Compiled(summary, base.modules, origin="external")


__all__ = ["AXPBY_PTX", "ACCUM_PTX", "axpby", "twostep", "BLOCK", "make_pack"]


class _LocalProgram:
    """What ``pack[name]`` gives, for machines without the flatbuffers package (the GPU
    machine may lack it): the same attributes the runtime reads."""

    def __init__(self, compiled: Compiled) -> None:
        self.name = compiled.name
        self.summary = compiled.summary
        self.modules = {m.name: m for m in compiled.modules}

    def plan(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        from kernelpack.planner import Planner

        return Planner(self.summary).plan(*args, **kwargs)

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        from kernelpack.runtime import call_program

        return call_program(self, *args, **kwargs)


class _LocalPack:
    def __init__(self, compiled: list[Compiled]) -> None:
        self._programs = {c.name: _LocalProgram(c) for c in compiled}
        self.programs = sorted(self._programs)
        self.modules = {m.name: m for c in compiled for m in c.modules}

    def __getitem__(self, name: str) -> _LocalProgram:
        return self._programs[name]


def make_pack(compiled: list[Compiled]):  # type: ignore[no-untyped-def]
    """``kp.load(kp.save(compiled))``, or an equivalent in-memory pack when the serializer's
    flatbuffers dependency is not installed."""
    import importlib.util

    if importlib.util.find_spec("flatbuffers") is None:
        return _LocalPack(compiled)
    return kp.load(kp.save(compiled))
