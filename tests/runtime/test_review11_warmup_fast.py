"""``warmup`` builds the torch fast path too (review 11): a server warms up to pay at start-up
what its first requests would, and the fast path was left to the second call (~1.5 ms on an
H200 host: importing and building it), i.e. to the first request after a warm-up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_fastpath_fake import Tensor, exchange, fake, launch_path, torch  # noqa: E402,F401
from test_launch_fake import axpby  # noqa: E402

from kernelpack.runtime import call_program, warmup  # noqa: E402
from kernelpack.runtime.launcher import bind  # noqa: E402


def test_warmup_builds_the_fast_path(fake, torch, launch_path) -> None:
    prog = axpby()
    warmup([prog], devices=[0])
    bound = bind(prog)
    assert bound.call != bound.__call__ and bound.call != bound._fast_on_next_call
    x, y = Tensor([1.0, 2.0, 3.0], torch.float32), Tensor([1.0, 1.0, 1.0], torch.float32)
    assert call_program(prog, x, y, 2.0).values() == [3.0, 5.0, 7.0]  # the first call: fast
    if launch_path.startswith("C"):
        assert bound.call.__self__.fast_calls == 1
    loads = [c for c in fake.calls if c[0] == "cuLibraryLoadData"]
    assert len(loads) == 1  # loaded by the warm-up, not again by the call


def test_a_warm_up_before_torch_is_imported_still_gets_the_torch_path(fake, torch,
                                                                        launch_path) -> None:
    prog = axpby()
    saved = sys.modules.pop("torch")
    try:
        warmup([prog], devices=[0])  # no torch yet: a fast path for no framework
        bound = bind(prog)
        assert bound.call == bound.__call__
    finally:
        sys.modules["torch"] = saved
    x, y = Tensor([1.0, 2.0], torch.float32), Tensor([1.0, 1.0], torch.float32)
    assert call_program(prog, x, y, 2.0).values() == [3.0, 5.0]  # general path, sees torch
    assert call_program(prog, x, y, 1.0).values() == [2.0, 3.0]
    assert bound.call != bound.__call__  # the torch path was built after all
