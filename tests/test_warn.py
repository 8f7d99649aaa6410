"""``_warn.warn_caller``: a warning names the first line outside kernelpack."""

from __future__ import annotations

import contextlib
import os
import warnings

from kernelpack import _warn
from kernelpack._warn import warn_caller


def test_the_callers_line_is_named_however_deep_the_warning_is() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_caller("direct", RuntimeWarning)
        line = _line()
    [w] = caught
    assert (w.filename, w.lineno, w.category) == (__file__, line - 1, RuntimeWarning)


def test_frames_inside_the_package_and_contextlib_are_passed_over() -> None:
    """A warning given in a ``@contextmanager``'s exit has contextlib's frame between the
    package's and the caller's: it is passed over too. The context manager is compiled as if
    it were a file of the package."""
    namespace: dict = {"contextlib": contextlib, "warn_caller": warn_caller}
    source = ("@contextlib.contextmanager\n"
              "def held():\n"
              "    yield\n"
              "    warn_caller('at exit')\n")
    exec(compile(source, os.path.join(os.path.dirname(_warn.__file__), "_fake.py"), "exec"),
         namespace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with namespace["held"]():
            pass
        line = _line()
    [w] = caught
    # the `with` line (the `pass` line on Python versions that attribute the exit there)
    assert w.filename == __file__ and w.lineno in (line - 2, line - 1), (w.filename, w.lineno)


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno
