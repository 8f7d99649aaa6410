"""Eleventh review on real GPUs (two or more; skipped otherwise): what the fake-driver tests of
test_review11_multidevice check, against the driver and torch. First run on two H200s in
session 19 (all passed); test_two_devices_gpu.py covers the rest of multi-GPU use."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from kernelpack.errors import LaunchError

sys.path.insert(0, str(Path(__file__).parent))
import runtime_kernels as kernels  # noqa: E402

pytestmark = pytest.mark.gpu

_COUNT = kernels.gpu_count_or_skip()
needs_two = pytest.mark.skipif(_COUNT < 2, reason="needs two GPUs")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _calls_from_device_1(torch, calls: int) -> None:
    """torch.cuda.set_device(1), tensors on 0: each launch runs on 0, the thread stays on 1."""
    pack = kernels.make_pack([kernels.axpby()])
    x = torch.randn(1000, device="cuda:0")
    torch.cuda.set_device(1)
    try:
        for _ in range(calls):
            z = pack["axpby"](x, x, 1.0)
            assert z.device == x.device
            assert torch.cuda.current_device() == 1
        torch.cuda.synchronize(0)
        torch.testing.assert_close(z, 2 * x)
    finally:
        torch.cuda.set_device(0)


@needs_two
def test_the_callers_device_is_left_alone_on_the_general_path(torch) -> None:
    _calls_from_device_1(torch, 1)  # a program's first call takes the general path


@needs_two
def test_the_callers_device_is_left_alone_on_the_fast_path(torch) -> None:
    _calls_from_device_1(torch, 3)


@needs_two
def test_a_stream_of_another_device_is_refused(torch) -> None:
    pack = kernels.make_pack([kernels.axpby()])
    x = torch.randn(8, device="cuda:0")
    with pytest.raises(LaunchError, match="stream of device 1"):
        pack["axpby"](x, x, 1.0, stream=torch.cuda.Stream(device=1))


@needs_two
def test_threads_on_two_devices(torch) -> None:
    pack = kernels.make_pack([kernels.axpby()])
    pack.warmup(devices=[0, 1])
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            x = torch.randn(4096, device=f"cuda:{i % 2}")
            for _ in range(50):
                z = pack["axpby"](x, x, 1.0)
            torch.cuda.synchronize(x.device)
            torch.testing.assert_close(z, 2 * x)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
