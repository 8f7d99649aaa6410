"""What the first-load/first-call speedups must not change: ``EncodedExprs`` still behaves as
the frozen dataclass it replaced, an ``ExprProgram`` builds its evaluators lazily with the same
results, and a small file's load imports neither ``mmap`` nor a ``typing`` alias it no longer
needs."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from kernelpack.errors import ExpressionError
from kernelpack.expr import cdiv, sym
from kernelpack.expr_program import EncodedExprs, ExprEncoder, ExprProgram


def test_encoded_exprs_is_a_frozen_value() -> None:
    a = EncodedExprs(("n",), b"\x02\x00", (0,))
    b = EncodedExprs(symbols=("n",), ops=b"\x02\x00", imms=(0,))
    assert a == b and hash(a) == hash(b) and a != EncodedExprs(("m",), b"\x02\x00", (0,))
    assert a != ("n",) and repr(a) == "EncodedExprs(symbols=('n',), ops=b'\\x02\\x00', imms=(0,))"
    with pytest.raises(AttributeError, match="immutable"):
        a.ops = b""  # type: ignore[misc]
    for clone in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
        assert clone == a and type(clone) is EncodedExprs


def test_program_builds_its_evaluators_on_first_value() -> None:
    n, m = sym("n"), sym("m")
    enc = ExprEncoder()
    shared = cdiv(n, 4) * m
    roots = [enc.add(e) for e in (shared + 1, shared * 2, n // m)]
    encoded, positions = enc.finish()
    prog = ExprProgram(encoded)
    assert prog._roots is None and [str(prog.exprs[r]) for r in positions] == \
        [str(shared + 1), str(shared * 2), str(n // m)]
    frame = prog.new_frame([10, 3] if prog.symbols == ("n", "m") else [3, 10])
    assert [prog.value(frame, positions[i]) for i in roots] == [10, 18, 3]
    assert prog._roots is not None
    zero = prog.new_frame([0 if s == "m" else 10 for s in prog.symbols])
    with pytest.raises(ExpressionError, match="division by zero"):
        prog.value(zero, positions[2], "grid")


def test_small_load_path_imports(tmp_path: Path) -> None:
    """Loading a small artifact reads it (no mmap import); the verifier's Buffer alias is a
    PEP 604 union, and the fast planner's type aliases exist only for type checkers. The
    artifact goes to ``tmp_path`` (a ``tempfile.mkdtemp()`` here was left behind every run)."""
    code = ("import sys, json, kernelpack as kp\n"
            "from kp_samples import axpy\n"
            "import os\n"
            "path = os.path.join(sys.argv[1], 'a.kpack')\n"
            "kp.save([axpy()], path)\n"
            "had = 'mmap' in sys.modules\n"
            "pack = kp.load(path)\n"
            "pack['axpy'].plan((8,), (8,), 1.0)\n"
            "import kernelpack.verify as v, kernelpack._plan_fast as f\n"
            "print(json.dumps([had, 'mmap' in sys.modules, str(v.Buffer), hasattr(f, 'FastPlan')]))\n")
    path = os.pathsep.join([os.path.dirname(__file__), *[p for p in sys.path if p]])
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, check=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": path}).stdout
    had, has, buffer, fastplan = json.loads(out.splitlines()[-1])
    assert (had, has) == (False, False)
    assert buffer == "bytes | bytearray | memoryview" and fastplan is False
