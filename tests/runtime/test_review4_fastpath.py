"""Review 4: the C fast path (``(float)x``, round to nearest) and the general path agree on a
float32 scalar at the top of float32's range: a value that rounds to FLT_MAX launches on both,
one that rounds to inf is the general path's ConstraintError on both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("kernelpack.runtime._launch",
                    reason="the C extension kernelpack.runtime._launch is not built")
from test_fast_native import both_paths  # noqa: E402
from test_fastpath_fake import torch  # noqa: E402,F401


@pytest.mark.parametrize("value, ok", [
    (3.4028235e38, True),                # the usual spelling of FLT_MAX: rounds down to it
    (-3.4028235677973362e38, True),      # just below the rounding midpoint
    (3.4028235677973366e38, False),      # the midpoint: rounds (to even) to inf
    (-1e39, False),
])
def test_float32_top_of_range_same_answer_on_both_paths(monkeypatch, torch, value,
                                                        ok) -> None:
    results = both_paths(monkeypatch, torch, 1, value)
    assert results[0] == results[1]
    assert (results[0][0] == "ok") is ok
    if not ok:
        assert results[0][0] == "ConstraintError" and "overflows float32" in results[0][1]
