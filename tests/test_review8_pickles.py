"""Plans cross process boundaries; loaded images say what to send instead.

``Program.plan(...)`` returned a ``Plan`` whose mapping fields are read-only views
(``mappingproxy``), which cannot be pickled: a plan sent to a worker failed with
"cannot pickle 'mappingproxy' object". A loaded ``ImageInfo`` failed with Python's
"cannot pickle memoryview objects", naming nothing of the caller's."""

from __future__ import annotations

import copy
import pickle
from types import MappingProxyType

import pytest

import kernelpack as kp

from kp_samples import axpy


def test_a_plan_pickles_and_stays_read_only() -> None:
    pack = kp.load(kp.save([axpy()]))
    plan = pack["axpy"].plan(x=(1000,), y=(1000,), a=2.0)
    for again in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert again == plan
        assert isinstance(again.symbols, MappingProxyType)
        assert isinstance(again.allocations, MappingProxyType)
        with pytest.raises(TypeError):
            again.symbols["n"] = 1  # type: ignore[index]


def test_a_loaded_image_says_what_to_send_instead() -> None:
    pack = kp.load(kp.save([axpy()]))
    image = next(iter(pack.modules.values())).images[0]
    with pytest.raises(TypeError, match=r"pack.compiled\(name\)"):
        pickle.dumps(image)
    # what it points to works
    assert pickle.loads(pickle.dumps(pack.compiled("axpy"))) == pack.compiled("axpy")
