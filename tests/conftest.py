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

from hypothesis import settings

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("kernelpack-fixed", derandomize=True)
settings.register_profile("kernelpack-random", derandomize=False)
settings.load_profile("kernelpack-random" if os.environ.get("KERNELPACK_TEST_HYPOTHESIS_RANDOM")
                      else "kernelpack-fixed")
