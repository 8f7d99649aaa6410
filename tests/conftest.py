"""Suite-wide test settings.

Hypothesis draws its examples from a fixed seed per test (``derandomize``): CI runs the suite
once in a fresh clone, and a property test that found a new counterexample only on that run
would block a landing with a failure nobody can reproduce from the log. Exploration with fresh
seeds is opt-in: ``KERNELPACK_TEST_HYPOTHESIS_RANDOM=1 pytest ...`` (the fuzzers in ``tests/``
and ``tools/`` search further).

SIGINT is put back to Python's default when the suite starts with it ignored: a shell starts
a background job (``pytest ... &``, ``nohup``) with SIGINT ignored, every child inherits that,
and the tests that send a child Ctrl-C then saw it ignored (exit 0 instead of 130).
"""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import settings

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("kernelpack-fixed", derandomize=True)
settings.register_profile("kernelpack-random", derandomize=False)
settings.load_profile("kernelpack-random" if os.environ.get("KERNELPACK_TEST_HYPOTHESIS_RANDOM")
                      else "kernelpack-fixed")


@pytest.fixture
def emitted_kernels(monkeypatch) -> list[str]:
    """The names of the kernels the lowering emits while the test runs, in order, a repeated
    emission counted again (``lowering.kernels.emit`` wrapped): how tests see that a compile
    re-emitted kernels it had already made."""
    from kernelpack.lowering import kernels

    names: list[str] = []
    original = kernels.emit

    def counting(*args, **kwargs):
        names.append(args[2].name)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "emit", counting)
    return names
