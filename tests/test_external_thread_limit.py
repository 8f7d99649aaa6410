"""kp.external refuses a constant block above the kernel's own thread limit (``.maxntid`` /
``.reqntid`` in its PTX, e.g. from ``__launch_bounds__``): the driver would refuse every launch.
A symbolic block is left to the launch, which names the driver's error."""

from __future__ import annotations

import pytest

import kernelpack as kp
from kernelpack.code_scan import ptx_entry_max_threads

pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (kernelpack[compile]) missing")

PTX = """
.version 8.0
.target sm_80
.address_size 64
// .entry decoy(.param .u64 p) .maxntid 1 { ret; }
.visible .entry other(.param .u64 p, .param .u32 n)
.maxntid 32
{
  ret;
}
.visible .entry k(.param .u64 p, .param .u32 n)
.maxntid 128, 1, 1
{
  ret;
}
.visible .entry free(.param .u64 p, .param .u32 n)
{
  ret;
}
.visible .entry tiled(.param .u64 p, .param .u32 n) .reqntid 16, 8
{
  ret;
}
"""

n = kp.sym("n")


def declare(entry: str, block: tuple, **kw: object) -> kp.Compiled:
    return kp.external(entry, entry, params=[kp.Tensor("x", kp.f32, ("n",))], grid=(n,),
                       block=block, args=["x", (n, "u32")],
                       **({"ptx": PTX, "targets": ["sm_80"]} | kw))


def test_reads_each_entry_s_own_directive() -> None:
    assert ptx_entry_max_threads(PTX.encode(), "k") == (".maxntid 128, 1, 1", 128)
    assert ptx_entry_max_threads(PTX.encode(), "other") == (".maxntid 32", 32)
    assert ptx_entry_max_threads(PTX.encode(), "tiled") == (".reqntid 16, 8", 128)
    assert ptx_entry_max_threads(PTX.encode(), "free") is None
    assert ptx_entry_max_threads(PTX.encode(), "decoy") is None  # commented out
    assert ptx_entry_max_threads(PTX.encode(), "missing") is None


@pytest.mark.parametrize("entry, block", [("k", (256,)), ("k", (64, 4)), ("tiled", (16, 16)),
                                          ("other", (33,))])
def test_a_constant_block_above_the_limit_is_refused(entry: str, block: tuple) -> None:
    with pytest.raises(ValueError, match=rf"block .* but the kernel '{entry}' declares "
                                         rf"\.(maxntid|reqntid) .*every launch would fail"):
        declare(entry, block)


@pytest.mark.parametrize("entry, block", [("k", (128,)), ("k", (32, 4)), ("tiled", (16, 8)),
                                          ("free", (1024,))])
def test_blocks_within_the_limit_and_symbolic_blocks_are_taken(entry: str, block: tuple) -> None:
    assert declare(entry, block).summary.name == entry
    assert declare(entry, (n,)).summary.name == entry  # symbolic: left to the launch


def test_launch_bounds_in_cuda_c_are_checked_through_nvrtc_s_ptx() -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings' NVRTC module missing")
    from kernelpack.toolchain import nvrtc

    try:
        nvrtc.toolchain_id()
    except kp.CompileError as exc:
        pytest.skip(f"NVRTC missing: {exc}")
    source = 'extern "C" __global__ void __launch_bounds__(64) k(float* x, unsigned n) {}'
    with pytest.raises(ValueError, match=r"block \(16, 8, 1\) is 128 threads.*\.maxntid 64"):
        declare("k", (16, 8), ptx=None, cuda=source, targets=["sm_80", "ptx"])
    assert declare("k", (64,), ptx=None, cuda=source, targets=["sm_80", "ptx"])
