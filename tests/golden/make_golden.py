"""Rebuild tests/golden/format-1.MINOR.kpack (and its facts file) from axpy.ptx.

Run only when deliberately minting the golden artifact of a *new* format version (then save
it under a new name): the committed format-1.0 and format-1.1 files must stay byte-for-byte as
they are, because every later reader has to keep loading them. Needs nvJitLink
(kernelpack[compile]); no GPU.

    python tests/golden/make_golden.py --minor 1 [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import kernelpack as kp
from kernelpack.summary import (Arg, Compiled, Constraint, Image, KernelSummary, Launch, Module,
                                Scalar, Scratch, Tensor, Variant)
from kernelpack.targets import parse_arch

HERE = Path(__file__).parent


def summaries(minor: int = 0) -> tuple[KernelSummary, KernelSummary]:
    """The two programs' summaries of format 1.``minor`` (the golden test compares the loaded
    ones to these): 1.1 adds a launch's ``reads_elsewhere`` and ``stores_after_loads``."""
    n = kp.sym("n")
    args = (Arg.buffer("x"), Arg.buffer("y"), Arg.scalar("a"), Arg.scalar("n32"))
    axpy = KernelSummary(
        "axpy",
        (Tensor("x", kp.f32, ("n",)), Tensor("y", kp.f32, ("n",), role="inout"),
         Scalar("a", kp.f32), Scalar("n32", kp.u32, value=n)),
        (Variant((Launch("axpy", "axpy", (kp.cdiv(n, 256),), (256,), args),)),),
        (Constraint(n < (1 << 32), "32-bit n"),))
    # Every other summary feature, so later readers are held to all of format 1.0 (1.1).
    features = KernelSummary(
        "features",
        (Tensor("x", kp.f32, ("b", "n")), Scalar("k", kp.i32), Scalar("a", kp.f32),
         Tensor("y", kp.f32, ("n",), role="inout"),
         Tensor("out", kp.f64, (kp.sym("b"), 2 * n), role="out", zero_init=True),
         Scalar("n32", kp.u32, value=n * kp.sym("b"))),
        (Variant((Launch("axpy", "axpy", (kp.cdiv(n, 128), kp.sym("b")), (128,), args,
                         shared_mem=64, reads_elsewhere=("x",) if minor >= 1 else (),
                         stores_after_loads=minor >= 1),),
                 predicate=n <= 4096),
         Variant((Launch("axpy", "axpy", (kp.cdiv(n, kp.shl(256, "s")),), (256, 1, 1),
                         (Arg.buffer("ws"), Arg.buffer("y"), Arg.scalar("a"),
                          Arg.of(kp.shl(1, "s") + kp.sym("k"), kp.u32)),
                         count=kp.emin(kp.sym("k"), 3), loop="s"),),
                 scratch=(Scratch("ws", kp.f32, (kp.cdiv(n, 2),), zero_init=True),))),
        (Constraint(kp.sym("k") >= 0, "k must be non-negative"),))
    return axpy, features


def programs(minor: int = 0) -> list[Compiled]:
    from kernelpack.toolchain import nvjitlink  # only when minting: the test needs no toolchain

    ptx = (HERE / "axpy.ptx").read_bytes()
    images = [Image("cubin", parse_arch(t), nvjitlink.ptx_to_cubin(ptx, parse_arch(t)),
                    nvjitlink.toolchain_id(), nvjitlink.cuda_version())
              for t in ("sm_80", "sm_90")]
    images.append(Image("ptx", parse_arch("sm_80"), ptx, "external PTX", 0,
                        nvjitlink.ptx_isa(ptx)))
    module = Module("axpy", ("axpy",), tuple(images))
    return [Compiled(summary, (module,)) for summary in summaries(minor)]


def facts(data: bytes) -> dict:
    pack = kp.load(data)
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "programs": pack.programs,
        "images": {i.target: {"raw_digest": i.raw_digest, "raw_size": i.raw_size,
                              "codec": i.codec, "toolchain": i.toolchain,
                              "cuda_version": i.cuda_version, "ptx_isa": i.ptx_isa}
                   for i in pack.modules["axpy"].images},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minor", type=int, required=True, choices=(0, 1),
                        help="the format version 1.MINOR to mint")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    name = f"format-1.{args.minor}"
    data = kp.save(programs(args.minor), args.out / f"{name}.kpack")
    assert kp.load(data).format_version == (1, args.minor)
    (args.out / f"{name}.json").write_text(json.dumps(facts(data), indent=2, sort_keys=True)
                                           + "\n")
    print(f"wrote {args.out / name}.kpack ({len(data)} bytes)")


if __name__ == "__main__":
    main()
