"""``kernelpack build examples/fusions.py`` on a GPU: the README's built artifact runs right.

The CPU tests check what the build writes (programs, plans, constraints); this runs each
program of it on torch tensors against float64 torch, so the documented path from a module of
fusions to a deployed artifact is checked end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelpack as kp
from kernelpack.cli import main

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fusions.py"


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float = 1e-5) -> None:
    err = (got.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    assert err <= tol, err


def test_the_built_example_runs_on_the_gpu(tmp_path, capsys) -> None:
    out = tmp_path / "model.kpack"
    assert main(["build", str(EXAMPLE), "-o", str(out), "--quiet"]) == 0, capsys.readouterr()
    pack = kp.load(out)
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(1000, 3, device="cuda", generator=gen).flatten()[:2999]  # odd size
    ref = x.double()
    ref = 0.5 * ref * (1 + torch.tanh(0.7978845608 * (ref + 0.044715 * ref ** 3)))
    _close(pack["gelu"](x.contiguous()), ref)

    rows = torch.randn(37, 1001, device="cuda", generator=gen)
    _close(pack["scaled_softmax"](rows, 0.5), torch.softmax(rows.double() * 0.5, dim=1))

    x, w = (torch.randn(5, 4096, device="cuda", generator=gen),
            torch.randn(4096, device="cuda", generator=gen))
    xd = x.double()
    ref = xd * torch.rsqrt((xd * xd).mean(dim=1, keepdim=True) + 1e-6) * w.double()
    _close(pack["rms_norm_4096"](x, w), ref)
    with pytest.raises(kp.ConstraintError):
        pack["rms_norm_4096"](x[:, :4000].contiguous(), w[:4000].contiguous())
