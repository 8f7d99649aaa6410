"""Review 11 (A): what a stranger gets wrong, and whether the same fusion gives the same bytes.

Misuse a user who read only DESIGN.md and the issue will make (mismatched dims, mixed dtype
widths, an axis out of range, reducing a 0-d value over an axis, arithmetic on bools, shifting
floats) must be a ``TraceError`` that names the op and the shapes, never an IndexError,
AttributeError, KeyError or RecursionError from inside the tracer. And the workloads as written
in :mod:`.test_review11_stranger_workloads` / :mod:`.test_review11_stranger_quantum` (complex
``exp``, ``kp`` scalars, an int mask's count, a masked pad) must give
byte-identical ``kp.save`` output when compiled twice in one process and in another process.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import kernelpack as kp

T = kp.Tensor
ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["sm_80", "sm_90", "ptx"]


def _trace(fn: Callable[..., Any]) -> None:
    kp.compile(kp.fusion(fn), targets=["sm_80"])


# (fusion body, the op named, fragments the message must hold: the shapes or dtypes)
def _dims(x: T[kp.f32, "b", "n"], w: T[kp.f32, "b"]):
    return x * w  # meant w[:, None]


def _transposed(x: T[kp.f32, "b", "n"], y: T[kp.f32, "n", "b"]):
    return x + y


def _fixed(x: T[kp.f32, "b", 3], y: T[kp.f32, "b", 4]):
    return x - y


def _bits_vs_qubits(x: T[kp.f32, "b", "n"]):
    n = x.shape[1]
    return kp.arange(1 << n) >> kp.arange(n)  # meant [:, None]


def _widths(x: T[kp.f32, "n"], y: T[kp.f64, "n"]):
    return x + y


def _scalar_width(x: T[kp.f32, "n"], eps: kp.f64):
    return x / eps


def _index_widths(j: T[kp.i32, "b"], n: kp.i64):
    return kp.arange(1 << n) == j[:, None]


def _complex_widths(z: T[kp.c64, "n"], x: T[kp.f64, "n"]):
    return z * x


def _where_widths(m: T[kp.bool_, "n"], x: T[kp.f32, "n"], y: T[kp.f64, "n"]):
    return kp.where(m, x, y)


def _axis(x: T[kp.f32, "b", "n"]):
    return x.sum(axis=2)


def _negative_axis(x: T[kp.f32, "b", "n"]):
    return kp.max(x, axis=-3, keepdims=True)


def _axes(x: T[kp.f32, "b", "n"]):
    return x.mean(axis=(0, 2))


def _scalar_reduce(x: T[kp.f32, "n"]):
    return x.sum().sum(axis=0)


def _param_reduce(a: kp.f32):
    return kp.max(a, axis=-1)


def _bool_sub(m: T[kp.bool_, "b", "n"]):
    return m - m


def _bool_neg(m: T[kp.bool_, "n"]):
    return -m


def _shift_float(x: T[kp.f32, "n"]):
    return x >> 1


def _shift_by_tensor(x: T[kp.f32, "b", "n"]):
    return 1 << x


def _and_float(x: T[kp.f64, "n"]):
    return x & 1


def _invert_float(x: T[kp.f32, "n"]):
    return ~x


def _complex_order(z: T[kp.c64, "b", "n"]):
    return z.max(-1)


def _pad_axis(x: T[kp.f32, "n"]):
    return kp.pad(x, 8, axis=1)


def _pad_shorter(x: T[kp.f32, "b", 5]):
    return kp.pad(x, 4)


MISUSE = [
    (_dims, "mul", ["(b, n)", "(b,)"]),
    (_transposed, "add", ["(b, n)", "(n, b)"]),
    (_fixed, "sub", ["(b, 3)", "(b, 4)"]),
    (_bits_vs_qubits, "shr", ["(1 << n,)", "(n,)"]),
    (_widths, "add", ["float32[n]", "float64[n]"]),
    (_scalar_width, "div", ["float32[n]", "float64[]"]),
    (_index_widths, "eq", ["int64[1 << n]", "int32[b, 1]"]),
    (_complex_widths, "mul", ["complex64[n]", "float64[n]"]),
    (_where_widths, "where", ["float32[n]", "float64[n]"]),
    (_axis, "sum", ["axis 2", "float32[b, n]"]),
    (_negative_axis, "max", ["axis -3", "float32[b, n]"]),
    (_axes, "mean", ["axis 2", "float32[b, n]"]),
    (_scalar_reduce, "sum", ["axis 0", "float32[]"]),
    (_param_reduce, "max", ["axis -1", "float32[]"]),
    (_bool_sub, "sub", ["bool[b, n]"]),
    (_bool_neg, "neg", ["bool[n]"]),
    (_shift_float, "shr", ["float32[n]"]),
    (_shift_by_tensor, "shl", ["float32[b, n]"]),
    (_and_float, "and", ["float64[n]"]),
    (_invert_float, "~", ["float32[n]"]),
    (_complex_order, "max", ["complex64[b, n]"]),
    (_pad_axis, "pad", ["axis 1", "float32[n]"]),
    (_pad_shorter, "pad", ["4", "5"]),
]


@pytest.mark.parametrize("fn,op,parts", MISUSE, ids=[m[0].__name__.strip("_") for m in MISUSE])
def test_misuse_is_a_trace_error_naming_the_op_and_shapes(fn, op, parts):
    with pytest.raises(kp.TraceError) as info:
        _trace(fn)
    msg = str(info.value)
    assert msg.startswith(f"{op}:") or f" {op}" in msg or f"{op} " in msg, msg
    for part in parts:
        assert part in msg, (part, msg)


def _python_if(x: T[kp.f32, "n"]):
    return x if x.sum() > 0 else -x


def _float_size(x: T[kp.f32, "b", "n"]):
    return x / math.sqrt(x.shape[1])


def _loop(x: T[kp.f32, "n"]):
    return sum(x)


def _python_math(x: T[kp.f32, "n"]):
    return math.exp(x)


def _int_index(x: T[kp.f32, "b", "n"]):
    return x[0]


def _slice(x: T[kp.f32, "n"]):
    return x[1:]


def _too_many_axes(x: T[kp.f32, "n"]):
    return x[:, :, None]


def _shape_index(x: T[kp.f32, "n"]):
    return x * x.shape[1]


def _reshape(x: T[kp.f32, "b", "n"]):
    return x.reshape(-1)


def _transpose(x: T[kp.f32, "b", "n"]):
    return x.T


def _matmul(x: T[kp.f32, "b", "n"], w: T[kp.f32, "n", "m"]):
    return x @ w


def _no_return(x: T[kp.f32, "n"]):
    x + 1  # noqa: B018 - the stranger forgot the return


def _arange_of_tensor(x: T[kp.f32, "n"]):
    return kp.arange(x)


def _keepdims_word(x: T[kp.f32, "b", "n"]):
    return x.sum(-1, keepdims="yes")


def _bad_dtype(x: T[kp.f32, "n"]):
    return x.astype("float128")


def _int_pow(x: T[kp.i32, "n"]):
    return x ** -1


def _big_literal(x: T[kp.i32, "n"]):
    return x + 2 ** 40


def _no_annotation(x):
    return x


def _numpy_annotation(x: list):
    return x


PYTHON_MISUSE = [_python_if, _float_size, _loop, _python_math, _int_index, _slice,
                 _too_many_axes, _shape_index, _reshape, _transpose, _matmul, _no_return,
                 _arange_of_tensor, _keepdims_word, _bad_dtype, _int_pow, _big_literal,
                 _no_annotation, _numpy_annotation]


@pytest.mark.parametrize("fn", PYTHON_MISUSE, ids=[f.__name__.strip("_") for f in PYTHON_MISUSE])
def test_python_misuse_is_a_trace_error_not_a_crash(fn):
    """Python-level habits (if on a tensor, math.*, slicing, .T, @, a missing return): a
    TraceError that says what is supported, not an exception from the tracer's internals."""
    with pytest.raises(kp.TraceError) as info:
        _trace(fn)
    assert len(str(info.value)) > 20 and "Traceback" not in str(info.value)


# ------------------------------------------------------------------------ determinism


@kp.fusion
def det_gelu(x: T[kp.f64, "n"], c: kp.f64, k: kp.f64):
    return 0.5 * x * (1 + kp.tanh(c * (x + k * x * x * x)))


@kp.fusion
def det_masked_mean(x: T[kp.f32, "b", "n"], mask: T[kp.i32, "b", "n"]):
    keep = mask != 0
    return kp.where(keep, x, 0.0).sum(axis=-1) / keep.sum(axis=-1)


@kp.fusion
def det_phase(x: T[kp.f64, "b", "n"]):
    n = x.shape[1]
    bk = (kp.arange(1 << n)[:, None] >> kp.arange(n)[None, :]) & 1
    return kp.exp(1j * (x[:, None, :] * bk[None]).sum(axis=2)) * 2.0 ** (-0.5 * n)


@kp.fusion
def det_masked_amplitude(v: T[kp.f32, "b", "l"], n: kp.i64):
    big_n = 1 << n
    padded = kp.pad(v, big_n, axis=1) / kp.sqrt(kp.sum(v ** 2, axis=1))[:, None]
    return kp.complex(kp.where(kp.arange(big_n) < v.shape[1], padded, 0), 0)


DETERMINISM = [det_gelu, det_masked_mean, det_phase, det_masked_amplitude]


def _digest(f: kp.fusion) -> str:
    return hashlib.sha256(kp.save([kp.compile(f, targets=TARGETS)])).hexdigest()


def test_same_fusion_same_bytes_in_one_process_and_another():
    first = {f.name: _digest(f) for f in DETERMINISM}
    again = {f.name: _digest(f) for f in reversed(DETERMINISM)}
    assert again == first
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from tests.lowering.test_review11_stranger_errors import DETERMINISM, _digest\n"
            "for f in DETERMINISM[::-1]: print(f.name, _digest(f))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin",
                                                     "PYTHONHASHSEED": "977"})
    assert out.returncode == 0, out.stderr
    assert dict(line.split() for line in out.stdout.splitlines()) == first
