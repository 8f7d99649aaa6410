"""Small programs shared by the format tests (serializer, loader, verify, corruption, ...)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import kernelpack as kp
from kernelpack.summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module,
                                Scalar, Scratch, Tensor, Variant)

PTX_PATH = Path(__file__).parent / "golden" / "axpy.ptx"


def fake_image(kind: str = "cubin", arch: str = "sm_80", size: int = 600, seed: int = 1) -> Image:
    data = bytes((i * seed + i // 7) % 251 for i in range(size))  # compressible, not trivial
    return Image(kind, arch, b"\x7fELF" + data, "fake-toolchain 1.0", 12080,
                 (8, 0) if kind == "ptx" else None)


def axpy_summary(name: str = "axpy", module: str = "axpy") -> KernelSummary:
    return KernelSummary(
        name,
        (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",), role="inout"),
         Scalar("a", kp.f32), Scalar("n32", kp.u32, value="n")),
        (Variant((Launch("axpy", module, (kp.cdiv("n", 256),), (256,),
                         (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"),
                          Arg.scalar("n32"))),)),),
        (Constraint(kp.sym("n") < (1 << 32), "32-bit n"),))


def axpy(name: str = "axpy", module: str = "axpy", images: tuple[Image, ...] | None = None
         ) -> Compiled:
    images = images or (fake_image("cubin", "sm_80"), fake_image("cubin", "sm_90", seed=3),
                        fake_image("ptx", "sm_80", seed=5))
    return Compiled(axpy_summary(name, module), (Module(module, ("axpy",), images),))


def _noise(n: int) -> bytes:
    """Deterministic incompressible bytes (stored uncompressed)."""
    out = b""
    while len(out) < n:
        out += hashlib.sha256(out[-32:] + b"kp").digest()
    return out[:n]


def tiny() -> Compiled:
    """The smallest useful artifact: one program, one tiny image (for bit-flip sweeps)."""
    s = KernelSummary("t", (Tensor("x", kp.f32, ("n",)),),
                      (Variant((Launch("k", "m", (kp.cdiv("n", 128),), (128,),
                                       (Arg.buffer("x"),)),)),))
    return Compiled(s, (Module("m", ("k",), (Image("cubin", "sm_80", _noise(84),
                                                   "t", 12080),)),))


def rich() -> Compiled:
    """Every summary feature: outputs, scratch, constraints, variants, repeats, value args."""
    n, m = kp.sym("n"), kp.sym("m")
    small = Variant(
        (Launch("rowsum", "red", (n,), (kp.emin(m, 1024),),
                (Arg.buffer("x"), Arg.buffer("out"), Arg.scalar("m"), Arg.of(n * m, kp.i64)),
                shared_mem=4 * kp.emin(m, 1024)),),
        predicate=m <= 1024)
    big = Variant(
        (Launch("partial", "red", (n, kp.cdiv(m, 1024)), (1024,),
                (Arg.buffer("x"), Arg.buffer("ws"), Arg.scalar("m")), shared_mem=4096),
         Launch("stage", "red", (kp.cdiv(n, kp.shl(1, "s") + 0),), (256,),
                (Arg.buffer("ws"), Arg.of(kp.shl(1, "s"), kp.i32)), count=3, loop="s"),
         Launch("finish", "red", (n,), (32,), (Arg.buffer("ws"), Arg.buffer("out")))),
        scratch=(Scratch("ws", kp.f32, (n, kp.cdiv(m, 1024)), zero_init=True),))
    s = KernelSummary(
        "rowsum",
        (Tensor("x", kp.f32, ("n", "m")), Scalar("m", kp.i32), Scalar("scale", kp.f64),
         Tensor("out", kp.f32, ("n",), role="out", zero_init=True),
         Scalar("total", kp.i64, value=n * m)),
        (small, big),
        (Constraint(n >= 1, "need at least one row"), Constraint(kp.ge(m, 1))))
    images = (fake_image("cubin", "sm_80", seed=7), fake_image("cubin", "sm_90a", seed=9))
    return Compiled(s, (Module("red", ("finish", "partial", "rowsum", "stage"), images),))
