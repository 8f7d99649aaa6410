"""Fusions for ``kernelpack build``: a module a deployment compiles once into one artifact.

    kernelpack build examples/fusions.py -o model.kpack
    kernelpack inspect model.kpack
    kernelpack eval model.kpack scaled_softmax x=4096,1000 s=0.5

Every module-level ``@kp.fusion`` becomes a program of that name (compiled for ``--targets``);
a module-level ``kp.Compiled`` (here a specialization with a static row length) is stored as
it is. Names starting with ``_`` are built only when named on the command line.
"""

import kernelpack as kp


@kp.fusion
def gelu(x: kp.Tensor[kp.f32, "n"]):
    """The tanh approximation of GELU, elementwise."""
    return 0.5 * x * (1.0 + kp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


@kp.fusion
def scaled_softmax(x: kp.Tensor[kp.f32, "b", "n"], s: kp.f32):
    """softmax(s * x) over the last axis: one row-reduction kernel that keeps each row."""
    z = x * s
    e = kp.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@kp.fusion(name="rms_norm_4096")
def _rms_norm(x: kp.Tensor[kp.f32, "b", "n"], w: kp.Tensor[kp.f32, "n"]):
    return x * kp.rsqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * w


# a specialization: the row length fixed at 4096 in the code (other lengths are refused)
rms_norm_4096 = kp.compile(_rms_norm, targets=["sm_80", "sm_90", "ptx"], static={"n": 4096})
