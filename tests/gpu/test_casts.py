"""Float to integer casts on the device (review 10): NumPy's values, element by element, where
the device's own conversion (``cvt.rzi``) saturates — 0 for a negative float cast to an unsigned
type, 0 for NaN — and NumPy wraps or gives the x86 minimum (tests/lowering/test_review10_casts.py
checks the same on the host emulator)."""

from __future__ import annotations

import numpy as np
import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lowering.test_review10_casts import _TARGETS, _VALUES, _numpy_one_by_one  # noqa: E402

T = kp.Tensor


@pytest.mark.parametrize("src", [(kp.f64, np.float64, torch.float64),
                                 (kp.f32, np.float32, torch.float32)], ids=str)
def test_float_to_integer_casts_match_numpy_on_the_device(src) -> None:
    kdt, ndt, tdt = src

    @kp.fusion(name=f"casts_{kdt.name}")
    def casts(x: T[kdt, "n"]):
        return tuple(x.astype(k) for k, _ in _TARGETS)

    major, minor = torch.cuda.get_device_capability()
    program = kp.load(kp.save([kp.compile(casts, targets=[f"sm_{major}{minor}"])]))[casts.name]
    with np.errstate(all="ignore"):
        x = np.array(_VALUES * 37, ndt)  # 1036 values: the 16-byte body and the scalar tail
    outs = program(torch.from_numpy(x).cuda())
    for got, (_, to) in zip(outs, _TARGETS):
        signed = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(np.dtype(to).itemsize)
        # (torch's uint16/32/64 tensors may lack .numpy(): read their bits as signed ones)
        got = got.cpu().view(signed).numpy().view(to) if np.dtype(to).kind == "u" \
            and np.dtype(to).itemsize > 1 else got.cpu().numpy()
        ref = _numpy_one_by_one(x, to)
        wrong = [(float(v), int(g), int(r)) for v, g, r in zip(x, got, ref) if g != r][:5]
        assert not wrong, f"{ndt.__name__} -> {to.__name__}: (value, device, NumPy) {wrong}"
