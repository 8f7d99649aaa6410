"""Build ``example.kpack`` from ``examples/axpy.ptx``: the kernelpack quick start, runnable on a
machine without a GPU (nvJitLink assembles the PTX into cubins toolkit-side).

    python examples/build_example.py [OUTPUT]      # default: ./example.kpack
    kernelpack inspect example.kpack
    kernelpack eval example.kpack axpy x=1000000 y=1000000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import kernelpack as kp

HERE = Path(__file__).resolve().parent


def build() -> kp.Compiled:
    """y = a * x + y over n floats, one thread per element, 256 threads per block."""
    return kp.external(
        "axpy", "axpy",
        params=[
            kp.Tensor("x", kp.f32, ["n"]),
            kp.Tensor("y", kp.f32, ["n"], role="inout"),
            kp.Scalar("a", kp.f32),
            kp.Scalar("n32", kp.u32, value="n"),  # computed from x's shape, never passed
        ],
        grid=kp.cdiv("n", 256),
        block=256,
        ptx=HERE / "axpy.ptx",
        targets=["sm_80", "sm_90", "ptx"],
        constraints=[(kp.sym("n") < (1 << 32), "the kernel indexes with 32-bit n")],
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="build_example.py",
        description="Build a kernelpack artifact holding axpy (y = a*x + y) from "
                    "examples/axpy.ptx: sm_80 and sm_90 cubins (nvJitLink, no GPU needed) "
                    "and the PTX itself. Inspect it with `kernelpack inspect OUTPUT`.")
    parser.add_argument("output", nargs="?", default="example.kpack",
                        help="where to write the artifact (default: ./example.kpack)")
    out = Path(parser.parse_args(argv[1:]).output)
    data = kp.save([build()], out)
    print(f"wrote {out} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
