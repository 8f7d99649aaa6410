"""``kp.exp`` of a complex tensor near exp's overflow, on the device (libdevice's ``exp``;
the CPU emulator checks the same with the host's libm: tests/test_review27_math.py).

e^re overflows past re = 709.78 (float64) / 88.72 (float32) while e^re·cos(im) or e^re·sin(im)
can still be finite: the lowering scales the product there (``mathops._scaled_product``), as
C99's cexp (NumPy's) does. Review 27 found ``exp(709.9+1.5j)`` giving ``inf+infj``.
"""

import numpy as np
import pytest

import kernelpack as kp

try:
    import torch
    _NO_GPU = "" if torch.cuda.is_available() else "no CUDA device (torch sees none)"
except ImportError:
    torch = None
    _NO_GPU = "torch is not installed (the GPU tests launch through torch tensors)"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_NO_GPU), reason=_NO_GPU or "-")]


def _exp_of(ctype):
    @kp.fusion(name=f"cexp_{ctype.name}")
    def cexp(z: kp.Tensor[ctype, "n"]):
        return kp.exp(z)
    return cexp


@pytest.mark.parametrize("ctype, npt, values", [
    (kp.complex128, np.complex128, [709.9 + 1.5j, 710 + 0.1j, 740 + 1.5707963267948966j,
                                    709 + 3j, 1.0 + 2.0j, -800 + 1j, 750 + 0j, 1e4 + 1j]),
    (kp.complex64, np.complex64, [88.8 + 1.5j, 89 + 0.1j, 100 + 1.5707964j, 88 + 3j,
                                  1.0 + 2.0j, -120 + 1j, 95 + 0j, 1e3 + 1j]),
])
def test_complex_exp_near_overflow_matches_numpy(ctype, npt, values) -> None:
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    pack = kp.load(kp.save([kp.compile(_exp_of(ctype), targets=[arch])]))
    z = np.array(values, dtype=npt)
    got = pack[f"cexp_{ctype.name}"](torch.from_numpy(z).cuda()).cpu().numpy()
    ref = np.exp(z)
    for part in ("real", "imag"):
        g, r = getattr(got, part), getattr(ref, part)
        assert np.array_equal(np.isinf(g), np.isinf(r)), (part, z, got, ref)
        finite = np.isfinite(r)
        rel = np.abs(g[finite] - r[finite]) / np.maximum(np.abs(r[finite]), np.finfo(g.dtype).tiny)
        assert np.all(rel <= 8 * np.finfo(g.dtype).eps), (part, z, got, ref, rel)
