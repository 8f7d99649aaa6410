"""runtime/device.py: what a device's creation asks the driver (a process's first launch pays
each call), against the C-level fake driver."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import install  # noqa: E402
from test_libcuda import _make  # noqa: E402

from kernelpack.runtime.device import get_device  # noqa: E402


def test_the_name_is_asked_only_when_shown(monkeypatch) -> None:
    """cuDeviceGetName took ~30 µs of an H200 host's first launch for a name that only repr and
    messages show: a device is made without it, and asks once when it is shown."""
    drv, c = _make(arch=(9, 0))
    install(monkeypatch, drv)
    device = get_device(0)
    asked = [name for name, _, _ in c.lookups]
    assert "cuDevicePrimaryCtxRetain" in asked and "cuDeviceGetName" not in asked
    assert device.arch.sm == "sm_90" and device.ctx_id == 0x100
    assert repr(device) == "<Device 0: Fake GPU (sm_90)>" and device.name == "Fake GPU"
    assert [name for name, _, _ in c.lookups].count("cuDeviceGetName") == 1
    assert not c.fake.callback_errors
