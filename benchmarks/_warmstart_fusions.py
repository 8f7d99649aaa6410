"""The warm start's 50 fusions (``fusion_jobs``), in a module of their own: a warm-start child
imports it inside its clock, as a real process imports the module that defines its kernels,
and it imports nothing but ``inspect`` and ``itertools`` (kernelpack's import loads both), so
the clock holds no import of the benchmark's own harness (subprocess, socket, tempfile, ...:
10-15 ms on the 2-CPU box after ``import kernelpack.cache``, when the CPU child imported
``warmstart`` itself; 0.2 ms for this module; session 49).
"""

from __future__ import annotations

import inspect
import itertools

__all__ = ["FUSIONS", "DTYPES", "SHAPES", "fusion_jobs"]


def _kp():  # the benchmark's own process imports kernelpack only where needed
    import kernelpack
    return kernelpack


def _softmax(x, s):
    z = x * s
    e = _kp().exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _axpby(x, y, s):
    return s * x + y


def _gelu(x, s):
    return 0.5 * x * (1.0 + _kp().erf(x * s))


def _rownorm(x, s):
    m = x.mean(axis=1, keepdims=True)
    d = x - m
    return d / _kp().sqrt((d * d).mean(axis=1, keepdims=True) + s)


def _relu_sum(x, s):
    return _kp().where(x > 0, x, x * s).sum(axis=1)


def _tanh_mul(x, y, s):
    return _kp().tanh(x * s) * y


# (name, body, tensor rank, tensor inputs); every body ends with a scalar `s`.
FUSIONS = [("softmax", _softmax, 2, 1), ("axpby", _axpby, 1, 2), ("gelu", _gelu, 1, 1),
           ("rownorm", _rownorm, 2, 1), ("relu_sum", _relu_sum, 2, 1),
           ("tanh_mul", _tanh_mul, 1, 2)]
DTYPES = ["f32", "f64", "f16"]
SHAPES = [None, 1024, 4096]  # None: fully symbolic; else n is fixed (static=)


def fusion_jobs(n: int) -> list:
    """``n`` distinct (fusion, static shapes) pairs: 6 fusions x 3 dtypes x 3 shapes."""
    import kernelpack as kp

    out = []
    for (fname, fn, rank, ntens), dname, size in itertools.product(FUSIONS, DTYPES, SHAPES):
        dt = getattr(kp, dname)
        dims = ("b", "n") if rank == 2 else ("n",)

        def body(*a, _fn=fn):  # type: ignore[no-untyped-def]
            return _fn(*a)

        names = ["x", "y"][:ntens] + ["s"]
        params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in names]
        body.__signature__ = inspect.Signature(params)
        ann = {p: kp.Tensor[(dt,) + dims] for p in names[:-1]}
        ann["s"] = dt
        body.__annotations__ = ann
        f = kp.fusion(body, name=f"{fname}_{dname}")
        out.append((f, {} if size is None else {"n": size}))
        if len(out) == n:
            break
    return out
