"""Build ``example.kpack`` from ``examples/axpy.ptx``: the kernelpack quick start, runnable on a
machine without a GPU (nvJitLink assembles the PTX into cubins toolkit-side).

    python examples/build_example.py [OUTPUT]      # default: ./example.kpack
    kernelpack inspect example.kpack
    kernelpack eval example.kpack axpy x=1000000 y=1000000
"""

from __future__ import annotations

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
    out = Path(argv[1]) if len(argv) > 1 else Path("example.kpack")
    data = kp.save([build()], out)
    print(f"wrote {out} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
