"""Tenth review: a call by keyword that names an output or a computed scalar says which it is
(as ``plan()`` does), instead of "has no input 'z'" for a parameter the summary declares."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kernelpack as kp

sys.path.insert(0, str(Path(__file__).parent))
from fake_driver import FakeDriver, HostArray, install  # noqa: E402
from test_launch_fake import _axpby_impl, axpby  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, FakeDriver(kernels={"axpby": ("QQQfI", _axpby_impl)}))


@pytest.fixture
def program(fake, tmp_path):
    kp.save([axpby()], tmp_path / "a.kpack")
    return kp.load(tmp_path / "a.kpack")["axpby"]


def _launches(fake) -> int:
    return sum(1 for c in fake.calls if c[0] == "cuLaunchKernel")


def test_output_passed_by_name_points_to_out(fake, program) -> None:
    x, y, z = HostArray([1.0]), HostArray([2.0]), HostArray([0.0])
    for launched in range(2):  # unbound, then bound (the C entry hands keywords on the same)
        with pytest.raises(TypeError, match=r"^axpby: 'z' is not an input, it is an output: "
                                            r"kernelpack allocates it, or pass your array as "
                                            r"out= \(out=\{'z': array\}\) \(inputs: "
                                            r"\['x', 'y', 'a'\]\)$"):
            program(x, y, 1.0, z=z)
        assert _launches(fake) == launched
        program(x, y, 1.0)  # binds the program for the second round
    assert program(x, y, 1.0, out={"z": z}) is z and z.values() == [3.0]


def test_computed_scalar_passed_by_name_is_named_as_computed(fake, program) -> None:
    with pytest.raises(TypeError, match=r"^axpby: 'n32' is not an input, it is computed from "
                                        r"the shapes, never passed"):
        program(HostArray([1.0]), HostArray([2.0]), a=1.0, n32=1)
    assert _launches(fake) == 0


def test_unknown_and_repeated_names_keep_their_messages(fake, program) -> None:
    x, y = HostArray([1.0]), HostArray([2.0])
    with pytest.raises(TypeError, match=r"^axpby has no input 'b' \(inputs: \['x', 'y', 'a'\]\)"):
        program(x, y, b=1.0)
    with pytest.raises(TypeError, match=r"^axpby: input 'a' given twice"):
        program(x, y, 1.0, a=1.0)
    assert program(x=x, y=y, a=2.0).shape == (1,)  # all by name still launches
